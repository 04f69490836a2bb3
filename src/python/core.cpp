// src/python/core.cpp — the core functions of the oracle on NumPy arrays (oasis._core), in float32
// or float64: each call converts its arrays exactly (arrays.hpp), runs the library's compiled
// instance of the function for that scalar (oasis/core/instances.hpp) and copies the result back, so a
// Python caller gets the C++ library's bits. Options arrive as a JSON object built by the Python
// layer (oasis/__init__.py) and are read with the compare engine's typed accessors, which name the
// key on a type error; the depth options are parsed by the engine's own parse_depth_options, so
// they are spelled exactly as the options of `check("depth", ...)`. token_attention and
// attn_res_route take a backend (core_support.hpp): "reference", the default, is the above; another
// backend computes in float32 through its table (oasis/backends/backend.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core_support.hpp"
#include "bindings.hpp"
#include "oasis/oasis.hpp"

namespace oasis::python {

using verify::detail::Options;

io::json::Value options_of(const std::string& json, const std::vector<std::string>& known, const char* fn) {
  io::json::Value v = json.empty() ? io::json::Value{} : io::json::parse(json);
  OASIS_REQUIRE(v.kind == io::json::Value::Kind::null || v.is_object(), "options", fn, ": options must be an object");
  for (const auto& m : v.members)
    OASIS_REQUIRE(std::find(known.begin(), known.end(), m.first) != known.end(), m.first, "unknown option of ", fn,
                  " (known: ", verify::detail::join_names(known), ")");
  return v;
}

MaskedRow parse_masked_row(const std::string& s) {
  if (s == "zero") return MaskedRow::zero;
  if (s == "error") return MaskedRow::error;
  throw invalid_argument("masked_row", "must be zero or error, got '" + s + "'");
}

const std::vector<std::string> kAttentionKeys = {"normalizer", "null_logits", "causal",     "key_lengths",
                                                 "scale",      "window",      "layout",     "return_probs",
                                                 "masked_row", "gamma",       "zeta"};

AttentionOptions attention_options(const Options& o, py::handle bias_in) {
  AttentionOptions a;
  a.normalizer = parse_row_norm(o.string("normalizer", "softmax1"));
  a.null_logits = o.numbers("null_logits");
  a.causal = o.boolean("causal", false);
  a.key_lengths = o.integers("key_lengths");
  if (o.has("scale")) a.scale = o.number("scale", 1.0);
  if (o.has("window")) {
    const double wd = o.number("window", 0);
    OASIS_REQUIRE(wd >= 0 && wd == std::floor(wd) && wd < 9.0e15, "window", "must be a non-negative integer (0: none)");
    a.window = static_cast<index_t>(wd);
  }
  a.layout = parse_attention_layout(o.string("layout", "bhtd"));
  a.return_probs = o.boolean("return_probs", false);
  a.masked_row = parse_masked_row(o.string("masked_row", "zero"));
  a.norm_params.gamma = o.number("gamma", a.norm_params.gamma);
  a.norm_params.zeta = o.number("zeta", a.norm_params.zeta);
  if (!bias_in.is_none()) a.bias = to_double_tensor(bias_in, "bias");
  return a;
}

namespace {

// ---- normalisers (docs/spec.md §1) -------------------------------------------------------------------------

py::object normalize(py::handle z_in, py::handle s_in, const std::string& normalizer, const std::string& masked_row) {
  const RowNorm kind = parse_row_norm(normalizer);
  const MaskedRow mr = parse_masked_row(masked_row);
  return dispatch(z_in, "z", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> z = to_tensor<T>(z_in, "z");
    OASIS_REQUIRE(z.rank() >= 1, "z", "must have rank >= 1 (rows of logits), got a scalar");
    const Shape lead(z.shape().begin(), z.shape().end() - 1);
    const Tensor<T> s = to_tensor<T>(s_in, "s");
    OASIS_REQUIRE(s.shape() == lead, "s", "shape ", shape_str(s.shape()), " is not the rows' shape ", shape_str(lead));
    const index_t m = z.dim(z.rank() - 1), R = s.size();
    Tensor<T> p(z.shape()), p_null(lead), lse(lead);
    {
      py::gil_scoped_release nogil;
      for (index_t r = 0; r < R; ++r) {
        const RowStats<T> st = normalize_row(kind, z.data() + r * m, m, s[r], p.data() + r * m, mr, "z");
        p_null[r] = st.p_null;
        lse[r] = st.lse;
      }
    }
    py::dict out;
    out["p"] = to_numpy(p);
    out["p_null"] = to_numpy(p_null);
    out["lse"] = to_numpy(lse);
    return std::move(out);
  });
}

// ---- token attention (docs/spec.md §2, §8) --------------------------------------------------------------------

py::object token_attention(py::handle q_in, py::handle k_in, py::handle v_in, py::object bias_in, const std::string& json,
                           const std::string& backend) {
  const io::json::Value v = options_of(json, kAttentionKeys, "token_attention");
  const AttentionOptions a = attention_options(Options(&v), bias_in);
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, q_in, "q", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> q = tensor_on<T>(b, q_in, "q"), k = tensor_on<T>(b, k_in, "k"), vv = tensor_on<T>(b, v_in, "v");
    AttentionResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::token_attention(ops, q, k, vv, a); },
          [&] { return oasis::token_attention(q, k, vv, a); });
    }
    py::dict out;
    out["out"] = to_numpy(r.out);
    out["lse"] = to_numpy(r.lse);
    out["p_null"] = to_numpy(r.p_null);
    if (a.return_probs) out["probs"] = to_numpy(r.probs);
    return std::move(out);
  });
}

// ---- psi and coupling (docs/spec.md §3) --------------------------------------------------------------------------

py::object null_statistic(py::handle p_null_in) {
  return dispatch(p_null_in, "p_null", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> pn = to_tensor<T>(p_null_in, "p_null");
    return to_numpy(oasis::null_statistic(pn));
  });
}

py::object null_statistic_from_mass(py::handle probs_in) {
  return dispatch(probs_in, "probs", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> pr = to_tensor<T>(probs_in, "probs");
    return to_numpy(oasis::null_statistic_from_mass(pr));
  });
}

const std::vector<std::string> kCouplingKeys = {"profile", "centring", "headless", "beta_max", "score_clamp"};

/// g = clamp(g_old - beta Dpsi) per candidate vector: g_old, dpsi [n] or [n, N] (one column per token).
py::object couple_depth_logits(py::handle g_in, py::handle d_in, double beta, const std::string& json) {
  const io::json::Value v = options_of(json, kCouplingKeys, "couple_depth_logits");
  const Options o(&v);
  const CouplingOptions co = verify::detail::parse_depth_options(o, true).coupling_options;
  return dispatch(g_in, "g_old", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> g_old = to_tensor<T>(g_in, "g_old"), dpsi = to_tensor<T>(d_in, "dpsi");
    OASIS_REQUIRE(g_old.rank() == 1 || g_old.rank() == 2, "g_old", "expected [n] or [n, N], got ", shape_str(g_old.shape()));
    OASIS_REQUIRE(dpsi.shape() == g_old.shape(), "dpsi", "shape ", shape_str(dpsi.shape()), " differs from g_old's ",
                  shape_str(g_old.shape()));
    const index_t n = g_old.dim(0), N = g_old.rank() == 2 ? g_old.dim(1) : 1;
    Tensor<T> g(g_old.shape());
    Vec<T> gc(n), dc(n);
    for (index_t t = 0; t < N; ++t) {
      for (index_t i = 0; i < n; ++i) { gc[i] = g_old[i * N + t]; dc[i] = dpsi[i * N + t]; }
      const Vec<T> r = oasis::couple_depth_logits(gc, dc, T(beta), co);
      for (index_t i = 0; i < n; ++i) g[i * N + t] = r[i];
    }
    return to_numpy(g);
  });
}

// ---- depth routing (docs/spec.md §3-4) --------------------------------------------------------------------------

py::object attn_res_route(py::handle s_in, py::handle g_in, py::object psi_in, const std::string& json,
                          const std::string& backend) {
  const io::json::Value v = options_of(json, verify::detail::kDepthOptionKeys, "attn_res_route");
  const Options o(&v);
  const DepthOptions d = verify::detail::parse_depth_options(o, true);
  const BackendOps* b = backend_of(backend);
  return dispatch_on(b, s_in, "sources", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> sources = tensor_on<T>(b, s_in, "sources"), g_old = tensor_on<T>(b, g_in, "g_old");
    require_rank(g_old, 2, "g_old", "[n, N]");
    Tensor<T> psi(g_old.shape());
    if (!psi_in.is_none()) psi = tensor_on<T>(b, psi_in, "psi");
    else OASIS_REQUIRE(!d.coupling, "psi", "attn_res_route with coupling needs psi [n, N] (or coupling=False)");
    const std::vector<SourceKind> kinds = verify::detail::parse_kinds(o, g_old.dim(0));
    DepthRoute<T> r;
    {
      py::gil_scoped_release nogil;
      r = on_backend<T>(
          b, [&](const auto& ops) { return oasis::attn_res_route(ops, sources, g_old, psi, kinds, d); },
          [&] { return oasis::attn_res_route(sources, g_old, psi, kinds, d); });
    }
    py::dict out;
    out["h"] = to_numpy(r.h);
    out["alpha"] = to_numpy(r.alpha);
    out["alpha_null"] = to_numpy(r.alpha_null);
    out["g"] = to_numpy(r.g);
    out["dpsi"] = to_numpy(r.dpsi);
    return std::move(out);
  });
}

py::object pseudo_query_logits(py::handle s_in, py::handle w_in, py::object gain_in, const std::string& json) {
  const io::json::Value v = options_of(json, {"eps", "compute_in_float32"}, "pseudo_query_logits");
  const Options o(&v);
  KeyNormOptions k;
  k.eps = o.number("eps", k.eps);
  k.compute_in_float32 = o.boolean("compute_in_float32", false);
  return dispatch(s_in, "sources", [&](auto tag) -> py::object {
    using T = decltype(tag);
    const Tensor<T> sources = to_tensor<T>(s_in, "sources"), w = to_tensor<T>(w_in, "w");
    const Tensor<T> gain = gain_in.is_none() ? Tensor<T>() : to_tensor<T>(gain_in, "gain");
    return to_numpy(oasis::pseudo_query_logits(sources, w, gain, k));
  });
}

}  // namespace

void bind_core(py::module_& m) {
  m.def("normalize", &normalize, py::arg("z"), py::arg("s"), py::arg("normalizer"), py::arg("masked_row"));
  m.def("token_attention", &token_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("bias"), py::arg("options"),
        py::arg("backend") = "reference");
  m.def("null_statistic", &null_statistic, py::arg("p_null"));
  m.def("null_statistic_from_mass", &null_statistic_from_mass, py::arg("probs"));
  m.def("couple_depth_logits", &couple_depth_logits, py::arg("g_old"), py::arg("dpsi"), py::arg("beta"), py::arg("options"));
  m.def("attn_res_route", &attn_res_route, py::arg("sources"), py::arg("g_old"), py::arg("psi"), py::arg("options"),
        py::arg("backend") = "reference");
  m.def("pseudo_query_logits", &pseudo_query_logits, py::arg("sources"), py::arg("w"), py::arg("gain"), py::arg("options"));
}

}  // namespace oasis::python
