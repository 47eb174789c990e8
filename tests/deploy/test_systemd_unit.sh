#!/usr/bin/env bash
# Pins deploy/moeserve.service: `systemd-analyze verify` passes on it (with
# ExecStart pointed at the built binary, since verify checks the file exists)
# and prints no warning, it has the hardening the issue lists, and its stop
# timeout is longer than the drain time in deploy/moeserve.env.
set -euo pipefail
unit="$MOESERVE_SOURCE_ROOT/deploy/moeserve.service"
envf="$MOESERVE_SOURCE_ROOT/deploy/moeserve.env"
dir="$(mktemp -d /tmp/moeserve-unit-XXXXXX)"
trap 'rm -rf "$dir"' EXIT

grep -q '^ExecStart=/usr/local/bin/moeserve serve ' "$unit"
sed "s|^ExecStart=/usr/local/bin/moeserve |ExecStart=$MOESERVE_BIN |" "$unit" > "$dir/moeserve.service"
grep -q "^ExecStart=$MOESERVE_BIN serve" "$dir/moeserve.service"
out="$(systemd-analyze verify "$dir/moeserve.service" 2>&1)" || { echo "$out" >&2; exit 1; }
# verify exits 0 on unknown keys and bad values, but says so: none allowed.
if grep -q "moeserve.service" <<<"$out"; then echo "$out" >&2; exit 1; fi

for want in Type=notify DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes \
            PrivateTmp=yes ReadOnlyPaths= Restart=on-failure TimeoutStopSec= LimitNOFILE= \
            EnvironmentFile=/etc/moeserve/moeserve.env CacheDirectory=moeserve \
            Environment=XDG_CACHE_HOME=/var/cache RestartPreventExitStatus=2; do
  grep -q "^$want" "$unit" || { echo "moeserve.service lacks $want" >&2; exit 1; }
done
stop="$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s\{0,1\}$/\1/p' "$unit")"
drain="$(sed -n 's/^MOESERVE_ARGS=.*--shutdown-timeout \([0-9]*\).*/\1/p' "$envf")"
[[ -n "$stop" && -n "$drain" ]] || { echo "cannot read TimeoutStopSec or --shutdown-timeout" >&2; exit 1; }
(( stop > drain )) || { echo "TimeoutStopSec=$stop must exceed --shutdown-timeout $drain" >&2; exit 1; }
# The env file names what ExecStart expands.
for v in MOESERVE_MODEL MOESERVE_HOST MOESERVE_PORT MOESERVE_ARGS; do
  grep -q "^$v=" "$envf" || { echo "moeserve.env lacks $v" >&2; exit 1; }
done

# The check is real: a unit whose binary is missing fails it.
sed "s|^ExecStart=/usr/local/bin/moeserve |ExecStart=$dir/no-such-binary |" "$unit" > "$dir/broken.service"
if systemd-analyze verify "$dir/broken.service" >/dev/null 2>&1; then
  echo "systemd-analyze verify accepted a unit without its binary" >&2
  exit 1
fi
echo "deploy/moeserve.service: ok"
