// bench/bench_model.cpp — one full AttnRes transformer block of the model oracle
// (include/oasis/model, Model<float>, OASIS variant, Kimi full routing): attention sublayer and
// SwiGLU MLP sublayer with their depth routers, final readout router, norm and a small LM head.
// This is the plain scalar reference (the error-tracking oracle with tracking off), timed so the
// fast composed sublayer of bench_cpu.cpp (BM_Layer_attnres_attention_sublayer) has a reference
// point; it has no fast counterpart to validate.
#include <benchmark/benchmark.h>

#include <chrono>

#include "bench_support.hpp"
#include "oasis/model/model.hpp"
#include "oasis_random.hpp"

namespace oasis_bench {
namespace {

using namespace oasis;

void BM_Layer_model_reference_block(benchmark::State& st) {
  model::ModelConfig cfg;
  cfg.vocab_size = 32;
  cfg.d_model = 512;
  cfg.n_blocks = 1;
  cfg.n_heads = 8;
  cfg.d_ff = 1024;
  const index_t T = st.range(0), d = cfg.d_model, f = cfg.d_ff, H = cfg.n_heads, dh = d / H;
  const model::Model<float> m = model::Model<float>::initialized(cfg, 5);
  auto rng = oasis::test::make_rng(400);
  const Tensor<float> x = oasis::test::randn<float>({1, T, d}, rng);
  // counted work: q, k, v, o projections, causal attention, SwiGLU (3 d x f products), LM head
  const double flops = 4.0 * 2.0 * T * d * d + static_cast<double>(H) * T * (T + 1) / 2.0 * 4.0 * dh +
                       3.0 * 2.0 * T * d * f + 2.0 * T * d * cfg.vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : st) benchmark::DoNotOptimize(m.forward_embeddings(x));
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = flops * static_cast<double>(st.iterations()) / sec * 1e-9;
  st.counters["GFLOP/s"] = rate;
  st.counters["ratio_gemm"] = g_gemm_gflops > 0 ? rate / g_gemm_gflops : 0;
  st.SetLabel("Model<float>, d=512, 8 heads, d_ff=1024, 1 block");
}
BENCHMARK(BM_Layer_model_reference_block)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace oasis_bench
