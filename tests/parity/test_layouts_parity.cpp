// The packed (THD) and paged layouts on every registered backend (oasis/backends/layouts.hpp):
// each sequence's part of the result under the kernel parity rule (parity_rule.hpp) against the
// long double oracle of that sequence's dense call, its fully masked rows exact; the packed
// backward's null-logit gradient the sum, in sequence order, of the backend's own dense partials.
// The adaptor runs the backend's dense op per sequence, so this is the dense parity through the
// packing and gathering. An unavailable backend (cuda without a device) skips with its reason.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "attention_parity.hpp"
#include "layouts_cases.hpp"
#include "oasis/backends/layouts.hpp"
#include "oasis/backends/registry.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/instances.hpp"

namespace oasis::test {
namespace {

using HP = long double;

class VarlenParity : public ::testing::TestWithParam<std::tuple<std::string, VarlenCase>> {};

TEST_P(VarlenParity, EachSequenceWithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const VarlenInputs in = make_varlen(c, salt_of(c.name) + 1);
  const AttentionResult<float> got = token_attention_varlen(backend, in.q, in.k, in.v, in.cu_q, in.cu_k, in.opt);
  ASSERT_EQ(got.out.shape(), (Shape{in.cu_q.back(), c.H, c.d_v}));
  ASSERT_EQ(got.lse.shape(), (Shape{c.H, in.cu_q.back()}));
  ASSERT_EQ(got.p_null.shape(), (Shape{c.H, in.cu_q.back()}));
  EXPECT_TRUE(got.probs.empty());
  for (index_t i = 0; i + 1 < static_cast<index_t>(in.cu_q.size()); ++i) {
    if (in.cu_q[i + 1] == in.cu_q[i]) continue;
    SCOPED_TRACE("sequence " + std::to_string(i));
    expect_attention_parity<HP>(sequence_result(got, in, i), sequence_inputs(in, i));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()), ::testing::ValuesIn(varlen_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

/// The dense backward's parity (the floor: the float reference backward's derived bound) of one
/// sequence's gradients, the null logits' partial included.
std::vector<::testing::AssertionResult> sequence_backward_parity(const AttentionGrads<float>& got, const AttentionInputs& in,
                                                                 const AttentionCotangents<float>& d) {
  const AttentionGrads<float> ref = token_attention_backward(in.q, in.k, in.v, d, in.opt);
  const Tensor<HP> q = in.q.cast<HP>(), k = in.k.cast<HP>(), v = in.v.cast<HP>();
  const AttentionGrads<HP> hp =
      token_attention_backward(q, k, v, AttentionCotangents<HP>{d.out.cast<HP>(), d.lse.cast<HP>(), d.p_null.cast<HP>()}, in.opt);
  AttentionOptions fo = in.opt;
  fo.return_probs = true;
  const bounds::AttentionBackwardBounds b = bounds::attention_backward_bounds(in.q, in.k, in.v, d, in.opt, token_attention(q, k, v, fo));
  std::vector<::testing::AssertionResult> r = {within_twice_reference("dq", got.q, ref.q, hp.q, b.q),
                                               within_twice_reference("dk", got.k, ref.k, hp.k, b.k),
                                               within_twice_reference("dv", got.v, ref.v, hp.v, b.v)};
  if (in.opt.normalizer == RowNorm::softmax1)
    r.push_back(within_twice_reference("dnull_logits", got.null_logits, ref.null_logits, hp.null_logits, b.null_logits));
  return r;
}

class VarlenBackwardParity : public ::testing::TestWithParam<std::tuple<std::string, VarlenCase>> {};

TEST_P(VarlenBackwardParity, EachSequenceWithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const VarlenInputs in = make_varlen(c, salt_of(c.name) + 2);
  const AttentionCotangents<float> d = make_varlen_cotangents(c, in, salt_of(c.name) + 3);
  const AttentionGrads<float> got = token_attention_varlen_backward(backend, in.q, in.k, in.v, in.cu_q, in.cu_k, d, in.opt);
  ASSERT_EQ(got.q.shape(), in.q.shape());
  ASSERT_EQ(got.k.shape(), in.k.shape());
  ASSERT_EQ(got.v.shape(), in.v.shape());
  Tensor<float> null_sum = c.normalizer == RowNorm::softmax1 ? Tensor<float>({c.H}) : Tensor<float>();
  for (index_t i = 0; i + 1 < static_cast<index_t>(in.cu_q.size()); ++i) {
    const index_t q0 = in.cu_q[i], tq = in.cu_q[i + 1] - q0, k0 = in.cu_k[i], tk = in.cu_k[i + 1] - k0;
    SCOPED_TRACE("sequence " + std::to_string(i));
    if (tq == 0) {  // keys no query sees: exactly zero
      for (const Tensor<float>* g : {&got.k, &got.v})
        for (index_t x = k0 * g->dim(1) * g->dim(2); x < (k0 + tk) * g->dim(1) * g->dim(2); ++x) EXPECT_EQ((*g)[x], 0.0f);
      continue;
    }
    const AttentionInputs s = sequence_inputs(in, i);
    const AttentionCotangents<float> di{rows_of(d.out, q0, tq), cols_of(d.lse, q0, tq),
                                        d.p_null.empty() ? Tensor<float>() : cols_of(d.p_null, q0, tq)};
    // the backend's own dense partial of this sequence, and the packed result's part
    const AttentionGrads<float> partial = token_attention_backward(backend, s.q, s.k, s.v, di, s.opt);
    AttentionGrads<float> part;
    part.q = rows_of(got.q, q0, tq);
    part.k = tk > 0 ? rows_of(got.k, k0, tk) : partial.k;
    part.v = tk > 0 ? rows_of(got.v, k0, tk) : partial.v;
    part.null_logits = partial.null_logits;
    for (const ::testing::AssertionResult& r : sequence_backward_parity(part, s, di)) OASIS_EXPECT_PARITY(r);
    for (index_t h = 0; h < null_sum.size(); ++h) null_sum[h] += partial.null_logits[h];
  }
  EXPECT_EQ(got.null_logits.storage(), null_sum.storage()) << "the null logits' gradient is the sum of the dense partials";
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenBackwardParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()), ::testing::ValuesIn(varlen_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

class PagedParity : public ::testing::TestWithParam<std::tuple<std::string, PagedCase>> {};

TEST_P(PagedParity, EachSequenceWithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const PagedInputs in = make_paged(c, salt_of(c.name) + 4);
  const AttentionResult<float> got =
      token_attention_paged(backend, in.q, in.k_cache, in.v_cache, in.block_table, in.seq_lens, in.opt);
  ASSERT_EQ(got.out.shape(), in.opt.layout == AttentionLayout::bthd
                                 ? (Shape{static_cast<index_t>(c.seq_lens.size()), c.Tq, c.H, c.d_v})
                                 : (Shape{static_cast<index_t>(c.seq_lens.size()), c.H, c.Tq, c.d_v}));
  for (index_t b = 0; b < static_cast<index_t>(c.seq_lens.size()); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    expect_attention_parity<HP>(paged_sequence_result(got, b), paged_sequence_inputs(in, b));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PagedParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()), ::testing::ValuesIn(paged_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

class LayoutsBackend : public ::testing::TestWithParam<std::string> {};

// The adaptor validates before the backend runs: the same argument named on every backend.
TEST_P(LayoutsBackend, RefusesHostileMetadataAsTheReference) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const VarlenInputs in = make_varlen(varlen_cases()[0], 8);
  try {
    (void)token_attention_varlen(backend, in.q, in.k, in.v, {0, 5, 5, 22, 25}, {0, 9, 15, 33, 32}, in.opt);
    ADD_FAILURE() << "a decreasing cu_seqlens_k accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "cu_seqlens_k") << e.what();
  }
  const PagedInputs p = make_paged(paged_cases()[0], 8);
  Tensor<index_t> t = p.block_table;
  t(2, 5) = p.k_cache.dim(0);
  try {
    (void)token_attention_paged(backend, p.q, p.k_cache, p.v_cache, t, p.seq_lens, p.opt);
    ADD_FAILURE() << "a block id past num_blocks accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "block_table") << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LayoutsBackend, ::testing::ValuesIn(parity_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace oasis::test
