#!/usr/bin/env bash
# scripts/test.sh: runs every test of the project, the broker tests included, against real Apache
# Kafka brokers, in three lanes side by side, each a `cargo test` of two threads:
#   a. the security and OIDC tests on the local SECURED broker (scripts/kafka.sh up --secure:
#      SASL_SSL, SCRAM users, an OAUTHBEARER listener, ACLs; KAFKA_SECURE_BOOTSTRAP,
#      KAFKA_SECURE_DIR, KAFKA_SECURE_CA and KAFKA_SECURE_OAUTH_* tell the tests where it is), and
#      a few long files on the local single broker (scripts/kafka.sh up);
#   b. the unit tests and every other broker test, on the single broker;
#   c. the tests of the local 3-broker cluster (scripts/kafka.sh up --brokers 3): chaos, restore,
#      coordinator.
# A broker that is not running is started here, before the lanes, and stopped again at the end;
# one that was already running is reused and left alone. With arguments (a selection such as
# --test pipeline) every broker is started and the selection runs once.
#
# Broker tests are #[ignore]d under a plain `cargo test` (no broker there); here they run with
# --include-ignored, so none is silently skipped.
#
# alert-sink's tests need PostgreSQL too: scripts/postgres.sh up when it is not running (stopped
# again at the end), unless DATABASE_URL names a server already.
#
# Environment: KAFKA_BOOTSTRAP (default 127.0.0.1:9092), KAFKA_CLUSTER_BOOTSTRAP (default the
# cluster's 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094), DATABASE_URL (default the cluster of
# scripts/postgres.sh); extra arguments go to `cargo test`
# before `--` (e.g. scripts/test.sh --test pipeline).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
export KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}
export KAFKA_CLUSTER_BOOTSTRAP=${KAFKA_CLUSTER_BOOTSTRAP:-127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094}
# The start-up check of every binary a test starts waits this long for a broker to answer (the
# binaries' --connect-timeout, 10 s by default). A fresh-clone run (2026-12-03) had dlq-replay give
# up after 10 s with the load at 57 on two cores: a stall of the machine, not a broker that is
# away. An orchestrator would restart it; the test instead fails, so the tests wait longer. Tests
# that prove the check fails fast pass --connect-timeout themselves, and a refused login, TLS
# handshake or token still ends the check at once.
export KAFKA_CONNECT_TIMEOUT=${KAFKA_CONNECT_TIMEOUT:-60s}

command -v cargo >/dev/null || { echo "test.sh: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
# What the build and the tests need from the system (librdkafka's headers, Java and Maven,
# promtool and prometheus), installed when missing and we may; scripts/postgres.sh installs PostgreSQL.
scripts/prereqs.sh

# PostgreSQL for alert-sink's tests: the cluster of scripts/postgres.sh, started here when it is not
# running (and stopped again at the end); a DATABASE_URL given by the caller is used as it is.
started=0 cluster_started=0 secure_started=0 pg_started=0 log_root= sampler_pid=
cleanup() {
  if [ "$started" = 1 ]; then scripts/kafka.sh down --wipe >/dev/null || true; fi
  if [ "$cluster_started" = 1 ]; then scripts/kafka.sh down --brokers 3 --wipe >/dev/null || true; fi
  # --wipe: its certificates and passwords go with it.
  if [ "$secure_started" = 1 ]; then scripts/kafka.sh down --secure --wipe >/dev/null || true; fi
  if [ "$pg_started" = 1 ]; then scripts/postgres.sh down >/dev/null || true; fi
  if [ -n "$log_root" ]; then rm -rf "$log_root"; fi
  if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; fi
  if [ -n "${logs:-}" ]; then rm -rf "$logs"; fi
}
trap cleanup EXIT
# The log dirs of the brokers started here go on a tmpfs (/dev/shm) when it has 4 GiB free, so
# that no broker waits on the disk behind the build's gigabytes of writeback. What the tests prove
# does not depend on the disk: they kill processes, never the machine. (It did not end the
# single broker's stalls after the build: see the Prometheus test below.) Not when a broker of
# this checkout runs already (one started elsewhere keeps its log dirs where they are, and a
# bounce by the tests must find them there).
if [ -z "${KAFKA_LOG_ROOT:-}" ] && [ -d /dev/shm ] && ! pgrep -f "$ROOT/.kafka/.*properties" >/dev/null \
  && [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')" -gt $((4 * 1024 * 1024)) ] 2>/dev/null; then
  log_root=$(mktemp -d /dev/shm/price-alerts-kafka.XXXXXX)
  export KAFKA_LOG_ROOT=$log_root
fi
if [ -z "${DATABASE_URL:-}" ]; then
  if ! scripts/postgres.sh status >/dev/null 2>&1; then
    scripts/postgres.sh up >/dev/null
    pg_started=1
  fi
  DATABASE_URL=$(scripts/postgres.sh url)
  export DATABASE_URL
fi
# Each broker is started here when none answers (and stopped again at the end); one that was
# already running is reused and left alone. They all start before any test runs: on 2026-12-02
# one fresh-clone run failed 4 tests while five broker JVMs started beside the tests (issue 19).
# Running, they cost little: over a whole suite (2026-12-03, 9.4 min) the single broker used 81
# CPU seconds, the secured one 67, the cluster's 21, 53 and 64 (printed at the end of each run).
scripts/kafka.sh classpath >/dev/null
start_brokers() { # single | cluster | secure ...
  local pids=() which
  for which in "$@"; do
    case $which in
      single) if ! scripts/kafka.sh status >/dev/null 2>&1; then started=1; scripts/kafka.sh up & pids+=($!); fi ;;
      cluster) if ! scripts/kafka.sh status --brokers 3 >/dev/null 2>&1; then cluster_started=1; scripts/kafka.sh up --brokers 3 & pids+=($!); fi ;;
      secure) if ! scripts/kafka.sh status --secure >/dev/null 2>&1; then secure_started=1; scripts/kafka.sh up --secure & pids+=($!); fi ;;
    esac
  done
  local pid rc=0
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" || rc=1; done
  return $rc
}

SECONDS=0
# Two test threads: the machine has two cores and each broker test runs clients of its own.
# Skipped by name, to keep the suite's time: the all-stage chaos run with a coordinator kill
# (about five minutes), and three of tests/coordinator.rs's cases (a coordinator gone from the
# metadata or bounced, and alert-deliver's kill: they pass). The suite keeps the pipeline's kill
# and 60 s freeze, alert-deliver's freeze, and the offsets clients' freeze. Run them by hand: the
# test files say how.
skipped=(a_coordinator_kill_leaves_no_instance_stuck
  pipeline_heals_when_send_offsets_starts_after_the_group_coordinator_is_gone
  pipeline_heals_after_a_hard_bounce_of_the_group_coordinator_inside_send_offsets
  deliver_hand_offs_heal_after_a_sigkill_of_the_group_coordinator_inside_send_offsets)
skip_args=()
for t in "${skipped[@]}"; do skip_args+=(--skip "$t"); done
run_tests() { cargo test --locked --workspace --no-fail-fast "$@" -- --include-ignored --test-threads=2 "${skip_args[@]}"; }
if [ $# -gt 0 ]; then
  # A selection (e.g. --test pipeline): every broker up, one run.
  start_brokers single cluster secure
  eval "$(scripts/kafka.sh env --secure)"
  cargo build --locked --workspace --all-targets
  run_tests "$@"
  echo "test.sh: all tests passed in ${SECONDS}s"
  exit 0
fi
# The tests that need the 3-broker cluster; every other test file runs on the single broker (the
# security tests on the secured one).
cluster_tests=(chaos restore coordinator)
single_args=(--lib --bins)
for f in tests/*.rs bench/tests/*.rs; do
  name=$(basename "$f" .rs)
  [[ " ${cluster_tests[*]} " == *" $name "* ]] || single_args+=(--test "$name")
done
cluster_args=()
for name in "${cluster_tests[@]}"; do cluster_args+=(--test "$name"); done
# The three lanes run side by side: their tests mostly wait (for sessions to expire, brokers to
# answer, children to exit), so three cargo test processes of two threads each keep two cores
# busy. Until 2026-12-03 the cluster's tests ran after the others, alone with their three brokers
# (7.5 min after 8.6); beside them the suite takes the longest lane's time, 8.7-10.1 min. Lane A takes
# these long files, lane B everything else (a new file lands there). Their balance, measured:
# in a fresh-clone run on an idle machine (2026-12-02), lane A's files took 345 s and lane B's
# 450 s, so pipeline (42 s) moved to lane A. On 2026-12-03 (security grown by the stages' rights
# revoked while running) lane A's took 501 s and lane B's 370 s: pipeline, operability and topics
# (74 s) went back to lane B. Later that day, with Kafka's tools on class-data archives and two
# tests no longer waiting out a session and a transaction timeout, lane A's took 355 s and lane
# B's 524 s: oidc (86 s) moved to lane A.
lane_a_tests=(security failures replay oidc)
# tests/prometheus.rs (issue 21) runs in lane B. It used to take 134-505 s and load the machine
# for all of it (a 5-minute freeze, members that waited out session timeouts); it takes 55-90 s
# now, beside the other lanes too. Where its earlier form ran and failed: beside the other lanes
# (a load of 57, the broker stalled), after them on the same broker (it stalled under the
# suite's thousands of partitions), alone first (passed once, failed once, and added its
# minutes).
lane_a=() lane_b=()
set -- "${single_args[@]}"
while [ $# -gt 0 ]; do
  case $1 in
    --test)
      if [[ " ${lane_a_tests[*]} " == *" $2 "* ]]; then lane_a+=(--test "$2")
      else lane_b+=(--test "$2"); fi
      shift 2 ;;
    *) lane_b+=("$1"); shift ;;
  esac
done
logs=$(mktemp -d)
# Each lane's output goes to its own file, printed whole when the lane ends (interleaved output
# would be unreadable), followed by how long each test file took.
# Each test binary's start and each test's end are stamped with the time of day ("Running
# tests/x.rs (...) at 11:02:33", "test x ... ok at 11:03:10", as the pressure samples below): the
# timeline says which tests ran beside which, how long each took, and when the machine was busy.
run_lane() { # name args...
  local name=$1 rc=0; shift
  run_tests "$@" 2>&1 | while IFS= read -r line; do
    if [[ $line == *" Running "* || $line == "test "*" ... "* ]]; then printf '%s at %(%T)T\n' "$line" -1
    else printf '%s\n' "$line"; fi
  done >"$logs/$name.log" || rc=$?
  { echo "=== test.sh: lane $name (exit $rc)"; cat "$logs/$name.log"; } >&2
  return $rc
}
timings() {
  cat "$logs"/*.log 2>/dev/null | awk '/ Running /{f=$2; at=$NF} /test result/{print "  " f ": " $NF " (from " at ")"}' >&2 || true
}
# While the tests run, the machine's pressure (PSI, the share of the last 10 s in which tasks
# waited: for a CPU, for memory (all tasks at once), for I/O (all at once)) and load, every 2 s.
# Tests here fail when a broker goes silent for 15-30 s; when one fails, stall_report says whether
# the machine stalled at that time, and whether the brokers' JVMs paused themselves (gc.log).
# The three red runs of 2026-12-03 each had a load of 20-124 on the 2 cores for a minute, and the
# four green ones none: with more than 8 threads runnable (or waiting on I/O) at a sample, the
# sample also names the processes they belong to (command[pid]:threads), to find what piles up.
pressure_log=$logs/pressure.txt
sample_pressure() {
  [ -r /proc/pressure/memory ] || return 0
  local loadavg runnable
  while :; do
    read -r -a loadavg </proc/loadavg
    runnable=${loadavg[3]%/*}
    printf '%s load %s cpu-some %s mem-full %s io-full %s runnable %s' "$(date +%T)" "${loadavg[0]}" \
      "$(awk '/^some/ { sub("avg10=", "", $2); print $2 }' /proc/pressure/cpu)" \
      "$(awk '/^full/ { sub("avg10=", "", $2); print $2 }' /proc/pressure/memory)" \
      "$(awk '/^full/ { sub("avg10=", "", $2); print $2 }' /proc/pressure/io)" "$runnable"
    if [ "$runnable" -gt 8 ]; then
      local n pid
      while read -r n pid; do
        printf ' %s[%s]:%s' "$(cat "/proc/$pid/comm" 2>/dev/null)" "$pid" "$n"
      done < <(ps -eLo stat=,pid= 2>/dev/null | awk '$1 ~ /^[RD]/ { n[$2]++ } END { for (p in n) print n[p], p }' \
        | sort -rn | head -4)
    fi
    echo
    sleep 2
  done >"$pressure_log" 2>/dev/null
}
# A report only: nothing in it may end the script (under pipefail, `head` closing a pipe early
# makes the pipeline fail with SIGPIPE, and set -e would stop the suite before its timings).
stall_report() { # the gc.log files of the brokers (wiped with them when they stop)
  {
    echo "test.sh: samples with memory or I/O stalls (full avg10 >= 5%), a load above 20, or more than 8 threads runnable:"
    awk '$7 >= 5 || $9 >= 5 || $3 > 20 || $11 > 8' "$pressure_log" 2>/dev/null | head -40 || true
    local gc
    for gc in "$@"; do
      [ -f "$gc" ] || continue
      echo "test.sh: the longest pauses of the broker JVM in $gc (ms), and the longest stretches without one (s):"
      awk '/Total: [0-9]+ ns/ { match($0, /Total: [0-9]+ ns/); ns = substr($0, RSTART + 7, RLENGTH - 10); \
        printf "  %9.1f  %s\n", ns / 1e6, substr($1, 2, 23) }' "$gc" 2>/dev/null | sort -rn | head -5 || true
      # A JVM that is busy reaches a safepoint every second or so; a stretch of many seconds
      # that is not a whole number of them is a JVM that did not run (13.5 s seen, issue 19).
      awk '/Time since last: [0-9]+ ns/ { match($0, /Time since last: [0-9]+/); \
        s = substr($0, RSTART + 17, RLENGTH - 17) / 1e9; if (s > 5) printf "  %9.1f  until %s\n", s, substr($1, 2, 23) }' \
        "$gc" 2>/dev/null | sort -rn | head -5 || true
    done
  } >&2 || true
}
sample_pressure &
sampler_pid=$!

start_brokers single secure
eval "$(scripts/kafka.sh env --secure)"
cargo build --locked --workspace --all-targets
# The build just wrote gigabytes of test binaries; flush them before any broker test starts. In a
# fresh-clone run the single broker froze for 28 s right after the build (every thread silent,
# then fenced by its own controller), which fits its fsyncs waiting behind that writeback.
sync
# Then hand the build's page cache back and compact memory (root only; skipped otherwise). In three
# fresh-clone runs the single broker went silent for 15-30 s within minutes of the build, with its
# log dirs on a tmpfs, on a machine whose /proc/vmstat counts tens of thousands of direct
# compaction stalls: the build leaves about 16 GiB of cache on 23 GiB. Of the four fresh-clone runs
# with it (2026-12-02), three were green and the red one failed under CPU pressure, with no memory
# stall in the samples below; the broker's 13.5 s freezes were seen without a build (issue 19).
if [ -w /proc/sys/vm/drop_caches ]; then
  echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
  if [ -w /proc/sys/vm/compact_memory ]; then echo 1 >/proc/sys/vm/compact_memory 2>/dev/null || true; fi
fi
failed=0
# The cluster starts after the build, whose CPU and writeback it would otherwise share.
start_brokers cluster
broker_cpu() { # the CPU seconds each running broker of this checkout has used
  local f pid
  for f in .kafka/broker.pid .kafka/secure/broker.pid .kafka/cluster/broker-*/broker.pid; do
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -r "/proc/$pid/stat" ] || continue
    awk -v f="$f" -v hz="$(getconf CLK_TCK)" '{ printf "  %s: %.0f CPU s\n", f, ($14 + $15) / hz }' "/proc/$pid/stat"
  done >&2
}
run_lane a "${lane_a[@]}" & lane_a_pid=$!
run_lane cluster "${cluster_args[@]}" & cluster_pid=$!
run_lane b "${lane_b[@]}" || { echo "test.sh: lane b returned $?" >&2; failed=1; }
wait "$lane_a_pid" || { echo "test.sh: lane a returned $?" >&2; failed=1; }
wait "$cluster_pid" || { echo "test.sh: lane cluster returned $?" >&2; failed=1; }
echo "test.sh: broker CPU:" >&2
broker_cpu
if [ "$failed" = 1 ]; then stall_report .kafka/gc.log .kafka/secure/gc.log .kafka/cluster/broker-*/gc.log; fi
echo "test.sh: time per test file:" >&2
timings
if [ "$failed" = 1 ]; then
  echo "test.sh: some tests failed (${SECONDS}s)" >&2
  exit 1
fi
echo "test.sh: all tests passed in ${SECONDS}s"
