// src/python/arrays.hpp — NumPy arrays <-> oasis tensors, exactly (no rounding either way).
//
// An array handed to the library must be a C-contiguous (row-major, as Tensor) NumPy array of a
// native-endian float dtype; anything else is an oasis::invalid_argument naming the argument
// (oasis._core turns it into oasis.InvalidArgument). The Python layer (oasis/_arrays.py) first
// turns torch tensors into arrays and bf16 into uint16 bits with the dtype tag "bf16".
#pragma once

#include <string>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "oasis/io/dtype.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::python {

namespace py = pybind11;

/// The scalar a float32 or float64 array computes in.
enum class Scalar { f32, f64 };

/// float32 -> f32, float64 -> f64; any other object or dtype throws naming `name`.
Scalar scalar_of(py::handle a, const std::string& name);

/// The array as a Tensor<T> (T float or double); its dtype must be exactly T's, C-contiguous.
/// NaN is rejected (naming the argument and the first flat index) unless allow_nan.
template <class T>
Tensor<T> to_tensor(py::handle a, const std::string& name, bool allow_nan = false);

/// A float32 or float64 array widened exactly to double (NaN rejected; +-inf kept).
Tensor<double> to_double_tensor(py::handle a, const std::string& name);

/// A stored tensor of the compare engine: `dtype` "f64", "f32", "f16" (float64, float32, float16
/// arrays) or "bf16" (the raw bits as a uint16 array); values widened exactly to double, NaN kept.
io::StoredTensor to_stored(py::handle a, const std::string& dtype, const std::string& name);

/// {name: (dtype tag, array)} -> TensorMap; `what` names the dict in errors ("inputs", "outputs").
io::TensorMap to_tensor_map(const py::dict& d, const std::string& what);

/// A new NumPy array holding a copy of the tensor (dtype of T).
template <class T>
py::array_t<T> to_numpy(const Tensor<T>& t);

}  // namespace oasis::python
