// oasis/io/dtype_enum.hpp — the element-type enum on its own, without dependencies, so that code
// which must not include the oasis core (the CUDA kernels' launch structs, src/cuda/launch.hpp,
// compiled by nvcc) names the same enum as the rest of the library. Everything else about a
// dtype (sizes, names, exact conversions) is in oasis/io/dtype.hpp.
#pragma once

namespace oasis::io {

/// Element type of a stored tensor (i32, i64: token ids) and of the CUDA backend's inputs (f32, f16, bf16).
enum class DType { f16, bf16, f32, f64, i32, i64 };

}  // namespace oasis::io
