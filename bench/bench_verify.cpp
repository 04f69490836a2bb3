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
//   BM_Verify_model_full/...         op model on the full float32 trace of Model<float>::run (random
//                                    Kimi Full AttnRes model): d = 256, 4 blocks, T = 128, vocab 256;
//                                    d = 768, 12 blocks, 12 heads, T = 512, vocab 32000 (GPT-2 small)
//   BM_Verify_model_logits/...       the same two models, logits only (the end-to-end verdict: the
//                                    double replay with its error estimated by a long double replay,
//                                    docs/verify-model.md "The model level's fast oracle")
//   BM_VerifyAnswers_attention{,_backward}_{causal,gptoss}/{correct,one_wrong,all_wrong}
//   BM_Load_npy_f32_32x4096x128      reading one [1, 32, 4096, 128] float32 .npy file into the
//                                    engine's double tensor, as oasis-verify compare reads each input
//                                    (GB/s of the file, ratio to the same run's triad)
//   BM_VerifyPolicy_attention_causal_32x4096x128/{worst_case,probabilistic}
//                                    failing fast (docs/policies.md): the same check on the correct
//                                    outputs (gradients), on one element moved far off, and on every
//                                    element wrong, beside the cpu_fast kernel computing the op in the
//                                    same run (`kernel_s`, `check_per_kernel`); the counters
//                                    `mp50_rows`, `verdict_certain` tell what the check did
// Targets (docs/benchmarks.md): <= 30 s, <= 30 s and <= 10 s on the 2-core benchmark machine; the
// model checks <= 5 s (d = 256) and <= 300 s (GPT-2 small), full trace or logits only.
#include <benchmark/benchmark.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <random>

#include <unistd.h>

#include "bench_support.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/model.hpp"
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
  Tensor<float> q, k, v, dout;  ///< attention: the kernel's inputs (BM_VerifyAnswers)
  AttentionOptions opt;
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
  p->q = q;
  p->k = k;
  p->v = v;
  p->opt = o;
  return p;
}

/// The backward of attention_problem: cotangent grad_out ~ N(0, 1), the gradients of cpu_fast.
std::unique_ptr<Problem> attention_backward_problem(index_t H, index_t H_kv, index_t T, index_t d, bool sinks) {
  std::unique_ptr<Problem> p = attention_problem(H, H_kv, T, d, sinks);
  auto rng = test::make_rng(77 + static_cast<std::uint64_t>(H));
  p->op = "attention_backward";
  p->dout = test::randn<float>({1, H, T, d}, rng);
  AttentionCotangents<float> dc;
  dc.out = p->dout;
  const AttentionGrads<float> g = token_attention_backward(Backend::cpu_fast, p->q, p->k, p->v, dc, p->opt);
  p->in.emplace("grad_out", stored(p->dout));
  if (sinks) p->in.emplace("null_logits", io::StoredTensor{io::DType::f32, Tensor<double>({H}, p->opt.null_logits)});
  p->out.clear();
  p->out.emplace("grad_q", stored(g.q));
  p->out.emplace("grad_k", stored(g.k));
  p->out.emplace("grad_v", stored(g.v));
  if (sinks) p->out.emplace("grad_null_logits", stored(g.null_logits));
  std::string opts = R"({"causal": true})";
  p->options = io::json::parse(opts);
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

/// Seconds of one call of the cpu_fast kernel computing `p`'s op (attention or its backward).
static double kernel_seconds(const Problem& p) {
  AttentionCotangents<float> dc;  // the backward's cotangent, copied before the clock starts
  if (p.op != "attention") dc.out = p.dout;
  const auto t0 = std::chrono::steady_clock::now();
  if (p.op == "attention")
    benchmark::DoNotOptimize(token_attention(Backend::cpu_fast, p.q, p.k, p.v, p.opt));
  else
    benchmark::DoNotOptimize(token_attention_backward(Backend::cpu_fast, p.q, p.k, p.v, dc, p.opt));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Failing fast: one check of `p`'s outputs as they are (0), with one element moved far off (1) or
/// with every element wrong (2), beside the cpu_fast kernel computing the same op in the same run.
static void answers_bench(benchmark::State& state, Problem& p) {
  const int which = static_cast<int>(state.range(0));
  io::TensorMap out = p.out;
  for (auto& [name, t] : out)
    for (index_t i = 0; i < t.values.size(); ++i)
      if (which == 2 || (which == 1 && i == t.values.size() / 2 && name == out.begin()->first))
        t.values[i] = t.values[i] * 1.5 + 1.0;
  verify::CompareOptions co;
  co.show = 3;
  verify::CompareReport rep;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    rep = verify::check(p.op, p.in, out, p.options, co);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (rep.passed != (which == 0)) abort_run(p.op + ": unexpected verdict\n" + verify::format_report(rep));
  const double kernel_s = kernel_seconds(p);
  bool certain = false;
  for (const auto& t : rep.tensors) certain = certain || t.certain_failure;
  state.counters["check_s"] = seconds;
  state.counters["kernel_s"] = kernel_s;
  state.counters["check_per_kernel"] = kernel_s > 0 ? seconds / kernel_s : 0.0;
  state.counters["mp50_rows"] = static_cast<double>(rep.mp50_rows);
  state.counters["verdict_certain"] = certain ? 1.0 : 0.0;
  state.SetLabel(which == 0 ? "correct" : which == 1 ? "one_wrong" : "all_wrong");
}

static Problem& causal_fwd() {
  static std::unique_ptr<Problem> p = attention_problem(32, 32, 4096, 128, false);
  return *p;
}
static Problem& gptoss_fwd() {
  static std::unique_ptr<Problem> p = attention_problem(64, 8, 4096, 64, true);
  return *p;
}
static void BM_VerifyAnswers_attention_causal_32x4096x128(benchmark::State& state) { answers_bench(state, causal_fwd()); }
static void BM_VerifyAnswers_attention_gptoss_64x4096x64_kv8_sinks(benchmark::State& state) {
  answers_bench(state, gptoss_fwd());
}
static void BM_VerifyAnswers_attention_backward_causal_32x4096x128(benchmark::State& state) {
  static std::unique_ptr<Problem> p = attention_backward_problem(32, 32, 4096, 128, false);
  answers_bench(state, *p);
}
static void BM_VerifyAnswers_attention_backward_gptoss_64x4096x64_kv8_sinks(benchmark::State& state) {
  static std::unique_ptr<Problem> p = attention_backward_problem(64, 8, 4096, 64, true);
  answers_bench(state, *p);
}

/// A check's cost by policy: worst_case (0: the worst-case line alone) and the default
/// probabilistic policy (1: the probabilistic bound computed besides it), beside the cpu_fast kernel.
static void policy_bench(benchmark::State& state, Problem& p) {
  verify::CompareOptions co;
  co.policy = state.range(0) == 0 ? verify::Policy::worst_case : verify::Policy::probabilistic;
  verify::CompareReport rep;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    rep = verify::check(p.op, p.in, p.out, p.options, co);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!rep.passed) abort_run(p.op + " check did not pass:\n" + verify::format_report(rep));
  const double kernel_s = kernel_seconds(p);
  state.counters["check_s"] = seconds;
  state.counters["kernel_s"] = kernel_s;
  state.counters["check_per_kernel"] = kernel_s > 0 ? seconds / kernel_s : 0.0;
  state.SetLabel(std::string(verify::to_string(co.policy)));
}
/// The forward on the causal [1,32,4096,128] outputs of BM_VerifyAnswers: under worst_case the
/// fast oracle leaves out the three products of out's probabilistic bound.
static void BM_VerifyPolicy_attention_causal_32x4096x128(benchmark::State& state) { policy_bench(state, causal_fwd()); }
static void BM_VerifyPolicy_attention_backward_gptoss_8x1024x64_sinks(benchmark::State& state) {
  static std::unique_ptr<Problem> p = attention_backward_problem(8, 8, 1024, 64, true);
  policy_bench(state, *p);
}

/// The depth backward's check by policy (0: worst_case, 1: the default probabilistic policy), both
/// with the fast double oracle, beside the float reference backward (attn_res_route_backward<float>)
/// in the same run: 9 candidates, 256 tokens, d = 4096, the weights' cotangents given.
static void BM_VerifyPolicy_depth_backward_9x256x4096(benchmark::State& state) {
  const index_t n = 9, N = 256, d = 4096;
  static std::vector<SourceKind> kinds;
  static DepthOptions o;
  static Tensor<float> s, g, psi, dh, da, dan;
  static io::TensorMap in, out;
  if (in.empty()) {
    auto rng = test::make_rng(4343);
    kinds.assign(static_cast<std::size_t>(n), SourceKind::attention);
    kinds[0] = SourceKind::initial;
    o.theta = 0.5;
    s = test::randn<float>({n, N, d}, rng);
    g = test::randn<float>({n, N}, rng);
    psi = test::uniform<float>({n, N}, rng, 0.0, 1.0);
    dh = test::randn<float>({N, d}, rng);
    da = test::randn<float>({n, N}, rng, 64.0);
    dan = test::randn<float>({N}, rng, 64.0);
    const DepthGrads<float> r = attn_res_route_backward(s, g, psi, kinds, o, DepthCotangents<float>{dh, da, dan});
    in.emplace("sources", stored(s));
    in.emplace("g_old", stored(g));
    in.emplace("psi", stored(psi));
    in.emplace("grad_h", stored(dh));
    in.emplace("grad_alpha", stored(da));
    in.emplace("grad_alpha_null", stored(dan));
    out.emplace("grad_sources", stored(r.sources));
    out.emplace("grad_g_old", stored(r.g_old));
    out.emplace("grad_psi", stored(r.psi));
    out.emplace("grad_beta", stored(Tensor<float>({1}, {r.beta})));
    out.emplace("grad_theta", stored(Tensor<float>({1}, {r.theta})));
  }
  verify::CompareOptions co;
  co.policy = state.range(0) == 0 ? verify::Policy::worst_case : verify::Policy::probabilistic;
  const io::json::Value opts = io::json::parse(R"({"theta": 0.5, "kinds": ["initial", "attention", "attention", )"
                                               R"("attention", "attention", "attention", "attention", "attention", "attention"]})");
  verify::CompareReport rep;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    rep = verify::check("depth_backward", in, out, opts, co);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!rep.passed) abort_run("depth_backward check did not pass:\n" + verify::format_report(rep));
  const auto t0 = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(attn_res_route_backward(s, g, psi, kinds, o, DepthCotangents<float>{dh, da, dan}));
  const double kernel_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["check_s"] = seconds;
  state.counters["kernel_s"] = kernel_s;
  state.counters["check_per_kernel"] = kernel_s > 0 ? seconds / kernel_s : 0.0;
  state.SetLabel(std::string(verify::to_string(co.policy)) + ", " + rep.oracle);
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
namespace {

/// A random float model, its ids and its float32 trace (Model<float>::run with the trace on).
struct ModelProblem {
  model::ModelConfig cfg;
  io::TensorMap weights, in, trace, logits;
};

model::ModelConfig model_config(index_t vocab, index_t d, index_t blocks, index_t heads) {
  model::ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = d;
  c.n_blocks = blocks;
  c.n_heads = heads;
  c.d_ff = 4 * d;
  return c;
}

std::unique_ptr<ModelProblem> model_problem(const model::ModelConfig& cfg, index_t T) {
  auto p = std::make_unique<ModelProblem>();
  p->cfg = cfg;
  const model::Model<float> m = model::Model<float>::initialized(cfg, 2027);
  for (const auto& [name, t] : m.parameters()) p->weights.emplace(name, stored(t));
  Tensor<double> idt;
  const std::vector<index_t> ids = model_ids(T, cfg.vocab_size, idt);
  p->in.emplace("ids", io::StoredTensor{io::DType::i32, idt});
  model::ForwardOptions fo;
  fo.trace = true;
  p->trace = model::trace_tensors(m.forward(ids, 1, T, fo), io::DType::f32);
  p->logits.emplace("logits", p->trace.at("logits"));
  return p;
}

/// blocks x T x d^2: how the check's cost grows (the mp50 estimate scales a measured small check by it).
double model_work(const model::ModelConfig& c, index_t T) {
  return static_cast<double>(c.n_blocks) * static_cast<double>(T) * static_cast<double>(c.d_model * c.d_model);
}

/// Times one check of the trace (full or logits only) and estimates the mp50 oracle's time by
/// timing it on the small model (d = 64, 2 blocks, T = 32) and scaling by blocks x T x d^2.
void model_bench(benchmark::State& state, ModelProblem& p, index_t T, bool full) {
  verify::CompareOptions co;
  co.show = 3;
  const io::TensorMap& out = full ? p.trace : p.logits;
  verify::CompareReport rep;
  double seconds = 0, cpu_seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    rep = verify::check_model(p.cfg, p.weights, p.in, out, {}, co);
    cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!rep.passed) abort_run("model check did not pass:\n" + verify::format_report(rep));
  static std::unique_ptr<ModelProblem> small = model_problem(model_config(64, 64, 2, 4), 32);
  co.oracle = verify::Oracle::mp50;
  const auto t0 = std::chrono::steady_clock::now();
  const verify::CompareReport mp = verify::check_model(small->cfg, small->weights, small->in, full ? small->trace : small->logits, {}, co);
  const double small_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!mp.passed) abort_run("mp50 model check did not pass:\n" + verify::format_report(mp));
  const double mp50_s = small_s * model_work(p.cfg, T) / model_work(small->cfg, 32);
  state.counters["check_s"] = seconds;
  state.counters["cpu_s"] = cpu_seconds;
  state.counters["mp50_s_estimate"] = mp50_s;
  state.counters["speedup_vs_mp50"] = seconds > 0 ? mp50_s / seconds : 0.0;
  state.SetLabel(rep.oracle);
}

}  // namespace

static void BM_Verify_model_full_d256_4blocks_T128(benchmark::State& state) {
  static std::unique_ptr<ModelProblem> p = model_problem(model_config(256, 256, 4, 4), 128);
  model_bench(state, *p, 128, true);
}
static void BM_Verify_model_logits_d256_4blocks_T128(benchmark::State& state) {
  static std::unique_ptr<ModelProblem> p = model_problem(model_config(256, 256, 4, 4), 128);
  model_bench(state, *p, 128, false);
}
/// GPT-2 small's sizes; one problem for the full-trace and the logits-only check (memory).
static ModelProblem& gpt2_small() {
  static std::unique_ptr<ModelProblem> p = model_problem(model_config(32000, 768, 12, 12), 512);
  return *p;
}
static void BM_Verify_model_full_gpt2small_d768_12blocks_T512(benchmark::State& state) {
  model_bench(state, gpt2_small(), 512, true);
}
static void BM_Verify_model_logits_gpt2small_d768_12blocks_T512(benchmark::State& state) {
  model_bench(state, gpt2_small(), 512, false);
}

// Reading a 64 MiB float32 .npy file (written once, so read from the page cache) into fresh double
// storage each time; validated against the written tensor first.
static void BM_Load_npy_f32_32x4096x128(benchmark::State& state) {
  auto rng = test::make_rng(7);
  const Tensor<float> x = test::randn<float>({1, 32, 4096, 128}, rng);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("oasis_bench_load_" + std::to_string(::getpid()) + ".npy")).string();
  io::write_npy(path, stored(x));
  const io::StoredTensor back = io::read_npy(path);
  for (index_t i = 0; i < x.size(); ++i)
    if (back.values[i] != static_cast<double>(x[i])) abort_run("BM_Load_npy: entry " + std::to_string(i) + " read back wrong");
  const double bytes = static_cast<double>(std::filesystem::file_size(path));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(io::read_npy(path));
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double gbs = bytes * static_cast<double>(state.iterations()) / sec * 1e-9;
  state.counters["GB/s"] = gbs;
  state.counters["ratio_triad"] = g_triad_gbs > 0 ? gbs / g_triad_gbs : 0;
  std::filesystem::remove(path);
}

BENCHMARK(BM_Load_npy_f32_32x4096x128)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VerifyAnswers_attention_causal_32x4096x128)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyAnswers_attention_gptoss_64x4096x64_kv8_sinks)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyAnswers_attention_backward_causal_32x4096x128)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyAnswers_attention_backward_gptoss_64x4096x64_kv8_sinks)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyPolicy_depth_backward_9x256x4096)->DenseRange(0, 1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyPolicy_attention_causal_32x4096x128)->DenseRange(0, 1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyPolicy_attention_backward_gptoss_8x1024x64_sinks)->DenseRange(0, 1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_attention_causal_32x4096x128)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_attention_gptoss_64x4096x64_kv8_sinks)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_depth_8192_tokens_33_sources_d2048)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_model_full_d256_4blocks_T128)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_model_logits_d256_4blocks_T128)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_model_full_gpt2small_d768_12blocks_T512)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Verify_model_logits_gpt2small_d768_12blocks_T512)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace oasis_bench
