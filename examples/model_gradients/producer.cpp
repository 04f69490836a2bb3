// examples/model_gradients/producer.cpp — the files a training implementation writes for the
// model-level gradient check of `oasis-verify compare` (docs/verify-model.md, "Model gradients").
//
//   producer OUTDIR [--mistake theta-buffer|loss-scale]
//
// A tiny OASIS model (Kimi Full AttnRes, coupling, 2 blocks) in float32: OUTDIR/model.safetensors
// (oasis::model::save_model: weights and configuration), OUTDIR/tensors.safetensors with the token
// ids, the incoming gradient of the logits `grad_logits` (here of L = sum(logits * R) for a fixed
// random R; in training, dL/dlogits of the real loss) and the parameter gradients `grad.<name>`,
// and OUTDIR/model_grad.json. The gradients stand in for a training framework's `.grad` after
// backward(); this producer takes them from the oracle's float32 backward, then applies the mistake:
//
// --mistake theta-buffer  the coupling parameters theta were registered as buffers, not as
//                         parameters: they get no gradient (zeros), everything else is right.
// --mistake loss-scale    the gradients come from the loss divided by the number of tokens, but
//                         grad_logits was dumped before that scaling: every gradient is off by 1/N.
#include <cstdio>
#include <cstring>
#include <string>

#include "oasis/grad/model_backward.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"

int main(int argc, char** argv) {
  namespace om = oasis::model;
  namespace io = oasis::io;
  if (argc < 2 || (argc != 2 && !(argc == 4 && std::strcmp(argv[2], "--mistake") == 0))) {
    std::fprintf(stderr, "usage: %s OUTDIR [--mistake theta-buffer|loss-scale]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], mistake = argc == 4 ? argv[3] : "";
  if (!mistake.empty() && mistake != "theta-buffer" && mistake != "loss-scale") {
    std::fprintf(stderr, "unknown mistake '%s' (expected theta-buffer or loss-scale)\n", mistake.c_str());
    return 2;
  }
  om::ModelConfig cfg;  // vocab 32, d 16, 2 blocks, 2 heads, d_ff 32, OASIS, Kimi Full, final AttnRes readout
  cfg.init_std = 0.3;
  om::Model<float> m = om::Model<float>::initialized(cfg, 7);
  // trained-looking routers: non-zero pseudo-queries and theta away from its initial -5
  for (const om::ParamSpec& p : om::parameter_specs(cfg)) {
    const std::string& n = p.name;
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".query") == 0) {
      oasis::Tensor<float> q(p.shape);
      for (oasis::index_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>((i * 7 + n.size()) % 9) - 1.0f;
      m.set_param(n, q);
    }
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".theta") == 0) m.set_param(n, oasis::Tensor<float>({1}, {0.5f}));
  }
  const oasis::index_t B = 1, T = 6, V = cfg.vocab_size;
  const std::vector<oasis::index_t> ids = {3, 14, 15, 9, 26, 5};
  oasis::Tensor<float> dl({B, T, V});  // dL/dlogits of L = sum(logits * R)
  for (oasis::index_t i = 0; i < dl.size(); ++i) dl[i] = static_cast<float>((i * 37) % 23) / 11.0f - 1.0f;
  const om::ModelGrads<float> g = om::model_backward(m, ids, B, T, dl);

  io::TensorMap out;
  oasis::Tensor<double> idt({B, T});
  for (oasis::index_t i = 0; i < T; ++i) idt[i] = static_cast<double>(ids[static_cast<std::size_t>(i)]);
  out["ids"] = {io::DType::f32, idt};
  out["grad_logits"] = {io::DType::f32, dl.cast<double>()};
  for (const auto& [name, t] : g.params) {
    oasis::Tensor<double> v = t.cast<double>();
    if (mistake == "theta-buffer" && name.size() > 6 && name.compare(name.size() - 6, 6, ".theta") == 0)
      v = oasis::Tensor<double>(v.shape());
    if (mistake == "loss-scale")
      for (oasis::index_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(static_cast<float>(v[i]) / static_cast<float>(B * T));
    out["grad." + name] = {io::DType::f32, v};
  }
  om::save_model(m, dir + "/model.safetensors");
  io::write_safetensors(dir + "/tensors.safetensors", out);
  std::FILE* f = std::fopen((dir + "/model_grad.json").c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s/model_grad.json\n", dir.c_str());
    return 2;
  }
  std::fprintf(f, "{\"op\": \"model\", \"model\": \"model.safetensors\", \"inputs\": \"tensors.safetensors\", "
                  "\"outputs\": \"tensors.safetensors\"}\n");
  std::fclose(f);
  std::printf("wrote %s/model.safetensors, %s/tensors.safetensors (%zu gradient tensors), %s/model_grad.json\n",
              dir.c_str(), dir.c_str(), g.params.size(), dir.c_str());
  return 0;
}
