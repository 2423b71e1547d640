#!/usr/bin/env bash
# scripts/postgres.sh: runs a real local PostgreSQL cluster on this machine without Docker, for
# alert-sink's tests, the demo and the benchmark. It uses the server binaries of the distribution's
# `postgresql` package (installed with apt-get when missing and run as root) and keeps everything
# in .postgres/ at the repository's top (git-ignored). PostgreSQL refuses to run as root: when this
# script runs as root, the server runs as the `postgres` system user the package creates.
#
# Usage:
#   scripts/postgres.sh up               start the cluster (initialising it on first use), or reuse
#                                        the one already running; wait until it accepts
#                                        connections; print its DATABASE_URL on stdout
#   scripts/postgres.sh down [--wipe] [--immediate]
#                                        stop the cluster `up` started (--immediate: no shutdown
#                                        checkpoint, as a crash: the sink's outage test uses it);
#                                        --wipe also deletes its data, password and port
#   scripts/postgres.sh status           is it running and accepting connections (exit 0 if so)
#   scripts/postgres.sh url              print the DATABASE_URL (exit 1 if never initialised)
#   scripts/postgres.sh psql [ARGS]      psql connected to the cluster, e.g.
#                                          scripts/postgres.sh psql -c 'select count(*) from alerts'
#
# All state lives in .postgres/ (git-ignored; PG_STATE names another folder):
#   .postgres/data/          the cluster (owned by the user the server runs as)
#   .postgres/server.log     the server's log (the previous run's is kept as server.log.1)
#   .postgres/port           the TCP port chosen on first `up`: a free one from PG_PORT up; every
#                            later start keeps it unless the server cannot bind it (then `up` moves
#                            to a free port and says so)
#   .postgres/password       the password of the `postgres` superuser, random, made on first `up`
#   .postgres/url            the DATABASE_URL: postgres://postgres:<password>@127.0.0.1:<port>/postgres
#   .postgres/server.crt, .postgres/server.key   a self-signed certificate for 127.0.0.1, so TLS
#                            can be tried locally (sslmode=require with this file as root cert)
# The server listens on 127.0.0.1 only and has no Unix socket. Host connections use a password
# (scram-sha-256), so a wrong or missing password is refused as it would be in production.
# If the `postgres` user cannot reach .postgres/ (a checkout under a private home, say), the data
# folder goes to /var/tmp/price-alerts-postgres-<hash of this checkout's path>/ instead.
#
# Environment variables read:
#   PG_STATE           the state folder (default .postgres/ at the repository's top): another
#                      folder is another server, with its own data, port and password (the
#                      all-stage chaos test runs one of its own, so that its shutdowns stop no
#                      other test's server)
#   PG_PORT            first port tried on the first `up`; default 15432, below Linux's
#                      ephemeral range (32768-60999), in which a client connection's local port
#                      (a Kafka client's, say) can hold the port as the server binds it
#   PG_BIN             folder of the server binaries; default the newest /usr/lib/postgresql/*/bin
#   PG_START_TIMEOUT   seconds `up` waits for the server to accept connections; default 60
#   PG_STOP_TIMEOUT    seconds `down` waits for the server to stop; default 60
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)
STATE=${PG_STATE:-$ROOT/.postgres}
[[ $STATE == /* ]] || STATE="$PWD/$STATE"
PORT_FILE="$STATE/port"
PASSWORD_FILE="$STATE/password"
URL_FILE="$STATE/url"
LOG="$STATE/server.log"

PG_PORT=${PG_PORT:-15432}
PG_START_TIMEOUT=${PG_START_TIMEOUT:-60}
PG_STOP_TIMEOUT=${PG_STOP_TIMEOUT:-60}
PG_USER=postgres

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { printf 'postgres.sh: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# Binaries, user, folders

find_bin() {
  if [[ -n ${PG_BIN:-} ]]; then
    [[ -x $PG_BIN/postgres ]] || die "PG_BIN=$PG_BIN has no postgres binary"
    echo "$PG_BIN"
    return 0
  fi
  local dir
  dir=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
  [[ -n $dir && -x $dir/postgres ]] || return 1
  echo "$dir"
}

# The server binaries, installing the distribution's package when they are missing and we may.
need_bin() {
  if BIN=$(find_bin); then return 0; fi
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL server binaries not found: installing the distribution's postgresql package"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
      || die "apt-get install postgresql failed"
    BIN=$(find_bin) || die "postgresql installed but no /usr/lib/postgresql/*/bin/postgres found"
    return 0
  fi
  die "PostgreSQL server binaries not found: install the postgresql package (apt-get install postgresql) or set PG_BIN"
}

is_root() { [[ $(id -u) == 0 ]]; }

# Runs a command as the user the server runs as (postgres when we are root, else ourselves).
as_server() {
  if is_root; then
    # From /: the server's user may not be allowed into the caller's working directory.
    (cd / && runuser -u "$PG_USER" -- "$@")
  else
    "$@"
  fi
}

# The data folder: .postgres/data, or a folder under /var/tmp when the server's user cannot reach
# .postgres/ (remembered in .postgres/data-dir so every command finds the same one).
data_dir() {
  if [[ -f $STATE/data-dir ]]; then cat "$STATE/data-dir"; return 0; fi
  if ! is_root || runuser -u "$PG_USER" -- test -x "$STATE"; then
    echo "$STATE/data"
  else
    local hash
    hash=$(printf '%s' "$STATE" | sha256sum | cut -c1-12)
    echo "/var/tmp/price-alerts-postgres-$hash/data"
  fi
}

prepare_state() {
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  if is_root; then
    id "$PG_USER" >/dev/null 2>&1 || die "no '$PG_USER' system user (the postgresql package creates it): reinstall postgresql"
  fi
  DATA=$(data_dir)
  local parent
  parent=$(dirname -- "$DATA")
  mkdir -p "$parent"
  if is_root; then chown "$PG_USER:" "$parent"; fi
  if [[ $DATA != "$STATE/data" && ! -f $STATE/data-dir ]]; then
    echo "$DATA" >"$STATE/data-dir"
    log "the '$PG_USER' user cannot reach $STATE: data goes to $DATA"
  fi
  # The server's log lives beside its data when that is elsewhere; .postgres/server.log points there.
  if [[ $DATA == "$STATE/data" ]]; then SERVER_LOG=$LOG; else SERVER_LOG="$parent/server.log"; ln -sfn "$SERVER_LOG" "$LOG"; fi
  if is_root; then touch "$SERVER_LOG" && chown "$PG_USER:" "$SERVER_LOG"; fi
}

lock_state() {
  mkdir -p "$STATE"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$STATE/.lock"
    flock 9
  fi
}

# ---------------------------------------------------------------------------------------------
# Port, password, URL

port_open() { # PORT
  # shellcheck disable=SC2016 # $1 is expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# Whether a socket holds 127.0.0.1:PORT so that the server's bind would fail: a listener, or a
# connection whose local port it is (a client's ephemeral port). Sockets in TIME-WAIT do not
# count: every connection a server closed itself (all those open at a crash, `down --immediate`)
# waits a minute in TIME-WAIT on its port, and the server's listener (SO_REUSEADDR) binds over
# those; counting them moved a restarted cluster away from the port its clients were given. (A
# client's own TIME-WAIT socket, without SO_REUSEADDR, does refuse the bind: the retry in cmd_up
# moves the server then.)
port_taken() { # PORT
  port_open "$1" && return 0
  command -v ss >/dev/null 2>&1 || return 1
  [[ -n $(ss -Htan state all exclude time-wait "( sport = :$1 )" 2>/dev/null) ]]
}

# The port to start on: the cluster's own (.postgres/port) unless something listens there now, else
# a free one from FROM (default PG_PORT) up. The cluster's own port is not checked further: what
# its last server left on it (TIME-WAIT, FIN-WAIT-2) is no obstacle, and a bind that fails all the
# same moves the server (cmd_up).
choose_port() { # [FROM]
  local p from=${1:-$PG_PORT}
  if [[ -z ${1:-} && -f $PORT_FILE ]]; then
    p=$(cat "$PORT_FILE")
    if ! port_open "$p"; then echo "$p"; return 0; fi
    log "port $p (used before) is taken now: choosing another"
  fi
  for ((p = from; p < from + 200; p++)); do
    if ! port_taken "$p"; then echo "$p"; return 0; fi
  done
  die "no free port in $from..$((from + 199)): set PG_PORT"
}

ensure_password() {
  if [[ ! -s $PASSWORD_FILE ]]; then
    local pw
    pw=$(LC_ALL=C tr -dc 'A-Za-z0-9' < <(head -c 600 /dev/urandom))
    (umask 077 && printf '%s' "${pw:0:24}" >"$PASSWORD_FILE")
  fi
  chmod 600 "$PASSWORD_FILE"
}

write_url() { # PORT
  (umask 077 && printf 'postgres://%s:%s@127.0.0.1:%s/postgres\n' "$PG_USER" "$(cat "$PASSWORD_FILE")" "$1" >"$URL_FILE")
}

# ---------------------------------------------------------------------------------------------
# The server

running_pid() {
  local pid
  [[ -n ${DATA:-} && -f $DATA/postmaster.pid ]] || return 1
  pid=$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

running_port() { sed -n 4p "$DATA/postmaster.pid" 2>/dev/null; }

accepting() { # PORT
  "$BIN/pg_isready" -q -h 127.0.0.1 -p "$1" -t 2 >/dev/null 2>&1
}

init_cluster() {
  ensure_password
  local pwfile
  pwfile=$(dirname -- "$DATA")/.initdb-password
  install -m 600 "$PASSWORD_FILE" "$pwfile"
  if is_root; then chown "$PG_USER:" "$pwfile"; fi
  log "initialising a cluster in $DATA"
  if ! as_server "$BIN/initdb" -D "$DATA" -U "$PG_USER" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 >"$STATE/initdb.log" 2>&1; then
    rm -f "$pwfile"
    tail -n 20 "$STATE/initdb.log" >&2
    die "initdb failed (output above and in .postgres/initdb.log)"
  fi
  rm -f "$pwfile"
  make_certificate
}

# A self-signed certificate for 127.0.0.1/localhost, when openssl is at hand: TLS can then be
# tried against the local cluster (clients that do not ask for it are still served in plain text).
make_certificate() {
  command -v openssl >/dev/null 2>&1 || { log "openssl not found: the cluster runs without TLS"; return 0; }
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$STATE/server.key" -out "$STATE/server.crt" >/dev/null 2>&1 \
    || { log "could not make a TLS certificate: the cluster runs without TLS"; return 0; }
  install -m 600 "$STATE/server.key" "$DATA/server.key"
  install -m 644 "$STATE/server.crt" "$DATA/server.crt"
  if is_root; then chown "$PG_USER:" "$DATA/server.key" "$DATA/server.crt"; fi
}

print_log_tail() {
  if [[ -f $LOG ]]; then
    echo "---- last 30 lines of $LOG ----" >&2
    tail -n 30 "$LOG" >&2
    echo "----" >&2
  fi
}

# ---------------------------------------------------------------------------------------------
# Commands

cmd_up() {
  lock_state
  need_bin
  prepare_state
  local pid port
  if pid=$(running_pid); then
    port=$(running_port)
    if accepting "$port"; then
      log "our cluster (pid $pid) already accepts connections on 127.0.0.1:$port: reusing it"
      write_url "$port"
      cat "$URL_FILE"
      return 0
    fi
    log "our cluster (pid $pid) is running but does not accept connections yet: waiting for it"
  else
    [[ -f $DATA/PG_VERSION ]] || init_cluster
    ensure_password
    local ssl=off
    [[ -f $DATA/server.key ]] && ssl=on
    local attempt from=
    for attempt in 1 2 3; do
      port=$(choose_port ${from:+"$from"})
      if [[ -f $LOG ]]; then mv -f "$LOG" "$LOG.1" 2>/dev/null || true; fi
      prepare_state # the log file again, owned by the server's user
      # -o: the settings that differ from initdb's postgresql.conf, given on every start so the
      # port can change: TCP on 127.0.0.1 only, no Unix socket (its path could be too long).
      # 9>&-: the server must not inherit (and so hold forever) this script's lock.
      if as_server "$BIN/pg_ctl" -D "$DATA" -l "$SERVER_LOG" -w -t "$PG_START_TIMEOUT" start \
        -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c ssl=$ssl" >/dev/null 9>&-; then
        break
      fi
      # A socket holds the port though nothing listened there: a client connection's local port
      # (on the cluster's own port, or taken between the check and the bind). Another port,
      # twice at most.
      if ((attempt < 3)) && grep -q 'could not bind' "$SERVER_LOG" 2>/dev/null; then
        log "the server could not bind 127.0.0.1:$port ($(grep -m 1 -o 'could not bind.*' "$SERVER_LOG")): moving to another port"
        from=$((port + 1))
        continue
      fi
      print_log_tail
      die "the server did not start on 127.0.0.1:$port within ${PG_START_TIMEOUT}s; its log: $LOG"
    done
    echo "$port" >"$PORT_FILE"
    pid=$(running_pid) || { print_log_tail; die "the server exited right after starting; its log: $LOG"; }
    log "started PostgreSQL ($("$BIN/postgres" --version | sed 's/^[^0-9]*\([0-9.]*\).*/\1/'), pid $pid) on 127.0.0.1:$port"
  fi
  local deadline=$((SECONDS + PG_START_TIMEOUT))
  until accepting "$port"; do
    if ! running_pid >/dev/null; then print_log_tail; die "the server exited before accepting connections; its log: $LOG"; fi
    ((SECONDS < deadline)) || die "the server does not accept connections on 127.0.0.1:$port after ${PG_START_TIMEOUT}s; its log: $LOG"
    sleep 0.2
  done
  write_url "$port"
  cat "$URL_FILE"
}

cmd_down() {
  local wipe=0 mode=fast
  while (($#)); do
    case $1 in
      --wipe) wipe=1 ;;
      --immediate) mode=immediate ;;
      *) die "down: unknown argument '$1' (usage: down [--wipe] [--immediate])" ;;
    esac
    shift
  done
  lock_state
  DATA=$(data_dir)
  local pid
  if pid=$(running_pid); then
    need_bin
    log "stopping the cluster (pid $pid, mode $mode)"
    as_server "$BIN/pg_ctl" -D "$DATA" -m "$mode" -w -t "$PG_STOP_TIMEOUT" stop >/dev/null \
      || die "the cluster (pid $pid) did not stop within ${PG_STOP_TIMEOUT}s"
  else
    log "no cluster started by this script is running"
  fi
  if ((wipe)); then
    # The folder under /var/tmp too, when the data was kept there.
    if [[ $DATA != "$STATE/data" ]]; then rm -rf "$(dirname -- "$DATA")"; fi
    rm -rf "$DATA" "$PORT_FILE" "$PASSWORD_FILE" "$URL_FILE" "$STATE/data-dir" "$STATE/server.key" "$STATE/server.crt"
    log "deleted the cluster's data, password and port"
  fi
}

cmd_status() {
  DATA=$(data_dir)
  local pid port
  if pid=$(running_pid); then
    port=$(running_port)
    if BIN=$(find_bin) && accepting "$port"; then
      echo "our cluster: running (pid $pid) on 127.0.0.1:$port, accepting connections; data $DATA"
      return 0
    fi
    echo "our cluster: running (pid $pid) on 127.0.0.1:$port but not accepting connections"
    return 1
  fi
  echo "our cluster: not running"
  return 1
}

cmd_url() {
  [[ -f $URL_FILE ]] || die "no cluster yet: run scripts/postgres.sh up"
  cat "$URL_FILE"
}

cmd_psql() {
  [[ -f $URL_FILE ]] || die "no cluster yet: run scripts/postgres.sh up"
  command -v psql >/dev/null 2>&1 || die "psql not found: install postgresql-client"
  exec psql "$(cat "$URL_FILE")" "$@"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    url) cmd_url "$@" ;;
    psql) cmd_psql "$@" ;;
    -h | --help | help) usage ;;
    '') usage >&2; exit 2 ;;
    *) log "unknown command '$cmd'"; usage >&2; exit 2 ;;
  esac
}

main "$@"
