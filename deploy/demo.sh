#!/usr/bin/env bash
# demo.sh: set up (deploy/setup.sh), write the embedded demo model once, and
# serve it: `moeserve serve` with the OpenAI API on http://HOST:PORT/v1.
# MOESERVE_HOST / MOESERVE_PORT override 127.0.0.1:8000; extra arguments go
# to `moeserve serve` (for example --api-key KEY or --data-parallel-size 2
# --enable-expert-parallel).
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
host="${MOESERVE_HOST:-127.0.0.1}"
port="${MOESERVE_PORT:-8000}"
echo "moeserve: serving the demo model as \"demo\" on http://$host:$port/v1 (Ctrl-C drains and stops)" >&2
exec "$bin" serve "$model" --host "$host" --port "$port" --served-model-name demo "$@"
