#!/usr/bin/env bash
# tests/bench/plot_store.sh: the recall/latency trade-off of bench_store's ANN
# sweep as a PNG: recall@3 against p99 latency, one point per ef_search, the
# store and raw hnswlib side by side, one panel per dataset.
#
#   build/tests/bench/bench_store > store.jsonl
#   tests/bench/plot_store.sh store.jsonl docs/snapshot-store-ann.png
#
# Needs gnuplot (Debian gnuplot-nox).
set -euo pipefail
in=${1:?usage: plot_store.sh BENCH_JSONL OUT_PNG}
out=${2:?usage: plot_store.sh BENCH_JSONL OUT_PNG}
command -v gnuplot >/dev/null || { echo "plot_store.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line per dataset and ef: ef, store p99, raw p99, store recall, raw recall.
# A dataset the run skipped (GloVe without npm) gets no panel.
datasets=()
for dataset in clustered glove; do
  awk -v ds="$dataset" '
    function field(name,   m) { if (match($0, "\"" name "\": *\"?[^,\"}]*")) { m = substr($0, RSTART, RLENGTH); sub(/^"[^"]*": *"?/, "", m); return m } return "" }
    {
      c = field("case"); metric = field("metric")
      if (index(c, ds "/ann_ef") != 1) next
      ef = substr(c, length(ds "/ann_ef") + 1)
      if (metric == "p99_latency") { p99[ef] = field("value"); raw_p99[ef] = field("baseline") }
      if (metric == "recall@3") { rec[ef] = field("value"); raw_rec[ef] = field("baseline") }
    }
    END { for (ef in p99) if (ef in rec) print ef, p99[ef], raw_p99[ef], rec[ef], raw_rec[ef] }
  ' "$in" | sort -n >"$work/$dataset.dat"
  [[ -s $work/$dataset.dat ]] && datasets+=("$dataset")
done
[[ ${#datasets[@]} -gt 0 ]] || { echo "plot_store.sh: no ANN sweep in $in" >&2; exit 1; }

gnuplot <<EOF
set terminal pngcairo size $((250 + 425 * ${#datasets[@]})),460 font ",10" noenhanced
set output "$out"
set multiplot layout 1,${#datasets[@]} title "Snapshot store level 2 (hnswlib): recall@3 against p99 latency, one point per ef_search"
set xlabel "p99 latency (µs)"
set ylabel "recall@3 (against brute force)"
set key bottom right
set grid
set logscale x
set arrow from 1000, graph 0 to 1000, graph 1 nohead dt 2 lc rgb "gray40"
set arrow from graph 0, first 0.95 to graph 1, first 0.95 nohead dt 2 lc rgb "gray40"
do for [ds in "${datasets[*]}"] {
  set title ds
  # Labels above and below the points in turn: neighbouring ef values can sit close together.
  plot "$work/".ds.".dat" using 2:4:(int(\$0) % 2 == 0 ? sprintf("ef %d", \$1) : "") with labels offset 0,0.9 notitle, \
       "" using 2:4:(int(\$0) % 2 == 1 ? sprintf("ef %d", \$1) : "") with labels offset 0,-0.9 notitle, \
       "" using 2:4 with linespoints lt 1 pt 7 lw 2 title "store", \
       "" using 3:5 with linespoints lt 2 pt 5 lw 2 dt 3 title "raw hnswlib (same run)"
}
unset multiplot
EOF
echo "plot_store.sh: wrote $out"
