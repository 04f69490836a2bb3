// src/cuda/backward_cuda.cpp — host side of the CUDA attention backward: Backend::cuda's entry
// point detail::cuda_token_attention_backward (entry_points.hpp). It validates as the reference
// does, runs the fused forward (attention.cu, keeping each row's state M, S), then the backward
// kernels of attention_backward.cu (rows, dkdv, dq), and finishes on the host what is a short
// sum in the reference's order: each head's null-logit gradient (sum over b, t of the rows' ds)
// and, when asked for, the bias gradient (dL/dz summed over the bias's broadcast axes) and the
// scores' gradient.
#include <cuda_runtime_api.h>

#include "device_util.hpp"
#include "entry_points.hpp"
#include "launch_backward.hpp"

namespace oasis::detail {

AttentionGrads<float> cuda_token_attention_backward(const Tensor<float>& q, const Tensor<float>& k,
                                                    const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                    const AttentionOptions& opt) {
  using namespace cuda::detail;
  const AttentionShape s = check_attention_args(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  check_cuda_attention_limits(s, opt.normalizer);
  check_masked_rows(s, opt);
  require_device();

  const std::size_t rows = static_cast<std::size_t>(s.B * s.H * s.Tq);
  const bool want_dz = opt.return_probs || !opt.bias.empty();
  DeviceBuffer<float> q_dev = to_device(q), k_dev = to_device(k), v_dev = to_device(v);
  AttentionLaunch a = layout_launch(io::DType::f32, q_dev.get(), k_dev.get(), v_dev.get(), s, opt.layout);
  const DeviceAttentionOptions options = set_attention_options(a, s, opt);
  // the fused forward, keeping each row's final state (M, S) for the recomputed probabilities
  const DeviceAttentionOutputs fwd = run_forward(
      a, s, opt, true, [](const AttentionLaunch& l) { check(launch_attention(l, nullptr), "fused attention launch"); });
  Tensor<float> lse_host({s.B, s.H, s.Tq});
  fwd.lse.download(lse_host.data());
  check_masked_lse(s, opt, lse_host);

  DeviceBuffer<float> dout = to_device(d.out), dlse = to_device(d.lse), dpn = to_device(d.p_null);
  DeviceBuffer<float> inv(rows), D(rows), ds(rows);
  DeviceBuffer<float> gq(static_cast<std::size_t>(q.size())), gk(static_cast<std::size_t>(k.size())),
      gv(static_cast<std::size_t>(v.size()));
  DeviceBuffer<float> dz(want_dz ? rows * static_cast<std::size_t>(s.Tk) : 0);
  if (want_dz) check(cudaMemset(dz.get(), 0, dz.size() * sizeof(float)), "cudaMemset");
  AttentionBackwardLaunch g;
  g.dout = dout.get();
  g.dlse = d.lse.empty() ? nullptr : dlse.get();
  g.dp_null = d.p_null.empty() ? nullptr : dpn.get();
  g.row_inv = inv.get();
  g.row_D = D.get();
  g.row_ds = ds.get();
  g.dq = gq.get();
  g.dk = gk.get();
  g.dv = gv.get();
  g.dz = want_dz ? dz.get() : nullptr;
  check(launch_attention_backward_rows(a, g, nullptr), "attention backward rows launch");
  check(launch_attention_backward_dkdv(a, g, nullptr), "attention backward dk/dv launch");
  check(launch_attention_backward_dq(a, g, nullptr), "attention backward dq launch");

  AttentionGrads<float> r;
  r.q = Tensor<float>(q.shape());
  r.k = Tensor<float>(k.shape());
  r.v = Tensor<float>(v.shape());
  gq.download(r.q.data());
  gk.download(r.k.data());
  gv.download(r.v.data());
  Tensor<float> row_ds({s.B, s.H, s.Tq});
  ds.download(row_ds.data());
  Tensor<float> dz_host;
  if (want_dz) {
    dz_host = Tensor<float>({s.B, s.H, s.Tq, s.Tk});
    dz.download(dz_host.data());
  }
  check(cudaDeviceSynchronize(), "attention backward kernels");

  if (opt.normalizer == RowNorm::softmax1) {  // ds_h = sum over (b, t), in the reference's order
    r.null_logits = Tensor<float>({s.H});
    for (index_t h = 0; h < s.H; ++h) {
      float x = 0.0f;
      for (index_t b = 0; b < s.B; ++b)
        for (index_t t = 0; t < s.Tq; ++t) x += row_ds(b, h, t);
      r.null_logits[h] = x;
    }
  }
  if (!opt.bias.empty()) {  // dz summed over the broadcast axes, in the reference's (b, h) order
    const Tensor<double>& bi = opt.bias;  // the gradient of the bias takes its (broadcast) shape
    r.bias = Tensor<float>(bi.shape());
    for (index_t b = 0; b < s.B; ++b)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t t = 0; t < s.Tq; ++t)
          for (index_t j = 0; j < s.Tk; ++j) {
            r.bias[attention_bias_offset(opt, b, h, t, j)] += dz_host(b, h, t, j);
          }
  }
  if (opt.return_probs) r.scores = std::move(dz_host);
  return r;
}

}  // namespace oasis::detail
