#!/usr/bin/env python3
"""A --cmd program for `oasis-verify fuzz attention` (docs/fuzz-protocol.md): Softmax1 attention
with per-head sinks in NumPy, bhtd layout, options causal and scale.

    oasis-verify fuzz attention --cmd 'python3 cmd_consumer.py {in} {out}' --without window,key_lengths,bias,mask

Down to main() it is the example of docs/fuzz-protocol.md. `--bug KIND` makes it wrong on purpose,
for the tests of tests/fuzz/cli_tests.cmake: nosink (plain softmax: the sink dropped), nan_masked
(NaN on rows with no visible key), hang (never returns), exit3 (fails with exit status 3).
"""
import json, os, sys
import numpy as np


def load(folder, name):
    path = os.path.join(folder, name)
    if os.path.exists(path + ".bf16.npy"):  # bfloat16 as raw bits: the high half of a float32
        return (np.load(path + ".bf16.npy").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.load(path + ".npy").astype(np.float64) if os.path.exists(path + ".npy") else None


def attention(q, k, v, s, causal, scale):
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = (np.repeat(x, H // x.shape[1], axis=1) for x in (k, v))  # GQA: head h reads kv head h // (H / Hkv)
    z = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    if causal:  # bottom-right aligned: query t sees key j iff j <= t + Tk - Tq
        z[..., np.arange(Tk)[None, :] > np.arange(Tq)[:, None] + Tk - Tq] = -np.inf
    s = np.broadcast_to(s[None, :, None], z.shape[:3])
    m = np.maximum(s, z.max(axis=-1, initial=-np.inf))  # the max includes the sink: nothing overflows
    m = np.where(np.isfinite(m), m, 0.0)  # s = +inf, or s = -inf over no visible key
    e, en = np.exp(z - m[..., None]), np.exp(s - m)
    S = en + e.sum(axis=-1)  # e^(s-m) + sum_j e^(z_j-m); inf only when s = +inf, 0 only when s = -inf and no key
    lse = m + np.log(S)  # log(e^s + sum_j e^z_j)
    Sd = np.where(S > 0, S, 1.0)  # no key and no null: p = 0, output 0
    out = np.einsum("bhqk,bhkd->bhqd", e / Sd[..., None], v)
    return out, lse, np.where(np.isposinf(s), 1.0, en / Sd)


def main(inp, outdir, bug=None):
    opts = json.load(open(os.path.join(inp, "options.json")))
    extra = (set(opts) - {"causal", "scale"}) | {n for n in ("bias", "mask") if load(inp, n) is not None}
    if extra:  # a crash names what is missing, rather than a wrong answer
        sys.exit("unsupported: " + ", ".join(sorted(extra)))
    q, k, v, s = (load(inp, n) for n in ("q", "k", "v", "null_logits"))
    s = np.zeros(q.shape[1]) if s is None else s  # no input null_logits: Softmax1's s = 0
    if bug == "nosink":
        s = np.full_like(s, -np.inf)
    with np.errstate(all="ignore"):
        out, lse, p_null = attention(q, k, v, s, opts.get("causal", False), opts.get("scale", q.shape[-1] ** -0.5))
    if bug == "nan_masked" and opts.get("causal", False):  # the first Tq - Tk queries see no key
        out[:, :, : max(q.shape[2] - k.shape[2], 0)] = np.nan
    wide = os.path.exists(os.path.join(inp, "q.npy")) and np.load(os.path.join(inp, "q.npy")).dtype == np.float64
    for name, x in (("out", out), ("lse", lse), ("p_null", p_null)):
        np.save(os.path.join(outdir, name + ".npy"), x.astype(np.float64 if wide else np.float32))


if __name__ == "__main__":
    bug = sys.argv[sys.argv.index("--bug") + 1] if "--bug" in sys.argv else None
    if bug == "hang":
        import time
        while True:
            time.sleep(60)
    if bug == "exit3":
        print("cmd_consumer: failing on purpose (--bug exit3)", file=sys.stderr)
        sys.exit(3)
    main(sys.argv[1], sys.argv[2], bug)
