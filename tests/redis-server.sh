#!/bin/sh
# A private redis-server for the tests, on 127.0.0.1 and a free port, no persistence.
#   tests/redis-server.sh start DIR   prints the port (the pid is in DIR/redis.pid)
#   tests/redis-server.sh stop DIR
set -e
cmd=$1; dir=$2
[ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
case "$cmd" in
start)
    command -v redis-server >/dev/null || { echo "redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }
    mkdir -p "$dir"
    port=$(${PYTHON:-python3} -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --pidfile "$dir/redis.pid" --dir "$dir" --logfile "$dir/redis.log" >/dev/null
    i=0
    until redis-cli -p "$port" ping >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 100 ] || { echo "redis-server did not answer on port $port" >&2; exit 1; }
        sleep 0.05
    done
    echo "$port" ;;
stop)
    [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
    rm -rf "$dir" ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
