#!/usr/bin/env bash
# Runs make targets in lanes side by side: the targets of one lane run in
# order, the lanes at once. make test uses it to run the phases that do not
# share a broker at the same time (each broker's suite stops and restarts its
# own broker, never another's), which keeps it within about fifteen minutes
# on two cores: most of a broker suite's time is spent waiting on the broker
# and on timers, not on the CPU.
#
#   scripts/lanes.sh "NAME: TARGET..." ["NAME: TARGET..."]...
#
# Every line a lane prints is prefixed with [NAME], as it comes. When every
# lane has ended it says how long each took and which failed, and fails if
# any did; a failed target ends its own lane only (the others run on, so
# that one run shows every failure). ^C or a TERM stops every lane: the
# targets' own traps (the cluster's removal, a test's cleanup) still run.
set -euo pipefail

make_cmd=${MAKE:-make}
if [[ $# -eq 0 ]]; then
  echo "lanes.sh: no lanes given; usage: scripts/lanes.sh \"NAME: TARGET...\"..." >&2
  exit 2
fi

results=$(mktemp -d)
pids=()
names=()
trap 'trap - INT TERM; kill -TERM "${pids[@]}" 2>/dev/null; wait; rm -rf "$results"; exit 130' INT TERM
trap 'rm -rf "$results"' EXIT

for lane in "$@"; do
  name=${lane%%:*}
  targets=${lane#*:}
  if [[ $name == "$lane" || -z ${targets// /} ]]; then
    echo "lanes.sh: lane \"$lane\" is not NAME: TARGET..." >&2
    exit 2
  fi
  names+=("$name")
  (
    start=$(date +%s)
    status=0
    # shellcheck disable=SC2086 # targets are words
    $make_cmd --no-print-directory $targets 2>&1 | sed -u "s/^/[$name] /" || status=$?
    echo "$status $(($(date +%s) - start)) $targets" > "$results/$name"
  ) &
  pids+=($!)
done
wait

failed=0
echo "== lanes"
for name in "${names[@]}"; do
  read -r status seconds targets < "$results/$name" || { status=1 seconds=? targets="(no result)"; }
  if [[ $status == 0 ]]; then verdict=ok; else verdict="FAILED (exit $status)"; failed=1; fi
  printf '   %-6s %-22s %4ss  %s\n' "$name" "$verdict" "$seconds" "$targets"
done
exit $failed
