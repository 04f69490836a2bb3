// Sanity of the variant table (tests/baselines/variant_table.hpp): every row finite and within
// the ranges its definitions force, identical weights visible through identical rows where the
// variants coincide, and coarser quantisation giving larger output error.
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
    ASSERT_EQ(r.quant_error.size(), 3u);
    for (double e : r.quant_error) EXPECT_TRUE(std::isfinite(e) && e > 0) << r.name;
    // 8-bit steps are 4x and 16x finer than 6- and 4-bit ones.
    EXPECT_LT(r.quant_error[0], r.quant_error[1]) << r.name;
    EXPECT_LT(r.quant_error[1], r.quant_error[2]) << r.name;
    ASSERT_EQ(r.sublayer_wa_error.size(), 3u);
    for (double e : r.sublayer_wa_error) EXPECT_TRUE(std::isfinite(e) && e > 0) << r.name;
    EXPECT_LT(r.sublayer_wa_error[0], r.sublayer_wa_error[1]) << r.name;
    EXPECT_LT(r.sublayer_wa_error[1], r.sublayer_wa_error[2]) << r.name;
  }
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
  EXPECT_NE(os.str().find("entmax15"), std::string::npos);
}
