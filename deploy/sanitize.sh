#!/usr/bin/env bash
# The sanitizer jobs of CI (and of deploy/test.sh), each in its own build directory with
# clang, building only what the job needs:
#
#   deploy/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer (every report
#                             fatal): core, service, metrics, client and integration tests
#                             (kvarnd and its helper processes run instrumented too) and the
#                             install test; then the libFuzzer targets on their seed corpora
#                             (KVARN_FUZZ_SECONDS each, default 30: four targets, two minutes).
#   deploy/sanitize.sh tsan   ThreadSanitizer: everything that runs threads: the core's
#                             concurrency tests, the service under concurrent clients (Watch
#                             hub, keep-alive reactors, descriptor channel), the client's
#                             keep-alive thread, and the integration tests.
#
# Zero reports are tolerated: the runtime options below make any report fail its test.
# Assumes deploy/setup.sh ran (deploy/test.sh does it).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/ccache_env.sh
mode=${1:?usage: deploy/sanitize.sh asan|tsan}
jobs=${KVARN_JOBS:-$(nproc)}
dirs="daemon/core;daemon/tiers;daemon/service;daemon/metrics;client/lib;integration"
# The sanitizers' reports name functions through llvm-symbolizer, and TSan's suppressions
# (tests/sanitizers/tsan.supp) match function names: without it every suppressed report of
# gRPC's inlined code fires. deploy/setup.sh installs it (llvm-14).
symbolizer=$(command -v llvm-symbolizer || echo /usr/lib/llvm-14/bin/llvm-symbolizer)
if [ ! -x "$symbolizer" ]; then
  echo "deploy/sanitize.sh: no llvm-symbolizer (install llvm-14: deploy/setup.sh)" >&2
  exit 1
fi
case "$mode" in
  asan)
    build=${KVARN_ASAN_BUILD_DIR:-build-asan}
    flags=(-DKVARN_SANITIZE=address -DKVARN_FUZZ=ON)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1:external_symbolizer_path=$symbolizer}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    ;;
  tsan)
    build=${KVARN_TSAN_BUILD_DIR:-build-tsan}
    flags=(-DKVARN_SANITIZE=thread)
    # The suppressions from a directory every uid may read: as root the tests run kvarnd and
    # the attacker as nobody, which cannot read a checkout in root's 0700 home (TSan then
    # refuses to start them).
    supp_dir=$(mktemp -d /tmp/kvarn-tsan.XXXXXX)
    trap 'rm -rf "$supp_dir"' EXIT
    chmod 0755 "$supp_dir"
    install -m 0644 tests/sanitizers/tsan.supp "$supp_dir/tsan.supp"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$supp_dir/tsan.supp:external_symbolizer_path=$symbolizer}
    ;;
  *) echo "deploy/sanitize.sh: mode must be asan or tsan" >&2; exit 2 ;;
esac
echo "== $mode: configure and build ($build)"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVARN_WITH_CUDA=OFF \
  -DKVARN_BUILD_BENCHMARKS=OFF "-DKVARN_TEST_DIRS=$dirs" "${flags[@]}" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs"
echo "== $mode: tests"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
if [ "$mode" = asan ]; then
  echo "== asan: fuzzers"
  tests/fuzz/run_fuzzers.sh "$build" "${KVARN_FUZZ_SECONDS:-30}"
fi
echo "== $mode: 0 reports"
