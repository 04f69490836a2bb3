// src/verify/op_model.cpp — the model level (op "model", check_model; docs/verify-model.md "Model level").
//
// The weights and the configuration come from a file written by oasis::model::save_model (or by
// hand, oasis/model/io.hpp). A PASS means that every trace tensor is what the configured model
// computes from the tensors the trace holds (docs/spec.md §8): each tensor is checked against its
// producer (model_checker.hpp) — a step on the implementation's own inputs, or a link (a router
// candidate is the wired sublayer output or block sum, a sublayer reads the wired router output,
// the candidates carry the wired psi, the state is the configured readout) — under
//   |x - ref| <= 0.5 ulp_D(ref) + 2 e(D).
// A check whose inputs need a tensor the trace lacks is an input error naming it, except for the
// readout state (without the tensors it is made of) and the logits (without `state`): they get
// the END-TO-END verdict, the backends' parity rule per token row in the infinity norm against a replay of the
// configured model from the ids in the implementation's precision (x_ref) and in mp50 (x_hp):
//   max_c |x - x_hp| <= 2 max_c |x_ref - x_hp| + floor,
//   floor = 0.5 ulp_D(max_c |x_hp|) + 2 e_last(D)   (e_last: bound of the last step, head or readout,
//                                                    on the replay's own inputs).
// Forward order of the report: per sublayer its router (Kimi: before it; authors: after it),
// input and steps, then the final router, state, logits; the first failing tensor is named in a note.
//
// The oracle (CompareOptions::oracle, docs/verify-model.md "The model level's fast oracle"): fast runs
// every producer in double (ModelCheckerOf<double>, the matrix products as blocked GEMMs), each
// value within kOwnError x its rules' bound at u = 2^-53 of the exact producer, and decides each
// element with that error folded in (TensorCheck); a tensor with an undecided element is
// recomputed in mp50 (ModelCheckerOf<mp50>, built only then). The end-to-end verdict takes the
// exact replay as the double replay x_d within E per row: its derived forward bound at u = 2^-53
// (ForwardOptions::error_u; certain), else under the probabilistic and p16 policies for a trace
// narrower than float64 the estimate 4 (max_c |x_d - x_ld| + 2^-53 max_c |x_d|) from a long double
// replay x_ld; a row left open falls back to the mp50 replay. Configurations with a norm
// evaluated in float32 (the reference itself rounds to float there, so a double reference off by
// ~2^-53 may round differently) use mp50 throughout.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "ops.hpp"
#include "model_checker.hpp"
#include "model_row_parity.hpp"
#include "op_model_grad.hpp"
#include "progress.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"

namespace oasis::verify::detail {

namespace {

namespace om = oasis::model;

Tensor<double> scaled(Tensor<double> b, DType d) {
  const double s = d == DType::f64 ? 1.0 : io::dtype_eps(d) / io::dtype_eps(DType::f32);
  for (index_t i = 0; i < b.size(); ++i) b[i] *= s;
  return b;
}

/// Safety factor on the double reference's own first-order bound (its coefficients are taken
/// from the double values, not the exact ones; second-order terms at u = 2^-53).
constexpr double kOwnError = 1.01;
/// The oracle's models: the double model always, the mp50 model only when a check needs it.
struct Models {
  om::Model<double> d;
  std::unique_ptr<om::Model<mp50>> hp;
  const om::Model<mp50>& mp() {
    if (!hp) hp = std::make_unique<om::Model<mp50>>(d.cast<mp50>());  // exact: the weights are doubles
    return *hp;
  }
};

double store_bf16(double x) { return io::round_to_dtype(x, DType::bf16); }
double store_f16(double x) { return io::round_to_dtype(x, DType::f16); }

/// Token ids [B, T]: exact integers in [0, vocab) in any dtype (i32, i64 or a float dtype).
std::vector<index_t> read_ids(const TensorMap& inputs, index_t vocab, index_t& B, index_t& Tn) {
  const auto it = inputs.find("ids");
  OASIS_REQUIRE(it != inputs.end(), "ids", "op model needs input tensor 'ids' [B, T] (token ids; the inputs hold: ",
                names_of(inputs), ")");
  const Tensor<double>& idt = it->second.values;
  require_rank(idt, 2, "ids", "[B, T]");
  OASIS_REQUIRE(idt.dim(0) > 0 && idt.dim(1) > 0, "ids", "empty batch or sequence ", shape_str(idt.shape()));
  std::vector<index_t> ids(static_cast<std::size_t>(idt.size()));
  for (index_t i = 0; i < idt.size(); ++i) {
    const double x = idt[i];
    OASIS_REQUIRE(std::isfinite(x) && x == std::floor(x) && x >= 0 && x < static_cast<double>(vocab), "ids", "entry ", i,
                  " = ", x, " is not a token id in [0, vocab_size = ", vocab, ")");
    ids[static_cast<std::size_t>(i)] = static_cast<index_t>(x);
  }
  B = idt.dim(0);
  Tn = idt.dim(1);
  return ids;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// "unknown trace tensor 'x' ... knows: ..." with the names grouped by prefix, and the prefixes
/// layers.{b}.attn / layers.{b}.mlp with equal fields grouped over b.
template <class Checker>
std::string unknown_name_message(const std::string& name, const Checker& ck) {
  std::string best;
  std::size_t best_d = 4;
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  // prefix -> fields, in order
  for (const auto& [n, s] : ck.names()) {
    (void)s;
    const std::size_t dd = edit_distance(name, n);
    if (dd < best_d) { best_d = dd; best = n; }
    const auto dot = n.rfind('.');
    const std::string prefix = dot == std::string::npos ? "" : n.substr(0, dot), field = n.substr(dot == std::string::npos ? 0 : dot + 1);
    if (groups.empty() || groups.back().first != prefix) groups.push_back({prefix, {}});
    groups.back().second.push_back(field);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> patterns;  // "layers.{b}.attn.{f..}" -> blocks
  for (const auto& [prefix, fields] : groups) {
    std::string pat = prefix, b;
    if (prefix.rfind("layers.", 0) == 0) {
      const auto dot = prefix.find('.', 7);
      b = prefix.substr(7, dot - 7);
      pat = "layers.{b}" + prefix.substr(dot);
    }
    const std::string key = (prefix.empty() ? join_names(fields) : pat + ".{" + join_names(fields) + "}");
    auto it = std::find_if(patterns.begin(), patterns.end(), [&](const auto& p) { return p.first == key; });
    if (it == patterns.end()) patterns.push_back({key, {}}), it = patterns.end() - 1;
    if (!b.empty()) it->second.push_back(b);
  }
  std::string known = "ids";
  for (const auto& [key, blocks] : patterns)
    known += ", " + key + (blocks.empty() ? "" : " for b = " + join_names(blocks));
  return "unknown trace tensor '" + name + "' for this model" + (best.empty() ? "" : " (did you mean '" + best + "'?)") +
         "; the model level knows: " + known;
}

/// The end-to-end verdict of `name` (logits or state): row parity against the replays. fast: the
/// exact replay x_hp is taken as the double replay x_d with |x_d - x_hp| <= E_r on row r, and each
/// element is decided on intervals; E_r is (1) kOwnError x the composed forward bound at u = 2^-53
/// (certain), else, under the probabilistic and p16 policies and for a trace narrower than
/// float64, (2) the estimate kLdSafety (max_c |x_d - x_ld| + 2^-53 max_c |x_d|) from a long double
/// replay x_ld (docs/verify-model.md "The model level's fast oracle"). A row left open sets `recomputed`
/// and the verdict is taken again against the mp50 replay. `oracle` receives which replay decided.
TensorReport end_to_end(const std::string& name, const StoredTensor& got, Models& ms, const std::vector<index_t>& ids,
                        index_t B, index_t Tn, const CompareOptions& opt, bool fast, bool& recomputed, std::string& oracle) {
  const DType D = got.dtype;
  const bool wide = D == DType::f64;
  const bool logits = name == "logits";
  const om::ModelConfig& cfg = ms.d.config();
  const Shape want{B, Tn, logits ? cfg.vocab_size : cfg.d_model};
  if (got.values.shape() != want)
    return tensor_failure(
        name, got, "shape " + shape_str(got.values.shape()) + " but the model's " + name + " has shape " + shape_str(want), true);
  om::ForwardOptions fo;
  fo.trace = !logits;  // the head's step (the floor of logits) reads the state only
  fo.store = D == DType::bf16 ? store_bf16 : D == DType::f16 ? store_f16 : nullptr;
  // The plain reference in the implementation's precision and its trace (for the floor).
  Tensor<double> x_ref;
  TensorMap replay;
  if (wide) {
    const om::ForwardResult<double> r = ms.d.forward(ids, B, Tn, fo);
    x_ref = logits ? r.logits : r.state;
    replay = om::trace_tensors(r, D);
  } else {
    const om::ForwardResult<float> r = ms.d.cast<float>().forward(ids, B, Tn, fo);
    x_ref = (logits ? r.logits : r.state).cast<double>();
    replay = om::trace_tensors(r, D);
  }
  const index_t w = want.back(), rows = got.values.size() / w;
  // The verdict against the double replay xd with |xd - x_hp| <= E[r] on row r; false when a row is left open.
  auto judge = [&](const Tensor<double>& xd, const std::vector<double>& E, TensorReport& t) {
    ModelCheckerOf<double> rc(ms.d, replay, ids, B, Tn);
    const Tensor<double> e_last =
        scaled(logits ? rc.expected("logits", replay.at("logits"), wide).e : rc.readout_step(wide).e.reshaped(want), D);
    return row_verdict(name, got, x_ref, xd, E, kBoundRho, e_last, w, opt, t);
  };

  if (fast) {
    Tensor<double> xd;  // the double replay
    {
      om::ForwardResult<double> hd;
      bool bounded = cfg.forward_bound_derived();
      if (bounded) {
        om::ForwardOptions fh;
        fh.error_u = kU53;
        try {
          hd = ms.d.forward(ids, B, Tn, fh);
        } catch (const invalid_argument&) {  // no forward error rule (e.g. a baseline token normaliser)
          bounded = false;
        }
      }
      if (bounded) {
        std::vector<double> E = logits ? hd.logit_error : hd.state_error;
        for (double& e : E) e *= kOwnError;
        TensorReport t = report_of(name, got);
        if (judge(logits ? hd.logits : hd.state, E, t)) {
          oracle = name + ": double replay within its worst-case bound";
          return t;
        }
        xd = logits ? std::move(hd.logits) : std::move(hd.state);
      }
    }
    if (!wide && opt.policy != Policy::worst_case) {
      if (xd.size() == 0) {
        om::ForwardResult<double> r = ms.d.forward(ids, B, Tn);
        xd = logits ? std::move(r.logits) : std::move(r.state);
      }
      Tensor<double> xld;  // the long double replay, rounded to double (an error of 2^-53 |x|, in the floor below)
      {
        progress_stage(name + ": long double replay");
        const om::ForwardResult<long double> r = ms.d.cast<long double>().forward(ids, B, Tn);
        xld = (logits ? r.logits : r.state).cast<double>();
      }
      std::vector<double> E(static_cast<std::size_t>(rows));
      for (index_t r = 0; r < rows; ++r) {
        double dmax = 0, xmax = 0;
        for (index_t c = 0; c < w; ++c) {
          const index_t i = r * w + c;
          dmax = std::max(dmax, std::abs(xd[i] - xld[i]));
          xmax = std::max(xmax, std::abs(xd[i]));
        }
        E[static_cast<std::size_t>(r)] = kLdSafety * (dmax + kU53 * xmax);
      }
      TensorReport t = report_of(name, got);
      if (judge(xd, E, t)) {
        oracle = name + ": double replay, error estimated by a long double replay";
        return t;
      }
    }
    recomputed = true;
  }
  oracle = name + ": mp50 replay";
  progress_stage(oracle);
  TensorReport t = report_of(name, got);
  const om::Model<mp50>& m = ms.mp();
  const om::ForwardResult<mp50> hp = m.forward(ids, B, Tn);
  const Tensor<mp50>& x_hp = logits ? hp.logits : hp.state;
  ModelChecker rc(m, replay, ids, B, Tn);
  const Tensor<double> e_last =
      scaled(logits ? rc.expected("logits", replay.at("logits"), wide).e : rc.readout_step(wide).e.reshaped(want), D);
  row_verdict(name, got, x_ref, x_hp, {}, 0.0, e_last, w, opt, t);
  return t;
}

/// The tensor `name` judged against a double producer with its own error folded in: false when an
/// element is left undecided (nothing pushed; the caller recomputes the tensor in mp50).
bool judge_fast(const std::string& name, const StoredTensor& got, const ExpectedOf<double>& x, bool wide,
                const CompareOptions& opt, std::vector<TensorReport>& out) {
  const Tensor<double> tol = scaled(x.e, got.dtype);
  // the double producer's own error: its rules' bound at u = 2^-53 (x.e is at the checked
  // precision's u; every rule is u times a factor nondecreasing in u, plus floors that shrink with u)
  const double own = kOwnError * (wide ? 1.0 : kU53 / io::dtype_eps(DType::f32) * 2.0);
  TensorCheck chk(name, got, opt.show);
  for (index_t i = 0; i < x.ref.size(); ++i)
    if (!std::isfinite(x.ref[i]) || !chk.add(i, RefValue{x.ref[i], 0.0, own * x.e[i]}, Allowed{2.0 * tol[i], 2.0 * tol[i], false, kBoundRho}))
      return false;
  out.push_back(chk.finish("worst-case"));
  return true;
}

CompareReport run_model(Models& ms, const TensorMap& inputs, const TensorMap& outputs, const CompareOptions& opt) {
  index_t B = 0, Tn = 0;
  const om::ModelConfig& cfg = ms.d.config();
  const std::vector<index_t> ids = read_ids(inputs, cfg.vocab_size, B, Tn);
  const bool fast = opt.oracle == Oracle::fast && fast_oracle_applies(cfg);
  ModelCheckerOf<double> ck(ms.d, outputs, ids, B, Tn);
  std::unique_ptr<ModelChecker> ckm;  // the mp50 producers, built when a tensor needs them
  auto hp = [&]() -> ModelChecker& {
    if (!ckm) ckm = std::make_unique<ModelChecker>(ms.mp(), outputs, ids, B, Tn);
    return *ckm;
  };

  // Every name is known (a misspelt name must not silently check nothing); only ids are integers.
  for (const TensorMap* set : {&outputs, &inputs})
    for (const auto& [name, t] : *set) {
      if (name == "ids") continue;
      // the gradient tensors (outputs) and the user's dL/dlogits (an input), also seen in the other
      // set when one file holds both: op_model_grad.cpp checks their names
      if ((is_model_gradient_name(name) && outputs.count(name)) || (name == "grad_logits" && inputs.count(name)))
        continue;
      OASIS_REQUIRE(ck.shape_of(name), name, unknown_name_message(name, ck));
      OASIS_REQUIRE(!io::is_integer(t.dtype), name, "is an integer tensor (", io::to_string(t.dtype),
                    "); only ids may be integers, trace tensors are floating point");
    }

  CompareReport rep;
  rep.op = "model";
  std::map<std::string, std::string> steps;  // checked tensor -> its producer
  index_t checked = 0, recomputed = 0;
  std::vector<std::string> replays;  // the end-to-end verdicts' oracles
  std::string prefix;  // of the tensors being checked: the memory held is that of one sublayer's steps
  for (const auto& [name, shape] : ck.names()) {
    const auto it = outputs.find(name);
    if (it == outputs.end()) continue;
    const std::string p = name.substr(0, name.rfind('.') == std::string::npos ? 0 : name.rfind('.'));
    if (p != prefix) {
      ck.release();
      if (ckm) ckm->release();
      prefix = p;
    }
    const StoredTensor& got = it->second;
    const std::string field = name.substr(name.rfind('.') + 1);
    if (field == "psi" && !ck.psi_used(name)) {
      rep.notes.push_back("'" + name + "' is not read by this configuration (router without coupling); not checked");
      continue;
    }
    if (got.values.shape() != shape) {
      rep.tensors.push_back(tensor_failure(
          name, got,
          "shape " + shape_str(got.values.shape()) + " but the configured model's " + name + " has shape " + shape_str(shape),
          true));
      steps[name] = "the configured model's tensor shapes";
      continue;
    }
    ++checked;
    const bool wide = got.dtype == DType::f64;
    try {
      bool decided = false;
      if (fast) {
        const ExpectedOf<double> x = ck.expected(name, got, wide);
        decided = judge_fast(name, got, x, wide, opt, rep.tensors);
        steps[name] = x.step;
      }
      if (!decided) {
        if (fast) ++recomputed;
        const Expected x = hp().expected(name, got, wide);
        rep.tensors.push_back(compare_tensor(name, got, x.ref, scaled(x.e, got.dtype), opt.show));
        steps[name] = x.step;
      }
    } catch (const Missing& miss) {
      OASIS_REQUIRE(name == "logits" || name == "state", miss.name, "the trace lacks it, and ", name,
                    " is checked against what the configured model computes from the tensors it reads, which needs ",
                    miss.name, " ", shape_str(miss.shape), " (provide it, or leave out ", name, ")");
      bool again = false;
      std::string how;
      rep.tensors.push_back(end_to_end(name, got, ms, ids, B, Tn, opt, fast, again, how));
      if (again) ++recomputed;
      replays.push_back(how);
      steps[name] = "the end-to-end replay of the configured model";
      rep.notes.push_back(name + ": end-to-end verdict (the trace lacks " + miss.name +
                          ", needed to check it from the tensors that produce it): per token row, max |x - oracle| <= 2 x the "
                          "row error of the plain replay in the trace's precision + floor (docs/verify.md); errors below "
                          "that are not seen");
    } catch (const Unusable& bad) {
      // not a proof that this tensor is wrong: the step that produced its input failed
      rep.tensors.push_back(tensor_failure(name, got, "cannot be recomputed: it reads " + bad.name + ", which " + bad.why, false));
      steps[name] = "(its input failed)";
    }
  }
  // a minimal trace: the sublayer outputs traced without their inputs also get end-to-end rows
  std::vector<std::string> e2e_names;
  for (const auto& [name, shape] : ck.names()) {
    const std::string suffix = ".output";
    if (name.rfind("layers.", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 && outputs.count(name) &&
        !outputs.count(name.substr(0, name.size() - suffix.size()) + ".input"))
      e2e_names.push_back(name);
  }
  if (!e2e_names.empty()) {
    std::string note;
    std::vector<TensorReport> rows = sublayer_end_to_end(
        ms.d, [&]() -> const om::Model<mp50>& { return ms.mp(); }, outputs, e2e_names, ids, B, Tn, opt, note);
    for (TensorReport& t : rows) {  // each right after its local row (forward order)
      const std::string local = t.name.substr(0, t.name.rfind(" (end to end)"));
      auto at = std::find_if(rep.tensors.begin(), rep.tensors.end(), [&](const TensorReport& x) { return x.name == local; });
      steps[t.name] = "the end-to-end replay of the configured model";
      rep.tensors.insert(at == rep.tensors.end() ? at : at + 1, std::move(t));
    }
    rep.notes.push_back(note);
  }
  rep.oracle = fast ? "fast (double, its own error bound folded in; " + std::to_string(recomputed) + " of " +
                          std::to_string(checked) + " tensors recomputed in mp50)"
                    : opt.oracle == Oracle::fast ? "mp50 (a norm evaluated in float32: no fast oracle)" : "mp50";
  if (fast)
    for (const auto& how : replays) rep.oracle += "; " + how;
  std::set<std::string> gradients;
  const bool any_gradient = std::any_of(outputs.begin(), outputs.end(), [](const auto& kv) { return is_model_gradient_name(kv.first); });
  if (any_gradient || inputs.count("grad_logits"))  // op_model_grad.cpp
    check_model_gradients(ms.d, [&]() -> const om::Model<mp50>& { return ms.mp(); }, ids, B, Tn, inputs, outputs, opt,
                          rep, gradients, steps);
  for (const auto& g : gradients) steps[g] = "the oracle's backward from the implementation's grad_logits";
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs",
                "op model checked no tensor: the outputs hold no trace tensor of this model (they hold: ", names_of(outputs),
                "); provide at least 'logits' [B, T, vocab]");
  rep.passed = true;
  for (auto& t : rep.tensors) {
    rep.passed = rep.passed && (t.informative || t.passed);
    t.step = steps[t.name];
  }
  progress_stage("");
  for (const auto& t : rep.tensors)
    if (!t.informative && !t.passed) {
      rep.notes.insert(rep.notes.begin(), "first wrong step (forward order): " + t.name + " — checked against " + steps[t.name]);
      break;
    }
  return rep;
}

}  // namespace

CompareReport run_model(const std::string& path, const TensorMap& inputs, const TensorMap& outputs,
                        const CompareOptions& opt) {
  Models ms{om::load_model<double>(path), nullptr};
  return run_model(ms, inputs, outputs, opt);
}

CompareReport run_model(const om::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                        const TensorMap& outputs, const CompareOptions& opt) {
  Models ms{om::model_from_tensors<double>(config, weights, "weights"), nullptr};
  return run_model(ms, inputs, outputs, opt);
}

}  // namespace oasis::verify::detail
