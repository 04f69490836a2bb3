// oasis/verify/compare.hpp — the compare engine: check another implementation's tensors against
// the oracle recomputed from the same inputs (in double with its own error bound folded in, or in
// 50-digit oasis::mp50; CompareOptions::oracle).
//
// One engine serves `oasis-verify compare` (a JSON configuration naming tensor files) and
// programs that hold the tensors in memory (check()). File formats, tensor names and options:
// docs/verify.md; the tolerance policies: docs/policies.md. Ops and their tensors: describe_ops().
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
#include "oasis/core/multiprecision.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::model {
struct ModelConfig;
}

namespace oasis::verify {

/// Check the outputs of the op-level `op` (every op but "model") computed from `inputs`;
/// `options` is the op's options object (a null Value for none).
CompareReport check(const std::string& op, const io::TensorMap& inputs, const io::TensorMap& outputs,
                    const io::json::Value& options = {}, const CompareOptions& opt = {});

/// Check a model trace (op "model"): `weights_file` holds the weights and the configuration in
/// its metadata (oasis::model::save_model, or written by hand), `inputs` the token ids, `trace`
/// the logits, the state and the trace tensors. Every trace tensor is checked against what the
/// configured model computes from the tensors it reads (a PASS certifies the wiring too); logits
/// without the state get the end-to-end verdict (docs/verify-model.md, "Model level").
CompareReport check_model(const std::string& weights_file, const io::TensorMap& inputs, const io::TensorMap& trace,
                          const io::json::Value& options = {}, const CompareOptions& opt = {});

/// The same for a model held in memory: its configuration and its weights by parameter name
/// (oasis::model::parameter_specs; checked as load_model checks a file).
CompareReport check_model(const model::ModelConfig& config, const io::TensorMap& weights, const io::TensorMap& inputs,
                          const io::TensorMap& trace, const io::json::Value& options = {}, const CompareOptions& opt = {});

/// Comparison options from a JSON object (a null Value for the defaults): {"show": N}. An unknown
/// key is an error naming it (the Python module passes its keyword arguments through here).
CompareOptions compare_options(const io::json::Value& v);

/// Run the comparison described by a configuration file (JSON, or a .safetensors file whose
/// "__metadata__" holds the JSON under "oasis_config").
CompareReport compare_config_file(const std::string& path, const CompareOptions& opt = {});

/// The same for an already parsed configuration; relative paths are resolved against base_dir.
/// `default_file` is used for "inputs"/"outputs" when they are absent (may be empty).
CompareReport compare_config(const io::json::Value& cfg, const std::string& base_dir,
                             const std::string& default_file, const CompareOptions& opt = {});

/// The worst-case policy on one tensor: `got` (stored in dtype D = got.dtype) against the mp50
/// oracle `ref`, per element |x - ref| <= 0.5 ulp_D(ref) + 2 plain, with plain = B_i(D) of ref's
/// shape (a shape mismatch fails the tensor); lists the first `show` mismatches. The model level
/// and the parity rows of `oasis-verify selfcheck` call it.
TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show);

/// The names of the ops the engine knows.
std::vector<std::string> op_names();

/// The option keys, input and output tensor names of op-level `op` (an unknown op is an error
/// naming it).
std::vector<std::string> op_option_names(const std::string& op);
std::vector<std::string> op_input_names(const std::string& op);
std::vector<std::string> op_output_names(const std::string& op);

/// The ops with their input and output tensor names and options (for --help and docs).
std::string describe_ops();

}  // namespace oasis::verify
