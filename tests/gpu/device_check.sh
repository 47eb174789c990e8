#!/usr/bin/env bash
# device_check.sh: the CUDA backend's check on a machine with a GPU, as one
# command — build there, run the GPU test suite, then measure and write a
# table. The device machine has CUDA, gcc, meson and ninja but not the
# Debian libraries moeserve links (jansson, libmicrohttpd, libcurl, pcre2,
# utf8proc, cmocka): `prepare` copies them (headers, and the shared
# libraries with everything they load but glibc) from this machine into
# .devdeps/, with the tokenizer files the build needs; `run` uses them there.
# The measurements: bench_gpu's tables (copy bandwidth, the expert GEMM at
# 1..256 rows per expert in bf16, fp8, int8 and int4, decode attention,
# NCCL), and bench-offline passes on a dummy Qwen3-30B-A3B: decode at
# concurrency 1..256, the same with --quantization int4 and fp8, prefill,
# and the 1024 / 128 x 256 target. What the issues' targets need runs first
# (batch-1 decode, the target pass, bench_gpu capped), so that a short budget
# drops the side-by-side passes, not those.
#
# Here, once (from the repository root, after a build in build/):
#   tests/gpu/device_check.sh prepare
# Then, on the device machine (the device tool's run, carrying .devdeps):
#   run(command="bash tests/gpu/device_check.sh run", carry=[".devdeps"], timeout_s=330)
# The table and the logs land in $OUT (device_check.md, build.log, tests.log,
# bench.log); the whole run stays under --budget seconds (default 300: with
# the machine's start, a second run still fits the 15 minutes of device time
# a task gets): the tests are cut off where they would leave the first
# passes too little, and each pass is skipped, with a note, when too little
# time is left.
#
# Subcommands:
#   prepare [--deps DIR]        fill DIR (.devdeps) from this machine
#   run [options]               build, test, measure (the device machine): the
#                               decode passes run with CUDA graphs on and off
#                               (--enforce-eager), side by side
#   check                       say what `run` would find here and stop: exit 0
#                               when a GPU is visible, 77 when not (the skip path)
# run options:
#   --deps DIR      the prepared folder (.devdeps)
#   --build DIR     the build folder (build-device)
#   --out DIR       where the table and logs go ($OUT, else device-check-out)
#   --budget S      seconds for the whole run (300)
#   --no-bench      build and test only
#   --cuda DIR      the CUDA toolkit (/usr/local/cuda)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; }
die() { echo "device_check: $*" >&2; exit 1; }

cmd="${1:-}"
[ $# -gt 0 ] && shift
deps="$root/.devdeps" build="$root/build-device" out="${OUT:-$root/device-check-out}"
budget=300 bench=1 cuda=/usr/local/cuda
while [ $# -gt 0 ]; do
    case "$1" in
    --deps) deps="$(realpath -m "${2:?--deps needs a folder}")"; shift 2 ;;
    --build) build="$(realpath -m "${2:?--build needs a folder}")"; shift 2 ;;
    --out) out="$(realpath -m "${2:?--out needs a folder}")"; shift 2 ;;
    --budget)
        [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "device_check: --budget needs whole seconds, not '${2:-}'" >&2; exit 2; }
        budget=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --cuda) cuda="${2:?--cuda needs a folder}"; shift 2 ;;
    *) echo "device_check: unknown option '$1'" >&2; usage; exit 2 ;;
    esac
done
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

# Libraries moeserve and its tests link, and the headers they include.
libs="jansson microhttpd curl pcre2-8 utf8proc cmocka"
headers="jansson.h jansson_config.h microhttpd.h curl pcre2.h utf8proc.h cmocka.h cmocka_pbc.h"

prepare() {
    local libdir=/lib/x86_64-linux-gnu
    rm -rf "$deps"
    mkdir -p "$deps/lib" "$deps/include" "$deps/tokenizer" "$deps/bin" || die "cannot make $deps"
    # pkg-config itself, which the device machine may lack.
    cp -L /usr/bin/pkgconf "$deps/bin/pkg-config" && cp -L /lib/x86_64-linux-gnu/libpkgconf.so.3 "$deps/lib/" ||
        die "pkgconf is missing: apt-get install pkgconf"
    local h d found
    for h in $headers; do
        found=
        for d in /usr/include /usr/include/x86_64-linux-gnu; do
            [ -e "$d/$h" ] && cp -rL "$d/$h" "$deps/include/" && found=1 && break
        done
        [ -n "$found" ] || die "the header $h is missing: run deploy/setup.sh first"
    done
    # Each library with its whole closure but glibc, the compiler's runtime and CUDA.
    local l so
    for l in $libs; do
        so=$(ls "$libdir"/lib"$l".so.[0-9]* 2>/dev/null | head -1)
        [ -n "$so" ] || die "lib$l is not installed: run deploy/setup.sh first"
        { echo "$so"; ldd "$so" | awk '$3 ~ /^\// {print $3}'; } |
            grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+|libresolv)\.so' |
            while read -r f; do cp -L "$f" "$deps/lib/"; done
        ln -sf "$(basename "$so")" "$deps/lib/lib$l.so"
    done
    local tok="$root/third_party/qwen3-tokenizer"
    cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$deps/tokenizer/" ||
        die "the tokenizer files are missing under $tok: run deploy/setup.sh first"
    echo "prepared $deps ($(du -sh "$deps" | cut -f1)); on the device machine run:"
    echo '  run(command="bash tests/gpu/device_check.sh run", carry=[".devdeps"], timeout_s=330)'
}

# A toolkit folder meson can read: the CUDA toolkit, with NCCL and cuBLAS
# linked in from wherever this machine keeps them (the toolkit itself, the
# system, or the nvidia-* Python packages PyTorch brings).
toolkit() {
    local tk=/tmp/moeserve-cudatk d f
    rm -rf "$tk"
    mkdir -p "$tk/lib64" "$tk/include"
    # Everything else of the toolkit (bin, nvvm, targets...) as it is: nvcc
    # finds its parts relative to where it is called from.
    for f in "$cuda"/*; do
        case "$(basename "$f")" in include|lib64) ;; *) ln -s "$f" "$tk/" ;; esac
    done
    for f in "$cuda"/include/* "$cuda"/targets/x86_64-linux/include/*; do
        [ -e "$f" ] && ln -sf "$f" "$tk/include/"
    done
    for f in "$cuda"/lib64/* "$cuda"/targets/x86_64-linux/lib/*; do [ -e "$f" ] && ln -sf "$f" "$tk/lib64/"; done
    local py_dirs
    py_dirs=$(python3 -c 'import nvidia, os; [print(os.path.join(p, d)) for p in nvidia.__path__ for d in os.listdir(p)]' 2>/dev/null)
    for d in /usr/lib/x86_64-linux-gnu /usr/include $py_dirs; do
        for f in "$d"/libnccl.so* "$d"/lib/libnccl.so* "$d"/lib/libcublas*.so* "$d"/lib/libcudart.so*; do
            [ -e "$f" ] && [ ! -e "$tk/lib64/$(basename "$f")" ] && ln -s "$f" "$tk/lib64/"
        done
        for f in "$d"/nccl*.h "$d"/include/nccl*.h; do
            [ -e "$f" ] && [ ! -e "$tk/include/$(basename "$f")" ] && ln -s "$f" "$tk/include/"
        done
    done
    for l in nccl cublas cudart; do # the unversioned names the linker looks for
        if [ ! -e "$tk/lib64/lib$l.so" ]; then
            f=$(ls "$tk"/lib64/lib$l.so.[0-9]* 2>/dev/null | head -1)
            [ -n "$f" ] && ln -s "$(basename "$f")" "$tk/lib64/lib$l.so"
        fi
    done
    echo "$tk"
}

pkgconfig() { # pc files for the carried libraries, prefixed where they are now
    local pc="$deps/pkgconfig" l name
    mkdir -p "$pc"
    for l in $libs; do
        case $l in
        pcre2-8) name=libpcre2-8 ;; microhttpd) name=libmicrohttpd ;; curl) name=libcurl ;;
        utf8proc) name=libutf8proc ;; *) name=$l ;;
        esac
        printf 'Name: %s\nDescription: carried\nVersion: 99\nCflags: -I%s/include\nLibs: -L%s/lib -l%s\n' \
            "$name" "$deps" "$deps" "$l" >"$pc/$name.pc"
    done
    echo "$pc"
}

gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

case "$cmd" in
prepare) prepare; exit $? ;;
check)
    echo "nvcc: $(command -v "$cuda/bin/nvcc" || echo missing)"
    echo "meson: $(command -v meson || echo missing); ninja: $(command -v ninja || echo missing)"
    echo "prepared libraries: $([ -d "$deps/lib" ] && ls "$deps/lib" | wc -l || echo none) in $deps"
    if gpu_visible; then nvidia-smi -L; exit 0; fi
    echo "no GPU is visible here: the device check needs one (skipped)"
    exit 77 ;;
run) ;;
-h|--help|help) usage; exit 0 ;;
*) echo "device_check: say prepare, run or check${cmd:+, not '$cmd'}" >&2; usage; exit 2 ;;
esac

# ---- run ----------------------------------------------------------------------------
mkdir -p "$out" || die "cannot make $out"
table="$out/device_check.md"
note() { echo "$*" | tee -a "$table"; }
: >"$table"
note "# moeserve device check ($(date -u +%FT%TZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
note ""
gpu_visible && note "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/GPU: /')"
[ -d "$deps/lib" ] || die "$deps is missing: run 'tests/gpu/device_check.sh prepare' where the libraries are, and carry it"
tk=$(toolkit)
pc=$(pkgconfig)
command -v pkg-config >/dev/null || export PKG_CONFIG="$deps/bin/pkg-config"

# Build: CUDA required (-Dcuda=enabled), the carried libraries alone through
# pkg-config; warnings not errors (-Dwerror=false): the machine's compilers
# are not this one's, and a warning only they give must not cost the run
# its minutes (the count goes into the table, the warnings into build.log).
# The programs find the libraries through an RPATH (not RUNPATH: libcurl's
# own dependencies are carried too), also when the build runs them
# (make-model writes the test checkpoints).
echo "== build ($build)" | tee "$out/build.log"
if [ ! -f "$build/build.ninja" ]; then
    PKG_CONFIG_LIBDIR="$pc" PKG_CONFIG_PATH= meson setup "$build" -Dcuda=enabled -Dcudatoolkit="$tk" -Dwerror=false \
        -Dtokenizer_dir="$deps/tokenizer" -Dc_args="-I$deps/include" \
        -Dc_link_args="-L$deps/lib -Wl,-rpath-link,$deps/lib -Wl,-rpath,$deps/lib -Wl,--disable-new-dtags" \
        >>"$out/build.log" 2>&1 ||
        { tail -30 "$out/build.log"; die "meson setup failed (build.log)"; }
fi
t0=$(date +%s)
meson compile -C "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; die "the build failed (build.log)"; }
note "build: $(( $(date +%s) - t0 )) s, $(grep -c 'warning:' "$out/build.log") compiler warnings (build.log)"
# From here on moeserve's programs run: the carried libraries, then the toolkit's.
export LD_LIBRARY_PATH="$deps/lib:$tk/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Tests: the GPU suite (every op against its CPU twin, the golden set, the
# engine invariants, NCCL) and the plans; then the CPU suites the seam touches.
echo "== tests" | tee "$out/tests.log"
# A hung test (an NCCL wait, say) must not take the measurements' time: the
# suite gets what is left but 200 s (at least 60), what the first pass and
# the target pass need.
tlim=$(( $(left) - 200 )); [ "$tlim" -lt 60 ] && tlim=60
timeout "$tlim" meson test -C "$build" --suite gpu --print-errorlogs --num-processes 4 >>"$out/tests.log" 2>&1
trc=$?
[ $trc -eq 124 ] && note "tests/gpu: cut off after $tlim s (tests.log)"
note "tests/gpu: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$out/tests.log" | tr -s ' ' | paste -sd ' ')$([ $trc -ne 0 ] && echo ' (FAILED: see tests.log)')"
grep -E '^ *[0-9]+/[0-9]+ ' "$out/tests.log" | sed 's/^/    /' >>"$table"
[ "$bench" = 1 ] || exit $trc
gpu_visible || { note "no GPU visible: no measurements"; exit $trc; }

# Measurements.
echo "== bench" | tee "$out/bench.log"
cfg="$root/tests/data/qwen3-30b-a3b/config.json"
moe="$build/server/moeserve"
model=$(mktemp -d)
cp "$cfg" "$model/"
common=(--load-format dummy --device cuda --max-model-len 4096 --json)
kv=() # the KV cache's size for the passes (below)
pass() { # pass LABEL GRAPHS SECONDS ARGS...: one bench-offline pass, or a note when time is short
    local label=$1 graphs=$2 need=$3; shift 3
    if [ "$(left)" -lt "$need" ]; then note "| $label | $graphs | skipped: $(left) s left of the budget |"; return; fi
    local js extra=()
    [ "$graphs" = off ] && extra=(--enforce-eager)
    js=$(timeout $(( $(left) - 10 )) "$moe" bench-offline "$model" "${common[@]}" "${kv[@]}" "${extra[@]}" "$@" 2>>"$out/bench.log" | tail -1)
    if [ -z "$js" ]; then note "| $label | $graphs | failed or timed out (bench.log) |"; return; fi
    python3 - "$label" "$graphs" "$js" <<'PY' | tee -a "$table"
import json, sys
label, graphs, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
c, steps = j["max_concurrency"], max(j["steps"], 1)
print("| %s | %s | %d | %.1f | %.0f | %.0f | %.2f | %d of %d |" % (label, graphs, c,
      1e3 * j["elapsed_time"] / steps, j["output_tokens_per_second"], j["tokens_per_second"],
      c / max(j["output_tokens_per_second"], 1e-9) * 1e3, j.get("graph_steps", 0), steps))
PY
}
note ""
note "Qwen3-30B-A3B shape, --load-format dummy, bf16 unless the pass says a --quantization, one GPU (bench-offline; TPOT ~ concurrency / output tokens/s, prefill included; the batch-1 target: 2.1 ms, the bound 1.27 ms). graphs on: decode steps padded to their bucket and replayed from a CUDA graph per bucket (the last column: steps replayed of all steps); off: --enforce-eager."
note ""
note "| pass | graphs | concurrency | ms per step | output tok/s | total tok/s | TPOT ms | graph steps |"
note "|---|---|---|---|---|---|---|---|"
# The KV cache: sized from --gpu-memory-utilization's default in the first
# pass, as a server does; then 48 GiB (half a million tokens: the target
# pass's 256 x 1152 fit whole).
pass "decode, 64 in / 64 out, KV sized by --gpu-memory-utilization" on 45 --num-prompts 1 --max-concurrency 1 --input-len 64 --output-len 64
kv=(--kv-cache-memory 48GiB)
pass "target: 1024 in / 128 out" on 120 --num-prompts 256 --max-concurrency 256 --input-len 1024 --output-len 128
if [ "$(left)" -gt 60 ]; then
    note ""
    bl=$(( $(left) - 30 )); [ "$bl" -gt 90 ] && bl=90
    timeout "$bl" "$build/tests/gpu/bench_gpu" "$cfg" 2>>"$out/bench.log" | tee -a "$table"
    note ""
fi
# Graphs on and off side by side where launches weigh most (small batches).
pass "decode, 64 in / 64 out" off 45 --num-prompts 1 --max-concurrency 1 --input-len 64 --output-len 64
for c in 8 64; do
    for g in on off; do
        pass "decode, 64 in / 64 out" $g 45 --num-prompts "$c" --max-concurrency "$c" --input-len 64 --output-len 64
    done
done
pass "decode, 64 in / 64 out" on 45 --num-prompts 256 --max-concurrency 256 --input-len 64 --output-len 64
pass "prefill, 2048 in / 1 out" on 45 --num-prompts 16 --max-concurrency 16 --input-len 2048 --output-len 1
# Quantized experts and projections, made on the GPU at load (issue 17).
for q in int4 fp8; do
    for c in 1 64; do
        pass "$q decode, 64 in / 64 out" on 45 --quantization "$q" --num-prompts "$c" --max-concurrency "$c" \
            --input-len 64 --output-len 64
    done
done
pass "decode, 64 in / 64 out" off 45 --num-prompts 256 --max-concurrency 256 --input-len 64 --output-len 64
rm -rf "$model"
note ""
note "total: $(( $(date +%s) - start )) s"
exit $trc
