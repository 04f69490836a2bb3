// src/python/model.cpp — oasis._core.Model: an AttnRes model (oasis/model) given by its
// configuration and weights, from a file of save_model or from memory (a Python dict of
// configuration fields and a dict of weights by parameter name, e.g. a torch state_dict).
//
// The configuration fields are the metadata fields of a weights file (docs/model.md,
// config_metadata: "d_model", "variant", "router", ...; the "oasis." prefix is optional) and go
// through config_from_metadata, the one parser of a configuration; absent fields take the
// defaults of ModelConfig, and a key that is not a field is an error naming it. forward() runs the library's compiled Model<float> or Model<double> and
// returns its logits, readout state and the tensors of every SublayerTrace by member name.
#include <cstdio>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "model.hpp"
#include "oasis/model/io.hpp"

namespace oasis::python {
namespace {

namespace om = oasis::model;

const std::string kPrefix = "oasis.";

/// Every metadata key a configuration can have (config_metadata of a configuration with every
/// optional field set).
const std::map<std::string, std::string>& all_fields() {
  static const std::map<std::string, std::string> m = [] {
    om::ModelConfig c;
    c.token_normalizer = RowNorm::softmax1;
    c.beta = 0.0;
    return om::config_metadata(c);
  }();
  return m;
}

std::string field_text(const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "1" : "0";
  if (py::isinstance<py::int_>(v)) return py::str(v);
  if (py::isinstance<py::float_>(v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v.cast<double>());
    return buf;
  }
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw invalid_argument(key, "must be a string, number or bool, got " +
                                  std::string(py::str(py::type::handle_of(v).attr("__name__"))));
}

/// The configuration of a dict of fields. A field that is absent takes ModelConfig's default, the
/// readout and the coupling conventions by router and variant as ModelConfig does (they are filled
/// from config_metadata of a default configuration with the given router and variant).
om::ModelConfig config_from_dict(const py::dict& d) {
  std::map<std::string, std::string> given;
  for (const auto& kv : d) {
    OASIS_REQUIRE(py::isinstance<py::str>(kv.first), "config", "keys must be strings");
    std::string key = kv.first.cast<std::string>();
    if (key.rfind(kPrefix, 0) != 0) key = kPrefix + key;
    if (!all_fields().count(key)) {
      std::string known;
      for (const auto& f : all_fields()) known += (known.empty() ? "" : ", ") + f.first.substr(kPrefix.size());
      throw invalid_argument(key.substr(kPrefix.size()), "not a configuration field (fields: " + known + ")");
    }
    given[key] = field_text(key.substr(kPrefix.size()), kv.second);
  }
  om::ModelConfig base;
  if (given.count(kPrefix + "router")) base.router = om::parse_router_family(given[kPrefix + "router"]);
  if (given.count(kPrefix + "variant")) base.variant = parse_variant(given[kPrefix + "variant"]);
  std::map<std::string, std::string> md = om::config_metadata(base);
  for (const auto& kv : given) md[kv.first] = kv.second;
  return om::config_from_metadata(md);
}

py::dict config_dict(const om::ModelConfig& c) {
  py::dict d;
  for (const auto& [k, v] : om::config_metadata(c)) d[py::str(k.substr(kPrefix.size()))] = v;
  return d;
}

template <class T>
std::shared_ptr<const om::Model<T>> build(const HeldModel& m) {
  return std::make_shared<const om::Model<T>>(om::model_from_tensors<T>(m.config, m.weights, "weights"));
}

HeldModel make(om::ModelConfig cfg, io::TensorMap weights) {
  HeldModel m{std::move(cfg), std::move(weights), nullptr, nullptr};
  m.f64 = build<double>(m);  // checks every weight (names, shapes, finite values) now
  return m;
}

HeldModel from_memory(const py::dict& config, const py::dict& weights) {
  return make(config_from_dict(config), to_tensor_map(weights, "weights"));
}

/// The library's seeded initialisation (Model<double>::initialized), weights stored as f64.
HeldModel initialized(const py::dict& config, std::uint64_t seed) {
  const om::ModelConfig cfg = config_from_dict(config);
  const om::Model<double> m = om::Model<double>::initialized(cfg, seed);
  io::TensorMap w;
  for (const auto& [name, t] : m.parameters()) w[name] = io::StoredTensor{io::DType::f64, t};
  return make(cfg, std::move(w));
}

HeldModel from_file(const std::string& path) {
  return make(om::config_from_metadata(io::read_safetensors_metadata(path)), io::read_safetensors(path));
}

/// Members of SublayerTrace<T> by name (the names of the trace's fields, docs/model.md).
template <class T>
const std::vector<std::pair<const char*, Tensor<T> om::SublayerTrace<T>::*>>& trace_members() {
  using S = om::SublayerTrace<T>;
  static const std::vector<std::pair<const char*, Tensor<T> S::*>> m = {
      {"input", &S::input},       {"output", &S::output},         {"routed", &S::routed},
      {"sources", &S::sources},   {"g_old", &S::g_old},           {"g", &S::g},
      {"psi", &S::psi},           {"dpsi", &S::dpsi},             {"alpha", &S::alpha},
      {"alpha_null", &S::alpha_null}, {"p_null", &S::p_null},     {"lse", &S::lse},
      {"branch_psi", &S::branch_psi}, {"attn_q", &S::attn_q},     {"attn_k", &S::attn_k},
      {"attn_v", &S::attn_v},     {"attn_heads", &S::attn_heads}, {"mlp_hidden", &S::mlp_hidden},
      {"attn_probs", &S::attn_probs}, {"attn_gates", &S::attn_gates}, {"p_sink", &S::p_sink}};
  return m;
}

template <class T>
py::tuple run_forward(const om::Model<T>& model, const std::vector<index_t>& ids, index_t B, index_t Tn, bool trace) {
  om::ForwardOptions fo;
  fo.trace = trace;
  om::ForwardResult<T> r;
  {
    py::gil_scoped_release nogil;
    r = model.forward(ids, B, Tn, fo);
  }
  py::list sublayers;
  for (const auto& tr : r.trace) {
    py::dict fields;
    for (const auto& [name, member] : trace_members<T>())
      if ((tr.*member).size() > 0) fields[name] = to_numpy(tr.*member);
    sublayers.append(py::make_tuple(tr.name, fields));
  }
  return py::make_tuple(to_numpy(r.logits), to_numpy(r.state), sublayers);
}

/// ids: a C-contiguous int64 array [B, T] (the Python layer converts integer arrays to it).
py::tuple forward(HeldModel& m, py::handle ids_in, const std::string& dtype, bool trace) {
  OASIS_REQUIRE(py::isinstance<py::array_t<std::int64_t>>(ids_in), "ids", "expected an int64 array [B, T]");
  const auto a = py::reinterpret_borrow<py::array_t<std::int64_t>>(ids_in);
  OASIS_REQUIRE(a.ndim() == 2, "ids", "expected shape [B, T], got rank ", a.ndim());
  OASIS_REQUIRE(a.flags() & py::array::c_style, "ids", "is not C-contiguous; pass np.ascontiguousarray(ids)");
  const index_t B = a.shape(0), Tn = a.shape(1);
  std::vector<index_t> ids(a.data(), a.data() + a.size());
  if (dtype == "float32") {
    if (!m.f32) m.f32 = build<float>(m);
    return run_forward(*m.f32, ids, B, Tn, trace);
  }
  OASIS_REQUIRE(dtype == "float64", "dtype", "must be float32 or float64, got '", dtype, "'");
  return run_forward(*m.f64, ids, B, Tn, trace);
}

py::dict weights(const HeldModel& m) {
  py::dict d;
  for (const auto& [name, t] : m.weights) {
    if (t.dtype == io::DType::f32) d[py::str(name)] = to_numpy(t.values.cast<float>());
    else d[py::str(name)] = to_numpy(t.values);
  }
  return d;
}

void save(const HeldModel& m, const std::string& path, const std::string& dtype) {
  io::TensorMap out = m.weights;
  if (!dtype.empty())
    for (auto& kv : out) kv.second.dtype = io::parse_dtype(dtype);  // rounded (RNE) on writing
  io::write_safetensors(path, out, om::config_metadata(m.config));
}

py::list parameter_specs(const HeldModel& m) {
  py::list l;
  for (const auto& p : om::parameter_specs(m.config)) l.append(py::make_tuple(p.name, py::tuple(py::cast(p.shape))));
  return l;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<HeldModel>(m, "HeldModel")
      .def("forward", &forward, py::arg("ids"), py::arg("dtype"), py::arg("trace"))
      .def("config", [](const HeldModel& h) { return config_dict(h.config); })
      .def("weights", &weights)
      .def("save", &save, py::arg("path"), py::arg("dtype"))
      .def("parameter_specs", &parameter_specs);
  m.def("model_from_memory", &from_memory, py::arg("config"), py::arg("weights"));
  m.def("model_from_file", &from_file, py::arg("path"));
  m.def("model_initialized", &initialized, py::arg("config"), py::arg("seed"));
  m.def("config_fields", [] {
    py::list l;
    for (const auto& f : all_fields()) l.append(f.first.substr(kPrefix.size()));
    return l;
  });
}

}  // namespace oasis::python
