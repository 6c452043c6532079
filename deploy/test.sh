#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test: unit, property,
# conformance (golden vectors), integration (kvarnd and client processes, the attacker, a
# short chaos run), metrics (promtool); then the sanitizer jobs: ASan+UBSan with the
# fuzzers on their corpora, and TSan (deploy/sanitize.sh). GPU tests skip cleanly where
# there is no device.
#
#   KVARN_TEST_SANITIZERS=0   skip the sanitizer jobs (the release tests only)
#   KVARN_FUZZ_SECONDS=N      seconds per fuzz target in the ASan job (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
deploy/build.sh "$@"
build=${KVARN_BUILD_DIR:-build}
echo "== release: tests"
ctest --test-dir "$build" --output-on-failure -j "${KVARN_JOBS:-$(nproc)}" --timeout 600
echo "== release: passed after $(( $(date +%s) - start )) s"
if [ "${KVARN_TEST_SANITIZERS:-1}" != 0 ]; then
  deploy/sanitize.sh asan
  echo "== asan: passed after $(( $(date +%s) - start )) s"
  deploy/sanitize.sh tsan
  echo "== tsan: passed after $(( $(date +%s) - start )) s"
fi
echo "== all tests passed in $(( $(date +%s) - start )) s (wall clock)"
