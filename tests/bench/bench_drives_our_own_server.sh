#!/usr/bin/env bash
# Pins `moeserve bench` against `moeserve serve` (the tiny model, loopback):
# both endpoints, every request succeeds, the token totals are exactly what
# was asked for, and the server's own /metrics counted the same tokens.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../server/serve_env.sh"
bin="$MOESERVE_BIN"
model="$MOESERVE_TINY_MODEL"
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d)
log="$dir/serve.log"
"$bin" serve "$model" --port 0 --threads 1 --api-key sekrit --max-model-len 2048 2>"$log" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
serve_wait_ready "$log" "$pid"
url=$(serve_url "$log")
[ -n "$url" ] || fail "the server did not start: $(cat "$log")"

field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
counter() { # the sum of a /metrics counter over its series
  curl -s "$url/metrics" | awk -v n="moeserve:$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%d\n", s }'
}

gen0=$(counter generation_tokens_total)
# Completions with exact-length id prompts: 12 requests, 4 in flight.
out=$("$bin" bench --base-url "$url" --api-key sekrit --num-prompts 12 --max-concurrency 4 \
  --random-input-len 24 --random-output-len 6 --ignore-eos --no-initial-test --no-progress \
  --fail-on-error --save-result "$dir/c.json" 2>&1) || fail "bench on /v1/completions failed: $out"
grep -q '^Successful requests: *12 *$' <<<"$out" || fail "not 12 successes: $out"
grep -q '^Failed requests: *0 *$' <<<"$out" || fail "failures: $out"
grep -q 'Mean TTFT (ms)' <<<"$out" || fail "no TTFT block: $out"
[ "$(field "$dir/c.json" completed)" = 12 ] || fail "JSON completed: $(cat "$dir/c.json")"
[ "$(field "$dir/c.json" total_input_tokens)" = 288 ] || fail "input tokens, want 12 x 24: $(cat "$dir/c.json")"
[ "$(field "$dir/c.json" total_output_tokens)" = 72 ] || fail "output tokens, want 12 x 6: $(cat "$dir/c.json")"
gen1=$(counter generation_tokens_total)
[ $((gen1 - gen0)) -eq 72 ] || fail "the server counted $((gen1 - gen0)) generated tokens, the bench 72"

# Chat with random words, Poisson arrivals, the initial test request on.
out=$("$bin" bench --base-url "$url" --api-key sekrit --endpoint /v1/chat/completions \
  --num-prompts 8 --request-rate 50 --random-input-len 16 --random-output-len 5 --ignore-eos \
  --seed 3 --no-progress --fail-on-error --save-result "$dir/chat.json" 2>&1) \
  || fail "bench on /v1/chat/completions failed: $out"
[ "$(field "$dir/chat.json" completed)" = 8 ] || fail "chat JSON completed: $(cat "$dir/chat.json")"
[ "$(field "$dir/chat.json" failed)" = 0 ] || fail "chat failures: $(cat "$dir/chat.json")"
[ "$(field "$dir/chat.json" total_output_tokens)" = 40 ] || fail "chat output tokens, want 8 x 5: $(cat "$dir/chat.json")"

# A wrong key: model discovery is refused with the server's message; with
# --model every request fails, and the bench counts them.
out=$("$bin" bench --base-url "$url" --api-key wrong --num-prompts 2 --no-progress 2>&1)
[ $? -ne 0 ] || fail "a wrong key should stop model discovery: $out"
grep -q 'HTTP 401.*missing or wrong API key' <<<"$out" || fail "the 401 should be shown: $out"
out=$("$bin" bench --base-url "$url" --api-key wrong --model "$(field "$dir/c.json" model_id)" --num-prompts 2 --random-input-len 4 \
  --random-output-len 2 --no-initial-test --no-progress --fail-on-error 2>&1)
[ $? -eq 1 ] || fail "a wrong key should make --fail-on-error exit 1: $out"
grep -q '^Failed requests: *2 *$' <<<"$out" || fail "a wrong key should fail both requests: $out"
echo ok
