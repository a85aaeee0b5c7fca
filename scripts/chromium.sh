#!/usr/bin/env bash
# Make sure a headless Chromium runs here, for the console's browser tests
# (cmd/amqpretry/consoletest). Quiet and quick when it does; prints nothing
# but errors.
#
#   1. $AMQPRETRY_CHROMIUM, chromium, chromium-browser or google-chrome runs -> done
#   2. root with apt     -> apt-get install chromium (Debian's package), then 1
#   3. otherwise         -> say how to get one, exit 1
# "Runs" means it prints its version; the tests start it headless with a
# fresh profile and no background networking.
set -euo pipefail

say() { echo "chromium.sh: $*" >&2; }

find_chromium() {
  local c
  for c in "${AMQPRETRY_CHROMIUM:-}" chromium chromium-browser google-chrome; do
    [[ -n $c ]] || continue
    if command -v "$c" >/dev/null && "$c" --version >/dev/null 2>&1; then
      return 0
    fi
  done
  return 1
}

find_chromium && exit 0

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  say "no Chromium found; installing Debian's chromium package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq chromium >&2
  if find_chromium; then
    say "installed: $(chromium --version 2>/dev/null || echo chromium)"
    exit 0
  fi
  say "chromium was installed but does not run: try chromium --headless --no-sandbox --version"
  exit 1
fi

say "no Chromium found (tried \$AMQPRETRY_CHROMIUM, chromium, chromium-browser, google-chrome)."
say "install it (Debian/Ubuntu: sudo apt-get install chromium), or point \$AMQPRETRY_CHROMIUM"
say "at a Chromium or Chrome binary."
exit 1
