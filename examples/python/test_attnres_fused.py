"""Example: check a fused AttnRes routing written like fla's naive_attnres, forward and backward.

fla's AttnRes (flash-linear-attention, naive_attnres) mixes L residual sources per token: the keys
are the sources through RMSNorm (eps, gain rms_weight), the logits the keys against one learned
pseudo-query times `scale`, a softmax over depth, and the output the weighted sum of the raw
sources. The logits are never returned: the oracle's op "attn_res" recomputes them and takes their
rounding into the bound of the weights (docs/verify.md, "Fused AttnRes routing"); op
"attn_res_backward" checks the gradients autograd gives, grad_sources being the total (through the
mix and through the keys).

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_attnres_fused.py
"""

import pytest

torch = pytest.importorskip("torch", reason="this example checks a torch implementation (torch not installed)")

import oasis  # noqa: E402

EPS, SCALE = 1e-6, 0.5


def naive_attnres(query, residuals, rms_weight, rms_eps=EPS, scale=SCALE, mistake=None):
    """residuals [L, B, T, D], query and rms_weight [D]; returns o [B, T, D] and p [L, B, T]."""
    v = residuals.float()
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + rms_eps) * rms_weight.float()  # F.rms_norm
    if mistake == "raw dot":
        k = v
    p = torch.einsum("l...d,d->l...", k, query.flatten().float() * scale).softmax(dim=0)
    o = torch.einsum("l...,l...d->...d", p, v).to(residuals.dtype)
    return o, p


@pytest.fixture
def data():
    torch.manual_seed(0)
    L, B, T, D = 4, 2, 6, 32
    residuals = torch.randn(L, B, T, D) * torch.arange(1, L + 1).view(L, 1, 1, 1)
    return (torch.randn(D).requires_grad_(), residuals.requires_grad_(), (1 + 0.1 * torch.randn(D)).requires_grad_())


def inputs(query, residuals, rms_weight):
    """The oracle's [n, N, d] sources: the tokens (B T) flattened."""
    L, D = residuals.shape[0], residuals.shape[-1]
    return {"sources": residuals.detach().reshape(L, -1, D), "w": query.detach(), "gain": rms_weight.detach()}


OPTIONS = {"scale": SCALE, "eps": EPS}  # normalizer softmax and no coupling: the op's defaults


def test_forward_and_backward_pass(data):
    query, residuals, rms_weight = data
    o, p = naive_attnres(query, residuals, rms_weight)
    L, D = residuals.shape[0], residuals.shape[-1]
    report = oasis.check("attn_res", inputs(*data), {"h": o.detach().reshape(-1, D), "alpha": p.detach().reshape(L, -1)},
                         options=OPTIONS)
    print(report)
    report.assert_ok()

    grad_o = torch.randn_like(o)
    o.backward(grad_o)
    report = oasis.check("attn_res_backward", {**inputs(*data), "grad_h": grad_o.reshape(-1, D)},
                         {"grad_sources": residuals.grad.reshape(L, -1, D), "grad_w": query.grad,
                          "grad_gain": rms_weight.grad}, options=OPTIONS)
    print(report)
    report.assert_ok()


def test_logits_without_the_rmsnorm_are_caught(data):
    query, residuals, rms_weight = data
    o, p = naive_attnres(query, residuals, rms_weight, mistake="raw dot")
    L, D = residuals.shape[0], residuals.shape[-1]
    report = oasis.check("attn_res", inputs(*data), {"h": o.detach().reshape(-1, D), "alpha": p.detach().reshape(L, -1)},
                         options=OPTIONS)
    assert not report["alpha"]["passed"]
