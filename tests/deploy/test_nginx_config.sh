#!/usr/bin/env bash
# Pins deploy/nginx.conf: it is valid for the Debian nginx (nginx -t) once
# pointed at test ports, and keeps the settings SSE and failover rely on.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/nginx_env.sh"
nginx_bin="${MOESERVE_NGINX:-nginx}"
dir="$(mktemp -d /tmp/moeserve-nginx-XXXXXX)"
trap 'rm -rf "$dir"' EXIT
nginx_prepare "$dir" 18080 18001 18002
"$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -t
grep -q "server 127.0.0.1:18001" "$dir/moeserve.conf"
grep -q "server 127.0.0.1:18002" "$dir/moeserve.conf"
conf="$MOESERVE_SOURCE_ROOT/deploy/nginx.conf"
for want in "proxy_buffering off;" "proxy_http_version 1.1;" 'proxy_set_header Connection "";' \
            "keepalive 64;" "proxy_read_timeout 3600s;" "max_fails=" "fail_timeout=" \
            "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" "location = /health"; do
  grep -qF -- "$want" "$conf" || { echo "deploy/nginx.conf lacks: $want" >&2; exit 1; }
done
# A broken copy must fail the same check (the check is real).
sed -i 's/proxy_buffering off;/proxy_buffering sideways;/' "$dir/moeserve.conf"
if "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -t 2>/dev/null; then
  echo "nginx -t accepted a broken configuration" >&2
  exit 1
fi
echo "deploy/nginx.conf: ok"
