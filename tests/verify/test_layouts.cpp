// tests/verify/test_layouts.cpp — ops attention and attention_backward on packed (THD) and paged
// tensors (docs/verify.md, "Packed (THD) and paged layouts"): correct float kernels (the float
// references of oasis/ops/varlen.hpp and oasis/ops/paged.hpp) PASS with every packed element
// counted; the mistakes real packed and paged kernels make FAIL, their first mismatch named at a
// packed index where the kernel is wrong (no later than its first gross error); hostile metadata is
// an input error naming the tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "oasis/io/json.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/ops/paged.hpp"
#include "oasis/ops/varlen.hpp"
#include "oasis/verify/compare.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
using oasis::AttentionOptions;
using oasis::AttentionResult;
using oasis::index_t;
using oasis::Shape;
using oasis::Tensor;

namespace {

io::StoredTensor f32(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }
io::StoredTensor i32(const std::vector<index_t>& v) {
  Tensor<double> t({static_cast<index_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<index_t>(i)] = static_cast<double>(v[i]);
  return {io::DType::i32, t};
}
io::StoredTensor i64(const Tensor<index_t>& v) { return {io::DType::i64, v.cast<double>()}; }

Tensor<float> randn(Shape s, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Tensor<float> t(std::move(s));
  for (index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(nd(rng));
  return t;
}

// --- packed ------------------------------------------------------------------------------------

/// Four sequences: decode-like (5 queries, 9 keys), no queries, equal (17), no keys; GQA 2:1.
struct Thd {
  std::vector<index_t> cu_q{0, 5, 5, 22, 25}, cu_k{0, 9, 15, 32, 32};
  index_t H = 4, H_kv = 2, d = 16;
  Tensor<float> q, k, v;
  AttentionOptions opt;
  std::string options = R"({"layout": "thd", "causal": true, "null_logits": [0.5, -1, 0, 2]})";
  explicit Thd(std::uint64_t seed = 1) {
    std::mt19937_64 rng(seed);
    q = randn({25, H, d}, rng);
    k = randn({32, H_kv, d}, rng);
    v = randn({32, H_kv, d}, rng);
    opt.causal = true;
    opt.null_logits = {0.5, -1, 0, 2};
  }
  io::TensorMap inputs() const {
    return {{"q", f32(q)}, {"k", f32(k)}, {"v", f32(v)}, {"cu_seqlens_q", i32(cu_q)}, {"cu_seqlens_k", i32(cu_k)}};
  }
  AttentionResult<float> forward(const std::vector<index_t>& cuk) const { return oasis::token_attention_varlen(q, k, v, cu_q, cuk, opt); }
  verify::CompareReport check(const AttentionResult<float>& r) const {
    return verify::check("attention", inputs(), {{"out", f32(r.out)}, {"lse", f32(r.lse)}, {"p_null", f32(r.p_null)}},
                         io::json::parse(options));
  }
};

const verify::TensorReport& tensor(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

/// The flat index named by "name[i, j, ...]: ..." in `shape`.
index_t named_flat(const std::string& text, const Shape& shape) {
  const std::size_t open = text.find('['), close = text.find(']');
  std::vector<index_t> ix;
  for (std::size_t at = open + 1; at < close;) {
    std::size_t used = 0;
    ix.push_back(std::stoll(text.substr(at, close - at), &used));
    at += used;
    while (at < close && (text[at] == ',' || text[at] == ' ')) ++at;
  }
  EXPECT_EQ(ix.size(), shape.size()) << text;
  index_t f = 0;
  for (std::size_t a = 0; a < shape.size() && a < ix.size(); ++a) f = f * shape[a] + ix[a];
  return f;
}

/// The report FAILs on `name`, its first mismatch is an element where the kernel differs from the
/// correct result, and none of the kernel's gross errors (|diff| > 1e-3) comes before it.
void expect_named_at_a_wrong_element(const verify::CompareReport& rep, const std::string& name, const Tensor<float>& bad,
                                     const Tensor<float>& good) {
  EXPECT_FALSE(rep.passed) << verify::format_report(rep);
  const verify::TensorReport& t = tensor(rep, name);
  EXPECT_FALSE(t.passed);
  ASSERT_FALSE(t.first_mismatches.empty()) << verify::format_report(rep);
  EXPECT_EQ(t.first_mismatches[0].compare(0, name.size() + 1, name + "["), 0) << t.first_mismatches[0];
  const index_t f = named_flat(t.first_mismatches[0], bad.shape());
  ASSERT_LT(f, bad.size());
  EXPECT_NE(bad[f], good[f]) << t.first_mismatches[0] << " names an element the kernel got right";
  index_t gross = bad.size();
  for (index_t i = 0; i < bad.size() && gross == bad.size(); ++i)
    if (!(std::abs(bad[i] - good[i]) <= 1e-3)) gross = i;
  EXPECT_LE(f, gross) << t.first_mismatches[0] << ": the first gross error is at flat " << gross;
  // the report's worst element (the error map) is named at its packed index too
  ASSERT_FALSE(t.map.worst.empty());
  index_t w = 0;
  for (std::size_t a = 0; a < bad.shape().size(); ++a) w = w * bad.shape()[a] + t.map.worst[0].index[a];
  EXPECT_EQ(static_cast<double>(bad[w]), t.map.worst[0].got) << "the worst element's packed index";
  EXPECT_NE(bad[w], good[w]);
}

TEST(ThdAttention, CorrectKernelPassesWithEveryPackedElementCounted) {
  const Thd c;
  const AttentionResult<float> r = c.forward(c.cu_k);
  const verify::CompareReport rep = c.check(r);
  EXPECT_TRUE(rep.passed) << verify::format_report(rep);
  ASSERT_EQ(rep.tensors.size(), 3u);
  for (const auto& t : rep.tensors) {
    EXPECT_EQ(t.elements, t.name == "out" ? 25 * 4 * 16 : 4 * 25) << t.name;
    EXPECT_EQ(t.checked, t.elements) << t.name;
    EXPECT_EQ(t.shape, t.name == "out" ? (Shape{25, 4, 16}) : (Shape{4, 25})) << t.name;
    EXPECT_FALSE(t.map.empty()) << t.name;
  }
  EXPECT_NE(rep.oracle.find("4 sequences"), std::string::npos) << rep.oracle;
  EXPECT_NE(rep.oracle.find("of 100 rows"), std::string::npos) << rep.oracle << " (the rows of the parts summed)";
  verify::CompareOptions co;
  co.oracle = verify::Oracle::mp50;
  const verify::CompareReport exact = verify::check(
      "attention", c.inputs(), {{"out", f32(r.out)}, {"lse", f32(r.lse)}, {"p_null", f32(r.p_null)}}, io::json::parse(c.options), co);
  EXPECT_TRUE(exact.passed) << verify::format_report(exact);
  EXPECT_EQ(exact.oracle.rfind("mp50", 0), 0u) << exact.oracle;
}

// The same through a configuration file: .npy tensors, the offsets int32 and int64.
TEST(ThdAttention, ThroughAConfigurationFile) {
  const Thd c;
  const AttentionResult<float> r = c.forward(c.cu_k);
  const std::string dir = ::testing::TempDir() + "oasis_layouts_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  io::write_npy(dir + "/q.npy", f32(c.q));
  io::write_npy(dir + "/k.npy", f32(c.k));
  io::write_npy(dir + "/v.npy", f32(c.v));
  io::write_npy(dir + "/cu_q.npy", i32(c.cu_q));
  io::write_npy(dir + "/cu_k.npy", {io::DType::i64, i32(c.cu_k).values});
  io::write_npy(dir + "/out.npy", f32(r.out));
  io::write_npy(dir + "/lse.npy", f32(r.lse));
  std::ofstream(dir + "/c.json") << R"({"op": "attention", "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy",)"
                                 << R"( "cu_seqlens_q": "cu_q.npy", "cu_seqlens_k": "cu_k.npy"}, "outputs": {"out": "out.npy",)"
                                 << R"( "lse": "lse.npy"}, "options": )" << c.options << "}";
  const verify::CompareReport rep = verify::compare_config_file(dir + "/c.json");
  EXPECT_TRUE(rep.passed) << verify::format_report(rep);
  EXPECT_EQ(rep.tensors.size(), 2u);
  std::filesystem::remove_all(dir);
}

// A kernel that writes its statistics dense, [B, H, max_seqlen], read back as the packed [H, total_q].
TEST(ThdAttention, StatisticsReadAsDenseFailAtThePackedIndex) {
  const Thd c;
  const AttentionResult<float> r = c.forward(c.cu_k);
  const index_t B = 4, max_q = 17, total = 25;
  Tensor<float> dense({B, c.H, max_q});
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < c.cu_q[b + 1] - c.cu_q[b]; ++t)
      for (index_t h = 0; h < c.H; ++h) dense(b, h, t) = r.lse(h, c.cu_q[b] + t);
  Tensor<float> bad({c.H, total});
  for (index_t i = 0; i < bad.size(); ++i) bad[i] = dense[i];
  AttentionResult<float> m = r;
  m.lse = bad;
  const verify::CompareReport rep = c.check(m);
  expect_named_at_a_wrong_element(rep, "lse", bad, r.lse);
  EXPECT_TRUE(tensor(rep, "out").passed);
  // given in the dense shape itself, the tensor fails as a whole, naming the packed shape
  m.lse = dense;
  const verify::CompareReport whole = c.check(m);
  EXPECT_TRUE(tensor(whole, "lse").certain_failure);
  EXPECT_NE(tensor(whole, "lse").problem.find("[4, 25]"), std::string::npos) << tensor(whole, "lse").problem;
}

// Causal aligned on packed indices: query at packed row p sees packed key r <= p + total_k - total_q
// of its own sequence, instead of j <= t + Tk_i - Tq_i.
TEST(ThdAttention, CausalAlignedPerPackedIndexFails) {
  const Thd c;
  const AttentionResult<float> good = c.forward(c.cu_k);
  AttentionResult<float> bad = good;
  const index_t total_q = 25, total_k = 32;
  for (index_t i = 0; i < 4; ++i) {
    const index_t q0 = c.cu_q[i], tq = c.cu_q[i + 1] - q0, k0 = c.cu_k[i], tk = c.cu_k[i + 1] - k0;
    if (tq == 0 || tk == 0) continue;
    AttentionOptions o = c.opt;
    o.causal = false;
    o.layout = oasis::AttentionLayout::bthd;
    o.bias = Tensor<double>({tq, tk});
    for (index_t t = 0; t < tq; ++t)
      for (index_t j = 0; j < tk; ++j)
        o.bias(t, j) = k0 + j <= q0 + t + total_k - total_q ? 0.0 : -std::numeric_limits<double>::infinity();
    Tensor<float> qi({1, tq, c.H, c.d}), ki({1, tk, c.H_kv, c.d}), vi({1, tk, c.H_kv, c.d});
    std::copy(c.q.ptr(q0), c.q.ptr(q0) + qi.size(), qi.data());
    std::copy(c.k.ptr(k0), c.k.ptr(k0) + ki.size(), ki.data());
    std::copy(c.v.ptr(k0), c.v.ptr(k0) + vi.size(), vi.data());
    const AttentionResult<float> ri = oasis::token_attention(qi, ki, vi, o);
    std::copy(ri.out.data(), ri.out.data() + ri.out.size(), bad.out.ptr(q0));
  }
  const verify::CompareReport rep = c.check(bad);
  expect_named_at_a_wrong_element(rep, "out", bad.out, good.out);
}

// A sequence boundary off by one: the kernel reads cu_seqlens_k[1] + 1, so sequence 0 sees the
// first key of sequence 1 and sequence 1 loses it.
TEST(ThdAttention, SequenceBoundaryOffByOneFails) {
  const Thd c;
  const AttentionResult<float> good = c.forward(c.cu_k);
  std::vector<index_t> shifted = c.cu_k;
  shifted[1] += 1;
  const AttentionResult<float> bad = c.forward(shifted);
  const verify::CompareReport rep = c.check(bad);
  expect_named_at_a_wrong_element(rep, "out", bad.out, good.out);
  EXPECT_LT(named_flat(tensor(rep, "out").first_mismatches[0], bad.out.shape()), 5 * 4 * 16) << "in sequence 0's rows";
}

/// The backward of Thd: inputs, the cotangents, and the dense partial null-logit gradients [B, H].
struct ThdBackward : Thd {
  oasis::AttentionCotangents<float> cot;
  ThdBackward() {
    std::mt19937_64 rng(5);
    cot = {randn({25, H, d}, rng), randn({H, 25}, rng), randn({H, 25}, rng)};
  }
  io::TensorMap inputs() const {
    io::TensorMap m = Thd::inputs();
    m["grad_out"] = f32(cot.out);
    m["grad_lse"] = f32(cot.lse);
    m["grad_p_null"] = f32(cot.p_null);
    return m;
  }
  /// Sequence i's partial of the null logits' gradient, as a kernel accumulating per sequence holds it.
  Tensor<float> partials() const {
    Tensor<float> p({4, H});
    for (index_t i = 0; i < 4; ++i) {
      const std::vector<index_t> one_q{0, cu_q[i + 1] - cu_q[i]}, one_k{0, cu_k[i + 1] - cu_k[i]};
      if (one_q[1] == 0) continue;
      auto rows = [](const Tensor<float>& x, index_t r0, index_t n) {
        Tensor<float> y({n, x.dim(1), x.dim(2)});
        std::copy(x.ptr(r0), x.ptr(r0) + y.size(), y.data());
        return y;
      };
      auto cols = [](const Tensor<float>& x, index_t c0, index_t n) {
        Tensor<float> y({x.dim(0), n});
        for (index_t h = 0; h < x.dim(0); ++h) std::copy(x.ptr(h) + c0, x.ptr(h) + c0 + n, y.ptr(h));
        return y;
      };
      const oasis::AttentionGrads<float> g = oasis::token_attention_varlen_backward(
          rows(q, cu_q[i], one_q[1]), rows(k, cu_k[i], one_k[1]), rows(v, cu_k[i], one_k[1]), one_q, one_k,
          {rows(cot.out, cu_q[i], one_q[1]), cols(cot.lse, cu_q[i], one_q[1]), cols(cot.p_null, cu_q[i], one_q[1])}, opt);
      for (index_t h = 0; h < H; ++h) p(i, h) = g.null_logits[h];
    }
    return p;
  }
  verify::CompareReport check(const oasis::AttentionGrads<float>& g, const Tensor<float>& null) const {
    return verify::check("attention_backward", inputs(),
                         {{"grad_q", f32(g.q)}, {"grad_k", f32(g.k)}, {"grad_v", f32(g.v)}, {"grad_null_logits", f32(null)}},
                         io::json::parse(options));
  }
};

TEST(ThdAttentionBackward, CorrectKernelPassesAndKeysNoQuerySeesAreExactlyZero) {
  const ThdBackward c;
  const oasis::AttentionGrads<float> g = oasis::token_attention_varlen_backward(c.q, c.k, c.v, c.cu_q, c.cu_k, c.cot, c.opt);
  const verify::CompareReport rep = c.check(g, c.partials());
  EXPECT_TRUE(rep.passed) << verify::format_report(rep);
  for (const auto& t : rep.tensors) EXPECT_EQ(t.checked, t.elements) << t.name;
  // with the forward's stored out and lse (FlashAttention-2's D and P), packed as the forward's
  const AttentionResult<float> f = c.forward(c.cu_k);
  io::TensorMap in = c.inputs();
  in["out"] = f32(f.out);
  in["lse"] = f32(f.lse);
  const verify::CompareReport stored = verify::check(
      "attention_backward", in, {{"grad_q", f32(g.q)}, {"grad_k", f32(g.k)}, {"grad_null_logits", f32(c.partials())}},
      io::json::parse(c.options));
  EXPECT_TRUE(stored.passed) << verify::format_report(stored);
  // keys 9..14 (sequence 1, no queries) must be exactly 0
  oasis::AttentionGrads<float> bad = g;
  bad.k(12, 1, 3) = 1e-30f;
  const verify::CompareReport r2 = c.check(bad, c.partials());
  EXPECT_FALSE(r2.passed);
  ASSERT_FALSE(tensor(r2, "grad_k").first_mismatches.empty());
  EXPECT_EQ(tensor(r2, "grad_k").first_mismatches[0].rfind("grad_k[12, 1, 3]", 0), 0u) << tensor(r2, "grad_k").first_mismatches[0];
}

TEST(ThdAttentionBackward, NullGradientSummedOverSequencesIsCheckedOnThePaddedBatch) {
  // FlashAttention varlen's dsink: [H] summed over every sequence, judged as one padded dense call
  const ThdBackward c;
  const oasis::AttentionGrads<float> g = oasis::token_attention_varlen_backward(c.q, c.k, c.v, c.cu_q, c.cu_k, c.cot, c.opt);
  const verify::CompareReport ok = c.check(g, g.null_logits);
  EXPECT_TRUE(ok.passed) << verify::format_report(ok);
  EXPECT_EQ(tensor(ok, "grad_null_logits").checked, c.H);
  // the sum of the partials in another order is as right
  Tensor<float> sum({c.H});
  const Tensor<float> parts = c.partials();
  for (index_t i = 3; i >= 0; --i)
    for (index_t h = 0; h < c.H; ++h) sum[h] += parts(i, h);
  const verify::CompareReport reordered = c.check(g, sum);
  EXPECT_TRUE(reordered.passed) << verify::format_report(reordered);
  // one sequence's partial left out of the sum (a reduction that skips the last sequence) fails
  Tensor<float> missing({c.H});
  for (index_t i = 0; i < 3; ++i)
    for (index_t h = 0; h < c.H; ++h) missing[h] += parts(i, h);
  const verify::CompareReport bad = c.check(g, missing);
  EXPECT_FALSE(tensor(bad, "grad_null_logits").passed) << verify::format_report(bad);
  // the per-sequence partials [B, H]: a wrong partial of sequence 2 fails at [2, h]
  Tensor<float> p = c.partials();
  p(2, 1) += 0.5f;
  const verify::CompareReport rep = c.check(g, p);
  ASSERT_FALSE(tensor(rep, "grad_null_logits").first_mismatches.empty());
  EXPECT_EQ(tensor(rep, "grad_null_logits").first_mismatches[0].rfind("grad_null_logits[2, 1]", 0), 0u);
}

// --- paged -------------------------------------------------------------------------------------

/// Three sequences of 9, 0 and 22 keys in blocks of 4, 3 new queries each (chunked prefill, causal).
/// Every table entry holds a distinct valid id (unused entries too) and every cache slot a finite value, so
/// that the mutants below read real numbers.
struct Paged {
  std::vector<index_t> lens{9, 0, 22};
  index_t bs = 4, nb = 21, H = 4, H_kv = 2, d = 16, Tq = 3, max_blocks = 7;
  Tensor<float> q, kc, vc;
  Tensor<index_t> table{Shape{3, 7}};
  AttentionOptions opt;
  Paged() {
    std::mt19937_64 rng(11);
    q = randn({3, H, Tq, d}, rng);
    kc = randn({nb, bs, H_kv, d}, rng);
    vc = randn({nb, bs, H_kv, d}, rng);
    for (index_t b = 0; b < 3; ++b)  // distinct blocks: a permutation of the 21 ids
      for (index_t i = 0; i < max_blocks; ++i) table(b, i) = (8 * (b * max_blocks + i) + 5) % nb;
    opt.causal = true;
  }
  AttentionResult<float> forward(const Tensor<index_t>& t, const std::vector<index_t>& l) const {
    return oasis::token_attention_paged(q, kc, vc, t, l, opt);
  }
  io::TensorMap inputs() const {
    return {{"q", f32(q)}, {"k_cache", f32(kc)}, {"v_cache", f32(vc)}, {"block_table", i64(table)}, {"seq_lens", i32(lens)}};
  }
  verify::CompareReport check(const AttentionResult<float>& r) const {
    return verify::check("attention", inputs(), {{"out", f32(r.out)}, {"lse", f32(r.lse)}, {"p_null", f32(r.p_null)}},
                         io::json::parse(R"({"causal": true})"));
  }
};

TEST(PagedAttention, CorrectKernelPasses) {
  const Paged c;
  const verify::CompareReport rep = c.check(c.forward(c.table, c.lens));
  EXPECT_TRUE(rep.passed) << verify::format_report(rep);
  for (const auto& t : rep.tensors) EXPECT_EQ(t.checked, t.elements) << t.name;
  // decode in [B, T, H, d] with a window, plain softmax, the table's unused entries -1
  Paged d;
  d.opt.causal = false;
  d.opt.window = 5;
  d.opt.normalizer = oasis::RowNorm::softmax;
  d.opt.layout = oasis::AttentionLayout::bthd;
  std::mt19937_64 rng(3);
  d.q = randn({3, 1, d.H, d.d}, rng);
  for (index_t b = 0; b < 3; ++b)
    for (index_t i = (d.lens[b] + d.bs - 1) / d.bs; i < d.max_blocks; ++i) d.table(b, i) = -1;
  const AttentionResult<float> r = d.forward(d.table, d.lens);
  const verify::CompareReport dec =
      verify::check("attention", d.inputs(), {{"out", f32(r.out)}, {"lse", f32(r.lse)}},
                    io::json::parse(R"({"window": 5, "normalizer": "softmax", "layout": "bthd"})"));
  EXPECT_TRUE(dec.passed) << verify::format_report(dec);
  EXPECT_EQ(tensor(dec, "out").shape, (Shape{3, 1, 4, 16}));
}

// The block table read with the row stride max_blocks - 1.
TEST(PagedAttention, BlockTableReadWithTheWrongStrideFails) {
  const Paged c;
  Tensor<index_t> t = c.table;
  for (index_t b = 0; b < 3; ++b)
    for (index_t i = 0; i < c.max_blocks; ++i) t(b, i) = c.table[b * (c.max_blocks - 1) + i];
  const AttentionResult<float> good = c.forward(c.table, c.lens), bad = c.forward(t, c.lens);
  expect_named_at_a_wrong_element(c.check(bad), "out", bad.out, good.out);
}

// The last partial block read to its end: sequence 0 (9 keys) reads 12, sequence 2 (22) reads 24.
TEST(PagedAttention, LastPartialBlockReadPastSeqLenFails) {
  const Paged c;
  const AttentionResult<float> good = c.forward(c.table, c.lens), bad = c.forward(c.table, {12, 0, 24});
  expect_named_at_a_wrong_element(c.check(bad), "out", bad.out, good.out);
}

// A block id of another sequence: sequence 2's second block read from sequence 0's table row.
TEST(PagedAttention, BlockOfAnotherSequenceFails) {
  const Paged c;
  Tensor<index_t> t = c.table;
  t(2, 1) = c.table(0, 1);
  const AttentionResult<float> good = c.forward(c.table, c.lens), bad = c.forward(t, c.lens);
  const verify::CompareReport rep = c.check(bad);
  expect_named_at_a_wrong_element(rep, "out", bad.out, good.out);
  EXPECT_GE(named_flat(tensor(rep, "out").first_mismatches[0], bad.out.shape()), 2 * 4 * 3 * 16) << "in sequence 2";
}

// --- hostile metadata ----------------------------------------------------------------------------

void expect_input_error(const std::function<void()>& f, const std::string& arg, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), arg) << what << ": " << e.what();
  }
}

TEST(LayoutsCompare, HostileMetadataIsAnInputErrorNamingIt) {
  const Thd c;
  const AttentionResult<float> r = c.forward(c.cu_k);
  const io::TensorMap outs{{"out", f32(r.out)}};
  auto thd = [&](const std::string& name, io::StoredTensor t, const std::string& options = "") {
    return [&, name, t, options] {
      io::TensorMap in = c.inputs();
      if (t.values.empty()) in.erase(name);
      else in[name] = t;
      (void)verify::check("attention", in, outs, io::json::parse(options.empty() ? c.options : options));
    };
  };
  expect_input_error(thd("cu_seqlens_q", i32({1, 5, 5, 22, 25})), "cu_seqlens_q", "not starting at 0");
  expect_input_error(thd("cu_seqlens_q", i32({0, 5, 4, 22, 25})), "cu_seqlens_q", "decreasing");
  expect_input_error(thd("cu_seqlens_k", i32({0, 9, 15, 32, 31})), "cu_seqlens_k", "last entry != total_k");
  expect_input_error(thd("cu_seqlens_k", i32({0, 9, 32})), "cu_seqlens_k", "B + 1 differs from q's");
  expect_input_error(thd("cu_seqlens_k", {io::DType::f32, Tensor<double>({5}, 1.0)}), "cu_seqlens_k", "a float tensor");
  expect_input_error(thd("cu_seqlens_q", {io::DType::i64, Tensor<double>({5, 1})}), "cu_seqlens_q", "rank 2");
  expect_input_error(thd("cu_seqlens_k", {}), "cu_seqlens_k", "missing");
  expect_input_error(thd("cu_seqlens_q", i32(c.cu_q), R"({"layout": "thd", "key_lengths": [1, 1, 1, 1]})"), "key_lengths",
                     "key_lengths with packed sequences");
  expect_input_error([&] { (void)verify::check("attention", c.inputs(), {{"probs", f32(r.out)}}, io::json::parse(c.options)); },
                     "probs", "a probability matrix");
  expect_input_error([&] {
    verify::CompareOptions co;
    co.sample = 3;
    (void)verify::check("attention", c.inputs(), outs, io::json::parse(c.options), co);
  }, "sample", "sampled rows");
  const Paged p;
  const io::TensorMap pouts{{"out", f32(p.forward(p.table, p.lens).out)}};
  auto paged = [&](const std::string& name, io::StoredTensor t) {
    return [&, name, t] {
      io::TensorMap in = p.inputs();
      if (t.values.empty()) in.erase(name);
      else in[name] = t;
      (void)verify::check("attention", in, pouts, io::json::parse("{}"));
    };
  };
  Tensor<index_t> t = p.table;
  t(2, 3) = p.nb;
  expect_input_error(paged("block_table", i64(t)), "block_table", "block id past num_blocks");
  t = p.table;
  t(0, 0) = -1;
  expect_input_error(paged("block_table", i64(t)), "block_table", "negative block id");
  expect_input_error(paged("seq_lens", i32({9, 0, 29})), "seq_lens", "seq_len past the table's capacity");
  expect_input_error(paged("seq_lens", i32({9, -1, 22})), "seq_lens", "negative seq_len");
  expect_input_error(paged("block_table", {io::DType::f32, p.table.cast<double>()}), "block_table", "a float block table");
  expect_input_error(paged("v_cache", {}), "v_cache", "v_cache missing");
  expect_input_error(paged("k", f32(p.q)), "k", "k given with a paged cache");
  expect_input_error(thd("k_cache", f32(p.kc)), "k_cache", "layout thd with a paged cache");
}

}  // namespace
