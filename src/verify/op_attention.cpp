// src/verify/op_attention.cpp — op "attention": multi-head token attention (SPEC §2).
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
  const StoredTensor &q = need(in, "q", "attention"), &k = need(in, "k", "attention"), &v = need(in, "v", "attention");
  AttentionOptions a;
  a.normalizer = token_normalizer(o, "normalizer");
  a.causal = o.boolean("causal", false);
  a.key_lengths = o.integers("key_lengths");
  a.null_logits = o.numbers("null_logits");
  if (const StoredTensor* nl = maybe(in, "null_logits")) {
    OASIS_REQUIRE(a.null_logits.empty(), "null_logits", "given both as input tensor and as option");
    OASIS_REQUIRE(nl->values.rank() == 1, "null_logits", "input tensor must have shape [H], got ", shape_str(nl->values.shape()));
    a.null_logits = nl->values.storage();
  }
  if (o.has("scale")) a.scale = o.number("scale", 1.0);
  a.return_probs = true;  // the bounds need the exact probabilities
  const Tensor<mp50> qm = q.values.cast<mp50>(), km = k.values.cast<mp50>(), vm = v.values.cast<mp50>();
  const AttentionResult<mp50> ref = token_attention(qm, km, vm, a);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::AttentionBounds b = bounds::attention_bounds(as<T>(q), as<T>(k), as<T>(v), a, ref);
      return BoundMap{{"out", b.out}, {"lse", b.lse}, {"p_null", b.p_null}, {"probs", b.probs}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = "attention";
  compare_outputs(rep, out, {{"out", &ref.out}, {"lse", &ref.lse}, {"p_null", &ref.p_null}, {"probs", &ref.probs}}, bounds, copt);
  return rep;
}

}  // namespace

OpSpec attention_op() {
  return {"attention",
          {{"q", "[B,H,Tq,dh]"}, {"k", "[B,Hkv,Tk,dh]"}, {"v", "[B,Hkv,Tk,dv]"}, {"null_logits", "[H]", false}},
          {{"out", "[B,H,Tq,dv]"}, {"lse", "[B,H,Tq]"}, {"p_null", "[B,H,Tq]"}, {"probs", "[B,H,Tq,Tk]"}},
          {"normalizer", "causal", "key_lengths", "null_logits", "scale"},
          "normalizer: softmax1 (default) | softmax; null_logits: one per query head (or input null_logits)",
          run};
}

}  // namespace oasis::verify::detail
