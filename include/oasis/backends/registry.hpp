// oasis/backends/registry.hpp — a backend is one table of its ops; the registry holds the tables.
//
// Each backend folder (src/<backend>/register.cpp) fills one BackendOps. The library's own
// backends are listed in src/core/backend.cpp, one line each, in the order of enum class Backend
// (oasis/backends/backend.hpp): an explicit list, not self-registering objects, because a static
// library drops an object file that nothing refers to and the order of static initialisers across
// files is unspecified. A backend outside the library (a plugin, a test double) is added at run
// time with register_backend. The parity suite (tests/parity) and `oasis-verify selfcheck` run
// over registered_backends().
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/attn_res.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis {

/// One backend's table: plain function pointers, so that a table is a constant (initialised before
/// any code runs). The dispatcher below checks that the backend is available and the arguments'
/// shapes (check_attention_shapes, check_route_shapes) before it calls an op; an op checks the
/// values as the reference does (the same argument named) and fills the reference's structures.
struct BackendOps {
  std::string_view name;  ///< to_string's and parse_backend's name, the parity tests' prefix
  /// True if usable now; otherwise sets *why (when why is not null) to the reason.
  bool (*available)(std::string* why);
  AttentionResult<float> (*token_attention)(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                            const AttentionOptions& opt);
  AttentionGrads<float> (*token_attention_backward)(const Tensor<float>& q, const Tensor<float>& k,
                                                    const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                    const AttentionOptions& opt);
  DepthRoute<float> (*attn_res_route)(const Tensor<float>& sources, const Tensor<float>& g_old,
                                      const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                      const DepthOptions& opt);
  /// The fused AttnRes routing (oasis/ops/attn_res.hpp) and its backward (oasis/grad/attn_res_backward.hpp).
  DepthRoute<float> (*attn_res)(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                const AttnResOptions& opt);
  AttnResGrads<float> (*attn_res_backward)(const Tensor<float>& sources, const Tensor<float>& w,
                                           const Tensor<float>& gain, const Tensor<float>& psi,
                                           const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                           const DepthCotangents<float>& d);
};

/// Adds a backend after the library's own (the table is copied, its name included); thread-safe.
/// Throws oasis::invalid_argument naming "backend" when the name is empty or taken, or an op is
/// missing.
void register_backend(const BackendOps& ops);
/// Every backend, available or not: the library's (reference, cpu_fast, cuda), then the registered
/// ones in the order of registration. The tables live as long as the process.
std::vector<const BackendOps*> registered_backends();
/// The backend of that name; throws oasis::invalid_argument naming "backend" with the known names.
const BackendOps& backend_ops(std::string_view name);

/// True if the backend is usable now.
bool backend_available(const BackendOps& b);
/// Why backend_available(b) is false ("" when it is available).
std::string backend_unavailable_reason(const BackendOps& b);

/// The ops of oasis/backends/backend.hpp on a table: throw oasis::invalid_argument naming
/// "backend" when it is unavailable, or naming the argument when the arguments are invalid.
AttentionResult<float> token_attention(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                       const Tensor<float>& v, const AttentionOptions& opt = {});
AttentionGrads<float> token_attention_backward(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                               const Tensor<float>& v, const AttentionCotangents<float>& d,
                                               const AttentionOptions& opt = {});
DepthRoute<float> attn_res_route(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& g_old,
                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                 const DepthOptions& opt = {});
DepthRoute<float> attn_res(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& w,
                           const Tensor<float>& gain, const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                           const AttnResOptions& opt = {});
AttnResGrads<float> attn_res_backward(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& w,
                                      const Tensor<float>& gain, const Tensor<float>& psi,
                                      const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                      const DepthCotangents<float>& d);

}  // namespace oasis
