"""The backends and the kernel-interface functions of oasis (docs/python.md, "Backends and
kernel-interface functions"), each checked against NumPy written here:

- forwards against a NumPy float64 implementation of the formula (softmax1 attention with GQA,
  per-head null logits and a bottom-right causal mask; fused AttnRes routing: RMSNorm keys, depth
  softmax / softmax1; varlen and paged as dense attention per sequence);
- backwards against central finite differences of that NumPy forward, for the loss
  L = <grad_out, out> + <grad_lse, lse> + <grad_p_null, p_null> (attention) or
  L = <grad_h, h> + <grad_alpha, alpha> + <grad_alpha_null, alpha_null> (AttnRes);
- the coupled routing (no NumPy formula here) on a fast backend against the float64 reference.

Tolerances, as max |x - ref| <= tol * max(1, max |ref|): the float64 reference against NumPy
float64 1e-10 (forward) and 1e-8 (against finite differences of step 1e-5: truncation ~1e-10,
cancellation ~1e-11; observed <= 2e-10); any backend in float32 against float64 1e-5 (forward)
and 5e-5 (backward), some 100 to 400 float32 roundings for these sizes (d <= 8, at most 12 keys)
and 8 to 20 times the largest error cpu_fast shows over seeds 1-7 and the default (6e-7 forward,
1e-6 backward), while a mistake of formula (a missing null, a wrong mask or head, a gradient
without a term) moves a result by more than 1e-2, and a float32 kernel with a lost digit (an
intermediate state of cpu_fast's attn_res_backward erred by 1e-3 in grad_sources) fails.

"cuda" runs where it is available and is skipped otherwise, after checking that asking for it
raises InvalidArgument naming "backend". Bad input: test_backends_errors.py.
"""

import numpy as np
import pytest

import oasis

FAST = [b for b in oasis.backends() if b != "reference"]
ALL = ["reference", "cpu_fast", "cuda"]

TOL64, TOL_FD, TOL32_FWD, TOL32_BWD = 1e-10, 1e-8, 1e-5, 5e-5


def close(x, ref, tol, what=""):
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert x.shape == ref.shape, f"{what}: shape {x.shape} != {ref.shape}"
    err = float(np.max(np.abs(x - ref))) if ref.size else 0.0
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} * {scale:.3g}"


def need(backend):
    if backend not in oasis.backends():
        pytest.skip(f"backend {backend} is not available here")


def dtype_of(backend):
    """The reference runs float64 here (tight tolerances); every other backend float32."""
    return np.float64 if backend == "reference" else np.float32


def tols(backend):
    return (TOL64, TOL_FD) if backend == "reference" else (TOL32_FWD, TOL32_BWD)


def cast(d, dt):
    return {k: (v.astype(dt) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for k, v in d.items()}


def fd_grad(f, x, h=1e-5):
    """Central finite differences of the scalar f() with respect to the array x (changed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


# ---- NumPy references --------------------------------------------------------------------------------------


def np_attention(q, k, v, null_logits=None, causal=False, scale=None, normalizer="softmax1"):
    """Dense attention, layout bhtd, float64: out, lse, p_null (softmax1 with null logit s_h per head;
    causal bottom-right aligned: query t sees key j iff j <= t + Tk - Tq)."""
    B, H, Tq, dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(dh) if scale is None else scale
    kk = np.repeat(k, H // Hkv, axis=1)
    vv = np.repeat(v, H // Hkv, axis=1)
    z = np.einsum("bhtd,bhjd->bhtj", q, kk) * scale
    if causal:
        mask = np.arange(Tk)[None, :] > np.arange(Tq)[:, None] + Tk - Tq
        z = np.where(mask, -np.inf, z)
    if normalizer == "softmax1":
        s = np.zeros(H) if null_logits is None else np.asarray(null_logits, dtype=np.float64)
        s = np.broadcast_to(s[None, :, None, None], (B, H, Tq, 1))
        zz = np.concatenate([z, s], axis=-1)
    else:
        zz = z
    m = np.max(zz, axis=-1, keepdims=True)
    e = np.exp(zz - m)
    tot = e.sum(-1, keepdims=True)
    p = e / tot
    lse = (m + np.log(tot))[..., 0]
    if normalizer == "softmax1":
        p, p_null = p[..., :Tk], p[..., Tk]
    else:
        p_null = np.zeros((B, H, Tq))
    out = np.einsum("bhtj,bhjd->bhtd", p, vv)
    return {"out": out, "lse": lse, "p_null": p_null}


def np_attn_res(sources, w, gain=None, eps=1e-6, scale=1.0, normalizer="softmax"):
    """Fused AttnRes routing without coupling, float64: g = scale w^T RMSNorm(s), then the depth
    normaliser over the n candidates (softmax1: null logit 0)."""
    y = sources / np.sqrt(np.mean(sources**2, axis=-1, keepdims=True) + eps)
    if gain is not None:
        y = y * gain
    g = scale * (y @ w)  # [n, N]
    return np_route(sources, g, normalizer)


def np_route(sources, g, normalizer):
    zz = np.concatenate([g, np.zeros((1, g.shape[1]))], axis=0) if normalizer == "softmax1" else g
    m = zz.max(0, keepdims=True)
    e = np.exp(zz - m)
    p = e / e.sum(0, keepdims=True)
    n = g.shape[0]
    alpha = p[:n]
    alpha_null = p[n] if normalizer == "softmax1" else np.zeros(g.shape[1])
    h = np.einsum("it,itc->tc", alpha, sources)
    return {"h": h, "alpha": alpha, "alpha_null": alpha_null, "g": g}


# ---- inputs ----------------------------------------------------------------------------------------------


@pytest.fixture
def attn(rng):
    B, H, Hkv, T, dh, dv = 2, 4, 2, 5, 8, 6
    return {
        "q": rng.standard_normal((B, H, T, dh)),
        "k": rng.standard_normal((B, Hkv, T, dh)),
        "v": rng.standard_normal((B, Hkv, T, dv)),
        "null_logits": rng.standard_normal(H),
        "grad_out": rng.standard_normal((B, H, T, dv)),
        "grad_lse": rng.standard_normal((B, H, T)),
        "grad_p_null": rng.standard_normal((B, H, T)),
    }


@pytest.fixture
def depth(rng):
    n, N, d = 4, 6, 8
    return {
        "sources": rng.standard_normal((n, N, d)),
        "w": rng.standard_normal(d),
        "gain": 1 + 0.3 * rng.standard_normal(d),
        "psi": rng.uniform(0.05, 0.95, (n, N)),
        "grad_h": rng.standard_normal((N, d)),
        "grad_alpha": rng.standard_normal((n, N)),
        "grad_alpha_null": rng.standard_normal(N),
    }


# ---- the list ----------------------------------------------------------------------------------------------


def test_backends_lists_reference_first_and_cpu_fast():
    names = oasis.backends()
    assert names[0] == "reference" and "cpu_fast" in names
    assert all(oasis.backend_available(b) for b in names)
    assert oasis.backend_available("cuda") == ("cuda" in names)
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.backend_available("gpu")
    assert e.value.argument == "backend" and "cpu_fast" in str(e.value)


def test_unavailable_cuda_is_an_error_naming_backend(attn, depth):
    if "cuda" in oasis.backends():
        pytest.skip("cuda is available here")
    q32 = attn["q"].astype(np.float32)
    s32, w32 = depth["sources"].astype(np.float32), depth["w"].astype(np.float32)
    calls = [
        lambda: oasis.token_attention(q32, q32, q32, backend="cuda"),
        lambda: oasis.token_attention_backward(q32, q32, q32, q32, backend="cuda"),
        lambda: oasis.attn_res(s32, w32, backend="cuda"),
        lambda: oasis.attn_res_route(s32, s32[:, :, 0], coupling=False, backend="cuda"),
    ]
    for call in calls:
        with pytest.raises(oasis.InvalidArgument) as e:
            call()
        assert e.value.argument == "backend" and "cuda is not available" in str(e.value)


# ---- token attention ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_token_attention(backend, attn):
    need(backend)
    dt, (tol, _) = dtype_of(backend), tols(backend)
    a = cast(attn, dt)
    for causal in (False, True):
        ref = np_attention(attn["q"], attn["k"], attn["v"], attn["null_logits"], causal=causal)
        r = oasis.token_attention(a["q"], a["k"], a["v"], null_logits=attn["null_logits"], causal=causal,
                                  backend=backend)
        for name in ("out", "lse", "p_null"):
            assert r[name].dtype == dt
            close(r[name], ref[name], tol, f"{backend} causal={causal} {name}")


def test_reference_backend_is_the_default(attn):
    a = cast(attn, np.float32)
    r0 = oasis.token_attention(a["q"], a["k"], a["v"], causal=True)
    r1 = oasis.token_attention(a["q"], a["k"], a["v"], causal=True, backend="reference")
    for name in r0:
        assert np.array_equal(r0[name], r1[name])


@pytest.mark.parametrize("backend", ALL)
def test_token_attention_backward(backend, attn):
    need(backend)
    dt, (_, tol) = dtype_of(backend), tols(backend)
    q, k, v, s = (attn[x].copy() for x in ("q", "k", "v", "null_logits"))
    do, dl, dp = attn["grad_out"], attn["grad_lse"], attn["grad_p_null"]

    def loss():
        r = np_attention(q, k, v, s, causal=True)
        return np.sum(r["out"] * do) + np.sum(r["lse"] * dl) + np.sum(r["p_null"] * dp)

    a = cast(attn, dt)
    g = oasis.token_attention_backward(a["q"], a["k"], a["v"], a["grad_out"], a["grad_lse"], a["grad_p_null"],
                                       null_logits=attn["null_logits"], causal=True, backend=backend)
    assert set(g) == {"grad_q", "grad_k", "grad_v", "grad_null_logits"}
    for name, x in (("q", q), ("k", k), ("v", v), ("null_logits", s)):
        close(g["grad_" + name], fd_grad(loss, x), tol, f"{backend} grad_{name}")


@pytest.mark.parametrize("backend", ALL)
def test_token_attention_backward_without_optional_cotangents(backend, attn):
    need(backend)
    dt, (_, tol) = dtype_of(backend), tols(backend)
    q, k, v = (attn[x].copy() for x in ("q", "k", "v"))
    do = attn["grad_out"]

    def loss():
        return np.sum(np_attention(q, k, v, normalizer="softmax")["out"] * do)

    a = cast(attn, dt)
    g = oasis.token_attention_backward(a["q"], a["k"], a["v"], a["grad_out"], normalizer="softmax", backend=backend)
    assert "grad_null_logits" not in g
    for name, x in (("q", q), ("k", k), ("v", v)):
        close(g["grad_" + name], fd_grad(loss, x), tol, f"{backend} grad_{name}")


# ---- depth routing and the fused AttnRes routing -----------------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_attn_res_route(backend, depth, rng):
    need(backend)
    dt, (tol, _) = dtype_of(backend), tols(backend)
    g_old = rng.standard_normal(depth["psi"].shape)
    for normalizer in ("softmax", "softmax1"):
        ref = np_route(depth["sources"], g_old, normalizer)
        r = oasis.attn_res_route(depth["sources"].astype(dt), g_old.astype(dt), coupling=False, normalizer=normalizer,
                                 backend=backend)
        for name in ("h", "alpha", "alpha_null", "g"):
            close(r[name], ref[name], tol, f"{backend} {normalizer} {name}")


@pytest.mark.parametrize("backend", FAST)
def test_coupled_attn_res_route_matches_the_float64_reference(backend, depth, rng):
    g_old = rng.standard_normal(depth["psi"].shape)
    kinds = ["initial", "attention", "headless", "attention"]
    args = (depth["sources"], g_old, depth["psi"])
    ref = oasis.attn_res_route(*args, kinds=kinds, beta=0.5)
    r = oasis.attn_res_route(*(x.astype(np.float32) for x in args), kinds=kinds, beta=0.5, backend=backend)
    for name in ref:
        close(r[name], ref[name], TOL32_FWD, f"{backend} {name}")


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("normalizer", ["softmax", "softmax1"])
def test_attn_res(backend, normalizer, depth):
    need(backend)
    dt, (tol, _) = dtype_of(backend), tols(backend)
    a = cast(depth, dt)
    ref = np_attn_res(depth["sources"], depth["w"], depth["gain"], eps=1e-5, scale=0.7, normalizer=normalizer)
    r = oasis.attn_res(a["sources"], a["w"], a["gain"], eps=1e-5, scale=0.7, normalizer=normalizer, backend=backend)
    assert set(r) == {"h", "alpha", "alpha_null", "g", "dpsi"}
    for name in ("h", "alpha", "alpha_null", "g"):
        close(r[name], ref[name], tol, f"{backend} {name}")
    assert not np.any(r["dpsi"])


def test_attn_res_defaults_are_op_attn_res(depth):
    """normalizer softmax (alpha_null 0), eps 1e-6, scale 1, no gain, coupling off without psi."""
    r = oasis.attn_res(depth["sources"], depth["w"])
    ref = np_attn_res(depth["sources"], depth["w"])
    for name in ("h", "alpha", "alpha_null", "g"):
        close(r[name], ref[name], TOL64, name)
    assert not np.any(r["alpha_null"])


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("normalizer", ["softmax", "softmax1"])
def test_attn_res_backward(backend, normalizer, depth):
    need(backend)
    dt, (_, tol) = dtype_of(backend), tols(backend)
    s, w, gain = (depth[x].copy() for x in ("sources", "w", "gain"))
    dh, da, dan = depth["grad_h"], depth["grad_alpha"], depth["grad_alpha_null"]
    g0 = np_attn_res(s, w, gain, scale=0.7, normalizer=normalizer)["g"]

    def loss_of(r):
        return np.sum(r["h"] * dh) + np.sum(r["alpha"] * da) + np.sum(r["alpha_null"] * dan)

    def loss():
        return loss_of(np_attn_res(s, w, gain, scale=0.7, normalizer=normalizer))

    a = cast(depth, dt)
    g = oasis.attn_res_backward(a["sources"], a["w"], a["grad_h"], a["gain"], None, a["grad_alpha"],
                                a["grad_alpha_null"], scale=0.7, normalizer=normalizer, backend=backend)
    assert set(g) == {"grad_sources", "grad_w", "grad_gain", "grad_psi", "grad_logits", "grad_beta", "grad_theta"}
    for name, x in (("sources", s), ("w", w), ("gain", gain)):
        close(g["grad_" + name], fd_grad(loss, x), tol, f"{backend} grad_{name}")
    logits = g0.copy()
    close(g["grad_logits"], fd_grad(lambda: loss_of(np_route(s, logits, normalizer)), logits), tol,
          f"{backend} grad_logits")
    assert not np.any(g["grad_psi"]) and g["grad_beta"].shape == (1,) and g["grad_beta"][0] == 0


@pytest.mark.parametrize("backend", FAST)
def test_coupled_attn_res_and_backward_match_the_float64_reference(backend, depth):
    kinds = ["initial", "attention", "headless", "attention"]
    opts = dict(kinds=kinds, theta=-1.0, normalizer="softmax1")
    d32 = cast(depth, np.float32)
    ref = oasis.attn_res(depth["sources"], depth["w"], depth["gain"], depth["psi"], **opts)
    r = oasis.attn_res(d32["sources"], d32["w"], d32["gain"], d32["psi"], backend=backend, **opts)
    for name in ref:
        close(r[name], ref[name], TOL32_FWD, f"{backend} {name}")
    assert np.any(ref["dpsi"])  # coupling is on: psi was given
    args = ("sources", "w", "grad_h", "gain", "psi", "grad_alpha", "grad_alpha_null")
    gref = oasis.attn_res_backward(*(depth[x] for x in args), **opts)
    g = oasis.attn_res_backward(*(d32[x] for x in args), backend=backend, **opts)
    assert set(g) == set(gref)
    for name in gref:
        close(g[name], gref[name], TOL32_BWD, f"{backend} {name}")
    assert gref["grad_theta"][0] != 0 and np.any(gref["grad_psi"])


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("with_partial", [False, True])
def test_block_attn_res_and_backward(backend, with_partial, depth):
    """Block AttnRes is attn_res over [blocks; partial]: the forward against NumPy on the stacked
    sources, the backward's grad_blocks / grad_partial against the stacked grad_sources of
    attn_res_backward on the same backend (bitwise on the reference)."""
    need(backend)
    dt, (tol, _) = dtype_of(backend), tols(backend)
    a = cast(depth, dt)
    src = a["sources"] if with_partial else a["sources"][:-1].copy()
    blocks = src[:-1].copy() if with_partial else src
    partial = src[-1].copy() if with_partial else None
    n = src.shape[0]
    ref = np_attn_res(src.astype(np.float64), depth["w"], depth["gain"])
    r = oasis.block_attn_res(blocks, a["w"], partial, a["gain"], backend=backend)
    for name in ("h", "alpha", "alpha_null", "g"):
        close(r[name], ref[name], tol, f"{backend} {name}")
    g = oasis.block_attn_res_backward(blocks, a["w"], a["grad_h"], partial, a["gain"], None, a["grad_alpha"][:n],
                                      backend=backend)
    gs = oasis.attn_res_backward(src, a["w"], a["grad_h"], a["gain"], None, a["grad_alpha"][:n], backend=backend)
    assert set(g) == {"grad_blocks", "grad_w", "grad_gain", "grad_psi", "grad_logits", "grad_beta", "grad_theta"} | (
        {"grad_partial"} if with_partial else set())
    stacked = np.concatenate([g["grad_blocks"], g["grad_partial"][None]]) if with_partial else g["grad_blocks"]
    exact = backend == "reference"
    for name, x, y in [("sources", stacked, gs["grad_sources"])] + [(k, g[k], gs[k]) for k in gs if k != "grad_sources"]:
        if exact:
            assert np.array_equal(x, y), name
        else:
            close(x, y, TOL32_BWD, f"{backend} {name}")


# ---- packed (varlen) and paged layouts ---------------------------------------------------------------------


def varlen_inputs(rng):
    H, Hkv, dh, dv = 4, 2, 8, 6
    lq, lk = [3, 1, 4], [3, 5, 4]  # sequence 1: one query over five keys (bottom-right causal)
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    return {
        "q": rng.standard_normal((cu_q[-1], H, dh)),
        "k": rng.standard_normal((cu_k[-1], Hkv, dh)),
        "v": rng.standard_normal((cu_k[-1], Hkv, dv)),
        "null_logits": rng.standard_normal(H),
        "grad_out": rng.standard_normal((cu_q[-1], H, dv)),
        "grad_lse": rng.standard_normal((H, cu_q[-1])),
    }, cu_q, cu_k


def np_varlen(q, k, v, cu_q, cu_k, null_logits):
    out, lse, p_null = [], [], []
    for i in range(len(cu_q) - 1):
        tq = lambda x: x[cu_q[i]:cu_q[i + 1]].transpose(1, 0, 2)[None]
        tk = lambda x: x[cu_k[i]:cu_k[i + 1]].transpose(1, 0, 2)[None]
        r = np_attention(tq(q), tk(k), tk(v), null_logits, causal=True)
        out.append(r["out"][0].transpose(1, 0, 2))
        lse.append(r["lse"][0])
        p_null.append(r["p_null"][0])
    return {"out": np.concatenate(out), "lse": np.concatenate(lse, axis=1), "p_null": np.concatenate(p_null, axis=1)}


@pytest.mark.parametrize("backend", ALL)
def test_token_attention_varlen_and_backward(backend, rng):
    need(backend)
    dt, (tol, tol_b) = dtype_of(backend), tols(backend)
    x, cu_q, cu_k = varlen_inputs(rng)
    a = cast(x, dt)
    ref = np_varlen(x["q"], x["k"], x["v"], cu_q, cu_k, x["null_logits"])
    r = oasis.token_attention_varlen(a["q"], a["k"], a["v"], cu_q, list(cu_k), null_logits=x["null_logits"],
                                     causal=True, backend=backend)
    for name in ("out", "lse", "p_null"):
        close(r[name], ref[name], tol, f"{backend} {name}")
    q, k, v, s = (x[n].copy() for n in ("q", "k", "v", "null_logits"))

    def loss():
        rr = np_varlen(q, k, v, cu_q, cu_k, s)
        return np.sum(rr["out"] * x["grad_out"]) + np.sum(rr["lse"] * x["grad_lse"])

    g = oasis.token_attention_varlen_backward(a["q"], a["k"], a["v"], cu_q, cu_k, a["grad_out"], a["grad_lse"],
                                              null_logits=x["null_logits"], causal=True, backend=backend)
    for name, y in (("q", q), ("k", k), ("v", v), ("null_logits", s)):
        close(g["grad_" + name], fd_grad(loss, y), tol_b, f"{backend} grad_{name}")


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_token_attention_paged(backend, layout, rng):
    need(backend)
    dt, (tol, _) = dtype_of(backend), tols(backend)
    B, H, Hkv, Tq, dh, dv, bs, nb = 2, 4, 2, 2, 8, 6, 3, 6
    seq_lens = [5, 7]
    table = np.array([[4, 1, -1], [0, 5, 2]])  # -1: padding, never read
    kc = rng.standard_normal((nb, bs, Hkv, dh))
    vc = rng.standard_normal((nb, bs, Hkv, dv))
    kc[3], vc[3] = np.nan, np.nan  # a block no sequence reads
    kc[1, 2], vc[1, 2] = np.nan, np.nan  # the slot after sequence 0's last key
    q = rng.standard_normal((B, H, Tq, dh))
    s = rng.standard_normal(H)
    outs = []
    for b in range(B):
        keys = [(table[b, j // bs], j % bs) for j in range(seq_lens[b])]
        kd = np.stack([kc[i, j] for i, j in keys]).transpose(1, 0, 2)[None]
        vd = np.stack([vc[i, j] for i, j in keys]).transpose(1, 0, 2)[None]
        outs.append(np_attention(q[b:b + 1], kd, vd, s, causal=True))
    ref = {n: np.concatenate([o[n] for o in outs]) for n in ("out", "lse", "p_null")}
    qq = q.transpose(0, 2, 1, 3).copy() if layout == "bthd" else q
    r = oasis.token_attention_paged(qq.astype(dt), kc.astype(dt), vc.astype(dt), table, np.array(seq_lens),
                                    null_logits=s, causal=True, layout=layout, backend=backend)
    out = r["out"].transpose(0, 2, 1, 3) if layout == "bthd" else r["out"]
    close(out, ref["out"], tol, f"{backend} out")
    for name in ("lse", "p_null"):
        close(r[name], ref[name], tol, f"{backend} {name}")


# ---- the results are checked by the oracle ----------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_results_pass_the_checks_of_their_ops(backend, attn, depth):
    """Keyed like the outputs of check's ops: a fast backend's float32 results pass them."""
    need(backend)
    a, d = cast(attn, np.float32), cast(depth, np.float32)
    qkv = {x: a[x] for x in ("q", "k", "v")}
    opts = {"null_logits": attn["null_logits"].tolist(), "causal": True}
    fwd = oasis.token_attention(**qkv, backend=backend, **opts)
    oasis.check("attention", qkv, fwd, options=opts).assert_ok()
    cot = {x: a[x] for x in ("grad_out", "grad_lse", "grad_p_null")}
    g = oasis.token_attention_backward(**qkv, **cot, backend=backend, **opts)
    oasis.check("attention_backward", dict(qkv, **cot), g, options=opts).assert_ok()
    fused = {x: d[x] for x in ("sources", "w", "gain", "psi")}
    r = oasis.attn_res(**fused, backend=backend)
    oasis.check("attn_res", fused, {x: r[x] for x in ("h", "alpha", "alpha_null")}).assert_ok()
    dcot = {x: d[x] for x in ("grad_h", "grad_alpha", "grad_alpha_null")}
    gr = oasis.attn_res_backward(**fused, **dcot, backend=backend)
    del gr["grad_logits"]
    oasis.check("attn_res_backward", dict(fused, **dcot), gr).assert_ok()


# ---- torch tensors in, torch autograd as a second reference ------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_torch_tensors_and_autograd(backend, depth):
    """torch tensors are taken as they are (detached, float32 for a fast backend); the fused backward
    equals torch autograd of the same routing written in torch (float64)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    need(backend)
    dt, (_, tol) = dtype_of(backend), tols(backend)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in depth.items()}
    s, w, gain = t["sources"], t["w"], t["gain"]
    y = s / torch.sqrt((s**2).mean(-1, keepdim=True) + 1e-6) * gain
    g = 0.5 * (y @ w)
    zz = torch.cat([g, torch.zeros(1, g.shape[1], dtype=g.dtype)])
    p = torch.softmax(zz, 0)
    alpha, alpha_null = p[:-1], p[-1]
    h = torch.einsum("it,itc->tc", alpha, s)
    loss = (h * t["grad_h"]).sum() + (alpha * t["grad_alpha"]).sum() + (alpha_null * t["grad_alpha_null"]).sum()
    loss.backward()
    tt = {k: v.detach().to(torch.float64 if dt == np.float64 else torch.float32) for k, v in t.items()}
    r = oasis.attn_res_backward(tt["sources"], tt["w"], tt["grad_h"], tt["gain"], None, tt["grad_alpha"],
                                tt["grad_alpha_null"], scale=0.5, normalizer="softmax1", backend=backend)
    for name in ("sources", "w", "gain"):
        close(r["grad_" + name], t[name].grad.numpy(), tol, f"{backend} grad_{name} vs autograd")
