// The backend registry and dispatch (oasis/backends/registry.hpp, oasis/backends/backend.hpp).
#include <deque>
#include <mutex>

#include "backend_registry.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/grad/instances.hpp"

namespace oasis {
namespace {

/// The library's backends, one line per backend folder: first the enumerators of enum class
/// Backend, in their order; a backend without an enumerator after them (reached by its name).
const std::vector<const BackendOps*>& library_backends() {
  static const std::vector<const BackendOps*> list{
      &detail::reference_backend(),
      &detail::cpu_fast_backend(),
      &detail::cuda_backend(),
  };
  return list;
}

/// The backends added by register_backend: each table with its own copy of the name.
struct Registered {
  std::string name;
  BackendOps ops;
};

struct Extra {
  std::mutex mutex;
  std::deque<Registered> backends;  // a deque keeps the tables where they are as it grows

  /// The table of that name, with the mutex held.
  const BackendOps* find_locked(std::string_view name) const {
    for (const BackendOps* b : library_backends())
      if (b->name == name) return b;
    for (const Registered& r : backends)
      if (r.ops.name == name) return &r.ops;
    return nullptr;
  }
};

Extra& extra() {
  static Extra e;
  return e;
}

const BackendOps* find(std::string_view name) {
  Extra& e = extra();
  const std::lock_guard<std::mutex> lock(e.mutex);
  return e.find_locked(name);
}

constexpr std::size_t kEnumerators = static_cast<std::size_t>(Backend::cuda) + 1;

/// The table of an enumerator; nullptr for a value outside the enumeration.
const BackendOps* find(Backend b) {
  const auto i = static_cast<std::size_t>(b);
  return i < kEnumerators ? library_backends()[i] : nullptr;
}

void require_available(const BackendOps& b) {
  const std::string why = backend_unavailable_reason(b);
  OASIS_REQUIRE(why.empty(), "backend", b.name, " is not available: ", why);
}

}  // namespace

// --- the registry -------------------------------------------------------------------------------

void register_backend(const BackendOps& ops) {
  OASIS_REQUIRE(!ops.name.empty(), "backend", "a backend needs a name");
  OASIS_REQUIRE(ops.available && ops.token_attention && ops.token_attention_backward && ops.attn_res_route &&
                    ops.attn_res && ops.attn_res_backward,
                "backend", "'", ops.name,
                "' lacks an op (available, token_attention, token_attention_backward, attn_res_route, attn_res, "
                "attn_res_backward)");
  Extra& e = extra();
  const std::lock_guard<std::mutex> lock(e.mutex);
  OASIS_REQUIRE(e.find_locked(ops.name) == nullptr, "backend", "a backend named '", ops.name,
                "' is already registered");
  Registered& r = e.backends.emplace_back(Registered{std::string(ops.name), ops});
  r.ops.name = r.name;
}

std::vector<const BackendOps*> registered_backends() {
  std::vector<const BackendOps*> out = library_backends();
  Extra& e = extra();
  const std::lock_guard<std::mutex> lock(e.mutex);
  for (const Registered& r : e.backends) out.push_back(&r.ops);
  return out;
}

const BackendOps& backend_ops(std::string_view name) {
  if (const BackendOps* b = find(name)) return *b;
  std::string known;
  for (const BackendOps* b : registered_backends()) known += (known.empty() ? "" : ", ") + std::string(b->name);
  throw invalid_argument("backend", "unknown backend '" + std::string(name) + "' (registered: " + known + ")");
}

std::string backend_unavailable_reason(const BackendOps& b) {
  std::string why;
  return b.available(&why) ? "" : why;
}

bool backend_available(const BackendOps& b) { return backend_unavailable_reason(b).empty(); }

// --- dispatch on a table: availability and shapes here, values in the op --------------------------

AttentionResult<float> token_attention(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                       const Tensor<float>& v, const AttentionOptions& opt) {
  require_available(b);
  check_attention_shapes(q, k, v, opt);
  return b.token_attention(q, k, v, opt);
}

AttentionGrads<float> token_attention_backward(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                               const Tensor<float>& v, const AttentionCotangents<float>& d,
                                               const AttentionOptions& opt) {
  require_available(b);
  check_attention_shapes(q, k, v, opt);
  return b.token_attention_backward(q, k, v, d, opt);
}

DepthRoute<float> attn_res_route(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& g_old,
                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                 const DepthOptions& opt) {
  require_available(b);
  check_route_shapes(sources, g_old, psi, kinds);
  return b.attn_res_route(sources, g_old, psi, kinds, opt);
}

DepthRoute<float> attn_res(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& w,
                           const Tensor<float>& gain, const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                           const AttnResOptions& opt) {
  require_available(b);
  check_attn_res_shapes(sources, w, gain, psi, kinds);
  return b.attn_res(sources, w, gain, psi, kinds, opt);
}

AttnResGrads<float> attn_res_backward(const BackendOps& b, const Tensor<float>& sources, const Tensor<float>& w,
                                      const Tensor<float>& gain, const Tensor<float>& psi,
                                      const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                      const DepthCotangents<float>& d) {
  require_available(b);
  const RouteShape s = check_attn_res_shapes(sources, w, gain, psi, kinds);
  check_depth_cotangents(s, d);
  return b.attn_res_backward(sources, w, gain, psi, kinds, opt, d);
}

// --- enum class Backend: the library's tables in enumeration order ----------------------------------

std::string_view to_string(Backend b) {
  const BackendOps* t = find(b);
  return t ? t->name : "unknown";
}

Backend parse_backend(std::string_view name) {
  for (std::size_t i = 0; i < kEnumerators; ++i)
    if (library_backends()[i]->name == name) return static_cast<Backend>(i);
  throw invalid_argument("backend", "unknown backend '" + std::string(name) +
                                        "' (expected reference, cpu_fast or cuda)");
}

const BackendOps& backend_ops(Backend b) {
  const BackendOps* t = find(b);
  OASIS_REQUIRE(t != nullptr, "backend", "unknown is not available: unknown backend");
  return *t;
}

std::string backend_unavailable_reason(Backend b) {
  const BackendOps* t = find(b);
  return t ? backend_unavailable_reason(*t) : "unknown backend";
}

bool backend_available(Backend b) { return backend_unavailable_reason(b).empty(); }

std::vector<Backend> available_backends() {
  std::vector<Backend> out;
  for (std::size_t i = 0; i < kEnumerators; ++i)
    if (backend_available(*library_backends()[i])) out.push_back(static_cast<Backend>(i));
  return out;
}

AttentionResult<float> token_attention(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                       const Tensor<float>& v, const AttentionOptions& opt) {
  return token_attention(backend_ops(b), q, k, v, opt);
}

AttentionGrads<float> token_attention_backward(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                               const Tensor<float>& v, const AttentionCotangents<float>& d,
                                               const AttentionOptions& opt) {
  return token_attention_backward(backend_ops(b), q, k, v, d, opt);
}

DepthRoute<float> attn_res_route(Backend b, const Tensor<float>& sources, const Tensor<float>& g_old,
                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                 const DepthOptions& opt) {
  return attn_res_route(backend_ops(b), sources, g_old, psi, kinds, opt);
}

DepthRoute<float> attn_res(Backend b, const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                           const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  return attn_res(backend_ops(b), sources, w, gain, psi, kinds, opt);
}

AttnResGrads<float> attn_res_backward(Backend b, const Tensor<float>& sources, const Tensor<float>& w,
                                      const Tensor<float>& gain, const Tensor<float>& psi,
                                      const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                      const DepthCotangents<float>& d) {
  return attn_res_backward(backend_ops(b), sources, w, gain, psi, kinds, opt, d);
}

}  // namespace oasis
