// proofs_checks/support.hpp — machinery shared by the proof checks (internal to oasis_proofs).
//
// Every check follows one pattern (docs/paper-map.md):
//  1. an instance is generated in double from a reproducible stream and rounded once to the
//     scalar T under test, so that T and the high-precision reference see identical inputs;
//  2. the *implementation under test* (a small struct of std::function, the library by default,
//     a mutant in the teeth tests) is evaluated in T;
//  3. for T != mp50 the library is also evaluated in oasis::mp50 on the same inputs and every
//     output is compared with the documented bound of oasis/error_bounds.hpp (worst_error);
//  4. the statement's conclusion is evaluated in mp50 on the T outputs (converted exactly), with
//     a rounding allowance derived from the same bounds (worst_margin >= -margin_slack passes);
//     at an equality (tight) instance the margin must also be <= the allowance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "oasis/backend.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::checks::detail {

/// The high-precision reference scalar.
using R = oasis::mp50;

template <class T> struct Tag { using type = T; };

template <class T> const char* scalar_name();
template <> inline const char* scalar_name<float>() { return "float"; }
template <> inline const char* scalar_name<double>() { return "double"; }
template <> inline const char* scalar_name<mp50>() { return "mp50"; }
#if defined(OASIS_HAVE_MPFR)
template <> inline const char* scalar_name<mpfr50>() { return "mpfr50"; }
#endif

template <class T> inline constexpr bool is_mp_v = !std::is_floating_point_v<T>;

/// Rounding of evaluating a margin in mp50 (a few hundred operations at u ~ 1e-50), relative.
inline constexpr double kEvalAllowance = 1e-44;

/// Exact conversion to the reference scalar (mpfr50 goes through its full decimal expansion).
template <class T> R to_R(const T& x) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, R>) {
    return R(x);
  } else {
    using std::isinf; using std::isnan;
    if (isnan(x)) return R(std::numeric_limits<double>::quiet_NaN());
    if (isinf(x)) return x > 0 ? pos_inf<R>() : neg_inf<R>();
    return R(x.str(0, std::ios_base::scientific));
  }
}
template <class T> Tensor<R> to_R(const Tensor<T>& t) {
  Tensor<R> out(t.shape());
  for (index_t i = 0; i < t.size(); ++i) out[i] = to_R(t[i]);
  return out;
}
inline double dbl(const R& x) { return static_cast<double>(x); }

/// Random instances are drawn in double and rounded once to T.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  double normal(double sd = 1.0) { return std::normal_distribution<double>(0.0, sd)(g_); }
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(g_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  /// A unit vector (in double) of dimension d.
  std::vector<double> unit(int d) {
    std::vector<double> x(static_cast<std::size_t>(d));
    double n2 = 0;
    do {
      n2 = 0;
      for (double& v : x) { v = normal(); n2 += v * v; }
    } while (n2 < 1e-6);
    for (double& v : x) v /= std::sqrt(n2);
    return x;
  }

 private:
  std::mt19937_64 g_;
};

/// Seed of one check: the configured seed mixed with the check id (same stream for every scalar).
inline std::uint64_t seed_for(const CheckConfig& cfg, const std::string& id) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return cfg.seed ^ h;
}

/// x rounded to T (and back to double, exactly).
template <class T> double rd(double x) { return static_cast<double>(T(x)); }

/// Random instances per run: the configured count, a fifth of it (at least 8) for mp scalars.
template <class T> int instances_for(const CheckConfig& cfg) {
  const int n = std::max(1, cfg.instances);
  return is_mp_v<T> ? std::max(8, n / 5) : n;
}

/// Bounds of error_bounds.hpp are against the exact result; the reference mp50 carries its own
/// rounding (u_mp50), so a comparison allows bound * (1 + u_R / u_T).
template <class T> double ref_factor() {
  return 1.0 + bounds::Precision::of<R>().u / bounds::Precision::of<T>().u;
}

/// Accumulates one (check, scalar, backend) run.
class Tally {
 public:
  /// Multiplier of the documented bounds for the implementation under test: 1 for the plain
  /// reference, 2 for fused kernels (cpu_fast, cuda) — the tolerance policy allows a kernel twice
  /// the error of the same-precision reference (docs/tolerances.md, item 4).
  double bound_factor = 1.0;

  void begin(long index, bool tight, std::string what = {}) {
    ++instances_;
    if (tight) ++tight_;
    index_ = index;
    is_tight_ = tight;
    what_ = std::move(what);
  }
  /// Inequality with normalised margin m = (rhs - lhs) / scale; passes when m >= -allowed.
  void margin(const char* stmt, double m, double allowed) {
    slack_ = std::max(slack_, allowed);
    if (std::isnan(m) || m < worst_margin_) worst_margin_ = std::isnan(m) ? -std::numeric_limits<double>::infinity() : m;
    if (!(m >= -allowed)) fail(stmt, "margin ", m, " < -", allowed);
  }
  /// Equality case of an inequality: |m| <= allowed (a bound off by a constant fails here).
  void tight_margin(const char* stmt, double m, double allowed) {
    margin(stmt, m, allowed);
    if (!(m <= allowed)) fail(stmt, "equality case not attained: margin ", m, " > ", allowed, " (bound not tight)");
  }
  /// Identity with normalised residual r >= 0 (recorded as margin -r).
  void identity(const char* stmt, double r, double allowed) { margin(stmt, -std::abs(r), allowed); }
  /// Error against the high-precision reference: err <= bound.
  void error(const char* what, double err, double bound) {
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0.0 : std::numeric_limits<double>::infinity());
    if (std::isnan(ratio) || ratio > worst_error_) worst_error_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
    if (!(err <= bound)) fail(what, "|T - mp50| = ", err, " > bound ", bound);
  }
  /// A property that must hold exactly (or a guarantee of the construction) failed.
  template <class... P> void fail(const char* stmt, const P&... parts) {
    ++failures_;
    if (first_.empty()) {
      std::ostringstream os;
      os.precision(6);
      os << "instance " << index_ << (is_tight_ ? " (equality case)" : "") << (what_.empty() ? "" : " [" + what_ + "]")
         << ": " << stmt << ": ";
      (os << ... << parts);
      first_ = os.str();
    }
  }
  long failures() const { return failures_; }

  CheckResult result(const std::string& id, const std::string& ref, const std::string& scalar,
                     const std::string& backend) const {
    CheckResult r;
    r.check = id;
    r.paper_ref = ref;
    r.scalar = scalar;
    r.backend = backend;
    r.instances = instances_;
    r.tight_instances = tight_;
    r.worst_error = worst_error_;
    r.worst_margin = std::isinf(worst_margin_) && worst_margin_ > 0 ? 0.0 : worst_margin_;
    r.margin_slack = slack_;
    r.passed = failures_ == 0 && instances_ > 0;
    std::ostringstream os;
    if (r.passed)
      os << instances_ << " instances (" << tight_ << " at equality), worst margin " << r.worst_margin
         << " (allowance " << slack_ << "), worst |error|/bound " << worst_error_;
    else
      os << failures_ << " failure(s) in " << instances_ << " instances; first: " << first_;
    r.message = os.str();
    return r;
  }

 private:
  long instances_ = 0, tight_ = 0, failures_ = 0, index_ = 0;
  bool is_tight_ = false;
  std::string what_, first_;
  double worst_error_ = 0, worst_margin_ = std::numeric_limits<double>::infinity(), slack_ = 0;
};

/// Compare an output (converted to R) with the reference under per-element bounds.
inline void compare(Tally& t, const char* what, const Tensor<R>& got, const Tensor<R>& ref,
                    const Tensor<double>& bound, double factor) {
  if (got.shape() != ref.shape()) {
    t.fail(what, "shape ", shape_str(got.shape()), " differs from the reference ", shape_str(ref.shape()));
    return;
  }
  for (index_t i = 0; i < got.size(); ++i) {
    const R& g = got[i];
    const R& r = ref[i];
    using std::isinf; using std::abs;
    const double err = (isinf(g) && isinf(r) && (g > 0) == (r > 0)) ? 0.0 : dbl(abs(g - r));
    t.error(what, err, bound.empty() ? 0.0 : bound[i] * factor);
  }
}

// ---- the functions under test --------------------------------------------------------------------

template <class T>
using AttentionFn = std::function<AttentionResult<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,
                                                     const AttentionOptions&)>;
template <class T>
using RouteFn = std::function<DepthRoute<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,
                                            const std::vector<SourceKind>&, const DepthOptions&)>;

template <class T> AttentionFn<T> library_attention(Backend b = Backend::reference) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != Backend::reference)
      return [b](const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v, const AttentionOptions& o) {
        return token_attention(b, q, k, v, o);
      };
  }
  (void)b;
  return [](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    return token_attention<T>(q, k, v, o);
  };
}

template <class T> RouteFn<T> library_route(Backend b = Backend::reference) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != Backend::reference)
      return [b](const Tensor<float>& s, const Tensor<float>& g, const Tensor<float>& p,
                 const std::vector<SourceKind>& k, const DepthOptions& o) { return attn_res_route(b, s, g, p, k, o); };
  }
  (void)b;
  return [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
            const DepthOptions& o) { return attn_res_route<T>(s, g, p, k, o); };
}

/// The backends a run covers: every available one for float (when the check uses backends),
/// the reference otherwise; filtered by cfg.only_backend.
template <class T> std::vector<Backend> backends_for(const CheckConfig& cfg, bool uses_backends) {
  std::vector<Backend> all{Backend::reference};
  if (std::is_same_v<T, float> && uses_backends) all = available_backends();
  std::vector<Backend> out;
  for (Backend b : all)
    if (cfg.only_backend.empty() || cfg.only_backend == to_string(b)) out.push_back(b);
  return out;
}

// ---- attention on explicit rows ------------------------------------------------------------------

/// Rows of token attention given by their logits: H heads, one query each, d_h = 1, q = 1,
/// k_j = z_j and scale = 1, so the scores are exactly z_j in every T. Keys at index >= visible
/// are padding (key_lengths), i.e. masked.
struct RowSpec {
  std::vector<std::vector<double>> z;               ///< [H][m] logits (already rounded to T)
  std::vector<std::vector<std::vector<double>>> v;  ///< [H][m][d_v] values (already rounded to T)
  index_t visible = -1;                             ///< visible keys (-1 = all m)
  RowNorm kind = RowNorm::softmax1;
  std::vector<double> null_logits;                  ///< per head (softmax1), empty = 0
};

template <class T> struct RowCall {
  Tensor<T> q, k, v;
  AttentionOptions opt;
};

template <class T> RowCall<T> row_call(const RowSpec& s) {
  const index_t H = static_cast<index_t>(s.z.size()), m = static_cast<index_t>(s.z[0].size());
  const index_t dv = static_cast<index_t>(s.v[0][0].size());
  RowCall<T> c{Tensor<T>({1, H, 1, 1}, T(1)), Tensor<T>({1, H, m, 1}), Tensor<T>({1, H, m, dv}), {}};
  for (index_t h = 0; h < H; ++h)
    for (index_t j = 0; j < m; ++j) {
      c.k(0, h, j, 0) = T(s.z[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)]);
      for (index_t e = 0; e < dv; ++e)
        c.v(0, h, j, e) = T(s.v[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)][static_cast<std::size_t>(e)]);
    }
  c.opt.normalizer = s.kind;
  c.opt.null_logits = s.null_logits;
  c.opt.scale = 1.0;
  c.opt.return_probs = true;
  if (s.visible >= 0) c.opt.key_lengths = {s.visible};
  return c;
}

/// Outputs of one attention evaluation converted to R, with their error bounds in T.
struct AttentionEval {
  AttentionResult<R> val;
  bounds::AttentionBounds bound;  ///< bounds on |val - exact| (already including ref_factor)
};

inline Tensor<double> scaled(Tensor<double> b, double f) {
  for (index_t i = 0; i < b.size(); ++i) b[i] *= f;
  return b;
}

/// Evaluate `f` in T on the rows, compare with the library in mp50 (T != mp50) and return the
/// T outputs in R.
template <class T>
AttentionEval attend(Tally& t, const AttentionFn<T>& f, const RowSpec& spec) {
  const RowCall<T> c = row_call<T>(spec);
  const AttentionResult<T> got = f(c.q, c.k, c.v, c.opt);
  AttentionEval e;
  e.val = {to_R(got.out), to_R(got.lse), to_R(got.p_null), to_R(got.probs)};
  const double fac = ref_factor<T>() * t.bound_factor;
  if constexpr (std::is_same_v<T, R>) {
    bounds::AttentionBounds b = bounds::attention_bounds<T, R>(c.q, c.k, c.v, c.opt, e.val);
    e.bound = {scaled(b.out, fac), scaled(b.lse, fac), scaled(b.p_null, fac), scaled(b.probs, fac)};
  } else {
    const RowCall<R> cr = row_call<R>(spec);
    const AttentionResult<R> ref = token_attention<R>(cr.q, cr.k, cr.v, cr.opt);
    bounds::AttentionBounds b = bounds::attention_bounds<T, R>(c.q, c.k, c.v, c.opt, ref);
    e.bound = {scaled(b.out, fac), scaled(b.lse, fac), scaled(b.p_null, fac), scaled(b.probs, fac)};
    compare(t, "attention output vs mp50", e.val.out, ref.out, e.bound.out, 1.0);
    compare(t, "p_null vs mp50", e.val.p_null, ref.p_null, e.bound.p_null, 1.0);
    compare(t, "probabilities vs mp50", e.val.probs, ref.probs, e.bound.probs, 1.0);
    compare(t, "LSE vs mp50", e.val.lse, ref.lse, e.bound.lse, 1.0);
  }
  return e;
}

// ---- depth routing on explicit candidates --------------------------------------------------------

/// One depth-routing call: n candidates, N tokens, width d (all values already rounded to T).
struct RouteSpec {
  index_t n = 0, N = 1, d = 1;
  std::vector<double> sources;  ///< [n, N, d]
  std::vector<double> g_old;    ///< [n, N]
  std::vector<double> psi;      ///< [n, N]
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

template <class T> Tensor<T> tensor_of(const Shape& s, const std::vector<double>& x) {
  Tensor<T> t(s);
  for (index_t i = 0; i < t.size(); ++i) t[i] = T(x[static_cast<std::size_t>(i)]);
  return t;
}

struct RouteEval {
  DepthRoute<R> val;
  bounds::DepthRouteBounds bound;
};

template <class T>
RouteEval route(Tally& t, const RouteFn<T>& f, const RouteSpec& s) {
  const Tensor<T> src = tensor_of<T>({s.n, s.N, s.d}, s.sources), g = tensor_of<T>({s.n, s.N}, s.g_old),
                  psi = tensor_of<T>({s.n, s.N}, s.psi);
  const DepthRoute<T> got = f(src, g, psi, s.kinds, s.opt);
  RouteEval e;
  e.val = {to_R(got.h), to_R(got.alpha), to_R(got.alpha_null), to_R(got.g), to_R(got.dpsi)};
  const double fac = ref_factor<T>() * t.bound_factor;
  auto scale_all = [&](bounds::DepthRouteBounds b) {
    return bounds::DepthRouteBounds{scaled(b.h, fac), scaled(b.alpha, fac), scaled(b.alpha_null, fac),
                                    scaled(b.g, fac), scaled(b.dpsi, fac)};
  };
  if constexpr (std::is_same_v<T, R>) {
    e.bound = scale_all(bounds::depth_route_bounds<T, R>(src, g, psi, s.kinds, s.opt, e.val));
  } else {
    const DepthRoute<R> ref = attn_res_route<R>(tensor_of<R>({s.n, s.N, s.d}, s.sources), tensor_of<R>({s.n, s.N}, s.g_old),
                                                tensor_of<R>({s.n, s.N}, s.psi), s.kinds, s.opt);
    e.bound = scale_all(bounds::depth_route_bounds<T, R>(src, g, psi, s.kinds, s.opt, ref));
    compare(t, "routed state h vs mp50", e.val.h, ref.h, e.bound.h, 1.0);
    compare(t, "depth weights vs mp50", e.val.alpha, ref.alpha, e.bound.alpha, 1.0);
    compare(t, "depth null weight vs mp50", e.val.alpha_null, ref.alpha_null, e.bound.alpha_null, 1.0);
    compare(t, "coupled logits vs mp50", e.val.g, ref.g, e.bound.g, 1.0);
  }
  return e;
}

// ---- small linear algebra in R -------------------------------------------------------------------

inline R norm_of(const std::vector<R>& x) {
  using std::sqrt;
  R s(0);
  for (const R& v : x) s += v * v;
  return sqrt(s);
}
inline double norm_of(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}
/// Row `row` of the last axis of a tensor (e.g. out(0, h, 0, :)) as a vector.
template <class X> std::vector<X> last_axis(const Tensor<X>& t, index_t offset, index_t len) {
  return std::vector<X>(t.data() + offset, t.data() + offset + len);
}

// ---- running a check ---------------------------------------------------------------------------

template <class F> void for_scalars(const CheckConfig& cfg, F&& f) {
  auto want = [&](const char* n) { return cfg.only_scalar.empty() || cfg.only_scalar == n; };
  if (want("mp50")) f(Tag<mp50>{});
#if defined(OASIS_HAVE_MPFR)
  if (want("mpfr50")) f(Tag<mpfr50>{});
#endif
  if (want("double")) f(Tag<double>{});
  if (want("float")) f(Tag<float>{});
}

/// Runs body(Tag<T>, Backend, Tally&) for every scalar and backend of the configuration.
template <class Body>
std::vector<CheckResult> run_check(const std::string& id, const std::string& ref, const CheckConfig& cfg,
                                   bool uses_backends, Body&& body) {
  std::vector<CheckResult> out;
  for_scalars(cfg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (Backend b : backends_for<T>(cfg, uses_backends)) {
      Tally t;
      t.bound_factor = b == Backend::reference ? 1.0 : 2.0;
      try {
        body(tag, b, t);
      } catch (const std::exception& e) {
        t.fail("exception", e.what());
      }
      out.push_back(t.result(id, ref, scalar_name<T>(), std::string(to_string(b))));
      if (cfg.progress) cfg.progress(id, scalar_name<T>(), std::string(to_string(b)));
    }
  });
  return out;
}

/// Runs body(Tag<T>, Tally&) against a mutant in mp50 (the statement alone must reject it)
/// and in double (statement and error bounds).
template <class Body>
std::vector<CheckResult> run_mutant(const std::string& id, const std::string& ref, const CheckConfig& cfg, Body&& body) {
  std::vector<CheckResult> out;
  auto one = [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tally t;
    try {
      body(tag, t);
    } catch (const std::exception& e) {
      t.fail("exception", e.what());
    }
    out.push_back(t.result(id, ref, scalar_name<T>(), "mutant"));
  };
  if (cfg.only_scalar.empty() || cfg.only_scalar == "mp50") one(Tag<mp50>{});
  if (cfg.only_scalar.empty() || cfg.only_scalar == "double") one(Tag<double>{});
  return out;
}

/// A mutant whose run evaluates f(Tag<T>, cfg, Tally&) — the check body on the wrong implementation.
template <class F>
Mutant mutant_of(const char* check, const char* ref, const char* id, const char* what, F f) {
  return {id, what, [check, ref, f](const CheckConfig& cfg) {
            return run_mutant(check, ref, cfg, [&](auto tag, Tally& t) { f(tag, cfg, t); });
          }};
}

}  // namespace oasis::checks::detail
