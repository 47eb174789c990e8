#!/usr/bin/env bash
# test.sh: set up (deploy/setup.sh) and run the whole test suite under meson,
# then again on a build with AddressSanitizer and UBSan, so that an
# out-of-bounds read in a parser fails here and not in production.
# MOESERVE_SANITIZERS=0 skips the second run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/setup.sh"
build_dir="${MOESERVE_BUILD_DIR:-build}"
cd "$root"
if [ "${MOESERVE_SANITIZERS:-1}" = 0 ]; then
    exec meson test -C "$build_dir" --print-errorlogs --num-processes "$(nproc)" "$@"
fi
meson test -C "$build_dir" --print-errorlogs --num-processes "$(nproc)" "$@"
# Some tests ask for impossible sizes on purpose and expect a refusal, which
# ASan reports as a crash unless malloc may return NULL; any UBSan finding
# fails the test.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# A machine whose kernel or limits keep the sanitizers from running (no room
# for ASan's shadow memory, no ptrace for LeakSanitizer) says so and stops
# here, rather than failing every test.
probe="$(mktemp -d)"
printf '#include <stdlib.h>\nint main(void) { char *p = malloc(8); p[0] = 1; int r = p[0] - 1; free(p); return r; }\n' >"$probe/p.c"
if ! cc -fsanitize=address,undefined -o "$probe/p" "$probe/p.c" 2>"$probe/log" || ! "$probe/p" 2>>"$probe/log"; then
    echo "note: the sanitizers do not run on this machine, so the AddressSanitizer pass is skipped:"
    cat "$probe/log"
    rm -rf "$probe"
    exit 0
fi
rm -rf "$probe"
asan_dir="${MOESERVE_ASAN_BUILD_DIR:-build-asan}"
# -Dcuda=disabled: nvcc is not run twice (the sanitizers do not see device code anyway).
# -Dsystemd=disabled: the build without libsystemd (the GPU machine's, whose
# image lacks it) compiles and passes too; the first pass tests sd_notify.
# float-cast-overflow: GCC's -fsanitize=undefined leaves out a float
# converted to an integer type it does not fit (clang's, in the fuzz
# targets, has it: fuzz_jinja found one).
[ -f "$asan_dir/build.ninja" ] ||
    meson setup "$asan_dir" -Db_sanitize=address,undefined -Dc_args=-fsanitize=float-cast-overflow \
        -Dcuda=disabled -Dsystemd=disabled
echo "== the same tests with AddressSanitizer and UBSan ($asan_dir)"
# The sanitizers make code 2-10x slower: every test's time limit stretches with them.
exec meson test -C "$asan_dir" --print-errorlogs --num-processes "$(nproc)" --timeout-multiplier 5 "$@"
