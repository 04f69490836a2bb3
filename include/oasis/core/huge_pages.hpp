// oasis/core/huge_pages.hpp — large buffers backed by transparent huge pages where the host offers
// them on request: madvise(MADV_HUGEPAGE) before the first touch, so that a fresh buffer faults in
// 2 MiB pages instead of 4 KiB ones (512 times fewer faults; a hint that changes no value, ignored
// where unsupported). docs/benchmarks.md, "Page faults and huge pages".
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace oasis {

/// Allocations below this size are left alone (their faults are few; the hint is a system call).
inline constexpr std::size_t kHugePagesFrom = std::size_t(4) << 20;

/// Asks for huge pages over the 2 MiB-aligned part of [p, p + bytes) (at least kHugePagesFrom
/// bytes; only whole aligned 2 MiB extents can be huge pages). Call before the first touch: pages
/// already touched keep their size.
inline void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
  if (p == nullptr || bytes < kHugePagesFrom) return;
  const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(p), e = b + bytes, first = (b + kHuge - 1) & ~(kHuge - 1);
  if (e > first) (void)madvise(reinterpret_cast<void*>(first), e - first, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// v.resize(n, fill) for a contiguous container (std::vector, std::string), with storage it newly
/// allocates advised for huge pages before it is filled.
template <class C>
void resize_advised(C& v, std::size_t n, const typename C::value_type& fill = typename C::value_type()) {
  using T = typename C::value_type;
  if constexpr (!std::is_same_v<C, std::vector<bool>>) {  // std::vector<bool> has no data()
    if (n > v.capacity() && n * sizeof(T) >= kHugePagesFrom) {
      const T value = fill;  // fill may be an element of v, which reserve moves
      v.reserve(n);
      advise_huge_pages(v.data() + v.size(), (n - v.size()) * sizeof(T));
      v.resize(n, value);
      return;
    }
  }
  v.resize(n, fill);
}

}  // namespace oasis
