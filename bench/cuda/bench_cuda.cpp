// bench/cuda/bench_cuda.cpp — throughput of the CUDA backend on device buffers.
//
//   BM_FusedAttention/dtype/d_h/T/causal   B = 4, H = 32, H_kv = 8 (GQA), Tq = Tk = T, Softmax1
//   BM_WindowedAttention/d_h/T             as BM_FusedAttention (bf16, causal) with a sliding window of 128
//   BM_DecodeAttention/d_h/Tk              B = 16, H = 32, H_kv = 8, Tq = 1 (one new token)
//   BM_DepthRoute/n/N                       Full AttnRes routing of N tokens over n sources, d = 2048
//   BM_PseudoQueryLogits/n/N                g = w^T RMSNorm(v_i), d = 2048
// Time is measured with CUDA events around the kernels (manual time); counters report TFLOP/s
// (attention: 4 d_h flops per visible (query, key) pair: QK^T and PV) and GB/s (router: bytes of
// the sources read plus the routed state written). Without a device every benchmark is skipped
// with the reason.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "oasis/cuda.hpp"

namespace {

using oasis::index_t;
using oasis::io::DType;
namespace cu = oasis::cuda;

/// The dtype argument of BM_FusedAttention: 0 f32, 1 f16, 2 bf16.
constexpr DType kDtypeArg[] = {DType::f32, DType::f16, DType::bf16};

bool skip_without_device(benchmark::State& state) {
  std::string why;
  if (cu::available(&why)) return false;
  state.SkipWithError(("cuda is not available: " + why).c_str());
  return true;
}

/// Device buffer of n values of the given element type: a block of 2^20 N(0, sd^2) samples
/// repeated (the values only set the data pattern; generating billions of samples would dominate).
struct Buffer {
  void* p = nullptr;
  Buffer(std::size_t n, DType t, double sd, std::uint64_t seed) {
    const std::size_t block = std::min<std::size_t>(n, std::size_t(1) << 20);
    const std::size_t elem = t == DType::f32 ? sizeof(float) : sizeof(std::uint16_t);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sd));
    std::vector<float> hf(t == DType::f32 ? block : 0);
    std::vector<std::uint16_t> hh(t == DType::f32 ? 0 : block);
    for (std::size_t i = 0; i < block; ++i) {
      if (t == DType::f32) hf[i] = nd(rng);
      else hh[i] = oasis::io::round_to_bits(nd(rng), t);
    }
    const void* src = t == DType::f32 ? static_cast<const void*>(hf.data()) : static_cast<const void*>(hh.data());
    cudaMalloc(&p, n * elem);
    for (std::size_t off = 0; off < n; off += block)
      cudaMemcpy(static_cast<char*>(p) + off * elem, src, std::min(block, n - off) * elem, cudaMemcpyHostToDevice);
  }
  explicit Buffer(std::size_t bytes) { cudaMalloc(&p, bytes); cudaMemset(p, 0, bytes); }
  ~Buffer() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
};

struct Events {
  cudaEvent_t a, b;
  Events() { cudaEventCreate(&a); cudaEventCreate(&b); }
  ~Events() { cudaEventDestroy(a); cudaEventDestroy(b); }
  template <class F>
  double seconds(F&& f) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / 1e3;
  }
};

void run_attention(benchmark::State& state, DType dtype, index_t B, index_t H, index_t Hkv, index_t Tq, index_t Tk,
                   index_t dh, bool causal, index_t window = 0) {
  if (skip_without_device(state)) return;
  Buffer q(static_cast<std::size_t>(B * H * Tq * dh), dtype, 1.0, 1), k(static_cast<std::size_t>(B * Hkv * Tk * dh), dtype, 1.0, 2),
      v(static_cast<std::size_t>(B * Hkv * Tk * dh), dtype, 1.0, 3);
  Buffer out(static_cast<std::size_t>(B * H * Tq * dh) * sizeof(float)), lse(static_cast<std::size_t>(B * H * Tq) * sizeof(float)),
      pn(static_cast<std::size_t>(B * H * Tq) * sizeof(float));
  cu::DeviceAttention a;
  a.dtype = dtype;
  a.q = q.p; a.k = k.p; a.v = v.p;
  a.shape = oasis::AttentionShape{B, H, Hkv, Tq, Tk, dh, dh};
  a.causal = causal;
  a.window = window;
  a.out = out.f(); a.lse = lse.f(); a.p_null = pn.f();
  cu::token_attention_device(a);  // warm-up
  cudaDeviceSynchronize();
  Events ev;
  for (auto _ : state) state.SetIterationTime(ev.seconds([&] { cu::token_attention_device(a); }));
  // visible (query, key) pairs: bottom-right causal row t sees min(Tk, t + Tk - Tq + 1) keys, at
  // most W with a window
  double pairs = 0;
  for (index_t t = 0; t < Tq; ++t) {
    index_t n = causal || window > 0 ? std::min(Tk, t + Tk - Tq + 1) : Tk;
    if (window > 0) n = std::min(n, window);
    pairs += static_cast<double>(n);
  }
  const double flops = 4.0 * static_cast<double>(B * H * dh) * pairs;
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(B * H * Tq), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_FusedAttention(benchmark::State& state) {
  const DType dtype = kDtypeArg[state.range(0)];
  run_attention(state, dtype, 4, 32, 8, state.range(2), state.range(2), state.range(1), state.range(3) != 0);
  state.SetLabel(std::string(oasis::io::to_string(dtype)));
}
BENCHMARK(BM_FusedAttention)
    ->ArgNames({"dtype", "d_h", "T", "causal"})
    ->ArgsProduct({{0, 1, 2}, {64, 128}, {1024, 4096}, {1}})
    ->Args({0, 128, 8192, 1})
    ->Args({1, 128, 8192, 1})
    ->Args({1, 128, 4096, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// gpt-oss's windowed layers: W = 128; the kernel visits only each query block's band of key tiles
void BM_WindowedAttention(benchmark::State& state) {
  run_attention(state, DType::bf16, 4, 32, 8, state.range(1), state.range(1), state.range(0), true, 128);
}
BENCHMARK(BM_WindowedAttention)->ArgNames({"d_h", "T"})->ArgsProduct({{64}, {4096, 8192}})->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_DecodeAttention(benchmark::State& state) {
  run_attention(state, DType::f16, 16, 32, 8, 1, state.range(1), state.range(0), true);
}
BENCHMARK(BM_DecodeAttention)->ArgNames({"d_h", "Tk"})->ArgsProduct({{64, 128}, {8192}})->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_DepthRoute(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const index_t n = state.range(0), N = state.range(1), d = 2048;
  std::vector<oasis::SourceKind> kinds(static_cast<std::size_t>(n), oasis::SourceKind::attention);
  kinds[0] = oasis::SourceKind::initial;
  for (index_t i = 2; i < n; i += 2) kinds[static_cast<std::size_t>(i)] = oasis::SourceKind::headless;
  Buffer s(static_cast<std::size_t>(n * N * d), DType::f32, 1.0, 4), g_old(static_cast<std::size_t>(n * N), DType::f32, 1.0, 5);
  Buffer psi(static_cast<std::size_t>(n * N) * sizeof(float));  // zeros: valid probabilities
  Buffer h(static_cast<std::size_t>(N * d) * sizeof(float)), alpha(static_cast<std::size_t>(n * N) * sizeof(float)),
      an(static_cast<std::size_t>(N) * sizeof(float)), g(static_cast<std::size_t>(n * N) * sizeof(float)),
      dpsi(static_cast<std::size_t>(n * N) * sizeof(float));
  const oasis::DepthOptions opt;  // OASIS: Softmax1 over depth, paper_v2 coupling
  auto run = [&] {
    cu::attn_res_route_device(s.f(), g_old.f(), psi.f(), n, N, d, kinds, opt, h.f(), alpha.f(), an.f(), g.f(), dpsi.f());
  };
  run();
  cudaDeviceSynchronize();
  Events ev;
  for (auto _ : state) state.SetIterationTime(ev.seconds(run));
  const double bytes = 4.0 * static_cast<double>(n * N * d + N * d + 5 * n * N);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(N), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DepthRoute)->ArgNames({"n", "N"})->ArgsProduct({{9, 33}, {8192}})->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_PseudoQueryLogits(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const index_t n = state.range(0), N = state.range(1), d = 2048;
  Buffer s(static_cast<std::size_t>(n * N * d), DType::f32, 1.0, 6), w(static_cast<std::size_t>(d), DType::f32, 0.1, 7);
  Buffer g(static_cast<std::size_t>(n * N) * sizeof(float));
  auto run = [&] { cu::pseudo_query_logits_device(s.f(), n, N, d, w.f(), nullptr, oasis::KeyNormOptions{}, g.f()); };
  run();
  cudaDeviceSynchronize();
  Events ev;
  for (auto _ : state) state.SetIterationTime(ev.seconds(run));
  state.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(n * N * d), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PseudoQueryLogits)->ArgNames({"n", "N"})->ArgsProduct({{9, 33}, {8192}})->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
