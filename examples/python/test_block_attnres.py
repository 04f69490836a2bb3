"""Example: check a Block AttnRes routing written like Kimi's code, forward and backward.

Block AttnRes (Kimi, Attention Residuals Eq. 5-6) groups the sublayers into blocks: b_0 is the
token embedding, b_n the sum of block n's outputs, and the partial sum b_n^{i-1} of the current
block is carried as a running sum. Sublayer i of block n routes over [b_0, ..., b_{n-1}, b_n^{i-1}]
(the partial sum absent at a block's first sublayer) with the fused AttnRes routing. The oracle's
ops "block_attn_res" and "block_attn_res_backward" take the blocks and the partial sum as the
kernel does (docs/verify.md, "Fused AttnRes routing"): the partial sum's weight is alpha's last
row, and the gradients are the totals of the blocks and of the partial sum (through the mix and
through the keys).

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_block_attnres.py
"""

import pytest

torch = pytest.importorskip("torch", reason="this example checks a torch implementation (torch not installed)")

import oasis  # noqa: E402

EPS = 1e-6


def block_attn_res(blocks, partial_block, query, rms_weight, mistake=None):
    """blocks: a list of [B, T, D] block summaries; partial_block [B, T, D] or None.

    Returns h [B, T, D] and the weights p [n, B, T] (the partial sum's last)."""
    v = torch.stack(blocks + ([partial_block] if partial_block is not None else []))
    keys_of = v
    if mistake == "block summary detached":
        # a cached block summary enters the keys detached: no gradient through its key
        keys_of = torch.cat([v[: len(blocks)].detach(), v[len(blocks):]])
    k = keys_of * torch.rsqrt(keys_of.pow(2).mean(-1, keepdim=True) + EPS) * rms_weight
    p = torch.einsum("n...d,d->n...", k, query).softmax(dim=0)
    h = torch.einsum("n...,n...d->...d", p, v)
    return h, p


def run_model(n_blocks=3, sublayers_per_block=2, B=2, T=5, D=32, seed=0):
    """A tiny stack of linear sublayers wired as Block AttnRes; returns each routing call's tensors."""
    torch.manual_seed(seed)
    embedding = torch.randn(B, T, D)
    layers = [torch.nn.Linear(D, D) for _ in range(n_blocks * sublayers_per_block)]
    blocks, partial, calls = [embedding], None, []
    for i, layer in enumerate(layers):
        query = (0.3 * torch.randn(D)).requires_grad_()
        rms_weight = (1 + 0.1 * torch.randn(D)).requires_grad_()
        bl = [b.detach().requires_grad_() for b in blocks]
        pa = partial.detach().requires_grad_() if partial is not None else None
        calls.append((bl, pa, query, rms_weight))
        h, _ = block_attn_res(bl, pa, query, rms_weight)
        out = torch.tanh(layer(h)).detach()
        partial = out if partial is None else partial + out
        if (i + 1) % sublayers_per_block == 0:  # the block ends: its sum becomes a source
            blocks.append(partial)
            partial = None
    return calls


def tensors(blocks, partial, query, rms_weight):
    """The oracle's inputs: blocks [m, N, D] and partial [N, D], the tokens (B T) flattened."""
    D = query.shape[0]
    t = {"blocks": torch.stack([b.detach() for b in blocks]).reshape(len(blocks), -1, D), "w": query.detach(),
         "gain": rms_weight.detach()}
    if partial is not None:
        t["partial"] = partial.detach().reshape(-1, D)
    return t


OPTIONS = {"eps": EPS}  # softmax, no coupling, scale 1: the fused op's defaults (Kimi's routing)


def check_call(call, mistake=None):
    blocks, partial, query, rms_weight = call
    D = query.shape[0]
    h, p = block_attn_res(blocks, partial, query, rms_weight, mistake)
    fwd = oasis.check("block_attn_res", tensors(*call),
                      {"h": h.detach().reshape(-1, D), "alpha": p.detach().reshape(p.shape[0], -1)}, options=OPTIONS)
    grad_h = torch.randn_like(h)
    h.backward(grad_h)
    grads = {"grad_blocks": torch.stack([b.grad for b in blocks]).reshape(len(blocks), -1, D),
             "grad_w": query.grad, "grad_gain": rms_weight.grad}
    if partial is not None:
        grads["grad_partial"] = partial.grad.reshape(-1, D)
    bwd = oasis.check("block_attn_res_backward", {**tensors(*call), "grad_h": grad_h.reshape(-1, D)}, grads,
                      options=OPTIONS)
    return fwd, bwd


def test_every_routing_call_passes():
    calls = run_model()
    assert [len(c[0]) + (c[1] is not None) for c in calls] == [1, 2, 2, 3, 3, 4]  # the source sets of Eq. 5-6
    for call in calls:
        fwd, bwd = check_call(call)
        print(fwd)
        print(bwd)
        fwd.assert_ok()
        bwd.assert_ok()


def test_a_detached_block_summary_is_named_at_grad_blocks():
    call = run_model()[3]  # the second sublayer of block 1: blocks [b_0, b_1] and a partial sum
    fwd, bwd = check_call(call, mistake="block summary detached")
    fwd.assert_ok()  # the forward is the same function
    assert not bwd["grad_blocks"]["passed"]
    assert bwd["grad_partial"]["passed"] and bwd["grad_w"]["passed"]
