// tests/verify/trace_producer.cpp — a model and its float32 trace for the HTML report and figure
// tests (test_report_html.py, test_figures.cpp) and the figures of docs/report.md.
//
//   trace_producer OUTDIR [--mistake mlp] [--tokens T] [--blocks N]
//
// The tiny AttnRes model of examples/python (vocab 16, d 8, 2 heads, d_ff 12, OASIS, Kimi Full,
// final AttnRes readout, rotate_half RoPE; N transformer blocks, default 2) with weights
// N(0, 0.3^2), non-zero pseudo-queries and theta = 0.5, so that routing and coupling act:
// OUTDIR/model.safetensors (oasis::model::save_model), OUTDIR/trace.safetensors (the ids [1, T]
// and every trace tensor of the library's float32 forward) and OUTDIR/model.json (op model).
// --mistake mlp moves layers.0.mlp.output by a relative 1e-3: the model level names it first.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"

int main(int argc, char** argv) {
  namespace om = oasis::model;
  namespace io = oasis::io;
  using oasis::index_t;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUTDIR [--mistake mlp] [--tokens T] [--blocks N]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::string mistake;
  index_t T = 12, blocks = 2;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mistake") == 0) mistake = argv[i + 1];
    else if (std::strcmp(argv[i], "--tokens") == 0) T = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--blocks") == 0) blocks = std::atoi(argv[i + 1]);
    else return std::fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  if ((argc % 2) != 0 || (!mistake.empty() && mistake != "mlp") || T < 1 || blocks < 1) {
    std::fprintf(stderr, "bad arguments (--mistake mlp, --tokens T >= 1, --blocks N >= 1)\n");
    return 2;
  }
  om::ModelConfig cfg;
  cfg.vocab_size = 16;
  cfg.d_model = 8;
  cfg.n_blocks = blocks;
  cfg.n_heads = 2;
  cfg.d_ff = 12;
  cfg.rope = om::RopeLayout::rotate_half;
  cfg.init_std = 0.3;
  om::Model<float> m = om::Model<float>::initialized(cfg, 11);
  for (const om::ParamSpec& p : om::parameter_specs(cfg)) {
    const std::string& n = p.name;
    auto ends = [&](const char* s) { return n.size() >= std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0; };
    if (ends(".query")) {
      oasis::Tensor<float> q(p.shape);
      for (index_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>((i * 7 + n.size()) % 9) - 1.0f;
      m.set_param(n, q);
    }
    if (ends(".theta")) m.set_param(n, oasis::Tensor<float>({1}, {0.5f}));
  }
  std::vector<index_t> ids(static_cast<std::size_t>(T));
  for (index_t t = 0; t < T; ++t) ids[static_cast<std::size_t>(t)] = t == 0 ? 1 : (t * 5 + 3) % cfg.vocab_size;
  om::ForwardOptions fo;
  fo.trace = true;
  io::TensorMap out = om::trace_tensors(m.forward(ids, 1, T, fo), io::DType::f32);
  oasis::Tensor<double> idt({1, T});
  for (index_t t = 0; t < T; ++t) idt[t] = static_cast<double>(ids[static_cast<std::size_t>(t)]);
  out["ids"] = {io::DType::f32, idt};
  if (mistake == "mlp") {
    oasis::Tensor<double>& x = out.at("layers.0.mlp.output").values;
    for (index_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(static_cast<float>(x[i] * (1 + 1e-3)));
  }
  om::save_model(m, dir + "/model.safetensors");
  io::write_safetensors(dir + "/trace.safetensors", out);
  std::FILE* f = std::fopen((dir + "/model.json").c_str(), "w");
  if (!f) return std::fprintf(stderr, "cannot write %s/model.json\n", dir.c_str()), 2;
  std::fprintf(f, "{\"op\": \"model\", \"model\": \"model.safetensors\", \"inputs\": \"trace.safetensors\", "
                  "\"outputs\": \"trace.safetensors\"}\n");
  std::fclose(f);
  std::printf("wrote %s/model.safetensors, %s/trace.safetensors (%zu tensors), %s/model.json\n", dir.c_str(), dir.c_str(),
              out.size(), dir.c_str());
  return 0;
}
