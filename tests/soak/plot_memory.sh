#!/usr/bin/env bash
# tests/soak/plot_memory.sh: soak_memory's samples as a PNG: resident set (RSS),
# the tree's metadata and the snapshot store's files against requests served,
# one panel per run (make soak-memory).
#
#   tests/soak/plot_memory.sh build/soak/gsp.csv build/soak/mooncake.csv build/soak/soak-memory.png
#
# Needs gnuplot (Debian gnuplot-nox).
set -euo pipefail
gsp=${1:?usage: plot_memory.sh GSP_CSV MOONCAKE_CSV OUT_PNG}
mooncake=${2:?usage: plot_memory.sh GSP_CSV MOONCAKE_CSV OUT_PNG}
out=${3:?usage: plot_memory.sh GSP_CSV MOONCAKE_CSV OUT_PNG}
command -v gnuplot >/dev/null || { echo "plot_memory.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }

gnuplot <<GNUPLOT
set terminal pngcairo size 1200,480 font ",10" noenhanced
set output "$out"
set datafile separator ","
set key autotitle columnhead
set multiplot layout 1,2 title "soak_memory: one Engine (pool, host tier, snapshot store), a million requests; MiB against requests served"
set xlabel "requests (thousands)"
set ylabel "MiB"
set grid
set key center right
set yrange [0:*]
do for [f in "$gsp $mooncake"] {
  set title sprintf("%s (RSS includes the workload's token ids)", f)
  plot f using (\$1/1000):(\$2/1048576) with lines lw 2 lc rgb "black" title "process RSS", \
       f using (\$1/1000):(\$3/1048576) with lines lw 2 lc rgb "#1b9e77" title "tree metadata", \
       f using (\$1/1000):(\$6/1048576) with lines lw 2 lc rgb "#d95f02" title "snapshot store files"
}
unset multiplot
GNUPLOT
echo "plot_memory.sh: wrote $out"
