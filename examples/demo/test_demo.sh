#!/usr/bin/env bash
# examples/demo/test_demo.sh CLM_DEMO TINY_CONFIG [CLM_FIT]: the demo on a
# 2-layer model and 3 users. It must exit 0, print every table, and its cached
# run must find cached tokens (in the table and in the metrics text). With
# CLM_FIT: CLM parts trained on the demo's own conversations (as demo.sh
# does, into a temporary folder), then the demo with CLM in the loop, whose
# reuse lines must each name the question asked and the question served, and
# agree with the pairs file (--reuse-tsv) it names: the same pairs, and the
# same counts of hits and of hits from another intent, counted here with awk;
# the hits also agree with the loop's lookups. No hit at all passes too (the
# keyer may abstain on every question), with its "no lookup" line.
set -euo pipefail
demo=$1
config=$2
clm_fit=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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

if [[ -z $clm_fit ]]; then
  echo "test_demo: ok ($computed_on of $prompt_on prompt tokens computed with the cache; CLM not run: no CLM_FIT)"
  exit 0
fi
# CLM in the loop: collect, train, run (6 users: some repeats to find).
small=(--config "$config" --users 6 --turns 2 --system-bytes 300 --max-new-tokens 4 --device-tokens 1024
  --host-tokens 4096)
"$demo" "${small[@]}" --collect "$keys/collect" >/dev/null 2>&1 || fail "clm_demo --collect failed"
"$here/../tiny_llama/train_clm.sh" "$clm_fit" "$keys/collect" "$keys/trained" >/dev/null || fail "train_clm.sh failed"
pairs=$keys/reuse.tsv
out=$("$demo" "${small[@]}" --clm-dir "$keys/trained" --src-threshold 0 --reuse-tsv "$pairs" 2>/dev/null)
grep -qF "CLM reuse, per snapshot the store served" <<<"$out" || fail "no CLM reuse section"
grep -qxF "  the pairs, as TSV: $pairs" <<<"$out" || fail "the pairs file is not named"
[[ -f $pairs ]] || fail "no pairs file $pairs"
header=$'asked_user\tasked_turn\tasked_intent\tasked\tserved_user\tserved_turn\tserved_intent\tserved\tlevel\tkey\tversion\tsimilarity\thits\tother_intent'
[[ $(head -n 1 "$pairs") == "$header" ]] || fail "the pairs file's header is $(head -n 1 "$pairs")"
# Each reuse line: a mark, the question asked [intent] <- the question served [intent] (level, key vN, ...).
lines=$(grep -E '^  (same |OTHER|\?    )  asked "' <<<"$out" || true)
if [[ -n $lines ]]; then
  bad=$(grep -vE '^  (same |OTHER)  asked ".+" \[[a-z][a-z0-9_]*\] <- served ".+" \[[a-z][a-z0-9_]*\] \((exact|ann), .+ v[0-9]+, similarity -?[0-9.]+, [0-9]+ hits?\)$|^  \?      asked ".+" \[[a-z][a-z0-9_]*\] <- served \(no question: .*\) \((exact|ann|fallback), .+\)$' \
    <<<"$lines" || true)
  [[ -z $bad ]] || fail "reuse lines without both questions: $bad"
fi
printed=$(grep -cE '^  (same |OTHER|\?    )  asked "' <<<"$out" || true)
read -r reuse_hits reuse_pairs other_hits other_pairs < <(sed -nE \
  's/^  reuse: ([0-9]+) hits in ([0-9]+) pairs, of which from another intent: ([0-9]+) hits in ([0-9]+) pairs.*/\1 \2 \3 \4/p' \
  <<<"$out") || fail "no reuse totals line"
# The file, counted independently: rows, hits, and the rows whose intents differ (a known served question).
read -r f_pairs f_hits f_other_pairs f_other_hits f_marked < <(awk -F'\t' 'NR > 1 {
    pairs++; hits += $13
    if ($7 != "-" && $7 != $3) { other_pairs++; other_hits += $13 }
    marked += $14
  } END { printf "%d %d %d %d %d\n", pairs, hits, other_pairs, other_hits, marked }' "$pairs")
[[ $printed == "$reuse_pairs" && $f_pairs == "$reuse_pairs" ]] || fail "pairs: $printed lines, $reuse_pairs in the totals, $f_pairs in the file"
[[ $f_hits == "$reuse_hits" ]] || fail "hits: $reuse_hits printed, $f_hits in the file"
[[ $f_other_pairs == "$other_pairs" && $f_marked == "$other_pairs" && $f_other_hits == "$other_hits" ]] ||
  fail "other intent: $other_hits hits in $other_pairs pairs printed; the file: $f_other_hits in $f_other_pairs (marked $f_marked)"
(($(grep -c '^  OTHER  ' <<<"$out" || true) == other_pairs)) || fail "OTHER lines differ from $other_pairs"
# The loop's own count of hits (its lookups line).
read -r exact ann fallback < <(sed -nE 's/^lookups +[0-9]+: exact ([0-9]+) +ann ([0-9]+) +fallback ([0-9]+) .*/\1 \2 \3/p' <<<"$out")
((exact + ann + fallback == reuse_hits)) || fail "the loop counted $((exact + ann + fallback)) hits, the reuse lines $reuse_hits"
# Every question of the file is one of questions.tsv, under its intent.
unknown=$(awk -F'\t' 'FNR == NR { if ($0 !~ /^#/ && NF == 3) intent[$3] = $1; next }
  FNR > 1 && (intent[$4] != $3 || ($8 != "-" && intent[$8] != $7)) { print }' "$here/questions.tsv" "$pairs")
[[ -z $unknown ]] || fail "pairs whose questions are not in questions.tsv under their intent: $unknown"
if ((reuse_hits == 0)); then
  grep -qF "(no lookup was served a snapshot)" <<<"$out" || fail "no hits, and no line that says so"
fi
echo "test_demo: ok ($computed_on of $prompt_on prompt tokens computed with the cache; CLM: $reuse_hits hits in $reuse_pairs pairs," \
  "$other_hits hits in $other_pairs pairs from another intent)"
