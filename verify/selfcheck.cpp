// verify/selfcheck.cpp — `oasis-verify selfcheck` (see selfcheck.hpp).
#include "selfcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>

#include "oasis/backends/registry.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

#include "check.hpp"

namespace oasis::verify {
namespace {

constexpr double kNotApplicable = std::numeric_limits<double>::quiet_NaN();
const char* kParityRef = "docs/spec.md §2-4, tolerance policy (docs/verify.md)";

// ---------------------------------------------------------------------------------------------
// parity: every available backend of the registry (float; oasis/backends/registry.hpp) against the
// mp50 oracle on the same float inputs, under the compare engine's worst-case policy with D = f32
// (verify::compare_tensor, oasis/verify/compare.hpp), B the derived bound of the plain float reference.

struct AttentionCase {
  std::string id;
  index_t B, H, H_kv, Tq, Tk, d;
  double logit_scale;  // multiplies q: large values stress the stable evaluation
  AttentionOptions opt;
};

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> c;
  AttentionOptions o;
  o.causal = true;
  c.push_back({"softmax1_causal", 2, 4, 4, 24, 24, 16, 1.0, o});
  o = {};
  o.null_logits = {0.5, -1.0, 2.0, 0.0};
  o.key_lengths = {17, 0};  // the second sequence is fully padded: p_null = 1, output 0
  c.push_back({"gqa_sink_logits_padding", 2, 4, 2, 20, 20, 16, 1.0, o});
  o = {};
  o.normalizer = RowNorm::softmax;
  o.causal = true;  // bottom-right aligned: 3 new queries over 40 keys (decoding)
  c.push_back({"softmax_decode", 1, 2, 1, 3, 40, 32, 1.0, o});
  o = {};
  o.scale = 0.5;
  c.push_back({"softmax1_large_logits", 1, 2, 2, 16, 16, 8, 6.0, o});
  return c;
}

struct DepthCase {
  std::string id;
  index_t n, N, d;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

std::vector<DepthCase> depth_cases() {
  using K = SourceKind;
  std::vector<DepthCase> c;
  DepthOptions o;
  o.theta = 0.5;
  c.push_back({"oasis_paper_v2", 5, 12, 32, {K::initial, K::attention, K::headless, K::attention, K::headless}, o});
  o = {};
  o.coupling_options = CouplingOptions::authors_code();
  o.beta = 3.0;
  c.push_back({"oasis_authors_code", 4, 12, 32, {K::initial, K::attention, K::headless, K::attention}, o});
  o = {};
  o.coupling = false;
  o.normalizer = RowNorm::softmax;
  c.push_back({"vanilla_softmax", 3, 12, 16, {K::initial, K::attention, K::headless}, o});
  return c;
}

std::mt19937_64 rng_for(std::uint64_t seed, const std::string& id, int instance) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char ch : id) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  return std::mt19937_64(seed ^ h ^ (static_cast<std::uint64_t>(instance) * 0x9E3779B97F4A7C15ULL));
}

Tensor<float> randn(Shape s, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> nd(0.0, sd);
  Tensor<float> t(std::move(s));
  for (index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(nd(rng));
  return t;
}

/// One float output of a backend under the policy: the row keeps the worst |err| / bound (+inf for
/// a shape mismatch), fails on any violation and keeps the first one for its message.
void check_output(SelfcheckRow& row, const std::string& name, const Tensor<float>& got, const Tensor<mp50>& ref,
                  const Tensor<double>& plain) {
  const TensorReport t = compare_tensor(name, io::StoredTensor{io::DType::f32, got.cast<double>()}, ref, plain, 1);
  row.worst_error = std::max(row.worst_error, t.problem.empty() ? t.worst_ratio : std::numeric_limits<double>::infinity());
  if (!t.passed && row.passed) row.message = t.problem.empty() ? t.first_mismatches.front() : name + ": " + t.problem;
  row.passed = row.passed && t.passed;
}

/// One parity row: `instance(rng, row)` draws an instance, runs the backend and checks its outputs
/// with check_output; an exception fails the row with its message.
template <class Instance>
SelfcheckRow parity_row(const std::string& id, const BackendOps& b, int instances, std::uint64_t seed,
                        const char* pass_message, Instance instance) {
  SelfcheckRow row{id, kParityRef, "float", std::string(b.name), 0, 0, kNotApplicable, true, ""};
  try {
    for (int i = 0; i < instances; ++i) {
      auto rng = rng_for(seed, row.check, i);
      instance(rng, row);
      ++row.instances;
    }
    if (row.passed) row.message = pass_message;
  } catch (const std::exception& e) {
    row.passed = false;
    row.message = e.what();
  }
  return row;
}

SelfcheckRow attention_parity(const AttentionCase& c, const BackendOps& b, int instances, std::uint64_t seed) {
  return parity_row("parity.attention." + c.id, b, instances, seed,
                    "out, lse, p_null within 0.5 ulp + 2x the plain float bound",
                    [&](std::mt19937_64& rng, SelfcheckRow& row) {
                      Tensor<float> q = randn({c.B, c.H, c.Tq, c.d}, rng, c.logit_scale),
                                    k = randn({c.B, c.H_kv, c.Tk, c.d}, rng), v = randn({c.B, c.H_kv, c.Tk, c.d}, rng);
                      AttentionOptions ro = c.opt;
                      ro.return_probs = true;
                      const AttentionResult<mp50> ref = token_attention(q.cast<mp50>(), k.cast<mp50>(), v.cast<mp50>(), ro);
                      const bounds::AttentionBounds bd = bounds::attention_bounds(q, k, v, ro, ref);
                      const AttentionResult<float> got = token_attention(b, q, k, v, c.opt);
                      check_output(row, "out", got.out, ref.out, bd.out);
                      check_output(row, "lse", got.lse, ref.lse, bd.lse);
                      check_output(row, "p_null", got.p_null, ref.p_null, bd.p_null);
                    });
}

SelfcheckRow depth_parity(const DepthCase& c, const BackendOps& b, int instances, std::uint64_t seed) {
  return parity_row("parity.depth." + c.id, b, instances, seed,
                    "h, alpha, alpha_null within 0.5 ulp + 2x the plain float bound",
                    [&](std::mt19937_64& rng, SelfcheckRow& row) {
                      const Tensor<float> src = randn({c.n, c.N, c.d}, rng), g_old = randn({c.n, c.N}, rng, 2.0);
                      Tensor<float> psi({c.n, c.N});
                      std::uniform_real_distribution<double> ud(0.0, 1.0);
                      for (index_t j = 0; j < psi.size(); ++j) psi[j] = static_cast<float>(ud(rng));
                      const DepthRoute<mp50> ref =
                          attn_res_route(src.cast<mp50>(), g_old.cast<mp50>(), psi.cast<mp50>(), c.kinds, c.opt);
                      const bounds::DepthRouteBounds bd = bounds::depth_route_bounds(src, psi, c.kinds, c.opt, ref);
                      const DepthRoute<float> got = attn_res_route(b, src, g_old, psi, c.kinds, c.opt);
                      check_output(row, "h", got.h, ref.h, bd.h);
                      check_output(row, "alpha", got.alpha, ref.alpha, bd.alpha);
                      check_output(row, "alpha_null", got.alpha_null, ref.alpha_null, bd.alpha_null);
                    });
}

bool selected(const std::vector<std::string>& only, const std::string& id) {
  if (only.empty()) return true;
  for (const auto& o : only)
    if (id == o || (id.size() > o.size() && id.compare(0, o.size(), o) == 0 && id[o.size()] == '.')) return true;
  return false;
}

std::string fmt(double x) {
  if (std::isnan(x)) return "-";
  if (x == 0) x = 0;  // print -0 as 0
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

}  // namespace

std::vector<std::string> selfcheck_ids() {
  std::vector<std::string> ids;
  for (const auto& c : checks::catalogue()) ids.push_back(c.id);
  for (const auto& c : attention_cases()) ids.push_back("parity.attention." + c.id);
  for (const auto& c : depth_cases()) ids.push_back("parity.depth." + c.id);
  return ids;
}

std::vector<SelfcheckRow> run_selfcheck(const SelfcheckOptions& opt) {
  for (const auto& o : opt.only) {
    bool any = false;
    for (const auto& id : selfcheck_ids()) any = any || selected({o}, id);
    if (!any) {
      std::string ids;
      for (const auto& id : selfcheck_ids()) ids += (ids.empty() ? "" : ", ") + id;
      throw invalid_argument("--only", "'" + o + "' matches no check (ids: " + ids + "; a prefix such as 'parity' selects a group)");
    }
  }
  std::vector<const BackendOps*> backends;
  for (const BackendOps* b : registered_backends())
    if (backend_available(*b)) backends.push_back(b);
  struct Job { std::string id; std::function<std::vector<SelfcheckRow>()> run; };
  std::vector<Job> jobs;
  for (const auto& c : checks::catalogue()) {
    if (!selected(opt.only, c.id)) continue;
    jobs.push_back({c.id, [&opt, &c] {
      checks::CheckConfig cfg;
      cfg.seed = opt.seed;
      if (opt.instances > 0) cfg.instances = opt.instances;
      std::vector<SelfcheckRow> rows;
      for (const checks::CheckResult& r : c.run(cfg))
        rows.push_back({r.check, r.paper_ref, r.scalar, r.backend, r.instances, r.worst_error, r.worst_margin, r.passed, r.message});
      return rows;
    }});
  }
  // Parity runs a few instances: each needs the mp50 oracle, the costly part of the selfcheck.
  const int parity_instances = opt.instances > 0 ? std::min(opt.instances, 4) : 2;
  for (const auto& c : attention_cases())
    for (const BackendOps* b : backends)
      if (selected(opt.only, "parity.attention." + c.id))
        jobs.push_back({"parity.attention." + c.id + " " + std::string(b->name),
                        [c, b, parity_instances, &opt] { return std::vector<SelfcheckRow>{attention_parity(c, *b, parity_instances, opt.seed)}; }});
  for (const auto& c : depth_cases())
    for (const BackendOps* b : backends)
      if (selected(opt.only, "parity.depth." + c.id))
        jobs.push_back({"parity.depth." + c.id + " " + std::string(b->name),
                        [c, b, parity_instances, &opt] { return std::vector<SelfcheckRow>{depth_parity(c, *b, parity_instances, opt.seed)}; }});
  std::vector<SelfcheckRow> rows;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (opt.progress) opt.progress(static_cast<int>(j), static_cast<int>(jobs.size()), jobs[j].id);
    try {
      for (auto& r : jobs[j].run()) rows.push_back(std::move(r));
    } catch (const std::exception& e) {  // a check that throws is a failed check, reported as such
      rows.push_back({jobs[j].id, "", "", "", 0, kNotApplicable, kNotApplicable, false, std::string("threw: ") + e.what()});
    }
  }
  if (opt.progress) opt.progress(static_cast<int>(jobs.size()), static_cast<int>(jobs.size()), "done");
  return rows;
}

std::string format_selfcheck(const std::vector<SelfcheckRow>& rows) {
  std::size_t wc = 5, wr = 9;
  for (const auto& r : rows) { wc = std::max(wc, r.check.size()); wr = std::max(wr, r.paper_ref.size()); }
  wr = std::min<std::size_t>(wr, 44);
  std::ostringstream os;
  char line[1024];
  std::snprintf(line, sizeof line, "%-*s  %-*s  %-11s  %-9s  %9s  %11s  %12s  %s\n", static_cast<int>(wc), "check",
                static_cast<int>(wr), "paper ref", "scalar", "backend", "instances", "worst error", "worst margin", "verdict");
  os << line << std::string(wc + wr + 80, '-') << "\n";
  int failed = 0;
  for (const auto& r : rows) {
    std::string ref = r.paper_ref.size() > wr ? r.paper_ref.substr(0, wr - 3) + "..." : r.paper_ref;
    std::snprintf(line, sizeof line, "%-*s  %-*s  %-11s  %-9s  %9ld  %11s  %12s  %s\n", static_cast<int>(wc), r.check.c_str(),
                  static_cast<int>(wr), ref.c_str(), r.scalar.c_str(), r.backend.c_str(), r.instances,
                  fmt(r.worst_error).c_str(), fmt(r.worst_margin).c_str(), r.passed ? "PASS" : "FAIL");
    os << line;
    if (!r.passed) {
      os << "    -> " << r.message << "\n";
      ++failed;
    }
  }
  os << std::string(wc + wr + 80, '-') << "\n";
  os << "worst error: max |value - high precision| / documented bound (<= 1 passes); worst margin: normalised\n"
        "slack of the paper's inequality (passes down to minus the rounding allowance of the scalar);\n"
        "'-' = not applicable.\n";
  os << "backends: ";
  for (const BackendOps* b : registered_backends())
    if (backend_available(*b)) os << b->name << " ";
  for (const BackendOps* b : registered_backends())
    if (!backend_available(*b)) os << "(" << b->name << " unavailable: " << backend_unavailable_reason(*b) << ") ";
  os << "\n";
  os << "verdict: " << (failed ? "FAIL" : "PASS") << " (" << rows.size() - static_cast<std::size_t>(failed) << " of "
     << rows.size() << " rows pass)\n";
  return os.str();
}

std::string selfcheck_json(const std::vector<SelfcheckRow>& rows) {
  using io::json::quote;
  auto jnum = [](double x) {
    if (!std::isfinite(x)) return std::string("null");  // JSON has no NaN/inf
    char b[40];
    std::snprintf(b, sizeof b, "%.9g", x);
    return std::string(b);
  };
  bool all = true;
  std::ostringstream os;
  os << "{\"rows\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    all = all && r.passed;
    os << (i ? "," : "") << "\n{\"check\":" << quote(r.check) << ",\"paper_ref\":" << quote(r.paper_ref)
       << ",\"scalar\":" << quote(r.scalar) << ",\"backend\":" << quote(r.backend) << ",\"instances\":" << r.instances
       << ",\"worst_error\":" << jnum(r.worst_error) << ",\"worst_margin\":" << jnum(r.worst_margin)
       << ",\"passed\":" << (r.passed ? "true" : "false") << ",\"message\":" << quote(r.message) << "}";
  }
  os << "\n],\"passed\":" << (all ? "true" : "false")
     << "}\n";
  return os.str();
}

}  // namespace oasis::verify
