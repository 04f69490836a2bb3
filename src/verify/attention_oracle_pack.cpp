// src/verify/attention_oracle_pack.cpp — the fast oracle's packed keys and values of one (b, kv head)
// (AttnPacked, attention_oracle.hpp): K^T and |K|^T for the score products, rows [V | |V| | V^2]
// (VCol) for the mixing products, and the float sums' copies (float_sums.hpp) where the values allow them.
#include <algorithm>
#include <cmath>

#include "attention_oracle.hpp"
#include "float_sums.hpp"
#include "oracle_kernels.hpp"

namespace oasis::verify::detail {
namespace {
using kernels::kColumnQuantum;
using kernels::round_up;
}  // namespace

void pack_kv(const AttnCall& c, index_t b, index_t hk, AttnPacked& pk) {
  const index_t Tk = c.s.Tk, dh = c.s.d_h, dv = c.s.d_v;
  pk.b = b;
  pk.hk = hk;
  pk.tkp = round_up(Tk, kColumnQuantum) + kColumnQuantum;  // a block's window may start anywhere
  pk.dvp = round_up(dv, kColumnQuantum);
  pk.kt.assign(static_cast<std::size_t>(dh * pk.tkp), 0.0);
  pk.kta.assign(pk.kt.size(), 0.0);
  pk.vx.assign(static_cast<std::size_t>(Tk * pk.row_len()), 0.0);
  pk.vabs_prefix.assign(static_cast<std::size_t>((Tk + 1) * dv), 0.0);
  constexpr index_t kTile = 64;  // transpose K in tiles of keys (reads and writes stay in cache)
  for (index_t j0 = 0; j0 < Tk; j0 += kTile) {
    const index_t j1 = std::min(Tk, j0 + kTile);
    for (index_t x = 0; x < dh; ++x) {
      double* kt = pk.kt.data() + x * pk.tkp;
      double* ka = pk.kta.data() + x * pk.tkp;
      for (index_t j = j0; j < j1; ++j) {
        const double kx = c.krow(b, hk, j)[x];
        kt[j] = kx;
        ka[j] = std::abs(kx);
      }
    }
  }
  // |K|^T in float for Q (float_sums.hpp), where every k is in range
  pk.k_float = dh <= fsum::kMaxTerms;
  for (index_t x = 0; x < dh && pk.k_float; ++x) {
    const double* ka = pk.kta.data() + x * pk.tkp;
    for (index_t j = 0; j < Tk; ++j) pk.k_float = pk.k_float && fsum::in_range(ka[j]);
  }
  pk.ktaf.clear();
  if (pk.k_float) pk.ktaf.assign(pk.kta.begin(), pk.kta.end());  // each within u_f relative (in float's normal range) or 0
  for (index_t j = 0; j < Tk; ++j) {
    const double* vj = c.vrow(b, hk, j);
    double* row = pk.vx.data() + j * pk.row_len();
    double* pre = pk.vabs_prefix.data() + (j + 1) * dv;
    const double* prev = pk.vabs_prefix.data() + j * dv;
    for (index_t x = 0; x < dv; ++x) {
      row[pk.at(VCol::v) + x] = vj[x];
      row[pk.at(VCol::abs) + x] = std::abs(vj[x]);
      row[pk.at(VCol::squares) + x] = vj[x] * vj[x];
      pre[x] = prev[x] + std::abs(vj[x]);
    }
  }
  // the float sums' copies (float_sums.hpp), where every v is in their range
  pk.float_sums = Tk <= fsum::kMaxTerms;
  for (index_t j = 0; j < Tk && pk.float_sums; ++j) {
    const double* vj = c.vrow(b, hk, j);
    for (index_t x = 0; x < dv; ++x) pk.float_sums = pk.float_sums && fsum::in_range(vj[x]);
  }
  if (!pk.float_sums) return;
  pk.vf.assign(pk.vx.size(), 0.0f);
  pk.vnz_prefix.assign(static_cast<std::size_t>((Tk + 1) * dv), 0);
  pk.vmax.assign(static_cast<std::size_t>(dv), 0.0);
  for (index_t j = 0; j < Tk; ++j) {
    const double* vj = c.vrow(b, hk, j);
    float* row = pk.vf.data() + j * pk.row_len();
    std::int32_t* nz = pk.vnz_prefix.data() + (j + 1) * dv;
    const std::int32_t* nzp = pk.vnz_prefix.data() + j * dv;
    for (index_t x = 0; x < dv; ++x) {
      row[pk.at(VCol::v) + x] = static_cast<float>(vj[x]);
      row[pk.at(VCol::abs) + x] = static_cast<float>(std::abs(vj[x]));
      row[pk.at(VCol::squares) + x] = static_cast<float>(vj[x] * vj[x]);
      nz[x] = nzp[x] + (vj[x] != 0.0);
      pk.vmax[static_cast<std::size_t>(x)] = std::max(pk.vmax[static_cast<std::size_t>(x)], std::abs(vj[x]));
    }
  }
}

}  // namespace oasis::verify::detail
