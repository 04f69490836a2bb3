// src/python/compare.cpp — the compare engine for Python: check() and check_model() on tensors held
// in memory. Options and comparison options arrive as JSON objects (the Python keyword arguments,
// json.dumps'ed by oasis/__init__.py) and go to the engine unchanged, so an option the engine
// learns needs no change here. A report comes back as (passed, the CLI's table, the CLI's JSON):
// the same format_report and report_json that `oasis-verify compare` prints and writes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "model.hpp"
#include "oasis/io/json.hpp"
#include "oasis/verify/compare.hpp"

namespace oasis::python {
namespace {

io::json::Value json_of(const std::string& text) { return text.empty() ? io::json::Value{} : io::json::parse(text); }

py::tuple as_tuple(const verify::CompareReport& r) {
  return py::make_tuple(r.passed, verify::format_report(r), verify::report_json(r));
}

py::tuple check(const std::string& op, const py::dict& inputs, const py::dict& outputs, const std::string& options,
                const std::string& compare) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), out = to_tensor_map(outputs, "outputs");
  const io::json::Value o = json_of(options);
  const verify::CompareOptions opt = verify::compare_options(json_of(compare));
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check(op, in, out, o, opt);
  }
  return as_tuple(r);
}

py::tuple check_model_file(const std::string& path, const py::dict& inputs, const py::dict& trace, const std::string& options,
                           const std::string& compare) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), tr = to_tensor_map(trace, "trace");
  const io::json::Value o = json_of(options);
  const verify::CompareOptions opt = verify::compare_options(json_of(compare));
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check_model(path, in, tr, o, opt);
  }
  return as_tuple(r);
}

py::tuple check_model_held(const HeldModel& m, const py::dict& inputs, const py::dict& trace, const std::string& options,
                           const std::string& compare) {
  const io::TensorMap in = to_tensor_map(inputs, "inputs"), tr = to_tensor_map(trace, "trace");
  const io::json::Value o = json_of(options);
  const verify::CompareOptions opt = verify::compare_options(json_of(compare));
  verify::CompareReport r;
  {
    py::gil_scoped_release nogil;
    r = verify::check_model(m.config, m.weights, in, tr, o, opt);
  }
  return as_tuple(r);
}

}  // namespace

void bind_compare(py::module_& m) {
  m.def("check", &check, py::arg("op"), py::arg("inputs"), py::arg("outputs"), py::arg("options"), py::arg("compare"));
  m.def("check_model_file", &check_model_file, py::arg("path"), py::arg("inputs"), py::arg("trace"), py::arg("options"),
        py::arg("compare"));
  m.def("check_model_held", &check_model_held, py::arg("model"), py::arg("inputs"), py::arg("trace"), py::arg("options"),
        py::arg("compare"));
  m.def("op_names", &verify::op_names);
  m.def("describe_ops", &verify::describe_ops);
}

}  // namespace oasis::python
