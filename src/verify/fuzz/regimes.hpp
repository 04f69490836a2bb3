// src/verify/fuzz/regimes.hpp — the regimes' generators behind oasis/verify/fuzz.hpp. A regime
// fills a Case at given sizes; regimes_attention.cpp holds the attention ops' (normalizer too),
// regimes_other.cpp the psi, depth, pseudo-query and fused and block AttnRes ops', regimes_merge.cpp
// attention_merge's.
// The catalogue is docs/fuzz.md.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "oasis/verify/fuzz.hpp"

namespace oasis::verify::fuzz::detail {

/// splitmix64 with Box-Muller normals: the same stream on every platform, so a printed seed
/// regenerates its case anywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  ///< [0, 1)
  double normal();
  index_t below(index_t n) { return static_cast<index_t>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t s_;
};

/// A mixed 64-bit hash (the seed of one run from the fuzz seed, the regime and the dtype).
std::uint64_t mix(std::uint64_t a, std::uint64_t b);
std::uint64_t hash_text(const std::string& s);

/// One regime: its catalogue entry and its generator.
struct Regime {
  RegimeInfo info;
  std::vector<Dims> start;  ///< per variant: the sizes a run starts at
  Dims least;               ///< the least sizes it needs (the shrinker's floor)
  /// Fill c.inputs and c.options at c.dims (c.op, c.dtype set); may adjust c.dims to what the
  /// regime needs (a GQA ratio, a length tied to another).
  std::function<void(Case& c, int variant, Rng& rng)> generate;
};

/// A regime from its catalogue entry, its variants (label, starting sizes), its least sizes and its generator.
Regime make_regime(std::string name, std::vector<std::string> ops, std::string description, std::string targets,
                   std::vector<std::string> needs, std::vector<std::pair<std::string, Dims>> variants, Dims least,
                   std::function<void(Case&, int, Rng&)> generate);

void add_attention_regimes(std::vector<Regime>& out);
void add_other_regimes(std::vector<Regime>& out);
void add_merge_regimes(std::vector<Regime>& out);

/// The whole catalogue, in run order.
const std::vector<Regime>& catalogue();

/// The family of an op: "attention" (attention, attention_backward), "normalizer", "psi"
/// (psi, psi_backward), "depth" (depth, depth_backward, coupling), "pseudo_query" (and its backward),
/// "merge" (attention_merge), "attn_res" (attn_res, attn_res_backward, block_attn_res,
/// block_attn_res_backward).
std::string family(const std::string& op);

/// Which Dims fields an op's cases use, in the shrinker's order.
std::vector<std::string> dim_fields(const std::string& op);
index_t& dim_ref(Dims& d, const std::string& field);
index_t dim_get(const Dims& d, const std::string& field);

/// The features a case exercises (Tq < Tk: "decode", H > Hkv: "gqa", ...): a case needing one the
/// kernel lacks is not admissible.
std::set<std::string> case_features(const Case& c);

// ---- helpers for the generators -----------------------------------------------------------------

/// A tensor of `shape` in dtype d, each value f(i) rounded to d (RNE, overflow to +-inf).
io::StoredTensor make_tensor(io::DType d, const Shape& shape, const std::function<double(index_t)>& f);
/// Standard normal entries times `scale`.
io::StoredTensor randn(io::DType d, const Shape& shape, Rng& rng, double scale = 1.0);
/// The largest finite value of d.
double dtype_max(io::DType d);
std::string num(double x);  ///< a JSON number literal (finite x)

}  // namespace oasis::verify::fuzz::detail
