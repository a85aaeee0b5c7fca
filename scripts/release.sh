#!/usr/bin/env bash
# scripts/release.sh [--dry-run] vX.Y.Z
#
# Releases the library, outbox and the command amqpretry at vX.Y.Z, from a
# clean checkout:
#   1. checks that no tag of vX.Y.Z exists, that vX.Y.Z is newer than the
#      last release, and that CHANGELOG.md's "## Unreleased" section says
#      what changed;
#   2. scripts/setversion.sh vX.Y.Z: the nested modules require the library
#      (and outbox) at vX.Y.Z, go.work makes that version this directory, the
#      spans and metrics report instrumentation version X.Y.Z;
#   3. CHANGELOG.md: the Unreleased section becomes "## vX.Y.Z (DATE)", under
#      a new, empty Unreleased section;
#   4. scripts/release-check.sh --version vX.Y.Z: what the tags publish
#      resolves outside the repository (go get, go install ...@vX.Y.Z), and
#      the nested go.sum files get the checksums our modules have at vX.Y.Z,
#      so that a nested module also builds on its own (GOWORK=off);
#   5. commits "release vX.Y.Z" and tags it vX.Y.Z, outbox/vX.Y.Z and
#      cmd/amqpretry/vX.Y.Z (annotated).
# It pushes nothing: it prints the command that does.
#
# --dry-run does all of it in a scratch copy of the work tree (uncommitted
# changes included), shows the commit and the tags it made there, and leaves
# this checkout as it was.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/modules.bash"

usage() { echo "usage: scripts/release.sh [--dry-run] vX.Y.Z" >&2; exit 2; }
dry=0
case ${1:-} in --dry-run) dry=1; shift ;; esac
[ $# = 1 ] || usage
version=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "release.sh: $*"; }
fail() { echo "release.sh: $*" >&2; exit 1; }

[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
  fail "$version is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]"

# 1. What must hold before anything changes.
for dir in $RELEASED_MODULES; do
  tag=$(tag_of "$dir" "$version")
  if git rev-parse -q --verify "refs/tags/$tag" > /dev/null; then fail "the tag $tag exists already"; fi
done
last=$(git tag --list 'v[0-9]*' | sort -V | tail -1)
if [ -n "$last" ] && [ "$(printf '%s\n%s\n' "$last" "$version" | sort -V | tail -1)" != "$version" ]; then
  fail "$version is older than the last release, $last"
fi
notes=$(awk '/^## /{ if (inside) exit; if ($0 == "## Unreleased") { inside = 1; next } } inside && NF' CHANGELOG.md)
[ -n "$notes" ] || fail "CHANGELOG.md has no \"## Unreleased\" section, or it is empty: say there what $version changes"

if [ $dry = 1 ]; then
  if [ -n "$(git status --porcelain)" ]; then
    say "note: this checkout has uncommitted changes; the dry run includes them, a release would refuse them"
  fi
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/amqpretry-release-dry-run.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf - | tar -xf - -C "$scratch"
  # The copy's commits and tags: by whoever runs this, unsigned.
  export GIT_CONFIG_COUNT=4 GIT_CONFIG_KEY_0=user.name GIT_CONFIG_VALUE_0="$(git config user.name || echo release)" \
    GIT_CONFIG_KEY_1=user.email GIT_CONFIG_VALUE_1="$(git config user.email || echo release@localhost)" \
    GIT_CONFIG_KEY_2=commit.gpgsign GIT_CONFIG_VALUE_2=false GIT_CONFIG_KEY_3=tag.gpgsign GIT_CONFIG_VALUE_3=false
  git -C "$scratch" init -q -b "$(git rev-parse --abbrev-ref HEAD)"
  git -C "$scratch" add -A
  git -C "$scratch" commit -q -m "the work tree before the release"
  # The release itself, in the copy.
  (cd "$scratch" && scripts/release.sh "$version") | sed 's/^release.sh: /release.sh (dry run): /' | grep -v ': to publish: '
  echo
  git -C "$scratch" --no-pager show --stat --format='commit: %s' HEAD
  echo
  git -C "$scratch" --no-pager diff HEAD~1 -- CHANGELOG.md go.work '*go.mod' internal/telemetry/version.go
  echo
  say "dry run: the tags it would make: $(git -C "$scratch" tag | tr '\n' ' ')"
  say "dry run: nothing changed here"
  exit 0
fi

[ -z "$(git status --porcelain)" ] || fail "the work tree has uncommitted changes: commit or stash them first (or --dry-run)"
branch=$(git rev-parse --abbrev-ref HEAD)
[ "$branch" = main ] || say "note: releasing from branch $branch, not main"

# 2. The versions.
previous=$(scripts/setversion.sh "$version")
say "the nested modules required $previous; now $version"

# 3. The changelog.
today=$(date -u +%Y-%m-%d)
awk -v v="$version" -v d="$today" '
  !done && $0 == "## Unreleased" { print; print ""; print "## " v " (" d ")"; done = 1; next }
  { print }' CHANGELOG.md > CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md

# 4. What the tags would publish, from outside.
scripts/release-check.sh --version "$version" --sums-into "$root"

# 5. The commit and the tags.
git add -A
git commit -q -m "release $version"
tags=()
for dir in $RELEASED_MODULES; do
  tag=$(tag_of "$dir" "$version")
  git tag -a "$tag" -m "$(path_of . "$dir") $version"
  tags+=("$tag")
done
say "committed \"release $version\" and tagged it ${tags[*]}"
say "to publish: git push origin $branch ${tags[*]}"
