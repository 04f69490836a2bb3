// src/verify/engine.cpp — the compare engine's entry points (oasis/verify/compare.hpp) and the
// registry of its ops (op_specs): a call is validated against its op's spec, then the op runs.
// This is the top layer (the layers: op_support.hpp); nothing below calls into it.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "config_files.hpp"
#include "oracle_arithmetic.hpp"
#include "ops.hpp"
#include "progress.hpp"

namespace oasis::verify {
namespace detail {
namespace {

std::vector<std::string> names(const std::vector<TensorSpec>& v) {
  std::vector<std::string> n;
  for (const auto& t : v) n.push_back(t.name);
  return n;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Unknown options, inputs or outputs are errors listing the known names; a tensor that belongs
/// to the other set (inputs and outputs read from one file) is allowed and not compared.
void validate_call(const OpSpec& s, const TensorMap& in, const TensorMap& out, const Options& o) {
  for (const auto& k : o.keys())
    OASIS_REQUIRE(contains(s.options, k), "options", "unknown option '", k, "' for op ", s.name,
                  " (known: ", join_names(s.options), ")");
  const std::vector<std::string> ins = names(s.inputs), outs = names(s.outputs);
  for (const auto& [name, t] : in) {
    (void)t;
    OASIS_REQUIRE(contains(ins, name) || contains(outs, name), name, "unknown input tensor '", name, "' for op ",
                  s.name, " (inputs: ", join_names(ins), ")");
  }
  bool any = false;
  for (const auto& [name, t] : out) {
    (void)t;
    OASIS_REQUIRE(contains(outs, name) || contains(ins, name), name, "unknown output tensor '", name, "' for op ",
                  s.name, " (outputs: ", join_names(outs), ")");
    any = any || contains(outs, name);
  }
  OASIS_REQUIRE(any, "outputs", "none of the outputs of op ", s.name, " (", join_names(outs),
                ") is present, so nothing would be checked; the outputs hold: ", names_of(out));
  for (const auto& t : s.inputs)
    OASIS_REQUIRE(!t.required || in.count(t.name), t.name, "op ", s.name, " needs input tensor '", t.name, "' ", t.shape,
                  " (the inputs hold: ", names_of(in), ")");
}

const std::vector<OpSpec>& op_specs() {
  static const std::vector<OpSpec> specs = {normalizer_op(),          attention_op(),     psi_op(),
                                            coupling_op(),            depth_op(),         pseudo_query_op(),
                                            attention_backward_op(),  psi_backward_op(),  depth_backward_op(),
                                            pseudo_query_backward_op(), attention_merge_op(),
                                            attn_res_op(),            attn_res_backward_op(),
                                            block_attn_res_op(),      block_attn_res_backward_op()};
  return specs;
}

/// "ops attention, normalizer, ..." : the ops that honour CompareOptions::sample.
std::string sampling_ops() {
  std::vector<std::string> v;
  for (const auto& s : op_specs())
    if (s.samples_rows) v.push_back(s.name);
  return "ops " + join_names(v);
}

const OpSpec& op_spec(const std::string& name) {
  for (const auto& s : op_specs())
    if (s.name == name) return s;
  throw invalid_argument("op", "unknown op '" + name + "' (known: " + join_names(op_names()) + ")");
}

}  // namespace
}  // namespace detail

using namespace detail;

std::vector<std::string> op_option_names(const std::string& op) { return op_spec(op).options; }
std::vector<std::string> op_input_names(const std::string& op) { return names(op_spec(op).inputs); }
std::vector<std::string> op_output_names(const std::string& op) { return names(op_spec(op).outputs); }

std::vector<std::string> op_names() {
  std::vector<std::string> n;
  for (const auto& s : op_specs()) n.push_back(s.name);
  n.push_back("model");
  return n;
}

CompareReport check(const std::string& op, const TensorMap& inputs, const TensorMap& outputs, const Value& options,
                    const CompareOptions& opt) {
  const detail::OracleArithmetic arithmetic;
  OASIS_REQUIRE(op != "model", "op", "the model level is check_model(weights_file, inputs, trace)");
  const OpSpec& s = op_spec(op);
  const Options o(&options);
  validate_call(s, inputs, outputs, o);
  for (const auto& [name, t] : outputs)  // integer tensors (ids) have no rounding policy
    OASIS_REQUIRE(!io::is_integer(t.dtype) || inputs.count(name), name, "is an integer tensor (", io::to_string(t.dtype),
                  "); outputs are floating point");
  // integers are the layouts' metadata only: a value tensor stored as integers is a mistake of the caller
  static const std::set<std::string> kIntegerInputs = {"cu_seqlens_q", "cu_seqlens_k", "block_table", "seq_lens"};
  for (const auto& [name, t] : inputs)
    OASIS_REQUIRE(!io::is_integer(t.dtype) || kIntegerInputs.count(name), name, "is an integer tensor (",
                  io::to_string(t.dtype), "); only the layouts' metadata (cu_seqlens_q, cu_seqlens_k, block_table, "
                  "seq_lens) may be integers");
  OASIS_REQUIRE(opt.sample >= 0, "sample", "must be >= 0 (0: every row), got ", opt.sample);
  OASIS_REQUIRE(opt.sample == 0 || s.samples_rows, "sample", "op ", op,
                " checks every element (sampling rows is offered by ", sampling_ops(), ")");
  const ProgressRun progress(opt, op, outputs, names(s.outputs));
  CompareReport rep = s.run(OpCall{inputs, outputs, o, opt});
  rep.op = op;
  rep.policy = std::string(to_string(opt.policy));
  // A 16-bit tensor outside the policy's bound (float32 arithmetic, stored once) but inside the
  // certain line, which is the worst case of arithmetic in 16 bits throughout: say which policy a
  // kernel that keeps its intermediates in 16 bits needs (it does not excuse a float32 kernel).
  // With 16-bit inputs the default bound already lets every intermediate be in 16 bits: only the
  // certain line is looser.
  if (opt.policy != Policy::worst_case) {
    std::string soft, all16;
    for (const auto& t : rep.tensors)
      if (!t.informative && t.violations > 0 && !t.certain_failure && t.problem.empty()) {
        if (t.bound.find(", all in ") != std::string::npos)
          all16 += (all16.empty() ? "" : ", ") + t.name;
        else if (t.dtype == DType::f16 || t.dtype == DType::bf16)
          soft += (soft.empty() ? "" : ", ") + t.name;
      }
    if (!all16.empty())
      rep.notes.push_back(all16 + ": outside the probabilistic bound of arithmetic in the 16-bit input type throughout "
                          "(which admits FlashAttention, P rounded before P V and torch eager code), within its worst "
                          "case; policy worst_case judges on that line alone");
    if (!soft.empty())
      rep.notes.push_back("16-bit " + soft + ": outside the " + std::string(to_string(opt.policy)) +
                          " bound, within the worst case of arithmetic in 16 bits throughout. A kernel that rounds the "
                          "probabilities to 16 bits before P V (FlashAttention) is checked with policy p16, one that "
                          "keeps its scores or weights in 16 bits with worst_case; for a kernel that accumulates in "
                          "float32 and rounds once the FAIL stands");
  }
  for (const auto& [name, t] : outputs) {
    (void)t;
    if (!rep.tensors.empty() && std::none_of(s.outputs.begin(), s.outputs.end(), [&](const TensorSpec& x) { return x.name == name; }))
      rep.notes.push_back("'" + name + "' is an input of op " + op + " held with the outputs; not compared");
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "op ", op, " checked no tensor");
  return rep;
}

namespace {
void check_model_options(const Value& options, const CompareOptions& opt) {
  const Options o(&options);
  for (const auto& k : o.keys()) throw invalid_argument("options", "unknown option '" + k + "' for op model (known: none)");
  OASIS_REQUIRE(opt.sample == 0, "sample", "the model level checks every element (sampling rows is offered by ",
                sampling_ops(), ")");
}

/// The model level has its own rules (each step under the worst-case line, end-to-end and gradient
/// verdicts under the parity rule; docs/verify.md), whatever the op-level policy.
CompareReport model_report(CompareReport rep, const CompareOptions& opt) {
  rep.policy = "worst_case";
  if (opt.policy != Policy::probabilistic)
    rep.notes.push_back("policy " + std::string(to_string(opt.policy)) +
                        " applies to op-level checks; the model level uses its own rules (docs/verify.md)");
  return rep;
}
}  // namespace

CompareReport check_model(const std::string& weights_file, const TensorMap& inputs, const TensorMap& trace,
                          const Value& options, const CompareOptions& opt) {
  const detail::OracleArithmetic arithmetic;
  check_model_options(options, opt);
  const ProgressRun progress(opt, "model", trace);
  return model_report(run_model(weights_file, inputs, trace, opt), opt);
}

CompareReport check_model(const model::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                          const TensorMap& trace, const Value& options, const CompareOptions& opt) {
  const detail::OracleArithmetic arithmetic;
  check_model_options(options, opt);
  const ProgressRun progress(opt, "model", trace);
  return model_report(run_model(config, weights, inputs, trace, opt), opt);
}

std::string describe_ops() {
  std::string s;
  auto tensors = [](const std::vector<TensorSpec>& v) {
    std::string t;
    for (const auto& x : v) t += (t.empty() ? "" : ", ") + x.name + " " + x.shape + (x.required ? "" : " (optional)");
    return t;
  };
  for (const auto& op : op_specs()) {
    char head[32];
    std::snprintf(head, sizeof head, "  %-13s ", op.name.c_str());
    s += head + std::string("inputs ") + tensors(op.inputs) + "\n";
    s += "                outputs " + tensors(op.outputs) + "\n";
    if (!op.options.empty()) s += "                options " + join_names(op.options) + "\n";
    if (!op.help.empty()) s += "                " + op.help + "\n";
  }
  s += "  model         \"model\": weights file of oasis::model::save_model (configuration in its metadata)\n"
       "                inputs ids [B,T] (integer or float dtype); outputs logits [B,T,vocab], state [B,T,d] and\n"
       "                trace tensors <sublayer>.<field>, each checked against its producer in the configured\n"
       "                model (docs/verify.md, model level)\n";
  return s;
}

CompareReport compare_config(const Value& cfg, const std::string& base_dir, const std::string& default_file,
                             const CompareOptions& opt) {
  OASIS_REQUIRE(cfg.is_object(), "config", "must be a JSON object with \"op\", \"inputs\", \"outputs\", \"options\"");
  for (const auto& m : cfg.members)
    OASIS_REQUIRE(m.first == "op" || m.first == "inputs" || m.first == "outputs" || m.first == "options" ||
                      m.first == "description" || m.first == "model",
                  "config", "unknown key '", m.first, "' (known: op, inputs, outputs, options, description, model)");
  const Value* opv = cfg.find("op");
  OASIS_REQUIRE(opv && opv->is_string(), "op", "missing; one of ", join_names(op_names()));
  const std::string op = opv->text;
  if (op != "model") (void)op_spec(op);  // unknown op: an error before any file is read
  OASIS_REQUIRE((op == "model") == (cfg.find("model") != nullptr), "model",
                op == "model" ? "op model needs \"model\": the weights file written by oasis::model::save_model"
                              : "the key \"model\" belongs to op model only");
  static const Value none;
  const Value* options = cfg.find("options");
  const TensorMap in = load_tensor_set(cfg.find("inputs"), base_dir, default_file, "inputs");
  const TensorMap out = load_tensor_set(cfg.find("outputs"), base_dir, default_file, "outputs");
  if (op == "model") {
    const Value& mv = *cfg.find("model");
    OASIS_REQUIRE(mv.is_string(), "model", "must be the path of a weights file (.safetensors)");
    return check_model(resolve_path(base_dir, mv.text), in, out, options ? *options : none, opt);
  }
  return check(op, in, out, options ? *options : none, opt);
}

CompareReport compare_config_file(const std::string& path, const CompareOptions& opt) {
  const ConfigFile f = read_config_file(path);
  return compare_config(f.cfg, f.base_dir, f.default_file, opt);
}

}  // namespace oasis::verify
