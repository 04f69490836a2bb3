#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build (Release), run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${OASIS_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$(nproc)"
if [ -x "$BUILD/verify/oasis-verify" ]; then
  exec "$BUILD/verify/oasis-verify" "$@"
else
  exec "$BUILD/examples/demo/oasis-demo"
fi
