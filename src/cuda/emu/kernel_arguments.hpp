// src/cuda/emu/kernel_arguments.hpp — the pointers among a kernel's arguments, for the emulator's
// launch check (cuda_runtime.h): on the device, a kernel that dereferences host memory faults; on
// the emulator it would silently read the host's memory, so every launch checks that each
// pointer it passes is null or device memory.
//
// An argument is checked when it is a pointer, or an aggregate struct (a launch struct such as
// oasis::cuda::detail::AttentionLaunch): then each of its pointer members is checked. C++17 has
// no reflection; an aggregate is taken apart with structured bindings, its member count found as
// the largest n for which T{x_1, ..., x_n} compiles with x_i convertible to anything (the
// technique of Boost.PFR). A struct with a bare array member cannot be counted this way (brace
// elision lets the array absorb initialisers): the count then reaches the limit and a
// static_assert asks for the array to be wrapped in a struct. Pointers nested deeper than one
// struct level, and members of non-aggregate classes, are not checked.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace oasis_emu {

/// True if p is null or points into (or one past the end of) a live device allocation.
bool is_device_pointer(const void* p);

namespace arguments {

/// Converts to any type; only named in unevaluated aggregate initialisation.
struct AnyMember {
  template <class T>
  operator T() const;
};

template <class T, class Indices, class = void>
struct initialisable_from : std::false_type {};
template <class T, std::size_t... I>
struct initialisable_from<T, std::index_sequence<I...>,
                          std::void_t<decltype(T{(static_cast<void>(I), AnyMember{})...})>> : std::true_type {};

inline constexpr std::size_t kMaxMembers = 64;

/// The number of members of the aggregate T (kMaxMembers + 1 when there are more, or a bare array).
template <class T, std::size_t N = 0>
constexpr std::size_t member_count() {
  if constexpr (N <= kMaxMembers && initialisable_from<T, std::make_index_sequence<N + 1>>::value)
    return member_count<T, N + 1>();
  else
    return N;
}

template <class F, class... M>
void visit_all(F& f, const M&... m) {
  (f(m), ...);
}

// Binding names m1..mN for the structured bindings of for_each_member.
#define OASIS_EMU_MEMBERS_1 m1
#define OASIS_EMU_MEMBERS_2 OASIS_EMU_MEMBERS_1, m2
#define OASIS_EMU_MEMBERS_3 OASIS_EMU_MEMBERS_2, m3
#define OASIS_EMU_MEMBERS_4 OASIS_EMU_MEMBERS_3, m4
#define OASIS_EMU_MEMBERS_5 OASIS_EMU_MEMBERS_4, m5
#define OASIS_EMU_MEMBERS_6 OASIS_EMU_MEMBERS_5, m6
#define OASIS_EMU_MEMBERS_7 OASIS_EMU_MEMBERS_6, m7
#define OASIS_EMU_MEMBERS_8 OASIS_EMU_MEMBERS_7, m8
#define OASIS_EMU_MEMBERS_9 OASIS_EMU_MEMBERS_8, m9
#define OASIS_EMU_MEMBERS_10 OASIS_EMU_MEMBERS_9, m10
#define OASIS_EMU_MEMBERS_11 OASIS_EMU_MEMBERS_10, m11
#define OASIS_EMU_MEMBERS_12 OASIS_EMU_MEMBERS_11, m12
#define OASIS_EMU_MEMBERS_13 OASIS_EMU_MEMBERS_12, m13
#define OASIS_EMU_MEMBERS_14 OASIS_EMU_MEMBERS_13, m14
#define OASIS_EMU_MEMBERS_15 OASIS_EMU_MEMBERS_14, m15
#define OASIS_EMU_MEMBERS_16 OASIS_EMU_MEMBERS_15, m16
#define OASIS_EMU_MEMBERS_17 OASIS_EMU_MEMBERS_16, m17
#define OASIS_EMU_MEMBERS_18 OASIS_EMU_MEMBERS_17, m18
#define OASIS_EMU_MEMBERS_19 OASIS_EMU_MEMBERS_18, m19
#define OASIS_EMU_MEMBERS_20 OASIS_EMU_MEMBERS_19, m20
#define OASIS_EMU_MEMBERS_21 OASIS_EMU_MEMBERS_20, m21
#define OASIS_EMU_MEMBERS_22 OASIS_EMU_MEMBERS_21, m22
#define OASIS_EMU_MEMBERS_23 OASIS_EMU_MEMBERS_22, m23
#define OASIS_EMU_MEMBERS_24 OASIS_EMU_MEMBERS_23, m24
#define OASIS_EMU_MEMBERS_25 OASIS_EMU_MEMBERS_24, m25
#define OASIS_EMU_MEMBERS_26 OASIS_EMU_MEMBERS_25, m26
#define OASIS_EMU_MEMBERS_27 OASIS_EMU_MEMBERS_26, m27
#define OASIS_EMU_MEMBERS_28 OASIS_EMU_MEMBERS_27, m28
#define OASIS_EMU_MEMBERS_29 OASIS_EMU_MEMBERS_28, m29
#define OASIS_EMU_MEMBERS_30 OASIS_EMU_MEMBERS_29, m30
#define OASIS_EMU_MEMBERS_31 OASIS_EMU_MEMBERS_30, m31
#define OASIS_EMU_MEMBERS_32 OASIS_EMU_MEMBERS_31, m32
#define OASIS_EMU_MEMBERS_33 OASIS_EMU_MEMBERS_32, m33
#define OASIS_EMU_MEMBERS_34 OASIS_EMU_MEMBERS_33, m34
#define OASIS_EMU_MEMBERS_35 OASIS_EMU_MEMBERS_34, m35
#define OASIS_EMU_MEMBERS_36 OASIS_EMU_MEMBERS_35, m36
#define OASIS_EMU_MEMBERS_37 OASIS_EMU_MEMBERS_36, m37
#define OASIS_EMU_MEMBERS_38 OASIS_EMU_MEMBERS_37, m38
#define OASIS_EMU_MEMBERS_39 OASIS_EMU_MEMBERS_38, m39
#define OASIS_EMU_MEMBERS_40 OASIS_EMU_MEMBERS_39, m40
#define OASIS_EMU_MEMBERS_41 OASIS_EMU_MEMBERS_40, m41
#define OASIS_EMU_MEMBERS_42 OASIS_EMU_MEMBERS_41, m42
#define OASIS_EMU_MEMBERS_43 OASIS_EMU_MEMBERS_42, m43
#define OASIS_EMU_MEMBERS_44 OASIS_EMU_MEMBERS_43, m44
#define OASIS_EMU_MEMBERS_45 OASIS_EMU_MEMBERS_44, m45
#define OASIS_EMU_MEMBERS_46 OASIS_EMU_MEMBERS_45, m46
#define OASIS_EMU_MEMBERS_47 OASIS_EMU_MEMBERS_46, m47
#define OASIS_EMU_MEMBERS_48 OASIS_EMU_MEMBERS_47, m48
#define OASIS_EMU_MEMBERS_49 OASIS_EMU_MEMBERS_48, m49
#define OASIS_EMU_MEMBERS_50 OASIS_EMU_MEMBERS_49, m50
#define OASIS_EMU_MEMBERS_51 OASIS_EMU_MEMBERS_50, m51
#define OASIS_EMU_MEMBERS_52 OASIS_EMU_MEMBERS_51, m52
#define OASIS_EMU_MEMBERS_53 OASIS_EMU_MEMBERS_52, m53
#define OASIS_EMU_MEMBERS_54 OASIS_EMU_MEMBERS_53, m54
#define OASIS_EMU_MEMBERS_55 OASIS_EMU_MEMBERS_54, m55
#define OASIS_EMU_MEMBERS_56 OASIS_EMU_MEMBERS_55, m56
#define OASIS_EMU_MEMBERS_57 OASIS_EMU_MEMBERS_56, m57
#define OASIS_EMU_MEMBERS_58 OASIS_EMU_MEMBERS_57, m58
#define OASIS_EMU_MEMBERS_59 OASIS_EMU_MEMBERS_58, m59
#define OASIS_EMU_MEMBERS_60 OASIS_EMU_MEMBERS_59, m60
#define OASIS_EMU_MEMBERS_61 OASIS_EMU_MEMBERS_60, m61
#define OASIS_EMU_MEMBERS_62 OASIS_EMU_MEMBERS_61, m62
#define OASIS_EMU_MEMBERS_63 OASIS_EMU_MEMBERS_62, m63
#define OASIS_EMU_MEMBERS_64 OASIS_EMU_MEMBERS_63, m64
#define OASIS_EMU_VISIT(N)                   \
  if constexpr (n == N) {                    \
    const auto& [OASIS_EMU_MEMBERS_##N] = t; \
    visit_all(f, OASIS_EMU_MEMBERS_##N);     \
  } else

/// Calls f(member) for each member of the aggregate t, in declaration order.
template <class T, class F>
void for_each_member(const T& t, F&& f) {
  constexpr std::size_t n = member_count<T>();
  static_assert(n <= kMaxMembers, "a kernel parameter struct with more than 64 members or a bare array member: "
                                  "wrap the array in a struct (see kernel_arguments.hpp)");
  if constexpr (n == 0) {
  } else
  OASIS_EMU_VISIT(1) OASIS_EMU_VISIT(2) OASIS_EMU_VISIT(3) OASIS_EMU_VISIT(4) OASIS_EMU_VISIT(5) OASIS_EMU_VISIT(6) OASIS_EMU_VISIT(7) OASIS_EMU_VISIT(8) OASIS_EMU_VISIT(9) OASIS_EMU_VISIT(10) OASIS_EMU_VISIT(11) OASIS_EMU_VISIT(12) OASIS_EMU_VISIT(13) OASIS_EMU_VISIT(14) OASIS_EMU_VISIT(15) OASIS_EMU_VISIT(16)
  OASIS_EMU_VISIT(17) OASIS_EMU_VISIT(18) OASIS_EMU_VISIT(19) OASIS_EMU_VISIT(20) OASIS_EMU_VISIT(21) OASIS_EMU_VISIT(22) OASIS_EMU_VISIT(23) OASIS_EMU_VISIT(24) OASIS_EMU_VISIT(25) OASIS_EMU_VISIT(26) OASIS_EMU_VISIT(27) OASIS_EMU_VISIT(28) OASIS_EMU_VISIT(29) OASIS_EMU_VISIT(30) OASIS_EMU_VISIT(31) OASIS_EMU_VISIT(32)
  OASIS_EMU_VISIT(33) OASIS_EMU_VISIT(34) OASIS_EMU_VISIT(35) OASIS_EMU_VISIT(36) OASIS_EMU_VISIT(37) OASIS_EMU_VISIT(38) OASIS_EMU_VISIT(39) OASIS_EMU_VISIT(40) OASIS_EMU_VISIT(41) OASIS_EMU_VISIT(42) OASIS_EMU_VISIT(43) OASIS_EMU_VISIT(44) OASIS_EMU_VISIT(45) OASIS_EMU_VISIT(46) OASIS_EMU_VISIT(47) OASIS_EMU_VISIT(48)
  OASIS_EMU_VISIT(49) OASIS_EMU_VISIT(50) OASIS_EMU_VISIT(51) OASIS_EMU_VISIT(52) OASIS_EMU_VISIT(53) OASIS_EMU_VISIT(54) OASIS_EMU_VISIT(55) OASIS_EMU_VISIT(56) OASIS_EMU_VISIT(57) OASIS_EMU_VISIT(58) OASIS_EMU_VISIT(59) OASIS_EMU_VISIT(60) OASIS_EMU_VISIT(61) OASIS_EMU_VISIT(62) OASIS_EMU_VISIT(63) OASIS_EMU_VISIT(64)
  {
  }
}

#undef OASIS_EMU_VISIT

/// "" when argument `index` (of type T) holds no pointer outside device memory; else the reason.
template <class T>
std::string host_pointer_in(const T& arg, int index) {
  const std::string where = "kernel argument " + std::to_string(index);
  const std::string what = " is a pointer outside every device allocation (host memory?)";
  if constexpr (std::is_pointer_v<T>) {
    return is_device_pointer(static_cast<const void*>(arg)) ? std::string() : where + what;
  } else if constexpr (std::is_class_v<T> && std::is_aggregate_v<T>) {
    std::string bad;
    int m = 0;
    for_each_member(arg, [&](const auto& member) {
      if constexpr (std::is_pointer_v<std::decay_t<decltype(member)>>)
        if (bad.empty() && !is_device_pointer(static_cast<const void*>(member)))
          bad = where + " (a struct): its member " + std::to_string(m) + what;
      ++m;
    });
    return bad;
  } else {
    return std::string();
  }
}

}  // namespace arguments
}  // namespace oasis_emu
