// proofs_checks/define_check.hpp — define_check(): the one way a check file builds its Check (the
// library run in every scalar and backend) and its mutants (wrong implementations it must reject).
//
// A check file provides, for its paper statement:
//   template <class T> struct Implementation;                       // the functions under test in T
//   template <class T> void check_statement(const Implementation<T>&, const CheckConfig&, CheckRun&);
//   template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend);
//   template <class T> Implementation<T> some_mutant(ScalarTag<T>);  // one per wrong implementation
// and registers them:
//   return define_check(kId, kPaperRef, "what is checked", BackendCoverage::every_available,
//                       [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
//                       [](auto scalar, Backend b) { return library_implementation(scalar, b); })
//       .mutant("some_mutant", "what is wrong", [](auto scalar) { return some_mutant(scalar); })
//       .check();
// A statement whose Implementation has a `loosen` factor on its own bound also registers
// .loosened_bound(factor, "...") (the library with a weakened bound: the equality cases must fail it).
// (The lambdas only turn the function templates into values; C++17 cannot pass a template.)
#pragma once

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "check_run.hpp"
#include "instances.hpp"
#include "oasis/backends/backend.hpp"

namespace oasis::checks::detail {

enum class BackendCoverage {
  reference_only,   ///< the statement is about functions that only the reference has
  every_available,  ///< float runs on every available backend (reference, cpu_fast, cuda)
};

/// Calls f(ScalarTag<T>{}) for every scalar of the configuration, highest precision first.
template <class F> void for_each_scalar(const CheckConfig& cfg, F&& f) {
  auto want = [&](const char* n) { return cfg.only_scalar.empty() || cfg.only_scalar == n; };
  if (want("mp50")) f(ScalarTag<mp50>{});
#if defined(OASIS_HAVE_MPFR)
  if (want("mpfr50")) f(ScalarTag<mpfr50>{});
#endif
  if (want("double")) f(ScalarTag<double>{});
  if (want("float")) f(ScalarTag<float>{});
}

/// The backends a run in T covers, filtered by cfg.only_backend.
template <class T> std::vector<Backend> backends_for(const CheckConfig& cfg, BackendCoverage coverage) {
  std::vector<Backend> all{Backend::reference};
  if (std::is_same_v<T, float> && coverage == BackendCoverage::every_available) all = available_backends();
  std::vector<Backend> out;
  for (Backend b : all)
    if (cfg.only_backend.empty() || cfg.only_backend == to_string(b)) out.push_back(b);
  return out;
}

/// Runs `evaluate()` into `run`; an exception is a failure of the run, not of the program.
template <class F> void run_guarded(CheckRun& run, F&& evaluate) {
  try {
    evaluate();
  } catch (const std::exception& e) {
    run.fail("exception", e.what());
  }
}

/// A Check under construction; see the top of this file.
template <class Statement, class Library> class CheckDefinition {
 public:
  CheckDefinition(std::string id, std::string paper_ref, std::string summary, BackendCoverage coverage,
                  Statement statement, Library library)
      : statement_(statement), library_(library) {
    check_.id = id;
    check_.paper_ref = paper_ref;
    check_.statement = std::move(summary);
    check_.run = [id, paper_ref, coverage, statement, library](const CheckConfig& cfg) {
      std::vector<CheckResult> out;
      for_each_scalar(cfg, [&](auto scalar) {
        using T = typename decltype(scalar)::type;
        for (Backend b : backends_for<T>(cfg, coverage)) {
          CheckRun run(b == Backend::reference ? 1.0 : 2.0);
          run_guarded(run, [&] { statement(library(scalar, b), cfg, run); });
          out.push_back(run.result(id, paper_ref, scalar_name<T>(), std::string(to_string(b))));
          if (cfg.progress) cfg.progress(id, scalar_name<T>(), std::string(to_string(b)));
        }
      });
      return out;
    };
  }

  /// A wrong implementation, `make(ScalarTag<T>)`, that the statement must reject: it runs in mp50
  /// (the statement alone must reject it) and in double (statement and error bounds).
  template <class Make> CheckDefinition& mutant(std::string id, std::string description, Make make) {
    Mutant m;
    m.id = std::move(id);
    m.description = std::move(description);
    m.run = [check = check_.id, paper_ref = check_.paper_ref, statement = statement_, make](const CheckConfig& cfg) {
      std::vector<CheckResult> out;
      auto one = [&](auto scalar) {
        using T = typename decltype(scalar)::type;
        CheckRun run;
        run_guarded(run, [&] { statement(make(scalar), cfg, run); });
        out.push_back(run.result(check, paper_ref, scalar_name<T>(), "mutant"));
      };
      if (cfg.only_scalar.empty() || cfg.only_scalar == "mp50") one(ScalarTag<mp50>{});
      if (cfg.only_scalar.empty() || cfg.only_scalar == "double") one(ScalarTag<double>{});
      return out;
    };
    check_.mutants.push_back(std::move(m));
    return *this;
  }

  /// The mutant "bound_loosened_10_percent": the library itself, with the statement's own bound
  /// scaled by `factor` (Implementation::loosen, 0.9 for a lower bound, 1.1 for an upper one). Only
  /// the equality cases can reject it, which shows that they are tight.
  CheckDefinition& loosened_bound(double factor, std::string description) {
    return mutant("bound_loosened_10_percent", std::move(description), [library = library_, factor](auto scalar) {
      auto impl = library(scalar, Backend::reference);
      impl.loosen = factor;
      return impl;
    });
  }

  Check check() const { return check_; }

 private:
  Statement statement_;
  Library library_;
  Check check_;
};

template <class Statement, class Library>
CheckDefinition<Statement, Library> define_check(std::string id, std::string paper_ref, std::string summary,
                                                 BackendCoverage coverage, Statement statement, Library library) {
  return CheckDefinition<Statement, Library>(std::move(id), std::move(paper_ref), std::move(summary), coverage,
                                             statement, library);
}

}  // namespace oasis::checks::detail
