// tests/python/golden.cpp — the C++ side of the Python module's bitwise tests (test_bitwise.py).
//
//   oasis_python_golden DIR
// For every case below, reads the inputs DIR/<case>.<name>.npy that the Python test wrote (float32
// or float64; the case computes in that scalar), calls the library as a C++ user does, and writes
// the outputs DIR/<case>.out.<name>.npy in the same dtype (exact). It also writes a seeded model
// DIR/model.safetensors and its float and double forward on DIR/model.ids.npy. The options of
// each case are fixed here and repeated, independently, by the Python test: the module must give
// these bits through its own argument handling.
#include <cstdio>
#include <exception>
#include <string>

#include "oasis/io/npy.hpp"
#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"

namespace {

using namespace oasis;
std::string dir;

io::StoredTensor read(const std::string& c, const std::string& name) { return io::read_npy(dir + "/" + c + "." + name + ".npy"); }

template <class T>
Tensor<T> in(const std::string& c, const std::string& name) {
  return read(c, name).values.cast<T>();
}

template <class T>
void out(const std::string& c, const std::string& name, const Tensor<T>& t) {
  io::write_npy(dir + "/" + c + ".out." + name + ".npy",
                io::StoredTensor{std::is_same_v<T, float> ? io::DType::f32 : io::DType::f64, t.template cast<double>()});
}

template <class T>
void softmax1_case(const std::string& c) {
  const Tensor<T> z = in<T>(c, "z"), s = in<T>(c, "s");
  const index_t m = z.dim(z.rank() - 1), R = s.size();
  Tensor<T> p(z.shape()), p_null(s.shape()), lse(s.shape());
  for (index_t r = 0; r < R; ++r) {
    Vec<T> zr(m);
    for (index_t j = 0; j < m; ++j) zr[j] = z[r * m + j];
    const RowProbs<T> rp = softmax_null(zr, s[r]);
    for (index_t j = 0; j < m; ++j) p[r * m + j] = rp.p[j];
    p_null[r] = rp.p_null;
    lse[r] = rp.lse;
  }
  out(c, "p", p);
  out(c, "p_null", p_null);
  out(c, "lse", lse);
}

template <class T>
void attention_case(const std::string& c, const AttentionOptions& a) {
  const AttentionResult<T> r = token_attention(in<T>(c, "q"), in<T>(c, "k"), in<T>(c, "v"), a);
  out(c, "out", r.out);
  out(c, "lse", r.lse);
  out(c, "p_null", r.p_null);
  if (a.return_probs) out(c, "probs", r.probs);
}

template <class T>
void coupling_case(const std::string& c) {  // per column, authors_code clamps, beta 0.7
  const Tensor<T> g_old = in<T>(c, "g_old"), dpsi = in<T>(c, "dpsi");
  const index_t n = g_old.dim(0), N = g_old.dim(1);
  Tensor<T> g(g_old.shape());
  for (index_t t = 0; t < N; ++t) {
    Vec<T> gc(n), dc(n);
    for (index_t i = 0; i < n; ++i) { gc[i] = g_old(i, t); dc[i] = dpsi(i, t); }
    const Vec<T> r = couple_depth_logits(gc, dc, T(0.7), CouplingOptions::authors_code());
    for (index_t i = 0; i < n; ++i) g(i, t) = r[i];
  }
  out(c, "g", g);
}

template <class T>
void route_case(const std::string& c) {  // kinds initial, attention, headless, attention; theta 0.3; paper_v2
  DepthOptions d;
  d.theta = 0.3;
  const std::vector<SourceKind> kinds = {SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                         SourceKind::attention};
  const DepthRoute<T> r = attn_res_route(in<T>(c, "sources"), in<T>(c, "g_old"), in<T>(c, "psi"), kinds, d);
  out(c, "h", r.h);
  out(c, "alpha", r.alpha);
  out(c, "alpha_null", r.alpha_null);
  out(c, "g", r.g);
  out(c, "dpsi", r.dpsi);
}

template <class T>
void pseudo_query_case(const std::string& c) {  // with gain, eps 1e-5
  KeyNormOptions k;
  k.eps = 1e-5;
  out(c, "g", pseudo_query_logits(in<T>(c, "sources"), in<T>(c, "w"), in<T>(c, "gain"), k));
}

template <class T>
void all_cases(const std::string& sfx) {
  softmax1_case<T>("softmax1" + sfx);
  AttentionOptions a;  // GQA, causal, per-head null logits, padding, probabilities
  a.causal = true;
  a.null_logits = {0.5, -1.0, 0.0, 2.0};
  a.key_lengths = {7, 4};
  a.return_probs = true;
  attention_case<T>("attention" + sfx, a);
  AttentionOptions w;  // [B,T,H,d], plain softmax, sliding window 3, additive bias, scale 0.3
  w.normalizer = RowNorm::softmax;
  w.layout = AttentionLayout::bthd;
  w.window = 3;
  w.scale = 0.3;
  w.bias = read("window" + sfx, "bias").values;
  attention_case<T>("window" + sfx, w);
  out("psi" + sfx, "psi", null_statistic(in<T>("psi" + sfx, "p_null")));
  out("mass" + sfx, "psi", null_statistic_from_mass(in<T>("mass" + sfx, "probs")));
  coupling_case<T>("coupling" + sfx);
  route_case<T>("route" + sfx);
  pseudo_query_case<T>("pseudo_query" + sfx);
}

template <class T>
void model_case(const model::Model<T>& m, const std::string& sfx) {
  const Tensor<double> idt = read("model", "ids").values;
  std::vector<index_t> ids(idt.storage().begin(), idt.storage().end());
  const model::ForwardResult<T> r = m.forward(ids, idt.dim(0), idt.dim(1));
  out("model" + sfx, "logits", r.logits);
  out("model" + sfx, "state", r.state);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: oasis_python_golden DIR\n");
    return 2;
  }
  dir = argv[1];
  try {
    all_cases<float>("_f32");
    all_cases<double>("_f64");
    model::ModelConfig cfg;  // the default OASIS Kimi-full model with logits of order 1
    cfg.init_std = 0.3;
    cfg.theta_init = 0.5;
    const auto md = model::Model<double>::initialized(cfg, 77);
    model::save_model(md, dir + "/model.safetensors");
    model_case(md, "_f64");
    model_case(md.cast<float>(), "_f32");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "oasis_python_golden: %s\n", e.what());
    return 1;
  }
  return 0;
}
