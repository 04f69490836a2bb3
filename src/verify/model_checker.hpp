// src/verify/model_checker.hpp — what every trace tensor of a configured model must be.
//
// The model level (op_model.cpp) checks each tensor of a trace against its PRODUCER: the step of
// the configured model that makes it (oasis/model/wiring.hpp), evaluated in mp50 on the tensors
// that step reads. A read tensor is taken from the trace when the trace has it (exactly, error 0:
// a mistake is then reported at the step that makes it); otherwise it is recomputed from the
// tensors the trace has, and the error the implementation may make in that recomputation enters
// the bound (the first-order rules of oasis/model/layers.hpp and router.hpp). Recomputation never
// passes through a sublayer output: `<sublayer>.output` is the carrier between sublayers, and a
// check whose reads need an output the trace lacks throws Missing naming it. The logits are
// checked on the trace's `state` only (else Missing: the caller's end-to-end verdict is stronger
// than the readout and head composed through recomputation).
//
// expected(name, wide) returns the producer's value `ref` and `e`, the first-order bound of the
// plain step in the precision of the checked tensor (wide: f64, u = 2^-53; else u = 2^-24, which
// the caller scales by u_D / u_f32 for f16/bf16), so that the tensor passes when
//   |x - ref| <= 0.5 ulp_D(ref) + 2 e(D)            (the op-level policy, docs/policies.md).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "op_support.hpp"
#include "oasis/model/model.hpp"
#include "oasis/model/wiring.hpp"

namespace oasis::verify::detail {

/// A tensor a check needs that the trace lacks (an input error: the link cannot be made).
struct Missing {
  std::string name;
  Shape shape;
};

/// A tensor a check reads that the trace has but cannot be used (wrong shape, not finite, a psi
/// outside [0, 1]); it fails its own check, and the checks reading it fail naming it.
struct Unusable {
  std::string name;
  std::string why;
};

/// A producer's value and the bound of the plain step (same shape as the trace tensor).
template <class R>
struct ExpectedOf {
  Tensor<R> ref;
  Tensor<double> e;
  std::string step;  ///< what produced it, for the report ("router layers.1.attn_res on ...")
};

/// An oracle value [N, w] and the bound on the error an implementation may make computing it.
template <class R>
struct ResolvedOf {
  Tensor<R> x;
  Tensor<double> e;
};

/// The producers of a trace, evaluated in the reference scalar R: mp50 (the 50-digit oracle) or
/// double (the fast oracle, op_model.cpp: each value within the same rules' bound at u = 2^-53 of
/// the exact one). Instantiated for both (model_checker_mp50.cpp, model_checker_double.cpp).
template <class R>
class ModelCheckerOf {
 public:
  ModelCheckerOf(const oasis::model::Model<R>& m, const TensorMap& trace, const std::vector<index_t>& ids, index_t B,
                 index_t Tn);
  ~ModelCheckerOf();

  /// Every trace name of this configuration with its shape, in forward order (then ids).
  const std::vector<std::pair<std::string, Shape>>& names() const { return names_; }
  const Shape* shape_of(const std::string& name) const;

  /// The producer of trace tensor `name` on the tensors it reads (excluding `name` itself).
  /// `got` is the implementation's tensor (entries no step reads are taken from it). Throws
  /// Missing, Unusable, or oasis::invalid_argument for tensors without a derived per-step bound.
  ExpectedOf<R> expected(const std::string& name, const StoredTensor& got, bool wide);

  /// The readout state recomputed from the trace without any tensor that holds it (the readout
  /// step alone; for the floor of the end-to-end verdict).
  ResolvedOf<R> readout_step(bool wide);

  /// True when the router traced under `name`'s prefix is coupled (psi used); false otherwise.
  bool psi_used(const std::string& name) const;

  /// Forgets the intermediate values kept between calls (projections, attention cores, routes,
  /// sums): the memory stays that of the steps in use (a later call recomputes what it needs).
  void release();

 private:
  struct Impl;
  std::vector<std::pair<std::string, Shape>> names_;
  std::map<std::string, Shape> shapes_;
  std::unique_ptr<Impl> p_;
};

extern template class ModelCheckerOf<mp50>;
extern template class ModelCheckerOf<double>;

using ModelChecker = ModelCheckerOf<mp50>;
using Expected = ExpectedOf<mp50>;
using Resolved = ResolvedOf<mp50>;

}  // namespace oasis::verify::detail
