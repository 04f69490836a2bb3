// src/python/compare.cpp — the compare engine for Python: check() and check_model() on tensors held
// in memory. Options and comparison options arrive as JSON objects (the Python keyword arguments,
// json.dumps'ed by oasis/__init__.py) and go to the engine unchanged, so an option the engine
// learns needs no change here. A report comes back as (passed, the CLI's table, the CLI's JSON,
// the report itself for report_html): the same format_report, report_json and report_html that
// `oasis-verify compare` prints and writes. A progress callable (or None) is called with a dict
// of CompareOptions::progress's fields; an exception it raises stops its calls and is raised
// again when the check returns.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "arrays.hpp"
#include "bindings.hpp"
#include "model.hpp"
#include "oasis/io/json.hpp"
#include "oasis/model/io.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/figures.hpp"

namespace oasis::python {
namespace {

io::json::Value json_of(const std::string& text) { return text.empty() ? io::json::Value{} : io::json::parse(text); }

py::tuple as_tuple(verify::CompareReport r) {
  const bool passed = r.passed;
  std::string text = verify::format_report(r), json = verify::report_json(r);
  return py::make_tuple(passed, text, json, std::move(r));
}

/// CompareOptions::progress calling a Python callable (None: no progress). The callable runs on the
/// engine's reporting thread, holding the GIL; its first exception is kept for rethrow().
class PyProgress {
 public:
  explicit PyProgress(py::object fn) : st_(std::make_shared<State>()) { st_->fn = std::move(fn); }
  void attach(verify::CompareOptions& opt) const {
    if (st_->fn.is_none()) return;
    opt.progress = [st = st_](const verify::Progress& p) {
      py::gil_scoped_acquire gil;
      if (!st->error.is_none()) return;
      py::dict d;
      d["op"] = p.op;
      d["tensors_done"] = p.tensors_done;
      d["tensors_total"] = p.tensors_total;
      d["elements_done"] = p.elements_done;
      d["elements_total"] = p.elements_total;
      d["elements_mp50"] = p.elements_mp50;
      d["level"] = p.level;
      d["seconds"] = p.seconds;
      d["finished"] = p.finished;
      try {
        st->fn(d);
      } catch (py::error_already_set& e) {
        st->type = e.type();
        st->error = e.value();
      }
    };
  }
  /// Raises the callable's exception, if it raised one.
  void rethrow() const {
    if (st_->error.is_none()) return;
    PyErr_SetObject(st_->type.ptr(), st_->error.ptr());
    throw py::error_already_set();
  }

 private:
  struct State {
    py::object fn, type = py::none(), error = py::none();
  };
  std::shared_ptr<State> st_;
};

py::tuple check(const std::string& op, const py::dict& inputs, const py::dict& outputs, const std::string& options,
                const std::string& compare, const py::object& progress) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), out = to_tensor_map(outputs, "outputs");
  const io::json::Value o = json_of(options);
  verify::CompareOptions opt = verify::compare_options(json_of(compare));
  const PyProgress pp(progress);
  pp.attach(opt);
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check(op, in, out, o, opt);
  }
  pp.rethrow();
  return as_tuple(std::move(r));
}

py::tuple check_model_file(const std::string& path, const py::dict& inputs, const py::dict& trace, const std::string& options,
                           const std::string& compare, const py::object& progress) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), tr = to_tensor_map(trace, "trace");
  const io::json::Value o = json_of(options);
  verify::CompareOptions opt = verify::compare_options(json_of(compare));
  const PyProgress pp(progress);
  pp.attach(opt);
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check_model(path, in, tr, o, opt);
  }
  pp.rethrow();
  return as_tuple(std::move(r));
}

py::tuple check_model_held(const HeldModel& m, const py::dict& inputs, const py::dict& trace, const std::string& options,
                           const std::string& compare, const py::object& progress) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), tr = to_tensor_map(trace, "trace");
  const io::json::Value o = json_of(options);
  verify::CompareOptions opt = verify::compare_options(json_of(compare));
  const PyProgress pp(progress);
  pp.attach(opt);
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check_model(m.config, m.weights, in, tr, o, opt);
  }
  pp.rethrow();
  return as_tuple(std::move(r));
}

/// The figures of a trace written into `out` (CSV and manifest; the PNGs are drawn in Python):
/// (the figures' names, what was left out).
py::tuple figures_of(const model::ModelConfig& cfg, const py::dict& trace, const std::string& out) {
  const io::TensorMap tr = to_tensor_map(trace, "trace");
  verify::FigureSet set;
  {
    py::gil_scoped_release nogil;
    set = verify::model_figures(cfg, tr);
    verify::write_figure_tables(set, out);
  }
  std::vector<std::string> names;
  for (const auto& f : set.figures) names.push_back(f.name);
  return py::make_tuple(names, set.left_out);
}

}  // namespace

void bind_compare(py::module_& m) {
  py::class_<verify::CompareReport>(m, "CompareReport").def("html", &verify::report_html);
  m.def("check", &check, py::arg("op"), py::arg("inputs"), py::arg("outputs"), py::arg("options"), py::arg("compare"),
        py::arg("progress") = py::none());
  m.def("check_model_file", &check_model_file, py::arg("path"), py::arg("inputs"), py::arg("trace"), py::arg("options"),
        py::arg("compare"), py::arg("progress") = py::none());
  m.def("check_model_held", &check_model_held, py::arg("model"), py::arg("inputs"), py::arg("trace"), py::arg("options"),
        py::arg("compare"), py::arg("progress") = py::none());
  m.def("model_figures_file", [](const std::string& path, const py::dict& trace, const std::string& out) {
    return figures_of(model::load_model<double>(path).config(), trace, out);
  });
  m.def("model_figures_held", [](const HeldModel& held, const py::dict& trace, const std::string& out) {
    return figures_of(held.config, trace, out);
  });
  m.def("op_names", &verify::op_names);
  m.def("describe_ops", &verify::describe_ops);
}

}  // namespace oasis::python
