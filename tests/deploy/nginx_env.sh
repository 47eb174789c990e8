# nginx_env.sh: sourced by the nginx tests. nginx_prepare DIR LISTEN_PORT
# UPSTREAM_PORT... writes DIR/nginx.conf: deploy/nginx.conf with its
# upstream servers and listen address pointed at loopback test ports, inside
# a minimal main context whose pid, logs and temp paths live under DIR, so
# nginx runs as the current user without touching /etc, /var or /run.
nginx_prepare() {
  local dir="$1" listen="$2"
  shift 2
  local src="$MOESERVE_SOURCE_ROOT/deploy/nginx.conf"
  local servers=""
  for p in "$@"; do
    servers+="    server 127.0.0.1:$p max_fails=1 fail_timeout=10s;"$'\n'
  done
  mkdir -p "$dir/tmp"
  # Replace the example upstream servers (every "server 127.0.0.1:PORT" line)
  # with ours, and "listen 80;" with the test port.
  awk -v servers="$servers" -v listen="$listen" '
    /^[[:space:]]*server 127\.0\.0\.1:[0-9]+/ { if (!done) { printf "%s", servers; done = 1 }; n++; next }
    /^[[:space:]]*listen 80;/ { print "    listen 127.0.0.1:" listen ";"; l++; next }
    { print }
    END { if (n < 2 || l != 1) { print "nginx_prepare: deploy/nginx.conf changed shape" > "/dev/stderr"; exit 1 } }
  ' "$src" > "$dir/moeserve.conf" || return 1
  {
    [[ $(id -u) -eq 0 ]] && echo "user root;"
    echo "worker_processes 1;"
    echo "pid $dir/nginx.pid;"
    echo "error_log $dir/error.log info;"
    echo "events { worker_connections 1024; }"
    echo "http {"
    echo "  access_log $dir/access.log;"
    echo "  client_body_temp_path $dir/tmp/body;"
    echo "  proxy_temp_path $dir/tmp/proxy;"
    echo "  fastcgi_temp_path $dir/tmp/fastcgi;"
    echo "  uwsgi_temp_path $dir/tmp/uwsgi;"
    echo "  scgi_temp_path $dir/tmp/scgi;"
    echo "  include $dir/moeserve.conf;"
    echo "}"
  } > "$dir/nginx.conf"
}

# A free TCP port on loopback (the kernel picks; racy but fine for tests).
free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close();});'
}
