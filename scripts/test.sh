#!/usr/bin/env bash
# scripts/test.sh: runs every test of the project, the broker tests included, against a real
# single-node Apache Kafka. Starts the local broker (scripts/kafka.sh up) when none answers at
# KAFKA_BOOTSTRAP and stops it again at the end; a broker that was already running is reused and
# left alone. The chaos test (tests/chaos.rs) runs on the local 3-broker cluster
# (scripts/kafka.sh up --brokers 3), started and stopped the same way, in parallel with the single
# broker.
#
# Broker tests are #[ignore]d under a plain `cargo test` (no broker there); here they run with
# --include-ignored, so none is silently skipped.
#
# The secure tests (tests/security.rs) run on the local SECURED broker (scripts/kafka.sh up --secure:
# SASL_SSL, SCRAM users, ACLs), started and stopped the same way, in parallel with the others;
# KAFKA_SECURE_BOOTSTRAP, KAFKA_SECURE_DIR and KAFKA_SECURE_CA tell the tests where it is.
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

command -v cargo >/dev/null || { echo "test.sh: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
# promtool (the distribution's prometheus package) checks the alert rules; install it when we may.
if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing promtool (the prometheus package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "test.sh: promtool not found: install the prometheus package (apt-get install prometheus)" >&2
    exit 1
  fi
fi

# PostgreSQL for alert-sink's tests: the cluster of scripts/postgres.sh, started here when it is not
# running (and stopped again at the end); a DATABASE_URL given by the caller is used as it is.
started=0 cluster_started=0 secure_started=0 pg_started=0
cleanup() {
  if [ "$started" = 1 ]; then scripts/kafka.sh down --wipe >/dev/null || true; fi
  if [ "$cluster_started" = 1 ]; then scripts/kafka.sh down --brokers 3 --wipe >/dev/null || true; fi
  # --wipe: its certificates and passwords go with it.
  if [ "$secure_started" = 1 ]; then scripts/kafka.sh down --secure --wipe >/dev/null || true; fi
  if [ "$pg_started" = 1 ]; then scripts/postgres.sh down >/dev/null || true; fi
}
trap cleanup EXIT
if [ -z "${DATABASE_URL:-}" ]; then
  if ! scripts/postgres.sh status >/dev/null 2>&1; then
    scripts/postgres.sh up >/dev/null
    pg_started=1
  fi
  DATABASE_URL=$(scripts/postgres.sh url)
  export DATABASE_URL
fi
# The jars first (once), then the single broker and the cluster start side by side.
scripts/kafka.sh classpath >/dev/null
pids=()
if ! scripts/kafka.sh status >/dev/null 2>&1; then
  started=1
  scripts/kafka.sh up &
  pids+=($!)
fi
if ! scripts/kafka.sh status --brokers 3 >/dev/null 2>&1; then
  cluster_started=1
  scripts/kafka.sh up --brokers 3 &
  pids+=($!)
fi
if ! scripts/kafka.sh status --secure >/dev/null 2>&1; then
  secure_started=1
  scripts/kafka.sh up --secure &
  pids+=($!)
fi
for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid"; done
eval "$(scripts/kafka.sh env --secure)"

SECONDS=0
cargo build --locked --workspace --all-targets
# Two test threads: the machine has two cores and each broker test runs clients of its own.
cargo test --locked --workspace --no-fail-fast "$@" -- --include-ignored --test-threads=2
echo "test.sh: all tests passed in ${SECONDS}s"
