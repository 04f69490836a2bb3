#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, run the whole test suite with ctest
# (unit, property, proof, parity, package), then the sanitizer lane (scripts/sanitize.sh: an
# ASan + UBSan build of the core, model, loader and emulator tests in build-sanitize/; skip it
# with OASIS_SANITIZE=0). Exit status is non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test  # also chromium and matplotlib, for the report and figure tests
BUILD=${OASIS_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" "$@"
if [ "${OASIS_SANITIZE:-1}" != 0 ]; then
  bash scripts/sanitize.sh "${OASIS_SANITIZE_BUILD_DIR:-$BUILD-sanitize}"
fi
