#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention (the FlashAttention backend) on the
shapes of bench_cuda, on the device's own torch, and writes Google-Benchmark-style JSON that
bench/make_table.py reads beside bench_cuda's.

usage: sdpa_bench.py OUT.json [--min-time SECONDS]

Shapes (bench/cuda/bench_cuda.cpp): B=4, H=32, H_kv=8, causal, Tq = Tk = T in {4096}, d_h in
{64, 128}, f16 and bf16 (BM_TensorCoreAttention), and one new token over Tk = 8192 keys, B=16,
f16 (BM_Decode). SDPA computes plain softmax (no null category); the FLOP count is the same
4 d_h per visible (query, key) pair. Grouped-query attention uses enable_gqa where this torch
has it, else K and V repeated per query head before timing (not timed). Without torch or CUDA
the JSON says why ("skipped") and the exit status is 0: the step is optional.
"""
import json
import sys
import time


def skipped(out, why):
    json.dump({"context": {"skipped": why}, "benchmarks": []}, open(out, "w"), indent=1)
    print(f"sdpa_bench: skipped: {why}")
    return 0


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    out = args[0]
    min_time = 0.2
    if "--min-time" in args:
        min_time = float(args[args.index("--min-time") + 1])
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
        return skipped(out, f"torch is not importable: {e!r}")
    if not hasattr(F, "scaled_dot_product_attention"):
        return skipped(out, f"torch {torch.__version__} has no scaled_dot_product_attention (torch >= 2.0)")
    if not torch.cuda.is_available():
        return skipped(out, f"torch {torch.__version__} sees no CUDA device")

    def flash_context():
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            return sdpa_kernel([SDPBackend.FLASH_ATTENTION]), "torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)"
        except Exception:  # noqa: BLE001 - older torch
            return (torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False),
                    "torch.backends.cuda.sdp_kernel(flash only)")

    dtypes = {1: torch.float16, 2: torch.bfloat16}
    names = {1: "f16", 2: "bf16"}
    results = []
    backend_note = ""

    def run(name, B, H, Hkv, Tq, Tk, d, dtype_arg, causal, label_extra=""):
        nonlocal backend_note
        dt = dtypes[dtype_arg]
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, Tq, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, Hkv, Tk, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(B, Hkv, Tk, d, device="cuda", dtype=dt, generator=g)
        gqa = "enable_gqa"
        ctx, backend_note = flash_context()

        def call_gqa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

        kr, vr = None, None

        def call_repeat():
            return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)

        with ctx:
            fn = call_gqa
            try:
                fn()
            except Exception:  # noqa: BLE001 - no enable_gqa, or flash refuses it
                kr = k.repeat_interleave(H // Hkv, dim=1)
                vr = v.repeat_interleave(H // Hkv, dim=1)
                fn, gqa = call_repeat, "K/V repeated per head"
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            t0 = time.time()
            while time.time() - t0 < min_time or len(times) < 3:
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
        t = sorted(times)[len(times) // 2]  # median seconds
        # visible pairs: is_causal in torch is top-left aligned; with Tq = Tk it is the bottom-right mask,
        # and the decode shape (Tq = 1) is called without a mask (every key visible)
        pairs = Tq * (Tq + 1) / 2 if causal else Tq * Tk
        flops = 4.0 * B * H * d * pairs
        kv_bytes = 2.0 * B * Hkv * Tk * d * q.element_size()
        results.append({
            "name": name, "run_type": "iteration", "iterations": len(times), "real_time": t * 1e3,
            "cpu_time": t * 1e3, "time_unit": "ms", "TFLOP/s": flops / t * 1e-12, "KV GB/s": kv_bytes / t * 1e-9,
            "label": f"{names[dtype_arg]} torch {torch.__version__} flash ({gqa}){label_extra}",
        })
        print(f"{name}: {t * 1e3:.3f} ms, {flops / t * 1e-12:.1f} TFLOP/s, {kv_bytes / t * 1e-9:.0f} KV GB/s ({gqa})")

    try:
        for dtype_arg in (1, 2):
            for d in (64, 128):
                run(f"SDPA_flash/dtype:{dtype_arg}/d_h:{d}/T:4096", 4, 32, 8, 4096, 4096, d, dtype_arg, True)
        run("SDPA_flash/dtype:2/d_h:128/T:8192", 4, 32, 8, 8192, 8192, 128, 2, True)
        for d in (64, 128):
            run(f"SDPA_flash_decode/d_h:{d}", 16, 32, 8, 1, 8192, d, 1, False, ", decode: no mask")
    except Exception as e:  # noqa: BLE001 - report what ran, and why the rest did not
        print(f"sdpa_bench: stopped: {e!r}")
        if not results:
            return skipped(out, f"SDPA failed: {e!r}")
    ctx = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
           "backend": backend_note, "timing": f"CUDA events, median of >= 3 calls over >= {min_time} s"}
    json.dump({"context": ctx, "benchmarks": results}, open(out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
