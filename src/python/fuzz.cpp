// src/python/fuzz.cpp — the fuzz driver (oasis/verify/fuzz.hpp) for Python: oasis.fuzz drives a
// Python callable through the regimes. The callable is the package's adapter (oasis/_fuzz.py),
// which converts the case's tensors for the user's function, runs it under its timer and returns
// {name: (dtype tag, array)}; this file turns it into a fuzz::Kernel.
//
// Why the driver gets timeout 0: with a timeout it runs the kernel on a thread of its own and
// leaves it running when it overruns, but a Python function can only be stopped by an exception
// raised inside it, which a signal handler does in the main thread only. So the driver calls the
// kernel on this (the main) thread, and the adapter's SIGALRM timer raises oasis.FuzzTimeout in it.
//
// Exceptions of the callable: FuzzTimeout -> fuzz::kernel_timeout (a hang); an Exception -> a
// std::runtime_error "Type: message (file:line in function)" (a crash); anything else (a
// BaseException such as KeyboardInterrupt or SystemExit, or an adapter error marked
// _oasis_fuzz_abort: a usage error) stops fuzzing (fuzz::kernel_abort) and is raised again when
// fuzz() returns.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "arrays.hpp"
#include "bindings.hpp"
#include "oasis/core/error.hpp"
#include "oasis/io/json.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/fuzz.hpp"

namespace oasis::python {
namespace {

namespace fz = verify::fuzz;

py::object json_to_py(const io::json::Value& v) {
  using K = io::json::Value::Kind;
  switch (v.kind) {
    case K::null: return py::none();
    case K::boolean: return py::bool_(v.b);
    case K::number:
      // an integer literal stays an int (window 64, key_lengths [0, 33]); others are floats
      if (v.text.find_first_of(".eE") == std::string::npos)
        return py::reinterpret_steal<py::object>(PyLong_FromString(v.text.c_str(), nullptr, 10));
      return py::float_(v.as_double());
    case K::string: return py::str(v.text);
    case K::array: {
      py::list l;
      for (const auto& x : v.items) l.append(json_to_py(x));
      return std::move(l);
    }
    case K::object: {
      py::dict d;
      for (const auto& [k, x] : v.members) d[py::str(k)] = json_to_py(x);
      return std::move(d);
    }
  }
  return py::none();
}

/// (dtype tag, array) of a case's tensor: float64/float32/float16 arrays, bf16 as its uint16 bits.
/// Every value is exact in its dtype (the generators rounded them), so the narrowing is exact.
py::tuple stored_to_py(const io::StoredTensor& t) {
  std::vector<py::ssize_t> shape(t.values.shape().begin(), t.values.shape().end());
  const index_t n = t.values.size();
  const double* x = t.values.data();
  auto fill = [&](py::array a, auto convert) {
    using Out = decltype(convert(0.0));
    Out* p = static_cast<Out*>(a.mutable_data());
    for (index_t i = 0; i < n; ++i) p[i] = convert(x[i]);
    return a;
  };
  py::array a;
  switch (t.dtype) {
    case io::DType::f64: a = fill(py::array_t<double>(shape), [](double v) { return v; }); break;
    case io::DType::f32: a = fill(py::array_t<float>(shape), [](double v) { return static_cast<float>(v); }); break;
    case io::DType::f16:
      a = fill(py::array(py::dtype("float16"), shape), [](double v) { return io::double_to_half_bits(v); });
      break;
    case io::DType::bf16:
      a = fill(py::array_t<std::uint16_t>(shape), [](double v) { return io::double_to_bf16_bits(v); });
      break;
    case io::DType::i32:
      a = fill(py::array_t<std::int32_t>(shape), [](double v) { return static_cast<std::int32_t>(v); });
      break;
    case io::DType::i64:
      a = fill(py::array_t<std::int64_t>(shape), [](double v) { return static_cast<std::int64_t>(v); });
      break;
  }
  return py::make_tuple(std::string(io::to_string(t.dtype)), a);
}

/// "ZeroDivisionError: division by zero (kernel.py:12 in attend)": the type, the message and the
/// innermost frame of the traceback, where the kernel raised.
std::string describe(const py::error_already_set& e) {
  std::string s = py::str(e.type().attr("__name__"));
  const std::string msg = py::str(e.value());
  if (!msg.empty()) s += ": " + msg;
  py::object tb = e.trace();
  if (!tb.is_none()) {
    while (!tb.attr("tb_next").is_none()) tb = tb.attr("tb_next");
    const py::object code = tb.attr("tb_frame").attr("f_code");
    s += " (" + std::string(py::str(code.attr("co_filename"))) + ":" + std::string(py::str(tb.attr("tb_lineno"))) +
         " in " + std::string(py::str(code.attr("co_name"))) + ")";
  }
  return s;
}

/// What the kernel and the log share with fuzz_py (touched with the GIL held only).
struct State {
  py::object call, log, timeout_type;
  py::object err_type, err_value, err_trace;  ///< the exception that stopped fuzzing
  bool aborted = false;

  /// Keep the exception being handled, to raise it again after fuzz().
  void abort(py::error_already_set& e) {
    if (!aborted) err_type = e.type(), err_value = e.value(), err_trace = e.trace();
    aborted = true;
  }
};

bool is_abort(py::error_already_set& e) {
  return !e.matches(PyExc_Exception) || py::hasattr(e.value(), "_oasis_fuzz_abort");
}

io::TensorMap call_kernel(State& st, const io::TensorMap& in, const io::json::Value& options) {
  py::gil_scoped_acquire gil;
  if (st.aborted) throw fz::kernel_abort("fuzzing stopped (" + std::string(py::str(st.err_type.attr("__name__"))) + ")");
  py::dict ins;
  for (const auto& [name, t] : in) ins[py::str(name)] = stored_to_py(t);
  try {
    const py::object res = st.call(ins, json_to_py(options));
    return to_tensor_map(res.cast<py::dict>(), "outputs");
  } catch (py::error_already_set& e) {
    if (e.matches(st.timeout_type)) throw fz::kernel_timeout(py::str(e.value()));
    if (is_abort(e)) {
      st.abort(e);
      throw fz::kernel_abort("fuzzing stopped (" + std::string(py::str(e.type().attr("__name__"))) + ")");
    }
    throw std::runtime_error(describe(e));
  }
}

/// fuzz(): (passed, text, json, the failure's compare report as (passed, text, json, report) or None).
py::tuple fuzz_py(const std::string& op, py::object call, py::object timeout_type, const std::vector<std::string>& dtypes,
                  const std::map<std::string, std::string>& fixed, const std::vector<std::string>& without,
                  const std::vector<std::string>& only, std::uint64_t seed, const std::string& replay_dir,
                  int max_shrink, const std::string& compare, py::object log) {
  fz::FuzzOptions opt;
  opt.dtypes.clear();
  for (const auto& d : dtypes) opt.dtypes.push_back(io::parse_dtype(d));
  opt.fixed = fixed;
  opt.without.insert(without.begin(), without.end());
  opt.only = only;
  opt.seed = seed;
  opt.timeout_s = 0;  // the adapter's timer (see the top of this file)
  opt.shrink_hangs = false;  // a hanging candidate costs a whole timeout: a hang is reported where found
  opt.max_shrink_runs = max_shrink;
  opt.replay_dir = replay_dir;
  opt.compare = verify::compare_options(compare.empty() ? io::json::Value{} : io::json::parse(compare));
  auto st = std::make_shared<State>();
  st->call = std::move(call), st->log = std::move(log), st->timeout_type = std::move(timeout_type);
  if (!st->log.is_none())
    opt.log = [st](const std::string& line) {
      py::gil_scoped_acquire gil;
      if (st->aborted) return;
      try {
        st->log(line);
      } catch (py::error_already_set& e) {
        st->abort(e);  // an exception of log stops fuzzing too, and is raised again
      }
    };
  const fz::Kernel kernel = [st](const io::TensorMap& in, const io::json::Value& o) { return call_kernel(*st, in, o); };
  auto reraise = [&] {
    PyErr_Restore(st->err_type.release().ptr(), st->err_value.release().ptr(), st->err_trace.release().ptr());
    throw py::error_already_set();
  };
  fz::FuzzReport r;
  try {
    py::gil_scoped_release nogil;
    r = fz::fuzz(op, kernel, opt);
  } catch (...) {
    if (st->aborted) reraise();
    throw;
  }
  if (st->aborted) reraise();
  std::string text = fz::format_fuzz_report(r), json = fz::fuzz_report_json(r);  // before the report moves out
  py::object failure = py::none();
  if (r.has_failure && r.failure.kind == "wrong") {
    verify::CompareReport& c = r.failure.report;
    const bool passed = c.passed;
    std::string ctext = verify::format_report(c), cjson = verify::report_json(c);
    failure = py::make_tuple(passed, ctext, cjson, std::move(c));
  }
  return py::make_tuple(r.passed, text, json, failure);
}

/// The ops' input and output tensor names (the engine's specs): what the autograd adapter pairs.
py::tuple op_tensors(const std::string& op) {
  return py::make_tuple(verify::op_input_names(op), verify::op_output_names(op));
}

}  // namespace

void bind_fuzz(py::module_& m) {
  m.def("fuzz", &fuzz_py, py::arg("op"), py::arg("call"), py::arg("timeout_type"), py::arg("dtypes"), py::arg("fixed"),
        py::arg("without"), py::arg("only"), py::arg("seed"), py::arg("replay_dir"), py::arg("max_shrink"),
        py::arg("compare"), py::arg("log"));
  m.def("fuzz_features", &fz::feature_names);
  m.def("fuzz_regimes", [](const std::string& op) {
    py::list out;
    for (const auto& r : fz::regimes(op)) {
      py::dict d;
      d["name"] = r.name, d["ops"] = r.ops, d["description"] = r.description, d["targets"] = r.targets;
      d["needs"] = r.needs, d["variants"] = r.variants;
      out.append(d);
    }
    return out;
  });
  m.def("op_tensors", &op_tensors);
  m.def("fuzz_seed", [] { return fz::FuzzOptions{}.seed; });
}

}  // namespace oasis::python
