#!/bin/sh
# run_check.sh NODE_DIR ARGS...: runs check_manifests.js ARGS with the packages npm_ci.sh
# installed into NODE_DIR. Exits 77 (CTest: skipped) when node or npm is not installed, as
# npm_ci.sh did; a missing install with node and npm present is a failure.
set -eu
node_dir=$1
shift
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node or npm is not installed; the Kubernetes manifest checks need them (deploy/setup.sh installs Debian's nodejs and npm)"
  exit 77
fi
exec node "$(dirname "$0")/check_manifests.js" --node-dir="$node_dir" "$@"
