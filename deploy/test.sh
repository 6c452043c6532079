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
#   KVARN_FUZZ_SECONDS=N      seconds per fuzz target in the ASan job (default 60)
#   KVARN_TEST_HUGE_PAGES=N   huge pages to reserve for the tests of huge_pages (default 32, i.e.
#                             64 MiB on x86-64), run as root only, given back at the end; 0 skips
#                             (those tests then check only the refusals and the fallback)
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
# Huge pages for the huge_pages tests (tests/integration/huge_pages_test.cc): reserved on top
# of what the machine has, and the old count restored on exit.
hugepages=/proc/sys/vm/nr_hugepages
want_huge=${KVARN_TEST_HUGE_PAGES:-32}
if [ "$want_huge" != 0 ] && [ -w "$hugepages" ] && [ "$(id -u)" = 0 ]; then
  huge_before=$(cat "$hugepages")
  trap 'echo "$huge_before" > "$hugepages"' EXIT
  echo $((huge_before + want_huge)) > "$hugepages" || true
  echo "== huge pages: $(awk '/^HugePages_Free/ { print $2 }' /proc/meminfo) free for the tests (vm.nr_hugepages $huge_before -> $(cat "$hugepages"))"
else
  echo "== huge pages: none reserved (KVARN_TEST_HUGE_PAGES=$want_huge, root and a writable $hugepages needed); their tests check only refusals"
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
