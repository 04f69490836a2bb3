// src/cuda/backend_cuda.cpp — host side of the CUDA backend: availability, and the attention,
// psi and pseudo-query entry points of oasis/backends/cuda.hpp (availability and float32
// attention are also ops of the backend's table, register.cpp), which copy tensors to device
// buffers and launch the kernels of attention.cu and depth.cu (the routing entry points are in
// route.cpp, the sublayer in layer.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "attention_dispatch.hpp"
#include "device_util.hpp"
#include "oasis/backends/cuda.hpp"

namespace oasis {
namespace cuda {
namespace detail {

namespace {

struct Availability {
  bool ok = false;
  std::string why;
};

Availability probe() {
  Availability a;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    a.why = std::string("no usable CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
            cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear the sticky-free error state
    return a;
  }
  if (count == 0) {
    a.why = "no CUDA device is present (cudaGetDeviceCount returned 0)";
    return a;
  }
  const int img = probe_kernel_image();
  if (img != 0) {
    int dev = 0;
    cudaDeviceProp prop{};
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    a.why = std::string("no kernel image for device '") + prop.name + "' (compute capability " +
            std::to_string(prop.major) + "." + std::to_string(prop.minor) +
            "); this build targets CUDA architectures " OASIS_CUDA_ARCHS_STRING ": " +
            cudaGetErrorString(static_cast<cudaError_t>(img));
    cudaGetLastError();
    return a;
  }
  a.ok = true;
  return a;
}

const Availability& availability() {
  static const Availability a = probe();  // thread-safe, probed once per process
  return a;
}

}  // namespace

void require_device() {
  const Availability& a = availability();
  OASIS_REQUIRE(a.ok, "backend", "cuda is not available: ", a.why);
}

}  // namespace detail

bool available(std::string* why) {
  const detail::Availability& a = detail::availability();
  if (why) *why = a.why;
  return a.ok;
}

// --- attention -------------------------------------------------------------------------------------

namespace detail {

/// The CUDA backend's limits on top of check_attention_args (shared by every entry point).
void check_cuda_attention_limits(const AttentionShape& s, RowNorm normalizer) {
  require_cuda_normalizer(normalizer, "normalizer");
  OASIS_REQUIRE(s.d_h <= kMaxHeadDim, "q", "head size d_h = ", s.d_h, " is not supported by the CUDA backend (at most ",
                kMaxHeadDim, "; tiled for 64 and 128)");
  OASIS_REQUIRE(s.d_v <= kMaxHeadDim, "v", "value head size d_v = ", s.d_v,
                " is not supported by the CUDA backend (at most ", kMaxHeadDim, ")");
  require_int(s.B, "q", "batch B", 65535);
  require_int(s.H, "q", "heads H", 65535);
  require_int(s.Tq, "q", "queries Tq");
  require_int(s.Tk, "k", "keys Tk");
  require_int(s.B * s.H * s.Tq, "q", "rows B * H * Tq");
}

/// Plain softmax with MaskedRow::error must throw on a row without visible keys, as the reference
/// does (argument "scores"); checked on the host before any launch.
void check_masked_rows(const AttentionShape& s, const AttentionOptions& opt) {
  if (opt.normalizer != RowNorm::softmax || opt.masked_row != MaskedRow::error) return;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t t = 0; t < s.Tq; ++t)
      OASIS_REQUIRE(visible_range(s, opt, b, t).count() > 0, "scores", "plain softmax on a fully masked row (batch ",
                    b, ", query ", t, ", no visible key) and MaskedRow::error was requested");
}

float attention_scale(const AttentionShape& s, const std::optional<double>& scale) {
  // As the reference in T = float: T(*scale) or T(1) / sqrt(T(d_h)).
  return scale ? static_cast<float>(*scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));
}

/// A launch on contiguous q, k, v and out in `layout` ([B, H, T, d] or [B, T, H, d]), by strides.
AttentionLaunch layout_launch(io::DType type, const void* q, const void* k, const void* v, const AttentionShape& s,
                              AttentionLayout layout) {
  AttentionLaunch a;
  a.in_type = type;
  a.q = q;
  a.k = k;
  a.v = v;
  a.B = static_cast<int>(s.B);
  a.H = static_cast<int>(s.H);
  a.H_kv = static_cast<int>(s.H_kv);
  a.Tq = static_cast<int>(s.Tq);
  a.Tk = static_cast<int>(s.Tk);
  a.d_h = static_cast<int>(s.d_h);
  a.d_v = static_cast<int>(s.d_v);
  const bool bthd = layout == AttentionLayout::bthd;
  // (batch, head, time) strides of a tensor with `heads` heads, T positions and rows of d
  auto set = [bthd](long long& sb, long long& sh, long long& st, index_t heads, index_t T, index_t d) {
    sb = heads * T * d;
    sh = bthd ? d : T * d;
    st = bthd ? heads * d : d;
  };
  set(a.q_sb, a.q_sh, a.q_st, s.H, s.Tq, s.d_h);
  set(a.k_sb, a.k_sh, a.k_st, s.H_kv, s.Tk, s.d_h);
  set(a.v_sb, a.v_sh, a.v_st, s.H_kv, s.Tk, s.d_v);
  set(a.o_sb, a.o_sh, a.o_st, s.H, s.Tq, s.d_v);
  return a;
}

/// The bias strides of a [Tq, Tk] or [B or 1, H or 1, Tq, Tk] bias (stride 0 on a broadcast axis).
void set_bias_strides(AttentionLaunch& a, const Shape& bias, const AttentionShape& s) {
  const bool r4 = bias.size() == 4;
  a.bias_st = s.Tk;
  a.bias_sh = r4 && bias[1] != 1 ? s.Tq * s.Tk : 0;
  a.bias_sb = r4 && bias[0] != 1 ? bias[1] * s.Tq * s.Tk : 0;
}

DeviceAttentionOptions set_attention_options(AttentionLaunch& a, const AttentionShape& s, const AttentionOptions& opt) {
  require_finite_null_logits(opt, "cuda");
  std::vector<float> nulls(opt.null_logits.begin(), opt.null_logits.end());  // T(s) with T = float
  std::vector<int> lens(opt.key_lengths.begin(), opt.key_lengths.end());
  std::vector<float> bias(static_cast<std::size_t>(opt.bias.size()));  // T(b) with T = float
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(opt.bias[static_cast<index_t>(i)]);
  DeviceAttentionOptions d{to_device(nulls), to_device(bias), to_device(lens)};
  a.softmax1 = opt.normalizer == RowNorm::softmax1;
  a.null_logits = nulls.empty() ? nullptr : d.null_logits.get();
  a.causal = opt.causal;
  a.key_lengths = lens.empty() ? nullptr : d.key_lengths.get();
  a.window = static_cast<int>(std::min(opt.window, s.Tk));  // W >= Tk sees every earlier key, as W = Tk
  if (!bias.empty()) {
    a.bias = d.bias.get();
    set_bias_strides(a, opt.bias.shape(), s);
  }
  a.scale = attention_scale(s, opt.scale);
  return d;
}

void check_masked_lse(const AttentionShape& s, const AttentionOptions& opt, const Tensor<float>& lse) {
  // A row whose visible scores are all -inf (masked by the bias, or overflowed to -inf) is fully
  // masked (LSE = -inf), as in normalize_row; with MaskedRow::error plain softmax rejects it like a
  // row without visible keys.
  if (opt.normalizer == RowNorm::softmax && opt.masked_row == MaskedRow::error)
    for (index_t b = 0; b < s.B; ++b)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t t = 0; t < s.Tq; ++t)
          OASIS_REQUIRE(!(std::isinf(lse(b, h, t)) && lse(b, h, t) < 0), "scores",
                        "plain softmax on a fully masked row (batch ", b, ", head ", h, ", query ", t,
                        ": every visible score is -inf) and MaskedRow::error was requested");
}

DeviceAttentionOutputs run_forward(AttentionLaunch& a, const AttentionShape& s, const AttentionOptions& opt,
                                   bool keep_row_state, const std::function<void(const AttentionLaunch&)>& launch) {
  const std::size_t rows = static_cast<std::size_t>(s.B * s.H * s.Tq);
  DeviceAttentionOutputs o{DeviceBuffer<float>(rows * static_cast<std::size_t>(s.d_v)), DeviceBuffer<float>(rows),
                           DeviceBuffer<float>(rows), DeviceBuffer<float>(keep_row_state ? rows : 0),
                           DeviceBuffer<float>(keep_row_state ? rows : 0)};
  DeviceBuffer<int> bad(1);
  check(cudaMemset(bad.get(), 0, sizeof(int)), "cudaMemset");
  a.out = o.out.get();
  a.lse = o.lse.get();
  a.p_null = o.p_null.get();
  a.row_max = o.row_max.get();
  a.row_sum = o.row_sum.get();
  a.bad_score = bad.get();
  launch(a);
  int bad_score = 0;
  bad.download(&bad_score);
  a.bad_score = nullptr;  // freed here
  // As normalize_row: a NaN or +inf score (q.k overflowed float) is rejected.
  OASIS_REQUIRE(bad_score == 0, "scores", "a score q.k * scale", opt.bias.empty() ? "" : " + bias",
                " overflowed to NaN or +inf (the inputs are too large for float32 scores)");
  return o;
}

namespace {

/// Runs validated attention from host buffers of element size `elem` (already in device layout)
/// with the kernel `kernel` (resolve_kernel).
AttentionResult<float> run_attention(io::DType type, const void* q, const void* k, const void* v, std::size_t elem,
                                     const AttentionShape& s, const AttentionOptions& opt, const KernelChoice& kernel) {
  const std::size_t nq = static_cast<std::size_t>(s.B * s.H * s.Tq * s.d_h);
  const std::size_t nk = static_cast<std::size_t>(s.B * s.H_kv * s.Tk * s.d_h);
  const std::size_t nv = static_cast<std::size_t>(s.B * s.H_kv * s.Tk * s.d_v);
  const std::size_t rows = static_cast<std::size_t>(s.B * s.H * s.Tq);
  DeviceBuffer<unsigned char> dq(nq * elem), dk(nk * elem), dv(nv * elem);
  dq.upload(static_cast<const unsigned char*>(q));
  dk.upload(static_cast<const unsigned char*>(k));
  dv.upload(static_cast<const unsigned char*>(v));
  AttentionLaunch a = layout_launch(type, dq.get(), dk.get(), dv.get(), s, opt.layout);
  const DeviceAttentionOptions options = set_attention_options(a, s, opt);
  // the probabilities are recomputed from each row's final state
  const DeviceAttentionOutputs o =
      run_forward(a, s, opt, opt.return_probs, [&](const AttentionLaunch& l) { launch_chosen(l, kernel, nullptr); });

  AttentionResult<float> r;
  r.out = opt.layout == AttentionLayout::bhtd ? Tensor<float>({s.B, s.H, s.Tq, s.d_v})
                                              : Tensor<float>({s.B, s.Tq, s.H, s.d_v});
  r.lse = Tensor<float>({s.B, s.H, s.Tq});
  r.p_null = Tensor<float>({s.B, s.H, s.Tq});
  if (opt.return_probs) {
    r.probs = Tensor<float>({s.B, s.H, s.Tq, s.Tk});
    DeviceBuffer<float> dprobs(static_cast<std::size_t>(r.probs.size()));
    check(launch_attention_probs(a, dprobs.get(), nullptr), "attention probabilities launch");
    dprobs.download(r.probs.data());
  }
  o.out.download(r.out.data());
  o.lse.download(r.lse.data());
  o.p_null.download(r.p_null.data());
  check(cudaDeviceSynchronize(), "attention kernels");
  check_masked_lse(s, opt, r.lse);
  return r;
}

}  // namespace
}  // namespace detail

AttentionResult<float> token_attention(const io::Tensor16& q, const io::Tensor16& k, const io::Tensor16& v,
                                       const AttentionOptions& opt, const KernelOptions& kernel) {
  OASIS_REQUIRE(q.dtype == io::DType::f16 || q.dtype == io::DType::bf16, "q", "dtype ", io::to_string(q.dtype),
                " is not a 16-bit type (float32 inputs: oasis::token_attention(Backend::cuda, ...))");
  OASIS_REQUIRE(k.dtype == q.dtype, "k", "dtype ", io::to_string(k.dtype), " differs from q's ", io::to_string(q.dtype));
  OASIS_REQUIRE(v.dtype == q.dtype, "v", "dtype ", io::to_string(v.dtype), " differs from q's ", io::to_string(q.dtype));
  // Validate on the exact float32 widening: same checks (shapes, finiteness) as the reference.
  const Tensor<float> qf = io::widen(q), kf = io::widen(k), vf = io::widen(v);
  const AttentionShape s = check_attention_args(qf, kf, vf, opt);
  detail::check_cuda_attention_limits(s, opt.normalizer);
  const KernelChoice choice = detail::resolve_kernel(s, q.dtype, detail::features_of(opt), kernel);
  detail::check_masked_rows(s, opt);
  detail::require_device();
  return detail::run_attention(q.dtype, q.bits.data(), k.bits.data(), v.bits.data(), sizeof(std::uint16_t), s, opt,
                               choice);
}

AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt, const KernelOptions& kernel) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  detail::check_cuda_attention_limits(s, opt.normalizer);
  const KernelChoice choice = detail::resolve_kernel(s, io::DType::f32, detail::features_of(opt), kernel);
  detail::check_masked_rows(s, opt);
  detail::require_device();
  return detail::run_attention(io::DType::f32, q.data(), k.data(), v.data(), sizeof(float), s, opt, choice);
}

void token_attention_device(const DeviceAttention& d) {
  const AttentionShape& s = d.shape;
  OASIS_REQUIRE(s.B > 0 && s.H > 0 && s.Tq > 0 && s.d_h > 0, "shape", "empty dimension in q [B, H, Tq, d_h] = [",
                s.B, ", ", s.H, ", ", s.Tq, ", ", s.d_h, "]");
  OASIS_REQUIRE(s.H_kv > 0 && s.Tk > 0 && s.d_v > 0, "shape", "empty dimension in H_kv = ", s.H_kv, ", Tk = ", s.Tk,
                ", d_v = ", s.d_v);
  OASIS_REQUIRE(s.H % s.H_kv == 0, "shape", "grouped-query attention needs H_kv to divide H, got H = ", s.H,
                ", H_kv = ", s.H_kv);
  OASIS_REQUIRE(d.q && d.k && d.v, "q", "null device pointer among q, k, v");
  OASIS_REQUIRE(d.out && d.lse && d.p_null, "out", "null device pointer among out, lse, p_null");
  OASIS_REQUIRE(!d.null_logits || d.normalizer == RowNorm::softmax1, "null_logits", "given but the normaliser is ",
                to_string(d.normalizer), " (no null category)");
  OASIS_REQUIRE(!d.scale || (std::isfinite(*d.scale) && *d.scale > 0), "scale", "must be finite and positive");
  OASIS_REQUIRE(d.dtype == io::DType::f32 || d.dtype == io::DType::f16 || d.dtype == io::DType::bf16, "dtype",
                "the CUDA kernels take f32, f16 or bf16 inputs, got ", io::to_string(d.dtype));
  OASIS_REQUIRE(d.window >= 0, "window", "must be >= 0 (0: no window), got ", d.window);
  const Shape& bs = d.bias_shape;
  if (d.bias)
    OASIS_REQUIRE((bs.size() == 2 || (bs.size() == 4 && (bs[0] == 1 || bs[0] == s.B) && (bs[1] == 1 || bs[1] == s.H))) &&
                      bs[bs.size() - 2] == s.Tq && bs[bs.size() - 1] == s.Tk,
                  "bias", "shape ", shape_str(bs), " does not broadcast to [B, H, Tq, Tk] = [", s.B, ", ", s.H, ", ",
                  s.Tq, ", ", s.Tk, "]");
  detail::check_cuda_attention_limits(s, d.normalizer);
  const KernelChoice choice =
      detail::resolve_kernel(s, d.dtype, detail::MaskFeatures{d.window, d.bias != nullptr}, d.kernel);
  detail::require_device();
  detail::AttentionLaunch a = detail::layout_launch(d.dtype, d.q, d.k, d.v, s, d.layout);
  a.softmax1 = d.normalizer == RowNorm::softmax1;
  a.null_logits = d.null_logits;
  a.causal = d.causal;
  a.key_lengths = d.key_lengths;
  a.window = static_cast<int>(std::min(d.window, s.Tk));  // W >= Tk sees every earlier key, as W = Tk
  if (d.bias) {
    a.bias = d.bias;
    detail::set_bias_strides(a, bs, s);
  }
  a.scale = detail::attention_scale(s, d.scale);
  a.out = d.out;
  a.lse = d.lse;
  a.p_null = d.p_null;
  detail::launch_chosen(a, choice, d.stream);
}

void null_statistic_device(const float* p_null, index_t B, index_t H, index_t T, float* psi, CUstream_st* stream) {
  OASIS_REQUIRE(B > 0 && H > 0 && T > 0, "p_null", "empty dimension in [B, H, T] = [", B, ", ", H, ", ", T, "]");
  OASIS_REQUIRE(p_null && psi, "p_null", "null device pointer (p_null or psi)");
  detail::require_int(B * H * T, "p_null", "size B * H * T");
  detail::require_device();
  detail::check(detail::launch_null_statistic(p_null, static_cast<int>(B), static_cast<int>(H), static_cast<int>(T),
                                              psi, stream),
                "psi launch");
}

Tensor<float> null_statistic(const Tensor<float>& p_null) {
  require_rank(p_null, 3, "p_null", "[B, H, T]");
  const index_t B = p_null.dim(0), H = p_null.dim(1), T = p_null.dim(2);
  OASIS_REQUIRE(H > 0, "p_null", "has no heads (H = 0): psi is a mean over heads");
  OASIS_REQUIRE(B > 0 && T > 0, "p_null", "empty dimension in ", shape_str(p_null.shape()));
  detail::require_int(p_null.size(), "p_null", "size");
  detail::require_device();
  detail::DeviceBuffer<float> dp = detail::to_device(p_null), dpsi(static_cast<std::size_t>(B * T));
  null_statistic_device(dp.get(), B, H, T, dpsi.get(), nullptr);
  Tensor<float> psi({B, T});
  dpsi.download(psi.data());
  return psi;
}

Tensor<float> pseudo_query_logits(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                  const KeyNormOptions& opt) {
  // The reference's checks (oasis::pseudo_query_logits), then the sources' finiteness.
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  OASIS_REQUIRE(n > 0 && N > 0 && d > 0, "sources", "empty dimension in ", shape_str(sources.shape()));
  require_rank(w, 1, "w", "[d]");
  OASIS_REQUIRE(w.dim(0) == d, "w", "has ", w.dim(0), " entries, sources have width d = ", d);
  OASIS_REQUIRE(gain.empty() || (gain.rank() == 1 && gain.dim(0) == d), "gain", "shape ", shape_str(gain.shape()),
                " is not [d] = [", d, "]");
  OASIS_REQUIRE(opt.eps > 0 && std::isfinite(opt.eps), "eps", "must be finite and positive");
  require_finite(w, "w");
  require_finite(sources, "sources");
  if (!gain.empty()) require_finite(gain, "gain");
  detail::require_int(sources.size(), "sources", "size");
  detail::require_device();
  detail::DeviceBuffer<float> ds = detail::to_device(sources), dw = detail::to_device(w);
  detail::DeviceBuffer<float> dg = detail::to_device(gain), out(static_cast<std::size_t>(n * N));
  detail::check(detail::launch_pseudo_query_logits(ds.get(), static_cast<int>(n), static_cast<int>(N),
                                                   static_cast<int>(d), dw.get(), gain.empty() ? nullptr : dg.get(),
                                                   static_cast<float>(opt.eps), out.get(), nullptr),
                "pseudo-query logits launch");
  Tensor<float> g({n, N});
  out.download(g.data());
  return g;
}

}  // namespace cuda
}  // namespace oasis
