// src/verify/op_block_attn_res.cpp — ops "block_attn_res" and "block_attn_res_backward": Block
// AttnRes (Kimi, Eq. 5-6). Layer i of block n routes over the completed block summaries
// b_0 .. b_{n-1} (b_0 the token embedding, b_k the sum of block k's sublayer outputs) and, from its
// block's second layer on, the partial sum b_n^{i-1}; Kimi's block_attn_res(blocks, partial_block,
// proj, norm) stacks blocks + [partial_block] and applies the fused AttnRes routing. The ops do the
// same: the sources of attn_res are [blocks; partial], the partial's row last, and attn_res's check
// (op_depth.cpp) or attn_res_backward's (op_attn_res_backward.cpp) runs on them; backward, the
// total gradient of the stacked sources is judged as grad_blocks (rows 0..m-1) and grad_partial
// (row m), every element with its own reference and bound.
#include <algorithm>

#include "attn_res_support.hpp"
#include "ops.hpp"

namespace oasis::verify::detail {
namespace {

const char* const kWhat = "blocks (and partial)";

/// The call of attn_res(_backward) on the stacked sources, the inputs checked under their block
/// names before anything is stacked.
struct Stacked {
  TensorMap inputs;
  SourcesSplit split;
};

Stacked stack(const OpCall& c, const std::string& op, bool backward) {
  const TensorMap& in = c.inputs;
  const StoredTensor& blocks = need(in, "blocks", op);
  require_rank(blocks.values, 3, "blocks", "[m, N, d]");
  const index_t m = blocks.values.dim(0), N = blocks.values.dim(1), d = blocks.values.dim(2);
  OASIS_REQUIRE(m > 0 && N > 0 && d > 0, "blocks", "empty dimension in ", shape_str(blocks.values.shape()),
                " (m >= 1: b_0, the embedding, is always a block)");
  require_finite(blocks.values, "blocks");
  const StoredTensor* partial = maybe(in, "partial") ? &need(in, "partial", op) : nullptr;
  if (partial) {
    OASIS_REQUIRE(partial->values.shape() == (Shape{N, d}), "partial", "shape ", shape_str(partial->values.shape()),
                  " is not [N, d] = [", N, ", ", d, "] of blocks ", shape_str(blocks.values.shape()));
    require_finite(partial->values, "partial");
  }
  const index_t n = m + (partial ? 1 : 0);
  const char* rows = partial ? "m + 1 (the blocks, then the partial)" : "m (no partial)";
  auto per_source = [&](const char* name) {
    const StoredTensor* t = maybe(in, name);
    OASIS_REQUIRE(!t || t->values.shape() == (Shape{n, N}), name, "shape ", shape_str(t ? t->values.shape() : Shape{}),
                  " is not [", rows, ", N] = [", n, ", ", N, "]");
  };
  per_source("psi");
  if (backward) per_source("grad_alpha");
  const std::vector<SourceKind> kinds = parse_kinds(c.options, n);
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(), " entries, one per source: ", rows,
                " = ", n);
  OASIS_REQUIRE(!c.outputs.count("grad_partial") || partial, "grad_partial",
                "grad_partial given but the inputs hold no partial (a block's first layer routes over the blocks alone)");
  Stacked s;
  s.split = {m, partial != nullptr};
  const DType dt = partial && (is16(blocks.dtype) || is16(partial->dtype)) ? input16({blocks.dtype, partial->dtype}) : blocks.dtype;
  s.inputs.emplace("sources", StoredTensor{dt, stack_block_sources(blocks.values, partial ? partial->values : Tensor<double>())});
  for (const auto& [name, t] : in)
    if (name != "blocks" && name != "partial") s.inputs.emplace(name, t);
  return s;
}

CompareReport forward(const OpCall& c) {
  const std::string op = "block_attn_res";
  const Stacked s = stack(c, op, false);
  return attn_res_report(OpCall{s.inputs, c.outputs, c.options, c.compare}, op, kWhat);
}

CompareReport backward(const OpCall& c) {
  const std::string op = "block_attn_res_backward";
  const Stacked s = stack(c, op, true);
  return attn_res_backward_report(OpCall{s.inputs, c.outputs, c.options, c.compare}, op, s.split, kWhat);
}

std::vector<std::string> option_keys() {
  std::vector<std::string> keys = kDepthOptionKeys;
  keys.insert(keys.end(), {"eps", "scale"});
  return keys;
}

}  // namespace

OpSpec block_attn_res_op() {
  OpSpec s{"block_attn_res",
          {{"blocks", "[m,N,d]"}, {"partial", "[N,d]", false}, {"w", "[d]"}, {"gain", "[d]", false}, {"psi", "[m(+1),N]", false}},
          {{"h", "[N,d]"}, {"alpha", "[m(+1),N]"}, {"alpha_null", "[N]"}},
          option_keys(),
          "Block AttnRes (Kimi, Eq. 5-6): attn_res over the sources [blocks; partial], the partial's weight\n"
          "                the last row of alpha; options as attn_res",
          forward};
  s.samples_rows = true;
  return s;
}

OpSpec block_attn_res_backward_op() {
  return {"block_attn_res_backward",
          {{"blocks", "[m,N,d]"},
           {"partial", "[N,d]", false},
           {"w", "[d]"},
           {"gain", "[d]", false},
           {"psi", "[m(+1),N]", false},
           {"grad_h", "[N,d]"},
           {"grad_alpha", "[m(+1),N]", false},
           {"grad_alpha_null", "[N]", false}},
          {{"grad_blocks", "[m,N,d]"},
           {"grad_partial", "[N,d]"},
           {"grad_w", "[d]"},
           {"grad_gain", "[d]"},
           {"grad_psi", "[m(+1),N]"},
           {"grad_beta", "[1]"},
           {"grad_theta", "[1]"}},
          option_keys(),
          "as block_attn_res; grad_blocks, grad_partial: the totals (the mix and the keys), attn_res_backward's\n"
          "                grad_sources split at the partial's row",
          backward};
}

}  // namespace oasis::verify::detail
