#!/usr/bin/env bash
# Pins deploy/nginx.conf in front of two real `moeserve serve` instances on
# loopback: streams flow through it continuously; SIGTERM to one instance
# mid-traffic lets its in-flight streams finish, and new requests move to
# the other one (503 while draining, refused connections after), so that no
# client sees an error and the drained instance exits 0.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/nginx_env.sh"
source "$here/../server/serve_env.sh"
nginx_bin="${MOESERVE_NGINX:-nginx}"
dir="$(mktemp -d /tmp/moeserve-nginx-live-XXXXXX)"
pids=()
traffic=""
cleanup() {
  # The traffic client too: on a failure its stop file never comes.
  [ -n "$traffic" ] && kill -KILL "$traffic" 2>/dev/null
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [ -f "$dir/nginx.pid" ] && kill -QUIT "$(cat "$dir/nginx.pid")" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$dir"/*.log; do echo "== $f" >&2; tail -20 "$f" >&2; done; exit 1; }

# --shutdown-timeout 300: the drain must outlast a stream on the slowest
# machine (ASan, busy neighbours: 25 s seen), or the test would pin the
# timeout's abort rather than the drain; a drain ends when its streams do.
start_server() { # PORT LOG
  # The per-client limits off, as deploy/moeserve.env has them behind nginx.
  "$MOESERVE_BIN" serve "$MOESERVE_TINY_MODEL" --port "$1" --served-model-name tiny --threads 1 \
    --http-threads 2 --kv-cache-memory 64MiB --max-model-len 2048 --shutdown-timeout 300 \
    --max-connections-per-client 0 --max-buffered-bytes-per-client 0 2>"$2" &
  pids+=($!)
}

pa=$(free_port); pb=$(free_port); pn=$(free_port)
start_server "$pa" "$dir/a.log"; pid_a=${pids[-1]}
start_server "$pb" "$dir/b.log"; pid_b=${pids[-1]}
serve_wait_ready "$dir/a.log" "$pid_a" || fail "server a did not start"
serve_wait_ready "$dir/b.log" "$pid_b" || fail "server b did not start"
nginx_prepare "$dir" "$pn" "$pa" "$pb" || fail "nginx_prepare"
"$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" || fail "nginx did not start"

node "$here/nginx_traffic.mjs" "http://127.0.0.1:$pn" 6 128 "$dir/stop" >"$dir/traffic.out" 2>&1 &
traffic=$!
# 128 tokens a stream: long enough that a stream is running on server a most
# of the time (with 24 the tiny model finished a stream in a few ms, and a
# SIGTERM could fall between two of a's streams, which proves nothing).
# Every wait below is for a condition, not for a fixed time: under ASan on
# a busy machine one stream has taken 25 s.
# A server logs this line for each stream it finished.
finished='POST /v1/completions 200'
completions_on_a() { grep -c "$finished" "$dir/a.log"; }
for _ in $(seq 2400); do
  [ "$(completions_on_a)" -gt 0 ] && break
  sleep 0.05
done
[ "$(completions_on_a)" -gt 0 ] || fail "nginx sent nothing to server a in 120 s of traffic"
# A's streams end in bursts (the clients' first streams started together,
# and least_conn hands a the next ones together), and a burst is the worst
# moment to signal: a stream seen running may have milliseconds left. So
# signal a quarter to a half of a stream's time (D, taken from a's first
# one: 0.5 s here, 25 s under ASan on a busy machine) after a's latest
# completion, when a runs a stream: begun at or after that burst, it has at
# least half of D to go. One poll decides; polling twice raced a's last
# stream of a burst (a CI run saw it running, then not).
running_on_a() {
  curl -sf -m 2 "http://127.0.0.1:$pa/metrics" |
    awk '/^moeserve:num_requests_running[{ ]/ { found = ($NF > 0) } END { exit !found }'
}
now_ms() { date +%s%3N; }
d_ms=$(grep -m1 "$finished" "$dir/a.log" | awk '{ sub(/s$/, "", $NF); printf "%d", $NF * 1000 }')
last=-1; last_t=0; signalled=0; t_end=$(($(now_ms) + 120000))
while [ "$(now_ms)" -lt "$t_end" ]; do
  n=$(completions_on_a); t=$(now_ms)
  [ "$n" -ne "$last" ] && { last=$n; last_t=$t; }
  q=$((t - last_t))
  if [ $((4 * q)) -ge "$d_ms" ] && [ $((2 * q)) -le "$d_ms" ] && running_on_a; then
    signalled=1; break
  fi
  sleep 0.01
done
[ "$signalled" -eq 1 ] || fail "server a never ran a fresh stream in 120 s of traffic (streams take $d_ms ms)"
kill -TERM "$pid_a"
wait "$pid_a"; rc_a=$?
[ "$rc_a" -eq 0 ] || fail "server a exited $rc_a after SIGTERM, not 0"
grep -q 'SIGTERM: draining' "$dir/a.log" || fail "server a did not drain"
# Streams that were running on a when the signal came finished there.
in_flight=$(sed -n '/SIGTERM: draining/,$p' "$dir/a.log" | grep -c "$finished")
[ "$in_flight" -gt 0 ] || fail "no stream was in flight on server a at the SIGTERM (the test proves nothing)"
served_b_before=$(grep -c "$finished" "$dir/b.log")
sleep 2 # traffic goes on with server a gone
touch "$dir/stop"
wait "$traffic"; rc_t=$?
cat "$dir/traffic.out"
[ "$rc_t" -eq 0 ] || fail "clients saw errors: $(cat "$dir/traffic.out")"
served_b_after=$(grep -c "$finished" "$dir/b.log")
[ "$served_b_after" -gt "$served_b_before" ] || fail "server b took no requests after a left"
# Nothing a finished was cut: every stream a began ended by length, not abort.
grep -q 'abort' "$dir/a.log" && fail "server a aborted requests while draining"
echo "nginx failover: a served $(grep -c "$finished" "$dir/a.log") ($in_flight finished while draining), b served $served_b_after"
