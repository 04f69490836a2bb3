// src/python/bindings.hpp — the parts of the extension module oasis._core (module.cpp defines it).
#pragma once

#include <pybind11/pybind11.h>

namespace oasis::python {

void bind_core(pybind11::module_& m);     ///< core.cpp: the core functions on arrays
void bind_compare(pybind11::module_& m);  ///< compare.cpp: check, check_model
void bind_model(pybind11::module_& m);    ///< model.cpp: the Model class (forward, weights, config)
void bind_fuzz(pybind11::module_& m);     ///< fuzz.cpp: the fuzz driver on a Python kernel
void bind_backends(pybind11::module_& m); ///< backends.cpp: the backends and the kernel-interface functions

}  // namespace oasis::python
