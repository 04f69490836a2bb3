// Fast CPU backend (Backend::cpu_fast, include/oasis/backends/cpu_fast.hpp).
//
// Token attention: the fused, tiled, online-normalised kernel of fast_kernels_impl.inc, run by
// OpenMP over (batch, query head, block of kQueryTile queries), most expensive causal blocks first.
// Keys are packed once per call into [tile][d_h][key tile] panels (the B operand of the score tile
// product), values into rows padded to a whole number of vectors when d_v needs it; q, v and out
// are otherwise used in place in either layout (strides); the bias is read per tile in double and
// rounded to float as the reference does; GQA maps query head h to kv head h / (H / H_kv)
// exactly as the reference.
// Attention backward: FlashAttention-2's algorithm with the null category (fast_kernels_impl.inc,
// attention_backward_block) on the forward's output and row state (M, S), run by OpenMP over
// (batch, kv head, chunk of key tiles); the operands are packed once per call (zero-padded rows of
// whole vectors, the score gemm's key and value panels); D, 1/S and the null-logit gradient of each
// row, the dq sums and the bias reduction are done here, in the reference's order.
// Depth routing: the weights of every token come from the reference's scalar functions
// (depth_weights: centring, coupling, clamps, normaliser); only the mixing h = sum_i alpha_i s_i,
// the bandwidth-bound part, is vectorised, in the reference's order and arithmetic.
// Workspaces are thread_local and grow only (first-touch page faults are paid once).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "fast_kernels.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/core/instances.hpp"

namespace oasis {
namespace {

using fast::Kernels;
using fast::kKeyTile;
using fast::kQueryTile;

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
const Kernels& active() { return *active_slot().load(std::memory_order_acquire); }

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

constexpr index_t kRouteTile = 16;  // depth routing: tokens per tile (16 floats: one cache line)
constexpr index_t kMixTokens = 4;  // depth mixing: up to 4 tokens per block when 4 d <= 4096

// Workspaces (grow only): the calling thread's packed keys/values and visible key ranges, and
// each OpenMP thread's tile buffers, row states and depth weights.
using fast::Workspace;  // float workspaces on cache lines (fast_kernels.hpp)

thread_local Workspace tl_kt, tl_v, tl_tile, tl_alpha;
// the backward's packed operands, per-row arrays and dq buffers (calling thread), and each OpenMP
// thread's tile workspace
thread_local Workspace tl_qp, tl_dop, tl_kp, tl_ktb, tl_vt, tl_rows, tl_dq, tl_dz, tl_bwd;
thread_local std::vector<index_t> tl_chunks;
thread_local std::vector<index_t> tl_span;
thread_local std::vector<online::State> tl_state;

float* grow(Workspace& b, std::size_t n) {
  if (b.size() < n) {
    b.clear();
    b.shrink_to_fit();
    b.resize(n);
  }
  return b.data();
}

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

void ensure_shape(Tensor<float>& t, const Shape& s) {
  if (t.shape() == s) return;
  std::vector<float> st = std::move(t.storage());
  st.resize(static_cast<std::size_t>(shape_numel(s)));
  t = Tensor<float>(s, std::move(st));
}

// Element strides of a [B, H, T, d] or [B, T, H, d] tensor in (batch, head, time) order.
struct Strides {
  index_t b, h, t;
};
Strides strides_of(const Tensor<float>& x, AttentionLayout l) {
  const index_t d = x.dim(3);
  if (l == AttentionLayout::bhtd) return {x.dim(1) * x.dim(2) * d, x.dim(2) * d, d};
  return {x.dim(1) * x.dim(2) * d, d, x.dim(2) * d};
}

// The errors the reference's normalize_row raises on a row (argument "scores"), reported after the
// parallel region (no exception may leave it) for the first failing row in the reference's loop
// order (b, h, t): a visible score NaN or +inf (the kernel marked the row with LSE = NaN), or,
// for plain softmax with MaskedRow::error, a row without a finite visible score (LSE = -inf: no
// visible key, or every visible score -inf, which the reference treats as masked).
void check_rows(const AttentionShape& s, const AttentionOptions& opt, const AttentionResult<float>& r) {
  const bool empty_is_error = opt.normalizer == RowNorm::softmax && opt.masked_row == MaskedRow::error;
  const float* lse = r.lse.data();
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        const float l = lse[(b * s.H + h) * s.Tq + t];
        OASIS_REQUIRE(!std::isnan(l), "scores", "a score q.k * scale", opt.bias.empty() ? "" : " + bias",
                      " overflowed to NaN or +inf (batch ", b,
                      ", head ", h, ", query ", t, "; the inputs are too large for float32 scores; "
                      "NaN and +inf are not allowed, mask with -inf)");
        if (empty_is_error)
          OASIS_REQUIRE(!(std::isinf(l) && l < 0), "scores", "plain ", to_string(opt.normalizer),
                        " on a fully masked row (no visible key) and MaskedRow::error was requested");
      }
}

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

// Arguments validated except for the finiteness of q, k and v (check_attention_shapes): that is
// checked where the values are read anyway (the key packing, the value copy or a pass over v in
// place, each task's query rows before its first product), and a non-finite value is then
// reported by the reference's checks in their order (q, k, v), with their messages, before any
// error of the scores. q, k, v and out are read and written in their layout through strides; the
// keys are packed (into the score gemm's B panels, as in either layout), and the values unless
// their rows are whole vectors on cache lines. `state`, when given, receives each row's final
// (M, S) (the backward's input).
void attention_impl(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                    const AttentionOptions& opt, AttentionResult<float>& r,
                    cpu_fast::AttentionRowState* state = nullptr) {
  if (opt.normalizer != RowNorm::softmax && opt.normalizer != RowNorm::softmax1) {
    // The fused kernel is an online softmax; the other normalisers of the library (the paper's
    // baselines: clipped softmax, sparse maps) need the whole row, so they run the reference.
    r = token_attention(q, k, v, opt);
    return;
  }
  AttentionShape s{};
  index_t kb, vb, vh, vt, kd;
  detail::bhtd_dims(q, opt.layout, s.B, s.H, s.Tq, s.d_h);
  detail::bhtd_dims(k, opt.layout, kb, s.H_kv, s.Tk, kd);
  detail::bhtd_dims(v, opt.layout, vb, vh, vt, s.d_v);
  const Strides qs = strides_of(q, opt.layout), ks = strides_of(k, opt.layout), vs = strides_of(v, opt.layout);
  const bool has_null = opt.normalizer == RowNorm::softmax1;

  const Kernels& K = active();
  const index_t W = K.lanes;
  const index_t group = s.H / s.H_kv;
  const index_t KT = fast::forward_key_tile(s.d_h, s.d_v);
  const index_t nt = (s.Tk + KT - 1) / KT;
  const index_t ldv = (s.d_v + W - 1) / W * W;
  // values are used in place only when every row is whole vectors starting on a cache line
  const auto on_line = [](index_t floats) { return floats % 16 == 0; };
  const bool pack_v = ldv != s.d_v || reinterpret_cast<std::uintptr_t>(v.data()) % 64 != 0 || !on_line(vs.b) ||
                      !on_line(vs.h) || !on_line(vs.t);
  const index_t BHkv = s.B * s.H_kv;
  const float scale = opt.scale ? static_cast<float>(*opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));

  const Shape out_shape = opt.layout == AttentionLayout::bhtd ? Shape{s.B, s.H, s.Tq, s.d_v}
                                                              : Shape{s.B, s.Tq, s.H, s.d_v};
  ensure_shape(r.out, out_shape);
  ensure_shape(r.lse, {s.B, s.H, s.Tq});
  ensure_shape(r.p_null, {s.B, s.H, s.Tq});
  if (opt.return_probs) ensure_shape(r.probs, {s.B, s.H, s.Tq, s.Tk});
  else r.probs = Tensor<float>();
  if (state) {
    ensure_shape(state->max, {s.B, s.H, s.Tq});
    ensure_shape(state->sum, {s.B, s.H, s.Tq});
  }
  const Strides os = strides_of(r.out, opt.layout);

  const Tensor<double>& bias = opt.bias;
  const index_t nqb = (s.Tq + kQueryTile - 1) / kQueryTile;
  // Phases. With at least two query blocks per thread in each kv head's group, one kv head at a
  // time: its keys and values packed, then its query blocks. The packed operands then take one kv
  // head's room (slot = kv head - kv0), which the next phase's packing writes over while it is
  // still in the caches, instead of every head's, written out to memory: at T = 1024, 8 heads,
  // d_h = 64, one thread, the packing's share of a call fell from about 7 % to 5 %
  // (docs/benchmarks.md, "What is left at T = 1024"). Otherwise one phase of every kv head.
  const bool phased = BHkv > 1 && group * nqb >= 2 * static_cast<index_t>(omp_get_max_threads());
  const index_t phase_heads = phased ? 1 : BHkv;
  float* kt = grow(tl_kt, static_cast<std::size_t>(phase_heads * nt * s.d_h * KT));
  float* vp = pack_v ? grow(tl_v, static_cast<std::size_t>(phase_heads * s.Tk * ldv)) : nullptr;
  index_t* kbegin = key_ranges(s, opt);
  index_t* kend = kbegin + s.B * s.Tq;

  const float* kd_ = k.data();
  const float* vd = v.data();
  bool finite = true;
#pragma omp parallel reduction(&& : finite)
  {
    float* w = grow(tl_tile, static_cast<std::size_t>(kQueryTile * KT + kQueryTile * ldv));
    if (tl_state.size() < static_cast<std::size_t>(kQueryTile)) tl_state.resize(static_cast<std::size_t>(kQueryTile));
    for (index_t kv0 = 0; kv0 < BHkv; kv0 += phase_heads) {
      const index_t kv1 = std::min(BHkv, kv0 + phase_heads);
#pragma omp for collapse(2) schedule(static)
      for (index_t bh = kv0; bh < kv1; ++bh)
        for (index_t tile = 0; tile < nt; ++tile) {
          const index_t b = bh / s.H_kv, hk = bh % s.H_kv;
          const index_t slot = bh - kv0;
          finite = pack_panel(kd_, ks, b, hk, tile, KT, s.Tk, s.d_h, kt + (slot * nt + tile) * s.d_h * KT) && finite;
          const index_t j0 = tile * KT, nj = std::min(s.Tk - j0, KT);
          const float* src = vd + b * vs.b + hk * vs.h + j0 * vs.t;
          finite = (pack_v ? K.copy_rows(src, vs.t, nj, s.d_v, vp + (slot * s.Tk + j0) * ldv, ldv)
                           : K.finite_rows(src, vs.t, nj, s.d_v)) &&
                   finite;
        }
      const index_t ntask = (kv1 - kv0) * group * nqb;
#pragma omp for schedule(dynamic, 1)
      for (index_t task = 0; task < ntask; ++task) {
        const index_t bhk = kv0 + task / (group * nqb), rem = task % (group * nqb);
        const index_t qb = nqb - 1 - rem % nqb;  // causal: the longest rows first
        const index_t b = bhk / s.H_kv, hk = bhk % s.H_kv, h = hk * group + rem / nqb;
        const index_t t0 = qb * kQueryTile;
        fast::AttnBlock a{};
        a.rows = std::min(kQueryTile, s.Tq - t0);
        a.d_h = s.d_h;
        a.q = q.data() + b * qs.b + h * qs.h + t0 * qs.t;
        a.ldq = qs.t;
        finite = K.finite_rows(a.q, a.ldq, a.rows, s.d_h) && finite;
        a.kt = kt + (bhk - kv0) * nt * s.d_h * KT;
        a.v = pack_v ? vp + (bhk - kv0) * s.Tk * ldv : vd + b * vs.b + hk * vs.h;
        a.ldv_in = pack_v ? ldv : vs.t;
        a.ldv = ldv;
        a.d_v = s.d_v;
        a.kbegin = kbegin + b * s.Tq + t0;
        a.kend = kend + b * s.Tq + t0;
        if (!bias.empty()) {
          const index_t bb = bias.rank() == 2 || bias.dim(0) == 1 ? 0 : b;
          const index_t bhh = bias.rank() == 2 || bias.dim(1) == 1 ? 0 : h;
          a.bias = bias.data() + ((bb * (bias.rank() == 2 ? 1 : bias.dim(1)) + bhh) * s.Tq + t0) * s.Tk;
          a.ldb = s.Tk;
        }
        a.scale = scale;
        a.null_logit = opt.null_logits.empty() ? 0.0f : static_cast<float>(opt.null_logits[static_cast<std::size_t>(h)]);
        a.has_null = has_null;
        a.s_ws = w;
        a.o_ws = w + kQueryTile * KT;
        a.st_ws = tl_state.data();
        a.out = r.out.data() + b * os.b + h * os.h + t0 * os.t;
        a.ldo = os.t;
        const index_t row0 = (b * s.H + h) * s.Tq + t0;
        a.lse = r.lse.data() + row0;
        a.p_null = r.p_null.data() + row0;
        a.probs = opt.return_probs ? r.probs.data() + row0 * s.Tk : nullptr;
        a.ldp = s.Tk;
        a.row_max = state ? state->max.data() + row0 : nullptr;
        a.row_sum = state ? state->sum.data() + row0 : nullptr;
        K.attention_block(a);
      }
    }
  }
  if (!finite) {
    require_finite_inputs(q, k, v);
  }
  check_rows(s, opt, r);  // B H Tq values: nothing next to the attention itself
}

// The forward results the backward reads, checked against the call's shapes (the two-step API takes
// them from its caller).
void check_forward(const AttentionShape& s, const AttentionOptions& opt, const AttentionResult<float>& fwd,
                   const cpu_fast::AttentionRowState& st) {
  const Shape out = opt.layout == AttentionLayout::bthd ? Shape{s.B, s.Tq, s.H, s.d_v} : Shape{s.B, s.H, s.Tq, s.d_v};
  const Shape rows{s.B, s.H, s.Tq};
  OASIS_REQUIRE(fwd.out.shape() == out, "forward", "out has shape ", shape_str(fwd.out.shape()), ", not the output's ",
                shape_str(out), " (pass the forward of the same call)");
  OASIS_REQUIRE(fwd.p_null.shape() == rows, "forward", "p_null has shape ", shape_str(fwd.p_null.shape()),
                ", not [B, H, Tq] = ", shape_str(rows));
  OASIS_REQUIRE(st.max.shape() == rows && st.sum.shape() == rows, "state", "row state of shapes ",
                shape_str(st.max.shape()), " and ", shape_str(st.sum.shape()), ", not [B, H, Tq] = ", shape_str(rows),
                " (the state token_attention_into wrote with the forward)");
}

// Work of each key tile of batch element b (the number of query rows that see one of its keys,
// per query head) and the boundaries of nc contiguous chunks of about equal work: tiles
// [bound[c], bound[c + 1]) form chunk c.
void chunk_tiles(const index_t* kbegin, const index_t* kend, index_t Tq, index_t Tk, index_t nt, index_t nc,
                 index_t* bound) {
  std::vector<double> work(static_cast<std::size_t>(nt));
  double total = 0;
  for (index_t tile = 0; tile < nt; ++tile) {
    const index_t j0 = tile * kKeyTile, j1 = std::min(Tk, j0 + kKeyTile);
    const index_t lo = std::upper_bound(kend, kend + Tq, j0) - kend;
    const index_t hi = std::lower_bound(kbegin, kbegin + Tq, j1) - kbegin;
    work[static_cast<std::size_t>(tile)] = static_cast<double>(std::max<index_t>(hi - lo, 0)) + 1.0;
    total += work[static_cast<std::size_t>(tile)];
  }
  bound[0] = 0;
  double acc = 0;
  index_t c = 1;
  for (index_t tile = 0; tile < nt; ++tile) {
    acc += work[static_cast<std::size_t>(tile)];
    while (c < nc && acc >= total * static_cast<double>(c) / static_cast<double>(nc)) bound[c++] = tile + 1;
  }
  for (; c <= nc; ++c) bound[c] = nt;
}

// The backward's dimensions: the shape, the strides of q, k, v, and the packed operands' row
// lengths (d_h and d_v in whole vectors of the active kernels).
struct BwdLayout {
  AttentionShape s;
  Strides qs, ks, vs;
  index_t group, nt, ldh, ldv, BHkv, nrows;
};
BwdLayout bwd_layout(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                     const AttentionOptions& opt) {
  BwdLayout L{};
  AttentionShape& s = L.s;
  index_t kb, vb, vh, vt, kd;
  detail::bhtd_dims(q, opt.layout, s.B, s.H, s.Tq, s.d_h);
  detail::bhtd_dims(k, opt.layout, kb, s.H_kv, s.Tk, kd);
  detail::bhtd_dims(v, opt.layout, vb, vh, vt, s.d_v);
  L.qs = strides_of(q, opt.layout);
  L.ks = strides_of(k, opt.layout);
  L.vs = strides_of(v, opt.layout);
  const index_t W = active().lanes;
  L.group = s.H / s.H_kv;
  L.nt = (s.Tk + kKeyTile - 1) / kKeyTile;
  L.ldh = (s.d_h + W - 1) / W * W;
  L.ldv = (s.d_v + W - 1) / W * W;
  L.BHkv = s.B * s.H_kv;
  L.nrows = s.B * s.H * s.Tq;
  return L;
}

// The backward's packed inputs, in the calling thread's workspaces: q rows padded to ldh (qp),
// keys as rows (kp) and as the score gemm's panels (kt), values as panels (vt). Returns whether
// every value of q, k and v was finite: each is read once, here, before the cotangents and the
// forward are checked, so that a non-finite input is reported first, as by the reference
// (check_attention_args). Shapes validated (check_attention_shapes).
bool pack_backward_inputs(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt) {
  const BwdLayout L = bwd_layout(q, k, v, opt);
  const AttentionShape& s = L.s;
  const Kernels& K = active();
  float* qp = grow(tl_qp, static_cast<std::size_t>(L.nrows * L.ldh));
  float* kp = grow(tl_kp, static_cast<std::size_t>(L.BHkv * L.nt * kKeyTile * L.ldh));
  float* kt = grow(tl_ktb, static_cast<std::size_t>(L.BHkv * L.nt * s.d_h * kKeyTile));
  float* vt = grow(tl_vt, static_cast<std::size_t>(L.BHkv * L.nt * s.d_v * kKeyTile));
  const index_t nqblk = (s.Tq + kKeyTile - 1) / kKeyTile;  // blocks of kKeyTile query rows
  bool finite = true;
#pragma omp parallel for collapse(2) schedule(static) reduction(&& : finite)
  for (index_t bh = 0; bh < s.B * s.H; ++bh)
    for (index_t blk = 0; blk < nqblk; ++blk) {
      const index_t b = bh / s.H, h = bh % s.H, t0 = blk * kKeyTile;
      finite = K.copy_rows(q.data() + b * L.qs.b + h * L.qs.h + t0 * L.qs.t, L.qs.t, std::min(kKeyTile, s.Tq - t0),
                           s.d_h, qp + (bh * s.Tq + t0) * L.ldh, L.ldh) &&
               finite;
    }
#pragma omp parallel for collapse(2) schedule(static) reduction(&& : finite)
  for (index_t bh = 0; bh < L.BHkv; ++bh)
    for (index_t tile = 0; tile < L.nt; ++tile) {
      const index_t b = bh / s.H_kv, hk = bh % s.H_kv, j0 = tile * kKeyTile;
      finite = pack_panel(k.data(), L.ks, b, hk, tile, kKeyTile, s.Tk, s.d_h, kt + (bh * L.nt + tile) * s.d_h * kKeyTile) &&
               finite;
      finite = pack_panel(v.data(), L.vs, b, hk, tile, kKeyTile, s.Tk, s.d_v, vt + (bh * L.nt + tile) * s.d_v * kKeyTile) &&
               finite;
      const index_t nj = std::min(kKeyTile, s.Tk - j0);  // the tile's keys, then zero rows to its end
      float* dst = kp + (bh * L.nt * kKeyTile + j0) * L.ldh;
      K.copy_rows(k.data() + b * L.ks.b + hk * L.ks.h + j0 * L.ks.t, L.ks.t, nj, s.d_h, dst, L.ldh);
      std::fill(dst + nj * L.ldh, dst + kKeyTile * L.ldh, 0.0f);
    }
  return finite;
}

// check_attention_args for the backward: the shapes, then pack_backward_inputs, whose reading of
// q, k and v is the finiteness check (a non-finite value is then reported by the reference's
// check, with its message). Returns the shape.
AttentionShape check_and_pack_backward_inputs(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                              const AttentionOptions& opt) {
  const AttentionShape s = check_attention_shapes(q, k, v, opt);
  if (!pack_backward_inputs(q, k, v, opt)) require_finite_inputs(q, k, v);
  return s;
}

// Arguments validated (check_attention_shapes, pack_backward_inputs returned true on the same q, k
// and v, check_attention_cotangents, check_forward); softmax or softmax1.
void backward_impl(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                   const AttentionResult<float>& fwd, const cpu_fast::AttentionRowState& st,
                   const AttentionCotangents<float>& d, const AttentionOptions& opt, AttentionGrads<float>& g) {
  const BwdLayout L = bwd_layout(q, k, v, opt);
  const AttentionShape& s = L.s;
  const Strides os = strides_of(fwd.out, opt.layout);
  const bool has_null = opt.normalizer == RowNorm::softmax1;
  const Kernels& K = active();
  const index_t group = L.group, nt = L.nt, ldh = L.ldh, ldv = L.ldv, BHkv = L.BHkv, nrows = L.nrows;
  const float scale = opt.scale ? static_cast<float>(*opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));

  ensure_shape(g.q, q.shape());
  ensure_shape(g.k, k.shape());
  ensure_shape(g.v, v.shape());
  if (has_null) ensure_shape(g.null_logits, {s.H});
  else g.null_logits = Tensor<float>();
  if (!opt.bias.empty()) ensure_shape(g.bias, opt.bias.shape());
  else g.bias = Tensor<float>();
  if (opt.return_probs) ensure_shape(g.scores, {s.B, s.H, s.Tq, s.Tk});
  else g.scores = Tensor<float>();
  const Strides gqs = strides_of(g.q, opt.layout), gks = strides_of(g.k, opt.layout), gvs = strides_of(g.v, opt.layout);

  // packed operands: q, keys and values by pack_backward_inputs (the same sizes: the same
  // buffers); dO rows padded to ldv, and per row, from the copy while it is cached: 1/S,
  // D = <dO, O> + p_null dP, dLSE, and ds = p_null ((dP - D) + dLSE) (the reference's
  // normalize_row_backward arithmetic, with D from the output as FlashAttention-2 forms it)
  const float* qp = grow(tl_qp, static_cast<std::size_t>(nrows * ldh));
  const float* kp = grow(tl_kp, static_cast<std::size_t>(BHkv * nt * kKeyTile * ldh));
  const float* kt = grow(tl_ktb, static_cast<std::size_t>(BHkv * nt * s.d_h * kKeyTile));
  const float* vt = grow(tl_vt, static_cast<std::size_t>(BHkv * nt * s.d_v * kKeyTile));
  float* dop = grow(tl_dop, static_cast<std::size_t>(nrows * ldv));
  float* rowbuf = grow(tl_rows, static_cast<std::size_t>(4 * nrows));
  float *row_inv = rowbuf, *row_D = rowbuf + nrows, *row_dlse = rowbuf + 2 * nrows, *row_ds = rowbuf + 3 * nrows;
  const index_t nqblk = (s.Tq + kKeyTile - 1) / kKeyTile;
#pragma omp parallel for collapse(2) schedule(static)
  for (index_t bh = 0; bh < s.B * s.H; ++bh)
    for (index_t blk = 0; blk < nqblk; ++blk) {
      const index_t b = bh / s.H, h = bh % s.H, t0 = blk * kKeyTile, t1 = std::min(s.Tq, t0 + kKeyTile);
      K.copy_rows(d.out.data() + b * os.b + h * os.h + t0 * os.t, os.t, t1 - t0, s.d_v,
                  dop + (bh * s.Tq + t0) * ldv, ldv);
      const float sl = opt.null_logits.empty() ? 0.0f : static_cast<float>(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = t0; t < t1; ++t) {
        const index_t r = bh * s.Tq + t;
        row_inv[r] = online::finish(online::State{st.max[r], st.sum[r]}, has_null, sl).inv;
        const float pn = has_null ? fwd.p_null[r] : 0.0f;
        const float dP = d.p_null.empty() ? 0.0f : d.p_null[r];
        const float dl = d.lse.empty() ? 0.0f : d.lse[r];
        const float* o = fwd.out.data() + b * os.b + h * os.h + t * os.t;
        const float* dot_ = dop + r * ldv;
        float D = has_null ? pn * dP : 0.0f;
        for (index_t c = 0; c < s.d_v; ++c) D += dot_[c] * o[c];
        row_D[r] = D;
        row_dlse[r] = dl;
        row_ds[r] = has_null ? pn * ((dP - D) + dl) : 0.0f;
      }
    }

  // visible key ranges per (batch, query); chunks of key tiles per (batch, kv head): one when
  // there are at least as many kv heads as threads, else enough for about two tasks per thread
  index_t* kbegin = key_ranges(s, opt);
  index_t* kend = kbegin + s.B * s.Tq;
  const index_t threads = omp_get_max_threads();
  const index_t nc = BHkv >= threads ? 1 : std::min(nt, (2 * threads + BHkv - 1) / BHkv);
  if (tl_chunks.size() < static_cast<std::size_t>(s.B * (nc + 1))) tl_chunks.resize(static_cast<std::size_t>(s.B * (nc + 1)));
  const index_t* chunks = tl_chunks.data();  // (thread_local: the calling thread's, read by the workers)
  for (index_t b = 0; b < s.B; ++b)
    chunk_tiles(kbegin + b * s.Tq, kend + b * s.Tq, s.Tq, s.Tk, nt, nc, tl_chunks.data() + b * (nc + 1));

  // dq: one buffer per chunk, summed below in chunk order
  float* dq = grow(tl_dq, static_cast<std::size_t>(nc * nrows * ldh));
#pragma omp parallel for schedule(static)
  for (index_t i = 0; i < nc * nrows; ++i)
    for (index_t c = 0; c < ldh; ++c) dq[i * ldh + c] = 0.0f;

  // dL/dz of every (row, visible key) when the scores' or the bias's gradient is wanted: into
  // g.scores, into g.bias when the bias has the full [B, H, Tq, Tk] shape, else a buffer reduced below
  const bool full_bias = !opt.bias.empty() && opt.bias.shape() == Shape{s.B, s.H, s.Tq, s.Tk};
  float* dz = nullptr;
  if (opt.return_probs) dz = g.scores.data();
  else if (full_bias) dz = g.bias.data();
  else if (!opt.bias.empty()) dz = grow(tl_dz, static_cast<std::size_t>(nrows * s.Tk));
  if (dz) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < nrows; ++r)
      for (index_t j = 0; j < s.Tk; ++j) dz[r * s.Tk + j] = 0.0f;
  }

  const Tensor<double>& bias = opt.bias;
  const index_t tasks = BHkv * nc;
#pragma omp parallel
  {
    float* ws = grow(tl_bwd, static_cast<std::size_t>(2 * kQueryTile * kKeyTile + kKeyTile * (ldh + ldv)));
#pragma omp for schedule(dynamic, 1)
    for (index_t task = 0; task < tasks; ++task) {
      const index_t bhk = task / nc, c = task % nc;
      const index_t b = bhk / s.H_kv, hk = bhk % s.H_kv;
      const index_t r0 = (b * s.H + hk * group) * s.Tq;  // first row of the group's first query head
      fast::BwdBlock a{};
      a.Tq = s.Tq;
      a.Tk = s.Tk;
      a.d_h = s.d_h;
      a.d_v = s.d_v;
      a.ldh = ldh;
      a.ldv = ldv;
      a.group = group;
      a.qp = qp + r0 * ldh;
      a.dop = dop + r0 * ldv;
      a.kp = kp + bhk * nt * kKeyTile * ldh;
      a.kt = kt + bhk * nt * s.d_h * kKeyTile;
      a.vt = vt + bhk * nt * s.d_v * kKeyTile;
      a.kbegin = kbegin + b * s.Tq;
      a.kend = kend + b * s.Tq;
      if (!bias.empty()) {
        const bool r2 = bias.rank() == 2;
        const index_t bb = r2 || bias.dim(0) == 1 ? 0 : b;
        const bool per_head = !r2 && bias.dim(1) != 1;
        a.bias = bias.data() + ((bb * (r2 ? 1 : bias.dim(1)) + (per_head ? hk * group : 0)) * s.Tq) * s.Tk;
        a.bias_sg = per_head ? s.Tq * s.Tk : 0;
      }
      a.row_max = st.max.data() + r0;
      a.row_inv = row_inv + r0;
      a.row_D = row_D + r0;
      a.row_dlse = row_dlse + r0;
      a.scale = scale;
      const index_t* bound = chunks + b * (nc + 1);
      a.tile0 = bound[c];
      a.tile1 = bound[c + 1];
      a.dq = dq + (c * nrows + r0) * ldh;
      a.dk = g.k.data() + b * gks.b + hk * gks.h;
      a.lddk = gks.t;
      a.dv = g.v.data() + b * gvs.b + hk * gvs.h;
      a.lddv = gvs.t;
      a.dz = dz ? dz + r0 * s.Tk : nullptr;
      a.ws = ws;
      K.attention_backward_block(a);
    }
  }

  // dq = scale * (sum of the chunks' sums), in the layout of q
#pragma omp parallel for collapse(2) schedule(static)
  for (index_t bh = 0; bh < s.B * s.H; ++bh)
    for (index_t t = 0; t < s.Tq; ++t) {
      const index_t b = bh / s.H, h = bh % s.H, r = bh * s.Tq + t;
      float* out = g.q.data() + b * gqs.b + h * gqs.h + t * gqs.t;
      for (index_t c = 0; c < s.d_h; ++c) {
        float x = dq[r * ldh + c];
        for (index_t ch = 1; ch < nc; ++ch) x += dq[(ch * nrows + r) * ldh + c];
        out[c] = scale * x;
      }
    }
  // the null logit of head h: sum over (b, t) of ds, in the reference's order
  if (has_null)
    for (index_t h = 0; h < s.H; ++h) {
      float x = 0.0f;
      for (index_t b = 0; b < s.B; ++b)
        for (index_t t = 0; t < s.Tq; ++t) x += row_ds[(b * s.H + h) * s.Tq + t];
      g.null_logits[h] = x;
    }
  // a broadcast bias: dz summed over the broadcast batch and head axes, in the reference's (b, h) order
  if (!opt.bias.empty() && dz != g.bias.data()) {
    const bool r2 = bias.rank() == 2;
    const index_t nb = r2 ? 1 : bias.dim(0), nh = r2 ? 1 : bias.dim(1);
    float* gb = g.bias.data();
#pragma omp parallel for schedule(static)
    for (index_t t = 0; t < s.Tq; ++t) {
      for (index_t bb = 0; bb < nb; ++bb)
        for (index_t hh = 0; hh < nh; ++hh)
          for (index_t j = 0; j < s.Tk; ++j) gb[((bb * nh + hh) * s.Tq + t) * s.Tk + j] = 0.0f;
      for (index_t b = 0; b < s.B; ++b)
        for (index_t h = 0; h < s.H; ++h) {
          float* row = gb + (((nb == 1 ? 0 : b) * nh + (nh == 1 ? 0 : h)) * s.Tq + t) * s.Tk;
          const float* src = dz + ((b * s.H + h) * s.Tq + t) * s.Tk;
          for (index_t j = 0; j < s.Tk; ++j) row[j] += src[j];
        }
    }
  }
}

// The one-call backward on validated arguments (q, k and v packed by
// check_and_pack_backward_inputs): the forward with its row state, then the backward.
AttentionGrads<float> forward_and_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                           const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  AttentionResult<float> fwd;
  cpu_fast::AttentionRowState state;
  AttentionOptions fo = opt;
  fo.return_probs = false;  // the backward recomputes the probabilities
  attention_impl(q, k, v, fo, fwd, &state);
  AttentionGrads<float> g;
  backward_impl(q, k, v, fwd, state, d, opt, g);
  return g;
}

void route_impl(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r) {
  // the reference's shape checks (oasis/ops/depth.hpp); the sources are checked for finiteness only
  // where the mixing's output is not finite (Kernels::mix), with the reference's message.
  // plain variables, not a structured binding: OpenMP regions may not capture bindings (clang)
  const RouteShape shape = check_route_shapes(sources, g_old, psi, kinds);
  const index_t n = shape.n, N = shape.N, d = shape.d;
  ensure_shape(r.h, {N, d});
  ensure_shape(r.alpha, {n, N});
  ensure_shape(r.alpha_null, {N});
  ensure_shape(r.g, {n, N});
  ensure_shape(r.dpsi, {n, N});

  // Per tile of kRouteTile consecutive tokens: the weights, by the reference's scalar functions
  // per token, then the mixing of the tile's tokens, ntok at a time, by the vectorised kernel. The
  // [n, N] inputs and outputs are read and written a tile at a time (one cache line per source
  // row), not token by token (a column of [n, N] touches n lines N floats apart, which share one
  // set of the L1 cache). An error is reported for the first failing token, as the reference's
  // sequential loop would (non-finite sources take precedence, as the reference checks them
  // first); a tile with a failing token is not mixed. One parallel region per call.
  std::exception_ptr err;
  index_t err_t = N;
  bool ok = true;
  const fast::Kernels& K = active();
  const fast::MixStreams streams = streams_slot().load(std::memory_order_acquire)->streams;
  // blocks of ntok consecutive tokens (adjacent rows in every source: longer contiguous reads)
  const index_t ntok = std::max<index_t>(1, std::min<index_t>(kMixTokens, 4096 / d));
  const index_t ntile = (N + kRouteTile - 1) / kRouteTile;
#pragma omp parallel reduction(&& : ok)
  {
    Vec<float> g(n), ps(n);
    // token-major tiles [kRouteTile][n]: g_old, psi, then alpha (the kernel's layout), g, dpsi
    float* buf = grow(tl_alpha, static_cast<std::size_t>(5 * kRouteTile * n));
    float* tg = buf;
    float* tps = buf + kRouteTile * n;
    float* tal = buf + 2 * kRouteTile * n;
    float* tgn = buf + 3 * kRouteTile * n;
    float* tdp = buf + 4 * kRouteTile * n;
#pragma omp for schedule(static)
    for (index_t tile = 0; tile < ntile; ++tile) {
      const index_t t0 = tile * kRouteTile, cnt = std::min(kRouteTile, N - t0);
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < cnt; ++j) {
          tg[j * n + i] = g_old(i, t0 + j);
          tps[j * n + i] = psi(i, t0 + j);
        }
      bool tile_ok = true;
      for (index_t j = 0; j < cnt; ++j) {
        try {
          for (index_t i = 0; i < n; ++i) { g[i] = tg[j * n + i]; ps[i] = tps[j * n + i]; }
          const DepthWeights<float> w = depth_weights(g, ps, kinds, opt);
          r.alpha_null[t0 + j] = w.alpha_null;
          for (index_t i = 0; i < n; ++i) {
            tal[j * n + i] = w.alpha[i];
            tgn[j * n + i] = w.g[i];
            tdp[j * n + i] = w.dpsi[i];
          }
        } catch (...) {
          tile_ok = false;
#pragma omp critical(oasis_cpu_fast_route_error)
          if (t0 + j < err_t) { err_t = t0 + j; err = std::current_exception(); }
        }
      }
      if (!tile_ok) continue;  // the error is rethrown below
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < cnt; ++j) {
          r.alpha(i, t0 + j) = tal[j * n + i];
          r.g(i, t0 + j) = tgn[j * n + i];
          r.dpsi(i, t0 + j) = tdp[j * n + i];
        }
      for (index_t j = 0; j < cnt; j += ntok) {
        const index_t m = std::min(ntok, cnt - j);
        ok = K.mix(sources.data() + (t0 + j) * d, N * d, tal + j * n, n, d, m, r.h.data() + (t0 + j) * d, streams,
                   t0 + j + m < N) && ok;
      }
    }
  }
  if (err) {
    require_finite(sources, "sources");
    std::rethrow_exception(err);
  }
  // a non-finite output: a non-finite source (the reference's error), or else a finite sum that
  // overflowed, which the reference returns as it is (Kernels::mix)
  if (!ok) require_finite(sources, "sources");
}

}  // namespace

namespace fast {
const Kernels& active_kernels() { return active(); }
}  // namespace fast

namespace cpu_fast {

std::string_view isa() { return active().isa; }

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

void release_workspaces() {
  auto drop = [](auto& v) { std::decay_t<decltype(v)>().swap(v); };
  drop(tl_kt);
  drop(tl_v);
  drop(tl_span);
  drop(tl_qp);
  drop(tl_dop);
  drop(tl_kp);
  drop(tl_ktb);
  drop(tl_vt);
  drop(tl_rows);
  drop(tl_dq);
  drop(tl_dz);
  drop(tl_chunks);
#pragma omp parallel
  {
    drop(tl_tile);
    drop(tl_state);
    drop(tl_alpha);
    drop(tl_bwd);
  }
}

void vector_exp(const float* x, float* y, index_t n) {
  OASIS_REQUIRE(n >= 0, "n", "negative length ", n);
  OASIS_REQUIRE(n == 0 || (x && y), "x", "null pointer");
  active().exp(x, y, n);
}

void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r) {
  check_attention_shapes(q, k, v, opt);  // finiteness: attention_impl
  attention_impl(q, k, v, opt, r);
}

AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt) {
  AttentionResult<float> r;
  token_attention_into(q, k, v, opt, r);
  return r;
}

void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r, AttentionRowState& state) {
  check_attention_shapes(q, k, v, opt);  // finiteness: attention_impl, or the reference's check below
  if (opt.normalizer != RowNorm::softmax && opt.normalizer != RowNorm::softmax1)
    check_attention_args(q, k, v, opt);  // a non-finite input is reported before the normaliser
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "the row state is the online softmax's (softmax and softmax1), got ", to_string(opt.normalizer));
  attention_impl(q, k, v, opt, r, &state);
}

void token_attention_backward_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                   const AttentionResult<float>& forward, const AttentionRowState& state,
                                   const AttentionCotangents<float>& d, const AttentionOptions& opt,
                                   AttentionGrads<float>& g) {
  const AttentionShape s = check_and_pack_backward_inputs(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  check_forward(s, opt, forward, state);
  backward_impl(q, k, v, forward, state, d, opt, g);
}

AttentionGrads<float> token_attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                               const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  const AttentionShape s = check_and_pack_backward_inputs(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  return forward_and_backward(q, k, v, d, opt);
}

void attn_res_route_into(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                         const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r) {
  route_impl(sources, g_old, psi, kinds, opt, r);
}

DepthRoute<float> attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const DepthOptions& opt) {
  DepthRoute<float> r;
  route_impl(sources, g_old, psi, kinds, opt, r);
  return r;
}

}  // namespace cpu_fast

namespace detail {

bool cpu_fast_available(std::string* why) {
  if (why) why->clear();
  return true;
}

AttentionResult<float> cpu_fast_token_attention(const Tensor<float>& q, const Tensor<float>& k,
                                                const Tensor<float>& v, const AttentionOptions& opt) {
  AttentionResult<float> r;
  attention_impl(q, k, v, opt, r);  // shapes and options validated by the dispatcher
  return r;
}

AttentionGrads<float> cpu_fast_token_attention_backward(const Tensor<float>& q, const Tensor<float>& k,
                                                        const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                        const AttentionOptions& opt) {
  return cpu_fast::token_attention_backward(q, k, v, d, opt);  // validates as the reference (in parallel)
}

DepthRoute<float> cpu_fast_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                          const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                          const DepthOptions& opt) {
  return cpu_fast::attn_res_route(sources, g_old, psi, kinds, opt);
}

}  // namespace detail
}  // namespace oasis
