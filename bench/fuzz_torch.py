"""Time a full oasis.fuzz of an eager torch sink attention: forward and backward (autograd), float32
and bfloat16, every regime but those needing key_lengths or a window (which the kernel lacks).

Run (the goal: under 2 minutes on two cores):

    OMP_NUM_THREADS=2 taskset -c 0,1 PYTHONPATH=build/python /usr/bin/python3 bench/fuzz_torch.py

Prints the seconds and the number of runs, then where the time went: per regime (summed over its
variants and dtypes), the seconds between its runs' log lines (the kernel's call, the check, the
tensors' conversion; the kernel's share timed separately). Options: --forward-only, --top N.
"""

import argparse
import os
import sys
import time
from collections import defaultdict

import torch

import oasis


# the correct kernel of the fuzzer's tests (its bugs off): one definition
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from test_fuzz import sink_attention  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forward-only", action="store_true", help="fuzz op attention only")
    ap.add_argument("--top", type=int, default=10, help="regimes listed by time (default 10)")
    args = ap.parse_args()

    kernel_s = [0.0]

    def timed(inputs, options):
        t = time.perf_counter()
        try:
            return sink_attention(inputs, options)
        finally:
            kernel_s[0] += time.perf_counter() - t

    # per regime: the time from the previous log line (or the start) to this run's line
    per_regime = defaultdict(float)
    last = [time.perf_counter()]

    def log(line):
        now = time.perf_counter()
        op, regime = line.split()[:2]
        per_regime[(op, regime.split("[")[0])] += now - last[0]
        last[0] = now

    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
          f"CPUs allowed {len(os.sched_getaffinity(0))}")
    start = time.perf_counter()
    last[0] = start
    report = oasis.fuzz(timed, "attention", backward=not args.forward_only, tensors="torch",
                        dtypes=("float32", "bfloat16"), without=("key_lengths", "window"), log=log)
    total = time.perf_counter() - start
    print(f"fuzz attention{'' if args.forward_only else ' + attention_backward'}, float32 + bfloat16: "
          f"{total:.1f} s, {len(report.runs)} runs, {'PASS' if report.passed else 'NOT PASSED'}")
    print(f"  in the kernel (torch, autograd included): {kernel_s[0]:.1f} s; the rest (checks, conversions): "
          f"{total - kernel_s[0]:.1f} s")
    print("slowest regimes (seconds, all variants and dtypes):")
    for (op, regime), s in sorted(per_regime.items(), key=lambda x: -x[1])[:args.top]:
        print(f"  {s:7.2f}  {op:20s} {regime}")
    if not report.passed:
        print(report)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
