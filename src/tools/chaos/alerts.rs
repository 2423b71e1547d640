//! Live alerts under chaos (`alert-chaos --live-rules`): the run's rules are loaded into the rules
//! topic before the start, and a thread changes alerts while the faults play (issue 42): updates
//! of a threshold, deletes, new one-shot alerts, new alerts with a re-arm band, spread over the
//! span, seeded.
//!
//! The changer acknowledges every write and tries a write again when a broker bounce refuses it
//! (bounded); a write that is in the log counts whatever its acknowledgement said, since the
//! oracle (`verify_live`) reads the rules topic as it is. So nothing here has to be known to the
//! checks but the topic itself.

use crate::kafka::KafkaConfig;
use crate::rules::live::{Alert, Watch};
use crate::rules::Rules;
use crate::tools::alerts::{alerts_of_file, RulesTopic};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rust_decimal::Decimal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Tries of one change before it is given up (each waits for its acknowledgement, 30 s at most).
const TRIES: usize = 4;

/// What the changer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub updates: u64,
    pub deletes: u64,
    pub one_shots: u64,
    pub banded: u64,
    /// Changes given up after [`TRIES`] refusals.
    pub given_up: u64,
}

impl Changes {
    pub fn total(&self) -> u64 {
        self.updates + self.deletes + self.one_shots + self.banded
    }
}

/// Loads `rules` into the run's rules topic (made co-partitioned with `input`); returns its
/// name.
pub fn load(
    kafka: &KafkaConfig,
    app_id: &str,
    input: &str,
    rules: &Rules,
) -> anyhow::Result<String> {
    let alerts = alerts_of_file(rules, None);
    let topic = crate::tools::alerts::load_blocking(kafka, app_id, input, &alerts)?;
    info!(topic = %topic, alerts = alerts.len(), "alerts loaded");
    Ok(topic)
}

/// What the changer changes, and when.
pub struct Changer {
    pub kafka: KafkaConfig,
    pub app_id: String,
    pub input: String,
    /// The run's rules, loaded before the start: what is updated and deleted.
    pub rules: Rules,
    /// Changes, spread over `span`.
    pub count: usize,
    pub span: Duration,
    pub seed: u64,
}

/// Starts the changer; it ends after its changes, or at `stop`.
pub fn spawn(changer: Changer, stop: Arc<AtomicBool>) -> JoinHandle<Changes> {
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                warn!(error = %e, "alert changer: no runtime; no changes");
                return Changes::default();
            }
        };
        rt.block_on(change(changer, stop))
    })
}

async fn change(changer: Changer, stop: Arc<AtomicBool>) -> Changes {
    let Changer {
        kafka,
        app_id,
        input,
        rules,
        count,
        span,
        seed,
    } = changer;
    let mut done = Changes::default();
    let topic = match RulesTopic::open(&kafka, &app_id, None, &input).await {
        Ok(t) => t,
        Err(e) => {
            warn!(
                error = format!("{e:#}"),
                "alert changer: no rules topic; no changes"
            );
            return done;
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xa1e7_5eed);
    // The ids the changer believes alive: the file's, and its own puts (a one-shot that fired is
    // gone, and a change of it puts it again, which is as good a change as any).
    let mut alive: Vec<(String, Alert)> = alerts_of_file(&rules, None);
    let symbols: Vec<&str> = rules.symbols().collect();
    let started = Instant::now();
    let every = span / (count.max(1) as u32 + 1);
    for k in 0..count {
        let at = every * (k as u32 + 1);
        while started.elapsed() < at {
            if stop.load(Ordering::Relaxed) {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let symbol = symbols[rng.random_range(0..symbols.len())];
        let thresholds = rules.thresholds(symbol).unwrap_or_default();
        let threshold = thresholds[rng.random_range(0..thresholds.len())];
        let direction = [Watch::Up, Watch::Down, Watch::Both][rng.random_range(0..3)];
        let fresh = |one_shot: bool, band: Option<Decimal>| Alert {
            symbol: symbol.to_owned(),
            threshold,
            direction,
            subscriber: None,
            one_shot,
            rearm_band: band,
        };
        // Updates and deletes of what exists, new one-shots and banded alerts, in even shares.
        let kind = rng.random_range(0..4);
        let (id, alert) = match kind {
            0 | 1 if !alive.is_empty() => {
                let i = rng.random_range(0..alive.len());
                if kind == 0 {
                    let (id, old) = &alive[i];
                    let mut new = old.clone();
                    let ts = rules.thresholds(&old.symbol).unwrap_or_default();
                    new.threshold = ts[rng.random_range(0..ts.len())];
                    new.direction = direction;
                    (id.clone(), Some(new))
                } else {
                    (alive.swap_remove(i).0, None)
                }
            }
            2 => (format!("chaos-once-{k}"), Some(fresh(true, None))),
            // A band of half a percent of the threshold: prices step up to 0.8 %.
            _ => (
                format!("chaos-band-{k}"),
                Some(fresh(
                    false,
                    Some((threshold / Decimal::from(200)).round_dp(2)),
                )),
            ),
        };
        let mut ok = false;
        for attempt in 1..=TRIES {
            let result = match &alert {
                Some(a) => topic.put(&id, a).await,
                None => topic.delete(&id).await,
            };
            match result {
                Ok(_) => {
                    ok = true;
                    break;
                }
                Err(e) => {
                    warn!(
                        id,
                        attempt,
                        error = format!("{e:#}"),
                        "alert change refused; trying again"
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        if !ok {
            done.given_up += 1;
            continue;
        }
        match (&alert, kind) {
            (None, _) => done.deletes += 1,
            (Some(a), _) if a.one_shot => {
                done.one_shots += 1;
                alive.push((id, a.clone()));
            }
            (Some(a), _) if a.rearm_band.is_some() && id.starts_with("chaos-band") => {
                done.banded += 1;
                alive.push((id, a.clone()));
            }
            (Some(a), _) => {
                done.updates += 1;
                if let Some(slot) = alive.iter_mut().find(|(i, _)| *i == id) {
                    slot.1 = a.clone();
                }
            }
        }
    }
    done
}
