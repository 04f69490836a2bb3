#!/usr/bin/env bash
# Fuzz with libFuzzer + ASan:
#   scripts/fuzz-loaders.sh [SECONDS] [WORKDIR] [TARGET]     (default 20 s, build-fuzz/, loaders)
# TARGET loaders: the tensor-file loaders (oasis/io: safetensors, .npy, JSON), header-only;
# TARGET model: the model-weights loader and the compare configuration (tests/verify/fuzz_model.cpp),
#   linked with the libraries of an existing build ($OASIS_BUILD_DIR, default build/; build the
#   targets oasis and oasis_verify first).
# Needs clang++ (clang-14) and libclang-rt-14-dev (both in scripts/install-deps.sh). ctest runs
# the same targets for 10 s each under the label "fuzz" (tests/verify/CMakeLists.txt). A crash
# leaves a reproducer crash-* in WORKDIR; rerun it with: WORKDIR/fuzz_<TARGET> WORKDIR/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-20}
WORK=${2:-build-fuzz}
TARGET=${3:-loaders}
CXX_FUZZ=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++ || true)}
if [ -z "$CXX_FUZZ" ]; then
  echo "fuzz-loaders: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi
mkdir -p "$WORK/corpus-$TARGET"
case "$TARGET" in
  loaders)
    "$CXX_FUZZ" -std=c++17 -O1 -g -fsanitize=fuzzer,address -Iinclude -I/usr/include/eigen3 \
      tests/verify/fuzz_loaders.cpp -o "$WORK/fuzz_loaders"
    cp tests/verify/fuzz_corpus/* "$WORK/corpus-$TARGET/" 2>/dev/null || true
    RSS=512 ;;
  model)
    BUILD=${OASIS_BUILD_DIR:-build}
    for lib in "$BUILD/src/verify/liboasis_verify.a" "$BUILD/liboasis.a"; do
      [ -f "$lib" ] || { echo "fuzz-loaders: $lib missing (cmake --build $BUILD --target oasis_verify)" >&2; exit 2; }
    done
    "$CXX_FUZZ" -std=c++17 -O1 -g -fsanitize=fuzzer,address -Iinclude -I/usr/include/eigen3 \
      -DOASIS_COMPILED_INSTANCES -DOASIS_HAVE_MPFR tests/verify/fuzz_model.cpp \
      "$BUILD/src/verify/liboasis_verify.a" "$BUILD/liboasis.a" -lmpfr -lgmp -lgomp -lpthread -o "$WORK/fuzz_model"
    cp tests/verify/fuzz_model_corpus/* "$WORK/corpus-$TARGET/" 2>/dev/null || true
    export OMP_NUM_THREADS=1
    RSS=1024 ;;
  *) echo "fuzz-loaders: unknown TARGET '$TARGET' (loaders or model)" >&2; exit 2 ;;
esac
# -rss_limit_mb: a loader that allocated from a lying header would exceed it and fail the run.
"$WORK/fuzz_$TARGET" "$WORK/corpus-$TARGET" -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb="$RSS" -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$WORK/"
