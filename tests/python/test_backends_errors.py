"""Bad input to the backend and kernel-interface functions of oasis (docs/python.md, "Backends
and kernel-interface functions") raises oasis.InvalidArgument naming the argument, and odd arrays
crash no backend (run in a child interpreter, as test_errors.py does for the core functions)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oasis

# ---- bad input names the argument --------------------------------------------------------------------------

f32 = lambda *s: np.ones(s, dtype=np.float32)
f64 = lambda *s: np.ones(s, dtype=np.float64)
Q = f32(1, 2, 3, 4)
S = np.linspace(0.5, 2.0, 3 * 2 * 4).reshape(3, 2, 4).astype(np.float32)

BAD = [
    ("unknown backend", lambda: oasis.token_attention(Q, Q, Q, backend="fast"), "backend"),
    ("backend not a name", lambda: oasis.attn_res(S, f32(4), backend=1), "backend"),
    ("float64 to cpu_fast", lambda: oasis.token_attention(Q.astype(np.float64), Q, Q, backend="cpu_fast"), "q"),
    ("float64 k to cpu_fast", lambda: oasis.token_attention(Q, Q.astype(np.float64), Q, backend="cpu_fast"), "k"),
    ("float64 sources to cpu_fast", lambda: oasis.attn_res(S.astype(np.float64), f32(4), backend="cpu_fast"), "sources"),
    ("float64 w to cpu_fast", lambda: oasis.attn_res(S, f64(4), backend="cpu_fast"), "w"),
    ("float64 cotangent to cpu_fast",
     lambda: oasis.token_attention_backward(Q, Q, Q, Q.astype(np.float64), backend="cpu_fast"), "grad_out"),
    ("float64 route to cpu_fast",
     lambda: oasis.attn_res_route(S.astype(np.float64), f64(3, 2), coupling=False, backend="cpu_fast"), "sources"),
    ("grad_out shape", lambda: oasis.token_attention_backward(Q, Q, Q, f32(1, 2, 3, 5)), "grad_out"),
    ("grad_out shape fast", lambda: oasis.token_attention_backward(Q, Q, Q, f32(1, 2, 3, 5), backend="cpu_fast"),
     "grad_out"),
    ("grad_lse shape", lambda: oasis.token_attention_backward(Q, Q, Q, Q, f32(1, 2, 4)), "grad_lse"),
    ("grad_p_null shape", lambda: oasis.token_attention_backward(Q, Q, Q, Q, None, f32(2, 3)), "grad_p_null"),
    ("grad_h shape", lambda: oasis.attn_res_backward(S, f32(4), f32(3, 4)), "grad_h"),
    ("grad_alpha shape", lambda: oasis.attn_res_backward(S, f32(4), f32(2, 4), grad_alpha=f32(2, 2)), "grad_alpha"),
    ("grad_alpha_null shape", lambda: oasis.attn_res_backward(S, f32(4), f32(2, 4), grad_alpha_null=f32(3),
                                                              backend="cpu_fast"), "grad_alpha_null"),
    ("w size", lambda: oasis.attn_res(S, f32(5), backend="cpu_fast"), "w"),
    ("gain size", lambda: oasis.attn_res(S, f32(4), f32(3)), "gain"),
    ("sources rank", lambda: oasis.attn_res(S[0], f32(4)), "sources"),
    ("psi shape", lambda: oasis.attn_res(S, f32(4), psi=f32(3, 3) / 2), "psi"),
    ("psi without coupling", lambda: oasis.attn_res(S, f32(4), psi=f32(3, 2) / 2, coupling=False), "psi"),
    ("coupling without psi", lambda: oasis.attn_res(S, f32(4), coupling=True), "psi"),
    ("kinds count", lambda: oasis.attn_res(S, f32(4), kinds=["initial"]), "kinds"),
    ("eps", lambda: oasis.attn_res(S, f32(4), eps=0.0), "eps"),
    ("normalizer", lambda: oasis.attn_res(S, f32(4), normalizer="sparsemax"), "normalizer"),
    ("partial shape", lambda: oasis.block_attn_res(S, f32(4), partial=f32(3, 4)), "partial"),
    ("blocks rank", lambda: oasis.block_attn_res(S[0], f32(4)), "blocks"),
    ("blocks rank 0 fast", lambda: oasis.block_attn_res_backward(f32(), f32(4), f32(2, 4), backend="cpu_fast"), "blocks"),
    ("block grad_h", lambda: oasis.block_attn_res_backward(S, f32(4), f32(2, 5)), "grad_h"),
    ("cu_seqlens end", lambda: oasis.token_attention_varlen(f32(4, 2, 4), f32(4, 2, 4), f32(4, 2, 4), [0, 3], [0, 4]),
     "cu_seqlens_q"),
    ("cu_seqlens floats", lambda: oasis.token_attention_varlen(f32(4, 2, 4), f32(4, 2, 4), f32(4, 2, 4), [0.0, 4.0],
                                                               [0, 4]), "cu_seqlens_q"),
    ("cu_seqlens count", lambda: oasis.token_attention_varlen(f32(4, 2, 4), f32(4, 2, 4), f32(4, 2, 4), [0, 4],
                                                              [0, 2, 4], backend="cpu_fast"), "cu_seqlens_k"),
    ("varlen q rank", lambda: oasis.token_attention_varlen(Q, f32(4, 2, 4), f32(4, 2, 4), [0, 4], [0, 4]), "q"),
    ("varlen grad_out", lambda: oasis.token_attention_varlen_backward(f32(4, 2, 4), f32(4, 2, 4), f32(4, 2, 4),
                                                                      [0, 4], [0, 4], f32(4, 2, 3)), "grad_out"),
    ("varlen grad_lse", lambda: oasis.token_attention_varlen_backward(f32(4, 2, 4), f32(4, 2, 4), f32(4, 2, 4),
                                                                      [0, 4], [0, 4], f32(4, 2, 4), f32(4, 2)),
     "grad_lse"),
    ("block_table dtype", lambda: oasis.token_attention_paged(Q, f32(2, 2, 2, 4), f32(2, 2, 2, 4), f32(1, 2), [3]),
     "block_table"),
    ("block_table id", lambda: oasis.token_attention_paged(Q, f32(2, 2, 2, 4), f32(2, 2, 2, 4), np.array([[0, 2]]),
                                                           [3], backend="cpu_fast"), "block_table"),
    ("seq_lens count", lambda: oasis.token_attention_paged(Q, f32(2, 2, 2, 4), f32(2, 2, 2, 4), np.array([[0, 1]]),
                                                           [3, 1]), "seq_lens"),
    ("paged NaN in a read slot", lambda: oasis.token_attention_paged(
        Q, np.full((2, 2, 2, 4), np.nan, np.float32), f32(2, 2, 2, 4), np.array([[0, 1]]), [3]), "k_cache"),
]


@pytest.mark.parametrize("call,argument", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(oasis.InvalidArgument) as e:
        call()
    assert e.value.argument == argument, str(e.value)
    assert f"'{argument}'" in str(e.value)


def test_float64_refused_by_a_fast_backend_says_why():
    with pytest.raises(oasis.InvalidArgument) as e:
        oasis.token_attention(Q.astype(np.float64), Q, Q, backend="cpu_fast")
    assert "float64" in str(e.value) and "cpu_fast" in str(e.value) and "float32" in str(e.value)


ODD = textwrap.dedent("""
    import numpy as np, oasis
    f = lambda *s: np.ones(s, np.float32)
    I = lambda *s: np.zeros(s, np.int64)
    shapes = [(), (0,), (0, 2, 3, 4), (1, 0, 3, 4), (1, 2, 0, 4), (1, 2, 3, 0), (3, 0, 4), (0, 2, 4), (3, 2, 0)]
    n = 0
    for b in oasis.backends():
        for shape in shapes:
            x = f(*shape)
            calls = [
                lambda: oasis.token_attention(x, x, x, backend=b),
                lambda: oasis.token_attention(f(1, 2, 3, 4), x, f(1, 2, 3, 4), backend=b),
                lambda: oasis.token_attention_backward(f(1, 2, 3, 4), f(1, 2, 3, 4), f(1, 2, 3, 4), x, backend=b),
                lambda: oasis.token_attention_backward(x, x, x, x, backend=b),
                lambda: oasis.attn_res(x, f(4), backend=b),
                lambda: oasis.attn_res(f(3, 2, 4), x, backend=b),
                lambda: oasis.attn_res_backward(x, f(4), f(2, 4), backend=b),
                lambda: oasis.attn_res_backward(f(3, 2, 4), f(4), x, backend=b),
                lambda: oasis.attn_res_route(x, f(3, 2), coupling=False, backend=b),
                lambda: oasis.block_attn_res(x, f(4), backend=b),
                lambda: oasis.block_attn_res(f(3, 2, 4), f(4), partial=x, backend=b),
                lambda: oasis.block_attn_res_backward(x, f(4), f(2, 4), backend=b),
                lambda: oasis.token_attention_varlen(x, x, x, [0, 0], [0, 0], backend=b),
                lambda: oasis.token_attention_varlen(f(0, 2, 4), f(0, 2, 4), f(0, 2, 4), [0, 0], [0, 0], backend=b),
                lambda: oasis.token_attention_varlen_backward(f(2, 2, 4), f(0, 2, 4), f(0, 2, 4), [0, 2], [0, 0],
                                                              f(2, 2, 4), backend=b),
                lambda: oasis.token_attention_paged(f(1, 2, 3, 4), x, x, I(1, 2), [0], backend=b),
                lambda: oasis.token_attention_paged(f(1, 2, 3, 4), f(2, 2, 2, 4), f(2, 2, 2, 4), I(1, 0), [0],
                                                    backend=b),
            ]
            for call in calls:
                try:
                    call()
                except oasis.InvalidArgument:
                    pass
                n += 1
    print("survived", n)
""")


def test_odd_arrays_do_not_crash_any_backend():
    """Zero-size and 0-d arrays in every position of the functions above, on every available
    backend, in a child interpreter: each call returns or raises InvalidArgument (no other
    exception, no signal)."""
    child = subprocess.run([sys.executable, "-c", ODD], capture_output=True, text=True, timeout=120, env=os.environ)
    assert child.returncode == 0, f"child exited with {child.returncode}\n{child.stdout}\n{child.stderr}"
    assert child.stdout.strip() == f"survived {len(oasis.backends()) * 9 * 17}", child.stdout + child.stderr
