"""check() and check_model(): the verdicts of `oasis-verify compare`, through the Report API.

The CLI comparison writes the same tensors as .npy files with a configuration, runs
oasis-verify compare --json and requires the same exit verdict, the same table and the same JSON
report, in every storage dtype; the model level is checked from a weights file, from an
oasis.Model and from (config, weights), on the library's own float32 trace.
"""

import json
import subprocess

import numpy as np
import pytest

import oasis


def bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even (NaN-free input)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def attention_case(rng, dt=np.float32):
    """Inputs and the outputs of the plain reference in dt (float32 outputs also stand for f16 and
    bf16 kernels that accumulate in float32), which pass the policy."""
    q = rng.standard_normal((1, 2, 5, 8)).astype(dt)
    k = rng.standard_normal((1, 2, 5, 8)).astype(dt)
    v = rng.standard_normal((1, 2, 5, 8)).astype(dt)
    ref = oasis.token_attention(q, k, v, causal=True)
    return {"q": q, "k": k, "v": v}, {"out": ref["out"], "lse": ref["lse"], "p_null": ref["p_null"]}


def stored_as(a, dtype):
    """(value for check, array to np.save, file suffix) of a float32 output stored in dtype."""
    if dtype == "bf16":
        bits = bf16_bits(a)
        return oasis.bf16(bits), bits, ".bf16.npy"
    x = a.astype({"f64": np.float64, "f32": np.float32, "f16": np.float16}[dtype])
    return x, x, ".npy"


@pytest.mark.parametrize("dtype", ["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("mistake", [False, True])
def test_verdicts_table_and_json_equal_the_cli(rng, verify_exe, tmp_path, dtype, mistake):
    inputs, outputs = attention_case(rng, np.float64 if dtype == "f64" else np.float32)
    if mistake:  # the LSE without the null logit, the worked example's mistake
        outputs["lse"] = outputs["lse"] - np.log1p(np.exp(-outputs["lse"]))
    cfg = {"op": "attention", "inputs": {}, "outputs": {}, "options": {"causal": True}}
    check_out = {}
    for name, a in inputs.items():
        np.save(tmp_path / f"{name}.npy", a)
        cfg["inputs"][name] = f"{name}.npy"
    for name, a in outputs.items():
        value, saved, suffix = stored_as(a, dtype)
        np.save(tmp_path / f"{name}{suffix}", saved)
        cfg["outputs"][name] = f"{name}{suffix}"
        check_out[name] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    cli = subprocess.run([verify_exe, "compare", str(tmp_path / "config.json"), "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True)
    report = oasis.check("attention", inputs, check_out, options={"causal": True})
    assert cli.returncode == (0 if report.passed else 1), cli.stderr
    assert report.passed == (not mistake)
    assert str(report) == cli.stdout
    assert report.to_json() == (tmp_path / "r.json").read_text()
    if mistake:
        assert not report["lse"]["passed"] and report["out"]["passed"]


def test_report_rows_table_and_assert_ok(rng):
    inputs, outputs = attention_case(rng)
    ok = oasis.check("attention", inputs, outputs, options={"causal": True})
    assert ok.passed and ok.assert_ok() is ok
    assert [r["name"] for r in ok.rows] == ["lse", "out", "p_null"]
    assert ok["out"]["shape"] == [1, 2, 5, 8] and ok["out"]["dtype"] == "f32" and ok["out"]["violations"] == 0
    assert "verdict: PASS (3 of 3 tensors within the policy)" in str(ok)
    with pytest.raises(KeyError, match="tensors: lse, out, p_null"):
        ok["probs"]

    outputs["out"] = outputs["out"].copy()
    outputs["out"][0, 1, 3, 2] += 1e-3
    bad = oasis.check("attention", inputs, outputs, options={"causal": True})
    assert not bad.passed and bad["out"]["violations"] == 1 and bad["lse"]["passed"]
    assert bad["out"]["first_mismatches"][0].startswith("out[0, 1, 3, 2]: got ")
    with pytest.raises(AssertionError) as e:
        bad.assert_ok()
    assert str(bad) in str(e.value) and "out[0, 1, 3, 2]" in str(e.value)


def test_comparison_options_reach_the_engine(rng):
    inputs, outputs = attention_case(rng)
    outputs["lse"] = outputs["lse"] + np.float32(0.5)  # every row fails
    assert len(oasis.check("attention", inputs, outputs, options={"causal": True}, show=2)["lse"]["first_mismatches"]) == 2
    assert oasis.check("attention", inputs, outputs, options={"causal": True}, show=0)["lse"]["first_mismatches"] == []
    with pytest.raises(oasis.InvalidArgument, match="unknown comparison option") as e:
        oasis.check("attention", inputs, outputs, frobnicate=1)
    assert e.value.argument == "frobnicate"
    # the mp50 fallback's budget (docs/policies.md, "Failing fast") is a comparison option too
    assert oasis.check("attention", inputs, outputs, options={"causal": True}, mp50_budget=0,
                       mp50_memory=1e9).to_json()
    with pytest.raises(oasis.InvalidArgument, match="non-negative") as e:
        oasis.check("attention", inputs, outputs, mp50_budget=-1)
    assert e.value.argument == "mp50_budget"
    # policy= reaches the engine: the report names it, and an unknown policy is an error naming it
    assert "policy: worst_case" in str(oasis.check("attention", inputs, outputs, options={"causal": True},
                                                   policy="worst_case"))
    with pytest.raises(oasis.InvalidArgument, match="unknown policy 'storage'") as e:
        oasis.check("attention", inputs, outputs, policy="storage")
    assert e.value.argument == "policy"


def test_torch_tensors_give_the_numpy_verdicts(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    inputs, outputs = attention_case(rng)
    want = oasis.check("attention", inputs, outputs, options={"causal": True})
    t_in = {k: torch.from_numpy(v).requires_grad_() for k, v in inputs.items()}
    t_out = {k: torch.from_numpy(v) for k, v in outputs.items()}
    assert oasis.check("attention", t_in, t_out, options={"causal": True}).to_json() == want.to_json()
    # bf16: a torch bfloat16 tensor and its bits as oasis.bf16 are the same tensor
    b_torch = {k: v.to(torch.bfloat16) for k, v in t_out.items()}
    b_bits = {k: oasis.bf16(v.view(torch.int16).numpy().view(np.uint16)) for k, v in b_torch.items()}
    r_torch = oasis.check("attention", inputs, b_torch, options={"causal": True})
    assert r_torch.to_json() == oasis.check("attention", inputs, b_bits, options={"causal": True}).to_json()
    assert r_torch.passed and r_torch["out"]["dtype"] == "bf16"


def test_the_callers_flush_to_zero_changes_no_figure(rng):
    """torch.set_flush_denormal(True) sets flush-to-zero and denormals-are-zero on the calling thread:
    the check computes in its own arithmetic (docs/tolerances.md, "The oracle's arithmetic"), with the
    same report, and leaves the mode as it found it."""
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    q = rng.standard_normal((1, 4, 64, 32)).astype(np.float32)
    k = rng.standard_normal((1, 4, 64, 32)).astype(np.float32)
    v = rng.standard_normal((1, 4, 64, 32)).astype(np.float32)
    ref = oasis.token_attention(q, k, v, causal=True)
    inputs, outputs = {"q": q, "k": k, "v": v}, {x: ref[x] for x in ("out", "lse", "p_null")}
    want = oasis.check("attention", inputs, outputs, options={"causal": True}).to_json()
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode for torch to set")
    try:
        assert (tiny * 1).item() == 0.0  # the mode is on
        got = oasis.check("attention", inputs, outputs, options={"causal": True}).to_json()
        assert (tiny * 1).item() == 0.0  # and still on
    finally:
        torch.set_flush_denormal(False)
    assert got == want


# ---- model level ---------------------------------------------------------------------------------

CONFIG = {"init_std": 0.3, "theta_init": 0.5}  # the default OASIS Kimi-full model, logits of order 1
IDS = np.array([[3, 10, 17, 24, 31], [6, 13, 20, 27, 2]])


@pytest.fixture(scope="module")
def model_and_trace():
    m = oasis.Model.initialized(CONFIG, seed=4242)
    return m, m.forward(IDS, dtype="float32", trace=True)


def test_the_library_trace_passes_in_every_model_form(model_and_trace, tmp_path):
    m, trace = model_and_trace
    r = oasis.check_model(m, trace, ids=IDS)
    r.assert_ok()
    # every tensor of the trace: 5 routers x (sources, psi, g_old, g, dpsi, alpha, alpha_null, routed)
    # + 2 attention sublayers x (input, attn_q, attn_k, attn_v, p_null, lse, attn_heads, branch_psi, output)
    # + 2 MLPs x (input, mlp_hidden, output) + state + logits
    assert len(r.rows) == 5 * 8 + 2 * 9 + 2 * 3 + 2 and not any(row["informative"] for row in r.rows)
    m.save(tmp_path / "model.safetensors")
    assert oasis.check_model(tmp_path / "model.safetensors", trace, ids=IDS).to_json() == r.to_json()
    assert oasis.check_model(str(tmp_path / "model.safetensors"), dict(trace, ids=IDS)).to_json() == r.to_json()
    assert oasis.check_model((m.config, m.weights()), trace, ids=IDS).to_json() == r.to_json()


def test_a_moved_step_output_fails_at_that_step_first(model_and_trace):
    m, trace = model_and_trace
    bad = dict(trace)
    bad["layers.0.mlp.output"] = trace["layers.0.mlp.output"].copy()
    bad["layers.0.mlp.output"][1, 2, 5] *= np.float32(1 + 1e-3)
    r = oasis.check_model(m, bad, ids=IDS)
    assert not r.passed
    # the step, then the later routers whose candidate should be that output (links)
    assert [row["name"] for row in r.rows if not row["passed"]] == [
        "layers.0.mlp.output", "layers.1.attn.sources", "layers.1.mlp.sources", "final_res.sources"]
    assert r.notes[0].startswith("first wrong step (forward order): layers.0.mlp.output")
    assert r["layers.0.mlp.output"]["first_mismatches"][0].startswith("layers.0.mlp.output[1, 2, 5]")


def test_logits_alone_get_the_end_to_end_verdict(model_and_trace):
    m, trace = model_and_trace
    r = oasis.check_model(m, {"logits": trace["logits"]}, ids=IDS)
    assert r.passed and not r["logits"]["informative"] and r["logits"]["passed"] is True
    assert any(n.startswith("logits: end-to-end verdict") for n in r.notes)
    wrong = dict(logits=trace["logits"] * np.float32(1.001))
    assert not oasis.check_model(m, wrong, ids=IDS).passed


def test_model_config_defaults_and_fields():
    m = oasis.Model.initialized({"router": "authors_code"}, seed=1)
    assert m.config["readout"] == "last" and m.config["centring"] == "authors_code"  # the router's defaults
    m = oasis.Model.initialized({}, seed=1)
    assert m.config["readout"] == "final_attnres" and m.config["centring"] == "paper_v2"
    assert set(m.config) <= set(oasis.config_fields())
    ids = np.array([[1, 2]])
    for dt in ("float32", np.float32, np.dtype(np.float32)):  # (and torch.float32 when torch is loaded)
        assert m.forward(ids, dtype=dt)["logits"].dtype == np.float32
    names = [n for n, _ in m.parameter_specs()]
    assert sorted(names) == sorted(m.weights()) and "layers.1.mlp_res.theta" in names
