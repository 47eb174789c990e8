#!/usr/bin/env bash
# Pins how serve chooses its device. With no usable GPU (this build has no
# CUDA backend, or the machine no driver or no visible device):
# `--device cuda` refuses to start (exit 1) with a sentence naming what is
# missing, and `--device auto` starts on the CPU and says why. With a GPU
# (the device machine) auto picks it, and --device cuda serves.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../server/serve_env.sh"
bin="$MOESERVE_BIN"
model="$MOESERVE_TINY_MODEL"
fail() { echo "FAIL: $*" >&2; exit 1; }

start() { # start LOG ARGS...: serve in the background until ready or gone; sets pid
    local log=$1; shift
    "$bin" serve "$model" --port 0 --threads 1 --max-model-len 512 --kv-cache-memory 64MiB "$@" 2>"$log" &
    pid=$!
    serve_wait_ready "$log" "$pid"
}
stop() { kill -TERM "$pid" 2>/dev/null; wait "$pid"; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if start "$log" --device cuda; then
    stop
    grep -q 'GPU 0 is' "$log" || fail "serving on CUDA should name the GPU: $(cat "$log")"
    start "$log" --device auto || fail "auto should start: $(cat "$log")"
    stop
    grep -q 'running on the CPU' "$log" && fail "auto fell back with a GPU visible: $(cat "$log")"
    echo "ok: a GPU is visible; --device cuda and auto run on it"
    exit 0
fi
wait "$pid"; rc=$?
[ "$rc" -eq 1 ] || fail "--device cuda without a GPU should exit 1, got $rc: $(cat "$log")"
grep -Eq -- '--device cuda: (no usable NVIDIA driver|no CUDA device is visible|this build of moeserve has no CUDA backend|the CUDA runtime cannot reach a GPU)' "$log" \
  || fail "the refusal should name what is missing: $(cat "$log")"
# CUDA_VISIBLE_DEVICES hides every GPU: the same refusal on any machine.
CUDA_VISIBLE_DEVICES='' "$bin" serve "$model" --port 0 --device cuda 2>"$log"
[ $? -eq 1 ] || fail "--device cuda with CUDA_VISIBLE_DEVICES empty should exit 1: $(cat "$log")"
grep -Eq -- '--device cuda: (no usable NVIDIA driver|no CUDA device is visible \(CUDA_VISIBLE_DEVICES=""\)|this build of moeserve has no CUDA backend)' "$log" \
  || fail "the refusal should name what is missing: $(cat "$log")"
start "$log" --device auto || fail "--device auto should fall back to the CPU: $(cat "$log")"
stop
grep -q -- '--device auto: .*; running on the CPU' "$log" || fail "auto should say it runs on the CPU and why: $(cat "$log")"
echo "ok: no GPU here; --device cuda refuses and auto falls back to the CPU"
