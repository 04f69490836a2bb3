// src/verify/engine.hpp — the compare engine's internal pieces, shared by its op files.
//
// An op is one OpSpec (op_specs() in engine.cpp lists them): its input and output tensor names, its option keys
// and a function from an OpCall to a CompareReport. The engine (engine.cpp) validates the call
// against the spec before the op runs — an unknown option, input or output name is an error that
// lists the known names, a missing required input is an error naming it — so every op file
// holds only its mathematics. To add an op: write src/verify/op_<name>.cpp with a function
// returning its OpSpec and list it in op_specs().
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/policy.hpp"
#include "tensor_check.hpp"

namespace oasis::verify::detail {

using io::DType;
using io::StoredTensor;
using io::TensorMap;
using io::json::Value;
using Ref = Tensor<mp50>;
using BoundMap = std::map<std::string, Tensor<double>>;

/// The options object of one op call, with typed accessors that name the key on a type error.
/// Unknown keys are rejected by the engine before the op runs.
class Options {
 public:
  explicit Options(const Value* v) : v_(v) {
    OASIS_REQUIRE(!v_ || v_->kind == Value::Kind::null || v_->is_object(), "options", "must be a JSON object");
    if (v_ && !v_->is_object()) v_ = nullptr;
  }
  const Value* get(const std::string& key) const { return v_ ? v_->find(key) : nullptr; }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  std::vector<std::string> keys() const;
  bool boolean(const std::string& key, bool def) const;
  double number(const std::string& key, double def) const;
  std::string string(const std::string& key, const std::string& def) const;
  std::vector<double> numbers(const std::string& key) const;
  std::vector<index_t> integers(const std::string& key) const;
  std::vector<std::string> strings(const std::string& key) const;

 private:
  const Value* v_;
};

/// One call of an op.
struct OpCall {
  const TensorMap& inputs;
  const TensorMap& outputs;
  const Options& options;
  const CompareOptions& compare;
};

/// A tensor an op takes or produces.
struct TensorSpec {
  std::string name;
  std::string shape;      ///< documentation, e.g. "[B,H,Tq,dh]"
  bool required = true;   ///< inputs only
};

struct OpSpec {
  std::string name;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<std::string> options;
  std::string help;  ///< option values and notes for describe_ops()
  std::function<CompareReport(const OpCall&)> run;
  bool samples_rows = false;  ///< honours CompareOptions::sample
};

/// Every op-level op the engine knows (engine.cpp).
const std::vector<OpSpec>& op_specs();
const OpSpec& op_spec(const std::string& name);

// ---- the op files -------------------------------------------------------------------------------
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

/// The model level (op_model.cpp): `weights_file` holds the model and its configuration; or the
/// configuration and the weights in memory.
CompareReport run_model(const std::string& weights_file, const TensorMap& inputs, const TensorMap& outputs,
                        const CompareOptions& opt);
CompareReport run_model(const model::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                        const TensorMap& outputs, const CompareOptions& opt);

// ---- helpers of the op files ----------------------------------------------------------------------

/// "a, b, c" (or "none").
std::string names_of(const TensorMap& m);
std::string join_names(const std::vector<std::string>& names);

/// A required input (NaN rejected, naming the tensor and the first bad index).
const StoredTensor& need(const TensorMap& m, const std::string& name, const std::string& op);
/// An optional tensor, nullptr when absent.
const StoredTensor* maybe(const TensorMap& m, const std::string& name);

/// Unit roundoff of a stored dtype.
inline double unit_roundoff(DType d) { return io::dtype_eps(d) / 2; }
inline bool is16(DType d) { return d == DType::f16 || d == DType::bf16; }

/// The allowed terms of one element of an output stored in d under policy p (policy.hpp), from the
/// bounds at the output's accumulation precision (double for f64 outputs, float otherwise):
/// wc the worst-case B, prob the probabilistic E (NaN: none derived), mix_mass sum_j p_j |v_jc|
/// of a mixture output (0 otherwise; the p16 term).
Allowed allowed_terms(DType d, Policy p, double wc, double prob, double mix_mass, double rho = 0);
/// The bound column of the report for such a tensor.
std::string bound_name(DType d, Policy p, bool has_prob, bool mixture);

/// B(D) for every output: f64 from the double bound, f32 from the float bound, f16/bf16 the
/// float bound scaled by u_D / u_f32 (the bounds are first order in u).
class PlainBounds {
 public:
  using Fn = std::function<BoundMap(bool wide)>;  // wide: double, else float
  explicit PlainBounds(Fn fn) : fn_(std::move(fn)) {}
  Tensor<double> get(const std::string& name, DType d);
  /// The unscaled bound at the accumulation precision of d (double for f64, float otherwise).
  const Tensor<double>& raw(const std::string& name, DType d);

 private:
  Fn fn_;
  BoundMap wide_, narrow_;
};

/// Compare every output present against the oracle's `refs` (mp50) with the worst-case bounds and,
/// when `prob` is given, the probabilistic ones (same BoundMap layout at the accumulation
/// precision); fills rep.tensors and rep.passed.
void compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, const Ref*>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob = nullptr);

/// A reference computed in double: its values and a bound on their error (times err_scale).
struct DoubleRef {
  const Tensor<double>* value;
  const Tensor<double>* err;
  double err_scale = 1.0;
};
/// As above against double references, the policy's terms known within a relative `rho`; returns
/// the number of elements their errors leave undecided (rep is then to be recomputed in mp50).
index_t compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, DoubleRef>& refs,
                        PlainBounds& bounds, const CompareOptions& opt, double rho);

/// Sorts `v` by `key` and returns the [first, last) index ranges of equal keys (the fast oracles
/// group their undecided elements by row or token, to recompute each once in mp50).
template <class T, class Key>
std::vector<std::pair<std::size_t, std::size_t>> group_by(std::vector<T>& v, Key key) {
  std::sort(v.begin(), v.end(), [&](const T& a, const T& b) { return key(a) < key(b); });
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  for (std::size_t x = 0; x < v.size();) {
    std::size_t y = x;
    while (y < v.size() && key(v[y]) == key(v[x])) ++y;
    spans.emplace_back(x, y);
    x = y;
  }
  return spans;
}

/// `n` distinct rows of `total` drawn with `seed` (sorted; all rows when n = 0 or n >= total).
/// Reproducible on every platform (SplitMix64, no standard-library distribution).
std::vector<index_t> sample_rows(index_t total, index_t n, std::uint64_t seed);

/// Option "normalizer" of the ops with derived bounds: softmax or softmax1.
RowNorm token_normalizer(const Options& o, const std::string& key);
/// The attention ops' AttentionOptions: options normalizer, causal, key_lengths, null_logits,
/// scale, window, layout and the input tensors null_logits, bias, mask (op_attention.cpp).
AttentionOptions attention_call_options(const Options& o, const TensorMap& in);
/// Options of the depth ops (coupling, depth).
extern const std::vector<std::string> kDepthOptionKeys;
DepthOptions parse_depth_options(const Options& o, bool coupling_default);
std::vector<SourceKind> parse_kinds(const Options& o, index_t n);

template <class T> Tensor<T> as(const StoredTensor& s) { return s.values.cast<T>(); }
template <class T> Tensor<T> as(const Tensor<double>& s) { return s.cast<T>(); }

}  // namespace oasis::verify::detail
