// The packed (THD) and paged references (oasis/ops/varlen.hpp, oasis/ops/paged.hpp): hostile
// metadata refused naming the argument; the packed reference equal, bit for bit, to the dense
// reference of a padded batch built so that the dense op's own bottom-right rule and key_lengths
// give each sequence its mask (an independent construction of the per-sequence alignment); the
// paged reference equal to the dense one on the keys the test drew before scattering them into
// shuffled blocks; sequences without queries or keys defined.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "layouts_cases.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/grad/instances.hpp"

namespace oasis::test {
namespace {

/// Runs f and expects oasis::invalid_argument naming `arg`.
void expect_refused(const std::function<void()>& f, const std::string& arg, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), arg) << what << ": " << e.what();
  }
}

TEST(VarlenReference, RefusesHostileMetadataNamingIt) {
  const VarlenCase c = varlen_cases()[0];
  const VarlenInputs in = make_varlen(c, 1);
  auto fwd = [&](std::vector<index_t> cu_q, std::vector<index_t> cu_k, AttentionOptions o = {}) {
    return [=, &in] { (void)token_attention_varlen(in.q, in.k, in.v, cu_q, cu_k, o); };
  };
  const std::vector<index_t> q = in.cu_q, k = in.cu_k;  // {0, 5, 5, 22, 25}, {0, 9, 15, 32, 32}
  expect_refused(fwd({1, 5, 5, 22, 25}, k), "cu_seqlens_q", "not starting at 0");
  expect_refused(fwd(q, {0, 9, 8, 32, 32}), "cu_seqlens_k", "decreasing (a negative length)");
  expect_refused(fwd({0, 5, 5, 22, 24}, k), "cu_seqlens_q", "last offset is not total_q");
  expect_refused(fwd(q, {0, 9, 15, 32, 33}), "cu_seqlens_k", "last offset past total_k");
  expect_refused(fwd(q, {0, 9, 32}), "cu_seqlens_k", "B + 1 differs between q and k");
  expect_refused(fwd({25}, {32}), "cu_seqlens_q", "no sequence");
  expect_refused(fwd({-3, 5, 5, 22, 25}, k), "cu_seqlens_q", "negative first offset");
  AttentionOptions o;
  o.key_lengths = {1, 1, 1, 1};
  expect_refused(fwd(q, k, o), "key_lengths", "key_lengths with packed sequences");
  o = {};
  o.bias = Tensor<double>({25, 32});
  expect_refused(fwd(q, k, o), "bias", "a bias");
  o = {};
  o.return_probs = true;
  expect_refused(fwd(q, k, o), "return_probs", "the probability matrix");
  o = {};
  o.layout = AttentionLayout::bthd;
  expect_refused(fwd(q, k, o), "layout", "a dense layout");
  o = {};
  o.null_logits = {0.0, 1.0};
  expect_refused(fwd(q, k, o), "null_logits", "null logits of the wrong count");
  expect_refused([&] { (void)token_attention_varlen(in.q.reshaped({25, 4, 32, 1}), in.k, in.v, q, k); }, "q", "rank 4 q");
  expect_refused([&] { (void)token_attention_varlen(in.q, in.k.reshaped({32, 1, 64}), in.v, q, k); }, "k",
                 "head size differs");
  expect_refused([&] { (void)token_attention_varlen(in.q, Tensor<float>({32, 3, 32}), Tensor<float>({32, 3, 24}), q, k); }, "k",
                 "GQA not dividing");
  Tensor<float> qn = in.q;
  qn[77] = std::nanf("");
  expect_refused([&] { (void)token_attention_varlen(qn, in.k, in.v, q, k); }, "q", "NaN in q");
  AttentionCotangents<float> d = make_varlen_cotangents(c, in, 2);
  auto bwd = [&](const AttentionCotangents<float>& dd) {
    return [&, dd] { (void)token_attention_varlen_backward(in.q, in.k, in.v, q, k, dd, in.opt); };
  };
  AttentionCotangents<float> dense_lse = d;
  dense_lse.lse = Tensor<float>({4, c.H, 17});  // [B, H, max_seqlen]: the dense statistics' layout
  expect_refused(bwd(dense_lse), "dlse", "statistics cotangent in the dense layout");
  AttentionCotangents<float> bad_out = d;
  bad_out.out = Tensor<float>({25, c.H, c.d_v + 1});
  expect_refused(bwd(bad_out), "dout", "output cotangent of the wrong shape");
}

TEST(PagedReference, RefusesHostileMetadataNamingIt) {
  const PagedCase c = paged_cases()[0];
  const PagedInputs in = make_paged(c, 3);
  auto call = [&](Tensor<index_t> table, std::vector<index_t> lens, AttentionOptions o) {
    return [&in, table, lens, o] { (void)token_attention_paged(in.q, in.k_cache, in.v_cache, table, lens, o); };
  };
  Tensor<index_t> t = in.block_table;
  t(0, 1) = in.k_cache.dim(0);  // past the last block, inside the used part (9 keys: 3 blocks)
  expect_refused(call(t, in.seq_lens, in.opt), "block_table", "block id past num_blocks");
  t = in.block_table;
  t(2, 0) = -1;
  expect_refused(call(t, in.seq_lens, in.opt), "block_table", "negative block id");
  t = in.block_table;
  t(0, 3) = 999;  // past the used part: never read
  EXPECT_NO_THROW(call(t, in.seq_lens, in.opt)());
  std::vector<index_t> lens = in.seq_lens;
  lens[2] = in.block_table.dim(1) * c.block_size + 1;
  expect_refused(call(in.block_table, lens, in.opt), "seq_lens", "seq_len past the table's capacity");
  lens = in.seq_lens;
  lens[1] = -1;
  expect_refused(call(in.block_table, lens, in.opt), "seq_lens", "negative seq_len");
  expect_refused(call(in.block_table, {9, 0}, in.opt), "seq_lens", "one length per sequence");
  expect_refused(call(in.block_table.reshaped({1, in.block_table.size()}), in.seq_lens, in.opt), "block_table",
                 "table rows differ from the batch");
  AttentionOptions o = in.opt;
  o.key_lengths = {1, 1, 1};
  expect_refused(call(in.block_table, in.seq_lens, o), "key_lengths", "key_lengths with a paged cache");
  o = in.opt;
  o.return_probs = true;
  expect_refused(call(in.block_table, in.seq_lens, o), "return_probs", "the probability matrix");
  expect_refused([&] { (void)token_attention_paged(in.q, in.k_cache, Tensor<float>({1, c.block_size, c.H_kv, c.d_v}),
                                                   in.block_table, in.seq_lens, in.opt); },
                 "v_cache", "v_cache of other blocks");
  Tensor<float> kc = in.k_cache;
  kc(in.block_table(2, 1), 3, 1, 5) = std::nanf("");  // a used slot
  expect_refused([&] { (void)token_attention_paged(in.q, kc, in.v_cache, in.block_table, in.seq_lens, in.opt); }, "k_cache",
                 "NaN in a used slot");
  // the unused slots already hold NaN (make_paged): accepted
  EXPECT_NO_THROW((void)token_attention_paged(in.q, in.k_cache, in.v_cache, in.block_table, in.seq_lens, in.opt));
}

/// The padded batch whose dense rules reproduce the packed call: each sequence's keys right-padded
/// to max_k (key_lengths = Tk_i), its queries at rows s_i .. s_i + Tq_i - 1 of Tq_pad with
/// s_i = Tq_pad - max_k + Tk_i - Tq_i, so that row s_i + t sees j <= t + Tk_i - Tq_i; the other
/// rows have zero queries and zero cotangents, which add exact zeros to every gradient.
struct Padded {
  Tensor<double> q, k, v;
  AttentionCotangents<double> d;
  AttentionOptions opt;
  std::vector<index_t> start;
};

Padded padded(const VarlenInputs& in, const AttentionCotangents<float>& d) {
  const index_t B = static_cast<index_t>(in.cu_q.size()) - 1, H = in.q.dim(1), Hk = in.k.dim(1);
  index_t max_k = 1, Tq_pad = 1;
  for (index_t i = 0; i < B; ++i) max_k = std::max(max_k, in.cu_k[i + 1] - in.cu_k[i]);
  for (index_t i = 0; i < B; ++i)
    Tq_pad = std::max(Tq_pad, max_k - (in.cu_k[i + 1] - in.cu_k[i]) + (in.cu_q[i + 1] - in.cu_q[i]));
  Padded p;
  p.q = Tensor<double>({B, Tq_pad, H, in.q.dim(2)});
  p.k = Tensor<double>({B, max_k, Hk, in.k.dim(2)});
  p.v = Tensor<double>({B, max_k, Hk, in.v.dim(2)});
  p.d.out = Tensor<double>({B, Tq_pad, H, in.v.dim(2)});
  p.d.lse = Tensor<double>({B, H, Tq_pad});
  if (!d.p_null.empty()) p.d.p_null = Tensor<double>({B, H, Tq_pad});
  p.opt = in.opt;
  p.opt.layout = AttentionLayout::bthd;
  for (index_t i = 0; i < B; ++i) {
    const index_t q0 = in.cu_q[i], tq = in.cu_q[i + 1] - q0, k0 = in.cu_k[i], tk = in.cu_k[i + 1] - k0;
    const index_t s = Tq_pad - max_k + tk - tq;
    p.start.push_back(s);
    p.opt.key_lengths.push_back(tk);
    for (index_t t = 0; t < tq; ++t)
      for (index_t h = 0; h < H; ++h) {
        for (index_t c = 0; c < p.q.dim(3); ++c) p.q(i, s + t, h, c) = in.q(q0 + t, h, c);
        for (index_t c = 0; c < p.d.out.dim(3); ++c) p.d.out(i, s + t, h, c) = d.out(q0 + t, h, c);
        p.d.lse(i, h, s + t) = d.lse(h, q0 + t);
        if (!d.p_null.empty()) p.d.p_null(i, h, s + t) = d.p_null(h, q0 + t);
      }
    for (index_t j = 0; j < tk; ++j)
      for (index_t h = 0; h < Hk; ++h) {
        for (index_t c = 0; c < p.k.dim(3); ++c) p.k(i, j, h, c) = in.k(k0 + j, h, c);
        for (index_t c = 0; c < p.v.dim(3); ++c) p.v(i, j, h, c) = in.v(k0 + j, h, c);
      }
  }
  return p;
}

class VarlenReference : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(VarlenReference, EqualsThePaddedDenseBatchBitForBit) {
  const VarlenCase& c = GetParam();
  const VarlenInputs in = make_varlen(c, salt_of(c.name));
  const AttentionCotangents<float> d = make_varlen_cotangents(c, in, salt_of(c.name));
  const Padded p = padded(in, d);
  const Tensor<double> q = in.q.cast<double>(), k = in.k.cast<double>(), v = in.v.cast<double>();
  const AttentionResult<double> got = token_attention_varlen(q, k, v, in.cu_q, in.cu_k, in.opt);
  const AttentionResult<double> want = token_attention(p.q, p.k, p.v, p.opt);
  const AttentionCotangents<double> dd{d.out.cast<double>(), d.lse.cast<double>(), d.p_null.cast<double>()};
  const AttentionGrads<double> g = token_attention_varlen_backward(q, k, v, in.cu_q, in.cu_k, dd, in.opt);
  const AttentionGrads<double> gw = token_attention_backward(p.q, p.k, p.v, p.d, p.opt);
  ASSERT_EQ(got.lse.shape(), (Shape{c.H, in.cu_q.back()}));
  for (std::size_t i = 0; i + 1 < in.cu_q.size(); ++i) {
    const index_t q0 = in.cu_q[i], s = p.start[i], k0 = in.cu_k[i];
    for (index_t t = 0; t < in.cu_q[i + 1] - q0; ++t)
      for (index_t h = 0; h < c.H; ++h) {
        EXPECT_EQ(got.lse(h, q0 + t), want.lse(static_cast<index_t>(i), h, s + t)) << "sequence " << i << " row " << t;
        EXPECT_EQ(got.p_null(h, q0 + t), want.p_null(static_cast<index_t>(i), h, s + t));
        for (index_t e = 0; e < c.d_v; ++e) EXPECT_EQ(got.out(q0 + t, h, e), want.out(static_cast<index_t>(i), s + t, h, e));
        for (index_t e = 0; e < c.d_h; ++e) EXPECT_EQ(g.q(q0 + t, h, e), gw.q(static_cast<index_t>(i), s + t, h, e));
      }
    for (index_t j = 0; j < in.cu_k[i + 1] - k0; ++j)
      for (index_t h = 0; h < c.H_kv; ++h) {
        for (index_t e = 0; e < c.d_h; ++e) EXPECT_EQ(g.k(k0 + j, h, e), gw.k(static_cast<index_t>(i), j, h, e));
        for (index_t e = 0; e < c.d_v; ++e) EXPECT_EQ(g.v(k0 + j, h, e), gw.v(static_cast<index_t>(i), j, h, e));
      }
  }
  // the null logits' gradient: the same terms, summed per sequence then across (packed) or row by
  // row across the batch (dense): equal up to the association of a double sum
  ASSERT_EQ(g.null_logits.size(), gw.null_logits.size());
  for (index_t h = 0; h < g.null_logits.size(); ++h)
    EXPECT_NEAR(g.null_logits[h], gw.null_logits[h], 1e-13 * std::max(1.0, std::abs(gw.null_logits[h])));
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenReference, ::testing::ValuesIn(varlen_cases()),
                         [](const auto& info) { return info.param.name; });

// Sequences without queries have no rows and their keys get zero gradients; sequences without
// keys have fully masked rows (Softmax1: out 0, p_null 1, LSE1 = s).
TEST(VarlenReference, EmptySequencesAreDefined) {
  const VarlenCase c = varlen_cases()[0];  // q_lens {5, 0, 17, 3}, k_lens {9, 6, 17, 0}
  const VarlenInputs in = make_varlen(c, 5);
  const AttentionResult<float> r = token_attention_varlen(in.q, in.k, in.v, in.cu_q, in.cu_k, in.opt);
  for (index_t t = 22; t < 25; ++t)
    for (index_t h = 0; h < c.H; ++h) {
      EXPECT_EQ(r.p_null(h, t), 1.0f);
      EXPECT_EQ(r.lse(h, t), static_cast<float>(in.opt.null_logits[static_cast<std::size_t>(h)]));
      for (index_t e = 0; e < c.d_v; ++e) EXPECT_EQ(r.out(t, h, e), 0.0f);
    }
  const AttentionGrads<float> g =
      token_attention_varlen_backward(in.q, in.k, in.v, in.cu_q, in.cu_k, make_varlen_cotangents(c, in, 6), in.opt);
  for (index_t j = 9; j < 15; ++j)
    for (index_t h = 0; h < c.H_kv; ++h)
      for (index_t e = 0; e < c.d_h; ++e) EXPECT_EQ(g.k(j, h, e), 0.0f);
  for (index_t t = 22; t < 25; ++t)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t e = 0; e < c.d_h; ++e) EXPECT_EQ(g.q(t, h, e), 0.0f);
}

class PagedReference : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedReference, EqualsTheDenseOpOnTheScatteredKeys) {
  const PagedCase& c = GetParam();
  const PagedInputs in = make_paged(c, salt_of(c.name));
  const AttentionResult<float> r = token_attention_paged(in.q, in.k_cache, in.v_cache, in.block_table, in.seq_lens, in.opt);
  for (index_t b = 0; b < static_cast<index_t>(c.seq_lens.size()); ++b) {
    const AttentionInputs s = paged_sequence_inputs(in, b);
    const AttentionResult<float> want = token_attention(s.q, s.k, s.v, s.opt);
    const AttentionResult<float> got = paged_sequence_result(r, b);
    EXPECT_EQ(got.out.storage(), want.out.storage()) << "sequence " << b;
    EXPECT_EQ(got.lse.storage(), want.lse.storage()) << "sequence " << b;
    EXPECT_EQ(got.p_null.storage(), want.p_null.storage()) << "sequence " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PagedReference, ::testing::ValuesIn(paged_cases()),
                         [](const auto& info) { return info.param.name; });

// More new queries than keys under causal: rows t < Tq - seq_len see no key (defined, not refused).
TEST(PagedReference, RowsBeforeTheFirstKeyAreFullyMasked) {
  const PagedCase c = paged_cases()[2];  // seq_lens {4, 10}, Tq = 6, causal, softmax1
  const PagedInputs in = make_paged(c, 9);
  const AttentionResult<float> r = token_attention_paged(in.q, in.k_cache, in.v_cache, in.block_table, in.seq_lens, in.opt);
  for (index_t h = 0; h < c.H; ++h)
    for (index_t t = 0; t < c.Tq; ++t) {
      const bool masked = t < c.Tq - 4;
      EXPECT_EQ(r.p_null(0, h, t) == 1.0f, masked) << "row " << t;
      if (masked) {
        EXPECT_EQ(r.lse(0, h, t), static_cast<float>(in.opt.null_logits[static_cast<std::size_t>(h)]));
        for (index_t e = 0; e < c.d_v; ++e) EXPECT_EQ(r.out(0, h, t, e), 0.0f);
      }
    }
}

}  // namespace
}  // namespace oasis::test
