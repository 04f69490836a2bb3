// oasis/backends/cuda.hpp — the CUDA backend's own API (available when the library was built with the CUDA
// toolkit: OASIS_HAVE_CUDA is defined for targets linking oasis::oasis; docs/cuda.md).
//
// The float32 entry points share the CPU API: oasis::token_attention(Backend::cuda, ...) and
// oasis::attn_res_route(Backend::cuda, ...) in oasis/backends/backend.hpp. This header adds what only the
// GPU path offers:
//   * float16 / bfloat16 inputs (raw 16-bit storage) with float32 accumulation and outputs;
//   * a device-pointer entry point (no host copies) for benchmarks and integration;
//   * the psi reduction and the Kimi pseudo-query logits on the device;
//   * one full AttnRes sublayer forward (depth routing, pre-norm, projections with cuBLAS, RoPE,
//     fused attention, psi, output projection; or the SwiGLU MLP) that takes the model's own types
//     (oasis::model::ModelConfig, AttentionWeights, MlpWeights) and computes what
//     oasis::model::kimi_route followed by attention_sublayer / mlp_sublayer compute for a
//     sublayer without KV cache.
// 16-bit inputs are oasis::io::Tensor16 (oasis/io/tensor16.hpp, with the host conversions).
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

#include <optional>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/io/tensor16.hpp"
#include "oasis/model/config.hpp"
#include "oasis/model/layers.hpp"
#include "oasis/core/tensor.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*; null = the default stream

namespace oasis::cuda {

/// True if a CUDA device with a kernel image of this build is usable; `why` gets the reason if not.
bool available(std::string* why = nullptr);

/// Which kernel evaluates token attention on the device (docs/cuda.md, "Kernel design"). Each is
/// checked against the oracle under the kernel parity rule; the tensor-core kernel under the rule
/// with the term of its rounding of P added (bounds::p_rounding_bound).
enum class AttentionKernel {
  automatic,     ///< split_keys for few query rows per kv head and long rows (kernel_choice), else fused
  fused,         ///< the float32 fused kernel (attention.cu): the default parity path
  split_keys,    ///< split-K (flash-decoding): keys split across blocks, partial states merged, the
                 ///< null category added once at the merge (attention_split.cu)
  tensor_cores,  ///< float16 / bfloat16 inputs only: wmma products with float accumulation, P rounded
                 ///< to the input type before P V as FlashAttention does (attention_tc.cu)
};
const char* to_string(AttentionKernel k);

/// The kernel choice of a device call. split_keys and tensor_cores do not implement a sliding
/// window or an additive bias and reject them naming the option (both take either layout).
struct KernelOptions {
  AttentionKernel kernel = AttentionKernel::automatic;
  /// split_keys: blocks per group of query rows over the keys, 1..1024; 0: kernel_choice's count.
  int key_splits = 0;
};

/// What `automatic` resolves to for a call of this shape on the current device (the heuristic of
/// docs/cuda.md, "Choosing a kernel"): split_keys when (H / H_kv) Tq <= 16 and Tk >= 256, with
/// key_splits = clamp(ceil(16 SMs / (B H_kv ceil((H / H_kv) Tq / 4))), 1, ceil(Tk / 256)); else
/// fused. An explicit kernel is returned as given (with the split count filled in for split_keys).
struct KernelChoice {
  AttentionKernel kernel;
  int key_splits;  ///< split_keys only, else 0
};
KernelChoice kernel_choice(const AttentionShape& shape, const KernelOptions& opt = {});

/// Token attention (docs/spec.md §2) on float16 / bfloat16 inputs with float32 accumulation; same layouts,
/// options and results as oasis::token_attention. q, k, v must share one 16-bit dtype.
AttentionResult<float> token_attention(const io::Tensor16& q, const io::Tensor16& k, const io::Tensor16& v,
                                       const AttentionOptions& opt = {}, const KernelOptions& kernel = {});
/// Token attention on float32 inputs with a kernel choice (oasis::token_attention(Backend::cuda,
/// ...) is this with KernelOptions{}).
AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt, const KernelOptions& kernel);

/// psi = mean over heads of p_null: p_null [B, H, T] -> [B, T] (oasis::null_statistic on the device).
Tensor<float> null_statistic(const Tensor<float>& p_null);

/// Kimi pseudo-query logits g_i = w^T RMSNorm(s_i) (oasis::pseudo_query_logits on the device).
Tensor<float> pseudo_query_logits(const Tensor<float>& sources, const Tensor<float>& w,
                                  const Tensor<float>& gain = {}, const KeyNormOptions& opt = {});

/// Device buffers of one attention call (row-major, contiguous, layouts of oasis/ops/attention.hpp).
/// The contents of null_logits / key_lengths / bias are trusted (they are on the device).
struct DeviceAttention {
  io::DType dtype = io::DType::f32;  ///< f32, f16 or bf16
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
  KernelOptions kernel;                ///< split_keys allocates its workspace stream-ordered (cudaMallocAsync)
};
/// Launches the chosen kernel asynchronously on a.stream (plain softmax rows with no visible key
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

// --- one AttnRes sublayer ------------------------------------------------------------------------

/// The parameters of a sublayer's depth router: the arguments of oasis::model::kimi_route.
struct KimiRouter {
  const Tensor<float>* query = nullptr;     ///< pseudo-query w_l [d] ("<router>.query")
  const Tensor<float>* key_gain = nullptr;  ///< key-norm gain [d]; null or empty: none (ModelConfig::key_norm_gain)
  double theta = -5.0;  ///< coupling parameter, beta = softplus(theta) (ModelConfig::beta overrides it)
};

struct SublayerResult {
  DepthRoute<float> route;  ///< the routed input h_l [N, d] with alpha, alpha_null, g, dpsi
  Tensor<float> g_old;      ///< [n, N] pseudo-query logits w_l^T RMSNorm(v_i), before any clamp
  Tensor<float> out;        ///< [N, d] raw sublayer output f_l(h_l), the next source v_l
  Tensor<float> p_null;     ///< [B, H, T] (attention only)
  Tensor<float> lse;        ///< [B, H, T] (attention only)
  Tensor<float> psi;        ///< [B, T] null statistic of the branch (attention only)
};

/// One sublayer of an AttnRes model with the Kimi router (kimi_full, or kimi_block with block
/// sums as sources), from positions 0..T-1 and without KV cache:
///   h_l = route(sources; g = w_l^T RMSNorm(v_i), coupled with psi)   (oasis::model::kimi_route)
///   f_l(h_l) = W_o Attn(RoPE(qk-norm(W_{q,k,v} RMSNorm(h_l))))        (oasis::model::attention_sublayer)
/// sources [n, N, d] with N = batch * T rows in (batch, position) order, psi [n, N] (the sources'
/// null statistics), kinds[n]. The configuration supplies the variant (normalisers, coupling),
/// the conventions (coupling options, beta, RoPE layout and theta, eps, qk-norm) and the head
/// sizes. Not implemented (invalid_argument naming the field): the authors_code router, the
/// original backbone, the mass-deficit psi estimator, gated attention and the prefix sink, token
/// normalisers other than softmax and softmax1, d_head > 128.
SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, index_t batch, const KimiRouter& router,
                                 const model::AttentionWeights<float>& w, const model::ModelConfig& cfg);
/// The same for an MLP sublayer: f_l(h_l) = W_down(silu(W_gate x) * W_up x), x = RMSNorm(h_l)
/// (oasis::model::mlp_sublayer).
SublayerResult attn_res_sublayer(const Tensor<float>& sources, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, index_t batch, const KimiRouter& router,
                                 const model::MlpWeights<float>& w, const model::ModelConfig& cfg);

}  // namespace oasis::cuda
