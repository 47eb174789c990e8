#!/usr/bin/env bash
# Pins device_check.sh's host side: its arguments (bad ones exit 2 with a
# reason), its skip path (`check` exits 77 where no GPU is visible, 0 where
# one is) and its refusal to build without the prepared libraries. The build
# and measuring paths themselves run on the device machine.
set -u
script="$(dirname "$0")/device_check.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$(bash "$script" bogus 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "say prepare, run or check, not 'bogus'" <<<"$out" || fail "bogus subcommand: rc $rc: $out"
out=$(bash "$script" run --budget soon 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--budget needs whole seconds, not 'soon'" <<<"$out" || fail "bad budget: rc $rc: $out"
out=$(bash "$script" run --frobnicate 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown option '--frobnicate'" <<<"$out" || fail "unknown option: rc $rc: $out"
out=$(bash "$script" help 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q 'carry=\[".devdeps"\]' <<<"$out" || fail "help should show the run call: rc $rc: $out"
out=$(bash "$script" run --deps "$tmp/none" --out "$tmp/out" --no-bench 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "is missing: run 'tests/gpu/device_check.sh prepare'" <<<"$out" ||
    fail "run without prepared libraries: rc $rc: $out"
[ -f "$tmp/out/device_check.md" ] || fail "the table file should exist even when the run stops early"
out=$(bash "$script" check --deps "$tmp/none" 2>&1); rc=$?
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    [ $rc -eq 0 ] || fail "check with a GPU should exit 0: $out"
else
    [ $rc -eq 77 ] && grep -q 'no GPU is visible here' <<<"$out" || fail "check without a GPU should skip (77): rc $rc: $out"
fi
echo ok
