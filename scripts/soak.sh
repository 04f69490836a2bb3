#!/usr/bin/env bash
# Soak the property and parity families with fresh random seeds, beyond CI's fixed one:
#   scripts/soak.sh MINUTES [BUILD_DIR]        (default 10 minutes, build/; the build must exist)
# Rounds repeat until MINUTES have passed (a round started in time is finished). Each round draws a seed S, prints it, and runs every
# test labelled "property" or "parity" (one process per test program, its ctest filter) with
#   RC_PARAMS="seed=S max_success=100"   (rapidcheck; ctest pins seed=20261129)
#   OASIS_TEST_SEED=S                    (tests/support/oasis_random.hpp, make_rng)
# A failing round prints the seed, the failing programs and the command that reruns them; a
# failing parity or property check also leaves a replay (tests/support/replay.hpp) under
# $OASIS_REPLAY_DIR (default BUILD_DIR/replay) with the `oasis-verify compare` command that
# replays its verdict. Exit status 1 if any round failed.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-10}
BUILD=${2:-build}
if ! [[ "$MINUTES" =~ ^[0-9]+$ ]]; then echo "soak: MINUTES must be a non-negative integer, got '$MINUTES'" >&2; exit 2; fi
if [ ! -f "$BUILD/CTestTestfile.cmake" ]; then echo "soak: no test build in '$BUILD' (build it first)" >&2; exit 2; fi
export OASIS_REPLAY_DIR=${OASIS_REPLAY_DIR:-$BUILD/replay}
exec /usr/bin/python3 - "$MINUTES" "$BUILD" <<'EOF'
import json, os, random, subprocess, sys, time
minutes, build = int(sys.argv[1]), sys.argv[2]
spec = json.loads(subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", "-L", "property|parity"],
                                 check=True, capture_output=True, text=True).stdout)
# one run per program: the union of its tests' --gtest_filter patterns; its ctest environment
programs = {}
for t in spec.get("tests", []):
    cmd = t.get("command") or []
    if not cmd:
        continue
    env = {}
    for p in t.get("properties", []):
        if p["name"] == "ENVIRONMENT":
            for kv in p["value"]:
                k, _, v = kv.partition("=")
                env[k] = v
    filters = [a.split("=", 1)[1] for a in cmd[1:] if a.startswith("--gtest_filter=")]
    other = [a for a in cmd[1:] if not a.startswith("--gtest_filter=")]
    key = (cmd[0], tuple(other))
    prog = programs.setdefault(key, {"filters": [], "env": env})
    prog["filters"] += filters
if not programs:
    sys.exit("soak: no tests labelled property or parity in " + build)
print(f"soak: {len(programs)} programs, {sum(len(p['filters']) for p in programs.values())} tests, {minutes} min")
deadline, rounds, failed = time.time() + 60 * minutes, 0, []
while True:
    seed = random.SystemRandom().randrange(1, 2**31)
    rounds += 1
    print(f"soak: round {rounds} seed {seed}", flush=True)
    t0 = time.time()
    for (exe, other), prog in sorted(programs.items()):
        env = dict(os.environ, **prog["env"])
        env["RC_PARAMS"] = f"seed={seed} max_success=100"
        env["OASIS_TEST_SEED"] = str(seed)
        cmd = [exe, *other] + ([f"--gtest_filter={':'.join(prog['filters'])}"] if prog["filters"] else [])
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            failed.append((seed, exe))
            print(r.stdout[-6000:] + r.stderr[-2000:])
            print(f"soak: FAILED {os.path.basename(exe)} with seed {seed}; rerun: "
                  f"RC_PARAMS='seed={seed} max_success=100' OASIS_TEST_SEED={seed} {' '.join(cmd)}", flush=True)
    print(f"soak: round {rounds} seed {seed} done ({time.time() - t0:.0f} s)", flush=True)
    if time.time() > deadline:
        break
print(f"soak: {rounds} rounds, {len(failed)} failures" + "".join(f"\n  seed {s}: {e}" for s, e in failed))
sys.exit(1 if failed else 0)
EOF
