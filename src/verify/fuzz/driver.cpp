// src/verify/fuzz/driver.cpp — fuzz(): every admissible regime in every dtype, judged by check();
// the first failure shrunk greedily (each size field towards the regime's least, then each input's
// values: dropped if optional, zeroed, rounded to quarters), keeping a candidate only when it
// still fails the same way (a tensor outside the policy, a crash, a hang); then written as a replay.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "oasis/core/error.hpp"
#include "oasis/verify/compare.hpp"
#include "regimes.hpp"

namespace oasis::verify::fuzz {
namespace {

using detail::Regime;

/// What one kernel call on one case gave.
struct Attempt {
  std::string kind;  ///< "" (judged: see report), "crash" or "hang"
  io::TensorMap outputs;
  CompareReport report;
  std::string message;
  bool failed() const { return !kind.empty() || (!report.passed && verdict_word(report) != "UNDECIDED"); }
  std::string failure_kind() const { return kind.empty() ? "wrong" : kind; }
};

struct Shared {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  io::TensorMap out;
  std::string kind, message;
};

void run_into(const Kernel& k, const io::TensorMap& in, const io::json::Value& o, Shared& s) {
  io::TensorMap out;
  std::string kind, message;
  try {
    out = k(in, o);
  } catch (const kernel_timeout& e) {
    kind = "hang", message = e.what();
  } catch (const kernel_abort& e) {
    kind = "abort", message = e.what();
  } catch (const std::exception& e) {
    kind = "crash", message = e.what();
  } catch (...) {
    kind = "crash", message = "a non-standard exception";
  }
  std::lock_guard<std::mutex> lock(s.m);
  s.out = std::move(out), s.kind = std::move(kind), s.message = std::move(message), s.done = true;
  s.cv.notify_all();
}

/// Run the kernel; with a timeout on a thread of its own, left running (detached) if it overruns.
Attempt call(const Kernel& k, const Case& c, const FuzzOptions& opt) {
  const io::json::Value o = io::json::parse(c.options_json());
  auto s = std::make_shared<Shared>();
  if (opt.timeout_s <= 0) {
    run_into(k, c.inputs, o, *s);
  } else {
    std::thread([k, in = c.inputs, o, s] { run_into(k, in, o, *s); }).detach();
    std::unique_lock<std::mutex> lock(s->m);
    if (!s->cv.wait_for(lock, std::chrono::duration<double>(opt.timeout_s), [&] { return s->done; }))
      return {"hang", {}, {}, "no result within " + detail::num(opt.timeout_s) + " s (--timeout)"};
  }
  std::lock_guard<std::mutex> lock(s->m);
  if (s->kind == "abort") throw kernel_abort(s->message);
  return {s->kind, std::move(s->out), {}, s->message};
}

/// Call and judge. Errors of the case itself (outside the op's domain) or of the kernel's output
/// names propagate as compare's named errors.
Attempt attempt(const Kernel& k, const Case& c, const FuzzOptions& opt) {
  Attempt a = call(k, c, opt);
  if (a.kind.empty()) a.report = check(c.op, c.inputs, a.outputs, io::json::parse(c.options_json()), opt.compare);
  return a;
}

/// A regime's case as the kernel can take it: the user's fixed options applied, the optional
/// inputs it lacks removed. Empty optional when a fixed option contradicts the regime.
bool adapt(Case& c, const FuzzOptions& opt, std::string* why) {
  for (const auto& [k, v] : opt.fixed) {
    auto it = c.options.find(k);
    if (it != c.options.end() && it->second != v) {
      if (why) *why = "needs " + k + " = " + it->second + " (fixed to " + v + ")";
      return false;
    }
    c.options[k] = v;
  }
  static const std::pair<const char*, const char*> optional_inputs[] = {
      {"null_logits", "null_logits"}, {"null_logits", "s"},     {"grad_lse", "grad_lse"}, {"grad_p_null", "grad_p_null"},
      {"gain", "gain"},               {"grad_alpha", "grad_alpha"}, {"grad_alpha", "grad_alpha_null"}};
  for (const auto& [feature, input] : optional_inputs)
    if (opt.without.count(feature)) c.inputs.erase(input);
  return true;
}

bool admissible(const Case& c, const FuzzOptions& opt, std::string* why) {
  for (const std::string& f : detail::case_features(c))
    if (opt.without.count(f)) {
      if (why) *why = "needs " + f;
      return false;
    }
  return true;
}

Case generate(const Regime& r, int variant, const std::string& op, io::DType dt, std::uint64_t seed, const Dims& dims) {
  Case c;
  c.op = op;
  c.regime = r.info.variants[static_cast<std::size_t>(variant)].empty()
                 ? r.info.name
                 : r.info.name + "[" + r.info.variants[static_cast<std::size_t>(variant)] + "]";
  c.seed = seed, c.dtype = dt, c.dims = dims;
  detail::Rng rng(seed);
  r.generate(c, variant, rng);
  return c;
}

std::vector<index_t> candidates(index_t cur, index_t least) {
  std::vector<index_t> v;
  for (index_t x : {least, cur / 2, cur - 1})
    if (x >= least && x < cur && std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
  return v;
}

struct Shrinker {
  const Kernel& k;
  const FuzzOptions& opt;
  const Regime& r;
  int variant;
  Failure& f;
  Attempt best;

  /// The tensors a judged attempt fails on.
  static std::set<std::string> failing(const Attempt& a) {
    std::set<std::string> names;
    for (const auto& t : a.report.tensors)
      if (!t.informative && !t.passed) names.insert(t.name);
    return names;
  }

  /// A value step must keep every tensor that fails failing: zeroing v would otherwise hide a
  /// wrong `out` behind a wrong `lse`, and the shrunk case would show less than the bug does.
  bool keeps_failing_tensors(const Attempt& a) const {
    const std::set<std::string> now = failing(best), then = failing(a);
    return std::includes(then.begin(), then.end(), now.begin(), now.end());
  }

  bool still_fails(const Case& c, Attempt* out) {
    if (f.shrink_runs >= opt.max_shrink_runs) return false;
    ++f.shrink_runs;
    Attempt a;
    try {
      a = attempt(k, c, opt);
    } catch (const invalid_argument&) {
      return false;  // a candidate outside the op's domain (a required input dropped)
    }
    if (a.kind == "hang" && !opt.shrink_hangs) f.shrink_runs = opt.max_shrink_runs;  // a stuck thread: stop
    if (!a.failed() || a.failure_kind() != f.kind) return false;
    *out = std::move(a);
    return true;
  }

  void sizes() {
    for (bool progress = true; progress && f.shrink_runs < opt.max_shrink_runs;) {
      progress = false;
      std::vector<std::string> fields = detail::dim_fields(f.shrunk.op);
      if (detail::family(f.shrunk.op) == "attention") fields.insert(fields.begin() + 2, "T");  // Tq = Tk together
      for (const std::string& field : fields) {
        const Dims cur = f.shrunk.dims;
        const bool joint = field == "T";
        if (joint && cur.Tq != cur.Tk) continue;
        const index_t now = joint ? cur.Tq : detail::dim_get(cur, field);
        const index_t least = joint ? std::max(r.least.Tq, r.least.Tk) : detail::dim_get(r.least, field);
        if (now == 0) continue;
        for (index_t x : candidates(now, least)) {
          Dims d = cur;
          if (joint) d.Tq = d.Tk = x;
          else detail::dim_ref(d, field) = x;
          Case c = generate(r, variant, f.shrunk.op, f.shrunk.dtype, f.shrunk.seed, d);
          if (!adapt(c, opt, nullptr) || !admissible(c, opt, nullptr) || c.dims.volume() >= cur.volume()) continue;
          Attempt a;
          if (!still_fails(c, &a)) continue;
          f.shrink_steps.push_back((joint ? std::string("Tq = Tk") : field) + " " + std::to_string(now) + " -> " +
                                   std::to_string(x));
          f.shrunk = std::move(c), best = std::move(a), progress = true;
          break;
        }
      }
    }
  }

  void values() {
    static const std::set<std::string> optional = {"null_logits", "s", "bias", "grad_lse", "grad_p_null",
                                                   "gain", "grad_alpha", "grad_alpha_null"};
    std::vector<std::string> names;
    for (const auto& [n, t] : f.shrunk.inputs) names.push_back(n);
    for (const std::string& n : names) {
      for (const char* how : {"dropped", "zeroed", "rounded to quarters"}) {
        if (!f.shrunk.inputs.count(n) || f.shrink_runs >= opt.max_shrink_runs) break;
        Case c = f.shrunk;
        const std::string h = how;
        if (h == "dropped") {
          if (!optional.count(n)) continue;
          c.inputs.erase(n);
        } else {
          bool changed = false;
          for (double& x : c.inputs[n].values.storage()) {
            const double y = h == "zeroed" ? 0.0 : std::isfinite(x) && std::fabs(x) < 1e3 ? std::round(4 * x) / 4 : x;
            changed = changed || y != x;
            x = y;
          }
          if (!changed) continue;
        }
        if (!admissible(c, opt, nullptr)) continue;
        Attempt a;
        if (!still_fails(c, &a) || !keeps_failing_tensors(a)) continue;
        f.shrink_steps.push_back(n + " " + h);
        f.shrunk = std::move(c), best = std::move(a);
      }
    }
  }
};

std::string sanitize(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.') o += ch;
    else if (ch == '[' || ch == ',') o += '-';
    else if (ch == '+') o += "plus";
    else if (ch != ']' && ch != '=') o += '_';
  }
  return o;
}

}  // namespace

FuzzReport fuzz(const std::string& op, const Kernel& kernel, const FuzzOptions& opt) {
  detail::family(op);
  OASIS_REQUIRE(static_cast<bool>(kernel), "kernel", "is empty");
  OASIS_REQUIRE(!opt.dtypes.empty(), "dtypes", "no dtype to fuzz in");
  for (io::DType d : opt.dtypes)
    OASIS_REQUIRE(!io::is_integer(d), "dtypes", "inputs are floating point, not ", io::to_string(d));
  const std::vector<std::string> known = feature_names();
  for (const std::string& f : opt.without)
    OASIS_REQUIRE(std::count(known.begin(), known.end(), f), "without", "unknown feature '", f, "'");
  for (const std::string& name : opt.only) {
    bool found = false;
    for (const auto& r : detail::catalogue())
      found = found || (r.info.name == name && std::count(r.info.ops.begin(), r.info.ops.end(), op));
    OASIS_REQUIRE(found, "only", "'", name, "' is not a regime of op ", op);
  }
  const std::vector<std::string> keys = op_option_names(op);
  for (const auto& [k, v] : opt.fixed) {
    OASIS_REQUIRE(std::count(keys.begin(), keys.end(), k), "fixed", "op ", op, " has no option '", k, "'");
    try {
      (void)io::json::parse(v);
    } catch (const std::exception& e) {
      throw invalid_argument("fixed", "option " + k + " = " + v + " is not a JSON value (" + e.what() + ")");
    }
  }
  FuzzReport rep;
  rep.op = op;
  if (std::none_of(opt.dtypes.begin(), opt.dtypes.end(),
                   [](io::DType d) { return d == io::DType::f16 || d == io::DType::bf16; }))
    rep.not_exercised.push_back("16-bit inputs (f16, bf16): not among the dtypes (zero sinks read as unset, 16-bit reductions)");
  for (const Regime& r : detail::catalogue()) {
    if (!std::count(r.info.ops.begin(), r.info.ops.end(), op)) continue;
    if (!opt.only.empty() && !std::count(opt.only.begin(), opt.only.end(), r.info.name)) continue;
    std::string why;
    for (const std::string& need : r.info.needs)
      if (opt.without.count(need) && why.empty()) why = "needs " + need;
    if (!why.empty()) {
      rep.not_exercised.push_back(r.info.name + ": " + why);
      continue;
    }
    std::vector<std::string> skipped;  // "variant (dtype): why", folded into one line when every case has one reason
    std::set<std::string> reasons;
    const std::size_t cases = r.start.size() * opt.dtypes.size();
    auto flush_skipped = [&] {
      if (skipped.size() == cases && reasons.size() == 1) rep.not_exercised.push_back(r.info.name + ": " + *reasons.begin());
      else rep.not_exercised.insert(rep.not_exercised.end(), skipped.begin(), skipped.end());
    };
    for (int v = 0; v < static_cast<int>(r.start.size()); ++v)
      for (io::DType dt : opt.dtypes) {
        const std::uint64_t seed =
            detail::mix(opt.seed, detail::hash_text(op + "/" + r.info.name + "/" + std::to_string(v) + "/" +
                                                    std::string(io::to_string(dt))));
        Case c = generate(r, v, op, dt, seed, r.start[static_cast<std::size_t>(v)]);
        if (!adapt(c, opt, &why) || !admissible(c, opt, &why)) {
          skipped.push_back(c.regime + " (" + std::string(io::to_string(dt)) + "): " + why);
          reasons.insert(why);
          continue;
        }
        Attempt a = attempt(kernel, c, opt);
        Run run{c.regime, dt, seed, c.dims, a.kind.empty() ? verdict_word(a.report) : a.kind == "hang" ? "HANG" : "CRASH",
                0, a.message};
        for (const auto& t : a.report.tensors) {
          if (!t.informative && !std::isnan(run.worst_ratio))  // a NaN element: NaN, not hidden by max
            run.worst_ratio = std::isnan(t.worst_ratio) ? t.worst_ratio : std::max(run.worst_ratio, t.worst_ratio);
          if (run.detail.empty() && !t.informative && !t.passed) run.detail = t.name;
        }
        rep.runs.push_back(run);
        if (opt.log)
          opt.log(op + "  " + run.regime + "  " + std::string(io::to_string(dt)) + "  seed " + std::to_string(seed) + "  " +
                  run.dims.str() + "  " + run.verdict + (run.detail.empty() ? "" : " (" + run.detail + ")"));
        if (!a.failed()) continue;
        Failure& f = rep.failure;
        rep.has_failure = true;
        f.kind = a.failure_kind();
        f.original = c;
        f.shrunk = c;
        f.message = a.message;
        Shrinker s{kernel, opt, r, v, f, std::move(a)};
        if (f.kind != "hang" || opt.shrink_hangs) {
          s.sizes();
          s.values();
        }
        f.report = s.best.report;
        if (!s.best.message.empty()) f.message = s.best.message;
        namespace fs = std::filesystem;
        fs::path root = opt.replay_dir.empty() ? fs::temp_directory_path() / ("oasis-fuzz-" + std::to_string(seed))
                                               : fs::path(opt.replay_dir);
        f.replay_dir = (root / sanitize(op + "-" + f.shrunk.regime + "-" + std::string(io::to_string(dt)))).string();
        std::string desc = "oasis fuzz: op " + op + ", regime " + f.shrunk.regime + ", seed " + std::to_string(seed) +
                           ", " + f.shrunk.dims.str() + "; " + f.kind +
                           (f.message.empty() ? "" : ": " + f.message);
        f.replay_command = write_replay(f.shrunk, s.best.outputs, f.replay_dir, desc);
        if (f.kind == "wrong" && opt.compare.policy != Policy::probabilistic)
          f.replay_command += " --policy " + std::string(to_string(opt.compare.policy));
        if (f.kind != "wrong") f.replay_command.clear();
        flush_skipped();
        return rep;
      }
    flush_skipped();
  }
  rep.passed = !rep.runs.empty() &&
               std::all_of(rep.runs.begin(), rep.runs.end(), [](const Run& r) { return r.verdict == "PASS"; });
  return rep;
}

}  // namespace oasis::verify::fuzz
