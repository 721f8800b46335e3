#!/usr/bin/env bash
# tests/bench/report.sh: the benchmark report. Runs every bench program and the
# replay's hit-rate sweeps, keeps what they print in OUT_DIR, then writes
# DOCS_DIR/benchmarks.md and DOCS_DIR/bench-*.png (bench_report writes the
# markdown and the gnuplot scripts; gnuplot draws them here).
#
#   tests/bench/report.sh --bench-report BIN --replay BIN OUT_DIR DOCS_DIR BENCH_PROGRAM...
#   tests/bench/report.sh --bench-report BIN --render-only OUT_DIR DOCS_DIR
#
# `make bench` (the CMake target `bench`) runs the first form with every
# program of tests/bench/CMakeLists.txt, OUT_DIR = <build>/bench-results and
# DOCS_DIR = docs. --render-only writes the report again from an OUT_DIR that a
# run left, running nothing. The workloads come from $CLM_SHARED_DIR (default:
# ../shared beside the source tree).
#
# CLM_BENCH_SMOKE=1: every program at its smoke size, a short sweep over the
# first lines of the Mooncake trace; a minute or two. Its figures are not
# measurements, so when DOCS_DIR is the source tree's docs/ both folders move
# to a fresh temporary one (printed at the end).
#
# OUT_DIR afterwards: machine.tsv, runs.tsv, <program>.jsonl (its stdout),
# <program>.log (its stderr), replay_sweep.jsonl, plots/ (data + gnuplot).
# Exit status: 0; 1 when a program failed (the report is written all the
# same, naming it); 2 usage; 77 gnuplot missing.
set -euo pipefail

usage() {
  echo "usage: report.sh --bench-report BIN (--replay BIN OUT_DIR DOCS_DIR BENCH_PROGRAM... | --render-only OUT_DIR DOCS_DIR)" >&2
  exit 2
}
say() { echo "report.sh: $*" >&2; }

source_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bench_report="" replay="" render_only=0
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --bench-report) bench_report=${2:?}; shift 2 ;;
    --replay) replay=${2:?}; shift 2 ;;
    --render-only) render_only=1; shift ;;
    *) usage ;;
  esac
done
[[ $# -ge 2 && -n $bench_report ]] || usage
out_dir=$1 docs_dir=$2
shift 2
programs=("$@")
if [[ $render_only == 0 && (-z $replay || ${#programs[@]} -eq 0) ]]; then usage; fi
command -v gnuplot >/dev/null || { say "gnuplot is missing (apt-get install gnuplot-nox)"; exit 77; }

smoke=0
[[ ${CLM_BENCH_SMOKE:-0} != 0 ]] && smoke=1
shared_dir=$(realpath -m "${CLM_SHARED_DIR:-$source_root/../shared}")
if [[ $smoke == 1 && $render_only == 0 ]] && mkdir -p "$docs_dir" &&
   [[ $(cd "$docs_dir" && pwd -P) == $(cd "$source_root/docs" && pwd -P) ]]; then
  smoke_dir=$(mktemp -d "${TMPDIR:-/tmp}/clm-bench-smoke.XXXXXX")
  out_dir=$smoke_dir/results docs_dir=$smoke_dir/docs
  say "smoke run: writing into $smoke_dir, not into docs/"
fi
mkdir -p "$out_dir" "$docs_dir"
out_dir=$(cd "$out_dir" && pwd) docs_dir=$(cd "$docs_dir" && pwd)

# A path as the report shows it: relative to the source tree when inside it.
shown() {
  local relative
  relative=$(realpath -m --relative-to="$source_root" "$1")
  if [[ $relative == ../../* ]]; then realpath -m "$1"; else echo "$relative"; fi
}
load_average() { cut -d' ' -f1 /proc/loadavg; }

# The machine, once: every figure of the report names it.
write_machine() {
  local cpu cores memory_kib commit
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
  cores=$(nproc)
  memory_kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)
  commit=$(git -C "$source_root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [[ -n $(git -C "$source_root" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    commit+=" (with uncommitted changes)"
  fi
  {
    printf 'cpu\t%s\n' "${cpu:-unknown}"
    printf 'cores\t%s\n' "$cores"
    printf 'memory\t%s GiB\n' "$(awk -v k="$memory_kib" 'BEGIN { printf "%.1f", k / 1048576 }')"
    printf 'kernel\t%s\n' "$(uname -sr)"
    printf 'date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'commit\t%s\n' "$commit"
    printf 'smoke\t%s\n' "$smoke"
    printf 'load_start\t%s\n' "$(load_average)"
  } >"$out_dir/machine.tsv"
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Runs one bench program: JSON lines to OUT_DIR/<name>.jsonl (and stdout),
# stderr to OUT_DIR/<name>.log, a row in runs.tsv.
run_program() {
  local index=$1 program=$2 name status start seconds
  local -a env_vars=("CLM_SHARED_DIR=$(shown "$shared_dir")")
  [[ $smoke == 1 ]] && env_vars+=(CLM_BENCH_SMOKE=1 CLM_BENCH_NO_NPM=1)
  name=$(basename "$program")
  say "[$index/${#programs[@]}] $name ..."
  start=$(now)
  set +e
  (cd "$source_root" && env "${env_vars[@]}" "$program") 2>"$out_dir/$name.log" | tee "$out_dir/$name.jsonl"
  status=${PIPESTATUS[0]}
  set -e
  seconds=$(elapsed "$start")
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "${env_vars[*]} $(shown "$program")" >>"$out_dir/runs.tsv"
  case $status in
    0) say "[$index/${#programs[@]}] $name: $(wc -l <"$out_dir/$name.jsonl") figures in $seconds s" ;;
    77) say "[$index/${#programs[@]}] $name: skipped: $(tail -n1 "$out_dir/$name.log")" ;;
    *)
      say "[$index/${#programs[@]}] $name FAILED (exit status $status) after $seconds s; the end of its log:"
      tail -n 20 "$out_dir/$name.log" >&2
      failed+=("$name")
      ;;
  esac
}

# The hit-rate sweeps: one `replay --json` per workload, policy and capacity.
# The largest capacity of each workload evicts nothing (the upper bound).
run_replay_sweep() {
  local policies trace start sweep=$out_dir/replay_sweep.jsonl
  local -a gsp_capacities mooncake_capacities workloads
  # Every policy the replay accepts, as its --help lists them.
  read -r -a policies <<<"$("$replay" --help | sed -n 's/.*--policy \([a-z_|]*\).*/\1/p' | head -n1 | tr '|' ' ')"
  [[ ${#policies[@]} -gt 0 ]] || { say "cannot read the policies from replay --help"; exit 1; }
  trace=$shared_dir/traces/mooncake/conversation_trace.jsonl
  if [[ $smoke == 1 ]]; then
    gsp_capacities=(32768 131072 1048576)
    mooncake_capacities=(100000 1000000 16000000)
    if [[ -f $trace ]]; then
      head -n 500 "$trace" >"$out_dir/mooncake-first-500.jsonl"
      trace=$out_dir/mooncake-first-500.jsonl
    fi
  else
    gsp_capacities=(16384 32768 65536 131072 262144 524288 1048576)
    mooncake_capacities=(100000 300000 1000000 3000000 10000000 200000000)
  fi
  workloads=(gsp)
  if [[ -f $trace ]]; then
    workloads+=("mooncake:$(shown "$trace")")
  else
    say "no Mooncake trace at $trace: the sweep covers gsp only"
  fi
  : >"$sweep"
  start=$(now)
  local workload policy capacity
  local -a capacities
  for workload in "${workloads[@]}"; do
    if [[ $workload == gsp ]]; then capacities=("${gsp_capacities[@]}"); else capacities=("${mooncake_capacities[@]}"); fi
    say "replay sweep: ${workload%%:*}, policies ${policies[*]}, capacities ${capacities[*]}"
    for capacity in "${capacities[@]}"; do
      for policy in "${policies[@]}"; do
        # From the source tree, as the report shows the command.
        (cd "$source_root" && "$replay" --workload "$workload" --page-size 16 --capacity "$capacity" \
          --policy "$policy" --json) >>"$sweep"
      done
    done
  done
  printf '%s\t0\t%s\t%s\n' replay_sweep "$(elapsed "$start")" \
    "$(shown "$replay") --workload W --page-size 16 --capacity C --policy P --json" >>"$out_dir/runs.tsv"
  say "replay sweep: $(wc -l <"$sweep") replays in $(elapsed "$start") s"
}

failed=()
if [[ $render_only == 0 ]]; then
  rm -rf "$out_dir/plots"
  rm -f "$out_dir"/*.jsonl "$out_dir"/*.log "$out_dir/runs.tsv"
  write_machine
  index=0
  for program in "${programs[@]}"; do
    index=$((index + 1))
    run_program "$index" "$program"
  done
  run_replay_sweep
  printf 'load_end\t%s\n' "$(load_average)" >>"$out_dir/machine.tsv"
fi

# Plots of an earlier run must not outlive it.
rm -f "$docs_dir"/bench-*.png
if [[ -f $out_dir/bench_store.jsonl ]] && grep -q '/ann_ef' "$out_dir/bench_store.jsonl"; then
  "$source_root/tests/bench/plot_store.sh" "$out_dir/bench_store.jsonl" "$docs_dir/bench-ann.png" >&2
fi
"$bench_report" "$out_dir" "$docs_dir"
for script in "$out_dir"/plots/*.gp; do
  [[ -e $script ]] || continue
  gnuplot "$script" || { say "gnuplot failed on $script"; exit 1; }
done
say "wrote $docs_dir/benchmarks.md and $(find "$docs_dir" -maxdepth 1 -name 'bench-*.png' | wc -l) plots"
if [[ ${#failed[@]} -gt 0 ]]; then
  say "failed: ${failed[*]} (named in the report)"
  exit 1
fi
