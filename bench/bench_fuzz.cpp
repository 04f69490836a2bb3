// bench/bench_fuzz.cpp — a full fuzz (oasis/verify/fuzz.hpp, docs/fuzz.md) of a correct kernel:
// every regime of the op, in f32 and bf16 inputs, each run judged by the compare engine. The
// kernel is the library's float32 reference (fuzz::reference_kernel), an eager implementation of
// the kind users fuzz; its own time is measured in the same run (`kernel_s`), so `check_per_kernel`
// is the fuzzer's overhead per unit of kernel work. `runs` counts the regime runs. A fuzz that does
// not PASS aborts the run.
//
//   BM_Fuzz_attention            every attention regime (forward)
//   BM_Fuzz_attention_backward   every attention_backward regime
//   BM_Fuzz_depth_backward       every depth_backward regime
// Target (docs/benchmarks.md): a full fuzz, forward and backward, under 2 minutes on 2 cores.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "oasis/verify/fuzz.hpp"

namespace {

namespace fz = oasis::verify::fuzz;
using Clock = std::chrono::steady_clock;

void fuzz_bench(benchmark::State& state, const std::string& op) {
  double kernel_s = 0, total_s = 0;
  std::size_t runs = 0;
  const fz::Kernel ref = fz::reference_kernel(op);
  const fz::Kernel timed = [&](const oasis::io::TensorMap& in, const oasis::io::json::Value& o) {
    const auto t0 = Clock::now();
    oasis::io::TensorMap out = ref(in, o);
    kernel_s += std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  };
  fz::FuzzOptions opt;
  opt.dtypes = {oasis::io::DType::f32, oasis::io::DType::bf16};
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const fz::FuzzReport r = fz::fuzz(op, timed, opt);
    total_s += std::chrono::duration<double>(Clock::now() - t0).count();
    runs = r.runs.size();
    if (!r.passed) {
      std::fprintf(stderr, "%s", fz::format_fuzz_report(r).c_str());
      std::abort();
    }
  }
  state.counters["runs"] = static_cast<double>(runs);
  state.counters["kernel_s"] = kernel_s / static_cast<double>(state.iterations());
  state.counters["check_per_kernel"] = (total_s - kernel_s) / std::max(kernel_s, 1e-9);
}

}  // namespace

static void BM_Fuzz_attention(benchmark::State& state) { fuzz_bench(state, "attention"); }
static void BM_Fuzz_attention_backward(benchmark::State& state) { fuzz_bench(state, "attention_backward"); }
static void BM_Fuzz_depth_backward(benchmark::State& state) { fuzz_bench(state, "depth_backward"); }
BENCHMARK(BM_Fuzz_attention)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Fuzz_attention_backward)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK(BM_Fuzz_depth_backward)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();
