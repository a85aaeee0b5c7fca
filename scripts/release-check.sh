#!/usr/bin/env bash
# scripts/release-check.sh [--version vX.Y.Z] [--sums-into ROOT] [--proxy-only DIR] [--keep]
#
# Proves that a program outside this repository can use what a release would
# publish (make test runs it; scripts/release.sh runs it before it tags):
#
#  1. no go.mod has a replace directive, and every workspace module requires
#     the released modules (the library, outbox) at one version, the one
#     go.work replaces with the directory beside it;
#  2. the work tree (tracked files and new ones git does not ignore) is
#     copied, set to the version (scripts/setversion.sh; by default the
#     version the modules require now, so nothing changes), committed and
#     tagged as a release tags it (v…, outbox/v…, cmd/amqpretry/v…) in a
#     scratch repository, and the go command fetches the modules from it as
#     the Go module proxy fetches them from GitHub (the same zips, so the same
#     checksums): that makes a file-system module proxy (GOPROXY=file://…).
#     On the way, each nested go.sum gets the checksums of the modules it
#     requires at that version, as a release commits them;
#  3. in a scratch module at the Go floor, with GOWORK=off and
#     GOFLAGS=-mod=mod, `go get` of outbox alone (the library comes with it,
#     at the version outbox requires), then of the library, builds a program
#     importing both without raising the go line; `go install` of the CLI at
#     the version works, and `amqpretry version` says that version;
#  4. each nested released module, built on its own (GOWORK=off,
#     -mod=readonly), finds every checksum it needs in its go.sum.
#
# Our modules come from the scratch proxy only, and the checksum database is
# not asked about them (GONOSUMDB); every other module comes from the local
# module cache (as a file proxy) or, failing that, from $(go env GOPROXY).
#
# --version V      check (and prepare the sums of) version V instead
# --sums-into ROOT copy the nested go.sum files, with the checksums of our
#                  modules at V, into the checkout at ROOT (scripts/release.sh)
# --proxy-only DIR stop after 2 and leave the proxy in DIR (scripts/tidy.sh)
# --keep           leave the scratch directory (it is printed) for a look
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/modules.bash"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="" sums_into="" proxy_only="" keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=$2; shift 2 ;;
    --sums-into) sums_into=$2; shift 2 ;;
    --proxy-only) proxy_only=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: scripts/release-check.sh [--version vX.Y.Z] [--sums-into ROOT] [--proxy-only DIR] [--keep]" >&2; exit 2 ;;
  esac
done

say() { echo "release check: $*"; }
fail() { echo "release check: FAILED: $*" >&2; exit 1; }

cd "$root"
core=$(module_path .)
modules=$(workspace_modules go.work)

# 1. What the go.mod files and go.work say.
current="" first=""
for m in $modules; do
  [ -f "$m/go.mod" ] || fail "go.work uses $m, which has no go.mod"
  if [ -n "$(directive "$m/go.mod" replace)" ]; then
    fail "$m/go.mod has a replace directive: go install …@version refuses such a module, and its users could not resolve it. Local builds go through go.work instead"
  fi
  for dir in $RELEASED_MODULES; do
    path=$(path_of . "$dir")
    v=$(required_version "$m/go.mod" "$path")
    [ -n "$v" ] || continue
    [ -n "$current" ] || { current=$v; first=$m; }
    [ "$v" = "$current" ] || fail "$m/go.mod requires $path $v, $first/go.mod requires $core $current: the modules require ours at the one version they are released with (scripts/setversion.sh sets it)"
    if [ "$(replaced_versions go.work "$path")" != "$v" ]; then
      fail "go.work replaces $path at '$(replaced_versions go.work "$path" | tr '\n' ' ')', not at $v, the version $m requires: run scripts/setversion.sh $v"
    fi
  done
done
[ -n "$current" ] || fail "no workspace module requires $core: nothing to check"
version=${version:-$current}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/amqpretry-release-check.XXXXXX")
if [ $keep = 1 ]; then say "scratch directory $scratch"; else trap 'rm -rf "$scratch"' EXIT; fi
stage=$scratch/repo

# The go command as the module proxy and a user run it: no workspace, the
# toolchain at hand, module caches of our own (removable: -modcacherw).
base_env=(GOWORK=off GOTOOLCHAIN=local GOPRIVATE= GONOPROXY= GONOSUMDB="$core" GIT_TERMINAL_PROMPT=0)
usercache="$(go env GOMODCACHE)/cache/download"
upstream=$(go env GOPROXY | tr ',|' '\n\n' | grep -vx -e direct -e off | paste -sd, -)

# 2. The release, in a scratch repository.
mkdir -p "$stage"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$stage"
if [ "$version" != "$current" ]; then "$stage/scripts/setversion.sh" "$version" "$stage" > /dev/null; fi
git -C "$stage" init -q
commit() {
  git -C "$stage" add -A
  git -C "$stage" -c user.name=release-check -c user.email=release-check@localhost -c commit.gpgsign=false \
    commit -q --allow-empty -m "$1"
}
tag_all() { local d; for d in $RELEASED_MODULES; do git -C "$stage" tag -f "$(tag_of "$d" "$version")" > /dev/null; done; }

# fetch CACHE DIR...: go mod download of the released modules in DIRs at
# $version from the scratch repository, as GitHub would serve them (git
# reads the repository through the URL GitHub has), into the module cache
# CACHE; prints "path sum gomodsum" per module.
repo_url="https://${core}"
fetch() {
  local cache=$1 args=() d; shift
  for d in "$@"; do args+=("$(path_of "$stage" "$d")@$version"); done
  (cd "$scratch" && env "${base_env[@]}" GOMODCACHE="$cache" GOPROXY=direct GONOSUMDB= GOPRIVATE="$core" GOFLAGS=-modcacherw \
    GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0="url.$stage.insteadOf" GIT_CONFIG_VALUE_0="$repo_url" \
    GIT_CONFIG_KEY_1=protocol.file.allow GIT_CONFIG_VALUE_1=always \
    go mod download -json "${args[@]}") |
    awk -F'"' '/"Path"/ { p = $4 } /"Sum"/ { s = $4 } /"GoModSum"/ { print p, s, $4 } /"Error"/ { print "ERROR", $4; bad = 1 } END { exit bad }'
}

# set_sum GOSUM PATH SUM GOMODSUM: GOSUM records PATH at $version with these
# checksums, and no other version of PATH; the lines go where the go command
# would put them, the others stay as they are.
set_sum() {
  local file=$1 path=$2
  [ -f "$file" ] || touch "$file"
  LC_ALL=C awk -v p="$path" -v l1="$path $version $3" -v l2="$path $version/go.mod $4" '
    $1 == p { next }
    !done && $1 > p { print l1; print l2; done = 1 }
    { print }
    END { if (!done) { print l1; print l2 } }' "$file" > "$file.new"
  mv "$file.new" "$file"
}

# Each released module's checksums go into the go.sum of every module that
# requires it, before that module is fetched in turn (its go.sum is part of
# its zip): the library, then outbox. Each fetch has a module cache of its
# own, so that no tag is remembered from the one before.
n=0
for dir in $RELEASED_MODULES; do
  path=$(path_of "$stage" "$dir")
  dependents=""
  for m in $modules; do
    [ "$m" != "$dir" ] && [ -n "$(required_version "$stage/$m/go.mod" "$path")" ] && dependents="$dependents $m"
  done
  [ -n "$dependents" ] || continue
  n=$((n + 1))
  commit "release $version: checksums of $dir"
  tag_all
  fetch "$scratch/sums-cache-$n" "$dir" > "$scratch/sums" || { cat "$scratch/sums" >&2; fail "fetching $dir at $version from the scratch repository"; }
  read -r got sum gomodsum < "$scratch/sums"
  [ "$got" = "$path" ] || fail "fetching $dir at $version gave '$got'"
  for m in $dependents; do set_sum "$stage/$m/go.sum" "$path" "$sum" "$gomodsum"; done
done
commit "release $version"
tag_all
proxy_cache=$scratch/proxy-cache
fetch "$proxy_cache" $RELEASED_MODULES > "$scratch/sums" || { cat "$scratch/sums" >&2; fail "fetching the released modules at $version"; }
proxy=$proxy_cache/cache/download
say "$version of $(echo $RELEASED_MODULES | tr ' ' ',') served from a scratch module proxy (file://$proxy)"

if [ -n "$proxy_only" ]; then
  mkdir -p "$proxy_only" && cp -r "$proxy/." "$proxy_only/"
  exit 0
fi

consumer_env=("${base_env[@]}" GOMODCACHE="$scratch/consumer-cache" GOFLAGS="-mod=mod -modcacherw -trimpath"
  GOPROXY="file://$proxy,file://$usercache${upstream:+,$upstream}")

# 3. A user's module.
consumer=$scratch/consumer
mkdir -p "$consumer"
cd "$consumer"
printf 'module example.com/consumer\n\ngo %s\n' "$GO_FLOOR_LINE" > go.mod
# The checksums the repository records for its dependencies: the checksum
# database is not needed for those either.
cat "$root"/go.sum $(for m in $modules; do echo "$root/$m/go.sum"; done | sort -u) 2>/dev/null |
  awk -v p="$core" 'index($1, p) != 1' | LC_ALL=C sort -u > go.sum
run() { env "${consumer_env[@]}" "$@" > "$scratch/out" 2>&1 || { cat "$scratch/out" >&2; return 1; }; }

run go get "$core/outbox@$version" || fail "go get $core/outbox@$version"
got=$(required_version go.mod "$core")
[ "$got" = "$version" ] || fail "go get of outbox $version brought $core ${got:-(nothing)}, not $version"
cat > main.go <<EOF
package main

import (
	_ "$core/dlx"
	_ "$core/listener"
	_ "$core/middleware"
	_ "$core/outbox"
	_ "$core/outbox/inbox"
	_ "$core/publisher"
	_ "$core/recoverer"
)

func main() {}
EOF
run go get "$core@$version" || fail "go get $core@$version"
run go build ./... || fail "building a program that imports the library and outbox at $version"
line=$(directive go.mod go)
[ "$line" = "$GO_FLOOR_LINE" ] || fail "go get raised the user's go line from $GO_FLOOR_LINE to $line: a dependency needs a newer Go than the floor"
say "go get $core/outbox@$version, then $core@$version, and a build: ok"

# go install has no go.sum to check against (a module of its own is not
# used), so the checksum database would be asked: not about ours, and, for
# the others, their checksums were checked in the steps above.
run env GOSUMDB=off GOBIN="$scratch/bin" go install "$core/cmd/amqpretry@$version" || fail "go install $core/cmd/amqpretry@$version"
"$scratch/bin/amqpretry" version > "$scratch/out" 2>&1 || { cat "$scratch/out" >&2; fail "amqpretry version"; }
grep -qF "$version" "$scratch/out" || fail "amqpretry version says '$(cat "$scratch/out")', not $version"
say "go install $core/cmd/amqpretry@$version: ok ($(cat "$scratch/out"))"

# 4. The nested modules on their own, from the release's files.
for dir in $RELEASED_MODULES; do
  [ "$dir" = . ] && continue
  (cd "$stage/$dir" && env "${consumer_env[@]}" GOFLAGS="-mod=readonly -modcacherw" go list -deps -test ./... > "$scratch/out" 2>&1) ||
    { cat "$scratch/out" >&2; fail "$dir at $version, built alone (GOWORK=off), lacks a checksum in its go.sum"; }
done
say "the nested modules find every checksum in their go.sum: ok"

if [ -n "$sums_into" ]; then
  for m in $modules; do
    [ "$m" = . ] || cp "$stage/$m/go.sum" "$sums_into/$m/go.sum"
  done
  say "go.sum files with the checksums of $version written into $sums_into"
fi
