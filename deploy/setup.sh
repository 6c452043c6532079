#!/usr/bin/env bash
# Installs every build, test and run dependency of kvarnd from Debian 12 packages.
# Idempotent and non-interactive; runs apt-get as root (directly, or through sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential g++ clang cmake ninja-build git ccache pkg-config python3
  # clang's sanitizer and libFuzzer runtimes (the sanitizer jobs of deploy/test.sh), and
  # llvm-symbolizer (llvm-14), without which TSan's suppressions by function name match nothing
  libclang-rt-14-dev llvm-14
  # libraries
  libhwy-dev libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libboost-dev libssl-dev openssl
  libmemcached-dev memcached  # the shared tier (daemon/tiers/memcached_tier.h) and the servers its tests start
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # promtool validates the metrics exposition in the tests
  prometheus
  nodejs $(command -v npm >/dev/null || echo npm)  # tests/deploy/k8s; an npm already there (NodeSource's nodejs has one) conflicts with Debian's
  pybind11-dev python3-dev python3-numpy python3-pytest  # the Python package (python/) and its tests
  python3-torch libopenblas0-openmp perl-doc  # kvarn.lm: the model (PyTorch; OpenBLAS, or matmuls run ~15x slower) and its held-out text (perl-doc pod files)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  as_root=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
# The prometheus package ships promtool; its service is never started here.
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
echo "setup: done"
