#!/usr/bin/env bash
# tests/fuzz/run.sh: runs every libFuzzer target of a CLM_FUZZ build for a
# while, two at a time, each on a copy of its seed corpus in a temporary
# directory (the source tree is never written), with ASan's leak check on and
# UBSan fatal. Prints one line per target (executions, new corpus units,
# crashes) and exits non-zero on any crash, leak, undefined behaviour, timeout
# or missing target, naming the reproducer and keeping it in the temporary
# directory. `make test-fuzz` runs it for 30 s, `make soak` for 10 minutes.
#
#   tests/fuzz/run.sh build-fuzz 30
#   build-fuzz/tests/fuzz/fuzz_safetensors <reproducer>     (replays one input)
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
parallel=${CLM_FUZZ_JOBS:-2}  # the CI machine has 2 cores

# Every fuzz_<name>.cpp is a target with a corpus in corpus/<name>/.
targets=()
for src in "$here"/fuzz_*.cpp; do
  name=$(basename "$src" .cpp)
  targets+=("${name#fuzz_}")
done
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/fuzz_$t"
  if [ ! -x "$bin" ]; then
    echo "FAIL: $bin is missing: build it with 'make build-fuzz' (clang and libFuzzer are required)" >&2
    exit 1
  fi
  if [ ! -d "$here/corpus/$t" ]; then
    echo "FAIL: no seed corpus $here/corpus/$t" >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/clm-fuzz.XXXXXX")
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

run_one() {
  local t=$1 dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  cp -r "$here/corpus/$t/." "$dir/corpus/"
  local before
  before=$(find "$dir/corpus" -type f | wc -l)
  local rc=0
  # -timeout: an input that runs 10 s is a hang; TMPDIR: what a target writes.
  TMPDIR="$dir/tmp" "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  local after execs
  after=$(find "$dir/corpus" -type f | wc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  echo "$rc ${execs:-0} $((after - before))" >"$dir/result"
}

running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait || true

failed=0
printf '%-18s %12s %10s %8s\n' target executions new_units crashes
for t in "${targets[@]}"; do
  dir="$work/$t"
  read -r rc execs new <"$dir/result"
  crashes=$(find "$dir/artifacts" -type f | wc -l)
  printf '%-18s %12s %10s %8s\n' "$t" "$execs" "$new" "$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    echo "  FAIL: fuzz_$t exited $rc; log $dir/log" >&2
    grep -m3 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|FUZZ_CHECK failed' "$dir/log" |
      sed 's/^/    /' >&2 || true
    for a in "$dir"/artifacts/*; do
      [ -e "$a" ] && echo "  reproducer: $a  (replay: $build/tests/fuzz/fuzz_$t $a)" >&2
    done
  fi
done

if [ "$failed" -ne 0 ]; then
  echo "fuzzing found problems; everything is kept in $work" >&2
  exit 1
fi
rm -rf "$work"
