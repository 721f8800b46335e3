#!/usr/bin/env bash
# tests/bench/test_report.sh: ctest checks of the benchmark report
# (tests/bench/report.sh), in a temporary folder that is removed afterwards.
#
#   test_report.sh smoke BENCH_REPORT REPLAY BENCH_PROGRAM...
#       the whole report in smoke mode (CLM_BENCH_SMOKE=1): every section is
#       there, every program has its table, every plot is a real PNG
#   test_report.sh ttft BENCH_REPORT
#       the TTFT section from a made-up bench_e2e.jsonl (--render-only): a
#       table per turn and its plot, which a run without bench_e2e never shows
#
# Exit status 0 passed, 1 failed (also without gnuplot: `make deps` installs gnuplot-nox).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mode=${1:?usage: test_report.sh smoke|ttft BENCH_REPORT ...}
bench_report=${2:?usage: test_report.sh smoke|ttft BENCH_REPORT ...}
shift 2
command -v gnuplot >/dev/null || { echo "test_report.sh: no gnuplot (Debian gnuplot-nox: make deps)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/clm-test-report.XXXXXX")
trap 'rm -rf "$work"' EXIT
results=$work/results docs=$work/docs
report=$docs/benchmarks.md

fail() {
  echo "test_report.sh: FAILED: $*" >&2
  exit 1
}

# Every section of the report, in order.
check_sections() {
  local section previous=0 line
  for section in "## Runs" "## Hit rate against capacity" "## TTFT with and without the cache" \
    "## ANN latency against recall" "## Kernel bandwidth fractions" "## Every figure"; do
    line=$(grep -n -x -F "$section" "$report" | head -n1 | cut -d: -f1)
    [[ -n $line ]] || fail "no section '$section' in the report"
    [[ $line -gt $previous ]] || fail "section '$section' out of order"
    previous=$line
  done
}

# The body of a section: from its heading to the next "## ".
section_body() {
  awk -v heading="$1" '$0 == heading { inside = 1; next } /^## / { inside = 0 } inside' "$report"
}

# Every image the report shows is a PNG of some substance, and every PNG is shown.
check_images() {
  local image magic size
  while read -r image; do
    [[ -f $docs/$image ]] || fail "the report shows $image, which is not there"
    magic=$(head -c 8 "$docs/$image" | od -An -tx1 | tr -d ' \n')
    [[ $magic == 89504e470d0a1a0a ]] || fail "$image is not a PNG (starts with $magic)"
    size=$(stat -c %s "$docs/$image")
    [[ $size -gt 10000 ]] || fail "$image has only $size bytes"
  done < <(grep -o '!\[[^]]*\]([^)]*)' "$report" | sed 's/.*(\(.*\))/\1/')
  for image in "$docs"/bench-*.png; do
    grep -q "($(basename "$image"))" "$report" || fail "$(basename "$image") is not shown in the report"
  done
}

# The section shows a plot, or says it was not measured.
shows_plot() { section_body "$1" | grep -q '^!\['; }

case $mode in
  smoke)
    replay=${1:?usage: test_report.sh smoke BENCH_REPORT REPLAY BENCH_PROGRAM...}
    shift
    CLM_BENCH_SMOKE=1 "$here/report.sh" --bench-report "$bench_report" --replay "$replay" "$results" "$docs" "$@" \
      >"$work/stdout" || fail "report.sh exited with $?"
    check_sections
    check_images
    grep -q "Smoke run" "$report" || fail "no smoke banner"
    for program in "$@"; do
      grep -q -x -F "### $(basename "$program")" "$report" || fail "no table of $(basename "$program")"
    done
    shows_plot "## Hit rate against capacity" || fail "no hit-rate plot"
    if [[ -f ${CLM_SHARED_DIR:-$here/../../../shared}/traces/mooncake/conversation_trace.jsonl ]]; then
      [[ $(section_body "## Hit rate against capacity" | grep -c '^!\[') -eq 2 ]] ||
        fail "not two hit-rate plots (gsp and Mooncake)"
    fi
    shows_plot "## Kernel bandwidth fractions" || fail "no bandwidth-fraction plot"
    shows_plot "## ANN latency against recall" || fail "no ANN plot"
    if shows_plot "## TTFT with and without the cache"; then
      grep -q '^bench_e2e' "$results/runs.tsv" || fail "a TTFT plot without bench_e2e"
    else
      section_body "## TTFT with and without the cache" | grep -q "Not measured in this run" ||
        fail "the TTFT section neither shows a plot nor says it was not measured"
    fi
    ;;
  ttft)
    mkdir -p "$results"
    printf 'cpu\ttest CPU\ncores\t2\nmemory\t1.0 GiB\nsmoke\t0\n' >"$results/machine.tsv"
    printf 'bench_e2e\t0\t1.0\tbench_e2e\n' >"$results/runs.tsv"
    for turn in 1 2 3 4; do
      for stat in p50 p99; do
        printf '{"bench":"e2e","case":"turn_%d","metric":"ttft_%s_ms_cache","value":%d,"unit":"ms","baseline_metric":"ttft_%s_ms_nocache","baseline":%d,"ratio":0.5}\n' \
          "$turn" "$stat" $((10 + turn)) "$stat" $((20 * turn))
      done
    done >"$results/bench_e2e.jsonl"
    "$here/report.sh" --bench-report "$bench_report" --render-only "$results" "$docs" || fail "report.sh exited with $?"
    check_sections
    check_images
    shows_plot "## TTFT with and without the cache" || fail "no TTFT plot"
    section_body "## TTFT with and without the cache" | grep -q '^| 4 | 14 | 80 | 5.71x | 14 | 80 | 5.71x |$' ||
      fail "turn 4 is not in the TTFT table as p50 and p99, 14 ms cached against 80"
    for section in "## Hit rate against capacity" "## ANN latency against recall"; do
      section_body "$section" | grep -q "Not measured in this run" || fail "'$section' does not say it was not measured"
    done
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo "test_report.sh: $mode: passed"
