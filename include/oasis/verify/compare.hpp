// oasis/verify/compare.hpp — the compare engine: check another implementation's tensors against
// the oracle recomputed from the same inputs (in double with its own error bound folded in, or in
// 50-digit oasis::mp50; CompareOptions::oracle).
//
// One engine serves `oasis-verify compare` (a JSON configuration naming tensor files) and
// programs that hold the tensors in memory (check()). File formats, tensor names, options and the
// tolerance policies: docs/verify.md. Ops and their tensors: describe_ops().
//
// Each element of an output stored in dtype D is judged on two lines (oasis/verify/policy.hpp):
// the certain worst-case bound |x_i - ref_i| <= 0.5 ulp_D(ref_i) + 2 B_i(D) (outside it:
// FAIL-certain) and the selected policy, by default probabilistic (outside it: FAIL). The
// derivations and the measurements behind them are in docs/tolerances.md.
//
// Errors: unusable input (a missing or unknown tensor, a bad option, an unreadable file) throws
// oasis::invalid_argument or io::format_error, naming the problem; `oasis-verify` exits 2.
#pragma once

#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify {

/// Check the outputs of the op-level `op` (every op but "model") computed from `inputs`;
/// `options` is the op's options object (a null Value for none).
CompareReport check(const std::string& op, const io::TensorMap& inputs, const io::TensorMap& outputs,
                    const io::json::Value& options = {}, const CompareOptions& opt = {});

/// Check a model trace (op "model"): `weights_file` is a file of oasis::model::save_model (the
/// configuration in its metadata), `inputs` holds the token ids, `trace` the logits and trace
/// tensors (docs/verify.md, "Model level").
CompareReport check_model(const std::string& weights_file, const io::TensorMap& inputs, const io::TensorMap& trace,
                          const io::json::Value& options = {}, const CompareOptions& opt = {});

/// Run the comparison described by a configuration file (JSON, or a .safetensors file whose
/// "__metadata__" holds the JSON under "oasis_config").
CompareReport compare_config_file(const std::string& path, const CompareOptions& opt = {});

/// The same for an already parsed configuration; relative paths are resolved against base_dir.
/// `default_file` is used for "inputs"/"outputs" when they are absent (may be empty).
CompareReport compare_config(const io::json::Value& cfg, const std::string& base_dir,
                             const std::string& default_file, const CompareOptions& opt = {});

/// The names of the ops the engine knows.
std::vector<std::string> op_names();

/// The ops with their input and output tensor names and options (for --help and docs).
std::string describe_ops();

}  // namespace oasis::verify
