#!/usr/bin/env bash
# Install the Debian packages the project needs, when missing. Idempotent; run as root
# (or with sudo) on Debian 12. The CUDA toolkit is optional and never installed here. The Python
# packages build the module oasis (docs/python.md); python3-torch is needed only by its torch
# tests and examples, which skip without it.
#   --test  also what only the test suite needs: chromium (the HTML report test opens the pages in
#           headless Chromium) and python3-matplotlib (the PNGs of `oasis-verify figures`); their
#           tests skip without them. scripts/run-tests.sh passes it; the main job does not.
set -euo pipefail
pkgs=(build-essential cmake ninja-build git
      libeigen3-dev libboost-dev libmpfr-dev libgmp-dev libomp-dev
      libgtest-dev libgmock-dev googletest librapidcheck-dev libbenchmark-dev
      clang libclang-rt-14-dev python3
      python3-dev pybind11-dev python3-numpy python3-pytest python3-torch)
for arg in "$@"; do
  case "$arg" in
    --test) pkgs+=(chromium python3-matplotlib) ;;
    *) echo "install-deps: unknown option '$arg' (known: --test)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
