// oasis/backends/cpu_fast.hpp — the fast CPU path (Backend::cpu_fast) with explicit control.
//
// Backend::cpu_fast in oasis/backends/backend.hpp runs the same code; this header adds what a user of the
// fast path needs beyond the one-call API:
//  * *_into functions that write into a caller-owned result and reuse its buffers when the shape
//    matches, so a loop that calls attention repeatedly does not pay the first-touch page faults
//    of fresh output tensors on every call (docs/benchmarks.md, "Workspaces"); the packing and
//    per-thread workspaces are thread_local and grow only, so they are reused too;
//  * the instruction-set variant in use (avx512, avx2, generic), chosen at run time, and a way to
//    force a narrower one (tests run every variant the CPU supports);
//  * the vectorised exponential the kernels use, so its error can be measured.
//
// Semantics are those of the reference (oasis/ops/attention.hpp token_attention, oasis/ops/depth.hpp
// attn_res_route, oasis/grad/attention_backward.hpp token_attention_backward): same validation
// and messages, same outputs, every option (masks, sliding window, additive bias, both layouts). Token attention is fused and tiled (the online softmax of
// oasis/ops/online_softmax.hpp: the null category enters every row's sum exactly once); depth
// routing computes its weights with the reference's own scalar functions and only vectorises the
// mixing, in the reference's order and arithmetic, so its outputs are bitwise the reference's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"

namespace oasis::cpu_fast {

/// The instruction-set variant in use: "avx512", "avx2" or "generic".
std::string_view isa();
/// Variants this CPU can run, widest first ("generic" is always present).
std::vector<std::string> available_isas();
/// Force a variant (one of available_isas()); throws oasis::invalid_argument naming "isa".
/// Process-wide; not to be called while another thread runs a fast-path function.
void set_isa(std::string_view name);

/// How the depth routing's mixing streams its sources: "pairs-l2" (two sources per pass over the
/// output block, the next pass's rows prefetched into L2) or "quads-l1" (four per pass in vectors
/// of at most 32 bytes, each stream prefetched 2 KiB ahead into L1), chosen from the CPU vendor
/// (quads-l1 on AMD, pairs-l2 elsewhere; docs/benchmarks.md, "Where the AMD runs lost: depth
/// routing");
/// OASIS_CPU_FAST_ROUTE_STREAMS sets the initial choice. Both give bitwise the same result;
/// set_route_streams forces one (throws oasis::invalid_argument naming "route_streams" for an
/// unknown name). Process-wide, as set_isa.
std::string_view route_streams();
std::vector<std::string> available_route_streams();
void set_route_streams(std::string_view name);

/// Frees the grow-only workspaces of the calling thread and of the OpenMP worker threads (the
/// next call allocates and first-touches them again). Not to be called concurrently with a
/// fast-path function.
void release_workspaces();

/// y_i = e^{x_i} with the kernels' vectorised exponential (x and y may alias). Domain: results
/// below 2^-125 are flushed to 0, x > ln(FLT_MAX) gives +inf; error bound in docs/benchmarks.md.
void vector_exp(const float* x, float* y, index_t n);

/// Token attention into `r` (its tensors are reshaped, reusing storage when the size matches).
/// As the reference, a visible score scale * q.k that overflows float32 to NaN or +inf throws
/// oasis::invalid_argument naming "scores" (the message names the first such row's batch, head and
/// query); a visible -inf score is a masked key. `r` is then left partly written.
void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r);
/// token_attention_into with a fresh result.
AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt = {});

/// What the backward reads of its forward besides the output: each row's final online-softmax
/// state (oasis/ops/online_softmax.hpp), [B, H, Tq]: M (the running maximum, the null logit included)
/// and S (the sum in units of e^M). The backward recomputes p_j = e^{z_j - M} (1 / S), the
/// reference's arithmetic (oasis::normalize_row). FlashAttention-2 keeps LSE = M + log S instead
/// and forms e^{z_j - LSE}; in float that costs a relative error u |LSE| in every probability of
/// the row (LSE is rounded where |LSE| is large), which the parity rule would reject for large
/// logits, so the two numbers are kept (8 bytes per row instead of 4).
struct AttentionRowState {
  Tensor<float> max, sum;
};

/// Token attention into `r` that also writes the row state the backward needs (softmax and
/// softmax1 only; another normaliser throws naming "normalizer").
void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r, AttentionRowState& state);

/// The backward of token attention (oasis/grad/attention_backward.hpp, docs/spec.md §8) from a forward of
/// the same call (`forward`: its out and p_null; `state`: the row state token_attention_into
/// wrote), into `g` (reusing its storage when the shapes match). FlashAttention-2's algorithm with
/// the null category: the probabilities are recomputed tile by tile, never stored; D = <dO, O> +
/// p_null dP per row. Same validation as the reference (check_attention_args,
/// check_attention_cotangents) plus the forward's shapes ("forward", "state"); the options must be
/// the forward's (a different mask gives the gradients of a different function). Results: every
/// field of AttentionGrads as the reference fills it — q, k, v (GQA: summed over each group),
/// null_logits (softmax1), bias (when the options have one) and scores (dL/dz, [B, H, Tq, Tk],
/// when opt.return_probs); the last two cost O(B H Tq Tk) memory, the others O(inputs).
/// Fully masked rows contribute nothing to dq, dk, dv (their null logit receives dLSE).
/// Deterministic: the sums run in an order fixed by the shapes and the number of OpenMP threads.
void token_attention_backward_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                   const AttentionResult<float>& forward, const AttentionRowState& state,
                                   const AttentionCotangents<float>& d, const AttentionOptions& opt,
                                   AttentionGrads<float>& g);
/// The backward in one call: runs the forward (token_attention_into with the row state), then
/// token_attention_backward_into.
AttentionGrads<float> token_attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                               const AttentionCotangents<float>& d, const AttentionOptions& opt = {});

/// Depth routing of one layer into `r` (reusing its storage when the size matches).
void attn_res_route_into(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                         const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r);
/// attn_res_route_into with a fresh result.
DepthRoute<float> attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const DepthOptions& opt = {});

/// The fused AttnRes routing (oasis/ops/attn_res.hpp) into `r`, and its backward
/// (oasis/grad/attn_res_backward.hpp) into `g`, each reusing the caller's storage when the shapes
/// match (every element is written): a training loop does not pay the first touch of a fresh
/// [n, N, d] gradient per call (docs/benchmarks.md, "Fused AttnRes routing on the fast path").
/// Same validation and results as Backend::cpu_fast's attn_res and attn_res_backward.
void attn_res_into(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                   const std::vector<SourceKind>& kinds, const AttnResOptions& opt, DepthRoute<float>& r);
void attn_res_backward_into(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                            const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                            const DepthCotangents<float>& d, AttnResGrads<float>& g);

}  // namespace oasis::cpu_fast
