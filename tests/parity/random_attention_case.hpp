// tests/parity/random_attention_case.hpp — the random attention instance of the rapidcheck parity
// properties (forward and backward): shapes across the kernels' tiling edges (Tq 1..48 and
// Tk 1..100 around the 16-query and 32-key tiles, head sizes 1..128, d_v != d_h), GQA, causal
// with Tq > Tk, padding lengths down to 0, both normalisers, null logits, scores scaled up to 40,
// sliding windows, additive biases of every broadcast shape with masked entries and fully masked
// rows, both layouts.
#pragma once
#include <rapidcheck.h>

#include "parity_rule.hpp"

namespace oasis::test {

inline AttentionCase random_attention_case() {
  AttentionCase c;
  c.name = "random";
  c.B = *rc::gen::inRange<index_t>(1, 3);
  c.H_kv = *rc::gen::inRange<index_t>(1, 3);
  c.H = c.H_kv * *rc::gen::inRange<index_t>(1, 4);
  c.Tq = *rc::gen::inRange<index_t>(1, 49);
  c.Tk = *rc::gen::inRange<index_t>(1, 101);
  c.d_h = *rc::gen::inRange<index_t>(1, 129);
  c.d_v = *rc::gen::arbitrary<bool>() ? c.d_h : *rc::gen::inRange<index_t>(1, 129);
  c.normalizer = *rc::gen::element(RowNorm::softmax1, RowNorm::softmax);
  c.causal = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>())
    for (index_t b = 0; b < c.B; ++b) c.key_lengths.push_back(*rc::gen::inRange<index_t>(0, c.Tk + 1));
  c.null_logits = c.normalizer == RowNorm::softmax1 && *rc::gen::arbitrary<bool>();
  c.q_scale = *rc::gen::element(1.0, 8.0, 40.0);
  c.probs = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) c.window = *rc::gen::inRange<index_t>(1, c.Tk + 6);
  c.bias = *rc::gen::element(BiasKind::none, BiasKind::none, BiasKind::tk, BiasKind::batch, BiasKind::head,
                             BiasKind::full);
  c.bias_masked = *rc::gen::element(0.0, 0.3, 0.9);
  c.bias_masked_rows = *rc::gen::inRange<index_t>(0, 3);
  c.layout = *rc::gen::element(AttentionLayout::bhtd, AttentionLayout::bthd);
  return c;
}

}  // namespace oasis::test
