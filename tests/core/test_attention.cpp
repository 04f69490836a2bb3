// Token attention (docs/spec.md §2): float/double/long double within the derived bound of the mp50
// reference over random shapes, masks, GQA; structural identities; bad input.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using R = mp50;
using test::thrown_argument;

namespace {

struct Config {
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
  bool causal;
  bool padding;
  RowNorm norm;
  bool sinks;
  double logit_scale;  // multiplies q: larger scores, down to near one-hot rows
};

std::string name_of(const Config& c) {
  return "B" + std::to_string(c.B) + "H" + std::to_string(c.H) + "kv" + std::to_string(c.H_kv) + "Tq" +
         std::to_string(c.Tq) + "Tk" + std::to_string(c.Tk) + "d" + std::to_string(c.d_h) + (c.causal ? "_causal" : "") +
         (c.padding ? "_pad" : "") + "_" + std::string(to_string(c.norm)) + (c.sinks ? "_sinks" : "");
}

template <class T>
void check_config(const Config& c, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  const Tensor<T> q = oasis::test::randn<T>({c.B, c.H, c.Tq, c.d_h}, rng, c.logit_scale);
  const Tensor<T> k = oasis::test::randn<T>({c.B, c.H_kv, c.Tk, c.d_h}, rng);
  const Tensor<T> v = oasis::test::randn<T>({c.B, c.H_kv, c.Tk, c.d_v}, rng);
  AttentionOptions opt;
  opt.normalizer = c.norm;
  opt.causal = c.causal;
  opt.return_probs = true;
  if (c.padding) {
    opt.key_lengths.resize(static_cast<std::size_t>(c.B));
    for (index_t b = 0; b < c.B; ++b) opt.key_lengths[static_cast<std::size_t>(b)] = static_cast<index_t>(rng() % (c.Tk + 1));
    opt.key_lengths[0] = 0;  // always one fully masked sequence
  }
  if (c.sinks)
    for (index_t h = 0; h < c.H; ++h) opt.null_logits.push_back(std::ldexp(static_cast<double>(rng() % 513) - 256.0, -5));
  const AttentionResult<T> got = token_attention(q, k, v, opt);
  const AttentionResult<R> ref = token_attention(q.template cast<R>(), k.template cast<R>(), v.template cast<R>(), opt);
  const bounds::AttentionBounds b = bounds::attention_bounds(q, k, v, opt, ref);
  auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
  EXPECT_TRUE(oasis::test::within_bound("out", got.out, ref.out, use(b.out))) << name_of(c);
  EXPECT_TRUE(oasis::test::within_bound("lse", got.lse, ref.lse, use(b.lse))) << name_of(c);
  EXPECT_TRUE(oasis::test::within_bound("p_null", got.p_null, ref.p_null, use(b.p_null))) << name_of(c);
  EXPECT_TRUE(oasis::test::within_bound("probs", got.probs, ref.probs, use(b.probs))) << name_of(c);
}

const std::vector<Config> kConfigs = {
    {1, 1, 1, 1, 1, 1, 1, false, false, RowNorm::softmax1, false, 1.0},
    {2, 4, 2, 7, 7, 8, 8, true, false, RowNorm::softmax1, false, 1.0},
    {2, 4, 4, 5, 9, 16, 4, true, true, RowNorm::softmax1, true, 2.0},
    {3, 6, 2, 9, 4, 8, 8, true, true, RowNorm::softmax, false, 1.0},  // Tq > Tk: fully masked causal rows
    {2, 2, 1, 6, 6, 32, 16, false, true, RowNorm::softmax, false, 8.0},
    {1, 8, 1, 12, 12, 64, 64, true, false, RowNorm::softmax1, false, 30.0},  // near one-hot rows
    {1, 2, 2, 3, 40, 4, 4, false, false, RowNorm::softmax1, true, 100.0},   // |z| in the hundreds
};

}  // namespace

template <class T>
class AttentionPrecision : public ::testing::Test {};
using Scalars = ::testing::Types<float, double, long double>;
TYPED_TEST_SUITE(AttentionPrecision, Scalars);

TYPED_TEST(AttentionPrecision, WithinDerivedBoundOfHighPrecision) {
  std::uint64_t seed = 100;
  for (const Config& c : kConfigs) check_config<TypeParam>(c, seed++);
}

TEST(Attention, MassScalingOfTheOutput) {
  // Ã = (1 - p_null) A: Softmax1 attention is softmax attention scaled by the real mass.
  auto rng = oasis::test::make_rng(3);
  const Tensor<R> q = oasis::test::randn<double>({2, 3, 5, 4}, rng).cast<R>();
  const Tensor<R> k = oasis::test::randn<double>({2, 3, 5, 4}, rng).cast<R>();
  const Tensor<R> v = oasis::test::randn<double>({2, 3, 5, 6}, rng).cast<R>();
  AttentionOptions o1, o0;
  o1.causal = o0.causal = true;
  o0.normalizer = RowNorm::softmax;
  const auto a1 = token_attention(q, k, v, o1);
  const auto a0 = token_attention(q, k, v, o0);
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 3; ++h)
      for (index_t t = 0; t < 5; ++t)
        for (index_t c = 0; c < 6; ++c) {
          const R diff = a1.out(b, h, t, c) - (1 - a1.p_null(b, h, t)) * a0.out(b, h, t, c);
          EXPECT_LT(to_double(diff < 0 ? R(-diff) : diff), 1e-45);
        }
}

TEST(Attention, GroupedQueryEqualsReplicatedKvHeads) {
  auto rng = oasis::test::make_rng(4);
  const Tensor<double> q = oasis::test::randn<double>({1, 6, 4, 8}, rng);
  const Tensor<double> k = oasis::test::randn<double>({1, 2, 4, 8}, rng);
  const Tensor<double> v = oasis::test::randn<double>({1, 2, 4, 8}, rng);
  Tensor<double> k6({1, 6, 4, 8}), v6({1, 6, 4, 8});
  for (index_t h = 0; h < 6; ++h)
    for (index_t j = 0; j < 4; ++j)
      for (index_t c = 0; c < 8; ++c) {
        k6(0, h, j, c) = k(0, h / 3, j, c);
        v6(0, h, j, c) = v(0, h / 3, j, c);
      }
  AttentionOptions o;
  o.causal = true;
  const auto a = token_attention(q, k, v, o);
  const auto b = token_attention(q, k6, v6, o);
  EXPECT_TRUE(oasis::test::exactly_equal("out", a.out, b.out));
  EXPECT_TRUE(oasis::test::exactly_equal("p_null", a.p_null, b.p_null));
}

TEST(Attention, PaddingEqualsTruncatedKeys) {
  auto rng = oasis::test::make_rng(5);
  const Tensor<double> q = oasis::test::randn<double>({1, 2, 3, 4}, rng);
  const Tensor<double> k = oasis::test::randn<double>({1, 2, 7, 4}, rng);
  const Tensor<double> v = oasis::test::randn<double>({1, 2, 7, 4}, rng);
  Tensor<double> k4({1, 2, 4, 4}), v4({1, 2, 4, 4});
  for (index_t h = 0; h < 2; ++h)
    for (index_t j = 0; j < 4; ++j)
      for (index_t c = 0; c < 4; ++c) { k4(0, h, j, c) = k(0, h, j, c); v4(0, h, j, c) = v(0, h, j, c); }
  AttentionOptions pad;
  pad.key_lengths = {4};
  const auto a = token_attention(q, k, v, pad);
  const auto b = token_attention(q, k4, v4, AttentionOptions{});
  EXPECT_TRUE(oasis::test::exactly_equal("out", a.out, b.out));
  EXPECT_TRUE(oasis::test::exactly_equal("lse", a.lse, b.lse));
}

TEST(Attention, DecodeStepEqualsLastRowOfCausalAttention) {
  // bottom-right causal alignment: the last query alone against all keys equals the last row.
  auto rng = oasis::test::make_rng(6);
  const Tensor<double> q = oasis::test::randn<double>({1, 2, 5, 4}, rng);
  const Tensor<double> k = oasis::test::randn<double>({1, 2, 5, 4}, rng);
  const Tensor<double> v = oasis::test::randn<double>({1, 2, 5, 4}, rng);
  Tensor<double> q1({1, 2, 1, 4});
  for (index_t h = 0; h < 2; ++h)
    for (index_t c = 0; c < 4; ++c) q1(0, h, 0, c) = q(0, h, 4, c);
  AttentionOptions o;
  o.causal = true;
  const auto full = token_attention(q, k, v, o);
  const auto step = token_attention(q1, k, v, o);
  for (index_t h = 0; h < 2; ++h) {
    EXPECT_EQ(step.p_null(0, h, 0), full.p_null(0, h, 4));
    for (index_t c = 0; c < 4; ++c) EXPECT_EQ(step.out(0, h, 0, c), full.out(0, h, 4, c));
  }
}

TEST(Attention, FullyMaskedRowsGiveZeroOutputNeverNaN) {
  auto rng = oasis::test::make_rng(7);
  const Tensor<float> q = oasis::test::randn<float>({2, 2, 3, 4}, rng);
  const Tensor<float> k = oasis::test::randn<float>({2, 2, 3, 4}, rng);
  const Tensor<float> v = oasis::test::randn<float>({2, 2, 3, 4}, rng);
  for (RowNorm n : {RowNorm::softmax1, RowNorm::softmax}) {
    AttentionOptions o;
    o.normalizer = n;
    o.key_lengths = {0, 3};
    o.null_logits = n == RowNorm::softmax1 ? std::vector<double>{0.5, -2.0} : std::vector<double>{};
    const auto a = token_attention(q, k, v, o);
    for (index_t h = 0; h < 2; ++h)
      for (index_t t = 0; t < 3; ++t) {
        for (index_t c = 0; c < 4; ++c) EXPECT_EQ(a.out(0, h, t, c), 0.0f);
        if (n == RowNorm::softmax1) {
          EXPECT_EQ(a.p_null(0, h, t), 1.0f);
          EXPECT_EQ(a.lse(0, h, t), static_cast<float>(o.null_logits[static_cast<std::size_t>(h)]));
        } else {
          EXPECT_TRUE(is_neg_inf(a.lse(0, h, t)));
        }
      }
  }
}

TEST(Attention, BadInputNamesTheArgument) {
  const Tensor<double> q({1, 4, 3, 8}), k({1, 2, 3, 8}), v({1, 2, 3, 8});
  EXPECT_EQ(thrown_argument([&] { token_attention(q, Tensor<double>({1, 3, 3, 8}), Tensor<double>({1, 3, 3, 8})); }), "k");  // 3 ∤ 4
  EXPECT_EQ(thrown_argument([&] { token_attention(q, Tensor<double>({1, 2, 3, 7}), v); }), "k");
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, Tensor<double>({1, 2, 2, 8})); }), "v");
  EXPECT_EQ(thrown_argument([&] { token_attention(Tensor<double>({1, 4, 8}), k, v); }), "q");
  EXPECT_EQ(thrown_argument([&] { token_attention(Tensor<double>({1, 4, 0, 8}), k, v); }), "q");
  AttentionOptions o;
  o.key_lengths = {-1};
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "key_lengths");
  o.key_lengths = {1, 2};
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "key_lengths");
  AttentionOptions o2;
  o2.null_logits = {0.0, 0.0};
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o2); }), "null_logits");
  Tensor<double> qn = q;
  qn[5] = std::nan("");
  EXPECT_EQ(thrown_argument([&] { token_attention(qn, k, v); }), "q");
  Tensor<double> vi = v;
  vi[2] = pos_inf<double>();
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, vi); }), "v");
  AttentionOptions o3;
  o3.scale = -1.0;
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o3); }), "scale");
}

// require_finite (q, k, v of every attention call) names the first non-finite element wherever it
// lies: in the first block of its branch-free scan, at a block boundary, in a later block, in the
// tail after the last whole block, with a later bad value present; and accepts finite extremes.
template <class T>
void expect_first_non_finite_named() {
  const index_t n = 3 * 1024 + 37;
  const T special[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                       -std::numeric_limits<T>::infinity()};
  Tensor<T> finite({n});
  for (index_t i = 0; i < n; ++i) finite[i] = static_cast<T>(i % 7) - T(3);
  finite[1] = std::numeric_limits<T>::max();
  finite[2] = -std::numeric_limits<T>::max();
  finite[3] = std::numeric_limits<T>::denorm_min();
  finite[4] = -T(0);
  EXPECT_NO_THROW(require_finite(finite, "x"));
  for (const index_t at : {index_t{0}, index_t{5}, index_t{1023}, index_t{1024}, index_t{2500}, n - 30, n - 1})
    for (const T bad : special) {
      Tensor<T> x = finite;
      x[at] = bad;
      if (at + 100 < n) x[at + 100] = std::numeric_limits<T>::quiet_NaN();  // a later one is not named
      std::string what;
      try {
        require_finite(x, "x");
      } catch (const invalid_argument& e) {
        EXPECT_EQ(e.argument(), "x");
        what = e.what();
      }
      EXPECT_NE(what.find("at flat index " + std::to_string(at)), std::string::npos)
          << "bad value " << bad << " at " << at << ": " << (what.empty() ? "(no error)" : what);
    }
}

TEST(Attention, RequireFiniteNamesTheFirstNonFiniteElement) {
  expect_first_non_finite_named<float>();
  expect_first_non_finite_named<double>();
}

// docs/spec.md §8: a sliding window, an additive bias and the [B, T, H, d] layout.
TEST(Attention, WindowEqualsBiasMaskingOutsideTheWindow) {
  auto rng = oasis::test::make_rng(81);
  const index_t B = 2, H = 4, Hkv = 2, Tq = 6, Tk = 9, d = 8;
  const Tensor<double> q = oasis::test::randn<double>({B, H, Tq, d}, rng), k = oasis::test::randn<double>({B, Hkv, Tk, d}, rng),
                       v = oasis::test::randn<double>({B, Hkv, Tk, d}, rng);
  for (index_t W : {1, 2, 3, 5}) {
    AttentionOptions win;
    win.window = W;
    win.null_logits = {0.5, -1.0, 0.0, 2.0};
    win.key_lengths = {9, 7};
    win.return_probs = true;
    AttentionOptions biased = win;
    biased.window = 0;
    biased.causal = true;
    biased.bias = Tensor<double>({Tq, Tk});
    for (index_t t = 0; t < Tq; ++t)
      for (index_t j = 0; j < Tk; ++j)  // t' = t + Tk - Tq; visible iff t' - W < j
        if (j <= t + (Tk - Tq) - W) biased.bias(t, j) = neg_inf<double>();
    const auto a = token_attention(q, k, v, win), b = token_attention(q, k, v, biased);
    EXPECT_TRUE(oasis::test::exactly_equal("out", a.out, b.out)) << "W = " << W;
    EXPECT_TRUE(oasis::test::exactly_equal("lse", a.lse, b.lse)) << "W = " << W;
    EXPECT_TRUE(oasis::test::exactly_equal("probs", a.probs, b.probs)) << "W = " << W;
  }
  // a window at least as long as the row is the causal mask
  AttentionOptions wide, causal;
  wide.window = Tk;
  causal.causal = true;
  EXPECT_TRUE(oasis::test::exactly_equal("out", token_attention(q, k, v, wide).out, token_attention(q, k, v, causal).out));
}

TEST(Attention, BiasBroadcastsOverBatchAndHeads) {
  auto rng = oasis::test::make_rng(82);
  const index_t B = 2, H = 2, T = 5, d = 4;
  const Tensor<double> q = oasis::test::randn<double>({B, H, T, d}, rng), k = oasis::test::randn<double>({B, H, T, d}, rng),
                       v = oasis::test::randn<double>({B, H, T, d}, rng);
  const Tensor<double> b2 = oasis::test::randn<double>({T, T}, rng);
  Tensor<double> b4({B, H, T, T});
  for (index_t i = 0; i < B * H; ++i)
    for (index_t e = 0; e < T * T; ++e) b4[i * T * T + e] = b2[e];
  AttentionOptions o2, o4, o1;
  o2.bias = b2;
  o4.bias = b4;
  o1.bias = b2.reshaped({1, 1, T, T});
  const auto r2 = token_attention(q, k, v, o2), r4 = token_attention(q, k, v, o4), r1 = token_attention(q, k, v, o1);
  EXPECT_TRUE(oasis::test::exactly_equal("out", r2.out, r4.out));
  EXPECT_TRUE(oasis::test::exactly_equal("out", r2.out, r1.out));
  // the bias moves the scores: z + b differs from z
  EXPECT_FALSE(oasis::test::exactly_equal("out", r2.out, token_attention(q, k, v).out));
  // -inf in the bias removes the key: the last key masked is the padding of one key
  AttentionOptions last, pad;
  last.bias = Tensor<double>({T, T});
  for (index_t t = 0; t < T; ++t) last.bias(t, T - 1) = neg_inf<double>();
  pad.key_lengths = {T - 1, T - 1};
  EXPECT_TRUE(oasis::test::exactly_equal("out", token_attention(q, k, v, last).out, token_attention(q, k, v, pad).out));
}

TEST(Attention, BthdLayoutIsTheSameComputation) {
  auto rng = oasis::test::make_rng(83);
  const Tensor<double> q = oasis::test::randn<double>({2, 4, 5, 8}, rng), k = oasis::test::randn<double>({2, 2, 7, 8}, rng),
                       v = oasis::test::randn<double>({2, 2, 7, 3}, rng);
  AttentionOptions a;
  a.causal = true;
  a.window = 4;
  a.null_logits = {0.0, 1.0, -2.0, 0.5};
  a.return_probs = true;
  AttentionOptions b = a;
  b.layout = AttentionLayout::bthd;
  const auto ra = token_attention(q, k, v, a);
  const auto rb = token_attention(swap_head_time(q), swap_head_time(k), swap_head_time(v), b);
  EXPECT_EQ(rb.out.shape(), (Shape{2, 5, 4, 3}));
  EXPECT_TRUE(oasis::test::exactly_equal("out", swap_head_time(rb.out), ra.out));
  EXPECT_TRUE(oasis::test::exactly_equal("lse", rb.lse, ra.lse));
  EXPECT_TRUE(oasis::test::exactly_equal("probs", rb.probs, ra.probs));
}

TEST(Attention, WindowBiasAndLayoutWithinTheDerivedBound) {
  auto rng = oasis::test::make_rng(84);
  const index_t B = 1, H = 2, T = 12, d = 8;
  const Tensor<float> q = oasis::test::randn<float>({B, T, H, d}, rng), k = oasis::test::randn<float>({B, T, H, d}, rng),
                      v = oasis::test::randn<float>({B, T, H, d}, rng);
  AttentionOptions o;
  o.layout = AttentionLayout::bthd;
  o.window = 5;
  o.null_logits = {1.0, -0.5};
  o.bias = oasis::test::randn<double>({T, T}, rng);
  o.return_probs = true;
  const auto got = token_attention(q, k, v, o);
  const auto ref = token_attention(q.cast<R>(), k.cast<R>(), v.cast<R>(), o);
  const bounds::AttentionBounds b = bounds::attention_bounds(q, k, v, o, ref);
  auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
  EXPECT_TRUE(oasis::test::within_bound("out", got.out, ref.out, use(b.out)));
  EXPECT_TRUE(oasis::test::within_bound("lse", got.lse, ref.lse, use(b.lse)));
  EXPECT_TRUE(oasis::test::within_bound("probs", got.probs, ref.probs, use(b.probs)));
}

TEST(Attention, BadWindowBiasAndLayoutNameTheArgument) {
  const Tensor<double> q({1, 2, 3, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4});
  AttentionOptions o;
  o.window = -1;
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "window");
  o = {};
  o.bias = Tensor<double>({3, 4});  // Tk = 5
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "bias");
  o.bias = Tensor<double>({2, 2, 3, 5});  // batch 2 against B = 1
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "bias");
  o.bias = Tensor<double>({3, 5});
  o.bias[4] = std::nan("");
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "bias");
  o.bias[4] = pos_inf<double>();
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "bias");
  o = {};
  o.layout = AttentionLayout::bthd;  // q [B, Tq=2, H=3, d]: 3 heads against 5 kv heads
  EXPECT_EQ(thrown_argument([&] { token_attention(q, k, v, o); }), "k");
  EXPECT_EQ(thrown_argument([] { parse_attention_layout("bhdt"); }), "layout");
}
