#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test: unit, property,
# conformance (golden vectors), integration (kvarnd and client processes), metrics
# (promtool). GPU tests skip cleanly where there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh "$@"
build=${KVARN_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "${KVARN_JOBS:-$(nproc)}" --timeout 600
