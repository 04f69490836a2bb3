// src/python/backends.cpp — the library's backends and its kernel-interface functions on NumPy
// arrays (oasis._core): the list of backends, the backward of token attention, the fused AttnRes
// routing (attn_res, block_attn_res) and its backward, and token attention on packed (varlen) and
// paged layouts (oasis/backends/backend.hpp, oasis/backends/layouts.hpp).
//
// Every function takes a backend name (core_support.hpp): "reference" runs the scalar-generic
// reference in the dtype of the first array (float32 or float64); another backend runs its table
// in float32 and refuses any other dtype, naming the array. Results are dicts keyed like the
// outputs of the matching op of `check` (grad_q, grad_sources, ...), so that a result can be
// handed to check() as it is. The fused routing's options are those of op attn_res: the depth keys
// read by the compare engine's parse_depth_options and parse_kinds, plus eps and scale, with op
// attn_res's defaults (normalizer softmax, coupling when psi is given) — set here as
// src/verify/attn_res_support.cpp's attn_res_call sets them, since that function reads a
// TensorMap of the compare engine rather than options alone.
#include <cmath>
#include <cstdint>
#include <cstring>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "core_support.hpp"
#include "oasis/backends/layouts.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::python {

using verify::detail::Options;

// ---- the choice of a backend (core_support.hpp) ----------------------------------------------------------

const BackendOps* backend_of(const std::string& name) {
  if (name == "reference") return nullptr;
  const BackendOps& b = backend_ops(name);  // an unknown name throws naming "backend", with the known names
  const std::string why = backend_unavailable_reason(b);
  OASIS_REQUIRE(why.empty(), "backend", name, " is not available: ", why);
  return &b;
}

void require_float32(const BackendOps* b, py::handle a, const std::string& name) {
  if (!b || scalar_of(a, name) == Scalar::f32) return;
  throw invalid_argument(name, "dtype " + std::string(py::str(py::reinterpret_borrow<py::array>(a).dtype())) +
                                   ": backend " + std::string(b->name) +
                                   " computes in float32; pass float32 arrays, or backend=\"reference\" for float64");
}

void rethrow_with_python_names(const invalid_argument& e) {
  static const std::pair<const char*, const char*> names[] = {
      {"dout", "grad_out"}, {"dlse", "grad_lse"},         {"dp_null", "grad_p_null"},
      {"dh", "grad_h"},     {"dalpha", "grad_alpha"}, {"dalpha_null", "grad_alpha_null"}};
  for (const auto& [lib, py_name] : names)
    if (e.argument() == lib) {
      std::string what = e.what();
      const std::string prefix = "oasis: argument '" + e.argument() + "': ";
      if (what.compare(0, prefix.size(), prefix) == 0) what.erase(0, prefix.size());
      throw invalid_argument(py_name, what);
    }
  throw;  // called in the handler: the exception as it was
}

namespace {

// ---- the list ---------------------------------------------------------------------------------------------

std::vector<std::string> backends() {
  std::vector<std::string> out;
  for (const BackendOps* b : registered_backends())
    if (backend_available(*b)) out.emplace_back(b->name);
  return out;
}

bool is_backend_available(const std::string& name) { return backend_available(backend_ops(name)); }

// ---- helpers ----------------------------------------------------------------------------------------------

/// An optional array (None: an empty tensor).
template <class T>
Tensor<T> optional_on(const BackendOps* b, py::handle a, const std::string& name) {
  return a.is_none() ? Tensor<T>() : tensor_on<T>(b, a, name);
}

/// An integer array (the Python layer hands over int64, C-contiguous) as Tensor<index_t>.
Tensor<index_t> index_tensor(py::handle h, const std::string& name) {
  OASIS_REQUIRE(py::isinstance<py::array_t<std::int64_t>>(h), name, "expected an int64 array");
  const auto a = py::reinterpret_borrow<py::array_t<std::int64_t>>(h);
  OASIS_REQUIRE(a.flags() & py::array::c_style, name, "is not C-contiguous; pass np.ascontiguousarray(x)");
  Shape s;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<index_t>(a.shape(i)));
  Tensor<index_t> t(s);
  if (t.size() > 0) std::memcpy(t.data(), a.data(), static_cast<std::size_t>(t.size()) * sizeof(index_t));
  return t;
}

template <class T>
py::array_t<T> scalar_array(T x) {
  Tensor<T> t({1});
  t[0] = x;
  return to_numpy(t);
}

template <class T>
py::dict attention_dict(const AttentionResult<T>& r) {
  py::dict out;
  out["out"] = to_numpy(r.out);
  out["lse"] = to_numpy(r.lse);
  out["p_null"] = to_numpy(r.p_null);
  if (!r.probs.empty()) out["probs"] = to_numpy(r.probs);
  return out;
}

template <class T>
py::dict attention_grads_dict(const AttentionGrads<T>& g) {
  py::dict out;
  out["grad_q"] = to_numpy(g.q);
  out["grad_k"] = to_numpy(g.k);
  out["grad_v"] = to_numpy(g.v);
  if (!g.null_logits.empty()) out["grad_null_logits"] = to_numpy(g.null_logits);
  if (!g.bias.empty()) out["grad_bias"] = to_numpy(g.bias);
  if (!g.scores.empty()) out["grad_scores"] = to_numpy(g.scores);
  return out;
}

template <class T>
py::dict route_dict(const DepthRoute<T>& r) {
  py::dict out;
  out["h"] = to_numpy(r.h);
  out["alpha"] = to_numpy(r.alpha);
  out["alpha_null"] = to_numpy(r.alpha_null);
  out["g"] = to_numpy(r.g);
  out["dpsi"] = to_numpy(r.dpsi);
  return out;
}

/// w, gain, psi, logits, beta, theta of the fused backward (the sources' entries are the caller's).
template <class T>
void add_fused_grads(py::dict& out, const AttnResGrads<T>& g) {
  out["grad_w"] = to_numpy(g.w);
  if (!g.gain.empty()) out["grad_gain"] = to_numpy(g.gain);
  out["grad_psi"] = to_numpy(g.psi);
  out["grad_logits"] = to_numpy(g.logits);
  out["grad_beta"] = scalar_array(g.beta);
  out["grad_theta"] = scalar_array(g.theta);
}

// ---- token attention's backward (oasis/grad/attention_backward.hpp) --------------------------------------

/// The cotangents of token attention's outputs under their Python names (grad_lse, grad_p_null optional).
template <class T>
AttentionCotangents<T> attention_cotangents(const BackendOps* b, py::handle dout_in, py::object dlse_in, py::object dpn_in) {
  return {tensor_on<T>(b, dout_in, "grad_out"), optional_on<T>(b, dlse_in, "grad_lse"), optional_on<T>(b, dpn_in, "grad_p_null")};
}

py::object token_attention_backward(py::handle q_in, py::handle k_in, py::handle v_in, py::handle dout_in,
                                    py::object dlse_in, py::object dpn_in, py::object bias_in, const std::string& json,
                                    const std::string& backend) {
  const io::json::Value v = options_of(json, kAttentionKeys, "token_attention_backward");
  const AttentionOptions a = attention_options(Options(&v), bias_in);
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, q_in, "q", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> q = tensor_on<T>(b, q_in, "q"), k = tensor_on<T>(b, k_in, "k"), vv = tensor_on<T>(b, v_in, "v");
    const AttentionCotangents<T> d = attention_cotangents<T>(b, dout_in, dlse_in, dpn_in);
    AttentionGrads<T> g;
    {
      py::gil_scoped_release nogil;
      g = python_names([&] {
        return on_backend<T>(
            b, [&](const auto& ops) { return oasis::token_attention_backward(ops, q, k, vv, d, a); },
            [&] { return oasis::token_attention_backward(q, k, vv, d, a); });
      });
    }
    return attention_grads_dict(g);
  });
}

// ---- the fused AttnRes routing (oasis/ops/attn_res.hpp, oasis/grad/attn_res_backward.hpp) ----------------

std::vector<std::string> attn_res_keys() {
  std::vector<std::string> keys = verify::detail::kDepthOptionKeys;
  keys.insert(keys.end(), {"eps", "scale"});
  return keys;
}

/// Op attn_res's options (src/verify/attn_res_support.cpp attn_res_call): eps > 0 and scale finite,
/// normalizer softmax unless given, coupling by default when psi is given (and required then).
AttnResOptions attn_res_options(const Options& o, bool has_psi, const char* fn) {
  AttnResOptions a;
  a.key_norm.eps = o.number("eps", a.key_norm.eps);
  OASIS_REQUIRE(a.key_norm.eps > 0 && std::isfinite(a.key_norm.eps), "eps", "must be finite and positive");
  a.scale = o.number("scale", 1.0);
  OASIS_REQUIRE(std::isfinite(a.scale), "scale", "must be finite");
  a.depth = verify::detail::parse_depth_options(o, has_psi);
  if (!o.has("normalizer")) a.depth.normalizer = RowNorm::softmax;  // fla's AttnRes
  if (has_psi) OASIS_REQUIRE(a.depth.coupling, "psi", "given but coupling is false (drop psi or set coupling=True)");
  else OASIS_REQUIRE(!a.depth.coupling, "psi", fn, " with coupling needs psi [n, N]");
  return a;
}

/// The arguments of a fused call besides its sources: w, gain, psi (zeros [n, N] when not given) and kinds.
template <class T>
struct FusedArgs {
  Tensor<T> w, gain, psi;
  std::vector<SourceKind> kinds;
};

/// n candidates of N tokens (0 when the sources' shape is wrong: the library names it).
template <class T>
FusedArgs<T> fused_args(const BackendOps* b, const Options& o, index_t n, index_t N, py::handle w_in, py::handle gain_in,
                        py::handle psi_in) {
  FusedArgs<T> f;
  f.w = tensor_on<T>(b, w_in, "w");
  f.gain = optional_on<T>(b, gain_in, "gain");
  f.psi = psi_in.is_none() ? Tensor<T>({n, N}) : tensor_on<T>(b, psi_in, "psi");
  f.kinds = verify::detail::parse_kinds(o, n);
  return f;
}

template <class T>
DepthCotangents<T> depth_cotangents(const BackendOps* b, py::handle dh, py::handle da, py::handle dan) {
  DepthCotangents<T> d;
  d.h = tensor_on<T>(b, dh, "grad_h");
  d.alpha = optional_on<T>(b, da, "grad_alpha");
  d.alpha_null = optional_on<T>(b, dan, "grad_alpha_null");
  return d;
}

py::object attn_res(py::handle s_in, py::handle w_in, py::object gain_in, py::object psi_in, const std::string& json,
                    const std::string& backend) {
  const io::json::Value v = options_of(json, attn_res_keys(), "attn_res");
  const Options o(&v);
  const AttnResOptions opt = attn_res_options(o, !psi_in.is_none(), "attn_res");
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, s_in, "sources", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> s = tensor_on<T>(b, s_in, "sources");
    const bool r3 = s.rank() == 3;
    const FusedArgs<T> f = fused_args<T>(b, o, r3 ? s.dim(0) : 0, r3 ? s.dim(1) : 0, w_in, gain_in, psi_in);
    DepthRoute<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::attn_res(ops, s, f.w, f.gain, f.psi, f.kinds, opt); },
          [&] { return oasis::attn_res(s, f.w, f.gain, f.psi, f.kinds, opt); });
    }
    return route_dict(r);
  });
}

py::object attn_res_backward(py::handle s_in, py::handle w_in, py::handle dh_in, py::object gain_in, py::object psi_in,
                             py::object da_in, py::object dan_in, const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, attn_res_keys(), "attn_res_backward");
  const Options o(&v);
  const AttnResOptions opt = attn_res_options(o, !psi_in.is_none(), "attn_res_backward");
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, s_in, "sources", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> s = tensor_on<T>(b, s_in, "sources");
    const bool r3 = s.rank() == 3;
    const FusedArgs<T> f = fused_args<T>(b, o, r3 ? s.dim(0) : 0, r3 ? s.dim(1) : 0, w_in, gain_in, psi_in);
    const DepthCotangents<T> d = depth_cotangents<T>(b, dh_in, da_in, dan_in);
    AttnResGrads<T> g;
    {
      py::gil_scoped_release nogil;
      g = python_names([&] {
        return on_backend<T>(
            b, [&](const auto& ops) { return oasis::attn_res_backward(ops, s, f.w, f.gain, f.psi, f.kinds, opt, d); },
            [&] { return oasis::attn_res_backward(s, f.w, f.gain, f.psi, f.kinds, opt, d); });
      });
    }
    py::dict out;
    out["grad_sources"] = to_numpy(g.sources);
    add_fused_grads(out, g);
    return std::move(out);
  });
}

/// Block AttnRes's candidates: m blocks plus the partial sum when given. The rank of blocks is
/// checked here, in stack_block_sources's words: the backends' block_attn_res_backward
/// (src/core/backend_layouts.cpp) reads blocks.dim(0) in the same call as it stacks, so a blocks
/// array of rank 0 would reach Tensor::dim unchecked (std::out_of_range) before the stacking names it.
template <class T>
std::pair<index_t, index_t> block_rows(const Tensor<T>& blocks, const Tensor<T>& partial) {
  require_rank(blocks, 3, "blocks", "[m, N, d]");
  return {blocks.dim(0) + (partial.empty() ? 0 : 1), blocks.dim(1)};
}

py::object block_attn_res(py::handle bl_in, py::object part_in, py::handle w_in, py::object gain_in, py::object psi_in,
                          const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, attn_res_keys(), "block_attn_res");
  const Options o(&v);
  const AttnResOptions opt = attn_res_options(o, !psi_in.is_none(), "block_attn_res");
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, bl_in, "blocks", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> bl = tensor_on<T>(b, bl_in, "blocks"), part = optional_on<T>(b, part_in, "partial");
    const auto [n, N] = block_rows(bl, part);
    const FusedArgs<T> f = fused_args<T>(b, o, n, N, w_in, gain_in, psi_in);
    DepthRoute<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::block_attn_res(ops, bl, part, f.w, f.gain, f.psi, f.kinds, opt); },
          [&] { return oasis::block_attn_res(bl, part, f.w, f.gain, f.psi, f.kinds, opt); });
    }
    return route_dict(r);
  });
}

py::object block_attn_res_backward(py::handle bl_in, py::handle w_in, py::handle dh_in, py::object part_in,
                                   py::object gain_in, py::object psi_in, py::object da_in, py::object dan_in,
                                   const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, attn_res_keys(), "block_attn_res_backward");
  const Options o(&v);
  const AttnResOptions opt = attn_res_options(o, !psi_in.is_none(), "block_attn_res_backward");
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, bl_in, "blocks", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> bl = tensor_on<T>(b, bl_in, "blocks"), part = optional_on<T>(b, part_in, "partial");
    const auto [n, N] = block_rows(bl, part);
    const FusedArgs<T> f = fused_args<T>(b, o, n, N, w_in, gain_in, psi_in);
    const DepthCotangents<T> d = depth_cotangents<T>(b, dh_in, da_in, dan_in);
    BlockAttnResGrads<T> g;
    {
      py::gil_scoped_release nogil;
      g = python_names([&] {
        return on_backend<T>(
            b,
            [&](const auto& ops) {
              return oasis::block_attn_res_backward(ops, bl, part, f.w, f.gain, f.psi, f.kinds, opt, d);
            },
            [&] { return oasis::block_attn_res_backward(bl, part, f.w, f.gain, f.psi, f.kinds, opt, d); });
      });
    }
    py::dict out;
    out["grad_blocks"] = to_numpy(g.blocks);
    if (!g.partial.empty()) out["grad_partial"] = to_numpy(g.partial);
    add_fused_grads(out, g.fused);
    return std::move(out);
  });
}

// ---- packed (varlen) and paged layouts (oasis/ops/varlen.hpp, oasis/ops/paged.hpp) -----------------------

py::object token_attention_varlen(py::handle q_in, py::handle k_in, py::handle v_in, const std::vector<index_t>& cu_q,
                                  const std::vector<index_t>& cu_k, const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, kAttentionKeys, "token_attention_varlen");
  const AttentionOptions a = attention_options(Options(&v), py::none());
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, q_in, "q", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> q = tensor_on<T>(b, q_in, "q"), k = tensor_on<T>(b, k_in, "k"), vv = tensor_on<T>(b, v_in, "v");
    AttentionResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::token_attention_varlen(ops, q, k, vv, cu_q, cu_k, a); },
          [&] { return oasis::token_attention_varlen(q, k, vv, cu_q, cu_k, a); });
    }
    return attention_dict(r);
  });
}

py::object token_attention_varlen_backward(py::handle q_in, py::handle k_in, py::handle v_in,
                                           const std::vector<index_t>& cu_q, const std::vector<index_t>& cu_k,
                                           py::handle dout_in, py::object dlse_in, py::object dpn_in,
                                           const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, kAttentionKeys, "token_attention_varlen_backward");
  const AttentionOptions a = attention_options(Options(&v), py::none());
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, q_in, "q", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> q = tensor_on<T>(b, q_in, "q"), k = tensor_on<T>(b, k_in, "k"), vv = tensor_on<T>(b, v_in, "v");
    const AttentionCotangents<T> d = attention_cotangents<T>(b, dout_in, dlse_in, dpn_in);
    AttentionGrads<T> g;
    {
      py::gil_scoped_release nogil;
      g = python_names([&] {
        return on_backend<T>(
            b, [&](const auto& ops) { return oasis::token_attention_varlen_backward(ops, q, k, vv, cu_q, cu_k, d, a); },
            [&] { return oasis::token_attention_varlen_backward(q, k, vv, cu_q, cu_k, d, a); });
      });
    }
    return attention_grads_dict(g);
  });
}

py::object token_attention_paged(py::handle q_in, py::handle kc_in, py::handle vc_in, py::handle table_in,
                                 const std::vector<index_t>& seq_lens, const std::string& json, const std::string& backend) {
  const io::json::Value v = options_of(json, kAttentionKeys, "token_attention_paged");
  const AttentionOptions a = attention_options(Options(&v), py::none());
  const BackendOps* b = backend_of(backend);
  const Tensor<index_t> table = index_tensor(table_in, "block_table");
  return dispatch_on(b, q_in, "q", [&](auto tag) -> py::object {
    using T = decltype(tag);
    // the cache slots no sequence reads may hold anything, NaN included (oasis/ops/paged.hpp)
    const Tensor<T> q = tensor_on<T>(b, q_in, "q"), kc = tensor_on<T>(b, kc_in, "k_cache", true),
                    vc = tensor_on<T>(b, vc_in, "v_cache", true);
    AttentionResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::token_attention_paged(ops, q, kc, vc, table, seq_lens, a); },
          [&] { return oasis::token_attention_paged(q, kc, vc, table, seq_lens, a); });
    }
    return attention_dict(r);
  });
}

}  // namespace

void bind_backends(py::module_& m) {
  m.def("backends", &backends);
  m.def("backend_available", &is_backend_available, py::arg("name"));
  m.def("token_attention_backward", &token_attention_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("grad_out"), py::arg("grad_lse"), py::arg("grad_p_null"), py::arg("bias"), py::arg("options"),
        py::arg("backend"));
  m.def("attn_res", &attn_res, py::arg("sources"), py::arg("w"), py::arg("gain"), py::arg("psi"), py::arg("options"),
        py::arg("backend"));
  m.def("attn_res_backward", &attn_res_backward, py::arg("sources"), py::arg("w"), py::arg("grad_h"), py::arg("gain"),
        py::arg("psi"), py::arg("grad_alpha"), py::arg("grad_alpha_null"), py::arg("options"), py::arg("backend"));
  m.def("block_attn_res", &block_attn_res, py::arg("blocks"), py::arg("partial"), py::arg("w"), py::arg("gain"),
        py::arg("psi"), py::arg("options"), py::arg("backend"));
  m.def("block_attn_res_backward", &block_attn_res_backward, py::arg("blocks"), py::arg("w"), py::arg("grad_h"),
        py::arg("partial"), py::arg("gain"), py::arg("psi"), py::arg("grad_alpha"), py::arg("grad_alpha_null"),
        py::arg("options"), py::arg("backend"));
  m.def("token_attention_varlen", &token_attention_varlen, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("options"), py::arg("backend"));
  m.def("token_attention_varlen_backward", &token_attention_varlen_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("grad_out"), py::arg("grad_lse"),
        py::arg("grad_p_null"), py::arg("options"), py::arg("backend"));
  m.def("token_attention_paged", &token_attention_paged, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("block_table"), py::arg("seq_lens"), py::arg("options"), py::arg("backend"));
}

}  // namespace oasis::python
