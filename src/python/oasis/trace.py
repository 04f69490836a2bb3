"""oasis.trace: record a model trace (forward, and a training step's backward) from a torch
module for oasis.check_model.

A trace holds tensors named as docs/verify-model.md ("Model level", "Model gradients") documents
them: ``<sublayer>.<field>`` with ``<sublayer>`` one of ``layers.{b}.attn``, ``layers.{b}.mlp``
(the attention and MLP sublayers of transformer block b) and ``final_res`` (the final readout
router), plus ``logits``, ``state`` (the readout state before the final norm) and ``ids``; the
gradients ``<sublayer>.grad_<field>``, ``grad.<parameter>``, ``grad_state``, ``grad_embeddings``
and ``grad_logits`` (dL/dlogits: an input of the check). TRACE_FIELDS and GRAD_FIELDS below are
the one table of the fields and their layouts: when the documented names or layouts change, these
tables change, and so does every user of the recorder and ``oasis.Model.forward(trace=True)``.

Three ways to fill a recorder, all inactive (free) when no recorder is recording:

* calls in the model's code: ``oasis.record("layers.0.attn.attn_q", q, layout="bhtd")`` records
  into every active recorder; inside ``with oasis.trace_scope("layers.0.attn"):`` field names are
  relative (``oasis.record("attn_q", q, ...)``);
* a name map: ``TraceRecorder(modules={"blocks.0.attention": "layers.0.attn"}).attach(model)``
  hooks the named submodules: each records its output as ``<sublayer>.output`` and runs inside
  ``trace_scope(<sublayer>)``, so relative ``oasis.record`` calls in its code land under its name;
* ``rec.hook(module, "layers.0.mlp")``: the same for one module.

With ``backward=True`` a recorder also registers a tensor hook (``Tensor.register_hook``) on each
recorded tensor whose gradient has a documented name (GRAD_OF below): ``loss.backward()`` then
records ``.grad_output``, ``.grad_routed``, ``.grad_sources``, ... and ``grad_logits``;
``rec.record_parameter_grads(model)`` after it records ``grad.<parameter>``.

Tensors are copied when recorded (detached, on the CPU, C-contiguous), in their dtype (bfloat16
as oasis.bf16), converted to the documented layout: per-head tensors given as [B, T, H, d_h]
("bthd") or [B, H, T, d_h] ("bhtd") become [B, T, H d_h]; routing tensors given as a list of the
n candidates' tensors are stacked on a new first axis.
"""

import contextlib
import difflib
import re

import numpy as np

from . import _arrays
from ._arrays import bf16, fail

# field: (layout of the stored tensor, conversion accepted on recording, meaning)
#   conversions: "heads" = [B,T,H,dh] (layout="bthd") or [B,H,T,dh] (layout="bhtd") -> [B,T,H*dh];
#                "stack" = a list of n tensors -> stacked on axis 0
TRACE_FIELDS = {
    "input":      ("B,T,d",       None,    "the state the sublayer reads, before its pre-norm (with AttnRes: the routed h_l)"),
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
# gradient fields of a sublayer (oasis::model::SublayerGradTrace, docs/verify-model.md "Model gradients")
GRAD_FIELDS = {
    "grad_input":      ("B,T,d",   None,    "dL/d input through this sublayer's function only"),
    "grad_output":     ("B,T,d",   None,    "total dL/d the raw sublayer output"),
    "grad_routed":     ("B,T,d",   None,    "total dL/d the router's output"),
    "grad_branch_psi": ("B,T",     None,    "attention sublayers: total dL/d the branch's psi"),
    "grad_sources":    ("n,B,T,d", "stack", "dL/d the router's candidates through this router (mix + keys)"),
    "grad_g_old":      ("n,B,T",   "stack", "dL/d the router's logits before coupling"),
    "grad_psi":        ("n,B,T",   "stack", "dL/d the candidates' psi as given to the coupling (0 where not read)"),
}
GRAD_TOP_LEVEL = {
    "grad_logits":     ("B,T,vocab", None, "dL/dlogits of the loss (an input of the check)"),
    "grad_state":      ("B,T,d",     None, "total dL/d the readout state"),
    "grad_embeddings": ("B,T,d",     None, "dL/d the embedding rows (the lookup's output)"),
}
# the gradient a tensor hook on a recorded field gives, when that is a documented gradient: the
# hook sees the total gradient of the tensor it is registered on, so a field maps here only when
# that total is the documented quantity. Totals: output, routed, branch_psi, logits, state.
# sources, g_old, psi: the router's own tensors (its stack of the candidates, its logits), whose
# only consumer is that router, so their total is "through this router" as grad_sources means.
# Not here: input (grad_input is through the sublayer alone, which a hook on a state that also
# feeds a residual sum does not give; oasis.record_grad records it where it holds).
GRAD_OF = {"output": "grad_output", "routed": "grad_routed", "branch_psi": "grad_branch_psi",
           "sources": "grad_sources", "g_old": "grad_g_old", "psi": "grad_psi",
           "logits": "grad_logits", "state": "grad_state"}
SUBLAYER = re.compile(r"layers\.\d+\.(attn|mlp)|final_res")

_ACTIVE = []   # the recording recorders
_SCOPES = []   # the open trace scopes (innermost last): _Scope objects


class _Scope:
    def __init__(self, sublayer, owner=None):
        self.sublayer, self.owner = sublayer, owner


def _spec(field):
    return TRACE_FIELDS.get(field) or GRAD_FIELDS.get(field) or TOP_LEVEL.get(field) or GRAD_TOP_LEVEL.get(field)


def split_name(name):
    """(sublayer or None, field) of a trace name; InvalidArgument for a name not documented.
    ``grad.<parameter>`` is accepted as (None, name): the check knows the model's parameters."""
    if not isinstance(name, str):
        fail("name", f"trace names are strings, got {type(name).__name__}")
    if name in TOP_LEVEL or name in GRAD_TOP_LEVEL or (name.startswith("grad.") and len(name) > 5):
        return None, name
    sub, _, field = name.rpartition(".")
    if not SUBLAYER.fullmatch(sub) or (field not in TRACE_FIELDS and field not in GRAD_FIELDS):
        fail(name, "not a documented trace name: '<sublayer>.<field>' with sublayer layers.{b}.attn, "
                   "layers.{b}.mlp or final_res and field one of " + ", ".join(TRACE_FIELDS) + ", " +
                   ", ".join(GRAD_FIELDS) + "; or " + ", ".join(list(TOP_LEVEL) + list(GRAD_TOP_LEVEL)) +
                   ", grad.<parameter>")
    return sub, field


def _check_sublayer(sublayer, argument):
    if not isinstance(sublayer, str) or not SUBLAYER.fullmatch(sublayer):
        fail(argument, f"{sublayer!r} is not a documented sublayer: layers.{{b}}.attn, layers.{{b}}.mlp or final_res")
    return sublayer


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
    if field.startswith("grad."):  # a parameter's gradient: the parameter's shape, checked by the engine
        if layout is not None or isinstance(x, (list, tuple)):
            fail(name, "a parameter's gradient is one tensor of the parameter's shape (no layout, no list)")
        return _copy(x, name)
    doc, conversion, _ = _spec(field)
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


@contextlib.contextmanager
def trace_scope(sublayer):
    """``with trace_scope("layers.0.attn"):`` oasis.record and oasis.record_grad take names relative
    to the sublayer (``record("output", y)`` records ``layers.0.attn.output``); the innermost scope
    applies. Costs nothing when no recorder is active (names are resolved only when recording)."""
    scope = _Scope(_check_sublayer(sublayer, "sublayer"))
    _SCOPES.append(scope)
    try:
        yield
    finally:
        _remove_scope(scope)


def _remove_scope(scope):
    for i in range(len(_SCOPES) - 1, -1, -1):
        if _SCOPES[i] is scope:
            del _SCOPES[i]
            return


def _resolve(name):
    """The full trace name of `name`: inside a trace scope a field name ('output', 'attn_q',
    'grad_sources', ...) is relative to the innermost scope's sublayer; any other name (a full
    name, 'logits', 'grad_embeddings', ...) is taken as it is. Field names and full names never
    coincide (a full name has a sublayer or is top-level), so the rule is unambiguous."""
    if not _SCOPES or not isinstance(name, str):
        return name
    sub = _SCOPES[-1].sublayer
    full = f"{sub}.{name}" if name in TRACE_FIELDS or name in GRAD_FIELDS else name
    try:
        split_name(full)
    except _arrays.InvalidArgument:
        fail(name, f"not a documented trace name (inside trace_scope('{sub}') a field name such as 'output' or "
                   f"'grad_sources' is relative to the sublayer, other names are full names: "
                   f"'<sublayer>.<field>', {', '.join(list(TOP_LEVEL) + list(GRAD_TOP_LEVEL))}, grad.<parameter>)")
    return full


def _first_tensor(x):
    """A module's output: the tensor itself, or the first element of a tuple or list (modules that
    return (output, extras), such as an attention returning (output, psi))."""
    return x[0] if isinstance(x, (tuple, list)) and x else x


def _module_target(target):
    """(sublayer or None, field) a name-map value records a module's output as: a sublayer (its
    .output), a trace name <sublayer>.<field> (e.g. a router module's 'layers.0.attn.routed') or
    a top-level name ('logits', 'state')."""
    if isinstance(target, str) and SUBLAYER.fullmatch(target):
        return target, "output"
    if isinstance(target, str) and target in ("logits", "state"):
        return None, target
    sub, _, field = target.rpartition(".") if isinstance(target, str) else ("", "", "")
    if not SUBLAYER.fullmatch(sub) or field not in TRACE_FIELDS:
        fail("modules", f"{target!r} is not a documented sublayer (layers.{{b}}.attn, layers.{{b}}.mlp, final_res), "
                        f"trace name '<sublayer>.<field>' (fields: {', '.join(TRACE_FIELDS)}), 'logits' or 'state'")
    return sub, field


def _input_field(input):
    """What a hooked module's first argument is recorded as: None (nothing) or a trace field."""
    if input is None or input in TRACE_FIELDS:
        return input
    if input == "normed":
        fail("input", "no documented trace field holds a sublayer's normed input: '.input' is the state before the "
                      "sublayer's pre-norm (attn_q = RMSNorm(input) W_q, docs/verify-model.md), which a module "
                      "receiving RMSNorm(input) never sees. Leave input=None (the check recomputes it from the "
                      "router), or record the state where the model forms it (oasis.record('input', h) in a trace_scope)")
    fail("input", f"expected None or a trace field ({', '.join(TRACE_FIELDS)}), got {input!r}")


class TraceRecorder:
    """Collects a model trace: ``with TraceRecorder() as rec: model(ids)``; ``rec.trace`` is the
    dict to pass to oasis.check_model (which also accepts the recorder itself).

    ``modules``: a name map {module name as ``model.named_modules()`` gives it: sublayer, trace
    name or 'logits'/'state'}; ``rec.attach(model)`` hooks those modules (see hook()).
    ``input``: what the hooked modules' first argument is recorded as: None (the default: nothing)
    or "input" for modules whose first argument is the documented ``.input``, the state *before*
    the sublayer's pre-norm. A hook cannot see where a model applies its pre-norm, and a model
    that applies it outside the module (as many do) hands the module RMSNorm(input): recorded as
    ``.input`` it would fail a correct model. Without ``.input`` the check recomputes the
    sublayer's input from its router (docs/verify-model.md, "Reads"): a looser bound, no false
    failure.
    ``backward``: also record the documented gradients of the recorded tensors during
    ``loss.backward()`` (GRAD_OF), and the parameters' with record_parameter_grads().
    """

    def __init__(self, modules=None, input=None, backward=False):
        self.trace = {}
        self.backward = bool(backward)
        self.unreached = []     # gradient names the backward did not reach (recorded as zeros)
        self.without_grad = {}  # gradient name -> why no hook could be registered
        self._input = _input_field(input)
        if modules is not None and not isinstance(modules, dict):
            fail("modules", f"expected a dict {{module name: sublayer}}, got {type(modules).__name__}")
        self._modules = {}
        for mname, target in (modules or {}).items():
            if not isinstance(mname, str):
                fail("modules", f"module names are strings, got {mname!r}")
            self._modules[mname] = _module_target(target)
        self._hooks = []
        self._pending = {}      # gradient name -> (shape, torch dtype, layout) of a hooked tensor not reached yet
        self._reached = False   # the backward reached at least one hooked tensor

    # ---- recording ---------------------------------------------------------------------------

    def record(self, name, x, layout=None):
        """Record tensor x as the documented trace name (see the module's doc); a name recorded
        twice is an error (two modules recording under one name). With backward=True, a tensor
        whose gradient has a documented name (GRAD_OF) also gets a gradient hook."""
        if name in self.trace:
            fail(name, "recorded twice (one name per tensor: is a block index repeated?)")
        self.trace[name] = to_documented(name, x, layout)
        if self.backward:
            sub, field = split_name(name)
            if field in GRAD_OF:
                self.record_grad(f"{sub}.{GRAD_OF[field]}" if sub else GRAD_OF[field], x, layout)

    def record_grad(self, name, x, layout=None):
        """Record the gradient that ``loss.backward()`` delivers to tensor x as the documented
        gradient name (a tensor hook: the total dL/dx, once per backward). A tensor that does not
        require grad has no gradient to hook (``without_grad`` says so); a list of candidates has
        none either (each candidate's own gradient also holds what other routers pass it)."""
        split_name(name)
        if name in self.trace or name in self._pending:
            fail(name, "recorded twice (one name per tensor: is a block index repeated?)")
        if not _arrays._is_torch(x):
            self.without_grad[name] = ("given as a list of the candidates, not as the router's own stacked tensor"
                                       if isinstance(x, (list, tuple)) else "not a torch tensor")
            return
        if not x.requires_grad:
            self.without_grad[name] = "the tensor does not require grad (recorded under torch.no_grad, or constant)"
            return
        self._pending[name] = (tuple(x.shape), x.dtype, layout)

        def on_grad(g):
            self._reached = True
            if self._pending.pop(name, None) is None:  # a second backward through a retained graph, or after finish()
                fail(name, "a gradient delivered twice, or after finish() (one backward per recorder: record each "
                           "step, or micro-batch, with its own TraceRecorder)")
            self.trace[name] = to_documented(name, g, layout)

        x.register_hook(on_grad)

    def finish(self):
        """After ``loss.backward()``: every hooked tensor the backward did not reach gets its
        gradient, zero (the backward computed none: what torch's ``.grad is None`` means, and what
        an optimizer applies), listed in ``unreached``. Does nothing until the backward has reached
        some hooked tensor, so a forward checked before the backward is left as it is."""
        if not self._reached:
            return self
        torch = _arrays._torch()
        for name, (shape, dtype, layout) in list(self._pending.items()):
            self.trace[name] = to_documented(name, torch.zeros(shape, dtype=dtype), layout)
            self.unreached.append(name)
        self._pending = {}
        return self

    def record_parameter_grads(self, model, names=None):
        """After ``loss.backward()``: record each parameter's ``.grad`` as ``grad.<name>`` (a
        parameter whose ``.grad`` is None — the backward did not reach it — as zeros), then
        finish(). ``names``: None (the model's parameter names are the library's), a dict {torch
        name: library name or None to leave it out} that names every parameter, or a callable."""
        torch = _arrays._torch()
        for pname, p in model.named_parameters():
            if names is None:
                lib = pname
            elif isinstance(names, dict):
                if pname not in names:
                    fail("names", f"the name map has no entry for parameter '{pname}' (map it to None to leave it out)")
                lib = names[pname]
            else:
                lib = names(pname)
            if lib is not None:
                self.record(f"grad.{lib}", p.grad if p.grad is not None else torch.zeros_like(p))
        return self.finish()

    # ---- module hooks ------------------------------------------------------------------------

    def attach(self, model):
        """Hook the modules of the name map given at construction (names as model.named_modules()
        gives them); InvalidArgument naming a module the model lacks."""
        named = dict(model.named_modules())
        for mname, (sub, field) in self._modules.items():
            if mname not in named:
                near = difflib.get_close_matches(mname, list(named), n=3)
                fail("modules", f"the model has no submodule '{mname}'" +
                     (f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""))
            self._hook(named[mname], sub, field, self._input if field == "output" else None)
        return self

    def hook(self, module, sublayer, input=None, output="output"):
        """Hook one torch module as sublayer ``sublayer``: while the recorder is active, each call
        runs inside trace_scope(sublayer) (relative oasis.record calls in the module's code land
        under its name) and records its output (the first element of a tuple) as
        ``<sublayer>.<output>`` and, when ``input`` is a field, its first positional argument as
        ``<sublayer>.<input>`` (None: not that one; see the class doc for why input defaults to None)."""
        _check_sublayer(sublayer, "sublayer")
        if output is not None and output not in TRACE_FIELDS:
            fail("output", f"expected None or a trace field ({', '.join(TRACE_FIELDS)}), got {output!r}")
        self._hook(module, sublayer, output, _input_field(input))
        return self

    def _hook(self, module, sub, field, input):
        open_scopes = []

        def before(mod, args):
            if self in _ACTIVE and sub is not None:
                scope = _Scope(sub, owner=self)
                _SCOPES.append(scope)
                open_scopes.append(scope)

        def after(mod, args, out):
            if self not in _ACTIVE:
                return
            if open_scopes:
                _remove_scope(open_scopes.pop())
            prefix = f"{sub}." if sub is not None else ""
            if input is not None:
                self.record(prefix + input, args[0])
            if field is not None:
                self.record(prefix + field, _first_tensor(out))

        self._hooks.append(module.register_forward_pre_hook(before))
        self._hooks.append(module.register_forward_hook(after))

    def remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self):
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        # scopes this recorder's hooks opened and a raising forward left open
        for scope in [s for s in _SCOPES if s.owner is self]:
            _remove_scope(scope)
        return False


def record(name, x, layout=None):
    """Record into every active TraceRecorder (the name relative to the innermost trace_scope);
    does nothing (and converts nothing) when none is."""
    if _ACTIVE:
        full = _resolve(name)
        for rec in _ACTIVE:
            rec.record(full, x, layout)


def record_grad(name, x, layout=None):
    """Record the gradient the backward delivers to tensor x as gradient name `name` (e.g.
    'grad_embeddings', or 'grad_input' inside a trace_scope) in every active recorder with
    backward=True; does nothing when none is."""
    if any(rec.backward for rec in _ACTIVE):
        full = _resolve(name)
        for rec in _ACTIVE:
            if rec.backward:
                rec.record_grad(full, x, layout)
