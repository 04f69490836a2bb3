#!/usr/bin/env bash
# Runs the micro-benchmarks (CPU; GPU when a device and bench/cuda's benchmarks are present) and
# writes docs/benchmarks.md: machine (CPU vendor and model), date, load, the performance targets,
# this host kind's table of ratios (the other kinds' tables already in the file are kept), the
# tables, and the notes (bench/benchmarks_notes.md). Benchmarks are not tests; ctest never runs them. A second run with
# one thread (fast kernels and ceilings only) adds ratios from process CPU time, which a busy
# shared machine distorts less (docs/benchmarks.md, "Measurement conditions").
#
#   scripts/bench.sh                      # build dir: $OASIS_BUILD_DIR or build-bench
#   OASIS_BENCH_THREADS=2 scripts/bench.sh --benchmark_filter=Attention   # extra args go to the CPU binary
#   OASIS_BENCH_ROUNDS=1 scripts/bench.sh  # one round (default 3: the fast kernels and ceilings again)
#   OASIS_GPU_JSON="out/bench_cuda.json out/sdpa.json" scripts/bench.sh     # a GPU run's results (scripts/gpu/run.sh)
#   OASIS_BENCH_ISA=avx2 scripts/bench.sh  # the avx2 kernels against AVX2 ceilings (oasis_bench_cpu_avx2):
#                                          # the ISA of AVX2-only hosts, measured on any AVX2 host
#
# Each fast configuration is validated against the mp50 oracle before it is timed; a failed
# validation stops the run (exit status 2) and leaves docs/benchmarks.md untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${OASIS_BUILD_DIR:-build-bench}
export OASIS_BENCH_THREADS=${OASIS_BENCH_THREADS:-2}
export OMP_NUM_THREADS=$OASIS_BENCH_THREADS
# OASIS_BENCH_ISA: unset, the widest kernels against ceilings built for this machine (-march=native);
# avx2, the avx2 kernels against ceilings built for AVX2 + FMA, its own table of docs/benchmarks.md
BIN=oasis_bench_cpu
isa_kind=""
case "${OASIS_BENCH_ISA:-}" in
  "") ;;
  avx2)
    if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
      echo "bench.sh: OASIS_BENCH_ISA=avx2 needs a CPU with AVX2 and FMA" >&2; exit 2
    fi
    BIN=oasis_bench_cpu_avx2
    export OASIS_CPU_FAST_ISA=avx2
    isa_kind="; avx2 kernels, AVX2 ceilings" ;;
  *) echo "bench.sh: unknown OASIS_BENCH_ISA '$OASIS_BENCH_ISA' (unset, or avx2)" >&2; exit 2 ;;
esac
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "$BIN"
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
if [ "$have_gpu" = 1 ] && cmake --build "$BUILD" --target help | grep -q '^bench_cuda'; then
  cmake --build "$BUILD" -j"$(nproc)" --target bench_cuda   # bench/cuda (CUDA backend's benchmarks)
fi
OUT=${OASIS_BENCH_OUT:-$(mktemp -d)}  # the runs' JSON (OASIS_BENCH_OUT: kept in that folder)
mkdir -p "$OUT"
# the kernels of the per-host-kind table and their ceilings
kernels='Ceiling|Attention_fast/|Attention_fast_kernel/1024|Attention_fast_peaked/|Attention_backward_fast/|Attention_backward_fast_peaked/|Route_fast/'
# a run of other kernels (OASIS_BENCH_ISA) writes only its host table: by default only those kernels
first=("$@")
if [ -n "${OASIS_BENCH_ISA:-}" ] && [ $# = 0 ]; then first=(--benchmark_filter="$kernels"); fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$BUILD/bench/$BIN" --benchmark_min_time=0.05 --benchmark_out="$OUT/cpu.json" \
  --benchmark_out_format=json "${first[@]}"
# the same kernels with one thread (no slow references): ratios from process CPU time, which do
# not depend on what else the machine runs (OASIS_BENCH_SINGLE=0 skips this run)
single=()
if [ "${OASIS_BENCH_SINGLE:-1}" != 0 ]; then
  OASIS_BENCH_THREADS=1 OMP_NUM_THREADS=1 "$BUILD/bench/$BIN" --benchmark_min_time=0.05 \
    --benchmark_filter='Ceiling|RowNormalizer|Attention_fast/|Attention_fast_kernel/|Attention_fast_peaked/|Attention_backward_fast/|Attention_backward_fast_peaked/|Route_fast/|Layer_attnres' \
    --benchmark_out="$OUT/cpu1.json" --benchmark_out_format=json
  single=(--single "$OUT/cpu1.json")
fi
# further rounds of the kernels of the per-host-kind table and their ceilings (OASIS_BENCH_ROUNDS in
# all, default 3): on a shared machine one round's rates can be a fraction of the same kernel's a
# minute later; the table takes the best of the rounds on each side of every ratio
rounds=()
for r in $(seq 2 "${OASIS_BENCH_ROUNDS:-3}"); do
  "$BUILD/bench/$BIN" --benchmark_min_time=0.05 --benchmark_filter="$kernels" \
    --benchmark_out="$OUT/cpu_r$r.json" --benchmark_out_format=json >/dev/null
  rounds+=(--round "$OUT/cpu_r$r.json")
  if [ "${OASIS_BENCH_SINGLE:-1}" != 0 ]; then
    OASIS_BENCH_THREADS=1 OMP_NUM_THREADS=1 "$BUILD/bench/$BIN" --benchmark_min_time=0.05 \
      --benchmark_filter="$kernels" --benchmark_out="$OUT/cpu1_r$r.json" --benchmark_out_format=json >/dev/null
    rounds+=(--single-round "$OUT/cpu1_r$r.json")
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
gpu_json=()
# GPU results measured elsewhere (the device machine's scripts/gpu/run.sh OUT: bench_cuda.json, sdpa.json)
for j in ${OASIS_GPU_JSON:-}; do gpu_json+=("$j"); done
if [ "$have_gpu" = 1 ] && [ -d "$BUILD/bench/cuda" ]; then
  for exe in "$BUILD"/bench/cuda/*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    "$exe" --benchmark_min_time=0.05 --benchmark_out="$OUT/$(basename "$exe").json" --benchmark_out_format=json
    gpu_json+=("$OUT/$(basename "$exe").json")
  done
fi
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
cpu_field() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
# the host kind names one table of docs/benchmarks.md ("Ratios per host kind"): vendor, model name,
# family and model (a VM's model name can hide the generation; family and model do not)
cpu_vendor=$(cpu_field vendor_id)
host_kind="$cpu_model ($cpu_vendor, family $(cpu_field 'cpu family'), model $(cpu_field model))$isa_kind"
gpu_name=$( (nvidia-smi -L 2>/dev/null || true) | head -1)
python3 bench/make_table.py ${OASIS_BENCH_ISA:+--host-table-only} docs/benchmarks.md bench/benchmarks_notes.md "$OUT/cpu.json" "${single[@]}" "${rounds[@]}" "${gpu_json[@]}" -- \
  "date (UTC)=$(date -u '+%Y-%m-%d %H:%M')" \
  "host kind=$host_kind" \
  "machine=$cpu_model, $(nproc) logical CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM${gpu_name:+; GPU: $gpu_name}" \
  "compiler=$(${CXX:-c++} --version | head -1)" \
  "threads=$OASIS_BENCH_THREADS (OpenMP and Eigen)" \
  "load average (1, 5, 15 min) before / after=$load_before / $load_after" \
  "command=${OASIS_BENCH_ISA:+OASIS_BENCH_ISA=$OASIS_BENCH_ISA }OASIS_BENCH_THREADS=$OASIS_BENCH_THREADS OASIS_BENCH_ROUNDS=${OASIS_BENCH_ROUNDS:-3} scripts/bench.sh $*" \
  "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet -- src bench include 2>/dev/null || echo ' (with local changes)')"
echo "wrote docs/benchmarks.md${OASIS_BENCH_ISA:+ (the host table of $OASIS_BENCH_ISA only)}"
