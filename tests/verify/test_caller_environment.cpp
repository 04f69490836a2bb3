// tests/verify/test_caller_environment.cpp — a check computes in the oracle's arithmetic whatever
// floating-point environment its caller left (src/verify/oracle_arithmetic.hpp; docs/tolerances.md,
// "The oracle's arithmetic"), and gives the caller's environment back.
//
// The cases are the fuzz catalogue's, the outputs those of its float reference kernel. Without the
// guard, each changes a figure under each directed rounding mode, and two of them under flush-to-zero
// with denormals-are-zero: attention `typical` in f32, whose fast oracle takes its sums of magnitudes
// in float only where subnormals are kept (float_sums.hpp), and attn_res_backward `fused_peaked` in
// f64, whose weights include double subnormals.
#include <gtest/gtest.h>

#include <omp.h>

#include <cfenv>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "oasis/io/npy.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/fuzz.hpp"
#include "oasis/verify/report.hpp"
#include "oracle_arithmetic.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace fuzz = oasis::verify::fuzz;
using oasis::index_t;
using oasis::Tensor;

namespace {

struct Problem {
  std::string op;
  fuzz::Case c;
  io::TensorMap out;
};

Problem problem(const std::string& op, const std::string& regime, io::DType dt) {
  Problem p{op, fuzz::make_case(op, regime, dt, 7), {}};
  p.out = fuzz::reference_kernel(op)(p.c.inputs, io::json::parse(p.c.options_json()));
  return p;
}

verify::CompareReport run(const Problem& p) {
  return verify::check(p.op, p.c.inputs, p.out, io::json::parse(p.c.options_json()), verify::CompareOptions{});
}

/// Every figure of the two reports, bitwise.
void expect_same(const verify::CompareReport& a, const verify::CompareReport& b, const std::string& what) {
  EXPECT_EQ(verify::verdict_word(a), verify::verdict_word(b)) << what;
  EXPECT_EQ(a.oracle, b.oracle) << what;
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.worst_ratio, y.worst_ratio) << what << ": " << x.name;
    EXPECT_EQ(x.worst_ratio_certain, y.worst_ratio_certain) << what << ": " << x.name;
    EXPECT_EQ(x.max_abs, y.max_abs) << what << ": " << x.name;
    EXPECT_EQ(x.max_rel, y.max_rel) << what << ": " << x.name;
    EXPECT_EQ(x.violations, y.violations) << what << ": " << x.name;
  }
}

/// Runs f on the calling thread and on every thread of its OpenMP pool.
template <class F>
void on_every_thread(F f) {
  f();
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0) f();
  }
}

/// The pool has at least two threads for the length of a test.
struct TwoThreads {
  int old = omp_get_max_threads();
  TwoThreads() { omp_set_num_threads(old < 2 ? 2 : old); }
  ~TwoThreads() { omp_set_num_threads(old); }
};

const char* name_of(int mode) {
  return mode == FE_UPWARD ? "upward" : mode == FE_DOWNWARD ? "downward" : mode == FE_TOWARDZERO ? "toward zero" : "nearest";
}

TEST(CallerEnvironment, DirectedRoundingChangesNoFigureAndIsGivenBack) {
  const TwoThreads threads;
  const std::vector<Problem> ps = {problem("attention", "typical", io::DType::f32),
                                   problem("attn_res_backward", "fused_peaked", io::DType::f64),
                                   problem("attention_backward", "typical", io::DType::bf16)};
  for (const Problem& p : ps) {
    const verify::CompareReport base = run(p);
    for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
      on_every_thread([&] { std::fesetround(mode); });
      const verify::CompareReport r = run(p);
      int kept = 0, threads_seen = 0;
      on_every_thread([&] {
#pragma omp atomic
        kept += std::fegetround() == mode;
#pragma omp atomic
        ++threads_seen;
      });
      on_every_thread([] { std::fesetround(FE_TONEAREST); });
      expect_same(base, r, p.op + " " + p.c.regime + ", the caller rounding " + name_of(mode));
      EXPECT_EQ(kept, threads_seen) << "the caller's rounding " << name_of(mode) << " given back on every thread";
    }
  }
}

TEST(CallerEnvironment, ThrowingCheckGivesTheEnvironmentBack) {
  std::fesetround(FE_UPWARD);
  EXPECT_THROW(verify::check("no_such_op", {}, {}, io::json::parse("{}"), verify::CompareOptions{}), std::exception);
  const int after = std::fegetround();
  std::fesetround(FE_TONEAREST);
  EXPECT_EQ(after, FE_UPWARD);
}

TEST(CallerEnvironment, GuardSetsTheDefaultOnThePoolAndNestsOnce) {
  const TwoThreads threads;
  on_every_thread([] { std::fesetround(FE_DOWNWARD); });
  int in_guard = 0, inner = 0, after_inner = 0, after = 0, seen = 0;
  {
    const verify::detail::OracleArithmetic outer;
    on_every_thread([&] {
#pragma omp atomic
      in_guard += std::fegetround() == FE_TONEAREST;
#pragma omp atomic
      ++seen;
    });
    {
      const verify::detail::OracleArithmetic nested;
      inner = std::fegetround() == FE_TONEAREST;
    }
    on_every_thread([] { const verify::detail::OracleArithmetic on_a_pool_thread; });  // does nothing
    on_every_thread([&] {
#pragma omp atomic
      after_inner += std::fegetround() == FE_TONEAREST;
    });
  }
  on_every_thread([&] {
#pragma omp atomic
    after += std::fegetround() == FE_DOWNWARD;
  });
  on_every_thread([] { std::fesetround(FE_TONEAREST); });
  EXPECT_GE(seen, 2);
  EXPECT_EQ(in_guard, seen) << "round to nearest on every thread inside the guard";
  EXPECT_EQ(inner, 1);
  EXPECT_EQ(after_inner, seen) << "a nested guard's end leaves the outer guard's environment";
  EXPECT_EQ(after, seen) << "the caller's rounding given back on every thread";
}

#if defined(__x86_64__)
constexpr unsigned kFlushBits = 0x8040u;  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)

// The readers and the Python module widen float32 from the bits before a check's guard starts: a
// subnormal element keeps its value under the caller's denormals-are-zero.
TEST(CallerEnvironment, SubnormalFloatsAreReadUnderDenormalsAreZero) {
  const Tensor<double> x({3}, 0.0);
  Tensor<double> v = x;
  v[0] = 0x1p-140, v[1] = -0x1p-149, v[2] = 0x1.8p-127;  // float subnormals
  const std::string npy = io::serialize_npy(io::StoredTensor{io::DType::f32, v}, "x.npy");
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | kFlushBits);
  const io::StoredTensor r = io::parse_npy(npy, "x.npy");
  volatile float tiny = 0x1p-140f;
  const double flushed = static_cast<double>(tiny);  // what the conversion instruction gives
  _mm_setcsr(csr);
  EXPECT_EQ(flushed, 0.0) << "denormals-are-zero was in force";
  for (index_t i = 0; i < 3; ++i) EXPECT_EQ(r.values[i], v[i]) << "entry " << i;
}

TEST(CallerEnvironment, FlushToZeroChangesNoFigureAndIsGivenBack) {
  const TwoThreads threads;
  for (const Problem& p : {problem("attention", "typical", io::DType::f32),
                           problem("attn_res_backward", "fused_peaked", io::DType::f64)}) {
    const verify::CompareReport base = run(p);
    on_every_thread([] { _mm_setcsr(_mm_getcsr() | kFlushBits); });
    const verify::CompareReport r = run(p);
    int kept = 0, seen = 0;
    on_every_thread([&] {
#pragma omp atomic
      kept += (_mm_getcsr() & kFlushBits) == kFlushBits;
#pragma omp atomic
      ++seen;
    });
    on_every_thread([] { _mm_setcsr(_mm_getcsr() & ~kFlushBits); });
    expect_same(base, r, p.op + " " + p.c.regime + " under flush-to-zero and denormals-are-zero");
    EXPECT_EQ(kept, seen) << "the caller's flush modes given back on every thread";
  }
}
#endif

}  // namespace
