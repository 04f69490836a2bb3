// src/verify/op_attention.cpp — op "attention": multi-head token attention (docs/spec.md §2, §8), checked
// row by row (one row: the outputs of one (b, h, t)) with the oracles of attention_oracle.hpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "attention_oracle.hpp"
#include "op_layouts.hpp"
#include "ops.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

enum class Kind { out, lse, p_null, probs };

struct Target {
  Kind kind;
  std::string name;
  const StoredTensor* got;
  bounds::Precision pr;  ///< accumulation precision of the output: double for f64, float otherwise, flushing
  DType in = DType::f32;  ///< the inputs' 16-bit type, if any (allowed_terms)
};

/// An element whose verdict the fast oracle's error leaves open: recomputed in mp50.
struct Open {
  index_t row, target, elem;
};

index_t elems_per_row(const AttnCall& c, Kind k) {
  return k == Kind::out ? c.s.d_v : k == Kind::probs ? c.s.Tk : 1;
}

/// A row's (b, h, t); rows are numbered in (b, h, t) order.
struct RowId {
  index_t b, h, t;
};
RowId row_id(const AttnCall& c, index_t row) { return {row / (c.s.Tq * c.s.H), (row / c.s.Tq) % c.s.H, row % c.s.Tq}; }

index_t flat_of(const AttnCall& c, const RowId& r, Kind k, index_t e) {
  const index_t stat = (r.b * c.s.H + r.h) * c.s.Tq + r.t;
  switch (k) {
    case Kind::out: return c.out_offset(r.b, r.h, r.t) + e;
    case Kind::lse:
    case Kind::p_null: return stat;
    case Kind::probs: return stat * c.s.Tk + e;
  }
  return 0;
}

/// Judges element e of row r for target t; false when undecided.
bool judge(const AttnCall& c, const AttnRow& r, const Target& t, index_t e, Policy policy, TensorCheck& chk) {
  static const bounds::Precision dp = own_precision();
  ElemBounds eb, own;
  double hi = 0, mix = 0, rho = r.rho;
  const mp50* exact = nullptr;
  switch (t.kind) {
    case Kind::out:
      hi = r.out[static_cast<std::size_t>(e)];
      if (r.exact) exact = &r.out_mp[static_cast<std::size_t>(e)];
      eb = r.out_bounds(e, t.pr);
      own.wc = r.err_out[static_cast<std::size_t>(e)];
      mix = r.V1[static_cast<std::size_t>(e)];
      rho = r.rho_out[static_cast<std::size_t>(e)];
      break;
    case Kind::lse:
      hi = r.lse;
      if (r.exact) exact = &r.lse_mp;
      eb = r.lse_bounds(t.pr);
      own = r.exact ? ElemBounds{} : r.lse_bounds(dp);
      break;
    case Kind::p_null:
      hi = r.p_null;
      if (r.exact) exact = &r.p_null_mp;
      eb = r.p_null_bounds(t.pr);
      own = r.exact ? ElemBounds{} : r.p_null_bounds(dp);
      break;
    case Kind::probs: {
      if (e < r.kr.begin || e >= r.kr.end) {  // masked key: exactly 0
        static const mp50 zero(0);
        return chk.add(flat_of(c, {r.b, r.h, r.t}, t.kind, e), RefValue{0.0, 0.0, 0.0, &zero}, Allowed{});
      }
      const index_t j = e - r.kr.begin;
      hi = r.p[static_cast<std::size_t>(j)];
      if (r.exact) exact = &r.p_mp[static_cast<std::size_t>(j)];
      eb = r.p_bounds(j, t.pr);
      own = r.exact ? ElemBounds{} : r.p_bounds(j, dp);
      break;
    }
  }
  if (t.kind != Kind::out) own.wc *= 1.0 + r.own_rel;  // (err_out holds it already)
  RefValue ref{hi, 0.0, own.wc, exact};
  if (exact && std::isfinite(hi)) ref.lo = static_cast<double>(*exact - mp50(hi));
  Allowed a = allowed_terms(t.got->dtype, policy, eb.wc, eb.prob, t.kind == Kind::out ? mix : 0.0, r.exact ? 0.0 : rho, t.in);
  if (t.kind == Kind::out && is16(t.in)) {
    // probabilities stored in the 16-bit input type below its smallest normal n16 (sinks far above
    // the scores): each is off by up to u16 n16 absolutely, so out_c by sum_j |v_jc| u16 n16
    const double sub = bounds::kSecondOrder * unit_roundoff(t.in) * std::ldexp(1.0, io::dtype_min_exponent(t.in)) *
                       r.absv[static_cast<std::size_t>(e)];
    const bool same = a.policy == a.certain;  // worst_case: the policy line is the certain line
    a.certain += 2.0 * sub;
    a.policy = same ? a.certain : a.policy + sub;
  }
  return chk.add(flat_of(c, {r.b, r.h, r.t}, t.kind, e), ref, a);
}

std::string row_label(const AttnCall& c, index_t row) {
  const RowId r = row_id(c, row);
  return "(" + std::to_string(r.b) + ", " + std::to_string(r.h) + ", " + std::to_string(r.t) + ")";
}

CompareReport run(const OpCall& call) {
  if (thd_layout(call.options)) return thd_attention(call, run);  // packed: per-sequence dense calls of run
  if (paged_call(call.inputs)) return paged_attention(call, run);
  const TensorMap &in = call.inputs, &out = call.outputs;
  const Options& o = call.options;
  const CompareOptions& copt = call.compare;
  const StoredTensor &q = need(in, "q", "attention"), &k = need(in, "k", "attention"), &v = need(in, "v", "attention");
  const AttentionOptions a = attention_call_options(o, in);
  AttnCall c(q.values, k.values, v.values, a);
  c.probs_needed = out.count("probs") > 0;
  c.mix_R_needed = copt.policy != Policy::worst_case;  // allowed_terms reads no probabilistic bound there
  c.lse = lse_convention(o);
  const Shape out_shape = c.bthd() ? Shape{c.s.B, c.s.Tq, c.s.H, c.s.d_v} : Shape{c.s.B, c.s.H, c.s.Tq, c.s.d_v};
  const std::map<std::string, std::pair<Kind, Shape>> known = {
      {"out", {Kind::out, out_shape}},
      {"lse", {Kind::lse, {c.s.B, c.s.H, c.s.Tq}}},
      {"p_null", {Kind::p_null, {c.s.B, c.s.H, c.s.Tq}}},
      {"probs", {Kind::probs, {c.s.B, c.s.H, c.s.Tq, c.s.Tk}}}};

  CompareReport rep;
  rep.op = "attention";
  std::vector<Target> targets;
  std::vector<std::size_t> slot;  // position of each target's report in rep.tensors
  for (const auto& [name, t] : out) {
    auto it = known.find(name);
    if (it == known.end()) continue;  // an input held in the same file
    if (t.values.shape() != it->second.second) {
      rep.tensors.push_back(shape_mismatch(name, t, it->second.second));
      continue;
    }
    targets.push_back({it->second.first, name, &t,
                       t.dtype == DType::f64 ? bounds::Precision::flushing<double>() : bounds::Precision::flushing<float>(),
                       input16({q.dtype, k.dtype, v.dtype})});
    slot.push_back(rep.tensors.size());
    rep.tensors.emplace_back();
  }

  const std::vector<index_t> rows = sample_rows(c.rows(), copt.sample, copt.seed);
  std::vector<TensorCheck> checks;
  for (const Target& t : targets) checks.emplace_back(t.name, *t.got, copt.show);
  auto merge_into = [&](std::vector<TensorCheck>& mine) {
    for (std::size_t i = 0; i < checks.size(); ++i) checks[i].merge(mine[i]);
  };
  std::vector<Open> open;
  auto judge_row = [&](const AttnRow& r, index_t row, std::vector<TensorCheck>& mine, std::vector<Open>* undecided) {
    for (std::size_t ti = 0; ti < targets.size(); ++ti) {
      const index_t ne = elems_per_row(c, targets[ti].kind);
      for (index_t e = 0; e < ne; ++e)
        if (!judge(c, r, targets[ti], e, copt.policy, mine[ti])) {
          OASIS_REQUIRE(undecided, "oracle", "an element of an mp50 row was left undecided");  // cannot happen
          undecided->push_back({row, static_cast<index_t>(ti), e});
        }
    }
  };
  auto fresh_checks = [&] {
    std::vector<TensorCheck> v2;
    for (const Target& t : targets) v2.emplace_back(t.name, *t.got, copt.show);
    return v2;
  };

  if (copt.oracle == Oracle::mp50) {
#pragma omp parallel if (rows.size() > 1)
    {
      std::vector<TensorCheck> mine = fresh_checks();
#pragma omp for schedule(dynamic, 1)
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const RowId r = row_id(c, rows[i]);
        judge_row(mp50_row(c, r.b, r.h, r.t), rows[i], mine, nullptr);
      }
#pragma omp critical(oasis_attention_merge)
      merge_into(mine);
    }
    rep.oracle = "mp50";
  } else {
    // tasks: (b, kv head) groups, packed once; within a group blocks of up to 64 rows of one head
    constexpr index_t kRows = 64;
    const index_t group = c.group();
    std::size_t i = 0;
    AttnPacked pk;
    // one workspace per thread for every group: its buffers (megabytes at 4096 keys) keep their pages
    std::vector<AttnWorkspace> spaces(static_cast<std::size_t>(omp_get_max_threads()));
    std::vector<std::vector<AttnRow>> results(spaces.size());
    while (i < rows.size()) {
      const index_t b = rows[i] / (c.s.Tq * c.s.H), hk = ((rows[i] / c.s.Tq) % c.s.H) / group;
      std::size_t j = i;
      while (j < rows.size() && rows[j] / (c.s.Tq * c.s.H) == b && ((rows[j] / c.s.Tq) % c.s.H) / group == hk) ++j;
      pack_kv(c, b, hk, pk);
      struct Task { index_t h; std::vector<index_t> ts; };
      std::vector<Task> tasks;
      for (std::size_t x = i; x < j;) {
        const index_t h = (rows[x] / c.s.Tq) % c.s.H;
        Task tk{h, {}};
        while (x < j && (rows[x] / c.s.Tq) % c.s.H == h && static_cast<index_t>(tk.ts.size()) < kRows) tk.ts.push_back(rows[x++] % c.s.Tq);
        tasks.push_back(std::move(tk));
      }
      // most expensive (latest, most keys) first; threads only where there is work to share
      std::reverse(tasks.begin(), tasks.end());
      const double work = static_cast<double>(j - i) * static_cast<double>(c.s.Tk) * static_cast<double>(c.s.d_h + c.s.d_v);
#pragma omp parallel if (tasks.size() > 1 && work > 1e7)
      {
        std::vector<TensorCheck> mine = fresh_checks();
        std::vector<Open> undecided;
        AttnWorkspace& ws = spaces[static_cast<std::size_t>(omp_get_thread_num())];
        std::vector<AttnRow>& res = results[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
        for (std::size_t x = 0; x < tasks.size(); ++x) {
          fast_rows(c, pk, tasks[x].h, tasks[x].ts.data(), static_cast<index_t>(tasks[x].ts.size()), ws, res);
          for (const AttnRow& r : res) judge_row(r, (b * c.s.H + r.h) * c.s.Tq + r.t, mine, &undecided);
        }
#pragma omp critical(oasis_attention_merge)
        {
          merge_into(mine);
          open.insert(open.end(), undecided.begin(), undecided.end());
        }
      }
      i = j;
    }
    // The open elements, their rows recomputed in mp50 (docs/policies.md, "Failing fast"): none of a
    // tensor already FAIL-certain (their verdicts cannot change it), and only the rows within the
    // budget, in row order; the others' elements stay undecided.
    auto check_of = [&](const Open& x) -> TensorCheck& { return checks[static_cast<std::size_t>(x.target)]; };
    auto leave = [&](const Open& x) {
      check_of(x).leave_undecided(flat_of(c, row_id(c, x.row), targets[static_cast<std::size_t>(x.target)].kind, x.elem));
    };
    const std::size_t n_open = open.size();
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](const Open& x) {
                                if (!check_of(x).failed_certain()) return false;
                                leave(x);
                                return true;
                              }),
               open.end());
    if (open.size() < n_open)
      rep.notes.push_back(std::to_string(n_open - open.size()) +
                          " elements left undecided by the double oracle were not recomputed in mp50: each lies in a "
                          "tensor already FAIL-certain, whose verdict they cannot change");
    auto spans = group_by(open, [](const Open& x) { return x.row; });  // [first, last) per row
    const double row_work = static_cast<double>(c.s.Tk) * static_cast<double>(c.s.d_h + c.s.d_v + (c.probs_needed ? 1 : 0));
    const double row_bytes = static_cast<double>(sizeof(mp50)) * static_cast<double>(c.s.Tk) * 4.0 * omp_get_max_threads();
    std::size_t fit = spans.size();
    if (!mp50_fits(rep, row_work * static_cast<double>(spans.size()), row_bytes, copt,
                   "the " + std::to_string(spans.size()) + " rows holding undecided elements were")) {
      fit = row_bytes > copt.mp50_memory ? 0 : static_cast<std::size_t>(std::min<double>(spans.size(), copt.mp50_budget / row_work));
      rep.notes.back() += "; " + std::to_string(fit) + " of them (the first) recomputed within it, the rest left undecided";
      if (fit < spans.size())
        for (std::size_t y = spans[fit].first; y < open.size(); ++y) leave(open[y]);  // spans are contiguous
      spans.resize(fit);
    }
    rep.mp50_rows = static_cast<index_t>(spans.size());
    rep.mp50_work = row_work * static_cast<double>(spans.size());
#pragma omp parallel if (spans.size() > 1)
    {
      std::vector<TensorCheck> mine = fresh_checks();
#pragma omp for schedule(dynamic, 1)
      for (std::size_t x = 0; x < spans.size(); ++x) {
        const RowId id = row_id(c, open[spans[x].first].row);
        const AttnRow r = mp50_row(c, id.b, id.h, id.t);
        for (std::size_t y = spans[x].first; y < spans[x].second; ++y) {
          const bool ok = judge(c, r, targets[static_cast<std::size_t>(open[y].target)], open[y].elem, copt.policy,
                                mine[static_cast<std::size_t>(open[y].target)]);
          (void)ok;  // exact decisions
        }
      }
#pragma omp critical(oasis_attention_merge)
      merge_into(mine);
    }
    rep.oracle = "fast (double, its own error bound folded in; " + std::to_string(spans.size()) + " of " +
                 std::to_string(rows.size()) + " rows recomputed in mp50)";
  }
  for (std::size_t ti = 0; ti < targets.size(); ++ti)
    rep.tensors[slot[ti]] = checks[ti].finish(
        bound_name(targets[ti].got->dtype, copt.policy, true, targets[ti].kind == Kind::out, targets[ti].in) +
        (targets[ti].kind == Kind::lse && !c.lse.is_default() ? "; LSE " + c.lse.describe() : ""));
  if (copt.sample > 0 && copt.sample < c.rows()) {
    rep.sample.rows = static_cast<index_t>(rows.size());
    rep.sample.total = c.rows();
    rep.sample.seed = copt.seed;
    rep.sample.row_kind = "(b, h, t)";
    for (index_t r : rows) rep.sample.which.push_back(row_label(c, r));
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

}  // namespace

OpSpec attention_op() {
  OpSpec s{"attention",
           {{"q", "[B,H,Tq,dh] (bthd: [B,Tq,H,dh]; thd: [total_q,H,dh])"},
            {"k", "[B,Hkv,Tk,dh] (thd: [total_k,Hkv,dh]; absent with a paged cache)", false},
            {"v", "[B,Hkv,Tk,dv] (thd: [total_k,Hkv,dv]; absent with a paged cache)", false},
            {"null_logits", "[H]", false},
            {"bias", "[Tq,Tk] or [B|1,H|1,Tq,Tk]", false},
            {"mask", "as bias, 1 visible / 0 masked", false},
            {"cu_seqlens_q", "[B+1] int32/int64 (layout thd)", false},
            {"cu_seqlens_k", "[B+1] int32/int64 (layout thd)", false},
            {"k_cache", "[num_blocks,block_size,Hkv,dh] (paged, instead of k)", false},
            {"v_cache", "[num_blocks,block_size,Hkv,dv] (paged, instead of v)", false},
            {"block_table", "[B,max_blocks] int32/int64 (paged)", false},
            {"seq_lens", "[B] int32/int64 (paged)", false}},
           {{"out", "[B,H,Tq,dv] (bthd: [B,Tq,H,dv]; thd: [total_q,H,dv])"},
            {"lse", "[B,H,Tq] (thd: [H,total_q])"},
            {"p_null", "[B,H,Tq] (thd: [H,total_q])"},
            {"probs", "[B,H,Tq,Tk] (dense layouts only)"}},
           {"normalizer", "causal", "key_lengths", "null_logits", "scale", "window", "layout", "lse_null", "lse_base"},
           "normalizer: softmax1 (default) | softmax; null_logits: one per query head (or input null_logits; -inf: no "
           "null, +inf: all on it); window: sliding window W (0: none); layout: bhtd (default) | bthd | thd;\n"
           "                lse_null: included (default) | excluded (lse over the keys only); lse_base: e (default) | 2;\n"
           "                thd: packed sequences delimited by cu_seqlens_q/k, statistics head-major [H,total_q];\n"
           "                paged: k_cache, v_cache, block_table, seq_lens instead of k, v (query t of sequence b sees\n"
           "                key j <= t + seq_lens[b] - Tq under causal); both checked per sequence (docs/verify.md)",
           run};
  s.samples_rows = true;
  return s;
}

}  // namespace oasis::verify::detail
