//! The DLQ tooling behind `dlq-replay`: replaying dead letters exactly once and inspecting a DLQ.
//! The replay ledger and the backlog watcher that gives the pipeline and the deliverer their DLQ
//! gauges live below, in [`crate::dlq`], where the stages take them from.
//!
//! Progress is kept per dead letter, in a replay ledger beside the DLQ, not as a consumer
//! group's offsets: an offset can only say "everything before here", which made a filtered replay
//! commit past the dead letters it did not select and left them unreplayable for good. With the
//! ledger a dead letter is *handled* iff it has an entry, a filter takes exactly what it selects,
//! and every reader (replay, inspect, watcher) agrees on what is left.
//!
//! In data-flow order:
//! - [`select`]: which dead letters a command takes (class, subscriber, partition, offset range); unknown
//!   classes refused with the known ones.
//! - [`crate::dlq::ledger`]: the ledger topic `<dlq>.replayed`, its keys and entries, reading it.
//! - [`run`]: `replay`: fence, read the ledger, scan the DLQ, copy and record in one transaction.
//! - [`inspect`]: `inspect`: counts by class and source partition, handled or not, ages, samples.
//! - [`crate::dlq::watch`]: the backlog watcher: tails the DLQ and the ledger, sets the DLQ gauges.

pub mod inspect;
pub mod run;
pub mod select;

pub use inspect::{inspect, InspectOptions, Inspection};
pub use run::{replay, ClassCounts, ReplayHooks, ReplayOptions, ReplayReport, DEFAULT_BATCH};
pub use select::{SelectError, Selection};

use rdkafka::message::BorrowedMessage;

/// The class of dead letter `m` (`unknown` without a `dlq.error.class` header).
fn class_of<'a>(m: &'a BorrowedMessage<'_>) -> &'a str {
    crate::dlq::header(m, "dlq.error.class").unwrap_or("unknown")
}

/// The subscriber of dead letter `m` (alert-deliver's `retry.subscriber`), if it has one.
fn subscriber_of<'a>(m: &'a BorrowedMessage<'_>) -> Option<&'a str> {
    crate::dlq::header(m, crate::deliver::buckets::SUBSCRIBER)
}

/// Milliseconds since the epoch, now (the ages of dead letters are measured against it).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An aligned text table: the first column to the left, the others (numbers) to the right.
fn table(titles: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..titles.len())
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(String::len)
                .chain([titles[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i == 0 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("  {cell:>w$}"));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut titles.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_align() {
        let t = super::table(
            &["class", "n"],
            &[
                vec!["poison".into(), "3".into()],
                vec!["permanent.empty".into(), "12".into()],
            ],
        );
        assert_eq!(
            t,
            "class             n\npoison            3\npermanent.empty  12\n"
        );
    }
}
