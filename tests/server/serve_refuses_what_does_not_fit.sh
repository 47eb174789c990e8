#!/usr/bin/env bash
# Pins serve's start-up fit check: it logs the memory plan, refuses to start
# (exit 2, which the systemd unit does not restart; expected against actual)
# when the KV budget asks for more than the
# host's memory, and starts with a warning when the memory holds the model
# but the chosen pool is shorter than one --max-model-len sequence.
set -u
bin="$MOESERVE_BIN"
model="$MOESERVE_TINY_MODEL"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Far more KV than any test machine has.
out=$("$bin" serve "$model" --port 0 --threads 1 --kv-cache-memory 64TiB --max-model-len 2048 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "a 64 TiB KV cache should refuse to start with exit 2, got $rc: $out"
grep -q 'memory plan: weights .* GiB usable' <<<"$out" || fail "no memory plan line: $out"
grep -q 'the model does not fit.*KV cache [0-9.]* GiB = [0-9.]* GiB, more than the .* GiB usable; lower the KV cache size' <<<"$out" \
  || fail "the refusal should give the KV size against the usable memory: $out"

# Two ranks: the plan counts both pools.
out=$("$bin" serve "$model" --port 0 --threads 2 --data-parallel-size 2 --enable-expert-parallel \
  --kv-cache-memory 64TiB --max-model-len 2048 2>&1)
[ $? -eq 2 ] || fail "two ranks with 64 TiB of KV should refuse to start with exit 2: $out"
grep -q '2 ranks sharing one memory' <<<"$out" || fail "the refusal should name the 2 ranks: $out"

# A pool of 64 blocks (1024 tokens) for --max-model-len 2048 would refuse
# requests the server promises to take: it refuses to start, with the
# numbers and the length that would fit (as vLLM does).
out=$("$bin" serve "$model" --port 0 --threads 1 --kv-cache-memory "$((64 * $("$bin" plan "$model" --json \
  | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_bytes_per_token"] * 16)')))" \
  --max-model-len 2048 2>&1)
[ $? -eq 2 ] || fail "a pool shorter than one --max-model-len sequence should refuse to start with exit 2: $out"
grep -q 'does not hold one 2048-token sequence' <<<"$out" || fail "the refusal should name the length: $out"
grep -q 'at most 1024' <<<"$out" || fail "the refusal should say what fits: $out"
echo ok
