// src/verify/op_attention_backward.cpp — op "attention_backward": the gradients of token attention
// (SPEC §8) from the incoming gradients of its outputs.
#include <cmath>
#include <map>

#include "engine.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const std::string op = "attention_backward";
  const StoredTensor &q = need(in, "q", op), &k = need(in, "k", op), &v = need(in, "v", op), &dout = need(in, "grad_out", op);
  const StoredTensor *dlse = maybe(in, "grad_lse"), *dpn = maybe(in, "grad_p_null");
  if (dlse) (void)need(in, "grad_lse", op);
  if (dpn) (void)need(in, "grad_p_null", op);
  AttentionOptions a = attention_call_options(c.options, in);
  OASIS_REQUIRE(!out.count("grad_null_logits") || a.normalizer == RowNorm::softmax1, "outputs",
                "grad_null_logits given but the normaliser is softmax (no null logit)");
  OASIS_REQUIRE(!out.count("grad_bias") || !a.bias.empty(), "outputs", "grad_bias given but the inputs hold no bias");
  a.return_probs = true;  // the bounds need the exact probabilities
  auto cot = [&](auto tag) {
    using T = decltype(tag);
    return AttentionCotangents<T>{as<T>(dout), dlse ? as<T>(*dlse) : Tensor<T>(), dpn ? as<T>(*dpn) : Tensor<T>()};
  };
  const Tensor<mp50> qm = as<mp50>(q), km = as<mp50>(k), vm = as<mp50>(v);
  const AttentionResult<mp50> fwd = token_attention(qm, km, vm, a);
  AttentionOptions ab = a;
  ab.return_probs = false;
  const AttentionGrads<mp50> ref = token_attention_backward(qm, km, vm, cot(mp50{}), ab);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::AttentionBackwardBounds b =
          bounds::attention_backward_bounds(as<T>(q), as<T>(k), as<T>(v), cot(tag), a, fwd);
      return BoundMap{{"grad_q", b.q}, {"grad_k", b.k}, {"grad_v", b.v}, {"grad_null_logits", b.null_logits},
                      {"grad_bias", b.bias}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = op;
  compare_outputs(rep, out,
                  {{"grad_q", &ref.q}, {"grad_k", &ref.k}, {"grad_v", &ref.v}, {"grad_null_logits", &ref.null_logits},
                   {"grad_bias", &ref.bias}},
                  bounds, c.compare);
  return rep;
}

}  // namespace

OpSpec attention_backward_op() {
  return {"attention_backward",
          {{"q", "[B,H,Tq,dh]"},
           {"k", "[B,Hkv,Tk,dh]"},
           {"v", "[B,Hkv,Tk,dv]"},
           {"grad_out", "[B,H,Tq,dv]"},
           {"grad_lse", "[B,H,Tq]", false},
           {"grad_p_null", "[B,H,Tq]", false},
           {"null_logits", "[H]", false},
           {"bias", "[Tq,Tk] or [B|1,H|1,Tq,Tk]", false}},
          {{"grad_q", "[B,H,Tq,dh]"},
           {"grad_k", "[B,Hkv,Tk,dh]"},
           {"grad_v", "[B,Hkv,Tk,dv]"},
           {"grad_null_logits", "[H]"},
           {"grad_bias", "shape of bias"}},
          {"normalizer", "causal", "key_lengths", "null_logits", "scale", "window", "layout"},
          "as attention, plus window (0: none) and layout (bhtd | bthd: q, k, v, grad_out and grad_q/k/v as [B,T,H,d]);\n"
          "                grad_lse, grad_p_null: incoming gradients of lse and p_null (absent: 0)",
          run};
}

}  // namespace oasis::verify::detail
