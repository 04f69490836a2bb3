#!/usr/bin/env bash
# Fuzz the tensor-file loaders (oasis/io: safetensors, .npy, JSON) with libFuzzer + ASan.
#   scripts/fuzz-loaders.sh [SECONDS] [WORKDIR]     (default 20 s, build-fuzz/)
# Needs clang++ (clang-14) and libclang-rt-14-dev (both in scripts/install-deps.sh). ctest runs
# the same target for 10 s under the label "fuzz" (tests/verify/CMakeLists.txt). A crash leaves a
# reproducer crash-* in WORKDIR; rerun it with: WORKDIR/fuzz_loaders WORKDIR/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-20}
WORK=${2:-build-fuzz}
CXX_FUZZ=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++ || true)}
if [ -z "$CXX_FUZZ" ]; then
  echo "fuzz-loaders: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi
mkdir -p "$WORK/corpus"
"$CXX_FUZZ" -std=c++17 -O1 -g -fsanitize=fuzzer,address -Iinclude -I/usr/include/eigen3 \
  tests/verify/fuzz_loaders.cpp -o "$WORK/fuzz_loaders"
cp tests/verify/fuzz_corpus/* "$WORK/corpus/" 2>/dev/null || true
# -rss_limit_mb: a loader that allocated from a lying header would exceed it and fail the run.
"$WORK/fuzz_loaders" "$WORK/corpus" -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=512 -timeout=5 \
  -print_final_stats=1 -artifact_prefix="$WORK/"
