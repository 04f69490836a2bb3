// bench/bench_support.hpp — shared pieces of the CPU benchmarks.
#pragma once

#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/grad/attention_backward.hpp"

namespace oasis_bench {

/// Ceilings measured earlier in this run (0 until their benchmark ran).
extern double g_gemm_gflops;
extern double g_triad_gbs;
int threads();

/// Validates a fast attention result at its exact configuration before it is timed: the last
/// `last_rows` query rows (all keys; bottom-right causal alignment keeps their visibility) and,
/// for causal calls, the first `first_rows` rows, against oasis::mp50 and the plain float
/// reference under the kernel parity rule (tests/parity/parity_bound.hpp). Returns "" when it
/// holds, else a report.
std::string validate_attention(const oasis::Tensor<float>& q, const oasis::Tensor<float>& k,
                               const oasis::Tensor<float>& v, const oasis::AttentionOptions& opt,
                               const oasis::AttentionResult<float>& fast, oasis::index_t last_rows,
                               oasis::index_t first_rows);

/// Validates a fast attention backward before it is timed, on slices whose gradients do not
/// depend on the rest of the call: the last `last_rows` query rows with every key (their dq
/// and, causal only, the dk and dv of the last `last_rows` keys, which no other row sees) and,
/// causal only, the first `first_rows` rows with the keys they see (their dq). Against the long
/// double oracle and the float reference under the kernel parity rule, the floor being
/// attention_backward_bounds; the null logits' gradient (a sum over every row) is not covered
/// here (the tests check it). Returns "" when the rule holds, else a report.
std::string validate_attention_backward(const oasis::Tensor<float>& q, const oasis::Tensor<float>& k,
                                        const oasis::Tensor<float>& v, const oasis::AttentionCotangents<float>& d,
                                        const oasis::AttentionOptions& opt, const oasis::AttentionGrads<float>& fast,
                                        oasis::index_t last_rows, oasis::index_t first_rows);

/// The token ids of the model benchmarks, (7919 i + 13) mod vocab for i < T; `as_tensor` receives
/// them as the [1, T] input tensor "ids".
inline std::vector<oasis::index_t> model_ids(oasis::index_t T, oasis::index_t vocab, oasis::Tensor<double>& as_tensor) {
  std::vector<oasis::index_t> ids;
  as_tensor = oasis::Tensor<double>({1, T});
  for (oasis::index_t i = 0; i < T; ++i) {
    ids.push_back((7919 * i + 13) % vocab);
    as_tensor[i] = static_cast<double>(ids.back());
  }
  return ids;
}

/// Aborts the benchmark run (exit status 2) with a message: a configuration failed validation.
[[noreturn]] void abort_run(const std::string& what);

}  // namespace oasis_bench
