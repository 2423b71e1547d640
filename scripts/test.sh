#!/usr/bin/env bash
# scripts/test.sh: runs every test of the project, the broker tests included, against a real
# single-node Apache Kafka. Starts the local broker (scripts/kafka.sh up) when none answers at
# KAFKA_BOOTSTRAP and stops it again at the end; a broker that was already running is reused and
# left alone.
#
# Broker tests are #[ignore]d under a plain `cargo test` (no broker there); here they run with
# --include-ignored, so none is silently skipped.
#
# alert-sink's tests need PostgreSQL too: scripts/postgres.sh up when it is not running (stopped
# again at the end), unless DATABASE_URL names a server already.
#
# Environment: KAFKA_BOOTSTRAP (default 127.0.0.1:9092), DATABASE_URL (default the cluster of
# scripts/postgres.sh); extra arguments go to `cargo test`
# before `--` (e.g. scripts/test.sh --test pipeline).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
export KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}

command -v cargo >/dev/null || { echo "test.sh: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }

started=0
if ! scripts/kafka.sh status >/dev/null 2>&1; then
  scripts/kafka.sh up
  started=1
fi
# PostgreSQL for alert-sink's tests: the cluster of scripts/postgres.sh, started here when it is not
# running (and stopped again at the end); a DATABASE_URL given by the caller is used as it is.
pg_started=0
if [ -z "${DATABASE_URL:-}" ]; then
  if ! scripts/postgres.sh status >/dev/null 2>&1; then
    scripts/postgres.sh up >/dev/null
    pg_started=1
  fi
  DATABASE_URL=$(scripts/postgres.sh url)
  export DATABASE_URL
fi
cleanup() {
  if [ "$started" = 1 ]; then scripts/kafka.sh down --wipe >/dev/null || true; fi
  if [ "$pg_started" = 1 ]; then scripts/postgres.sh down >/dev/null || true; fi
}
trap cleanup EXIT

SECONDS=0
cargo build --locked --all-targets
# Two test threads: the machine has two cores and each broker test runs clients of its own.
cargo test --locked --no-fail-fast "$@" -- --include-ignored --test-threads=2
echo "test.sh: all tests passed in ${SECONDS}s"
