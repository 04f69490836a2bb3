// oasis/research/metrics.hpp — outlier and sink metrics over tensors (docs/spec.md §6, docs/baselines.md).
//
// They take plain tensors, so they apply to any model trace (hidden states, attention
// probabilities, null probabilities). Accumulation is in double with two passes (mean first,
// then central moments); results are double.
//
//   kurtosis_regularised         Bondarenko et al. (2023), their code: per sequence s over its
//                                flattened T x d values x, mean((x - mu)^4) / (std^4 + 1e-6),
//                                std Bessel-corrected; averaged over sequences. The 1e-6 is an
//                                absolute term: for activations of scale std << 0.03 it
//                                dominates std^4 and drives the value towards 0 (std 1e-3 gives
//                                ~1e-6 for a Gaussian). The form of the paper's Tables 1-3.
//   kurtosis_pearson             plain Pearson kurtosis m4 / m2^2 with population moments
//                                (scipy.stats.kurtosis(fisher=False, bias=True); a Gaussian
//                                gives 3), scale-invariant; averaged over sequences.
//   kurtosis_excess              kurtosis_pearson - 3 (scipy.stats.kurtosis's default).
//   max infinity norm            per sequence max |x|, averaged over sequences; max over tensors.
//   BOS mass                     mean over (batch, head, query) of p_{t,0}.
//   attention entropy            mean over rows of -sum p log p (0 log 0 = 0), with the null
//                                category included, excluded (partial sum over real keys), or
//                                over the real keys renormalised to sum 1.
//   null mass                    mean of p_null.
//   sink_rate (Gu et al. 2025)   fraction of (sample, layer, head) triples whose first-key
//                                importance (1/Tq) sum_t p_{b,h,t,0} exceeds epsilon: the
//                                threshold is applied per sample, then averaged (their
//                                compute_attention_sink). Key 0 is visible to every causal
//                                query, so their (1/(T-k+1)) sum_{t>=k} p_{t,k} at k = first key
//                                has the factor 1/T.
//   sink_rate_batch_mean         the importance averaged over the batch first, then thresholded
//                                per (layer, head); equals sink_rate for B = 1 only.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis {

/// Epsilon of the regularised kurtosis denominator std^4 + 1e-6 (Bondarenko et al.'s code).
inline constexpr double kKurtosisEps = 1e-6;
/// Sink-rate threshold of Gu et al. (2025).
inline constexpr double kSinkRateEpsilon = 0.3;

namespace detail {
template <class T>
void require_sequences(const Tensor<T>& x, const char* arg, index_t min_per_seq) {
  OASIS_REQUIRE(x.rank() >= 1 && x.dim(0) > 0, arg, "needs a leading sequence dimension, got shape ",
                shape_str(x.shape()));
  OASIS_REQUIRE(x.size() / x.dim(0) >= min_per_seq, arg, "needs at least ", min_per_seq,
                " values per sequence, got shape ", shape_str(x.shape()));
  require_finite(x, arg);
}
/// Sums of central powers s2 = sum (x - mu)^2, s4 = sum (x - mu)^4, two passes in double.
struct CentralSums {
  double s2 = 0, s4 = 0;
};
template <class T>
CentralSums central_sums(const T* x, index_t n) {
  double mu = 0;
  for (index_t i = 0; i < n; ++i) mu += to_double(x[i]);
  mu /= static_cast<double>(n);
  CentralSums m;
  for (index_t i = 0; i < n; ++i) {
    const double d = to_double(x[i]) - mu, d2 = d * d;
    m.s2 += d2;
    m.s4 += d2 * d2;
  }
  return m;
}
}  // namespace detail

/// Regularised kurtosis of n values (Bondarenko et al.'s code): mean((x - mu)^4) / (s^4 + 1e-6)
/// with s^2 = sum (x - mu)^2 / (n - 1). Needs n >= 2.
template <class T>
double kurtosis_regularised_values(const T* x, index_t n) {
  OASIS_REQUIRE(n >= 2, "x", "kurtosis needs at least 2 values (Bessel correction), got ", n);
  const detail::CentralSums m = detail::central_sums(x, n);
  const double var = m.s2 / static_cast<double>(n - 1);
  return (m.s4 / static_cast<double>(n)) / (var * var + kKurtosisEps);
}

/// Pearson kurtosis of n values: m4 / m2^2 with population central moments m_k = mean((x - mu)^k).
/// Undefined (throws) for a constant sequence.
template <class T>
double kurtosis_pearson_values(const T* x, index_t n) {
  OASIS_REQUIRE(n >= 2, "x", "kurtosis needs at least 2 values, got ", n);
  const detail::CentralSums m = detail::central_sums(x, n);
  OASIS_REQUIRE(m.s2 > 0.0, "x", "Pearson kurtosis is undefined for a constant sequence (zero variance)");
  const double m2 = m.s2 / static_cast<double>(n), m4 = m.s4 / static_cast<double>(n);
  return m4 / (m2 * m2);
}

/// Which kurtosis estimator (docs/baselines.md, "Kurtosis: which estimator").
enum class KurtosisEstimator {
  regularised,  ///< mean((x-mu)^4) / (std_Bessel^4 + 1e-6): the paper tables (authors' code)
  pearson,      ///< m4 / m2^2 (a Gaussian gives 3)
  excess,       ///< m4 / m2^2 - 3 (a Gaussian gives 0; scipy's default)
};

/// Kurtosis of a tensor [S, ...] with estimator `est`: per sequence over the flattened remaining
/// dimensions, averaged over the S sequences.
template <class T>
double kurtosis(const Tensor<T>& x, KurtosisEstimator est) {
  detail::require_sequences(x, "x", 2);
  const index_t S = x.dim(0), n = x.size() / S;
  double acc = 0;
  for (index_t s = 0; s < S; ++s) {
    const T* xs = x.data() + s * n;
    acc += est == KurtosisEstimator::regularised ? kurtosis_regularised_values(xs, n) : kurtosis_pearson_values(xs, n);
  }
  const double k = acc / static_cast<double>(S);
  return est == KurtosisEstimator::excess ? k - 3.0 : k;
}

template <class T>
double kurtosis_regularised(const Tensor<T>& x) { return kurtosis(x, KurtosisEstimator::regularised); }
template <class T>
double kurtosis_pearson(const Tensor<T>& x) { return kurtosis(x, KurtosisEstimator::pearson); }
template <class T>
double kurtosis_excess(const Tensor<T>& x) { return kurtosis(x, KurtosisEstimator::excess); }

/// Max infinity norm of a tensor [S, ...]: per sequence max |x|, averaged over sequences.
template <class T>
double max_inf_norm(const Tensor<T>& x) {
  detail::require_sequences(x, "x", 1);
  const index_t S = x.dim(0), n = x.size() / S;
  double acc = 0;
  for (index_t s = 0; s < S; ++s) {
    double m = 0;
    for (index_t i = 0; i < n; ++i) m = std::max(m, std::abs(to_double(x[s * n + i])));
    acc += m;
  }
  return acc / static_cast<double>(S);
}

/// Outlier statistics over the tracked tensors of a trace (Tables 1-3: "Avg. kurtosis",
/// "Max inf. norm").
struct OutlierSummary {
  double avg_kurtosis = 0;  ///< mean over tensors of kurtosis(x, estimator)
  double max_kurtosis = 0;  ///< max over tensors of kurtosis(x, estimator)
  double max_inf_norm = 0;  ///< max over tensors of max_inf_norm()
  index_t tensors = 0;      ///< number of tracked tensors
};

/// Default estimator: the regularised one of the paper tables (Bondarenko et al.'s code).
template <class T>
OutlierSummary outlier_summary(const std::vector<Tensor<T>>& tracked,
                               KurtosisEstimator estimator = KurtosisEstimator::regularised) {
  OASIS_REQUIRE(!tracked.empty(), "tracked", "needs at least one tensor");
  OutlierSummary r;
  r.max_kurtosis = -HUGE_VAL;
  for (const Tensor<T>& x : tracked) {
    const double k = kurtosis(x, estimator);
    r.avg_kurtosis += k;
    r.max_kurtosis = std::max(r.max_kurtosis, k);
    r.max_inf_norm = std::max(r.max_inf_norm, max_inf_norm(x));
  }
  r.tensors = static_cast<index_t>(tracked.size());
  r.avg_kurtosis /= static_cast<double>(r.tensors);
  return r;
}

namespace detail {
template <class T>
void require_probs(const Tensor<T>& probs, const char* arg) {
  require_rank(probs, 4, arg, "[B, H, Tq, Tk]");
  OASIS_REQUIRE(probs.size() > 0, arg, "empty dimension in shape ", shape_str(probs.shape()));
  // A normalised probability may exceed 1 by a few roundings of T (e.g. 1 - tau in sparsemax).
  const double hi = 1.0 + 4.0 * to_double(std::numeric_limits<T>::epsilon());
  for (index_t i = 0; i < probs.size(); ++i) {
    const double p = to_double(probs[i]);
    OASIS_REQUIRE(p >= 0.0 && p <= hi, arg, "entry ", p, " at flat index ", i, " is not a probability");
  }
}
template <class T>
void require_p_null(const Tensor<T>& p_null, const Tensor<T>& probs, const char* arg) {
  require_rank(p_null, 3, arg, "[B, H, Tq]");
  OASIS_REQUIRE(p_null.dim(0) == probs.dim(0) && p_null.dim(1) == probs.dim(1) && p_null.dim(2) == probs.dim(2),
                arg, "shape ", shape_str(p_null.shape()), " does not match probs ", shape_str(probs.shape()));
  for (index_t i = 0; i < p_null.size(); ++i) {
    const double p = to_double(p_null[i]);
    OASIS_REQUIRE(p >= 0.0 && p <= 1.0 + 4.0 * to_double(std::numeric_limits<T>::epsilon()), arg, "entry ", p,
                  " at flat index ", i, " is not a probability");
  }
}
}  // namespace detail

/// BOS (first-token) mass: mean over (b, h, t) of probs[b, h, t, 0]. probs [B, H, Tq, Tk].
template <class T>
double bos_mass(const Tensor<T>& probs) {
  detail::require_probs(probs, "probs");
  const index_t rows = probs.size() / probs.dim(3);
  double acc = 0;
  for (index_t r = 0; r < rows; ++r) acc += to_double(probs[r * probs.dim(3)]);
  return acc / static_cast<double>(rows);
}

/// Null mass: mean of p_null [B, H, Tq].
template <class T>
double null_mass(const Tensor<T>& p_null) {
  require_rank(p_null, 3, "p_null", "[B, H, Tq]");
  OASIS_REQUIRE(p_null.size() > 0, "p_null", "empty dimension in shape ", shape_str(p_null.shape()));
  require_finite(p_null, "p_null");
  double acc = 0;
  for (index_t i = 0; i < p_null.size(); ++i) acc += to_double(p_null[i]);
  return acc / static_cast<double>(p_null.size());
}

/// How attention_entropy treats the null category.
enum class NullInEntropy {
  include,      ///< H = -sum_j p_j log p_j - p_null log p_null (the full distribution)
  exclude,      ///< H = -sum_j p_j log p_j (partial sum over the real keys, not renormalised)
  renormalize,  ///< entropy of q_j = p_j / sum_k p_k over real keys (0 when sum_k p_k = 0)
};

/// Mean over rows (b, h, t) of the attention entropy in nats (0 log 0 = 0). p_null [B, H, Tq]
/// may be empty (no null category: treated as 0; include and exclude then coincide).
template <class T>
double attention_entropy(const Tensor<T>& probs, const Tensor<T>& p_null = {},
                         NullInEntropy mode = NullInEntropy::include) {
  detail::require_probs(probs, "probs");
  if (!p_null.empty()) detail::require_p_null(p_null, probs, "p_null");
  const index_t Tk = probs.dim(3), rows = probs.size() / Tk;
  auto plogp = [](double p) { return p > 0 ? p * std::log(p) : 0.0; };
  double acc = 0;
  for (index_t r = 0; r < rows; ++r) {
    const T* p = probs.data() + r * Tk;
    double h = 0;
    if (mode == NullInEntropy::renormalize) {
      double sum = 0;
      for (index_t j = 0; j < Tk; ++j) sum += to_double(p[j]);
      if (sum > 0)
        for (index_t j = 0; j < Tk; ++j) h -= plogp(to_double(p[j]) / sum);
    } else {
      for (index_t j = 0; j < Tk; ++j) h -= plogp(to_double(p[j]));
      if (mode == NullInEntropy::include && !p_null.empty()) h -= plogp(to_double(p_null[r]));
    }
    acc += h;
  }
  return acc / static_cast<double>(rows);
}

/// First-key importance per sample and head: imp[b][h] = (1/Tq) sum_t probs[b, h, t, 0].
template <class T>
std::vector<std::vector<double>> first_key_importance_per_sample(const Tensor<T>& probs) {
  detail::require_probs(probs, "probs");
  const index_t B = probs.dim(0), H = probs.dim(1), Tq = probs.dim(2);
  std::vector<std::vector<double>> imp(static_cast<std::size_t>(B), std::vector<double>(static_cast<std::size_t>(H), 0.0));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      double& a = imp[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)];
      for (index_t t = 0; t < Tq; ++t) a += to_double(probs(b, h, t, 0));
      a /= static_cast<double>(Tq);
    }
  return imp;
}

/// First-key importance per head averaged over the batch: (1/(B Tq)) sum_{b,t} probs[b, h, t, 0].
template <class T>
std::vector<double> first_key_importance(const Tensor<T>& probs) {
  const std::vector<std::vector<double>> per = first_key_importance_per_sample(probs);
  std::vector<double> imp(per.front().size(), 0.0);
  for (const std::vector<double>& row : per)
    for (std::size_t h = 0; h < row.size(); ++h) imp[h] += row[h];
  for (double& x : imp) x /= static_cast<double>(per.size());
  return imp;
}

namespace detail {
inline void require_sink_args(std::size_t layers, double epsilon) {
  OASIS_REQUIRE(layers > 0, "probs_per_layer", "needs at least one layer");
  OASIS_REQUIRE(std::isfinite(epsilon) && epsilon >= 0.0 && epsilon < 1.0, "epsilon",
                "must be in [0, 1), got ", epsilon);
}
}  // namespace detail

/// Sink rate (Gu et al. 2025): fraction of (sample, layer, head) triples whose first-key
/// importance exceeds epsilon (strictly). probs_per_layer: one [B, H, Tq, Tk] tensor per layer.
template <class T>
double sink_rate(const std::vector<Tensor<T>>& probs_per_layer, double epsilon = kSinkRateEpsilon) {
  detail::require_sink_args(probs_per_layer.size(), epsilon);
  index_t triples = 0, sinks = 0;
  for (const Tensor<T>& p : probs_per_layer)
    for (const std::vector<double>& row : first_key_importance_per_sample(p))
      for (double imp : row) {
        ++triples;
        if (imp > epsilon) ++sinks;
      }
  return static_cast<double>(sinks) / static_cast<double>(triples);
}

/// Batch-mean sink rate: fraction of (layer, head) pairs whose batch-averaged first-key
/// importance (first_key_importance) exceeds epsilon. Not Gu et al.'s estimator for B > 1.
template <class T>
double sink_rate_batch_mean(const std::vector<Tensor<T>>& probs_per_layer, double epsilon = kSinkRateEpsilon) {
  detail::require_sink_args(probs_per_layer.size(), epsilon);
  index_t heads = 0, sinks = 0;
  for (const Tensor<T>& p : probs_per_layer)
    for (double imp : first_key_importance(p)) {
      ++heads;
      if (imp > epsilon) ++sinks;
    }
  return static_cast<double>(sinks) / static_cast<double>(heads);
}

}  // namespace oasis
