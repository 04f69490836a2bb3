// tests/verify/policy_table.cpp — prints the measurements of docs/tolerances.md ("The compare
// policies"): for every case of oasis::zoo::policy_cases(), output dtype and implementation of
// the zoo (correct ones and mutants), the worst err/bound of each output tensor under each policy
// of oasis-verify compare, and the factor k that the FlashAttention rule
// max|x - ref| <= k max|plain_f32 - ref| (+ 0.5 ulp_D) would need.
//
//   build/tests/verify/oasis_policy_table [--markdown]
// A measurement, not a test: the acceptance assertions are in test_policy.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "attention_zoo.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace zoo = oasis::zoo;
using oasis::index_t;
using oasis::Tensor;

namespace {

const char* const kTensors[] = {"out", "lse", "p_null", "probs"};

struct Ratios {
  std::map<std::string, double> p, w, p16, fa;  // per tensor; fa: the k the FlashAttention rule needs
};

const Tensor<float>& pick(const zoo::Result& r, const std::string& n) {
  return n == "out" ? r.out : n == "lse" ? r.lse : n == "p_null" ? r.p_null : r.probs;
}
const Tensor<double>& pick(const oasis::AttentionResult<double>& r, const std::string& n) {
  return n == "out" ? r.out : n == "lse" ? r.lse : n == "p_null" ? r.p_null : r.probs;
}

struct Line {
  std::string cs, dt, impl;
  bool correct, p16;
  Ratios rt;
};

std::string g3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

/// The two tables of docs/tolerances.md: the correct zoo's worst ratios per case and dtype, and
/// every mutant's ratios.
void print_markdown(const std::vector<Line>& lines) {
  std::printf("Correct zoo, worst err/bound over its members (<= 1 passes; `FA k`: the factor the FlashAttention rule needs):\n\n");
  std::printf("| case | dtype | probabilistic: out / lse / p_null / probs | worst case: out / lse / p_null / probs | FA k: out / any tensor |\n|---|---|---|---|---|\n");
  for (std::size_t i = 0; i < lines.size();) {
    std::size_t j = i;
    std::map<std::string, double> p, w;
    double fa_out = 0, fa_any = 0;
    for (; j < lines.size() && lines[j].cs == lines[i].cs && lines[j].dt == lines[i].dt; ++j) {
      if (!lines[j].correct || lines[j].p16) continue;
      for (const char* tn : kTensors) {
        p[tn] = std::max(p[tn], lines[j].rt.p.at(tn));
        w[tn] = std::max(w[tn], lines[j].rt.w.at(tn));
        fa_any = std::max(fa_any, lines[j].rt.fa.count(tn) ? lines[j].rt.fa.at(tn) : 0.0);
      }
      fa_out = std::max(fa_out, lines[j].rt.fa.count("out") ? lines[j].rt.fa.at("out") : 0.0);
    }
    std::printf("| %s | %s | %s / %s / %s / %s | %s / %s / %s / %s | %s / %s |\n", lines[i].cs.c_str(), lines[i].dt.c_str(),
                g3(p["out"]).c_str(), g3(p["lse"]).c_str(), g3(p["p_null"]).c_str(), g3(p["probs"]).c_str(),
                g3(w["out"]).c_str(), g3(w["lse"]).c_str(), g3(w["p_null"]).c_str(), g3(w["probs"]).c_str(), g3(fa_out).c_str(),
                g3(fa_any).c_str());
    i = j;
  }
  std::printf("\nKernels that round P to the 16-bit type before P V, worst err/bound of `out`:\n\n| case | dtype | member | probabilistic (storage) | p16 |\n|---|---|---|---|---|\n");
  for (const Line& l : lines)
    if (l.p16) std::printf("| %s | %s | %s | %s | %s |\n", l.cs.c_str(), l.dt.c_str(), l.impl.c_str(), g3(l.rt.p.at("out")).c_str(), g3(l.rt.p16.at("out")).c_str());
  std::printf("\nMutants, worst err/bound (> 1 fails):\n\n| case | dtype | mutant | `out` alone: probabilistic / p16 / worst case | any tensor: probabilistic / worst case | FA k: out / any |\n|---|---|---|---|---|---|\n");
  for (const Line& l : lines) {
    if (l.correct) continue;
    double ap = 0, aw = 0, af = 0;
    for (const char* tn : kTensors) {
      ap = std::max(ap, l.rt.p.at(tn));
      aw = std::max(aw, l.rt.w.at(tn));
      af = std::max(af, l.rt.fa.count(tn) ? l.rt.fa.at(tn) : 0.0);
    }
    std::printf("| %s | %s | %s | %s / %s / %s | %s / %s | %s / %s |\n", l.cs.c_str(), l.dt.c_str(), l.impl.c_str(),
                g3(l.rt.p.at("out")).c_str(), l.dt == "f32" ? "-" : g3(l.rt.p16.at("out")).c_str(), g3(l.rt.w.at("out")).c_str(),
                g3(ap).c_str(), g3(aw).c_str(), g3(l.rt.fa.count("out") ? l.rt.fa.at("out") : 0.0).c_str(), g3(af).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool markdown = argc > 1 && std::string(argv[1]) == "--markdown";
  std::vector<Line> lines;
  for (const zoo::Case& c : zoo::policy_cases()) {
    oasis::AttentionOptions o = c.opt;
    o.return_probs = true;
    const auto ref = oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o);
    const zoo::Result plain = zoo::attention({"plain"}, c.q, c.k, c.v, o);
    std::map<std::string, double> plain_err;  // max |plain_f32 - ref| per tensor
    for (const char* tn : kTensors) {
      const Tensor<double>& rf = pick(ref, tn);
      for (index_t i = 0; i < rf.size(); ++i)
        if (std::isfinite(rf[i])) plain_err[tn] = std::max(plain_err[tn], std::abs(pick(plain, tn)[i] - rf[i]));
    }
    const io::TensorMap in = zoo::inputs_of(c);
    const io::json::Value opts = io::json::parse(zoo::options_json(c));
    for (io::DType d : c.dtypes) {
      std::vector<zoo::Impl> impls = zoo::correct_zoo(c.small_logits);
      if (d != io::DType::f32)
        for (zoo::Impl im : {zoo::Impl{"p16_plain", zoo::Algo::plain}, zoo::Impl{"p16_online_b64", zoo::Algo::online, 64}}) {
          im.p16 = true;
          im.p16_type = d;
          impls.push_back(im);
        }
      for (const zoo::Impl& m : zoo::mutants()) impls.push_back(m);
      impls.push_back({"one_element_64_ulps", zoo::Algo::plain});
      std::map<std::string, double> zoo_max_p, zoo_max_w;
      for (const zoo::Impl& im : impls) {
        zoo::Result r = zoo::attention(im, c.q, c.k, c.v, o);
        if (d != io::DType::f32) r = zoo::storage(r, d);
        if (im.name == "one_element_64_ulps") zoo::one_element_off(r.out, d, 64);
        const io::TensorMap outm = zoo::outputs_of(r, d);
        Ratios rt;
        for (verify::Policy pol : {verify::Policy::probabilistic, verify::Policy::p16, verify::Policy::worst_case}) {
          if (pol == verify::Policy::p16 && d == io::DType::f32) continue;
          verify::CompareOptions co;
          co.policy = pol;
          co.show = 0;
          const verify::CompareReport rep = verify::check("attention", in, outm, opts, co);
          for (const auto& t : rep.tensors)
            (pol == verify::Policy::probabilistic ? rt.p : pol == verify::Policy::p16 ? rt.p16 : rt.w)[t.name] = t.worst_ratio;
        }
        for (const char* tn : kTensors) {
          const Tensor<double>& rf = pick(ref, tn);
          for (index_t i = 0; i < rf.size(); ++i) {
            if (!std::isfinite(rf[i])) continue;
            const double ex = std::abs(pick(r, tn)[i] - rf[i]) - 0.5 * io::dtype_ulp(d, rf[i]);
            if (ex > 0) rt.fa[tn] = std::max(rt.fa[tn], plain_err[tn] > 0 ? ex / plain_err[tn] : INFINITY);
          }
        }
        const bool correct = im.bug == zoo::Bug::none && im.name != "one_element_64_ulps";
        double any_p = 0, any_w = 0, any_fa = 0;
        for (const char* tn : kTensors) {
          any_p = std::max(any_p, rt.p[tn]);
          any_w = std::max(any_w, rt.w[tn]);
          any_fa = std::max(any_fa, rt.fa[tn]);
          if (correct && !im.p16) {
            zoo_max_p[tn] = std::max(zoo_max_p[tn], rt.p[tn]);
            zoo_max_w[tn] = std::max(zoo_max_w[tn], rt.w[tn]);
          }
        }
        const std::string p16 = d == io::DType::f32 ? "-" : [&] {
          char b[32];
          std::snprintf(b, sizeof b, "%.3g", rt.p16["out"]);
          return std::string(b);
        }();
        for (const char* tn : kTensors) rt.fa[tn];  // present, 0 when never exceeded
        lines.push_back({c.name, std::string(io::to_string(d)), im.name, correct, im.p16, rt});
        if (!markdown)
          std::printf("%-24s %-5s %-22s %-7s out P %9.3g p16 %9s W %9.3g | any P %9.3g W %9.3g | FA k %9.3g any %9.3g\n",
                      c.name.c_str(), std::string(io::to_string(d)).c_str(), im.name.c_str(),
                      correct ? (im.p16 ? "p16" : "zoo") : "MUTANT", rt.p["out"], p16.c_str(), rt.w["out"], any_p, any_w,
                      rt.fa["out"], any_fa);
        std::fflush(stdout);
      }
      if (!markdown)
        for (const char* tn : kTensors)
          std::printf("%-24s %-5s zoo max %-8s probabilistic %9.3g  worst-case %9.3g\n", c.name.c_str(),
                      std::string(io::to_string(d)).c_str(), tn, zoo_max_p[tn], zoo_max_w[tn]);
    }
  }
  if (markdown) print_markdown(lines);
  return 0;
}
