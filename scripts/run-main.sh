#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build (Release) only what the main job runs —
# oasis-verify and the libraries it links — and run it. The tests, benchmarks, the CUDA emulator
# and the Python module are built by the test command (scripts/run-tests.sh) in the same build
# folder, which reuses everything built here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${OASIS_BUILD_DIR:-build}
start=$SECONDS
echo "run-main: configuring $BUILD (Release)"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
grep -E '^-- oasis:' "$BUILD/configure.log" | sed 's/^-- /run-main: /'
target=oasis-verify
grep -q 'OASIS_BUILD_VERIFY:BOOL=OFF' "$BUILD/CMakeCache.txt" && target=oasis-demo
todo=$(ninja -C "$BUILD" -n "$target" 2>/dev/null | grep -c '^\[' || true)
echo "run-main: building $target: $todo steps (the oracle's instances for float, double, long double and"
echo "          50-digit scalars, the fast CPU path, the compare engine, the paper's checks), $(nproc) jobs"
cmake --build "$BUILD" --target "$target" -j"$(nproc)"
echo "run-main: built in $((SECONDS - start)) s; running $target"
if [ "$target" = oasis-verify ]; then
  exec "$BUILD/verify/oasis-verify" "$@"
else
  exec "$BUILD/examples/demo/oasis-demo"
fi
