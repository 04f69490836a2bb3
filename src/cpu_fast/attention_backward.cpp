// src/cpu_fast/attention_backward.cpp — the attention backward on the fast path:
// FlashAttention-2's algorithm with the null category (kernels/backward.inc,
// attention_backward_block) on the forward's output and row state (M, S), run by OpenMP over
// (batch, kv head, chunk of key tiles); the operands are packed once per call (zero-padded rows of
// whole vectors, the score gemm's key and value panels); D, 1/S and the null-logit gradient of each
// row, the dq sums and the bias reduction are done here, in the reference's order.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fast_kernels.hpp"
#include "oasis/core/instances.hpp"
#include "ops.hpp"
#include "packing.hpp"
#include "workspace.hpp"

namespace oasis::fast {
namespace {

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
  const index_t W = active_kernels().lanes;
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
  const Kernels& K = active_kernels();
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

}  // namespace

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

// check_attention_args for the backward: the shapes, then pack_backward_inputs, whose reading of
// q, k and v is the finiteness check (a non-finite value is then reported by the reference's
// check, with its message). Returns the shape.
AttentionShape check_and_pack_backward_inputs(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                              const AttentionOptions& opt) {
  const AttentionShape s = check_attention_shapes(q, k, v, opt);
  require_finite_null_logits(opt, "cpu_fast");
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
  const Kernels& K = active_kernels();
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

}  // namespace oasis::fast
