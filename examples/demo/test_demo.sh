#!/usr/bin/env bash
# examples/demo/test_demo.sh CLM_DEMO TINY_CONFIG: the demo on a 2-layer
# model and 3 users. It must exit 0, print every table, and its cached run
# must find cached tokens (in the table and in the metrics text).
set -euo pipefail
demo=$1
config=$2
out=$("$demo" --config "$config" --users 3 --turns 2 --system-bytes 300 --max-new-tokens 4 --device-tokens 1024 \
  --host-tokens 4096 2>/dev/null)
fail() {
  echo "test_demo: $1" >&2
  echo "$out" >&2
  exit 1
}
for line in "prompt tokens" "cached tokens, from the device" "TTFT p50 (ms)" "TTFT p99 (ms)" "tokens/s" \
  "TTFT by turn" "# TYPE clm_prefix_cache_hits_total counter"; do
  grep -qF -- "$line" <<<"$out" || fail "no \"$line\" in the output"
done
# Cache on: computed < prompt tokens; cache off: computed == prompt tokens.
read -r _ _ prompt_off prompt_on < <(grep -E '^ +prompt tokens ' <<<"$out" | tr -d ,)
read -r _ _ _ computed_off computed_on < <(grep -E '^ +prompt tokens computed' <<<"$out" | tr -d ,)
[[ $prompt_off == "$prompt_on" && $computed_off == "$prompt_off" ]] || fail "the cache-off run computed $computed_off of $prompt_off"
((computed_on < prompt_on)) || fail "the cached run found nothing: computed $computed_on of $prompt_on"
hits=$(sed -nE 's/^clm_prefix_cache_hits_total ([0-9]+)$/\1/p' <<<"$out")
# At least: an admission put back for lack of room was matched (and counted) once more.
[[ -n $hits ]] && ((hits >= prompt_on - computed_on)) || fail "clm_prefix_cache_hits_total $hits < $((prompt_on - computed_on))"
echo "test_demo: ok ($computed_on of $prompt_on prompt tokens computed with the cache)"
