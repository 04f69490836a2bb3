"""Arguments of the oasis functions as the compiled module takes them.

Tensors are NumPy arrays or torch tensors (torch is imported by the caller, never here). A torch
tensor is detached, moved to the CPU and viewed as a NumPy array (no copy for a CPU tensor);
bfloat16, which NumPy lacks, travels as its raw bits (uint16) with the dtype tag "bf16", as in
the .bf16.npy files of oasis-verify. Nothing is converted silently: a non-contiguous array, a
dtype the function does not take or an untagged uint16 array is an InvalidArgument naming the
argument (the compiled module checks contiguity and dtype again).
"""

import sys

import numpy as np

from . import _core

InvalidArgument = _core.InvalidArgument


def fail(argument, what):
    """Raise InvalidArgument for `argument`, worded as the C++ library words it."""
    err = InvalidArgument(f"oasis: argument '{argument}': {what}")
    err.argument = argument
    raise err


class bf16:
    """bfloat16 values given by their raw bits: ``oasis.bf16(bits)`` with ``bits`` a uint16 array
    (e.g. ``t.view(torch.int16).numpy().view(np.uint16)``, or ml_dtypes' ``a.view(np.uint16)``)."""

    __slots__ = ("bits",)

    def __init__(self, bits):
        bits = _numpy(bits, "bits")
        if bits.dtype != np.uint16:
            fail("bits", f"bf16 bits must be a uint16 array, got dtype {bits.dtype}")
        self.bits = bits

    @property
    def shape(self):
        return self.bits.shape

    def to_float32(self):
        """The values as float32 (exact: every bf16 value is a float32)."""
        return (self.bits.astype(np.uint32) << 16).view(np.float32)

    def __repr__(self):
        return f"oasis.bf16(shape={self.bits.shape})"


def _torch():
    return sys.modules.get("torch")


def _is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _from_torch(x):
    """A torch tensor as a NumPy array, or as bf16 bits."""
    t = _torch()
    x = x.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    if x.dtype == t.bfloat16:
        return bf16(x.view(t.int16).numpy().view(np.uint16))
    return x.numpy()


def _numpy(x, name):
    if isinstance(x, np.ndarray):
        return x
    if _is_torch(x):
        a = _from_torch(x)
        if isinstance(a, bf16):
            fail(name, "bfloat16 tensor: this argument takes float32 or float64")
        return a
    fail(name, f"expected a numpy array or a torch tensor, got {type(x).__name__}")


def array(x, name):
    """A NumPy array for a core function (float32 or float64, checked by the compiled module)."""
    if isinstance(x, bf16):
        fail(name, "bf16 values: the core functions compute in float32 or float64")
    return _numpy(x, name)


_TAGS = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
         np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}


def stored(x, name):
    """(dtype tag, array) of a tensor checked by the compare engine: f64, f32, f16 or bf16; int32
    or int64 for integer metadata (ids, cu_seqlens, block_table, seq_lens: the engine names any
    other tensor given as integers)."""
    if _is_torch(x):
        x = _from_torch(x)
    if isinstance(x, bf16):
        return ("bf16", x.bits)
    if not isinstance(x, np.ndarray):
        fail(name, f"expected a numpy array, a torch tensor or oasis.bf16(bits), got {type(x).__name__}")
    tag = _TAGS.get(x.dtype.newbyteorder("="))
    if tag is not None:
        return (tag, x)
    if x.dtype == np.uint16:
        fail(name, "uint16 array: pass bfloat16 bits as oasis.bf16(bits), so that integers are never read as floats")
    fail(name, f"dtype {x.dtype}: the compare engine takes float64, float32, float16, bfloat16, int32 or int64")


def tensor_map(d, what):
    """{name: tensor} -> {name: (tag, array)}."""
    if not isinstance(d, dict):
        fail(what, f"expected a dict {{name: tensor}}, got {type(d).__name__}")
    out = {}
    for name, x in d.items():
        if not isinstance(name, str):
            fail(what, f"tensor names must be strings, got {name!r}")
        out[name] = stored(x, name)
    return out


def token_ids(x, name="ids"):
    """Token ids for the model level: an integer array (exact below 2^53) as float64, or a float
    array of exact integers as it is (the engine checks the values)."""
    if _is_torch(x):
        x = _from_torch(x)
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if isinstance(x, np.ndarray) and x.dtype.kind in "iu":
        if x.size and (x.max() >= 2**53 or x.min() < 0):
            fail(name, "token ids must lie in [0, 2^53)")
        return ("f64", np.ascontiguousarray(x, dtype=np.float64))
    return stored(x, name)


def int_array(x, name, what="an integer array"):
    """An integer array, tensor or nested sequence as a C-contiguous int64 array (block_table)."""
    if _is_torch(x):
        x = _from_torch(x)
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "iu":
        fail(name, f"expected {what}, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dtype == np.uint64 and x.size and x.max() >= 2**63:
        fail(name, "entry beyond int64")
    return np.ascontiguousarray(x, dtype=np.int64)


def int_ids(x, name="ids"):
    """Token ids [B, T] as a C-contiguous int64 array (for Model.forward)."""
    return int_array(x, name, "an integer array [B, T]")


def int_list(x, name):
    """A list of Python ints from a 1-d integer sequence, array or tensor (cu_seqlens, seq_lens)."""
    if isinstance(x, (list, tuple)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in x):
            fail(name, "expected a sequence of integers")
        x = np.asarray(x, dtype=np.int64) if x else np.zeros(0, dtype=np.int64)
    x = int_array(x, name, "a 1-d integer sequence or array")
    if x.ndim != 1:
        fail(name, f"expected a 1-d sequence, got shape {list(x.shape)}")
    return [int(v) for v in x.tolist()]


def number_list(x, name):
    """A list of Python numbers from a sequence, array or tensor (exact for float32 and float64)."""
    if _is_torch(x) or isinstance(x, np.ndarray):
        a = _numpy(x, name)
        if a.ndim != 1:
            fail(name, f"expected a 1-d sequence, got shape {list(a.shape)}")
        return a.tolist()
    if isinstance(x, (list, tuple)):
        return [v.item() if isinstance(v, np.generic) else v for v in x]
    fail(name, f"expected a sequence of numbers, got {type(x).__name__}")


def json_default(x):
    """json.dumps hook: NumPy scalars and arrays, torch tensors."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray) or _is_torch(x):
        return _numpy(x, "options").tolist()
    raise TypeError(f"an option value of type {type(x).__name__} is not a JSON value")
