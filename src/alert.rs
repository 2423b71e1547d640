//! The crossing rule: pure, no I/O, no async.
//!
//! For a threshold `t`, a price `p` is *above* when `p >= t` and *below* when `p < t`. A
//! notification is emitted whenever a symbol's side of `t` flips between its previous accepted
//! price and the new one: **up** when `prev < t <= p`, **down** when `prev >= t > p`. One jump
//! across several thresholds gives one notification per threshold, ascending for up and
//! descending for down. The first tick of a symbol only sets its state. A tick whose `seq` is not
//! greater than the last accepted `seq` is stale: ignored, never changes state, never alerts.
//!
//! Everything here is deterministic, which is what makes the verifier an oracle: it replays the
//! input topic through [`apply`] and must find exactly the notifications the pipeline committed.

use crate::rules::live::{entry_of, Entry};
use crate::rules::Rules;
use crate::tick::Tick;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Last accepted price of one symbol; this is the value written to the state changelog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolState {
    /// Last accepted price.
    #[serde(with = "rust_decimal::serde::str")]
    pub price: Decimal,
    /// Sequence number of the tick that set `price`.
    pub seq: u64,
    /// Live alerts with a re-arm band that fired and have not re-armed yet (see
    /// [`apply_alerts`]); always empty with a rules file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disarmed: Vec<Disarmed>,
}

/// A live alert's direction that fired and waits for the price to leave its band before it may
/// fire again. Named with the alert's version: a new version of the alert starts armed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Disarmed {
    pub id: String,
    pub version: i64,
    pub direction: Direction,
}

/// Direction of a crossing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

/// One threshold crossing, before it is dressed as a [`Notification`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    pub threshold: Decimal,
    pub direction: Direction,
    pub previous_price: Decimal,
}

/// What a tick did to its symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The tick was accepted: state is now `new_state`, with zero or more crossings.
    Accepted { crossings: Vec<Crossing> },
    /// The tick's seq is not newer than the state's: ignored and counted.
    Stale { last_seq: u64 },
    /// The symbol has no rules: nothing is kept for it.
    Unwatched,
}

/// Applies one tick to the state of its symbol (`state` is `None` for a symbol never seen).
///
/// Returns the outcome; `state` is updated in place when the tick is accepted.
pub fn apply(thresholds: &[Decimal], state: &mut Option<SymbolState>, tick: &Tick) -> Outcome {
    let prev = match state {
        Some(s) if tick.seq <= s.seq => return Outcome::Stale { last_seq: s.seq },
        Some(s) => Some(s.price),
        None => None,
    };
    *state = Some(SymbolState {
        price: tick.price,
        seq: tick.seq,
        disarmed: Vec::new(),
    });
    let Some(prev) = prev else {
        return Outcome::Accepted {
            crossings: Vec::new(),
        };
    };
    let p = tick.price;
    // `thresholds` is sorted ascending and deduplicated by `Rules`.
    let crossings = if p > prev {
        thresholds
            .iter()
            .filter(|&&t| prev < t && t <= p)
            .map(|&t| Crossing {
                threshold: t,
                direction: Direction::Up,
                previous_price: prev,
            })
            .collect()
    } else if p < prev {
        thresholds
            .iter()
            .rev()
            .filter(|&&t| prev >= t && t > p)
            .map(|&t| Crossing {
                threshold: t,
                direction: Direction::Down,
                previous_price: prev,
            })
            .collect()
    } else {
        Vec::new()
    };
    Outcome::Accepted { crossings }
}

/// Applies `tick` with the thresholds of its symbol; `Unwatched` when the rules do not name it.
pub fn apply_rules(rules: &Rules, state: &mut Option<SymbolState>, tick: &Tick) -> Outcome {
    match rules.thresholds(&tick.symbol) {
        Some(ts) => apply(ts, state, tick),
        None => Outcome::Unwatched,
    }
}

/// The side of `t` that a move from `prev` to `p` crosses to, if any (the rule at the top).
fn crossing_of(t: Decimal, prev: Decimal, p: Decimal) -> Option<Direction> {
    if prev < t && t <= p {
        Some(Direction::Up)
    } else if prev >= t && t > p {
        Some(Direction::Down)
    } else {
        None
    }
}

/// A live alert that fired on a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub id: String,
    pub version: i64,
    pub threshold: Decimal,
    pub direction: Direction,
    pub previous_price: Decimal,
    pub subscriber: Option<String>,
    pub one_shot: bool,
}

/// What a tick did against the live alerts of its symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveOutcome {
    /// Accepted (the state is now the tick's), with the alerts that fired.
    Accepted { fired: Vec<Fired> },
    /// The tick's seq is not newer than the state's: ignored and counted.
    Stale { last_seq: u64 },
}

/// Applies one tick to its symbol's state against the live alerts of the symbol in force for it
/// (`alerts`, by id). Every symbol keeps its last price, with or without alerts, so that an alert
/// put now fires on the next crossing, not only after a second tick.
///
/// An alert fires when its threshold is crossed (the rule at the top) in a direction it watches.
/// With a re-arm band `b`, after firing up it is disarmed for up until a tick's price is below
/// `t - b`; after firing down, for down until a price is at or above `t + b`; a new version of
/// the alert starts armed. Within a tick: fire with the armed state before it, then re-arm by its
/// price, then disarm what fired. Fired alerts come ascending by threshold for up, descending for
/// down, then by id.
pub fn apply_alerts(
    alerts: Option<&[Entry]>,
    state: &mut Option<SymbolState>,
    tick: &Tick,
) -> LiveOutcome {
    let (prev, mut disarmed) = match state.take() {
        Some(s) if tick.seq <= s.seq => {
            let last_seq = s.seq;
            *state = Some(s);
            return LiveOutcome::Stale { last_seq };
        }
        Some(s) => (Some(s.price), s.disarmed),
        None => (None, Vec::new()),
    };
    let p = tick.price;
    let mut fired = Vec::new();
    if let (Some(prev), Some(alerts)) = (prev, alerts) {
        for v in alerts {
            let (id, a) = (&v.id, v);
            let Some(direction) = crossing_of(a.threshold, prev, p) else {
                continue;
            };
            if !a.direction.watches(direction) {
                continue;
            }
            let key = Disarmed {
                id: id.to_string(),
                version: v.version,
                direction,
            };
            if a.rearm_band.is_some() && disarmed.contains(&key) {
                continue;
            }
            fired.push(Fired {
                id: id.to_string(),
                version: v.version,
                threshold: a.threshold,
                direction,
                previous_price: prev,
                subscriber: a.subscriber.as_deref().map(str::to_owned),
                one_shot: a.one_shot,
            });
        }
    }
    // Re-arm: an entry stays while its alert is in force at that version and the price has not
    // left the band on the far side.
    disarmed.retain(|d| {
        let Some(v) = alerts.and_then(|a| entry_of(a, &d.id)) else {
            return false;
        };
        let (Some(band), true) = (v.rearm_band, v.version == d.version) else {
            return false;
        };
        match d.direction {
            Direction::Up => p >= v.threshold - band,
            Direction::Down => p < v.threshold + band,
        }
    });
    for f in &fired {
        let banded = alerts
            .and_then(|a| entry_of(a, &f.id))
            .is_some_and(|v| v.rearm_band.is_some());
        if banded && !f.one_shot {
            disarmed.push(Disarmed {
                id: f.id.clone(),
                version: f.version,
                direction: f.direction,
            });
        }
    }
    disarmed.sort();
    disarmed.dedup();
    fired.sort_by(|a, b| {
        let by_threshold = match a.direction {
            Direction::Up => a.threshold.cmp(&b.threshold),
            Direction::Down => b.threshold.cmp(&a.threshold),
        };
        a.direction
            .cmp(&b.direction)
            .then(by_threshold)
            .then_with(|| a.id.cmp(&b.id))
    });
    *state = Some(SymbolState {
        price: p,
        seq: tick.seq,
        disarmed,
    });
    LiveOutcome::Accepted { fired }
}

/// The live alert behind a notification: its id and version (the rules offset that put it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AlertRef {
    pub id: String,
    pub version: i64,
}

/// Where the tick behind a notification was read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// A notification as written to the `notifications` topic (key = symbol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// `symbol:seq:threshold:direction`: stable, so a downstream system can deduplicate on it.
    pub id: String,
    pub symbol: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub threshold: Decimal,
    pub direction: Direction,
    #[serde(with = "rust_decimal::serde::str")]
    pub price: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub previous_price: Decimal,
    pub seq: u64,
    /// The tick's own timestamp, or the record timestamp when the tick had none.
    pub tick_ts: String,
    pub source: Source,
    /// The live alert that fired (absent for a rules file's thresholds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<AlertRef>,
    /// Who the alert is for: the subscriber alert-deliver sends it to (absent: by symbol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
}

impl Notification {
    /// The stable id of a live alert's firing: `symbol:seq:alert-id:direction` (two alerts of a
    /// symbol may share a threshold).
    pub fn id_of_alert(symbol: &str, seq: u64, alert_id: &str, direction: Direction) -> String {
        format!("{symbol}:{seq}:{alert_id}:{}", direction.as_str())
    }

    /// The notification of a live alert that fired.
    pub fn of_alert(tick: &Tick, fired: &Fired, tick_ts: String, source: Source) -> Self {
        Notification {
            id: Self::id_of_alert(&tick.symbol, tick.seq, &fired.id, fired.direction),
            symbol: tick.symbol.clone(),
            threshold: fired.threshold,
            direction: fired.direction,
            price: tick.price,
            previous_price: fired.previous_price,
            seq: tick.seq,
            tick_ts,
            source,
            alert: Some(AlertRef {
                id: fired.id.clone(),
                version: fired.version,
            }),
            subscriber: fired.subscriber.clone(),
        }
    }

    /// The stable id of a crossing.
    pub fn id_of(symbol: &str, seq: u64, threshold: Decimal, direction: Direction) -> String {
        format!("{symbol}:{seq}:{threshold}:{}", direction.as_str())
    }

    pub fn new(tick: &Tick, crossing: &Crossing, tick_ts: String, source: Source) -> Self {
        Notification {
            id: Self::id_of(
                &tick.symbol,
                tick.seq,
                crossing.threshold,
                crossing.direction,
            ),
            symbol: tick.symbol.clone(),
            threshold: crossing.threshold,
            direction: crossing.direction,
            price: tick.price,
            previous_price: crossing.previous_price,
            seq: tick.seq,
            tick_ts,
            source,
            alert: None,
            subscriber: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::from_str_exact(s).unwrap()
    }

    fn tick(price: &str, seq: u64) -> Tick {
        Tick {
            symbol: "BBCA".into(),
            price: d(price),
            seq,
            ts: None,
        }
    }

    fn crossings(o: Outcome) -> Vec<(String, Direction)> {
        match o {
            Outcome::Accepted { crossings } => crossings
                .into_iter()
                .map(|c| (c.threshold.to_string(), c.direction))
                .collect(),
            other => panic!("expected Accepted, got {other:?}"),
        }
    }

    #[test]
    fn first_tick_sets_state_and_emits_nothing() {
        let mut s = None;
        assert_eq!(
            crossings(apply(&[d("100")], &mut s, &tick("150", 1))),
            vec![]
        );
        assert_eq!(
            s,
            Some(SymbolState {
                price: d("150"),
                seq: 1,
                disarmed: Vec::new(),
            })
        );
    }

    #[test]
    fn up_and_down() {
        let t = [d("100")];
        let mut s = None;
        apply(&t, &mut s, &tick("99", 1));
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("101", 2))),
            vec![("100".into(), Direction::Up)]
        );
        assert_eq!(crossings(apply(&t, &mut s, &tick("102", 3))), vec![]);
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("98", 4))),
            vec![("100".into(), Direction::Down)]
        );
        assert_eq!(crossings(apply(&t, &mut s, &tick("97", 5))), vec![]);
    }

    #[test]
    fn exactly_at_the_threshold_is_above() {
        let t = [d("100")];
        let mut s = None;
        apply(&t, &mut s, &tick("99.99", 1));
        // prev < t <= p: landing exactly on t is an up crossing...
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("100", 2))),
            vec![("100".into(), Direction::Up)]
        );
        // ...and staying there, or moving above, is not another one.
        assert_eq!(crossings(apply(&t, &mut s, &tick("100.00", 3))), vec![]);
        assert_eq!(crossings(apply(&t, &mut s, &tick("100.5", 4))), vec![]);
        // Back to t from above is no crossing: t is on the above side.
        assert_eq!(crossings(apply(&t, &mut s, &tick("100", 5))), vec![]);
        // Leaving t downwards is: prev >= t > p.
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("99.999", 6))),
            vec![("100".into(), Direction::Down)]
        );
    }

    #[test]
    fn one_jump_across_several_thresholds() {
        let t = [d("10"), d("20"), d("30"), d("40")];
        let mut s = None;
        apply(&t, &mut s, &tick("5", 1));
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("35", 2))),
            vec![
                ("10".into(), Direction::Up),
                ("20".into(), Direction::Up),
                ("30".into(), Direction::Up)
            ]
        );
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("10", 3))),
            vec![
                ("30".into(), Direction::Down),
                ("20".into(), Direction::Down)
            ]
        );
    }

    #[test]
    fn stale_seq_is_ignored() {
        let t = [d("100")];
        let mut s = None;
        apply(&t, &mut s, &tick("90", 10));
        assert_eq!(
            apply(&t, &mut s, &tick("110", 10)),
            Outcome::Stale { last_seq: 10 }
        );
        assert_eq!(
            apply(&t, &mut s, &tick("110", 3)),
            Outcome::Stale { last_seq: 10 }
        );
        assert_eq!(
            s,
            Some(SymbolState {
                price: d("90"),
                seq: 10,
                disarmed: Vec::new(),
            }),
            "stale ticks never change state"
        );
        // The next fresh tick compares against the last accepted price, not the stale one.
        assert_eq!(crossings(apply(&t, &mut s, &tick("95", 11))), vec![]);
    }

    #[test]
    fn decimal_precision_no_floats() {
        // 0.1 + 0.2 != 0.3 in binary floating point; here the threshold is hit exactly.
        let t = [d("0.3")];
        let mut s = None;
        apply(&t, &mut s, &tick("0.29999999999999999999", 1));
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("0.30", 2))),
            vec![("0.3".into(), Direction::Up)]
        );
        // A difference in the 20th decimal place still decides the side.
        apply(&t, &mut s, &tick("0.30000000000000000001", 3));
        assert_eq!(
            crossings(apply(&t, &mut s, &tick("0.29999999999999999999", 4))),
            vec![("0.3".into(), Direction::Down)]
        );
    }

    #[test]
    fn notification_json_matches_the_design() {
        let tk = Tick {
            symbol: "BBCA".into(),
            price: d("10000.50"),
            seq: 1042,
            ts: None,
        };
        let c = Crossing {
            threshold: d("10000"),
            direction: Direction::Up,
            previous_price: d("9990.00"),
        };
        let n = Notification::new(
            &tk,
            &c,
            "2026-11-30T09:15:00.123Z".into(),
            Source {
                topic: "market-updates".into(),
                partition: 3,
                offset: 5521,
            },
        );
        let v: serde_json::Value =
            serde_json::from_slice(&serde_json::to_vec(&n).unwrap()).unwrap();
        assert_eq!(v["id"], "BBCA:1042:10000:up");
        assert_eq!(v["threshold"], "10000");
        assert_eq!(v["direction"], "up");
        assert_eq!(v["price"], "10000.50");
        assert_eq!(v["previous_price"], "9990.00");
        assert_eq!(v["seq"].as_u64(), Some(1042));
        assert_eq!(v["source"]["partition"].as_i64(), Some(3));
        assert_eq!(v["source"]["offset"].as_i64(), Some(5521));
        let back: Notification = serde_json::from_value(v).unwrap();
        assert_eq!(back, n);
    }

    fn live(
        id: &str,
        version: i64,
        t: &str,
        watch: crate::rules::live::Watch,
        band: Option<&str>,
    ) -> Entry {
        Entry {
            id: id.into(),
            version,
            threshold: d(t),
            direction: watch,
            subscriber: Some("ops".into()),
            one_shot: false,
            rearm_band: band.map(d),
        }
    }

    fn fired(o: LiveOutcome) -> Vec<(String, Direction)> {
        match o {
            LiveOutcome::Accepted { fired } => {
                fired.into_iter().map(|f| (f.id, f.direction)).collect()
            }
            other => panic!("expected Accepted, got {other:?}"),
        }
    }

    #[test]
    fn live_alerts_fire_in_the_directions_they_watch() {
        use crate::rules::live::Watch;
        let alerts = [
            live("both", 3, "100", Watch::Both, None),
            live("down", 2, "100", Watch::Down, None),
            live("up", 1, "100", Watch::Up, None),
        ];
        let alerts = &alerts[..];
        let mut s = None;
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("99", 1))),
            vec![]
        );
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("100", 2))),
            vec![("both".into(), Direction::Up), ("up".into(), Direction::Up)]
        );
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("99", 3))),
            vec![
                ("both".into(), Direction::Down),
                ("down".into(), Direction::Down)
            ]
        );
        assert!(matches!(
            apply_alerts(Some(alerts), &mut s, &tick("101", 3)),
            LiveOutcome::Stale { last_seq: 3 }
        ));
        // Without alerts the price is kept, so an alert put later fires on the next crossing.
        assert_eq!(fired(apply_alerts(None, &mut s, &tick("98", 4))), vec![]);
        assert_eq!(s.as_ref().map(|s| s.price), Some(d("98")));
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("100.5", 5))),
            vec![("both".into(), Direction::Up), ("up".into(), Direction::Up)]
        );
    }

    #[test]
    fn a_rearm_band_stops_a_hovering_price_from_flooding() {
        use crate::rules::live::Watch;
        let alerts = [live("a", 7, "100", Watch::Both, Some("2"))];
        let alerts = &alerts[..];
        let mut s = None;
        let mut out = Vec::new();
        for (seq, price) in ["99", "100.1", "99.9", "100.1", "99.9", "100.2", "99.8"]
            .iter()
            .enumerate()
        {
            out.extend(fired(apply_alerts(
                Some(alerts),
                &mut s,
                &tick(price, seq as u64 + 1),
            )));
        }
        // One up, one down, then quiet while it hovers inside the band.
        assert_eq!(
            out,
            vec![("a".into(), Direction::Up), ("a".into(), Direction::Down)]
        );
        // Below 98 re-arms up; the next up crossing fires again.
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("97.9", 10))),
            vec![]
        );
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("100", 11))),
            vec![("a".into(), Direction::Up)]
        );
        // At or above 102 re-arms down.
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("102", 12))),
            vec![]
        );
        assert_eq!(
            fired(apply_alerts(Some(alerts), &mut s, &tick("99", 13))),
            vec![("a".into(), Direction::Down)]
        );
        // A new version starts armed.
        let v2 = [live("a", 8, "100", Watch::Both, Some("2"))];
        let v2 = &v2[..];
        assert_eq!(
            fired(apply_alerts(Some(v2), &mut s, &tick("100", 14))),
            vec![("a".into(), Direction::Up)]
        );
        let json = serde_json::to_string(s.as_ref().unwrap()).unwrap();
        let back: SymbolState = serde_json::from_str(&json).unwrap();
        assert_eq!(
            Some(back),
            s,
            "the disarmed entries survive the changelog: {json}"
        );
    }
}
