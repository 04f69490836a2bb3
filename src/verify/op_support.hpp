// src/verify/op_support.hpp — what the op files share: the OpSpec an op file returns, the call it
// receives, and the glue from an op's oracle to its report (inputs, bounds, element verdicts).
//
// The compare engine has three layers, each calling only the ones below it:
//   engine.cpp         entry points (check, check_model, compare_config) and the registry of ops
//                      (op_specs): validates a call against its op's spec, runs the op;
//   config_files.cpp   a configuration file and the tensor files it names (below the entry points);
//   op_<name>.cpp      one op each (ops.hpp), holding only its mathematics; they call this layer
//                      (op_support.cpp, op_options.cpp) and the oracles (attention_oracle,
//                      tensor_check, the model checker), never the entry points.
#pragma once

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "oasis/core/multiprecision.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/policy.hpp"
#include "op_options.hpp"
#include "tensor_check.hpp"

namespace oasis::verify::detail {

using io::DType;
using io::StoredTensor;
using io::TensorMap;
using io::json::Value;
using Ref = Tensor<mp50>;
using BoundMap = std::map<std::string, Tensor<double>>;
/// f64 gradients keep the worst-case line (their probabilistic bound is not derived): every
/// probabilistic bound of `m` made NaN, which compare_outputs reads as "none"; the per-token
/// flag kink_edge is kept.
void keep_worst_case_line(BoundMap& m);

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

/// An op: its input and output tensor names, its option keys and a function from an OpCall to a
/// CompareReport. The engine validates the call against the spec before the op runs (an unknown
/// option, input or output name is an error listing the known names, a missing required input
/// an error naming it), so the op's function holds only its mathematics.
struct OpSpec {
  std::string name;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<std::string> options;
  std::string help;  ///< option values and notes for describe_ops()
  std::function<CompareReport(const OpCall&)> run;
  bool samples_rows = false;  ///< honours CompareOptions::sample
};

/// "a, b, c" (or "none") of the tensors of m.
std::string names_of(const TensorMap& m);

/// A required input (NaN rejected, naming the tensor and the first bad index).
const StoredTensor& need(const TensorMap& m, const std::string& name, const std::string& op);

/// Unit roundoff of a stored dtype.
inline double unit_roundoff(DType d) { return io::dtype_eps(d) / 2; }
inline bool is16(DType d) { return d == DType::f16 || d == DType::bf16; }

/// The allowed terms of one element of an output stored in d under policy p (policy.hpp), from the
/// bounds at the output's accumulation precision (double for f64 outputs, float otherwise):
/// wc the worst-case B, prob the probabilistic E (NaN: none derived), mix_mass sum_j p_j |v_jc|
/// of a mixture output (0 otherwise; the p16 term). `in`: the inputs' type; 16-bit inputs let
/// every intermediate be in that type (the certain line at u_in, and the default policy the
/// probabilistic bound at u_in: torch eager, tensor-core P·V; docs/policies.md).
Allowed allowed_terms(DType d, Policy p, double wc, double prob, double mix_mass, double rho = 0, DType in = DType::f32);
/// The bound column of the report for such a tensor.
std::string bound_name(DType d, Policy p, bool has_prob, bool mixture, DType in = DType::f32);
/// The 16-bit type of the inputs `xs` with the larger unit roundoff (bf16 over f16), else f32.
DType input16(std::initializer_list<DType> xs);

/// The bound of psi = mean_h p_null_h over H heads (Tk = 0), or of the mass estimator psi =
/// mean_h (1 - sum_{j<Tk} p_j), at unit roundoff u (op psi; the model level's psi from p_null).
double psi_bound(double u, index_t H, index_t Tk, double psi);

/// B(D) for every output: f64 from the double bound, f32 from the float bound, f16/bf16 the
/// float bound scaled by u_D / u_f32 (the bounds are first order in u). An optional `fixed` part
/// (same layout) is an error the output carries whatever precision it is computed in (a forward
/// stored in the input type): it is added after the scaling.
class PlainBounds {
 public:
  using Fn = std::function<BoundMap(bool wide)>;  // wide: double, else float
  explicit PlainBounds(Fn fn, Fn fixed = nullptr) : fn_(std::move(fn)), fixed_fn_(std::move(fixed)) {}
  Tensor<double> get(const std::string& name, DType d);
  /// The bound at the accumulation precision of d (double for f64, float otherwise), the fixed
  /// part included divided by the scale get() applies (so that get() = raw() x scale).
  const Tensor<double>& raw(const std::string& name, DType d);
  /// The bound plus the fixed part, unscaled: a policy term E (a probabilistic bound at the
  /// accumulation precision; allowed_terms takes E of a 16-bit output unscaled).
  const Tensor<double>& unscaled(const std::string& name, DType d);

 private:
  const BoundMap& base(DType d);
  const Tensor<double>* fixed(const std::string& name, DType d);
  Fn fn_, fixed_fn_;
  std::map<std::pair<std::string, DType>, Tensor<double>> done_, unscaled_;
  BoundMap wide_, narrow_, fixed_wide_, fixed_narrow_;
};

/// Compare every output present against the oracle's `refs` (mp50) with the worst-case bounds and,
/// when `prob` is given, the probabilistic ones (same BoundMap layout at the accumulation
/// precision, taken as they are); fills rep.tensors and rep.passed. `in`: a 16-bit input type puts
/// the certain line at the wider of the output's type and it (an implementation computing in the
/// precision of its inputs).
void compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, const Ref*>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob = nullptr, DType in = DType::f32);

/// A reference computed in double: its values and a bound on their error (times err_scale).
struct DoubleRef {
  const Tensor<double>* value;
  const Tensor<double>* err;
  double err_scale = 1.0;
};
/// As above against double references, the policy's terms known within a relative `rho`; returns
/// the number of elements their errors leave undecided (rep is then to be recomputed in mp50).
index_t compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, DoubleRef>& refs,
                        PlainBounds& bounds, const CompareOptions& opt, double rho, PlainBounds* prob = nullptr,
                        DType in = DType::f32);

/// The budget of the mp50 fallback (CompareOptions::mp50_budget, mp50_memory; docs/policies.md,
/// "Failing fast"): whether recomputing in mp50 at an estimated `work` (multiply-adds) and `bytes`
/// (of mp50 values held at once) fits. When it does not, `rep` gets a note naming `what` and both
/// figures against the budget.
bool mp50_fits(CompareReport& rep, double work, double bytes, const CompareOptions& opt, const std::string& what);

/// After a fast oracle left `undecided` elements: whether the whole op is to be recomputed in mp50
/// (mp50_fits). If so, `rep` is reset for it (op, mp50_work) and `fallback` names the elements for
/// the oracle line; if not, `rep` keeps the fast verdicts with the oracle line saying how many are
/// left undecided.
bool mp50_fallback(CompareReport& rep, const std::string& op, index_t undecided, double work, double bytes,
                   const CompareOptions& opt, const std::string& what, std::string& fallback);

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

template <class T> Tensor<T> as(const StoredTensor& s) { return s.values.cast<T>(); }
template <class T> Tensor<T> as(const Tensor<double>& s) { return s.cast<T>(); }

}  // namespace oasis::verify::detail
