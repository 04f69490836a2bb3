// bench/bench_attn_res.cpp — the fused AttnRes routing (ops attn_res, attn_res_backward; fla's
// naive_attnres) on Backend::cpu_fast beside the plain float reference, at n = 9 sources, N = 4096
// tokens, d = 2048, fla's options (softmax, no coupling, eps 1e-6, scale 1) with an RMSNorm gain:
//   AttnRes_fast / AttnRes_reference                    forward (through the backend API: a fresh
//                                                       result per call, as a caller gets it)
//   AttnRes_backward_fast / AttnRes_backward_reference  backward from the cotangents dh, dalpha
//   AttnRes_fresh_grad_sources                          a zero-filled [n, N, d] float tensor alone:
//                                                       the part of every call that allocates it
// Counters: GB/s of the minimum traffic (forward: the sources read once and h written,
// 4 (n + 1) N d bytes; backward: the sources and dh read once, grad sources written,
// 4 (2n + 1) N d bytes) and ratio_triad = GB/s / the same run's STREAM triad (BM_Ceiling_Triad of
// bench_cpu.cpp, which must be in the same run: --benchmark_filter='Ceiling_Triad$|AttnRes'; 0
// without it). The fast forward reads the sources twice (the logits' pass, then the routing's
// mix), its backward twice as well (pass 1 per token, pass 2 from cache), so 1 is not reachable.
// Validation before timing: the first kCheck tokens of the full-size fast call are bitwise those of
// a call on those tokens alone (every output but dL/dw and dL/dgain depends on its own token
// only), and that call satisfies the kernel parity rule (tests/parity/attn_res_bound.hpp) against
// the long double oracle; a failure aborts the run (exit status 2).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <string>

#include "attn_res_bound.hpp"
#include "bench_support.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis_random.hpp"

namespace oasis_bench {
namespace {

using namespace oasis;
using Clock = std::chrono::steady_clock;

constexpr index_t kSources = 9, kTokens = 4096, kWidth = 2048;
constexpr index_t kCheck = 16;  // tokens validated against the oracle

// The inputs at full size, drawn once.
const fast_parity::AttnResInputs& full_inputs() {
  static const fast_parity::AttnResInputs in = [] {
    auto rng = oasis::test::make_rng(900);
    fast_parity::AttnResInputs r;
    r.sources = oasis::test::randn<float>({kSources, kTokens, kWidth}, rng);
    r.w = oasis::test::randn<float>({kWidth}, rng, 0.05);
    r.gain = oasis::test::uniform<float>({kWidth}, rng, 0.5, 1.5);
    r.psi = Tensor<float>({kSources, kTokens});  // not read without coupling
    r.kinds.assign(static_cast<std::size_t>(kSources), SourceKind::attention);
    r.kinds[0] = SourceKind::initial;
    r.d.h = oasis::test::randn<float>({kTokens, kWidth}, rng);
    r.d.alpha = oasis::test::randn<float>({kSources, kTokens}, rng, 0.1);
    return r;
  }();
  return in;
}

// The inputs of tokens [0, T) alone.
fast_parity::AttnResInputs first_tokens(index_t T) {
  const fast_parity::AttnResInputs& full = full_inputs();
  fast_parity::AttnResInputs in;
  in.w = full.w;
  in.gain = full.gain;
  in.kinds = full.kinds;
  in.opt = full.opt;
  in.sources = Tensor<float>({kSources, T, kWidth});
  in.psi = Tensor<float>({kSources, T});
  in.d.h = Tensor<float>({T, kWidth});
  in.d.alpha = Tensor<float>({kSources, T});
  for (index_t i = 0; i < kSources; ++i) {
    std::memcpy(in.sources.ptr(i), full.sources.ptr(i), sizeof(float) * static_cast<std::size_t>(T * kWidth));
    for (index_t t = 0; t < T; ++t) in.d.alpha(i, t) = full.d.alpha(i, t);
  }
  std::memcpy(in.d.h.data(), full.d.h.data(), sizeof(float) * static_cast<std::size_t>(T * kWidth));
  return in;
}

// Whether the first `count` elements of every row of a are bitwise those of b ([rows, ...] with
// `row` elements per row in a, `count` in b).
bool same_prefix(const Tensor<float>& a, const Tensor<float>& b, index_t rows, index_t row, index_t count) {
  for (index_t r = 0; r < rows; ++r)
    if (std::memcmp(a.data() + r * row, b.data() + r * count, sizeof(float) * static_cast<std::size_t>(count)) != 0)
      return false;
  return true;
}

void validate_forward(const DepthRoute<float>& fast) {
  const fast_parity::AttnResInputs in = first_tokens(kCheck);
  const DepthRoute<float> part = attn_res(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt);
  if (!(same_prefix(fast.h, part.h, 1, 0, kCheck * kWidth) &&
        same_prefix(fast.alpha, part.alpha, kSources, kTokens, kCheck)))
    abort_run("attn_res: the first tokens of the full call differ from a call on them alone");
  const bounds::ParityOutcome o =
      fast_parity::check_attn_res(part, fast_parity::attn_res_forward_oracle<long double>(in));
  if (!o.ok) abort_run("attn_res: kernel parity rule violated\n" + o.first);
}

void validate_backward(const AttnResGrads<float>& fast) {
  const fast_parity::AttnResInputs in = first_tokens(kCheck);
  const AttnResGrads<float> part =
      attn_res_backward(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d);
  if (!(same_prefix(fast.sources, part.sources, kSources, kTokens * kWidth, kCheck * kWidth) &&
        same_prefix(fast.logits, part.logits, kSources, kTokens, kCheck)))
    abort_run("attn_res_backward: the first tokens of the full call differ from a call on them alone");
  const bounds::ParityOutcome o = fast_parity::check_attn_res_backward(
      part, fast_parity::attn_res_backward_oracle<long double>(in), in.opt.depth.coupling);
  if (!o.ok) abort_run("attn_res_backward: kernel parity rule violated\n" + o.first);
}

void report(benchmark::State& st, double bytes, Clock::time_point t0) {
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gbs = bytes * static_cast<double>(st.iterations()) / sec * 1e-9;
  st.counters["GB/s"] = gbs;
  st.counters["ratio_triad"] = g_triad_gbs > 0 ? gbs / g_triad_gbs : 0;
}

constexpr double kForwardBytes = 4.0 * (kSources + 1) * kTokens * kWidth;
constexpr double kBackwardBytes = 4.0 * (2 * kSources + 1) * kTokens * kWidth;

void BM_AttnRes_fast(benchmark::State& st) {
  const fast_parity::AttnResInputs& in = full_inputs();
  validate_forward(attn_res(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt));
  const Clock::time_point t0 = Clock::now();
  for (auto _ : st)
    benchmark::DoNotOptimize(attn_res(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt));
  report(st, kForwardBytes, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", fresh result per call");
}

void BM_AttnRes_reference(benchmark::State& st) {
  const fast_parity::AttnResInputs& in = full_inputs();
  const Clock::time_point t0 = Clock::now();
  for (auto _ : st) benchmark::DoNotOptimize(attn_res(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt));
  report(st, kForwardBytes, t0);
}

void BM_AttnRes_backward_fast(benchmark::State& st) {
  const fast_parity::AttnResInputs& in = full_inputs();
  validate_backward(attn_res_backward(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d));
  const Clock::time_point t0 = Clock::now();
  for (auto _ : st)
    benchmark::DoNotOptimize(
        attn_res_backward(Backend::cpu_fast, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d));
  report(st, kBackwardBytes, t0);
  st.SetLabel(std::string(cpu_fast::isa()) + ", fresh result per call");
}

void BM_AttnRes_backward_reference(benchmark::State& st) {
  const fast_parity::AttnResInputs& in = full_inputs();
  const Clock::time_point t0 = Clock::now();
  for (auto _ : st)
    benchmark::DoNotOptimize(attn_res_backward(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d));
  report(st, kBackwardBytes, t0);
}

// What a fresh result costs alone: a zero-filled [n, N, d] float tensor (the backward's grad
// sources; the forward's h is 1/n of it), first touched by the calling thread.
void BM_AttnRes_fresh_grad_sources(benchmark::State& st) {
  const Clock::time_point t0 = Clock::now();
  for (auto _ : st) benchmark::DoNotOptimize(Tensor<float>({kSources, kTokens, kWidth}));
  report(st, 4.0 * kSources * kTokens * kWidth, t0);
}

}  // namespace

// The fast paths run at least 0.25 s (several iterations) whatever --benchmark_min_time says, as
// bench_cpu.cpp's; the plain references keep the command line's minimum time.
BENCHMARK(BM_AttnRes_fast)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.25);
BENCHMARK(BM_AttnRes_reference)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnRes_backward_fast)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.25);
BENCHMARK(BM_AttnRes_backward_reference)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AttnRes_fresh_grad_sources)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.25);

}  // namespace oasis_bench
