#!/usr/bin/env bash
# tests/bench/plot_tiers.sh: what a host tier buys on gsp, as a PNG: the hit
# rate against the device tier's (L1) size, L1 alone beside L1 + a host tier
# (L2) four times as large, split into tokens served from L1 and from L2, per
# write policy. Each point is one deterministic replay (the replay binary,
# through an Engine with tiers).
#
#   tests/bench/plot_tiers.sh build/examples/replay/replay docs/tiers-gsp.png
#
# Needs gnuplot (Debian gnuplot-nox).
set -euo pipefail
replay=${1:?usage: plot_tiers.sh REPLAY_BINARY OUT_PNG}
out=${2:?usage: plot_tiers.sh REPLAY_BINARY OUT_PNG}
command -v gnuplot >/dev/null || { echo "plot_tiers.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() {  # field NAME JSON: a number from the replay's one-line JSON
  sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p" <<<"$2"
}
capacities=(16384 32768 65536 98304 131072)
for policy in write_through write_through_selective write_back; do
  : >"$work/$policy.dat"
done
: >"$work/alone.dat"
for l1 in "${capacities[@]}"; do
  echo "plot_tiers.sh: L1 $l1 tokens" >&2
  alone=$("$replay" --workload gsp --page-size 16 --capacity "$l1" --json)
  echo "$l1 $(field hit_rate "$alone")" >>"$work/alone.dat"
  for policy in write_through write_through_selective write_back; do
    tiered=$("$replay" --workload gsp --page-size 16 --capacity "$l1" --l2-capacity $((4 * l1)) \
      --write-policy "$policy" --json)
    echo "$l1 $(field hit_rate_device "$tiered") $(field hit_rate_host "$tiered") $(field hit_rate "$tiered")" \
      >>"$work/$policy.dat"
  done
done

gnuplot <<GNUPLOT
set terminal pngcairo size 1100,480 font ",10" noenhanced
set output "$out"
set title "gsp (64 groups x 16 prompts, page 16): hit rate against the device tier's size; host tier = 4x L1\n(the device tier's own hit rate stays that of L1 alone, within 0.002: the gain is host-tier hits)"
set xlabel "device tier (L1) size, tokens"
set ylabel "prompt tokens served from cache"
set yrange [0:1]
set key top left
set grid
set format x "%.0f"
plot "$work/alone.dat" using 1:2 with linespoints pt 7 lw 2 lc rgb "black" title "L1 alone", \
     "$work/write_through.dat" using 1:4 with linespoints pt 5 lw 2 lc rgb "#1b9e77" title "L1 + L2, write_through", \
     "$work/write_through_selective.dat" using 1:4 with linespoints pt 9 lw 2 lc rgb "#d95f02" title "L1 + L2, write_through_selective", \
     "$work/write_back.dat" using 1:4 with linespoints pt 13 lw 2 lc rgb "#7570b3" title "L1 + L2, write_back"
GNUPLOT
echo "plot_tiers.sh: wrote $out"
