"""Example: check sink attention through the interfaces inference kernels really have.

Three torch implementations written the way kernels lay their data out, each checked in one call
on its own tensors (docs/verify.md, "Packed (THD) and paged layouts" and "The split-KV merge"):

* packed variable-length batches (THD with cu_seqlens, as FlashAttention varlen): out
  [total_q, H, d], LSE [H, total_q];
* a paged KV cache (vLLM / FlashInfer decoding): k_cache, v_cache [num_blocks, block_size, H_kv, d],
  block_table [B, max_blocks], seq_lens [B];
* split-KV decoding: each split's partial output and LSE over its keys, merged with the sink
  (op attention_merge, form B: judged split by split and at the merge).

Each also has the bug class reported for it, caught at the tensor it corrupts.

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_kernel_layouts.py
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="this example checks torch implementations (torch not installed)")

import oasis  # noqa: E402

H, D = 4, 32
SCALE = D ** -0.5


def sink_attention(q, k, v, sinks, causal):
    """One sequence: q [H, Tq, D], k, v [H, Tk, D], sinks [H]; Softmax1 with the sink as the null
    logit. Returns out [H, Tq, D] and LSE1 [H, Tq] (the LSE with the sink), in nats."""
    Tq, Tk = q.shape[1], k.shape[1]
    s = (q @ k.transpose(-1, -2)) * SCALE
    if causal:  # bottom-right aligned: query t sees keys j <= t + Tk - Tq
        j = torch.arange(Tk).view(1, Tk)
        t = torch.arange(Tq).view(Tq, 1)
        s = s.masked_fill(j > t + (Tk - Tq), float("-inf"))
    lse = torch.logsumexp(torch.cat([s, sinks.view(-1, 1, 1).expand(-1, Tq, 1)], dim=-1), dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


@pytest.fixture
def sinks():
    torch.manual_seed(0)
    return 2.0 * torch.randn(H)


# ---- packed variable-length batches (THD) ------------------------------------------------------------


def varlen_attention(q, k, v, cu_q, cu_k, sinks, mistake=None):
    """q [total_q, H, D], k, v [total_k, H, D]: each sequence's rows packed one after another."""
    out = torch.zeros_like(q)
    lse = torch.zeros(H, q.shape[0])
    max_q = int(max(np.diff(cu_q)))
    for i in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        o, l = sink_attention(q[qs].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1), sinks, True)
        out[qs] = o.transpose(0, 1)
        if mistake == "LSE written at dense offsets":  # the padded layout's columns i max_q + t, where they fit
            cols = torch.arange(l.shape[1]) + i * max_q
            keep = cols < lse.shape[1]
            lse[:, cols[keep]] = l[:, keep]
        else:
            lse[:, qs] = l
    return out, lse


@pytest.mark.parametrize("mistake", [None, "LSE written at dense offsets"])
def test_packed_varlen(sinks, mistake):
    cu_q, cu_k = np.array([0, 5, 6, 19]), np.array([0, 9, 16, 29])  # Tq 5, 1, 13 against Tk 9, 7, 13
    torch.manual_seed(1)
    q, k, v = (torch.randn(int(c[-1]), H, D) for c in (cu_q, cu_k, cu_k))
    out, lse = varlen_attention(q, k, v, cu_q, cu_k, sinks, mistake)
    report = oasis.check("attention", {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
                                       "null_logits": sinks}, {"out": out, "lse": lse},
                         options={"layout": "thd", "causal": True})
    print(report)
    if mistake is None:
        report.assert_ok()
    else:
        assert report["out"]["passed"] and not report["lse"]["passed"]


# ---- a paged KV cache -----------------------------------------------------------------------------------

BLOCK = 16


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, sinks, mistake=None):
    """q [B, H, 1, D]: one new token per sequence; its keys are the first seq_lens[b] slots of the
    blocks block_table[b] lists, in order."""
    outs, lses = [], []
    for b, n in enumerate(seq_lens):
        blocks = block_table[b, : -(-n // BLOCK)]
        keys = k_cache[blocks].reshape(-1, H, D)
        vals = v_cache[blocks].reshape(-1, H, D)
        if mistake != "the last block read in full":
            keys, vals = keys[:n], vals[:n]
        o, l = sink_attention(q[b], keys.transpose(0, 1), vals.transpose(0, 1), sinks, True)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("mistake", [None, "the last block read in full"])
def test_paged_decode(sinks, mistake):
    torch.manual_seed(2)
    seq_lens = np.array([37, 16, 5])
    num_blocks, max_blocks = 12, 3
    k_cache, v_cache = torch.randn(num_blocks, BLOCK, H, D), torch.randn(num_blocks, BLOCK, H, D)
    block_table = np.full((3, max_blocks), -1)  # unused entries may hold anything
    free = list(np.random.default_rng(3).permutation(num_blocks))
    for b, n in enumerate(seq_lens):
        for j in range(-(-n // BLOCK)):
            block_table[b, j] = free.pop()
    q = torch.randn(3, H, 1, D)
    out, lse = paged_decode(q, k_cache, v_cache, block_table, seq_lens, sinks, mistake)
    report = oasis.check("attention", {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                                       "seq_lens": seq_lens, "null_logits": sinks}, {"out": out, "lse": lse},
                         options={"causal": True})
    print(report)
    if mistake is None:
        report.assert_ok()
    else:  # stale slots of the last blocks enter the softmax
        assert not report["out"]["passed"] and not report["lse"]["passed"]


# ---- split-KV decoding and the merge --------------------------------------------------------------------

SPLIT = 16


def split_kv_decode(q, k, v, sinks, mistake=None):
    """q [B, H, Tq, D], k, v [B, H, Tk, D]: each split's partial softmax over its keys (no sink),
    then the merge adds the sink once. Returns out_parts [S, B, H, Tq, D], lse_parts [S, B, H, Tq],
    out, lse."""
    Tk = k.shape[2]
    parts, lses = [], []
    for a in range(0, Tk, SPLIT):
        s = (q @ k[:, :, a:a + SPLIT].transpose(-1, -2)) * SCALE
        if mistake == "the sink in every split":
            s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], dim=-1)
            l = torch.logsumexp(s, dim=-1)
            parts.append(torch.exp(s[..., :-1] - l[..., None]) @ v[:, :, a:a + SPLIT])
        else:
            l = torch.logsumexp(s, dim=-1)
            parts.append(torch.exp(s - l[..., None]) @ v[:, :, a:a + SPLIT])
        lses.append(l)
    out_parts, lse_parts = torch.stack(parts), torch.stack(lses)
    sink = sinks.view(1, -1, 1).expand_as(lse_parts[0])
    terms = lse_parts if mistake == "the sink in every split" else torch.cat([lse_parts, sink[None]])
    lse = torch.logsumexp(terms, dim=0)
    out = (torch.exp(lse_parts - lse)[..., None] * out_parts).sum(0)
    return out_parts, lse_parts, out, lse


@pytest.mark.parametrize("mistake", [None, "the sink in every split"])
def test_split_kv_decode(sinks, mistake):
    torch.manual_seed(4)
    q, k, v = torch.randn(2, H, 1, D), torch.randn(2, H, 70, D), torch.randn(2, H, 70, D)
    out_parts, lse_parts, out, lse = split_kv_decode(q, k, v, sinks, mistake)
    report = oasis.check("attention_merge", {"q": q, "k": k, "v": v, "null_logits": sinks},
                         {"out_parts": out_parts, "lse_parts": lse_parts, "out": out, "lse": lse},
                         options={"split_size": SPLIT})
    print(report)
    if mistake is None:
        report.assert_ok()
    else:  # each split's LSE holds the sink (sink_in "merge": it should not), and the merge counts it 5 times
        assert not report["lse_parts"]["passed"] and not report["lse"]["passed"] and not report["out"]["passed"]
