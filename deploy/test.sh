#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test: unit, property,
# conformance (golden vectors), integration (kvarnd and client processes, the attacker, a
# short chaos run), metrics (promtool); then the sanitizer jobs: ASan+UBSan with the
# fuzzers on their corpora, and TSan (deploy/sanitize.sh). GPU tests skip cleanly where
# there is no device.
#
#   KVARN_TEST_SANITIZERS=0   skip the sanitizer jobs (the release tests only)
#   KVARN_TEST_STOCK_CMAKE=0  skip configuring with Debian's stock CMake modules and building
#                             one CUDA target with them (deploy/check_stock_cmake.sh)
#   KVARN_FUZZ_SECONDS=N      seconds per fuzz target in the ASan job (default 30)
#   KVARN_TEST_HUGE_PAGES=N   huge pages to add to the machine's pool for the tests of huge_pages
#                             (default 64, i.e. 128 MiB on x86-64), as root only, taken back at
#                             the end; 0 adds none (without available huge pages those tests
#                             check only the refusals and the fallback)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# ccache's hit and miss counters, to print what the builds took from the cache (none before
# deploy/setup.sh installs ccache on a fresh machine).
ccache_counts() {
  { ccache --print-stats 2>/dev/null || true; } | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ { h += $2 }
    $1 == "cache_miss" { m = $2 } END { print h + 0, m + 0 }'
}
read -r hits0 misses0 <<< "$(ccache_counts)"
deploy/build.sh "$@"
build=${KVARN_BUILD_DIR:-build}
if [ "${KVARN_TEST_STOCK_CMAKE:-1}" != 0 ]; then
  echo "== stock cmake modules: configure and build a CUDA target (deploy/check_stock_cmake.sh)"
  deploy/check_stock_cmake.sh
  echo "== stock cmake modules: passed after $(( $(date +%s) - start )) s"
fi
# Huge pages for the huge_pages tests (tests/integration/huge_pages_test.cc and others): added
# to the machine's pool for the run, and taken back on exit.
hugepages=/proc/sys/vm/nr_hugepages
add_huge=${KVARN_TEST_HUGE_PAGES:-64}
if ! [[ $add_huge =~ ^[0-9]+$ ]]; then
  echo "KVARN_TEST_HUGE_PAGES must be a number of pages, not '$add_huge'" >&2
  exit 2
fi
huge_available() { awk '/^HugePages_Free/ { f = $2 } /^HugePages_Rsvd/ { r = $2 } END { print f - r }' /proc/meminfo; }
if [ "$add_huge" != 0 ] && [ -w "$hugepages" ] && [ "$(id -u)" = 0 ]; then
  huge_before=$(cat "$hugepages")
  echo $((huge_before + add_huge)) > "$hugepages" || true
  huge_added=$(( $(cat "$hugepages") - huge_before ))
  # Take back what was added, whatever else changed the pool meanwhile.
  trap 'echo $(( $(cat "$hugepages") - huge_added )) > "$hugepages" 2>/dev/null || true' EXIT
  echo "== huge pages: $huge_added added (vm.nr_hugepages $huge_before -> $(cat "$hugepages")), $(huge_available) available"
else
  echo "== huge pages: none added (KVARN_TEST_HUGE_PAGES=$add_huge; needs root and a writable $hugepages), $(huge_available) available"
fi
echo "== release: tests"
ctest --test-dir "$build" --output-on-failure -j "${KVARN_JOBS:-$(nproc)}" --timeout 600
echo "== release: passed after $(( $(date +%s) - start )) s"
if [ "${KVARN_TEST_SANITIZERS:-1}" != 0 ]; then
  deploy/sanitize.sh asan
  echo "== asan: passed after $(( $(date +%s) - start )) s"
  deploy/sanitize.sh tsan
  echo "== tsan: passed after $(( $(date +%s) - start )) s"
fi
read -r hits1 misses1 <<< "$(ccache_counts)"
echo "== ccache: $((hits1 - hits0)) compilations from the cache, $((misses1 - misses0)) compiled"
echo "== all tests passed in $(( $(date +%s) - start )) s (wall clock)"
