#!/usr/bin/env bash
# examples/replay/replay_demo.sh: the replay demo (`make demo`). Runs the gsp
# workload (LRU, page sizes 1 and 16, capacities 131072 and 1048576 tokens) and
# the Mooncake trace (page size 16, capacities 100k/1M/3M tokens, LRU, LFU and
# SLRU) and prints one aligned table; then gsp through the tiered cache: a
# small device tier alone, with a host tier 4x as large, and two processes in
# turn sharing a storage directory (docs/tiers.md). Takes about 30 seconds.
#
#   usage: replay_demo.sh PATH/TO/replay PATH/TO/shared
set -euo pipefail
export LC_ALL=C  # printf rounds with a decimal point whatever the locale

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PATH/TO/replay PATH/TO/shared" >&2
  exit 2
fi
replay=$1
shared=$2
trace=$shared/traces/mooncake/conversation_trace.jsonl
if [[ ! -x $replay ]]; then
  echo "$0: $replay is not an executable (build the replay target first)" >&2
  exit 2
fi

# The value of a number or string field of the one-line JSON object in $1.
field() {
  sed -E "s/.*\"$2\":\"?([^,\"}]*).*/\1/" <<<"$1"
}

row_format="%-10s %-5s %5s %9s %9s %7s %11s %11s %10s\n"
# shellcheck disable=SC2059
printf "$row_format" workload policy page capacity hit_rate failed requests/s meta_B/tok mem_bound
run() {  # run WORKLOAD_LABEL REPLAY_ARGS...
  local label=$1
  shift
  local json
  json=$("$replay" "$@" --json)
  # shellcheck disable=SC2059
  printf "$row_format" "$label" "$(field "$json" policy)" "$(field "$json" page_size)" "$(field "$json" capacity)" \
    "$(printf %.4f "$(field "$json" hit_rate)")" "$(field "$json" failed_requests)" \
    "$(printf %.0f "$(field "$json" requests_per_s)")" \
    "$(printf %.2f "$(field "$json" metadata_bytes_per_token)")" \
    "$(printf %.3f "$(field "$json" memory_bound_fraction)")"
}

for page in 1 16; do
  for capacity in 131072 1048576; do
    run gsp --workload gsp --page-size "$page" --capacity "$capacity" --policy lru --repeat 3
  done
done
if [[ -f $trace ]]; then
  for capacity in 100000 1000000 3000000; do
    for policy in lru lfu slru; do
      run mooncake --workload "mooncake:$trace" --page-size 16 --capacity "$capacity" --policy "$policy"
    done
  done
else
  echo "(no Mooncake trace at $trace: its rows are skipped)"
fi
echo "gsp: 1024 requests, unbounded optimum hit rate 0.8824; requests/s of gsp are medians of 3 runs."
echo "meta_B/tok: tree metadata bytes per cached token at the peak; mem_bound: memory-bound fraction."

# ---- tiers: gsp with a device tier (L1) of 32768 tokens --------------------
echo
echo "Tiers (docs/tiers.md): gsp, page 16, device tier (L1) 32768 tokens; hit rate by where the tokens came from"
tier_format="%-44s %9s %9s %9s %9s\n"
# shellcheck disable=SC2059
printf "$tier_format" setup hit_rate device host storage
tier_run() {  # tier_run LABEL REPLAY_ARGS...
  local label=$1
  shift
  local json
  json=$("$replay" --workload gsp --page-size 16 --capacity 32768 "$@" --json)
  # shellcheck disable=SC2059
  printf "$tier_format" "$label" "$(printf %.4f "$(field "$json" hit_rate)")" \
    "$(printf %.4f "$(field "$json" hit_rate_device)")" "$(printf %.4f "$(field "$json" hit_rate_host)")" \
    "$(printf %.4f "$(field "$json" hit_rate_storage)")"
}
storage_dir=$(mktemp -d)
trap 'rm -rf "$storage_dir"' EXIT
alone=$("$replay" --workload gsp --page-size 16 --capacity 32768 --json)
# shellcheck disable=SC2059
printf "$tier_format" "L1 alone" "$(printf %.4f "$(field "$alone" hit_rate)")" \
  "$(printf %.4f "$(field "$alone" hit_rate)")" "$(printf %.4f 0)" "$(printf %.4f 0)"
for policy in write_through write_through_selective write_back; do
  tier_run "+ L2 131072 ($policy)" --l2-capacity 131072 --write-policy "$policy"
done
tier_run "+ L2 + storage dir, 1st process (writes)" --l2-capacity 131072 --storage "file://$storage_dir" --model-id replay-demo-model
tier_run "+ L2 + storage dir, 2nd process (reads)" --l2-capacity 131072 --storage "file://$storage_dir" --model-id replay-demo-model
echo "The 2nd process starts with empty L1 and L2: what it finds beyond its own work, the 1st stored."
