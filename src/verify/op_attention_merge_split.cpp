// src/verify/op_attention_merge_split.cpp — op attention_merge, form B: a split-KV kernel judged
// split by split and at the merge (docs/verify.md, "The split-KV merge"). Nothing is bounded here:
// split i (keys [i split_size, (i + 1) split_size)) is op attention's check of plain-softmax attention
// whose visible keys are also restricted to the split (a bias of -inf outside it, added to the
// call's own bias and mask), its LSE over those keys in the base of parts_lse_base (with sink_in
// "split0", split 0 is Softmax1 attention with the null logit, its LSE with the null); the merged
// out, lse, p_null are op attention's check on the full inputs. The splits' reports are folded into
// one per tensor (out_parts, lse_parts) as the packed layouts' are (layout_fold.hpp): the listed
// elements and the heat map's cells at [i, ...] of the partials.
#include <algorithm>
#include <cmath>
#include <limits>

#include "layout_fold.hpp"
#include "lse_convention.hpp"
#include "ops.hpp"
#include "oasis/ops/attention.hpp"

namespace oasis::verify::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

io::json::Value string_value(const std::string& s) {
  io::json::Value v;
  v.kind = io::json::Value::Kind::string;
  v.text = s;
  return v;
}

/// The call's options without the merge's own keys (and without `drop`), with normalizer and
/// lse_base set: the options of one attention check.
io::json::Value attention_options(const Options& o, const std::vector<std::string>& drop, const std::string& normalizer,
                                  const std::string* lse_base) {
  io::json::Value v;
  v.kind = io::json::Value::Kind::object;
  for (const std::string& k : o.keys()) {
    if (k == "split_size" || k == "parts_lse_base" || k == "sink_in" || (lse_base && k == "lse_base")) continue;
    if (std::find(drop.begin(), drop.end(), k) != drop.end()) continue;
    v.members.emplace_back(k, *o.get(k));
  }
  v.members.emplace_back("normalizer", string_value(normalizer));
  if (lse_base) v.members.emplace_back("lse_base", string_value(*lse_base));
  return v;
}

/// Split i of tensor t [S, ...]: its slice [...].
StoredTensor slice(const StoredTensor& t, index_t i) {
  const Shape rest(t.values.shape().begin() + 1, t.values.shape().end());
  const index_t n = shape_numel(rest);
  const double* p = t.values.data() + i * n;
  return {t.dtype, Tensor<double>(rest, std::vector<double>(p, p + n))};
}

/// The call's bias (bias and mask combined) with -inf outside keys [begin, end).
Tensor<double> split_bias(const AttentionOptions& a, const AttentionShape& s, index_t begin, index_t end) {
  Tensor<double> b = a.bias.empty() ? Tensor<double>({s.Tq, s.Tk}) : a.bias;
  for (index_t i = 0; i < b.size(); ++i) {
    const index_t j = i % s.Tk;
    if (j < begin || j >= end) b[i] = -kInf;
  }
  return b;
}

/// Whether row (b, h, t) sees a key of [begin, end) (visible and not masked by the bias).
bool sees(const AttentionOptions& a, const AttentionShape& s, index_t b, index_t h, index_t t, index_t begin, index_t end) {
  const KeyRange kr = visible_range(s, a, b, t);
  for (index_t j = std::max(kr.begin, begin); j < std::min(kr.end, end); ++j)
    if (!std::isinf(attention_bias(a, b, h, t, j))) return true;
  return false;
}


/// Split i's report of op attention, its tensors renamed to the kernel's [S, ...] partials
/// ("out" -> "out_parts"), so that ReportFold places them at [i, ...].
CompareReport as_parts(CompareReport r) {
  for (TensorReport& t : r.tensors) {
    const std::string to = t.name + "_parts";
    for (std::vector<std::string>* v : {&t.first_mismatches, &t.first_undecided})
      for (std::string& line : *v)
        if (line.rfind(t.name + "[", 0) == 0) line = to + line.substr(t.name.size());
    t.name = to;
  }
  return r;
}

}  // namespace

CompareReport attention_merge_split_report(const OpCall& call, const std::string& sink_in, bool parts_base2) {
  const TensorMap &in = call.inputs, &out = call.outputs;
  const Options& o = call.options;
  const std::string op = "attention_merge";
  OASIS_REQUIRE(o.has("split_size"), "split_size", "form B (q, k, v given) needs option split_size: the keys per split, "
                "split i holding keys [i split_size, (i + 1) split_size)");
  const double ssd = o.number("split_size", 0.0);
  OASIS_REQUIRE(ssd >= 1 && ssd == std::floor(ssd) && ssd < 9.0e15, "split_size", "must be a positive integer, got ", ssd);
  const StoredTensor &q = need(in, "q", op), &k = need(in, "k", op), &v = need(in, "v", op);
  (void)lse_convention(o);  // lse_null, lse_base: an unknown value is an error even when only the partials are judged
  const AttentionOptions a = attention_call_options(o, in);
  const AttentionShape s = check_attention_args(q.values, k.values, v.values, a);
  OASIS_REQUIRE(s.Tk >= 1, "k", "holds no key (Tk = 0): nothing to split");
  OASIS_REQUIRE(sink_in != "none" || a.null_logits.empty(), "null_logits",
                "given but sink_in is \"none\" (plain softmax: no null category)");
  for (double x : a.null_logits)
    OASIS_REQUIRE(sink_in != "split0" || !(x > 0 && std::isinf(x)), "null_logits",
                  "+inf with sink_in \"split0\": split 0's LSE would be +inf (give sink_in \"merge\")");
  const index_t ss = static_cast<index_t>(ssd), S = (s.Tk + ss - 1) / ss;
  const bool bthd = a.layout == AttentionLayout::bthd;
  const Shape out_shape = bthd ? Shape{S, s.B, s.Tq, s.H, s.d_v} : Shape{S, s.B, s.H, s.Tq, s.d_v};
  const Shape lse_shape{S, s.B, s.H, s.Tq};
  const std::string parts_base = parts_base2 ? "2" : "e";

  CompareReport rep;
  rep.op = op;
  const StoredTensor* got_out = maybe(out, "out_parts");
  const StoredTensor* got_lse = maybe(out, "lse_parts");
  if (got_out && got_out->values.shape() != out_shape) {
    rep.tensors.push_back(shape_mismatch("out_parts", *got_out, out_shape));
    got_out = nullptr;
  }
  if (got_lse && got_lse->values.shape() != lse_shape) {
    rep.tensors.push_back(shape_mismatch("lse_parts", *got_lse, lse_shape));
    got_lse = nullptr;
  }
  std::string oracle;
  if (got_out || got_lse) {
    // the splits' reports folded as the packed layouts' (layout_fold.hpp): counts summed, every
    // listed element and the heat map's cells placed at [i, ...] of the partials
    TensorMap parts;
    if (got_out) parts["out_parts"] = *got_out;
    if (got_lse) parts["lse_parts"] = *got_lse;
    ReportFold fold(parts, call.compare.show);
    const Shape out_split(out_shape.begin() + 1, out_shape.end()), lse_split(lse_shape.begin() + 1, lse_shape.end());
    TensorMap sin = {{"q", q}, {"k", k}, {"v", v}};
    for (index_t i = 0; i < S; ++i) {
      const index_t begin = i * ss, end = std::min(s.Tk, begin + ss);
      const bool sink = sink_in == "split0" && i == 0;
      sin["bias"] = StoredTensor{DType::f64, split_bias(a, s, begin, end)};
      if (sink && maybe(in, "null_logits")) sin["null_logits"] = in.at("null_logits");
      else sin.erase("null_logits");
      TensorMap sout;
      if (got_out) {
        // a split without a visible key contributes nothing: its out is not read (form A's rule), so
        // it is judged as the documented zero whatever the kernel left there (NaN included)
        StoredTensor o_i = slice(*got_out, i);
        for (index_t b = 0; b < s.B; ++b)
          for (index_t h = 0; h < s.H; ++h) {
            const double sh = a.null_logits.empty() ? 0.0 : a.null_logits[static_cast<std::size_t>(h)];
            if (sink && sh > -kInf) continue;  // Softmax1: its out is 0 exactly, judged as written
            for (index_t t = 0; t < s.Tq; ++t) {
              if (sees(a, s, b, h, t, begin, end)) continue;
              const index_t off = bthd ? ((b * s.Tq + t) * s.H + h) * s.d_v : ((b * s.H + h) * s.Tq + t) * s.d_v;
              for (index_t x = 0; x < s.d_v; ++x) o_i.values[off + x] = 0.0;
            }
          }
        sout["out"] = std::move(o_i);
      }
      if (got_lse) sout["lse"] = slice(*got_lse, i);
      const io::json::Value ov = attention_options(o, sink ? std::vector<std::string>{"lse_null"}
                                                           : std::vector<std::string>{"lse_null", "null_logits"},
                                                   sink ? "softmax1" : "softmax", &parts_base);
      const Options so(&ov);
      const CompareReport r = attention_op().run(OpCall{sin, sout, so, fold.part_options(call.compare)});
      for (const std::string& n : r.notes) rep.notes.push_back("split " + std::to_string(i) + ": " + n);
      if (oracle.empty()) oracle = r.oracle.substr(0, r.oracle.find(' '));
      CompareReport named = as_parts(r);
      named.notes.clear();
      fold.add(named, "split " + std::to_string(i),
               {{"out_parts", contiguous_part(out_split, i * shape_numel(out_split))},
                {"lse_parts", contiguous_part(lse_split, i * shape_numel(lse_split))}});
    }
    CompareReport folded = fold.finish("per split");
    std::stable_sort(folded.tensors.begin(), folded.tensors.end(),  // the kernel's order: out, then lse
                     [](const TensorReport& x, const TensorReport& y) { return x.name == "out_parts" && y.name != x.name; });
    for (TensorReport& t : folded.tensors) {
      t.bound += "; per split, as op attention";
      rep.tensors.push_back(std::move(t));
    }
    rep.mp50_rows += folded.mp50_rows;
    rep.mp50_work += folded.mp50_work;
  }
  TensorMap fout;
  for (const char* n : {"out", "lse", "p_null"})
    if (out.count(n)) fout[n] = out.at(n);
  if (!fout.empty()) {
    const io::json::Value ov = attention_options(o, {}, sink_in == "none" ? "softmax" : "softmax1", nullptr);
    const Options fo(&ov);
    CompareReport r = attention_op().run(OpCall{in, fout, fo, call.compare});
    for (TensorReport& t : r.tensors) rep.tensors.push_back(std::move(t));
    for (const std::string& n : r.notes) rep.notes.push_back("merged: " + n);
    rep.mp50_rows += r.mp50_rows;
    rep.mp50_work += r.mp50_work;
    if (oracle.empty()) oracle = r.oracle.substr(0, r.oracle.find(' '));
  }
  rep.oracle = oracle + " (op attention's, for each of the " + std::to_string(S) + " splits and for the merge; " +
               std::to_string(rep.mp50_rows) + " rows recomputed in mp50)";
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

}  // namespace oasis::verify::detail
