// oasis/cpu_fast.hpp — the fast CPU path (Backend::cpu_fast) with explicit control.
//
// Backend::cpu_fast in oasis/backend.hpp runs the same code; this header adds what a user of the
// fast path needs beyond the one-call API:
//  * *_into functions that write into a caller-owned result and reuse its buffers when the shape
//    matches, so a loop that calls attention repeatedly does not pay the first-touch page faults
//    of fresh output tensors on every call (about 13 us per 4 KiB page on the project machines);
//    the packing and per-thread workspaces are thread_local and grow only, so they are reused too;
//  * the instruction-set variant in use (avx512, avx2, generic), chosen at run time, and a way to
//    force a narrower one (tests run every variant the CPU supports);
//  * the vectorised exponential the kernels use, so its error can be measured.
//
// Semantics are those of the reference (oasis/attention.hpp token_attention and oasis/depth.hpp
// attn_res_route): same validation and messages, same outputs, every option (masks, sliding
// window, additive bias, both layouts). Token attention is fused and tiled (the online softmax of
// oasis/online_softmax.hpp: the null category enters every row's sum exactly once); depth
// routing computes its weights with the reference's own scalar functions and only vectorises the
// mixing, in the reference's order and arithmetic, so its outputs are bitwise the reference's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "oasis/attention.hpp"
#include "oasis/depth.hpp"

namespace oasis::cpu_fast {

/// The instruction-set variant in use: "avx512", "avx2" or "generic".
std::string_view isa();
/// Variants this CPU can run, widest first ("generic" is always present).
std::vector<std::string> available_isas();
/// Force a variant (one of available_isas()); throws oasis::invalid_argument naming "isa".
/// Process-wide; not to be called while another thread runs a fast-path function.
void set_isa(std::string_view name);

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

/// Depth routing of one layer into `r` (reusing its storage when the size matches).
void attn_res_route_into(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                         const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r);
/// attn_res_route_into with a fresh result.
DepthRoute<float> attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const DepthOptions& opt = {});

}  // namespace oasis::cpu_fast
