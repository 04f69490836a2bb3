// src/verify/op_model_grad.hpp — the model level's gradient tensors (op_model_grad.cpp; docs/verify-model.md,
// "Model gradients"). op_model.cpp calls check_model_gradients once per model check.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/model/model.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify::detail {

/// Whether `name` is a model-level gradient tensor name: "grad.<parameter>", "grad_state",
/// "grad_embeddings" or "<sublayer>.grad_<field>" (known or not: unknown ones are errors there).
bool is_model_gradient_name(const std::string& name);

/// Whether the fast (double) oracle applies to this configuration: not with a norm evaluated in
/// float32 (the reference itself rounds to float there, so a double reference off by ~2^-53 may round
/// differently); mp50 then. Shared by the forward's and the gradients' checks.
bool fast_oracle_applies(const model::ModelConfig& c);

/// Checks every gradient tensor of `outputs` (is_model_gradient_name) against the oracle's backward
/// from the implementation's own dL/dlogits (input tensor "grad_logits" [B, T, V]) under the
/// end-to-end parity rule; adds one report row per tensor and the checked names to `checked`.
/// Without gradient tensors it does nothing (a lone grad_logits gets a note). The reference is the
/// double model `md` (fast oracle) or the mp50 model `mp()` (built only when needed). Then the local
/// backward steps of the routers and sublayers, rows named "<tensor> (backward step)" with their
/// step in `step_of`, and the first wrong one in backward order noted.
void check_model_gradients(const model::Model<double>& md, const std::function<const model::Model<mp50>&()>& mp,
                           const std::vector<index_t>& ids, index_t B, index_t Tn, const io::TensorMap& inputs,
                           const io::TensorMap& outputs, const CompareOptions& opt, CompareReport& rep,
                           std::set<std::string>& checked, std::map<std::string, std::string>& step_of);

/// A local backward step's verdict: the step's position in the forward schedule (model::forward_schedule;
/// backward order is descending) and its label ("router layers.1.attn_res", "sublayer layers.1.mlp").
struct StepVerdict {
  index_t position = 0;
  std::string label;
  bool passed = true;
};

/// The local backward steps of the routers (model_grad_steps.cpp; docs/verify-model.md, "Local
/// backward steps"), called by check_model_gradients over N = B T positions.
void check_router_backward_steps(const model::Model<double>& m, index_t N, const io::TensorMap& outputs,
                                 const CompareOptions& opt, CompareReport& rep, std::map<std::string, std::string>& step_of,
                                 std::vector<StepVerdict>& verdicts);

/// The local backward steps of the attention and MLP sublayers (model_grad_sublayer_steps.cpp): each
/// sublayer whose trace holds its .input and the cotangents it received (.grad_output, and
/// .grad_branch_psi when the branch psi is read) has its .grad_input and its parameters' gradients
/// judged on exactly those tensors (reference: the double model `md` under the fast oracle, else the
/// mp50 model `mp()`).
void check_sublayer_backward_steps(const model::Model<double>& md, const std::function<const model::Model<mp50>&()>& mp,
                                   index_t B, index_t Tn, const io::TensorMap& outputs, const CompareOptions& opt,
                                   CompareReport& rep, std::map<std::string, std::string>& step_of,
                                   std::vector<StepVerdict>& verdicts);

/// The report's first note: the first wrong step in backward order and the last correct one before it.
void note_first_wrong_step(std::vector<StepVerdict> verdicts, CompareReport& rep);

}  // namespace oasis::verify::detail
