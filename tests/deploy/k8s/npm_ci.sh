#!/bin/sh
# npm_ci.sh SOURCE_DIR NODE_DIR: installs the packages pinned by SOURCE_DIR's package-lock.json
# into NODE_DIR/node_modules with `npm ci` (never into the source tree), unless that lock file
# is what NODE_DIR holds already. Exits 77 (CTest: skipped) when node or npm is not installed.
set -eu
src=$1
dest=$2
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node or npm is not installed; the Kubernetes manifest checks need them (deploy/setup.sh installs Debian's nodejs and npm)"
  exit 77
fi
stamp=$dest/node_modules/.kvarn-package-lock.json
if [ -f "$stamp" ] && cmp -s "$src/package-lock.json" "$stamp" && cmp -s "$src/package.json" "$dest/package.json"; then
  echo "npm_ci: $dest/node_modules already holds $src/package-lock.json"
  exit 0
fi
mkdir -p "$dest"
cp "$src/package.json" "$src/package-lock.json" "$dest/"
cd "$dest"
echo "npm_ci: node $(node --version), npm $(npm --version), into $dest"
# No package here needs an install script; none runs.
npm ci --no-audit --no-fund --ignore-scripts --loglevel=warn
cp package-lock.json "$stamp"
