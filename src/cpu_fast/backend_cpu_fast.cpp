// Fast CPU backend (Backend::cpu_fast, include/oasis/cpu_fast.hpp).
//
// Token attention: the fused, tiled, online-normalised kernel of fast_kernels_impl.inc, run by
// OpenMP over (batch, query head, block of kQueryTile queries), most expensive causal blocks first.
// Keys are packed once per call into [tile][d_h][kKeyTile] panels (the B operand of the score tile
// product), values into rows padded to a whole number of vectors when d_v needs it; q, v and out
// are otherwise used in place in either layout (strides); the bias is read per tile in double and
// rounded to float as the reference does; GQA maps query head h to kv head h / (H / H_kv)
// exactly as the reference.
// Depth routing: the weights of every token come from the reference's scalar functions
// (depth_weights: centring, coupling, clamps, normaliser); only the mixing h = sum_i alpha_i s_i,
// the bandwidth-bound part, is vectorised, in the reference's order and arithmetic.
// Workspaces are thread_local and grow only (first-touch page faults are paid once).
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <type_traits>

#include "fast_kernels.hpp"
#include "oasis/backend.hpp"
#include "oasis/cpu_fast.hpp"
#include "oasis/instances.hpp"

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

constexpr index_t kMixTokens = 4;  // depth mixing: up to 4 tokens per block when 4 d <= 4096

// Workspaces (grow only): the calling thread's packed keys/values and visible key ranges, and
// each OpenMP thread's tile buffers, row states and depth weights.
thread_local std::vector<float> tl_kt, tl_v, tl_tile, tl_alpha;
thread_local std::vector<index_t> tl_span;
thread_local std::vector<online::State> tl_state;

float* grow(std::vector<float>& b, std::size_t n) {
  if (b.size() < n) {
    b.clear();
    b.shrink_to_fit();
    b.resize(n);
  }
  return b.data();
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

// Arguments already validated (check_attention_args). q, k, v and out are read and written in
// their layout through strides; only the keys are packed (into the score gemm's B panels, as in
// either layout) and the values when d_v is not a whole number of vectors.
void attention_impl(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                    const AttentionOptions& opt, AttentionResult<float>& r) {
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
  const index_t nt = (s.Tk + kKeyTile - 1) / kKeyTile;
  const index_t ldv = (s.d_v + W - 1) / W * W;
  const bool pack_v = ldv != s.d_v;
  const index_t BHkv = s.B * s.H_kv;
  const float scale = opt.scale ? static_cast<float>(*opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));

  const Shape out_shape = opt.layout == AttentionLayout::bhtd ? Shape{s.B, s.H, s.Tq, s.d_v}
                                                              : Shape{s.B, s.Tq, s.H, s.d_v};
  ensure_shape(r.out, out_shape);
  ensure_shape(r.lse, {s.B, s.H, s.Tq});
  ensure_shape(r.p_null, {s.B, s.H, s.Tq});
  if (opt.return_probs) ensure_shape(r.probs, {s.B, s.H, s.Tq, s.Tk});
  else r.probs = Tensor<float>();
  const Strides os = strides_of(r.out, opt.layout);

  float* kt = grow(tl_kt, static_cast<std::size_t>(BHkv * nt * s.d_h * kKeyTile));
  float* vp = pack_v ? grow(tl_v, static_cast<std::size_t>(BHkv * s.Tk * ldv)) : nullptr;
  if (tl_span.size() < static_cast<std::size_t>(2 * s.B * s.Tq)) tl_span.resize(static_cast<std::size_t>(2 * s.B * s.Tq));
  index_t* kbegin = tl_span.data();
  index_t* kend = kbegin + s.B * s.Tq;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t t = 0; t < s.Tq; ++t) {
      const KeyRange kr = visible_range(s, opt, b, t);
      kbegin[b * s.Tq + t] = kr.begin;
      kend[b * s.Tq + t] = kr.end;
    }

  const float* kd_ = k.data();
  const float* vd = v.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (index_t bh = 0; bh < BHkv; ++bh)
    for (index_t tile = 0; tile < nt; ++tile) {
      const index_t b = bh / s.H_kv, hk = bh % s.H_kv;
      float* dst = kt + (bh * nt + tile) * s.d_h * kKeyTile;
      for (index_t jj = 0; jj < kKeyTile; ++jj) {
        const index_t j = tile * kKeyTile + jj;
        const float* src = kd_ + b * ks.b + hk * ks.h + j * ks.t;
        for (index_t c = 0; c < s.d_h; ++c) dst[c * kKeyTile + jj] = j < s.Tk ? src[c] : 0.0f;
      }
      if (pack_v)
        for (index_t j = tile * kKeyTile; j < std::min(s.Tk, (tile + 1) * kKeyTile); ++j) {
          const float* src = vd + b * vs.b + hk * vs.h + j * vs.t;
          float* row = vp + (bh * s.Tk + j) * ldv;
          for (index_t c = 0; c < ldv; ++c) row[c] = c < s.d_v ? src[c] : 0.0f;
        }
    }

  const Tensor<double>& bias = opt.bias;
  const index_t nqb = (s.Tq + kQueryTile - 1) / kQueryTile;
  const index_t tasks = s.B * s.H * nqb;
#pragma omp parallel
  {
    float* w = grow(tl_tile, static_cast<std::size_t>(kQueryTile * kKeyTile + kQueryTile * ldv));
    if (tl_state.size() < static_cast<std::size_t>(kQueryTile)) tl_state.resize(static_cast<std::size_t>(kQueryTile));
#pragma omp for schedule(dynamic, 1)
    for (index_t task = 0; task < tasks; ++task) {
      const index_t qb = nqb - 1 - task % nqb;  // causal: the longest rows first
      const index_t bhq = task / nqb;
      const index_t b = bhq / s.H, h = bhq % s.H, hk = h / group;
      const index_t t0 = qb * kQueryTile;
      fast::AttnBlock a{};
      a.rows = std::min(kQueryTile, s.Tq - t0);
      a.d_h = s.d_h;
      a.q = q.data() + b * qs.b + h * qs.h + t0 * qs.t;
      a.ldq = qs.t;
      a.kt = kt + (b * s.H_kv + hk) * nt * s.d_h * kKeyTile;
      a.v = pack_v ? vp + (b * s.H_kv + hk) * s.Tk * ldv : vd + b * vs.b + hk * vs.h;
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
      a.o_ws = w + kQueryTile * kKeyTile;
      a.st_ws = tl_state.data();
      a.out = r.out.data() + b * os.b + h * os.h + t0 * os.t;
      a.ldo = os.t;
      const index_t row0 = (b * s.H + h) * s.Tq + t0;
      a.lse = r.lse.data() + row0;
      a.p_null = r.p_null.data() + row0;
      a.probs = opt.return_probs ? r.probs.data() + row0 * s.Tk : nullptr;
      a.ldp = s.Tk;
      K.attention_block(a);
    }
  }
  check_rows(s, opt, r);  // B H Tq values: nothing next to the attention itself
}

void route_impl(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r) {
  // the reference's shape checks (oasis/depth.hpp); the finiteness of the sources is checked
  // during the mixing (and reported with the reference's message).
  const auto [n, N, d] = check_route_shapes(sources, g_old, psi, kinds);
  ensure_shape(r.h, {N, d});
  ensure_shape(r.alpha, {n, N});
  ensure_shape(r.alpha_null, {N});
  ensure_shape(r.g, {n, N});
  ensure_shape(r.dpsi, {n, N});

  // Weights: the reference's scalar functions per token. An error is reported for the first
  // failing token, as the reference's sequential loop would (non-finite sources take precedence,
  // as the reference checks them first). Mixing: the vectorised kernel. Both loops are static
  // over the same token blocks, so each thread mixes exactly the tokens it weighted and no
  // barrier is needed between them (nowait); one parallel region per call.
  std::exception_ptr err;
  index_t err_t = N;
  bool ok = true;
  const fast::Kernels& K = active();
  // blocks of ntok consecutive tokens (adjacent rows in every source: longer contiguous reads)
  const index_t ntok = std::max<index_t>(1, std::min<index_t>(kMixTokens, 4096 / d));
  const index_t nblk = (N + ntok - 1) / ntok;
#pragma omp parallel reduction(&& : ok)
  {
    Vec<float> g(n), ps(n);
    float* al = grow(tl_alpha, static_cast<std::size_t>(n * ntok));
    bool mine_ok = true;
#pragma omp for schedule(static) nowait
    for (index_t blk = 0; blk < nblk; ++blk)
      for (index_t t = blk * ntok; t < std::min(N, (blk + 1) * ntok); ++t) {
        try {
          for (index_t i = 0; i < n; ++i) { g[i] = g_old(i, t); ps[i] = psi(i, t); }
          const DepthWeights<float> w = depth_weights(g, ps, kinds, opt);
          r.alpha_null[t] = w.alpha_null;
          for (index_t i = 0; i < n; ++i) {
            r.alpha(i, t) = w.alpha[i];
            r.g(i, t) = w.g[i];
            r.dpsi(i, t) = w.dpsi[i];
          }
        } catch (...) {
          mine_ok = false;
#pragma omp critical(oasis_cpu_fast_route_error)
          if (t < err_t) { err_t = t; err = std::current_exception(); }
        }
      }
#pragma omp for schedule(static)
    for (index_t blk = 0; blk < nblk; ++blk) {
      if (!mine_ok) continue;  // this thread's weights are incomplete; the error is rethrown below
      const index_t t0 = blk * ntok, cnt = std::min(ntok, N - t0);
      for (index_t j = 0; j < cnt; ++j)
        for (index_t i = 0; i < n; ++i) al[j * n + i] = r.alpha(i, t0 + j);
      ok = K.mix(sources.data() + t0 * d, N * d, al, n, d, cnt, r.h.data() + t0 * d) && ok;
    }
  }
  if (err) {
    require_finite(sources, "sources");
    std::rethrow_exception(err);
  }
  if (!ok) {
    require_finite(sources, "sources");
    throw invalid_argument("sources", "non-finite value");  // unreachable: require_finite threw
  }
}

}  // namespace

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

void release_workspaces() {
  auto drop = [](auto& v) { std::decay_t<decltype(v)>().swap(v); };
  drop(tl_kt);
  drop(tl_v);
  drop(tl_span);
#pragma omp parallel
  {
    drop(tl_tile);
    drop(tl_state);
    drop(tl_alpha);
  }
}

void vector_exp(const float* x, float* y, index_t n) {
  OASIS_REQUIRE(n >= 0, "n", "negative length ", n);
  OASIS_REQUIRE(n == 0 || (x && y), "x", "null pointer");
  active().exp(x, y, n);
}

void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r) {
  check_attention_args(q, k, v, opt);
  attention_impl(q, k, v, opt, r);
}

AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt) {
  AttentionResult<float> r;
  token_attention_into(q, k, v, opt, r);
  return r;
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
  attention_impl(q, k, v, opt, r);  // validated by the dispatcher
  return r;
}

DepthRoute<float> cpu_fast_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                          const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                          const DepthOptions& opt) {
  return cpu_fast::attn_res_route(sources, g_old, psi, kinds, opt);
}

}  // namespace detail
}  // namespace oasis
