// src/verify/op_paged.cpp — op attention over a paged key/value cache: inputs k_cache, v_cache,
// block_table and seq_lens instead of k and v (oasis/ops/paged.hpp; docs/verify.md, "Packed (THD)
// and paged layouts"). Each sequence's keys are gathered from its blocks into the dense k and v of
// a call of B = 1 (in the call's layout), checked through the op's own run function; the reports
// fold into one on out [B, H, Tq, d_v], lse and p_null [B, H, Tq] (layout_fold.hpp).
#include <algorithm>
#include <string>

#include "layout_fold.hpp"
#include "op_layouts.hpp"
#include "oasis/ops/paged.hpp"

namespace oasis::verify::detail {
namespace {

const char* const kPaged[] = {"k_cache", "v_cache", "block_table", "seq_lens"};

/// A cache input: present, its NaN left to check_paged_args (unused slots may hold anything).
const StoredTensor& cache(const TensorMap& in, const std::string& name) {
  const StoredTensor* t = maybe(in, name);
  OASIS_REQUIRE(t, name, "op attention over a paged cache needs input tensor '", name,
                "' [num_blocks,block_size,Hkv,d] with block_table and seq_lens (the inputs hold: ", names_of(in), ")");
  return *t;
}

/// Batch element b of a tensor of any rank, as [1, ...].
Tensor<double> batch_part(const Tensor<double>& x, index_t b) {
  Shape sh = x.shape();
  sh[0] = 1;
  Tensor<double> y(sh);
  std::copy(x.data() + b * y.size(), x.data() + (b + 1) * y.size(), y.data());
  return y;
}

}  // namespace

bool paged_call(const TensorMap& in) {
  for (const char* x : kPaged)
    if (in.count(x)) return true;
  return false;
}

CompareReport paged_attention(const OpCall& c, const DenseRun& dense) {
  const std::string op = "attention";
  const TensorMap &in = c.inputs, &out = c.outputs;
  OASIS_REQUIRE(c.compare.sample == 0, "sample", "op attention over a paged cache checks every row (sampling is offered for "
                "the dense layouts)");
  for (const char* x : {"k", "v"})
    OASIS_REQUIRE(!in.count(x), x, "give either k and v (dense) or k_cache, v_cache, block_table and seq_lens (paged), not both");
  OASIS_REQUIRE(!c.options.has("key_lengths"), "key_lengths", "a paged cache takes the key lengths from seq_lens");
  for (const char* x : {"bias", "mask"})
    OASIS_REQUIRE(!maybe(in, x), x, "a paged cache takes no additive bias or mask (its Tk differs per sequence)");
  OASIS_REQUIRE(!out.count("probs"), "probs", "a paged cache has no probability matrix output (its Tk differs per sequence)");
  const StoredTensor& q = need(in, "q", op);
  const StoredTensor &kc = cache(in, "k_cache"), &vc = cache(in, "v_cache");
  const Tensor<index_t> table = integer_input(in, "block_table", 2, "[B, max_blocks]");
  const std::vector<index_t> lens = integer_input(in, "seq_lens", 1, "[B]").storage();
  const AttentionOptions a = attention_call_options(c.options, in);
  const PagedShape s = check_paged_args(q.values, kc.values, vc.values, table, lens, a);
  const bool bthd = a.layout == AttentionLayout::bthd;

  ReportFold fold(out, c.compare.show);
  const Shape stats{s.B, s.H, s.Tq};
  const bool has[] = {placed(out, "out", bthd ? Shape{s.B, s.Tq, s.H, s.d_v} : Shape{s.B, s.H, s.Tq, s.d_v}, fold),
                      placed(out, "lse", stats, fold), placed(out, "p_null", stats, fold)};
  const char* const names[] = {"out", "lse", "p_null"};
  for (index_t b = 0; b < s.B && (has[0] || has[1] || has[2]); ++b) {
    const index_t len = lens[static_cast<std::size_t>(b)];
    TensorMap ins;
    ins["q"] = stored(q, batch_part(q.values, b));
    for (const char* x : {"k", "v"}) {
      Tensor<double> g = oasis::detail::gather_blocks(x[0] == 'k' ? kc.values : vc.values, table, b, len);
      ins[x] = stored(x[0] == 'k' ? kc : vc, bthd ? std::move(g) : swap_head_time(g));
    }
    if (const StoredTensor* nl = maybe(in, "null_logits")) ins["null_logits"] = *nl;
    TensorMap outs;
    std::map<std::string, PartPlace> where;
    for (int t = 0; t < 3; ++t)
      if (has[t]) {
        const Tensor<double>& x = out.at(names[t]).values;
        outs[names[t]] = stored(out.at(names[t]), batch_part(x, b));
        where[names[t]] = contiguous_part(outs[names[t]].values.shape(), b * (x.size() / s.B));
      }
    std::vector<std::pair<std::string, io::json::Value>> extra;
    if (len == 0) extra.emplace_back("key_lengths", json_integers({0}));  // the zero key gather_blocks gives, masked
    const io::json::Value o = dense_options(c.options, {}, extra);
    const Options oo(&o);
    fold.add(dense(OpCall{ins, outs, oo, fold.part_options(c.compare)}), "sequence " + std::to_string(b), where);
  }
  return fold.finish(std::to_string(s.B) + " sequences, each gathered from its blocks and checked as a dense call of B = 1");
}

}  // namespace oasis::verify::detail
