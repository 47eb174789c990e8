#!/usr/bin/env bash
# test.sh: set up (deploy/setup.sh) and run the whole test suite under meson.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/setup.sh"
build_dir="${MOESERVE_BUILD_DIR:-build}"
cd "$root"
exec meson test -C "$build_dir" --print-errorlogs --num-processes "$(nproc)" "$@"
