// oasis/cuda.hpp — the CUDA backend's own API (available when the library was built with the CUDA
// toolkit: OASIS_HAVE_CUDA is defined for targets linking oasis::oasis; docs/cuda.md).
//
// The float32 entry points share the CPU API: oasis::token_attention(Backend::cuda, ...) and
// oasis::attn_res_route(Backend::cuda, ...) in oasis/backend.hpp. This header adds what only the
// GPU path offers:
//   * float16 / bfloat16 inputs (raw 16-bit storage) with float32 accumulation and outputs;
//   * a device-pointer entry point (no host copies) for benchmarks and integration;
//   * the psi reduction and the Kimi pseudo-query logits on the device;
//   * one full AttnRes sublayer forward (depth routing, pre-norm, projections with cuBLAS, RoPE,
//     fused attention, psi, output projection; or the SwiGLU MLP), the semantics of
//     oasis/model/layers.hpp for a sublayer without KV cache.
// Every function validates its arguments first (oasis::invalid_argument naming the argument) and
// then requires a device (oasis::invalid_argument naming "backend" with the reason otherwise), so
// the validation runs, and is tested, on machines without a GPU.
//
// Supported: head sizes d_h, d_v in [1, 128] (kernels are tiled for 64 and 128), both row
// normalisers (softmax1 with per-head null logits, softmax with MaskedRow::zero or ::error),
// causal and padding masks, sliding windows, an additive bias / boolean mask, grouped-query
// attention, the [B, H, T, d] and [B, T, H, d] layouts. Fully masked rows (no visible key, or
// every visible key masked by the bias): softmax1 gives out 0, p_null 1, LSE1 = s; plain softmax
// gives the documented zero (out 0, p_null 0, LSE -inf).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/attention.hpp"
#include "oasis/coupling.hpp"
#include "oasis/depth.hpp"
#include "oasis/tensor.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*; null = the default stream

namespace oasis::cuda {

/// Element type of attention inputs.
enum class DType { f32, f16, bf16 };
std::string_view to_string(DType t);
DType parse_dtype(std::string_view name);  // "f32" | "f16" | "bf16"

/// True if a CUDA device with a kernel image of this build is usable; `why` gets the reason if not.
bool available(std::string* why = nullptr);

/// A tensor of float16 (IEEE binary16) or bfloat16 values stored as their 16-bit patterns.
struct Tensor16 {
  DType dtype = DType::f16;
  Shape shape;
  std::vector<std::uint16_t> bits;
  index_t size() const { return static_cast<index_t>(bits.size()); }
};

/// Round float32 values to float16 / bfloat16 (round to nearest, ties to even; overflow to inf).
Tensor16 round_to(const Tensor<float>& x, DType dtype);
/// Exact widening to float32.
Tensor<float> widen(const Tensor16& x);
std::uint16_t round_to_bits(float x, DType dtype);
float widen_bits(std::uint16_t bits, DType dtype);

/// Token attention (SPEC §2) on float16 / bfloat16 inputs with float32 accumulation; same layouts,
/// options and results as oasis::token_attention. q, k, v must share one 16-bit dtype.
AttentionResult<float> token_attention(const Tensor16& q, const Tensor16& k, const Tensor16& v,
                                       const AttentionOptions& opt = {});

/// psi = mean over heads of p_null: p_null [B, H, T] -> [B, T] (oasis::null_statistic on the device).
Tensor<float> null_statistic(const Tensor<float>& p_null);

/// Kimi pseudo-query logits g_i = w^T RMSNorm(s_i) (oasis::pseudo_query_logits on the device).
Tensor<float> pseudo_query_logits(const Tensor<float>& sources, const Tensor<float>& w,
                                  const Tensor<float>& gain = {}, const KeyNormOptions& opt = {});

/// Device buffers of one attention call (row-major, contiguous, layouts of oasis/attention.hpp).
/// The contents of null_logits / key_lengths / bias are trusted (they are on the device).
struct DeviceAttention {
  DType dtype = DType::f32;
  AttentionLayout layout = AttentionLayout::bhtd;  ///< of q, k, v and out (shapes below for bhtd)
  const void* q = nullptr;  ///< [B, H, Tq, d_h] of dtype ([B, Tq, H, d_h] for bthd)
  const void* k = nullptr;  ///< [B, H_kv, Tk, d_h]
  const void* v = nullptr;  ///< [B, H_kv, Tk, d_v]
  AttentionShape shape{};
  RowNorm normalizer = RowNorm::softmax1;
  const float* null_logits = nullptr;  ///< [H] or null (s = 0)
  bool causal = false;
  const int* key_lengths = nullptr;    ///< [B] in [0, Tk] or null (all Tk)
  index_t window = 0;                  ///< sliding window W >= 1 (AttentionOptions::window), 0: none
  const float* bias = nullptr;         ///< additive bias of shape bias_shape (-inf masks), or null
  Shape bias_shape;                    ///< [Tq, Tk] or [B or 1, H or 1, Tq, Tk] (AttentionOptions::bias)
  std::optional<double> scale;         ///< default 1/sqrt(d_h) in float
  float* out = nullptr;                ///< [B, H, Tq, d_v] ([B, Tq, H, d_v] for bthd)
  float* lse = nullptr;                ///< [B, H, Tq]
  float* p_null = nullptr;             ///< [B, H, Tq]
  CUstream_st* stream = nullptr;
};
/// Launches the fused kernel asynchronously on a.stream (plain softmax rows with no visible key
/// get the documented zero).
void token_attention_device(const DeviceAttention& a);
/// psi [B, T] from p_null [B, H, T], device buffers, asynchronous on `stream`.
void null_statistic_device(const float* p_null, index_t B, index_t H, index_t T, float* psi,
                           CUstream_st* stream = nullptr);

/// Depth routing (oasis::attn_res_route) on device buffers, asynchronous on `stream`: sources
/// [n, N, d], g_old [n, N], psi [n, N] in; h [N, d], alpha [n, N], alpha_null [N], g [n, N],
/// dpsi [n, N] out. The options and kinds are validated (n <= 1024); the buffers' contents are
/// trusted (g_old finite, psi in [0, 1] for candidates with null evidence).
void attn_res_route_device(const float* sources, const float* g_old, const float* psi, index_t n, index_t N,
                           index_t d, const std::vector<SourceKind>& kinds, const DepthOptions& opt, float* h,
                           float* alpha, float* alpha_null, float* g, float* dpsi, CUstream_st* stream = nullptr);
/// Pseudo-query logits g [n, N] of device sources [n, N, d], w [d], gain [d] or null.
void pseudo_query_logits_device(const float* sources, index_t n, index_t N, index_t d, const float* w,
                                const float* gain, const KeyNormOptions& opt, float* g, CUstream_st* stream = nullptr);

// --- one AttnRes sublayer --------------------------------------------------------------------------

enum class SublayerKind { attention, mlp };
/// RoPE layout (oasis::model::RopeLayout's two layouts, and none).
enum class Rope { none, rotate_half, interleaved };

/// Weights of one sublayer l (PyTorch nn.Linear layout W [out, in], no bias).
struct SublayerWeights {
  Tensor<float> pseudo_query;  ///< w_l [d], the depth router's pseudo-query
  Tensor<float> key_gain;      ///< [d] gain of the router's key RMSNorm, or empty (none)
  Tensor<float> norm;          ///< [d] gain of the sublayer's pre-norm, or empty (1)
  // attention sublayer
  Tensor<float> wq;            ///< [H d_h, d]
  Tensor<float> wk;            ///< [H_kv d_h, d]
  Tensor<float> wv;            ///< [H_kv d_h, d]
  Tensor<float> wo;            ///< [d, H d_h]
  Tensor<float> q_norm;        ///< [d_h] per-head q RMSNorm gain (Qwen3 qk-norm) or empty (off)
  Tensor<float> k_norm;        ///< [d_h] per-head k RMSNorm gain, given together with q_norm
  // MLP sublayer (SwiGLU)
  Tensor<float> gate;          ///< [d_ff, d]
  Tensor<float> up;            ///< [d_ff, d]
  Tensor<float> down;          ///< [d, d_ff]
};

struct SublayerOptions {
  SublayerKind kind = SublayerKind::attention;
  index_t batch = 1;                 ///< B; the N = B * T rows are in (batch, position) order
  index_t n_heads = 1;               ///< H
  index_t n_kv_heads = 0;            ///< H_kv, 0: H
  index_t d_head = 0;                ///< d_h, 0: d / H
  KeyNormOptions key_norm{};         ///< router key RMSNorm (eps; float32 evaluation is moot here)
  double norm_eps = 1e-6;            ///< eps of the pre-norm and of the q/k norms
  DepthOptions depth{};              ///< depth normaliser, coupling, centring, theta / beta
  RowNorm token_normalizer = RowNorm::softmax1;
  bool causal = true;
  Rope rope = Rope::rotate_half;
  double rope_theta = 10000.0;
};

struct SublayerResult {
  DepthRoute<float> route;  ///< the routed input h_l [N, d] with alpha, alpha_null, g, dpsi
  Tensor<float> g_old;      ///< [n, N] pseudo-query logits before coupling
  Tensor<float> out;        ///< [N, d] raw sublayer output f_l(h_l), the next source v_l
  Tensor<float> p_null;     ///< [B, H, T] (attention only)
  Tensor<float> lse;        ///< [B, H, T] (attention only)
  Tensor<float> psi;        ///< [B, T] null statistic of the branch (attention only)
};

/// One Full-AttnRes sublayer: h_l = route(sources; g = w_l^T RMSNorm(v_i), coupling with psi;
/// without coupling a finite score_clamp still clamps g, as oasis::model's routers do),
/// then f_l(h_l) = W_o Attn(RoPE(qk-norm(W_{q,k,v} RMSNorm(h_l)))) or W_down(silu(W_gate x) * W_up x).
/// sources [n, N, d], psi [n, N] (the branches' null statistics), kinds[n].
SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const SublayerWeights& w,
                                 const SublayerOptions& opt);

}  // namespace oasis::cuda
