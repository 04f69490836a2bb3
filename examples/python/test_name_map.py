"""Example: record a trace from a torch model whose names are not the library's and whose pre-norms
sit outside its sublayer modules, with a name map (oasis.TraceRecorder(modules=...)), with pytest.

The model is the Kimi Full AttnRes + OASIS model of test_attnres_model.py written the way many
code bases write it: its own module and parameter names (blocks.{b}.attention.wq, feed_forward.w1,
attn_router.pseudo_query, ...), and each block applying RMSNorm *before* calling its attention and
feed-forward modules, so those modules receive RMSNorm(h), not h. Its code knows no trace names:
the name map hooks the modules to the documented sublayer names, and oasis.record calls inside a
hooked module take names relative to its sublayer (the hook runs the module in a trace_scope).

docs/verify-model.md documents ``<sublayer>.input`` as the state *before* the sublayer's pre-norm
(attn_q = RMSNorm(input) W_q). A forward hook sees only the module's argument, here RMSNorm(h):
recorded as ``.input`` it fails this correct model (test_recording_the_module_argument_as_input_fails),
which is why the recorder records no ``.input`` unless told (``input="input"``).

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_name_map.py
"""

import re

import pytest

torch = pytest.importorskip("torch", reason="this example checks a torch implementation (torch not installed)")

import oasis  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
import test_attnres_model as base  # noqa: E402  (rms_norm, rope, the configuration and ids)

CONFIG, IDS = base.CONFIG, base.IDS


class Attention(nn.Module):
    """Causal Softmax1 attention with RoPE on an already normed x; returns (output, psi)."""

    def __init__(self, d, H):
        super().__init__()
        self.H, self.dh = H, d // H
        self.wq, self.wk = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.wv, self.wo = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        split = lambda y: y.view(B, T, self.H, self.dh)
        q, k, v = base.rope(split(self.wq(x))), base.rope(split(self.wk(x))), split(self.wv(x))
        scores = torch.einsum("bthd,bshd->bhts", q, k) * self.dh ** -0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(torch.cat([scores, torch.zeros_like(scores[..., :1])], -1), -1)
        psi = w[..., -1].mean(1)                       # mean over heads of the null probability
        oasis.record("branch_psi", psi)                # relative: the hook's scope names the sublayer
        heads = torch.einsum("bhts,bshd->bthd", w[..., :-1], v)
        return self.wo(heads.reshape(B, T, -1)), psi


class FeedForward(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DepthRouter(nn.Module):
    """g_i = w^T RMSNorm(v_i), g = g_old - softplus(theta) Dpsi over the candidates with evidence,
    Softmax1 over depth; its forward inputs recorded relative to the sublayer it feeds."""

    def __init__(self, d):
        super().__init__()
        self.pseudo_query = nn.Parameter(torch.zeros(d))
        self.theta = nn.Parameter(torch.full((1,), -5.0))

    def forward(self, sources, evidence, psis):
        s, psi = torch.stack(sources), torch.stack(psis)
        g_old = torch.einsum("nbtd,d->nbt", base.rms_norm(s), self.pseudo_query)
        ev = torch.tensor(evidence).view(-1, 1, 1)
        dpsi = (psi - (psi * ev).sum(0) / ev.sum()) * ev if int(ev.sum()) >= 2 else torch.zeros_like(psi)
        g = g_old - F.softplus(self.theta) * dpsi
        alpha = torch.softmax(torch.cat([g, torch.zeros_like(g[:1])]), 0)[:-1]
        for field, x in (("sources", s), ("g_old", g_old), ("psi", psi)):
            oasis.record(field, x)
        return torch.einsum("nbt,nbtd->btd", alpha, s)


class Block(nn.Module):
    def __init__(self, d, H, f):
        super().__init__()
        self.attn_router, self.attn_norm, self.attention = DepthRouter(d), base.RMSNorm(d), Attention(d, H)
        self.ffn_router, self.ffn_norm, self.feed_forward = DepthRouter(d), base.RMSNorm(d), FeedForward(d, f)

    def forward(self, sources, evidence, psis):
        h = self.attn_router(sources, evidence, psis)
        out, psi = self.attention(self.attn_norm(h))   # the pre-norm outside the module
        sources, evidence, psis = sources + [out], evidence + [True], psis + [psi]
        h = self.ffn_router(sources, evidence, psis)
        out = self.feed_forward(self.ffn_norm(h))
        return sources + [out], evidence + [True], psis + [psi]  # the MLP inherits its block's psi


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.tok_embeddings = nn.Embedding(c["vocab_size"], d)
        self.blocks = nn.ModuleList(Block(d, c["n_heads"], c["d_ff"]) for _ in range(c["n_blocks"]))
        self.final_router, self.norm = DepthRouter(d), base.RMSNorm(d)
        self.output = nn.Linear(d, c["vocab_size"], bias=False)

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        sources, evidence, psis = [x], [False], [torch.zeros(ids.shape)]
        for blk in self.blocks:
            sources, evidence, psis = blk(sources, evidence, psis)
        return self.output(self.norm(self.final_router(sources, evidence, psis)))


# the model's module names -> documented trace names: a sublayer module records its output as
# <sublayer>.output; a router module its output as the .routed of the sublayer it feeds
NAME_MAP = {"final_router": "final_res.routed", "output": "logits"}
for _b in range(CONFIG["n_blocks"]):
    NAME_MAP.update({f"blocks.{_b}.attention": f"layers.{_b}.attn", f"blocks.{_b}.feed_forward": f"layers.{_b}.mlp",
                     f"blocks.{_b}.attn_router": f"layers.{_b}.attn.routed",
                     f"blocks.{_b}.ffn_router": f"layers.{_b}.mlp.routed"})

# the model's parameter names -> the library's (docs/model.md, "Parameters")
RENAMES = [(r"^tok_embeddings\.", "embed_tokens."), (r"^output\.", "lm_head."),
           (r"^final_router\.pseudo_query$", "final_res.query"), (r"^final_router\.", "final_res."),
           (r"^blocks\.(\d+)\.attention\.w([qkvo])\.", r"layers.\1.attn.\2_proj."),
           (r"^blocks\.(\d+)\.feed_forward\.w1\.", r"layers.\1.mlp.gate_proj."),
           (r"^blocks\.(\d+)\.feed_forward\.w3\.", r"layers.\1.mlp.up_proj."),
           (r"^blocks\.(\d+)\.feed_forward\.w2\.", r"layers.\1.mlp.down_proj."),
           (r"^blocks\.(\d+)\.attn_norm\.", r"layers.\1.attn_norm."), (r"^blocks\.(\d+)\.ffn_norm\.", r"layers.\1.mlp_norm."),
           (r"^blocks\.(\d+)\.attn_router\.pseudo_query$", r"layers.\1.attn_res.query"),
           (r"^blocks\.(\d+)\.ffn_router\.pseudo_query$", r"layers.\1.mlp_res.query"),
           (r"^blocks\.(\d+)\.attn_router\.", r"layers.\1.attn_res."), (r"^blocks\.(\d+)\.ffn_router\.", r"layers.\1.mlp_res.")]


def library_name(name):
    for pattern, repl in RENAMES:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    return name


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return base.init_weights(Transformer(CONFIG))


def weights(model):
    return {library_name(k): v for k, v in model.state_dict().items()}


def failing(report):
    return sorted(r["name"] for r in report.rows if r["passed"] is False)


def test_the_name_map_records_a_trace_that_passes(model):
    rec = oasis.TraceRecorder(modules=NAME_MAP).attach(model)
    with torch.no_grad(), rec:
        model(IDS)
    rec.remove_hooks()
    assert "layers.0.attn.input" not in rec.trace  # not recorded by default: the module's argument is normed
    assert {"layers.1.mlp.output", "layers.1.attn.branch_psi", "layers.1.attn.routed", "layers.1.attn.g_old",
            "final_res.sources", "logits"} <= set(rec.trace)
    report = oasis.check_model((CONFIG, weights(model)), rec, ids=IDS)
    print(report)
    report.assert_ok()
    # 5 routers x (sources, psi, g_old, routed), 4 outputs, 2 psi, logits; and the 4 outputs' end-to-end
    # rows (the trace lacks their sublayers' inputs)
    assert len(report.rows) == 31
    assert sum(r["name"].endswith(" (end to end)") for r in report.rows) == 4


def test_recording_the_module_argument_as_input_fails(model):
    """input="input" says the module's first argument is the documented .input; here it is
    RMSNorm(h), so the correct model fails, first at the first sublayer's input."""
    rec = oasis.TraceRecorder(modules=NAME_MAP, input="input").attach(model)
    with torch.no_grad(), rec:
        model(IDS)
    rec.remove_hooks()
    report = oasis.check_model((CONFIG, weights(model)), rec, ids=IDS)
    assert not report.passed and report.notes[0].startswith("first wrong step (forward order): layers.0.attn.input")
    # every sublayer's .input fails (it is RMSNorm(h), not h), and so do the steps checked on it
    # (the sublayers' outputs and psi are recomputed from the .input they were given)
    assert {f"layers.{b}.{s}.input" for b in range(2) for s in ("attn", "mlp")} <= set(failing(report))


def test_the_name_map_records_the_backward_too(model):
    """With backward=True the hooked modules' outputs and the routers' recorded tensors get
    gradient hooks: every router's backward passes as a local step (docs/verify-model.md)."""
    model.zero_grad()
    rec = oasis.TraceRecorder(modules=NAME_MAP, backward=True).attach(model)
    with rec:
        logits = model(IDS)
    rec.remove_hooks()
    logits.pow(2).mean().backward()
    rec.record_parameter_grads(model, names=library_name)
    assert {"grad_logits", "layers.0.attn.grad_output", "layers.1.mlp.grad_routed", "final_res.grad_sources",
            "grad.layers.1.mlp_res.query"} <= set(rec.trace)
    report = oasis.check_model((CONFIG, weights(model)), rec, ids=IDS)
    local = [r for r in report.rows if r["name"].endswith(" (backward step)")]
    # five routers' grad_g_old, grad_sources, query and theta gradients, grad_psi of the four that
    # couple; no sublayer step: this model's norms sit outside its modules, so .input is not traced
    assert len(local) == 24 and all(r["passed"] for r in local)
    assert [r["name"] for r in report.rows if r["passed"] is False and "grad" not in r["name"]] == []


def test_name_map_errors_name_the_module_or_the_sublayer(model):
    with pytest.raises(oasis.InvalidArgument, match=r"no submodule 'blocks\.0\.attn' \(did you mean .*'blocks\.0\.attention'"):
        oasis.TraceRecorder(modules={"blocks.0.attn": "layers.0.attn"}).attach(model)
    with pytest.raises(oasis.InvalidArgument, match="'layers.0.attention' is not a documented sublayer"):
        oasis.TraceRecorder(modules={"blocks.0.attention": "layers.0.attention"})
    with pytest.raises(oasis.InvalidArgument, match="no documented trace field holds a sublayer's normed input"):
        oasis.TraceRecorder(modules=NAME_MAP, input="normed")
