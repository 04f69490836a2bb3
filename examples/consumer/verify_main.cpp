// Consumer of the installed package's compare engine (oasis::verify): an attention output in
// float32 storage passes its check, and the same output with one element off fails it.
#include <cstdio>
#include <random>

#include <oasis/io/dtype.hpp>
#include <oasis/ops/attention.hpp>
#include <oasis/verify/compare.hpp>

int main() {
  namespace io = oasis::io;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n01;
  auto draw = [&] {
    oasis::Tensor<double> x({1, 2, 16, 8});
    for (oasis::index_t i = 0; i < x.size(); ++i) x[i] = io::round_to_dtype(n01(rng), io::DType::f32);
    return x;
  };
  const oasis::Tensor<double> q = draw(), k = draw(), v = draw();
  oasis::Tensor<double> out = oasis::token_attention(q, k, v, oasis::AttentionOptions{}).out;
  for (oasis::index_t i = 0; i < out.size(); ++i) out[i] = io::round_to_dtype(out[i], io::DType::f32);
  const io::TensorMap in{{"q", {io::DType::f32, q}}, {"k", {io::DType::f32, k}}, {"v", {io::DType::f32, v}}};
  const oasis::verify::CompareReport good = oasis::verify::check("attention", in, {{"out", {io::DType::f32, out}}});
  out[5] = io::round_to_dtype(out[5] + 0.5, io::DType::f32);
  const oasis::verify::CompareReport bad = oasis::verify::check("attention", in, {{"out", {io::DType::f32, out}}});
  std::printf("attention check: %s; with one element off by 0.5: %s\n", good.passed ? "PASS" : "FAIL",
              bad.passed ? "PASS" : "FAIL");
  const bool ok = good.passed && !bad.passed;
  std::printf(ok ? "consumer_verify: OK\n" : "consumer_verify: FAILED\n");
  return ok ? 0 : 1;
}
