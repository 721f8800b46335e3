# examples/server/test_lib.sh: what the clm_server tests share (sourced by
# test_server.sh and test_server_limits.sh after they set $server and
# $probe): a mktemp -d work directory removed at exit (and a server still
# running killed), fail/ok/expect_eq, post (a chat completion with curl),
# field (a response's JSON field), refuse_to_start (flags that must not
# start a server), http_status, launch (a server on a free port with the
# tests' small model) and stop (SIGTERM, exit 0, the final JSON line).
# shellcheck shell=bash
export LC_ALL=C # ${#s} counts bytes
command -v curl >/dev/null 2>&1 || {
  echo "FAIL: curl is missing (make deps installs it)" >&2
  exit 1
}
work=$(mktemp -d "${TMPDIR:-/tmp}/clm_server_test.XXXXXX")
# The tests' model: small, random, byte vocabulary.
cat >"$work/config.json" <<'EOF'
{"vocab_size": 272, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096}
EOF
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
checks=0
page=8

fail() {
  echo "FAIL: $*" >&2
  echo "--- last response:" >&2
  head -c 2000 "$work/out" >&2 2>/dev/null || true
  echo >&2
  echo "--- server stderr:" >&2
  tail -c 2000 "$work/server.err" >&2 2>/dev/null || true
  exit 1
}
ok() {
  checks=$((checks + 1))
  echo "ok $checks - $*"
}
expect_eq() { [ "$1" = "$2" ] || fail "$3: got '$1', expected '$2'"; }

# post TENANT JSON [CURL ARGS...]: POST /v1/chat/completions; the body in
# $work/out, the status in $code. TENANT "-" sends no X-Tenant header.
post() {
  local tenant=$1 body=$2
  shift 2
  local headers=(-H 'Content-Type: application/json')
  [ "$tenant" = - ] || headers+=(-H "X-Tenant: $tenant")
  printf '%s' "$body" >"$work/request"
  code=$(curl -s -o "$work/out" -w '%{http_code}' "${headers[@]}" --data-binary @"$work/request" "$@" \
    "$base/v1/chat/completions") || fail "curl failed on $body"
}
field() { "$probe" get "$@" <"$work/out" || fail "reading $* of the response"; }
# The prompt's tokens: <|begin_of_text|>, per message a header (start, role,
# end, "\n\n"), the content's bytes and <|eot_id|>, then the assistant's header.
message_tokens() { echo $((1 + ${#1} + 1 + 2 + $2 + 1)); }
assistant_header=$((1 + 9 + 1 + 2))

# Everything admitted so far, for the metrics at the end.
queried=0 hits=0 generated=0 chats_ok=0 bad=0
# answered PROMPT_TOKENS CACHED: one more request the engine admitted.
answered() {
  queried=$((queried + $1))
  hits=$((hits + $2))
  generated=$((generated + 1))
  chats_ok=$((chats_ok + 1))
}

# refuse_to_start WANT ARGS...: the server with the tests' model and ARGS
# must exit 2 (before or after the model loads) with WANT in its stderr and
# nothing on stdout (nothing listened).
refuse_to_start() {
  local want=$1
  shift
  set +e
  "$server" --port 0 --config "${model_config:-$work/config.json}" --page-size $page --pool-tokens 16384 \
    --threads 1 "$@" >"$work/server.out" 2>"$work/server.err"
  local rc=$?
  set -e
  expect_eq "$rc" 2 "clm_server $*: the exit status"
  grep -q -- "$want" "$work/server.err" || fail "clm_server $*: no '$want' in: $(cat "$work/server.err")"
  [ ! -s "$work/server.out" ] || fail "clm_server $*: it printed $(cat "$work/server.out")"
}
# http_status HEADERS: the status code of `curl -D -` output.
http_status() { head -n1 <<<"$1" | cut -d' ' -f2; }

# launch ARGS...: starts the server (the test's model, page size and pool,
# and ARGS) in the background and waits for its "listening on" line; sets
# pid, port and base ($scheme://$connect_host:PORT, http://127.0.0.1 unless
# set). $model_config, when set, is another model's config.json.
launch() {
  # Made before the server starts: reading it must not race the background
  # job's redirection (a missing file would end the script under set -e).
  : >"$work/server.out"
  "$server" --port 0 --config "${model_config:-$work/config.json}" --page-size $page --pool-tokens 16384 \
    --threads 1 "$@" >"$work/server.out" 2>"$work/server.err" &
  pid=$!
  port=
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || fail "the server exited at start-up"
    port=$(sed -n '1s/^listening on [^ ]*:\([0-9][0-9]*\)\( (https)\)\{0,1\}$/\1/p' "$work/server.out")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || fail "no 'listening on HOST:PORT' line within 60 s"
  base=${scheme:-http}://${connect_host:-127.0.0.1}:$port
}
# stop: SIGTERM, exit status 0 (invariants hold, nothing left), the final
# JSON line in $work/out.
stop() {
  kill -TERM "$pid"
  set +e
  wait "$pid"
  local rc=$?
  set -e
  pid=
  expect_eq "$rc" 0 "the exit status after SIGTERM (3: invariants broken or a sequence left)"
  tail -n 1 "$work/server.out" >"$work/out"
  expect_eq "$(field event)" shutdown "the final line"
  expect_eq "$(field invariants)" ok "the final line: invariants"
}
