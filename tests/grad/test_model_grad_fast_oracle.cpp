// tests/grad/test_model_grad_fast_oracle.cpp — the estimate on which the fast oracle of model
// gradients rests (docs/verify-model.md, "Model gradients: the fast oracle"): the double backward
// x_d is within E_row = 1024 * 2^-29 * dev32_row + 2^-53 max_row |x_d| of the exact (mp50) gradient
// in every row, dev32 being the six float replays' largest row error against x_d. Measured on every
// model case of model_grad_support.hpp (router families, readouts, variants, block layouts, tied
// embeddings, the original backbone) over several seeds (OASIS_GRAD_SEED moves them); the worst
// |x_d - x_hp| / E is printed, so the margin the factor 1024 leaves is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "matrix_products.hpp"
#include "model_grad_replays.hpp"
#include "op_model_grad.hpp"
#include "model_grad_support.hpp"

namespace oasis::model_grad_test {
namespace {

namespace vd = oasis::verify::detail;

TEST(ModelGradFastOracle, DoubleBackwardIsWithinItsEstimatedErrorOfTheExactOne) {
  om::ForwardOptions fo;
  fo.products = &oasis::verify::matrix_products();
  double worst = 0;
  std::string worst_at;
  index_t rows = 0;
  for (const ModelCase& mc : model_cases()) {
    if (!vd::fast_oracle_applies(mc.cfg)) continue;  // mp50 there
    try {
      om::require_backward_support(mc.cfg);
    } catch (const oasis::invalid_argument&) {
      continue;
    }
    for (std::uint64_t seed = base_seed(); seed < base_seed() + 3; ++seed) {
      SCOPED_TRACE(mc.name + " seed " + std::to_string(seed));
      const om::Model<double> md = random_model<double>(mc.cfg, seed);
      const LossInputs li = loss_inputs(mc, seed);
      const Tensor<double> dl = li.R.cast<float>().cast<double>();  // exact in float, as an implementation's
      const om::ModelGrads<double> xd = om::model_backward(md, li.ids, mc.B, mc.T, dl, {}, fo);
      const om::ModelGrads<mp50> hp = om::model_backward(md.cast<mp50>(), li.ids, mc.B, mc.T, dl.cast<mp50>());
      const std::vector<std::string> names = vd::gradient_names(xd);
      // the six float replays' row errors against x_d, as the check forms them
      const auto dev = vd::replay_row_errors(md.cast<float>(), li.ids, mc.B, mc.T, dl.cast<float>(), names, xd);
      for (const std::string& n : names) {
        const Tensor<double>* x = vd::find_gradient(xd, n);
        const std::vector<double> E = vd::double_row_error(dev.at(n), *x);
        const Tensor<mp50>& e = *vd::find_gradient(hp, n);
        const index_t w = vd::parity_row_width(x->shape());
        for (std::size_t r = 0; r < E.size(); ++r, ++rows) {
          double err = 0;
          for (index_t i = static_cast<index_t>(r) * w; i < static_cast<index_t>(r + 1) * w; ++i)
            err = std::max(err, std::abs((*x)[i] - static_cast<double>(e[i])));
          EXPECT_LE(err, E[r]) << n << " row " << r;
          const double ratio = E[r] > 0 ? err / E[r] : (err > 0 ? INFINITY : 0.0);
          if (ratio > worst) {
            worst = ratio;
            worst_at = mc.name + " seed " + std::to_string(seed) + " " + n + " row " + std::to_string(r);
          }
        }
      }
    }
  }
  EXPECT_GT(rows, 0);
  std::printf("double backward: worst |x_d - x_hp| / E = %.3g over %lld rows (%s)\n", worst,
              static_cast<long long>(rows), worst_at.c_str());
}

}  // namespace
}  // namespace oasis::model_grad_test
