"""The trace recorder (oasis.trace): documented names only, conversion to the documented layouts,
copies, activation; and its table of fields is the library's own trace."""

import numpy as np
import pytest

import oasis
from oasis.trace import TRACE_FIELDS, to_documented


def test_the_table_is_the_library_trace():
    """Model.forward(trace=True) of a Kimi model produces exactly the fields of TRACE_FIELDS, in
    the documented ranks (so the recorder and the library name and lay out a trace alike)."""
    m = oasis.Model.initialized({"d_model": 8, "n_heads": 2, "d_ff": 12, "vocab_size": 10}, seed=3)
    tr = m.forward(np.array([[1, 2, 3]]), trace=True)
    fields = {}
    for name, a in tr.items():
        sub, field = oasis.trace.split_name(name)
        fields[field] = a
        assert a.ndim == (TRACE_FIELDS.get(field) or oasis.trace.TOP_LEVEL[field])[0].count(",") + 1, name
    assert set(fields) == set(TRACE_FIELDS) | {"logits", "state"}
    assert tr["layers.0.attn.attn_q"].shape == (1, 3, 8) and tr["layers.1.mlp.sources"].shape == (4, 1, 3, 8)


def test_per_head_layouts_become_b_t_hdh(rng):
    x = rng.standard_normal((2, 3, 4, 5))  # [B, H, T, dh]
    want = x.transpose(0, 2, 1, 3).reshape(2, 4, 15)
    assert np.array_equal(to_documented("layers.0.attn.attn_q", x, layout="bhtd"), want)
    assert np.array_equal(to_documented("layers.0.attn.attn_k", want.reshape(2, 4, 3, 5), layout="bthd"), want)
    assert np.array_equal(to_documented("layers.0.attn.attn_heads", want), want)
    y = to_documented("layers.0.attn.attn_v", x, layout="bhtd")
    assert y.flags.c_contiguous and y[1, 3, 2 * 5 + 4] == x[1, 2, 3, 4]  # (b, t, h dh + c) = (b, h, t, c)


def test_candidates_are_stacked_and_copies_are_taken(rng):
    parts = [rng.standard_normal((2, 3, 4)) for _ in range(3)]
    rec = oasis.TraceRecorder()
    rec.record("layers.1.attn.sources", parts)
    parts[0][0, 0, 0] = 99.0  # the recording is a copy
    assert rec.trace["layers.1.attn.sources"].shape == (3, 2, 3, 4)
    assert rec.trace["layers.1.attn.sources"][0, 0, 0, 0] != 99.0
    with pytest.raises(oasis.InvalidArgument, match="recorded twice"):
        rec.record("layers.1.attn.sources", parts)
    with pytest.raises(oasis.InvalidArgument, match="routing fields only"):
        rec.record("layers.1.attn.input", parts)


def test_record_is_inactive_outside_a_recorder_and_feeds_every_active_one():
    x = np.zeros((1, 2, 4))
    oasis.record("layers.0.attn.input", x)  # no recorder: nothing happens
    with oasis.TraceRecorder() as a, oasis.TraceRecorder() as b:
        oasis.record("layers.0.attn.input", x)
    oasis.record("layers.0.attn.output", x)
    assert list(a.trace) == list(b.trace) == ["layers.0.attn.input"]


def test_torch_hooks_and_bf16():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    lin = torch.nn.Linear(4, 4)
    rec = oasis.TraceRecorder().hook(lin, "layers.0.mlp")
    x = torch.randn(1, 2, 4, requires_grad=True)
    lin(x)  # not recording yet
    assert rec.trace == {}
    with rec:
        y = lin(x)
    rec.remove_hooks()
    assert np.array_equal(rec.trace["layers.0.mlp.input"], x.detach().numpy())
    assert np.array_equal(rec.trace["layers.0.mlp.output"], y.detach().numpy())
    with rec:
        rec.record("layers.0.attn.p_null", torch.rand(1, 2, 2).to(torch.bfloat16))
    b = rec.trace["layers.0.attn.p_null"]
    assert isinstance(b, oasis.bf16) and b.shape == (1, 2, 2)
