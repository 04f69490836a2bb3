#!/usr/bin/env python3
"""Turns Google Benchmark JSON (CPU, and GPU when measured) into docs/benchmarks.md.

usage: make_table.py OUT.md NOTES.md CPU.json [--single CPU1.json] [--round CPUr.json ...]
                     [--single-round CPU1r.json ...] [GPU.json ...] -- key=value context lines
       make_table.py --gpu-summary OUT.md GPU.json ...
CPU1.json: an OASIS_BENCH_THREADS=1 run, whose *_cpu ratios (process CPU time) do not depend on
the load of a shared machine. --round / --single-round: further rounds of the fast kernels and
the ceilings (scripts/bench.sh, OASIS_BENCH_ROUNDS); the per-host-kind table takes the best of
all rounds on each side of a ratio (best_ratio). GPU.json: bench_cuda's output and the SDPA step's
(scripts/gpu/sdpa_bench.py: torch's FlashAttention on the same shapes, benchmarks named SDPA_*);
the GPU section gives each rate over the device's same-run ceilings (copy, cuBLAS bf16 GEMM) and
the tensor-core kernel's rate over SDPA's. --gpu-summary writes the GPU section alone (the GPU
run's summary, scripts/gpu/run.sh).

Context lines "host kind=..." (CPU vendor, model name, family and model) and "cpu=..." name the
host. The section "Ratios per host kind" has one table per kind: this run's replaces the table of
the same kind that OUT.md already has, and the tables of other kinds in OUT.md are kept as they
are (each says where and when it was measured), so one file carries every kind measured.
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
        name = re.sub(r"/min_time:[0-9.]+", "", b["name"].replace("/real_time", "").replace("/manual_time", ""))
        thr, ratio = "", ""
        first = ("KV GB/s",) if "ratio_copy" in b else ()  # decode: the K/V read rate is the measure
        rate_keys = [k for k in first + ("GFLOP/s", "TFLOP/s", "GB/s") if k in b] + \
            [k for k in b if k.endswith("/s") and k not in first + ("GFLOP/s", "TFLOP/s", "GB/s") and not k.endswith("_cpu")]
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
        elif "ratio_copy" in b:
            ratio = f"{b['ratio_copy']:.3g} of copy"
        extra = [f"{k}={v:.4g}" for k, v in b.items()
                 if isinstance(v, (int, float)) and k not in rate_keys[:1] and k not in
                 ("real_time", "cpu_time", "iterations", "ratio_gemm", "ratio_triad", "ratio_copy",
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


def targets(cpus, singles):
    """The targets' lines; ratios as the per-host-kind table's (best_ratio over the rounds)."""
    cpu = cpus[0]
    lines = ["Ratios here are the best rate over the best ceiling across the run's rounds (best_ratio, as the "
             "per-host-kind table); the tables under \"CPU, 2 threads\" and \"CPU, 1 thread\" are the first "
             "round's, each over that round's first ceiling.", "",
             "| target | measured, 2 threads (wall time) | status | 1 thread, CPU-time ratio |",
             "|---|---:|---|---:|"]

    def fmt(x):
        return f"{x:.3f}" if x is not None else "-"

    r = best_ratio(cpus, "BM_Attention_fast/4096/64/", "GFLOP/s", "BM_Ceiling_GemmF32")
    r1 = best_ratio(singles, "BM_Attention_fast/4096/64/", "GFLOP/s_cpu", "BM_Ceiling_GemmF32") if singles else None
    if r is not None:
        lines.append(f"| fused causal Softmax1, T=4096, 8 heads, d_h=64: >= 0.60 of same-run GEMM | {fmt(r)} | "
                     f"{'met' if r >= 0.6 else 'NOT met'} | {fmt(r1)} |")
    fast = find(cpu, "BM_Attention_fast/4096/64/")
    ref = find(cpu, "BM_Attention_reference/4096/64/")
    if fast and ref:
        s = ref["real_time"] / fast["real_time"] if fast["time_unit"] == ref["time_unit"] else 0
        lines.append(f"| same config: >= 5x faster than the plain reference | {s:.1f}x | "
                     f"{'met' if s >= 5 else 'NOT met'} | - |")
    r = best_ratio(cpus, "BM_Attention_backward_fast/4096/64/", "GFLOP/s", "BM_Ceiling_GemmF32")
    r1 = best_ratio(singles, "BM_Attention_backward_fast/4096/64/", "GFLOP/s_cpu", "BM_Ceiling_GemmF32") if singles else None
    if r is not None:
        lines.append(f"| fused causal Softmax1 backward (10 d_h flops per visible pair), T=4096, 8 heads, d_h=64: "
                     f">= 0.40 of same-run GEMM | {fmt(r)} | {'met' if r >= 0.4 else 'NOT met'} | {fmt(r1)} |")
    r = best_ratio(cpus, "BM_Route_fast/32/", "GB/s", "BM_Ceiling_Triad")
    r1 = best_ratio(singles, "BM_Route_fast/32/", "GB/s_cpu", "BM_Ceiling_Triad") if singles else None
    if r is not None:
        lines.append(f"| depth routing, 32 sources, d=2048: >= 0.50 of same-run triad | {fmt(r)} | "
                     f"{'met' if r >= 0.5 else 'NOT met'} | {fmt(r1)} |")
    for prefix, limit, what in (("BM_Verify_attention_causal", 30, "compare check, [1,32,4096,128] causal f32 attention"),
                                ("BM_Verify_attention_gptoss", 30, "compare check, gpt-oss-like [1,64,4096,64], 8 kv heads, sinks"),
                                ("BM_Verify_depth", 10, "compare check, depth routing, 8192 tokens x 33 sources, d=2048"),
                                ("BM_Verify_model_full_d256", 5, "compare op model, full f32 trace, d=256, 4 blocks, T=128"),
                                ("BM_Verify_model_logits_d256", 5, "compare op model, logits only, d=256, 4 blocks, T=128"),
                                ("BM_Verify_model_full_gpt2small", 300,
                                 "compare op model, full f32 trace, d=768, 12 blocks, 12 heads, T=512, vocab 32000"),
                                ("BM_Verify_model_logits_gpt2small", 300,
                                 "compare op model, logits only, d=768, 12 blocks, 12 heads, T=512, vocab 32000"),
                                ("BM_VerifyGrad_model_d256", None,
                                 "compare op model, forward + backward f32 trace, d=256, 4 blocks, T=128"),
                                ("BM_VerifyGrad_model_gpt2small", 300,
                                 "compare op model, forward + backward f32 trace, d=768, 12 blocks, 12 heads, T=512, "
                                 "vocab 32000")):
        b = find(cpu, prefix)
        if b and "check_s" in b:
            cpu_s = b.get("cpu_s")
            target = f": <= {limit} s" if limit is not None else " (no target)"
            verdict = ('met' if b['check_s'] <= limit else 'NOT met') if limit is not None else '-'
            extra = (f"peak {b['peak_rss_gb']:.2f} GB" if "peak_rss_gb" in b
                     else f"mp50 est. {b.get('mp50_s_estimate', 0):.3g} s")
            lines.append(f"| {what}{target} | {b['check_s']:.1f} s (CPU {cpu_s:.1f} s; {extra}) | {verdict} | - |")
    return "\n".join(lines)


# (benchmark prefix, label, counter, ceiling prefix, target: a ratio, or a note for rows without one)
# of the per-host-kind table
HOST_ROWS = [(f"BM_Attention_fast/{t}/{d}/", f"fused causal Softmax1 forward, T={t}, d_h={d}", "GFLOP/s",
              "BM_Ceiling_GemmF32", 0.8) for t in (1024, 4096) for d in (64, 128)] + \
    [(f"BM_Attention_backward_fast/{t}/{d}/", f"its backward, T={t}, d_h={d}", "GFLOP/s", "BM_Ceiling_GemmF32", 0.8)
     for t in (1024, 4096) for d in (64, 128)] + \
    [(f"BM_Attention_fast_kernel/1024/{d}/", f"forward kernel alone (no packing or input checks), T=1024, d_h={d}",
      "GFLOP/s", "BM_Ceiling_GemmF32", "where the forward's time goes") for d in (64, 128)] + \
    [("BM_Attention_fast_peaked/1024/64/20/", "forward, peaked rows (logits ~N(0, 20^2)), T=1024, d_h=64", "GFLOP/s",
      "BM_Ceiling_GemmF32", "subnormal weights: compare T=1024, d_h=64"),
     ("BM_Attention_backward_fast_peaked/1024/64/20/", "its backward, peaked rows, T=1024, d_h=64", "GFLOP/s",
      "BM_Ceiling_GemmF32", "subnormal weights: compare T=1024, d_h=64")] + \
    [(f"BM_Route_fast/{n}/", f"depth routing, {n} sources, d=2048", "GB/s", "BM_Ceiling_Triad", 0.7)
     for n in (8, 16, 32, 64)]
HOST_BEGIN, HOST_END = "<!-- host-kind: ", "<!-- /host-kind -->"


def best_ratio(datas, bench, counter, ceiling_prefix):
    """The best rate of bench over the best ceiling, across the rounds `datas` (each ceiling measured
    twice per round, at its start and end): on a shared machine each side's best is its rate
    when least disturbed, and the larger ceiling keeps the ratio conservative."""
    rates = [b[counter] for d in datas for b in d.get("benchmarks", [])
             if b["name"].startswith(bench) and b.get("run_type") != "aggregate" and counter in b]
    ceils = [c[counter] for d in datas for c in d.get("benchmarks", [])
             if c["name"].startswith(ceiling_prefix) and c.get(counter)]
    if not rates or not ceils:
        return None
    return max(rates) / max(ceils)


def host_block(kind, ctx, cpus, singles):
    """This run's table of ratios to the same-run ceilings (best of its rounds), marked as host kind
    `kind`; cpus / singles: the JSON of each round with the run's threads / with one thread."""
    cpu = cpus[0]
    threads = cpu.get("context", {}).get("threads", "?")
    lines = [f"{HOST_BEGIN}{kind} -->", f"### {kind}", "",
             f"Measured {ctx.get('date (UTC)', '?')} UTC at commit {ctx.get('commit', '?')} "
             f"(`{ctx.get('command', 'scripts/bench.sh')}`), {ctx.get('machine', '')}; fast-path ISA "
             f"{cpu.get('context', {}).get('cpu_fast_isa', '?')}, ceilings built for "
             f"{cpu.get('context', {}).get('eigen_simd_ceiling', '?')}; load average before / after "
             f"{ctx.get('load average (1, 5, 15 min) before / after', '?')}. Each ratio is the best of "
             f"{len(cpus)} round(s) of the rate over the best of the same rounds' ceilings (start and end of "
             f"each round).", "",
             f"| benchmark | target | {threads} threads, wall time | 1 thread, CPU time |", "|---|---:|---:|---:|"]
    for prefix, label, counter, ceiling, goal in HOST_ROWS:
        r = best_ratio(cpus, prefix, counter, ceiling)
        r1 = best_ratio(singles, prefix, counter + "_cpu", ceiling) if singles else None
        if r is None and r1 is None:
            continue
        of = "GEMM" if "Gemm" in ceiling else "triad"
        fmt = lambda x: f"{x:.2f}" if x is not None else "-"
        target = f">= {goal} of {of}" if not isinstance(goal, str) else f"- ({goal}; of {of})"
        lines.append(f"| {label} | {target} | {fmt(r)} | {fmt(r1)} |")
    lines.append(HOST_END)
    return "\n".join(lines)


def host_blocks(path):
    """The host-kind tables of an existing OUT.md, {kind: text}, in file order."""
    try:
        text = open(path).read()
    except OSError:
        return {}
    out = {}
    pos = 0
    while True:
        i = text.find(HOST_BEGIN, pos)
        if i < 0:
            return out
        j = text.find(HOST_END, i)
        if j < 0:
            return out
        kind = text[i + len(HOST_BEGIN):text.find(" -->", i)]
        out[kind] = text[i:j + len(HOST_END)]
        pos = j


def gpu_section(datas):
    """The GPU tables and targets from bench_cuda's JSON and the SDPA step's (any order)."""
    bench = {"benchmarks": [b for d in datas for b in d.get("benchmarks", []) if not b["name"].startswith("SDPA")]}
    sdpa = {"benchmarks": [b for d in datas for b in d.get("benchmarks", []) if b["name"].startswith("SDPA")]}
    md = []
    ctxs = [d.get("context", {}) for d in datas]
    for c in ctxs:
        if c.get("device") or c.get("skipped") or c.get("torch"):
            md.append("- " + ", ".join(f"**{k}**: {v}" for k, v in c.items()
                                       if k in ("device", "driver", "torch", "cuda", "backend", "timing", "skipped")))
    md.append("")
    if not bench["benchmarks"]:
        md.append("Not measured in this run (no GPU on the benchmark machine, or no CUDA benchmark built). "
                  "scripts/gpu/run.sh measures it on a device machine (docs/cuda.md, \"GPU run\"); "
                  "scripts/bench.sh includes its JSON through OASIS_GPU_JSON.")
        return "\n".join(md)

    def rate(data, prefix, counter):
        b = find(data, prefix)
        return b.get(counter) if b else None

    def fmt(x, digits=3):
        return f"{x:.{digits}f}" if x is not None else "-"

    lines = ["Ratios divide by the *larger* of the two same-run ceiling measurements (start and end of "
             "bench_cuda's run), the conservative choice; the table below uses the first. SDPA ran in the "
             "same GPU session, right after bench_cuda (scripts/gpu/run.sh).", "",
             "| target | measured | status |", "|---|---:|---|"]
    for d in (64, 128):
        r = conservative(bench, f"BM_Decode/kernel:1/d_h:{d}", "KV GB/s", "BM_Ceiling_CopyD2D", "GB/s")
        goal = f"decode (B=16, H=32, H_kv=8, Tk=8192, f16, d_h={d}), split-K: K/V read >= 0.60 of the copy rate"
        lines.append(f"| {goal} | {fmt(r)} | {'-' if r is None else ('met' if r >= 0.6 else 'NOT met')} |")
    for dt, name in ((2, "bf16"), (1, "f16")):
        for d in (64, 128):
            ours = rate(bench, f"BM_TensorCoreAttention/dtype:{dt}/d_h:{d}/T:4096", "TFLOP/s")
            theirs = rate(sdpa, f"SDPA_flash/dtype:{dt}/d_h:{d}/T:4096", "TFLOP/s")
            r = ours / theirs if ours is not None and theirs else None
            status = "-" if r is None else ("met (moonshot 0.80 met)" if r >= 0.8 else "met" if r >= 0.5 else "NOT met")
            lines.append(f"| tensor cores, {name}, causal, T=4096, d_h={d}: >= 0.50 of SDPA flash "
                         f"({fmt(ours, 1)} / {fmt(theirs, 1)} TFLOP/s) | {fmt(r)} | {status} |")
    md += ["### GPU targets", ""] + lines + ["", "### GPU, bench_cuda", "", table(rows(bench)), ""]
    if sdpa["benchmarks"]:
        gemm = [c["TFLOP/s"] for c in bench["benchmarks"] if c["name"].startswith("BM_Ceiling_GemmBf16")
                and "TFLOP/s" in c]
        copy = [c["GB/s"] for c in bench["benchmarks"] if c["name"].startswith("BM_Ceiling_CopyD2D") and "GB/s" in c]
        for b in sdpa["benchmarks"]:
            if gemm and "decode" not in b["name"]:
                b["ratio_gemm"] = b["TFLOP/s"] / gemm[0]
            elif copy and "decode" in b["name"]:
                b["ratio_copy"] = b["KV GB/s"] / copy[0]
        md += ["### GPU, torch SDPA (FlashAttention) on the same shapes", "", table(rows(sdpa)), ""]
    return "\n".join(md)


def main():
    argv = sys.argv[1:]
    if argv and argv[0] == "--gpu-summary":
        datas = []
        for g in argv[2:]:
            try:
                datas.append(json.load(open(g)))
            except (OSError, ValueError) as e:
                print(f"make_table.py: {g}: {e}", file=sys.stderr)
        open(argv[1], "w").write("## GPU\n\n" + gpu_section(datas) + "\n")
        return
    ctx = []
    if "--" in argv:
        i = argv.index("--")
        ctx = argv[i + 1:]
        argv = argv[:i]
    def take(flag):
        """the files given after each occurrence of flag, removed from argv"""
        nonlocal argv
        files = []
        while flag in argv:
            i = argv.index(flag)
            files.append(json.load(open(argv[i + 1])))
            argv = argv[:i] + argv[i + 2:]
        return files

    # --host-table-only: replace (or add) this host kind's table in the existing OUT.md and leave the
    # rest of it as it is (a run of other kernels on the same host: OASIS_BENCH_ISA in scripts/bench.sh)
    host_only = "--host-table-only" in argv
    if host_only:
        argv.remove("--host-table-only")
    singles = take("--single")
    single = singles[0] if singles else None
    rounds, single_rounds = take("--round"), take("--single-round")
    out, notes, cpu_json, gpu_jsons = argv[0], argv[1], argv[2], argv[3:]
    cpu = json.load(open(cpu_json))
    if host_only:
        ctx_map = dict(c.partition("=")[::2] for c in ctx)
        kind = ctx_map.get("host kind", "unnamed host")
        try:
            text = open(out).read()
        except OSError as e:
            sys.exit(f"make_table.py: --host-table-only needs an existing {out}: {e}")
        block = host_block(kind, ctx_map, [cpu] + rounds, singles + single_rounds)
        old_block = host_blocks(out).get(kind)
        if old_block is not None:
            text = text.replace(old_block, block)
        elif "\n## CPU, " in text:
            i = text.index("\n## CPU, ")
            text = text[:i] + "\n" + block + "\n" + text[i:]
        else:
            sys.exit(f"make_table.py: {out} has no \"## CPU, \" section to put the host table before")
        open(out, "w").write(text)
        return
    md = ["# Benchmarks (generated by scripts/bench.sh)", ""]
    md.append("## Conditions")
    md.append("")
    for c in ctx:
        k, _, v = c.partition("=")
        md.append(f"- **{k}**: {v}")
    cctx = cpu.get("context", {})
    md.append(f"- **Google Benchmark context**: {cctx.get('cpu_model', '?')} ({cctx.get('cpu_vendor', '?')}), "
              f"{cctx.get('num_cpus')} CPUs at {cctx.get('mhz_per_cpu')} MHz, "
              f"load average at start {cctx.get('load_avg')}, threads {cctx.get('threads')}, "
              f"fast-path ISA {cctx.get('cpu_fast_isa')}, ceiling Eigen SIMD: {cctx.get('eigen_simd_ceiling')}")
    md += ["", "## Targets", "", targets([cpu] + rounds, singles + single_rounds), ""]
    ctx_map = dict(c.partition("=")[::2] for c in ctx)
    kind = ctx_map.get("host kind", "unnamed host")
    blocks = host_blocks(out)
    blocks[kind] = host_block(kind, ctx_map, [cpu] + rounds, singles + single_rounds)
    md += ["## Ratios per host kind", "",
           "One table per kind of host measured, each rate over the ceilings of its own run; this run's "
           "kind is regenerated, the others are kept from earlier runs (each table says how its ratios "
           "were formed).", ""]
    for k in [kind] + [k for k in blocks if k != kind]:
        md += [blocks[k], ""]
    md += ["## CPU, %s threads" % cctx.get("threads", "?"), "", table(rows(cpu)), ""]
    if single:
        sctx = single.get("context", {})
        md += ["## CPU, 1 thread: ratios from process CPU time (less sensitive to the shared machine's load)", "",
               f"Load average at start {sctx.get('load_avg')}. The `*_cpu` counters (notes column) divide the "
               "work by the process CPU time of the timing loop; with one thread that is the time the loop "
               "really ran, so `ratio_*_cpu` is less sensitive to other processes than a wall-time ratio (its limits: "
               "\"Measurement conditions\" below).", "",
               table(rows(single)), ""]
    gpu_datas = []
    for g in gpu_jsons:
        try:
            gpu_datas.append(json.load(open(g)))
        except (OSError, ValueError):
            pass
    md.append("## GPU")
    md.append("")
    md.append(gpu_section(gpu_datas))
    md.append("")
    md.append(open(notes).read())
    open(out, "w").write("\n".join(md))


if __name__ == "__main__":
    main()
