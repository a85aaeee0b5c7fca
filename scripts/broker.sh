#!/usr/bin/env bash
# Make sure a RabbitMQ broker accepts AMQP connections at $AMQP_URL
# (default amqp://guest:guest@127.0.0.1:5672/). Quiet and quick when it does.
#
#   1. it answers                      -> done
#   2. the node runs, the app stopped  -> rabbitmqctl start_app
#   3. rabbitmq-server is installed    -> rabbitmq-server -detached
#   4. root with apt                   -> apt-get install rabbitmq-server, then 3
#   5. otherwise                       -> say how to get one, exit 1
# In 2-4 it waits up to $BROKER_WAIT seconds (default 90) for AMQP to connect.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wait_for="${BROKER_WAIT:-90}"
check="$root/.bin/brokercheck"
export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"

say() { echo "broker.sh: $*" >&2; }

# The checker dials and logs in, which proves more than an open port.
(cd "$root" && go build -o "$check" ./internal/cmd/brokercheck)

"$check" -quiet && exit 0

if ! "$check" -loopback; then
  "$check" || true # prints the URL, password hidden, and why the dial failed
  say "that broker is not on this machine, so I cannot start it: start it there or fix \$AMQP_URL"
  exit 1
fi

wait_for_amqp() {
  local deadline=$((SECONDS + wait_for))
  while ((SECONDS < deadline)); do
    "$check" -quiet -timeout 2s && { say "broker is up ($((SECONDS - started))s)"; return 0; }
    sleep 1
  done
  say "the broker did not accept AMQP connections within ${wait_for}s"
  "$check" || true
  for log in /var/log/rabbitmq/startup_err /var/log/rabbitmq/startup_log; do
    [[ -s $log ]] && { say "last lines of $log:"; tail -n 20 "$log" >&2; }
  done
  return 1
}

started=$SECONDS

if command -v rabbitmqctl >/dev/null && rabbitmqctl -q ping >/dev/null 2>&1; then
  # The Erlang node runs but the app does not (rabbitmqctl stop_app, a
  # crashed boot): starting another server would fail on the node name.
  say "the RabbitMQ node runs but does not accept connections; starting its app"
  rabbitmqctl -q start_app >&2 || true
  wait_for_amqp
  exit
fi

if ! command -v rabbitmq-server >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "rabbitmq-server is not installed; installing Debian's package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq rabbitmq-server >&2
  else
    say "no broker answers at 127.0.0.1 and rabbitmq-server is not installed."
    say "install it (Debian/Ubuntu: sudo apt-get install rabbitmq-server), or run one in a"
    say "container (docker run -d -p 5672:5672 rabbitmq:3), or point \$AMQP_URL at a broker."
    exit 1
  fi
fi

say "starting rabbitmq-server"
rabbitmq-server -detached >&2 || say "rabbitmq-server -detached exited with $? (it may already be starting)"
wait_for_amqp
