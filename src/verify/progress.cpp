// src/verify/progress.cpp — the ProgressRun of progress.hpp and terminal_progress().
#include "progress.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace oasis::verify {
namespace detail {

using Clock = std::chrono::steady_clock;

/// First report after kQuiet, then every kEvery: a quick check shows nothing.
constexpr auto kQuiet = std::chrono::seconds(2);
constexpr auto kEvery = std::chrono::milliseconds(250);

struct ProgressTracker {
  std::function<void(const Progress&)> fn;
  Progress base;  // op, totals
  Clock::time_point start = Clock::now();
  std::atomic<index_t> done{0}, exact{0}, tensors{0};
  std::mutex m;  // guards stage, stop and the condition
  std::condition_variable cv;
  std::string stage;
  bool stop = false, called = false;
  std::thread reporter;

  Progress snapshot(bool finished) {
    Progress p = base;
    p.elements_done = done.load(std::memory_order_relaxed);
    p.elements_mp50 = exact.load(std::memory_order_relaxed);
    p.tensors_done = tensors.load(std::memory_order_relaxed);
    p.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    p.finished = finished;
    {
      std::lock_guard<std::mutex> g(m);
      p.level = stage;
    }
    if (p.level.empty())
      p.level = p.elements_mp50 == 0 ? "double"
                : p.elements_mp50 == p.elements_done
                    ? "mp50"
                    : "double, " + std::to_string(p.elements_mp50) + " elements recomputed in mp50";
    return p;
  }
  void call(bool finished) {
    try {
      fn(snapshot(finished));
      called = true;
    } catch (...) {  // a progress function must not stop the comparison: it is not called again
      fn = nullptr;
    }
  }
  void run() {
    std::unique_lock<std::mutex> g(m);
    if (cv.wait_until(g, start + kQuiet, [&] { return stop; })) return;
    while (!stop) {
      g.unlock();
      if (fn) call(false);
      g.lock();
      cv.wait_for(g, kEvery, [&] { return stop; });
    }
  }
};

namespace {
std::atomic<ProgressTracker*> g_active{nullptr};
}  // namespace

ProgressRun::ProgressRun(const CompareOptions& opt, const std::string& op, const io::TensorMap& outputs,
                         const std::vector<std::string>& checked) {
  if (!opt.progress) return;
  auto* t = new ProgressTracker;
  t->fn = opt.progress;
  t->base.op = op;
  for (const auto& [name, s] : outputs) {
    if (io::is_integer(s.dtype) || name == "ids") continue;
    if (!checked.empty() && std::find(checked.begin(), checked.end(), name) == checked.end()) continue;
    ++t->base.tensors_total;
    t->base.elements_total += s.values.size();
  }
  if (opt.sample > 0) t->base.elements_total = 0;  // the sample's share is not known here
  ProgressTracker* none = nullptr;
  if (!g_active.compare_exchange_strong(none, t)) {
    delete t;
    return;
  }
  t_ = t;
  t_->reporter = std::thread([t] { t->run(); });
}

ProgressRun::~ProgressRun() {
  if (!t_) return;
  {
    std::lock_guard<std::mutex> g(t_->m);
    t_->stop = true;
  }
  t_->cv.notify_all();
  t_->reporter.join();
  g_active.store(nullptr);
  if (t_->called && t_->fn) t_->call(true);
  delete t_;
}

void progress_stage(const std::string& stage) {
  ProgressTracker* t = g_active.load();
  if (!t) return;
  std::lock_guard<std::mutex> g(t->m);
  t->stage = stage;
}

void CheckProgress::flush() {
  if (ProgressTracker* t = g_active.load(std::memory_order_relaxed)) {
    t->done.fetch_add(pending_, std::memory_order_relaxed);
    t->exact.fetch_add(pending_exact_, std::memory_order_relaxed);
  }
  pending_ = pending_exact_ = 0;
}

void CheckProgress::finish() {
  flush();
  if (ProgressTracker* t = g_active.load(std::memory_order_relaxed)) t->tensors.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace detail

namespace {
std::string count(index_t n) {
  char b[32];
  if (n >= 10000000) std::snprintf(b, sizeof b, "%.1fM", static_cast<double>(n) / 1e6);
  else if (n >= 10000) std::snprintf(b, sizeof b, "%.1fk", static_cast<double>(n) / 1e3);
  else std::snprintf(b, sizeof b, "%lld", static_cast<long long>(n));
  return b;
}
}  // namespace

std::function<void(const Progress&)> terminal_progress() {
#if defined(__unix__) || defined(__APPLE__)
  if (!isatty(STDERR_FILENO)) return {};
#else
  return {};
#endif
  return [](const Progress& p) {
    std::string line = p.op + ": " + std::to_string(p.tensors_done) + " of " + std::to_string(p.tensors_total) +
                       " tensors, " + count(p.elements_done);
    if (p.elements_total > 0) {
      char pct[32];
      std::snprintf(pct, sizeof pct, " (%.0f %%)", 100.0 * static_cast<double>(p.elements_done) / static_cast<double>(p.elements_total));
      line += " of " + count(p.elements_total) + " elements" + pct;
    } else {
      line += " elements";
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, ", %.0f s", p.seconds);
    line += "; oracle: " + p.level + secs;
    // \r and erase-line redraw one status line; the last call ends it
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), p.finished ? "\n" : "");
    std::fflush(stderr);
  };
}

}  // namespace oasis::verify
