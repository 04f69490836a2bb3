// src/cpu_fast/dispatch.cpp — the choices the fast path makes at run time: the instruction-set
// variant of the kernels (the widest this CPU runs, or OASIS_CPU_FAST_ISA, or cpu_fast::set_isa)
// and the depth mixing's streaming (by CPU vendor, or OASIS_CPU_FAST_ROUTE_STREAMS, or
// cpu_fast::set_route_streams).
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fast_kernels.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/core/error.hpp"

namespace oasis {
namespace {

using fast::Kernels;

std::vector<const Kernels*> supported_kernels() {
  std::vector<const Kernels*> out;
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f")) out.push_back(&fast::kernels_avx512());
  if (avx2) out.push_back(&fast::kernels_avx2());
#endif
  out.push_back(&fast::kernels_generic());
  return out;
}

const Kernels* find_kernels(std::string_view name) {
  for (const Kernels* k : supported_kernels())
    if (name == k->isa) return k;
  return nullptr;
}

const Kernels* initial_kernels() {
  // OASIS_CPU_FAST_ISA=avx2|generic forces a narrower variant (benchmarks of each variant).
  if (const char* env = std::getenv("OASIS_CPU_FAST_ISA"))
    if (const Kernels* k = find_kernels(env)) return k;
  return supported_kernels().front();
}

std::atomic<const Kernels*>& active_slot() {
  static std::atomic<const Kernels*> slot{initial_kernels()};
  return slot;
}

// How the depth mixing streams its sources (fast::MixStreams): four per pass into L1 on AMD, two
// per pass into L2 elsewhere (docs/benchmarks.md, "Where the AMD runs lost: depth routing").
// OASIS_CPU_FAST_ROUTE_STREAMS=pairs-l2|quads-l1 forces one (benchmarks of each).
struct NamedStreams {
  const char* name;
  fast::MixStreams streams;
};
constexpr NamedStreams kStreams[] = {{"pairs-l2", fast::MixStreams::pairs_l2}, {"quads-l1", fast::MixStreams::quads_l1}};

const NamedStreams* find_streams(std::string_view name) {
  for (const NamedStreams& s : kStreams)
    if (name == s.name) return &s;
  return nullptr;
}

const NamedStreams* initial_streams() {
  if (const char* env = std::getenv("OASIS_CPU_FAST_ROUTE_STREAMS"))
    if (const NamedStreams* s = find_streams(env)) return s;
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) return find_streams("quads-l1");
#endif
  return find_streams("pairs-l2");
}

std::atomic<const NamedStreams*>& streams_slot() {
  static std::atomic<const NamedStreams*> slot{initial_streams()};
  return slot;
}

}  // namespace

namespace fast {
const Kernels& active_kernels() { return *active_slot().load(std::memory_order_acquire); }
MixStreams active_streams() { return streams_slot().load(std::memory_order_acquire)->streams; }
}  // namespace fast

namespace cpu_fast {

std::string_view isa() { return fast::active_kernels().isa; }

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const fast::Kernels* k : supported_kernels()) out.emplace_back(k->isa);
  return out;
}

void set_isa(std::string_view name) {
  const fast::Kernels* k = find_kernels(name);
  if (!k) {
    std::string list;
    for (const std::string& s : available_isas()) list += (list.empty() ? "" : ", ") + s;
    throw invalid_argument("isa", "'" + std::string(name) + "' is not supported on this CPU (available: " + list + ")");
  }
  active_slot().store(k, std::memory_order_release);
}

std::string_view route_streams() { return streams_slot().load(std::memory_order_acquire)->name; }

std::vector<std::string> available_route_streams() {
  std::vector<std::string> out;
  for (const NamedStreams& s : kStreams) out.emplace_back(s.name);
  return out;
}

void set_route_streams(std::string_view name) {
  const NamedStreams* s = find_streams(name);
  if (!s) {
    std::string list;
    for (const std::string& n : available_route_streams()) list += (list.empty() ? "" : ", ") + n;
    throw invalid_argument("route_streams", "unknown '" + std::string(name) + "' (available: " + list + ")");
  }
  streams_slot().store(s, std::memory_order_release);
}

}  // namespace cpu_fast
}  // namespace oasis
