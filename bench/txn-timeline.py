#!/usr/bin/env python3
"""Where a transaction's time goes, from librdkafka's own debug log (issue 11's timeline).

Reads the stderr of a run with `RUST_LOG=price_alerts=debug,librdkafka=debug` and
`-X debug=eos,protocol`, finds each committed transaction of the transactional producer, and prints
percentiles of its steps:

    begin ─► first partition registered (AddPartitionsToTxn, with its CONCURRENT_TRANSACTIONS
             retries) ─► first ProduceRequest ─► send_offsets_to_transaction called ─► returned
             (AddOffsetsToTxn + TxnOffsetCommit) ─► commit_transaction called (the drain before
             it) ─► returned (EndTxn)

For the pipeline:
    RUST_LOG=price_alerts=debug,librdkafka=debug target/release/alert-pipeline ... \
        -X debug=eos,protocol 2>eos.log
    bench/txn-timeline.py eos.log

The debug log slows the client, so its times are upper bounds. Only the standard library is used.
"""

import re
import sys
from datetime import datetime

STAMP = "%Y-%m-%dT%H:%M:%S.%f"


def millis(line):
    """The log line's timestamp (tracing's RFC 3339, microseconds, UTC) in milliseconds."""
    return datetime.strptime(line[:26], STAMP).timestamp() * 1000.0


def transactions(lines):
    """Each committed transaction as a dict of step -> time (ms), plus its counts."""
    done, cur = [], None
    for line in lines:
        if "begin_transaction return" in line:
            cur = {"begin": millis(line), "concurrent": 0}
            continue
        if cur is None:
            continue
        if "another concurrent operation on the same transaction" in line:
            cur["concurrent"] += 1
        elif "registered with transaction" in line:
            cur.setdefault("registered", millis(line))
        elif "Sent ProduceRequest" in line:
            cur.setdefault("produce", millis(line))
        elif "called: send_offsets_to_transaction" in line:
            cur["offsets"] = millis(line)
        elif "send_offsets_to_transaction return" in line:
            cur["offsets_done"] = millis(line)
        elif "called: commit_transaction" in line:
            cur["commit"] = millis(line)
        elif "commit_transaction return" in line:
            cur["end"] = millis(line)
            done.append(cur)
            cur = None
        m = re.search(r"transaction committed records=(\d+) notifications=(\d+)", line)
        if m and done:
            done[-1]["records"] = int(m.group(1))
            done[-1]["notifications"] = int(m.group(2))
    return done


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100.0 * (len(values) - 1))))]


STEPS = [
    ("registration: begin -> first partition registered", "begin", "registered"),
    ("begin -> first ProduceRequest", "begin", "produce"),
    ("processing: begin -> send_offsets called", "begin", "offsets"),
    ("send_offsets (AddOffsetsToTxn + TxnOffsetCommit)", "offsets", "offsets_done"),
    ("drain: send_offsets returned -> commit called", "offsets_done", "commit"),
    ("EndTxn: commit called -> returned", "commit", "end"),
    ("whole transaction: begin -> commit returned", "begin", "end"),
]


def main(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        txns = transactions(f)
    if not txns:
        sys.exit(f"{path}: no committed transaction found (was the log taken with debug=eos?)")
    conc = sum(1 for t in txns if t["concurrent"])
    print(f"{len(txns)} committed transactions; CONCURRENT_TRANSACTIONS answered in {conc}")
    print(f"{'step (ms)':52} {'n':>4} {'p50':>8} {'p90':>8} {'max':>8}")
    for name, a, b in STEPS:
        xs = [t[b] - t[a] for t in txns if a in t and b in t]
        if xs:
            print(f"{name:52} {len(xs):4} {percentile(xs, 50):8.1f} {percentile(xs, 90):8.1f} {max(xs):8.1f}")
    for key in ("records", "notifications"):
        xs = [t[key] for t in txns if key in t]
        if xs:
            print(f"{key + ' per transaction':52} {len(xs):4} {percentile(xs, 50):8.0f} {percentile(xs, 90):8.0f} {max(xs):8.0f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench/txn-timeline.py LOG")
    main(sys.argv[1])
