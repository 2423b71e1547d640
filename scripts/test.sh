#!/usr/bin/env bash
# scripts/test.sh: runs every test of the project, the broker tests included, against a real
# single-node Apache Kafka. Starts the local broker (scripts/kafka.sh up) when none answers at
# KAFKA_BOOTSTRAP and stops it again at the end; a broker that was already running is reused and
# left alone.
#
# Broker tests are #[ignore]d under a plain `cargo test` (no broker there); here they run with
# --include-ignored, so none is silently skipped.
#
# Environment: KAFKA_BOOTSTRAP (default 127.0.0.1:9092); extra arguments go to `cargo test`
# before `--` (e.g. scripts/test.sh --test pipeline).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
export KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}

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

started=0
if ! scripts/kafka.sh status >/dev/null 2>&1; then
  scripts/kafka.sh up
  started=1
fi
cleanup() {
  if [ "$started" = 1 ]; then scripts/kafka.sh down --wipe >/dev/null || true; fi
}
trap cleanup EXIT

SECONDS=0
cargo build --locked --workspace --all-targets
# Two test threads: the machine has two cores and each broker test runs clients of its own.
cargo test --locked --workspace --no-fail-fast "$@" -- --include-ignored --test-threads=2
echo "test.sh: all tests passed in ${SECONDS}s"
