#!/usr/bin/env bash
# scripts/setversion.sh vX.Y.Z [ROOT]
#
# Sets, in the checkout at ROOT (default: this one), the version a release
# publishes the modules at:
#   - every workspace module (go.work) that requires one of the released
#     modules (the library, outbox, cmd/amqpretry) requires it at vX.Y.Z;
#   - go.work replaces exactly that version with the directory beside it, so
#     that local development builds what is checked out, also before the
#     version exists anywhere else. The go.mod files carry no replace
#     directives: the go command refuses `go install ...@version` of a module
#     that has one, and a user of outbox could not resolve a directory;
#   - the instrumentation version spans and metrics report
#     (internal/telemetry/version.go).
# It prints the version the modules required before. scripts/release.sh runs
# it, and the release check on a copy. It neither commits nor tags.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/modules.bash"

usage() { echo "usage: scripts/setversion.sh vX.Y.Z [ROOT]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
version=$1
root=${2:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "setversion.sh: $version is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
  exit 2
fi
if [[ $version =~ ^v([1-9][0-9]*)\. ]] && [ "${BASH_REMATCH[1]}" -ge 2 ]; then
  echo "setversion.sh: $version needs /v${BASH_REMATCH[1]} at the end of every module path (go.mod, imports); this script handles v0 and v1" >&2
  exit 2
fi
cd "$root"

previous=""
for dir in $RELEASED_MODULES; do
  path=$(path_of . "$dir")
  required=0
  for m in $(workspace_modules go.work); do
    [ "$m" = "$dir" ] && continue
    old=$(required_version "$m/go.mod" "$path")
    [ -n "$old" ] || continue
    required=1
    previous=${previous:-$old}
    go mod edit -require="$path@$version" "$m/go.mod"
  done
  # go.work's replacement follows the requirement: every replacement of the
  # module goes, and the new version is replaced if a module requires it.
  for old in $(replaced_versions go.work "$path"); do
    if [ "$old" = "*" ]; then go work edit -dropreplace="$path" go.work; else go work edit -dropreplace="$path@$old" go.work; fi
  done
  if [ $required = 1 ]; then
    go work edit -replace="$path@$version=./${dir#.}" go.work
  fi
done

sed -i "s/^const Version = \".*\"$/const Version = \"${version#v}\"/" internal/telemetry/version.go
grep -q "^const Version = \"${version#v}\"$" internal/telemetry/version.go ||
  { echo "setversion.sh: internal/telemetry/version.go has no line const Version = \"...\" to set" >&2; exit 1; }

echo "${previous:-none}"
