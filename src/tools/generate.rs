//! A seeded tick stream: N symbols, M ticks, random-walk prices, and the rules that go with it.
//!
//! The same seed gives the same ticks and rules, so a test or a demo can be rerun exactly. Each
//! symbol starts at a price between 50 and 5000 and gets four thresholds at -3%, -1%, +1% and +3%
//! of it; steps of up to ±0.8% make crossings (and multi-threshold jumps) frequent. Prices have two
//! decimal places and are computed in decimals.

use crate::rules::Rules;
use crate::tick::Tick;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rust_decimal::{Decimal, RoundingStrategy};
use std::collections::BTreeMap;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenOptions {
    pub symbols: usize,
    pub ticks: usize,
    pub seed: u64,
    /// Every n-th tick is followed by a re-send of an earlier tick of the same symbol (a stale
    /// duplicate that must be ignored); 0 for none.
    pub stale_every: usize,
}

/// Symbol name of index `i`.
pub fn symbol(i: usize) -> String {
    format!("SYM{i:03}")
}

/// Generates the rules and the ticks, in production order.
pub fn generate(opts: &GenOptions) -> (Rules, Vec<Tick>) {
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut prices: Vec<Decimal> = Vec::with_capacity(opts.symbols);
    let mut rules = Vec::with_capacity(opts.symbols);
    for i in 0..opts.symbols {
        let base = Decimal::from(rng.random_range(50..5000));
        let thresholds = [97, 99, 101, 103]
            .iter()
            .map(|pct| (base * Decimal::from(*pct) / Decimal::from(100)).round_dp(2))
            .collect();
        rules.push((symbol(i), thresholds));
        prices.push(base);
    }
    let mut seqs = vec![0u64; opts.symbols];
    let mut last: BTreeMap<usize, Tick> = BTreeMap::new();
    let mut ticks = Vec::with_capacity(opts.ticks);
    while ticks.len() < opts.ticks && opts.symbols > 0 {
        let i = rng.random_range(0..opts.symbols);
        // A step of -0.8% .. +0.8% in basis points, applied in decimals.
        let bp: i64 = rng.random_range(-80..=80);
        let next = (prices[i] * (Decimal::from(10_000 + bp) / Decimal::from(10_000)))
            .round_dp_with_strategy(2, RoundingStrategy::MidpointNearestEven)
            .max(Decimal::new(1, 2));
        prices[i] = next;
        seqs[i] += 1;
        let tick = Tick {
            symbol: symbol(i),
            price: next,
            seq: seqs[i],
            ts: None,
        };
        ticks.push(tick.clone());
        if opts.stale_every > 0 && ticks.len() % opts.stale_every == 0 && ticks.len() < opts.ticks {
            if let Some(old) = last.get(&i) {
                ticks.push(old.clone());
            }
        }
        last.insert(i, tick);
    }
    (Rules::from_pairs(rules), ticks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::{apply_rules, Outcome};
    use std::collections::HashMap;

    #[test]
    fn same_seed_same_stream_and_crossings_happen() {
        let opts = GenOptions {
            symbols: 5,
            ticks: 2000,
            seed: 7,
            stale_every: 50,
        };
        let (rules, ticks) = generate(&opts);
        assert_eq!(generate(&opts).1, ticks);
        assert_eq!(ticks.len(), 2000);
        assert_eq!(rules.len(), 5);
        let mut state = HashMap::new();
        let (mut crossings, mut stale) = (0, 0);
        for t in &ticks {
            let s = state.entry(t.symbol.clone()).or_insert(None);
            match apply_rules(&rules, s, t) {
                Outcome::Accepted { crossings: c } => crossings += c.len(),
                Outcome::Stale { .. } => stale += 1,
                Outcome::Unwatched => unreachable!("every generated symbol has rules"),
            }
        }
        assert!(crossings > 50, "only {crossings} crossings");
        assert!(stale >= 30, "only {stale} stale duplicates");
    }
}
