"""oasis: the OASIS reference oracle as a Python import (docs/python.md).

Check your implementation's tensors against the oracle recomputed in high precision (mp50), with
exactly the verdicts of ``oasis-verify compare``::

    report = oasis.check("attention", {"q": q, "k": k, "v": v}, {"out": out, "lse": lse},
                         options={"causal": True})
    report.assert_ok()          # AssertionError carrying the table when a tensor fails

    oasis.check_model("model.safetensors", trace, ids=ids).assert_ok()

Fuzz your kernel through the regimes where sink bugs live (sinks far above the logits, fully masked
rows, lengths at tile boundaries, ...), each run checked, the first failure shrunk and written as a
replay folder for ``oasis-verify compare``::

    oasis.fuzz(my_attention, "attention", backward=True, tensors="torch",
               dtypes=("float32", "bfloat16"), without=("key_lengths", "window")).assert_ok()

and compute the oracle's functions on NumPy arrays in float32 or float64, bit for bit as the
C++ library: softmax1, normalize, token_attention, null_statistic, null_statistic_from_mass,
couple_depth_logits, attn_res_route, pseudo_query_logits, Model.forward; and the library's
kernel-interface functions on any of its backends (``backend="reference"``, the default, or
"cpu_fast", "cuda": ``oasis.backends()``): token_attention and its backward, attn_res_route,
attn_res, block_attn_res and their backwards, token_attention_varlen (and backward),
token_attention_paged.

Tensors are NumPy arrays or torch tensors (torch is never required); bfloat16 is a torch
bfloat16 tensor or ``oasis.bf16(uint16_bits)``. Bad input raises InvalidArgument (a ValueError)
whose ``argument`` names the offending argument.
"""

import json as _json
import os as _os

import numpy as _np

from . import _arrays, _core
from . import trace as _trace
from ._arrays import InvalidArgument, bf16, fail as _fail
from ._figures import figures
from ._fuzz import FuzzReport, FuzzTimeout, fuzz, fuzz_features, fuzz_regimes
from ._progress import progress_callback as _progress_callback
from .trace import GRAD_FIELDS, TRACE_FIELDS, TraceRecorder, record, record_grad, trace_scope

__all__ = [
    "InvalidArgument", "Report", "Model", "bf16", "check", "check_model", "op_names", "describe_ops", "config_fields",
    "softmax1", "normalize", "token_attention", "null_statistic", "null_statistic_from_mass",
    "couple_depth_logits", "attn_res_route", "pseudo_query_logits",
    "backends", "backend_available", "token_attention_backward", "attn_res", "attn_res_backward", "block_attn_res",
    "block_attn_res_backward", "token_attention_varlen", "token_attention_varlen_backward", "token_attention_paged",
    "TraceRecorder", "record", "record_grad", "trace_scope", "TRACE_FIELDS", "GRAD_FIELDS", "figures",
    "fuzz", "fuzz_regimes", "fuzz_features", "FuzzReport", "FuzzTimeout",
]


def _json_text(obj, name):
    """A dict of options as JSON text for the engine ("" for None)."""
    if obj is None:
        return ""
    if not isinstance(obj, dict):
        _fail(name, f"expected a dict, got {type(obj).__name__}")
    try:
        return _json.dumps(obj, allow_nan=False, default=_arrays.json_default)
    except (TypeError, ValueError) as e:
        _fail(name, f"not representable as JSON ({e})")


# ---- reports ------------------------------------------------------------------------------------


class Report:
    """The result of check() or check_model(): the engine's report.

    ``passed``: the verdict. ``rows``: one dict per checked tensor (name, dtype, shape, max_abs,
    max_rel, max_ulps, worst_ratio, violations, passed — None for an informative row —,
    informative, problem, first_mismatches), as in ``oasis-verify compare --json``;
    ``report["lse"]`` is the row of one tensor. ``str(report)`` is the CLI's table,
    ``to_json()`` the CLI's JSON, ``to_html()`` the page of ``oasis-verify compare --html`` (heat
    maps, histograms, worst elements; docs/report.md), ``plot()`` writes that page and opens it;
    ``assert_ok()`` raises AssertionError carrying the table.
    """

    def __init__(self, passed, text, json_text, report=None):
        self.passed = bool(passed)
        self._text = text
        self._json = json_text
        self._report = report
        doc = _json.loads(json_text)
        self.op = doc["op"]
        self.rows = doc["tensors"]
        self.notes = doc["notes"]

    def __str__(self):
        return self._text

    def __repr__(self):
        return f"<oasis.Report op={self.op} {'PASS' if self.passed else 'FAIL'}: {len(self.rows)} tensors>"

    def __getitem__(self, name):
        for r in self.rows:
            if r["name"] == name:
                return r
        raise KeyError(f"no tensor '{name}' in the report (tensors: {', '.join(r['name'] for r in self.rows)})")

    def to_json(self):
        return self._json

    def to_html(self, path=None):
        """The report as one self-contained HTML page (text); also written to ``path`` when given."""
        html = self._report.html()
        if path is not None:
            with open(_os.fspath(path), "w", encoding="utf-8") as f:
                f.write(html)
        return html

    def plot(self, path=None, open_browser=True):
        """Write the HTML page to ``path`` (default: a new temporary file) and open it in the web
        browser (``open_browser=False``: only write it); returns the path."""
        if path is None:
            import tempfile

            fd, path = tempfile.mkstemp(prefix=f"oasis-{self.op}-", suffix=".html")
            _os.close(fd)
        self.to_html(path)
        if open_browser:
            import webbrowser

            webbrowser.open("file://" + _os.path.abspath(_os.fspath(path)))
        return path

    def assert_ok(self):
        if not self.passed:
            raise AssertionError("oasis: the comparison failed\n" + self._text)
        return self


def _compare_options(policy, compare):
    opts = dict(compare)
    if policy is not None:
        opts["policy"] = policy
    return _json_text(opts, "compare options") if opts else ""


def check(op, inputs, outputs, options=None, policy=None, progress=None, **compare):
    """Check the outputs of op-level ``op`` computed from ``inputs`` (dicts name -> tensor).

    ``options``: the op's options (``oasis.describe_ops()``, docs/verify.md). ``policy`` and the
    keyword arguments (``show=5``: mismatches listed per tensor) are the comparison options,
    passed to the engine as they are. ``progress``: True (a status line on stderr) or a callable
    given a dict, once the check has run 2 s (docs/report.md). Returns a Report."""
    if not isinstance(op, str):
        _fail("op", f"expected the op's name, got {type(op).__name__}")
    return Report(*_core.check(op, _arrays.tensor_map(inputs, "inputs"), _arrays.tensor_map(outputs, "outputs"),
                               _json_text(options, "options"), _compare_options(policy, compare),
                               _progress_callback(progress)))


def check_model(model, trace, ids=None, options=None, policy=None, progress=None, grad_logits=None, **compare):
    """Check a model trace (docs/verify-model.md, "Model level").

    ``model``: a weights file of oasis::model::save_model (path), an ``oasis.Model``, or a pair
    ``(config, weights)`` (see Model). ``trace``: dict name -> tensor (logits, state,
    ``<sublayer>.<field>``; gradients ``grad.<parameter>``, ``grad_state``, ``grad_embeddings``,
    ``<sublayer>.grad_<field>`` with ``grad_logits``) or a TraceRecorder (finished: see
    TraceRecorder.finish); a name that is not documented (oasis.TRACE_FIELDS, oasis.GRAD_FIELDS)
    is an error, a documented one that this model does not check is noted in the report.
    ``ids`` [B, T]: the token ids (integers); when None, ``trace["ids"]``. ``grad_logits``
    [B, T, vocab]: the dL/dlogits the gradients were back-propagated from (an input of the
    check); when None, ``trace["grad_logits"]`` if present. ``progress`` as for check(). Returns a
    Report."""
    if isinstance(trace, TraceRecorder):
        trace = trace.finish().trace
    if not isinstance(trace, dict):
        _fail("trace", f"expected a dict {{name: tensor}} or a TraceRecorder, got {type(trace).__name__}")
    trace = dict(trace)
    if ids is None:
        if "ids" not in trace:
            _fail("ids", "not given and the trace has no 'ids' [B, T]")
        ids = trace.pop("ids")
    else:
        trace.pop("ids", None)
    for name in trace:
        _trace.split_name(name)  # a name that is not documented is a typo, not a tensor to ignore
    grad_logits = trace.pop("grad_logits", None) if grad_logits is None else grad_logits
    trace.pop("grad_logits", None)
    inputs = {"ids": _arrays.token_ids(ids)}
    if grad_logits is not None:  # an input of the check: the gradients are the backward from it
        inputs["grad_logits"] = _arrays.stored(grad_logits, "grad_logits")
    tr = _arrays.tensor_map(trace, "trace")
    opts, comp, prog = _json_text(options, "options"), _compare_options(policy, compare), _progress_callback(progress)
    if isinstance(model, (str, _os.PathLike)):
        return Report(*_core.check_model_file(_os.fspath(model), inputs, tr, opts, comp, prog))
    if isinstance(model, tuple) and len(model) == 2:
        model = Model(*model)
    if not isinstance(model, Model):
        _fail("model", f"expected a weights file path, an oasis.Model or (config, weights), got {type(model).__name__}")
    return Report(*_core.check_model_held(model._held, inputs, tr, opts, comp, prog))


def op_names():
    """The ops the engine knows."""
    return _core.op_names()


def describe_ops():
    """The ops with their input and output tensor names and options."""
    return _core.describe_ops()


# ---- the model ----------------------------------------------------------------------------------------


def _config_items(config):
    if not isinstance(config, dict):
        _fail("config", f"expected a dict of configuration fields, got {type(config).__name__}")
    return {k: (v.item() if isinstance(v, _np.generic) else v) for k, v in config.items()}


class Model:
    """An AttnRes model of the library (docs/model.md): ``Model(config, weights)`` or
    ``Model.load(path)``.

    ``config``: dict of configuration fields, spelled as the metadata of a weights file
    (docs/model.md; ``oasis.config_fields()``), e.g. ``{"vocab_size": 32, "d_model": 16,
    "variant": "oasis", "router": "kimi_full"}``; absent fields take the library's defaults
    (docs/model.md), a key that is not a field is an error.
    ``weights``: dict parameter name -> tensor (``Model.parameter_specs``), e.g. a torch
    ``state_dict()`` whose names follow the library's."""

    def __init__(self, config, weights):
        self._held = _core.model_from_memory(_config_items(config), _arrays.tensor_map(weights, "weights"))

    @classmethod
    def initialized(cls, config, seed):
        """The library's seeded initialisation of a configuration (Model<double>::initialized:
        weights N(0, init_std^2), gains 1, pseudo-queries 0, theta = theta_init), in float64."""
        m = cls.__new__(cls)
        m._held = _core.model_initialized(_config_items(config), int(seed))
        return m

    @classmethod
    def load(cls, path):
        """The model of a weights file written by oasis::model::save_model (or Model.save)."""
        m = cls.__new__(cls)
        m._held = _core.model_from_file(_os.fspath(path))
        return m

    @property
    def config(self):
        """Every configuration field as text (the file metadata without the "oasis." prefix)."""
        return self._held.config()

    def weights(self):
        """dict name -> array: float32 for weights given in float32, float64 otherwise."""
        return self._held.weights()

    def parameter_specs(self):
        """[(name, shape)] of every parameter of this configuration, in canonical order."""
        return self._held.parameter_specs()

    def save(self, path, dtype=None):
        """Write a weights file for oasis-verify (configuration in its metadata); ``dtype`` "f32"
        or "f64" rounds every weight to it, None keeps each weight's dtype."""
        self._held.save(_os.fspath(path), "" if dtype is None else dtype)

    def forward(self, ids, dtype="float64", trace=False):
        """The library's forward of token ids [B, T] in float32 or float64: dict with "logits"
        [B, T, vocab] and "state" [B, T, d] (the readout state), and with ``trace=True`` every
        trace tensor "<sublayer>.<field>" of TRACE_FIELDS (docs/verify-model.md): a reference trace
        that check_model accepts as it is."""
        if type(dtype).__module__ == "torch":  # torch.float32 -> "float32"
            dtype = str(dtype).replace("torch.", "")
        try:
            name = _np.dtype(dtype).name
        except TypeError:
            _fail("dtype", f"expected float32 or float64, got {dtype!r}")
        logits, state, sublayers = self._held.forward(_arrays.int_ids(ids), name, bool(trace))
        out = {"logits": logits, "state": state}
        for sub, fields in sublayers:
            for f, a in fields.items():
                if f in TRACE_FIELDS:
                    out[f"{sub}.{f}"] = a
        return out


def config_fields():
    """The configuration fields a Model's config dict may hold."""
    return _core.config_fields()


# ---- core functions ------------------------------------------------------------------------------------


def _opts(**kw):
    return _json_text({k: v for k, v in kw.items() if v is not None}, "options")


def normalize(z, normalizer="softmax1", s=0.0, masked_row="zero"):
    """Rows z [..., m] (masked entries -inf) through a row normaliser with null logit ``s`` (a
    number, or an array of the rows' shape [...]): dict p [..., m], p_null [...], lse [...]."""
    z = _arrays.array(z, "z")
    if _arrays._is_torch(s) or isinstance(s, _np.ndarray):
        s = _arrays.array(s, "s")
    else:
        s = _np.full(z.shape[:-1], s, dtype=z.dtype if z.dtype in (_np.float32, _np.float64) else _np.float64)
    return _core.normalize(z, s, normalizer, masked_row)


def softmax1(z, s=0.0):
    """Softmax1 (softmax with a null category of logit s, docs/spec.md §1) over the last axis."""
    return normalize(z, "softmax1", s)


def _backend(backend):
    if not isinstance(backend, str):
        _fail("backend", f"expected a backend's name (oasis.backends()), got {type(backend).__name__}")
    return backend


def _attention_opts(null_logits=None, key_lengths=None, **kw):
    if null_logits is not None:
        null_logits = _arrays.number_list(null_logits, "null_logits")
    if key_lengths is not None:
        key_lengths = _arrays.number_list(key_lengths, "key_lengths")
    return _opts(null_logits=null_logits, key_lengths=key_lengths, **kw)


def _optional(x, name):
    return None if x is None else _arrays.array(x, name)


def token_attention(q, k, v, *, normalizer=None, null_logits=None, causal=None, key_lengths=None, scale=None,
                    window=None, bias=None, layout=None, return_probs=None, masked_row=None, gamma=None, zeta=None,
                    backend="reference"):
    """Token attention (docs/spec.md §2, §8): dict out, lse, p_null (and probs with
    return_probs=True). q [B,H,Tq,d_h], k [B,H_kv,Tk,d_h], v [B,H_kv,Tk,d_v] (layout "bhtd", the
    default) or [B,T,H,d] (layout "bthd"). ``backend``: "reference" (float32 or float64, the
    library's bits) or another of ``oasis.backends()`` (float32 only)."""
    q, k, v = _arrays.array(q, "q"), _arrays.array(k, "k"), _arrays.array(v, "v")
    return _core.token_attention(q, k, v, _optional(bias, "bias"),
                                 _attention_opts(normalizer=normalizer, null_logits=null_logits, causal=causal,
                                                 key_lengths=key_lengths, scale=scale, window=window, layout=layout,
                                                 return_probs=return_probs, masked_row=masked_row, gamma=gamma,
                                                 zeta=zeta),
                                 _backend(backend))


def null_statistic(p_null):
    """psi [B, T] = mean over the query heads of p_null [B, H, T] (docs/spec.md §3)."""
    return _core.null_statistic(_arrays.array(p_null, "p_null"))


def null_statistic_from_mass(probs):
    """The authors' estimator psi = mean_h max(0, 1 - sum_j p_j) from probs [B, H, Tq, Tk]."""
    return _core.null_statistic_from_mass(_arrays.array(probs, "probs"))


def couple_depth_logits(g_old, dpsi, beta, *, profile=None, centring=None, headless=None, beta_max=None,
                        score_clamp=None):
    """g = clamp(g_old - beta Dpsi) for g_old, dpsi [n] or [n, N] (one column per token)."""
    return _core.couple_depth_logits(_arrays.array(g_old, "g_old"), _arrays.array(dpsi, "dpsi"), float(beta),
                                     _opts(profile=profile, centring=centring, headless=headless, beta_max=beta_max,
                                           score_clamp=score_clamp))


def attn_res_route(sources, g_old, psi=None, *, kinds=None, normalizer=None, coupling=None, profile=None,
                   centring=None, headless=None, theta=None, beta=None, beta_max=None, score_clamp=None,
                   backend="reference"):
    """Depth routing of one layer over N tokens (docs/spec.md §3-4): sources [n, N, d], g_old [n, N],
    psi [n, N] (needed with coupling); options as op "depth" of check(). Returns dict h [N, d],
    alpha [n, N], alpha_null [N], g [n, N], dpsi [n, N]. ``backend`` as for token_attention."""
    p = None if psi is None else _arrays.array(psi, "psi")
    return _core.attn_res_route(_arrays.array(sources, "sources"), _arrays.array(g_old, "g_old"), p,
                                _opts(kinds=kinds, normalizer=normalizer, coupling=coupling, profile=profile,
                                      centring=centring, headless=headless, theta=theta, beta=beta,
                                      beta_max=beta_max, score_clamp=score_clamp),
                                _backend(backend))


def pseudo_query_logits(sources, w, gain=None, *, eps=None, compute_in_float32=None):
    """Kimi depth logits g_i = w^T RMSNorm(s_i): sources [n, N, d], w [d], gain [d] -> g [n, N]."""
    gn = None if gain is None else _arrays.array(gain, "gain")
    return _core.pseudo_query_logits(_arrays.array(sources, "sources"), _arrays.array(w, "w"), gn,
                                     _opts(eps=eps, compute_in_float32=compute_in_float32))


# ---- backends and kernel-interface functions ---------------------------------------------------------------


def backends():
    """The names of the backends usable in this process, "reference" first (then "cpu_fast", and
    "cuda" when built with CUDA and a device is present)."""
    return _core.backends()


def backend_available(name):
    """True if the backend ``name`` is usable now (an unknown name is an InvalidArgument)."""
    return _core.backend_available(_backend(name))


def token_attention_backward(q, k, v, grad_out, grad_lse=None, grad_p_null=None, *, normalizer=None,
                             null_logits=None, causal=None, key_lengths=None, scale=None, window=None, bias=None,
                             layout=None, return_probs=None, masked_row=None, gamma=None, zeta=None,
                             backend="reference"):
    """The backward of token_attention (docs/spec.md §8) from the cotangents of its outputs:
    grad_out (the shape of out), grad_lse and grad_p_null [B, H, Tq] (None: 0); options as
    token_attention. Returns dict grad_q, grad_k, grad_v (k, v summed over each GQA group),
    grad_null_logits [H] (softmax1), grad_bias (with a bias), grad_scores [B, H, Tq, Tk] (dL/dz,
    with return_probs=True)."""
    q, k, v = _arrays.array(q, "q"), _arrays.array(k, "k"), _arrays.array(v, "v")
    return _core.token_attention_backward(
        q, k, v, _arrays.array(grad_out, "grad_out"), _optional(grad_lse, "grad_lse"),
        _optional(grad_p_null, "grad_p_null"), _optional(bias, "bias"),
        _attention_opts(normalizer=normalizer, null_logits=null_logits, causal=causal, key_lengths=key_lengths,
                        scale=scale, window=window, layout=layout, return_probs=return_probs, masked_row=masked_row,
                        gamma=gamma, zeta=zeta),
        _backend(backend))


def _attn_res_opts(eps, scale, kinds, normalizer, coupling, profile, centring, headless, theta, beta, beta_max,
                   score_clamp):
    return _opts(eps=eps, scale=scale, kinds=kinds, normalizer=normalizer, coupling=coupling, profile=profile,
                 centring=centring, headless=headless, theta=theta, beta=beta, beta_max=beta_max,
                 score_clamp=score_clamp)


def attn_res(sources, w, gain=None, psi=None, *, eps=None, scale=None, kinds=None, normalizer=None, coupling=None,
             profile=None, centring=None, headless=None, theta=None, beta=None, beta_max=None, score_clamp=None,
             backend="reference"):
    """The fused AttnRes routing (fla's naive_attnres; docs/spec.md §4): g_i = scale w^T RMSNorm(s_i)
    (eps 1e-6, scale 1, gain optional) computed from sources [n, N, d], then depth routing with
    normalizer softmax unless given and coupling when psi [n, N] is given: options as op "attn_res"
    of check(). Returns dict h [N, d], alpha [n, N], alpha_null [N], g [n, N] (the routed logits),
    dpsi [n, N]."""
    return _core.attn_res(_arrays.array(sources, "sources"), _arrays.array(w, "w"), _optional(gain, "gain"),
                          _optional(psi, "psi"),
                          _attn_res_opts(eps, scale, kinds, normalizer, coupling, profile, centring, headless, theta,
                                         beta, beta_max, score_clamp),
                          _backend(backend))


def attn_res_backward(sources, w, grad_h, gain=None, psi=None, grad_alpha=None, grad_alpha_null=None, *, eps=None,
                      scale=None, kinds=None, normalizer=None, coupling=None, profile=None, centring=None,
                      headless=None, theta=None, beta=None, beta_max=None, score_clamp=None, backend="reference"):
    """The backward of attn_res from grad_h [N, d], grad_alpha [n, N], grad_alpha_null [N] (None: 0).
    Returns dict grad_sources [n, N, d] (the total, through the mix and the keys), grad_w [d],
    grad_gain [d] (with a gain), grad_psi [n, N], grad_logits [n, N] (dL/dg of the scaled logits),
    grad_beta [1], grad_theta [1]."""
    return _core.attn_res_backward(
        _arrays.array(sources, "sources"), _arrays.array(w, "w"), _arrays.array(grad_h, "grad_h"),
        _optional(gain, "gain"), _optional(psi, "psi"), _optional(grad_alpha, "grad_alpha"),
        _optional(grad_alpha_null, "grad_alpha_null"),
        _attn_res_opts(eps, scale, kinds, normalizer, coupling, profile, centring, headless, theta, beta, beta_max,
                       score_clamp),
        _backend(backend))


def block_attn_res(blocks, w, partial=None, gain=None, psi=None, *, eps=None, scale=None, kinds=None,
                   normalizer=None, coupling=None, profile=None, centring=None, headless=None, theta=None, beta=None,
                   beta_max=None, score_clamp=None, backend="reference"):
    """Block AttnRes (Kimi, Eq. 5-6): attn_res over the sources [b_0 .. b_{m-1}, partial] stacked from
    blocks [m, N, d] and the partial sum [N, d] (optional; its weight is alpha's last row); psi and
    kinds describe the stacked sources. Returns dict h, alpha, alpha_null, g, dpsi as attn_res."""
    return _core.block_attn_res(_arrays.array(blocks, "blocks"), _optional(partial, "partial"),
                                _arrays.array(w, "w"), _optional(gain, "gain"), _optional(psi, "psi"),
                                _attn_res_opts(eps, scale, kinds, normalizer, coupling, profile, centring, headless,
                                               theta, beta, beta_max, score_clamp),
                                _backend(backend))


def block_attn_res_backward(blocks, w, grad_h, partial=None, gain=None, psi=None, grad_alpha=None,
                            grad_alpha_null=None, *, eps=None, scale=None, kinds=None, normalizer=None, coupling=None,
                            profile=None, centring=None, headless=None, theta=None, beta=None, beta_max=None,
                            score_clamp=None, backend="reference"):
    """The backward of block_attn_res: dict grad_blocks [m, N, d], grad_partial [N, d] (with a
    partial), then grad_w, grad_gain, grad_psi, grad_logits, grad_beta, grad_theta as attn_res_backward."""
    return _core.block_attn_res_backward(
        _arrays.array(blocks, "blocks"), _arrays.array(w, "w"), _arrays.array(grad_h, "grad_h"),
        _optional(partial, "partial"), _optional(gain, "gain"), _optional(psi, "psi"),
        _optional(grad_alpha, "grad_alpha"), _optional(grad_alpha_null, "grad_alpha_null"),
        _attn_res_opts(eps, scale, kinds, normalizer, coupling, profile, centring, headless, theta, beta, beta_max,
                       score_clamp),
        _backend(backend))


def token_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, normalizer=None, null_logits=None, causal=None,
                           scale=None, window=None, masked_row=None, gamma=None, zeta=None, backend="reference"):
    """Token attention on packed sequences (THD, FlashAttention's varlen): q [total_q, H, d_h],
    k [total_k, H_kv, d_h], v [total_k, H_kv, d_v], cu_seqlens_q / cu_seqlens_k the B + 1 offsets
    (integers). Returns dict out [total_q, H, d_v], lse and p_null [H, total_q] (head-major)."""
    q, k, v = _arrays.array(q, "q"), _arrays.array(k, "k"), _arrays.array(v, "v")
    return _core.token_attention_varlen(
        q, k, v, _arrays.int_list(cu_seqlens_q, "cu_seqlens_q"), _arrays.int_list(cu_seqlens_k, "cu_seqlens_k"),
        _attention_opts(normalizer=normalizer, null_logits=null_logits, causal=causal, scale=scale, window=window,
                        masked_row=masked_row, gamma=gamma, zeta=zeta),
        _backend(backend))


def token_attention_varlen_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, grad_out, grad_lse=None, grad_p_null=None, *,
                                    normalizer=None, null_logits=None, causal=None, scale=None, window=None,
                                    masked_row=None, gamma=None, zeta=None, backend="reference"):
    """The backward of token_attention_varlen: grad_out [total_q, H, d_v], grad_lse and grad_p_null
    [H, total_q] (None: 0). Returns dict grad_q, grad_k, grad_v (packed), grad_null_logits [H]
    (softmax1; summed over the sequences)."""
    q, k, v = _arrays.array(q, "q"), _arrays.array(k, "k"), _arrays.array(v, "v")
    return _core.token_attention_varlen_backward(
        q, k, v, _arrays.int_list(cu_seqlens_q, "cu_seqlens_q"), _arrays.int_list(cu_seqlens_k, "cu_seqlens_k"),
        _arrays.array(grad_out, "grad_out"), _optional(grad_lse, "grad_lse"), _optional(grad_p_null, "grad_p_null"),
        _attention_opts(normalizer=normalizer, null_logits=null_logits, causal=causal, scale=scale, window=window,
                        masked_row=masked_row, gamma=gamma, zeta=zeta),
        _backend(backend))


def token_attention_paged(q, k_cache, v_cache, block_table, seq_lens, *, normalizer=None, null_logits=None,
                          causal=None, scale=None, window=None, layout=None, masked_row=None, gamma=None, zeta=None,
                          backend="reference"):
    """Token attention over a paged KV cache (vLLM, FlashInfer): q [B, H, Tq, d_h] (or [B, Tq, H, d_h]
    with layout "bthd"), k_cache / v_cache [num_blocks, block_size, H_kv, d], block_table
    [B, max_blocks] and seq_lens [B] integers (sequence b's key j lives in block
    block_table[b, j // block_size]; the new queries are the last Tq keys). Cache slots no sequence
    reads may hold anything, NaN included. Returns dict out (the layout of q), lse, p_null [B, H, Tq]."""
    return _core.token_attention_paged(
        _arrays.array(q, "q"), _arrays.array(k_cache, "k_cache"), _arrays.array(v_cache, "v_cache"),
        _arrays.int_array(block_table, "block_table"), _arrays.int_list(seq_lens, "seq_lens"),
        _attention_opts(normalizer=normalizer, null_logits=null_logits, causal=causal, scale=scale, window=window,
                        layout=layout, masked_row=masked_row, gamma=gamma, zeta=zeta),
        _backend(backend))
