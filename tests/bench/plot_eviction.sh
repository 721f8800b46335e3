#!/usr/bin/env bash
# tests/bench/plot_eviction.sh: the eviction policies against Belady's offline
# optimum (docs/eviction.md), as a PNG and as tables: the hit rate against the
# pool's size (100k, 300k, 1M, 3M tokens, page 16), one line per policy, one
# panel per workload (gsp, the Mooncake conversation trace). Hit rates are
# deterministic: one replay per point. Then the cost, on Mooncake: requests
# per second of ghost_slru against LRU, interleaved (LRU, ghost_slru, LRU, ...
# ROUNDS times, each a --repeat 3 median; the table gives the median over the
# rounds), and the tree's metadata bytes per cached token at the peak.
#
#   tests/bench/plot_eviction.sh build/examples/replay/replay docs/eviction.png \
#       ../shared/traces/mooncake/conversation_trace.jsonl
#
# Needs gnuplot (Debian gnuplot-nox). ROUNDS (default 3) sets the cost rounds.
set -euo pipefail
replay=${1:?usage: plot_eviction.sh REPLAY_BINARY OUT_PNG MOONCAKE_TRACE}
out=${2:?usage: plot_eviction.sh REPLAY_BINARY OUT_PNG MOONCAKE_TRACE}
trace=${3:?usage: plot_eviction.sh REPLAY_BINARY OUT_PNG MOONCAKE_TRACE}
rounds=${ROUNDS:-3}
command -v gnuplot >/dev/null || { echo "plot_eviction.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() {  # field NAME JSON: a number from the replay's one-line JSON
  sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p" <<<"$2"
}
median() {  # median of the arguments
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
capacities=(100000 300000 1000000 3000000)
policies=(lru lfu slru ghost_slru belady)
declare -A workload_spec=([gsp]=gsp [mooncake]="mooncake:$trace")

for name in gsp mooncake; do
  echo "| $name | $(printf '%s | ' "${capacities[@]}")"
  for policy in "${policies[@]}"; do
    : >"$work/$name-$policy.dat"
    row="| $policy |"
    for capacity in "${capacities[@]}"; do
      json=$("$replay" --workload "${workload_spec[$name]}" --page-size 16 --capacity "$capacity" --policy "$policy" --json)
      rate=$(field hit_rate "$json")
      echo "$capacity $rate" >>"$work/$name-$policy.dat"
      row="$row $(printf '%.4f' "$rate") |"
    done
    echo "$row"
  done
done

echo "| Mooncake, page 16 | LRU req/s | ghost_slru req/s | ratio | LRU bytes/token | ghost_slru bytes/token |"
for capacity in "${capacities[@]}"; do
  lru_rates=() ghost_rates=()
  for ((round = 0; round < rounds; ++round)); do
    for policy in lru ghost_slru; do
      json=$("$replay" --workload "mooncake:$trace" --page-size 16 --capacity "$capacity" --policy "$policy" \
        --repeat 3 --json)
      if [[ $policy == lru ]]; then
        lru_rates+=("$(field requests_per_s "$json")") lru_bytes=$(field metadata_bytes_per_token "$json")
      else
        ghost_rates+=("$(field requests_per_s "$json")") ghost_bytes=$(field metadata_bytes_per_token "$json")
      fi
    done
  done
  lru=$(median "${lru_rates[@]}") ghost=$(median "${ghost_rates[@]}")
  printf '| %s | %.0f | %.0f | %.2f | %.2f | %.2f |\n' "$capacity" "$lru" "$ghost" \
    "$(awk -v a="$ghost" -v b="$lru" 'BEGIN { print a / b }')" "$lru_bytes" "$ghost_bytes"
done

plot_panel() {  # plot_panel NAME TITLE: one panel's gnuplot commands
  local sep=""
  printf 'set title "%s"\nplot ' "$2"
  local styles=("pt 7 lc rgb '#1b9e77'" "pt 5 lc rgb '#d95f02'" "pt 9 lc rgb '#7570b3'" "pt 13 lc rgb '#e7298a'"
    "pt 3 dt 2 lc rgb 'black'")
  for i in "${!policies[@]}"; do
    printf '%s"%s" using 1:2 with linespoints lw 2 %s title "%s"' "$sep" "$work/$1-${policies[$i]}.dat" \
      "${styles[$i]}" "${policies[$i]}"
    sep=", "
  done
  printf '\n'
}
gnuplot <<GNUPLOT
set terminal pngcairo size 1200,500 font ",10" noenhanced
set output "$out"
set multiplot layout 1,2
set logscale x
set xrange [70000:4300000]
set xtics ("100k" 100000, "300k" 300000, "1M" 1000000, "3M" 3000000)
set mxtics 1
set xlabel "pool size, tokens (page 16)"
set ylabel "hit rate (prompt tokens served from cache)"
set grid
set key bottom right
set yrange [0:1]
$(plot_panel gsp "gsp (64 groups x 16 prompts, 2048-token system prompts)")
set key top left
set yrange [0:0.4]
$(plot_panel mooncake "Mooncake conversation trace (12031 requests); belady = offline optimum")
unset multiplot
GNUPLOT
echo "plot_eviction.sh: wrote $out" >&2
