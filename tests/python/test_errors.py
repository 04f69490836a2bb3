"""Bad input raises oasis.InvalidArgument naming the argument; nothing crashes the interpreter.

Each case is one call and the argument its error must name. The crash test runs every case, and
calls that reach deeper into the C++ code with odd arrays, in a child interpreter: a segfault or
an abort there fails the test instead of killing pytest.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oasis

f32 = lambda *s: np.ones(s, dtype=np.float32)
f64 = lambda *s: np.ones(s, dtype=np.float64)


def with_nan(a, index):
    a = a.copy()
    a[index] = np.nan
    return a


Q, K, V = f32(1, 2, 3, 4), f32(1, 2, 3, 4), f32(1, 2, 3, 4)
OUT = {"out": f32(1, 2, 3, 4)}
QKV = {"q": Q, "k": K, "v": V}
MODEL_CFG = {"d_model": 8, "n_heads": 2, "d_ff": 8, "vocab_size": 11, "n_blocks": 1}

# (id, call, argument named by the error)
CASES = [
    # check(): names, options, dtypes, layouts, NaN
    ("op type", lambda: oasis.check(3, QKV, OUT), "op"),
    ("unknown op", lambda: oasis.check("atention", QKV, OUT), "op"),
    ("unknown option", lambda: oasis.check("attention", QKV, OUT, options={"casual": True}), "options"),
    ("unknown input", lambda: oasis.check("attention", dict(QKV, qq=Q), OUT), "qq"),
    ("unknown output", lambda: oasis.check("attention", QKV, {"output": OUT["out"]}), "output"),
    ("missing input", lambda: oasis.check("attention", {"q": Q, "k": K}, OUT), "v"),
    ("NaN input", lambda: oasis.check("attention", dict(QKV, k=with_nan(K, (0, 1, 2, 3))), OUT), "k"),
    ("coupled depth without psi", lambda: oasis.check("depth", {"sources": f64(2, 3, 4), "g_old": f64(2, 3)}, {"h": f64(3, 4)}), "psi"),
    ("output of the other estimator", lambda: oasis.check("psi_backward", {"p_null": f64(1, 2, 3), "grad_psi": f64(1, 3)},
                                                          {"grad_probs": f64(1, 2, 3, 4)}), "grad_probs"),
    ("int dtype", lambda: oasis.check("attention", dict(QKV, q=Q.astype(np.int32)), OUT), "q"),
    ("untagged uint16", lambda: oasis.check("attention", QKV, {"out": OUT["out"].view(np.uint16)}), "out"),
    ("non-contiguous", lambda: oasis.check("attention", dict(QKV, q=f32(1, 2, 4, 3).transpose(0, 1, 3, 2)), OUT), "q"),
    ("big-endian", lambda: oasis.check("attention", dict(QKV, q=Q.astype(">f4")), OUT), "q"),
    ("list as tensor", lambda: oasis.check("attention", dict(QKV, q=Q.tolist()), OUT), "q"),
    ("inputs not a dict", lambda: oasis.check("attention", [Q, K, V], OUT), "inputs"),
    ("options not a dict", lambda: oasis.check("attention", QKV, OUT, options="causal"), "options"),
    ("NaN option", lambda: oasis.check("attention", QKV, OUT, options={"scale": float("nan")}), "options"),
    ("wrong-rank input", lambda: oasis.check("attention", dict(QKV, q=f32(2, 3, 4)), OUT), "q"),
    # core functions
    ("float16 core", lambda: oasis.token_attention(Q.astype(np.float16), K, V), "q"),
    ("mixed dtypes", lambda: oasis.token_attention(Q, K.astype(np.float64), V), "k"),
    ("non-contiguous core", lambda: oasis.token_attention(Q, K, f32(1, 2, 4, 3).transpose(0, 1, 3, 2)), "v"),
    ("NaN core", lambda: oasis.token_attention(with_nan(Q, (0, 0, 1, 1)), K, V), "q"),
    ("head size", lambda: oasis.token_attention(Q, f32(1, 2, 3, 5), f32(1, 2, 3, 5)), "k"),
    ("GQA", lambda: oasis.token_attention(f32(1, 3, 3, 4), K, V), "k"),
    ("normalizer", lambda: oasis.token_attention(Q, K, V, normalizer="softmax2"), "normalizer"),
    ("layout", lambda: oasis.token_attention(Q, K, V, layout="tbhd"), "layout"),
    ("null_logits count", lambda: oasis.token_attention(Q, K, V, null_logits=[1.0]), "null_logits"),
    ("bf16 core", lambda: oasis.softmax1(oasis.bf16(np.zeros(3, np.uint16))), "z"),
    ("+inf logit", lambda: oasis.softmax1(np.array([0.0, np.inf])), "z"),
    ("NaN logit", lambda: oasis.softmax1(np.array([0.0, np.nan])), "z"),
    ("s shape", lambda: oasis.softmax1(f64(3, 4), s=f64(4)), "s"),
    ("scalar rows", lambda: oasis.softmax1(np.float64(1.0) * f64()), "z"),
    ("psi rank", lambda: oasis.null_statistic(f64(2, 3)), "p_null"),
    ("kinds count", lambda: oasis.attn_res_route(f64(3, 2, 4), f64(3, 2), f64(3, 2) / 2, kinds=["initial"]), "kinds"),
    ("kind name", lambda: oasis.attn_res_route(f64(2, 2, 4), f64(2, 2), f64(2, 2) / 2, kinds=["initial", "mlp"]), "kinds"),
    ("psi missing", lambda: oasis.attn_res_route(f64(2, 2, 4), f64(2, 2)), "psi"),
    ("psi range", lambda: oasis.attn_res_route(f64(2, 2, 4), f64(2, 2), 2 * f64(2, 2)), "psi"),
    ("route option", lambda: oasis.couple_depth_logits(f64(3), f64(3), 0.5, profile="kimi"), "profile"),
    ("w size", lambda: oasis.pseudo_query_logits(f64(2, 3, 4), f64(5)), "w"),
    # the model
    ("config key", lambda: oasis.Model.initialized({"d_modle": 8}, 1), "d_modle"),
    ("config value", lambda: oasis.Model.initialized({"variant": "oasiss"}, 1), "variant"),
    ("config type", lambda: oasis.Model.initialized({"qk_norm": [1]}, 1), "qk_norm"),
    ("config consistency", lambda: oasis.Model.initialized(dict(MODEL_CFG, n_heads=3), 1), "d_head"),
    ("missing weight", lambda: oasis.Model(MODEL_CFG, {}), "embed_tokens.weight"),
    ("extra weight", lambda: oasis.Model(MODEL_CFG, dict(oasis.Model.initialized(MODEL_CFG, 1).weights(), rope=f32(3))), "rope"),
    ("weight shape", lambda: oasis.Model(MODEL_CFG, dict(oasis.Model.initialized(MODEL_CFG, 1).weights(), **{"norm.weight": f32(7)})), "norm.weight"),
    ("NaN weight", lambda: oasis.Model(MODEL_CFG, dict(oasis.Model.initialized(MODEL_CFG, 1).weights(), **{"norm.weight": with_nan(f32(8), 3)})), "norm.weight"),
    ("id range", lambda: oasis.Model.initialized(MODEL_CFG, 1).forward(np.array([[1, 11]])), "ids"),
    ("float ids", lambda: oasis.Model.initialized(MODEL_CFG, 1).forward(np.array([[1.0, 2.0]])), "ids"),
    ("ids rank", lambda: oasis.Model.initialized(MODEL_CFG, 1).forward(np.array([1, 2])), "ids"),
    ("forward dtype", lambda: oasis.Model.initialized(MODEL_CFG, 1).forward(np.array([[1, 2]]), dtype="float16"), "dtype"),
    ("trace name", lambda: oasis.check_model(oasis.Model.initialized(MODEL_CFG, 1), {"layers.0.attn.attn_qq": f32(1, 2, 8)}, ids=[[1, 2]]), "layers.0.attn.attn_qq"),
    ("no ids", lambda: oasis.check_model(oasis.Model.initialized(MODEL_CFG, 1), {"logits": f32(1, 2, 11)}), "ids"),
    ("negative ids", lambda: oasis.check_model(oasis.Model.initialized(MODEL_CFG, 1), {"logits": f32(1, 2, 11)}, ids=[[1, -2]]), "ids"),
    ("model type", lambda: oasis.check_model(42, {"logits": f32(1, 2, 11)}, ids=[[1, 2]]), "model"),
    ("missing file", lambda: oasis.check_model("/nonexistent/model.safetensors", {"logits": f32(1, 2, 11)}, ids=[[1, 2]]), "/nonexistent/model.safetensors"),
    # the MLP's input is its router's output over the embedding and layers.0.attn.output, not in the trace
    ("step input missing", lambda: oasis.check_model(oasis.Model.initialized(MODEL_CFG, 1), {"layers.0.mlp.mlp_hidden": f32(1, 2, 8)}, ids=[[1, 2]]), "layers.0.attn.output"),
    # the recorder
    ("record name", lambda: oasis.TraceRecorder().record("layers.0.attention.input", f32(1, 2, 8)), "layers.0.attention.input"),
    ("record rank", lambda: oasis.TraceRecorder().record("layers.0.attn.input", f32(2, 8)), "layers.0.attn.input"),
    ("record layout", lambda: oasis.TraceRecorder().record("layers.0.attn.attn_q", f32(1, 2, 2, 4)), "layers.0.attn.attn_q"),
]


@pytest.mark.parametrize("call,argument", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(oasis.InvalidArgument) as e:
        call()
    assert e.value.argument == argument, str(e.value)
    assert isinstance(e.value, ValueError) and f"argument '{argument}'" in str(e.value)


def test_a_wrong_output_shape_is_a_failing_row_not_an_error():
    r = oasis.check("attention", QKV, {"out": f32(1, 2, 3, 5)})
    assert not r.passed and "shape [1, 2, 3, 5] but the oracle's out has shape [1, 2, 3, 4]" in r["out"]["problem"]


def test_nan_outputs_fail_and_do_not_raise():
    r = oasis.check("attention", QKV, {"out": with_nan(oasis.token_attention(Q, K, V)["out"], (0, 0, 0, 0))})
    assert not r.passed and r["out"]["violations"] == 1


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import oasis, _core_probe
    from test_errors import CASES
    survived = 0
    for name, call in [c[:2] for c in CASES] + _core_probe.PROBES:
        try:
            call()
        except Exception:
            survived += 1
    print("survived", survived)
""")

PROBE = textwrap.dedent("""
    import numpy as np
    from oasis import _core
    z = np.zeros
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(1 << 20, 1 << 20), strides=(0, 0))
    PROBES = [
        ("direct wrong types", lambda: _core.token_attention(None, None, None, None, "")),
        ("direct bad json", lambda: _core.token_attention(z((1,1,1,1), np.float32), z((1,1,1,1), np.float32), z((1,1,1,1), np.float32), None, "{")),
        ("direct bad map", lambda: _core.check("attention", {"q": 1}, {}, "", "")),
        ("direct bad tag", lambda: _core.check("attention", {"q": ("f8", z(1))}, {}, "", "")),
        ("broadcast giant", lambda: _core.normalize(big, z(1 << 20, np.float32), "softmax1", "zero")),
        ("empty dims", lambda: _core.token_attention(z((1,1,0,4), np.float32), z((1,1,0,4), np.float32), z((1,1,0,4), np.float32), None, "")),
        ("zero-size ids", lambda: _core.model_initialized({}, 1).forward(z((0, 3), np.int64), "float64", False)),
        ("zero-d arrays", lambda: _core.null_statistic(np.float64(1.0) * np.ones(()))),
        ("zero-size route", lambda: _core.attn_res_route(z((0, 2, 3)), z((0, 2)), z((0, 2)), "")),
        ("huge window", lambda: _core.token_attention(z((1,1,2,2)), z((1,1,2,2)), z((1,1,2,2)), None, '{"window": 1e300}')),
        ("negative key length", lambda: _core.token_attention(z((1,1,2,2)), z((1,1,2,2)), z((1,1,2,2)), None, '{"key_lengths": [-1]}')),
        ("empty model check", lambda: _core.check_model_held(_core.model_initialized({}, 1), {"ids": ("f64", z((1, 0)))}, {}, "", "")),
    ]
""")


def test_nothing_crashes_the_interpreter(tmp_path):
    """Every bad call above, and odd arrays given to the compiled functions directly, in a child
    interpreter: it must finish normally (a crash would show as a signal or an abort)."""
    (tmp_path / "_core_probe.py").write_text(PROBE)
    path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=path))
    assert child.returncode == 0, f"child exited with {child.returncode}\n{child.stdout}\n{child.stderr}"
    assert child.stdout.strip() == f"survived {len(CASES) + PROBE.count('lambda:')}", child.stdout + child.stderr
