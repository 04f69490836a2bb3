#!/usr/bin/env python3
"""Turns Google Benchmark JSON (CPU, and GPU when measured) into docs/benchmarks.md.

usage: make_table.py OUT.md NOTES.md CPU.json [--single CPU1.json] [GPU.json ...] -- key=value context lines
CPU1.json: an OASIS_BENCH_THREADS=1 run, whose *_cpu ratios (process CPU time) do not depend on
the load of a shared machine.
"""
import json
import re
import sys


def fmt_time(b):
    t = b.get("real_time", 0.0)
    unit = b.get("time_unit", "ns")
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return t * scale


def rows(data):
    out = []
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate":
            continue
        name = re.sub(r"/min_time:[0-9.]+", "", b["name"].replace("/real_time", ""))
        thr, ratio = "", ""
        rate_keys = [k for k in ("GFLOP/s", "TFLOP/s", "GB/s") if k in b] + \
            [k for k in b if k.endswith("/s") and k not in ("GFLOP/s", "TFLOP/s", "GB/s") and not k.endswith("_cpu")]
        if rate_keys:
            thr = f"{b[rate_keys[0]]:.4g} {rate_keys[0]}"
        elif "items_per_second" in b:
            thr = f"{b['items_per_second'] / 1e6:.4g} M items/s"
        else:
            rate_keys = []
        if "ratio_gemm" in b:
            ratio = f"{b['ratio_gemm']:.3g} of GEMM"
        elif "ratio_triad" in b:
            ratio = f"{b['ratio_triad']:.3g} of triad"
        extra = [f"{k}={v:.4g}" for k, v in b.items()
                 if isinstance(v, (int, float)) and k not in rate_keys[:1] and k not in
                 ("real_time", "cpu_time", "iterations", "ratio_gemm", "ratio_triad",
                  "items_per_second", "repetitions", "repetition_index", "threads", "family_index",
                  "per_family_instance_index")]
        out.append((name, fmt_time(b), b.get("iterations", 0), thr, ratio, b.get("label", ""), " ".join(extra)))
    return out


def table(rs):
    lines = ["| benchmark | time per iteration (ms) | iterations | throughput | ratio to same-run ceiling | notes |",
             "|---|---:|---:|---:|---:|---|"]
    for name, t, it, thr, ratio, label, extra in rs:
        notes = ", ".join(x for x in (label, extra) if x)
        lines.append(f"| `{name}` | {t:.3f} | {it} | {thr} | {ratio} | {notes} |")
    return "\n".join(lines)


def find(data, prefix):
    for b in data.get("benchmarks", []):
        if b["name"].startswith(prefix):
            return b
    return None


def conservative(data, bench, counter, ceiling_prefix, ceiling_counter):
    """counter of bench over the larger of the two same-run ceilings (start and end of the run)."""
    b = find(data, bench) if data else None
    if not b or counter not in b:
        return None
    ceil = [c[ceiling_counter] for c in data.get("benchmarks", [])
            if c["name"].startswith(ceiling_prefix) and ceiling_counter in c]
    return b[counter] / max(ceil) if ceil else None


def targets(cpu, single):
    lines = ["Ratios here divide by the *larger* of the two same-run ceiling measurements (start and end "
             "of the run), the conservative choice; the tables below use the first.", "",
             "| target | measured, 2 threads (wall time) | status | 1 thread, CPU-time ratio |",
             "|---|---:|---|---:|"]

    def fmt(x):
        return f"{x:.3f}" if x is not None else "-"

    r = conservative(cpu, "BM_Attention_fast/4096/64/", "GFLOP/s", "BM_Ceiling_GemmF32", "GFLOP/s")
    r1 = conservative(single, "BM_Attention_fast/4096/64/", "GFLOP/s_cpu", "BM_Ceiling_GemmF32", "GFLOP/s_cpu")
    if r is not None:
        lines.append(f"| fused causal Softmax1, T=4096, 8 heads, d_h=64: >= 0.60 of same-run GEMM | {fmt(r)} | "
                     f"{'met' if r >= 0.6 else 'NOT met'} | {fmt(r1)} |")
    fast = find(cpu, "BM_Attention_fast/4096/64/")
    ref = find(cpu, "BM_Attention_reference/4096/64/")
    if fast and ref:
        s = ref["real_time"] / fast["real_time"] if fast["time_unit"] == ref["time_unit"] else 0
        lines.append(f"| same config: >= 5x faster than the plain reference | {s:.1f}x | "
                     f"{'met' if s >= 5 else 'NOT met'} | - |")
    r = conservative(cpu, "BM_Attention_backward_fast/4096/64/", "GFLOP/s", "BM_Ceiling_GemmF32", "GFLOP/s")
    r1 = conservative(single, "BM_Attention_backward_fast/4096/64/", "GFLOP/s_cpu", "BM_Ceiling_GemmF32", "GFLOP/s_cpu")
    if r is not None:
        lines.append(f"| fused causal Softmax1 backward (10 d_h flops per visible pair), T=4096, 8 heads, d_h=64: "
                     f">= 0.40 of same-run GEMM | {fmt(r)} | {'met' if r >= 0.4 else 'NOT met'} | {fmt(r1)} |")
    r = conservative(cpu, "BM_Route_fast/32/", "GB/s", "BM_Ceiling_Triad", "GB/s")
    r1 = conservative(single, "BM_Route_fast/32/", "GB/s_cpu", "BM_Ceiling_Triad", "GB/s_cpu")
    if r is not None:
        lines.append(f"| depth routing, 32 sources, d=2048: >= 0.50 of same-run triad | {fmt(r)} | "
                     f"{'met' if r >= 0.5 else 'NOT met'} | {fmt(r1)} |")
    for prefix, limit, what in (("BM_Verify_attention_causal", 30, "compare check, [1,32,4096,128] causal f32 attention"),
                                ("BM_Verify_attention_gptoss", 30, "compare check, gpt-oss-like [1,64,4096,64], 8 kv heads, sinks"),
                                ("BM_Verify_depth", 10, "compare check, depth routing, 8192 tokens x 33 sources, d=2048")):
        b = find(cpu, prefix)
        if b and "check_s" in b:
            cpu_s = b.get("cpu_s")
            lines.append(f"| {what}: <= {limit} s | {b['check_s']:.1f} s (CPU {cpu_s:.1f} s; mp50 est. "
                         f"{b.get('mp50_s_estimate', 0):.3g} s) | {'met' if b['check_s'] <= limit else 'NOT met'} | - |")
    return "\n".join(lines)


def main():
    argv = sys.argv[1:]
    ctx = []
    if "--" in argv:
        i = argv.index("--")
        ctx = argv[i + 1:]
        argv = argv[:i]
    single = None
    if "--single" in argv:
        i = argv.index("--single")
        single = json.load(open(argv[i + 1]))
        argv = argv[:i] + argv[i + 2:]
    out, notes, cpu_json, gpu_jsons = argv[0], argv[1], argv[2], argv[3:]
    cpu = json.load(open(cpu_json))
    md = ["# Benchmarks (generated by scripts/bench.sh)", ""]
    md.append("## Conditions")
    md.append("")
    for c in ctx:
        k, _, v = c.partition("=")
        md.append(f"- **{k}**: {v}")
    cctx = cpu.get("context", {})
    md.append(f"- **Google Benchmark context**: {cctx.get('num_cpus')} CPUs at {cctx.get('mhz_per_cpu')} MHz, "
              f"load average at start {cctx.get('load_avg')}, threads {cctx.get('threads')}, "
              f"fast-path ISA {cctx.get('cpu_fast_isa')}, ceiling Eigen SIMD: {cctx.get('eigen_simd_ceiling')}")
    md += ["", "## Targets", "", targets(cpu, single), "", "## CPU, %s threads" % cctx.get("threads", "?"), "",
           table(rows(cpu)), ""]
    if single:
        sctx = single.get("context", {})
        md += ["## CPU, 1 thread: ratios from process CPU time (less sensitive to the shared machine's load)", "",
               f"Load average at start {sctx.get('load_avg')}. The `*_cpu` counters (notes column) divide the "
               "work by the process CPU time of the timing loop; with one thread that is the time the loop "
               "really ran, so `ratio_*_cpu` is less sensitive to other processes than a wall-time ratio (its limits: "
               "\"Measurement conditions\" below).", "",
               table(rows(single)), ""]
    gpu_rows = []
    for g in gpu_jsons:
        try:
            gpu_rows += rows(json.load(open(g)))
        except (OSError, ValueError):
            pass
    md.append("## GPU")
    md.append("")
    md.append(table(gpu_rows) if gpu_rows else "Not measured in this run (no GPU on the benchmark machine, or no "
              "CUDA benchmark built). scripts/bench.sh adds this table when `nvidia-smi` sees a device and "
              "`bench/cuda` built its benchmarks (every executable in the build's bench/cuda/ directory is run).")
    md.append("")
    md.append(open(notes).read())
    open(out, "w").write("\n".join(md))


if __name__ == "__main__":
    main()
