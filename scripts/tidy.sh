#!/usr/bin/env bash
# scripts/tidy.sh (make tidy): go mod tidy in every module of the workspace.
#
# go mod tidy ignores go.work: in outbox/ or cmd/amqpretry/ it would look for
# the library at the version they require on the Go module proxy, where it is
# not before its release (and is an older tree after it). So the modules of
# this work tree are served, at the version required, from a scratch module
# proxy (scripts/release-check.sh --proxy-only), and every other module as
# usual. The checksums of our own modules in the go.sum files stay as they
# were: they are those of a published release, which scripts/release.sh
# writes, not those of the work tree.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/modules.bash"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
core=$(module_path .)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/amqpretry-tidy.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
proxy=$scratch/proxy
scripts/release-check.sh --proxy-only "$proxy" > /dev/null
# A module cache of its own: the work tree's modules at the version required
# must not land in the user's module cache, which would keep them (a module
# cache is never refreshed) in place of the published ones. Every other
# module comes from the user's cache, read as a file proxy, or from GOPROXY.
usercache="$(go env GOMODCACHE)/cache/download"

ours() { awk -v p="$core" '$1 == p || index($1, p "/") == 1' "$1"; }
for m in $(workspace_modules go.work); do
  sum="$root/$m/go.sum"
  kept=$(if [ -f "$sum" ]; then ours "$sum"; fi)
  (cd "$m" && env GOWORK=off GOFLAGS="-mod=mod -modcacherw" GOMODCACHE="$scratch/modcache" \
    GOPROXY="file://$proxy,file://$usercache,$(go env GOPROXY)" GONOSUMDB="$core" GOPRIVATE= GONOPROXY= \
    go mod tidy) || { echo "tidy.sh: go mod tidy failed in $m" >&2; exit 1; }
  [ -f "$sum" ] || continue
  LC_ALL=C awk -v p="$core" -v kept="$kept" '
    $1 == p || index($1, p "/") == 1 { next }
    !done && $1 > p { if (kept != "") print kept; done = 1 }
    { print }
    END { if (!done && kept != "") print kept }' "$sum" > "$sum.new"
  mv "$sum.new" "$sum"
  echo "tidy.sh: $m tidy"
done
