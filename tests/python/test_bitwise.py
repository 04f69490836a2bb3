"""The core functions and the model forward give the C++ library's bits, in float32 and float64.

The inputs are random (seeded); oasis_python_golden (golden.cpp) reads them from .npy files and
calls the library as a C++ user does, with the options of each case fixed there; the module is
called here with the same options spelled through its Python arguments. Bit equality is the
claim, so the comparison is of the raw bits (NaN-safe), with the first differing index printed.
"""

import subprocess

import numpy as np
import pytest

import oasis
import support

DTYPES = {"_f32": np.float32, "_f64": np.float64}


def bits_equal(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, f"{name}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    view = np.uint32 if got.dtype == np.float32 else np.uint64
    diff = np.flatnonzero(got.view(view) != want.view(view))
    assert diff.size == 0, (f"{name}: {diff.size} elements differ, first at {np.unravel_index(diff[0], got.shape)}: "
                            f"{got.flat[diff[0]]!r} vs {want.flat[diff[0]]!r}")


def make_inputs(rng, dt):
    """{case: {input: array}}: the inputs of every case of golden.cpp in dtype dt."""
    f = lambda *shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(dt)
    z = f(3, 4, 6, scale=3.0)
    z[0, 1, 2] = -np.inf
    z[2, 3, :] = -np.inf  # a fully masked row: p = 0, p_null = 1, lse = s
    probs = rng.random((2, 3, 4, 5)).astype(dt)
    probs /= (1.3 * probs.sum(-1, keepdims=True)).astype(dt)
    bias = rng.standard_normal((5, 6))
    bias[1, 0] = -np.inf
    g_old = f(5, 6, scale=30.0)  # beyond the authors' clamp of 50 in places
    return {
        "softmax1": {"z": z, "s": f(3, 4)},
        "attention": {"q": f(2, 4, 5, 8), "k": f(2, 2, 7, 8), "v": f(2, 2, 7, 8)},
        "window": {"q": f(2, 5, 3, 4), "k": f(2, 6, 3, 4), "v": f(2, 6, 3, 4), "bias": bias},
        "psi": {"p_null": rng.random((2, 4, 5)).astype(dt)},
        "mass": {"probs": probs},
        "coupling": {"g_old": g_old, "dpsi": f(5, 6, scale=0.3)},
        "route": {"sources": f(4, 6, 8), "g_old": f(4, 6), "psi": rng.random((4, 6)).astype(dt)},
        "pseudo_query": {"sources": f(3, 6, 8), "w": f(8), "gain": f(8)},
    }


def python_side(case, x):
    """The module's result for one case, with golden.cpp's options."""
    if case == "softmax1":
        return oasis.softmax1(x["z"], s=x["s"])
    if case == "attention":
        return oasis.token_attention(x["q"], x["k"], x["v"], causal=True, null_logits=[0.5, -1.0, 0.0, 2.0],
                                     key_lengths=[7, 4], return_probs=True)
    if case == "window":
        return oasis.token_attention(x["q"], x["k"], x["v"], normalizer="softmax", layout="bthd", window=3, scale=0.3,
                                     bias=x["bias"])
    if case == "psi":
        return {"psi": oasis.null_statistic(x["p_null"])}
    if case == "mass":
        return {"psi": oasis.null_statistic_from_mass(x["probs"])}
    if case == "coupling":
        return {"g": oasis.couple_depth_logits(x["g_old"], x["dpsi"], 0.7, profile="authors_code")}
    if case == "route":
        return oasis.attn_res_route(x["sources"], x["g_old"], x["psi"], theta=0.3,
                                    kinds=["initial", "attention", "headless", "attention"])
    if case == "pseudo_query":
        return {"g": oasis.pseudo_query_logits(x["sources"], x["w"], x["gain"], eps=1e-5)}
    raise AssertionError(case)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """Run golden.cpp once on fresh inputs: (directory, {case+sfx: inputs}, ids)."""
    exe = support.program("OASIS_GOLDEN", "oasis_python_golden program")
    rng = np.random.default_rng(support.seed())
    d = tmp_path_factory.mktemp("golden")
    cases = {}
    for sfx, dt in DTYPES.items():
        for case, x in make_inputs(rng, dt).items():
            cases[case + sfx] = x
            for name, a in x.items():
                np.save(d / f"{case}{sfx}.{name}.npy", a)
    ids = rng.integers(0, 32, size=(2, 5))
    np.save(d / "model.ids.npy", ids.astype(np.float64))
    subprocess.run([exe, str(d)], check=True)
    return d, cases, ids


@pytest.mark.parametrize("sfx", list(DTYPES))
@pytest.mark.parametrize("case", ["softmax1", "attention", "window", "psi", "mass", "coupling", "route", "pseudo_query"])
def test_core_function_equals_the_library_bitwise(golden, case, sfx):
    d, cases, _ = golden
    got = python_side(case, cases[case + sfx])
    files = sorted(d.glob(f"{case}{sfx}.out.*.npy"))
    assert files, "golden.cpp wrote no output for this case"
    assert set(got) == {f.name.split(".")[2] for f in files}
    for f in files:
        name = f.name.split(".")[2]
        bits_equal(f"{case}{sfx}.{name}", got[name], np.load(f))


@pytest.mark.parametrize("sfx", list(DTYPES))
def test_model_forward_equals_the_library_bitwise(golden, sfx):
    d, _, ids = golden
    dtype = "float32" if sfx == "_f32" else "float64"
    from_file = oasis.Model.load(d / "model.safetensors")
    in_memory = oasis.Model(from_file.config, from_file.weights())  # the same model through the dict form
    for m in (from_file, in_memory):
        r = m.forward(ids, dtype=dtype)
        for name in ("logits", "state"):
            bits_equal(f"model{sfx}.{name}", r[name], np.load(d / f"model{sfx}.out.{name}.npy"))


def test_the_bitwise_comparison_sees_one_ulp(golden):
    """bits_equal is not vacuous: one ulp of difference is reported with its index."""
    d, _, _ = golden
    want = np.load(d / "attention_f32.out.out.npy")
    got = want.copy()
    got[1, 2, 3, 4] = np.nextafter(got[1, 2, 3, 4], np.float32(np.inf))
    with pytest.raises(AssertionError, match=r"1 elements differ, first at \(1, 2, 3, 4\)"):
        bits_equal("out", got, want)
