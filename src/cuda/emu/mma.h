// src/cuda/emu/mma.h — warp matrix multiply-accumulate (nvcuda::wmma) of the CUDA emulator: the
// 16x16x16 shape with __half or __nv_bfloat16 inputs and float accumulators, which is what the
// tensor-core attention kernel (attention_tc.cu) uses of the toolkit's <mma.h>.
//
// The toolkit leaves the mapping of matrix elements to the lanes' fragment elements (x[i])
// unspecified; a kernel may rely only on the documented semantics: load_matrix_sync and
// store_matrix_sync are inverse for one fragment type, mma_sync's result is what
// store_matrix_sync writes, and element-wise operations act on each element in place. The
// emulator uses a fixed mapping per use (matrix_a, matrix_b, accumulator) that is deliberately
// scrambled (slot s = lane * num_elements + i holds element perm(s mod 256), three different
// permutations), so a kernel that assumes the device's layout, or that one use's layout equals
// another's, gives wrong results here. Fragments have the toolkit's num_elements (a __half
// matrix_a/b fragment holds 16: every element twice, as on the device).
//
// Every function is a warp-wide operation (cuda_runtime.h, warp_operation): all 32 lanes must
// arrive, with the same pointer, leading dimension, layout (and fill value); the last to arrive
// performs it for the whole warp. Checked as the device requires (CUDA C++ Programming Guide,
// "Warp Matrix Functions"): the pointer 256-bit (32-byte) aligned, ldm a multiple of 16 bytes,
// and every element read or written inside one live device allocation or shared memory (the
// latter is not distinguishable here: reads outside any allocation are caught under ASan).
//
// mma_sync's arithmetic, the order stated: D[r][n] = C[r][n], then for k = 0..15 in order
// D[r][n] = fmaf(A[r][k], B[k][n], D[r][n]). The products of two 16-bit inputs are exact in
// float (11 + 11 or 8 + 8 significant bits), so each step is one float rounding of the running
// sum: the exact sum of the products, accumulated in k order in IEEE binary32. The device's
// tensor cores add the products in an unspecified order and grouping; the parity rule's score
// term (any order, at most d_h roundings) covers both (docs/tolerances.md, "Tensor cores").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emu {

/// Element e of the 16x16 tile (row e / 16, column e % 16) held by fragment slot s (s < 256).
template <class Use>
constexpr int element_of_slot(int s) {
  if constexpr (std::is_same_v<Use, matrix_a>) return (s * 167 + 89) & 255;
  else if constexpr (std::is_same_v<Use, matrix_b>) return (s * 71 + 5) & 255;
  else return (s * 199 + 31) & 255;
}

template <class T>
float widen(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return x;
}

}  // namespace emu

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator implements the 16x16x16 shape");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>),
                "the emulator implements __half / __nv_bfloat16 inputs with float accumulators");
  static_assert(std::is_same_v<Use, accumulator> == std::is_same_v<Layout, void>,
                "matrix_a / matrix_b fragments take row_major or col_major, accumulators no layout");

 public:
  using element_type = T;
  using storage_element_type = T;
  using use = Use;
  using layout = Layout;
  /// The toolkit's element counts: a __half input fragment holds each element twice.
  enum { num_elements = std::is_same_v<T, __half> ? 16 : 8, num_storage_elements = num_elements };
  T x[num_elements];
};

namespace emu {

/// The arguments that every lane of a warp must pass alike (compared bytewise: no padding).
struct Call {
  const void* ptr;
  unsigned ldm;
  int layout;  // 0 row-major, 1 column-major
  float fill;
  unsigned unused;
};
static_assert(sizeof(Call) == sizeof(void*) + 16, "Call has no padding bytes");
inline Call make_call(const void* ptr, unsigned ldm, int layout) {
  Call c;
  std::memset(&c, 0, sizeof c);
  c.ptr = ptr;
  c.ldm = ldm;
  c.layout = layout;
  return c;
}

/// Address of element (r, c) of a 16x16 tile at p with leading dimension ldm.
inline std::size_t offset(int r, int c, unsigned ldm, int layout) {
  return layout == 0 ? static_cast<std::size_t>(r) * ldm + c : static_cast<std::size_t>(c) * ldm + r;
}

template <class T>
void check_access(const char* name, const void* p, unsigned ldm) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    oasis_emu::device_error(std::string(name) + ": the pointer is not 256-bit (32-byte) aligned");
  if ((static_cast<std::size_t>(ldm) * sizeof(T)) % 16 != 0)
    oasis_emu::device_error(std::string(name) + ": ldm = " + std::to_string(ldm) + " is not a multiple of " +
                            std::to_string(16 / sizeof(T)) + " elements (16 bytes)");
  if (ldm < 16) oasis_emu::device_error(std::string(name) + ": ldm = " + std::to_string(ldm) + " is below 16");
}

template <class Frag>
void run_load(void* const* lanes, const void* call) {
  using T = typename Frag::element_type;
  const Call& c = *static_cast<const Call*>(call);
  check_access<T>("wmma::load_matrix_sync", c.ptr, c.ldm);
  const T* p = static_cast<const T*>(c.ptr);
  for (int l = 0; l < 32; ++l) {
    Frag& f = *static_cast<Frag*>(lanes[l]);
    for (int i = 0; i < Frag::num_elements; ++i) {
      const int e = element_of_slot<typename Frag::use>((l * Frag::num_elements + i) & 255);
      f.x[i] = p[offset(e / 16, e % 16, c.ldm, c.layout)];
    }
  }
}

template <class Frag>
void run_store(void* const* lanes, const void* call) {
  const Call& c = *static_cast<const Call*>(call);
  check_access<float>("wmma::store_matrix_sync", c.ptr, c.ldm);
  float* p = static_cast<float*>(const_cast<void*>(c.ptr));
  for (int l = 0; l < 32; ++l) {
    const Frag& f = *static_cast<const Frag*>(lanes[l]);
    for (int i = 0; i < Frag::num_elements; ++i) {
      const int e = element_of_slot<accumulator>(l * Frag::num_elements + i);
      p[offset(e / 16, e % 16, c.ldm, c.layout)] = f.x[i];
    }
  }
}

template <class Frag>
void run_fill(void* const* lanes, const void* call) {
  const Call& c = *static_cast<const Call*>(call);
  using T = typename Frag::element_type;
  T v;
  if constexpr (std::is_same_v<T, float>) v = c.fill;
  else std::memcpy(&v, &c.fill, sizeof v);  // the 16-bit pattern, passed in the float's bytes
  for (int l = 0; l < 32; ++l) {
    Frag& f = *static_cast<Frag*>(lanes[l]);
    for (int i = 0; i < Frag::num_elements; ++i) f.x[i] = v;
  }
}

/// The whole 16x16 tile of a fragment from the 32 lanes' slots (the first copy of a replicated
/// element).
template <class Frag>
void gather(void* const* lanes, float (&tile)[256]) {
  bool seen[256] = {};
  for (int l = 0; l < 32; ++l) {
    const Frag& f = *static_cast<const Frag*>(lanes[l]);
    for (int i = 0; i < Frag::num_elements; ++i) {
      const int e = element_of_slot<typename Frag::use>((l * Frag::num_elements + i) & 255);
      if (!seen[e]) tile[e] = widen(f.x[i]);
      seen[e] = true;
    }
  }
}

template <class FA, class FB>
struct MmaLane {  // what each lane contributes to mma_sync
  fragment<accumulator, 16, 16, 16, float>* d;
  const FA* a;
  const FB* b;
  const fragment<accumulator, 16, 16, 16, float>* c;
};

template <class FA, class FB>
void run_mma(void* const* lanes, const void* /*call*/) {
  using Acc = fragment<accumulator, 16, 16, 16, float>;
  float A[256], B[256], C[256];
  void* pa[32];
  void* pb[32];
  void* pc[32];
  for (int l = 0; l < 32; ++l) {
    const auto& m = *static_cast<const MmaLane<FA, FB>*>(lanes[l]);
    pa[l] = const_cast<FA*>(m.a);
    pb[l] = const_cast<FB*>(m.b);
    pc[l] = const_cast<Acc*>(m.c);
  }
  gather<FA>(pa, A);
  gather<FB>(pb, B);
  gather<Acc>(pc, C);
  // The fragment's row-major or column-major tag says how it was loaded; the tile gathered here is
  // the matrix itself (row r, column c at e = 16 r + c) either way.
  float D[256];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = C[r * 16 + n];
      for (int k = 0; k < 16; ++k) acc = std::fma(A[r * 16 + k], B[k * 16 + n], acc);
      D[r * 16 + n] = acc;
    }
  for (int l = 0; l < 32; ++l) {  // after every read: d may be c
    Acc& d = *static_cast<const MmaLane<FA, FB>*>(lanes[l])->d;
    for (int i = 0; i < Acc::num_elements; ++i) d.x[i] = D[element_of_slot<accumulator>(l * Acc::num_elements + i)];
  }
}

inline int layout_of(layout_t l) { return l == mem_row_major ? 0 : 1; }
template <class Layout>
constexpr int layout_of() {
  return std::is_same_v<Layout, row_major> ? 0 : 1;
}

}  // namespace emu

/// Loads a matrix_a / matrix_b fragment: element (r, c) at p[r * ldm + c] (row_major) or
/// p[c * ldm + r] (col_major); for matrix_b, r indexes K and c indexes N.
template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout_t");
  const emu::Call call = emu::make_call(p, ldm, emu::layout_of<Layout>());
  oasis_emu::warp_operation("wmma::load_matrix_sync", &call, sizeof call, &f,
                            &emu::run_load<fragment<Use, 16, 16, 16, T, Layout>>);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  const emu::Call call = emu::make_call(p, ldm, emu::layout_of(layout));
  oasis_emu::warp_operation("wmma::load_matrix_sync", &call, sizeof call, &f,
                            &emu::run_load<fragment<accumulator, 16, 16, 16, float>>);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  const emu::Call call = emu::make_call(p, ldm, emu::layout_of(layout));
  oasis_emu::warp_operation("wmma::store_matrix_sync", &call, sizeof call,
                            const_cast<fragment<accumulator, 16, 16, 16, float>*>(&f),
                            &emu::run_store<fragment<accumulator, 16, 16, 16, float>>);
}

/// Every element of the fragment set to v; the lanes must pass the same v (a per-lane value would
/// fill an unspecified part of the matrix).
template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v) {
  emu::Call call = emu::make_call(nullptr, 0, 0);
  std::memcpy(&call.fill, &v, sizeof v);
  oasis_emu::warp_operation("wmma::fill_fragment", &call, sizeof call, &f,
                            &emu::run_fill<fragment<Use, 16, 16, 16, T, Layout>>);
}

/// d = a b + c (16x16x16), float accumulation in the order stated at the top of this file; d may
/// be c.
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  using FA = fragment<matrix_a, 16, 16, 16, T, LA>;
  using FB = fragment<matrix_b, 16, 16, 16, T, LB>;
  emu::MmaLane<FA, FB> lane{&d, &a, &b, &c};
  const emu::Call call = emu::make_call(nullptr, 0, 0);
  oasis_emu::warp_operation("wmma::mma_sync", &call, sizeof call, &lane, &emu::run_mma<FA, FB>);
}

}  // namespace wmma
}  // namespace nvcuda
