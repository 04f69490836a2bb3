// src/verify/op_varlen.cpp — ops attention and attention_backward with option layout "thd": packed
// variable-length sequences (oasis/ops/varlen.hpp; docs/verify.md, "Packed (THD) and paged
// layouts"). Each sequence is checked as the dense op's call of B = 1 in layout bthd (the packed
// rows of a sequence are exactly that tensor), through the op's own run function; the reports fold
// into one on the packed tensors (layout_fold.hpp).
//
// The null logits' gradient of a packed backward, [H] summed over every sequence (FlashAttention
// varlen's dsink), is a sum over the rows of several dense calls: the dense bound of such a sum
// counts the rows of every batch element at once (its summation term), which the per-sequence
// bounds do not compose to. So it is checked on one padded dense call of B = the sequences: each
// sequence's rows and keys padded to the longest, every sequence's own visibility (its key count,
// causal bottom-right within it, its window) given as a 0 / -inf bias, padded rows fully masked
// with zero cotangents (their terms are exactly 0). The bound is the dense one over B max_Tq rows,
// looser than the packed rows need only in the summation term's count. The stored out and lse are
// not passed to it (the dense call recomputes its forward: D's error is then the forward's own).
// Given per sequence, [B, H] (each row a sequence's partial sum), it is checked with the sequences.
#include <algorithm>
#include <limits>
#include <string>

#include "layout_fold.hpp"
#include "op_layouts.hpp"
#include "oasis/ops/varlen.hpp"

namespace oasis::verify::detail {
namespace {

std::vector<index_t> offsets(const TensorMap& in, const std::string& name) {
  const Tensor<index_t> t = integer_input(in, name, 1, "[B + 1] (layout thd)");
  return t.storage();
}

/// What a packed call of either op shares: refused options and inputs, the offsets, the options.
struct Packed {
  std::vector<index_t> cu_q, cu_k;
  io::json::Value dense;  ///< the options of a sequence's dense call (layout bthd)
  AttentionOptions opt;   ///< the options, for check_varlen_args
  VarlenShape s;
};

Packed packed_call(const OpCall& c, const std::string& op) {
  const TensorMap& in = c.inputs;
  OASIS_REQUIRE(c.compare.sample == 0, "sample", "op ", op, " with layout thd checks every row (sampling is offered for the dense layouts)");
  OASIS_REQUIRE(!c.options.has("key_lengths"), "key_lengths", "layout thd takes the key lengths from cu_seqlens_k");
  for (const char* x : {"bias", "mask"})
    OASIS_REQUIRE(!maybe(in, x), x, "layout thd takes no additive bias or mask (its [Tq, Tk] differs per sequence)");
  for (const char* x : {"k_cache", "v_cache", "block_table", "seq_lens"})
    OASIS_REQUIRE(!maybe(in, x), x, "layout thd takes packed k and v, not a paged cache");
  const StoredTensor &q = need(in, "q", op), &k = need(in, "k", op), &v = need(in, "v", op);
  Packed p;
  p.cu_q = offsets(in, "cu_seqlens_q");
  p.cu_k = offsets(in, "cu_seqlens_k");
  p.dense = dense_options(c.options, {"layout"}, {{"layout", json_string("bthd")}});
  p.opt = attention_call_options(Options(&p.dense), in);
  p.opt.layout = AttentionLayout::bhtd;  // the packed call's AttentionOptions keep the default
  p.s = check_varlen_args(q.values, k.values, v.values, p.cu_q, p.cu_k, p.opt);
  return p;
}

/// Sequence i's rows and keys.
struct Seq {
  index_t q0, tq, k0, tk;
};
Seq seq(const Packed& p, index_t i) {
  const std::size_t ii = static_cast<std::size_t>(i);
  return {p.cu_q[ii], p.cu_q[ii + 1] - p.cu_q[ii], p.cu_k[ii], p.cu_k[ii + 1] - p.cu_k[ii]};
}

/// The dense inputs of sequence i: q, k, v (a sequence without keys: one zero key, masked by the
/// options' key_lengths = [0]), null_logits as given, and the row-wise inputs `rows` ([total_q, ...])
/// and `stats` ([H, total_q]) cut to its rows.
TensorMap sequence_inputs(const TensorMap& in, const Seq& q, const std::vector<std::string>& rows,
                          const std::vector<std::string>& stats) {
  TensorMap m;
  const StoredTensor &k = in.at("k"), &v = in.at("v");
  m["q"] = stored(in.at("q"), oasis::detail::packed_rows(in.at("q").values, q.q0, q.tq));
  m["k"] = stored(k, oasis::detail::keys_or_dummy(k.values, q.k0, q.tk));
  m["v"] = stored(v, oasis::detail::keys_or_dummy(v.values, q.k0, q.tk));
  if (const StoredTensor* nl = maybe(in, "null_logits")) m["null_logits"] = *nl;
  for (const std::string& r : rows)
    if (const StoredTensor* x = maybe(in, r)) m[r] = stored(*x, oasis::detail::packed_rows(x->values, q.q0, q.tq));
  for (const std::string& r : stats)
    if (const StoredTensor* x = maybe(in, r)) m[r] = stored(*x, oasis::detail::packed_stat(x->values, q.q0, q.tq));
  return m;
}

io::json::Value sequence_options(const Packed& p, const Seq& q) {
  if (q.tk > 0) return p.dense;
  io::json::Value o = p.dense;
  o.members.emplace_back("key_lengths", json_integers({0}));
  return o;
}

/// The padded dense call that judges grad_null_logits [H] summed over the sequences (see the top).
CompareReport padded_null_gradient(const OpCall& c, const Packed& p, const StoredTensor& gn, const DenseRun& dense) {
  const TensorMap& in = c.inputs;
  const VarlenShape& s = p.s;
  index_t mq = 1, mk = 1;
  for (index_t i = 0; i < s.B; ++i) mq = std::max(mq, seq(p, i).tq), mk = std::max(mk, seq(p, i).tk);
  const double ninf = -std::numeric_limits<double>::infinity();
  auto rows = [&](const std::string& name, index_t width, bool keys) {  // [total, heads, w] -> [B, max, heads, w]
    const StoredTensor& x = in.at(name);
    const index_t heads = x.values.dim(1), m = keys ? mk : mq;
    Tensor<double> t({s.B, m, heads, width});
    for (index_t i = 0; i < s.B; ++i) {
      const Seq q = seq(p, i);
      const index_t r0 = keys ? q.k0 : q.q0, n = keys ? q.tk : q.tq;
      for (index_t r = 0; r < n; ++r)
        for (index_t e = 0; e < heads * width; ++e) t[((i * m + r) * heads) * width + e] = x.values[(r0 + r) * heads * width + e];
    }
    return stored(x, std::move(t));
  };
  auto stat = [&](const std::string& name) {  // [H, total_q] -> [B, H, max_q]
    const StoredTensor& x = in.at(name);
    Tensor<double> t({s.B, s.H, mq});
    for (index_t i = 0; i < s.B; ++i)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t r = 0; r < seq(p, i).tq; ++r) t((i), h, r) = x.values(h, seq(p, i).q0 + r);
    return stored(x, std::move(t));
  };
  TensorMap ins;
  ins["q"] = rows("q", s.d_h, false);
  ins["k"] = rows("k", s.d_h, true);
  ins["v"] = rows("v", s.d_v, true);
  ins["grad_out"] = rows("grad_out", s.d_v, false);
  for (const char* x : {"grad_lse", "grad_p_null"})
    if (maybe(in, x)) ins[x] = stat(x);
  if (const StoredTensor* nl = maybe(in, "null_logits")) ins["null_logits"] = *nl;
  Tensor<double> bias({s.B, 1, mq, mk}, ninf);
  for (index_t i = 0; i < s.B; ++i) {
    const Seq q = seq(p, i);
    for (index_t t = 0; t < q.tq; ++t) {
      const online::KeySpan<index_t> span = online::key_span<index_t>(q.tk, p.opt.causal, p.opt.window, t, q.tq, q.tk);
      for (index_t j = span.begin; j < span.end; ++j) bias(i, index_t(0), t, j) = 0.0;
    }
  }
  ins["bias"] = {io::DType::f32, std::move(bias)};
  io::json::Value o = dense_options(Options(&p.dense), {"causal", "window"}, {});
  const Options oo(&o);
  CompareReport r = dense(OpCall{ins, {{"grad_null_logits", gn}}, oo, c.compare});
  r.notes.push_back("grad_null_logits [H] summed over " + std::to_string(s.B) +
                    " sequences: checked as one dense call of the sequences padded to " + std::to_string(mq) +
                    " rows and " + std::to_string(mk) + " keys (each one's visibility as a 0 / -inf bias)");
  return r;
}

std::string parts_of(const Packed& p) {
  return std::to_string(p.s.B) + " sequences, each checked as a dense call of B = 1";
}

}  // namespace

bool thd_layout(const Options& o) { return o.has("layout") && o.string("layout", "") == "thd"; }

CompareReport thd_attention(const OpCall& c, const DenseRun& dense) {
  const TensorMap& out = c.outputs;
  const Packed p = packed_call(c, "attention");
  const VarlenShape& s = p.s;
  OASIS_REQUIRE(!out.count("probs"), "probs", "layout thd has no probability matrix (its [Tq, Tk] differs per sequence)");
  ReportFold fold(out, c.compare.show);
  const bool has_out = placed(out, "out", {s.total_q, s.H, s.d_v}, fold);
  const bool has_lse = placed(out, "lse", {s.H, s.total_q}, fold), has_pn = placed(out, "p_null", {s.H, s.total_q}, fold);
  for (index_t i = 0; i < s.B && (has_out || has_lse || has_pn); ++i) {
    const Seq q = seq(p, i);
    if (q.tq == 0) continue;
    const TensorMap ins = sequence_inputs(c.inputs, q, {}, {});
    TensorMap outs;
    std::map<std::string, PartPlace> where;
    if (has_out) {
      outs["out"] = stored(out.at("out"), oasis::detail::packed_rows(out.at("out").values, q.q0, q.tq));
      where["out"] = contiguous_part(outs["out"].values.shape(), q.q0 * s.H * s.d_v);
    }
    for (const std::string n : {"lse", "p_null"})
      if (n == "lse" ? has_lse : has_pn) {
        outs[n] = stored(out.at(n), oasis::detail::packed_stat(out.at(n).values, q.q0, q.tq));
        where[n] = stat_part(s.H, s.total_q, q.q0, q.tq);
      }
    const io::json::Value o = sequence_options(p, q);
    const Options oo(&o);
    fold.add(dense(OpCall{ins, outs, oo, fold.part_options(c.compare)}), "sequence " + std::to_string(i), where);
  }
  return fold.finish(parts_of(p));
}

CompareReport thd_attention_backward(const OpCall& c, const DenseRun& dense) {
  const std::string op = "attention_backward";
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Packed p = packed_call(c, op);
  const VarlenShape& s = p.s;
  const StoredTensor& dout = need(in, "grad_out", op);
  const StoredTensor *dlse = maybe(in, "grad_lse"), *dpn = maybe(in, "grad_p_null");
  check_varlen_cotangents(s, p.opt, AttentionCotangents<double>{dout.values, dlse ? need(in, "grad_lse", op).values : Tensor<double>(),
                                                                dpn ? need(in, "grad_p_null", op).values : Tensor<double>()});
  const Shape rows{s.total_q, s.H, s.d_v}, stats{s.H, s.total_q};
  if (const StoredTensor* x = maybe(in, "out"))
    OASIS_REQUIRE(need(in, "out", op).values.shape() == rows, "out", "shape ", shape_str(x->values.shape()),
                  " is not the packed output's [total_q, H, d_v] = ", shape_str(rows));
  if (const StoredTensor* x = maybe(in, "lse"))
    OASIS_REQUIRE(need(in, "lse", op).values.shape() == stats, "lse", "shape ", shape_str(x->values.shape()),
                  " is not the packed statistics' [H, total_q] = ", shape_str(stats), " (head-major, FlashAttention-2 varlen)");
  OASIS_REQUIRE(!out.count("grad_bias"), "grad_bias", "layout thd takes no bias");
  ReportFold fold(out, c.compare.show);
  const bool gq = placed(out, "grad_q", {s.total_q, s.H, s.d_h}, fold);
  const bool gk = placed(out, "grad_k", {s.total_k, s.H_kv, s.d_h}, fold), gv = placed(out, "grad_v", {s.total_k, s.H_kv, s.d_v}, fold);
  // grad_null_logits: [B, H] per sequence, or [H] when at most one sequence has queries
  index_t with_rows = 0;
  for (index_t i = 0; i < s.B; ++i) with_rows += seq(p, i).tq > 0 ? 1 : 0;
  const StoredTensor* gn = out.count("grad_null_logits") ? &out.at("grad_null_logits") : nullptr;
  OASIS_REQUIRE(!gn || p.opt.normalizer == RowNorm::softmax1, "grad_null_logits",
                "grad_null_logits given but the normaliser is softmax (no null logit)");
  const bool gn_rows = gn && gn->values.shape() == Shape{s.B, s.H};
  const bool gn_sum = gn && !gn_rows && gn->values.shape() == Shape{s.H};
  if (gn && !gn_rows && !gn_sum) fold.whole(shape_mismatch("grad_null_logits", *gn, {s.B, s.H}));
  if (gn_sum && with_rows > 1) {  // one padded dense call (see the top)
    const CompareReport padded = padded_null_gradient(c, p, *gn, dense);
    fold.add(padded, "the padded sequences", {{"grad_null_logits", contiguous_part({s.H}, 0)}});
  }
  const bool gn_each = gn_rows || (gn_sum && with_rows <= 1);
  for (index_t i = 0; i < s.B; ++i) {
    const Seq q = seq(p, i);
    const std::string label = "sequence " + std::to_string(i);
    if (q.tq == 0) {  // no query sees these keys; the sequence's null-logit partial is an empty sum
      for (const std::string n : {"grad_k", "grad_v"})
        if ((n == "grad_k" ? gk : gv) && q.tk > 0) {
          const StoredTensor part = stored(out.at(n), oasis::detail::packed_rows(out.at(n).values, q.k0, q.tk));
          const index_t w = out.at(n).values.dim(1) * out.at(n).values.dim(2);
          fold.add(zero_report(n, part, c.compare.show, "keys no query sees"), label, {{n, contiguous_part(part.values.shape(), q.k0 * w)}});
        }
      if (gn_rows || (gn_sum && with_rows == 0)) {
        Tensor<double> row({s.H});
        for (index_t h = 0; h < s.H; ++h) row[h] = gn->values[(gn_rows ? i * s.H : 0) + h];
        if (gn_rows || i == 0)
          fold.add(zero_report("grad_null_logits", stored(*gn, row), c.compare.show, "a sequence without queries"), label,
                   {{"grad_null_logits", contiguous_part({s.H}, gn_rows ? i * s.H : 0)}});
      }
      continue;
    }
    const TensorMap ins = sequence_inputs(in, q, {"grad_out", "out"}, {"grad_lse", "grad_p_null", "lse"});
    TensorMap outs;
    std::map<std::string, PartPlace> where;
    if (gq) {
      outs["grad_q"] = stored(out.at("grad_q"), oasis::detail::packed_rows(out.at("grad_q").values, q.q0, q.tq));
      where["grad_q"] = contiguous_part(outs["grad_q"].values.shape(), q.q0 * s.H * s.d_h);
    }
    for (const std::string n : {"grad_k", "grad_v"})
      if ((n == "grad_k" ? gk : gv) && q.tk > 0) {
        outs[n] = stored(out.at(n), oasis::detail::packed_rows(out.at(n).values, q.k0, q.tk));
        where[n] = contiguous_part(outs[n].values.shape(), q.k0 * out.at(n).values.dim(1) * out.at(n).values.dim(2));
      }
    if (gn_each) {
      Tensor<double> row({s.H});
      for (index_t h = 0; h < s.H; ++h) row[h] = gn->values[(gn_rows ? i * s.H : 0) + h];
      outs["grad_null_logits"] = stored(*gn, row);
      where["grad_null_logits"] = contiguous_part({s.H}, gn_rows ? i * s.H : 0);
    }
    if (outs.empty()) continue;
    const io::json::Value o = sequence_options(p, q);
    const Options oo(&o);
    fold.add(dense(OpCall{ins, outs, oo, fold.part_options(c.compare)}), label, where);
  }
  return fold.finish(parts_of(p));
}

}  // namespace oasis::verify::detail
