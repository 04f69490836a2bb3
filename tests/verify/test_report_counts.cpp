// tests/verify/test_report_counts.cpp — every report line counts what it judged: "N of M elements
// outside the bound" with M the elements checked, in the table and in the JSON, for the end-to-end
// verdict of a logits-only model trace (fast and mp50 oracles), a tensor whose shape is wrong and
// a model gradient; and the figures of a float64 output judged against the fast oracle's double
// reference, whose own error there exceeds the error it measures, say what they can be at most.
#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <string>
#include <vector>

#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace io = oasis::io;
namespace om = oasis::model;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::Tensor;

namespace {

constexpr index_t kB = 2, kT = 5;

struct Case {
  om::ModelConfig cfg;
  om::Model<double> model;
  io::TensorMap weights, inputs;
  std::vector<index_t> ids;
};

Case make_case() {
  om::ModelConfig cfg;
  cfg.init_std = 0.3;
  om::Model<double> m = om::Model<double>::initialized(cfg, 4401);
  io::TensorMap w;
  for (const auto& [name, t] : m.parameters()) w.emplace(name, io::StoredTensor{io::DType::f64, t});
  std::vector<index_t> ids;
  Tensor<double> idt({kB, kT});
  for (index_t i = 0; i < kB * kT; ++i) {
    ids.push_back((5 * i + 2) % cfg.vocab_size);
    idt[i] = static_cast<double>(ids.back());
  }
  return {cfg, std::move(m), std::move(w), {{"ids", {io::DType::i32, idt}}}, ids};
}

/// The table line of tensor `name` and its JSON object (from the name to the next tensor).
std::string line_of(const std::string& table, const std::string& name) {
  const auto at = table.find("\n  " + name + " ");
  return at == std::string::npos ? "" : table.substr(at + 1, table.find('\n', at + 1) - at - 1);
}
std::string json_of(const std::string& json, const std::string& name) {
  const auto at = json.find("{\"name\":\"" + name + "\"");
  return at == std::string::npos ? "" : json.substr(at, json.find("]}", at) - at);
}

/// The counts of tensor `name` agree in the report, its table line and its JSON.
void expect_counts(const verify::CompareReport& r, const std::string& name, index_t checked, index_t violations) {
  const verify::TensorReport* t = nullptr;
  for (const auto& x : r.tensors)
    if (x.name == name) t = &x;
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(t->checked, checked) << name;
  EXPECT_EQ(t->violations, violations) << name;
  EXPECT_LE(t->violations, t->checked) << name;
  const std::string line = line_of(verify::format_report(r), name), js = json_of(verify::report_json(r), name);
  if (violations > 0 && t->problem.empty())
    EXPECT_NE(line.find(std::to_string(violations) + " of " + std::to_string(checked) + " elements"), std::string::npos) << line;
  EXPECT_NE(js.find("\"checked\":" + std::to_string(checked) + ","), std::string::npos) << js;
  EXPECT_NE(js.find("\"violations\":" + std::to_string(violations) + ","), std::string::npos) << js;
}

}  // namespace

TEST(ReportCounts, LogitsOnlyEndToEndLineCountsItsElements) {
  const Case c = make_case();
  const index_t V = c.cfg.vocab_size, n = kB * kT * V;
  const om::ForwardResult<float> f = c.model.cast<float>().forward(c.ids, kB, kT);
  io::TensorMap trace{{"logits", {io::DType::f32, f.logits.cast<double>()}}};
  for (verify::Oracle o : {verify::Oracle::fast, verify::Oracle::mp50}) {
    verify::CompareOptions opt;
    opt.oracle = o;
    const verify::CompareReport ok = verify::check_model(c.cfg, c.weights, c.inputs, trace, {}, opt);
    EXPECT_TRUE(ok.passed) << verify::format_report(ok);
    expect_counts(ok, "logits", n, 0);
    // every logit of the first token row moved by 1: that row's V elements fail, no other
    io::TensorMap bad = trace;
    for (index_t v = 0; v < V; ++v) bad.at("logits").values[v] += 1.0;
    const verify::CompareReport r = verify::check_model(c.cfg, c.weights, c.inputs, bad, {}, opt);
    EXPECT_FALSE(r.passed);
    expect_counts(r, "logits", n, V);
  }
}

TEST(ReportCounts, WrongShapeCountsEveryElement) {
  const Case c = make_case();
  const om::ForwardResult<float> f = c.model.cast<float>().forward(c.ids, kB, kT);
  io::TensorMap trace{{"logits", {io::DType::f32, f.logits.cast<double>().reshaped({kB * kT, c.cfg.vocab_size})}}};
  const verify::CompareReport r = verify::check_model(c.cfg, c.weights, c.inputs, trace);
  EXPECT_FALSE(r.passed);
  const index_t n = kB * kT * c.cfg.vocab_size;
  expect_counts(r, "logits", n, n);
}

TEST(ReportCounts, ModelGradientLineCountsItsElements) {
  const Case c = make_case();
  const index_t V = c.cfg.vocab_size, d = c.cfg.d_model;
  io::TensorMap in = c.inputs;
  Tensor<double> dl({kB, kT, V});
  for (index_t i = 0; i < dl.size(); ++i) dl[i] = static_cast<double>(static_cast<float>(std::sin(0.7 * static_cast<double>(i))));
  in.emplace("grad_logits", io::StoredTensor{io::DType::f32, dl});
  // a gradient of the embeddings that is 0 everywhere: wrong wherever the true one is not small
  io::TensorMap out{{"grad_embeddings", {io::DType::f32, Tensor<double>({kB, kT, d})}}};
  const verify::CompareReport r = verify::check_model(c.cfg, c.weights, in, out);
  EXPECT_FALSE(r.passed);
  const verify::TensorReport& t = r.tensors.at(0);
  EXPECT_GT(t.violations, 0);
  expect_counts(r, "grad_embeddings", kB * kT * d, t.violations);
}

TEST(ReportCounts, FiguresAgainstADoubleReferenceSayWhatTheyCanBeAtMost) {
  // float64 attention with sinks of 400 and 630: out ~ e^-400, and the double reference's own
  // error (about the worst-case bound) is far above the error of a correct float64 kernel
  std::vector<double> v0(2 * 48 * 16);
  for (std::size_t i = 0; i < v0.size(); ++i) v0[i] = static_cast<double>(static_cast<float>(std::sin(1.3 * i + 0.2)));
  Tensor<double> q({1, 2, 48, 16}, v0), k({1, 2, 48, 16}, v0), v({1, 2, 48, 16}, v0);
  for (index_t i = 0; i < k.size(); ++i) k[i] = static_cast<double>(static_cast<float>(std::cos(0.7 * static_cast<double>(i))));
  oasis::AttentionOptions o;
  o.causal = true;
  o.null_logits = {400.0, 630.0};
  const auto r = oasis::token_attention(q, k, v, o);
  const io::TensorMap in{{"q", {io::DType::f64, q}}, {"k", {io::DType::f64, k}}, {"v", {io::DType::f64, v}},
                         {"null_logits", {io::DType::f64, Tensor<double>({2}, o.null_logits)}}};
  const io::TensorMap out{{"out", {io::DType::f64, r.out}}};
  verify::CompareOptions fast, mp;
  fast.policy = mp.policy = verify::Policy::worst_case;
  mp.oracle = verify::Oracle::mp50;
  const auto opts = io::json::parse(R"({"causal": true})");
  const verify::TensorReport f = verify::check("attention", in, out, opts, fast).tensors.at(0);
  const verify::TensorReport m = verify::check("attention", in, out, opts, mp).tensors.at(0);
  ASSERT_TRUE(f.passed && m.passed);
  const std::string tag = "against the double reference: exactly at most ";
  const auto at = f.bound.find(tag);
  ASSERT_NE(at, std::string::npos) << f.bound;
  const double most = std::stod(f.bound.substr(at + tag.size()));
  EXPECT_GE(most, m.max_abs) << f.bound;
  // what the double reference measures lies within its own error of the exact figure, on either side
  // (and may coincide with it: the fused rows' reference does on this data on some CPUs)
  const double own = most - f.max_abs;
  EXPECT_GT(own, 0.0) << f.bound;
  EXPECT_GE(m.max_abs, f.max_abs - own) << std::setprecision(17) << f.max_abs << " " << m.max_abs << " " << most;
  EXPECT_EQ(m.bound.find(tag), std::string::npos) << m.bound;  // mp50's figures are exact
}

