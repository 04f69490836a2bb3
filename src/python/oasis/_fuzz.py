"""oasis._fuzz: oasis.fuzz — drive your kernel through the regimes where sink bugs live.

The driver is the C++ library's (oasis/verify/fuzz.hpp; the CLI's ``oasis-verify fuzz``): every
regime of the op's catalogue (sinks far above the logits, fully masked rows, lengths at tile
boundaries, ...) in every dtype asked for, each run checked by the compare engine, the first failure
shrunk to a small case that fails the same way and written as a replay folder. This module is the
Python side: the adapter between the case's tensors and your function (NumPy or torch), the
autograd path of ``backward=True``, the timer of ``timeout`` and the report.
"""

import json as _json
import os as _os
import signal as _signal
import sys as _sys
import threading as _threading

import numpy as _np

from . import _arrays, _core
from ._arrays import fail as _fail


class FuzzTimeout(BaseException):
    """Raised inside your function when it runs past ``timeout`` (the run is reported as a hang).

    A BaseException, as KeyboardInterrupt is, so that an ``except Exception`` in the kernel does not
    swallow it and keep the hang going."""


# dtype names -> the engine's tags
_DTYPES = {"float32": "f32", "f32": "f32", "float64": "f64", "f64": "f64", "float16": "f16", "f16": "f16",
           "half": "f16", "bfloat16": "bf16", "bf16": "bf16"}

# cotangent inputs a kernel may lack, with the feature of fuzz(without=...) that leaves them out
_COTANGENT_FEATURES = {"grad_lse": "grad_lse", "grad_p_null": "grad_p_null", "grad_alpha": "grad_alpha",
                       "grad_alpha_null": "grad_alpha"}


def _dtype_tag(d):
    if type(d).__module__ == "torch":  # torch.bfloat16 -> "bfloat16"
        d = str(d).replace("torch.", "")
    elif not isinstance(d, str):
        try:
            d = _np.dtype(d).name
        except TypeError:
            _fail("dtypes", f"expected dtype names (float32, bfloat16, float16, float64), got {d!r}")
    tag = _DTYPES.get(d)
    if tag is None:
        _fail("dtypes", f"unknown dtype '{d}' (expected float32, bfloat16, float16 or float64)")
    return tag


def _names(x, argument):
    """A tuple of names from a string or an iterable of strings."""
    if isinstance(x, str):
        return (x,)
    try:
        names = tuple(x)
    except TypeError:
        _fail(argument, f"expected a name or a sequence of names, got {type(x).__name__}")
    for n in names:
        if not isinstance(n, str):
            _fail(argument, f"expected names (strings), got {n!r}")
    return names


def _abort(argument, what):
    """An InvalidArgument that stops fuzzing (a usage error, not a failure of the kernel) and is
    raised by oasis.fuzz."""
    err = _arrays.InvalidArgument(f"oasis: argument '{argument}': {what}")
    err.argument = argument
    err._oasis_fuzz_abort = True
    return err


# ---- tensors -------------------------------------------------------------------------------------------


class _Tensors:
    """The case's tensors ((tag, array) from the engine) as the kernel takes them, and back."""

    def __init__(self, kind, device):
        self.kind = kind
        self.device = device
        self.torch = None
        if kind == "torch":
            try:
                import torch
            except ImportError:
                _fail("tensors", "'torch' needs torch installed")
            self.torch = torch

    def to_user(self, tag, a):
        if self.kind == "numpy":
            # bf16 has no NumPy dtype: its values as float32 (exact: a bf16 is a float32 whose low
            # 16 bits are 0)
            return (a.astype(_np.uint32) << 16).view(_np.float32) if tag == "bf16" else a
        t = self.torch.from_numpy(a.view(_np.int16)).view(self.torch.bfloat16) if tag == "bf16" else self.torch.from_numpy(a)
        return t if self.device is None else t.to(self.device)

    @staticmethod
    def from_user(res):
        """{name: tensor} returned by the kernel -> {name: (tag, array)}; any other result is the
        kernel's error (a crash of the run)."""
        if not isinstance(res, dict):
            raise TypeError(f"the kernel returned {type(res).__name__}, expected a dict {{output name: tensor}}")
        out = {}
        for name, x in res.items():
            if not isinstance(name, str):
                raise TypeError(f"the kernel returned an output named {name!r}; names are strings (oasis.describe_ops())")
            tag, a = _arrays.stored(x, name)
            out[name] = (tag, _np.ascontiguousarray(a))  # a transposed result is still the kernel's answer
        return out


class _Timer:
    """Raises FuzzTimeout inside the kernel after ``seconds`` (SIGALRM, main thread). Armed only
    while the kernel runs: an alarm delivered after it returned (the handler runs at the next
    bytecode, maybe in the engine's callback) does nothing."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.armed = False

    def handler(self, signum, frame):
        if self.armed:
            self.armed = False
            raise FuzzTimeout(f"no result within {self.seconds:g} s (timeout)")

    def __enter__(self):
        if self.seconds:
            self.armed = True
            _signal.setitimer(_signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.seconds:
            self.armed = False
            _signal.setitimer(_signal.ITIMER_REAL, 0)
        return False


def _forward_call(fn, conv, timer):
    def call(ins, options):
        inputs = {name: conv.to_user(tag, a) for name, (tag, a) in ins.items()}
        with timer:
            res = fn(inputs, options)
        return conv.from_user(res)

    return call


def _backward_call(fn, conv, timer, op, backward_op):
    """The kernel of op `backward_op` made of fn (the forward) and autograd.

    From a case of the backward op: the inputs of the forward op go to fn, the float ones whose
    gradient the backward op outputs as leaves requiring grad; the cotangents grad_<output> go to
    torch.autograd.backward with fn's outputs; the leaves' .grad come back as grad_<input>. An input
    that received no gradient (None: the outputs do not depend on it) returns zeros, which is its
    gradient when that independence is right and a wrong gradient the check reports when it is not.
    The backward op's stored forward outputs (out, lse of attention_backward) are not passed: fn
    recomputes the forward."""
    torch = conv.torch
    fwd_in, fwd_out = _core.op_tensors(op)
    _, bwd_out = _core.op_tensors(backward_op)

    def call(ins, options):
        case = {name: conv.to_user(tag, a) for name, (tag, a) in ins.items()}
        leaves, cotangents = {}, {}
        for name, t in case.items():
            if name in fwd_in:
                if "grad_" + name in bwd_out and t.is_floating_point():
                    t = t.detach().requires_grad_(True)
                leaves[name] = t
            elif name.startswith("grad_") and name[5:] in fwd_out:
                cotangents[name[5:]] = t
        with timer, torch.enable_grad():
            res = fn(dict(leaves), options)
            if not isinstance(res, dict):
                raise TypeError(f"the kernel returned {type(res).__name__}, expected a dict {{output name: tensor}}")
            ys, gs = [], []
            for name, g in cotangents.items():
                y = res.get(name)
                if y is None:
                    if not bool((g != 0).any()):
                        continue  # a zero cotangent adds nothing: dropping it is exact
                    feature = _COTANGENT_FEATURES.get("grad_" + name)
                    hint = f"return '{name}', or pass without=('{feature}',)" if feature else f"return '{name}'"
                    raise _abort("fn", f"returned no '{name}' though the case of {backward_op} has its cotangent "
                                       f"grad_{name}: {hint}")
                if not (isinstance(y, torch.Tensor) and y.requires_grad):
                    raise TypeError(f"output '{name}' does not require grad: it is not computed from the inputs by "
                                    "torch operations (detached, or computed in NumPy)")
                ys.append(y)
                gs.append(g.to(dtype=y.dtype, device=y.device))  # bf16 -> f32 is exact
            if ys:
                torch.autograd.backward(ys, gs)
        grads = {}
        for name, t in leaves.items():
            if t.requires_grad:
                grads["grad_" + name] = t.grad if t.grad is not None else torch.zeros_like(t)
        return conv.from_user(grads)

    return call


# ---- the report ------------------------------------------------------------------------------------------


class FuzzReport:
    """The result of oasis.fuzz.

    ``passed``: every run passed. ``runs``: one dict per run (op, regime, dtype — the engine's tag
    f32, bf16, f16 or f64 —, seed, dims,
    verdict — PASS, FAIL, FAIL-certain, UNDECIDED, CRASH or HANG —, worst_ratio, detail: the
    failing tensor or the crash's message). ``never_exercised``: "regime: why" for the regimes
    skipped (a feature in ``without``, a ``fixed`` option). ``failure``: None, or the first failure,
    shrunk: a dict with op, kind ("wrong", "crash" or "hang"), regime, dtype, seed, found_at,
    shrunk_to (the sizes), shrink_runs, shrink_steps, options, message (a crash's), replay_dir,
    replay_command (``oasis-verify compare <dir>/config.json``; "" for a crash or a hang) and
    report (the shrunk case's oasis.Report for a wrong output, else None).
    ``str(report)``: the text of ``oasis-verify fuzz``; ``to_json()`` its JSON; ``assert_ok()``
    raises AssertionError carrying the text unless passed.

    With ``backward=True`` the report has two parts, ``forward`` (op) and ``backward``
    (op_backward), each a FuzzReport; the attributes above join them (passed: both passed; failure:
    the forward's, else the backward's). Otherwise ``forward`` is the report itself and
    ``backward`` None. ``parts``: the parts' list.
    """

    def __init__(self, passed, text, json_text, failure_report=None, parts=None, op=None):
        if parts is not None:  # the join of two parts
            self.op = op
            self.parts = parts
            self.passed = all(p.passed for p in parts)
            self.runs = [r for p in parts for r in p.runs]
            self.never_exercised = [f"{p.op}: {n}" for p in parts for n in p.never_exercised]
            self.failure = next((p.failure for p in parts if p.failure is not None), None)
            self._text = "\n".join(str(p) for p in parts) + "\nfuzz " + " and ".join(p.op for p in parts) + ": " + (
                "PASS" if self.passed else "FAIL" if self.failure else "NOT PASSED") + "\n"
            self._json = _json.dumps({"op": op, "passed": self.passed, "parts": [_json.loads(p._json) for p in parts]})
            self.forward = next((p for p in parts if p.op == op), None)
            self.backward = next((p for p in parts if p.op == op + "_backward"), None)
            return
        from . import Report

        doc = _json.loads(json_text)
        self.op = doc["op"]
        self.passed = bool(passed)
        # the JSON carries 64-bit seeds as decimal strings (a JSON number is a double): ints here
        self.runs = [dict(r, op=self.op, seed=int(r["seed"])) for r in doc["runs"]]
        self.never_exercised = list(doc["never_exercised"])
        self.failure = None
        if doc["failure"] is not None:
            f = dict(doc["failure"], op=self.op, seed=int(doc["failure"]["seed"]))
            f["report"] = Report(*failure_report) if failure_report is not None else None
            self.failure = f
        self._text, self._json = text, json_text
        self.parts, self.forward, self.backward = [self], self, None

    def __str__(self):
        return self._text

    def __repr__(self):
        verdict = "PASS" if self.passed else f"FAIL ({self.failure['kind']})" if self.failure else "NOT PASSED"
        return f"<oasis.FuzzReport op={self.op} {verdict}: {len(self.runs)} runs>"

    def to_json(self):
        return self._json

    def assert_ok(self):
        if not self.passed:
            raise AssertionError("oasis: fuzzing found a failure\n" + self._text)
        return self


# ---- entry points ---------------------------------------------------------------------------------------


def fuzz_features():
    """The features a kernel may lack (fuzz's ``without``): causal, noncausal, window, key_lengths,
    bias, mask, gqa, decode, tq_gt_tk, batch, null_logits, infinite_null, grad_lse, grad_p_null,
    mass, coupling, grad_alpha, gain (docs/fuzz-protocol.md)."""
    return list(_core.fuzz_features())


def fuzz_regimes(op=None):
    """The regimes of ``op`` (every regime when None), in the order fuzz runs them: dicts with name,
    ops, description, targets (the bug class), needs (features) and variants (labels; [""]: one)."""
    if op is not None and not isinstance(op, str):
        _fail("op", f"expected the op's name, got {type(op).__name__}")
    return _core.fuzz_regimes(op or "")


def _log_callback(log):
    if log is None or log is False:
        return None
    if log is True:
        return lambda line: print(line, file=_sys.stderr, flush=True)
    if not callable(log):
        _fail("log", f"expected True, False, None or a callable taking a line, got {type(log).__name__}")
    return log


def _install_timer(timeout):
    """(timer, how to restore the previous SIGALRM handler)."""
    if timeout is None or timeout == 0:
        return _Timer(0), lambda: None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        _fail("timeout", f"expected a number of seconds > 0 (or None), got {timeout!r}")
    if not hasattr(_signal, "setitimer"):
        _fail("timeout", "needs signal.setitimer (POSIX); pass timeout=None")
    if _threading.current_thread() is not _threading.main_thread():
        _fail("timeout", "is enforced with SIGALRM, which Python delivers to the main thread only: call fuzz "
                         "from the main thread, or pass timeout=None")
    if _signal.getitimer(_signal.ITIMER_REAL)[0] > 0:
        _fail("timeout", "an ITIMER_REAL timer (signal.setitimer) is already running; fuzz's timeout would replace it")
    timer = _Timer(float(timeout))
    previous = _signal.signal(_signal.SIGALRM, timer.handler)

    def restore():
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, previous if previous is not None else _signal.SIG_DFL)

    return timer, restore


def fuzz(fn, op, *, backward=False, dtypes=("float32",), tensors="numpy", device=None, fixed=None, without=(),
         only=(), seed=None, timeout=None, replay_dir=None, max_shrink=400, policy=None, oracle=None, log=None):
    """Fuzz ``fn`` as an implementation of op ``op``; returns a FuzzReport (docs/python.md).

    ``fn(inputs, options)``: ``inputs`` a dict of the op's input tensors by name (oasis.describe_ops();
    bhtd layout), ``options`` the op's options as a dict (e.g. ``{"causal": True}``); it returns a
    dict of the outputs it computes (any subset of the op's outputs, names as describe_ops()).
    ``tensors``: "numpy" — float32/float64/float16 arrays, and bfloat16 inputs as float32 arrays
    holding bf16-exact values; outputs as NumPy float16/32/64 arrays or oasis.bf16(bits) — or
    "torch": torch tensors (bfloat16 for bf16), moved to ``device`` when given; outputs any float
    torch tensors (bfloat16 read exactly).

    ``backward=True`` (torch only) also fuzzes op + "_backward" through autograd: from each case of
    the backward op, fn runs on the forward inputs (float ones as leaves requiring grad), then
    torch.autograd.backward on fn's outputs whose cotangent grad_<output> the case holds, and
    the leaves' gradients are checked as grad_<input>; an input that got no gradient counts as
    zeros. A case holding a nonzero cotangent of an output fn does not return is a usage error
    (InvalidArgument naming the feature to put in ``without``, e.g. grad_p_null).

    ``dtypes``: the inputs' dtypes, each fuzzed in turn ("float32", "bfloat16", "float16",
    "float64"). ``fixed``: options every case carries, e.g. ``{"lse_base": "2"}``; regimes needing
    another value are skipped. ``without``: features fn lacks (oasis.fuzz_features()), whose
    regimes are skipped and listed as never exercised. ``only``: run only these regimes
    (oasis.fuzz_regimes(op)). ``seed``: every run's seed derives from it (default the CLI's).
    ``timeout``: seconds per call of fn (None: none); past it oasis.FuzzTimeout is raised inside fn
    (SIGALRM, so main thread only; code in C that never returns to Python cannot be interrupted)
    and the run is a hang, reported where found (not shrunk: each try would cost the timeout).
    ``replay_dir``: where the shrunk failure is written (default a fresh temporary folder).
    ``max_shrink``: calls of fn spent shrinking. ``policy``, ``oracle``: the checks' comparison
    options (as oasis.check). ``log``: True (one line per run on stderr) or a callable given each
    line.

    fn raising an exception is a crash of that run; KeyboardInterrupt (or another BaseException)
    stops fuzzing and is raised again. Bad arguments raise InvalidArgument naming the argument."""
    if not callable(fn):
        _fail("fn", f"expected a callable fn(inputs, options) -> dict of outputs, got {type(fn).__name__}")
    if not isinstance(op, str):
        _fail("op", f"expected the op's name, got {type(op).__name__}")
    if tensors not in ("numpy", "torch"):
        _fail("tensors", f"expected 'numpy' or 'torch', got {tensors!r}")
    if device is not None and tensors != "torch":
        _fail("device", "places torch tensors: pass tensors='torch'")
    if backward and tensors != "torch":
        _fail("backward", "the backward is computed by torch.autograd: pass tensors='torch'")
    _core.fuzz_regimes(op)  # an op the fuzzer does not drive is named before anything else
    ops = [op]
    if backward:
        if op + "_backward" not in _core.op_names():
            _fail("backward", f"op '{op}' has no backward op (ops with one: attention, depth, pseudo_query, psi)")
        ops.append(op + "_backward")
    if isinstance(dtypes, str) or not hasattr(dtypes, "__iter__"):
        dtypes = (dtypes,)  # one dtype: "bfloat16", np.float32, torch.bfloat16
    tags = [_dtype_tag(d) for d in dtypes]
    if not tags:
        _fail("dtypes", "no dtype to fuzz in")
    fixed_text = {}
    for k, v in (fixed or {}).items():
        if not isinstance(k, str):
            _fail("fixed", f"option names are strings, got {k!r}")
        try:
            fixed_text[k] = _json.dumps(v, allow_nan=False, default=_arrays.json_default)
        except (TypeError, ValueError) as e:
            _fail("fixed", f"option '{k}' is not representable as JSON ({e})")
    without = _names(without, "without")
    known = set(_core.fuzz_features())
    for f in without:
        if f not in known:
            _fail("without", f"unknown feature '{f}' (known: {', '.join(sorted(known))})")
    only = _names(only, "only")
    if seed is None:
        seed = _core.fuzz_seed()
    if isinstance(seed, bool) or not isinstance(seed, (int, _np.integer)) or not 0 <= seed < 2**64:
        _fail("seed", f"expected an integer in [0, 2^64), got {seed!r}")
    if isinstance(max_shrink, bool) or not isinstance(max_shrink, (int, _np.integer)) or not 0 <= max_shrink <= 1000000:
        _fail("max_shrink", f"expected an integer in [0, 1000000], got {max_shrink!r}")
    compare = {k: v for k, v in (("policy", policy), ("oracle", oracle)) if v is not None}
    compare_text = _json.dumps(compare) if compare else ""
    log_fn = _log_callback(log)
    replay = "" if replay_dir is None else _os.fspath(replay_dir)
    conv = _Tensors(tensors, device)

    # `only` per op: a regime of the backward op only (cotangent_lse) runs there; a part with
    # nothing left to run is skipped
    plan = []
    for o in ops:
        names = {r["name"] for r in _core.fuzz_regimes(o)}
        mine = [n for n in only if n in names]
        if not only or mine:
            plan.append((o, mine))
    for n in only:
        if not any(n in {r["name"] for r in _core.fuzz_regimes(o)} for o in ops):
            _fail("only", f"'{n}' is not a regime of op {' or '.join(ops)} (oasis.fuzz_regimes(op) names them)")

    timer, restore = _install_timer(timeout)
    parts = []
    try:
        for o, regimes in plan:
            call = _forward_call(fn, conv, timer) if o == op else _backward_call(fn, conv, timer, op, o)
            res = _core.fuzz(o, call, FuzzTimeout, tags, fixed_text, list(without), regimes, int(seed), replay,
                             int(max_shrink), compare_text, log_fn)
            parts.append(FuzzReport(*res))
    finally:
        restore()
    if len(parts) == 1 and not backward:
        return parts[0]
    return FuzzReport(None, None, None, parts=parts, op=op)
