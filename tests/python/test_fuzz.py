"""oasis.fuzz: a correct eager torch sink attention fuzzes clean (forward and backward, float32 and
bfloat16); four plausible sink bugs are found, shrunk to a small case and replayed as FAIL by
`oasis-verify compare`; a kernel that raises is a crash, one that hangs a hang; the NumPy path; the
argument errors."""

import functools
import math
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import oasis

torch = pytest.importorskip("torch", reason="the fuzzed kernels are torch kernels (torch not installed)")

# the features the kernels below lack: their regimes are skipped (reported as never exercised)
WITHOUT = ("key_lengths", "window")


def sink_attention(inputs, options, bug=None):
    """Eager softmax1 attention with a per-head null logit s_h ("sink"), computed in float32.

    z = scale q k^T (+ bias), causal bottom-right (key j visible from query t when
    j <= t + Tk - Tq); the row [z, s_h] is normalised with its max m taken over the keys *and* the
    sink: e = exp([z, s] - m), l = sum e, lse = m + log l, p = e / l; out = p[:Tk] v,
    p_null = p[Tk]. A sink of +inf puts all the mass on the null: it is computed as the largest
    float32 (then p_null = 1, out = 0 exactly) and its lse set to +inf. ``bug`` injects one of the
    sink bugs of docs/fuzz.md."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    B, H, Tq, dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    g = H // Hkv
    qf, kf, vf = q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    z = (qf @ kf.transpose(-1, -2)) * options.get("scale", dh ** -0.5)
    if "bias" in inputs:
        z = z + inputs["bias"].float()
    if options.get("causal"):
        t, j = torch.arange(Tq).view(Tq, 1), torch.arange(Tk).view(1, Tk)
        z = z.masked_fill(j > t + (Tk - Tq), -math.inf)
    s = inputs["null_logits"].float() if "null_logits" in inputs else torch.zeros(H)
    if bug == "sink_per_kv_head":  # sinks[h // group]: the heads of a group share the first one's sink
        s = s[torch.arange(H) // g]
    s_fin = torch.where(s == math.inf, torch.full_like(s, torch.finfo(torch.float32).max), s)
    sink = s_fin.view(1, H, 1, 1).expand(B, H, Tq, 1)
    zz = torch.cat([z, sink], -1)
    # the max over the keys only lets e^(s - m) overflow when the sink lies far above the logits
    m = (z if bug == "sink_outside_max" else zz).amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(zz - m)
    l = e.sum(-1)
    lse = m.squeeze(-1) + torch.log(l)
    if bug == "dsink_without_dlse":  # the sink's term of the LSE cut from the graph: dS lacks p_null dLSE
        lse = m.squeeze(-1) + torch.log(torch.exp(torch.cat([z, sink.detach()], -1) - m).sum(-1))
    p = e / l.unsqueeze(-1)
    out, p_null = p[..., :Tk] @ vf, p[..., Tk]
    if bug == "nan_masked_rows":  # softmax over the keys times 1 - p_null = sigmoid(lse_keys - s): 0/0 without keys
        lse_keys = torch.logsumexp(z, -1)
        out = (torch.softmax(z, -1) @ vf) * torch.sigmoid(lse_keys - sink.squeeze(-1)).unsqueeze(-1)
    lse = torch.where((s == math.inf).view(1, H, 1), torch.full_like(lse, math.inf), lse)
    return {"out": out.to(q.dtype), "lse": lse, "p_null": p_null}


def shrunk_dims(failure):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", failure["shrunk_to"])}


def replay(failure, verify_exe):
    """Run the report's replay command with the oasis-verify of the build."""
    cmd = failure["replay_command"].split()
    assert cmd[:2] == ["oasis-verify", "compare"]
    return subprocess.run([verify_exe, *cmd[1:]], capture_output=True, text=True, timeout=60)


def test_correct_kernel_fuzzes_clean_forward_and_backward():
    lines = []
    report = oasis.fuzz(sink_attention, "attention", backward=True, tensors="torch", dtypes=("float32", "bfloat16"),
                        without=WITHOUT, log=lines.append)
    print(report)
    report.assert_ok()
    assert report.forward.op == "attention" and report.backward.op == "attention_backward"
    assert report.forward.passed and report.backward.passed and report.failure is None
    assert len(lines) == len(report.runs) == len(report.forward.runs) + len(report.backward.runs)
    assert {r["dtype"] for r in report.runs} == {"f32", "bf16"}
    assert all(r["verdict"] == "PASS" for r in report.runs)
    assert any(r["regime"] == "cotangent_lse" for r in report.backward.runs)
    assert any(n.startswith("attention: window_edges") for n in report.never_exercised)
    assert all(isinstance(r["seed"], int) for r in report.runs)
    assert '"parts"' in report.to_json()


@pytest.mark.parametrize("bug, backward, regime", [
    ("sink_outside_max", False, "sink_far_above"),
    ("nan_masked_rows", False, "bias_masked_rows"),
    ("sink_per_kv_head", False, "gqa"),
    ("dsink_without_dlse", True, "cotangent_lse"),
])
def test_bug_is_found_shrunk_and_replays(bug, backward, regime, verify_exe, tmp_path):
    # the backward bug leaves the forward right: fuzz only the regime where the backward shows it
    only = (regime,) if backward else ()
    report = oasis.fuzz(functools.partial(sink_attention, bug=bug), "attention", backward=backward, tensors="torch",
                        dtypes=("float32", "bfloat16"), without=WITHOUT, only=only, replay_dir=tmp_path)
    print(report)
    f = report.failure
    assert not report.passed and f is not None and f["kind"] == "wrong"
    assert f["regime"].startswith(regime) and f["op"] == ("attention_backward" if backward else "attention")
    d = shrunk_dims(f)
    assert d["B"] <= 2 and d["H"] <= 2 and d["Tq"] <= 16, f["shrunk_to"]
    assert not f["report"].passed and f["replay_dir"].startswith(str(tmp_path))
    with pytest.raises(AssertionError, match="FIRST FAILURE"):
        report.assert_ok()
    r = replay(f, verify_exe)
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr


def test_a_raising_kernel_is_a_crash(tmp_path):
    def kernel(inputs, options):
        raise ZeroDivisionError("tile count 0")

    report = oasis.fuzz(kernel, "attention", tensors="torch", replay_dir=tmp_path)
    f = report.failure
    assert f["kind"] == "crash" and report.runs[0]["verdict"] == "CRASH"
    assert "ZeroDivisionError: tile count 0" in f["message"] and "test_fuzz.py" in f["message"]
    assert f["replay_command"] == "" and "FIRST FAILURE (crash)" in str(report)


def test_a_hanging_kernel_is_a_hang_within_the_timeout(tmp_path):
    def kernel(inputs, options):
        while True:
            time.sleep(0.05)

    before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    report = oasis.fuzz(kernel, "attention", tensors="numpy", timeout=1, replay_dir=tmp_path)
    assert time.monotonic() - start < 5
    assert report.failure["kind"] == "hang" and report.runs[0]["verdict"] == "HANG"
    assert "no result within 1 s" in report.failure["message"]
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_keyboard_interrupt_stops_fuzzing_and_is_raised(tmp_path):
    calls = []

    def kernel(inputs, options):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return sink_attention(inputs, options)

    with pytest.raises(KeyboardInterrupt):
        oasis.fuzz(kernel, "attention", tensors="torch", device="cpu", replay_dir=tmp_path)
    assert len(calls) == 3


def test_fixed_option_reaches_every_case(tmp_path):
    """A kernel whose LSE is always in base 2 passes with fixed lse_base "2", and fails without it."""
    def base2(inputs, options):
        out = sink_attention(inputs, options)
        return dict(out, lse=out["lse"] / math.log(2))

    kw = dict(tensors="torch", only=("typical", "sink_far_above"), replay_dir=tmp_path)
    oasis.fuzz(base2, "attention", fixed={"lse_base": "2"}, **kw).assert_ok()
    report = oasis.fuzz(base2, "attention", **kw)
    assert report.failure["kind"] == "wrong" and report.runs[0]["detail"] == "lse"


def test_numpy_kernel(tmp_path):
    """A NumPy kernel in float64: bf16 inputs arrive as float32 arrays of bf16-exact values, f16 as
    float16; its outputs are returned as float32 (float16 for float16 inputs)."""
    seen = set()

    def kernel(inputs, options):
        q, k, v = (inputs[n].astype(np.float64) for n in ("q", "k", "v"))
        seen.add(inputs["q"].dtype.name)
        if inputs["q"].dtype == np.float32:  # bf16-exact values have 16 zero low bits, float32 draws do not all
            seen.add("bf16-exact" if not (inputs["q"].view(np.uint32) & 0xFFFF).any() else "f32")
        B, H, Tq, dh = q.shape
        g = H // k.shape[1]
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        z = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        if options.get("causal"):
            Tk = k.shape[2]
            z = np.where(np.arange(Tk)[None, :] > np.arange(Tq)[:, None] + Tk - Tq, -np.inf, z)
        s = np.broadcast_to(inputs["null_logits"].astype(np.float64)[None, :, None, None], (B, H, Tq, 1))
        zz = np.concatenate([z, s], axis=-1)
        m = zz.max(-1, keepdims=True)
        e = np.exp(zz - m)
        l = e.sum(-1)
        out_dtype = np.float16 if inputs["q"].dtype == np.float16 else np.float32
        return {"out": ((e[..., :-1] / l[..., None]) @ v).astype(out_dtype),
                "lse": (m[..., 0] + np.log(l)).astype(np.float32)}

    report = oasis.fuzz(kernel, "attention", dtypes=("float32", "bfloat16", "float16"), without=WITHOUT,
                        only=("typical", "sink_far_above", "gqa", "decode"), replay_dir=tmp_path)
    print(report)
    report.assert_ok()
    assert seen == {"float32", "float16", "f32", "bf16-exact"}
    assert {r["dtype"] for r in report.runs} == {"f32", "bf16", "f16"}


def test_missing_output_for_a_cotangent_is_a_usage_error():
    def kernel(inputs, options):
        return {"out": sink_attention(inputs, options)["out"]}

    with pytest.raises(oasis.InvalidArgument, match="without=\\('grad_lse',\\)") as e:
        oasis.fuzz(kernel, "attention", backward=True, tensors="torch", only=("cotangent_lse",))
    assert e.value.argument == "fn"


@pytest.mark.parametrize("kwargs, argument", [
    (dict(op="attn"), "op"),
    (dict(op="model"), "op"),
    (dict(op="attn", backward=True, tensors="torch"), "op"),
    (dict(without=("sliding",)), "without"),
    (dict(dtypes=("float8",)), "dtypes"),
    (dict(only=("no_such_regime",)), "only"),
    (dict(tensors="jax"), "tensors"),
    (dict(backward=True), "backward"),
    (dict(op="normalizer", backward=True, tensors="torch"), "backward"),
    (dict(seed=-1), "seed"),
    (dict(timeout=-2), "timeout"),
    (dict(log=3), "log"),
    (dict(policy="strict"), "policy"),
])
def test_bad_arguments_raise_invalid_argument(kwargs, argument):
    kwargs = dict(dict(op="attention"), **kwargs)
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.fuzz(sink_attention, kwargs.pop("op"), **kwargs)
    assert e.value.argument == argument, str(e.value)


def test_timeout_outside_the_main_thread_is_refused():
    errors = []

    def run():
        try:
            oasis.fuzz(sink_attention, "attention", tensors="torch", timeout=5)
        except oasis.InvalidArgument as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors and errors[0].argument == "timeout" and "main thread" in str(errors[0])


def test_catalogue():
    regimes = oasis.fuzz_regimes("attention_backward")
    names = [r["name"] for r in regimes]
    assert "cotangent_lse" in names and "sink_far_above" in names
    assert all({"name", "ops", "description", "targets", "needs", "variants"} <= set(r) for r in regimes)
    assert "cotangent_lse" not in [r["name"] for r in oasis.fuzz_regimes("attention")]
    assert "grad_lse" in oasis.fuzz_features() and "infinite_null" in oasis.fuzz_features()
    with pytest.raises(oasis.InvalidArgument):
        oasis.fuzz_regimes("attn")
