// src/verify/ops.hpp — the ops of the compare engine: each op file src/verify/op_<name>.cpp
// defines one function returning its OpSpec (op_support.hpp), and the registry (op_specs() in
// engine.cpp) lists them. To add an op: write its file, declare its function here and list it
// in op_specs().
#pragma once

#include <string>
#include <vector>

#include "op_support.hpp"

namespace oasis::verify::detail {

OpSpec normalizer_op();
OpSpec attention_op();
OpSpec psi_op();
OpSpec coupling_op();
OpSpec depth_op();
OpSpec pseudo_query_op();
OpSpec attention_backward_op();
OpSpec psi_backward_op();
OpSpec depth_backward_op();
OpSpec pseudo_query_backward_op();
OpSpec attention_merge_op();
OpSpec attn_res_op();
OpSpec attn_res_backward_op();
OpSpec block_attn_res_op();
OpSpec block_attn_res_backward_op();

/// Op attention_merge's form B (op_attention_merge_split.cpp): a split-KV kernel's partials judged
/// as op attention split by split (plain softmax over each split's keys; with sink_in "split0",
/// split 0 as Softmax1), and its merged out, lse, p_null as op attention on the full inputs.
CompareReport attention_merge_split_report(const OpCall& call, const std::string& sink_in, bool parts_base2);

/// Op depth_backward on DepthOptions and kinds given directly (the model level's local backward
/// steps of the routers, op_model_grad.cpp).
CompareReport depth_backward_report(const TensorMap& in, const TensorMap& out, const DepthOptions& d,
                                    const std::vector<SourceKind>& kinds, const CompareOptions& copt);

/// The model level (op_model.cpp): `weights_file` holds the model and its configuration; or the
/// configuration and the weights in memory.
CompareReport run_model(const std::string& weights_file, const TensorMap& inputs, const TensorMap& outputs,
                        const CompareOptions& opt);
CompareReport run_model(const model::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                        const TensorMap& outputs, const CompareOptions& opt);

}  // namespace oasis::verify::detail
