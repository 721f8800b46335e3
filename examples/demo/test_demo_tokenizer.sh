#!/usr/bin/env bash
# examples/demo/test_demo_tokenizer.sh CLM_DEMO TINY_CONFIG TOKENIZER_JSON: the
# demo with Qwen3's tokenizer (examples/tokenizer) on a 2-layer model: it must
# exit 0 with the model's vocabulary the tokenizer's, find cached tokens, and
# print per turn the tokenizer's prompt tokens against the byte tokens of the
# same conversation, fewer with the tokenizer; with CLM it is refused.
set -euo pipefail
demo=$1
config=$2
tokenizer=$3
[[ -f $tokenizer ]] || { echo "test_demo_tokenizer: $tokenizer is missing (make deps installs it)" >&2; exit 1; }
out=$("$demo" --config "$config" --users 3 --turns 2 --system-bytes 300 --max-new-tokens 4 --device-tokens 1024 \
  --host-tokens 4096 --tokenizer "$tokenizer" 2>/dev/null)
fail() {
  echo "test_demo_tokenizer: $1" >&2
  echo "$out" >&2
  exit 1
}
grep -qF "(vocabulary 151669)" <<<"$out" || fail "the model's vocabulary is not the tokenizer's"
read -r _ _ prompt_off prompt_on < <(grep -E '^ +prompt tokens ' <<<"$out" | tr -d ,)
read -r _ _ _ computed_off computed_on < <(grep -E '^ +prompt tokens computed' <<<"$out" | tr -d ,)
[[ $prompt_off == "$prompt_on" && $computed_off == "$prompt_off" ]] || fail "the cache-off run computed $computed_off of $prompt_off"
((computed_on < prompt_on)) || fail "the cached run found nothing: computed $computed_on of $prompt_on"
turns=0
while read -r _ turn real bytes _; do
  ((real > 0 && real < bytes)) || fail "turn $turn: $real tokenizer tokens against $bytes byte tokens"
  turns=$((turns + 1))
done < <(sed -n '/^Prompt tokens by turn/,/^$/p' <<<"$out" | grep -E '^ +turn ' | tr -d ,)
((turns == 2)) || fail "$turns turns in the prompt-token table, not 2"
# The prompt tokens of the table's cached run add up to the run's prompt tokens.
sum=$(sed -n '/^Prompt tokens by turn/,/^$/p' <<<"$out" | grep -E '^ +turn ' | tr -d , | awk '{s += $3} END {print s}')
((sum == prompt_on)) || fail "the turns' prompt tokens add up to $sum, not $prompt_on"
if "$demo" --tokenizer "$tokenizer" --clm-dir /nonexistent >/dev/null 2>&1; then
  fail "--tokenizer with --clm-dir was accepted"
fi
echo "test_demo_tokenizer: ok ($prompt_on tokenizer tokens)"
