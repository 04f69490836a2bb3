// verify/compare_model.cpp — `compare` at the model level (op "model"; docs/verify.md).
//
// The weights and the configuration come from a file written by oasis::model::save_model
// (oasis/model/io.hpp); the oracle runs Model<mp50>::forward on the given token ids, and bounds
// the forward error of the plain same-precision model with the model's own first-order error
// propagation (ForwardOptions::error_u = u_D, ForwardResult::logit_error: per token, a bound on
// max_v |logit error|). Policy per logit: |x - ref| <= 0.5 ulp_D(ref) + 2 logit_error[token](u_D).
//
// Per-sublayer trace ("<sublayer>.<field>", sublayer names of SublayerTrace: layers.{b}.attn,
// layers.{b}.mlp, final_res): each router is checked *locally* on the implementation's own
// router inputs <sublayer>.sources [n,B,T,d], .g_old [n,B,T], .psi [n,B,T] — the oracle routes
// exactly those (mp50, attn_res_route with the sublayer's kinds, normaliser, coupling and beta
// from the oracle's trace) and .alpha, .alpha_null, .g, .dpsi, .routed (the router's output h,
// [B,T,d]) are compared under the depth-routing policy of the op level. Attention sublayers:
// .branch_psi [B,T] against the mean over heads of the implementation's .p_null [B,H,T] (psi
// policy). A local check points at the first sublayer whose routing is wrong, independent of
// the rounding that accumulates upstream.
#include <cmath>
#include <set>

#include "oasis/error_bounds.hpp"

#include "compare_detail.hpp"
#include "oasis/io/safetensors.hpp"

#if __has_include("oasis/model/io.hpp")
#include "oasis/model/io.hpp"
#define OASIS_VERIFY_HAVE_MODEL 1
#endif

namespace oasis::verify::detail {

#if defined(OASIS_VERIFY_HAVE_MODEL)
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
  // attention sublayer: branch psi from the implementation's own p_null
  if (const io::StoredTensor* bp = find_t(out, P + "branch_psi")) {
    const io::StoredTensor* pn = find_t(out, P + "p_null");
    OASIS_REQUIRE(pn, P + "branch_psi", "is checked against the mean over heads of the implementation's ", P,
                  "p_null [B, H, T]; provide it");
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

}  // namespace
#endif

CompareReport op_model(const io::json::Value& model, const std::string& base_dir, const io::TensorMap& inputs,
                       const io::TensorMap& outputs, const CompareOptions& opt) {
  OASIS_REQUIRE(model.is_string(), "model", "must be the path of a weights file (.safetensors)");
  const std::string path = (model.text.empty() || model.text[0] == '/') ? model.text : base_dir + "/" + model.text;
#if defined(OASIS_VERIFY_HAVE_MODEL)
  const oasis::model::Model<mp50> m = oasis::model::load_model<mp50>(path);
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
  {
    oasis::model::ForwardOptions fo;
    fo.trace = true;
    const oasis::model::ForwardResult<mp50> tref = m.forward(ids, B, Tn, fo);
    for (const auto& tr : tref.trace) check_trace(tr, m.config(), outputs, B, Tn, opt, rep, traced);
  }
  for (const auto& [name, t] : outputs) {
    if (traced.count(name)) continue;
    if (name != "logits") {
      rep.notes.push_back("output '" + name + "' is neither logits nor a checked trace tensor (<sublayer>.alpha, "
                          ".alpha_null, .g, .dpsi, .routed, .branch_psi); ignored");
      continue;
    }
    oasis::model::ForwardOptions fo;
    fo.error_u = io::dtype_eps(t.dtype) / 2;  // bound the plain model run in the output's precision
    const oasis::model::ForwardResult<mp50> ref = m.forward(ids, B, Tn, fo);
    Tensor<double> plain(ref.logits.shape());
    const index_t V = ref.logits.dim(2);
    for (index_t r = 0; r < B * Tn; ++r)
      for (index_t v = 0; v < V; ++v) plain[r * V + v] = ref.logit_error.at(static_cast<std::size_t>(r));
    rep.tensors.push_back(compare_tensor(name, t, ref.logits, plain, opt.show));
  }
  OASIS_REQUIRE(!rep.tensors.empty(), "outputs", "op model found neither 'logits' [B, T, vocab] nor trace tensors in the outputs");
  rep.passed = true;
  for (const auto& t : rep.tensors) rep.passed = rep.passed && t.passed;
  return rep;
#else
  (void)inputs; (void)outputs; (void)opt;
  throw invalid_argument("op", "op model needs oasis/model/io.hpp, which this build does not have (" + path + ")");
#endif
}

}  // namespace oasis::verify::detail
