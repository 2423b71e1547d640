#!/usr/bin/env bash
# scripts/demo.sh: the project's main job on the local broker, end to end.
#   1. txn-demo: the commit/abort experiment (read_committed 5 vs read_uncommitted 10, then 10/15
#      after a restart that redoes the aborted batch).
#   2. The pipeline: generate a seeded tick stream, run alert-pipeline over it until it idles,
#      and check the output with the verifier (expected, found, missing, duplicate, unexpected).
# Starts the broker (scripts/kafka.sh up) if none answers; leaves it running.
# Environment: KAFKA_BOOTSTRAP (default 127.0.0.1:9092), TICKS (10000), SYMBOLS (50).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
export KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}
TICKS=${TICKS:-10000}
SYMBOLS=${SYMBOLS:-50}

scripts/kafka.sh status >/dev/null 2>&1 || scripts/kafka.sh up
cargo build --locked --release --bins
BIN="$ROOT/target/release"
export RUST_LOG=${RUST_LOG:-warn}

echo "== 1. Kafka transactions: commit versus abort =="
"$BIN/txn-demo"

echo
echo "== 2. The exactly-once pipeline over $TICKS ticks of $SYMBOLS symbols =="
run="demo-$(date +%s)-$$"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN/tick-gen" --topic "$run-market-updates" --partitions 6 --symbols "$SYMBOLS" --ticks "$TICKS" \
  --stale-every 97 --rules-out "$work/rules.toml"
"$BIN/alert-pipeline" --rules "$work/rules.toml" --app-id "$run" --input "$run-market-updates" \
  --output "$run-notifications" --exit-when-idle 3s
"$BIN/alert-verify" --rules "$work/rules.toml" --input "$run-market-updates" --output "$run-notifications"
echo
echo "demo.sh: done; topics of this run start with $run-. The broker keeps running: scripts/kafka.sh down"
