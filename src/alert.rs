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
}

impl Notification {
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
                seq: 1
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
                seq: 10
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
}
