// src/python/core_support.hpp — what the core functions (core.cpp) and the backend and
// kernel-interface functions (backends.cpp) share: the options object, the attention options,
// the dispatch on the dtype of the first array, and the choice of a backend.
//
// A call names its backend ("reference" by default). The reference runs the library's
// scalar-generic functions in the dtype of the call's first array (float32 or float64), as the
// core functions always have. Any other backend (cpu_fast, cuda, or one added with
// oasis::register_backend) computes in float32 through its table (oasis/backends/registry.hpp):
// an array of another dtype is refused naming the array and its dtype, never converted.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "op_options.hpp"  // src/verify: Options, parse_depth_options, parse_kinds
#include "oasis/backends/registry.hpp"
#include "oasis/io/json.hpp"

namespace oasis::python {

/// A JSON object of options with only `known` keys (an unknown key names itself).
io::json::Value options_of(const std::string& json, const std::vector<std::string>& known, const char* fn);

/// "zero" | "error".
MaskedRow parse_masked_row(const std::string& s);

/// The keys of token_attention's options (and of its backward, varlen and paged forms).
extern const std::vector<std::string> kAttentionKeys;
/// AttentionOptions from those keys, plus the optional bias array (None: no bias).
AttentionOptions attention_options(const verify::detail::Options& o, py::handle bias);

/// Run f<float> or f<double> by the dtype of the array `first` (named `name`).
template <class F>
py::object dispatch(py::handle first, const std::string& name, F&& f) {
  if (scalar_of(first, name) == Scalar::f32) return f(float{});
  return f(double{});
}

/// The backend a call names: nullptr for "reference" (the scalar-generic reference), else the
/// table of that backend. An unknown name, or a backend that is not available now, throws
/// naming "backend" (with the registered names, or with the reason it is unavailable).
const BackendOps* backend_of(const std::string& name);

/// Throws naming `name` unless the array is float32 (b is a backend's table; nothing for the reference).
void require_float32(const BackendOps* b, py::handle a, const std::string& name);

/// dispatch on the reference; f<float> on a backend's table, after require_float32 on `first`.
template <class F>
py::object dispatch_on(const BackendOps* b, py::handle first, const std::string& name, F&& f) {
  if (!b) return dispatch(first, name, std::forward<F>(f));
  require_float32(b, first, name);
  return f(float{});
}

/// An array of the call as Tensor<T>, checked to be float32 first on a backend's table.
template <class T>
Tensor<T> tensor_on(const BackendOps* b, py::handle a, const std::string& name, bool allow_nan = false) {
  require_float32(b, a, name);
  return to_tensor<T>(a, name, allow_nan);
}

/// fast(*b) on a backend's table (T float), ref() on the reference. `fast` takes `const auto&`, so
/// that its body is compiled for float only.
template <class T, class Fast, class Ref>
auto on_backend(const BackendOps* b, Fast&& fast, Ref&& ref) {
  if constexpr (std::is_same_v<T, float>) {
    if (b) return fast(*b);
  }
  return ref();
}

/// f() with the library's names of the cotangents (dout, dlse, dp_null, dh, dalpha, dalpha_null)
/// in an error replaced by the Python argument's (grad_out, ..., grad_alpha_null).
/// rethrow_with_python_names: called in the handler of `e` (another error is rethrown as it is).
[[noreturn]] void rethrow_with_python_names(const invalid_argument& e);
template <class F>
auto python_names(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const invalid_argument& e) {
    rethrow_with_python_names(e);
  }
}

}  // namespace oasis::python
