//! What an instance says and shows while the restore of its state is held by an undecided
//! transaction on the changelog ([`super::state`], "A restore held by an undecided transaction").
//!
//! Such a wait is not a stuck loop (the leader answers, every few seconds, that the transaction is
//! still open) and not a failure (nothing this instance does, a restart included, ends it). Before,
//! it ended in the watchdog's exit 75 (its 90 s bound is shorter than the restore's own, 140 s),
//! with nothing that named the transaction, and again at every restart. Now, while the read sees
//! the hold afresh ([`crate::kafka::read::WATCH_EVERY`]):
//!
//! | what                     | shows                                                                 |
//! |--------------------------|-----------------------------------------------------------------------|
//! | liveness (`/healthz`)    | 200, status "restoring, held" and what holds it: a beat at each sighting, so the watchdog does not fire |
//! | readiness (`/readyz`)    | 503, the same description as the reason                               |
//! | log                      | one WARN line per held partition at once, then every [`SAY_EVERY`]: topic, partition, last stable offset, high watermark, how long, and the runbook's `kafka-transactions` steps |
//! | metric                   | `alerts_restore_held_partitions`, 0 once none is                      |
//!
//! Only a fresh sighting beats: a read whose leader stops answering, or a call that never returns,
//! beats no more, and the watchdog ends the process as before. The hold ends when the restore of
//! its partition does (decided, or the partition revoked): the engine then calls
//! [`RestoreHolds::observed`] with what is still held.

use crate::kafka::read::Hold;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tracing::warn;

/// How often a held restore says so in the log: the operator wants to hear of it without
/// scrolling, and a line per partition every 10 s stays readable with a few dozen partitions.
pub const SAY_EVERY: Duration = Duration::from_secs(10);

/// The held partitions of one engine's restore, since when each is held, and when they were last
/// said.
#[derive(Debug)]
pub struct RestoreHolds {
    changelog: String,
    /// Partition -> (first sighting of this hold, latest sighting).
    held: BTreeMap<i32, (Instant, Hold)>,
    /// When the holds were last said in the log.
    said: Option<Instant>,
}

impl RestoreHolds {
    pub fn new(changelog: &str) -> Self {
        RestoreHolds {
            changelog: changelog.to_owned(),
            held: BTreeMap::new(),
            said: None,
        }
    }

    /// The partitions held now are `holds` (seen at `now`): a partition not among them is no longer
    /// held, one seen before keeps its start. Returns whether it is time to say them
    /// ([`RestoreHolds::say`]): at the first sighting of a hold, then every [`SAY_EVERY`].
    pub fn observed(&mut self, holds: &[Hold], now: Instant) -> bool {
        let mut held = BTreeMap::new();
        let mut new = false;
        for hold in holds {
            let since = match self.held.get(&hold.partition) {
                Some((since, _)) => *since,
                None => {
                    new = true;
                    now
                }
            };
            held.insert(hold.partition, (since, hold.clone()));
        }
        self.held = held;
        if self.held.is_empty() {
            self.said = None;
            return false;
        }
        new || self
            .said
            .is_none_or(|at| now.duration_since(at) >= SAY_EVERY)
    }

    /// How many partitions are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// What holds the restore, for `/healthz` and `/readyz` (`None` when nothing does).
    pub fn describe(&self, now: Instant) -> Option<String> {
        if self.held.is_empty() {
            return None;
        }
        let mut text = String::from("restoring, held by an undecided transaction:");
        for (i, (since, h)) in self.held.values().enumerate() {
            let _ = write!(
                text,
                "{} {} [{}]: last stable offset {} < high watermark {} for {} s",
                if i == 0 { "" } else { ";" },
                self.changelog,
                h.partition,
                h.last_stable,
                h.high_watermark,
                now.duration_since(*since).as_secs()
            );
        }
        text.push_str(" (docs/runbook.md, \"Restore held by an undecided transaction\")");
        Some(text)
    }

    /// One WARN line per held partition, with the runbook's steps filled in (the brokers' address
    /// and any client settings are the operator's: this says neither, secrets included).
    pub fn say(&mut self, now: Instant) {
        self.said = Some(now);
        for (since, h) in self.held.values() {
            warn!(
                changelog = %self.changelog,
                partition = h.partition,
                last_stable_offset = h.last_stable,
                high_watermark = h.high_watermark,
                held_s = now.duration_since(*since).as_secs(),
                find = format!(
                    "kafka-transactions.sh --bootstrap-server BROKERS find-hanging --broker-id {}",
                    h.leader
                ),
                abort = format!(
                    "kafka-transactions.sh --bootstrap-server BROKERS abort --topic {} --partition {} --start-offset {}",
                    self.changelog, h.partition, h.last_stable
                ),
                "restore held by an undecided transaction: not ready until it is decided (restarting does not help); \
                 see docs/runbook.md, \"Restore held by an undecided transaction\""
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(partition: i32, last_stable: i64) -> Hold {
        Hold {
            partition,
            leader: 1,
            last_stable,
            high_watermark: last_stable + 1,
        }
    }

    #[test]
    fn a_hold_is_said_at_once_then_every_ten_seconds() {
        let mut h = RestoreHolds::new("app-state");
        let t0 = Instant::now();
        assert!(!h.observed(&[], t0), "nothing held, nothing to say");
        assert!(h.observed(&[hold(0, 5)], t0), "a new hold");
        h.say(t0);
        assert!(!h.observed(&[hold(0, 5)], t0 + Duration::from_secs(2)));
        assert!(!h.observed(&[hold(0, 5)], t0 + Duration::from_secs(9)));
        assert!(h.observed(&[hold(0, 5)], t0 + SAY_EVERY));
        h.say(t0 + SAY_EVERY);
        assert!(
            h.observed(&[hold(0, 5), hold(3, 7)], t0 + Duration::from_secs(12)),
            "another partition held: said at once"
        );
    }

    #[test]
    fn a_hold_keeps_its_start_until_it_ends() {
        let mut h = RestoreHolds::new("app-state");
        let t0 = Instant::now();
        h.observed(&[hold(0, 5), hold(1, 2)], t0);
        h.observed(&[hold(0, 5), hold(1, 2)], t0 + Duration::from_secs(30));
        assert_eq!(
            h.describe(t0 + Duration::from_secs(31)).as_deref(),
            Some(
                "restoring, held by an undecided transaction: app-state [0]: last stable offset 5 < \
                 high watermark 6 for 31 s; app-state [1]: last stable offset 2 < high watermark 3 \
                 for 31 s (docs/runbook.md, \"Restore held by an undecided transaction\")"
            )
        );
        // Partition 1 decided (or revoked): gone; partition 0 keeps its start.
        h.observed(&[hold(0, 5)], t0 + Duration::from_secs(40));
        assert_eq!(h.len(), 1);
        let text = h.describe(t0 + Duration::from_secs(41)).unwrap();
        assert!(
            text.contains("[0]: last stable offset 5 < high watermark 6 for 41 s"),
            "{text}"
        );
        assert!(!text.contains("[1]"), "{text}");
        // Held again later: a new hold, from then.
        h.observed(&[], t0 + Duration::from_secs(50));
        assert!(h.is_empty());
        assert_eq!(h.describe(t0 + Duration::from_secs(50)), None);
        assert!(h.observed(&[hold(0, 9)], t0 + Duration::from_secs(60)));
        let text = h.describe(t0 + Duration::from_secs(61)).unwrap();
        assert!(text.contains("for 1 s"), "{text}");
    }
}
