// src/verify/op_options.hpp — the options of an op call: the JSON options object with typed
// accessors, and the parsers the op files share (the attention ops' AttentionOptions, the depth
// ops' DepthOptions). Part of the op files' helper layer (op_support.hpp); the Python module's
// core functions read their options with the same parsers, so they are spelled as the ops' options.
#pragma once

#include <string>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis::verify::detail {

/// The options object of one op call, with typed accessors that name the key on a type error.
/// Unknown keys are rejected by the engine before the op runs.
class Options {
 public:
  explicit Options(const io::json::Value* v) : v_(v) {
    OASIS_REQUIRE(!v_ || v_->kind == io::json::Value::Kind::null || v_->is_object(), "options", "must be a JSON object");
    if (v_ && !v_->is_object()) v_ = nullptr;
  }
  const io::json::Value* get(const std::string& key) const { return v_ ? v_->find(key) : nullptr; }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  std::vector<std::string> keys() const;
  bool boolean(const std::string& key, bool def) const;
  double number(const std::string& key, double def) const;
  std::string string(const std::string& key, const std::string& def) const;
  std::vector<double> numbers(const std::string& key) const;
  std::vector<index_t> integers(const std::string& key) const;
  std::vector<std::string> strings(const std::string& key) const;

 private:
  const io::json::Value* v_;
};

/// "a, b, c" (or "none"), for the lists of known names in error messages.
std::string join_names(const std::vector<std::string>& names);

/// An optional tensor of a call (an optional input such as bias or mask), nullptr when absent.
const io::StoredTensor* maybe(const io::TensorMap& m, const std::string& name);

/// Option `key` of the ops with derived bounds: softmax or softmax1 (default softmax1).
RowNorm token_normalizer(const Options& o, const std::string& key);

/// The attention ops' AttentionOptions: options normalizer, causal, key_lengths, null_logits,
/// scale, window, layout and the optional input tensors null_logits, bias and mask (mask: 1
/// visible / 0 masked, added to the bias as 0 / -inf).
AttentionOptions attention_call_options(const Options& o, const io::TensorMap& in);

/// The option keys of the depth ops (coupling, depth, depth_backward).
extern const std::vector<std::string> kDepthOptionKeys;
/// DepthOptions from those keys (profile, centring, headless, theta, beta, beta_max, score_clamp,
/// normalizer, coupling).
DepthOptions parse_depth_options(const Options& o, bool coupling_default);
/// Option "kinds" for n candidates (default: the embedding, then attention sublayers).
std::vector<SourceKind> parse_kinds(const Options& o, index_t n);

}  // namespace oasis::verify::detail
