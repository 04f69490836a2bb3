#!/usr/bin/env bash
# The sanitizer lane: an AddressSanitizer + UndefinedBehaviorSanitizer build (-O1, no CUDA
# toolkit, no MPFR, no benchmarks or Python) of the test programs of the core, model, file-loader
# and emulator families, then their tests. scripts/run-tests.sh runs it after the main suite
# unless OASIS_SANITIZE=0.
#   scripts/sanitize.sh [BUILD_DIR]          (default build-sanitize)
# Families and why (the lane must fit CI's 30 minutes on 2 cores with the main build):
#   core    test_core_normalizer, test_core_attention, test_core_coupling: the oracle's kernels
#   model   test_model_structure, test_model_io: the model and the weights loader
#   verify  verify_io_tests: the safetensors / .npy / JSON readers on malformed input (the
#           compare engine, oasis_verify, is left out: its multiprecision translation units
#           alone take longer than the lane's budget; the fuzz smoke runs it under ASan)
#   emu     test_cuda_emu: the emulator itself (fibers, barriers, shuffles, wmma); the CUDA
#           parity tests on the emulator already run under ASan in the main suite
#           (emu.asan.parity_and_device)
# Built without precompiled headers (cmake/OasisPch.cmake): the files it compiles (src/core,
# src/cpu_fast and the tests above) are also checked to include what they use.
# Any sanitizer report fails its test (halt_on_error). Leak checking is on except for the
# emulator, whose fibers abandoned after a reported fault keep their frames (by design).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-sanitize}
JOBS=${OASIS_SANITIZE_JOBS:-$(nproc)}
FLAGS="-O1 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DOASIS_ENABLE_CUDA=OFF -DOASIS_WITH_MPFR=OFF \
  -DOASIS_BUILD_BENCH=OFF -DOASIS_BUILD_PYTHON=OFF -DOASIS_BUILD_CUDA_EMU=ON -DOASIS_BUILD_VERIFY=OFF \
  -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON > /dev/null
TARGETS=(test_core_normalizer test_core_attention test_core_coupling test_model_structure test_model_io
         verify_io_tests test_cuda_emu)
start=$(date +%s)
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"
built=$(date +%s)
# The programs run directly (the ctest entries of the whole tree are not all built here), with
# the environment ctest gives them (tests/CMakeLists.txt: cmake/OasisTesting.cmake).
export RC_PARAMS="seed=20261129 max_success=100" OMP_WAIT_POLICY=passive
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
run() {  # run NAME DIR ASAN_OPTIONS
  local t0=$(date +%s)
  if ASAN_OPTIONS="$3" "$BUILD/tests/$2/$1" --gtest_brief=1 > "$BUILD/sanitize-$1.log" 2>&1; then
    echo "sanitize: $1 passed ($(($(date +%s) - t0)) s)"
  else
    echo "sanitize: $1 FAILED ($(($(date +%s) - t0)) s); its output:"; tail -n 80 "$BUILD/sanitize-$1.log"; status=1
  fi
}
LEAKS=detect_leaks=1:abort_on_error=0
run test_core_normalizer core $LEAKS
run test_core_attention core $LEAKS
run test_core_coupling core $LEAKS
run test_model_structure model $LEAKS
run test_model_io model $LEAKS
run verify_io_tests verify $LEAKS
run test_cuda_emu cuda detect_leaks=0:abort_on_error=0
echo "sanitize: build $((built - start)) s, tests $(($(date +%s) - built)) s"
exit $status
