"""Example: check a tiny Kimi Full AttnRes model with OASIS coupling, written in torch, with pytest.

The model follows the library's conventions (docs/model.md, ModelConfig defaults: variant oasis,
router kimi_full, readout final_attnres, rotate_half RoPE, eps 1e-6) and names its parameters as
the library does, so its state_dict is the weights dict of oasis.check_model. While it runs under
an oasis.TraceRecorder, oasis.record() calls store every step's tensors under the documented
trace names (docs/verify-model.md, "Model level"); outside a recorder they cost nothing. The oracle
then checks every tensor against what the configured model computes from the tensors it reads
(each step in high precision on the model's own inputs, and each link of the wiring): a mistake
is reported at the step that makes it. test_attnres_training.py trains this model and checks its
backward too (the routers' ``mistake`` attribute and MisroutedMix are its backward mistakes).

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_attnres_model.py
"""

import pytest

torch = pytest.importorskip("torch", reason="this example checks a torch implementation (torch not installed)")

import oasis  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

CONFIG = {"vocab_size": 16, "d_model": 8, "n_blocks": 2, "n_heads": 2, "d_ff": 12,
          "variant": "oasis", "router": "kimi_full", "readout": "final_attnres", "rope": "rotate_half"}
EPS, ROPE_THETA = 1e-6, 10000.0


def rms_norm(x, weight=None):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms_norm(x, self.weight)


class MisroutedMix(torch.autograd.Function):
    """h = sum_i alpha_i s_i whose backward accumulates the last candidate's gradient alpha_n dh
    into the candidate before it (a backward wiring mistake: the forward is right)."""

    @staticmethod
    def forward(ctx, alpha, s):
        ctx.save_for_backward(alpha, s)
        return torch.einsum("nbt,nbtd->btd", alpha, s)

    @staticmethod
    def backward(ctx, dh):
        alpha, s = ctx.saved_tensors
        ds = alpha[..., None] * dh[None]                  # the right gradient: alpha_i dh
        ds[-2] += ds[-1]
        ds[-1] = 0
        return torch.einsum("btd,nbtd->nbt", dh, s), ds


class Router(nn.Module):
    """Kimi pseudo-query router with OASIS coupling: g_i = w^T RMSNorm(v_i), g = g_old - beta Dpsi
    (paper_v2 centring over the candidates with null evidence), beta = min(softplus(theta),
    beta_max), Softmax1 over depth. ``mistake`` (an attribute, so that a test can put it in one
    router) selects a backward wiring mistake; the forward stays right."""

    def __init__(self, d):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d))
        self.theta = nn.Parameter(torch.full((1,), -5.0))
        self.beta_max, self.mistake = float("inf"), None

    def forward(self, name, sources, kinds, psis, mistake=None):
        s = torch.stack(sources)                          # [n, B, T, d]
        psi = torch.stack(psis)                           # [n, B, T]
        query = self.query.detach() if self.mistake == "stop-gradient on the pseudo-query" else self.query
        if self.mistake == "keys without the RMSNorm's projection term":
            keys = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS).detach()  # d(1/rms)/ds dropped
        elif self.mistake == "no gradient from g_old to the sources":
            keys = rms_norm(s.detach())                   # the sources get the mix's gradient only
        else:
            keys = rms_norm(s)
        g_old = torch.einsum("nbtd,d->nbt", keys, query)
        coupled_psi = psi.detach() if self.mistake == "detached psi" else psi
        evidence = torch.tensor([k != "initial" for k in kinds]).view(-1, 1, 1)  # attention, headless (inherit)
        dpsi = torch.zeros_like(psi)
        if int(evidence.sum()) >= 2:
            mean = (coupled_psi * evidence).sum(0) / evidence.sum()
            dpsi = (coupled_psi - mean) * evidence
        softplus = F.softplus(self.theta)
        beta = softplus.clamp(max=self.beta_max)          # an active clamp passes no gradient to theta
        if self.mistake == "beta's clamp passes its gradient":
            beta = softplus + (beta - softplus).detach()  # straight through: dbeta/dtheta = sigmoid(theta)
        g = g_old - beta * dpsi
        null = torch.zeros_like(g[:1])
        w = torch.softmax(g if mistake == "no depth null" else torch.cat([g, null]), dim=0)
        alpha = w if mistake == "no depth null" else w[:-1]
        if self.mistake == "gradient into the wrong source":
            routed = MisroutedMix.apply(alpha, s)
        else:
            routed = torch.einsum("nbt,nbtd->btd", alpha, s)
        for field, x in (("sources", s), ("g_old", g_old), ("psi", psi), ("g", g), ("dpsi", dpsi), ("alpha", alpha),
                         ("alpha_null", torch.zeros_like(g[0]) if mistake == "no depth null" else w[-1]),
                         ("routed", routed)):
            oasis.record(f"{name}.{field}", x)
        return routed


def rope(x):
    """rotate_half RoPE at positions 0..T-1 of x [B, T, H, dh]: pairs (c, c + dh/2)."""
    T, dh = x.shape[1], x.shape[3]
    inv_freq = ROPE_THETA ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, dh/2]
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(x.dtype)[None, :, None, :]
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    """Causal Softmax1 attention (a null logit 0 per row) with RoPE; psi = mean over heads of p_null."""

    def __init__(self, d, H):
        super().__init__()
        self.H, self.dh = H, d // H
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)

    def forward(self, name, x, mistake=None):
        B, T, _ = x.shape
        split = lambda y: y.view(B, T, self.H, self.dh)
        q, k, v = rope(split(self.q_proj(x))), rope(split(self.k_proj(x))), split(self.v_proj(x))
        scores = torch.einsum("bthd,bshd->bhts", q, k) * self.dh ** -0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        logits = torch.cat([scores, torch.zeros_like(scores[..., :1])], -1)
        w = torch.softmax(logits, -1)
        p_null = w[..., -1]                                   # [B, H, T]
        heads = torch.einsum("bhts,bshd->bthd", w[..., :-1], v)
        if mistake == "psi summed over heads":
            psi = p_null.sum(1)
        elif mistake == "psi as the max over heads":
            psi = p_null.amax(1)
        else:
            psi = p_null.mean(1)
        for field, y in (("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_heads", heads)):
            oasis.record(f"{name}.{field}", y, layout="bthd")
        oasis.record(f"{name}.p_null", p_null)
        oasis.record(f"{name}.lse", torch.logsumexp(logits, -1))
        oasis.record(f"{name}.branch_psi", psi)
        return self.o_proj(heads.reshape(B, T, -1)), psi


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, name, x):
        hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)
        oasis.record(f"{name}.mlp_hidden", hidden)
        return self.down_proj(hidden)


class Block(nn.Module):
    def __init__(self, d, H, f):
        super().__init__()
        self.attn_res, self.attn_norm, self.attn = Router(d), RMSNorm(d), Attention(d, H)
        self.mlp_res, self.mlp_norm, self.mlp = Router(d), RMSNorm(d), MLP(d, f)


class TinyAttnRes(nn.Module):
    """Full AttnRes: sublayer l reads h_l = sum_i alpha_i v_i over v_0 = embedding and the raw
    outputs v_1..v_{l-1}; an MLP output carries the psi of its block's attention (inherit)."""

    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], d)
        self.layers = nn.ModuleList(Block(d, c["n_heads"], c["d_ff"]) for _ in range(c["n_blocks"]))
        self.final_res, self.norm = Router(d), RMSNorm(d)
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)

    def forward(self, ids, mistake=None):
        x0 = self.embed_tokens(ids)
        oasis.record_grad("grad_embeddings", x0)  # with TraceRecorder(backward=True): dL/d the embedding rows
        sources, kinds, psis = [x0], ["initial"], [torch.zeros(ids.shape)]
        for b, blk in enumerate(self.layers):
            for sub, res, norm, kind in (("attn", blk.attn_res, blk.attn_norm, "attention"),
                                         ("mlp", blk.mlp_res, blk.mlp_norm, "headless")):
                name = f"layers.{b}.{sub}"
                h = res(name, sources, kinds, psis, mistake)
                if sub == "attn":
                    out, psi = blk.attn(name, norm(h), mistake)
                else:
                    out = blk.mlp(name, norm(h))  # psi: the attention's of this block (inherit)
                oasis.record(f"{name}.input", h)
                oasis.record(f"{name}.output", out)
                sources, kinds, psis = sources + [out], kinds + [kind], psis + [psi]
        state = self.final_res("final_res", sources, kinds, psis, mistake)
        logits = self.lm_head(self.norm(state))
        oasis.record("state", state)
        oasis.record("logits", logits)
        return logits


def init_weights(m):
    """Weights of order 1 and non-trivial routing from torch's generator as the caller seeded it:
    pseudo-queries N(0, 1), theta U(-1, 1), norm gains as they are, every other weight N(0, 0.3^2).
    Shared by the examples beside this one."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("query"):
                p.normal_(0.0, 1.0)
            elif name.endswith("theta"):
                p.uniform_(-1.0, 1.0)
            elif not name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    return m


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return init_weights(TinyAttnRes(CONFIG))


IDS = torch.tensor([[1, 5, 9, 13, 2], [7, 3, 11, 0, 15]])


def run(model, mistake=None):
    with torch.no_grad(), oasis.TraceRecorder() as rec:
        model(IDS, mistake)
    return oasis.check_model((CONFIG, model.state_dict()), rec, ids=IDS)


def failing(report):
    return sorted(r["name"] for r in report.rows if r["passed"] is False)


def first_wrong(report):
    return report.notes[0].split(": ")[1].split(" ")[0] if report.notes and report.notes[0].startswith("first wrong") else None


def test_the_torch_model_passes_every_step(model):
    report = run(model)
    print(report)
    report.assert_ok()
    # every tensor of the trace has a verdict: each step on its own inputs, and each link of the
    # wiring (router candidates, their psi, router logits from the weights, sublayer inputs, readout)
    assert len(report.rows) == 66


def test_the_torch_model_passes_from_its_outputs_or_its_logits_alone(model):
    """What forward hooks give (sublayer outputs, branch psi, logits), and the logits alone (the
    end-to-end verdict against replays of the configured model) pass too."""
    with torch.no_grad(), oasis.TraceRecorder() as rec:
        model(IDS)
    minimal = {k: v for k, v in rec.trace.items() if k.endswith((".output", ".branch_psi")) or k == "logits"}
    oasis.check_model((CONFIG, model.state_dict()), minimal, ids=IDS).assert_ok()
    e2e = oasis.check_model((CONFIG, model.state_dict()), {"logits": rec.trace["logits"]}, ids=IDS)
    e2e.assert_ok()
    assert e2e["logits"]["worst_ratio"] < 0.5


def test_psi_as_the_max_over_heads_fails_at_branch_psi_only(model):
    """Each router is checked on the psi it was given, so the mistake shows where it is made."""
    assert failing(run(model, "psi as the max over heads")) == ["layers.0.attn.branch_psi", "layers.1.attn.branch_psi"]


def test_psi_summed_over_heads_fails_first_at_branch_psi(model):
    """A psi outside [0, 1] cannot feed the coupling: the routers that read it fail saying so."""
    report = run(model, "psi summed over heads")
    assert not report.passed and first_wrong(report) == "layers.0.attn.branch_psi"
    assert any("not a probability" in r["problem"] for r in report.rows if r["passed"] is False)


def test_a_depth_softmax_without_the_null_fails_at_the_routers(model):
    report = run(model, "no depth null")
    bad = failing(report)
    assert first_wrong(report) == "layers.0.attn.alpha"
    assert "layers.0.attn.alpha_null" in bad and "final_res.routed" in bad
    assert not any(n.endswith((".g", ".dpsi", ".attn_q", ".mlp_hidden")) for n in bad)


@pytest.mark.parametrize("mistake", ["psi as the max over heads", "psi summed over heads", "no depth null"])
def test_every_mistake_fails_from_the_logits_alone(model, mistake):
    with torch.no_grad(), oasis.TraceRecorder() as rec:
        model(IDS, mistake)
    report = oasis.check_model((CONFIG, model.state_dict()), {"logits": rec.trace["logits"]}, ids=IDS)
    assert not report.passed and first_wrong(report) == "logits"
