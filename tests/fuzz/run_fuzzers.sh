#!/usr/bin/env bash
# Runs kvarnd's libFuzzer targets on their seed corpora (tests/fuzz/corpus/<name>), each for
# SECONDS (default 60), in a scratch copy of the corpus so the repository is not modified.
# Prints each fuzzer's executions (and, for core_actions_fuzzer, the actions checked; for
# commit_ring_fuzzer, the steps checked and the ring records accepted, refused and unverified,
# and the rings broken; for tier_record_fuzzer, the records checked and, by kind of record, how
# many the core asked for, adopted and rejected by reason) and exits non-zero if any input
# crashed, leaked or broke an invariant;
# the crashing input is kept under the scratch directory, whose path is printed.
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS]      # CI: BUILD_DIR built with -DKVARN_FUZZ=ON
#   tests/fuzz/run_fuzzers.sh build-fuzz 3600          # a long run
set -uo pipefail
build=$(cd "${1:?usage: run_fuzzers.sh BUILD_DIR [SECONDS]}" && pwd)
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d /tmp/kvarn-fuzz.XXXXXX)
status=0
for name in core_actions service commit_ring tier_record; do
  bin="$build/bin/${name}_fuzzer"
  [ -x "$bin" ] || { echo "run_fuzzers: $bin is missing (configure with -DKVARN_FUZZ=ON)" >&2; exit 2; }
  mkdir -p "$scratch/$name"
  cp "$here/corpus/$name/"* "$scratch/$name/" 2>/dev/null || true
  log="$scratch/$name.log"
  echo "== ${name}_fuzzer for ${seconds} s (corpus: $(ls "$scratch/$name" | wc -l) inputs)"
  (cd "$scratch" && ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=64} "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
     -artifact_prefix="$scratch/$name-" "$scratch/$name" > "$log" 2>&1)
  rc=$?
  grep -a -E "^stat::number_of_executed_units|actions in|steps in|^tier_record_fuzzer: |^stat::peak_rss_mb" "$log" | sed 's/^/   /'
  if [ $rc -ne 0 ]; then
    status=1
    echo "   FAILED (exit $rc): see $log"
    grep -a -E "ERROR|fuzzer:|SUMMARY|runtime error" "$log" | head -20 | sed 's/^/   /'
  else
    echo "   0 crashes"
  fi
done
[ $status -eq 0 ] && rm -rf "$scratch"
exit $status
