#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine, then runs the main job on its embedded
# defaults:
#  1. a real language model generating text with its KV cache in kvarnd: `python3 -m kvarn.lm
#     demo` (the byte-level model trained by python/kvarn/lm/train.py, docs/model.md) starts
#     its own kvarnd and runs worker processes that share system prompts;
#  2. the codec on synthetic K/V: `kvarnctl codec synth` then `kvarnctl codec eval`,
#     comparing KVarN against the KIVI and Hadamard-only baselines;
#  3. kvarnd on the host backend with its default configuration, and `kvarnctl demo`:
#     simulated workers sharing system prompts through the shared-memory pool.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
build=${KVARN_BUILD_DIR:-build}
bin="$build/bin"
data=$(mktemp -d)
trap 'kill "${daemon_pid:-}" 2>/dev/null || true; rm -rf "$data"' EXIT

echo "== a real model generating through kvarnd (python3 -m kvarn.lm demo) =="
PYTHONPATH="$build/python" /usr/bin/python3 -m kvarn.lm demo

echo
echo "== KVarN codec on synthetic K/V =="
"$bin/kvarnctl" codec synth --out-dir "$data/kv"
"$bin/kvarnctl" codec eval --keys "$data/kv/k.npy" --values "$data/kv/v.npy" --queries "$data/kv/q.npy" \
  --preset kvarn_k4v2_g128 --preset kvarn_k4v4_g128 --preset kivi_k4v2_g128 --preset hadamard_k4v2_g128

echo
echo "== kvarnd with kvarnctl demo =="
sock="$data/kvarnd.sock"
"$bin/kvarnd" --listen="$sock" --metrics=127.0.0.1:0 --instance="demo$$" &
daemon_pid=$!
# kvarnd listens once its pool is mapped, and kvarnctl fails at once on a socket nobody serves
# yet: wait for its health check to pass (60 s at most), or for kvarnd to exit.
deadline=$((SECONDS + 60))
until "$bin/kvarnctl" health --target="unix:$sock" --timeout=1s > /dev/null 2>&1; do
  kill -0 "$daemon_pid" 2> /dev/null || { echo "run.sh: kvarnd exited before it served" >&2; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "run.sh: kvarnd did not serve within 60 s" >&2; exit 1; }
  sleep 0.1
done
"$bin/kvarnctl" demo --target="unix:$sock"
"$bin/kvarnctl" status --target="unix:$sock"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
