// bench/cuda/bench_cuda.cpp — throughput of the CUDA backend on device buffers, with the device's
// own ceilings measured in the same run (at the start and again at the end, as bench_cpu does).
//
//   BM_Ceiling_CopyD2D                      device-to-device copy of 1 GiB; GB/s = bytes read + written
//   BM_Ceiling_GemmBf16                     cuBLAS cublasGemmEx, bf16 in/out, fp32 accumulation, 8192^3
//   BM_FusedAttention/dtype/d_h/T/causal    the fused float32 kernel: B = 4, H = 32, H_kv = 8, Tq = Tk = T
//   BM_TensorCoreAttention/dtype/d_h/T      the tensor-core kernel, same shapes, causal (f16, bf16)
//   BM_WindowedAttention/d_h/T              the fused kernel (bf16, causal) with a sliding window of 128
//   BM_Decode/kernel/d_h                    one new token over Tk = 8192 cached keys, B = 16, H = 32,
//                                           H_kv = 8, f16: the fused kernel (0) and split-K (1)
//   BM_DepthRoute/n/N                       Full AttnRes routing of N tokens over n sources, d = 2048
//   BM_PseudoQueryLogits/n/N                g = w^T RMSNorm(v_i), d = 2048
// Time is measured with CUDA events around the kernels (manual time). Counters: TFLOP/s
// (attention: 4 d_h flops per visible (query, key) pair: QK^T and PV) with ratio_gemm (over the
// bf16 GEMM ceiling), GB/s with ratio_copy (decode: bytes of K and V read; router: sources read
// plus the routed state written; over the copy ceiling). Every attention configuration is
// validated against the long double oracle under its parity rule before it is timed (a failure
// stops the run with exit status 2, as bench_cpu). Without a device every benchmark is skipped
// with the reason.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "oasis/backends/cuda.hpp"
#include "oasis/ops/error_bounds.hpp"

namespace {

using oasis::index_t;
using oasis::Tensor;
using oasis::io::DType;
namespace cu = oasis::cuda;

/// The dtype argument of the attention benchmarks: 0 f32, 1 f16, 2 bf16.
constexpr DType kDtypeArg[] = {DType::f32, DType::f16, DType::bf16};

/// Ceilings measured earlier in this run (0 until their benchmark ran).
double g_copy_gbs = 0, g_gemm_tflops = 0;

bool skip_without_device(benchmark::State& state) {
  std::string why;
  if (cu::available(&why)) return false;
  state.SkipWithError(("cuda is not available: " + why).c_str());
  return true;
}

[[noreturn]] void abort_run(const std::string& what) {
  std::fprintf(stderr, "bench_cuda: VALIDATION FAILED, not timing: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(2);
}

/// Device buffer of n values of the given element type: a block of 2^20 N(0, sd^2) samples
/// repeated (the values only set the data pattern; generating billions of samples would
/// dominate). value(i) is element i as a float (the widened 16-bit value), for the validation.
struct Buffer {
  void* p = nullptr;
  DType type = DType::f32;
  std::vector<float> block;
  Buffer(std::size_t n, DType t, double sd, std::uint64_t seed) : type(t) {
    block.resize(std::min<std::size_t>(n, std::size_t(1) << 20));
    const std::size_t elem = t == DType::f32 ? sizeof(float) : sizeof(std::uint16_t);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sd));
    std::vector<std::uint16_t> hh(t == DType::f32 ? 0 : block.size());
    for (std::size_t i = 0; i < block.size(); ++i) {
      block[i] = nd(rng);
      if (t != DType::f32) {
        hh[i] = oasis::io::round_to_bits(block[i], t);
        block[i] = oasis::io::widen_bits(hh[i], t);
      }
    }
    const void* src = t == DType::f32 ? static_cast<const void*>(block.data()) : static_cast<const void*>(hh.data());
    cudaMalloc(&p, n * elem);
    for (std::size_t off = 0; off < n; off += block.size())
      cudaMemcpy(static_cast<char*>(p) + off * elem, src, std::min(block.size(), n - off) * elem, cudaMemcpyHostToDevice);
  }
  explicit Buffer(std::size_t bytes) { cudaMalloc(&p, bytes); cudaMemset(p, 0, bytes); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
  float value(std::size_t i) const { return block[i % block.size()]; }
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

// --- ceilings --------------------------------------------------------------------------------------

/// Sets `ratio` = rate / ceiling, the rate being `work` per iteration over the timed seconds.
void set_ratio(benchmark::State& state, const char* ratio, double work, double seconds, double ceiling) {
  if (seconds > 0 && ceiling > 0)
    state.counters[ratio] = work * static_cast<double>(state.iterations()) / seconds / ceiling;
}

void BM_Ceiling_CopyD2D(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const std::size_t bytes = std::size_t(1) << 30;
  Buffer src(bytes), dst(bytes);
  cudaMemcpy(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice);
  Events ev;
  double total = 0;
  for (auto _ : state) {
    const double t = ev.seconds([&] { cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice); });
    total += t;
    state.SetIterationTime(t);
  }
  const double moved = 2.0 * static_cast<double>(bytes);  // read and written
  state.counters["GB/s"] = benchmark::Counter(moved * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ratio_copy"] = 1.0;
  if (g_copy_gbs == 0 && total > 0) g_copy_gbs = moved * 1e-9 * static_cast<double>(state.iterations()) / total;
}

void BM_Ceiling_GemmBf16(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const int n = static_cast<int>(state.range(0));
  const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  Buffer A(count, DType::bf16, 1.0, 11), B(count, DType::bf16, 1.0, 12), C(count * sizeof(std::uint16_t));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.p, CUDA_R_16BF, n, B.p, CUDA_R_16BF, n, &beta,
                        C.p, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  if (gemm() != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    state.SkipWithError("cublasGemmEx (bf16, CUBLAS_COMPUTE_32F) failed");
    return;
  }
  cudaDeviceSynchronize();
  Events ev;
  double total = 0;
  for (auto _ : state) {
    const double t = ev.seconds(gemm);
    total += t;
    state.SetIterationTime(t);
  }
  cublasDestroy(h);
  const double flops = 2.0 * n * static_cast<double>(n) * n;
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ratio_gemm"] = 1.0;
  if (g_gemm_tflops == 0 && total > 0) g_gemm_tflops = flops * 1e-12 * static_cast<double>(state.iterations()) / total;
}

// --- validation before timing ----------------------------------------------------------------------

/// The rows [t0, t0 + rows) of query head h of batch b and the keys [0, keys) of its kv head, as
/// float tensors [1, 1, T, d] (the widened 16-bit values).
struct Slice {
  Tensor<float> q, k, v;
};
Slice slice(const Buffer& q, const Buffer& k, const Buffer& v, index_t H, index_t Hkv, index_t Tq, index_t Tk,
            index_t dh, index_t b, index_t h, index_t t0, index_t rows, index_t keys) {
  const index_t hk = h / (H / Hkv);
  Slice s{Tensor<float>({1, 1, rows, dh}), Tensor<float>({1, 1, keys, dh}), Tensor<float>({1, 1, keys, dh})};
  for (index_t t = 0; t < rows; ++t)
    for (index_t c = 0; c < dh; ++c)
      s.q(0, 0, t, c) = q.value(static_cast<std::size_t>(((b * H + h) * Tq + t0 + t) * dh + c));
  for (index_t j = 0; j < keys; ++j)
    for (index_t c = 0; c < dh; ++c) {
      const std::size_t e = static_cast<std::size_t>(((b * Hkv + hk) * Tk + j) * dh + c);
      s.k(0, 0, j, c) = k.value(e);
      s.v(0, 0, j, c) = v.value(e);
    }
  return s;
}

/// The kernel parity rule on rows of one (b, h): the device's out / lse / p_null rows against the
/// long double oracle and the plain float reference on the slice, with the P-rounding term for
/// the tensor-core kernel. Returns "" when it holds.
std::string check_rows(const Slice& s, bool causal, index_t window, const float* out, const float* lse, const float* pn,
                       index_t dh, bool tensor_cores, DType dtype) {
  using L = long double;
  oasis::AttentionOptions opt;
  opt.causal = causal;
  opt.window = window;
  const oasis::AttentionResult<float> ref = oasis::token_attention(s.q, s.k, s.v, opt);
  oasis::AttentionOptions hp_opt = opt;
  hp_opt.return_probs = true;
  const oasis::AttentionResult<L> hp = oasis::token_attention(s.q.cast<L>(), s.k.cast<L>(), s.v.cast<L>(), hp_opt);
  oasis::bounds::AttentionBounds b = oasis::bounds::attention_bounds(s.q, s.k, s.v, opt, hp);
  if (tensor_cores) {
    const Tensor<double> term = oasis::bounds::p_rounding_bound(
        s.q, s.k, s.v, opt, hp, dtype == DType::f16 ? oasis::bounds::kBinary16 : oasis::bounds::kBfloat16);
    for (index_t i = 0; i < b.out.size(); ++i) b.out[i] += term[i];
  }
  const index_t rows = s.q.dim(2);
  Tensor<float> got_out({1, 1, rows, dh}), got_lse({1, 1, rows}), got_pn({1, 1, rows});
  std::copy(out, out + rows * dh, got_out.data());
  std::copy(lse, lse + rows, got_lse.data());
  std::copy(pn, pn + rows, got_pn.data());
  oasis::bounds::ParityOutcome o;
  oasis::bounds::check_parity("out", got_out, ref.out, hp.out, b.out, o);
  oasis::bounds::check_parity("lse", got_lse, ref.lse, hp.lse, b.lse, o);
  oasis::bounds::check_parity("p_null", got_pn, ref.p_null, hp.p_null, b.p_null, o);
  return o.ok ? "" : o.first;
}

/// Validates a device attention result (out [B, H, Tq, d], lse / p_null [B, H, Tq] on the
/// device) on two heads: the last 2 query rows (every key) and, when causal, the first 64 rows
/// (bottom-right alignment and a window keep each row's keys in these slices).
void validate(const char* what, const Buffer& q, const Buffer& k, const Buffer& v, const Buffer& out,
              const Buffer& lse, const Buffer& pn, index_t B, index_t H, index_t Hkv, index_t Tq, index_t Tk,
              index_t dh, bool causal, index_t window, bool tensor_cores, DType dtype) {
  for (const auto [b, h] : {std::pair<index_t, index_t>{0, 0}, std::pair<index_t, index_t>{B - 1, H - 1}}) {
    auto check = [&](index_t t0, index_t rows, index_t keys, const char* part) {
      std::vector<float> o(static_cast<std::size_t>(rows * dh)), l(static_cast<std::size_t>(rows)),
          p(static_cast<std::size_t>(rows));
      const std::size_t row0 = static_cast<std::size_t>((b * H + h) * Tq + t0);
      cudaMemcpy(o.data(), out.f() + row0 * static_cast<std::size_t>(dh), o.size() * sizeof(float), cudaMemcpyDeviceToHost);
      cudaMemcpy(l.data(), lse.f() + row0, l.size() * sizeof(float), cudaMemcpyDeviceToHost);
      cudaMemcpy(p.data(), pn.f() + row0, p.size() * sizeof(float), cudaMemcpyDeviceToHost);
      const std::string r = check_rows(slice(q, k, v, H, Hkv, Tq, Tk, dh, b, h, t0, rows, keys), causal, window,
                                       o.data(), l.data(), p.data(), dh, tensor_cores, dtype);
      if (!r.empty())
        abort_run(std::string(what) + ", batch " + std::to_string(b) + " head " + std::to_string(h) + ", " + part +
                  ":\n" + r);
    };
    const index_t last = std::min<index_t>(2, Tq);
    check(Tq - last, last, Tk, "last rows");
    if (causal && Tq > last) {
      const index_t first = std::min<index_t>(64, Tq - last);
      const index_t keys = std::min(Tk, first + Tk - Tq);
      if (keys > 0) check(0, first, keys, "first rows");
    }
  }
}

// --- attention ---------------------------------------------------------------------------------------

/// Which same-run ceiling an attention benchmark is compared with.
enum class Ceiling { gemm, copy };

void run_attention(benchmark::State& state, DType dtype, index_t B, index_t H, index_t Hkv, index_t Tq, index_t Tk,
                   index_t dh, bool causal, cu::KernelOptions kernel, Ceiling ceiling, index_t window = 0) {
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
  a.kernel = kernel;
  const cu::KernelChoice choice = cu::kernel_choice(a.shape, kernel);
  cu::token_attention_device(a);  // warm-up, and the result validated before timing
  cudaDeviceSynchronize();
  const std::string what = std::string(cu::to_string(choice.kernel)) + " attention, " +
                           std::string(oasis::io::to_string(dtype)) + ", B=" + std::to_string(B) + " H=" +
                           std::to_string(H) + " H_kv=" + std::to_string(Hkv) + " Tq=" + std::to_string(Tq) +
                           " Tk=" + std::to_string(Tk) + " d_h=" + std::to_string(dh) + (causal ? " causal" : "") +
                           (window > 0 ? " window=" + std::to_string(window) : "");
  validate(what.c_str(), q, k, v, out, lse, pn, B, H, Hkv, Tq, Tk, dh, causal, window,
           choice.kernel == cu::AttentionKernel::tensor_cores, dtype);
  Events ev;
  double total = 0;
  for (auto _ : state) {
    const double t = ev.seconds([&] { cu::token_attention_device(a); });
    total += t;
    state.SetIterationTime(t);
  }
  // visible (query, key) pairs: bottom-right causal row t sees min(Tk, t + Tk - Tq + 1) keys, at
  // most W with a window
  double pairs = 0;
  for (index_t t = 0; t < Tq; ++t) {
    index_t n = causal || window > 0 ? std::min(Tk, t + Tk - Tq + 1) : Tk;
    if (window > 0) n = std::min(n, window);
    pairs += static_cast<double>(n);
  }
  const double flops = 4.0 * static_cast<double>(B * H * dh) * pairs;
  // K and V bytes, read once per kv head (the decode benchmarks' measure)
  const double kv_bytes = 2.0 * static_cast<double>(B * Hkv * Tk * dh) * static_cast<double>(oasis::io::dtype_size(dtype));
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["KV GB/s"] = benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (ceiling == Ceiling::gemm) set_ratio(state, "ratio_gemm", flops * 1e-12, total, g_gemm_tflops);
  else set_ratio(state, "ratio_copy", kv_bytes * 1e-9, total, g_copy_gbs);
  if (choice.kernel == cu::AttentionKernel::split_keys) state.counters["key_splits"] = choice.key_splits;
  state.SetLabel(std::string(oasis::io::to_string(dtype)) + " " + cu::to_string(choice.kernel));
}

void BM_FusedAttention(benchmark::State& state) {
  run_attention(state, kDtypeArg[state.range(0)], 4, 32, 8, state.range(2), state.range(2), state.range(1),
                state.range(3) != 0, {cu::AttentionKernel::fused, 0}, Ceiling::gemm);
}

void BM_TensorCoreAttention(benchmark::State& state) {
  run_attention(state, kDtypeArg[state.range(0)], 4, 32, 8, state.range(2), state.range(2), state.range(1), true,
                {cu::AttentionKernel::tensor_cores, 0}, Ceiling::gemm);
}

// gpt-oss's windowed layers: W = 128; the kernel visits only each query block's band of key tiles
void BM_WindowedAttention(benchmark::State& state) {
  run_attention(state, DType::bf16, 4, 32, 8, state.range(1), state.range(1), state.range(0), true,
                {cu::AttentionKernel::fused, 0}, Ceiling::gemm, 128);
}

void BM_Decode(benchmark::State& state) {
  const cu::AttentionKernel kernel = state.range(0) == 0 ? cu::AttentionKernel::fused : cu::AttentionKernel::split_keys;
  run_attention(state, DType::f16, 16, 32, 8, 1, 8192, state.range(1), true, {kernel, 0}, Ceiling::copy);
}

// --- depth routing -------------------------------------------------------------------------------------

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
  double total = 0;
  for (auto _ : state) {
    const double t = ev.seconds(run);
    total += t;
    state.SetIterationTime(t);
  }
  const double bytes = 4.0 * static_cast<double>(n * N * d + N * d + 5 * n * N);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(N), benchmark::Counter::kIsIterationInvariantRate);
  set_ratio(state, "ratio_copy", bytes * 1e-9, total, g_copy_gbs);
}

void BM_PseudoQueryLogits(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const index_t n = state.range(0), N = state.range(1), d = 2048;
  Buffer s(static_cast<std::size_t>(n * N * d), DType::f32, 1.0, 6), w(static_cast<std::size_t>(d), DType::f32, 0.1, 7);
  Buffer g(static_cast<std::size_t>(n * N) * sizeof(float));
  auto run = [&] { cu::pseudo_query_logits_device(s.f(), n, N, d, w.f(), nullptr, oasis::KeyNormOptions{}, g.f()); };
  run();
  cudaDeviceSynchronize();
  Events ev;
  double total = 0;
  for (auto _ : state) {
    const double t = ev.seconds(run);
    total += t;
    state.SetIterationTime(t);
  }
  state.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(n * N * d), benchmark::Counter::kIsIterationInvariantRate);
  set_ratio(state, "ratio_copy", 4e-9 * static_cast<double>(n * N * d), total, g_copy_gbs);
}

// The ceilings first and last (the ratios use the first; make_table.py the larger of the two).
BENCHMARK(BM_Ceiling_CopyD2D)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Ceiling_GemmBf16)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->ArgNames({"kernel", "d_h"})->ArgsProduct({{0, 1}, {64, 128}})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TensorCoreAttention)
    ->ArgNames({"dtype", "d_h", "T"})
    ->ArgsProduct({{1, 2}, {64, 128}, {4096}})
    ->Args({2, 128, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WindowedAttention)->ArgNames({"d_h", "T"})->ArgsProduct({{64}, {4096, 8192}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FusedAttention)
    ->ArgNames({"dtype", "d_h", "T", "causal"})
    ->ArgsProduct({{0, 2}, {64, 128}, {4096}, {1}})
    ->Args({1, 128, 1024, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DepthRoute)->ArgNames({"n", "N"})->ArgsProduct({{9, 33}, {8192}})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PseudoQueryLogits)->ArgNames({"n", "N"})->ArgsProduct({{9, 33}, {8192}})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Ceiling_CopyD2D)->Name("BM_Ceiling_CopyD2D_end")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Ceiling_GemmBf16)->Name("BM_Ceiling_GemmBf16_end")->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);

/// The device this run measures, for the JSON's context (bench/make_table.py prints it).
std::string device_description() {
  std::string why;
  if (!cu::available(&why)) return "none (" + why + ")";
  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB; CUDA driver " + std::to_string(driver) + ", runtime " +
         std::to_string(runtime);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("device", device_description());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
