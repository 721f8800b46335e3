#!/usr/bin/env bash
# examples/snapshot_store/test_clm_store.sh: a session with the clm_store tool,
# checked step by step (ctest runs it as clm_store_cli):
#
#   test_clm_store.sh PATH/TO/clm_store
#
# key on paraphrases, negations and bad lines; ingest of generated JSON lines
# (random unit vectors, a fresh seed each run: CLM_STORE_TEST_SEED=N repeats a
# run) into a temporary store; lookups at levels exact (the vector back within
# f16 tolerance) and ann (a noisy copy under another key of the same group),
# tenant isolation, stats, eviction, rebuild-index after deleting the index
# files, check; the reading commands beside a holder of the store's lock; the key rules a store records (refused under others), rekey
# and rekey --adopt; and bad input (malformed JSON, a wrong dimension, numbers
# that are no finite float, missing flags) refused with a non-zero exit and the
# store's rows unchanged; administration by hand (versions, pin, unpin,
# rollback, blacklist, delete-key, delete-tenant) in a store of its own;
# anomalies from a CLM watch's JSON lines (the window, the last line per key,
# bad lines named) with that store's blacklist; plot
# of a key of two meanings (its PNG, its points) and its refusals, in a store of
# its own. Texts are keyed with the test's own lexicons (the
# built-in ones change with the key rules, and no key string of theirs is
# checked here). Plain bash and awk; everything it writes lies in one mktemp -d
# directory, removed at the end.
# shellcheck disable=SC2015  # `[ A ] && [ B ] || fail ...` fails when either test does: meant
set -euo pipefail

bin=${1:?usage: test_clm_store.sh PATH/TO/clm_store}
work=$(mktemp -d "${TMPDIR:-/tmp}/clm_store_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
seed=${CLM_STORE_TEST_SEED:-$(((RANDOM << 15) | RANDOM))}
store=$work/store
dim=24
checks=0

fail() {
  echo "FAIL: $*" >&2
  echo "--- stdout:" >&2
  head -c 4000 "$work/out" >&2 || true
  echo "--- stderr:" >&2
  head -c 4000 "$work/err" >&2 || true
  echo "(seed $seed: CLM_STORE_TEST_SEED=$seed repeats this run)" >&2
  exit 1
}
ok() {
  checks=$((checks + 1))
  echo "ok $checks - $*"
}

# run ARGS...: the tool's stdout in $work/out, stderr in $work/err, status in $rc (stdin: /dev/null).
run() {
  set +e
  "$bin" "$@" </dev/null >"$work/out" 2>"$work/err"
  rc=$?
  set -e
}
# run_in FILE ARGS...: the same with FILE on stdin.
run_in() {
  local input=$1
  shift
  set +e
  "$bin" "$@" <"$input" >"$work/out" 2>"$work/err"
  rc=$?
  set -e
}
# run_no_wait ARGS...: run ARGS (a lookup with --no-wait), again while its miss is only the breaker's
# (a lookup past --no-wait's 2 ms on a loaded machine: ASan, a parallel ctest), at most 5 times.
run_no_wait() {
  local try
  for try in 1 2 3 4 5; do
    run "$@"
    grep -q "was busy: the miss is the breaker's" "$work/err" || return 0
  done
}
expect_rc() { [ "$rc" = "$1" ] || fail "$2: exit status $rc, expected $1"; }
expect_err() { grep -q -- "$1" "$work/err" || fail "$2: stderr lacks '$1'"; }
expect_out() { grep -q -- "$1" "$work/out" || fail "$2: stdout lacks '$1'"; }
# field NAME: the first "NAME":value of the JSON on stdout (strings without their quotes).
field() { grep -o "\"$1\":[^,}]*" "$work/out" | head -1 | cut -d: -f2- | tr -d '"'; }
# array NAME: the first "NAME":[...] of the JSON on stdout, as comma-separated numbers.
array() { grep -o "\"$1\":\[[^]]*\]" "$work/out" | head -1 | sed 's/^[^[]*\[//; s/\]$//'; }
# snapshot_of FILE KEY: the snapshot of the line with "key":"KEY" in a JSONL file.
snapshot_of() { grep "\"key\":\"$2\"," "$1" | head -1 | sed 's/.*"snapshot":\[//; s/\].*//'; }
# close A B TOL: the comma-separated vectors A and B agree within TOL in every component.
close() {
  awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN {
    na = split(a, x, ","); nb = split(b, y, ",")
    if (na != nb || na == 0) exit 1
    for (i = 1; i <= na; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > tol) exit 1 }
  }'
}
rows() {
  run stats --store "$store" "${L1[@]}" --json
  expect_rc 0 "stats"
  field rows
}

echo "# clm_store test: seed $seed, work dir $work"

# The test's lexicons (suffix_key.hpp: surface<TAB>category<TAB>CANONICAL); lex2
# names the detail "status" STATE, so every key with it changes under lex2.
lex=$work/lexicons
lex2=$work/lexicons2
mkdir -p "$lex" "$lex2"
printf '%s\t%s\t%s\n' check action QUERY order object ORDER status detail STATUS please stopword PLEASE \
  the stopword THE of stopword OF what question QUERY is stopword IS "don t" negation NOT_ \
  hi greeting GREETING hello greeting GREETING there stopword THERE >"$lex/test.tsv"
sed 's/\tSTATUS$/\tSTATE/' "$lex/test.tsv" >"$lex2/test.tsv"
# They replace the built-in lexicons, which change with the key rules.
L1=(--lexicons "$lex" --replace-lexicons)
L2=(--lexicons "$lex2" --replace-lexicons)

# ---- key -------------------------------------------------------------------
printf '%s\n' 'Please check the status of order 789' 'What is the status of order #789?' "Don't check order 789" '' \
  >"$work/texts.txt"
printf 'bad \xff\xfe utf-8\n' >>"$work/texts.txt"
printf '%s\n' 'Hi there' 'Hello!' 'Please check the status of order 790' >>"$work/texts.txt"
run_in "$work/texts.txt" key "${L1[@]}"
expect_rc 1 "key with two bad lines"
[ "$(wc -l <"$work/out")" = 8 ] || fail "key: one output line per input line"
key_of() { sed -n "${1}p" "$work/out" | cut -f1; }
[ -n "$(key_of 1)" ] || fail "key: a key for the first line"
text_key=$(key_of 1)
[ "$(key_of 1)" = "$(key_of 2)" ] || fail "key: a paraphrase shares a key"
[ "$(sed -n 1p "$work/out")" = "$(sed -n 2p "$work/out")" ] || fail "key: the same key, the same fingerprint"
[ "$(key_of 3)" != "$(key_of 1)" ] || fail "key: a negation gets another key"
[ "$(key_of 8)" != "$(key_of 1)" ] || fail "key: another order number, another key"
[ -z "$(key_of 4)" ] && [ -z "$(key_of 5)" ] || fail "key: a failed line prints an empty line"
[ "$(key_of 6)" = "$(key_of 7)" ] || fail "key: greetings share a key"
sed -n 1p "$work/out" | grep -qE $'^[A-Z0-9-]+\t[0-9a-f]{16}$' || fail "key: KEY<TAB>16 hex digits"
expect_err "line 4" "key: the empty line's error"
expect_err "line 5" "key: the invalid UTF-8 line's error"
expect_err "2 of 8 lines failed" "key: the count of failed lines"
ok "key: paraphrases share a key, a negation does not, bad lines are reported and skipped"

run_in "$work/texts.txt" key --json "${L1[@]}"
expect_rc 1 "key --json"
sed -n 3p "$work/out" >"$work/line3"
grep -q '"action":"NOT-QUERY"' "$work/line3" || fail "key --json: the negation is NOT-QUERY"
grep -q '"entity":"789"' "$work/line3" || fail "key --json: the entity"
grep -q '"object":"ORDER"' "$work/line3" || fail "key --json: the object"
sed -n 1p "$work/out" | grep -q '"details":\["STATUS"\]' || fail "key --json: the details"
sed -n 1p "$work/out" | grep -q '"low_information":false' || fail "key --json: low_information false"
sed -n 6p "$work/out" | grep -q '"low_information":true' || fail "key --json: a greeting is low_information"
sed -n 6p "$work/out" | grep -q '"abstain_reason":"[^"]' || fail "key --json: why a key abstains"
sed -n 4p "$work/out" | grep -q '"error":' || fail "key --json: the failed line's error"
ok "key --json: entity, action, object, details, low_information, abstain_reason, errors"

printf '%s\n' 'Please check the status of order 789' '帮我查下订单789的状态' >"$work/builtin.txt"
run_in "$work/builtin.txt" key
expect_rc 0 "key with the built-in lexicons"
[ "$(grep -c . "$work/out")" = 2 ] || fail "key: the built-in lexicons key English and Chinese"
ok "key: the built-in lexicons key English and Chinese text"

run key --lexicons "$work/no-such-dir"
[ "$rc" = 2 ] || fail "key --lexicons with a missing directory: exit 2"
run key --replace-lexicons
[ "$rc" = 2 ] || fail "key --replace-lexicons without --lexicons: exit 2"
expect_err "needs --lexicons" "--replace-lexicons without --lexicons"
ok "key: a missing lexicon directory, or --replace-lexicons without one, is an error"

# ---- ingest ------------------------------------------------------------------
# n random unit vectors, keys k0..k(n-1) in 24 groups; every 8th in tenant acme.
n=240
awk -v seed="$seed" -v n="$n" -v dim="$dim" '
  function gauss(  u1, u2) { u1 = rand(); u2 = rand(); if (u1 < 1e-12) u1 = 1e-12
                             return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2) }
  BEGIN {
    srand(seed)
    for (i = 0; i < n; i++) {
      norm = 0
      for (d = 0; d < dim; d++) { v[d] = gauss(); norm += v[d] * v[d] }
      norm = sqrt(norm)
      line = "{\"key\":\"k" i "\",\"group\":\"g" (i % 24) "\","
      if (i % 8 == 0) line = line "\"tenant\":\"acme\","
      line = line "\"snapshot\":["
      for (d = 0; d < dim; d++) line = line sprintf("%s%.7f", d ? "," : "", v[d] / norm)
      print line "]}"
    }
    # Two texts, one key: the second record confirms the first. Then a
    # greeting, on which the keyer abstains: not stored.
    for (t = 0; t < 3; t++) {
      text = t == 0 ? "Please check the status of order 789" : t == 1 ? "What is the status of order #789?" : "Hello there"
      line = "{\"text\":\"" text "\",\"snapshot\":["
      for (d = 0; d < dim; d++) line = line sprintf("%s%.7f", d ? "," : "", d == 0 ? 1 : 0)
      print line "]}"
    }
  }' >"$work/data.jsonl"
total=$((n + 1))

run_in "$work/data.jsonl" ingest --store "$store" "${L1[@]}" --dim "$dim" --shards 4 --min-usage 1 --json
expect_rc 0 "ingest"
[ "$(field records)" = $((n + 3)) ] || fail "ingest: records"
[ "$(field admitted)" = "$total" ] || fail "ingest: every key admitted at once (--min-usage 1)"
[ "$(field confirmed)" = 1 ] || fail "ingest: the paraphrase confirms the text's key"
[ "$(field abstained)" = 1 ] || fail "ingest: the greeting abstained"
[ "$(field rows_before)" = 0 ] && [ "$(field rows_after)" = "$total" ] || fail "ingest: rows before and after"
ok "ingest: $((n + 3)) records of a generated JSONL, $total rows (a greeting abstained)"

run --help
expect_rc 0 "--help"
expect_out "rebuild-index" "--help lists the commands"
run ingest --help
expect_rc 0 "ingest --help"
expect_out "--min-usage" "ingest --help"
ok "--help, overall and per command"

run_in "$work/data.jsonl" ingest --store "$store" "${L1[@]}" --min-usage 1
expect_rc 0 "ingest again"
grep -qE "confirmed +$((n + 2))$" "$work/out" || fail "ingest again: every record confirms its key"
grep -qE "abstained +1$" "$work/out" || fail "ingest again: the greeting abstained again"
grep -qE "rows +$total \(was $total\)" "$work/out" || fail "ingest again: no new rows"
ok "ingest of the same records again: all confirmed, no new rows (the shape of the store is read from it)"

# ---- lookup ------------------------------------------------------------------
run lookup --store "$store" "${L1[@]}" --key k5 --group g5 --json --print-snapshot
expect_rc 0 "lookup k5"
[ "$(field level)" = exact ] || fail "lookup k5: level exact"
[ "$(field key)" = k5 ] && [ "$(field version)" = 1 ] && [ "$(field stable)" = true ] || fail "lookup k5: k5 v1, stable"
close "$(array snapshot)" "$(snapshot_of "$work/data.jsonl" k5)" 0.002 || fail "lookup k5: the ingested vector (f16)"
ok "lookup of an ingested key: level exact, the vector back within f16 tolerance"

run lookup --store "$store" "${L1[@]}" --key k5 --group g5
expect_rc 0 "lookup k5 (text)"
grep -qE '^level +exact$' "$work/out" || fail "lookup text output: the level"
ok "lookup: the human output"

# A noisy copy of k5 (cosine about 0.99) under a key never ingested.
noisy=$(awk -v a="$(snapshot_of "$work/data.jsonl" k5)" -v seed="$((seed + 1))" 'BEGIN {
  srand(seed); n = split(a, x, ",")
  for (i = 1; i <= n; i++) printf "%s%.7f", (i > 1 ? "," : ""), x[i] + 0.03 * (rand() - 0.5)
}')
run lookup --store "$store" "${L1[@]}" --key probe --group g5 --query "[$noisy]" --json
expect_rc 0 "lookup probe"
[ "$(field level)" = ann ] || fail "lookup of a noisy copy in the same group: level ann"
[ "$(field key)" = k5 ] || fail "lookup of a noisy copy: k5 served"
awk -v s="$(field similarity)" 'BEGIN { exit !(s > 0.95) }' || fail "lookup of a noisy copy: similarity"
ok "lookup of a noisy copy under another key of the same group: level ann, k5"

run lookup --store "$store" "${L1[@]}" --key probe --group g6 --query "[$noisy]" --json
expect_rc 0 "lookup probe g6"
[ "$(field level)" = miss ] || fail "lookup of a noisy copy in another group: miss"
ok "lookup of the same vector in another group: miss"

printf '{"snapshot":[%s]}\n' "$noisy" >"$work/query.json"
run lookup --store "$store" "${L1[@]}" --key probe --group g5 --query-file "$work/query.json" --json
[ "$(field level)" = ann ] || fail "lookup --query-file"
ok "lookup --query-file"

run lookup --store "$store" "${L1[@]}" --key k0 --group g0 --json
[ "$(field level)" = miss ] || fail "lookup of tenant acme's key by the default tenant: miss"
run lookup --store "$store" "${L1[@]}" --key k0 --group g0 --tenant acme --json
[ "$(field level)" = exact ] || fail "lookup of k0 by tenant acme: exact"
ok "tenants see only their own rows"

run lookup --store "$store" "${L1[@]}" "What is the status of order #789?" --json
[ "$(field query_key)" = "$text_key" ] && [ "$(field level)" = exact ] || fail "lookup by text"
run lookup --store "$store" "${L1[@]}" "Hello there" --json
[ "$(field low_information)" = true ] && [ "$(field level)" = miss ] || fail "lookup of a greeting: level 3 only"
ok "lookup by text; a greeting is never served a stored row"

# ---- stats, evict ------------------------------------------------------------
run stats --store "$store" "${L1[@]}" --json
expect_rc 0 "stats"
[ "$(field rows)" = "$total" ] || fail "stats: rows"
[ "$(grep -o '"shard":' "$work/out" | wc -l)" = 4 ] || fail "stats: four shards"
tenants=$(field shard_tenants)
[ "$(field index_files)" = "$tenants" ] || fail "stats: an index file per shard and tenant"
run stats --store "$store" "${L1[@]}"
expect_rc 0 "stats (table)"
grep -qE "^ *total +$total " "$work/out" || fail "stats table: the total row"
ok "stats: $total rows in 4 shards, $tenants index files"

run evict --store "$store" "${L1[@]}" --json
expect_rc 0 "evict"
[ "$(field deleted)" = 0 ] && [ "$(field rows_after)" = "$total" ] || fail "evict with nothing old deletes nothing"
ok "evict: nothing old, nothing deleted"

# ---- rebuild-index -----------------------------------------------------------
rm -f "$store"/*.hnsw "$store"/*.hnsw.meta
run stats --store "$store" "${L1[@]}" --json
[ "$(field index_files)" = 0 ] || fail "stats after deleting the index files"
run rebuild-index --store "$store" "${L1[@]}" --json
expect_rc 0 "rebuild-index"
[ "$(field indexes)" = "$tenants" ] || fail "rebuild-index: indexes"
run stats --store "$store" "${L1[@]}" --json
[ "$(field index_files)" = "$tenants" ] || fail "rebuild-index: the index files are back"
run_no_wait lookup --store "$store" "${L1[@]}" --key probe --group g5 --query "[$noisy]" --json --no-wait
[ "$(field level)" = ann ] && [ "$(field key)" = k5 ] || fail "level 2 after rebuild-index"
ok "rebuild-index after deleting every index file: files back, level 2 answers (without waiting)"

rm -f "$store"/*.hnsw "$store"/*.hnsw.meta
run lookup --store "$store" "${L1[@]}" --key probe --group g5 --query "[$noisy]" --json
[ "$(field level)" = ann ] || fail "lookup rebuilds a missing index before it answers"
expect_err "rebuilt first" "lookup: the note on the rebuilt indexes"
ok "lookup with the index files gone: rebuilt first, level ann"

# ---- beside a server: the commands that only read open the store read-only -------
# evict --dry-run below matches rows last used before this second; the lookups above used
# rows moments ago, and the readers below count no usage.
sleep 1.1
# This shell holds the store's lock (fd 9), as a server's open store does.
exec 9>>"$store/LOCK"
flock -x -n 9 || fail "could not take the store's lock"
run delete-key --store "$store" "${L1[@]}" --key k5 --group g5
[ "$rc" = 2 ] && grep -q "already open" "$work/err" || fail "a writer beside the lock's holder: refused"
run stats --store "$store" "${L1[@]}" --json
[ "$rc" = 0 ] && [ "$(field rows)" = "$total" ] || fail "stats beside a writer"
run lookup --store "$store" "${L1[@]}" --key probe --group g5 --query "[$noisy]" --json
[ "$rc" = 0 ] && [ "$(field level)" = ann ] && [ "$(field key)" = k5 ] || fail "lookup beside a writer"
run versions --store "$store" "${L1[@]}" --key k5 --group g5 --json
[ "$rc" = 0 ] || fail "versions beside a writer"
run blacklist --store "$store" "${L1[@]}" --list --json
[ "$rc" = 0 ] || fail "blacklist --list beside a writer"
run evict --store "$store" "${L1[@]}" --older-than-days 0 --below-usage 1000000 --dry-run --json
[ "$rc" = 0 ] && [ "$(field matched)" = "$total" ] && [ "$(field deleted)" = 0 ] || fail "evict --dry-run beside a writer"
run check --store "$store" "${L1[@]}"
[ "$rc" = 0 ] || fail "check beside a writer"
flock -u 9
exec 9>&-
run stats --store "$store" "${L1[@]}" --json
[ "$(field rows)" = "$total" ] || fail "the readers changed the rows"
ok "beside a server holding the lock: a writer refused; stats, lookup, versions, blacklist --list, evict --dry-run, check run"

# ---- key rules: refused under others, rekey, rekey --adopt -------------------------
files_digest() { (cd "$store" && cksum shard-*.db | sort); }
digest_before=$(files_digest)
run stats --store "$store" --json
[ "$rc" = 2 ] || fail "a store opened under other key rules (the built-in lexicons)"
expect_err "failed_precondition" "other key rules: the status"
expect_err "key rules" "other key rules: what differs"
expect_err "clm_store rekey $store" "other key rules: what to run"
expect_err "rekey --adopt" "other key rules: how to keep the keys"
expect_err "same --lexicons" "other key rules: the hint about --lexicons"
[ "$(files_digest)" = "$digest_before" ] || fail "a refused open wrote to the store"
run lookup --store "$store" "${L2[@]}" --key k5 --group g5 --json
[ "$rc" = 2 ] || fail "lookup under other lexicons"
expect_err "is it the directory the store was made with" "other --lexicons: the hint"
[ "$(files_digest)" = "$digest_before" ] || fail "a refused lookup wrote to the store"
ok "a store opens only under the key rules it was made with; refused, it is left as it was"

run_in "$work/texts.txt" key "${L2[@]}"
text_key2=$(key_of 1)
[ -n "$text_key2" ] && [ "$text_key2" != "$text_key" ] || fail "lex2 gives the text another key"
run rekey "${L2[@]}" --json "$store"
expect_rc 0 "rekey to lex2"
[ "$(field adopted)" = false ] && [ "$(field resumed)" = false ] || fail "rekey: adopted, resumed"
[ "$(field old_format)" = 4 ] || fail "rekey: the format found"
[ "$(field rows_before)" = "$total" ] && [ "$(field rows_after)" = "$total" ] || fail "rekey: rows before and after"
[ "$(field rekeyed)" = 1 ] && [ "$(field changed)" = 1 ] || fail "rekey: the text row's key made again, and changed"
[ "$(field kept)" = "$n" ] || fail "rekey: the host keys kept"
[ "$(field dropped)" = 0 ] || fail "rekey: nothing dropped"
[ "$(field indexes_rebuilt)" -ge 1 ] || fail "rekey: the indexes rebuilt"
[ "$(field old_rules)" != "$(field new_rules)" ] || fail "rekey: the rules change"
run lookup --store "$store" "${L2[@]}" "Please check the status of order 789" --json
[ "$(field query_key)" = "$text_key2" ] && [ "$(field level)" = exact ] || fail "lookup by text after rekey"
run lookup --store "$store" "${L2[@]}" --key k5 --group g5 --json --print-snapshot
[ "$(field level)" = exact ] || fail "a host key after rekey"
close "$(array snapshot)" "$(snapshot_of "$work/data.jsonl" k5)" 0.002 || fail "a host key's vector after rekey"
run_no_wait lookup --store "$store" "${L2[@]}" --key probe --group g5 --query "[$noisy]" --json --no-wait
[ "$(field level)" = ann ] && [ "$(field key)" = k5 ] || fail "level 2 after rekey (rebuilt indexes)"
run stats --store "$store" "${L1[@]}" --json
[ "$rc" = 2 ] || fail "the old lexicons after rekey"
ok "rekey --lexicons: the text's key made again, host keys and their vectors kept, level 2 answers"

run rekey --adopt "${L1[@]}" "$store"
expect_rc 0 "rekey --adopt"
expect_out "keep their keys" "rekey --adopt: the summary"
run lookup --store "$store" "${L1[@]}" "Please check the status of order 789" --json
[ "$(field level)" = miss ] || fail "after --adopt the keys are lex2's: the text's lex key misses"
run lookup --store "$store" "${L1[@]}" --key k5 --group g5 --json
[ "$(field level)" = exact ] || fail "a host key after --adopt"
run rekey --store "$store" "${L1[@]}"
expect_rc 0 "rekey back to lex"
expect_out "rekeyed from key rules" "rekey: the summary"
grep -qE "rows +$total -> $total$" "$work/out" || fail "rekey summary: rows"
run lookup --store "$store" "${L1[@]}" "Please check the status of order 789" --json
[ "$(field query_key)" = "$text_key" ] && [ "$(field level)" = exact ] || fail "lookup by text after rekey back"
ok "rekey --adopt keeps the keys as they are; rekey back makes them from the text again"

run rekey "$work/nowhere"
[ "$rc" = 2 ] || fail "rekey of a missing directory"
expect_err "no snapshot store" "rekey of a missing directory"
[ ! -e "$work/nowhere" ] || fail "rekey created a directory"
mkdir -p "$work/empty"
run rekey --adopt "$work/empty"
[ "$rc" = 2 ] || fail "rekey of a directory with no store"
expect_err "no snapshot store" "rekey of a directory with no store"
[ -z "$(ls -A "$work/empty")" ] || fail "rekey wrote into a directory with no store"
run rekey
[ "$rc" = 2 ] || fail "rekey without a directory"
expect_err "--store is required" "rekey without a directory"
run rekey "$store" "$work/empty"
[ "$rc" = 2 ] || fail "rekey of two directories"
run rekey --store "$store" "$store"
[ "$rc" = 2 ] || fail "rekey with the directory twice"
run rekey --frobnicate "$store"
[ "$rc" = 2 ] || fail "rekey --frobnicate"
run rekey --lexicons "$work/no-such-lexicons" "$store"
[ "$rc" = 2 ] || fail "rekey with a missing lexicon directory"
run rekey --help
expect_rc 0 "rekey --help"
expect_out "--adopt" "rekey --help"
[ "$(rows)" = "$total" ] || fail "the refused rekeys changed the rows"
ok "rekey: missing or empty directories, missing lexicons and bad flags are errors"

# ---- bad input: refused, nothing written ----------------------------------------
before=$(rows)
good() { printf '{"key":"%s","snapshot":[%s]}\n' "$1" "$(snapshot_of "$work/data.jsonl" k7)"; }
vec23=$(snapshot_of "$work/data.jsonl" k7 | cut -d, -f1-23)
bad_input() {  # bad_input NAME LINE EXPECTED-STDERR: three new keys, the bad line, one more
  { good new1; good new2; good new3; printf '%s\n' "$2"; good new4; } >"$work/bad.jsonl"
  run_in "$work/bad.jsonl" ingest --store "$store" "${L1[@]}" --min-usage 1
  [ "$rc" = 2 ] || fail "$1: exit status $rc, expected 2"
  expect_err ":4: " "$1: the line number"
  expect_err "$3" "$1"
  expect_err "nothing was written" "$1"
  [ "$(rows)" = "$before" ] || fail "$1: rows changed"
  run lookup --store "$store" "${L1[@]}" --key new1 --json
  [ "$(field level)" = miss ] || fail "$1: a good line before the bad one was written"
  ok "ingest refuses $1; nothing written"
}
bad_input "malformed JSON" '{"key":"bad","snapshot":[0.5, 0.25' "parse error"
bad_input "a wrong dimension" "{\"key\":\"bad\",\"snapshot\":[$vec23]}" "has 23 values"
bad_input "a number beyond double (1e999)" "{\"key\":\"bad\",\"snapshot\":[1e999,$vec23]}" "overflow"
bad_input "a number beyond float (1e39)" "{\"key\":\"bad\",\"snapshot\":[1e39,$vec23]}" "not a finite float"
bad_input "NaN as a string" "{\"key\":\"bad\",\"snapshot\":[\"NaN\",$vec23]}" "not a number"
bad_input "a bare NaN" "{\"key\":\"bad\",\"snapshot\":[NaN,$vec23]}" "parse error"
bad_input "a zero vector" "{\"key\":\"bad\",\"snapshot\":[$(printf '0,%.0s' $(seq 23))0]}" "no direction"
bad_input "an unknown field" "{\"key\":\"bad\",\"snapshots\":[$vec23,1]}" "unknown field"
bad_input "a field given twice" "{\"key\":\"bad\",\"key\":\"b\",\"snapshot\":[$vec23,1]}" "given twice"
bad_input "text and key" "{\"key\":\"bad\",\"text\":\"order 789\",\"snapshot\":[$vec23,1]}" "not both"
bad_input "text without content" "{\"text\":\" ?! \",\"snapshot\":[$vec23,1]}" "text:"
bad_input "an array line" "[1,2,3]" "expected a JSON object"

run_in "$work/data.jsonl" ingest --dim "$dim"
[ "$rc" = 2 ] || fail "ingest without --store"
expect_err "--store is required" "ingest without --store"
ok "ingest without --store: an error"

run_in "$work/data.jsonl" ingest --store "$store" "${L1[@]}" --dim 32
[ "$rc" = 2 ] || fail "ingest --dim 32 into a store of dim 24"
expect_err "snapshot_dim $dim" "--dim against the store's"
run_in "$work/data.jsonl" ingest --store "$work/new-store"
[ "$rc" = 2 ] || fail "ingest into a new store without --dim"
expect_err "--dim is required" "a new store without --dim"
[ ! -e "$work/new-store" ] || fail "a refused ingest created a directory"
run_in "$work/data.jsonl" ingest --store "$work/new-store" --dim 0
[ "$rc" = 2 ] || fail "--dim 0"
ok "ingest: --dim must agree with the store, a new store needs one"

run lookup --store "$store" "${L1[@]}" --key k5 --query "[0.5, 0.5]"
[ "$rc" = 2 ] || fail "lookup with a query of the wrong length"
expect_err "has 2 values" "lookup: the query's length"
run lookup --store "$store" "${L1[@]}" --key k5 --query "[$(printf '0,%.0s' $(seq 23))0]"
[ "$rc" = 2 ] || fail "lookup with a zero query"
run lookup --store "$store" "${L1[@]}"
[ "$rc" = 2 ] || fail "lookup without a key"
run lookup --store "$store" "${L1[@]}" --key k5 --text hello
[ "$rc" = 2 ] || fail "lookup with a key and a text"
ok "lookup: a query of the wrong length or no direction, no key, two keys: errors"

run stats --store "$work/nowhere"
[ "$rc" = 2 ] || fail "stats of a missing store"
expect_err "no snapshot store" "stats of a missing store"
[ ! -e "$work/nowhere" ] || fail "stats created a store"
run stats
[ "$rc" = 2 ] || fail "stats without --store"
expect_err "--store is required" "stats without --store"
run stats --store "$store" "${L1[@]}" --frobnicate
[ "$rc" = 2 ] || fail "an unknown flag"
expect_err "unknown flag --frobnicate" "an unknown flag"
run evict --store "$store" "${L1[@]}" --older-than-days -1
[ "$rc" = 2 ] || fail "evict --older-than-days -1"
run evict --store "$store" "${L1[@]}" --below-usage many
[ "$rc" = 2 ] || fail "evict --below-usage many"
run frobnicate
[ "$rc" = 2 ] || fail "an unknown command"
run
[ "$rc" = 2 ] || fail "no command"
ok "missing or unknown stores, flags and commands: errors"

[ "$(rows)" = "$before" ] || fail "the refused commands changed the rows"
run check --store "$store" "${L1[@]}"
expect_rc 0 "check"
expect_out "ok: 4 shards, $total rows" "check"
ok "check: ok, $total rows; the rows unchanged by every refused command"

# ---- administration by hand (a store of its own) -----------------------------------
astore=$work/admin-store
run_in "$work/data.jsonl" ingest --store "$astore" "${L1[@]}" --dim "$dim" --shards 4 --min-usage 1 --quiet
expect_rc 0 "ingest into the admin store"
run_in "$work/data.jsonl" ingest --store "$astore" "${L1[@]}" --min-usage 1 --quiet
expect_rc 0 "ingest into the admin store again: every version 1 stable"
awk -v dim="$dim" 'BEGIN { line = "{\"key\":\"k7\",\"group\":\"g7\",\"snapshot\":["
  for (d = 0; d < dim; d++) line = line (d ? "," : "") (d == 1 ? 1 : 0); print line "]}" }' >"$work/k7v2.jsonl"
run_in "$work/k7v2.jsonl" ingest --store "$astore" "${L1[@]}" --min-usage 1 --json
[ "$(field new_version)" = 1 ] || fail "a dissimilar snapshot of k7: a new version"
run versions --store "$astore" "${L1[@]}" --key k7 --group g7 --json
expect_rc 0 "versions k7"
[ "$(grep -o '"version":' "$work/out" | wc -l)" = 2 ] || fail "versions k7: two versions"
grep -q '"version":1,[^}]*"stable":true,"pinned":false,"served":true' "$work/out" ||
  fail "versions k7: version 1 stable and served"
grep -q '"version":2,[^}]*"stable":false,"pinned":false,"served":false' "$work/out" ||
  fail "versions k7: version 2 not stable, not served"
ok "versions: a key's two versions, the stable one served"

run pin --store "$astore" "${L1[@]}" --key k7 --group g7 --version 2
expect_rc 0 "pin k7 v2"
run lookup --store "$astore" "${L1[@]}" --key k7 --group g7 --json
[ "$(field version)" = 2 ] || fail "lookup after pin: version 2"
run unpin --store "$astore" "${L1[@]}" --key k7 --group g7
expect_rc 0 "unpin k7"
run lookup --store "$astore" "${L1[@]}" --key k7 --group g7 --json
[ "$(field version)" = 1 ] || fail "lookup after unpin: version 1"
run rollback --store "$astore" "${L1[@]}" --key k7 --group g7 --to 1 --json
expect_rc 0 "rollback k7"
[ "$(field deleted)" = 1 ] || fail "rollback k7 to 1: one version deleted"
run versions --store "$astore" "${L1[@]}" --key k7 --group g7 --json
[ "$(grep -o '"version":' "$work/out" | wc -l)" = 1 ] || fail "versions after rollback: one"
ok "pin serves version 2, unpin version 1 again, rollback deletes version 2"

run blacklist --store "$astore" "${L1[@]}" --key k9 --group g9 --reason "served a wrong answer" --hours 1
expect_rc 0 "blacklist k9"
run lookup --store "$astore" "${L1[@]}" --key k9 --group g9 --json
[ "$(field level)" = miss ] || fail "lookup of a blacklisted key: miss"
run blacklist --store "$astore" "${L1[@]}" --list --json
expect_rc 0 "blacklist --list"
[ "$(field key)" = k9 ] && [ "$(field by_hand)" = true ] && [ "$(field reason)" = "served a wrong answer" ] ||
  fail "blacklist --list: k9 by hand, with its reason"
run unblacklist --store "$astore" "${L1[@]}" --key k9 --group g9
expect_rc 0 "unblacklist k9"
run lookup --store "$astore" "${L1[@]}" --key k9 --group g9 --json
[ "$(field level)" = exact ] || fail "lookup after unblacklist: exact"
ok "blacklist by hand: refused, listed with its reason, lifted"

run delete-key --store "$astore" "${L1[@]}" --key k10 --group g10 --json
expect_rc 0 "delete-key k10"
[ "$(field deleted)" = 1 ] || fail "delete-key k10: one version"
run lookup --store "$astore" "${L1[@]}" --key k10 --group g10 --json
[ "$(field level)" = miss ] || fail "lookup after delete-key: miss"
run delete-tenant --store "$astore" "${L1[@]}" --tenant acme --json
expect_rc 0 "delete-tenant acme"
[ "$(field rows)" = $((n / 8)) ] || fail "delete-tenant acme: its $((n / 8)) rows"
run lookup --store "$astore" "${L1[@]}" --key k0 --group g0 --tenant acme --json
[ "$(field level)" = miss ] || fail "lookup of acme's key after delete-tenant: miss"
ok "delete-key and delete-tenant: rows gone, lookups miss"

run stats --store "$astore" "${L1[@]}" --json
arows=$(field rows)
for bad in "delete-key --key k10 --group g10" "unpin --key k7 --group g7" "pin --key k7 --group g7 --version 9" \
  "rollback --key k7 --group g7 --to 5" "unblacklist --key k9 --group g9" "versions --key nope" \
  "delete-tenant --tenant nobody" "blacklist --key k9 --group g9" "pin --key k7 --group g7" "blacklist --list --key k9"; do
  # shellcheck disable=SC2086  # word splitting of the flags is meant
  run $bad --store "$astore" "${L1[@]}"
  [ "$rc" = 2 ] || fail "clm_store $bad: exit status $rc, expected 2"
done
run stats --store "$astore" "${L1[@]}" --json
[ "$(field rows)" = "$arows" ] || fail "the refused administration changed the rows"
ok "administration on what is not there: exit status 2, nothing changed"

# ---- anomalies: a server's CLM watch, as JSON lines ---------------------------------
now=$(($(date +%s) * 1000))
{
  printf '{"time_ms":%d,"event":"low_src","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER","sightings":20,"median_src":0.0625}\n' $((now - 6000))
  printf '{"time_ms":%d,"event":"version_created","tenant":"acme","adapter_id":1,"key":"SHIP-ORDER","version":1}\n' $((now - 5000))
  printf '{"time_ms":%d,"event":"low_src","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER","sightings":31,"median_src":0.05}\n' $((now - 4000))
  printf '{"time_ms":%d,"event":"drift","tenant":"acme","adapter_id":1,"key":"SHIP-ORDER","version":2}\n' $((now - 3000))
  printf '{"time_ms":%d,"event":"blacklisted","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER","reason":"accuracy 0.40 below 0.95","until_ms":%d,"by":"breaker"}\n' $((now - 2000)) $((now + 86400000))
  echo
  printf '{"time_ms":%d,"event":"blacklisted","tenant":"old","adapter_id":0,"key":"OLD","reason":"x","until_ms":1,"by":"administrator"}\n' $((now - 172800000))
} >"$work/events.jsonl"
run anomalies --events "$work/events.jsonl" --json
expect_rc 0 "anomalies"
[ "$(field lines)" = 7 ] && [ "$(field in_window)" = 5 ] || fail "anomalies: 7 lines, 5 in the last day"
[ "$(field sightings)" = 31 ] && [ "$(field median_src)" = 0.05 ] || fail "anomalies: the last low_src line of the key"
[ "$(field drifts)" = 1 ] && [ "$(field last_version)" = 2 ] || fail "anomalies: a version and a drift, the last v2"
[ "$(field by)" = breaker ] && [ "$(field reason)" = "accuracy 0.40 below 0.95" ] ||
  fail "anomalies: the breaker's blacklist with its reason"
grep -q OLD "$work/out" && fail "anomalies: a line two days old in the last 24 hours"
run anomalies --events "$work/events.jsonl" --hours 0 --json
[ "$(field in_window)" = 6 ] || fail "anomalies --hours 0: every line"
run blacklist --store "$astore" "${L1[@]}" --key k9 --group g9 --reason "wrong refunds" --hours 1
expect_rc 0 "blacklist k9 again"
run anomalies --events "$work/events.jsonl" --store "$astore" "${L1[@]}"
expect_rc 0 "anomalies --store"
expect_out "REFUND-ORDER  31 sightings, median SRC 0.050" "anomalies: the low-SRC key in text"
expect_out "SHIP-ORDER  1 version(s), 1 by drift, the last v2" "anomalies: versions in text"
expect_out "k9  until .*wrong refunds" "anomalies --store: the store's blacklist now"
cp "$work/events.jsonl" "$work/bad-events.jsonl"
echo '{"time_ms":1,"event":"low_src","tenant":"a","key":"k","sightings":"many","median_src":0.1}' >>"$work/bad-events.jsonl"
run anomalies --events "$work/bad-events.jsonl"
expect_rc 2 "anomalies: a line with a bad field"
expect_err "bad-events.jsonl:8: \"sightings\" is not" "anomalies: the bad line named"
echo 'not json' >"$work/bad-events.jsonl"
run anomalies --events "$work/bad-events.jsonl"
expect_rc 2 "anomalies: not JSON"
expect_err "bad-events.jsonl:1: not JSON" "anomalies: not JSON, the line named"
echo '{"time_ms":1,"event":"exploded","tenant":"a","key":"k"}' >"$work/bad-events.jsonl"
run anomalies --events "$work/bad-events.jsonl"
expect_rc 2 "anomalies: an unknown event"
expect_err 'unknown event "exploded"' "anomalies: the unknown event named"
run anomalies --events "$work/no-such-file.jsonl"
expect_rc 2 "anomalies: no file"
run anomalies --events "$work/events.jsonl" --hours -1
expect_rc 2 "anomalies --hours -1"
ok "anomalies: the last low-SRC line per key, versions and drift, the breaker's reason, the window, the store's blacklist; bad lines named (exit 2)"

# ---- plot (a store of its own) ------------------------------------------------------
# Key pk holds two meanings: its records alternate between two far-apart
# centres (cosine below 0.3), each switch a new version (--version-cosine 0.9),
# so odd versions lie in one cluster and even ones in the other. Beside it,
# neighbour keys n0..n5 (n0, n1 near the centres) and a key of one row.
command -v gnuplot >/dev/null || fail "plot: gnuplot is not on PATH (Debian gnuplot-nox: make deps installs it)"
pstore=$work/plot-store
awk -v seed="$seed" -v dim="$dim" '
  function gauss(  u1, u2) { u1 = rand(); u2 = rand(); if (u1 < 1e-12) u1 = 1e-12
                             return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2) }
  function unit(v,   d, n) { n = 0; for (d = 0; d < dim; d++) n += v[d] * v[d]; n = sqrt(n)
                             for (d = 0; d < dim; d++) v[d] /= n }
  function emit(key, group, base, sigma,   d, v, line) {
    for (d = 0; d < dim; d++) v[d] = base[d] + sigma * gauss(); unit(v)
    line = "{\"key\":\"" key "\",\"group\":\"" group "\",\"snapshot\":["
    for (d = 0; d < dim; d++) line = line sprintf("%s%.7f", d ? "," : "", v[d])
    print line "]}"
  }
  BEGIN {
    srand(seed + 1)
    do {
      for (d = 0; d < dim; d++) { a[d] = gauss(); b[d] = gauss() }
      unit(a); unit(b); c = 0; for (d = 0; d < dim; d++) c += a[d] * b[d]
    } while (c > 0.3 || c < -0.3)
    for (i = 0; i < 8; i++) {
      if (i % 2) { emit("pk", "pg", b, 0.01); emit("pk", "pg", b, 0.01) } else { emit("pk", "pg", a, 0.01); emit("pk", "pg", a, 0.01) }
    }
    emit("n0", "h0", a, 0.1); emit("n1", "h1", b, 0.1)
    for (k = 2; k < 6; k++) { for (d = 0; d < dim; d++) r[d] = gauss(); emit("n" k, "h" k, r, 0) }
    for (d = 0; d < dim; d++) r[d] = gauss(); emit("lone", "pg", r, 0)
  }' >"$work/plot.jsonl"
run_in "$work/plot.jsonl" ingest --store "$pstore" "${L1[@]}" --dim "$dim" --shards 4 --min-usage 1 \
  --version-cosine 0.9 --json
expect_rc 0 "ingest into the plot store"
[ "$(field new_version)" = 7 ] || fail "plot store: pk's seven switches of meaning are seven new versions"
exec 9>>"$pstore/LOCK"  # held as a server holds it: plot opens the store read-only
flock -x -n 9 || fail "could not take the plot store's lock"
run plot --store "$pstore" "${L1[@]}" --key pk --group pg --top 3 --out "$work/pk.png" --points "$work/pk.tsv"
expect_rc 0 "plot pk"
[ "$(head -c 8 "$work/pk.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "plot: a PNG signature"
[ "$(wc -c <"$work/pk.png")" -gt 5000 ] || fail "plot: a PNG of some size"
[ "$(grep -c '^row	pk	' "$work/pk.tsv")" = 8 ] || fail "plot --points: a line for each of pk's 8 rows"
[ "$(grep -c '^neighbour	' "$work/pk.tsv")" -ge 3 ] || fail "plot --points: the neighbours' rows"
[ "$(awk -F'\t' '$1 == "neighbour" { print $2 }' "$work/pk.tsv" | sort -u | wc -l)" = 3 ] ||
  fail "plot --top 3: three neighbour keys"
awk -F'\t' '$1 == "neighbour" && $2 == "pk" { exit 1 }' "$work/pk.tsv" || fail "plot: the key is not its own neighbour"
awk -F'\t' '$1 == "neighbour" && ($2 == "n0" || $2 == "n1") { seen[$2] = 1 } END { exit !(seen["n0"] && seen["n1"]) }' \
  "$work/pk.tsv" || fail "plot: the keys near each meaning are among the nearest"
# Two meanings: odd versions on one side of the first axis, even ones on the other.
awk -F'\t' '$1 == "row" { side = ($4 > 0); parity = $3 % 2
    if (parity in seen && seen[parity] != side) exit 1; seen[parity] = side }
  END { exit !(seen[0] != seen[1]) }' "$work/pk.tsv" || fail "plot: the two meanings on either side of PC1"
expect_out "PC1" "plot: the explained variance"
ok "plot: a PNG of pk's 8 versions in two clusters and its 3 nearest keys, beside the store's lock holder"
rm -f "$work/none.png"
run plot --store "$pstore" "${L1[@]}" --key lone --group pg --out "$work/none.png" --points "$work/none.tsv"
expect_rc 2 "plot of a key with one row"
expect_err "one row has no shape to plot" "plot of a key with one row"
[ ! -e "$work/none.png" ] && [ ! -e "$work/none.tsv" ] || fail "plot of a key with one row: no picture, no points"
run plot --store "$pstore" "${L1[@]}" --key nobody --group pg --out "$work/none.png"
expect_rc 2 "plot of a key not stored"
expect_err "not_found" "plot of a key not stored"
expect_err "nobody" "plot of a key not stored: the key named"
[ ! -e "$work/none.png" ] || fail "plot of a key not stored: no picture"
run plot --store "$pstore" "${L1[@]}" --key pk --group pg --out "$work/pk.svg"
expect_rc 2 "plot --out not a .png"
run plot --store "$pstore" "${L1[@]}" --key pk --group pg --top 65 --out "$work/none.png"
expect_rc 2 "plot --top 65"
PATH=$work/no-such-dir run plot --store "$pstore" "${L1[@]}" --key pk --group pg --out "$work/none.png"
expect_rc 2 "plot without gnuplot"
expect_err "gnuplot is not on PATH" "plot without gnuplot: named"
[ ! -e "$work/none.png" ] || fail "plot without gnuplot: no picture"
flock -u 9
exec 9>&-
ok "plot refused (exit 2, a message, no picture): a key of one row, a key not stored, --out not .png, --top 65, no gnuplot"

# ---- evict for real --------------------------------------------------------------
run evict --store "$store" "${L1[@]}" --older-than-days 0 --below-usage 1000000 --dry-run
expect_rc 0 "evict --dry-run"
[ "$(rows)" = "$total" ] || fail "evict --dry-run deleted rows"
sleep 2  # every row's last_used is now at least a second ago
run evict --store "$store" "${L1[@]}" --older-than-days 0 --below-usage 1000000 --json --list
expect_rc 0 "evict all"
[ "$(field deleted)" = "$total" ] && [ "$(field matched)" = "$total" ] && [ "$(field rows_after)" = 0 ] ||
  fail "evict of every row"
run lookup --store "$store" "${L1[@]}" --key k5 --group g5 --json
[ "$(field level)" = miss ] || fail "lookup after eviction"
run check --store "$store" "${L1[@]}"
expect_rc 0 "check after eviction"
ok "evict --older-than-days 0: every row deleted, lookups miss, check ok"

echo "# all $checks checks passed"
