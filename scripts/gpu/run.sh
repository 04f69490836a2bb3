#!/usr/bin/env bash
# The GPU run of a pack made by scripts/gpu-pack.sh, on the device machine (docs/cuda.md, "GPU
# run"). It needs no cmake, no development packages and no network: the pack holds the CUDA tests
# and benchmarks built for sm_90 and the shared libraries they need beyond the system's and the
# device's own CUDA runtime and cuBLAS.
#
#   PACK/run.sh OUT
#
# Steps (each under its own timeout, cut so that the whole run ends within OASIS_GPU_BUDGET_S,
# default 420 s):
#   files       the pack's checksums, the libraries every binary needs (ldd), glibc / libstdc++
#   device      nvidia-smi and the backend's own availability probe
#   parity      test_parity, test_cuda_host, test_cuda_device (parity of every backend with the
#               oracle, the split-K and tensor-core kernels, the host simulations, the device entry
#               points, the sublayer, the fused AttnRes routing and its backward (test_cuda_device's
#               test_cuda_attn_res.cpp), determinism), each sharded over all cores
#   sanitizer   compute-sanitizer memcheck, racecheck, synccheck, initcheck over a subset of them
#   bench       bench_cuda (the same-run ceilings first and last; each attention configuration
#               validated against the oracle before it is timed)
#   sdpa        torch SDPA (FlashAttention) on the same shapes, when the device's torch is there
# OUT receives summary.txt (printed at the end), device.txt, one log per step, tests/*.json
# (GoogleTest results per shard), parity_margins.txt, sanitizer/*.log, bench_cuda.json,
# sdpa.json and gpu_benchmarks.md (the GPU section of docs/benchmarks.md).
# Exit status: 0 all passed; 1 a test, sanitizer or validation failed; 2 usage or a broken pack;
# 3 no usable CUDA device (after the file checks: the pack itself is checked on any machine).
# OASIS_GPU_DRY_RUN=1 runs every step even without a device (the CUDA tests skip with the reason,
# the benchmarks report it), to check the run step itself on a machine without a GPU; the exit
# status is still 3.
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT" >&2
  exit 2
fi
PACK=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
JOBS=$(nproc)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
DEADLINE=$((SECONDS + ${OASIS_GPU_BUDGET_S:-420}))
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }
budget() {  # budget LIMIT: LIMIT cut to what is left before the deadline
  local left=$((DEADLINE - SECONDS))
  ((left < $1)) && echo "$left" || echo "$1"
}
step() {  # step NAME TIMEOUT_S command...   (output in OUT/NAME.log)
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  if ((limit <= 5)); then
    note "$(printf '%-12s skipped: the time budget is spent' "$name")"
    return 124
  fi
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-12s rc=%-3s %4ss  (log: %s.log)' "$name" "$rc" "$((SECONDS - t0))" "$name")"
  return $rc
}

note "oasis GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) of the pack: $(head -1 "$PACK/PACK_INFO.txt" 2>/dev/null || echo '(no PACK_INFO.txt)')"

# --- files -----------------------------------------------------------------------------------------
if ! (cd "$PACK" && sha256sum --quiet -c MANIFEST.sha256) >"$OUT/files.log" 2>&1; then
  note "files: the pack is incomplete or altered (sha256sum -c MANIFEST.sha256):"
  head -5 "$OUT/files.log" | tee -a "$SUMMARY"
  exit 2
fi
# The device's own CUDA runtime and cuBLAS (the toolkit's lib64), then the pack's libraries.
# A toolkit directory (a path with /cuda) is preferred to copies elsewhere (e.g. Python wheels).
CUDALIB=""
for lib in libcublas.so.13 libcudart.so.13; do
  found=$(find /usr/local /usr/lib /usr/lib64 /opt -name "$lib" 2>/dev/null | awk '/\/cuda/ {print 0, $0; next} {print 1, $0}' |
    sort | head -1 | cut -d' ' -f2-)
  [[ -n $found && ":$CUDALIB:" != *":$(dirname "$found"):"* ]] && CUDALIB="${CUDALIB:+$CUDALIB:}$(dirname "$found")"
done
LIBPATH="$PACK/lib${CUDALIB:+:$CUDALIB}"
# libstdc++ / libgcc_s: the pack's only when the system's lacks the GLIBCXX version the binaries need
# (a newer system libstdc++ is kept: cuBLAS may need it).
need_cxx=$(sed -n 's/^GLIBCXX //p' "$PACK/REQUIRES.txt")
sys_cxx=$( (ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}') )
if [[ -n $need_cxx ]] && { [[ -z $sys_cxx ]] || ! grep -aq "GLIBCXX_$need_cxx" "$sys_cxx"; }; then
  LIBPATH="$PACK/lib/cxx:$LIBPATH"
  note "libstdc++: the pack's (the system's ${sys_cxx:-none} lacks GLIBCXX_$need_cxx)"
else
  note "libstdc++: the system's ($sys_cxx has GLIBCXX_$need_cxx)"
fi
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
need_glibc=$(sed -n 's/^GLIBC //p' "$PACK/REQUIRES.txt")
have_glibc=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]*\.[0-9]*$')
note "glibc: needs $need_glibc, system $have_glibc; CUDA libraries from ${CUDALIB:-(not found under /usr/local, /usr/lib, /opt)}"
missing=0
for exe in "$PACK"/bin/*; do
  if ldd "$exe" 2>&1 | grep -q "not found"; then
    note "files: $(basename "$exe") cannot load: $(ldd "$exe" 2>&1 | grep 'not found' | tr -s ' \t' ' ' | paste -sd ';')"
    missing=1
  fi
done
((missing)) && exit 2
note "files: the pack is complete; every binary finds its libraries"

# --- device ----------------------------------------------------------------------------------------
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv 2>&1 ||
  echo "nvidia-smi unavailable"; } >"$OUT/device.txt"
note "device: $(tail -n +2 "$OUT/device.txt" | head -1)"
# The backend's own probe: the test skips, with the runtime's reason, when no device is usable.
timeout 60 "$PACK/bin/test_cuda_device" --gtest_filter='CudaDeviceApi.EqualsTheHostEntryPointBitwise' \
  >"$OUT/availability.log" 2>&1
no_device=0
if grep -q "SKIPPED" "$OUT/availability.log" || ! grep -q "PASSED  \] 1 test" "$OUT/availability.log"; then
  note "no usable CUDA device: $(grep -o 'cuda is not available.*' "$OUT/availability.log" | head -1)"
  if [[ ${OASIS_GPU_DRY_RUN:-0} == 0 ]]; then
    note "(the pack's files and libraries were checked; nothing else ran)"
    exit 3
  fi
  note "OASIS_GPU_DRY_RUN: every step runs anyway (the CUDA tests skip, the benchmarks report the reason)"
  no_device=1
fi

# --- parity tests, sharded -----------------------------------------------------------------------------
mkdir -p "$OUT/tests"
export RC_PARAMS="seed=20261129 max_success=100" OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
run_sharded() {  # run_sharded BINARY: JOBS shards in parallel, GoogleTest JSON per shard
  local bin=$1 pids=() i
  for ((i = 0; i < JOBS; ++i)); do
    GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$i "$PACK/bin/$bin" \
      --gtest_output="json:$OUT/tests/$bin.$i.json" >"$OUT/tests/$bin.$i.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
parity() {
  local rc=0
  for bin in test_parity test_cuda_host test_cuda_device; do run_sharded "$bin" || rc=1; done
  return $rc
}
export -f run_sharded parity
export PACK OUT JOBS
step parity 240 bash -c parity || status=1
python3 - "$OUT/tests" <<'EOF' | tee -a "$SUMMARY"
import glob, json, sys
tot = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
failed = []
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    for suite in json.load(open(f)).get("testsuites", []):
        for t in suite.get("testsuite", []):
            tot["tests"] += 1
            name = suite["name"] + "." + t["name"]
            if t.get("failures"):
                tot["failed"] += 1
                failed.append(name)
            elif t.get("result") == "SKIPPED":
                tot["skipped"] += 1
            else:
                tot["passed"] += 1
print("parity tests: {tests} run, {passed} passed, {failed} failed, {skipped} skipped".format(**tot))
for n in failed[:20]:
    print("  FAILED " + n)
EOF
shards=$(ls "$OUT"/tests/*.json 2>/dev/null | wc -l)
((shards < 3 * JOBS)) && { note "parity: only $shards of $((3 * JOBS)) shards wrote results (a crash or the timeout)"; status=1; }
grep -h "^\[parity\]" "$OUT"/tests/*.log 2>/dev/null | sort -t' ' -k1,1 >"$OUT/parity_margins.txt"
note "parity margins (worst |err| / allowed, the largest 8 of $(wc -l <"$OUT/parity_margins.txt") checks; all in parity_margins.txt):"
awk '{print $NF, $2, $3}' "$OUT/parity_margins.txt" | sort -g -r | head -8 | sed 's/^/  /' | tee -a "$SUMMARY"

# --- compute-sanitizer over a subset --------------------------------------------------------------------
SAN=$(command -v compute-sanitizer || find /usr/local -name compute-sanitizer -type f 2>/dev/null | head -1)
if [[ -z $SAN ]]; then
  note "sanitizer    skipped: compute-sanitizer not found (PATH, /usr/local)"
else
  mkdir -p "$OUT/sanitizer"
  SUBSET='Backends/AttentionParity.*/cuda_gqa_causal_padded_d64:Backends/AttentionParity.*/cuda_odd_head_sizes'
  SUBSET+=':Backends/RouteParity.*/cuda_oasis_default:Cuda/HalfInputParity.*/bf16_decode_block_d128'
  SUBSET+=':Cuda/SplitKeysParity.*/decode_gqa4_padded_5_splits:Cuda/SplitKeysParity.*/rows_beyond_one_group'
  SUBSET+=':Cuda/SplitKeysParity.*/fully_masked_rows_softmax:Cuda/TensorCoreParity.*/bf16_multi_block_tiles'
  SUBSET+=':Cuda/TensorCoreParity.*/f16_odd_head_sizes:Cuda/TensorCoreParity.*/bf16_multi_block_d128_softmax'
  limit=$(budget 150)
  t0=$SECONDS
  pids=()
  for tool in memcheck racecheck synccheck initcheck; do
    extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    ( timeout "$limit" "$SAN" --tool "$tool" --error-exitcode 1 --print-limit 20 "${extra[@]}" \
        "$PACK/bin/test_parity" --gtest_filter="$SUBSET" >"$OUT/sanitizer/$tool.log" 2>&1 ) &
    pids+=($!)
  done
  i=0
  for tool in memcheck racecheck synccheck initcheck; do
    wait "${pids[$i]}"
    rc=$?
    i=$((i + 1))
    summary_line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer/$tool.log" | tail -1)
    tests_line=$(grep -E "^\[  (PASSED|FAILED)  \]" "$OUT/sanitizer/$tool.log" | head -1)
    note "$(printf 'sanitizer    %-9s rc=%-3s %s %s' "$tool" "$rc" "${summary_line:-no summary}" "$tests_line")"
    ((rc != 0)) && status=1
  done
  note "sanitizer    $((SECONDS - t0))s over $(echo "$SUBSET" | tr ':' '\n' | wc -l) test patterns of test_parity"
fi

# --- benchmarks, then torch SDPA on the same shapes (the GPU otherwise idle) -------------------------------
step bench 150 "$PACK/bin/bench_cuda" --benchmark_min_time=0.05 --benchmark_out="$OUT/bench_cuda.json" \
  --benchmark_out_format=json || status=1
grep -q "VALIDATION FAILED" "$OUT/bench.log" && note "bench: $(grep -m1 'VALIDATION FAILED' "$OUT/bench.log")"
step sdpa 90 python3 "$PACK/sdpa_bench.py" "$OUT/sdpa.json" --min-time 0.2
tail -1 "$OUT/sdpa.log" | sed 's/^/  /' | tee -a "$SUMMARY"
python3 "$PACK/make_table.py" --gpu-summary "$OUT/gpu_benchmarks.md" "$OUT/bench_cuda.json" "$OUT/sdpa.json" \
  2>>"$OUT/sdpa.log" && sed -n '/### GPU targets/,/### GPU, bench_cuda/p' "$OUT/gpu_benchmarks.md" | head -n -1 |
  tee -a "$SUMMARY" >/dev/null
grep -E "^BM_" "$OUT/bench.log" >"$OUT/bench_table.txt" || true

note "total ${SECONDS}s, status $status (0: all passed)"
((no_device)) && exit 3
exit $status
