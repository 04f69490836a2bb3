// src/cpu_fast/attention.cpp — token attention on the fast path: the fused, tiled, online-normalised
// kernel of kernels/forward.inc, run by OpenMP over (batch, query head, block of kQueryTile
// queries), most expensive causal blocks first.
// Keys are packed once per call into [tile][d_h][key tile] panels (the B operand of the score tile
// product), values into rows padded to a whole number of vectors when d_v needs it; q, v and out
// are otherwise used in place in either layout (strides); the bias is read per tile in double and
// rounded to float as the reference does; GQA maps query head h to kv head h / (H / H_kv)
// exactly as the reference.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fast_kernels.hpp"
#include "oasis/core/instances.hpp"
#include "ops.hpp"
#include "packing.hpp"
#include "workspace.hpp"

namespace oasis::fast {
namespace {

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

}  // namespace

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
                    cpu_fast::AttentionRowState* state) {
  require_finite_null_logits(opt, "cpu_fast");
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

  const Kernels& K = active_kernels();
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
  // still in the caches, instead of every head's, written out to memory (docs/benchmarks.md,
  // "What is left at T = 1024"). Otherwise one phase of every kv head.
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

}  // namespace oasis::fast
