"""oasis.trace: record a model trace from a torch module for oasis.check_model.

A trace holds tensors named as docs/verify-model.md ("Model level") documents them:
``<sublayer>.<field>`` with ``<sublayer>`` one of ``layers.{b}.attn``, ``layers.{b}.mlp`` (the
attention and MLP sublayers of transformer block b) and ``final_res`` (the final readout
router), plus ``logits``, ``state`` (the readout state before the final norm) and ``ids``.
TRACE_FIELDS below is the one table of the fields and their layouts: when the documented names or
layouts change, this table changes, and so does every user of the recorder and
``oasis.Model.forward(trace=True)``.

Two ways to fill a recorder, both inactive (free) when no recorder is recording:

* calls in the model's code: ``oasis.record("layers.0.attn.attn_q", q, layout="bhtd")`` records
  into every active recorder (``with oasis.TraceRecorder() as rec: model(ids)``);
* forward hooks: ``rec.hook(module, "layers.0.mlp")`` records the module's first input as
  ``.input`` and its output as ``.output``.

Tensors are copied when recorded (detached, on the CPU, C-contiguous), in their dtype (bfloat16
as oasis.bf16), converted to the documented layout: per-head tensors given as [B, T, H, d_h]
("bthd") or [B, H, T, d_h] ("bhtd") become [B, T, H d_h]; routing tensors given as a list of the
n candidates' tensors are stacked on a new first axis.
"""

import re

import numpy as np

from . import _arrays
from ._arrays import bf16, fail

# field: (layout of the stored tensor, conversion accepted on recording, meaning)
#   conversions: "heads" = [B,T,H,dh] (layout="bthd") or [B,H,T,dh] (layout="bhtd") -> [B,T,H*dh];
#                "stack" = a list of n tensors -> stacked on axis 0
TRACE_FIELDS = {
    "input":      ("B,T,d",       None,    "the state the sublayer reads (with AttnRes: the routed h_l)"),
    "output":     ("B,T,d",       None,    "the raw sublayer output"),
    "attn_q":     ("B,T,H*dh",    "heads", "queries after the q norm and RoPE"),
    "attn_k":     ("B,T,Hkv*dh",  "heads", "keys after the k norm and RoPE"),
    "attn_v":     ("B,T,Hkv*dh",  "heads", "values"),
    "attn_heads": ("B,T,H*dh",    "heads", "per-head attention outputs before W_o"),
    "p_null":     ("B,H,T",       None,    "null probability per head and query"),
    "lse":        ("B,H,T",       None,    "LSE1 (softmax1) or LSE per head and query"),
    "branch_psi": ("B,T",         None,    "psi of the attention sublayer (mean of p_null over heads)"),
    "mlp_hidden": ("B,T,d_ff",    None,    "SwiGLU hidden rows silu(W_gate x) * (W_up x)"),
    "sources":    ("n,B,T,d",     "stack", "the router's candidate values"),
    "g_old":      ("n,B,T",       "stack", "depth logits before coupling"),
    "psi":        ("n,B,T",       "stack", "psi of each candidate as given to the coupling"),
    "g":          ("n,B,T",       "stack", "coupled depth logits"),
    "dpsi":       ("n,B,T",       "stack", "centred psi"),
    "alpha":      ("n,B,T",       "stack", "depth weights"),
    "alpha_null": ("B,T",         None,    "depth null weight"),
    "routed":     ("B,T,d",       None,    "the state the router produces"),
}
# names without a sublayer
TOP_LEVEL = {
    "ids":    ("B,T",       None, "token ids (integers)"),
    "logits": ("B,T,vocab", None, "the model's logits"),
    "state":  ("B,T,d",     None, "the readout state before the final norm"),
}
SUBLAYER = re.compile(r"layers\.\d+\.(attn|mlp)|final_res")

_ACTIVE = []


def split_name(name):
    """(sublayer or None, field) of a trace name; InvalidArgument for a name not documented."""
    if not isinstance(name, str):
        fail("name", f"trace names are strings, got {type(name).__name__}")
    if name in TOP_LEVEL:
        return None, name
    sub, _, field = name.rpartition(".")
    if not SUBLAYER.fullmatch(sub) or field not in TRACE_FIELDS:
        fail(name, "not a documented trace name: '<sublayer>.<field>' with sublayer layers.{b}.attn, "
                   "layers.{b}.mlp or final_res and field one of " + ", ".join(TRACE_FIELDS) +
                   "; or " + ", ".join(TOP_LEVEL))
    return sub, field


def _copy(x, name):
    """A detached, C-contiguous copy on the CPU: a NumPy array or oasis.bf16."""
    if _arrays._is_torch(x):
        x = _arrays._from_torch(x)
    if isinstance(x, bf16):
        return bf16(np.array(x.bits, order="C", copy=True))
    if isinstance(x, np.ndarray):
        return np.array(x, order="C", copy=True)
    fail(name, f"expected a torch tensor, numpy array or oasis.bf16, got {type(x).__name__}")


def _apply(x, fn):
    return bf16(np.ascontiguousarray(fn(x.bits))) if isinstance(x, bf16) else np.ascontiguousarray(fn(x))


def to_documented(name, x, layout=None):
    """The tensor `x` recorded as `name`: copied and converted to the documented layout."""
    _, field = split_name(name)
    doc, conversion, _ = TRACE_FIELDS.get(field) or TOP_LEVEL[field]
    if isinstance(x, (list, tuple)):
        if conversion != "stack":
            fail(name, f"a list of tensors is accepted for the routing fields only; {field} is one tensor [{doc}]")
        parts = [_copy(p, name) for p in x]
        if not parts:
            fail(name, "empty list of candidates")
        if any(isinstance(p, bf16) != isinstance(parts[0], bf16) for p in parts):
            fail(name, "candidates in different dtypes")
        x = _apply(parts[0], lambda _: np.stack([p.bits if isinstance(p, bf16) else p for p in parts]))
    else:
        x = _copy(x, name)
    rank = doc.count(",") + 1
    if conversion == "heads" and x.shape and len(x.shape) == 4:
        if layout == "bthd":
            x = _apply(x, lambda a: a.reshape(a.shape[0], a.shape[1], -1))
        elif layout == "bhtd":
            x = _apply(x, lambda a: a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1))
        else:
            fail(name, f"a 4-d per-head tensor needs layout='bthd' ([B,T,H,dh]) or 'bhtd' ([B,H,T,dh]), got {layout!r}")
    elif layout is not None:
        fail(name, f"layout={layout!r} applies to 4-d per-head tensors (attn_q, attn_k, attn_v, attn_heads) only")
    if len(x.shape) != rank:
        fail(name, f"shape {list(x.shape)} is not [{doc}]")
    return x


class TraceRecorder:
    """Collects a model trace: ``with TraceRecorder() as rec: model(ids)``; ``rec.trace`` is the
    dict to pass to oasis.check_model (which also accepts the recorder itself)."""

    def __init__(self):
        self.trace = {}
        self._hooks = []

    def record(self, name, x, layout=None):
        """Record tensor x as the documented trace name (see the module's doc); a name recorded
        twice is an error (two modules recording under one name)."""
        if name in self.trace:
            fail(name, "recorded twice (one name per tensor: is a block index repeated?)")
        self.trace[name] = to_documented(name, x, layout)

    def hook(self, module, sublayer, input="input", output="output"):
        """Record a torch module's first positional input as ``<sublayer>.<input>`` and its output
        as ``<sublayer>.<output>`` on every call while the recorder is active (None: not that one)."""
        if not SUBLAYER.fullmatch(sublayer):
            fail("sublayer", f"'{sublayer}' is not layers.{{b}}.attn, layers.{{b}}.mlp or final_res")

        def on_forward(mod, args, out):
            if self not in _ACTIVE:
                return
            if input is not None:
                self.record(f"{sublayer}.{input}", args[0])
            if output is not None:
                self.record(f"{sublayer}.{output}", out)

        self._hooks.append(module.register_forward_hook(on_forward))
        return self

    def remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self):
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        return False


def record(name, x, layout=None):
    """Record into every active TraceRecorder; does nothing (and converts nothing) when none is."""
    for rec in _ACTIVE:
        rec.record(name, x, layout)
