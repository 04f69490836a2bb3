// oasis/model/linear.hpp — the model's activations (Rows), the first-order error model of its
// forward bound (docs/model.md, "Forward error bound") and its linear layer y = W x, W [out, in]
// (PyTorch nn.Linear layout, no bias). Part of the layers of oasis/model/layers.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "oasis/core/scalar.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/model/matrix_products.hpp"

namespace oasis::model {

/// First-order rounding model of the precision whose error is being bounded (u = 0: off).
/// Standard model fl(a op b) = (a op b)(1 + d), |d| <= u; exp, log, sin, cos, pow within 2u.
/// `products`: the matrix products linear() uses when set (oasis/model/matrix_products.hpp).
struct ErrorModel {
  double u = 0;
  const MatrixProducts* products = nullptr;
  bool on() const { return u > 0; }
  /// gamma_n = n u / (1 - n u) (Higham, Lemma 3.1).
  double gamma(double n) const { return n * u / (1.0 - n * u); }
  /// Bound of a mean of n values (summed left to right, then divided) from the sum of their bounds.
  double mean_error(double e_sum, double n, double mean) const { return e_sum / n + (n + 1) * u * mean; }
};

/// Row-major activations [N, w] with optional per-row error bounds.
template <class T>
struct Rows {
  Tensor<T> x;
  std::vector<double> e;  ///< size N when the error model is on, else empty
  index_t n() const { return x.dim(0); }
  index_t w() const { return x.dim(1); }
};

template <class T> inline double row_inf(const T* x, index_t w) {
  double m = 0;
  for (index_t c = 0; c < w; ++c) m = std::max(m, std::abs(to_double(x[c])));
  return m;
}
template <class T> inline double row_l1(const T* x, index_t w) {
  double m = 0;
  for (index_t c = 0; c < w; ++c) m += std::abs(to_double(x[c]));
  return m;
}

/// y = W x for every row, W [out, in]; left-to-right dot products.
/// Error rule: e_y = ||W||_inf e_x + gamma_in max_r sum_c |W_rc x_c|   (Higham 3.1; W exact).
/// In double with the error model on (the bounded evaluation: the fast oracle of the model level,
/// the double replay of the end-to-end verdict), the products and the sums |W||x| of the rule are
/// blocked matrix products (Eigen, OpenMP where the caller is compiled with it): gamma_in holds for
/// every summation order, with or without fused multiply-add. Otherwise each output is the
/// sequential sum over the inputs, whatever the number of rows (incremental decoding equals the
/// full forward bit for bit), unless em.products is set (float or double, error model off): then
/// the products are those (MatrixProducts, any summation order).
template <class T>
Rows<T> linear(const Rows<T>& in, const Tensor<T>& W, const ErrorModel& em) {
  const index_t N = in.n(), nin = in.w(), nout = W.dim(0);
  OASIS_REQUIRE(W.rank() == 2 && W.dim(1) == nin, "W", "shape ", shape_str(W.shape()), " does not take inputs of width ", nin);
  Rows<T> out{Tensor<T>({N, nout}), {}};
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (em.products && !em.on()) {
      matrix_product(*em.products, false, true, N, nout, nin, in.x.data(), W.data(), out.x.data());
      return out;
    }
  }
  if constexpr (std::is_same_v<T, double>) {
    if (em.on()) {
      using M = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      const Eigen::Map<const M> X(in.x.data(), N, nin), Wm(W.data(), nout, nin);
      Eigen::Map<M>(out.x.data(), N, nout).noalias() = X * Wm.transpose();
      const M Wa = Wm.cwiseAbs();
      const double wnorm = Wa.rowwise().sum().maxCoeff();
      out.e.resize(static_cast<std::size_t>(N));
      const index_t chunk = 256;  // rows of |X||W|^T at a time (memory: chunk x nout)
      for (index_t r0 = 0; r0 < N; r0 += chunk) {
        const index_t nr = std::min(chunk, N - r0);
        const M A = X.middleRows(r0, nr).cwiseAbs() * Wa.transpose();
        for (index_t r = 0; r < nr; ++r)
          out.e[static_cast<std::size_t>(r0 + r)] = wnorm * in.e[static_cast<std::size_t>(r0 + r)] +
                                                    em.gamma(static_cast<double>(nin)) * A.row(r).maxCoeff();
      }
      return out;
    }
  }
  // Each output is the sequential sum over c; four outputs at a time (independent accumulators,
  // the same values) so that the loop is not bound by one addition's latency.
  for (index_t r = 0; r < N; ++r) {
    const T* x = in.x.ptr(r);
    T* y = out.x.ptr(r);
    index_t o = 0;
    for (; o + 4 <= nout; o += 4) {
      const T *w0 = W.ptr(o), *w1 = W.ptr(o + 1), *w2 = W.ptr(o + 2), *w3 = W.ptr(o + 3);
      T a0(0), a1(0), a2(0), a3(0);
      for (index_t c = 0; c < nin; ++c) {
        a0 += w0[c] * x[c];
        a1 += w1[c] * x[c];
        a2 += w2[c] * x[c];
        a3 += w3[c] * x[c];
      }
      y[o] = a0;
      y[o + 1] = a1;
      y[o + 2] = a2;
      y[o + 3] = a3;
    }
    for (; o < nout; ++o) {
      const T* wr = W.ptr(o);
      T acc(0);
      for (index_t c = 0; c < nin; ++c) acc += wr[c] * x[c];
      y[o] = acc;
    }
  }
  if (em.on()) {
    double wnorm = 0;
    for (index_t o = 0; o < nout; ++o) wnorm = std::max(wnorm, row_l1(W.ptr(o), nin));
    out.e.resize(static_cast<std::size_t>(N));
    for (index_t r = 0; r < N; ++r) {
      const T* x = in.x.ptr(r);
      double absdot = 0;
      for (index_t o = 0; o < nout; ++o) {
        double s = 0;
        for (index_t c = 0; c < nin; ++c) s += std::abs(to_double(W(o, c)) * to_double(x[c]));
        absdot = std::max(absdot, s);
      }
      out.e[static_cast<std::size_t>(r)] = wnorm * in.e[static_cast<std::size_t>(r)] + em.gamma(static_cast<double>(nin)) * absdot;
    }
  }
  return out;
}

}  // namespace oasis::model
