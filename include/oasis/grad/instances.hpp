// oasis/grad/instances.hpp — explicit instantiations of the backward oracle for the supported scalars.
//
// As oasis/core/instances.hpp for the forward: src/core/instantiate_grad_*.cpp instantiate the
// backward once per scalar (the multiprecision ones in their own translation units), and code
// that links oasis::oasis sees the `extern template` declarations below.
#pragma once

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/coupling_backward.hpp"
#include "oasis/grad/depth_backward.hpp"
#include "oasis/grad/normalizer_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/grad/router_backward.hpp"
#include "oasis/core/multiprecision.hpp"

#define OASIS_GRAD_INSTANCES(EXT, T)                                                                 \
  EXT template T oasis::normalize_row_backward<T>(::oasis::RowNorm, const T*, const T&, ::oasis::index_t, \
                                                  const T*, const T&, const T&, T*);                \
  EXT template ::oasis::AttentionGrads<T> oasis::token_attention_backward<T>(const ::oasis::Tensor<T>&,  \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::AttentionCotangents<T>&,     \
      const ::oasis::AttentionOptions&);                                                              \
  EXT template ::oasis::Tensor<T> oasis::null_statistic_backward<T>(const ::oasis::Tensor<T>&, ::oasis::index_t); \
  EXT template ::oasis::Tensor<T> oasis::null_statistic_from_mass_backward<T>(const ::oasis::Tensor<T>&, \
                                                                               const ::oasis::Tensor<T>&); \
  EXT template ::oasis::Vec<T> oasis::centre_null_statistic_backward<T>(const ::oasis::Vec<T>&,        \
      const std::vector<::oasis::SourceKind>&, const ::oasis::CouplingOptions&);                      \
  EXT template ::oasis::CouplingGrads<T> oasis::couple_depth_logits_backward<T>(const ::oasis::Vec<T>&, \
      const ::oasis::Vec<T>&, const T&, const ::oasis::Vec<T>&, const ::oasis::CouplingOptions&);     \
  EXT template ::oasis::DepthGrads<T> oasis::attn_res_route_backward<T>(const ::oasis::Tensor<T>&,     \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const std::vector<::oasis::SourceKind>&,   \
      const ::oasis::DepthOptions&, const ::oasis::DepthCotangents<T>&);                              \
  EXT template ::oasis::PseudoQueryGrads<T> oasis::pseudo_query_logits_backward<T>(                    \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&,                 \
      const ::oasis::Tensor<T>&, const ::oasis::KeyNormOptions&);                                     \
  EXT template ::oasis::model::AuthorsLogitGrads<T> oasis::model::authors_router_logits_backward<T>(   \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const T&,       \
      const ::oasis::Tensor<T>&);                                                                     \
  EXT template ::oasis::model::RouteGrads<T> oasis::model::kimi_route_backward<T>(                     \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&,                 \
      const ::oasis::KeyNormOptions&, const ::oasis::Tensor<T>&, const std::vector<::oasis::SourceKind>&, \
      const ::oasis::DepthOptions&, const ::oasis::DepthCotangents<T>&);                              \
  EXT template ::oasis::model::RouteGrads<T> oasis::model::authors_route_backward<T>(                  \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const T&,       \
      const ::oasis::Tensor<T>&, const std::vector<::oasis::SourceKind>&, const ::oasis::DepthOptions&, \
      const ::oasis::DepthCotangents<T>&);

#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_INSTANTIATING)
OASIS_GRAD_INSTANCES(extern, float)
OASIS_GRAD_INSTANCES(extern, double)
OASIS_GRAD_INSTANCES(extern, long double)
OASIS_GRAD_INSTANCES(extern, ::oasis::mp50)
#if defined(OASIS_HAVE_MPFR)
OASIS_GRAD_INSTANCES(extern, ::oasis::mpfr50)
#endif
#endif
