#!/usr/bin/env bash
# A weights cache truncated under a running server (root's cp over the
# read-only file) takes its mapped pages away: the server's next step dies of
# SIGBUS, and its log must say which files can do that and how to replace
# them, not only "Bus error", in one piece though both compute threads fault
# at once. A fresh start then rebuilds the file. A SIGBUS another process
# sends still ends the server, named as such.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/serve_env.sh"
bin="$MOESERVE_BIN"
model="$MOESERVE_TINY_MODEL"
dir=$(mktemp -d)
pid=
fail() { echo "FAIL: $*" >&2; [ -n "$pid" ] && kill "$pid" 2>/dev/null; exit 1; }

start() {
    "$bin" serve "$model" --threads 2 --max-model-len 256 --kv-cache-memory 16MiB --port 0 \
        --cache-dir "$dir/cache" 2>"$dir/$1.log" &
    pid=$!
    serve_wait_ready "$dir/$1.log" "$pid" || fail "the server did not start: $(cat "$dir/$1.log")"
    url=$(serve_url "$dir/$1.log")
}
ask() {
    curl -s -m 30 "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "hello", "max_tokens": 4, "temperature": 0}'
}

start first
grep -q "written to the cache" "$dir/first.log" || fail "the first start should write the cache: $(cat "$dir/first.log")"
ask | grep -q '"text"' || fail "the first server does not answer"
file=$(ls "$dir"/cache/*.weights)
chmod 644 "$file" && truncate -s 4096 "$file" || fail "cannot truncate $file"
ask >/dev/null
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the server still runs on a truncated weights file"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq $((128 + 7)) ] || fail "the server should end of SIGBUS (exit $((128 + 7))), got $rc: $(tail -5 "$dir/first.log")"
grep -q "SIGBUS at address 0x[0-9a-f]*: a file this process maps .* was truncated" "$dir/first.log" ||
    fail "the log should say what the SIGBUS means: $(tail -5 "$dir/first.log")"
grep -q "renaming a new one over them" "$dir/first.log" || fail "the log should say how to replace the files"

start second
grep -q "is truncated: preparing the weights again" "$dir/second.log" ||
    fail "the next start should rebuild the truncated file: $(cat "$dir/second.log")"
ask | grep -q '"text"' || fail "the rebuilt server does not answer"
kill -BUS "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the server survived a SIGBUS sent to it"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq $((128 + 7)) ] || fail "a sent SIGBUS should end the server (exit $((128 + 7))), got $rc"
grep -q "SIGBUS sent by another process" "$dir/second.log" ||
    fail "the log should name a sent SIGBUS: $(tail -3 "$dir/second.log")"
grep -q "a file this process maps" "$dir/second.log" && fail "a sent SIGBUS is no truncated file"
rm -rf "$dir"
echo "ok: a weights file truncated under the server ends it with a SIGBUS that says why; the next start rebuilds it; a sent SIGBUS ends it named"
