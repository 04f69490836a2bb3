// oasis/core/instances.hpp — explicit instantiations of the core for the supported scalars.
//
// The compiled library (target oasis::oasis, src/core/instantiate_*.cpp) instantiates the core
// once per scalar; code that links it sees `extern template` declarations here and does not
// re-instantiate — which matters for the multiprecision types (15–60 s per translation unit).
// Header-only use (no oasis::oasis) simply leaves OASIS_COMPILED_INSTANCES undefined.
#pragma once

#include "oasis/ops/attention.hpp"
#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/normalizer.hpp"

#define OASIS_CORE_INSTANCES(EXT, T)                                                              \
  EXT template ::oasis::RowStats<T> oasis::normalize_row<T>(::oasis::RowNorm, const T*,          \
      ::oasis::index_t, const T&, T*, ::oasis::MaskedRow, const char*);                          \
  EXT template ::oasis::RowProbs<T> oasis::softmax_null<T>(const ::oasis::Vec<T>&, const T&);   \
  EXT template ::oasis::RowProbs<T> oasis::softmax<T>(const ::oasis::Vec<T>&, ::oasis::MaskedRow); \
  EXT template T oasis::logsumexp<T>(const ::oasis::Vec<T>&);                                   \
  EXT template ::oasis::AttentionResult<T> oasis::token_attention<T>(const ::oasis::Tensor<T>&,  \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::AttentionOptions&);   \
  EXT template ::oasis::Tensor<T> oasis::null_statistic<T>(const ::oasis::Tensor<T>&);          \
  EXT template ::oasis::Vec<T> oasis::centre_null_statistic<T>(const ::oasis::Vec<T>&,          \
      const std::vector<::oasis::SourceKind>&, const ::oasis::CouplingOptions&);                 \
  EXT template ::oasis::Vec<T> oasis::couple_depth_logits<T>(const ::oasis::Vec<T>&,            \
      const ::oasis::Vec<T>&, const T&, const ::oasis::CouplingOptions&);                         \
  EXT template ::oasis::DepthWeights<T> oasis::depth_weights<T>(const ::oasis::Vec<T>&,         \
      const ::oasis::Vec<T>&, const std::vector<::oasis::SourceKind>&, const ::oasis::DepthOptions&); \
  EXT template ::oasis::DepthRoute<T> oasis::attn_res_route<T>(const ::oasis::Tensor<T>&,       \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const std::vector<::oasis::SourceKind>&, \
      const ::oasis::DepthOptions&);                                                              \
  EXT template ::oasis::Tensor<T> oasis::pseudo_query_logits<T>(const ::oasis::Tensor<T>&,      \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::KeyNormOptions&);

#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_INSTANTIATING)
OASIS_CORE_INSTANCES(extern, float)
OASIS_CORE_INSTANCES(extern, double)
OASIS_CORE_INSTANCES(extern, long double)
OASIS_CORE_INSTANCES(extern, ::oasis::mp50)
#if defined(OASIS_HAVE_MPFR)
OASIS_CORE_INSTANCES(extern, ::oasis::mpfr50)
#endif
#endif
