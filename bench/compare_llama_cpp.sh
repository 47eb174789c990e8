#!/usr/bin/env bash
# compare_llama_cpp.sh: moeserve beside llama.cpp's llama-server on the same
# weights and threads, both driven through HTTP by `moeserve bench`, servers
# alternating (ours, peer, ours, peer) because the machines we measure on are
# shared and noisy. A benchmark, not a test: it asserts nothing.
#
#   bench/compare_llama_cpp.sh MODEL_DIR MODEL.gguf [options]
#
# MODEL_DIR is a bf16 checkpoint (moeserve make-model), MODEL.gguf the same
# weights in GGUF bf16 (../shared/peer/README.md: hf_to_gguf.py). Per round
# and per kernel table it serves ours, then the peer once per round, and
# sends both the same four loads:
#   c16, c64  output tokens/s, one wave of C streams (C prompts of --in tokens,
#             --out tokens each, ignore_eos, greedy)
#   ttft      time to first token of a 512-token prompt, one at a time
#   tpot      time per output token of one stream (32-token prompt, 128 out)
# and, before and after each table's loads, `moeserve generate --bench`
# measures the machine's read bandwidth (1 GiB streamed on the same threads)
# and counts the bytes a decode step reads; bytes / the higher of the two
# bandwidths is the fastest a step can be, and "decode % of bound" is that
# bound over our TPOT at one stream. (The probe moved by a third from one
# minute to the next on a shared machine: 42-62 GB/s in one run; taken on
# both sides of the loads, the bound is the machine's best of that span.)
#
# Ratios are ours over the peer's of the same round (throughput) or the
# peer's over ours (times): above 1 means moeserve is ahead.
#
# Which llama.cpp: --peer, a build for this CPU, by default for every table.
# A table that stands for another kind of machine (avx2 for an AVX2-only
# one, avx512 for an AVX-512 one without avx512_bf16) is fairly compared
# with llama.cpp built for that machine, as its users would run it:
# --table-peer avx2=DIR,avx512=DIR gives those tables their own builds
# (README's CPU section says how to build them), each served once a round.
#
# The control (--peer-control, on by default): each round also serves the
# peer on ONE thread, and a second line of ratios puts ours against twice
# that (a peer on N threads is at most N times its one-thread speed). On a
# shared machine llama.cpp's threads spin at every op's barrier, so when
# another process takes a core the peer on 2 threads can fall far below its
# one-thread speed (measured here: llama-bench tg32 on the mid model, load
# average 7: 15 tok/s on 1 thread, 0.8 on 2), which inflates the same-thread
# ratios; the conservative ones do not depend on that. Every server's loads
# are tagged with the load average when they started.
#
# The peer's requests carry a logit_bias of -100 on the vocabulary's tokens
# that are not whole UTF-8 on their own (1448 of Qwen3's): llama-server
# parses every streamed chunk as UTF-8 and, on the invalid bytes a random
# model emits, stops streaming content and ends the request with an error
# ("does not match the expected Content-only format"). The bias costs it a
# few thousand additions per token; ours needs none (it sends U+FFFD) and
# caps logit_bias at 1024 entries, so its requests go without.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/compare_llama_cpp.sh MODEL_DIR MODEL.gguf [options]
  --build DIR        moeserve build tree (build; uses DIR/server/moeserve)
  --peer DIR         llama.cpp bin folder (/tmp/peer/llama.cpp/build/bin)
  --table-peer LIST  TABLE=DIR,...: the llama.cpp those tables are measured
                     against instead of --peer's (see the top of the script)
  --threads N        compute threads of both servers (2)
  --before DIR       a second moeserve build tree (say, of the commit before a
                     change), served each round beside this one: its tables
                     show as before-TABLE (--before-tables, default avx512,avx2)
  --tables LIST      kernel tables, comma-separated (default: every one this CPU
                     runs, avx512_bf16 included, but scalar, which is the
                     reference and slow)
  --rounds N         rounds, each ours then peer (2)
  --loads LIST       c16,c64,ttft,tpot (all)
  --in N --out N     prompt and output tokens of the c16/c64 loads (128, 64)
  --ours-args "..."  extra moeserve serve flags
  --peer-args "..."  extra llama-server flags
  --no-peer-control  skip the peer on one thread (see the top of the script)
  --out-dir DIR      where results and logs go (a new folder under /tmp)
  --port N           first of the two ports used (28631)
EOF
}

[[ $# -ge 2 ]] || { usage >&2; exit 2; }
MODEL_DIR=$1 GGUF=$2
shift 2
BEFORE="" BEFORE_TABLES=avx512,avx2 BUILD=build PEER=/tmp/peer/llama.cpp/build/bin TABLE_PEERS="" THREADS=2 TABLES="" ROUNDS=2
LOADS=c16,c64,ttft,tpot IN=128 OUT=64 OURS_ARGS="" PEER_ARGS="" OUT_DIR="" PORT=28631 CONTROL=1
while [[ $# -gt 0 ]]; do
    case $1 in
    --build) BUILD=$2; shift 2 ;;
    --peer) PEER=$2; shift 2 ;;
    --table-peer) TABLE_PEERS=$2; shift 2 ;;
    --before) BEFORE=$2; shift 2 ;;
    --before-tables) BEFORE_TABLES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --tables) TABLES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --loads) LOADS=$2; shift 2 ;;
    --in) IN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --ours-args) OURS_ARGS=$2; shift 2 ;;
    --peer-args) PEER_ARGS=$2; shift 2 ;;
    --no-peer-control) CONTROL=0; shift ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare_llama_cpp.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

MS=$BUILD/server/moeserve
# The peers: PEER_DIRS[i] is peer i's bin folder (0: --peer's); a kernel
# table's peer is PEER_FOR[table] (unset: 0).
PEER_DIRS=("$PEER")
declare -A PEER_FOR
if [[ -n $TABLE_PEERS ]]; then
    IFS=, read -r -a tp <<<"$TABLE_PEERS"
    for e in "${tp[@]}"; do
        [[ $e == ?*=?* ]] || { echo "compare_llama_cpp.sh: --table-peer wants TABLE=DIR, not '$e'" >&2; exit 2; }
        i=0
        while ((i < ${#PEER_DIRS[@]})) && [[ ${PEER_DIRS[i]} != "${e#*=}" ]]; do i=$((i + 1)); done
        ((i < ${#PEER_DIRS[@]})) || PEER_DIRS+=("${e#*=}")
        PEER_FOR[${e%%=*}]=$i
    done
fi
for f in "$MS" "${PEER_DIRS[@]/%//llama-server}"; do
    [[ -x $f ]] || { echo "compare_llama_cpp.sh: $f is missing (build it first)" >&2; exit 2; }
done
[[ -f $MODEL_DIR/config.json ]] || { echo "compare_llama_cpp.sh: $MODEL_DIR has no config.json" >&2; exit 2; }
[[ -f $GGUF ]] || { echo "compare_llama_cpp.sh: $GGUF is missing" >&2; exit 2; }
command -v jq >/dev/null || { echo "compare_llama_cpp.sh: needs jq (apt-get install jq)" >&2; exit 2; }

# The tables this CPU runs: moeserve falls back to the best one when told a
# table the CPU lacks, and names the one it took in generate --bench's JSON.
if [[ -z $TABLES ]]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    TABLES=""
    [[ $flags == *" amx_tile"* && $flags == *" amx_bf16"* ]] && TABLES+="amx,"
    [[ $flags == *" avx512f"* && $flags == *" avx512bw"* && $flags == *" avx512vl"* ]] && TABLES+="avx512,"
    [[ $flags == *" avx512_bf16"* ]] && TABLES+="avx512_bf16,"
    [[ $flags == *" avx2"* && $flags == *" fma"* ]] && TABLES+="avx2,"
    TABLES=${TABLES%,}
    [[ -n $TABLES ]] || TABLES=scalar
fi
IFS=, read -r -a TABLE_LIST <<<"$TABLES"
# What each entry serves: its moeserve and its table (before-X: --before's).
declare -A ENTRY_MS ENTRY_TABLE
for t in "${TABLE_LIST[@]}"; do ENTRY_MS[$t]=$MS ENTRY_TABLE[$t]=$t; done
if [[ -n $BEFORE ]]; then
    [[ -x $BEFORE/server/moeserve ]] || { echo "compare_llama_cpp.sh: $BEFORE/server/moeserve is missing" >&2; exit 2; }
    IFS=, read -r -a bt <<<"$BEFORE_TABLES"
    for t in "${bt[@]}"; do
        TABLE_LIST+=("before-$t")
        ENTRY_MS[before-$t]=$BEFORE/server/moeserve ENTRY_TABLE[before-$t]=$t
    done
fi
IFS=, read -r -a LOAD_LIST <<<"$LOADS"
# An entry's peer: its table's (--table-peer), else --peer's.
peer_of() { echo "${PEER_FOR[${ENTRY_TABLE[$1]}]:-0}"; }

[[ -n $OUT_DIR ]] || OUT_DIR=$(mktemp -d /tmp/compare-llama-cpp.XXXXXX)
mkdir -p "$OUT_DIR"
RESULTS=$OUT_DIR/results.tsv
: >"$RESULTS"
P_OURS=$PORT P_PEER=$((PORT + 1))

# The peer's logit_bias (see the top): tokens whose bytes (GPT-2's byte-level
# alphabet mapped back) do not decode as UTF-8.
PEER_EXTRA=$OUT_DIR/peer-extra-body.json
python3 - "$MODEL_DIR/tokenizer.json" >"$PEER_EXTRA" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
bias = {}
for tok, i in json.load(open(sys.argv[1]))["model"]["vocab"].items():
    try:
        bytes(byte_of[c] for c in tok).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        bias[str(i)] = -100
json.dump({"logit_bias": bias}, sys.stdout)
PY
SERVER_PID=""

stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Waits until GET /health answers 200 (both servers say 503 while loading).
wait_ready() {
    local port=$1 log=$2
    for _ in $(seq 1 1200); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "compare_llama_cpp.sh: the server exited; its log ($log):" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true) == 200 ]] && return 0
        sleep 0.5
    done
    echo "compare_llama_cpp.sh: the server on port $port did not become ready" >&2
    exit 1
}

# Another server on our port would answer our loads: refuse to start.
check_port_free() {
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health" || true) != 000 ]]; then
        echo "compare_llama_cpp.sh: something already answers on port $1; pick others with --port" >&2
        exit 1
    fi
}

start_ours() {
    local table=$1
    local log=$OUT_DIR/ours-$table-r$2.log
    check_port_free "$P_OURS"
    # --prefault-memory: the KV pool (and the step workspace) resident before
    # the server says ready, as llama-server's KV buffer is (it clears it at
    # start). Without it the loads paid each 2 MiB page's first touch, 10-15
    # ms on these VMs (their host takes back free memory): 3-6% of the
    # 64-stream load, up to a third of the first 2048-token step.
    # shellcheck disable=SC2086
    MOESERVE_CPU_KERNELS=${ENTRY_TABLE[$table]} "${ENTRY_MS[$table]}" serve "$MODEL_DIR" --host 127.0.0.1 --port "$P_OURS" \
        --threads "$THREADS" --max-num-seqs 64 --max-model-len 2048 --cache-dir none --prefault-memory \
        --disable-uvicorn-access-log $OURS_ARGS >"$log" 2>&1 &
    SERVER_PID=$!
    wait_ready "$P_OURS" "$log"
}

start_peer() { # ROUND THREADS PEER_INDEX
    local threads=$2 log=$OUT_DIR/peer$3-t$2-r$1.log
    check_port_free "$P_PEER"
    # 64 slots of 1024 positions: every load fits a slot.
    # shellcheck disable=SC2086
    "${PEER_DIRS[$3]}/llama-server" -m "$GGUF" --host 127.0.0.1 --port "$P_PEER" -t "$threads" \
        -c 65536 -np 64 --no-warmup --reasoning-format none --no-jinja $PEER_ARGS >"$log" 2>&1 &
    SERVER_PID=$!
    wait_ready "$P_PEER" "$log"
}

# One load against the server on port; prints the figure it is judged by.
run_load() {
    local port=$1 load=$2 tag=$3 json=$OUT_DIR/$3-$2.json
    local args=(--base-url "http://127.0.0.1:$port" --no-initial-test --no-progress --ignore-eos
                --save-result "$json" --fail-on-error)
    [[ $port == "$P_PEER" ]] && args+=(--extra-body "$(cat "$PEER_EXTRA")")
    case $load in
    c16) args+=(--num-prompts 16 --max-concurrency 16 --random-input-len "$IN" --random-output-len "$OUT" --seed 1) ;;
    c64) args+=(--num-prompts 64 --max-concurrency 64 --random-input-len "$IN" --random-output-len "$OUT" --seed 2) ;;
    ttft) args+=(--num-prompts 4 --max-concurrency 1 --random-input-len 512 --random-output-len 2 --seed 3) ;;
    tpot) args+=(--num-prompts 3 --max-concurrency 1 --random-input-len 32 --random-output-len 128 --seed 4) ;;
    warm) args+=(--num-prompts 2 --max-concurrency 2 --random-input-len 64 --random-output-len 8 --seed 99) ;;
    esac
    "$MS" bench "${args[@]}" >"$OUT_DIR/$tag-$load.txt" 2>&1 ||
        { echo "compare_llama_cpp.sh: $tag $load failed:" >&2; tail -5 "$OUT_DIR/$tag-$load.txt" >&2; exit 1; }
    case $load in
    c16|c64) jq -r '.output_throughput' "$json" ;;
    ttft) jq -r '.median_ttft_ms' "$json" ;;
    tpot) jq -r '.median_tpot_ms' "$json" ;;
    warm) echo 0 ;;
    esac
}

run_loads() {
    local port=$1 tag=$2 who=$3 round=$4 table=$5
    run_load "$port" warm "$tag" >/dev/null
    printf '%s\t%s\t%s\tload\t%s\n' "$round" "$who" "$table" "$(loadavg | cut -d' ' -f1)" >>"$RESULTS"
    for load in "${LOAD_LIST[@]}"; do
        local v
        v=$(run_load "$port" "$load" "$tag")
        printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$who" "$table" "$load" "$v" >>"$RESULTS"
        printf '  %-6s %-7s %-5s %s\n' "$who" "$table" "$load" "$v"
    done
}

echo "moeserve $MODEL_DIR vs llama-server $GGUF, $THREADS threads, ${TABLE_LIST[*]}, $ROUNDS rounds"
for ((pi = 0; pi < ${#PEER_DIRS[@]}; pi++)); do
    tabs=""
    for table in "${TABLE_LIST[@]}"; do [[ $(peer_of "$table") == "$pi" ]] && tabs+=" $table"; done
    echo "peer $pi: ${PEER_DIRS[$pi]} (for:${tabs:- none})"
done
echo "results: $OUT_DIR"

# The machine's read bandwidth and the bytes of a decode step, measured now
# (WHEN: before or after the table's loads).
genbench() { # TABLE ROUND WHEN
    local table=$1 round=$2 when=$3
    local gb=$OUT_DIR/genbench-$table-r$round-$when.json
    MOESERVE_CPU_KERNELS=${ENTRY_TABLE[$table]} "${ENTRY_MS[$table]}" generate "$MODEL_DIR" --bench --json --threads "$THREADS" \
        2>"${gb%.json}.log" >"$gb"
    {
        printf '%s\tours\t%s\tbw_gbs_%s\t%s\n' "$round" "$table" "$when" "$(jq -r .read_bandwidth_gbs "$gb")"
        # The bytes a step reads are the model's: one row for both probes.
        [[ $when == before ]] &&
            printf '%s\tours\t%s\tstep_bytes\t%s\n' "$round" "$table" "$(jq -r .decode_active_bytes "$gb")"
        printf '%s\tours\t%s\tgen_decode_frac_%s\t%s\n' "$round" "$table" "$when" "$(jq -r .decode_fraction_of_bandwidth "$gb")"
    } >>"$RESULTS"
    printf '  %-6s %-7s bandwidth %.2f GB/s %s, %s MB a step, generate --bench decode at %.0f%% of it\n' \
        ours "$table" "$(jq -r .read_bandwidth_gbs "$gb")" "$when" "$(jq -r '.decode_active_bytes / 1e6 | floor' "$gb")" \
        "$(jq -r '.decode_fraction_of_bandwidth * 100' "$gb")"
}

for ((round = 1; round <= ROUNDS; round++)); do
    echo "round $round (load average $(loadavg))"
    for table in "${TABLE_LIST[@]}"; do
        genbench "$table" "$round" before
        start_ours "$table" "$round"
        run_loads "$P_OURS" "ours-$table-r$round" ours "$round" "$table"
        stop_server
        genbench "$table" "$round" after
    done
    # The peers some table of this run is measured against, each once.
    for ((pi = 0; pi < ${#PEER_DIRS[@]}; pi++)); do
        used=0
        for table in "${TABLE_LIST[@]}"; do
            [[ $(peer_of "$table") == "$pi" ]] && used=1
        done
        ((used)) || continue
        start_peer "$round" "$THREADS" "$pi"
        run_loads "$P_PEER" "peer$pi-r$round" peer "$round" "$pi"
        stop_server
        if ((CONTROL)); then
            start_peer "$round" 1 "$pi"
            run_loads "$P_PEER" "peer1-$pi-r$round" peer1 "$round" "$pi"
            stop_server
        fi
    done
done
echo "load average at the end: $(loadavg)"

# The summary: per table and round, the ratios against that round's peer
# (and, with the control, against twice the peer on one thread).
summary() {
    local who=$1 scale=$2
    printf '%-12s %-5s %8s %8s %10s %9s %13s   (load: ours, peer)\n' table round "c16 x" "c64 x" "ttft512 x" "tpot1 x" "decode/bound"
    for table in "${TABLE_LIST[@]}"; do
        for ((round = 1; round <= ROUNDS; round++)); do
            awk -F'\t' -v t="$table" -v r="$round" -v w="$who" -v k="$scale" -v pi="$(peer_of "$table")" '
                $1 == r && $2 == "ours" && $3 == t { o[$4] = $5 }
                $1 == r && $2 == w && $3 == pi { p[$4] = $5 }
                function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "-" : sprintf("%.2f", a / b) }
                END {
                    if (!("c16" in p) && !("tpot" in p) && !("ttft" in p) && !("c64" in p)) exit
                    bw = o["bw_gbs_before"] > o["bw_gbs_after"] ? o["bw_gbs_before"] : o["bw_gbs_after"]
                    bound = (bw > 0) ? o["step_bytes"] / (bw * 1e9) * 1e3 : 0
                    frac = (bound > 0 && o["tpot"] > 0) ? sprintf("%.0f%%", 100 * bound / o["tpot"]) : "-"
                    printf "%-12s %-5s %8s %8s %10s %9s %13s   (%s, %s)\n", t, r,
                        ratio(o["c16"], p["c16"] * k), ratio(o["c64"], p["c64"] * k),
                        ratio(p["ttft"] / k, o["ttft"]), ratio(p["tpot"] / k, o["tpot"]), frac, o["load"], p["load"]
                }' "$RESULTS"
        done
    done
}
echo
echo "ours against the peer on $THREADS threads:"
summary peer 1
if ((CONTROL)); then
    echo
    echo "conservative: ours against $THREADS x the peer on one thread:"
    summary peer1 "$THREADS"
fi
# Per entry, the median over the rounds of each ratio (the rounds'
# disturbances differ: a median of several is the figure to quote).
medians() {
    local who=$1 scale=$2
    printf '%-12s %8s %8s %10s %9s %13s\n' "median of $ROUNDS" "c16 x" "c64 x" "ttft512 x" "tpot1 x" "decode/bound"
    for table in "${TABLE_LIST[@]}"; do
        awk -F'\t' -v t="$table" -v w="$who" -v k="$scale" -v R="$ROUNDS" -v pi="$(peer_of "$table")" '
            $2 == "ours" && $3 == t { o[$1, $4] = $5 }
            $2 == w && $3 == pi { p[$1, $4] = $5 }
            function med(a, n,   i, j, x) {
                for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
                return n == 0 ? "-" : sprintf("%.2f", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2)
            }
            function col(load, inv,   r, n, v) {
                n = 0; delete v
                for (r = 1; r <= R; r++)
                    if (((r, load) in o) && ((r, load) in p) && o[r, load] > 0 && p[r, load] > 0)
                        v[++n] = inv ? p[r, load] / k / o[r, load] : o[r, load] / (p[r, load] * k)
                return med(v, n)
            }
            function frac(   r, n, v, b, bw) {
                n = 0; delete v
                for (r = 1; r <= R; r++) {
                    bw = o[r, "bw_gbs_before"] > o[r, "bw_gbs_after"] ? o[r, "bw_gbs_before"] : o[r, "bw_gbs_after"]
                    if (bw > 0 && o[r, "tpot"] > 0) {
                        b = o[r, "step_bytes"] / (bw * 1e9) * 1e3
                        v[++n] = b / o[r, "tpot"]
                    }
                }
                return med(v, n)
            }
            END { printf "%-12s %8s %8s %10s %9s %13s\n", t, col("c16", 0), col("c64", 0), col("ttft", 1), col("tpot", 1), frac() }
        ' "$RESULTS"
    done
}
if ((ROUNDS > 1)); then
    echo
    echo "medians, against the peer on $THREADS threads:"
    medians peer 1
    if ((CONTROL)); then
        echo
        echo "medians, conservative (against $THREADS x the peer on one thread):"
        medians peer1 "$THREADS"
    fi
fi
echo
echo "raw figures (tok/s for c16/c64, ms for ttft/tpot; load average when the server's loads began):"
awk -F'\t' '$4 ~ /^(c16|c64|ttft|tpot|load)$/ { printf "  round %s %-5s %-12s %-5s %s\n", $1, $2, $3, $4, $5 }' "$RESULTS"
