#!/usr/bin/env bash
# bench/quant_bench.sh: the speed and size figures of quantized experts (issue
# 17), repeatable from a built tree. A benchmark, not a test: nothing here
# asserts a timing; it prints tables (and keeps every log under --work).
#
#   formats  the demo model in bf16, fp8, int8 and int4 (quantized at load):
#            `generate --bench` (decode at batch 1 against the read bandwidth
#            measured in the same run, on the bytes each format reads per step)
#            and `bench-offline` (output tokens/s at 1 and 16 streams)
#   full     the full-size Qwen3-30B-A3B shape (its config.json, --load-format
#            dummy --quantization int4) served over HTTP: cold start (weights
#            quantized and written to the cache), warm starts (the cache file
#            in the page cache, and evicted from it), `moeserve bench` chat
#            requests at 1 and 16 streams, resident memory
#   peer     the demo model through each server's HTTP API: ours in int4
#            against llama.cpp's llama-server in Q4_0 (its default file,
#            lm_head in Q6_K, and one whose lm_head stays bf16 as ours does),
#            by bench/compare_llama_cpp.sh (16 streams and TPOT at one stream,
#            rounds alternating, the peer on one thread as a control)
#   peer_kernels  the same weights without HTTP: generate --bench against
#            llama-bench, rounds alternating
#
# Usage: bench/quant_bench.sh [options] [formats] [full] [peer] [peer_kernels]   (all by default)
#   --build DIR         the meson build folder (build)
#   --demo DIR          the demo checkpoint (build/tests/demo-model: meson compile -C build demo_model)
#   --peer-bin DIR      llama.cpp's binaries (/tmp/peer/llama.cpp/build/bin; ../shared/peer/README.md)
#   --peer-gguf FILE    the demo checkpoint as bf16 GGUF (shared/peer/hf_to_gguf.py makes it)
#   --work DIR          logs, the Q4_0 files, the full-size folder and its weights cache
#                       (/tmp/quant_bench; the cache needs 16 GiB of disk)
#   --threads N         compute threads of every run (2)
#   --rounds N          rounds of the formats and peer parts, alternating (2)
#   --table T           our kernel table in the peer part (amx where the CPU has
#                       AMX, else avx512: the default table of such a machine)
# The full part needs about 17 GiB of free memory: it refuses to start below 18.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build
demo=
peer_bin=/tmp/peer/llama.cpp/build/bin
peer_gguf=
work=/tmp/quant_bench
threads=2
rounds=2
table=
parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --demo) demo=$2; shift 2 ;;
    --peer-bin) peer_bin=$2; shift 2 ;;
    --peer-gguf) peer_gguf=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    formats|full|peer|peer_kernels) parts+=("$1"); shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "quant_bench.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(formats full peer peer_kernels)
[ -n "$demo" ] || demo=$build/tests/demo-model
bin=$build/server/moeserve
py=/usr/bin/python3
die() { echo "quant_bench.sh: $*" >&2; exit 1; }
[ -x "$bin" ] || die "no $bin: build first (meson compile -C $build)"
mkdir -p "$work" || die "cannot make $work"

# ---- helpers -------------------------------------------------------------------------

load() { cut -d' ' -f1-3 /proc/loadavg; }
# field FILE KEY [N]: KEY of FILE's JSON document, or of the Nth object when
# FILE holds one object per line (bench-offline --json).
field() {
  "$py" -c 'import json,sys
t = open(sys.argv[1]).read()
try: d = json.loads(t)
except ValueError: d = json.loads(t.splitlines()[int(sys.argv[3]) - 1])
print(d[sys.argv[2]])' "$1" "$2" "${3:-1}"
}
fmt() { "$py" -c 'import sys; print(("%." + sys.argv[2] + "f") % float(sys.argv[1]))' "$1" "$2"; }
calc() { "$py" -c "print($1)"; }
mem_avail_gib() { awk '/MemAvailable/ { printf "%.1f\n", $2 / 1048576 }' /proc/meminfo; }

# The one server this script runs at a time: its pid, URL and log.
srv_pid=
srv_url=
stop_server() {
  [ -n "$srv_pid" ] || return 0
  kill -TERM "$srv_pid" 2>/dev/null
  wait "$srv_pid" 2>/dev/null
  srv_pid=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# start_ours LOG MODEL [serve options]: waits (up to 1 h) for the ready line.
# Sets srv_pid, srv_url and start_s (wall seconds from exec to ready).
start_ours() {
  local log=$1 model=$2
  shift 2
  local t0
  t0=$(date +%s.%N)
  "$bin" serve "$model" --port 0 --threads "$threads" "$@" 2>"$log" &
  srv_pid=$!
  for _ in $(seq 36000); do
    grep -q 'ready:' "$log" && break
    kill -0 "$srv_pid" 2>/dev/null || { srv_pid=; die "the server did not start: $(tail -5 "$log")"; }
    sleep 0.1
  done
  start_s=$(calc "$(date +%s.%N) - $t0")
  srv_url=$(grep -o 'ready: .* on http://[0-9.]*:[0-9]*' "$log" | grep -o 'http://[0-9.:]*$')
  [ -n "$srv_url" ] || die "no ready line in $log"
}

# serve_bench OUT.json CONCURRENCY PROMPTS [bench options]: moeserve bench
# against srv_url; prints "output_tok/s mean_tpot_ms failed".
serve_bench() {
  local out=$1 c=$2 n=$3
  shift 3
  "$bin" bench --base-url "$srv_url" --max-concurrency "$c" --num-prompts "$n" --ignore-eos \
    --no-progress --save-result "$out" "$@" >"${out%.json}.txt" 2>&1 || true
  [ -s "$out" ] || { echo "0 0 all"; return; }
  echo "$(fmt "$(field "$out" output_throughput)" 1) $(fmt "$(field "$out" mean_tpot_ms)" 1) $(field "$out" failed)"
}

# The read bandwidth of this machine now: best of generate --bench's five
# interleaved probes (on the tiny model, a few seconds).
bandwidth_gbs() {
  local j=$work/bandwidth.json
  "$bin" generate "$build/tests/tiny-model" --bench --json --threads "$threads" >"$j" 2>/dev/null ||
    { echo 0; return; }
  fmt "$(field "$j" read_bandwidth_gbs)" 2
}

echo "# quant_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores," \
  "$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), threads $threads, $(date -u +%FT%TZ)"
echo "# moeserve $(git -C "$here" describe --always --dirty 2>/dev/null), logs in $work"

# ---- formats -------------------------------------------------------------------------

part_formats() {
  [ -d "$demo" ] || die "no demo checkpoint at $demo (meson compile -C $build demo_model, or --demo DIR)"
  echo
  echo "## The demo model in four formats: generate --bench and bench-offline ($rounds rounds)"
  echo
  echo "% of the bound: the best decode window against the best probe pass, then the means of both"
  echo
  echo "| round | format | load avg | read GB/s | MB read per step | decode tok/s | % of the bound (best; means) | out tok/s, 1 stream | out tok/s, 16 streams |"
  echo "|---|---|---|---|---|---|---|---|---|"
  local r f q j o
  for r in $(seq "$rounds"); do
    for f in bf16 fp8 int8 int4; do
      q=()
      [ "$f" = bf16 ] || q=(--quantization "$f")
      j=$work/gen-$f-$r.json
      o=$work/offline-$f-$r.json
      local la
      la=$(load)
      "$bin" generate "$demo" --bench --json --threads "$threads" "${q[@]}" >"$j" 2>"${j%.json}.log" ||
        die "generate --bench $f failed: $(tail -3 "${j%.json}.log")"
      "$bin" bench-offline "$demo" --json --threads "$threads" "${q[@]}" --num-prompts 32 --input-len 128 \
        --output-len 64 --max-concurrency 1,16 >"$o" 2>"${o%.json}.log" ||
        die "bench-offline $f failed: $(tail -3 "${o%.json}.log")"
      echo "| $r | $f | ${la%% *} | $(fmt "$(field "$j" read_bandwidth_gbs)" 1)" \
        "| $(fmt "$(calc "$(field "$j" decode_active_bytes) / 1e6")" 1)" \
        "| $(fmt "$(field "$j" decode_tokens_per_second)" 1)" \
        "| $(fmt "$(calc "100 * $(field "$j" decode_fraction_of_bandwidth)")" 0)%;" \
        "$(fmt "$(calc "100 * $(field "$j" decode_fraction_of_bandwidth_means)")" 0)%" \
        "| $(fmt "$(field "$o" output_tokens_per_second 1)" 1) | $(fmt "$(field "$o" output_tokens_per_second 2)" 1) |"
    done
  done
}

# ---- full ----------------------------------------------------------------------------

part_full() {
  local full=$work/qwen3-30b-a3b cache=$work/cache-full tok=$here/third_party/qwen3-tokenizer
  mkdir -p "$full"
  cp "$here/tests/data/qwen3-30b-a3b/config.json" "$full/" || die "no full-size config.json"
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$full/" 2>/dev/null ||
    die "no Qwen3 tokenizer in $tok (deploy/setup.sh)"
  local avail
  avail=$(mem_avail_gib)
  [ "$(calc "$avail >= 18")" = True ] ||
    die "the full-size int4 model needs about 17 GiB; only $avail GiB is available"
  echo
  echo "## The full-size Qwen3-30B-A3B shape, int4 (dummy weights), served over HTTP"
  echo
  local opts=(--load-format dummy --quantization int4 --cache-dir "$cache" --max-model-len 4096
              --kv-cache-memory 1GiB)
  local bw_before bw_after
  bw_before=$(bandwidth_gbs)
  rm -rf "$cache"
  echo "| start | load avg | wall s to ready | the server's own 'loaded in' |"
  echo "|---|---|---|---|"
  local la
  la=$(load)
  start_ours "$work/full-cold.log" "$full" "${opts[@]}"
  echo "| cold (quantize, write the cache) | ${la%% *} | $(fmt "$start_s" 1) | $(grep -o 'loaded in [0-9.]*s' "$work/full-cold.log") |"
  # The chat benchmark on this first server.
  # Short prompts and 64 tokens out, so that decode dominates; 16 streams
  # start together once (16 requests).
  local c1 c16 rss hwm lck
  c1=$(serve_bench "$work/full-c1.json" 1 3 --endpoint /v1/chat/completions --random-input-len 32 \
    --random-output-len 64)
  c16=$(serve_bench "$work/full-c16.json" 16 16 --endpoint /v1/chat/completions --random-input-len 32 \
    --random-output-len 64)
  # The first token of a 512-token prompt (prefill), one request at a time;
  # without the initial test request, which sends the first prompt once
  # before the timed ones (it would then come from the prefix cache).
  local ttft
  "$bin" bench --base-url "$srv_url" --max-concurrency 1 --num-prompts 2 --ignore-eos --no-progress --no-initial-test \
    --save-result "$work/full-ttft.json" --endpoint /v1/completions --random-input-len 512 \
    --random-output-len 4 >"$work/full-ttft.txt" 2>&1 || true
  ttft=$([ -s "$work/full-ttft.json" ] && fmt "$(field "$work/full-ttft.json" mean_ttft_ms)" 0 || echo "-")
  rss=$(awk '/VmRSS/ { printf "%.2f", $2 / 1048576 }' "/proc/$srv_pid/status")
  hwm=$(awk '/VmHWM/ { printf "%.2f", $2 / 1048576 }' "/proc/$srv_pid/status")
  lck=$(awk '/VmLck/ { printf "%.2f", $2 / 1048576 }' "/proc/$srv_pid/status")
  stop_server
  la=$(load)
  start_ours "$work/full-warm.log" "$full" "${opts[@]}"
  echo "| warm (cache file in the page cache) | ${la%% *} | $(fmt "$start_s" 1) | $(grep -o 'loaded in [0-9.]*s' "$work/full-warm.log") |"
  stop_server
  # Evict the cache file from the page cache (this file only), as after a reboot.
  "$py" -c 'import os,sys
for f in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], f), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$cache"
  la=$(load)
  start_ours "$work/full-warm-disk.log" "$full" "${opts[@]}"
  echo "| warm (cache file read from disk) | ${la%% *} | $(fmt "$start_s" 1) | $(grep -o 'loaded in [0-9.]*s' "$work/full-warm-disk.log") |"
  stop_server
  bw_after=$(bandwidth_gbs)
  local bw step_bytes
  bw=$(calc "max($bw_before, $bw_after)")
  step_bytes=$(calc "1.93 * 2**30") # moeserve plan --dtype int4: weight bytes read per decode step at batch 1
  echo
  echo "chat requests, about 32 prompt tokens, 64 out (ignore_eos); decode tok/s = streams x 1000 / mean TPOT"
  echo
  echo "| streams | output tok/s (with prefill) | mean TPOT ms | decode tok/s | failed | decode GB/s at batch 1 | % of read bandwidth ($bw GB/s) |"
  echo "|---|---|---|---|---|---|---|"
  set -- $c1
  local gbs
  gbs=$(calc "$step_bytes / ($2 / 1e3) / 1e9 if $2 > 0 else 0")
  echo "| 1 | $1 | $2 | $(fmt "$(calc "1000 / $2 if $2 > 0 else 0")" 1) | $3 | $(fmt "$gbs" 1) | $(fmt "$(calc "100 * $gbs / $bw if $bw > 0 else 0")" 0)% |"
  set -- $c16
  echo "| 16 | $1 | $2 | $(fmt "$(calc "16000 / $2 if $2 > 0 else 0")" 1) | $3 | | |"
  echo
  echo "time to first token of a 512-token prompt (/v1/completions, one at a time, mean of 2): $ttft ms"
  echo "resident memory of the server after the benchmarks: VmRSS $rss GiB (peak $hwm GiB, locked $lck GiB)"
  echo "read bandwidth measured before and after: $bw_before and $bw_after GB/s"
}

# ---- peer ----------------------------------------------------------------------------

part_peer() {
  [ -d "$demo" ] || die "no demo checkpoint at $demo"
  [ -x "$peer_bin/llama-server" ] || die "no llama-server in $peer_bin (../shared/peer/README.md)"
  local q4=$work/demo-q4_0.gguf q4b=$work/demo-q4_0-bf16-output.gguf g
  if [ ! -s "$q4" ] || [ ! -s "$q4b" ]; then
    [ -n "$peer_gguf" ] && [ -s "$peer_gguf" ] || die "give --peer-gguf, the demo model as bf16 GGUF"
    [ -s "$q4" ] || "$peer_bin/llama-quantize" "$peer_gguf" "$q4" Q4_0 "$threads" >"$work/quantize.log" 2>&1 ||
      die "llama-quantize failed: $(tail -3 "$work/quantize.log")"
    [ -s "$q4b" ] || "$peer_bin/llama-quantize" --output-tensor-type bf16 "$peer_gguf" "$q4b" Q4_0 "$threads" \
      >"$work/quantize-bf16-output.log" 2>&1 || die "llama-quantize failed"
  fi
  # Two free ports next to each other (another comparison may hold the default ones).
  local port
  port=$("$py" -c 'import socket
for p in range(38631, 39631, 2):
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError: pass')
  local t=$table
  [ -n "$t" ] || { grep -qw amx_tile /proc/cpuinfo && t=amx || t=avx512; }
  for g in "$q4" "$q4b"; do
    echo
    echo "## The demo model over HTTP: moeserve int4 against llama.cpp $(basename "$g") ($rounds rounds)"
    echo
    echo '```'
    "$here/bench/compare_llama_cpp.sh" "$demo" "$g" --build "$build" --peer "$peer_bin" --threads "$threads" \
      --tables "$t" --rounds "$rounds" --loads c16,tpot --ours-args "--quantization int4" \
      --port "$port" --out-dir "$work/peer-$(basename "$g" .gguf)" | sed -n '/^ours against/,$p'
    echo '```'
  done
}

# llama-bench's figure of TEST (pp: pp512, tg: tg64) in its jsonl output
# FILE, "mean ± sd", times SCALE (1).
peer_ts() {
  "$py" -c 'import json,sys
k = float(sys.argv[3])
for l in open(sys.argv[1]):
    d = json.loads(l)
    if (d["n_prompt"] > 0) == (sys.argv[2] == "pp"):
        print("%.1f ± %.1f" % (k * d["avg_ts"], k * d["stddev_ts"]))' "$1" "$2" "${3:-1}"
}

# The same comparison without HTTP: generate --bench against llama-bench.
part_peer_kernels() {
  local q4=$work/demo-q4_0.gguf q4b=$work/demo-q4_0-bf16-output.gguf
  [ -s "$q4" ] && [ -s "$q4b" ] || die "run the peer part first (it makes the Q4_0 files in --work)"
  echo
  echo "## The demo model without HTTP: generate --bench (int4) against llama-bench (Q4_0), $rounds rounds"
  echo
  echo "decode at batch 1 (ours: best of 5 windows of 16 steps; llama-bench: tg64, mean of 3) and prefill"
  echo "of 512 tokens (pp512), tokens/s"
  echo
  echo "| round | engine | load avg | decode tok/s | prefill tok/s |"
  echo "|---|---|---|---|---|"
  local r who la j order
  for r in $(seq "$rounds"); do
    order="ours q4_0 q4_0-t1 q4_0-bf16-output"
    [ $((r % 2)) -eq 0 ] && order="q4_0-bf16-output q4_0-t1 q4_0 ours"
    for who in $order; do
      la=$(load)
      j=$work/kern-$who-$r.json
      case $who in
        ours) "$bin" generate "$demo" --bench --json --threads "$threads" --quantization int4 >"$j" 2>/dev/null ||
                die "generate --bench failed"
              echo "| $r | moeserve int4 | ${la%% *} | $(fmt "$(field "$j" decode_tokens_per_second)" 1)" \
                "| $(fmt "$(field "$j" prefill_tokens_per_second)" 1) |" ;;
        q4_0-t1) # The control: one thread, shown as its figure times $threads (at most what
                 # $threads threads could do), since llama.cpp's threads spin at every barrier
                 # and a shared machine drags them below their one-thread speed.
           "$peer_bin/llama-bench" -m "$q4" -t 1 -p 512 -n 64 -r 3 -o jsonl >"$j" 2>/dev/null ||
             die "llama-bench failed"
           echo "| $r | llama.cpp q4_0, 1 thread (x $threads) | ${la%% *} | $(peer_ts "$j" tg $threads)" \
             "| $(peer_ts "$j" pp $threads) |" ;;
        *) local g=$q4
           [ "$who" = q4_0 ] || g=$q4b
           "$peer_bin/llama-bench" -m "$g" -t "$threads" -p 512 -n 64 -r 3 -o jsonl >"$j" 2>/dev/null ||
             die "llama-bench failed"
           echo "| $r | llama.cpp $who | ${la%% *} | $(peer_ts "$j" tg) | $(peer_ts "$j" pp) |" ;;
      esac
    done
  done
}

for p in "${parts[@]}"; do "part_$p"; done
echo
echo "# load average at the end: $(load)"
