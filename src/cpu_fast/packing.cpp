// src/cpu_fast/packing.cpp — the visible key ranges and the key panels (packing.hpp).
#include "packing.hpp"

#include <algorithm>
#include <cstring>

#include "workspace.hpp"

namespace oasis::fast {
namespace {

// Four floats (the 4 x 4 transposes of pack_panel).
typedef float F4 __attribute__((vector_size(16)));
typedef int I4 __attribute__((vector_size(16)));
#if defined(__clang__)
#define OASIS_SHUFFLE2(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define OASIS_SHUFFLE2(a, b, i, j, k, l) __builtin_shuffle(a, b, I4{i, j, k, l})
#endif
inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }

}  // namespace

// Each (batch, query)'s visible keys (visible_range) in the calling thread's buffer: the begin of
// (b, t) at [b Tq + t], its end B Tq further.
index_t* key_ranges(const AttentionShape& s, const AttentionOptions& opt) {
  if (tl_span.size() < static_cast<std::size_t>(2 * s.B * s.Tq)) tl_span.resize(static_cast<std::size_t>(2 * s.B * s.Tq));
  index_t* kbegin = tl_span.data();
  index_t* kend = kbegin + s.B * s.Tq;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t t = 0; t < s.Tq; ++t) {
      const KeyRange kr = visible_range(s, opt, b, t);
      kbegin[b * s.Tq + t] = kr.begin;
      kend[b * s.Tq + t] = kr.end;
    }
  return kbegin;
}

// Panel `tile` (of KT keys) of the rows x (batch b, head h) of x, transposed for the score gemm's
// B operand: dst[c * KT + jj] = x(b, h, tile * KT + jj, c) for c < d, zero past row T.
// Transposed in 4 x 4 blocks (four rows' four columns in registers, stored as four runs of four
// floats) rather than one element at a time: a quarter of the strided stores.
// Returns whether every value it read was finite (x - x is 0 for a finite x, NaN otherwise).
bool pack_panel(const float* x, const Strides& xs, index_t b, index_t h, index_t tile, index_t KT, index_t T,
                index_t d, float* dst) {
  F4 bad = {0.0f, 0.0f, 0.0f, 0.0f};
  float bad_tail = 0.0f;
  const index_t j0 = tile * KT;
  const index_t full = std::max<index_t>(0, std::min(KT, T - j0)) / 4 * 4;  // keys in whole blocks of 4 rows
  const index_t d4 = d / 4 * 4;
  const float* base = x + b * xs.b + h * xs.h;
  for (index_t jj = 0; jj < full; jj += 4) {
    const float* r0 = base + (j0 + jj) * xs.t;
    const float* r1 = r0 + xs.t;
    const float* r2 = r1 + xs.t;
    const float* r3 = r2 + xs.t;
    for (index_t c = 0; c < d4; c += 4) {
      const F4 a0 = load4(r0 + c), a1 = load4(r1 + c), a2 = load4(r2 + c), a3 = load4(r3 + c);
      bad += ((a0 - a0) + (a1 - a1)) + ((a2 - a2) + (a3 - a3));
      const F4 t0 = OASIS_SHUFFLE2(a0, a1, 0, 4, 1, 5), t1 = OASIS_SHUFFLE2(a0, a1, 2, 6, 3, 7);
      const F4 t2 = OASIS_SHUFFLE2(a2, a3, 0, 4, 1, 5), t3 = OASIS_SHUFFLE2(a2, a3, 2, 6, 3, 7);
      float* o = dst + c * KT + jj;
      store4(o, OASIS_SHUFFLE2(t0, t2, 0, 1, 4, 5));                 // column c of rows jj..jj+3
      store4(o + KT, OASIS_SHUFFLE2(t0, t2, 2, 3, 6, 7));            // column c + 1
      store4(o + 2 * KT, OASIS_SHUFFLE2(t1, t3, 0, 1, 4, 5));        // column c + 2
      store4(o + 3 * KT, OASIS_SHUFFLE2(t1, t3, 2, 3, 6, 7));        // column c + 3
    }
    for (index_t c = d4; c < d; ++c) {
      dst[c * KT + jj] = r0[c];
      dst[c * KT + jj + 1] = r1[c];
      dst[c * KT + jj + 2] = r2[c];
      dst[c * KT + jj + 3] = r3[c];
      bad_tail += ((r0[c] - r0[c]) + (r1[c] - r1[c])) + ((r2[c] - r2[c]) + (r3[c] - r3[c]));
    }
  }
  for (index_t jj = full; jj < KT; ++jj) {  // the last rows, and zeros past row T
    const index_t j = j0 + jj;
    const float* src = base + j * xs.t;
    for (index_t c = 0; c < d; ++c) {
      const float x_c = j < T ? src[c] : 0.0f;
      dst[c * KT + jj] = x_c;
      bad_tail += x_c - x_c;
    }
  }
  return bad[0] == 0.0f && bad[1] == 0.0f && bad[2] == 0.0f && bad[3] == 0.0f && bad_tail == 0.0f;
}

#undef OASIS_SHUFFLE2

}  // namespace oasis::fast
