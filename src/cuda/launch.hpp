// src/cuda/launch.hpp — raw-pointer launchers of the CUDA kernels (internal to oasis_cuda).
//
// This header is shared by the .cu kernel files (compiled by nvcc) and the host wrappers
// (compiled by the C++ compiler). It includes neither Eigen nor Boost nor the oasis core (only
// the dependency-free oasis/io/dtype_enum.hpp), so the device code never sees them. Every
// launcher returns the cudaError_t of the launch as an int (0 = success); the host wrappers turn
// a failure into an exception.
//
// The launch structs are aggregates of scalars, pointers and structs (no bare arrays), so that
// the CUDA emulator can check each pointer member of a kernel parameter (src/cuda/emu).
#pragma once

#include <cstdint>

#include "oasis/io/dtype_enum.hpp"

struct CUstream_st;

namespace oasis::cuda::detail {

/// One fused attention call. Strides are in elements; q element (b, h, t, c) is at
/// q[b * q_sb + h * q_sh + t * q_st + c] (c contiguous), likewise k, v (with the kv head) and out,
/// so either layout ([B, H, T, d] or [B, T, H, d]) is addressed in place.
/// lse and p_null are [B, H, Tq] contiguous. row_max / row_sum (optional, may be null) receive the
/// final running maximum M and normaliser sum S of each row, so that the probability kernel can
/// form p_j = exp(z_j - M) / S exactly as the reference does.
struct AttentionLaunch {
  io::DType in_type = io::DType::f32;  ///< element type of q, k, v: f32, f16 or bf16
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  long long q_sb = 0, q_sh = 0, q_st = 0;
  long long k_sb = 0, k_sh = 0, k_st = 0;
  long long v_sb = 0, v_sh = 0, v_st = 0;
  int B = 0, H = 0, H_kv = 0, Tq = 0, Tk = 0, d_h = 0, d_v = 0;
  bool softmax1 = true;
  const float* null_logits = nullptr;  ///< device, H entries, or null for s = 0
  bool causal = false;
  const int* key_lengths = nullptr;    ///< device, B entries, or null for all Tk
  int window = 0;                      ///< sliding window W >= 1, or 0 for none
  /// Additive bias (device, float32), element (b, h, t, j) at bias[b * bias_sb + h * bias_sh +
  /// t * bias_st + j] (a stride 0 broadcasts), or null for none; -inf masks a key.
  const float* bias = nullptr;
  long long bias_sb = 0, bias_sh = 0, bias_st = 0;
  float scale = 1.0f;
  float* out = nullptr;
  long long o_sb = 0, o_sh = 0, o_st = 0;
  float* lse = nullptr;
  float* p_null = nullptr;
  float* row_max = nullptr;
  float* row_sum = nullptr;
  /// Optional flag set to 1 when a visible key's score is NaN or +inf (q.k overflowed): the
  /// reference rejects such a row ("scores"); the key is then treated as masked. A -inf score is
  /// a masked key, as in the reference.
  int* bad_score = nullptr;
};

/// The largest head size (d_h and d_v) the fused kernel supports.
inline constexpr int kMaxHeadDim = 128;

int launch_attention(const AttentionLaunch& a, CUstream_st* stream);
/// probs [B, H, Tq, Tk]: p_j = exp(z_j - M) / S for visible keys, 0 otherwise (needs row_max/row_sum).
int launch_attention_probs(const AttentionLaunch& a, float* probs, CUstream_st* stream);
/// psi[b, t] = (1/H) sum_h p_null[b, h, t] (sequential in h, as oasis::null_statistic).
int launch_null_statistic(const float* p_null, int B, int H, int T, float* psi, CUstream_st* stream);

/// Split-K attention (attention_split.cu): the keys of every row are split into `splits` blocks
/// of kSplitWarps ranges of keys_per_warp keys each (warp w of split i covers [r L, (r + 1) L),
/// r = i kSplitWarps + w). A warp computes the online-softmax state of its range for up to
/// kSplitRows query rows that share a kv head, without the null category; the block merges its
/// warps' states into one partial (M_i, S_i, o_i) per split; the combine kernel merges the splits'
/// partials of each row in key order, starting from the null category's state (added exactly
/// once there), and writes the outputs of the AttentionLaunch (out, lse, p_null, row_max, row_sum).
inline constexpr int kSplitWarps = 4;
inline constexpr int kSplitRows = 4;
static_assert(kSplitWarps == kSplitRows, "the block merge gives each warp one row");
struct SplitLaunch {
  int splits = 1;           ///< blocks per row group over the keys
  int keys_per_warp = 0;    ///< L: keys of one warp's range
  float* part_m = nullptr;  ///< [B, H, Tq, splits] maxima M_i of the partial states (-inf: no visible key)
  float* part_l = nullptr;  ///< [B, H, Tq, splits] sums S_i, relative to M_i
  float* part_o = nullptr;  ///< [B, H, Tq, splits, d_v] unnormalised outputs o_i, relative to M_i
};
int launch_attention_split_partials(const AttentionLaunch& a, const SplitLaunch& s, CUstream_st* stream);
int launch_attention_split_combine(const AttentionLaunch& a, const SplitLaunch& s, CUstream_st* stream);

/// The tensor-core kernel (attention_tc.cu): f16 / bf16 inputs, nvcuda::wmma products with
/// float accumulation, P rounded to the input type before P V (as FlashAttention); the same
/// outputs as launch_attention. Head sizes up to kMaxHeadDim.
int launch_attention_tc(const AttentionLaunch& a, CUstream_st* stream);

/// The most depth candidates one routing call takes (the evidence flags travel in the launch).
inline constexpr int kMaxCandidates = 1024;
/// The widest row the mixing kernel takes (column blocks of 128 on grid y <= 65535).
inline constexpr int kMaxWidth = 65535 * 128;

/// One flag per depth candidate.
struct CandidateFlags {
  unsigned char flag[kMaxCandidates] = {};
};

/// Depth weights of N tokens over n candidates (oasis::depth_weights per token).
struct DepthLaunch {
  int n = 0, N = 0;
  const float* g_old = nullptr;            ///< [n, N]
  const float* psi = nullptr;              ///< [n, N]
  CandidateFlags evidence;                 ///< has_null_evidence(kind_i, headless rule), i < n
  bool coupling = true;
  bool clamp_uncoupled = false;            ///< without coupling, clamp g_old too (oasis::model routers)
  bool authors_code = false;               ///< centring convention (false: paper_v2)
  float beta = 0.0f;                       ///< already capped by beta_max
  float score_clamp = 0.0f;                ///< +inf for none
  bool softmax1 = true;
  float* g = nullptr;                      ///< [n, N] coupled logits
  float* dpsi = nullptr;                   ///< [n, N]
  float* alpha = nullptr;                  ///< [n, N]
  float* alpha_null = nullptr;             ///< [N]
};
int launch_depth_weights(const DepthLaunch& a, CUstream_st* stream);
/// h[t, c] = sum_i alpha[i, t] * sources[i, t, c] (sequential in i, as oasis::attn_res_route).
int launch_depth_mix(const float* sources, const float* alpha, int n, int N, int d, float* h, CUstream_st* stream);
/// g[i, t] = sum_c w_c * (x_c * inv * gain_c), inv = 1 / sqrt(mean(x^2) + eps) (oasis::pseudo_query_logits).
int launch_pseudo_query_logits(const float* sources, int n, int N, int d, const float* w, const float* gain,
                               float eps, float* g, CUstream_st* stream);
/// y[r, c] = x[r, c] * inv_r * gain_c over R rows of width d (RMSNorm, gain may be null).
int launch_rms_norm(const float* x, int R, int d, const float* gain, float eps, float* y, CUstream_st* stream);
/// Rotary embedding in place of rows [N, H * dh], row r at position r % T: pair (c1, c2) of
/// frequency i (rotate_half: (i, i + dh/2); interleaved: (2i, 2i + 1)), angle = pos * inv_freq[i],
/// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). inv_freq: device [dh / 2].
int launch_rope(float* x, int N, int T, int H, int dh, bool interleaved, const float* inv_freq, CUstream_st* stream);
/// a[i] = silu(gate[i]) * up[i] for i < count (SwiGLU).
int launch_swiglu(const float* gate, const float* up, long long count, float* a, CUstream_st* stream);

/// 0 if a kernel image for the current device exists, else the cudaError_t of the probe.
int probe_kernel_image();

}  // namespace oasis::cuda::detail
