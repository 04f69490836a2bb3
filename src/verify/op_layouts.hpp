// src/verify/op_layouts.hpp — the packed (THD) and paged calls of ops attention and
// attention_backward (op_varlen.cpp, op_paged.cpp): the dense ops' run functions hand such a call
// over at their start, passing themselves as the check of each sequence (layout_fold.hpp).
#pragma once

#include "layout_fold.hpp"

namespace oasis::verify::detail {

/// Option layout is "thd".
bool thd_layout(const Options& o);
/// Any paged-cache input (k_cache, v_cache, block_table, seq_lens) is given.
bool paged_call(const TensorMap& in);

CompareReport thd_attention(const OpCall& c, const DenseRun& dense);
CompareReport thd_attention_backward(const OpCall& c, const DenseRun& dense);
CompareReport paged_attention(const OpCall& c, const DenseRun& dense);

}  // namespace oasis::verify::detail
