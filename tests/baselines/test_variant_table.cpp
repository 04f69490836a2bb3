// Sanity of the variant table (tests/baselines/variant_table.hpp): every row finite and within
// the ranges its definitions force (pathology terms included), identical weights visible through
// identical rows where the variants coincide (OASIS at beta = 0 equals AoS bit for bit), the
// original backbone without depth null mass, and coarser end-to-end W+A quantisation giving
// larger output error for every variant.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "variant_table.hpp"

using namespace oasis;
using namespace oasis::baselines_table;

TEST(BaselineVariantTable, RowsAreSane) {
  const TableOptions opt = default_table_options();
  const std::vector<VariantRow> rows = variant_table(opt);
  ASSERT_EQ(rows.size(), variant_cases().size());
  std::map<std::string, VariantRow> by;
  for (const VariantRow& r : rows) {
    by[r.name] = r;
    // Pearson kurtosis >= ((n-1)/n)^2 (m4 >= m2^2, Bessel factor); n = T d here.
    const double n = static_cast<double>(opt.seq * opt.base.d_model);
    EXPECT_GE(r.outliers.avg_kurtosis, (n - 1) * (n - 1) / (n * n) - 1e-9) << r.name;
    EXPECT_LE(r.outliers.avg_kurtosis, r.outliers.max_kurtosis) << r.name;
    EXPECT_TRUE(std::isfinite(r.outliers.max_kurtosis) && r.outliers.max_inf_norm > 0) << r.name;
    EXPECT_GE(r.null_mass, 0.0);
    EXPECT_LE(r.null_mass, 1.0);
    // BOS mass >= 1/T for softmax rows (query 0 sees only key 0), entropy <= log T.
    EXPECT_GT(r.bos_mass, 0.0) << r.name;
    EXPECT_LE(r.bos_mass, 1.0) << r.name;
    EXPECT_GE(r.sink_rate, 0.0);
    EXPECT_LE(r.sink_rate, 1.0);
    EXPECT_GE(r.entropy, 0.0) << r.name;
    EXPECT_LE(r.entropy, std::log(static_cast<double>(opt.seq) + 1.0)) << r.name;  // T keys + null
    // Definition 5.1/5.2 terms: L is a mass on N_t = {0} in [0, 1], C a single weighted
    // probability in (0, 1], E a negative entropy <= 0; S = L + C + E (lambda1 = lambda2 = 1)
    // holds for the means up to the rounding of the two averages.
    EXPECT_GE(r.pathology.leakage, 0.0) << r.name;
    EXPECT_LE(r.pathology.leakage, 1.0) << r.name;
    EXPECT_GT(r.pathology.concentration, 0.0) << r.name;
    EXPECT_LE(r.pathology.concentration, 1.0) << r.name;
    EXPECT_LE(r.pathology.entropy_collapse, 0.0) << r.name;
    EXPECT_NEAR(r.pathology_score, r.pathology.leakage + r.pathology.concentration + r.pathology.entropy_collapse,
                1e-12)
        << r.name;
    // End-to-end fake quantisation of weights and activations: positive, and growing as the
    // steps grow 4x per 2 bits fewer (relative Frobenius and max error).
    ASSERT_EQ(r.quant_rel.size(), 3u);
    ASSERT_EQ(r.quant_max.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isfinite(r.quant_rel[i]) && r.quant_rel[i] > 0) << r.name;
    EXPECT_LT(r.quant_rel[0], r.quant_rel[1]) << r.name;
    EXPECT_LT(r.quant_rel[1], r.quant_rel[2]) << r.name;
    EXPECT_LT(r.quant_max[0], r.quant_max[2]) << r.name;
  }
  // OASIS with beta = 0 is AoS exactly (docs/spec.md §3): every column equal bit for bit.
  {
    const VariantRow &o = by.at("oasis_beta0"), &a = by.at("aos");
    EXPECT_EQ(o.outliers.avg_kurtosis, a.outliers.avg_kurtosis);
    EXPECT_EQ(o.outliers.max_kurtosis, a.outliers.max_kurtosis);
    EXPECT_EQ(o.outliers.max_inf_norm, a.outliers.max_inf_norm);
    EXPECT_EQ(o.null_mass, a.null_mass);
    EXPECT_EQ(o.depth_null_mass, a.depth_null_mass);
    EXPECT_EQ(o.bos_mass, a.bos_mass);
    EXPECT_EQ(o.sink_rate, a.sink_rate);
    EXPECT_EQ(o.entropy, a.entropy);
    EXPECT_EQ(o.pathology_score, a.pathology_score);
    EXPECT_EQ(o.quant_rel, a.quant_rel);
    EXPECT_EQ(o.quant_max, a.quant_max);
    // ... while the learned beta (theta_init) makes OASIS differ from AoS.
    EXPECT_NE(by.at("oasis").outliers.avg_kurtosis, a.outliers.avg_kurtosis);
  }
  // Gating and the prefix sink change the model (identical other weights).
  EXPECT_NE(by.at("gated").outliers.avg_kurtosis, by.at("vanilla_attnres").outliers.avg_kurtosis);
  EXPECT_NE(by.at("gated_aos").outliers.avg_kurtosis, by.at("aos").outliers.avg_kurtosis);
  EXPECT_NE(by.at("s2_sink").outliers.avg_kurtosis, by.at("vanilla_attnres").outliers.avg_kurtosis);
  // The sink key is visible to every query: its mass (the S2 null column) is positive.
  EXPECT_GT(by.at("s2_sink").null_mass, 0.0);
  EXPECT_GT(by.at("gated_aos").null_mass, 0.0);
  EXPECT_EQ(by.at("gated").null_mass, 0.0);
  // Without a null category the token null mass is exactly 0; with Softmax1 it is positive.
  for (const char* n : {"original", "vanilla_attnres", "depth_only", "clipped_softmax", "sparsemax", "entmax15"})
    EXPECT_EQ(by.at(n).null_mass, 0.0) << n;
  for (const char* n : {"token_only", "aos", "oasis", "clipped_outeffhop", "clipped_aos"})
    EXPECT_GT(by.at(n).null_mass, 0.0) << n;
  // Depth null mass: zero for softmax depth and the residual stream, positive for Softmax1 depth.
  EXPECT_EQ(by.at("vanilla_attnres").depth_null_mass, 0.0);
  EXPECT_EQ(by.at("original").depth_null_mass, 0.0);
  EXPECT_GT(by.at("aos").depth_null_mass, 0.0);
  // Different normalisers give different hidden states: the table is not constant.
  EXPECT_NE(by.at("vanilla_attnres").outliers.avg_kurtosis, by.at("original").outliers.avg_kurtosis);
  std::ostringstream os;
  print_table(os, opt, rows);
  for (const VariantCase& c : variant_cases()) EXPECT_NE(os.str().find(c.name), std::string::npos) << c.name;
}
