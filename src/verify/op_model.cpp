// src/verify/op_model.cpp — the model level (op "model", check_model; docs/verify.md "Model level").
//
// The weights and the configuration come from a file written by oasis::model::save_model (or by
// hand, oasis/model/io.hpp). A PASS means that every trace tensor is what the configured model
// computes from the tensors the trace holds (SPEC §8): each tensor is checked against its
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
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "engine.hpp"
#include "model_checker.hpp"
#include "op_model_grad.hpp"
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

double store_bf16(double x) { return io::round_to_dtype(x, DType::bf16); }
double store_f16(double x) { return io::round_to_dtype(x, DType::f16); }

/// Token ids [B, T]: exact integers in [0, vocab) in any dtype (i32, i64 or a float dtype).
std::vector<index_t> read_ids(const TensorMap& inputs, index_t vocab, index_t& B, index_t& Tn) {
  const auto it = inputs.find("ids");
  OASIS_REQUIRE(it != inputs.end(), "inputs", "op model needs input tensor 'ids' [B, T] (token ids; the inputs hold: ",
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
std::string unknown_name_message(const std::string& name, const ModelChecker& ck) {
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

/// The end-to-end verdict of `name` (logits or state): row parity against the replays.
TensorReport end_to_end(const std::string& name, const StoredTensor& got, const om::Model<mp50>& m,
                        const std::vector<index_t>& ids, index_t B, index_t Tn, const CompareOptions& opt) {
  const DType D = got.dtype;
  const bool wide = D == DType::f64;
  om::ForwardOptions fo;
  fo.trace = true;
  fo.store = D == DType::bf16 ? store_bf16 : D == DType::f16 ? store_f16 : nullptr;
  // The plain reference in the implementation's precision, its trace (for the floor), and mp50.
  Tensor<double> x_ref;
  TensorMap replay;
  if (wide) {
    const om::ForwardResult<double> r = m.cast<double>().forward(ids, B, Tn, fo);
    x_ref = name == "logits" ? r.logits : r.state;
    replay = om::trace_tensors(r, D);
  } else {
    const om::ForwardResult<float> r = m.cast<float>().forward(ids, B, Tn, fo);
    x_ref = (name == "logits" ? r.logits : r.state).cast<double>();
    replay = om::trace_tensors(r, D);
  }
  const om::ForwardResult<mp50> hp = m.forward(ids, B, Tn);
  const Tensor<mp50>& x_hp = name == "logits" ? hp.logits : hp.state;
  ModelChecker rc(m, replay, ids, B, Tn);
  const Tensor<double> e_last = scaled(name == "logits" ? rc.expected("logits", replay.at("logits"), wide).e
                                                        : rc.readout_step(wide).e.reshaped(x_hp.shape()),
                                       D);

  if (got.values.shape() != x_hp.shape())
    return tensor_failure(
        name, got, "shape " + shape_str(got.values.shape()) + " but the model's " + name + " has shape " + shape_str(x_hp.shape()),
        true);
  TensorReport t;
  t.name = name;
  t.dtype = D;
  t.shape = got.values.shape();
  t.elements = got.values.size();
  const index_t w = x_hp.shape().back(), rows = x_hp.size() / w;
  for (index_t r = 0; r < rows; ++r) {
    double e_ref = 0, hmax = 0, elast = 0, e_x = 0;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = r * w + c;
      const double h = static_cast<double>(x_hp[i]);
      e_ref = std::max(e_ref, static_cast<double>(abs(mp50(x_ref[i]) - x_hp[i])));
      hmax = std::max(hmax, std::abs(h));
      elast = std::max(elast, e_last[i]);
    }
    const double allowed = 2.0 * e_ref + 0.5 * io::dtype_ulp(D, hmax) + 2.0 * elast;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = r * w + c;
      const double x = got.values[i], h = static_cast<double>(x_hp[i]);
      const double err = std::isfinite(x) ? static_cast<double>(abs(mp50(x) - x_hp[i])) : INFINITY;
      e_x = std::max(e_x, err);
      t.max_abs = std::max(t.max_abs, err);
      if (h != 0) t.max_rel = std::max(t.max_rel, err / std::abs(h));
      t.max_ulps = std::max(t.max_ulps, err / io::dtype_ulp(D, h));
      if (!(err <= allowed)) {
        if (t.violations < opt.show) {
          Shape ix(t.shape.size());
          index_t f = i;
          for (std::size_t k = ix.size(); k-- > 0;) { ix[k] = f % t.shape[k]; f /= t.shape[k]; }
          char buf[256];
          std::snprintf(buf, sizeof buf, ": got %.9g oracle %.9g |err| %.9g allowed %.9g (2 x replay row error %.3g + floor %.3g)",
                        x, h, err, allowed, e_ref, allowed - 2.0 * e_ref);
          t.first_mismatches.push_back(name + shape_str(ix) + buf);
        }
        ++t.violations;
      }
    }
    t.worst_ratio = std::max(t.worst_ratio, allowed > 0 ? e_x / allowed : (e_x > 0 ? INFINITY : 0.0));
  }
  t.passed = t.violations == 0;
  return t;
}

CompareReport run_model(const om::Model<mp50>& m, const TensorMap& inputs, const TensorMap& outputs,
                        const CompareOptions& opt) {
  index_t B = 0, Tn = 0;
  const std::vector<index_t> ids = read_ids(inputs, m.config().vocab_size, B, Tn);
  ModelChecker ck(m, outputs, ids, B, Tn);

  // Every name is known (a misspelt name must not silently check nothing); only ids are integers.
  for (const TensorMap* set : {&outputs, &inputs})
    for (const auto& [name, t] : *set) {
      if (name == "ids") continue;
      // the gradient tensors (outputs) and the user's dL/dlogits (an input), also seen in the other
      // set when one file holds both: op_model_grad.cpp checks their names
      if ((is_model_gradient_name(name) && outputs.count(name)) || (name == "grad_logits" && inputs.count(name)))
        continue;
      OASIS_REQUIRE(ck.shape_of(name), set == &inputs ? "inputs" : "outputs", unknown_name_message(name, ck));
      OASIS_REQUIRE(!io::is_integer(t.dtype), name, "is an integer tensor (", io::to_string(t.dtype),
                    "); only ids may be integers, trace tensors are floating point");
    }

  CompareReport rep;
  rep.op = "model";
  std::map<std::string, std::string> steps;  // checked tensor -> its producer
  for (const auto& [name, shape] : ck.names()) {
    const auto it = outputs.find(name);
    if (it == outputs.end()) continue;
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
    try {
      const Expected x = ck.expected(name, got, got.dtype == DType::f64);
      rep.tensors.push_back(compare_tensor(name, got, x.ref, scaled(x.e, got.dtype), opt.show));
      steps[name] = x.step;
    } catch (const Missing& miss) {
      OASIS_REQUIRE(name == "logits" || name == "state", miss.name, "the trace lacks it, and ", name,
                    " is checked against what the configured model computes from the tensors it reads, which needs ",
                    miss.name, " ", shape_str(miss.shape), " (provide it, or leave out ", name, ")");
      rep.tensors.push_back(end_to_end(name, got, m, ids, B, Tn, opt));
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
  std::set<std::string> gradients;
  check_model_gradients(m, ids, B, Tn, inputs, outputs, opt, rep, gradients);
  for (const auto& g : gradients) steps[g] = "the oracle's backward from the implementation's grad_logits";
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs",
                "op model checked no tensor: the outputs hold no trace tensor of this model (they hold: ", names_of(outputs),
                "); provide at least 'logits' [B, T, vocab]");
  rep.passed = true;
  for (const auto& t : rep.tensors) rep.passed = rep.passed && (t.informative || t.passed);
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
  return run_model(om::load_model<mp50>(path), inputs, outputs, opt);
}

CompareReport run_model(const om::ModelConfig& config, const TensorMap& weights, const TensorMap& inputs,
                        const TensorMap& outputs, const CompareOptions& opt) {
  return run_model(om::model_from_tensors<mp50>(config, weights, "weights"), inputs, outputs, opt);
}

}  // namespace oasis::verify::detail
