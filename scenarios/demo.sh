#!/usr/bin/env bash
# `make demo` (until scenario replay lands): a real nginx from Debian on
# loopback, a wrk load against it, and `qosd trace` following it live.
set -euo pipefail
cd "$(dirname "$0")/.."
QOSD=${QOSD:-target/release/qosd}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { kill "${wrk_pid:-}" "${ngx_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
cat >"$dir/nginx.conf" <<CONF
daemon off; master_process off; worker_processes 1;
error_log $dir/error.log; pid $dir/nginx.pid;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir; uwsgi_temp_path $dir; scgi_temp_path $dir;
  server { listen 127.0.0.1:$port; location / { return 200 "hello from nginx\n"; } } }
CONF
nginx -c "$dir/nginx.conf" -p "$dir" & ngx_pid=$!
for _ in $(seq 50); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
echo "== nginx (pid $ngx_pid) on 127.0.0.1:$port; wrk: 4 keep-alive connections for 8 s"
wrk -t 1 -c 4 -d 8s "http://127.0.0.1:$port/" >"$dir/wrk.txt" & wrk_pid=$!
echo "== qosd trace --pid $ngx_pid --duration 8   (server-side latency from eBPF, no change to nginx)"
"$QOSD" trace --pid "$ngx_pid" --duration 8
wait "$wrk_pid" || true
echo "== what wrk (the client) saw:"
sed -n '/Latency/,/Req\/Sec/p;/requests in/p' "$dir/wrk.txt"
echo
echo "Try it on any server: sudo $QOSD trace --pid \$(pidof -s memcached) --json"
