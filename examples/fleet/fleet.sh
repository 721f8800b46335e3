#!/usr/bin/env bash
# examples/fleet/fleet.sh: three clm_server instances on loopback sharing one
# redis-server as their storage tier, publishing KV events, played the same
# multi-turn conversations twice: routed by clm_fleet's prefix-aware
# scheduler (from the events alone), then round-robin, each time on fresh
# servers and an empty Redis. Prints a table and the figures (JSON lines) and
# draws OUT/fleet.png (`make fleet`; docs/fleet.md).
#
#   fleet.sh BUILD_DIR OUT_DIR [--smoke]
#
# --smoke: fewer, shorter conversations, and exit 1 unless prefix-aware
# routing finds at least 1.3 times as much of the prompts cached as
# round-robin (ctest's fleet_smoke). Everything else lives in one mktemp -d directory, removed at
# the end; redis-server and the servers die with the script.
set -euo pipefail

build=${1:?usage: fleet.sh BUILD_DIR OUT_DIR [--smoke]}
out=${2:?usage: fleet.sh BUILD_DIR OUT_DIR [--smoke]}
smoke=${3:-}
server=$build/examples/server/clm_server
fleet=$build/examples/fleet/clm_fleet
for tool in "$server" "$fleet"; do
  [ -x "$tool" ] || { echo "fleet.sh: $tool is not built" >&2; exit 2; }
done
for tool in redis-server gnuplot; do
  command -v "$tool" >/dev/null || { echo "fleet.sh: $tool is missing (make deps installs it)" >&2; exit 2; }
done
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/clm_fleet.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

instances=3
if [ "$smoke" = --smoke ]; then
  conversations=12 turns=4 pool=4096
else
  conversations=36 turns=6 pool=8192
fi
model_id="fleet-tiny-llama@seed"
cat >"$work/config.json" <<'JSON'
{"vocab_size": 272, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 8192}
JSON

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_redis: a fresh redis-server (nothing persisted); sets redis_port.
start_redis() {
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null; then return; fi
    sleep 0.05
  done
  echo "fleet.sh: redis-server did not start: $(cat "$work/redis.log")" >&2
  exit 1
}

# start_server I: instance I on a free port, its storage the Redis above;
# appends to ports, events, replays, server_pids.
start_server() {
  local i=$1 log=$work/server$1
  : >"$log.out"
  "$server" --port 0 --config "$work/config.json" --threads 1 --page-size 16 --pool-tokens "$pool" \
    --host-tokens "$pool" --storage "redis://127.0.0.1:$redis_port/0?prefix=fleet:" --model-id "$model_id" \
    --prefetch-policy wait_complete --trust-x-tenant --kv-events 'tcp://127.0.0.1:*' --kv-events-replay 'tcp://127.0.0.1:*' \
    >"$log.out" 2>"$log.err" &
  local pid=$!
  pids+=("$pid")
  server_pids+=("$pid")
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || { echo "fleet.sh: server $i exited: $(cat "$log.err")" >&2; exit 1; }
    if [ "$(wc -l <"$log.out")" -ge 2 ]; then break; fi
    sleep 0.1
  done
  local port pub replay
  port=$(sed -n '1s/^listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$log.out")
  pub=$(sed -n '2s/^kv events on \([^ ]*\) replay \([^ ]*\)$/\1/p' "$log.out")
  replay=$(sed -n '2s/^kv events on \([^ ]*\) replay \([^ ]*\)$/\2/p' "$log.out")
  [ -n "$port" ] && [ -n "$pub" ] && [ -n "$replay" ] || { echo "fleet.sh: server $i: $(cat "$log.out")" >&2; exit 1; }
  ports+=("$port") events+=("$pub") replays+=("$replay")
}

commas() { local IFS=,; echo "$*"; }

for mode in aware round_robin; do
  echo "fleet.sh: $mode: $instances servers, one redis-server, $conversations conversations of $turns turns" >&2
  start_redis
  ports=() events=() replays=() server_pids=()
  for i in $(seq 0 $((instances - 1))); do start_server "$i"; done
  "$fleet" run --mode "$mode" --servers "$(commas "${ports[@]}")" --events "$(commas "${events[@]}")" \
    --replays "$(commas "${replays[@]}")" --model-id "$model_id" --conversations "$conversations" --turns "$turns" \
    --out "$out/$mode.json"
  for p in "${server_pids[@]}" "$redis_pid"; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
done

expect=()
[ "$smoke" = --smoke ] && expect=(--expect-better)
"$fleet" report "$out/aware.json" "$out/round_robin.json" --plot "$out/fleet.png" "${expect[@]}" |
  tee "$out/figures.txt"
echo "fleet.sh: $out/fleet.png, $out/figures.txt" >&2
