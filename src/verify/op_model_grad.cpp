// src/verify/op_model_grad.cpp — model-level gradient tensors (docs/verify-model.md, "Model gradients").
//
// The implementation supplies dL/dlogits (input "grad_logits" [B, T, V]) and any of
//   grad.<parameter>                 the gradient of every parameter (names of parameter_specs)
//   grad_state, grad_embeddings      [B, T, d] total dL/d the readout state, dL/d the embedding rows
//   <sublayer>.grad_<field>          SublayerGradTrace fields (oasis/grad/model_backward.hpp):
//                                    grad_input, grad_output, grad_routed, grad_branch_psi,
//                                    grad_sources, grad_g_old, grad_psi
// Reference: the oracle's backward (oasis::model::model_backward) from the same ids, weights and
// grad_logits, in mp50 (x_hp), and six plain replays in the tensor's precision (x_ref,k: Model<double>
// for f64, Model<float> for f32). A gradient is the end of the whole model's chain, so no composed
// first-order bound is non-vacuous (docs/model.md); the verdict is the backends' parity rule
// (docs/tolerances.md item 4) per row — the last axis; a rank <= 1 tensor is one row — in the
// infinity norm, against the largest of the six replays' row errors:
//   max_row |x - x_hp| <= 2 max_k max_row |x_ref,k - x_hp| + floor,
//   floor = 0.5 ulp_D(max_row |x_hp|) + 2 * 1.02 N u_D max_row |x_hp|
// (N = B T positions: the rounding of the final accumulation over the positions at the result's
// size). The replays: the backward (its forward recomputation included) rounding to nearest, upward
// and downward, each from dl whole and as backward(hi) + backward(lo) with dl = hi + lo split
// exactly (split_cotangent; the backward is linear in its cotangent, so this is the same gradient,
// rounded differently). Why six: a row's error is, to first order, sum_j S_j delta_j over every
// rounding of the chain, forward included; one replay realises one such sum, which on a short row
// whose terms cancel can be far below another implementation's (a torch model's router grad_g_old:
// 5.3 x the allowance from the nearest replay alone, 100-333 ulps end to end, while its own step is
// within 1.3 ulps: the error is the forward's and the upstream cotangents', not the row's last
// sums, so no bound of the last steps covers it). The directed replays round every operation one
// way (|delta_j| < 1 ulp, one sign): their row errors do not cancel by chance, and they re-realise
// the forward, which the split (backward only) does not (docs/verify-model.md, "Model gradients",
// has the measurements). Still a parity rule, not a bound. f16/bf16 gradients are rejected (no
// plain replay in those precisions is defined).
#include "op_model_grad.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <map>
#include <sstream>
#include <type_traits>
#include <utility>

#include "model_grad_parity.hpp"
#include "op_support.hpp"
#include "oasis/grad/model_backward.hpp"

namespace oasis::verify::detail {

namespace {

namespace om = oasis::model;

template <class T>
const Tensor<T>* trace_field(const om::SublayerGradTrace<T>& tr, const std::string& f) {
  if (f == "grad_input") return &tr.grad_input;
  if (f == "grad_output") return &tr.grad_output;
  if (f == "grad_routed") return &tr.grad_routed;
  if (f == "grad_branch_psi") return &tr.grad_branch_psi;
  if (f == "grad_sources") return &tr.grad_sources;
  if (f == "grad_g_old") return &tr.grad_g_old;
  if (f == "grad_psi") return &tr.grad_psi;
  return nullptr;
}

/// The tensor `name` of a backward result (nullptr: no such tensor; empty: not defined here).
template <class T>
const Tensor<T>* find_gradient(const om::ModelGrads<T>& g, const std::string& name) {
  if (name == "grad_state") return &g.state;
  if (name == "grad_embeddings") return &g.embeddings;
  if (name.rfind("grad.", 0) == 0) {
    const auto it = g.params.find(name.substr(5));
    return it == g.params.end() ? nullptr : &it->second;
  }
  const std::size_t dot = name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  const std::string sub = name.substr(0, dot), field = name.substr(dot + 1);
  for (const auto& tr : g.trace)
    if (tr.name == sub) return trace_field(tr, field);
  return nullptr;
}

std::string known_names(const om::ModelGrads<mp50>& g) {
  std::ostringstream os;
  os << "grad.<parameter> (";
  bool first = true;
  for (const auto& [n, t] : g.params) {
    (void)t;
    os << (first ? "" : ", ") << n;
    first = false;
  }
  os << "), grad_state, grad_embeddings, <sublayer>.{grad_input, grad_output, grad_routed, grad_branch_psi, "
        "grad_sources, grad_g_old, grad_psi} for the sublayers ";
  first = true;
  for (const auto& tr : g.trace) {
    os << (first ? "" : ", ") << tr.name;
    first = false;
  }
  return os.str();
}

/// The six realisations of the plain replay in T (header comment): each rounding direction, of dl
/// whole and of hi and lo (summed by replay_tensors). split[k]: whether lo[k] is a realisation's
/// second half.
template <class T>
struct Replays {
  std::vector<om::ModelGrads<T>> first, lo;
  std::vector<bool> split;
};

/// The caller casts the weights and grad_logits to T, and the split runs, under the default
/// rounding; only the backward itself (its forward recomputation included) runs under each
/// rounding direction.
template <class T>
Replays<T> replays(const om::Model<T>& m, const std::vector<index_t>& ids, index_t B, index_t Tn, const Tensor<T>& dl) {
  const auto [hi, lo] = split_cotangent(dl);
  Replays<T> out;
  for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD}) {
    const RoundingMode rm(mode);
    out.first.push_back(om::model_backward(m, ids, B, Tn, dl));
    out.lo.emplace_back();
    out.split.push_back(false);
    out.first.push_back(om::model_backward(m, ids, B, Tn, hi));
    out.lo.push_back(om::model_backward(m, ids, B, Tn, lo));
    out.split.push_back(true);
  }
  return out;
}

/// The tensor `name` of every realisation (a split one: backward(hi) + backward(lo), rounded to T).
template <class T>
std::vector<Tensor<T>> replay_tensors(const Replays<T>& g, const std::string& name) {
  std::vector<Tensor<T>> out;
  for (std::size_t k = 0; k < g.first.size(); ++k) {
    Tensor<T> x = *find_gradient(g.first[k], name);
    if (g.split[k]) {
      const Tensor<T>& lo = *find_gradient(g.lo[k], name);
      for (index_t i = 0; i < x.size(); ++i) x[i] += lo[i];
    }
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

bool is_model_gradient_name(const std::string& name) {
  if (name == "grad_state" || name == "grad_embeddings" || name.rfind("grad.", 0) == 0) return true;
  const std::size_t dot = name.rfind('.');
  return dot != std::string::npos && name.compare(dot + 1, 5, "grad_") == 0;
}

void check_model_gradients(const om::Model<mp50>& m, const std::vector<index_t>& ids, index_t B, index_t Tn,
                           const io::TensorMap& inputs, const io::TensorMap& outputs, const CompareOptions& opt,
                           CompareReport& rep, std::set<std::string>& checked,
                           std::map<std::string, std::string>& step_of) {
  std::vector<std::string> names;
  for (const auto& [n, t] : outputs) {
    (void)t;
    if (is_model_gradient_name(n)) names.push_back(n);
  }
  const auto gl = inputs.find("grad_logits");
  if (names.empty()) {
    if (gl != inputs.end())
      rep.notes.push_back("input 'grad_logits' given but the outputs hold no gradient tensor (grad.<parameter>, "
                          "grad_state, grad_embeddings, <sublayer>.grad_*): no gradient was checked");
    return;
  }
  const om::ModelConfig& cfg = m.config();
  OASIS_REQUIRE(gl != inputs.end(), "grad_logits", "the gradient tensors (", names.front(),
                ", ...) are checked from the implementation's own dL/dlogits: provide input tensor 'grad_logits' ",
                shape_str(Shape{B, Tn, cfg.vocab_size}));
  const Tensor<double>& dl = gl->second.values;
  OASIS_REQUIRE(dl.shape() == (Shape{B, Tn, cfg.vocab_size}), "grad_logits", "shape ", shape_str(dl.shape()),
                " is not [B, T, vocab] = ", shape_str(Shape{B, Tn, cfg.vocab_size}));
  for (index_t i = 0; i < dl.size(); ++i)
    OASIS_REQUIRE(std::isfinite(dl[i]), "grad_logits", "entry ", i, " is not finite");
  om::require_backward_support(cfg);
  const om::ModelGrads<mp50> hp = om::model_backward(m, ids, B, Tn, dl.cast<mp50>());
  std::map<io::DType, bool> need;
  for (const std::string& n : names) {
    const Tensor<mp50>* t = find_gradient(hp, n);
    OASIS_REQUIRE(t, n, "is not a gradient tensor of this model; known: ", known_names(hp));
    OASIS_REQUIRE(!t->empty(), n, "is not defined for this configuration (",
                  cfg.attn_res() ? "this sublayer has no such router tensor" : "the original backbone has no routers",
                  ")");
    const io::DType d = outputs.at(n).dtype;
    OASIS_REQUIRE(d == io::DType::f32 || d == io::DType::f64, n, "is stored in ", io::safetensors_name(d),
                  ": model-level gradients are checked in F32 or F64 only (the parity rule needs a plain replay in "
                  "the tensor's precision)");
    need[d] = true;
  }
  Replays<float> ref32;
  Replays<double> ref64;
  if (need.count(io::DType::f32)) ref32 = replays(m.cast<float>(), ids, B, Tn, dl.cast<float>());
  if (need.count(io::DType::f64)) ref64 = replays(m.cast<double>(), ids, B, Tn, dl);
  const index_t N = B * Tn;
  for (const std::string& n : names) {
    const io::StoredTensor& got = outputs.at(n);
    const Tensor<mp50>& h = *find_gradient(hp, n);
    rep.tensors.push_back(got.dtype == io::DType::f64 ? parity_rows(n, got, replay_tensors(ref64, n), h, N, opt.show)
                                                      : parity_rows(n, got, replay_tensors(ref32, n), h, N, opt.show));
    checked.insert(n);
  }
  checked.insert("grad_logits");
  std::vector<StepVerdict> verdicts;
  check_router_backward_steps(m, N, outputs, opt, rep, step_of, verdicts);
  check_sublayer_backward_steps(m, B, Tn, outputs, opt, rep, step_of, verdicts);
  note_first_wrong_step(std::move(verdicts), rep);
  rep.notes.push_back("gradients: end-to-end parity per row against the oracle's backward from grad_logits, replayed in "
                      "the tensor's precision six times (rounding to nearest, upward, downward; grad_logits whole "
                      "and split) (docs/verify-model.md, \"Model gradients\")");
}

}  // namespace oasis::verify::detail
