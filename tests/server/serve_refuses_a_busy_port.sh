#!/usr/bin/env bash
# A second `moeserve serve` on a port a running one listens on must not start
# and take half the traffic (issue 21 item 1): it exits 1 with "port N is in
# use", and the first keeps serving. --reuse-port on both shares on purpose.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/serve_env.sh"
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
    serve_wait_ready "$dir/$name.log" "${pids[-1]}" || fail "$name did not start: $(cat "$dir/$name.log")"
    port=$(serve_url "$dir/$name.log")
    port=${port##*:}
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
