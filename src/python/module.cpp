// src/python/module.cpp — the extension module oasis._core (the compiled half of the Python
// package oasis; src/python/oasis/ is the other half, and the only public interface).
//
// Exceptions: oasis::invalid_argument (bad input, naming the argument; io::format_error for a
// malformed file derives from it) becomes oasis.InvalidArgument, a ValueError whose `argument`
// attribute is the argument's name. Any other C++ exception goes through pybind11's standard
// translation (std::bad_alloc -> MemoryError, std::exception -> RuntimeError, ...): no C++
// exception reaches the interpreter untranslated.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "oasis/core/error.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "oasis._core: the compiled part of the oasis package (use `import oasis`)";
  static py::exception<oasis::invalid_argument> invalid(m, "InvalidArgument", PyExc_ValueError);
  invalid.attr("__module__") = "oasis";  // raised and documented as oasis.InvalidArgument
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const oasis::invalid_argument& e) {
      py::object err = py::handle(invalid.ptr())(e.what());  // an instance, to carry .argument
      err.attr("argument") = e.argument();
      PyErr_SetObject(invalid.ptr(), err.ptr());
    }
  });
  oasis::python::bind_model(m);
  oasis::python::bind_compare(m);
  oasis::python::bind_core(m);
  oasis::python::bind_backends(m);
  oasis::python::bind_fuzz(m);
}
