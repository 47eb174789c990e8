# shellcheck shell=bash
# serve_env.sh: sourced by the shell tests that start `moeserve serve`, so
# that they wait for it the same way and the limit lives in one place.

# serve_wait_ready LOG [PID]: waits until LOG (the server's stderr) has its
# "ready:" line. Up to 120 s, as the C and node harnesses allow: under ASan
# on a busy CI machine the tiny model took 5.4 s to load, and a neighbour's
# build can stretch that further. Returns 1 when the time runs out, or at
# once when PID (if given) has exited without getting ready.
serve_wait_ready() {
  local log=$1 pid=${2:-}
  for _ in $(seq 1200); do
    grep -q 'ready:' "$log" 2>/dev/null && return 0
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      grep -q 'ready:' "$log" 2>/dev/null
      return
    fi
    sleep 0.1
  done
  return 1
}

# serve_url LOG: the http://ADDRESS:PORT the ready line names (empty if none).
serve_url() {
  grep -o 'ready: .* on http://[0-9.]*:[0-9]*' "$1" | grep -o 'http://[0-9.:]*$'
}
