//! What the broker does with a topic's old records, and the settings of the state changelog's
//! compaction: a leaf, so that `topics` (which creates topics with them) and `changelog` (which
//! checks an existing changelog against them) both import it and not each other. The reasoning
//! behind the numbers is in [`super::changelog`].

use std::time::Duration;

/// `segment.ms` of a state changelog: how long the active segment, which the cleaner never
/// touches and a restore reads whole, collects changes before it rolls (module doc).
pub const STATE_SEGMENT_MS: Duration = Duration::from_secs(10 * 60);

/// `segment.bytes` of a state changelog: the active segment's size bound at high change rates.
pub const STATE_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

/// `min.cleanable.dirty.ratio` of a state changelog: clean once a tenth of the log is dirty.
pub const STATE_MIN_CLEANABLE_DIRTY_RATIO: f64 = 0.1;

/// What the broker does with a topic's old records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// `cleanup.policy=delete`: kept for the spec's `retention` (or the broker's default).
    Delete,
    /// `cleanup.policy=compact` with the broker's segment settings: for a topic whose keys are
    /// never written twice (the replay ledger), where small segments would buy nothing.
    Compact,
    /// `cleanup.policy=compact` for state that is read whole on every restore (the changelog):
    /// small segments and an eager cleaner, see the module doc.
    CompactedState,
    /// The live alerts' rules topic (`crate::rules::live`): compacted like state, stamped by the
    /// broker (LogAppendTime), and its history kept [`RULES_HISTORY`] before the cleaner may
    /// remove a superseded version, so that the oracle can still replay the last hour's join.
    RulesTable,
}

/// `min.compaction.lag.ms` of the rules topic: how long a superseded alert version or an old
/// barrier stays readable (the window in which `alert-verify --rules-topic` can predict the join).
pub const RULES_HISTORY: Duration = Duration::from_secs(3600);

impl Cleanup {
    /// The topic configs this cleanup stands for.
    pub(crate) fn configs(self) -> Vec<(&'static str, String)> {
        match self {
            Cleanup::Delete => Vec::new(),
            Cleanup::Compact => vec![("cleanup.policy", "compact".to_owned())],
            Cleanup::CompactedState => vec![
                ("cleanup.policy", "compact".to_owned()),
                ("segment.ms", STATE_SEGMENT_MS.as_millis().to_string()),
                ("segment.bytes", STATE_SEGMENT_BYTES.to_string()),
                (
                    "min.cleanable.dirty.ratio",
                    STATE_MIN_CLEANABLE_DIRTY_RATIO.to_string(),
                ),
            ],
            Cleanup::RulesTable => vec![
                ("cleanup.policy", "compact".to_owned()),
                ("message.timestamp.type", "LogAppendTime".to_owned()),
                (
                    "min.compaction.lag.ms",
                    RULES_HISTORY.as_millis().to_string(),
                ),
                ("segment.ms", STATE_SEGMENT_MS.as_millis().to_string()),
                (
                    "min.cleanable.dirty.ratio",
                    STATE_MIN_CLEANABLE_DIRTY_RATIO.to_string(),
                ),
            ],
        }
    }
}
