// Model family: safetensors save/load of Model<T> . Save then load reproduces every
// weight and the logits bit for bit (float as F32, double as F64); a missing, mis-shaped,
// non-finite or unexpected tensor is an error naming it; renaming maps external names in.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <cstdio>
#include <string>

#include "model_test_util.hpp"
#include "oasis/model/io.hpp"

namespace om = oasis::model;
namespace oio = oasis::io;
using oasis::index_t;
using oasis::Tensor;
using oasis::Variant;
using oasis::model_test::random_model;
using oasis::model_test::tiny;
using oasis::model_test::tokens;
using oasis::test::exactly_equal;
using oasis::test::thrown_argument;

namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "oasis_model_" + name + ".safetensors"; }

template <class T>
void round_trip(const om::ModelConfig& cfg, std::uint64_t seed) {
  const auto m = random_model<double>(cfg, seed).template cast<T>();
  const std::string path = temp_path(std::string(om::to_string(cfg.router)) + typeid(T).name());
  om::save_model(m, path);
  const auto file = oio::read_safetensors(path);
  for (const auto& [name, st] : file)
    EXPECT_EQ(st.dtype, (std::is_same_v<T, float> ? oio::DType::f32 : oio::DType::f64)) << name;
  const auto back = om::load_model<T>(path);  // configuration from the metadata
  EXPECT_EQ(om::config_metadata(back.config()), om::config_metadata(m.config()));
  ASSERT_EQ(back.parameters().size(), m.parameters().size());
  for (const auto& [name, t] : m.parameters()) EXPECT_TRUE(exactly_equal(name, back.param(name), t));
  const auto ids = tokens(5, seed, cfg.vocab_size);
  EXPECT_TRUE(exactly_equal("logits", back.forward(ids, 1, 5).logits, m.forward(ids, 1, 5).logits));
  std::remove(path.c_str());
}

}  // namespace

TEST(ModelIo, SaveThenLoadIsBitExact) {
  std::uint64_t seed = 500;
  for (om::RouterFamily r : {om::RouterFamily::kimi_full, om::RouterFamily::kimi_block, om::RouterFamily::authors_code})
    for (Variant v : {Variant::original, Variant::oasis}) {
      om::ModelConfig c = tiny(v, r, 2);
      c.key_norm_gain = r == om::RouterFamily::kimi_block;
      c.qk_norm = r == om::RouterFamily::kimi_full;
      c.n_kv_heads = 1;
      round_trip<float>(c, seed++);
      round_trip<double>(c, seed++);
    }
}

TEST(ModelIo, MissingMisShapedNonFiniteAndUnexpectedTensorsAreNamed) {
  const om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  const auto m = random_model<double>(c, 600);
  const std::string path = temp_path("bad");
  om::save_model(m, path);
  const oio::TensorMap good = oio::read_safetensors(path);
  const auto meta = om::config_metadata(c);
  auto write_and_load = [&](const oio::TensorMap& t) {
    oio::write_safetensors(path, t, meta);
    return thrown_argument([&] { om::load_model<double>(path); });
  };
  for (const std::string name : {"layers.1.mlp_res.query", "lm_head.weight", "layers.0.attn.k_proj.weight"}) {
    oio::TensorMap t = good;
    ASSERT_EQ(t.erase(name), 1u);
    EXPECT_EQ(write_and_load(t), name) << "missing";
    t = good;
    t[name].values = Tensor<double>({3, 1});
    EXPECT_EQ(write_and_load(t), name) << "mis-shaped";
    t = good;
    t[name].values[0] = std::nan("");
    EXPECT_EQ(write_and_load(t), name) << "non-finite";
  }
  oio::TensorMap extra = good;
  extra["layers.9.attn.q_proj.weight"] = oio::StoredTensor{oio::DType::f64, Tensor<double>({2, 2})};
  EXPECT_EQ(write_and_load(extra), "layers.9.attn.q_proj.weight");
  // The one configuration field without a default is named when missing.
  auto m2 = meta;
  m2.erase("oasis.n_heads");
  oio::write_safetensors(path, good, m2);
  EXPECT_EQ(thrown_argument([&] { om::load_model<double>(path); }), "oasis.n_heads");
  std::remove(path.c_str());
}

// External names map in: a file with Hugging Face style "model." prefixes loads through `rename`.
TEST(ModelIo, RenameMapsExternalNames) {
  const om::ModelConfig c = tiny(Variant::aos, om::RouterFamily::kimi_block, 2);
  const auto m = random_model<double>(c, 700);
  oio::TensorMap ext;
  std::map<std::string, std::string> rename;
  for (const auto& [name, t] : m.parameters()) {
    ext["model." + name] = oio::StoredTensor{oio::DType::f64, t};
    rename["model." + name] = name;
  }
  const std::string path = temp_path("rename");
  oio::write_safetensors(path, ext);
  const auto back = om::load_model<double>(c, path, rename);
  for (const auto& [name, t] : m.parameters()) EXPECT_TRUE(exactly_equal(name, back.param(name), t));
  EXPECT_EQ(thrown_argument([&] { om::load_model<double>(c, path); }), "embed_tokens.weight");  // no rename: missing
  std::remove(path.c_str());
}

// A hand-written file needs only the keys that differ from the defaults: the sizes come from the
// tensor shapes, every convention from ModelConfig's defaults (docs/model.md); an unknown
// "oasis." key is an error listing the known ones, a malformed value names its key.
TEST(ModelIo, MetadataNeedsOnlyWhatDiffersFromTheDefaults) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  c.block_sizes = {2, 2, 1, 1};
  c.n_kv_heads = 1;
  c.d_head = 6;
  c.norm_float32 = true;
  c.key_norm_gain = true;
  const auto m = random_model<double>(c, 800);
  const std::string path = temp_path("minimal");
  oio::TensorMap t;
  for (const auto& [name, v] : m.parameters()) t[name] = oio::StoredTensor{oio::DType::f64, v};
  const std::map<std::string, std::string> minimal = {
      {"oasis.n_heads", "2"}, {"oasis.router", "kimi_block"}, {"oasis.block_sizes", "2,2,1,1"}, {"oasis.authors_rank", "4"},
      {"oasis.norm_float32", "1"}, {"oasis.key_norm_gain", "1"}, {"format", "pt"}};  // a foreign key is ignored
  oio::write_safetensors(path, t, minimal);
  const auto back = om::load_model<double>(path);
  EXPECT_EQ(om::config_metadata(back.config()), om::config_metadata(c));  // sizes 11, 8, 3 blocks, d_ff 12, H_kv 1, d_h 6
  for (const auto& [name, v] : m.parameters()) EXPECT_TRUE(exactly_equal(name, back.param(name), v));
  // save_model writes every key, and block_sizes round-trips
  om::save_model(m, path);
  EXPECT_EQ(om::load_model<double>(path).config().block_sizes, c.block_sizes);
  auto with = [&](const std::string& k, const std::string& v) {
    auto md = minimal;
    md[k] = v;
    oio::write_safetensors(path, t, md);
    try {
      om::load_model<double>(path);
    } catch (const oasis::invalid_argument& e) {
      return std::make_pair(e.argument(), std::string(e.what()));
    }
    return std::make_pair(std::string("(no error)"), std::string());
  };
  auto [arg, what] = with("oasis.rope_layout", "interleaved");
  EXPECT_EQ(arg, "oasis.rope_layout");
  EXPECT_NE(what.find("oasis.rope,"), std::string::npos) << what;
  EXPECT_EQ(with("oasis.block_sizes", "2,x").first, "oasis.block_sizes");
  EXPECT_EQ(with("oasis.block_sizes", "2,2,1").first, "oasis.block_sizes");  // sums to 5, the model has 6 sublayers
  EXPECT_EQ(with("oasis.norm_float32", "yes").first, "oasis.norm_float32");
  EXPECT_EQ(with("oasis.format", "oasis-model-9").first, "oasis.format");
  std::remove(path.c_str());
}

// Hostile metadata: sizes far beyond what the file holds are refused naming their key, before
// any parameter is allocated or the parameter list is built (a file of a few KB declaring 10^9
// blocks or a 2^40-row embedding); products that overflow index_t are refused by validate();
// weights stored as integers are refused naming the tensor. Time and memory of these refusals
// are bounded in tests/verify/test_hostile.cpp, which runs the CLI under rlimits.
TEST(ModelIo, SizesBeyondTheFileAreRefusedBeforeAllocation) {
  const om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  const auto m = random_model<double>(c, 900);
  const std::string path = temp_path("hostile");
  om::save_model(m, path);
  const oio::TensorMap good = oio::read_safetensors(path);
  const auto meta = om::config_metadata(c);
  auto with = [&](std::map<std::string, std::string> changes) {
    auto md = meta;
    for (const auto& [k, v] : changes) md[k] = v;
    oio::write_safetensors(path, good, md);
    return thrown_argument([&] { om::load_model<double>(path); });
  };
  const std::string p40 = std::to_string(std::int64_t(1) << 40), p62 = std::to_string(std::int64_t(1) << 62);
  EXPECT_EQ(with({{"oasis.n_blocks", "1000000000"}}), "oasis.n_blocks");
  EXPECT_EQ(with({{"oasis.n_blocks", "100000"}}), "oasis.n_blocks");
  EXPECT_EQ(with({{"oasis.n_blocks", "9223372036854775807"}}), "oasis.n_blocks");  // 2 n_blocks overflows: validate()
  EXPECT_EQ(with({{"oasis.vocab_size", p40}}), "oasis.vocab_size");
  EXPECT_EQ(with({{"oasis.d_ff", p62}}), "oasis.d_ff");  // d_ff d_model overflows: validate()
  EXPECT_EQ(with({{"oasis.d_ff", p40}}), "oasis.d_ff");
  EXPECT_EQ(with({{"oasis.vocab_size", p40}, {"oasis.d_model", p40}}), "oasis.vocab_size");
  EXPECT_EQ(with({{"oasis.d_head", p40}}), "oasis.d_head");
  EXPECT_EQ(with({{"oasis.d_model", p62}, {"oasis.d_head", "2"}}), "oasis.vocab_size");
  EXPECT_EQ(with({{"oasis.block_sizes", p62 + "," + p62}, {"oasis.router", "kimi_block"}}), "oasis.block_sizes");
  // n_heads far beyond the file with grouped kv heads to derive: no overflow in the derivation
  // (the sanitizer lane's UBSan would report one), the inconsistency is named.
  {
    om::ModelConfig g = c;
    g.n_kv_heads = 1;
    oio::TensorMap gt;
    const auto gm = random_model<double>(g, 901);
    for (const auto& [name, v] : gm.parameters()) gt[name] = oio::StoredTensor{oio::DType::f64, v};
    auto md = om::config_metadata(g);
    md.erase("oasis.n_kv_heads");
    md.erase("oasis.d_head");
    md["oasis.n_heads"] = p62;
    oio::write_safetensors(path, gt, md);
    EXPECT_EQ(thrown_argument([&] { om::load_model<double>(path); }), "oasis.d_head");
  }
  // Weights stored as integers: named (the shapes are right).
  oio::TensorMap ints = good;
  Tensor<double> zeros(ints.at("norm.weight").values.shape());
  ints["norm.weight"] = oio::StoredTensor{oio::DType::i64, zeros};
  oio::write_safetensors(path, ints, meta);
  EXPECT_EQ(thrown_argument([&] { om::load_model<double>(path); }), "norm.weight");
  // A configuration given apart from the file: the first declared tensor the file lacks or
  // holds with another shape is named, without building the parameters (or their list) first.
  om::ModelConfig big = c;
  big.n_blocks = 1000000000;
  EXPECT_EQ(thrown_argument([&] { om::model_from_tensors<double>(big, good, path); }), "layers.2.attn_res.query");
  big = c;
  big.vocab_size = std::int64_t(1) << 40;
  EXPECT_EQ(thrown_argument([&] { om::model_from_tensors<double>(big, good, path); }), "embed_tokens.weight");
  EXPECT_EQ(thrown_argument([&] { om::model_from_tensors<double>(c, oio::TensorMap{}, path); }), "embed_tokens.weight");
  std::remove(path.c_str());
}

// Tensor(Shape) counts its elements with overflow-checked products: a shape whose product
// overflows index_t is an error naming the shape, not undefined behaviour or a wrapped size.
TEST(ModelIo, TensorShapeProductsAreOverflowChecked) {
  const index_t p40 = index_t(1) << 40;
  EXPECT_EQ(thrown_argument([&] { Tensor<double> t({p40, p40}); }), "shape");
  EXPECT_EQ(thrown_argument([&] { Tensor<double> t({p40, p40, 0}); }), "shape");
  EXPECT_EQ(thrown_argument([&] { Tensor<double> t({2, -1}); }), "shape");
  EXPECT_EQ(oasis::shape_numel({p40, 0}), 0);
  EXPECT_EQ(oasis::shape_numel({3, 5, 7}), 105);
}
