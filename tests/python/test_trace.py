"""The trace recorder (oasis.trace): documented names only, conversion to the documented layouts,
copies, activation, trace scopes, name maps, gradient hooks; and its table of fields is the
library's own trace."""

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
    rec = oasis.TraceRecorder().hook(lin, "layers.0.mlp", input="input")
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


def test_trace_scopes_make_names_relative():
    x = np.zeros((1, 2, 4))
    with oasis.TraceRecorder() as rec:
        with oasis.trace_scope("layers.0.attn"):
            oasis.record("output", x)
            with oasis.trace_scope("final_res"):  # the innermost scope applies
                oasis.record("routed", x)
            oasis.record("input", x)
            oasis.record("state", x)                # not a field name: a full name, as it is
            oasis.record("layers.1.mlp.output", x)
            with pytest.raises(oasis.InvalidArgument, match=r"trace_scope\('layers.0.attn'\) a field name"):
                oasis.record("outptu", x)
    assert list(rec.trace) == ["layers.0.attn.output", "final_res.routed", "layers.0.attn.input", "state",
                               "layers.1.mlp.output"]
    with pytest.raises(oasis.InvalidArgument, match="not a documented sublayer"):
        with oasis.trace_scope("layers.0.attention"):
            pass
    assert oasis.trace._SCOPES == []


def test_gradient_names_are_documented_and_the_table_is_the_checks():
    assert oasis.trace.split_name("layers.1.mlp.grad_sources") == ("layers.1.mlp", "grad_sources")
    assert oasis.trace.split_name("grad.layers.0.attn.q_proj.weight") == (None, "grad.layers.0.attn.q_proj.weight")
    for name in ("grad_logits", "grad_state", "grad_embeddings"):
        assert oasis.trace.split_name(name) == (None, name)
    with pytest.raises(oasis.InvalidArgument, match="not a documented trace name"):
        oasis.trace.split_name("layers.0.attn.grad_q")
    # the engine knows exactly these sublayer gradient fields: its error message lists them
    with pytest.raises(oasis.InvalidArgument) as e:
        m = oasis.Model.initialized({"d_model": 8, "n_heads": 2, "d_ff": 12, "vocab_size": 10}, seed=3)
        oasis.check_model(m, {"grad.nothing": np.zeros(1)}, ids=np.array([[1, 2]]), grad_logits=np.zeros((1, 2, 10)))
    assert "{" + ", ".join(oasis.GRAD_FIELDS) + "}" in str(e.value)


def test_the_name_map_hooks_modules_by_name_and_names_its_errors():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.proj(x)
            oasis.record("branch_psi", y[..., 0].sigmoid())  # relative: the hook's scope
            return y, "extras"

    model = torch.nn.Sequential(torch.nn.LayerNorm(4), Attn())
    x = torch.randn(1, 2, 4)
    rec = oasis.TraceRecorder(modules={"1": "layers.0.attn", "0": "layers.0.attn.routed"}).attach(model)
    with rec:
        y, _ = model(x)
    rec.remove_hooks()
    assert sorted(rec.trace) == ["layers.0.attn.branch_psi", "layers.0.attn.output", "layers.0.attn.routed"]
    assert np.array_equal(rec.trace["layers.0.attn.output"], y.detach().numpy())  # the first element of a tuple
    assert oasis.trace._SCOPES == []
    with pytest.raises(oasis.InvalidArgument, match=r"no submodule 'attn'") as e:
        oasis.TraceRecorder(modules={"attn": "layers.0.attn"}).attach(model)
    assert e.value.argument == "modules"
    for bad in ("layers.0.attention", "layers.0.attn.grad_output", "blocks.0", 3):
        with pytest.raises(oasis.InvalidArgument, match="is not a documented sublayer"):
            oasis.TraceRecorder(modules={"1": bad})
    with pytest.raises(oasis.InvalidArgument, match="normed input") as e:
        oasis.TraceRecorder().hook(model[1], "layers.0.attn", input="normed")
    assert e.value.argument == "input"


def test_a_raising_forward_leaves_no_scope_open():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")

    class Boom(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    m = Boom()
    rec = oasis.TraceRecorder().hook(m, "layers.0.mlp")
    with pytest.raises(RuntimeError), rec:
        m(torch.zeros(1))
    assert oasis.trace._SCOPES == []


def test_backward_hooks_record_the_documented_gradients():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 4, bias=False)
    unused = torch.nn.Parameter(torch.ones(3))
    x = torch.randn(1, 2, 4, requires_grad=True)
    with oasis.TraceRecorder(backward=True) as rec:
        s = torch.stack([x, 2 * x])                      # a router's own stack of its candidates
        oasis.record("layers.0.mlp.sources", s)
        oasis.record("layers.0.mlp.g_old", s.sum(-1))    # never used below: gradient 0
        oasis.record("layers.0.mlp.psi", [x[..., 0], x[..., 1]])  # a list: no hook possible
        oasis.record("layers.0.mlp.routed", torch.zeros(1, 2, 4))  # requires no grad
        y = lin(s[0] + s[1])
        oasis.record("logits", y)
        with oasis.trace_scope("layers.0.mlp"):
            oasis.record_grad("grad_input", x)
    assert rec.finish().unreached == []                  # before the backward: nothing is filled
    (y * torch.arange(4.0)).sum().backward()
    rec.finish()
    assert np.array_equal(rec.trace["grad_logits"], np.broadcast_to(np.arange(4.0, dtype=np.float32), (1, 2, 4)))
    want = (torch.arange(4.0) @ lin.weight).detach().expand(1, 2, 4).numpy()  # dL/ds_i = dy W (both candidates)
    assert np.allclose(rec.trace["layers.0.mlp.grad_sources"], np.stack([want, want]), rtol=1e-6, atol=0)
    assert np.array_equal(rec.trace["layers.0.mlp.grad_input"], x.grad.numpy())
    assert rec.unreached == ["layers.0.mlp.grad_g_old"] and not rec.trace["layers.0.mlp.grad_g_old"].any()
    assert sorted(rec.without_grad) == ["layers.0.mlp.grad_psi", "layers.0.mlp.grad_routed"]
    holder = torch.nn.Module()
    holder.lin, holder.unused = lin, unused
    rec.record_parameter_grads(holder, names={"lin.weight": "layers.0.mlp.up_proj.weight", "unused": None})
    assert np.array_equal(rec.trace["grad.layers.0.mlp.up_proj.weight"], lin.weight.grad.numpy())
    assert "grad.unused" not in rec.trace
    with pytest.raises(oasis.InvalidArgument, match="no entry for parameter 'unused'"):
        oasis.TraceRecorder().record_parameter_grads(holder, names={"lin.weight": "x"})
    with pytest.raises(oasis.InvalidArgument, match="recorded twice"):
        rec.record_parameter_grads(holder, names={"lin.weight": "layers.0.mlp.up_proj.weight", "unused": None})


def test_a_second_backward_through_a_recorded_graph_is_an_error():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    x = torch.randn(1, 2, 4, requires_grad=True)
    with oasis.TraceRecorder(backward=True):
        y = 3 * x
        oasis.record("layers.0.attn.output", y)
    y.sum().backward(retain_graph=True)
    with pytest.raises(oasis.InvalidArgument, match="delivered twice"):
        y.sum().backward()


def test_check_model_takes_grad_logits_from_the_trace_or_the_argument():
    m = oasis.Model.initialized({"d_model": 8, "n_heads": 2, "d_ff": 12, "vocab_size": 10}, seed=3)
    ids = np.array([[1, 2, 3]])
    with pytest.raises(oasis.InvalidArgument, match="provide input tensor 'grad_logits'"):
        oasis.check_model(m, {"grad.norm.weight": np.zeros(8, np.float32)}, ids=ids)
    zero = np.zeros((1, 3, 10))
    a = oasis.check_model(m, {"grad.norm.weight": np.zeros(8), "grad_logits": zero}, ids=ids)
    b = oasis.check_model(m, {"grad.norm.weight": np.zeros(8)}, ids=ids, grad_logits=zero)
    assert a.passed and b.passed and str(a) == str(b)   # dL/dlogits = 0: every gradient is 0
