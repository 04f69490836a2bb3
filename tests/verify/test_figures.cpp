// tests/verify/test_figures.cpp — the figures of a model trace (oasis/verify/figures.hpp and
// `oasis-verify figures`): every CSV number equals the library's metric computed here on the same
// trace tensors (null_mass, kurtosis_regularised, max_inf_norm, sink_rate on the forward's own
// attention probabilities, means of alpha and psi); a trace without a figure's tensor leaves that
// figure out and names the tensor; bad paths and an unwritable output folder are named errors
// (CLI exit 2); the CLI writes each PNG with its CSV beside it (skipped without matplotlib).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>

#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/wiring.hpp"
#include "oasis/research/metrics.hpp"
#include "oasis/verify/figures.hpp"

#ifndef OASIS_VERIFY_CLI
#error "OASIS_VERIFY_CLI must name the oasis-verify executable"
#endif

namespace fs = std::filesystem;
namespace io = oasis::io;
namespace om = oasis::model;
using oasis::index_t;
using oasis::Tensor;

namespace {

struct Case {
  om::ModelConfig cfg;
  om::Model<double> model;
  om::ForwardResult<double> fwd;  // with the attention probabilities
  io::TensorMap trace;
};

Case make_case() {
  om::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_blocks = 3;
  c.n_heads = 2;
  c.d_ff = 12;
  c.init_std = 0.5;
  om::Model<double> m = om::Model<double>::initialized(c, 5);
  for (const om::ParamSpec& p : om::parameter_specs(c))
    if (p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, ".query") == 0) {
      Tensor<double> q(p.shape);
      for (index_t i = 0; i < q.size(); ++i) q[i] = 0.3 * static_cast<double>((i * 5 + p.name.size()) % 7) - 0.9;
      m.set_param(p.name, q);
    }
  const index_t B = 2, T = 9;
  std::vector<index_t> ids;
  for (index_t i = 0; i < B * T; ++i) ids.push_back(i % T == 0 ? 1 : (i * 7 + 2) % c.vocab_size);
  om::ForwardOptions fo;
  fo.trace = true;
  fo.trace_probs = true;
  om::ForwardResult<double> r = m.forward(ids, B, T, fo);
  io::TensorMap tr = om::trace_tensors(r, io::DType::f64);
  return {c, std::move(m), std::move(r), std::move(tr)};
}

/// The rows of <dir>/<name>.csv (header first), split at commas (the test's cells hold none).
std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << p;
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(f, line);) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    rows.push_back(cells);
  }
  return rows;
}

double mean(const Tensor<double>& x, index_t first, index_t n) {
  double s = 0;
  for (index_t i = first; i < first + n; ++i) s += x[i];
  return s / static_cast<double>(n);
}

std::string tmp(const std::string& leaf) {
  const fs::path d = fs::path(::testing::TempDir()) / ("oasis_figures_" + std::to_string(::getpid()) + "_" + leaf);
  fs::remove_all(d);
  return d.string();
}

int run(const std::string& args, std::string* out = nullptr) {
  const std::string log = tmp("cli.log");
  const int st = std::system(("\"" OASIS_VERIFY_CLI "\" " + args + " > \"" + log + "\" 2>&1").c_str());
  if (out) {
    std::ifstream f(log);
    *out = std::string(std::istreambuf_iterator<char>(f), {});
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(Figures, CsvNumbersAreTheLibraryMetrics) {
  const Case k = make_case();
  const std::string dir = tmp("metrics");
  const oasis::verify::FigureSet set = oasis::verify::model_figures(k.cfg, k.trace);
  EXPECT_TRUE(set.left_out.empty()) << set.left_out.front();
  ASSERT_EQ(set.figures.size(), 5u);
  oasis::verify::write_figure_tables(set, dir);
  ASSERT_TRUE(fs::exists(fs::path(dir) / "figures.json"));
  auto num = [](const std::string& s) { return std::strtod(s.c_str(), nullptr); };
  const om::ModelWiring w = om::model_wiring(k.cfg);

  // the trace of sublayer `name` in the forward
  auto sub = [&](const std::string& name) -> const om::SublayerTrace<double>& {
    for (const auto& t : k.fwd.trace)
      if (t.name == name) return t;
    throw std::runtime_error("no sublayer " + name);
  };
  const auto nm = read_csv(fs::path(dir) / "null_mass.csv");
  ASSERT_EQ(nm.size(), 1u + static_cast<std::size_t>(k.cfg.n_blocks * k.cfg.n_heads));
  for (std::size_t r = 1; r < nm.size(); ++r) {
    const index_t b = std::stoll(nm[r][0]), h = std::stoll(nm[r][1]);
    const Tensor<double>& p = sub("layers." + std::to_string(b) + ".attn").p_null;
    Tensor<double> one({p.dim(0), 1, p.dim(2)});
    for (index_t bb = 0; bb < p.dim(0); ++bb)
      for (index_t t = 0; t < p.dim(2); ++t) one(bb, 0, t) = p(bb, h, t);
    EXPECT_EQ(num(nm[r][2]), oasis::null_mass(one)) << "layer " << b << " head " << h;
  }
  const auto dw = read_csv(fs::path(dir) / "depth_weights.csv");
  std::size_t row = 1;
  for (const auto& router : w.routers) {
    const om::SublayerTrace<double>* tr = nullptr;
    for (const auto& t : k.fwd.trace)
      if (t.name == router.trace && t.has_route) tr = &t;
    ASSERT_TRUE(tr) << router.trace;
    const index_t n = tr->alpha.dim(0), N = tr->alpha.size() / n;
    for (index_t i = 0; i < n; ++i, ++row) {
      ASSERT_LT(row, dw.size());
      EXPECT_EQ(dw[row][0], router.trace);
      EXPECT_EQ(num(dw[row][2]), mean(tr->alpha, i * N, N)) << router.trace << " source " << i;
    }
    ASSERT_LT(row, dw.size());
    EXPECT_EQ(dw[row][1], "null");
    EXPECT_EQ(num(dw[row++][2]), mean(tr->alpha_null, 0, tr->alpha_null.size())) << router.trace;
  }
  EXPECT_EQ(row, dw.size());
  const auto psi = read_csv(fs::path(dir) / "psi.csv");
  const auto sinks = read_csv(fs::path(dir) / "sink_rate.csv");
  ASSERT_EQ(psi.size(), 1u + static_cast<std::size_t>(k.cfg.n_blocks));
  ASSERT_EQ(sinks.size(), psi.size());
  for (index_t b = 0; b < k.cfg.n_blocks; ++b) {
    const auto& t = sub("layers." + std::to_string(b) + ".attn");
    EXPECT_EQ(num(psi[static_cast<std::size_t>(b) + 1][1]), mean(t.branch_psi, 0, t.branch_psi.size()));
    EXPECT_EQ(num(sinks[static_cast<std::size_t>(b) + 1][1]), oasis::sink_rate(std::vector{t.attn_probs})) << "layer " << b;
  }
  const auto out = read_csv(fs::path(dir) / "outliers.csv");
  ASSERT_EQ(out.size(), 1u + w.sublayers.size());
  for (std::size_t l = 0; l < w.sublayers.size(); ++l) {
    const Tensor<double>& x = sub(w.sublayers[l].name).input;
    EXPECT_EQ(out[l + 1][0], w.sublayers[l].name);
    EXPECT_EQ(num(out[l + 1][1]), oasis::kurtosis_regularised(x)) << w.sublayers[l].name;
    EXPECT_EQ(num(out[l + 1][2]), oasis::max_inf_norm(x)) << w.sublayers[l].name;
  }
}

TEST(Figures, AFigureWithoutItsTensorIsLeftOutNamingIt) {
  Case k = make_case();
  k.trace.erase("layers.1.attn.p_null");
  k.trace.erase("layers.2.mlp.alpha");
  const oasis::verify::FigureSet set = oasis::verify::model_figures(k.cfg, k.trace);
  ASSERT_EQ(set.left_out.size(), 2u);
  EXPECT_NE(set.left_out[0].find("null_mass: the trace lacks layers.1.attn.p_null"), std::string::npos) << set.left_out[0];
  EXPECT_NE(set.left_out[1].find("depth_weights: the trace lacks layers.2.mlp.alpha"), std::string::npos) << set.left_out[1];
  std::vector<std::string> names;
  for (const auto& f : set.figures) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"psi", "outliers", "sink_rate"}));
  // a tensor of the wrong shape is an input error naming it
  k.trace.at("layers.0.attn.branch_psi").values = Tensor<double>({3});
  try {
    (void)oasis::verify::model_figures(k.cfg, k.trace);
    ADD_FAILURE() << "no error for a mis-shaped tensor";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "layers.0.attn.branch_psi");
  }
}

TEST(Figures, UnwritableFolderIsANamedError) {
  const std::string file = tmp("plainfile");
  std::ofstream(file) << "x";
  try {
    oasis::verify::write_figure_tables(oasis::verify::model_figures(make_case().cfg, make_case().trace), file + "/sub");
    ADD_FAILURE() << "no error for a folder under a file";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/sub"), std::string::npos) << e.what();
  }
}

TEST(Figures, CommandLineWritesEachPngWithItsCsv) {
  const Case k = make_case();
  const std::string dir = tmp("cli");
  fs::create_directories(dir);
  om::save_model(k.model, dir + "/model.safetensors");
  io::write_safetensors(dir + "/trace.safetensors", k.trace);
  std::string log;
  const std::string plain = tmp("plainfile2");
  std::ofstream(plain) << "x";
  EXPECT_EQ(run("figures " + dir + "/nonexistent.safetensors " + dir + "/trace.safetensors --out " + dir + "/o", &log), 2) << log;
  EXPECT_NE(log.find("nonexistent.safetensors"), std::string::npos) << log;
  EXPECT_EQ(run("figures " + dir + "/model.safetensors " + dir + "/missing.safetensors --out " + dir + "/o", &log), 2) << log;
  EXPECT_NE(log.find("missing.safetensors"), std::string::npos) << log;
  EXPECT_EQ(run("figures " + dir + "/model.safetensors " + dir + "/trace.safetensors --out " + plain + "/o", &log), 2) << log;
  EXPECT_NE(log.find(plain + "/o"), std::string::npos) << log;
  EXPECT_EQ(run("figures " + dir + "/model.safetensors", &log), 2) << log;
  if (std::system("/usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-matplotlib is not installed (scripts/install-deps.sh --test): PNGs not drawn";
  ASSERT_EQ(run("figures " + dir + "/model.safetensors " + dir + "/trace.safetensors --out " + dir + "/out", &log), 0) << log;
  for (const char* name : {"null_mass", "depth_weights", "psi", "outliers", "sink_rate"}) {
    const fs::path png = fs::path(dir) / "out" / (std::string(name) + ".png");
    ASSERT_TRUE(fs::exists(png)) << png << "\n" << log;
    EXPECT_GT(fs::file_size(png), 5000u) << png;
    EXPECT_LT(fs::file_size(png), 200000u) << png;
    EXPECT_TRUE(fs::exists(fs::path(dir) / "out" / (std::string(name) + ".csv"))) << name;
    std::ifstream f(png, std::ios::binary);
    char sig[8] = {};
    f.read(sig, 8);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG") << png;
  }
  // the same CSVs as the library writes directly
  const std::string direct = tmp("direct");
  oasis::verify::write_figure_tables(oasis::verify::model_figures(k.cfg, io::read_safetensors(dir + "/trace.safetensors")),
                                     direct);
  for (const char* name : {"null_mass.csv", "outliers.csv", "figures.json"}) {
    std::ifstream a(fs::path(dir) / "out" / name), b(fs::path(direct) / name);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {})) << name;
  }
}

}  // namespace
