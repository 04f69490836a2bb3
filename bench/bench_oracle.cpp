// bench/bench_oracle.cpp — validation against the mp50 oracle (the backward's: long double) and the
// oracle's own throughput.
// (Kept apart from bench_cpu.cpp: the Boost.Multiprecision code compiles slowly.)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench_support.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis/oasis.hpp"
#include "oasis_random.hpp"
#include "parity_bound.hpp"

namespace oasis_bench {
using namespace oasis;
using R = mp50;

namespace {

// rows [t0, t0 + r) of a [B, H, T, w] tensor
template <class T>
Tensor<T> rows_of(const Tensor<T>& x, index_t t0, index_t r) {
  const index_t B = x.dim(0), H = x.dim(1), w = x.dim(3);
  Tensor<T> out({B, H, r, w});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < r; ++t)
        for (index_t c = 0; c < w; ++c) out(b, h, t, c) = x(b, h, t0 + t, c);
  return out;
}
Tensor<float> stat_rows(const Tensor<float>& x, index_t t0, index_t r) {
  if (x.empty()) return x;
  const index_t B = x.dim(0), H = x.dim(1);
  Tensor<float> out({B, H, r});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < r; ++t) out(b, h, t) = x(b, h, t0 + t);
  return out;
}

std::string check_slice(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                        const AttentionOptions& opt, const AttentionResult<float>& fast_full, index_t t0,
                        index_t r, const char* what) {
  AttentionResult<float> fast;
  fast.out = rows_of(fast_full.out, t0, r);
  fast.lse = stat_rows(fast_full.lse, t0, r);
  fast.p_null = stat_rows(fast_full.p_null, t0, r);
  AttentionOptions o = opt;
  o.return_probs = false;
  const AttentionResult<float> ref = token_attention(q, k, v, o);
  o.return_probs = true;
  const AttentionResult<R> mp = token_attention(q.cast<R>(), k.cast<R>(), v.cast<R>(), o);
  o.return_probs = false;
  const fast_parity::Outcome out = fast_parity::check_attention(q, k, v, o, fast, ref, mp);
  if (out.ok) return "";
  return std::string(what) + ": " + std::to_string(out.violations) + " violations\n" + out.first;
}

}  // namespace

std::string validate_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                               const AttentionOptions& opt, const AttentionResult<float>& fast, index_t last_rows,
                               index_t first_rows) {
  const index_t Tq = q.dim(2), Tk = k.dim(2);
  std::string report;
  {  // the last rows see every key they would see in the full call
    const index_t r = std::min(last_rows, Tq);
    report += check_slice(rows_of(q, Tq - r, r), k, v, opt, fast, Tq - r, r, "last rows");
  }
  if (opt.causal && first_rows > 0) {  // the first rows see keys [0, r + Tk - Tq) only
    const index_t r = std::min(first_rows, Tq);
    const index_t keys = std::min(Tk, r + Tk - Tq);
    if (keys > 0) {
      AttentionOptions o = opt;
      for (index_t& len : o.key_lengths) len = std::min(len, keys);
      report += check_slice(rows_of(q, 0, r), rows_of(k, 0, keys), rows_of(v, 0, keys), o, fast, 0, r, "first rows");
    }
  }
  return report;
}

namespace {

// The backward of the sub-call (q rows [t0, t0 + r), keys [0, keys)) in float and in long double,
// with its bounds; compares the given slices of the fast gradients.
using HP = long double;

struct SubBackward {
  AttentionGrads<float> ref;
  AttentionGrads<HP> hp;
  bounds::AttentionBackwardBounds b;
};

SubBackward sub_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                         const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  SubBackward s;
  s.ref = token_attention_backward(q, k, v, d, opt);
  const Tensor<HP> qh = q.cast<HP>(), kh = k.cast<HP>(), vh = v.cast<HP>();
  s.hp = token_attention_backward(qh, kh, vh, AttentionCotangents<HP>{d.out.cast<HP>(), d.lse.cast<HP>(), d.p_null.cast<HP>()},
                                  opt);
  AttentionOptions fo = opt;
  fo.return_probs = true;
  s.b = bounds::attention_backward_bounds(q, k, v, d, opt, token_attention(qh, kh, vh, fo));
  return s;
}

AttentionCotangents<float> cotangent_rows(const AttentionCotangents<float>& d, index_t t0, index_t r) {
  return {rows_of(d.out, t0, r), stat_rows(d.lse, t0, r), stat_rows(d.p_null, t0, r)};
}

}  // namespace

std::string validate_attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                        const AttentionCotangents<float>& d, const AttentionOptions& opt,
                                        const AttentionGrads<float>& fast, index_t last_rows, index_t first_rows) {
  if (opt.layout != AttentionLayout::bhtd || opt.window > 0 || !opt.bias.empty())
    return "validate_attention_backward covers [B, H, T, d] calls without window or bias";
  const index_t Tq = q.dim(2), Tk = k.dim(2);
  AttentionOptions o = opt;
  o.return_probs = false;
  bounds::ParityOutcome out;
  {  // the last rows: every key they see; their dq, and (causal) the last keys' dk, dv
    const index_t r = std::min(last_rows, Tq);
    const SubBackward s = sub_backward(rows_of(q, Tq - r, r), k, v, cotangent_rows(d, Tq - r, r), o);
    bounds::check_parity("dq (last rows)", rows_of(fast.q, Tq - r, r), s.ref.q, s.hp.q, s.b.q, out);
    if (opt.causal) {  // keys [Tk - r, Tk) are seen by rows [Tq - r, Tq) only (bottom-right alignment)
      const index_t kr = std::min(r, Tk);
      bounds::check_parity("dk (last keys)", rows_of(fast.k, Tk - kr, kr), rows_of(s.ref.k, Tk - kr, kr),
                           rows_of(s.hp.k, Tk - kr, kr), rows_of(s.b.k, Tk - kr, kr), out);
      bounds::check_parity("dv (last keys)", rows_of(fast.v, Tk - kr, kr), rows_of(s.ref.v, Tk - kr, kr),
                           rows_of(s.hp.v, Tk - kr, kr), rows_of(s.b.v, Tk - kr, kr), out);
    }
  }
  if (opt.causal && first_rows > 0) {  // the first rows see keys [0, r + Tk - Tq) only: their dq
    const index_t r = std::min(first_rows, Tq);
    const index_t keys = std::min(Tk, r + Tk - Tq);
    if (keys > 0) {
      AttentionOptions of = o;
      for (index_t& len : of.key_lengths) len = std::min(len, keys);
      const SubBackward s = sub_backward(rows_of(q, 0, r), rows_of(k, 0, keys), rows_of(v, 0, keys),
                                         cotangent_rows(d, 0, r), of);
      bounds::check_parity("dq (first rows)", rows_of(fast.q, 0, r), s.ref.q, s.hp.q, s.b.q, out);
    }
  }
  return out.ok ? "" : std::to_string(out.violations) + " violations\n" + out.first;
}

[[noreturn]] void abort_run(const std::string& what) {
  std::fprintf(stderr, "oasis_bench_cpu: VALIDATION FAILED, not timing: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(2);
}

// The mp50 oracle's throughput: token attention (softmax1, causal) in 50-digit arithmetic.
static void BM_Oracle_mp50_attention(benchmark::State& state) {
  const index_t T = state.range(0), H = 2, d = 32;
  auto rng = oasis::test::make_rng(11);
  const Tensor<R> q = oasis::test::randn<float>({1, H, T, d}, rng).cast<R>();
  const Tensor<R> k = oasis::test::randn<float>({1, H, T, d}, rng).cast<R>();
  const Tensor<R> v = oasis::test::randn<float>({1, H, T, d}, rng).cast<R>();
  AttentionOptions opt;
  opt.causal = true;
  const double flops = static_cast<double>(H) * static_cast<double>(T * (T + 1) / 2) * 4.0 * d;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(token_attention(q, k, v, opt));
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = flops * static_cast<double>(state.iterations()) / sec;
  state.counters["GFLOP/s"] = rate * 1e-9;
  state.counters["ratio_gemm"] = g_gemm_gflops > 0 ? rate * 1e-9 / g_gemm_gflops : 0;
}
BENCHMARK(BM_Oracle_mp50_attention)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

static void BM_Oracle_mp50_row_softmax1(benchmark::State& state) {
  const index_t m = state.range(0);
  auto rng = oasis::test::make_rng(12);
  const Tensor<R> z = oasis::test::randn<float>({m}, rng).cast<R>();
  std::vector<R> p(static_cast<std::size_t>(m));
  for (auto _ : state) {
    benchmark::DoNotOptimize(normalize_row(RowNorm::softmax1, z.data(), m, R(0), p.data()));
  }
  state.SetItemsProcessed(state.iterations() * m);
}
BENCHMARK(BM_Oracle_mp50_row_softmax1)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace oasis_bench
