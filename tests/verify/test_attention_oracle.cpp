// tests/verify/test_attention_oracle.cpp — the forward fast oracle (src/verify/attention_oracle.hpp)
// row by row against the mp50 oracle's rows of the same call: the reference within the fast
// oracle's own error bound, and R of every output element (the probabilistic bound's piece, formed
// from matrix products with its sums of squares folded into one, prob_mix_from_folded) within the
// relative uncertainty the fast oracle declares for it (AttnRow::rho_out), from no sink up to sinks
// that push the weights to the bottom of the double range (at +738 the scale f of prob_mix_scale is
// its cap, 2^1022) and with values that are exactly 0. Beyond about +740 R itself is subnormal
// (the fast and mp50 rows' R then differ by about 1e-9 of it, as they did before the fold), and
// lambda u R lies far below the underflow floors that decide those elements.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_oracle.hpp"
#include "oasis_random.hpp"

namespace det = oasis::verify::detail;
using oasis::index_t;
using oasis::Tensor;

TEST(AttentionOracle, FastRowsMixtureBoundIsTheMp50RowsAtEverySink) {
  auto rng = oasis::test::make_rng(401);
  const index_t Tq = 3, Tk = 700, d = 32;
  for (double sink : {0.0, 300.0, 650.0, 700.0, 730.0, 738.0}) {
    // scores up to ~|30|: sigma (the shared events' coefficient) in the tens
    const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, 3.0);
    const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, 3.0);
    Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    for (index_t i = 0; i < v.size(); i += 7) v[i] = 0.0;
    oasis::AttentionOptions o;
    o.normalizer = oasis::RowNorm::softmax1;
    o.null_logits = {sink};
    const det::AttnCall c(q, k, v, o);
    det::AttnPacked pk;
    det::pack_kv(c, 0, 0, pk);
    det::AttnWorkspace ws;
    std::vector<det::AttnRow> fast;
    const std::vector<index_t> ts = {0, 1, 2};
    det::fast_rows(c, pk, 0, ts.data(), Tq, ws, fast);
    ASSERT_EQ(fast.size(), static_cast<std::size_t>(Tq));
    for (index_t t = 0; t < Tq; ++t) {
      const det::AttnRow exact = det::mp50_row(c, 0, 0, t);
      const det::AttnRow& f = fast[static_cast<std::size_t>(t)];
      for (index_t x = 0; x < d; ++x) {
        const auto xu = static_cast<std::size_t>(x);
        const std::string at = "sink " + std::to_string(sink) + " row " + std::to_string(t) + " column " + std::to_string(x);
        EXPECT_LE(std::abs(f.out[xu] - exact.out[xu]), f.err_out[xu] + std::abs(exact.out[xu]) * 0x1p-53) << at;
        ASSERT_TRUE(std::isfinite(f.out_R[xu])) << at << ": R " << f.out_R[xu];
        ASSERT_GT(exact.out_R[xu], 0.0) << at;
        EXPECT_LE(std::abs(f.out_R[xu] - exact.out_R[xu]), f.rho_out[xu] * exact.out_R[xu])
            << at << ": fast " << f.out_R[xu] << " mp50 " << exact.out_R[xu] << " rho " << f.rho_out[xu];
      }
    }
  }
}
