#!/usr/bin/env bash
# bench/compare.sh: our producer (producer-bench: librdkafka through rust-rdkafka) against Kafka's own
# org.apache.kafka.tools.ProducerPerformance (the Java client) with the same settings, on the same
# broker, interleaved run by run, and one table of the medians.
#
# Same settings on both sides: record size and count, warm-up records, partitions, acks,
# enable.idempotence, linger.ms, batch.size, max.in.flight.requests.per.connection, the unsent-data
# bound (buffer.memory in Java, queue.buffering.max.kbytes in librdkafka), and for the
# transactional mode a transactional id and the commit interval (--transaction-duration-ms on
# the Java side). Those values are read from bench/src/producer/mode.rs, so the two sides cannot drift
# apart.
#
# Interleaving: for each round, for each size, for each mode, one run of ours and one of theirs
# (who goes first alternates by round), each with a fresh topic. A slow minute on a shared machine
# then hits both clients and every mode alike; the table reports the median of the rounds, and the
# paired ratios (each round's run over the same side's idempotent run of that round), which cancel
# most of the drift between rounds.

#
# Usage:
#   bench/compare.sh               run, then print the table (also saved as OUT/compare.txt)
#   bench/compare.sh --table DIR   print the table of an earlier run's folder again
# Environment (defaults in brackets):
#   KAFKA_BOOTSTRAP  broker [127.0.0.1:9092]
#   ROUNDS           runs per side, mode and size [3]
#   SIZES            record sizes in bytes, space-separated [100 1024]
#   RECORDS          measured records per run, one per size [1000000 300000]
#   MODES            plain, idempotent, txn-N (transactional, commit every N ms), overlap-N (ours
#                    only: transactional with the commit overlapped, two producers)
#                    [plain idempotent txn-100]
#   PARTITIONS       partitions per topic [3]
#   WARMUP           warm-up records per run, not measured [10000]
#   OUT              where the raw samples, logs and the table go [bench/out/compare-<time>]
#   JAVA             java binary [java]
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)
KAFKA_SH="$ROOT/scripts/kafka.sh"
MODE_RS="$ROOT/bench/src/producer/mode.rs"

KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:9092}
export KAFKA_BOOTSTRAP
ROUNDS=${ROUNDS:-3}
read -r -a SIZES <<<"${SIZES:-100 1024}"
read -r -a RECORDS <<<"${RECORDS:-1000000 300000}"
read -r -a MODES <<<"${MODES:-plain idempotent txn-100}"
PARTITIONS=${PARTITIONS:-3}
WARMUP=${WARMUP:-10000}
OUT=${OUT:-$ROOT/bench/out/compare-$(date +%Y%m%d-%H%M%S)}
JAVA=${JAVA:-java}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN="$TARGET_DIR/release/producer-bench"

log() { printf 'compare.sh: %s\n' "$*" >&2; }
die() { printf 'compare.sh: error: %s\n' "$*" >&2; exit 1; }

# A `pub const NAME: u32 = VALUE;` of bench/src/producer/mode.rs (underscores dropped).
rust_const() {
  local v
  v=$(sed -n "s/^pub const $1: u32 = \([0-9_]*\);.*/\1/p" "$MODE_RS" | tr -d _)
  [[ $v =~ ^[0-9]+$ ]] || die "cannot read $1 from $MODE_RS"
  echo "$v"
}
LINGER_MS=$(rust_const LINGER_MS)
BATCH_SIZE=$(rust_const BATCH_SIZE)
MAX_IN_FLIGHT=$(rust_const MAX_IN_FLIGHT)
QUEUE_KBYTES=$(rust_const QUEUE_KBYTES)

# ---------------------------------------------------------------------------------------------
# The table: medians per side, mode and size.

print_table() { # prints the table of $OUT/samples.tsv and saves it as $OUT/compare.txt
  local table librdkafka java_client
  table=$(awk -F'\t' '
    # median of the space-separated numbers in list
    function median(list,   n, i, j, t, v) {
      n = split(list, v, " ")
      if (n == 0) return ""
      for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > t + 0; j--) v[j + 1] = v[j]; v[j + 1] = t }
      return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    function add(key, x) { samples[key] = samples[key] (samples[key] == "" ? "" : " ") x }
    # per round: this mode over the same side'"'"'s idempotent run of the same round and size
    function paired(side, mode, size,   r, list) {
      list = ""
      for (r = 1; r <= rounds; r++) {
        if ((side, mode, size, r) in value && (side, "idempotent", size, r) in value && value[side, "idempotent", size, r] > 0)
          list = list (list == "" ? "" : " ") value[side, mode, size, r] / value[side, "idempotent", size, r]
      }
      return list == "" ? "-" : sprintf("%.3f", median(list))
    }
    NR > 1 {
      # modes and sizes in the order they were first run
      if (!($2 in seen_mode)) { seen_mode[$2] = 1; M[++nm] = $2 }
      if (!($3 in seen_size)) { seen_size[$3] = 1; S[++ns] = $3 }
      add($1 SUBSEP $2 SUBSEP $3, $5); count[$1, $2, $3]++
      value[$1, $2, $3, $4] = $5; if ($4 + 0 > rounds) rounds = $4 + 0
    }
    END {
      printf "%-13s %6s %5s %14s %14s %12s %11s %11s %13s %13s\n", "mode", "size", "runs", "ours rec/s", "theirs rec/s",
        "ours/theirs", "ours /idem", "theirs /idem", "ours paired", "theirs paired"
      for (s = 1; s <= ns; s++) for (m = 1; m <= nm; m++) {
        o = median(samples["ours" SUBSEP M[m] SUBSEP S[s]]); t = median(samples["theirs" SUBSEP M[m] SUBSEP S[s]])
        oi = median(samples["ours" SUBSEP "idempotent" SUBSEP S[s]]); ti = median(samples["theirs" SUBSEP "idempotent" SUBSEP S[s]])
        # overlap-N has no Java counterpart: its theirs columns stay empty
        printf "%-13s %4d B %5d %14.0f %14s %12s %11s %11s %13s %13s\n", M[m], S[s], count["ours", M[m], S[s]], o,
          (t != "" ? sprintf("%.0f", t) : "-"), (t > 0 ? sprintf("%.3f", o / t) : "-"),
          (oi > 0 ? sprintf("%.3f", o / oi) : "-"), (t != "" && ti > 0 ? sprintf("%.3f", t / ti) : "-"),
          paired("ours", M[m], S[s]), (t != "" ? paired("theirs", M[m], S[s]) : "-")
      }
    }' "$SAMPLES")
  librdkafka=$(sed -n 's/.*"librdkafka_version": "\([^"]*\)".*/\1/p' "$OUT"/ours-*/results.json | head -n 1)
  java_client=$(find "$ROOT/.kafka/jars" -name 'kafka-clients-*.jar' 2>/dev/null | head -n 1)
  java_client=$(basename "${java_client:-unknown}" .jar)
  {
    echo "ours = producer-bench (librdkafka $librdkafka), theirs = ProducerPerformance (${java_client})"
    echo "(/idem: median over the idempotent median; paired: median over rounds of the ratio to the same side's idempotent run of that round)"
    echo "median records/s of $(awk -F'\t' 'NR > 1 && $4 + 0 > r { r = $4 + 0 } END { print r + 0 }' "$SAMPLES") interleaved rounds; $(cat "$OUT/settings.txt" 2>/dev/null || echo "settings unknown")"
    echo "$table"
  } | tee "$OUT/compare.txt"
}


if [[ ${1:-} == --table ]]; then
  [[ -n ${2:-} && -f $2/samples.tsv ]] || die "usage: bench/compare.sh --table DIR (a folder with samples.tsv)"
  OUT=$2
  SAMPLES="$OUT/samples.tsv"
  print_table
  exit 0
elif (($#)); then
  die "unknown argument '$1' (settings are environment variables; see the top of this script)"
fi

# ---------------------------------------------------------------------------------------------
# Checks

((${#SIZES[@]} == ${#RECORDS[@]})) || die "SIZES has ${#SIZES[@]} sizes but RECORDS ${#RECORDS[@]} counts: give one count per size"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
for m in "${MODES[@]}"; do
  [[ $m == plain || $m == idempotent || $m =~ ^(txn|overlap)-[1-9][0-9]*$ ]] \
    || die "unknown mode '$m' (plain, idempotent, txn-N or overlap-N with N the commit interval in ms)"
done
command -v "$JAVA" >/dev/null 2>&1 || die "java not found (Java 17+ is needed for ProducerPerformance; or set JAVA)"

if ! status=$("$KAFKA_SH" status 2>&1); then
  die "no Kafka broker answers at $KAFKA_BOOTSTRAP ($(tail -n 1 <<<"$status")): start one with scripts/kafka.sh up"
fi

log "building producer-bench (release)"
(cd "$ROOT" && cargo build --release --quiet -p price-alerts-bench --bin producer-bench) || die "cargo build --release failed"
[[ -x $BIN ]] || die "$BIN missing after the build (CARGO_TARGET_DIR?)"
CP=$("$KAFKA_SH" classpath) || die "scripts/kafka.sh classpath failed"

mkdir -p "$OUT"
echo "linger.ms=$LINGER_MS batch.size=$BATCH_SIZE max.in.flight=$MAX_IN_FLIGHT buffer=${QUEUE_KBYTES} KiB, $PARTITIONS partitions, warm-up $WARMUP" >"$OUT/settings.txt"
SAMPLES="$OUT/samples.tsv"
printf 'side\tmode\tsize\tround\trecords_per_s\n' >"$SAMPLES"
RUN_ID=$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
JAVA_PREFIX="pbcmp-$RUN_ID-java-"

topic_tool() { "$JAVA" -cp "$CP" org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" "$@"; }

cleanup() {
  # The Java runs' topics (ours delete their own); a regex matches all of this run's.
  topic_tool --delete --if-exists --topic "${JAVA_PREFIX}.*" >/dev/null 2>&1 \
    || log "could not delete topics ${JAVA_PREFIX}*: delete them by hand"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------------------------
# One run of each side; each appends one sample and prints its records/s.

ours() { # MODE SIZE RECORDS ROUND
  local mode=$1 size=$2 records=$3 round=$4 dir rps
  local -a sel
  case $mode in
    plain | idempotent) sel=(--modes "$mode") ;;
    txn-*) sel=(--modes transactional --commit-intervals "${mode#txn-}ms") ;;
    overlap-*) sel=(--modes overlapped --commit-intervals "${mode#overlap-}ms") ;;
  esac
  dir="$OUT/ours-$mode-${size}b-r$round"
  if ! "$BIN" --bootstrap "$KAFKA_BOOTSTRAP" --sizes "$size" --records "$records" --warmup "$WARMUP" \
    --partitions "$PARTITIONS" --repeats 1 "${sel[@]}" --out-dir "$dir" >"$dir.log" 2>&1; then
    tail -n 20 "$dir.log" >&2
    die "producer-bench failed ($mode, $size B); log in $dir.log"
  fi
  rps=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                 { print $col["records_per_s_median"]; exit }' "$dir/summary.csv")
  [[ -n $rps ]] || die "no records/s in $dir/summary.csv"
  printf 'ours\t%s\t%s\t%s\t%s\n' "$mode" "$size" "$round" "$rps" >>"$SAMPLES"
  echo "$rps"
}

theirs() { # MODE SIZE RECORDS ROUND
  local mode=$1 size=$2 records=$3 round=$4 topic logf rps
  topic="${JAVA_PREFIX}$mode-${size}b-r$round"
  logf="$OUT/theirs-$mode-${size}b-r$round.log"
  topic_tool --create --topic "$topic" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null \
    || die "creating topic $topic failed"
  local -a props=(
    "linger.ms=$LINGER_MS"
    "batch.size=$BATCH_SIZE"
    "max.in.flight.requests.per.connection=$MAX_IN_FLIGHT"
    "buffer.memory=$((QUEUE_KBYTES * 1024))"
  )
  local -a txn=()
  case $mode in
    plain) props+=(acks=1 enable.idempotence=false) ;;
    idempotent) props+=(acks=all enable.idempotence=true) ;;
    txn-*)
      props+=(acks=all enable.idempotence=true)
      txn=(--transactional-id "$topic" --transaction-duration-ms "${mode#txn-}")
      ;;
  esac
  # --num-records counts the warm-up too; the steady-state line covers the RECORDS after it.
  local -a warm=()
  ((WARMUP > 0)) && warm=(--warmup-records "$WARMUP")
  if ! "$JAVA" -cp "$CP" org.apache.kafka.tools.ProducerPerformance --bootstrap-server "$KAFKA_BOOTSTRAP" \
    --topic "$topic" --num-records $((records + WARMUP)) --record-size "$size" --throughput -1 \
    ${warm[@]+"${warm[@]}"} ${txn[@]+"${txn[@]}"} --command-property "${props[@]}" >"$logf" 2>&1; then
    tail -n 20 "$logf" >&2
    die "ProducerPerformance failed ($mode, $size B); log in $logf"
  fi
  local pattern='records sent, '
  ((WARMUP > 0)) && pattern='steady state records sent, '
  rps=$(grep -F "$pattern" "$logf" | tail -n 1 | sed -n 's/.* records sent, \([0-9.]*\) records\/sec.*/\1/p')
  [[ -n $rps ]] || die "no records/sec line in $logf"
  printf 'theirs\t%s\t%s\t%s\t%s\n' "$mode" "$size" "$round" "$rps" >>"$SAMPLES"
  echo "$rps"
}

# ---------------------------------------------------------------------------------------------
# The interleaved schedule

log "settings: linger.ms=$LINGER_MS batch.size=$BATCH_SIZE max.in.flight=$MAX_IN_FLIGHT buffer=${QUEUE_KBYTES} KiB partitions=$PARTITIONS warm-up=$WARMUP rounds=$ROUNDS"
log "output in $OUT"
start=$(date +%s)
for ((round = 1; round <= ROUNDS; round++)); do
  for i in "${!SIZES[@]}"; do
    size=${SIZES[$i]}
    records=${RECORDS[$i]}
    for mode in "${MODES[@]}"; do
      if ((round % 2 == 1)); then order=(ours theirs); else order=(theirs ours); fi
      # The Java client has no overlapped mode: overlap-N runs on our side only.
      [[ $mode == overlap-* ]] && order=(ours)
      for side in "${order[@]}"; do
        rps=$("$side" "$mode" "$size" "$records" "$round")
        log "round $round/$ROUNDS  $(printf '%-10s %5s B  %-6s %12.0f records/s' "$mode" "$size" "$side" "$rps")"
      done
    done
  done
done
log "done in $(($(date +%s) - start)) s"

print_table
