#!/usr/bin/env bash
# run.sh: builds the libFuzzer targets with clang (ASan + UBSan + LeakSanitizer)
# and runs each for SECONDS (or for RUNS executions with --runs RUNS).
#
#   tests/fuzz/run.sh [--smoke] [--runs N] SECONDS [TARGET...]
#
# Every parser of untrusted bytes has a target (the table below); each one's
# seed corpus is tests/fuzz/corpus/TARGET and its dictionary
# tests/fuzz/dict/TARGET.dict. New inputs a run finds go to
# $MOESERVE_FUZZ_DIR/corpus/TARGET (build/fuzz by default), never into the
# committed seeds; crashes to $MOESERVE_FUZZ_DIR/crashes/TARGET, with the
# harness's sentence on stderr. --smoke is the test suite's mode: exit 77
# (skipped) with a note when clang or libFuzzer is missing, else fail on any
# finding. Prints one line per target: executions, findings, seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${MOESERVE_FUZZ_DIR:-$root/build/fuzz}"
smoke=0
runs=-1
while [[ $# -gt 0 && "$1" == --* ]]; do
    case "$1" in
    --smoke) smoke=1 ;;
    --runs) runs="$2"; shift ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
seconds="${1:?usage: tests/fuzz/run.sh [--smoke] [--runs N] SECONDS [TARGET...]}"
shift

base="$(echo base/*.c)" # each target links what it uses of them
tok="tokenizer/tokenizer.c tokenizer/tokenizer_bpe.c tokenizer/tokenizer_decode.c tokenizer/tokenizer_load.c tokenizer/tokenizer_text.c"
tok_libs="-ljansson -lpcre2-8 -lutf8proc -lm"
# name | sources beyond the harness and base/ | libraries
targets=(
    "fuzz_openai_request|api/openai_parse.c api/openai_build.c model/sampling.c $tok|$tok_libs"
    "fuzz_api_fronts|api/responses_parse.c api/responses_build.c api/anthropic_parse.c api/anthropic_build.c api/text_trim.c api/translate.c api/output_parser.c api/py_literal.c api/openai_parse.c api/openai_build.c model/sampling.c $tok|$tok_libs"
    "fuzz_jinja|api/jinja_lex.c api/jinja_parse.c api/jinja_eval.c api/jinja_value.c api/jinja_builtins.c api/py_literal.c|-ljansson -lutf8proc -lm"
    "fuzz_sse|bench/sse.c|-ljansson -lm"
    "fuzz_http_head|server/http_head.c|-ljansson -lm"
    "fuzz_config|model/config.c|-ljansson -lm"
    "fuzz_safetensors|model/safetensors.c model/config.c|-ljansson -lm"
    "fuzz_checkpoint|model/model.c model/safetensors.c model/config.c model/quant.c model/makemodel.c|-ljansson -lm"
    "fuzz_tokenizer|$tok|$tok_libs"
    "fuzz_output_parser|api/output_parser.c api/py_literal.c|-ljansson -lm"
    "fuzz_py_literal|api/py_literal.c|-ljansson -lm"
    "fuzz_grammar|$(echo grammar/*.c) $tok|$tok_libs"
)

cc="${MOESERVE_FUZZ_CC:-clang}"
probe="$out/probe"
mkdir -p "$out"
if ! command -v "$cc" >/dev/null 2>&1 ||
   ! printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
        >"$probe.c" ||
   ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" 2>"$probe.log"; then
    echo "note: no clang with libFuzzer here ($cc; Debian: apt-get install clang libclang-rt-dev, as"
    echo "deploy/setup.sh does), so the fuzz targets were not run"
    [[ -f "$probe.log" ]] && head -3 "$probe.log"
    exit 77
fi

cflags=(-g -O1 -std=c11 -D_GNU_SOURCE -DMOESERVE_LIBFUZZER -I"$root" -fno-omit-frame-pointer
        -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
        -Wall -Wextra -Wno-unused-parameter)
newest_header="$(find base api model tokenizer grammar bench server tests/fuzz -name '*.h' -printf '%T@\n' | sort -n | tail -1)"

# Findings in code this script's authors do not own wait for its owners;
# until they land, the one check each trips is off for that file only, so
# that the rest of the target keeps being fuzzed (and the suite stays green).
# Remove a line when its fix lands.
declare -A known=(
)

# Files whose own comparisons are not worth tracing: the grammar's automaton
# builder, vocabulary walk and matcher stack run long loops of integer
# compares, and libFuzzer's compare tracing there took three quarters of
# fuzz_grammar's time (perf) while the input's shape is decided in the
# parsers, which keep it. Their edges are still covered.
declare -A light=(
    [grammar/grammar_automaton.c]=1
    [grammar/grammar_tokens.c]=1
    [grammar/grammar_stack.c]=1
)

obj_of() { echo "$out/obj/${1//\//_}.o"; }
# An object is rebuilt when its source or any header is newer.
stale() {
    local obj
    obj="$(obj_of "$1")"
    [[ ! -f "$obj" || "$1" -nt "$obj" ]] || (( $(printf '%.0f' "$newest_header") > $(stat -c %Y "$obj") ))
}
compile_one() {
    # shellcheck disable=SC2086
    "$cc" "${cflags[@]}" ${known[$1]:-} ${light[$1]:+-fno-sanitize-coverage=trace-cmp} -c "$1" \
        -o "$(obj_of "$1")"
}

# Targets by name, with or without the fuzz_ prefix; a name that matches
# none is an error (it would fuzz nothing and say done).
want=()
for w in "$@"; do want+=("fuzz_${w#fuzz_}"); done
selected=()
all_names=()
for row in "${targets[@]}"; do
    IFS='|' read -r name srcs libs <<<"$row"
    all_names+=("$name")
    if ((${#want[@]})) && [[ ! " ${want[*]} " == *" $name "* ]]; then continue; fi
    selected+=("$row")
done
for w in "${want[@]}"; do
    if [[ ! " ${all_names[*]} " == *" $w "* ]]; then
        echo "fuzz: no target $w; the targets: ${all_names[*]}" >&2
        exit 2
    fi
done
# Every stale object first, on all cores.
mkdir -p "$out/obj"
jobs=0
declare -A queued=()
for row in "${selected[@]}"; do
    IFS='|' read -r name srcs libs <<<"$row"
    for src in tests/fuzz/$name.c $srcs $base; do
        [[ -n "${queued[$src]:-}" ]] && continue
        queued[$src]=1
        stale "$src" || continue
        compile_one "$src" &
        if ((++jobs >= $(nproc))); then wait -n; jobs=$((jobs - 1)); fi
    done
done
while ((jobs > 0)); do wait -n; jobs=$((jobs - 1)); done

failed=0
total_start=$SECONDS
for row in "${selected[@]}"; do
    IFS='|' read -r name srcs libs <<<"$row"
    objs=()
    for src in tests/fuzz/$name.c $srcs $base; do objs+=("$(obj_of "$src")"); done
    # shellcheck disable=SC2086
    "$cc" -fsanitize=fuzzer,address,undefined "${objs[@]}" $libs -o "$out/$name"
    mkdir -p "$out/corpus/$name" "$out/crashes/$name"
    # The grammar compilers are bounded by their state and trie-walk limits,
    # which a hostile regex can take seconds to reach (10x that under ASan).
    limit=10
    [[ $name == fuzz_grammar ]] && limit=90
    args=(-max_total_time="$seconds" -timeout="$limit" -rss_limit_mb=2048 -max_len=16384
          -artifact_prefix="$out/crashes/$name/" -print_final_stats=1)
    ((runs >= 0)) && args+=(-runs="$runs")
    [[ -f tests/fuzz/dict/$name.dict ]] && args+=(-dict="tests/fuzz/dict/$name.dict")
    seeds=()
    [[ -d tests/fuzz/corpus/$name ]] && seeds+=("tests/fuzz/corpus/$name")
    log="$out/$name.log"
    start=$SECONDS
    rc=0
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
        "$out/$name" "${args[@]}" "$out/corpus/$name" "${seeds[@]}" >"$log" 2>&1 || rc=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    found="$(find "$out/crashes/$name" -type f -newer "$out/$name" | wc -l)"
    printf '%-20s %10s executions  %d findings  %ds\n' "$name" "${execs:-?}" "$found" $((SECONDS - start))
    if ((rc != 0 || found != 0)); then
        failed=1
        grep -m3 -E "promise broken|ERROR: |runtime error" "$log" || tail -5 "$log"
        echo "  (log: $log; inputs: $out/crashes/$name/)"
    fi
done
echo "fuzz: done in $((SECONDS - total_start))s"
exit $failed
