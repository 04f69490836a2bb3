// src/verify/op_model.cpp — the model level (op "model", check_model; docs/verify.md).
//
// The weights and the configuration come from a file written by oasis::model::save_model
// (oasis/model/io.hpp). Every verdict is LOCAL: a step of the model is recomputed in mp50 from
// the implementation's OWN inputs of that step (read exactly from its trace tensors) and its
// outputs are compared under
//   |x - ref| <= 0.5 ulp_D(ref) + 2 e_step(D)
// where e_step is the step's first-order bound of the plain same-precision step with exact inputs
// (the error model of oasis/model/layers.hpp with u = u_f64 for f64 outputs and u = u_f32 scaled
// by u_D / u_f32 for f32, f16, bf16 — as the op level). Steps (trace tensors "<sublayer>.<field>",
// sublayer names of SublayerTrace; docs/model.md "precision" for the per-step bounds):
//   attention: .input -> .attn_q/.attn_k/.attn_v (RMSNorm, projections, q/k norm, RoPE);
//              .attn_q,.attn_k,.attn_v -> .attn_heads (+ .branch_psi when no .p_null is given);
//              .attn_heads -> .output (W_o); without .attn_heads: .input -> .output (whole sublayer)
//   mlp:       .input -> .mlp_hidden; .mlp_hidden -> .output; without .mlp_hidden: .input -> .output
//   routers:   .sources/.g_old/.psi -> .alpha, .alpha_null, .g, .dpsi, .routed (depth policy)
//   psi:       .p_null -> .branch_psi (psi policy)
//   head:      state [B,T,d] (or final_res.routed with the final_attnres readout) -> logits
//              (final RMSNorm + LM head).
// Logits without a readout state are recomputed by the whole forward in mp50 and reported in
// units of D, informative only: the composed first-order end-to-end bound overestimates the
// error of a float model by 1e7 to 1e30 (docs/model.md), so no sound non-vacuous verdict exists.
#include <cmath>
#include <map>
#include <set>

#include "oasis/error_bounds.hpp"

#include "engine.hpp"
#include "op_model_grad.hpp"
#include "oasis/io/safetensors.hpp"

#include "oasis/model/io.hpp"

namespace oasis::verify::detail {

namespace {

const io::StoredTensor* find_t(const io::TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

Tensor<double> scaled(Tensor<double> b, io::DType d) {
  const double s = d == io::DType::f64 ? 1.0 : io::dtype_eps(d) / io::dtype_eps(io::DType::f32);
  for (index_t i = 0; i < b.size(); ++i) b[i] *= s;
  return b;
}

void check_trace(const oasis::model::SublayerTrace<mp50>& tr, const oasis::model::ModelConfig& cfg,
                 const io::TensorMap& out, index_t B, index_t Tn, const CompareOptions& opt, CompareReport& rep,
                 std::set<std::string>& traced) {
  const std::string P = tr.name + ".";
  const index_t N = B * Tn;
  // attention sublayer: branch psi from the implementation's own p_null (without p_null,
  // branch_psi is a product of the attention core step, check_sublayer_steps)
  const io::StoredTensor* bp = find_t(out, P + "branch_psi");
  const io::StoredTensor* pn = find_t(out, P + "p_null");
  if (bp && pn) {
    require_rank(pn->values, 3, (P + "p_null").c_str(), "[B, H, T]");
    const Tensor<mp50> psi = null_statistic(pn->values.cast<mp50>());
    const double H = static_cast<double>(pn->values.dim(1));
    Tensor<double> plain(psi.shape());
    for (index_t i = 0; i < plain.size(); ++i)  // psi policy of the op level: 1.02 H u psi
      plain[i] = bounds::kSecondOrder * H * (io::dtype_eps(bp->dtype) / 2) * static_cast<double>(psi[i]);
    rep.tensors.push_back(compare_tensor(P + "branch_psi", *bp, psi, plain, opt.show));
    traced.insert(P + "branch_psi");
    traced.insert(P + "p_null");
  }
  if (!tr.has_route) return;
  const char* fields[] = {"alpha", "alpha_null", "g", "dpsi", "routed"};
  bool any = false;
  for (const char* f : fields) any = any || find_t(out, P + f);
  if (!any) return;
  const io::StoredTensor* src = find_t(out, P + "sources");
  const io::StoredTensor* g_old = find_t(out, P + "g_old");
  const io::StoredTensor* psi = find_t(out, P + "psi");
  OASIS_REQUIRE(src && g_old && (psi || !tr.coupled), P + "alpha",
                "trace routing tensors are checked on the implementation's own router inputs: provide ", P,
                "sources [n,B,T,d], ", P, "g_old [n,B,T]", tr.coupled ? std::string(" and ") + P + "psi [n,B,T]" : std::string());
  const index_t n = static_cast<index_t>(tr.source_kinds.size()), d = tr.sources.dim(3);
  OASIS_REQUIRE(src->values.shape() == (Shape{n, B, Tn, d}), P + "sources", "shape ", shape_str(src->values.shape()),
                " but this sublayer routes over ", n, " candidates: expected ", shape_str(Shape{n, B, Tn, d}));
  OASIS_REQUIRE(g_old->values.shape() == (Shape{n, B, Tn}), P + "g_old", "shape ", shape_str(g_old->values.shape()),
                ", expected ", shape_str(Shape{n, B, Tn}));
  Tensor<double> ps({n, N});
  if (psi) {
    OASIS_REQUIRE(psi->values.shape() == (Shape{n, B, Tn}), P + "psi", "shape ", shape_str(psi->values.shape()),
                  ", expected ", shape_str(Shape{n, B, Tn}));
    ps = psi->values.reshaped({n, N});
  }
  DepthOptions dopt;
  dopt.normalizer = tr.depth_normalizer;
  dopt.coupling = tr.coupled;
  dopt.coupling_options = cfg.coupling_or_default();
  dopt.beta = tr.beta;
  const Tensor<double> s3 = src->values.reshaped({n, N, d}), g2 = g_old->values.reshaped({n, N});
  const DepthRoute<mp50> ref = attn_res_route(s3.cast<mp50>(), g2.cast<mp50>(), ps.cast<mp50>(), tr.source_kinds, dopt);
  for (const char* f : fields) {
    const io::StoredTensor* got = find_t(out, P + f);
    if (!got) continue;
    const std::string fs = f;
    const bool wide = got->dtype == io::DType::f64;
    auto bnd = [&](auto tag) {
      using T = decltype(tag);
      return bounds::depth_route_bounds(s3.cast<T>(), g2.cast<T>(), ps.cast<T>(), tr.source_kinds, dopt, ref);
    };
    const bounds::DepthRouteBounds b = wide ? bnd(double{}) : bnd(float{});
    const Tensor<mp50>* r = nullptr;
    Tensor<double> plain;
    Shape shape;
    if (fs == "alpha") { r = &ref.alpha; plain = b.alpha; shape = {n, B, Tn}; }
    else if (fs == "alpha_null") { r = &ref.alpha_null; plain = b.alpha_null; shape = {B, Tn}; }
    else if (fs == "g") { r = &ref.g; plain = b.g; shape = {n, B, Tn}; }
    else if (fs == "dpsi") { r = &ref.dpsi; plain = b.dpsi; shape = {n, B, Tn}; }
    else { r = &ref.h; plain = b.h; shape = {B, Tn, d}; }
    rep.tensors.push_back(compare_tensor(P + fs, *got, r->reshaped(shape), scaled(plain.reshaped(shape), got->dtype), opt.show));
    traced.insert(P + fs);
  }
  traced.insert(P + "sources");
  traced.insert(P + "g_old");
  traced.insert(P + "psi");
}


using oasis::model::ErrorModel;
using oasis::model::Rows;

/// u of the error model whose bound is reported for an output stored in D (then scaled()).
double model_u(io::DType d) { return d == io::DType::f64 ? io::dtype_eps(io::DType::f64) / 2 : io::dtype_eps(io::DType::f32) / 2; }

/// An implementation's step input, read exactly: rows [B*T, w] of the tensor [B, T, w], error 0.
Rows<mp50> input_rows(const io::TensorMap& out, const std::string& name, index_t B, index_t Tn, index_t w,
                      const std::string& why) {
  const io::StoredTensor* t = find_t(out, name);
  OASIS_REQUIRE(t, name, why, ": provide ", name, " ", shape_str(Shape{B, Tn, w}));
  OASIS_REQUIRE(t->values.shape() == (Shape{B, Tn, w}), name, "shape ", shape_str(t->values.shape()), ", expected ",
                shape_str(Shape{B, Tn, w}));
  for (index_t i = 0; i < t->values.size(); ++i)
    OASIS_REQUIRE(std::isfinite(t->values[i]), name, "entry ", i, " is not finite (a step input must be finite)");
  return Rows<mp50>{t->values.reshaped({B * Tn, w}).cast<mp50>(), std::vector<double>(static_cast<std::size_t>(B * Tn), 0.0)};
}

/// Compare the implementation's step output `name` (shape [B, T, w] or [B, T] for w = 0) with the
/// oracle's step rows ref [B*T, max(w,1)] and per-row bounds e (computed with u = model_u(D)).
void compare_step(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref, const std::vector<double>& e,
                  index_t B, index_t Tn, index_t w, const CompareOptions& opt, CompareReport& rep) {
  const Shape shape = w > 0 ? Shape{B, Tn, w} : Shape{B, Tn};
  const index_t ww = std::max<index_t>(w, 1);
  Tensor<double> plain(shape);
  for (index_t i = 0; i < plain.size(); ++i) plain[i] = e.at(static_cast<std::size_t>(i / ww));
  rep.tensors.push_back(compare_tensor(name, got, ref.reshaped(shape), scaled(plain, got.dtype), opt.show));
}

/// A step evaluated once per error-model u (outputs of different dtypes need different u).
template <class R, class F>
const R& memo(std::map<double, R>& cache, double u, F&& f) {
  auto it = cache.find(u);
  if (it == cache.end()) it = cache.emplace(u, f(ErrorModel{u})).first;
  return it->second;
}

/// The local steps of one attention or MLP sublayer (block b) on the implementation's own inputs.
void check_sublayer_steps(const oasis::model::Model<mp50>& m, const oasis::model::SublayerTrace<mp50>& tr, index_t b,
                          const io::TensorMap& out, index_t B, index_t Tn, bool psi_from_pnull, const CompareOptions& opt,
                          CompareReport& rep, std::set<std::string>& traced) {
  namespace om = oasis::model;
  const om::ModelConfig& c = m.config();
  const std::string P = tr.name + ".";
  const index_t d = c.d_model;
  if (tr.kind == om::SublayerKind::attention) {
    const index_t wq = c.n_heads * c.head_dim(), wkv = c.kv_heads() * c.head_dim();
    const char* steps[] = {"attn_q", "attn_k", "attn_v", "attn_heads", "output"};
    bool any = false;
    for (const char* f : steps) any = any || find_t(out, P + f);
    const bool have_qkv = find_t(out, P + "attn_q") && find_t(out, P + "attn_k") && find_t(out, P + "attn_v");
    // .p_null and .lse are core outputs when the projections are given (else p_null is only the
    // input of the branch psi step)
    const io::StoredTensor* pnull = have_qkv ? find_t(out, P + "p_null") : nullptr;
    const io::StoredTensor* lse = have_qkv ? find_t(out, P + "lse") : nullptr;
    if (!any && !pnull && !lse && !(find_t(out, P + "branch_psi") && !psi_from_pnull)) return;
    OASIS_REQUIRE(!c.gated_attention && !c.prefix_sink, P + "output",
                  "no per-step error bound is derived for gated attention or the prefix sink; the attention steps of this "
                  "configuration cannot be checked (leave out ", P, "attn_q/attn_k/attn_v/attn_heads/output)");
    const om::AttentionWeights<mp50> W = m.attn_weights(b);
    // step 1: projections from the implementation's .input
    if (find_t(out, P + "attn_q") || find_t(out, P + "attn_k") || find_t(out, P + "attn_v")) {
      const Rows<mp50> h = input_rows(out, P + "input", B, Tn, d, "the projections are checked on the sublayer's own input");
      struct Proj { Rows<mp50> q, k, v; };
      std::map<double, Proj> cache;
      const std::pair<const char*, index_t> f3[] = {{"attn_q", wq}, {"attn_k", wkv}, {"attn_v", wkv}};
      for (std::size_t i = 0; i < 3; ++i) {
        const io::StoredTensor* got = find_t(out, P + f3[i].first);
        if (!got) continue;
        const Proj& pr = memo(cache, model_u(got->dtype), [&](const ErrorModel& em) {
          Proj r;
          om::attention_projections(h, Tn, 0, W, c, em, r.q, r.k, r.v);
          return r;
        });
        const Rows<mp50>& r = i == 0 ? pr.q : i == 1 ? pr.k : pr.v;
        compare_step(P + f3[i].first, *got, r.x, r.e, B, Tn, f3[i].second, opt, rep);
        traced.insert(P + f3[i].first);
      }
      traced.insert(P + "input");
    }
    // step 2: attention core from the implementation's .attn_q, .attn_k, .attn_v
    const io::StoredTensor* heads = find_t(out, P + "attn_heads");
    const io::StoredTensor* bpsi = psi_from_pnull ? nullptr : find_t(out, P + "branch_psi");
    if (heads || bpsi) {
      const std::string why = "the attention core is checked on the sublayer's own projections";
      const Rows<mp50> q = input_rows(out, P + "attn_q", B, Tn, wq, why), k = input_rows(out, P + "attn_k", B, Tn, wkv, why),
                       v = input_rows(out, P + "attn_v", B, Tn, wkv, why);
      std::map<double, om::AttentionSublayer<mp50>> cache;
      auto core = [&](const ErrorModel& em) {
        om::KVCache<mp50> kv;
        return om::attention_core(q, k, v, B, Tn, c, kv, em);
      };
      if (heads) {
        const auto& a = memo(cache, model_u(heads->dtype), core);
        compare_step(P + "attn_heads", *heads, a.heads.x, a.heads.e, B, Tn, wq, opt, rep);
        traced.insert(P + "attn_heads");
      }
      if (bpsi) {
        const auto& a = memo(cache, model_u(bpsi->dtype), core);
        compare_step(P + "branch_psi", *bpsi, a.psi, a.e_psi, B, Tn, 0, opt, rep);
        traced.insert(P + "branch_psi");
      }
    }
    // step 2b: p_null and LSE of the core per (b, h, t): the op-level token attention on the
    // implementation's q, k, v split into heads, under the op-level attention bounds
    if (pnull || lse) {
      const index_t H = c.n_heads, Hkv = c.kv_heads(), dh = c.head_dim();
      auto heads_of = [&](const char* f, index_t Hx) {  // [B, T, Hx dh] -> [B, Hx, T, dh]
        const Tensor<double>& x = find_t(out, P + f)->values;
        OASIS_REQUIRE(x.shape() == (Shape{B, Tn, Hx * dh}), P + f, "shape ", shape_str(x.shape()), ", expected ",
                      shape_str(Shape{B, Tn, Hx * dh}));
        for (index_t i = 0; i < x.size(); ++i)
          OASIS_REQUIRE(std::isfinite(x[i]), P + f, "entry ", i, " is not finite (a step input must be finite)");
        Tensor<double> r({B, Hx, Tn, dh});
        for (index_t bb = 0; bb < B; ++bb)
          for (index_t hh = 0; hh < Hx; ++hh)
            for (index_t t = 0; t < Tn; ++t)
              for (index_t cc = 0; cc < dh; ++cc) r(bb, hh, t, cc) = x[(bb * Tn + t) * Hx * dh + hh * dh + cc];
        return r;
      };
      const Tensor<double> qh = heads_of("attn_q", H), kh = heads_of("attn_k", Hkv), vh = heads_of("attn_v", Hkv);
      AttentionOptions ao;  // as oasis::model::attention_core: the variant's normaliser, causal, scale 1/sqrt(d_h)
      ao.normalizer = c.token_norm();
      ao.causal = true;
      ao.return_probs = true;
      const AttentionResult<mp50> ref = token_attention(qh.cast<mp50>(), kh.cast<mp50>(), vh.cast<mp50>(), ao);
      auto plain = [&](io::DType dt) {
        if (dt == io::DType::f64) return bounds::attention_bounds(qh, kh, vh, ao, ref);
        return bounds::attention_bounds(qh.cast<float>(), kh.cast<float>(), vh.cast<float>(), ao, ref);
      };
      if (pnull) {
        rep.tensors.push_back(compare_tensor(P + "p_null", *pnull, ref.p_null, scaled(plain(pnull->dtype).p_null, pnull->dtype), opt.show));
        traced.insert(P + "p_null");
      }
      if (lse) {
        rep.tensors.push_back(compare_tensor(P + "lse", *lse, ref.lse, scaled(plain(lse->dtype).lse, lse->dtype), opt.show));
        traced.insert(P + "lse");
      }
    }
    // step 3: output projection from .attn_heads, else the whole sublayer from .input
    if (const io::StoredTensor* o = find_t(out, P + "output")) {
      std::map<double, Rows<mp50>> cache;
      const Rows<mp50>* r = nullptr;
      if (heads) {
        const Rows<mp50> hr = input_rows(out, P + "attn_heads", B, Tn, wq, "");
        r = &memo(cache, model_u(o->dtype), [&](const ErrorModel& em) { return om::linear(hr, *W.wo, em); });
      } else {
        const Rows<mp50> h = input_rows(out, P + "input", B, Tn, d, "the sublayer output is checked on the sublayer's own input");
        r = &memo(cache, model_u(o->dtype), [&](const ErrorModel& em) {
          om::KVCache<mp50> kv;
          return om::attention_sublayer(h, B, Tn, 0, W, c, kv, em).out;
        });
        traced.insert(P + "input");
      }
      compare_step(P + "output", *o, r->x, r->e, B, Tn, d, opt, rep);
      traced.insert(P + "output");
    }
  } else if (tr.kind == om::SublayerKind::mlp) {
    const io::StoredTensor* hid = find_t(out, P + "mlp_hidden");
    const io::StoredTensor* o = find_t(out, P + "output");
    if (!hid && !o) return;
    const om::MlpWeights<mp50> W = m.mlp_weights(b);
    if (hid) {  // step 1: hidden silu(W_gate x) * (W_up x), x = RMSNorm(.input)
      const Rows<mp50> h = input_rows(out, P + "input", B, Tn, d, "the MLP hidden rows are checked on the sublayer's own input");
      const Rows<mp50> r = om::mlp_hidden(h, W, c, ErrorModel{model_u(hid->dtype)});
      compare_step(P + "mlp_hidden", *hid, r.x, r.e, B, Tn, c.d_ff, opt, rep);
      traced.insert(P + "mlp_hidden");
      traced.insert(P + "input");
    }
    if (o) {  // step 2: W_down from .mlp_hidden, else the whole sublayer from .input
      const ErrorModel em{model_u(o->dtype)};
      Rows<mp50> r;
      if (hid) {
        r = om::linear(input_rows(out, P + "mlp_hidden", B, Tn, c.d_ff, ""), *W.down, em);
      } else {
        r = om::mlp_sublayer(input_rows(out, P + "input", B, Tn, d, "the MLP output is checked on the sublayer's own input"), W, c, em);
        traced.insert(P + "input");
      }
      compare_step(P + "output", *o, r.x, r.e, B, Tn, d, opt, rep);
      traced.insert(P + "output");
    }
  }
}

CompareReport run_model(const oasis::model::Model<mp50>& m, const io::TensorMap& inputs, const io::TensorMap& outputs,
                        const CompareOptions& opt) {
  auto it = inputs.find("ids");
  OASIS_REQUIRE(it != inputs.end(), "inputs", "op model needs input tensor 'ids' [B, T] (token ids)");
  const Tensor<double>& idt = it->second.values;
  require_rank(idt, 2, "ids", "[B, T]");
  std::vector<index_t> ids(static_cast<std::size_t>(idt.size()));
  for (index_t i = 0; i < idt.size(); ++i) {
    const double x = idt[i];
    OASIS_REQUIRE(std::isfinite(x) && x == std::floor(x) && x >= 0 && x < 9.0e15, "ids", "entry ", i, " = ", x,
                  " is not a non-negative integer");
    ids[static_cast<std::size_t>(i)] = static_cast<index_t>(x);
  }
  const index_t B = idt.dim(0), Tn = idt.dim(1);
  CompareReport rep;
  rep.op = "model";
  std::set<std::string> traced;
  oasis::model::ForwardOptions fo;
  fo.trace = true;
  const oasis::model::ForwardResult<mp50> tref = m.forward(ids, B, Tn, fo);
  for (std::size_t l = 0; l < tref.trace.size(); ++l) {
    const auto& tr = tref.trace[l];
    check_trace(tr, m.config(), outputs, B, Tn, opt, rep, traced);
    const bool psi_from_pnull = find_t(outputs, tr.name + ".branch_psi") && find_t(outputs, tr.name + ".p_null");
    check_sublayer_steps(m, tr, static_cast<index_t>(l / 2), outputs, B, Tn, psi_from_pnull, opt, rep, traced);
  }
  check_model_gradients(m, ids, B, Tn, inputs, outputs, opt, rep, traced);
  if (const io::StoredTensor* lg = find_t(outputs, "logits")) {
    traced.insert("logits");
    const oasis::model::ModelConfig& c = m.config();
    // the readout state feeding the final norm: "state", or the final router's output
    std::string sname = "state";
    if (!find_t(outputs, sname) && c.attn_res() && c.readout_or_default() == oasis::model::Readout::final_attnres &&
        find_t(outputs, "final_res.routed"))
      sname = "final_res.routed";
    if (find_t(outputs, sname)) {
      // head step: logits = LM head(RMSNorm(state)) from the implementation's own state
      const Rows<mp50> st = input_rows(outputs, sname, B, Tn, c.d_model, "");
      const ErrorModel em{model_u(lg->dtype)};
      const Rows<mp50> xn = oasis::model::rms_norm(st, m.param("norm.weight"), KeyNormOptions{c.norm_eps, false}, em);
      const Rows<mp50> r = oasis::model::linear(xn, m.param(c.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight"), em);
      compare_step("logits", *lg, r.x, r.e, B, Tn, c.vocab_size, opt, rep);
      traced.insert(sname);
    } else {
      // end to end: the whole forward in mp50 from the ids; reported, no verdict (file comment)
      Tensor<double> zero(tref.logits.shape());
      TensorReport t = compare_tensor("logits", *lg, tref.logits, zero, 0);
      if (t.problem.empty()) {  // a wrong shape stays a failure
        t.informative = true;
        t.passed = true;
        t.violations = 0;
        t.worst_ratio = 0;
        t.first_mismatches.clear();
      }
      rep.tensors.push_back(t);
      rep.notes.push_back("end-to-end: informative only, no verdict; provide the trace for a verdict (logits are checked "
                          "locally from the readout state 'state' [B,T,d] before the final norm)");
    }
  }
  for (const auto& [name, t] : outputs) {
    (void)t;
    if (traced.count(name)) continue;
    rep.notes.push_back("output '" + name + "' is neither logits nor a checked trace tensor (docs/verify.md, model level); ignored");
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "op model found neither 'logits' [B, T, vocab] nor trace tensors in the outputs");
  rep.passed = true;  // informative tensors carry no verdict
  for (const auto& t : rep.tensors) rep.passed = rep.passed && (t.informative || t.passed);
  return rep;
}

}  // namespace

CompareReport run_model(const std::string& path, const io::TensorMap& inputs, const io::TensorMap& outputs,
                        const CompareOptions& opt) {
  return run_model(oasis::model::load_model<mp50>(path), inputs, outputs, opt);
}

CompareReport run_model(const oasis::model::ModelConfig& config, const io::TensorMap& weights, const io::TensorMap& inputs,
                        const io::TensorMap& outputs, const CompareOptions& opt) {
  return run_model(oasis::model::model_from_tensors<mp50>(config, weights, "weights"), inputs, outputs, opt);
}

}  // namespace oasis::verify::detail
