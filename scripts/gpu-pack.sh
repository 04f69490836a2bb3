#!/usr/bin/env bash
# Packs the CUDA tests and benchmarks for a GPU machine that has the CUDA driver, toolkit
# libraries (cudart, cuBLAS) and python3, but no compiler toolchain for this project, no
# development packages and no network (docs/cuda.md, "GPU run").
#
#   scripts/gpu-pack.sh [DIR]        # DIR defaults to gpu-pack (ignored by git)
#
# Configures and builds (Release, OASIS_ENABLE_CUDA=ON, sm_${OASIS_CUDA_ARCHITECTURES:-90}, in
# ${OASIS_PACK_BUILD_DIR:-build-gpu-pack}) test_parity, test_cuda_host, test_cuda_device and
# bench_cuda, then writes into DIR:
#   bin/        the four programs (stripped)
#   lib/        the shared libraries they need beyond glibc and the device's CUDA libraries
#               (found with ldd: libmpfr, libgmp, libbenchmark, libgomp, ...)
#   lib/cxx/    libstdc++ and libgcc_s, used on the device only when its own are older
#   run.sh      the run step (scripts/gpu/run.sh), sdpa_bench.py, make_table.py
#   REQUIRES.txt the newest GLIBC and GLIBCXX symbol versions the programs and libraries use
#   PACK_INFO.txt the commit, the toolchain and the build's flags
#   MANIFEST.sha256 every file's checksum (run.sh checks it first)
# The pack must stay well under 64 MiB (the device machine's carry limit); the script fails
# otherwise. The tests read no files from the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu-pack}
BUILD=${OASIS_PACK_BUILD_DIR:-build-gpu-pack}
ARCHS=${OASIS_CUDA_ARCHITECTURES:-90}
LIMIT_MIB=48
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOASIS_ENABLE_CUDA=ON -DOASIS_CUDA_ARCHITECTURES="$ARCHS" \
  -DOASIS_BUILD_TESTS=ON -DOASIS_BUILD_BENCH=ON -DOASIS_BUILD_CUDA_EMU=OFF -DOASIS_BUILD_PYTHON=OFF \
  -DOASIS_BUILD_VERIFY=OFF "${launcher[@]}" >/dev/null
PROGRAMS=(tests/parity/test_parity tests/cuda/test_cuda_host tests/cuda/test_cuda_device bench/cuda/bench_cuda)
cmake --build "$BUILD" -j"$(nproc)" --target "${PROGRAMS[@]##*/}"

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib/cxx"
for p in "${PROGRAMS[@]}"; do
  cp "$BUILD/$p" "$DIR/bin/"
  strip --strip-unneeded "$DIR/bin/${p##*/}"
done

# Shared libraries: glibc's and the CUDA driver's / toolkit's stay the device's; libstdc++ and
# libgcc_s go to lib/cxx (run.sh decides); the rest is copied under its soname.
is_system() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
      libresolv.so.* | libutil.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnvidia-*.so.* | libnvrtc*.so.*) return 0 ;;
  esac
  return 1
}
copy_deps() {  # copy_deps FILE: the non-system libraries FILE needs, recursively
  ldd "$1" | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | while read -r soname path; do
    is_system "$soname" && continue
    local dest="$DIR/lib"
    case "$soname" in libstdc++.so.* | libgcc_s.so.*) dest="$DIR/lib/cxx" ;; esac
    [[ -e $dest/$soname ]] && continue
    cp -L "$path" "$dest/$soname"
    copy_deps "$path"
  done
}
for exe in "$DIR"/bin/*; do
  if ldd "$exe" | grep -q "not found"; then
    echo "gpu-pack: $exe cannot resolve its libraries here:" >&2
    ldd "$exe" | grep "not found" >&2
    exit 1
  fi
  copy_deps "$exe"
done
strip --strip-unneeded "$DIR"/lib/*.so* "$DIR"/lib/cxx/*.so* 2>/dev/null || true

# The newest glibc / libstdc++ symbol versions the programs and the packed libraries use.
newest() { objdump -T "$DIR"/bin/* "$DIR"/lib/*.so* 2>/dev/null | grep -o "$1_[0-9][0-9.]*" | sed "s/^$1_//" | sort -V | tail -1; }
{
  echo "GLIBC $(newest GLIBC)"
  echo "GLIBCXX $(newest GLIBCXX)"
} >"$DIR/REQUIRES.txt"

cp scripts/gpu/run.sh "$DIR/run.sh"
cp scripts/gpu/sdpa_bench.py bench/make_table.py "$DIR/"
chmod +x "$DIR/run.sh" "$DIR/sdpa_bench.py"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src include tests bench scripts 2>/dev/null || echo ' (with local changes)'), packed $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "architectures: sm_$ARCHS; nvcc: $(nvcc --version | tail -1); CXX: $(c++ --version | head -1)"
  echo "CUDA flags: $(grep -m1 '^CMAKE_CUDA_FLAGS:' "$BUILD/CMakeCache.txt" | cut -d= -f2-) + OASIS_NVCC_FLAGS (--fmad=false)"
  echo "system: $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | grep -o '[0-9]*\.[0-9]*$')"
  echo "libraries in lib/: $(cd "$DIR/lib" && ls -- *.so* 2>/dev/null | paste -sd ' ')"
  echo "libraries in lib/cxx/: $(cd "$DIR/lib/cxx" && ls 2>/dev/null | paste -sd ' ')"
} >"$DIR/PACK_INFO.txt"
(cd "$DIR" && find . -type f ! -name MANIFEST.sha256 -printf '%P\n' | sort | xargs sha256sum >MANIFEST.sha256)

size=$(du -sb "$DIR" | cut -f1)
mib=$(((size + 1048575) / 1048576))
if ((mib > LIMIT_MIB)); then
  echo "gpu-pack: $DIR is $mib MiB, over the $LIMIT_MIB MiB this pack may take (the carry limit is 64 MiB)" >&2
  exit 1
fi
echo "gpu-pack: wrote $DIR ($mib MiB): $(ls "$DIR/bin" | paste -sd ' '); $(cat "$DIR/REQUIRES.txt" | paste -sd ', ')"
echo "gpu-pack: on the device machine run: $DIR/run.sh OUT"
