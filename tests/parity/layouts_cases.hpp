// tests/parity/layouts_cases.hpp — packed (THD) and paged instances of the layout tests
// (test_layouts_reference.cpp, test_layouts_parity.cpp), and each sequence's dense form cut out by
// the test itself (not by the library's helpers), as the dense op of B = 1 sees it.
#pragma once

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "oasis/ops/paged.hpp"
#include "oasis/ops/varlen.hpp"
#include "oasis_random.hpp"
#include "parity_rule.hpp"

namespace oasis::test {

/// A packed batch: per-sequence query and key counts, heads, sizes and options.
struct VarlenCase {
  std::string name;
  std::vector<index_t> q_lens, k_lens;
  index_t H, H_kv, d_h, d_v;
  RowNorm normalizer = RowNorm::softmax1;
  bool causal = false;
  index_t window = 0;
  bool null_logits = true;
};

inline std::vector<VarlenCase> varlen_cases() {
  return {
      // decode-like, a sequence without queries, one without keys (fully masked rows), GQA 2:1
      {"gqa_causal_empty_sequences", {5, 0, 17, 3}, {9, 6, 17, 0}, 4, 2, 32, 24, RowNorm::softmax1, true, 0, true},
      {"window_softmax", {7, 12, 1}, {20, 3, 1}, 2, 1, 16, 16, RowNorm::softmax, false, 4, false},
      // Tq > Tk under causal: the first Tq - Tk rows fully masked; GQA 3:1; window 2
      {"causal_tq_over_tk_window", {10, 4}, {3, 4}, 3, 1, 8, 8, RowNorm::softmax1, true, 2, false},
      // across the fast kernels' 16-query and 32-key tiles
      {"tiles_causal_sinks", {40, 70, 33}, {100, 70, 65}, 2, 2, 64, 64, RowNorm::softmax1, true, 0, true},
  };
}

inline void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<index_t> offsets(const std::vector<index_t>& lens) {
  std::vector<index_t> cu{0};
  for (index_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

struct VarlenInputs {
  Tensor<float> q, k, v;
  std::vector<index_t> cu_q, cu_k;
  AttentionOptions opt;
};

inline VarlenInputs make_varlen(const VarlenCase& c, std::uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt);
  VarlenInputs in;
  in.cu_q = offsets(c.q_lens);
  in.cu_k = offsets(c.k_lens);
  in.q = randn<float>({in.cu_q.back(), c.H, c.d_h}, rng);
  in.k = randn<float>({in.cu_k.back(), c.H_kv, c.d_h}, rng);
  in.v = randn<float>({in.cu_k.back(), c.H_kv, c.d_v}, rng);
  in.opt.normalizer = c.normalizer;
  in.opt.causal = c.causal;
  in.opt.window = c.window;
  std::normal_distribution<double> nd(0.0, 2.0);
  if (c.null_logits)
    for (index_t h = 0; h < c.H; ++h) in.opt.null_logits.push_back(static_cast<double>(static_cast<float>(nd(rng))));
  return in;
}

/// Float-exact packed cotangents: out [total_q, H, d_v], lse and (softmax1) p_null [H, total_q].
inline AttentionCotangents<float> make_varlen_cotangents(const VarlenCase& c, const VarlenInputs& in, std::uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt + 7);
  AttentionCotangents<float> d;
  d.out = randn<float>({in.cu_q.back(), c.H, c.d_v}, rng);
  d.lse = randn<float>({c.H, in.cu_q.back()}, rng);
  if (c.normalizer == RowNorm::softmax1) d.p_null = randn<float>({c.H, in.cu_q.back()}, rng);
  return d;
}

/// Rows [r0, r0 + n) of a [total, heads, d] tensor as [1, n, heads, d]; n = 0 gives one zero row.
template <class T>
Tensor<T> rows_of(const Tensor<T>& x, index_t r0, index_t n) {
  Tensor<T> y({1, std::max<index_t>(n, 1), x.dim(1), x.dim(2)});
  for (index_t t = 0; t < n; ++t)
    for (index_t h = 0; h < x.dim(1); ++h)
      for (index_t c = 0; c < x.dim(2); ++c) y(0, t, h, c) = x(r0 + t, h, c);
  return y;
}

/// Columns [c0, c0 + n) of [H, total] as [1, H, n].
template <class T>
Tensor<T> cols_of(const Tensor<T>& x, index_t c0, index_t n) {
  Tensor<T> y({1, x.dim(0), n});
  for (index_t h = 0; h < x.dim(0); ++h)
    for (index_t t = 0; t < n; ++t) y(0, h, t) = x(h, c0 + t);
  return y;
}

/// Sequence i of a packed call as the dense call of B = 1 (bthd; a sequence without keys: one
/// zero key masked by key_lengths = {0}).
inline AttentionInputs sequence_inputs(const VarlenInputs& in, index_t i) {
  const std::size_t ii = static_cast<std::size_t>(i);
  const index_t tq = in.cu_q[ii + 1] - in.cu_q[ii], tk = in.cu_k[ii + 1] - in.cu_k[ii];
  AttentionInputs s{rows_of(in.q, in.cu_q[ii], tq), rows_of(in.k, in.cu_k[ii], tk), rows_of(in.v, in.cu_k[ii], tk), in.opt};
  s.opt.layout = AttentionLayout::bthd;
  if (tk == 0) s.opt.key_lengths = {0};
  return s;
}

/// Sequence i's part of a packed forward result, as the dense result of B = 1.
inline AttentionResult<float> sequence_result(const AttentionResult<float>& r, const VarlenInputs& in, index_t i) {
  const std::size_t ii = static_cast<std::size_t>(i);
  const index_t q0 = in.cu_q[ii], tq = in.cu_q[ii + 1] - q0;
  return {rows_of(r.out, q0, tq), cols_of(r.lse, q0, tq), cols_of(r.p_null, q0, tq), {}};
}

/// A paged batch: per-sequence key counts, the queries per sequence, the cache's geometry.
struct PagedCase {
  std::string name;
  std::vector<index_t> seq_lens;
  index_t Tq, block_size, spare_blocks, H, H_kv, d_h, d_v;
  RowNorm normalizer = RowNorm::softmax1;
  bool causal = false;
  index_t window = 0;
  AttentionLayout layout = AttentionLayout::bhtd;
};

inline std::vector<PagedCase> paged_cases() {
  return {
      // chunked prefill: 3 new queries, a sequence without keys, a partial last block
      {"prefill_causal_gqa", {9, 0, 24}, 3, 4, 5, 4, 2, 32, 32, RowNorm::softmax1, true, 0, AttentionLayout::bhtd},
      {"decode_window_bthd", {1, 33, 70}, 1, 16, 2, 2, 1, 64, 48, RowNorm::softmax, false, 8, AttentionLayout::bthd},
      // more new queries than keys under causal: the first rows fully masked
      {"tq_over_seq_len", {4, 10}, 6, 3, 1, 2, 2, 16, 16, RowNorm::softmax1, true, 0, AttentionLayout::bhtd},
  };
}

inline void PrintTo(const PagedCase& c, std::ostream* os) { *os << c.name; }

struct PagedInputs {
  Tensor<float> q, k_cache, v_cache;
  Tensor<index_t> block_table;
  std::vector<index_t> seq_lens;
  AttentionOptions opt;
  std::vector<Tensor<float>> k, v;  ///< each sequence's keys as [1, H_kv, len, d] (bhtd), scattered into the cache
};

/// The sequences' keys drawn dense, then scattered into shuffled blocks; unused slots hold NaN and
/// the table's unused entries -1.
inline PagedInputs make_paged(const PagedCase& c, std::uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt);
  PagedInputs in;
  const index_t B = static_cast<index_t>(c.seq_lens.size());
  index_t max_blocks = 1, used = 0;
  for (index_t n : c.seq_lens) {
    max_blocks = std::max(max_blocks, (n + c.block_size - 1) / c.block_size + 1);
    used += (n + c.block_size - 1) / c.block_size;
  }
  const index_t num_blocks = used + c.spare_blocks;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  in.k_cache = Tensor<float>({num_blocks, c.block_size, c.H_kv, c.d_h}, nan);
  in.v_cache = Tensor<float>({num_blocks, c.block_size, c.H_kv, c.d_v}, nan);
  in.block_table = Tensor<index_t>({B, max_blocks}, index_t(-1));
  std::vector<index_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::size_t next = 0;
  for (index_t b = 0; b < B; ++b) {
    const index_t len = c.seq_lens[static_cast<std::size_t>(b)];
    Tensor<float> kb = randn<float>({1, c.H_kv, len, c.d_h}, rng), vb = randn<float>({1, c.H_kv, len, c.d_v}, rng);
    for (index_t i = 0; i * c.block_size < len; ++i) in.block_table(b, i) = ids[next++];
    for (index_t j = 0; j < len; ++j)
      for (index_t h = 0; h < c.H_kv; ++h) {
        const index_t blk = in.block_table(b, j / c.block_size), slot = j % c.block_size;
        for (index_t e = 0; e < c.d_h; ++e) in.k_cache(blk, slot, h, e) = kb(0, h, j, e);
        for (index_t e = 0; e < c.d_v; ++e) in.v_cache(blk, slot, h, e) = vb(0, h, j, e);
      }
    in.k.push_back(std::move(kb));
    in.v.push_back(std::move(vb));
  }
  in.seq_lens = c.seq_lens;
  in.q = randn<float>(c.layout == AttentionLayout::bthd ? Shape{B, c.Tq, c.H, c.d_h} : Shape{B, c.H, c.Tq, c.d_h}, rng);
  in.opt.normalizer = c.normalizer;
  in.opt.causal = c.causal;
  in.opt.window = c.window;
  in.opt.layout = c.layout;
  std::normal_distribution<double> nd(0.0, 2.0);
  if (c.normalizer == RowNorm::softmax1)
    for (index_t h = 0; h < c.H; ++h) in.opt.null_logits.push_back(static_cast<double>(static_cast<float>(nd(rng))));
  return in;
}

/// Sequence b of a paged call as the dense call of B = 1 on the keys the test drew.
inline AttentionInputs paged_sequence_inputs(const PagedInputs& in, index_t b) {
  const std::size_t bb = static_cast<std::size_t>(b);
  Tensor<float> qb({1, in.q.dim(1), in.q.dim(2), in.q.dim(3)});
  for (index_t i = 0; i < qb.size(); ++i) qb[i] = in.q[b * qb.size() + i];
  AttentionInputs s{qb, in.k[bb], in.v[bb], in.opt};
  if (in.seq_lens[bb] == 0) {  // one zero key, masked
    s.k = Tensor<float>({1, in.k_cache.dim(2), 1, in.k_cache.dim(3)});
    s.v = Tensor<float>({1, in.v_cache.dim(2), 1, in.v_cache.dim(3)});
    s.opt.key_lengths = {0};
  }
  if (in.opt.layout == AttentionLayout::bthd) {
    s.k = swap_head_time(s.k);
    s.v = swap_head_time(s.v);
  }
  return s;
}

/// Sequence b's part of a paged result.
inline AttentionResult<float> paged_sequence_result(const AttentionResult<float>& r, index_t b) {
  auto slice = [b](const Tensor<float>& x) {
    Shape s = x.shape();
    s[0] = 1;
    Tensor<float> y(s);
    for (index_t i = 0; i < y.size(); ++i) y[i] = x[b * y.size() + i];
    return y;
  };
  return {slice(r.out), slice(r.lse), slice(r.p_null), {}};
}

}  // namespace oasis::test
