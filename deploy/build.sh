#!/usr/bin/env bash
# Installs dependencies (deploy/setup.sh), then configures and builds kvarnd into build/
# (or $KVARN_BUILD_DIR) with both cores. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/ccache_env.sh
deploy/setup.sh
build=${KVARN_BUILD_DIR:-build}
jobs=${KVARN_JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j "$jobs"
