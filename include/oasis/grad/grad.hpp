// oasis/grad/grad.hpp — the backward oracle in one include (docs/spec.md §8).
//
//   normalizer_backward.hpp   dz, ds of one softmax / Softmax1 row (the null as a category)
//   attention_backward.hpp    token attention: dq, dk, dv (GQA sums), null logits, bias, scores
//   coupling_backward.hpp     psi, centring, the clamps, beta = softplus(theta)
//   depth_backward.hpp        depth routing: sources (mix), g_old, psi, beta, theta
//   pseudo_query_backward.hpp Kimi pseudo-query logits: w, gain, sources (keys)
//   router_backward.hpp       the model's routers (Kimi, authors'): logits + routing, sources in total
//   backward_bounds.hpp       derived error bounds of the backward in T against high precision
//   depth_backward_bounds.hpp depth routing's bounds: the worst-case line and the probabilistic one
//   router_backward_bounds.hpp the routers' bounds, composed from the steps' bounds
//   instances.hpp             the compiled instances (float, double, long double, mp50, mpfr50)
#pragma once

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/coupling_backward.hpp"
#include "oasis/grad/depth_backward.hpp"
#include "oasis/grad/depth_backward_bounds.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis/grad/normalizer_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/grad/router_backward.hpp"
#include "oasis/grad/router_backward_bounds.hpp"
