"""Example: record and check training steps of a torch model, forward and backward, with pytest.

The model is the tiny Kimi Full AttnRes + OASIS model of test_attnres_model.py (library parameter
names, oasis.record calls in its code). Under ``oasis.TraceRecorder(backward=True)`` every
recorded tensor whose gradient has a documented name also gets a tensor hook, so
``loss.backward()`` records the gradients the model's autograd computed — ``grad_logits`` (the
dL/dlogits the check starts from), ``<sublayer>.grad_output``, ``.grad_routed``,
``.grad_branch_psi``, the routers' ``.grad_sources``, ``.grad_g_old``, ``.grad_psi``,
``grad_state``, ``grad_embeddings`` (oasis.record_grad) — and ``rec.record_parameter_grads(model)``
records ``grad.<parameter>``. oasis.check_model then checks, with the weights of that step:

* every forward tensor (steps and links, docs/verify-model.md "Model level");
* each router's backward as a local step on the tensors it traced ("Local backward steps": its
  grad_g_old, grad_psi and theta's gradient by op depth_backward, its grad_sources as the mix plus
  the keys' part, its query's gradient as the keys' backward of the traced grad_g_old), and each
  attention and MLP sublayer's weights' gradients on its traced input and grad_output;
* every gradient end to end against the oracle's backward ("Model gradients", parity per row).

The forward, the local steps and the end-to-end gradient rows pass at every step of a 3-step
training run (test_end_to_end_gradient_rows_of_a_correct_model: the rows' allowance is twice the
largest error of six differently rounded replays of the oracle's backward, docs/verify-model.md
"Model gradients"). The backward mistakes below are each named at the step that makes them.

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest examples/python/test_attnres_training.py
"""

import pytest

torch = pytest.importorskip("torch", reason="this example trains a torch implementation (torch not installed)")

import oasis  # noqa: E402
import test_attnres_model as base  # noqa: E402  (the model; this folder is on sys.path under pytest)

CONFIG, IDS = base.CONFIG, base.IDS
LOCAL = " (backward step)"


def init_model(config=CONFIG):
    """The model of test_attnres_model.py with its weights of order 1 and non-trivial routing."""
    torch.manual_seed(0)
    return base.init_weights(base.TinyAttnRes(config))


def next_token_loss(logits):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), IDS[:, 1:].reshape(-1))


def training_step(model, config=CONFIG):
    """One forward and backward, recorded; the report of check_model with this step's weights."""
    model.zero_grad()
    with oasis.TraceRecorder(backward=True) as rec:
        logits = model(IDS)
    next_token_loss(logits).backward()
    rec.record_parameter_grads(model)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}  # before the optimizer moves them
    return oasis.check_model((config, weights), rec, ids=IDS), rec


def is_gradient(row):
    return row["name"].startswith("grad") or ".grad_" in row["name"]


def forward_rows(report):
    return [r for r in report.rows if not is_gradient(r)]


def local_rows(report):
    return [r for r in report.rows if r["name"].endswith(LOCAL)]


def failing(rows):
    return sorted(r["name"] for r in rows if r["passed"] is False)


def backward_note(report):
    return next((n for n in report.notes if n.startswith("first wrong backward step")), None)


def with_mistake(router, mistake):
    model = init_model()
    for name, module in model.named_modules():
        if name == router:
            module.mistake = mistake
    return model


def test_three_training_steps_pass_the_forward_and_every_local_backward_step():
    model = init_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    first = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for step in range(3):
        report, rec = training_step(model)
        print(f"step {step}:\n{report}")
        # not reached by the backward (so recorded as 0, which is right): layers.0.mlp's psi, which
        # that router never reads (one candidate with null evidence: Dpsi = 0 without psi); not
        # hooked: layers.0.attn's psi, the embedding's constant 0 (no tensor requires grad)
        assert rec.unreached == ["layers.0.mlp.grad_psi"] and list(rec.without_grad) == ["layers.0.attn.grad_psi"]
        assert len(forward_rows(report)) == 66 and failing(forward_rows(report)) == [], f"step {step}"
        # five routers: grad_g_old, grad_sources, the query's and theta's gradients each, grad_psi for
        # the four that couple (24); four sublayers: their weights' gradients, on their traced input
        # and grad_output (attention 5 each, MLP 4 each: 18)
        assert len(local_rows(report)) == 42 and failing(local_rows(report)) == [], f"step {step}"
        assert backward_note(report) is None
        optimizer.step()
    # each step was checked with new weights: all moved but the thetas whose gradient is exactly 0
    # (routers with fewer than two candidates with evidence, or two with the same psi: Dpsi = 0)
    still = {k for k, v in model.state_dict().items() if torch.equal(v, first[k])}
    assert still == {"layers.0.attn_res.theta", "layers.0.mlp_res.theta", "layers.1.attn_res.theta"}


def test_end_to_end_gradient_rows_of_a_correct_model():
    """Every row of all 58 gradient tensors passes at each of 3 Adam steps, in float32 and with the
    model in float64: torch's autograd sums in other orders (and other formulas) than the replay,
    and on short rows whose terms cancel one replay can be accurate by chance (before the six
    replays: 6, 8 and 1 failing tensors in float32, worst err/bound 5.4 at layers.1.mlp.grad_psi)."""
    for dtype in (torch.float32, torch.float64):
        model = init_model().to(dtype)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        for step in range(3):
            report, _ = training_step(model)
            rows = [r for r in report.rows if is_gradient(r) and not r["name"].endswith(LOCAL)]
            assert len(rows) == 58 and failing(report.rows) == [], f"{dtype} step {step}:\n{report}"
            optimizer.step()


def test_a_detached_psi_is_named_at_its_router_step():
    """The router couples a detached psi: its candidates' psi get no gradient. The hook on the
    router's psi is never reached, so its gradient is recorded as 0 (rec.unreached), and the
    router's local step fails at grad_psi: the first wrong step in backward order is this router,
    the MLP sublayer before it (in backward order) is right."""
    report, rec = training_step(with_mistake("layers.1.mlp_res", "detached psi"))
    assert rec.unreached == ["layers.0.mlp.grad_psi", "layers.1.mlp.grad_psi"]
    assert failing(local_rows(report)) == ["layers.1.mlp.grad_psi" + LOCAL]
    assert backward_note(report).startswith("first wrong backward step (backward order): router "
                                            "layers.1.mlp_res's backward; the last correct one before it: "
                                            "sublayer layers.1.mlp's")
    assert failing(forward_rows(report)) == []


def test_a_gradient_accumulated_into_the_wrong_source_is_named_at_its_router_step():
    """The mix's backward adds the last candidate's alpha_n dh to the candidate before it: the
    router's grad_sources fails its local step (its grad_g_old and grad_psi are right)."""
    report, _ = training_step(with_mistake("layers.1.mlp_res", "gradient into the wrong source"))
    assert failing(local_rows(report)) == ["layers.1.mlp.grad_sources" + LOCAL]
    assert "router layers.1.mlp_res's backward" in backward_note(report)
    assert failing(forward_rows(report)) == []


@pytest.mark.parametrize("mistake", ["keys without the RMSNorm's projection term",
                                     "no gradient from g_old to the sources"])
def test_a_wrong_keys_backward_is_named_at_its_router_step(mistake):
    """The router's keys differentiated without the RMSNorm's projection term, or not at all (the
    sources get the mix's gradient only, no grad_g_old path): the forward and the router's
    grad_g_old and grad_psi are right, its grad_sources fails its local step, and the router is the
    first wrong step in backward order."""
    report, _ = training_step(with_mistake("layers.1.attn_res", mistake))
    assert failing(local_rows(report)) == ["layers.1.attn.grad_sources" + LOCAL]
    assert backward_note(report).startswith("first wrong backward step (backward order): router layers.1.attn_res's")
    assert failing(forward_rows(report)) == []


def test_a_stop_gradient_on_the_pseudo_query_is_named_at_its_router_step():
    """g_old = RMSNorm(s) . stop_gradient(w): the router's cotangents to g_old, psi and its candidates
    are right, but its step also judges dL/dw, the pseudo-query backward of the traced grad_g_old:
    that row fails and the router is named; the end-to-end row of the parameter fails too, every
    element got 0 (max_rel 1)."""
    report, _ = training_step(with_mistake("layers.1.mlp_res", "stop-gradient on the pseudo-query"))
    assert failing(local_rows(report)) == ["grad.layers.1.mlp_res.query" + LOCAL]
    assert "router layers.1.mlp_res's backward" in backward_note(report)
    row = report["grad.layers.1.mlp_res.query"]
    assert row["passed"] is False and row["max_rel"] == 1.0
    assert report["grad.layers.0.mlp_res.query"]["passed"] is True


def clamped_model(mistake=None):
    """beta_max = 1 with every theta at 1 (softplus(1) = 1.313 > 1): every beta sits at its clamp,
    so dL/dtheta is exactly 0 (an active clamp passes no gradient, docs/spec.md)."""
    model = init_model()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, base.Router):
                module.theta.fill_(1.0)
                module.beta_max, module.mistake = 1.0, mistake
    return model


def theta_rows(report):
    return [r for r in report.rows if r["name"].endswith(".theta")]


def test_betas_clamp_passing_its_gradient_fails_at_theta():
    """Straight through the clamp, theta gets -sum_i dg_i Dpsi_i sigmoid(theta) instead of 0: the
    thetas of the routers whose Dpsi is not zero (layers.1.mlp_res, final_res; layers.1.attn_res
    sees two candidates with the same psi) fail end to end and at their routers' steps (theta judged
    by op depth_backward on the traced cotangents); the forward and the correct model's zero thetas
    pass."""
    config = dict(CONFIG, beta_max=1.0)
    right, _ = training_step(clamped_model(), config)
    assert failing(forward_rows(right)) == [] and failing(theta_rows(right)) == []
    report, _ = training_step(clamped_model("beta's clamp passes its gradient"), config)
    assert failing(theta_rows(report)) == ["grad.final_res.theta", "grad.layers.1.mlp_res.theta"]
    assert failing(local_rows(report)) == ["grad.final_res.theta" + LOCAL, "grad.layers.1.mlp_res.theta" + LOCAL]
    assert backward_note(report).startswith("first wrong backward step (backward order): router final_res's")
    assert failing(forward_rows(report)) == []
