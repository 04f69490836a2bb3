// Backend::cpu_fast's table (oasis/backends/registry.hpp), listed in src/core/backend.cpp.
#include "core/backend_registry.hpp"
#include "entry_points.hpp"

namespace oasis::detail {

const BackendOps& cpu_fast_backend() {
  static constexpr BackendOps ops{"cpu_fast", &cpu_fast_available, &cpu_fast_token_attention,
                                  &cpu_fast_token_attention_backward, &cpu_fast_attn_res_route,
                                  &cpu_fast_attn_res, &cpu_fast_attn_res_backward};
  return ops;
}

}  // namespace oasis::detail
