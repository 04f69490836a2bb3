// src/cpu_fast/fast_kernels.hpp — internal interface of the fast CPU kernels.
//
// The kernels are written once, one file per op (kernels/*.inc: common, gemm, forward, backward,
// route; table.inc lists them), over a GCC/Clang vector type of W float lanes and compiled three
// times, each under its own target region: avx512 (W = 16), avx2+fma (W = 8) and the x86-64 /
// portable baseline (W = 4) (fast_kernels_<isa>.cpp). dispatch.cpp picks the widest one the CPU
// supports at run time (cpu_fast::set_isa overrides it, e.g. for tests of every variant).
// Only this file's own functions are compiled for a wider ISA; every standard or Eigen header is
// included before a target region starts, so no inline function of a shared header is ever
// emitted with instructions that another translation unit does not expect.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "oasis/ops/online_softmax.hpp"

namespace oasis::fast {

using idx = std::int64_t;

inline constexpr idx kKeyTile = 64;         ///< keys per tile (columns of a score tile): the backward's
inline constexpr idx kKeyTileNarrow = 128;  ///< the forward's for narrow heads (forward_key_tile)
inline constexpr idx kQueryTile = 64;       ///< query rows per task

/// Keys per tile of the forward (the kernel's and the key packing's): 128 when d_h and d_v are at most 64, else
/// 64 (a tile's key panel and value rows, KT (d_h + d_v) floats, stay within 64 KB). Twice
/// the keys halve the per-tile work of each row (tile maximum, rescale, state update, the output
/// accumulator's loads and stores in the P V product), which pays for heads of 64 and not for
/// heads of 128 (docs/benchmarks.md, "What is left at T = 1024").
inline constexpr idx forward_key_tile(idx d_h, idx d_v) {
  return d_h <= 64 && d_v <= 64 ? kKeyTileNarrow : kKeyTile;
}

/// Float workspaces start on a cache line: a vector load or store at a multiple of 16 floats then
/// never spans two lines (split accesses halve the L1 bandwidth of the micro-kernels on Intel cores).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};
using Workspace = std::vector<float, CacheLineAllocator<float>>;

/// One task of the fused attention: `rows` consecutive queries of one (batch, query head).
/// Strides are in floats, so both layouts ([B, H, T, d] and [B, T, H, d]) are read in place.
struct AttnBlock {
  const float* q;        ///< first query row; rows are ldq apart
  idx ldq, rows, d_h;
  const float* kt;       ///< packed key tiles of the kv head, KT = forward_key_tile(d_h, d_v) keys each:
                         ///< tile t at kt + t*d_h*KT, layout [d_h][KT]
  const float* v;        ///< values: key j's row at v + j*ldv_in, read ldv wide (the input in place
  idx ldv_in, ldv, d_v;  ///< when d_v = ldv, else a copy padded with zeros); ldv: d_v in whole vectors
  const idx* kbegin;     ///< visible keys of row i: [kbegin[i], kend[i]) (both non-decreasing in i;
  const idx* kend;       ///< oasis::online::key_span); a bias may mask more with -inf
  const double* bias;    ///< additive bias of row i, key j at bias[i*ldb + j], or null
  idx ldb;
  float scale, null_logit;
  bool has_null;         ///< softmax1 (null category of logit null_logit) or plain softmax
  float* s_ws;           ///< workspace rows x KT (scores, then probabilities of one tile)
  float* o_ws;           ///< workspace rows x ldv (unnormalised output)
  online::State* st_ws;  ///< workspace rows (the online state (M, S) of each row)
  float* out;            ///< rows ldo apart, d_v each
  idx ldo;
  float* lse;            ///< rows
  float* p_null;         ///< rows
  float* probs;          ///< rows x ldp, or null
  idx ldp;
  float* row_max;        ///< rows: the final running maximum M of each row, or null
  float* row_sum;        ///< rows: the final sum S of each row (in units of e^M), or null
};

/// One task of the attention backward: the key tiles [tile0, tile1) of one (batch, kv head), with
/// every query row of its group's query heads that sees one of their keys. Packed operands
/// (zero-padded to whole vectors: ldh, ldv multiples of the vector width) and per-row arrays are
/// indexed by r = g * Tq + t for query head hk * group + g of the kv head.
struct BwdBlock {
  idx Tq, Tk, d_h, d_v, ldh, ldv, group;
  const float* qp;        ///< queries, row r at qp + r * ldh
  const float* dop;       ///< dL/dout, row r at dop + r * ldv
  const float* kp;        ///< keys, key j at kp + j * ldh
  const float* kt;        ///< key tiles [tile][d_h][kKeyTile] (as AttnBlock::kt)
  const float* vt;        ///< value tiles [tile][d_v][kKeyTile]
  const idx* kbegin;      ///< visible keys of query t: [kbegin[t], kend[t]) (the batch element's,
  const idx* kend;        ///< the same for every head; non-decreasing in t)
  const double* bias;     ///< additive bias of (g, t, j) at bias[g * bias_sg + t * Tk + j], or null
  idx bias_sg;
  const float* row_max;   ///< per row r: the forward's final M
  const float* row_inv;   ///< 1 / S (0: the row has no visible key with a finite logit)
  const float* row_D;     ///< D = <dO, O> + p_null dP
  const float* row_dlse;  ///< dL/dLSE (0 when not given)
  float scale;
  idx tile0, tile1;
  float* dq;              ///< accumulated (+=), unscaled: row r at dq + r * ldh
  float* dk;              ///< key j's gradient at dk + j * lddk (scaled), d_h written
  idx lddk;
  float* dv;              ///< key j's at dv + j * lddv, d_v written
  idx lddv;
  float* dz;              ///< dL/dz of row r, key j at dz[r * Tk + j] (visible keys written), or null
  float* ws;              ///< workspace: 2 kQueryTile kKeyTile + kKeyTile (ldh + ldv) floats
};

/// How the depth mixing (Kernels::mix) streams its sources through the output block: pairs_l2, two
/// sources per pass in the ISA's vectors and the next pass's rows prefetched into L2; quads_l1,
/// four per pass in vectors of at most 32 bytes, each stream prefetched 2 KiB ahead into L1. The
/// fast backend chooses by CPU vendor, quads_l1 on AMD and pairs_l2 elsewhere (docs/benchmarks.md,
/// "Where the Intel runs lost, part 2" and "Where the AMD runs lost: depth routing"); both are
/// bitwise the reference.
enum class MixStreams { pairs_l2, quads_l1 };

struct Kernels {
  const char* isa;
  int lanes;
  /// y_i = e^{x_i} (vectorised polynomial exp; see docs/benchmarks.md for its error).
  void (*exp)(const float* x, float* y, idx n);
  /// Whether the rows x n floats at x (rows ld apart) are all finite.
  bool (*finite_rows)(const float* x, idx ld, idx rows, idx n);
  /// dst row r = src row r's n floats then zeros up to ldd (rows lds and ldd apart); returns
  /// whether every value copied was finite.
  bool (*copy_rows)(const float* src, idx lds, idx rows, idx n, float* dst, idx ldd);
  /// The fused online-normalised attention of one block. A row with a visible score (scale * q.k
  /// + bias, as the kernel computes it) that is NaN or +inf is written as NaN (out, lse, p_null)
  /// and the block's probabilities are not written: the caller throws ("scores") on a NaN LSE. A
  /// visible -inf score is a masked key, as in the reference.
  void (*attention_block)(const AttnBlock& a);
  /// The attention backward of one task (BwdBlock; algorithm in kernels/backward.inc).
  void (*attention_backward_block)(const BwdBlock& a);
  /// For ntok consecutive tokens j: h[j*d + c] = sum_{i<n} alpha[j*n + i] * src[i*stride + j*d + c]
  /// (c < d), summed in the order i = 0..n-1 with a separate multiply and add (bitwise the
  /// reference's arithmetic), its sources streamed as `m` says; `more`: the caller mixes the
  /// tokens that follow next (their rows may be prefetched). Returns false if an element of h is
  /// not finite: always when a source element is not finite (with finite weights; see the mixing
  /// in kernels/route.inc), and also when a sum of finite terms overflows.
  bool (*mix)(const float* src, idx stride, const float* alpha, idx n, idx d, idx ntok, float* h, MixStreams m,
              bool more);
};

const Kernels& kernels_generic();
#if defined(__x86_64__) || defined(_M_X64)
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
#endif
/// The variant the fast backend runs now (cpu_fast::isa(), cpu_fast::set_isa; dispatch.cpp).
const Kernels& active_kernels();
/// The depth mixing's streaming in use (cpu_fast::route_streams(), cpu_fast::set_route_streams; dispatch.cpp).
MixStreams active_streams();

}  // namespace oasis::fast
