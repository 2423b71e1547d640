//! The producer modes under test and the one set of batching settings they all share.
//!
//! A mode is what the comparison is about: how much does the exactly-once machinery cost?
//! - `plain`: acks=1, no idempotence: the cheapest way to hand records to Kafka.
//! - `idempotent`: acks=all, enable.idempotence=true: what every transactional producer already
//!   pays (the baseline transactions are compared against).
//! - `transactional`: idempotent plus a transaction committed every commit interval.
//! - `overlapped`: the same transactions, with the commit off the critical path: two transactional
//!   producers used alternately, so transaction n+1 is produced while n commits (see
//!   [`super::runner`] for the rules that keep it exactly-once).
//!
//! The client configurations come from [`KafkaConfig`] (the one place that builds them); this
//! module only adds the batching settings that must be equal in every mode and on the Java side
//! (`bench/compare.sh` passes the same values to ProducerPerformance), because librdkafka's and
//! the Java client's defaults differ and a comparison of defaults would measure the defaults.

use price_alerts::kafka::config::{KafkaConfig, DEFAULT_TRANSACTION_TIMEOUT};
use rdkafka::ClientConfig;
use std::fmt;
use std::time::Duration;

/// `linger.ms` of every mode: the Java client's default since Kafka 4.0 (KIP-1030) and
/// librdkafka's default (since 1.5), so neither client waits longer than the other to fill a
/// batch, and a 10 ms commit interval still leaves room for two linger periods.
pub const LINGER_MS: u32 = 5;

/// `batch.size` of every mode (bytes), 256 KiB: above Java's 16 KiB default, which holds only 15
/// records of 1 KB and would make both clients per-request bound, and below the largest batch
/// that both librdkafka (`message.max.bytes` 1,000,000) and the broker (1,048,588) accept, so
/// no client caps or splits it silently and the same value means the same thing on both sides.
pub const BATCH_SIZE: u32 = 262_144;

/// `max.in.flight.requests.per.connection` of every mode: the Java default and the most that
/// idempotence allows, so the plain mode gets no deeper pipeline than the modes it is compared to
/// (librdkafka's own default is 1,000,000).
pub const MAX_IN_FLIGHT: u32 = 5;

/// `queue.buffering.max.kbytes` of every mode: 32 MiB, the Java client's `buffer.memory` default
/// (compare.sh passes it as such). It bounds the unsent data a producer holds, and so how much a
/// transaction can enqueue before its commit has to wait for all of it; librdkafka's default
/// (1 GiB) would let a "100 ms" transaction of 1 KB records grow to 100 MB (its 100,000-message
/// cap) where Java's stops at 32 MB.
pub const QUEUE_KBYTES: u32 = 32_768;

/// The transaction timeout of the transactional mode: the project's default, far above the
/// longest commit interval measured.
pub const TRANSACTION_TIMEOUT: Duration = DEFAULT_TRANSACTION_TIMEOUT;

/// The kind of mode, as selected on the command line.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModeKind {
    Plain,
    Idempotent,
    /// One mode per commit interval.
    #[value(alias = "txn")]
    Transactional,
    /// Transactional, the commit overlapped with the next transaction; one mode per interval.
    #[value(alias = "overlap")]
    Overlapped,
}

/// One producer mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Plain,
    Idempotent,
    /// Commits when a transaction is at least this old (checked at each send, as
    /// ProducerPerformance's `--transaction-duration-ms` does) and at the end.
    Transactional {
        commit_interval: Duration,
    },
    /// As `Transactional`, but the commit runs beside the next transaction's production, on the
    /// other of two transactional producers.
    Overlapped {
        commit_interval: Duration,
    },
}

impl Mode {
    pub fn kind(self) -> ModeKind {
        match self {
            Mode::Plain => ModeKind::Plain,
            Mode::Idempotent => ModeKind::Idempotent,
            Mode::Transactional { .. } => ModeKind::Transactional,
            Mode::Overlapped { .. } => ModeKind::Overlapped,
        }
    }

    /// How many producers a run of this mode uses: two when commits overlap, else one.
    pub fn producers(self) -> usize {
        match self {
            Mode::Overlapped { .. } => 2,
            _ => 1,
        }
    }

    /// The commit interval of a transactional mode.
    pub fn commit_interval(self) -> Option<Duration> {
        match self {
            Mode::Transactional { commit_interval } | Mode::Overlapped { commit_interval } => {
                Some(commit_interval)
            }
            _ => None,
        }
    }

    /// A short label for tables, file rows and topic names: `plain`, `idempotent`, `txn-100ms`,
    /// `overlap-100ms`.
    pub fn label(self) -> String {
        match self {
            Mode::Plain => "plain".into(),
            Mode::Idempotent => "idempotent".into(),
            Mode::Transactional { commit_interval } => {
                format!("txn-{}ms", commit_interval.as_millis())
            }
            Mode::Overlapped { commit_interval } => {
                format!("overlap-{}ms", commit_interval.as_millis())
            }
        }
    }

    /// The producer configuration of this mode. `transactional_id` is used by the transactional
    /// mode only.
    pub fn producer_config(
        self,
        kafka: &KafkaConfig,
        transactional_id: &str,
    ) -> anyhow::Result<ClientConfig> {
        Ok(match self {
            // acks=1: the leader's acknowledgement only, the classic at-most-once-ish baseline.
            Mode::Plain => kafka.plain_producer("1"),
            Mode::Idempotent => kafka.idempotent_producer(),
            Mode::Transactional { .. } | Mode::Overlapped { .. } => {
                kafka.transactional_producer(transactional_id, TRANSACTION_TIMEOUT)?
            }
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Expands the selected kinds into modes: plain, idempotent, then per commit interval (in the
/// order given) the transactional and the overlapped mode, whatever order the kinds were listed
/// in, without duplicates. Each interval's two transactional modes sit side by side, so they run
/// within seconds of each other in the interleaved schedule.
pub fn expand(kinds: &[ModeKind], commit_intervals: &[Duration]) -> Vec<Mode> {
    let mut modes = Vec::new();
    if kinds.contains(&ModeKind::Plain) {
        modes.push(Mode::Plain);
    }
    if kinds.contains(&ModeKind::Idempotent) {
        modes.push(Mode::Idempotent);
    }
    for &commit_interval in commit_intervals {
        let wanted = [
            (
                ModeKind::Transactional,
                Mode::Transactional { commit_interval },
            ),
            (ModeKind::Overlapped, Mode::Overlapped { commit_interval }),
        ];
        for (kind, m) in wanted {
            if kinds.contains(&kind) && !modes.contains(&m) {
                modes.push(m);
            }
        }
    }
    modes
}

/// The batching settings of every producer of the benchmark, each with why.
pub const PRODUCER_SETTINGS: &[(&str, u32, &str)] = &[
    (
        "linger.ms",
        LINGER_MS,
        "Java's and librdkafka's default; equal in every mode and in compare.sh",
    ),
    (
        "batch.size",
        BATCH_SIZE,
        "256 KiB: above Java's 16 KiB, below both clients' largest batch",
    ),
    (
        "max.in.flight.requests.per.connection",
        MAX_IN_FLIGHT,
        "Java's default and idempotence's cap",
    ),
    (
        "queue.buffering.max.kbytes",
        QUEUE_KBYTES,
        "Java's buffer.memory (32 MiB): same unsent-data bound",
    ),
];

/// The user's connection settings plus the benchmark's batching settings, for the producers only
/// (admin clients and readers would warn about producer properties). A setting the user passed
/// with `-X` wins over ours, so the effect of another linger or batch size can be measured.
pub fn producer_kafka(kafka: &KafkaConfig) -> anyhow::Result<KafkaConfig> {
    let mut k = kafka.clone();
    for (key, value, _why) in PRODUCER_SETTINGS {
        if !k.properties.contains_key(*key) {
            k.set(key, &value.to_string())?;
        }
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(Mode::Plain.label(), "plain");
        assert_eq!(Mode::Idempotent.label(), "idempotent");
        assert_eq!(
            Mode::Transactional {
                commit_interval: Duration::from_millis(100)
            }
            .label(),
            "txn-100ms"
        );
        assert_eq!(
            Mode::Overlapped {
                commit_interval: Duration::from_millis(100)
            }
            .label(),
            "overlap-100ms"
        );
    }

    #[test]
    fn expansion_orders_modes_and_drops_duplicates() {
        let ms = |v| Duration::from_millis(v);
        let modes = expand(
            &[
                ModeKind::Transactional,
                ModeKind::Plain,
                ModeKind::Idempotent,
            ],
            &[ms(10), ms(100), ms(10)],
        );
        assert_eq!(
            modes,
            vec![
                Mode::Plain,
                Mode::Idempotent,
                Mode::Transactional {
                    commit_interval: ms(10)
                },
                Mode::Transactional {
                    commit_interval: ms(100)
                },
            ]
        );
        assert_eq!(expand(&[ModeKind::Plain], &[ms(10)]), vec![Mode::Plain]);
        assert_eq!(
            expand(
                &[ModeKind::Overlapped, ModeKind::Transactional],
                &[ms(10), ms(100)]
            ),
            vec![
                Mode::Transactional {
                    commit_interval: ms(10)
                },
                Mode::Overlapped {
                    commit_interval: ms(10)
                },
                Mode::Transactional {
                    commit_interval: ms(100)
                },
                Mode::Overlapped {
                    commit_interval: ms(100)
                },
            ]
        );
    }

    #[test]
    fn every_mode_gets_the_same_batching_and_its_own_guarantees() {
        let k = producer_kafka(&KafkaConfig::new("h:1")).unwrap();
        let modes = [
            Mode::Plain,
            Mode::Idempotent,
            Mode::Transactional {
                commit_interval: Duration::from_millis(10),
            },
        ];
        for m in modes {
            let c = m.producer_config(&k, "tid").unwrap();
            assert_eq!(c.get("linger.ms"), Some("5"), "{m}");
            assert_eq!(c.get("batch.size"), Some("262144"), "{m}");
            assert_eq!(
                c.get("max.in.flight.requests.per.connection"),
                Some("5"),
                "{m}"
            );
            assert_eq!(c.get("queue.buffering.max.kbytes"), Some("32768"), "{m}");
        }
        let plain = Mode::Plain.producer_config(&k, "tid").unwrap();
        assert_eq!(
            (plain.get("acks"), plain.get("enable.idempotence")),
            (Some("1"), Some("false"))
        );
        let idem = Mode::Idempotent.producer_config(&k, "tid").unwrap();
        assert_eq!(
            (idem.get("acks"), idem.get("enable.idempotence")),
            (Some("all"), Some("true"))
        );
        let txn = modes[2].producer_config(&k, "tid").unwrap();
        assert_eq!(txn.get("transactional.id"), Some("tid"));
    }

    #[test]
    fn user_overrides_win_over_bench_settings() {
        let user = KafkaConfig::new("h:1")
            .with_overrides(&["linger.ms=20"])
            .unwrap();
        let k = producer_kafka(&user).unwrap();
        let c = Mode::Idempotent.producer_config(&k, "t").unwrap();
        assert_eq!(c.get("linger.ms"), Some("20"));
        assert_eq!(c.get("batch.size"), Some("262144"));
        // The user's config itself (admin, readers) stays free of producer properties.
        assert!(!user.properties.contains_key("batch.size"));
    }
}
