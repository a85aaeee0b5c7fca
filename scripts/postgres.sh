#!/usr/bin/env bash
# Make sure PostgreSQL accepts connections at $DATABASE_URL
# (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and that
# its database exists. Quiet and quick when it does.
#
#   1. it answers                           -> done
#   2. it answers, the database is missing  -> create it
#   3. installed on this machine, stopped   -> pg_ctlcluster ... start
#   4. not installed, root with apt         -> apt-get install postgresql, let
#                                              127.0.0.1 in without a password
#                                              (trust), start
#   5. otherwise                            -> say what to do, exit 1
# In 3 and 4 it waits up to $POSTGRES_WAIT seconds (default 60) for a login.
# A password in $DATABASE_URL is never printed.
set -euo pipefail

url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
wait_for="${POSTGRES_WAIT:-60}"

say() { echo "postgres.sh: $*" >&2; }
redacted() { sed -E 's#(://[^:/@]*:)[^@]*@#\1xxxxx@#' <<<"$url"; }

# postgres[ql]://[user[:password]@]host[:port]/database[?params]
re='^postgres(ql)?://(([^:@/]*)(:[^@]*)?@)?([^/:?]*)(:([0-9]+))?/([^?]*)(\?.*)?$'
if [[ ! $url =~ $re ]]; then
  say "\$DATABASE_URL $(redacted) is not a postgres://user@host:port/database URL"
  exit 1
fi
user="${BASH_REMATCH[3]:-postgres}"
host="${BASH_REMATCH[5]:-127.0.0.1}"
port="${BASH_REMATCH[7]:-5432}"
dbname="${BASH_REMATCH[8]}"
# The same server's maintenance database, to create ours from.
admin_url="postgres://${BASH_REMATCH[2]}$host${BASH_REMATCH[6]}/postgres${BASH_REMATCH[9]}"

login() { psql "$1" -Atqc 'SELECT 1' >/dev/null 2>&1; }
server_up() { pg_isready -q -h "$host" -p "$port" -t 2 >/dev/null 2>&1; }

ensure_database() {
  [[ -z $dbname ]] && return 0
  login "$url" && return 0
  if login "$admin_url" && ! psql "$admin_url" -Atqc "SELECT 1 FROM pg_database WHERE datname = '$dbname'" | grep -q 1; then
    say "creating database $dbname"
    psql "$admin_url" -qc "CREATE DATABASE \"$dbname\"" >&2
    login "$url" && return 0
  fi
  say "PostgreSQL answers at $host:$port, but $(redacted) does not log in:"
  psql "$url" -Atqc 'SELECT 1' 2>&1 | sed -E 's#(://[^:/@]*:)[^@]*@#\1xxxxx@#' | sed 's/^/  /' >&2 || true
  say "the tests expect user $user to log in without a password from this machine (pg_hba.conf:"
  say "'host all all 127.0.0.1/32 trust'), or put the password in \$DATABASE_URL"
  return 1
}

if command -v psql >/dev/null && login "$url"; then
  exit 0
fi

case "$host" in
  localhost | 127.* | ::1 | "") local_host=1 ;;
  *) local_host=0 ;;
esac

if command -v pg_isready >/dev/null && server_up; then
  ensure_database
  exit
fi

if ((!local_host)); then
  say "no PostgreSQL answers at $(redacted), and it is not on this machine, so I cannot start it:"
  say "start it there, or point \$DATABASE_URL at one that runs"
  exit 1
fi

installed_here=0
if ! command -v pg_ctlcluster >/dev/null || [[ -z $(ls /etc/postgresql 2>/dev/null) ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "PostgreSQL is not installed; installing Debian's package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    installed_here=1
  else
    say "no PostgreSQL answers at $(redacted) and none is installed."
    say "install it (Debian/Ubuntu: sudo apt-get install postgresql), or run one in a container"
    say "(docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres), or point \$DATABASE_URL at one."
    exit 1
  fi
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
conf=/etc/postgresql/$version/main
if ((installed_here)); then
  # A fresh cluster of our own: let local TCP logins in without a password,
  # as the tests expect. A cluster someone else set up is left as it is.
  sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$conf/pg_hba.conf"
fi
if [[ -f $conf/postgresql.conf ]] && ! grep -Eq "^\s*port\s*=\s*$port\b" "$conf/postgresql.conf"; then
  say "warning: the cluster $version/main is not configured for port $port; starting it anyway"
fi

started=$SECONDS
say "starting PostgreSQL $version (cluster main)"
pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || say "pg_ctlcluster exited with $? (it may already be starting)"

deadline=$((SECONDS + wait_for))
until server_up; do
  if ((SECONDS >= deadline)); then
    say "PostgreSQL did not accept connections within ${wait_for}s"
    log=/var/log/postgresql/postgresql-$version-main.log
    [[ -s $log ]] && { say "last lines of $log:"; tail -n 20 "$log" >&2; }
    exit 1
  fi
  sleep 1
done
ensure_database
say "PostgreSQL is up ($((SECONDS - started))s)"
