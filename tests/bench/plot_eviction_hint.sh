#!/usr/bin/env bash
# tests/bench/plot_eviction_hint.sh: what a host's hint is worth under
# ghost_slru (docs/eviction.md, "A host that knows the next turn is coming"),
# as a PNG and as tables, on the Mooncake conversation trace, page 16.
#
# The hint is the replay's oracle (--hint-next-turn-within S: a request whose
# conversation's next turn comes within S seconds is cached with priority 1).
# Left panel: the hit rate against the pool's size for LRU, ghost_slru
# without a hint, ghost_slru with the hint at S = 30, 60, 120, 300 s, the
# same at 120 and 300 s with --hint-update set (dashed: a hint ends when the
# conversation's next turn comes without one), and Belady. Right panel: the
# hint with errors at 1M (S 120) and 3M (S 300): the hit rate against its
# recall, one line per false rate, and the issue's targets (raise, the
# default; the tables also have set). Every point is one deterministic replay.
#
#   tests/bench/plot_eviction_hint.sh build/examples/replay/replay docs/eviction-hint.png \
#       ../shared/traces/mooncake/conversation_trace.jsonl
#
# Needs gnuplot (Debian gnuplot-nox).
set -euo pipefail
usage="usage: plot_eviction_hint.sh REPLAY_BINARY OUT_PNG MOONCAKE_TRACE"
replay=${1:?$usage}
out=${2:?$usage}
trace=${3:?$usage}
command -v gnuplot >/dev/null || { echo "plot_eviction_hint.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

hit_rate() {  # hit_rate REPLAY_FLAGS...: the hit rate of one replay
  "$replay" --workload "mooncake:$trace" --page-size 16 --json "$@" | sed -n 's/.*"hit_rate": *\([0-9.eE+-]*\).*/\1/p'
}
capacities=(100000 300000 1000000 3000000)
lines=(lru ghost_slru hint30 hint60 hint120 hint300 set30 set60 set120 set300 belady)
plotted=(lru ghost_slru hint30 hint60 hint120 hint300 set120 set300 belady)
declare -A flags=([lru]="--policy lru" [ghost_slru]="--policy ghost_slru" [belady]="--policy belady"
  [hint30]="--policy ghost_slru --hint-next-turn-within 30" [hint60]="--policy ghost_slru --hint-next-turn-within 60"
  [hint120]="--policy ghost_slru --hint-next-turn-within 120"
  [hint300]="--policy ghost_slru --hint-next-turn-within 300")
declare -A titles=([lru]="lru" [ghost_slru]="ghost_slru, no hint" [belady]="belady (offline optimum)"
  [hint30]="ghost_slru, hint 30 s" [hint60]="ghost_slru, hint 60 s" [hint120]="ghost_slru, hint 120 s"
  [hint300]="ghost_slru, hint 300 s")
for within in 30 60 120 300; do
  flags[set$within]="--policy ghost_slru --hint-next-turn-within $within --hint-update set"
  titles[set$within]="ghost_slru, hint $within s, set"
done

echo "| pool | $(printf '%s | ' "${lines[@]}")"
for capacity in "${capacities[@]}"; do
  row="| $capacity |"
  for line in "${lines[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    rate=$(hit_rate --capacity "$capacity" ${flags[$line]})
    echo "$capacity $rate" >>"$work/$line.dat"
    row="$row $(printf '%.4f' "$rate") |"
  done
  echo "$row"
  echo "  pool $capacity done" >&2
done

recalls=(1 0.8 0.6 0.4)
false_rates=(0 0.1 0.2)
echo "| pool, hint | update | false rate | recall $(printf '%s | ' "${recalls[@]}")"
for setting in "1000000 120" "3000000 300"; do
  read -r capacity within <<<"$setting"
  for update in raise set; do
    for false_rate in "${false_rates[@]}"; do
      row="| $capacity, $within s | $update | $false_rate |"
      for recall in "${recalls[@]}"; do
        rate=$(hit_rate --capacity "$capacity" --policy ghost_slru --hint-next-turn-within "$within" \
          --hint-recall "$recall" --hint-false-rate "$false_rate" --hint-update "$update")
        echo "$recall $rate" >>"$work/noise-$capacity-$update-$false_rate.dat"
        row="$row $(printf '%.4f' "$rate") |"
      done
      echo "$row"
    done
  done
  echo "  errors at $capacity done" >&2
done

size_panel() {
  local styles=("pt 7 lc rgb '#1b9e77'" "pt 13 lc rgb '#e7298a'" "pt 4 lc rgb '#a6cee3'" "pt 6 lc rgb '#1f78b4'"
    "pt 8 lc rgb '#33a02c'" "pt 10 lc rgb '#ff7f00'" "pt 9 dt 2 lc rgb '#33a02c'" "pt 11 dt 2 lc rgb '#ff7f00'"
    "pt 3 dt 3 lc rgb 'black'")
  local sep=""
  printf 'plot '
  for i in "${!plotted[@]}"; do
    printf '%s"%s" using 1:2 with linespoints lw 2 %s title "%s"' "$sep" "$work/${plotted[$i]}.dat" "${styles[$i]}" \
      "${titles[${plotted[$i]}]}"
    sep=", "
  done
  printf '\n'
}
noise_panel() {
  local colors=('#1f78b4' '#33a02c' '#ff7f00')
  local sep=""
  printf 'plot 0.12 with lines dt 3 lc rgb "#1f78b4" title "target at 1M (0.12)", '
  printf '0.21 with lines dt 3 lc rgb "#d95f02" title "target at 3M (0.21)"'
  for capacity in 1000000 3000000; do
    for i in "${!false_rates[@]}"; do
      local label="1M, hint 120 s" point=7
      [[ $capacity == 3000000 ]] && label="3M, hint 300 s" point=5
      printf ', "%s" using 1:2 with linespoints lw 2 pt %s lc rgb "%s" title "%s, false rate %s"' \
        "$work/noise-$capacity-raise-${false_rates[$i]}.dat" "$point" "${colors[$i]}" "$label" "${false_rates[$i]}"
    done
  done
  printf '\n'
}
gnuplot <<GNUPLOT
set terminal pngcairo size 1300,520 font ",10" noenhanced
set output "$out"
set multiplot layout 1,2
set grid
set ylabel "hit rate (prompt tokens served from cache)"
set logscale x
set xrange [70000:4300000]
set xtics ("100k" 100000, "300k" 300000, "1M" 1000000, "3M" 3000000)
set mxtics 1
set xlabel "pool size, tokens (page 16)"
set yrange [0:0.4]
set key top left
set title "Mooncake conversation trace: ghost_slru with an oracle next-turn hint"
$(size_panel)
unset logscale x
set xrange [0.35:1.05]
set xtics 0.1
set xlabel "hint recall (share of next turns within S that are hinted)"
set yrange [0:0.3]
set key bottom right
set title "the hint with errors (false rate: share of the other requests hinted)"
$(noise_panel)
unset multiplot
GNUPLOT
echo "plot_eviction_hint.sh: wrote $out" >&2
