#!/usr/bin/env bash
# scripts/demo.sh: the project's main job on the local broker, end to end.
#   1. txn-demo: the commit/abort experiment (read_committed 5 vs read_uncommitted 10, then 10/15
#      after a restart that redoes the aborted batch).
#   2. The pipeline: generate a seeded tick stream, run alert-pipeline over it until it idles,
#      and check the output with the verifier (expected, found, missing, duplicate, unexpected).
#   3. alert-sink stores the pipeline's notifications in PostgreSQL (a database of this run's own);
#      the row count, a sample query, and the verifier comparing the table with the expected
#      notifications.
#   4. alert-deliver sends the notifications to three local subscribers (test-subscriber): one
#      accepts, one answers 503 for its first few seconds (the retry buckets, then delivery), one
#      answers 410 Gone (the parking lot); what each received, by Idempotency-Key, and what the
#      buckets and the parking lot hold (dlq-replay inspect).
#   5. Live alerts: alert-pipeline --live-rules runs while alert-rules loads a rules file and puts
#      a one-shot alert into the rules topic; the ticks that come after fire them, and the oracle
#      (alert-verify --rules-topic) checks the result from the two topics alone.
# Starts the broker (scripts/kafka.sh up) and PostgreSQL (scripts/postgres.sh up) if needed;
# leaves them running.
# Environment: KAFKA_BOOTSTRAP (default 127.0.0.1:9092), TICKS (10000), SYMBOLS (50), DATABASE_URL
# (default the cluster of scripts/postgres.sh), KAFKA_SH (default scripts/kafka.sh: the script
# whose broker is checked and started, e.g. another checkout's), FAIL_FOR (8s: how long the
# failing subscriber answers 503).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
export KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}
TICKS=${TICKS:-10000}
SYMBOLS=${SYMBOLS:-50}
FAIL_FOR=${FAIL_FOR:-8s}
KAFKA_SH=${KAFKA_SH:-scripts/kafka.sh}

command -v cargo >/dev/null || { echo "demo.sh: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
scripts/prereqs.sh
"$KAFKA_SH" status >/dev/null 2>&1 || "$KAFKA_SH" up
cargo build --locked --release --bins
BIN="$ROOT/target/release"
export RUST_LOG=${RUST_LOG:-warn}

echo "== 1. Kafka transactions: commit versus abort =="
"$BIN/txn-demo"

echo
echo "== 2. The exactly-once pipeline over $TICKS ticks of $SYMBOLS symbols =="
run="demo-$(date +%s)-$$"
work=$(mktemp -d)
subscribers_pid=
trap '[ -n "$subscribers_pid" ] && kill "$subscribers_pid" 2>/dev/null; rm -rf "$work"' EXIT
"$BIN/tick-gen" --topic "$run-market-updates" --partitions 6 --symbols "$SYMBOLS" --ticks "$TICKS" \
  --stale-every 97 --rules-out "$work/rules.toml"
"$BIN/alert-pipeline" --rules "$work/rules.toml" --app-id "$run" --input "$run-market-updates" \
  --output "$run-notifications" --exit-when-idle 3s
"$BIN/alert-verify" --rules "$work/rules.toml" --input "$run-market-updates" --output "$run-notifications"

echo
echo "== 3. Past Kafka's edge: the notifications into PostgreSQL (alert-sink) =="
# A database of this run's own on the local cluster (scripts/postgres.sh, started if needed), or on
# the server DATABASE_URL names.
admin_url=${DATABASE_URL:-$(scripts/postgres.sh up)}
db="${run//-/_}"
psql "$admin_url" -qc "CREATE DATABASE $db"
base=${admin_url%%\?*}
db_url="${base%/*}/$db"
DATABASE_URL="$db_url" "$BIN/alert-sink" --app-id "$run" --topic "$run-notifications" --exit-when-idle 3s
psql "$db_url" -c "SELECT count(*) AS rows, count(DISTINCT symbol) AS symbols, min(tick_ts) AS first, max(tick_ts) AS last FROM alerts"
top=$(psql "$db_url" -Atc "SELECT symbol FROM alerts GROUP BY symbol ORDER BY count(*) DESC, symbol LIMIT 1")
echo "Which alerts fired for $top today?"
psql "$db_url" -c "SELECT tick_ts, direction, threshold, previous_price, price, seq FROM alerts
                    WHERE symbol = '$top' AND tick_ts >= date_trunc('day', now()) ORDER BY seq, threshold LIMIT 10"
DATABASE_URL="$db_url" "$BIN/alert-verify" --rules "$work/rules.toml" --input "$run-market-updates" --table

echo
echo "== 4. To the subscribers' webhooks (alert-deliver): retry buckets, parking lot =="
# Three local subscribers in one process: steady accepts, flaky answers 503 for its first
# $FAIL_FOR (so its notifications go round the retry buckets, then are delivered), gone answers
# 410 (so its notifications are parked). It writes the subscriptions file once listening.
"$BIN/test-subscriber" --subscriber steady=accept --subscriber "flaky=fail-for:$FAIL_FOR" \
  --subscriber gone=status:410 --subscriptions-out "$work/subscriptions.toml" >"$work/received.txt" &
subscribers_pid=$!
for _ in $(seq 100); do [ -s "$work/subscriptions.toml" ] && break; sleep 0.1; done
[ -s "$work/subscriptions.toml" ] || { echo "demo.sh: test-subscriber did not start" >&2; exit 1; }
# Short buckets, so the retries fit the demo: 1 s, then 5 s, then 30 s (the sum well above the
# outage: nothing runs out of buckets into the DLQ). It stops once nothing is left to retry.
"$BIN/alert-deliver" --subscriptions "$work/subscriptions.toml" --app-id "$run" \
  --topic "$run-notifications" --buckets 1s,5s,30s --exit-when-idle 3s
kill -TERM "$subscribers_pid"
wait "$subscribers_pid"
subscribers_pid=
echo "What each subscriber received (keys are <notification id>/<subscriber>):"
cat "$work/received.txt"
for bucket in retry.1s retry.5s retry.30s parking-lot dlq; do
  echo
  echo "-- $run-notifications.$bucket (dlq-replay inspect)"
  "$BIN/dlq-replay" inspect --dlq "$run-notifications.$bucket" --show 1
done

echo
echo "== 5. Live alerts: alerts put while the pipeline runs fire on the ticks after them =="
live="$run-live"
"$BIN/alert-pipeline" --live-rules --app-id "$live" --input "$live-market-updates" \
  --output "$live-notifications" --partitions 3 --exit-when-idle 15s &
live_pid=$!
# The rules topic is made co-partitioned with the input, which the pipeline creates at start.
for _ in $(seq 100); do
  "$BIN/alert-rules" --app-id "$live" --input "$live-market-updates" list >/dev/null 2>&1 && break
  sleep 0.2
done
"$BIN/tick-gen" --symbols 5 --seed 7 --rules-only --rules-out "$work/live-rules.toml" >/dev/null
"$BIN/alert-rules" --app-id "$live" --input "$live-market-updates" load "$work/live-rules.toml"
# The first symbol of the file and its first threshold: a one-shot alert of its own beside them.
line=$(grep -m1 '^"' "$work/live-rules.toml")
first=$(cut -d'"' -f2 <<<"$line")
threshold=$(cut -d'"' -f4 <<<"$line")
"$BIN/alert-rules" --app-id "$live" --input "$live-market-updates" put "$first-once" \
  --symbol "$first" --threshold "$threshold" \
  --direction both --one-shot --subscriber ops-desk
"$BIN/alert-rules" --app-id "$live" --input "$live-market-updates" list
"$BIN/tick-gen" --topic "$live-market-updates" --symbols 5 --seed 7 --ticks 2000 >/dev/null
wait "$live_pid"
echo "One-shot alerts left in the table (0 once it fired: its tombstone went with its notification):"
"$BIN/alert-rules" --app-id "$live" --input "$live-market-updates" list | grep -c -- "-once " || true
"$BIN/alert-verify" --rules-topic "$live-rules" --input "$live-market-updates" --output "$live-notifications"

echo
echo "demo.sh: done; topics of this run start with $run-, its database is $db. The broker and"
echo "PostgreSQL keep running: scripts/kafka.sh down, scripts/postgres.sh down"
