// bench/bench_cpu.cpp — CPU micro-benchmarks, each reported against the machine's own
// ceilings measured earlier in the same run (float32 GEMM with Eigen, STREAM triad):
//   Ceiling_*            GEMM GFLOP/s (n = 2048), triad GB/s (3 x 64 MiB arrays, 12 B/element)
//   RowNormalizer_*      the reference row op (softmax1) and the fast path's vectorised exp
//   Attention_*          token attention, causal Softmax1, B = 1, 8 heads, T in {1024, 4096},
//                        d_h in {64, 128}: plain float reference vs the fused fast path (and its
//                        kernel alone, without the per-call packing and checks)
//   Attention_backward_* its backward (FlashAttention-2 with the null category) on the fast path,
//                        from the forward's saved output and row state
//   Route_*              depth routing over n in {8, 16, 32, 64} sources, N = 1024 tokens, d = 2048
//   Layer_*              one AttnRes attention sublayer from the core ops (route, RMSNorm, QKV
//                        projections, fused attention, output projection), d = 512, T = 1024
//   Layer_model_*        (bench_model.cpp) one full block of the model oracle, Model<float>
//   Oracle_mp50_*        (bench_oracle.cpp) the 50-digit oracle's throughput
//   OracleGemm/*         the fast oracle's matrix product (src/verify/oracle_kernels.hpp) at the
//                        attention oracle's shapes, one product per thread (not validated here:
//                        verify_oracle_kernels_tests holds every variant to the definition)
// Every fast configuration is validated (the kernel parity rule of tests/parity/parity_bound.hpp against
// oasis::mp50 on a subset of rows; depth routing: bitwise equal to the reference) before it is
// timed; a failure aborts the run with exit status 2.
// Counters: GFLOP/s or GB/s, and ratio_gemm / ratio_triad = throughput / same-run ceiling.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <string>

#include "bench_support.hpp"
#include "ceilings.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/oasis.hpp"
#include "oasis_random.hpp"
#include "fast_kernels.hpp"  // src/cpu_fast: the kernel table, for BM_Attention_fast_kernel
#include "oracle_kernels.hpp"  // src/verify: the fast oracle's matrix product, for BM_OracleGemm

namespace oasis_bench {
using namespace oasis;

double g_gemm_gflops = 0;
double g_triad_gbs = 0;
int threads() {
  const char* e = std::getenv("OASIS_BENCH_THREADS");
  return e ? std::max(1, std::atoi(e)) : 2;
}

namespace {

using Clock = std::chrono::steady_clock;

// Wall time and process CPU time of a timing loop. With one thread (OASIS_BENCH_THREADS=1) the
// CPU time is the time the loop actually ran, whatever else the machine was doing, so the
// *_cpu ratios of such a run are robust to a shared machine's load; they are reported only then
// (with several threads, CPU time includes barrier spinning and is not a rate).
struct Span {
  Clock::time_point wall;
  double cpu;
  static double process_cpu() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  static Span start() { return {Clock::now(), process_cpu()}; }
  double wall_sec() const { return std::chrono::duration<double>(Clock::now() - wall).count(); }
  double cpu_sec() const { return process_cpu() - cpu; }
};
double g_gemm_gflops_cpu = 0, g_triad_gbs_cpu = 0;

void report(benchmark::State& st, double work_per_iter, const Span& t0, const char* unit, double ceiling,
            double ceiling_cpu, const char* ratio_name) {
  const double wall = t0.wall_sec(), cpu = t0.cpu_sec();
  const double it = static_cast<double>(st.iterations());
  const double rate = work_per_iter * it / wall * 1e-9;
  st.counters[unit] = rate;
  st.counters[ratio_name] = ceiling > 0 ? rate / ceiling : 0;
  if (threads() == 1) {
    const double rate_cpu = work_per_iter * it / cpu * 1e-9;
    st.counters[std::string(unit) + "_cpu"] = rate_cpu;
    st.counters[std::string(ratio_name) + "_cpu"] = ceiling_cpu > 0 ? rate_cpu / ceiling_cpu : 0;
  }
}
void report_flops(benchmark::State& st, double flops_per_iter, const Span& t0) {
  report(st, flops_per_iter, t0, "GFLOP/s", g_gemm_gflops, g_gemm_gflops_cpu, "ratio_gemm");
}
void report_bytes(benchmark::State& st, double bytes_per_iter, const Span& t0) {
  report(st, bytes_per_iter, t0, "GB/s", g_triad_gbs, g_triad_gbs_cpu, "ratio_triad");
}

// ---- ceilings --------------------------------------------------------------------------------

void BM_Ceiling_GemmF32(benchmark::State& st) {
  const index_t n = st.range(0);
  auto rng = oasis::test::make_rng(1);
  const Tensor<float> a = oasis::test::randn<float>({n, n}, rng), b = oasis::test::randn<float>({n, n}, rng);
  Tensor<float> c({n, n});
  eigen_gemm(a.data(), b.data(), c.data(), n, n, n, threads());  // warm-up (first touch, threads)
  const Span t0 = Span::start();
  for (auto _ : st) {
    eigen_gemm(a.data(), b.data(), c.data(), n, n, n, threads());
    benchmark::ClobberMemory();
  }
  report_flops(st, 2.0 * n * n * n, t0);
  g_gemm_gflops = st.counters["GFLOP/s"];
  st.counters["ratio_gemm"] = 1.0;
  if (threads() == 1) {
    g_gemm_gflops_cpu = st.counters["GFLOP/s_cpu"];
    st.counters["ratio_gemm_cpu"] = 1.0;
  }
  st.SetLabel(eigen_simd());
}

void BM_Ceiling_Triad(benchmark::State& st) {
  const index_t n = st.range(0);
  std::vector<float> a(static_cast<std::size_t>(n), 0.0f), b(a.size(), 1.0f), c(a.size(), 2.0f);
  triad(a.data(), b.data(), c.data(), 3.0f, n);  // warm-up
  const Span t0 = Span::start();
  for (auto _ : st) {
    triad(a.data(), b.data(), c.data(), 3.0f, n);
    benchmark::ClobberMemory();
  }
  report_bytes(st, 12.0 * static_cast<double>(n), t0);
  g_triad_gbs = st.counters["GB/s"];
  st.counters["ratio_triad"] = 1.0;
  if (threads() == 1) {
    g_triad_gbs_cpu = st.counters["GB/s_cpu"];
    st.counters["ratio_triad_cpu"] = 1.0;
  }
}

// ---- row normaliser --------------------------------------------------------------------------

void BM_RowNormalizer_reference_softmax1(benchmark::State& st) {
  const index_t m = st.range(0);
  auto rng = oasis::test::make_rng(2);
  const Tensor<float> z = oasis::test::randn<float>({m}, rng, 3.0);
  std::vector<float> p(static_cast<std::size_t>(m));
  const Span t0 = Span::start();
  for (auto _ : st) {
    benchmark::DoNotOptimize(normalize_row(RowNorm::softmax1, z.data(), m, 0.0f, p.data()));
    benchmark::ClobberMemory();
  }
  report_bytes(st, 8.0 * static_cast<double>(m), t0);  // read z, write p
  st.SetItemsProcessed(st.iterations() * m);
}

void BM_RowNormalizer_fast_vector_exp(benchmark::State& st) {
  const index_t m = st.range(0);
  auto rng = oasis::test::make_rng(3);
  const Tensor<float> z = oasis::test::randn<float>({m}, rng, 3.0);
  std::vector<float> p(static_cast<std::size_t>(m));
  const Span t0 = Span::start();
  for (auto _ : st) {
    cpu_fast::vector_exp(z.data(), p.data(), m);
    benchmark::ClobberMemory();
  }
  report_bytes(st, 8.0 * static_cast<double>(m), t0);
  st.SetItemsProcessed(st.iterations() * m);
  st.SetLabel(std::string(cpu_fast::isa()));
}

// ---- token attention -------------------------------------------------------------------------

struct AttnInputs {
  Tensor<float> q, k, v;
  AttentionOptions opt;
  double flops = 0;
};

// H = 8 heads of T queries and keys, causal Softmax1; with a sliding window W > 0 (gpt-oss's
// windowed layers: W = 128) each row sees min(t + 1, W) keys. q ~ N(0, peak^2): the logits are
// N(0, peak^2) (peak 1: the default; peak 20: peaked rows, see BM_Attention_fast_peaked).
const AttnInputs& attn_inputs(index_t T, index_t d, index_t W = 0, index_t peak = 1) {
  static std::map<std::tuple<index_t, index_t, index_t, index_t>, AttnInputs> cache;
  auto it = cache.find({T, d, W, peak});
  if (it != cache.end()) return it->second;
  AttnInputs in;
  const index_t H = 8;
  auto rng = oasis::test::make_rng(100 + static_cast<std::uint64_t>(T + d));
  in.q = oasis::test::randn<float>({1, H, T, d}, rng, static_cast<double>(peak));
  in.k = oasis::test::randn<float>({1, H, T, d}, rng);
  in.v = oasis::test::randn<float>({1, H, T, d}, rng);
  in.opt.normalizer = RowNorm::softmax1;
  in.opt.causal = true;
  in.opt.window = W;
  // useful work: every visible (query, key) pair costs 2 d_h (score) + 2 d_v (output) flops
  double pairs = 0;
  for (index_t t = 0; t < T; ++t) pairs += static_cast<double>(W > 0 ? std::min(t + 1, W) : t + 1);
  in.flops = static_cast<double>(H) * pairs * 4.0 * static_cast<double>(d);
  return cache.emplace(std::make_tuple(T, d, W, peak), std::move(in)).first->second;
}

void BM_Attention_reference(benchmark::State& st) {
  const AttnInputs& in = attn_inputs(st.range(0), st.range(1));
  const Span t0 = Span::start();
  for (auto _ : st) benchmark::DoNotOptimize(token_attention(in.q, in.k, in.v, in.opt));
  report_flops(st, in.flops, t0);
}

void validate_fast_attention(const AttnInputs& in, const AttentionResult<float>& r) {
  const std::string rep = validate_attention(in.q, in.k, in.v, in.opt, r, 2, 64);
  if (!rep.empty()) abort_run("attention T=" + std::to_string(in.q.dim(2)) + " d=" + std::to_string(in.q.dim(3)) + ": " + rep);
}

void run_attention_fast(benchmark::State& st, const AttnInputs& in) {
  AttentionResult<float> r;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, r);  // also warms the workspaces
  validate_fast_attention(in, r);
  const Span t0 = Span::start();
  for (auto _ : st) {
    cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, r);
    benchmark::ClobberMemory();
  }
  report_flops(st, in.flops, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", " + std::string(cpu_fast::route_streams()) + ", reused result");
}
void BM_Attention_fast(benchmark::State& st) { run_attention_fast(st, attn_inputs(st.range(0), st.range(1))); }

// Peaked rows (attention sinks, outlier logits): logits ~ N(0, 20^2), so that most weights of a
// row lie below e^-87.3, where a float is subnormal and forming one costs a microcode assist on
// Intel cores. The kernels carry the weights times 2^32 (src/cpu_fast/kernels/common.inc, kWeightScale),
// which keeps them normal: the rate should be close to BM_Attention_fast's (its row maxima move
// more, so there are more rescales; docs/benchmarks.md, "Subnormal weights").
void BM_Attention_fast_peaked(benchmark::State& st) {
  run_attention_fast(st, attn_inputs(st.range(0), st.range(1), 0, st.range(2)));
}

// The fused kernel alone: the query blocks of BM_Attention_fast's inputs (8 heads, causal), on keys
// and values packed once before timing as the library packs them (keys into the score product's
// panels, values into 64-byte aligned rows), with no input check and no result allocation. Its
// difference to BM_Attention_fast is the O(T d_h) work of a call (packing, finiteness checks),
// which at T = 1024 is about a tenth of it (docs/benchmarks.md, "What is left at T = 1024").
// Validated as bitwise the library call's output (itself validated against the oracle).
void BM_Attention_fast_kernel(benchmark::State& st) {
  const AttnInputs& in = attn_inputs(st.range(0), st.range(1));
  AttentionResult<float> ref;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, ref);
  validate_fast_attention(in, ref);
  const fast::Kernels& K = fast::active_kernels();
  using fast::kQueryTile;
  const index_t H = in.q.dim(1), T = in.q.dim(2), d = in.q.dim(3);
  const index_t KT = fast::forward_key_tile(d, d);  // the library's key tile for this head size
  const index_t nt = (T + KT - 1) / KT, nqb = (T + kQueryTile - 1) / kQueryTile;
  const index_t ldv = (d + K.lanes - 1) / K.lanes * K.lanes;
  fast::Workspace kt(static_cast<std::size_t>(H * nt * d * KT)), vp(static_cast<std::size_t>(H * T * ldv));
  for (index_t h = 0; h < H; ++h)
    for (index_t j = 0; j < nt * KT; ++j)
      for (index_t c = 0; c < d; ++c) {
        const index_t tile = j / KT, jj = j % KT;
        kt[static_cast<std::size_t>(((h * nt + tile) * d + c) * KT + jj)] = j < T ? in.k[(h * T + j) * d + c] : 0.0f;
        if (j < T) vp[static_cast<std::size_t>((h * T + j) * ldv + c)] = in.v[(h * T + j) * d + c];
      }
  std::vector<index_t> kbegin(static_cast<std::size_t>(T), 0), kend(static_cast<std::size_t>(T));
  for (index_t t = 0; t < T; ++t) kend[static_cast<std::size_t>(t)] = t + 1;  // causal, Tq = Tk
  std::vector<float> out(static_cast<std::size_t>(H * T * d)), lse(static_cast<std::size_t>(H * T)),
      p_null(static_cast<std::size_t>(H * T));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto run = [&] {
#pragma omp parallel
    {
      fast::Workspace ws(static_cast<std::size_t>(kQueryTile * KT + kQueryTile * ldv));
      std::vector<online::State> state(static_cast<std::size_t>(kQueryTile));
#pragma omp for schedule(dynamic, 1)
      for (index_t task = 0; task < H * nqb; ++task) {  // the longest rows first, as the library
        const index_t h = task / nqb, t0 = (nqb - 1 - task % nqb) * kQueryTile;
        fast::AttnBlock a{};
        a.rows = std::min(kQueryTile, T - t0);
        a.q = in.q.data() + (h * T + t0) * d;
        a.ldq = d;
        a.d_h = d;
        a.kt = kt.data() + h * nt * d * KT;
        a.v = vp.data() + h * T * ldv;
        a.ldv_in = a.ldv = ldv;
        a.d_v = d;
        a.kbegin = kbegin.data() + t0;
        a.kend = kend.data() + t0;
        a.scale = scale;
        a.has_null = true;  // softmax1, null logit 0
        a.s_ws = ws.data();
        a.o_ws = ws.data() + kQueryTile * KT;
        a.st_ws = state.data();
        a.out = out.data() + (h * T + t0) * d;
        a.ldo = d;
        a.lse = lse.data() + h * T + t0;
        a.p_null = p_null.data() + h * T + t0;
        K.attention_block(a);
      }
    }
  };
  run();
  if (std::memcmp(out.data(), ref.out.data(), out.size() * sizeof(float)) != 0)
    abort_run("attention kernel T=" + std::to_string(T) + " d=" + std::to_string(d) +
              ": not bitwise the library call's output");
  const Span t0 = Span::start();
  for (auto _ : st) {
    run();
    benchmark::ClobberMemory();
  }
  report_flops(st, in.flops, t0);
  st.SetLabel(std::string(K.isa) + ", kernel only");
}

// A sliding-window layer: the kernel visits only the key tiles of each query block's band, so the
// time follows T W, not T^2 (compare BM_Attention_fast/4096/64, the full causal layer).
void BM_Attention_fast_window(benchmark::State& st) {
  const AttnInputs& in = attn_inputs(st.range(0), st.range(1), st.range(2));
  AttentionResult<float> r;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, r);
  validate_fast_attention(in, r);
  const Span t0 = Span::start();
  for (auto _ : st) {
    cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, r);
    benchmark::ClobberMemory();
  }
  report_flops(st, in.flops, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", window " + std::to_string(st.range(2)));
}

// The one-call Backend API: allocates (and first-touches) the result tensors on every call.
void BM_Attention_fast_backend_api(benchmark::State& st) {
  const AttnInputs& in = attn_inputs(st.range(0), st.range(1));
  validate_fast_attention(in, token_attention(Backend::cpu_fast, in.q, in.k, in.v, in.opt));
  const Span t0 = Span::start();
  for (auto _ : st) benchmark::DoNotOptimize(token_attention(Backend::cpu_fast, in.q, in.k, in.v, in.opt));
  report_flops(st, in.flops, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", " + std::string(cpu_fast::route_streams()) + ", fresh result per call");
}

// ---- attention backward ----------------------------------------------------------------------

// The backward of the fused causal Softmax1 call above, dL/dout ~ N(0, 1) (no LSE or p_null
// cotangent: a training loss on the output), from the forward's output and row state
// (cpu_fast::token_attention_into with AttentionRowState), into a reused AttentionGrads.
// Useful work, FlashAttention-2's accounting: per visible (query, key) pair the five products
// S = Q K^T (2 d_h, the recomputation), dP = dO V^T (2 d_v), dV += P^T dO (2 d_v),
// dK += dS^T Q (2 d_h), dQ += dS K (2 d_h) = 6 d_h + 4 d_v flops, 2.5 times the forward's 4 d
// at d_h = d_v = d.
void run_attention_backward_fast(benchmark::State& st, const AttnInputs& in) {
  auto rng = oasis::test::make_rng(500 + static_cast<std::uint64_t>(st.range(0) + st.range(1)));
  const AttentionCotangents<float> d{oasis::test::randn<float>(in.q.shape(), rng), {}, {}};
  AttentionResult<float> fwd;
  cpu_fast::AttentionRowState state;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, fwd, state);
  AttentionGrads<float> g;
  cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);  // warms the workspaces
  const std::string rep = validate_attention_backward(in.q, in.k, in.v, d, in.opt, g, 2, 64);
  if (!rep.empty())
    abort_run("attention backward T=" + std::to_string(in.q.dim(2)) + " d=" + std::to_string(in.q.dim(3)) + ": " + rep);
  const double flops = in.flops * 2.5;  // 10 d per visible pair (above) against the forward's 4 d
  const Span t0 = Span::start();
  for (auto _ : st) {
    cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);
    benchmark::ClobberMemory();
  }
  report_flops(st, flops, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", reused gradients");
}
void BM_Attention_backward_fast(benchmark::State& st) {
  run_attention_backward_fast(st, attn_inputs(st.range(0), st.range(1)));
}
void BM_Attention_backward_fast_peaked(benchmark::State& st) {  // the rows of BM_Attention_fast_peaked
  run_attention_backward_fast(st, attn_inputs(st.range(0), st.range(1), 0, st.range(2)));
}

// ---- depth routing ---------------------------------------------------------------------------

struct RouteInputs {
  Tensor<float> sources, g, psi;
  std::vector<SourceKind> kinds;
  double bytes = 0;
};

const RouteInputs& route_inputs(index_t n, index_t N, index_t d) {
  static std::map<index_t, RouteInputs> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  RouteInputs in;
  auto rng = oasis::test::make_rng(200 + static_cast<std::uint64_t>(n));
  in.sources = oasis::test::randn<float>({n, N, d}, rng);
  in.g = oasis::test::randn<float>({n, N}, rng, 2.0);
  in.psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  in.kinds.push_back(SourceKind::initial);
  for (index_t i = 1; i < n; ++i) in.kinds.push_back(i % 2 ? SourceKind::attention : SourceKind::headless);
  // streamed: every source once, the output once (weights and logits are O(n N), negligible)
  in.bytes = 4.0 * static_cast<double>((n + 1) * N * d);
  return cache.emplace(n, std::move(in)).first->second;
}

constexpr index_t kRouteTokens = 1024, kRouteWidth = 2048;  // one 1024-token sequence

void BM_Route_reference(benchmark::State& st) {
  const RouteInputs& in = route_inputs(st.range(0), kRouteTokens, kRouteWidth);
  const Span t0 = Span::start();
  for (auto _ : st) benchmark::DoNotOptimize(attn_res_route(in.sources, in.g, in.psi, in.kinds, DepthOptions{}));
  report_bytes(st, in.bytes, t0);
}

void validate_route(const RouteInputs& in, const DepthRoute<float>& r) {
  const DepthRoute<float> ref = attn_res_route(in.sources, in.g, in.psi, in.kinds, DepthOptions{});
  auto same = [](const Tensor<float>& a, const Tensor<float>& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
  };
  if (!(same(r.h, ref.h) && same(r.alpha, ref.alpha) && same(r.alpha_null, ref.alpha_null) && same(r.g, ref.g) &&
        same(r.dpsi, ref.dpsi)))
    abort_run("depth routing n=" + std::to_string(in.sources.dim(0)) + ": fast result is not bitwise the reference's");
}

void BM_Route_fast(benchmark::State& st) {
  const RouteInputs& in = route_inputs(st.range(0), kRouteTokens, kRouteWidth);
  DepthRoute<float> r;
  cpu_fast::attn_res_route_into(in.sources, in.g, in.psi, in.kinds, DepthOptions{}, r);
  validate_route(in, r);
  const Span t0 = Span::start();
  for (auto _ : st) {
    cpu_fast::attn_res_route_into(in.sources, in.g, in.psi, in.kinds, DepthOptions{}, r);
    benchmark::ClobberMemory();
  }
  report_bytes(st, in.bytes, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", " + std::string(cpu_fast::route_streams()) + ", reused result");
}

void BM_Route_fast_backend_api(benchmark::State& st) {
  const RouteInputs& in = route_inputs(st.range(0), kRouteTokens, kRouteWidth);
  validate_route(in, attn_res_route(Backend::cpu_fast, in.sources, in.g, in.psi, in.kinds, DepthOptions{}));
  const Span t0 = Span::start();
  for (auto _ : st)
    benchmark::DoNotOptimize(attn_res_route(Backend::cpu_fast, in.sources, in.g, in.psi, in.kinds, DepthOptions{}));
  report_bytes(st, in.bytes, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", " + std::string(cpu_fast::route_streams()) + ", fresh result per call");
}

// ---- the fast oracle's matrix product ------------------------------------------------------------
// The products of fast_rows (src/verify/attention_oracle.cpp) for a block of 64 query rows over 4096
// keys, d = 128: shape 0 the scores (64 x 4096, K = 128: S = Q K^T, and Q = |q| |K|^T in float),
// shape 1 the mixing sums (64 x 128, K = 4096: A = P V, and the bound's sums in float). Arg 0:
// double (1) or float (0). Each thread runs its own product; the rate is all threads' flops over
// wall time, against the float GEMM ceiling.
void BM_OracleGemm(benchmark::State& st) {
  const bool dbl = st.range(0) == 1, scores = st.range(1) == 0;
  const index_t M = 64, N = scores ? 4096 : 128, K = scores ? 128 : 4096;
  const auto& g = verify::kernels::oracle_gemm();
  const int nt = threads();
  auto rng = oasis::test::make_rng(7);
  const Tensor<double> a = oasis::test::randn<double>({M, K}, rng), b = oasis::test::randn<double>({K, N}, rng);
  const std::vector<float> af(a.data(), a.data() + a.size()), bf(b.data(), b.data() + b.size());
  std::vector<std::vector<double>> c(static_cast<std::size_t>(nt), std::vector<double>(static_cast<std::size_t>(M * N)));
  std::vector<std::vector<float>> cf(static_cast<std::size_t>(nt), std::vector<float>(static_cast<std::size_t>(M * N)));
  int team = 0;  // the threads the runtime gave
  auto run = [&] {
#pragma omp parallel num_threads(nt)
    {
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      if (t == 0) team = omp_get_num_threads();
      if (dbl) g.gemm(a.data(), K, b.data(), N, c[t].data(), N, M, N, K, false);
      else g.gemm_f32(af.data(), K, bf.data(), N, cf[t].data(), N, M, N, K, false);
    }
  };
  run();  // warm-up (first touch, threads)
  const Span t0 = Span::start();
  for (auto _ : st) {
    run();
    benchmark::ClobberMemory();
  }
  report_flops(st, 2.0 * static_cast<double>(M * N * K) * team, t0);
  st.SetLabel(std::string(g.isa) + (dbl ? ", double" : ", float"));
}

// ---- one AttnRes attention sublayer from the core ops -------------------------------------------
// h = route(sources) (fast, n = 8), x = RMSNorm(h), Q/K/V = x W (Eigen GEMM), fused causal
// Softmax1 attention (8 heads x 64), y = A W_o. d = 512, T = 1024 tokens, batch 1.
void BM_Layer_attnres_attention_sublayer(benchmark::State& st) {
  const index_t T = 1024, d = 512, H = 8, dh = 64, n = 8;
  auto rng = oasis::test::make_rng(300);
  const Tensor<float> sources = oasis::test::randn<float>({n, T, d}, rng);
  const Tensor<float> g = oasis::test::randn<float>({n, T}, rng);
  const Tensor<float> psi = oasis::test::uniform<float>({n, T}, rng, 0.0, 1.0);
  std::vector<SourceKind> kinds{SourceKind::initial};
  for (index_t i = 1; i < n; ++i) kinds.push_back(i % 2 ? SourceKind::attention : SourceKind::headless);
  const float wsd = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor<float> Wq = oasis::test::randn<float>({d, d}, rng, wsd), Wk = oasis::test::randn<float>({d, d}, rng, wsd), Wv = oasis::test::randn<float>({d, d}, rng, wsd),
                      Wo = oasis::test::randn<float>({d, d}, rng, wsd);
  DepthRoute<float> route;
  Tensor<float> x({T, d}), qr({T, d}), kr({T, d}), vr({T, d}), q({1, H, T, dh}), k({1, H, T, dh}), v({1, H, T, dh}),
      ar({T, d}), y({T, d});
  AttentionResult<float> att;
  AttentionOptions opt;
  opt.causal = true;
  auto to_heads = [&](const Tensor<float>& rows, Tensor<float>& heads) {
#pragma omp parallel for schedule(static)
    for (index_t t = 0; t < T; ++t)
      for (index_t h = 0; h < H; ++h) std::memcpy(heads.ptr(0, h, t), rows.ptr(t) + h * dh, sizeof(float) * dh);
  };
  auto step = [&] {
    cpu_fast::attn_res_route_into(sources, g, psi, kinds, DepthOptions{}, route);
#pragma omp parallel for schedule(static)
    for (index_t t = 0; t < T; ++t) {  // RMSNorm, eps 1e-6, no gain
      const float* hr = route.h.ptr(t);
      float ss = 0;
      for (index_t c = 0; c < d; ++c) ss += hr[c] * hr[c];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + 1e-6f);
      for (index_t c = 0; c < d; ++c) x(t, c) = hr[c] * inv;
    }
    eigen_gemm(x.data(), Wq.data(), qr.data(), T, d, d, threads());
    eigen_gemm(x.data(), Wk.data(), kr.data(), T, d, d, threads());
    eigen_gemm(x.data(), Wv.data(), vr.data(), T, d, d, threads());
    to_heads(qr, q);
    to_heads(kr, k);
    to_heads(vr, v);
    cpu_fast::token_attention_into(q, k, v, opt, att);
#pragma omp parallel for schedule(static)
    for (index_t t = 0; t < T; ++t)
      for (index_t h = 0; h < H; ++h) std::memcpy(ar.ptr(t) + h * dh, att.out.ptr(0, h, t), sizeof(float) * dh);
    eigen_gemm(ar.data(), Wo.data(), y.data(), T, d, d, threads());
  };
  step();
  validate_route(RouteInputs{sources, g, psi, kinds, 0}, route);
  {
    const std::string rep = validate_attention(q, k, v, opt, att, 2, 64);
    if (!rep.empty()) abort_run("layer attention: " + rep);
  }
  const double flops = 4.0 * 2.0 * T * d * d + static_cast<double>(H) * T * (T + 1) / 2.0 * 4.0 * dh + 2.0 * n * T * d;
  const Span t0 = Span::start();
  for (auto _ : st) {
    step();
    benchmark::ClobberMemory();
  }
  report_flops(st, flops, t0);
}

}  // namespace

// The ceilings and the fast paths run at least kSteady seconds (several iterations, whatever
// --benchmark_min_time says): their ratio is the result, so neither side rests on one iteration.
// The slow plain references keep the command line's minimum time.
constexpr double kSteady = 0.25;
BENCHMARK(BM_Ceiling_GemmF32)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Ceiling_Triad)->Arg(16 << 20)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_RowNormalizer_reference_softmax1)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowNormalizer_fast_vector_exp)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Attention_fast)->ArgsProduct({{1024, 4096}, {64, 128}})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_fast_kernel)->ArgsProduct({{1024, 4096}, {64, 128}})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_fast_window)->Args({4096, 64, 128})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_fast_backend_api)->Args({4096, 64})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_backward_fast)->ArgsProduct({{1024, 4096}, {64, 128}})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_fast_peaked)->Args({1024, 64, 20})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_backward_fast_peaked)->Args({1024, 64, 20})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Attention_reference)->ArgsProduct({{1024, 4096}, {64, 128}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Route_fast)->Arg(8)->Arg(16)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Route_fast_backend_api)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Route_reference)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_OracleGemm)->ArgsProduct({{1, 0}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Layer_attnres_attention_sublayer)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
// the ceilings again at the end: a drift between the two shows a machine whose load changed
BENCHMARK(BM_Ceiling_GemmF32)->Name("BM_Ceiling_GemmF32_end")->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);
BENCHMARK(BM_Ceiling_Triad)->Name("BM_Ceiling_Triad_end")->Arg(16 << 20)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(kSteady);

}  // namespace oasis_bench

namespace oasis_bench {
// The CPU's vendor id and model name as /proc/cpuinfo gives them ("unknown" elsewhere): the
// ratios of the fast kernels to the ceilings differ between micro-architectures.
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, key.size(), key) == 0 && line.find(':') != std::string::npos) {
      const std::size_t v = line.find_first_not_of(" \t", line.find(':') + 1);
      return v == std::string::npos ? "" : line.substr(v);
    }
  return "unknown";
}
}  // namespace oasis_bench

int main(int argc, char** argv) {
  omp_set_num_threads(oasis_bench::threads());
  benchmark::AddCustomContext("cpu_vendor", oasis_bench::cpuinfo_field("vendor_id"));
  benchmark::AddCustomContext("cpu_model", oasis_bench::cpuinfo_field("model name"));
  benchmark::AddCustomContext("threads", std::to_string(oasis_bench::threads()));
  benchmark::AddCustomContext("cpu_fast_isa", std::string(oasis::cpu_fast::isa()));
  benchmark::AddCustomContext("cpu_fast_route_streams", std::string(oasis::cpu_fast::route_streams()));
  benchmark::AddCustomContext("eigen_simd_ceiling", oasis_bench::eigen_simd());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
