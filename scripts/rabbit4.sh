#!/usr/bin/env bash
# RabbitMQ 4 brokers beside the system's 3.10, for testing on the versions
# users run. Debian bookworm ships only 3.10.8, so this installs a newer
# Debian's rabbitmq-server into a root of its own with debootstrap and runs it
# there under its own node name, ports and epmd:
#
#   4.0  Debian trixie's 4.0.5 (Erlang 27)
#        node rabbit4@localhost    AMQP 127.0.0.1:5673   distribution 25673   epmd 24369
#   4.3  Debian forky's 4.3.6 (Erlang 29; debootstrap's sid script bootstraps forky)
#        node rabbit43@localhost   AMQP 127.0.0.1:5674   distribution 25674   epmd 24370
#
#   scripts/rabbit4.sh [VERSION] [up]      make sure it answers: install, mount, start (idempotent)
#   scripts/rabbit4.sh [VERSION] down      stop it and unmount what up mounted
#   scripts/rabbit4.sh [VERSION] ctl ARGS  rabbitmqctl on that node (what tests call through
#                                          $AMQPRETRY_RABBITMQCTL)
#   scripts/rabbit4.sh [VERSION] status    say whether it answers; exit 1 if not
#   scripts/rabbit4.sh [VERSION] url       print its AMQP URL
#   scripts/rabbit4.sh [VERSION] root      print the directory of its root
#
# VERSION is 4.0 (the default) or 4.3. The root lives in $RABBIT4_ROOT or $RABBIT43_ROOT (default
# /var/lib/amqpretry/rabbitmq4-trixie for 4.0, /var/lib/amqpretry/rabbitmq43-forky
# for 4.3), outside the checkout, so every clone on the machine shares one
# install (about a minute and 370 MB the first time). Installing needs root and
# Debian's mirror.
# Debian's /usr/sbin wrappers switch to the rabbitmq user through su and drop the
# environment, so this runs the real scripts in /usr/lib/rabbitmq/bin as that
# user, and the settings live in the root's rabbitmq-env.conf, which both the
# server and rabbitmqctl read.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=4.0
if [[ ${1:-} =~ ^4\.[0-9]+$ ]]; then version=$1; shift; fi
case "$version" in
4.0) suite=trixie script=trixie node=rabbit4 port=5673 dist=25673 epmd=24369 R="${RABBIT4_ROOT:-/var/lib/amqpretry/rabbitmq4-trixie}" ;;
4.3) suite=forky script=sid node=rabbit43 port=5674 dist=25674 epmd=24370 R="${RABBIT43_ROOT:-/var/lib/amqpretry/rabbitmq43-forky}" ;;
*) echo "rabbit4.sh: RabbitMQ $version is not one this script installs: 4.0 or 4.3" >&2; exit 2 ;;
esac
url="amqp://guest:guest@127.0.0.1:$port/"
wait_for="${BROKER_WAIT:-90}"
check="$root/.bin/brokercheck"

say() { echo "rabbit4.sh ($version): $*" >&2; }

# need_root: the root is entered with chroot and mounts, which only root can do.
need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    say "$1 needs root (chroot and mount into $R); run it as root, or point \$AMQP_URL and"
    say "\$AMQPRETRY_RABBITMQCTL at a RabbitMQ $version of your own and run make suite"
    exit 1
  fi
}

# as_rabbitmq runs a command inside the root as its rabbitmq user.
as_rabbitmq() {
  local ids
  ids=$(awk -F: '$1 == "rabbitmq" { print $3 ":" $4 }' "$R/etc/passwd" 2>/dev/null || true)
  if [[ -z $ids ]]; then
    say "$R has no rabbitmq user: it is not a RabbitMQ root (remove it, and scripts/rabbit4.sh $version up installs it again)"
    exit 1
  fi
  chroot --userspec="$ids" "$R" /usr/bin/env -i HOME=/var/lib/rabbitmq PATH=/usr/bin:/bin LANG=C.UTF-8 "$@"
}

ctl() {
  need_root "rabbitmqctl on RabbitMQ 4"
  as_rabbitmq /usr/lib/rabbitmq/bin/rabbitmqctl "$@"
}

answers() { AMQP_URL="$url" "$check" -quiet -timeout "${1:-2s}"; }

install_root() {
  [[ -x $R/usr/lib/rabbitmq/bin/rabbitmq-server ]] && return 0
  need_root "installing RabbitMQ $version"
  mkdir -p "$(dirname "$R")"
  # One install at a time, whichever clone asks.
  exec 9>"$R.lock"
  flock 9
  [[ -x $R/usr/lib/rabbitmq/bin/rabbitmq-server ]] && return 0
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    { apt-get update -qq && apt-get install -y -qq debootstrap; } >&2
  fi
  say "installing Debian $suite's rabbitmq-server into $R (about a minute)"
  # A killed debootstrap may leave /proc or /sys mounted in its target.
  unmount_under "$R.partial"
  rm -rf --one-file-system "$R.partial"
  # A debootstrap older than the suite has no script named after it; sid's
  # (unstable's) bootstraps testing too.
  if ! debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$R.partial" http://deb.debian.org/debian \
    "/usr/share/debootstrap/scripts/$script" >"$R.log" 2>&1; then
    tail -n 20 "$R.log" >&2
    say "debootstrap failed; the whole log is $R.log"
    exit 1
  fi
  # A root that is there is a root that is whole: replace a broken one.
  if [[ -e $R ]]; then
    unmount_under "$R"
    rm -rf --one-file-system "$R"
  fi
  mv "$R.partial" "$R"
}

# sync_hosts gives the root this machine's /etc/hosts, with its host name. The
# root's own knows only localhost: the node's lookups of the host name then go
# to the name server, which does not answer here, and about one AMQP handshake
# in sixty waited for the resolver's 5 s timeout (0 in 300 with the name in
# /etc/hosts; 3.10, outside the root, never did).
sync_hosts() {
  local name
  name=$(hostname)
  { cat /etc/hosts; grep -qw -- "$name" /etc/hosts || printf '127.0.0.1\t%s\n' "$name"; } >"$R/etc/hosts.new"
  cmp -s "$R/etc/hosts.new" "$R/etc/hosts" && rm "$R/etc/hosts.new" || mv "$R/etc/hosts.new" "$R/etc/hosts"
}

configure() {
  sync_hosts
  cat >"$R/etc/rabbitmq/rabbitmq-env.conf" <<EOF
# Written by amqpretry's scripts/rabbit4.sh: a node beside the system's broker.
NODENAME=$node@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$port
DIST_PORT=$dist
ERL_EPMD_PORT=$epmd
EOF
  cat >"$R/etc/rabbitmq/rabbitmq.conf" <<EOF
# Written by amqpretry's scripts/rabbit4.sh.
listeners.tcp.default = 127.0.0.1:$port
log.file.level = warning
EOF
  if [[ $version == 4.3 ]]; then
    # 4.3.6 still permits transient non-exclusive queues (deprecated; the
    # 4.3.0 notes announce them refused by default): refuse them here, so
    # that a test, example or bench that declares one fails as it will on
    # the brokers users get (with 541, closing the connection).
    echo "deprecated_features.permit.transient_nonexcl_queues = false" >>"$R/etc/rabbitmq/rabbitmq.conf"
  fi
  # A channel checks its deliveries against consumer_timeout on its tick,
  # once a minute by default; this test node checks every 5 s, so that a
  # test of a short x-consumer-timeout waits seconds, not a minute.
  cat >"$R/etc/rabbitmq/advanced.config" <<EOF
%% Written by amqpretry's scripts/rabbit4.sh.
[{rabbit, [{channel_tick_interval, 5000}]}].
EOF
}

mount_all() {
  mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
  mountpoint -q "$R/dev" || mount --bind /dev "$R/dev"
}

# unmount_under unmounts everything mounted below a directory, deepest first.
unmount_under() {
  local m
  for m in $(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "$m" || true
  done
}

unmount_all() {
  for m in dev proc; do
    mountpoint -q "$R/$m" && umount -l "$R/$m"
  done
  return 0
}

wait_until() {
  local want=$1 deadline=$((SECONDS + wait_for))
  while ((SECONDS < deadline)); do
    if [[ $want == up ]]; then answers && return 0; else ! ctl -q ping >/dev/null 2>&1 && return 0; fi
    sleep 1
  done
  return 1
}

up() {
  (cd "$root" && go build -o "$check" ./internal/cmd/brokercheck)
  if answers; then
    # A machine handed on may have a new name (only for our own root).
    if [[ $(id -u) -eq 0 && -d $R/etc ]]; then sync_hosts; fi
    return 0
  fi
  need_root "starting RabbitMQ $version"
  install_root
  configure
  mount_all
  local started=$SECONDS
  if ctl -q ping >/dev/null 2>&1; then
    say "the node runs but does not accept connections; starting its app"
    ctl -q start_app >&2 || true
  else
    say "starting RabbitMQ $version ($node@localhost, port $port)"
    # setsid: the node outlives this script and the make that ran it, like
    # rabbitmq-server -detached does for the system broker.
    as_rabbitmq /bin/sh -c 'mkdir -p /var/log/rabbitmq && exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >/var/log/rabbitmq/startup_log 2>&1 </dev/null &'
  fi
  if wait_until up; then
    say "RabbitMQ $version is up ($((SECONDS - started))s)"
    return 0
  fi
  say "RabbitMQ $version did not accept AMQP connections within ${wait_for}s; last lines of its log:"
  tail -n 30 "$R/var/log/rabbitmq/startup_log" >&2 || true
  exit 1
}

down() {
  [[ -d $R ]] || return 0
  need_root "stopping RabbitMQ $version"
  if ctl -q ping >/dev/null 2>&1; then
    ctl -q shutdown >&2 || true
    wait_until down || say "the node did not stop within ${wait_for}s"
  fi
  # The node started an epmd of its own (port $epmd) that outlives it: the
  # one whose root is ours.
  local pid
  for pid in $(pgrep -x epmd || true); do
    [[ $(readlink "/proc/$pid/root") == "$R" ]] && kill "$pid"
  done
  unmount_all
}

case "${1:-up}" in
up) up ;;
down) down ;;
ctl) shift; ctl "$@" ;;
status)
  (cd "$root" && go build -o "$check" ./internal/cmd/brokercheck)
  if answers; then echo "RabbitMQ $version answers at $url"; else echo "RabbitMQ $version does not answer at $url"; exit 1; fi ;;
url) echo "$url" ;;
root) echo "$R" ;;
*) say "usage: $0 [4.0|4.3] [up|down|ctl ARGS...|status|url|root]"; exit 2 ;;
esac
