#!/usr/bin/env bash
# A real three-node RabbitMQ cluster on this machine, for the tests that kill,
# restart and cut off nodes. Each node runs in a network namespace of its own,
# joined to the host by a veth pair on one bridge, so it has its own address,
# the standard ports, its own epmd, and a link that can be cut:
#
#   node  name                 namespace      address (AMQP on :5672)
#   n1    rabbit@amqpretry-n1  amqpretry-n1   10.213.77.11
#   n2    rabbit@amqpretry-n2  amqpretry-n2   10.213.77.12
#   n3    rabbit@amqpretry-n3  amqpretry-n3   10.213.77.13
#   host  bridge amqpretry-br  10.213.77.1/24, so tests on the host reach every node
#
#   scripts/cluster.sh up              make sure all three answer AMQP and report
#                                      three running members (idempotent)
#   scripts/cluster.sh down            remove every process, namespace, link,
#                                      address, mount and file it made, from any state
#   scripts/cluster.sh kill NODE       SIGKILL the node's beam: a crash, not a stop
#   scripts/cluster.sh start NODE      start a killed node; it rejoins the cluster
#   scripts/cluster.sh partition NODE  set the node's link down: a real net split
#   scripts/cluster.sh heal NODE       set it up again and wait until the node answers
#                                      and it and the others count each other as running
#   scripts/cluster.sh status          each node, its address, whether it runs, and the
#                                      running members as it sees them (exit 1 unless
#                                      all three answer and see three members)
#   scripts/cluster.sh urls            the three amqp:// URLs, comma-separated
#   scripts/cluster.sh version         the RabbitMQ it runs (3, 4.0 or 4.3), or would run
#   scripts/cluster.sh ctl NODE ARGS   rabbitmqctl on that node, from inside its namespace
#   scripts/cluster.sh queues NODE ARGS  rabbitmq-queues likewise
#
# CLUSTER_RABBITMQ=3 (the default) runs the system's RabbitMQ (Debian's 3.10);
# CLUSTER_RABBITMQ=4.0 (or 4) and 4.3 run RabbitMQ 4.0 or 4.3 from the root
# scripts/rabbit4.sh installs for that version (`scripts/rabbit4.sh 4.3 root`),
# each node chrooted into it inside its namespace. One cluster at a time: to
# switch, run down first. Every command but up works on whichever runs.
#
# Users: guest/guest may log in from the host (loopback_users = none): the
# nodes are reachable only on the private bridge, and the tests already use guest.
#
# Partitions: this machine has neither nft nor iptables, and a link that is
# down is a split no process can see through (peers and clients alike, like a
# pulled cable: TCP stalls, nothing is reset). net_ticktime is lowered to
# $CLUSTER_NET_TICKTIME (default 5 s, production 60) so that the others see a
# cut node vanish within seconds, not a minute. partition returns at once.
# On 3.10 and 4.0 cluster_partition_handling is pause_minority, as production
# three-node clusters are advised to run: the majority drops the node after
# about 6.5 s, the node pauses after about 5.5 s on 3.10 and 10 s on 4.0, and
# it rejoins by itself after heal. 4.3 has no partition handling (its metadata
# store, Khepri, is a Raft log like a quorum queue's): the majority drops the
# node after 5 to 6.5 s and the node drops the others as soon, but it never
# pauses. Alone it still accepts connections, but without a majority a
# publish to a quorum queue is nacked after about 15 s, consuming one closes
# the connection, and so does a declaration, after 30 s; quorum queues it led
# get a leader among the others 2 to 4 s after they dropped it. After heal it
# rejoins within about 2 s, without a restart, and, having held elections
# alone, may take the metadata store's leadership on its return. heal waits
# until the node answers and it and the others count each other as running.
#
# Needs root (namespaces, links, setpriv). Everything lives in $CLUSTER_DIR
# (default /var/lib/amqpretry/cluster), /etc/netns/amqpretry-n*, the
# namespaces and links named above, and processes marked with
# AMQPRETRY_CLUSTER_NODE in their environment; down removes exactly those.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
D="${CLUSTER_DIR:-/var/lib/amqpretry/cluster}"
# The version asked for; the commands after up take the running cluster's.
# 4 is 4.0, as it was before there was a 4.3.
normalize() { case "$1" in 4) echo 4.0 ;; *) echo "$1" ;; esac; }
asked=$(normalize "${CLUSTER_RABBITMQ:-}")
version=$(normalize "${asked:-$(cat "$D/version" 2>/dev/null || echo 3)}")
case "$version" in
3 | 4.0 | 4.3) ;;
*) echo "cluster.sh: CLUSTER_RABBITMQ=$version: it is 3 (the system's RabbitMQ), 4.0 (or 4) or 4.3 (the roots of scripts/rabbit4.sh)" >&2; exit 2 ;;
esac
# R is the root a RabbitMQ 4 node is chrooted into: the one rabbit4.sh runs
# its node of that version from ($RABBIT4_ROOT or $RABBIT43_ROOT move it).
R=
[[ $version == 3 ]] || R=$("$root/scripts/rabbit4.sh" "$version" root)
wait_for="${CLUSTER_WAIT:-180}"
ticktime="${CLUSTER_NET_TICKTIME:-5}"
check="$root/.bin/brokercheck"

# 10.213.77.0/24: private, and on no route of this machine (eth0 is
# 192.0.2.0/24); up refuses to run if that ever changes.
net=10.213.77
bridge=amqpretry-br
nodes=(n1 n2 n3)

say() { echo "cluster.sh: $*" >&2; }

need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    say "$1 needs root (network namespaces, links and mounts)"
    exit 1
  fi
}

node_index() {
  local i
  for i in "${!nodes[@]}"; do [[ ${nodes[$i]} == "$1" ]] && { echo "$i"; return 0; }; done
  say "no node $1: the nodes are ${nodes[*]}"
  exit 2
}
# One name serves as namespace, host name and host-side veth: `ip link` and
# `ip netns list` then show plainly which node a thing belongs to.
name_of() { echo "amqpretry-$1"; }
ip_of() { echo "$net.$((11 + $(node_index "$1")))"; }
nodename_of() { echo "rabbit@$(name_of "$1")"; }
url_of() { echo "amqp://guest:guest@$(ip_of "$1"):5672/"; }

# rabbitmq_ids is the uid:gid the nodes run as: the system's rabbitmq user,
# or the 4.x root's (another number, which may be another user's on the host).
rabbitmq_ids() {
  local passwd=/etc/passwd
  [[ -n $R ]] && passwd=$R/etc/passwd
  awk -F: '$1 == "rabbitmq" { print $3 ":" $4 }' "$passwd"
}

# as_node runs a command in a node's namespace as the rabbitmq user, with an
# environment of its own: the node's HOME (its cookie), its env file (so
# nothing of /etc/rabbitmq/rabbitmq-env.conf, which pins the system broker to
# 127.0.0.1, applies), and AMQPRETRY_CLUSTER_NODE, by which down finds every
# process of the cluster even when its namespace is gone. For 4.x it enters
# the root in a mount namespace of its own, so the /proc, /dev, data and
# hosts mounts it needs vanish with the node and never touch the rabbit4.sh
# node's mounts of the same root.
as_node() {
  local n=$1 ids
  shift
  ids=$(rabbitmq_ids)
  local env=(HOME="$D/$n" PATH=/usr/bin:/bin:/usr/sbin:/sbin LANG=C.UTF-8
    RABBITMQ_CONF_ENV_FILE="$D/$n/rabbitmq-env.conf" AMQPRETRY_CLUSTER_NODE="$n")
  if [[ -n $R ]]; then
    ip netns exec "$(name_of "$n")" unshare -m --propagation private /bin/sh -c '
      R=$1 D=$2 ids=$3; shift 3
      mount -t proc proc "$R/proc" && mount --bind /dev "$R/dev" &&
        mount --bind "$D" "$R$D" && mount --bind /etc/hosts "$R/etc/hosts" &&
        exec chroot --userspec="$ids" "$R" /usr/bin/env -i "$@"' sh "$R" "$D" "$ids" "${env[@]}" "$@"
  else
    ip netns exec "$(name_of "$n")" setpriv --reuid="${ids%:*}" --regid="${ids#*:}" --init-groups \
      /usr/bin/env -i "${env[@]}" "$@"
  fi
}

ctl() {
  local n=$1
  shift
  as_node "$n" /usr/lib/rabbitmq/bin/rabbitmqctl -n "$(nodename_of "$n")" "$@"
}

queues() {
  local n=$1
  shift
  as_node "$n" /usr/lib/rabbitmq/bin/rabbitmq-queues -n "$(nodename_of "$n")" "$@"
}

# marked_pids lists the processes of one node (or of all with no argument)
# by the mark as_node puts in their environment: one grep over every
# process's environment, as the processes come and go while it reads.
marked_pids() {
  local f pid
  for f in $(grep -lz "^AMQPRETRY_CLUSTER_NODE=${1:-}" /proc/[0-9]*/environ 2>/dev/null || true); do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] || echo "$pid"
  done
}

beam_pid() {
  local pid
  for pid in $(marked_pids "$1"); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == beam.smp ]] && { echo "$pid"; return 0; }
  done
  return 1
}

answers() { AMQP_URL="$(url_of "$1")" "$check" -quiet -timeout "${2:-2s}"; }

# running_nodes prints the running members as a node sees them, short names,
# or why it cannot say: a node paused in a minority has its app stopped, and
# then cluster_status refuses to answer.
running_nodes() {
  local json
  if ! json=$(ctl "$1" -q -t 10 cluster_status --formatter json 2>/dev/null); then
    if ctl "$1" -q -t 5 ping >/dev/null 2>&1; then echo "(rabbit app not running: paused or booting)"; else echo "(node does not answer)"; fi
    return 0
  fi
  sed -n 's/.*"running_nodes":\[\([^]]*\)\].*/\1/p' <<<"$json" | tr -d '"' | tr ',' '\n' |
    sed 's/^rabbit@amqpretry-//' | sort | tr '\n' ' ' | sed 's/ $//'
}

build_check() { (cd "$root" && go build -o "$check" ./internal/cmd/brokercheck); }

install() {
  if [[ -n $R ]]; then
    if [[ ! -x $R/usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
      say "the RabbitMQ $version root is missing; scripts/rabbit4.sh $version up installs it"
      "$root/scripts/rabbit4.sh" "$version" up
    fi
    return 0
  fi
  [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] && return 0
  if ! command -v apt-get >/dev/null; then
    say "rabbitmq-server is not installed and there is no apt-get: install RabbitMQ 3.x"
    exit 1
  fi
  say "rabbitmq-server is not installed; installing Debian's package"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq rabbitmq-server; } >&2
}

# net_up makes whatever part of the network is missing: the bridge with the
# host's address, and for each node its namespace, veth pair, address and
# hosts file. It also sets every link up, so up heals a partition.
net_up() {
  local route
  route=$(ip route show | grep -v "dev $bridge" | grep -F "$net." || true)
  if [[ -n $route ]]; then
    say "$net.0/24 is already routed on this machine ($route); the cluster would collide with it"
    exit 1
  fi
  ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
  ip addr replace "$net.1/24" dev "$bridge"
  ip link set "$bridge" up

  local hosts n name
  # The host's own entries keep `hostname` resolving without the name server
  # (which does not answer here; see sync_hosts in rabbit4.sh).
  hosts=$(grep -v amqpretry- /etc/hosts; for n in "${nodes[@]}"; do printf '%s\t%s\n' "$(ip_of "$n")" "$(name_of "$n")"; done)
  for n in "${nodes[@]}"; do
    name=$(name_of "$n")
    [[ -e /run/netns/$name ]] || ip netns add "$name"
    # A host side whose peer is not in the namespace (left by a namespace
    # deleted under a running process) is useless: start that pair over.
    if ip link show "$name" >/dev/null 2>&1 && ! ip -n "$name" link show eth0 >/dev/null 2>&1; then
      ip link del "$name"
    fi
    ip link del "$name-p" >/dev/null 2>&1 || true # a pair whose move failed
    if ! ip link show "$name" >/dev/null 2>&1; then
      ip link add "$name" type veth peer name "$name-p"
      ip link set "$name-p" netns "$name"
      ip -n "$name" link set "$name-p" name eth0
    fi
    ip link set "$name" master "$bridge"
    ip link set "$name" up
    ip -n "$name" addr replace "$(ip_of "$n")/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" link set lo up
    # ip netns exec bind-mounts this file over /etc/hosts.
    mkdir -p "/etc/netns/$name"
    printf '%s\n' "$hosts" >"/etc/netns/$name/hosts"
  done
}

# configure writes each node's directory once: the same cookie for all, its
# own data and logs.
configure() {
  local ids n cookie
  ids=$(rabbitmq_ids)
  mkdir -p "$D"
  echo "$version" >"$D/version"
  [[ -s $D/cookie ]] || (umask 077 && od -An -tx1 -N20 /dev/urandom | tr -d ' \n' >"$D/cookie")
  cookie=$(cat "$D/cookie")
  for n in "${nodes[@]}"; do
    mkdir -p "$D/$n/mnesia" "$D/$n/log"
    cat >"$D/$n/rabbitmq-env.conf" <<EOF
# Written by amqpretry's scripts/cluster.sh: node $n of the test cluster.
NODENAME=$(nodename_of "$n")
CONFIG_FILE=$D/$n/rabbitmq.conf
ADVANCED_CONFIG_FILE=$D/$n/advanced.config
MNESIA_BASE=$D/$n/mnesia
LOG_BASE=$D/$n/log
ENABLED_PLUGINS_FILE=$D/$n/enabled_plugins
PID_FILE=$D/$n/rabbit.pid
EOF
    cat >"$D/$n/rabbitmq.conf" <<EOF
# Written by amqpretry's scripts/cluster.sh.
listeners.tcp.default = 5672
# The nodes are reachable only on the bridge; guest logs in from the host.
loopback_users = none
log.file.level = info
log.console = false
EOF
    # 4.3 has no partition handling to choose (it accepts the key and ignores it).
    if [[ $version != 4.3 ]]; then
      echo "cluster_partition_handling = pause_minority" >>"$D/$n/rabbitmq.conf"
    else
      # Upstream 4.3 refuses transient non-exclusive queues; Debian's 4.3.6
      # patches that back to permitted. Refused here, so that nothing the
      # cluster tests do can come to rely on them.
      echo "deprecated_features.permit.transient_nonexcl_queues = false" >>"$D/$n/rabbitmq.conf"
    fi
    echo "[{kernel, [{net_ticktime, $ticktime}]}]." >"$D/$n/advanced.config"
    # No plugins: management alone would double each node's memory and boot time.
    echo "[]." >"$D/$n/enabled_plugins"
    [[ -f $D/$n/.erlang.cookie ]] || (umask 077 && echo -n "$cookie" >"$D/$n/.erlang.cookie")
    chown -R "$ids" "$D/$n"
  done
  if [[ -n $R ]]; then mkdir -p "$R$D"; fi
}

start_node() {
  local n=$1
  beam_pid "$n" >/dev/null && return 0
  say "starting $(nodename_of "$n") at $(ip_of "$n")"
  # setsid and every descriptor redirected (9 is the lock): the node outlives
  # this script and holds nothing of its caller's, so a test waiting on our
  # output is not kept waiting by the node.
  as_node "$n" /bin/sh -c 'exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >>"$HOME/log/startup_log" 2>&1 </dev/null 9>&- &' 9>&-
}

# wait_answers waits until every named node accepts AMQP.
wait_answers() {
  local deadline=$((SECONDS + wait_for)) n pending
  while :; do
    pending=()
    for n in "$@"; do answers "$n" || pending+=("$n"); done
    ((${#pending[@]} == 0)) && return 0
    if ((SECONDS >= deadline)); then
      say "${pending[*]} did not accept AMQP within ${wait_for}s"
      for n in "${pending[@]}"; do
        say "last lines of $D/$n/log/startup_log:"
        tail -n 15 "$D/$n/log/startup_log" >&2 2>/dev/null || true
      done
      return 1
    fi
    sleep 1
  done
}

# join puts a fresh node into n1's cluster, unless it already is in one with
# n1 (a restarted node rejoins by itself).
join() {
  local n=$1 seed status
  seed=$(nodename_of "${nodes[0]}")
  status=$(ctl "$n" -q cluster_status --formatter json 2>/dev/null || true)
  grep -q "\"$seed\"" <<<"$status" && return 0
  say "joining $(nodename_of "$n") to $seed"
  quietly ctl "$n" -q stop_app
  quietly ctl "$n" -q reset
  quietly ctl "$n" -q join_cluster "$seed"
  quietly ctl "$n" -q start_app
}

# quietly shows a command's output only when it fails: join_cluster and
# start_app print pages of feature-flag warnings that mean nothing here.
quietly() {
  local out
  out=$("$@" 2>&1) && return 0
  local rc=$?
  printf '%s\n' "$out" >&2
  return $rc
}

# revive starts the app of a node that runs with it stopped, which is where
# an up interrupted inside join leaves it: waiting for it to answer would wait
# forever. start_app alone is enough: a node that was not yet joined comes up
# on its own, and join then finds it outside n1's cluster. A booting node is
# left to boot.
revive() {
  local n=$1 state
  beam_pid "$n" >/dev/null || return 0
  answers "$n" && return 0
  state=$(ctl "$n" -q -t 10 eval 'rabbit:is_booting() orelse rabbit:is_running().' 2>/dev/null || true)
  [[ $state == false ]] || return 0
  say "$n runs with its app stopped (an interrupted join?); starting it"
  quietly ctl "$n" -q start_app
}

# healthy: every node answers AMQP and n1 counts three running members.
healthy() {
  local n
  for n in "${nodes[@]}"; do answers "$n" || return 1; done
  [[ $(running_nodes "${nodes[0]}") == "n1 n2 n3" ]]
}

wait_members() {
  local deadline=$((SECONDS + wait_for))
  until [[ $(running_nodes "${nodes[0]}") == "n1 n2 n3" ]]; do
    if ((SECONDS >= deadline)); then
      say "the cluster did not report three running members within ${wait_for}s: $(running_nodes "${nodes[0]}")"
      return 1
    fi
    sleep 1
  done
}

check_version() {
  local running
  running=$(normalize "$(cat "$D/version" 2>/dev/null || true)")
  if [[ -n $running && $running != "$version" ]]; then
    say "the cluster in $D runs RabbitMQ $running, not $version: run scripts/cluster.sh down first"
    exit 1
  fi
}

lock() {
  mkdir -p "$(dirname "$D")"
  exec 9>"$D.lock"
  flock 9
}

up() {
  need_root "up"
  build_check
  check_version
  if [[ -d $D ]] && healthy; then return 0; fi
  lock
  local started=$SECONDS n
  install
  net_up
  configure
  for n in "${nodes[@]}"; do start_node "$n"; done
  for n in "${nodes[@]}"; do revive "$n"; done
  wait_answers "${nodes[@]}"
  for n in "${nodes[@]:1}"; do join "$n"; done
  wait_answers "${nodes[@]}"
  wait_members
  say "the RabbitMQ $version cluster is up ($((SECONDS - started))s): $(urls)"
}

down() {
  need_root "down"
  lock
  local n name pid pids=() left deadline
  # Kill first: a namespace outlives its deletion while a process runs in
  # it, and with it the veth pair. SIGKILL because the data goes too.
  for n in "${nodes[@]}"; do
    name=$(name_of "$n")
    [[ -e /run/netns/$name ]] && pids+=($(ip netns pids "$name" 2>/dev/null))
  done
  pids+=($(marked_pids))
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # Until they are reaped, not only dead: a zombie's environment is empty,
  # so only its pid tells it was ours, and it still shows in ps.
  deadline=$((SECONDS + 30))
  while :; do
    left=()
    for pid in "${pids[@]}"; do [[ -e /proc/$pid ]] && left+=("$pid"); done
    ((${#left[@]} == 0)) && break
    if ((SECONDS >= deadline)); then say "processes that would not go: ${left[*]}"; break; fi
    sleep 0.2
  done
  for n in "${nodes[@]}"; do
    name=$(name_of "$n")
    [[ -e /run/netns/$name ]] && ip netns del "$name"
    ip link del "$name" >/dev/null 2>&1 || true
    ip link del "$name-p" >/dev/null 2>&1 || true
    rm -rf "/etc/netns/$name"
  done
  # Only when empty: up made it, but others may keep files there.
  rmdir /etc/netns 2>/dev/null || true
  ip link del "$bridge" >/dev/null 2>&1 || true
  # Nothing is mounted on the host by design; this is for a 4.x mount that
  # escaped its namespace all the same. Both roots: a cluster whose version
  # file is gone may have run on either.
  local m r
  for r in "$("$root/scripts/rabbit4.sh" 4.0 root)" "$("$root/scripts/rabbit4.sh" 4.3 root)"; do
    for m in $(awk -v d="$D" -v r="$r$D" '$2 == r || index($2, d "/") == 1 || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r); do
      umount -l "$m" || true
    done
    # The 4.x nodes' mount point in the root, and its parent if up made it.
    if [[ -d $r$D ]]; then rmdir "$r$D" "$(dirname "$r$D")" 2>/dev/null || true; fi
  done
  rm -rf --one-file-system "$D"
  rm -f "$D.lock"
}

kill_node() {
  need_root "kill"
  local n=$1 pid
  node_index "$n" >/dev/null
  if ! pid=$(beam_pid "$n"); then
    say "$n does not run"
    return 0
  fi
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  say "killed $(nodename_of "$n") (beam $pid)"
}

start() {
  need_root "start"
  local n=$1 started=$SECONDS
  node_index "$n" >/dev/null
  if [[ ! -e /run/netns/$(name_of "$n") || ! -d $D/$n ]]; then
    say "there is no cluster to start $n in: run scripts/cluster.sh up"
    exit 1
  fi
  build_check
  lock
  start_node "$n"
  wait_answers "$n"
  say "$n answers again ($((SECONDS - started))s); it sees: $(running_nodes "$n")"
}

partition() {
  need_root "partition"
  local n=$1
  node_index "$n" >/dev/null
  ip link set "$(name_of "$n")" down
  say "cut $n off ($(ip_of "$n")): its link is down"
}

heal() {
  need_root "heal"
  local n=$1 started=$SECONDS
  node_index "$n" >/dev/null
  build_check
  ip link set "$(name_of "$n")" up
  # A node that was killed while cut off is start's to bring back.
  if beam_pid "$n" >/dev/null; then
    wait_answers "$n"
    wait_rejoined "$n"
  fi
  say "healed $n ($((SECONDS - started))s); it sees: $(running_nodes "$n")"
}

# wait_rejoined waits until a healed node and one node of the other side
# both count every node whose beam runs as a running member. A paused 3.10
# node comes back by itself once it sees the others, and answers only then;
# a 4.3 node never stops answering, so only the members tell that the
# cluster is one again.
wait_rejoined() {
  local n=$1 m want other= deadline=$((SECONDS + wait_for))
  want=$(for m in "${nodes[@]}"; do beam_pid "$m" >/dev/null && echo "$m"; done | tr '\n' ' ' | sed 's/ $//')
  for m in "${nodes[@]}"; do
    if [[ $m != "$n" ]] && beam_pid "$m" >/dev/null; then other=$m; break; fi
  done
  until [[ $(running_nodes "$n") == "$want" && (-z $other || $(running_nodes "$other") == "$want") ]]; do
    if ((SECONDS >= deadline)); then
      say "$n did not rejoin within ${wait_for}s: it sees $(running_nodes "$n")${other:+, $other sees $(running_nodes "$other")}"
      return 1
    fi
    sleep 0.5
  done
}

status() {
  need_root "status"
  build_check
  local n name pid link amqp seen ok=0
  printf '%-4s %-22s %-13s %-10s %-5s %-4s %s\n' node name address beam link amqp "running members as it sees them"
  for n in "${nodes[@]}"; do
    name=$(name_of "$n")
    pid=$(beam_pid "$n" || echo -)
    link=$(ip -br link show "$name" 2>/dev/null | awk '{ print tolower($2) }' || true)
    amqp=no
    answers "$n" 1s && amqp=yes
    seen=-
    [[ $pid != - ]] && seen=$(running_nodes "$n")
    printf '%-4s %-22s %-13s %-10s %-5s %-4s %s\n' "$n" "$(nodename_of "$n")" "$(ip_of "$n")" "$pid" "${link:-none}" "$amqp" "${seen:-(no answer)}"
    [[ $amqp == yes && $seen == "n1 n2 n3" ]] || ok=1
  done
  return $ok
}

urls() {
  local n out=()
  for n in "${nodes[@]}"; do out+=("$(url_of "$n")"); done
  (IFS=,; echo "${out[*]}")
}

usage() { say "usage: $0 up|down|kill NODE|start NODE|partition NODE|heal NODE|status|urls|version|ctl NODE ARGS|queues NODE ARGS"; exit 2; }

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case "$cmd" in
up) up ;;
down) down ;;
kill) [[ $# -eq 1 ]] || usage; kill_node "$1" ;;
start) [[ $# -eq 1 ]] || usage; start "$1" ;;
partition) [[ $# -eq 1 ]] || usage; partition "$1" ;;
heal) [[ $# -eq 1 ]] || usage; heal "$1" ;;
status) status ;;
urls) urls ;;
version) echo "$version" ;;
ctl) [[ $# -ge 1 ]] || usage; need_root ctl; node_index "$1" >/dev/null; ctl "$@" ;;
queues) [[ $# -ge 1 ]] || usage; need_root queues; node_index "$1" >/dev/null; queues "$@" ;;
*) usage ;;
esac
