"""Example: check a gpt-oss-style attention with learned sinks, written in torch, with pytest.

gpt-oss gives every query head h a learned "sink" logit s_h: the softmax runs over the keys plus
one extra column holding s_h, and that column is dropped before the values are mixed, so the
weights of the keys sum to 1 - p_sink. That is softmax with a null category of logit s_h
(docs/spec.md §1): the oracle's op "attention" with normalizer softmax1 and null_logits = the sinks, its
p_null being the sink probability and its lse the log-sum-exp over the keys and the sink.

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_gpt_oss_sinks.py
"""

import pytest

torch = pytest.importorskip("torch", reason="this example checks a torch implementation (torch not installed)")

import oasis  # noqa: E402


def sinks_attention(q, k, v, sinks, *, mistake=None):
    """Causal grouped-query attention with sinks, in the dtype of q.

    q [B, T, H, d], k and v [B, T, H_kv, d] (the gpt-oss layout), sinks [H]. Returns the output
    [B, T, H, d], and per head and query the log-sum-exp over keys and sink and the sink
    probability [B, H, T]."""
    B, T, H, d = q.shape
    group = H // k.shape[2]
    k = k.repeat_interleave(group, dim=2)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * d ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    sink = sinks.to(q.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
    logits = scores if mistake == "sinks ignored" else torch.cat([scores, sink], dim=-1)
    w = torch.softmax(logits, dim=-1)
    lse = torch.logsumexp(scores if mistake == "lse without the sink" else logits, dim=-1)
    p_sink = torch.zeros_like(lse) if mistake == "sinks ignored" else w[..., -1]
    w = w if mistake == "sinks ignored" else w[..., :-1]
    return torch.einsum("bhts,bshd->bthd", w, v), lse, p_sink


@pytest.fixture
def qkv():
    torch.manual_seed(0)
    B, T, H, H_kv, d = 2, 6, 4, 2, 16
    return (torch.randn(B, T, H, d), torch.randn(B, T, H_kv, d), torch.randn(B, T, H_kv, d),
            torch.tensor([0.5, -1.0, 2.0, 0.0]))


def check(q, k, v, sinks, out, lse, p_sink):
    """The oracle's layout is [B, H, T, d]: transpose, and name the tensors as op attention does.
    Arrays must be C-contiguous (a slice such as w[..., -1] is not: .contiguous() copies it).

    In bfloat16 this implementation rounds every intermediate (the scores, the weights) to bf16,
    not only its outputs: the default policy for 16-bit outputs (accumulated in float32, stored
    once; docs/policies.md) rightly rejects that, so it is checked under the worst-case policy, whose
    bound covers arithmetic in 16 bits throughout."""
    bhtd = lambda x: x.transpose(1, 2).contiguous()
    policy = "worst_case" if q.dtype == torch.bfloat16 else None
    return oasis.check("attention", {"q": bhtd(q), "k": bhtd(k), "v": bhtd(v), "null_logits": sinks},
                       {"out": bhtd(out), "lse": lse, "p_null": p_sink.contiguous()}, options={"causal": True},
                       policy=policy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_attention_passes(qkv, dtype):
    q, k, v, sinks = (x.to(dtype) for x in qkv)
    report = check(q, k, v, sinks, *sinks_attention(q, k, v, sinks))
    print(report)
    report.assert_ok()


def test_ignoring_the_sinks_is_caught(qkv):
    report = check(*qkv, *sinks_attention(*qkv, mistake="sinks ignored"))
    assert not report.passed
    assert not report["out"]["passed"] and not report["p_null"]["passed"]


def test_an_lse_without_the_sink_is_caught(qkv):
    """The output is right, the LSE misses the sink's e^s: only lse fails (always from below)."""
    report = check(*qkv, *sinks_attention(*qkv, mistake="lse without the sink"))
    assert [r["name"] for r in report.rows if not r["passed"]] == ["lse"]
    with pytest.raises(AssertionError, match=r"lse\[0, 0, 0\]: got"):
        report.assert_ok()
