// oasis/ops/paged.hpp — token attention over a paged key/value cache, the layout of vLLM's and
// FlashInfer's decode and chunked-prefill kernels (docs/spec.md §8, "Packed and paged layouts").
//
//   q            [B, H, Tq, d_h] (or [B, Tq, H, d_h] with AttentionOptions::layout = bthd)
//   k_cache      [num_blocks, block_size, H_kv, d_h]     v_cache [num_blocks, block_size, H_kv, d_v]
//   block_table  [B, max_blocks]   sequence b's key j is slot j % block_size of block
//                                  block_table[b, j / block_size]
//   seq_lens     [B]               keys of sequence b, 0 <= seq_lens[b] <= max_blocks * block_size;
//                                  the last Tq of them are the new queries' own keys
//   out [B, H, Tq, d_v] (the layout of q), lse and p_null [B, H, Tq]
// Sequence b is the dense op with Tk = seq_lens[b]: the causal mask bottom-right aligned, query t
// sees key j iff j <= t + seq_lens[b] - Tq. Tq > seq_lens[b] is allowed: the first
// Tq - seq_lens[b] rows of a causal call (every row of a sequence without keys) are fully masked,
// defined as in docs/spec.md §1. Only the first ceil(seq_lens[b] / block_size) entries of a table
// row are read; the rest (padding, often -1) are ignored, and so are the cache slots no sequence
// uses (they may hold anything, NaN included). Blocks may be shared between sequences.
//
// Not offered: key_lengths (seq_lens holds them), an additive bias and the probability matrix
// (their Tk differs per sequence); each is refused naming it.
//
// The reference gathers each sequence's keys into a dense [1, seq_len, H_kv, d] tensor and runs
// token_attention; attention_paged_with takes the dense op as an argument, so the backends'
// adaptor (oasis/backends/layouts.hpp) runs the same gathering.
#pragma once

#include <algorithm>
#include <vector>

#include "oasis/ops/varlen.hpp"

namespace oasis {

/// Shape facts of one paged call, validated once.
struct PagedShape {
  index_t B, H, H_kv, Tq, d_h, d_v, num_blocks, block_size, max_blocks;
};

/// Validates shapes, the block table, the lengths and the options; throws naming the argument. q
/// and the cache slots the sequences use are finite.
template <class T>
PagedShape check_paged_args(const Tensor<T>& q, const Tensor<T>& k_cache, const Tensor<T>& v_cache,
                            const Tensor<index_t>& block_table, const std::vector<index_t>& seq_lens,
                            const AttentionOptions& opt) {
  const bool bthd = opt.layout == AttentionLayout::bthd;
  require_rank(q, 4, "q", bthd ? "[B, Tq, H, d_h]" : "[B, H, Tq, d_h]");
  require_rank(k_cache, 4, "k_cache", "[num_blocks, block_size, H_kv, d_h]");
  require_rank(v_cache, 4, "v_cache", "[num_blocks, block_size, H_kv, d_v]");
  require_rank(block_table, 2, "block_table", "[B, max_blocks]");
  PagedShape s{};
  detail::bhtd_dims(q, opt.layout, s.B, s.H, s.Tq, s.d_h);
  s.num_blocks = k_cache.dim(0);
  s.block_size = k_cache.dim(1);
  s.H_kv = k_cache.dim(2);
  s.d_v = v_cache.dim(3);
  s.max_blocks = block_table.dim(1);
  OASIS_REQUIRE(s.B > 0 && s.H > 0 && s.Tq > 0 && s.d_h > 0, "q", "empty dimension in shape ", shape_str(q.shape()));
  OASIS_REQUIRE(s.block_size > 0 && s.H_kv > 0 && k_cache.dim(3) > 0, "k_cache", "empty block, head or head-size dimension in ",
                shape_str(k_cache.shape()));
  OASIS_REQUIRE(k_cache.dim(3) == s.d_h, "k_cache", "head size ", k_cache.dim(3), " differs from q's ", s.d_h);
  OASIS_REQUIRE(v_cache.dim(0) == s.num_blocks && v_cache.dim(1) == s.block_size && v_cache.dim(2) == s.H_kv && s.d_v > 0,
                "v_cache", "shape ", shape_str(v_cache.shape()), " does not match k_cache ", shape_str(k_cache.shape()),
                " in blocks, block size and kv heads (or has an empty head size)");
  OASIS_REQUIRE(block_table.dim(0) == s.B, "block_table", "has ", block_table.dim(0), " rows, q's batch is ", s.B);
  OASIS_REQUIRE(static_cast<index_t>(seq_lens.size()) == s.B, "seq_lens", "has ", seq_lens.size(),
                " entries, expected one per sequence (", s.B, ")");
  for (index_t b = 0; b < s.B; ++b) {
    const index_t len = seq_lens[static_cast<std::size_t>(b)];
    OASIS_REQUIRE(len >= 0, "seq_lens", "entry ", b, " = ", len, " is negative");
    const index_t used = len / s.block_size + (len % s.block_size != 0 ? 1 : 0);  // ceil, without overflow
    OASIS_REQUIRE(used <= s.max_blocks, "seq_lens", "entry ", b, " = ", len, " exceeds the block table's capacity of ",
                  s.max_blocks, " blocks of ", s.block_size, " keys");
    for (index_t i = 0; i < used; ++i) {
      const index_t id = block_table(b, i);
      OASIS_REQUIRE(id >= 0 && id < s.num_blocks, "block_table", "entry [", b, ", ", i, "] = ", id,
                    " is not a block id in [0, num_blocks = ", s.num_blocks, ") (sequence ", b, " reads its first ", used,
                    " entries: ", len, " keys in blocks of ", s.block_size, ")");
    }
  }
  detail::check_per_sequence_options(opt, "the paged layout", false);
  detail::check_dense_options(s.H, s.H_kv, s.d_h, s.d_v, opt);
  require_finite(q, "q");
  const index_t wk = s.H_kv * s.d_h, wv = s.H_kv * s.d_v;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t j = 0; j < seq_lens[static_cast<std::size_t>(b)]; ++j) {
      const index_t blk = block_table(b, j / s.block_size), slot = j % s.block_size;
      for (index_t c = 0; c < wk; ++c)
        OASIS_REQUIRE(is_finite(k_cache.ptr(blk, slot)[c]), "k_cache", "non-finite value ", to_double(k_cache.ptr(blk, slot)[c]),
                      " at [", blk, ", ", slot, ", ", c / s.d_h, ", ", c % s.d_h, "] (key ", j, " of sequence ", b, ")");
      for (index_t c = 0; c < wv; ++c)
        OASIS_REQUIRE(is_finite(v_cache.ptr(blk, slot)[c]), "v_cache", "non-finite value ", to_double(v_cache.ptr(blk, slot)[c]),
                      " at [", blk, ", ", slot, ", ", c / s.d_v, ", ", c % s.d_v, "] (key ", j, " of sequence ", b, ")");
    }
  return s;
}

namespace detail {

/// Sequence b's keys gathered from the cache as the dense [1, len, H_kv, d] (bthd); one zero key
/// (masked by key_lengths = {0}, sequence_options) when len = 0.
template <class T>
Tensor<T> gather_blocks(const Tensor<T>& cache, const Tensor<index_t>& block_table, index_t b, index_t len) {
  const index_t bs = cache.dim(1), w = cache.dim(2) * cache.dim(3);
  Tensor<T> y({1, std::max<index_t>(len, 1), cache.dim(2), cache.dim(3)});
  for (index_t j = 0; j < len; ++j) {
    const T* src = cache.ptr(block_table(b, j / bs), j % bs);
    std::copy(src, src + w, y.ptr(0, j));
  }
  return y;
}

/// Batch element b of a rank-4 tensor as [1, ...].
template <class T>
Tensor<T> batch_slice(const Tensor<T>& x, index_t b) {
  Tensor<T> y({1, x.dim(1), x.dim(2), x.dim(3)});
  std::copy(x.ptr(b), x.ptr(b) + y.size(), y.data());
  return y;
}

}  // namespace detail

/// The paged forward with `dense(q_b, k_b, v_b, opt_b)` (token_attention's signature) run on each
/// sequence's gathered keys, in the layout of the call.
template <class T, class Dense>
AttentionResult<T> attention_paged_with(const Tensor<T>& q, const Tensor<T>& k_cache, const Tensor<T>& v_cache,
                                        const Tensor<index_t>& block_table, const std::vector<index_t>& seq_lens,
                                        const AttentionOptions& opt, Dense dense) {
  const PagedShape s = check_paged_args(q, k_cache, v_cache, block_table, seq_lens, opt);
  const bool bthd = opt.layout == AttentionLayout::bthd;
  AttentionResult<T> r;
  r.out = Tensor<T>(bthd ? Shape{s.B, s.Tq, s.H, s.d_v} : Shape{s.B, s.H, s.Tq, s.d_v});
  r.lse = Tensor<T>({s.B, s.H, s.Tq});
  r.p_null = Tensor<T>({s.B, s.H, s.Tq});
  for (index_t b = 0; b < s.B; ++b) {
    const index_t len = seq_lens[static_cast<std::size_t>(b)];
    Tensor<T> kb = detail::gather_blocks(k_cache, block_table, b, len), vb = detail::gather_blocks(v_cache, block_table, b, len);
    if (!bthd) {
      kb = swap_head_time(kb);
      vb = swap_head_time(vb);
    }
    const AttentionResult<T> rb = dense(detail::batch_slice(q, b), kb, vb, detail::sequence_options(opt, opt.layout, len));
    std::copy(rb.out.data(), rb.out.data() + rb.out.size(), r.out.ptr(b));
    std::copy(rb.lse.data(), rb.lse.data() + rb.lse.size(), r.lse.ptr(b));
    std::copy(rb.p_null.data(), rb.p_null.data() + rb.p_null.size(), r.p_null.ptr(b));
  }
  return r;
}

/// The reference attention over a paged cache (docs/spec.md §8): token_attention per sequence.
template <class T>
AttentionResult<T> token_attention_paged(const Tensor<T>& q, const Tensor<T>& k_cache, const Tensor<T>& v_cache,
                                         const Tensor<index_t>& block_table, const std::vector<index_t>& seq_lens,
                                         const AttentionOptions& opt = {}) {
  return attention_paged_with(q, k_cache, v_cache, block_table, seq_lens, opt,
                              [](const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, const AttentionOptions& o) {
                                return token_attention(a, b, c, o);
                              });
}

}  // namespace oasis
