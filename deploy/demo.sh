#!/usr/bin/env bash
# demo.sh: set up (deploy/setup.sh), write the embedded demo model once, and
# run the main job on it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/setup.sh"
build_dir="${MOESERVE_BUILD_DIR:-build}"
cd "$root"
bin="$build_dir/moeserve"
"$bin" version
