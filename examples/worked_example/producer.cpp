// examples/worked_example/producer.cpp — a tiny "other implementation" of Softmax1 attention and
// of the null statistic psi, written WITHOUT the oracle (plain C++17, float arithmetic), that
// saves its inputs and outputs as .npy files plus the configuration `oasis-verify compare` reads.
//
//   producer OUTDIR [--mistake lse|psi-sum|grad-d]
//
// --mistake lse      the classic bug: the normaliser is right (so `out` is right) but the reported
//                    log-sum-exp leaves the null logit out, LSE = log sum_j e^{z_j} instead of
//                    LSE1 = log(e^0 + sum_j e^{z_j}); p_null is then derived as exp(0 - LSE).
// --mistake psi-sum  psi summed over heads instead of averaged (psi = sum_h p_null instead of
//                    (1/H) sum_h p_null).
// --mistake grad-d   in the backward, D = rowsum(dO * O) taken from the output renormalised over
//                    the keys (O / (1 - p_null), as if the probabilities summed to 1 without the
//                    null) instead of the Softmax1 output O.
// It also computes the backward of the attention for a random incoming gradient dO (grad_q, grad_k,
// grad_v and the gradient of each head's null logit) and writes attention_backward.json.
// See docs/verify.md ("Worked example") for the walkthrough.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr int B = 1, H = 2, T = 5, D = 8;

// Deterministic normal numbers (xorshift64* + Box-Muller), so the example is reproducible.
struct Rng {
  std::uint64_t s = 0x9E3779B97F4A7C15ULL;
  double uniform() {
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return static_cast<double>((s * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
  }
  float normal() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

// Minimal .npy writer: version 1.0, little-endian float32, C order.
bool write_npy_f32(const std::string& path, const std::vector<int>& shape, const std::vector<float>& data) {
  std::string sh = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  sh += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + sh + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xFF),
                                 static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f << header;
  for (float x : data) {  // little-endian bytes regardless of the host
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    const unsigned char b[4] = {static_cast<unsigned char>(u), static_cast<unsigned char>(u >> 8),
                                static_cast<unsigned char>(u >> 16), static_cast<unsigned char>(u >> 24)};
    f.write(reinterpret_cast<const char*>(b), 4);
  }
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: producer OUTDIR [--mistake lse|psi-sum|grad-d]\n");
    return argc < 2 ? 2 : 0;
  }
  const std::string dir = argv[1];
  std::string mistake;
  if (argc == 4 && std::string(argv[2]) == "--mistake") mistake = argv[3];
  else if (argc != 2) { std::fprintf(stderr, "producer: bad arguments\n"); return 2; }
  if (!mistake.empty() && mistake != "lse" && mistake != "psi-sum" && mistake != "grad-d") {
    std::fprintf(stderr, "producer: unknown mistake '%s'\n", mistake.c_str());
    return 2;
  }

  Rng rng;
  std::vector<float> q(B * H * T * D), k(q.size()), v(q.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = rng.normal();

  // Causal Softmax1 attention in float: z_j = <q_t, k_j>/sqrt(D) for j <= t, null logit 0.
  std::vector<float> out(B * H * T * D, 0.0f), lse(B * H * T), p_null(B * H * T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < T; ++t) {
      float z[T];
      float M = 0.0f;  // the running max includes the null logit 0
      float Mk = -INFINITY;
      for (int j = 0; j <= t; ++j) {
        float dot = 0.0f;
        for (int c = 0; c < D; ++c) dot += q[(h * T + t) * D + c] * k[(h * T + j) * D + c];
        z[j] = dot * scale;
        M = std::fmax(M, z[j]);
        Mk = std::fmax(Mk, z[j]);
      }
      float S = std::exp(0.0f - M);
      for (int j = 0; j <= t; ++j) S += std::exp(z[j] - M);
      for (int j = 0; j <= t; ++j) {
        const float p = std::exp(z[j] - M) / S;
        for (int c = 0; c < D; ++c) out[(h * T + t) * D + c] += p * v[(h * T + j) * D + c];
      }
      const int r = h * T + t;
      if (mistake == "lse") {  // BUG: log-sum-exp over the keys only
        float Sk = 0.0f;
        for (int j = 0; j <= t; ++j) Sk += std::exp(z[j] - Mk);
        lse[r] = Mk + std::log(Sk);
      } else {
        lse[r] = M + std::log(S);
      }
      p_null[r] = std::exp(0.0f - lse[r]);
    }
  // psi_t = (1/H) sum_h p_null_{h,t}
  std::vector<float> psi(B * T, 0.0f);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) psi[t] += p_null[h * T + t];
    if (mistake != "psi-sum") psi[t] /= static_cast<float>(H);  // BUG when omitted
  }

  // The backward for dL/dout = dO: with the row's probabilities p_j, p_null = exp(0 - LSE1) and
  // D = <dO_t, O_t>: dz_j = p_j (<dO_t, v_j> - D), dq_t = scale sum_j dz_j k_j, dk_j = scale
  // sum_t dz_j q_t, dv_j = sum_t p_j dO_t, and the null logit's ds = -sum_t p_null D.
  std::vector<float> dout(out.size()), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f), ds(H, 0.0f);
  for (float& x : dout) x = rng.normal();
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < T; ++t) {
      float z[T], p[T];
      float M = 0.0f;
      for (int j = 0; j <= t; ++j) {
        float dot = 0.0f;
        for (int c = 0; c < D; ++c) dot += q[(h * T + t) * D + c] * k[(h * T + j) * D + c];
        z[j] = dot * scale;
        M = std::fmax(M, z[j]);
      }
      float S = std::exp(0.0f - M);
      for (int j = 0; j <= t; ++j) S += std::exp(z[j] - M);
      for (int j = 0; j <= t; ++j) p[j] = std::exp(z[j] - M) / S;
      const float pn = std::exp(0.0f - M) / S;
      const float* dO = &dout[(h * T + t) * D];
      float Dt = 0.0f;
      for (int c = 0; c < D; ++c) Dt += dO[c] * out[(h * T + t) * D + c];
      if (mistake == "grad-d") Dt /= 1.0f - pn;  // BUG: D from the output without the null
      for (int j = 0; j <= t; ++j) {
        float dp = 0.0f;
        for (int c = 0; c < D; ++c) dp += dO[c] * v[(h * T + j) * D + c];
        const float dz = p[j] * (dp - Dt);
        for (int c = 0; c < D; ++c) {
          dq[(h * T + t) * D + c] += scale * dz * k[(h * T + j) * D + c];
          dk[(h * T + j) * D + c] += scale * dz * q[(h * T + t) * D + c];
          dv[(h * T + j) * D + c] += p[j] * dO[c];
        }
      }
      ds[h] -= pn * Dt;
    }

  bool ok = write_npy_f32(dir + "/q.npy", {B, H, T, D}, q) && write_npy_f32(dir + "/k.npy", {B, H, T, D}, k) &&
            write_npy_f32(dir + "/v.npy", {B, H, T, D}, v) && write_npy_f32(dir + "/out.npy", {B, H, T, D}, out) &&
            write_npy_f32(dir + "/lse.npy", {B, H, T}, lse) && write_npy_f32(dir + "/p_null.npy", {B, H, T}, p_null) &&
            write_npy_f32(dir + "/psi.npy", {B, T}, psi) && write_npy_f32(dir + "/grad_out.npy", {B, H, T, D}, dout) &&
            write_npy_f32(dir + "/grad_q.npy", {B, H, T, D}, dq) && write_npy_f32(dir + "/grad_k.npy", {B, H, T, D}, dk) &&
            write_npy_f32(dir + "/grad_v.npy", {B, H, T, D}, dv) && write_npy_f32(dir + "/grad_null_logits.npy", {H}, ds);
  std::ofstream(dir + "/attention.json")
      << "{\n  \"op\": \"attention\",\n"
         "  \"inputs\": {\"q\": \"q.npy\", \"k\": \"k.npy\", \"v\": \"v.npy\"},\n"
         "  \"outputs\": {\"out\": \"out.npy\", \"lse\": \"lse.npy\", \"p_null\": \"p_null.npy\"},\n"
         "  \"options\": {\"normalizer\": \"softmax1\", \"causal\": true}\n}\n";
  std::ofstream(dir + "/psi.json")
      << "{\n  \"op\": \"psi\",\n  \"inputs\": {\"p_null\": \"p_null.npy\"},\n  \"outputs\": {\"psi\": \"psi.npy\"}\n}\n";
  std::ofstream(dir + "/attention_backward.json")
      << "{\n  \"op\": \"attention_backward\",\n"
         "  \"inputs\": {\"q\": \"q.npy\", \"k\": \"k.npy\", \"v\": \"v.npy\", \"grad_out\": \"grad_out.npy\"},\n"
         "  \"outputs\": {\"grad_q\": \"grad_q.npy\", \"grad_k\": \"grad_k.npy\", \"grad_v\": \"grad_v.npy\",\n"
         "              \"grad_null_logits\": \"grad_null_logits.npy\"},\n"
         "  \"options\": {\"normalizer\": \"softmax1\", \"causal\": true}\n}\n";
  if (!ok) {
    std::fprintf(stderr, "producer: cannot write to %s\n", dir.c_str());
    return 1;
  }
  std::printf("wrote q, k, v, out, lse, p_null, psi, grad_* (.npy) and attention.json, psi.json, attention_backward.json to %s%s\n",
              dir.c_str(),
              mistake.empty() ? "" : (" (mistake: " + mistake + ")").c_str());
  return 0;
}
