#!/usr/bin/env bash
# The GPU machine's checks, in one go (it has the CUDA toolkit, CMake and Python only):
# configure the kernels-only build, build with all cores, run the device checks (golden
# conformance, CPU/GPU cross-check, fused attention, store), then the throughput benchmark,
# and print a summary. Designed to finish well under 8 minutes on an H200.
#
# Usage (from the repository root): bash tests/gpu/run_gpu_checks.sh
# Environment: KVARN_GPU_BUILD_DIR (default build-cuda-gpu), KVARN_GPU_QUICK_BENCH=1 (shorter
# benchmark). Logs go to $BUILD/gpu-check-logs, and to $OUT when it is set.
# Exit status: 0 when every check passed (or skipped for lack of a device), 1 otherwise.
set -u -o pipefail

cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
BUILD=${KVARN_GPU_BUILD_DIR:-build-cuda-gpu}
LOGS="$BUILD/gpu-check-logs"
START=$(date +%s)
JOBS=$(nproc 2>/dev/null || echo 8)
declare -a NAMES=() RESULTS=() TIMES=()

elapsed() { echo $(( $(date +%s) - START )); }
note() { printf '\n=== [%4ss] %s\n' "$(elapsed)" "$*"; }
record() { NAMES+=("$1"); RESULTS+=("$2"); TIMES+=("$3"); }

# run NAME TIMEOUT_S COMMAND...: runs one step with a time limit, logs it, records
# PASS / FAIL / SKIP (a step that prints "SKIPPED: no CUDA device" and exits 0); with
# NONFATAL_TIMEOUT=1 a timeout is only a warning.
run() {
  local name=$1 limit=$2
  shift 2
  local log="$LOGS/$name.log" t0 rc
  note "$name: $*"
  t0=$(date +%s)
  if command -v timeout >/dev/null 2>&1; then
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
  else
    "$@" 2>&1 | tee "$log"
  fi
  rc=${PIPESTATUS[0]}
  local dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ] && grep -q "SKIPPED: no CUDA device" "$log"; then
    record "$name" SKIP "$dt"
  elif [ "$rc" -eq 0 ]; then
    record "$name" PASS "$dt"
  elif { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "${NONFATAL_TIMEOUT:-0}" = 1 ]; then
    record "$name" "WARN (timeout ${limit}s)" "$dt"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" "FAIL (timeout ${limit}s)" "$dt"
  else
    record "$name" "FAIL (exit $rc)" "$dt"
  fi
}

mkdir -p "$LOGS"
note "machine"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")
"$NVCC" --version | tail -1
cmake --version | head -1
echo "cores: $JOBS, build dir: $BUILD"

# A build tool: Ninja if present (also the pip package's), else Make.
GEN=()
if command -v ninja >/dev/null 2>&1; then
  GEN=(-G Ninja)
elif python3 -c "import ninja" >/dev/null 2>&1; then
  GEN=(-G Ninja "-DCMAKE_MAKE_PROGRAM=$(python3 -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')")
elif ! command -v make >/dev/null 2>&1 && ! command -v gmake >/dev/null 2>&1; then
  echo "neither ninja nor make found: cannot build" >&2
  exit 1
fi
# Reuse an earlier build directory only if it is a kernels-only build with this generator.
WANT_GEN="Unix Makefiles"
[ ${#GEN[@]} -gt 0 ] && WANT_GEN=Ninja
if [ -f "$BUILD/CMakeCache.txt" ] &&
   { ! grep -q "^KVARN_KERNELS_ONLY:BOOL=ON" "$BUILD/CMakeCache.txt" ||
     ! grep -q "^CMAKE_GENERATOR:INTERNAL=$WANT_GEN\$" "$BUILD/CMakeCache.txt"; }; then
  echo "removing $BUILD (other configuration)"
  rm -rf "$BUILD"
  mkdir -p "$LOGS"
fi

# Which exp, log and std the authors' reference used (docs/codec_arithmetic.md): the
# project's torch statement of the spec with torch's CUDA functions against the golden
# records and the codec's arithmetic, where python3 has torch with CUDA. It runs on one CPU
# core and the GPU while the build below takes the others.
TORCH_PID=""
if python3 -c "import numpy, torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  note "torch-spec: tests/golden/torch_spec_check.py (in the background)"
  (
    t0=$(date +%s)
    timeout --kill-after=10 400 python3 tests/golden/torch_spec_check.py \
      --sweep "${KVARN_GPU_TORCH_SWEEP:-200}" --json "$LOGS/torch_spec.json" >"$LOGS/torch_spec.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" >"$LOGS/torch_spec.rc"
  ) &
  TORCH_PID=$!
else
  record torch-spec "SKIP (no torch with CUDA)" 0
fi

run configure 180 cmake -S "$ROOT" -B "$BUILD" ${GEN[@]+"${GEN[@]}"} -DKVARN_KERNELS_ONLY=ON -DKVARN_WITH_CUDA=ON \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_COMPILER=$NVCC" -DCMAKE_CUDA_FLAGS=-lineinfo
run build 420 cmake --build "$BUILD" -j "$JOBS" --target kvarn_gpu_checks kvarn_cuda_bench kvarn_ipc_test

CHECKS="$BUILD/bin/kvarn_gpu_checks"
BENCH="$BUILD/bin/kvarn_cuda_bench"
if [ -x "$CHECKS" ]; then
  run golden 180 "$CHECKS" golden          # golden vectors, manifest tolerances, vs CPU records
  run crosscheck 300 "$CHECKS" encode      # every preset x head_dim: encode and decode vs CPU
  run attention 180 "$CHECKS" attention    # fused attention, GQA, split-K vs CPU
  run store 120 "$CHECKS" store            # store kernel vs Codec::StoreTokens, round trip
else
  record checks "FAIL (not built)" 0
fi

# --- IPC two-process test (CUDA IPC pool mapping): this process exports a slab, importer
# processes open it (twice: one cached mapping), write through it and the exporter reads it
# back; the exporter's own Acquire returns its pointer; 1,000 open/close and 1,000 held opens
# in one importer leave one mapping and the device's free memory unchanged; importers killed
# with SIGKILL while mapped (KVARN_GPU_IPC_KILLS, default 128) leave no drift; and the
# daemon's NaN/Inf scan kernel. About 30-60 s, most of it importers' CUDA start-up.
IPC="$BUILD/bin/kvarn_ipc_test"
if [ -x "$IPC" ]; then
  run ipc 150 "$IPC" --kills "${KVARN_GPU_IPC_KILLS:-128}"
else
  record ipc "FAIL (not built)" 0
fi
# ---

if [ -x "$BENCH" ]; then
  if [ "$(elapsed)" -gt 330 ] || [ "${KVARN_GPU_QUICK_BENCH:-0}" = 1 ]; then
    run bench 150 "$BENCH" --quick
  else
    run bench 210 "$BENCH"
  fi
else
  record bench "FAIL (not built)" 0
fi

# compute-sanitizer on a few small launches of every kernel: out-of-bounds and misaligned
# accesses (memcheck), shared-memory hazards (racecheck), barrier misuse (synccheck). Skipped
# when the time budget is spent.
SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
if [ -x "$CHECKS" ] && [ -x "$SANITIZER" ]; then
  for tool in memcheck synccheck racecheck; do
    left=$(( 440 - $(elapsed) ))  # keep the whole script under ~7.5 minutes
    if [ "$left" -lt 30 ]; then
      record "$tool" "SKIP (time budget)" 0
      continue
    fi
    NONFATAL_TIMEOUT=1 run "$tool" $(( left < 100 ? left : 100 )) "$SANITIZER" --tool "$tool" --error-exitcode 3 \
      "$CHECKS" smoke
  done
else
  record sanitizer "SKIP (not found)" 0
fi

if [ -n "$TORCH_PID" ]; then
  wait "$TORCH_PID"
  read -r rc dt <"$LOGS/torch_spec.rc" || { rc=1; dt=0; }
  note "torch-spec"
  cat "$LOGS/torch_spec.log"
  if [ "$rc" -eq 0 ]; then record torch-spec PASS "$dt"; else record torch-spec "FAIL (exit $rc)" "$dt"; fi
fi

note "summary"
fail=0
for i in "${!NAMES[@]}"; do
  printf '  %-12s %-22s %5ss\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"
  case "${RESULTS[$i]}" in FAIL*) fail=1 ;; esac
done
for f in golden crosscheck attention store ipc memcheck racecheck synccheck; do
  [ -f "$LOGS/$f.log" ] && grep -hE "^(PASSED|FAILED|FAIL) |: [0-9]+/[0-9]+ records bit-identical|ERROR SUMMARY|free bytes" "$LOGS/$f.log" | sed "s/^/  $f: /"
done
if [ -f "$LOGS/bench.log" ]; then
  grep -hE "^(reference|encode|decode|attention|SUMMARY)" "$LOGS/bench.log" | sed 's/^/  /'
fi
echo "  total time: $(elapsed)s; logs: $LOGS"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  # One archive: the device tool returns at most 8 files.
  tar -czf "$OUT/gpu-check-logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null || true
fi
if [ "$fail" -eq 0 ]; then echo "GPU CHECKS: PASS"; else echo "GPU CHECKS: FAIL"; fi
exit "$fail"
