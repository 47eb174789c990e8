#!/usr/bin/env bash
# demo.sh: set up (deploy/setup.sh), write the embedded demo model once, and
# run the main job on it (until the HTTP server lands: `moeserve generate`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/setup.sh"
build_dir="${MOESERVE_BUILD_DIR:-build}"
cd "$root"
bin="$build_dir/server/moeserve"
"$bin" version
# The demo model is a build target (tests/meson.build), written once.
meson compile -C "$build_dir" demo_model >/dev/null
model="$build_dir/tests/demo-model"
"$bin" generate "$model" --prompt "The capital of France is" --max-tokens 32 --seed 0
