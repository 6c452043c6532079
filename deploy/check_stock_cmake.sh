#!/usr/bin/env bash
# Configures kvarnd with Debian's stock CMake modules, and builds its smallest CUDA target.
#
# The installed cmake-data may carry locally patched modules (`dpkg -V cmake-data` shows
# them); a user's Debian 12 has the stock ones. This downloads the installed cmake-data's
# .deb (apt-get download: no root needed), extracts its Modules/ into a temp dir and puts it
# first on CMAKE_MODULE_PATH, then configures the whole project from scratch in
# build-stockcmake/ (or $KVARN_STOCK_CMAKE_BUILD_DIR; removed first, ccache keeps it cheap).
# With nvcc (where the top-level CMakeLists.txt looks: /usr/local/cuda/bin, $CUDACXX, PATH)
# it requires CUDA (-DKVARN_WITH_CUDA=ON), checks that the stock FindCUDAToolkit.cmake ran,
# and builds kvarn_ipc_test: one .cu through nvcc and an executable linked against
# CUDA::cudart. Without nvcc it configures with the defaults and checks that CUDA is off.
# Extra arguments go to the configure step.
# Needs apt package lists (deploy/setup.sh runs apt-get update when it installs anything).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/ccache_env.sh
start=$(date +%s)
build=${KVARN_STOCK_CMAKE_BUILD_DIR:-build-stockcmake}
jobs=${KVARN_JOBS:-$(nproc)}
fail() { echo "check_stock_cmake: FAILED: $*" >&2; exit 1; }

# The stock modules of the cmake-data that is installed, for the cmake that runs.
version=$(dpkg-query -W -f='${Version}' cmake-data 2>/dev/null || true)
[ -n "$version" ] || fail "cmake-data is not installed from a Debian package (deploy/setup.sh installs cmake)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvarn-stock-cmake.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2016  # a CMake variable, expanded by cmake -P
echo 'message("${CMAKE_ROOT}")' > "$tmp/root.cmake"
cmake_root=$(cmake -P "$tmp/root.cmake" 2>&1)
[ -d "$cmake_root" ] || fail "cannot tell CMAKE_ROOT of $(command -v cmake): $cmake_root"
( cd "$tmp" && apt-get download -q "cmake-data=$version" ) > "$tmp/download.log" 2>&1 || {
  cat "$tmp/download.log" >&2
  fail "apt-get download cmake-data=$version failed (no apt lists? run apt-get update)"
}
dpkg-deb -x "$tmp"/cmake-data_*.deb "$tmp/deb" || fail "cannot extract $(ls "$tmp"/cmake-data_*.deb)"
modules="$tmp/deb/usr/share/$(basename "$cmake_root")/Modules"
[ -f "$modules/FindCUDAToolkit.cmake" ] ||
  fail "cmake-data $version has no $(basename "$cmake_root")/Modules/FindCUDAToolkit.cmake (cmake is $cmake_root)"
patched=$(cd "$tmp/deb" && find usr/share -name '*.cmake' -type f | while read -r f; do
  cmp -s "$f" "/$f" || echo "/$f"; done | paste -sd' ')
echo "check_stock_cmake: stock modules of cmake-data $version in $modules"
[ -z "$patched" ] || echo "check_stock_cmake: installed modules that differ from stock: $patched"

nvcc=
for c in /usr/local/cuda/bin/nvcc "${CUDACXX:-}" "$(command -v nvcc || true)"; do
  if [ -n "$c" ] && [ -x "$c" ] && [ -f "$c" ]; then nvcc=$c; break; fi
done
if [ -n "$nvcc" ]; then
  echo "check_stock_cmake: CUDA present ($nvcc): configure with KVARN_WITH_CUDA=ON, build kvarn_ipc_test"
  cuda=(-DKVARN_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc"
        "--trace-source=$modules/FindCUDAToolkit.cmake" "--trace-redirect=$build/stock-find-cuda.trace")
else
  echo "check_stock_cmake: CUDA absent (no nvcc in /usr/local/cuda/bin, \$CUDACXX or PATH): configure without CUDA"
  cuda=()
fi

rm -rf "$build"
mkdir -p "$build"
log="$build.configure.log"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_MODULE_PATH=$modules" \
  "${cuda[@]}" "$@" > "$log" 2>&1 || {
  cat "$log" >&2
  fail "configuring with the stock CMake modules of cmake-data $version failed (log: $log)"
}
if [ -n "$nvcc" ]; then
  grep -q "kvarn: CUDA kernels enabled" "$log" || { cat "$log" >&2; fail "CUDA was not enabled"; }
  grep -q "FindCUDAToolkit.cmake" "$build/stock-find-cuda.trace" 2>/dev/null ||
    fail "the stock FindCUDAToolkit.cmake was not used (CMAKE_MODULE_PATH=$modules)"
  cmake --build "$build" -j "$jobs" --target kvarn_ipc_test ||
    fail "building kvarn_ipc_test with the stock CMake modules failed"
else
  grep -q "kvarn: CUDA kernels disabled" "$log" || { cat "$log" >&2; fail "expected CUDA to be disabled"; }
fi
echo "check_stock_cmake: passed in $(( $(date +%s) - start )) s"
