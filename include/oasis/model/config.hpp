// oasis/model/config.hpp — configuration of the Attention-Residual transformer oracle (docs/spec.md §2–4).
//
// One configuration names every convention on which peer implementations differ; each option
// has a named default, listed in docs/model.md. validate() rejects inconsistent settings with an
// oasis::invalid_argument naming the field.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/core/error.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/ops/variant.hpp"

namespace oasis::model {

/// The depth-router family (docs/spec.md §4).
enum class RouterFamily {
  kimi_full,     ///< Full AttnRes: every sublayer output is a source, g = w^T RMSNorm(v_i)
  kimi_block,    ///< Block AttnRes: sources are block sums b_n and the partial sum b_n^{i-1}
  authors_code,  ///< the authors' router: cumulative states, low-rank q/k, recency bias
};

/// What feeds the final RMSNorm and LM head (docs/spec.md §4, "Readout").
enum class Readout {
  final_attnres,  ///< a final AttnRes op with its own pseudo-query over all sources (Kimi default)
  sum,            ///< plain sum of all sources
  last,           ///< the last routed state (authors' default; Kimi: h_L + v_L, see docs/model.md)
};

/// RoPE pairing (docs/spec.md §2): both layouts exist in peer code.
enum class RopeLayout {
  rotate_half,  ///< HF Llama: pairs (c, c + d_h/2)
  interleaved,  ///< pairs (2c, 2c + 1)
};

/// Estimator of the per-head null probability feeding psi (docs/spec.md §3).
enum class PsiEstimator {
  p_null,        ///< p_null = exp(s - LSE1) from the normaliser (library default)
  mass_deficit,  ///< max(0, 1 - sum_j p_j) (the authors' code)
};

std::string_view to_string(RouterFamily r);
RouterFamily parse_router_family(std::string_view name);
std::string_view to_string(Readout r);
Readout parse_readout(std::string_view name);
std::string_view to_string(RopeLayout r);
RopeLayout parse_rope_layout(std::string_view name);
std::string_view to_string(PsiEstimator e);
PsiEstimator parse_psi_estimator(std::string_view name);

struct ModelConfig {
  // --- sizes -------------------------------------------------------------------------------------
  index_t vocab_size = 32;
  index_t d_model = 16;
  index_t n_blocks = 2;     ///< transformer blocks; L = 2 * n_blocks sublayers (attention, MLP)
  index_t n_heads = 2;
  index_t n_kv_heads = 0;   ///< 0: equal to n_heads (no grouping); must divide n_heads
  index_t d_head = 0;       ///< 0: d_model / n_heads
  index_t d_ff = 32;        ///< SwiGLU hidden width

  // --- variant (docs/spec.md §4 table) and router -----------------------------------------------------------
  Variant variant = Variant::oasis;
  RouterFamily router = RouterFamily::kimi_full;
  index_t block_size = 2;   ///< S, sublayers per block (kimi_block only); S = 1 is Full AttnRes
  /// Explicit block sizes (kimi_block only; empty: blocks of block_size, the last one possibly
  /// shorter). Positive, summing to n_sublayers(); e.g. {2, 2, 1, 1} for 6 sublayers. A block may
  /// start at an MLP sublayer (docs/spec.md §4's "boundaries fall before attention sublayers" holds for even
  /// uniform S); a block without an attention sublayer is head-less (docs/model.md).
  std::vector<index_t> block_sizes;
  std::optional<Readout> readout;            ///< empty: final_attnres (kimi), last (authors_code), sum (original)
  /// Overrides the variant's token normaliser (any RowNorm of the core, e.g. baselines').
  std::optional<RowNorm> token_normalizer;

  // --- coupling ------------------------------------------------------------------------------------
  /// Empty: CouplingOptions::paper_v2() for kimi routers, CouplingOptions::authors_code() for authors_code.
  std::optional<CouplingOptions> coupling;
  /// Fixed beta for every router (overrides the learned theta; beta = 0 reproduces AoS exactly).
  std::optional<double> beta;
  PsiEstimator psi_estimator = PsiEstimator::p_null;

  // --- conventions ---------------------------------------------------------------------------------
  RopeLayout rope = RopeLayout::rotate_half;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;            ///< eps of the pre-norms, the final norm and the q/k norms
  /// Evaluate the pre-norms, the q/k norms and the final norm in float32 and cast back (PyTorch
  /// code that upcasts norms whatever the model dtype); the depth key norm has its own flag.
  bool norm_float32 = false;
  bool qk_norm = false;              ///< per-head RMSNorm of q and k before RoPE (Qwen3)
  KeyNormOptions key_norm{};         ///< depth-router key RMSNorm: eps (1e-6) and float32 evaluation
  bool key_norm_gain = false;        ///< learned gain of the depth key norm (init 1); false: none
  index_t authors_rank = 0;          ///< authors' q/k width; 0: max(d_model / 4, 64)
  bool tie_embeddings = false;       ///< LM head shares embed_tokens.weight

  // --- attention baselines inside the model (oasis/research/baselines.hpp, docs/model.md) -------
  /// Gated attention: each head's context times sigmoid(<RMSNorm(h)_t, w_h> + c_h) before W_o
  /// (oasis::head_gates; parameters layers.{b}.attn.head_gate.weight [H, d], .bias [H]).
  bool gated_attention = false;
  /// S2 prefix sink: a learned key and value per kv head prepended at key position 0, visible to
  /// every query, not rotated by RoPE (oasis::prefix_sink_attention; parameters
  /// layers.{b}.attn.sink_key / sink_value [H_kv, d_h]).
  bool prefix_sink = false;

  // --- initialisation ------------------------------------------------------------------------------
  double init_std = 0.02;            ///< linear and embedding weights ~ N(0, init_std^2)
  double theta_init = -5.0;          ///< beta = softplus(theta) ≈ 0.0067153 at init

  index_t n_sublayers() const { return 2 * n_blocks; }
  /// Options of every RMSNorm but the depth key norm (pre-norms, q/k norms, final norm).
  KeyNormOptions norm_options() const { return KeyNormOptions{norm_eps, norm_float32}; }
  /// First sublayer of every depth block (kimi_block: block_sizes or blocks of block_size;
  /// kimi_full: every sublayer), in order.
  std::vector<index_t> block_starts() const {
    std::vector<index_t> s;
    const index_t L = n_sublayers();
    if (router == RouterFamily::kimi_block && !block_sizes.empty()) {
      index_t at = 0;
      for (index_t k : block_sizes) { s.push_back(at); at += k; }
    } else {
      const index_t S = router == RouterFamily::kimi_block ? block_size : 1;
      for (index_t at = 0; at < L; at += S) s.push_back(at);
    }
    return s;
  }
  index_t kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  index_t head_dim() const { return d_head ? d_head : (n_heads ? d_model / n_heads : 0); }
  index_t authors_width() const {
    return authors_rank ? authors_rank : std::max<index_t>(d_model / 4, 64);
  }
  Readout readout_or_default() const {
    if (readout) return *readout;
    if (!attn_res()) return Readout::sum;  // standard residual stream: sum of all sources = last state
    return router == RouterFamily::authors_code ? Readout::last : Readout::final_attnres;
  }
  CouplingOptions coupling_or_default() const {
    return coupling ? *coupling
                    : (router == RouterFamily::authors_code ? CouplingOptions::authors_code()
                                                            : CouplingOptions::paper_v2());
  }
  RowNorm token_norm() const { return token_normalizer ? *token_normalizer : variant_spec(variant).token; }
  bool attn_res() const { return variant_spec(variant).attn_res; }
  /// Whether the forward error rules (layers.hpp, router.hpp) are derived for this configuration:
  /// not for gated attention or the prefix sink.
  bool forward_bound_derived() const { return !gated_attention && !prefix_sink; }

  /// The authors' published configuration: their router, centring, clamps and psi estimator.
  static ModelConfig authors_profile() { return authors_profile(ModelConfig{}); }
  static ModelConfig authors_profile(ModelConfig base) {
    base.router = RouterFamily::authors_code;
    base.readout = Readout::last;
    base.coupling = CouplingOptions::authors_code();
    base.psi_estimator = PsiEstimator::mass_deficit;
    return base;
  }

  void validate() const {
    OASIS_REQUIRE(vocab_size > 0, "vocab_size", "must be positive, got ", vocab_size);
    OASIS_REQUIRE(d_model > 0, "d_model", "must be positive, got ", d_model);
    OASIS_REQUIRE(n_blocks > 0 && n_blocks <= INT64_MAX / 2, "n_blocks", "must be positive and 2 * n_blocks must fit index_t, got ", n_blocks);
    OASIS_REQUIRE(n_heads > 0, "n_heads", "must be positive, got ", n_heads);
    OASIS_REQUIRE(n_kv_heads >= 0 && kv_heads() > 0 && n_heads % kv_heads() == 0, "n_kv_heads",
                  "must divide n_heads = ", n_heads, ", got ", n_kv_heads);
    OASIS_REQUIRE(d_head >= 0 && head_dim() > 0, "d_head", "must be positive (d_model / n_heads when 0)");
    OASIS_REQUIRE(d_head != 0 || d_model % n_heads == 0, "d_head",
                  "is 0 (derived) but n_heads = ", n_heads, " does not divide d_model = ", d_model);
    OASIS_REQUIRE(head_dim() % 2 == 0, "d_head", "RoPE needs an even head width, got ", head_dim());
    OASIS_REQUIRE(d_ff > 0, "d_ff", "must be positive, got ", d_ff);
    OASIS_REQUIRE(block_size >= 1, "block_size", "must be >= 1, got ", block_size);
    if (!block_sizes.empty()) {
      OASIS_REQUIRE(router == RouterFamily::kimi_block, "block_sizes", "belongs to the kimi_block router, not ",
                    to_string(router));
      index_t total = 0;
      for (index_t k : block_sizes) {
        OASIS_REQUIRE(k >= 1, "block_sizes", "every block needs at least one sublayer, got ", k);
        OASIS_REQUIRE(k <= n_sublayers() - total, "block_sizes", "sum to more than n_sublayers = 2 * n_blocks = ",
                      n_sublayers());
        total += k;
      }
      OASIS_REQUIRE(total == n_sublayers(), "block_sizes", "sum to ", total, " but the model has n_sublayers = 2 * n_blocks = ",
                    n_sublayers());
    }
    OASIS_REQUIRE(authors_rank >= 0, "authors_rank", "must be >= 0, got ", authors_rank);
    // Every parameter's element count must fit index_t (checked products: the shapes of
    // parameter_specs multiply these sizes; the largest of each kind is listed).
    auto fits = [](const char* field, const Shape& shape, const char* what) {
      std::uint64_t n = 0;
      OASIS_REQUIRE(checked_numel(shape, static_cast<std::uint64_t>(INT64_MAX), &n), field, "makes ", what, " ",
                    shape_str(shape), " too large: its element count overflows index_t");
    };
    fits("vocab_size", {vocab_size, d_model}, "embed_tokens.weight");
    fits("d_head", {n_heads, head_dim(), d_model}, "the q projection [n_heads, d_head, d_model] =");
    fits("d_ff", {d_ff, d_model}, "the MLP projection");
    fits("authors_rank", {authors_width(), d_model}, "the authors' router projection");
    OASIS_REQUIRE(std::isfinite(rope_theta) && rope_theta > 1, "rope_theta", "must be finite and > 1");
    OASIS_REQUIRE(std::isfinite(norm_eps) && norm_eps > 0, "norm_eps", "must be finite and positive");
    OASIS_REQUIRE(std::isfinite(key_norm.eps) && key_norm.eps > 0, "key_norm.eps", "must be finite and positive");
    OASIS_REQUIRE(std::isfinite(init_std) && init_std >= 0, "init_std", "must be finite and >= 0");
    OASIS_REQUIRE(std::isfinite(theta_init), "theta_init", "must be finite");
    OASIS_REQUIRE(!beta || (std::isfinite(*beta) && *beta >= 0), "beta", "must be finite and >= 0");
    const Readout r = readout_or_default();
    OASIS_REQUIRE(!attn_res() || router != RouterFamily::authors_code || r == Readout::last, "readout",
                  "the authors_code router routes cumulative states; only 'last' is defined, got ",
                  to_string(r));
    OASIS_REQUIRE(attn_res() || !readout || r == Readout::last || r == Readout::sum, "readout",
                  "the original backbone has a standard residual stream: use 'sum' or 'last' (equal), got ",
                  to_string(r));
  }
};

inline std::string_view to_string(RouterFamily r) {
  switch (r) {
    case RouterFamily::kimi_full: return "kimi_full";
    case RouterFamily::kimi_block: return "kimi_block";
    case RouterFamily::authors_code: return "authors_code";
  }
  throw invalid_argument("router", "unknown router family value");
}
inline RouterFamily parse_router_family(std::string_view name) {
  if (name == "kimi_full") return RouterFamily::kimi_full;
  if (name == "kimi_block") return RouterFamily::kimi_block;
  if (name == "authors_code") return RouterFamily::authors_code;
  throw invalid_argument("router", "unknown router family '" + std::string(name) +
                                       "' (expected kimi_full, kimi_block or authors_code)");
}
inline std::string_view to_string(Readout r) {
  switch (r) {
    case Readout::final_attnres: return "final_attnres";
    case Readout::sum: return "sum";
    case Readout::last: return "last";
  }
  throw invalid_argument("readout", "unknown readout value");
}
inline Readout parse_readout(std::string_view name) {
  if (name == "final_attnres") return Readout::final_attnres;
  if (name == "sum") return Readout::sum;
  if (name == "last") return Readout::last;
  throw invalid_argument("readout", "unknown readout '" + std::string(name) +
                                        "' (expected final_attnres, sum or last)");
}
inline std::string_view to_string(RopeLayout r) { return r == RopeLayout::rotate_half ? "rotate_half" : "interleaved"; }
inline RopeLayout parse_rope_layout(std::string_view name) {
  if (name == "rotate_half") return RopeLayout::rotate_half;
  if (name == "interleaved") return RopeLayout::interleaved;
  throw invalid_argument("rope", "unknown RoPE layout '" + std::string(name) +
                                     "' (expected rotate_half or interleaved)");
}
inline std::string_view to_string(PsiEstimator e) { return e == PsiEstimator::p_null ? "p_null" : "mass_deficit"; }
inline PsiEstimator parse_psi_estimator(std::string_view name) {
  if (name == "p_null") return PsiEstimator::p_null;
  if (name == "mass_deficit") return PsiEstimator::mass_deficit;
  throw invalid_argument("psi_estimator", "unknown psi estimator '" + std::string(name) +
                                              "' (expected p_null or mass_deficit)");
}

}  // namespace oasis::model
