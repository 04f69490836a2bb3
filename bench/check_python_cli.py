"""Time the same attention check from Python (NumPy arrays, torch tensors) and from the CLI.

The causal [1, 32, 4096, 128] float32 attention of the cpu_fast backend (inputs N(0, 1), seed 1),
written once as .npy files with a configuration; then, alternating for --rounds rounds, each in a
fresh process:
  cli      oasis-verify compare CONFIG (wall time: start, loading the files, the check, the report)
  numpy    oasis.check on the arrays from np.load (the check alone, and with the loading)
  torch    the same arrays as torch tensors (torch.from_numpy), OpenMP threads as torch set them
  torch-n  the same after torch.set_num_threads(n), n = the CLI's OpenMP threads

Run from the repository root after the build:

    OMP_NUM_THREADS=2 PYTHONPATH=build/python /usr/bin/python3 bench/check_python_cli.py

Importing torch sets the process's OpenMP thread count (libgomp is shared) to torch's own choice,
which the check then uses: the torch row shows what that costs where torch chooses fewer threads.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

NAMES_IN, NAMES_OUT = ("q", "k", "v"), ("out", "lse", "p_null")


def child(mode, folder, threads):
    """One timed check in this process; prints one JSON line."""
    t0 = time.perf_counter()
    if mode.startswith("torch"):
        import torch
        if mode != "torch":
            torch.set_num_threads(threads)
    import oasis
    inp = {n: np.load(os.path.join(folder, n + ".npy")) for n in NAMES_IN}
    out = {n: np.load(os.path.join(folder, n + ".npy")) for n in NAMES_OUT}
    if mode.startswith("torch"):
        inp = {n: torch.from_numpy(a) for n, a in inp.items()}
        out = {n: torch.from_numpy(a) for n, a in out.items()}
    t1 = time.perf_counter()
    r = oasis.check("attention", inp, out, options={"causal": True})
    t2 = time.perf_counter()
    threads_used = torch.get_num_threads() if mode.startswith("torch") else None
    print(json.dumps({"mode": mode, "check_s": t2 - t1, "total_s": t2 - t0, "passed": r.passed,
                      "torch_threads": threads_used}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cli", default=os.path.join("build", "verify", "oasis-verify"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    if a.child:
        child(a.child[0], a.child[1], threads)
        return
    import oasis
    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal((1, 32, 4096, 128)).astype(np.float32) for _ in range(3))
        r = oasis.token_attention(q, k, v, causal=True, backend="cpu_fast")
        for n, x in zip(NAMES_IN + NAMES_OUT, (q, k, v, r["out"], r["lse"], r["p_null"])):
            np.save(os.path.join(folder, n + ".npy"), x)
        cfg = os.path.join(folder, "check.json")
        with open(cfg, "w") as f:
            json.dump({"op": "attention", "inputs": {n: n + ".npy" for n in NAMES_IN},
                       "outputs": {n: n + ".npy" for n in NAMES_OUT}, "options": {"causal": True}}, f)
        print(f"OpenMP threads {threads}; {a.rounds} rounds, each mode in a fresh process")
        for rnd in range(a.rounds):
            t = time.perf_counter()
            rc = subprocess.run([a.cli, "compare", cfg, "--no-progress"], stdout=subprocess.DEVNULL).returncode
            print(f"round {rnd}: cli      wall {time.perf_counter() - t:6.2f} s  (exit {rc})")
            for mode in ("numpy", "torch", f"torch-{threads}"):
                res = subprocess.run([sys.executable, __file__, "--child", mode, folder], capture_output=True, text=True)
                if res.returncode != 0:
                    print(f"round {rnd}: {mode}: failed\n{res.stderr[-2000:]}")
                    continue
                j = json.loads(res.stdout.strip().splitlines()[-1])
                extra = f", torch threads {j['torch_threads']}" if j["torch_threads"] is not None else ""
                print(f"round {rnd}: {mode:8s} check {j['check_s']:6.2f} s, with loading {j['total_s']:6.2f} s"
                      f"  (passed {j['passed']}{extra})")


if __name__ == "__main__":
    main()
