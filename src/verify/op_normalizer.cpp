// src/verify/op_normalizer.cpp — op "normalizer": rows of logits through softmax or Softmax1 (SPEC §1).
#include <cmath>
#include <map>

#include "engine.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Options& o = c.options;
  const CompareOptions& copt = c.compare;
  const RowNorm kind = token_normalizer(o, "normalizer");
  const StoredTensor& z = need(in, "z", "normalizer");
  OASIS_REQUIRE(z.values.rank() >= 1, "z", "must have rank >= 1 (rows of logits), got a scalar");
  const index_t m = z.values.dim(z.values.rank() - 1);
  Shape lead(z.values.shape().begin(), z.values.shape().end() - 1);
  const index_t R = shape_numel(lead);
  std::vector<double> s(static_cast<std::size_t>(R), o.number("null_logit", 0.0));
  if (const StoredTensor* st = maybe(in, "s")) {
    OASIS_REQUIRE(!o.has("null_logit"), "s", "given both as input tensor 's' and as option null_logit");
    OASIS_REQUIRE(st->values.shape() == lead || st->values.size() == 1, "s", "shape ", shape_str(st->values.shape()),
                  " must be the rows' shape ", shape_str(lead), " or a single value");
    for (index_t r = 0; r < R; ++r) s[static_cast<std::size_t>(r)] = st->values[st->values.size() == 1 ? 0 : r];
  }
  OASIS_REQUIRE(kind == RowNorm::softmax1 || (!maybe(in, "s") && !o.has("null_logit")), "null_logit",
                "given but the normaliser is softmax (no null category)");
  Ref p(z.values.shape()), p_null(lead), lse(lead);
  for (index_t r = 0; r < R; ++r) {
    Vec<mp50> zr(m);
    for (index_t j = 0; j < m; ++j) zr[j] = mp50(z.values[r * m + j]);
    const RowProbs<mp50> rp = kind == RowNorm::softmax1 ? softmax_null(zr, mp50(s[static_cast<std::size_t>(r)])) : softmax(zr);
    for (index_t j = 0; j < m; ++j) p[r * m + j] = rp.p[j];
    p_null[r] = rp.p_null;
    lse[r] = rp.lse;
  }
  // The normaliser bound takes D's unit roundoff directly (no scaling needed).
  std::map<DType, BoundMap> cache;
  auto bound_for = [&](DType d) -> BoundMap& {
    BoundMap& bm = cache[d];
    if (!bm.empty()) return bm;
    const double denorm_min = std::ldexp(1.0, io::dtype_min_exponent(d) - io::dtype_fraction_bits(d));
    const bounds::Precision pr{unit_roundoff(d), 2.0 * denorm_min};
    Tensor<double> bp(z.values.shape()), bn(lead), bl(lead);
    std::vector<double> pr_d(static_cast<std::size_t>(m));
    for (index_t r = 0; r < R; ++r) {
      for (index_t j = 0; j < m; ++j) pr_d[static_cast<std::size_t>(j)] = static_cast<double>(p[r * m + j]);
      const bounds::RowBound rb = bounds::row_bound(pr, kind, z.values.data() + r * m, nullptr, m, s[static_cast<std::size_t>(r)],
                                                    0.0, pr_d.data(), static_cast<double>(p_null[r]), static_cast<double>(lse[r]));
      for (index_t j = 0; j < m; ++j) bp[r * m + j] = rb.p[static_cast<std::size_t>(j)];
      bn[r] = rb.p_null;
      bl[r] = rb.lse;
    }
    bm = {{"p", bp}, {"p_null", bn}, {"lse", bl}};
    return bm;
  };
  CompareReport rep;
  rep.op = "normalizer";
  const std::map<std::string, const Ref*> refs = {{"p", &p}, {"p_null", &p_null}, {"lse", &lse}};
  for (const auto& [name, t] : out) {
    auto it = refs.find(name);
    if (it == refs.end()) continue;  // an input held in the same file
    const bool same = t.values.shape() == it->second->shape();
    rep.tensors.push_back(compare_tensor(name, t, *it->second, same ? bound_for(t.dtype).at(name) : Tensor<double>(), copt.show));
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

}  // namespace

OpSpec normalizer_op() {
  return {"normalizer",
          {{"z", "[..., m]"}, {"s", "[...] or [1]", false}},
          {{"p", "[..., m]"}, {"p_null", "[...]"}, {"lse", "[...]"}},
          {"normalizer", "null_logit"},
          "normalizer: softmax1 (default) | softmax; null_logit: one null logit for every row (or input s)",
          run};
}

}  // namespace oasis::verify::detail
