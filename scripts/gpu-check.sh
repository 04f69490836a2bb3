#!/usr/bin/env bash
# GPU check of the CUDA backend, for a machine with an NVIDIA GPU (H100/H200: sm_90).
#
#   bash scripts/gpu-check.sh LOGDIR
#
# Configures a Release build with CUDA, builds the CUDA parity tests and benchmarks, runs them and
# writes every log to LOGDIR (summary.txt first). Designed to finish in under 8 minutes on 16
# cores: only the needed targets are built, benchmarks run with a short minimum time, and each
# step has its own timeout. Exit status: non-zero if the build or any parity test fails, or if no
# CUDA device is usable (the tests would only skip).
# Environment: OASIS_BUILD_DIR (default build-gpu), OASIS_CUDA_ARCHITECTURES (default 90).
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 LOGDIR" >&2
  exit 2
fi
LOG=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
BUILD=${OASIS_BUILD_DIR:-build-gpu}
ARCHS=${OASIS_CUDA_ARCHITECTURES:-90}
JOBS=$(nproc)
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }
DEADLINE=$((SECONDS + 460))  # the whole check stays under 8 minutes, whatever the steps' limits
step() {  # step NAME TIMEOUT_S command...  (the timeout is cut to what is left before DEADLINE)
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit <= 5)); then
    note "$(printf '%-18s skipped: the 8-minute budget is spent' "$name")"
    return 124
  fi
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-18s rc=%-3s %4ss  (log: %s.log)' "$name" "$rc" "$((SECONDS - t0))" "$name")"
  return $rc
}

note "oasis gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "nvidia-smi unavailable"; } >"$LOG/device.txt"
note "device: $(tail -n +2 "$LOG/device.txt" | head -1)"
note "nvcc: $(nvcc --version 2>/dev/null | tail -1)"

step configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOASIS_ENABLE_CUDA=ON \
  -DOASIS_CUDA_ARCHITECTURES="$ARCHS" -DOASIS_BUILD_TESTS=ON -DOASIS_BUILD_BENCH=ON -DOASIS_BUILD_CUDA_EMU=OFF || { note "configure failed"; exit 1; }

TARGETS=(test_cuda_host test_cuda_device test_cuda_parity)
HAVE_BENCH=0
if cmake --build "$BUILD" --target help 2>/dev/null | grep -q '^bench_cuda:'; then
  TARGETS+=(bench_cuda)
  HAVE_BENCH=1
else
  note "bench_cuda target missing: bench/CMakeLists.txt must add_subdirectory(cuda) when OASIS_HAVE_CUDA"
fi
step build 300 cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" || { note "build failed"; exit 1; }

# Is a device usable? Without one every CUDA test skips with the reason.
timeout 30 "$BUILD/tests/cuda/test_cuda_device" --gtest_filter='CudaDeviceApi.*' >"$LOG/availability.log" 2>&1
if grep -q "SKIPPED" "$LOG/availability.log"; then
  note "no usable CUDA device: $(grep -o 'backend cuda is not available.*' "$LOG/availability.log" | head -1)"
  status=1
fi

# The CUDA family (tests/cuda): parity over every backend, CUDA-only parity, host checks. -V keeps
# each test's output, including the [parity] lines with the realised errors and margins.
step parity_tests 200 ctest --test-dir "$BUILD" -L parity -R 'Cuda|Backends|SimulatedKernel|RandomShape' -V \
  -j"$JOBS" --timeout 150 || status=1
grep -E "tests passed|tests failed|Total Test time" "$LOG/parity_tests.log" | tee -a "$SUMMARY"
note "skipped tests: $(grep -c '\*\*\*Skipped' "$LOG/parity_tests.log" || true) (a backend that is unavailable skips with its reason)"
grep -E "\[parity\]" "$LOG/parity_tests.log" | sed 's/^[0-9]*: //' | sort >"$LOG/parity_margins.txt" || true

if [[ $HAVE_BENCH -eq 1 ]]; then
  step bench 120 "$BUILD/bench/cuda/bench_cuda" --benchmark_min_time=0.05 \
    --benchmark_out="$LOG/bench_cuda.json" --benchmark_out_format=json || status=1
  grep -E "^BM_" "$LOG/bench.log" | tee -a "$SUMMARY" >/dev/null
  grep -E "^BM_" "$LOG/bench.log" >"$LOG/bench_table.txt" || true
fi
note "total ${SECONDS}s, status $status"
exit $status
