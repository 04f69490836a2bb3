// tests/verify/fuzz_model.cpp — libFuzzer target for the model-weights loader and the compare
// configuration: any input must either load / compare or throw oasis::invalid_argument; never
// crash, hang, read out of bounds (ASan) or allocate beyond what the file holds (a weights file
// declaring 10^9 blocks or a 2^40-row embedding must be refused before anything is allocated).
//   first byte even: the rest is a weights file (safetensors with oasis.* metadata), loaded by
//                    parse_model<double> (what load_model runs on a file's bytes);
//   first byte odd:  the rest is a compare configuration (JSON), run by compare_config against a
//                    directory of small valid tensors and a tiny model written at start-up
//                    (q, k, v, out .npy; model.safetensors, ids.npy, logits.npy; packed, paged and
//                    split-KV tensors with their metadata: cu_q, cu_k, block_table, seq_lens).
// Built with clang++ -fsanitize=fuzzer,address against the project's libraries
// (tests/verify/CMakeLists.txt, scripts/fuzz-loaders.sh).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "oasis/io/json.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/verify/compare.hpp"

namespace {
std::string g_dir;  // the tensors the configurations may name

void write_fixture() {
  namespace oio = oasis::io;
  namespace om = oasis::model;
  g_dir = (std::filesystem::temp_directory_path() / ("oasis_fuzz_model_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(g_dir);
  const oasis::Tensor<double> qkv({1, 1, 2, 4}, 0.25);
  for (const char* n : {"q", "k", "v", "out"}) oio::write_npy(g_dir + "/" + n + ".npy", oio::StoredTensor{oio::DType::f32, qkv});
  om::ModelConfig cfg;
  cfg.vocab_size = 4;
  cfg.d_model = 4;
  cfg.n_blocks = 1;
  cfg.d_ff = 4;
  om::save_model(om::Model<double>::initialized(cfg, 1), g_dir + "/model.safetensors");
  oio::write_npy(g_dir + "/ids.npy", oio::StoredTensor{oio::DType::i64, oasis::Tensor<double>({1, 2}, 1.0)});
  oio::write_npy(g_dir + "/logits.npy", oio::StoredTensor{oio::DType::f32, oasis::Tensor<double>({1, 2, 4}, 0.0)});
  // packed (THD) and paged layouts, split-KV partials: metadata the configurations may misuse
  auto f32 = [&](const char* n, oasis::Shape s) { oio::write_npy(g_dir + "/" + n, oio::StoredTensor{oio::DType::f32, oasis::Tensor<double>(s, 0.5)}); };
  auto i32 = [&](const char* n, oasis::Shape s, std::vector<double> v) {
    oio::write_npy(g_dir + "/" + n, oio::StoredTensor{oio::DType::i32, oasis::Tensor<double>(std::move(s), std::move(v))});
  };
  f32("q_packed.npy", {3, 1, 4});
  f32("kv_packed.npy", {4, 1, 4});
  f32("out_packed.npy", {3, 1, 4});
  i32("cu_q.npy", {3}, {0, 1, 3});
  i32("cu_k.npy", {3}, {0, 2, 4});
  f32("kv_cache.npy", {2, 2, 1, 4});
  i32("block_table.npy", {1, 2}, {0, 1});
  i32("seq_lens.npy", {1}, {3});
  f32("out_parts.npy", {2, 1, 1, 2, 4});
  f32("lse_parts.npy", {2, 1, 1, 2});
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  write_fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace om = oasis::model;
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      (void)om::parse_model<double>(body, "fuzz.safetensors");
    } else {
      oasis::io::json::Value cfg = oasis::io::json::parse(body);
      oasis::verify::CompareOptions opt;
      opt.oracle = oasis::verify::Oracle::fast;
      (void)oasis::verify::compare_config(cfg, g_dir, "", opt);
    }
  } catch (const oasis::invalid_argument&) {
  } catch (const oasis::io::json::parse_error&) {
  }
  return 0;
}
