// bench/bench_verify_grad.cpp — op model on a whole training step's trace: the forward trace and
// every gradient tensor a backward can dump (docs/verify-model.md, "Model gradients"), checked with
// the fast oracle, at three sizes:
//
//   BM_VerifyGrad_model_worked_example       vocab 32, d 16, 2 blocks, 2 heads, T 6 (the worked example's model)
//   BM_VerifyGrad_model_d256_4blocks_T128    vocab 256, d 256, 4 blocks, 4 heads, T 128
//   BM_VerifyGrad_model_gpt2small_d768_12blocks_T512
//                                            vocab 32000, d 768, 12 blocks, 12 heads, T 512 (GPT-2 small)
//
// The "implementation" is the library's own float32 model (Model<float>, its forward traced, its
// backward by model_backward with blocked matrix products) from the cross-entropy gradient of the
// next-token loss, grad_logits = (softmax(logits) - onehot(next id)) / T. Every tensor is checked:
// the forward trace, grad.<parameter>, grad_embeddings, grad_state and every sublayer's grad_*
// (so the routers' and sublayers' local backward steps run too). Counters: check_s (wall time of
// verify::check_model), cpu_s (process CPU time, all threads), peak_rss_gb (the process's resident
// peak during the check, the problem's own tensors included; the peak is reset before the check
// through /proc/self/clear_refs), rss_before_gb (resident before the check), tensors (rows of the
// report). Target (docs/benchmarks.md): GPT-2 small in at most 300 s on two cores. A check that
// does not PASS aborts the run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>

#include "bench_support.hpp"
#include "matrix_products.hpp"
#include "model_grad_replays.hpp"
#include "oasis/grad/model_backward.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/model.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/report.hpp"

namespace oasis_bench {
using namespace oasis;
namespace io = oasis::io;

namespace {

namespace om = oasis::model;

io::StoredTensor f32(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }

/// A float32 model's weights, ids, grad_logits and its whole forward and backward trace.
struct GradProblem {
  om::ModelConfig cfg;
  io::TensorMap weights, in, trace;
};

std::unique_ptr<GradProblem> grad_problem(const om::ModelConfig& cfg, index_t T, double init_std) {
  auto p = std::make_unique<GradProblem>();
  p->cfg = cfg;
  p->cfg.init_std = init_std;
  const om::Model<float> m = om::Model<float>::initialized(p->cfg, 2027);
  for (const auto& [name, t] : m.parameters()) p->weights.emplace(name, f32(t));
  Tensor<double> idt;
  const std::vector<index_t> ids = model_ids(T, cfg.vocab_size, idt);
  p->in.emplace("ids", io::StoredTensor{io::DType::i32, idt});
  om::ForwardOptions fo;
  fo.trace = true;
  fo.products = &oasis::verify::matrix_products();
  const om::ForwardResult<float> f = m.forward(ids, 1, T, fo);
  p->trace = om::trace_tensors(f, io::DType::f32);
  // grad_logits of the mean next-token cross-entropy (the last position predicts the first id)
  const index_t V = cfg.vocab_size;
  Tensor<float> dl({1, T, V});
  for (index_t t = 0; t < T; ++t) {
    const float* z = f.logits.ptr(0) + t * V;
    float zmax = z[0];
    for (index_t v = 1; v < V; ++v) zmax = std::max(zmax, z[v]);
    double s = 0;
    for (index_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(z[v] - zmax));
    for (index_t v = 0; v < V; ++v)
      dl[t * V + v] = static_cast<float>(std::exp(static_cast<double>(z[v] - zmax)) / s / static_cast<double>(T));
    dl[t * V + ids[static_cast<std::size_t>((t + 1) % T)]] -= 1.0f / static_cast<float>(T);
  }
  p->in.emplace("grad_logits", f32(dl));
  const om::ModelGrads<float> g = om::model_backward(m, ids, 1, T, dl, {}, fo);
  for (const std::string& n : verify::detail::gradient_names(g)) p->trace.emplace(n, f32(*verify::detail::find_gradient(g, n)));
  return p;
}

/// VmHWM or VmRSS of /proc/self/status in GB (0 where unreadable).
double proc_status_gb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) * 1024.0 / 1e9;
  return 0.0;
}

void grad_bench(benchmark::State& state, const GradProblem& p) {
  verify::CompareOptions co;
  co.show = 3;
  verify::CompareReport rep;
  double seconds = 0, cpu_seconds = 0, before = 0, peak = 0;
  for (auto _ : state) {
    before = proc_status_gb("VmRSS");
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current resident size
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    rep = verify::check_model(p.cfg, p.weights, p.in, p.trace, {}, co);
    cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    peak = proc_status_gb("VmHWM");
  }
  if (!rep.passed) abort_run("model gradient check did not pass:\n" + verify::format_report(rep));
  state.counters["check_s"] = seconds;
  state.counters["cpu_s"] = cpu_seconds;
  state.counters["peak_rss_gb"] = peak;
  state.counters["rss_before_gb"] = before;
  state.counters["tensors"] = static_cast<double>(rep.tensors.size());
  state.SetLabel(rep.oracle);
}

om::ModelConfig config(index_t vocab, index_t d, index_t blocks, index_t heads, index_t d_ff) {
  om::ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = d;
  c.n_blocks = blocks;
  c.n_heads = heads;
  c.d_ff = d_ff;
  return c;
}

}  // namespace

static void BM_VerifyGrad_model_worked_example(benchmark::State& state) {
  static std::unique_ptr<GradProblem> p = grad_problem(config(32, 16, 2, 2, 32), 6, 0.3);
  grad_bench(state, *p);
}
static void BM_VerifyGrad_model_d256_4blocks_T128(benchmark::State& state) {
  static std::unique_ptr<GradProblem> p = grad_problem(config(256, 256, 4, 4, 1024), 128, om::ModelConfig{}.init_std);
  grad_bench(state, *p);
}
static void BM_VerifyGrad_model_gpt2small_d768_12blocks_T512(benchmark::State& state) {
  static std::unique_ptr<GradProblem> p = grad_problem(config(32000, 768, 12, 12, 3072), 512, om::ModelConfig{}.init_std);
  grad_bench(state, *p);
}

BENCHMARK(BM_VerifyGrad_model_worked_example)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyGrad_model_d256_4blocks_T128)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_VerifyGrad_model_gpt2small_d768_12blocks_T512)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace oasis_bench
