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

# The model key demo.sh compares before reusing trained CLM parts: the shape
# from --config, the weights' source; another seed is another model.
keys=$(mktemp -d "${TMPDIR:-/tmp}/test-demo-key.XXXXXX")
trap 'rm -rf "$keys"' EXIT
"$demo" --config "$config" --write-model-key "$keys/a"
"$demo" --config "$config" --write-model-key "$keys/b"
"$demo" --config "$config" --seed 2 --write-model-key "$keys/c"
"$demo" --write-model-key "$keys/d"
hidden=$(sed -nE 's/.*"hidden_size": *([0-9]+).*/\1/p' "$config")
grep -qE "\"hidden_size\": $hidden," "$keys/a" || fail "the model key has no hidden_size $hidden: $(cat "$keys/a")"
grep -qx "weights: random init, seed 1" "$keys/a" || fail "the model key does not name the weights: $(cat "$keys/a")"
cmp -s "$keys/a" "$keys/b" || fail "the same model gave two keys"
! cmp -s "$keys/a" "$keys/c" || fail "seeds 1 and 2 gave the same key"
! cmp -s "$keys/a" "$keys/d" || fail "--config and the default shape gave the same key"
if "$demo" --config "$keys/missing.json" --write-model-key "$keys/e" 2>/dev/null; then
  fail "--write-model-key with a missing config succeeded"
fi
# A weights file is named by its bytes: moved, the same key; replaced in place, another.
head -c 100000 /dev/urandom >"$keys/w1"
cp "$keys/w1" "$keys/w2"
"$demo" --weights "$keys/w1" --write-model-key "$keys/f"
"$demo" --weights "$keys/w2" --write-model-key "$keys/g"
cmp -s "$keys/f" "$keys/g" || fail "the same weights at two paths gave two keys"
grep -qx "weights: file with SHA-256 $(sha256sum "$keys/w1" | cut -d' ' -f1)" "$keys/f" ||
  fail "the model key does not hold the weights' SHA-256: $(cat "$keys/f")"
printf 'x' >>"$keys/w1"  # the same path, one byte more
"$demo" --weights "$keys/w1" --write-model-key "$keys/h"
! cmp -s "$keys/f" "$keys/h" || fail "weights changed in place kept their key"
if "$demo" --weights "$keys/missing.safetensors" --write-model-key "$keys/i" 2>/dev/null; then
  fail "--write-model-key with a missing weights file succeeded"
fi
echo "test_demo: ok ($computed_on of $prompt_on prompt tokens computed with the cache)"
