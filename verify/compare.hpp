// verify/compare.hpp — `oasis-verify compare`: check another implementation's tensors against
// the oracle recomputed in high precision (oasis::mp50). File formats, tensor names and the
// tolerance policy: docs/verify.md.
//
// Tolerance policy, per element i of an output stored in dtype D:
//   |x_i - ref_i| <= bound_i = 0.5 ulp_D(ref_i) + 2 * B_i(D)
// ref_i: the oracle in mp50 on exactly the stored inputs; 0.5 ulp_D(ref_i): the error of rounding
// the exact result to D (no implementation that stores D can do better); B_i(D): the derived
// per-element error bound of the plain same-precision reference evaluated in D
// (oasis/error_bounds.hpp; D = f32 or f64 directly, f16/bf16 as the first-order bound with D's
// unit roundoff); the factor 2 admits a kernel whose summation order or fusion differs from the
// plain reference (project policy: at most 2x the plain reference error, plus a rounding floor).
#pragma once

#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"

namespace oasis::verify {

/// Comparison of one output tensor.
struct TensorReport {
  std::string name;
  io::DType dtype = io::DType::f32;
  Shape shape;
  index_t elements = 0;
  double max_abs = 0;        ///< max |x - ref|
  double max_rel = 0;        ///< max |x - ref| / |ref| over ref != 0
  double max_ulps = 0;       ///< max |x - ref| / ulp_D(ref): error in units of D's precision
  double worst_ratio = 0;    ///< max |x - ref| / bound (<= 1 passes)
  index_t violations = 0;    ///< elements outside the bound (NaN counts)
  std::vector<std::string> first_mismatches;  ///< "name[i, j]: got .. ref .. |err| .. bound .."
  bool passed = false;
  /// Reported for information only, no verdict (model logits without a readout state: the
  /// end-to-end bound is vacuous, docs/verify.md); `passed` is then true and ignored.
  bool informative = false;
  std::string problem;       ///< a whole-tensor failure (shape mismatch), empty otherwise
};

struct CompareReport {
  std::string op;
  std::vector<TensorReport> tensors;
  std::vector<std::string> notes;  ///< e.g. tensors in the outputs that the op does not produce
  bool passed = false;
};

/// Options of the comparison (not of the op).
struct CompareOptions {
  int show = 5;  ///< mismatching elements listed per tensor
};

/// Run the comparison described by a configuration file (JSON, or a .safetensors file whose
/// "__metadata__" holds the JSON under "oasis_config"). Throws oasis::invalid_argument /
/// io::format_error on unusable input (exit status 2 in the tool).
CompareReport compare_config_file(const std::string& path, const CompareOptions& opt = {});

/// The same for an already parsed configuration; relative paths are resolved against base_dir.
/// `default_file` is used for "inputs"/"outputs" when they are absent (may be empty).
CompareReport compare_config(const io::json::Value& cfg, const std::string& base_dir,
                             const std::string& default_file, const CompareOptions& opt = {});

/// Human-readable report (one block per tensor, then the verdict).
std::string format_report(const CompareReport& r);
/// The report as a JSON document.
std::string report_json(const CompareReport& r);

/// The ops `compare` knows, with their input and output tensor names (for --help and docs).
std::string describe_ops();

}  // namespace oasis::verify
