#!/usr/bin/env bash
# A second `moeserve serve` on a port a running one listens on must not start
# and take half the traffic (issue 21 item 1): it exits 1 with "port N is in
# use", and the first keeps serving. --reuse-port on both shares on purpose.
set -u
bin="$MOESERVE_BIN"
model="$MOESERVE_TINY_MODEL"
fail() { echo "FAIL: $*" >&2; kill "${pids[@]}" 2>/dev/null; exit 1; }
dir=$(mktemp -d)
pids=()

# Starts a server with the given flags, its log in $dir/$1.log; sets port.
start() {
    local name="$1"
    shift
    "$bin" serve "$model" --threads 1 --max-model-len 256 --kv-cache-memory 16MiB "$@" \
        2>"$dir/$name.log" &
    pids+=($!)
    for _ in $(seq 1200); do # 120 s, as the C and node harnesses allow
        port=$(sed -n 's/.*ready: serving .* on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name.log")
        [ -n "$port" ] && return 0
        sleep 0.1
    done
    fail "$name did not start: $(cat "$dir/$name.log")"
}

start first --port 0
out=$(timeout 30 "$bin" serve "$model" --threads 1 --port "$port" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "a second server on busy port $port should exit 1, got $rc: $out"
grep -q "port $port is in use" <<<"$out" || fail "the refusal should say the port is in use: $out"
curl -sf "http://127.0.0.1:$port/health" >/dev/null || fail "the first server stopped answering"
kill "${pids[@]}"
wait

# Shared on purpose: both start.
pids=()
start a --port 0 --reuse-port
start b --port "$port" --reuse-port
curl -sf "http://127.0.0.1:$port/health" >/dev/null || fail "the shared port does not answer"
kill "${pids[@]}"
wait
rm -rf "$dir"
echo "ok: a busy port is refused, and shared only with --reuse-port on both"
