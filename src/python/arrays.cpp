// src/python/arrays.cpp — NumPy arrays <-> oasis tensors (arrays.hpp).
#include "arrays.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "oasis/core/error.hpp"

namespace oasis::python {
namespace {

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

/// The handle as an array, or an error naming the argument.
py::array as_array(py::handle h, const std::string& name) {
  OASIS_REQUIRE(py::isinstance<py::array>(h), name, "expected a numpy array (or a torch tensor), got ", type_name(h));
  return py::reinterpret_borrow<py::array>(h);
}

std::string dtype_name(const py::array& a) { return py::str(a.dtype()); }

bool native(const py::array& a) { return a.dtype().byteorder() != '>'; }

/// Contiguity and byte order, shared by every conversion.
void require_layout(const py::array& a, const std::string& name) {
  OASIS_REQUIRE(native(a), name, "big-endian dtype ", dtype_name(a), "; convert with a.astype(a.dtype.newbyteorder('='))");
  OASIS_REQUIRE(a.flags() & py::array::c_style, name,
                "is not C-contiguous (a transposed, sliced or broadcast view); pass np.ascontiguousarray(x) "
                "(torch: x.contiguous())");
}

Shape shape_of(const py::array& a) {
  Shape s;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<index_t>(a.shape(i)));
  return s;
}

template <class T>
int dtype_num() {
  return py::dtype::of<T>().num();
}

}  // namespace

Scalar scalar_of(py::handle h, const std::string& name) {
  const py::array a = as_array(h, name);
  if (a.dtype().num() == dtype_num<float>()) return Scalar::f32;
  if (a.dtype().num() == dtype_num<double>()) return Scalar::f64;
  throw invalid_argument(name, "dtype " + dtype_name(a) + ": the core functions compute in float32 or float64");
}

template <class T>
Tensor<T> to_tensor(py::handle h, const std::string& name, bool allow_nan) {
  const py::array a = as_array(h, name);
  OASIS_REQUIRE(a.dtype().num() == dtype_num<T>(), name, "dtype ", dtype_name(a), ", expected ",
                std::string(py::str(py::dtype::of<T>())), " (every array of one call has the dtype of the first)");
  require_layout(a, name);
  Tensor<T> t(shape_of(a));
  if (t.size() > 0) std::memcpy(t.data(), a.data(), static_cast<std::size_t>(t.size()) * sizeof(T));
  if (!allow_nan)
    for (index_t i = 0; i < t.size(); ++i)
      OASIS_REQUIRE(!std::isnan(t[i]), name, "NaN at flat index ", i);
  return t;
}

template Tensor<float> to_tensor<float>(py::handle, const std::string&, bool);
template Tensor<double> to_tensor<double>(py::handle, const std::string&, bool);

Tensor<double> to_double_tensor(py::handle h, const std::string& name) {
  if (scalar_of(h, name) == Scalar::f64) return to_tensor<double>(h, name);
  return to_tensor<float>(h, name).cast<double>();
}

io::StoredTensor to_stored(py::handle h, const std::string& dtype, const std::string& name) {
  const py::array a = as_array(h, name);
  const io::DType d = io::parse_dtype(dtype);
  const int num = a.dtype().num();
  const bool ok = (d == io::DType::f64 && num == dtype_num<double>()) || (d == io::DType::f32 && num == dtype_num<float>()) ||
                  (d == io::DType::f16 && num == py::dtype("float16").num()) ||
                  (d == io::DType::bf16 && num == dtype_num<std::uint16_t>()) ||
                  (d == io::DType::i32 && num == dtype_num<std::int32_t>()) || (d == io::DType::i64 && num == dtype_num<std::int64_t>());
  OASIS_REQUIRE(ok, name, "dtype ", dtype_name(a), " does not hold ", std::string(io::to_string(d)),
                " values (bf16: the raw bits as uint16)");
  require_layout(a, name);
  io::StoredTensor s{d, Tensor<double>(shape_of(a))};
  // the file readers' decode (io::detail::load_le_array: float32 from its bits, so a subnormal is
  // kept under the caller's denormals-are-zero); a native array is little-endian on every host built for
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "arrays are decoded as little-endian bytes");
  const auto n = static_cast<std::size_t>(s.values.size());
  const std::size_t bad = io::detail::load_le_array(static_cast<const unsigned char*>(a.data()), n, d, s.values.data());
  OASIS_REQUIRE(bad == n, name, "int64 entry ", bad, " lies beyond 2^53 in magnitude (not exact as a double)");
  return s;
}

io::TensorMap to_tensor_map(const py::dict& d, const std::string& what) {
  io::TensorMap m;
  for (const auto& kv : d) {
    OASIS_REQUIRE(py::isinstance<py::str>(kv.first), what, "tensor names must be strings, got ", type_name(kv.first));
    const std::string name = py::cast<std::string>(kv.first);
    OASIS_REQUIRE(py::isinstance<py::tuple>(kv.second) && py::len(kv.second) == 2, what,
                  "entry '", name, "' must be a (dtype, array) pair");
    const py::tuple t = py::reinterpret_borrow<py::tuple>(kv.second);
    OASIS_REQUIRE(py::isinstance<py::str>(t[0]), what, "entry '", name, "': the dtype tag must be a string");
    m.emplace(name, to_stored(t[1], py::cast<std::string>(t[0]), name));
  }
  return m;
}

template <class T>
py::array_t<T> to_numpy(const Tensor<T>& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  py::array_t<T> a(shape);
  if (t.size() > 0) std::memcpy(a.mutable_data(), t.data(), static_cast<std::size_t>(t.size()) * sizeof(T));
  return a;
}

template py::array_t<float> to_numpy<float>(const Tensor<float>&);
template py::array_t<double> to_numpy<double>(const Tensor<double>&);

}  // namespace oasis::python
