// oasis/model/decode.hpp — incremental decoding of the AttnRes model .
//
// A Decoder holds one key/value cache per attention sublayer (post-RoPE keys and values of every
// position so far) and the position counter. Each step runs the new positions through
// Model::run: token attention sees the cache plus the new keys (causal, bottom-right aligned);
// depth routing is per token, so the depth sources of the step's tokens (v_i or block sums b_n
// and the partial sum) are built during the step. The logits of every step equal the matching rows of the full forward, bit for bit: every
// row is computed by the same operations in the same order.
#pragma once

#include "oasis/model/model.hpp"

namespace oasis::model {

/// Incremental decoding: feed one or more new positions at a time; the logits of every step
/// equal the corresponding rows of the full forward (same operations in the same order).
template <class T>
class Decoder {
 public:
  Decoder(const Model<T>& model, index_t batch) : model_(&model), state_(model.new_state(batch)) {}

  /// New token ids [B * Tn] (row-major (b, t)).
  ForwardResult<T> step(const std::vector<index_t>& ids, index_t Tn, const ForwardOptions& opt = {}) {
    return model_->run(state_, model_->embed(ids, state_.batch, Tn), state_.batch, Tn, opt);
  }
  /// New input embeddings [B, Tn, d].
  ForwardResult<T> step_embeddings(const Tensor<T>& x, const ForwardOptions& opt = {}) {
    require_rank(x, 3, "x", "[B, T, d]");
    OASIS_REQUIRE(x.dim(0) == state_.batch, "x", "batch ", x.dim(0), " differs from the decoder's ", state_.batch);
    return model_->run(state_, model_->embed_rows(x), state_.batch, x.dim(1), opt);
  }
  index_t length() const { return state_.length; }
  const DecodeState<T>& state() const { return state_; }
  void reset() { state_ = model_->new_state(state_.batch); }

 private:
  const Model<T>* model_;
  DecodeState<T> state_;
};

}  // namespace oasis::model

#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_MODEL_INSTANTIATING)
extern template class oasis::model::Decoder<float>;
extern template class oasis::model::Decoder<double>;
extern template class oasis::model::Decoder<long double>;
extern template class oasis::model::Decoder<::oasis::mp50>;
#endif
