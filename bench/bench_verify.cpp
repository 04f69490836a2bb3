// bench/bench_verify.cpp — the compare engine (oasis/verify/compare.hpp) at real sizes: one check
// of a whole attention layer or depth router with the fast oracle (wall time of
// verify::check, the implementation's outputs computed beforehand by the fast CPU backend), and
// the mp50 oracle's time for the same check extrapolated from a random sample of rows
// (`mp50_s_estimate`, `speedup_vs_mp50`), and the process CPU time of the check (`cpu_s`, all
// threads). A check that does not PASS aborts the run.
//
//   BM_Verify_attention_causal/...   [1, 32, 4096, 128] causal Softmax1, float32
//   BM_Verify_attention_gptoss/...   [1, 64, 4096, 64] causal, 8 kv heads, sinks in [-3, 3]
//   BM_Verify_depth/...              8192 tokens over 33 sources, d = 2048, coupled Softmax1
// Targets (docs/benchmarks.md): <= 30 s, <= 30 s and <= 10 s on the 2-core benchmark machine.
#include <benchmark/benchmark.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <random>

#include "bench_support.hpp"
#include "oasis/backend.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_random.hpp"

namespace oasis_bench {
using namespace oasis;
namespace io = oasis::io;

namespace {

struct Problem {
  std::string op;
  io::TensorMap in, out;
  io::json::Value options;
  index_t rows = 0;  ///< rows of the check (attention: B H Tq; depth: tokens)
};

io::StoredTensor stored(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }

std::unique_ptr<Problem> attention_problem(index_t H, index_t H_kv, index_t T, index_t d, bool sinks) {
  auto rng = test::make_rng(2026 + static_cast<std::uint64_t>(H));
  auto p = std::make_unique<Problem>();
  p->op = "attention";
  const Tensor<float> q = test::randn<float>({1, H, T, d}, rng), k = test::randn<float>({1, H_kv, T, d}, rng),
                      v = test::randn<float>({1, H_kv, T, d}, rng);
  AttentionOptions o;
  o.causal = true;
  std::string opts = "{\"causal\": true";
  if (sinks) {
    std::uniform_real_distribution<double> ud(-3.0, 3.0);
    opts += ", \"null_logits\": [";
    for (index_t h = 0; h < H; ++h) {
      o.null_logits.push_back(static_cast<double>(static_cast<float>(ud(rng))));
      opts += (h ? ", " : "") + std::to_string(o.null_logits.back());
    }
    opts += "]";
  }
  // the options are written with std::to_string (6 digits): read them back so that both sides use
  // the same null logits
  p->options = io::json::parse(opts + "}");
  if (sinks)
    for (index_t h = 0; h < H; ++h) o.null_logits[static_cast<std::size_t>(h)] = p->options.find("null_logits")->items[static_cast<std::size_t>(h)].as_double();
  const AttentionResult<float> r = token_attention(Backend::cpu_fast, q, k, v, o);
  p->in.emplace("q", stored(q));
  p->in.emplace("k", stored(k));
  p->in.emplace("v", stored(v));
  p->out.emplace("out", stored(r.out));
  p->out.emplace("lse", stored(r.lse));
  p->out.emplace("p_null", stored(r.p_null));
  p->rows = H * T;
  return p;
}

std::unique_ptr<Problem> depth_problem(index_t n, index_t N, index_t d) {
  auto rng = test::make_rng(4242);
  auto p = std::make_unique<Problem>();
  p->op = "depth";
  std::vector<SourceKind> kinds(static_cast<std::size_t>(n), SourceKind::attention);
  kinds[0] = SourceKind::initial;
  DepthOptions o;
  o.beta = 0.5;
  Tensor<float> g = test::randn<float>({n, N}, rng), psi = test::uniform<float>({n, N}, rng, 0.0, 1.0);
  io::StoredTensor src{io::DType::f32, Tensor<double>({n, N, d})};
  {
    Tensor<float> s = test::randn<float>({n, N, d}, rng);
    const DepthRoute<float> r = attn_res_route(Backend::cpu_fast, s, g, psi, kinds, o);
    for (index_t i = 0; i < s.size(); ++i) src.values[i] = s[i];
    p->out.emplace("h", stored(r.h));
    p->out.emplace("alpha", stored(r.alpha));
    p->out.emplace("alpha_null", stored(r.alpha_null));
  }
  p->in.emplace("sources", std::move(src));
  p->in.emplace("g_old", stored(g));
  p->in.emplace("psi", stored(psi));
  p->options = io::json::parse(R"({"beta": 0.5})");
  p->rows = N;
  return p;
}

}  // namespace

/// Times one check per iteration and adds the mp50 estimate; `seconds` is the measured check time.
static void verify_bench(benchmark::State& state, Problem& p) {
  verify::CompareOptions co;
  co.show = 3;
  verify::CompareReport rep;
  double seconds = 0, cpu_seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();  // process CPU time, every thread
    rep = verify::check(p.op, p.in, p.out, p.options, co);
    cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!rep.passed) abort_run(p.op + " check did not pass:\n" + verify::format_report(rep));
  co.oracle = verify::Oracle::mp50;
  co.sample = 8;
  const auto t0 = std::chrono::steady_clock::now();
  const verify::CompareReport mp = verify::check(p.op, p.in, p.out, p.options, co);
  const double per_row = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 8.0;
  if (!mp.passed) abort_run(p.op + " mp50 sample did not pass:\n" + verify::format_report(mp));
  const double mp50_s = per_row * static_cast<double>(p.rows);
  state.counters["check_s"] = seconds;
  // CPU seconds of all threads: on a busy shared machine wall time overstates the work; with
  // OASIS_BENCH_THREADS threads and no other load the wall time is about cpu_s / threads
  state.counters["cpu_s"] = cpu_seconds;
  state.counters["mp50_s_estimate"] = mp50_s;
  state.counters["speedup_vs_mp50"] = seconds > 0 ? mp50_s / seconds : 0.0;
  state.SetLabel(rep.oracle);
}

static void BM_Verify_attention_causal_32x4096x128(benchmark::State& state) {
  static std::unique_ptr<Problem> p = attention_problem(32, 32, 4096, 128, false);
  verify_bench(state, *p);
}
static void BM_Verify_attention_gptoss_64x4096x64_kv8_sinks(benchmark::State& state) {
  static std::unique_ptr<Problem> p = attention_problem(64, 8, 4096, 64, true);
  verify_bench(state, *p);
}
static void BM_Verify_depth_8192_tokens_33_sources_d2048(benchmark::State& state) {
  static std::unique_ptr<Problem> p = depth_problem(33, 8192, 2048);
  verify_bench(state, *p);
}
BENCHMARK(BM_Verify_attention_causal_32x4096x128)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_attention_gptoss_64x4096x64_kv8_sinks)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_depth_8192_tokens_33_sources_d2048)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace oasis_bench
