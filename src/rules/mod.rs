//! Alert rules: which thresholds each symbol has, read from a TOML file.
//!
//! ```toml
//! [symbols]
//! BBCA = ["9500", "10000"]     # strings keep decimals exact
//! TLKM = [3000, 3500]          # integers are exact too
//! ```
//!
//! A file with a mistake is refused as a whole at start, with the line and the reason: a
//! processor that silently drops a rule would silently drop alerts. TOML floats are refused on
//! purpose, since `9525.3` as a binary float is not 9525.3.
//!
//! # Memory
//! A rules file may name 100,000 symbols (5.7 MB of TOML) and the rules stay for the life of the
//! process, so both the load and what is kept are made small (issue 11, `bench/RESULTS.md` §9):
//! - the file is parsed a piece of about 64 KiB at a time ([`split`]): the `toml` crate builds the
//!   whole document's tree before deserializing it, 80 MB of heap for that file, much of which the
//!   allocator then kept resident around the rules allocated among it;
//! - the rules are three flat allocations (every name in one string, every threshold in one
//!   vector, an index sorted by name), not a map with two allocations per symbol: 8.8 MB (heaptrack)
//!   instead of 16.5 MB for 100,000 symbols of four thresholds. A lookup is a binary search.

pub mod live;
#[cfg(test)]
mod piecewise_tests;
mod split;

use crate::tick::{parse_decimal, valid_symbol};
use rust_decimal::Decimal;
use serde::Deserialize;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use toml::Spanned;

/// Thresholds per symbol, each list sorted ascending without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Every symbol name, concatenated in ascending order (after [`Rules::sorted`]).
    names: String,
    /// Per symbol, in the order of `names`: where its name ends in `names` and where its
    /// thresholds end in `thresholds`. Each symbol's start is the previous symbol's end, so the
    /// index costs two numbers a symbol.
    ends: Vec<(usize, usize)>,
    /// Every symbol's thresholds, one symbol after the other.
    thresholds: Vec<Decimal>,
}

/// A rules file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read rules file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Invalid {
        path: String,
        line: usize,
        reason: String,
    },
}

/// Symbol -> thresholds, as written in the file, with where each part is (byte offsets).
type Entries = BTreeMap<Spanned<String>, Spanned<Vec<Spanned<toml::Value>>>>;

/// The root table, as a piece before the first header or a header piece shows it: `symbols` is
/// the only key a rules file has, and it is absent from a piece that does not define it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Root {
    symbols: Option<Entries>,
}

impl Rules {
    /// Rules from (symbol, thresholds) pairs; used by the generator and tests.
    pub fn from_pairs<I, S>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (S, Vec<Decimal>)>,
        S: Into<String>,
    {
        let mut by_symbol = BTreeMap::new();
        for (s, mut ts) in pairs {
            ts.sort();
            ts.dedup();
            by_symbol.insert(s.into(), ts);
        }
        let mut rules = Rules::default();
        // A BTreeMap iterates in ascending order: the rules come out sorted.
        for (s, ts) in &by_symbol {
            rules.push(s, ts);
        }
        rules
    }

    /// Reads and validates a rules file.
    pub fn load(path: &Path) -> Result<Self, RulesError> {
        let text = std::fs::read_to_string(path).map_err(|source| RulesError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses rules text; `origin` names it in error messages.
    ///
    /// The text is parsed a piece at a time (see [`split`] for why that is the same as parsing it
    /// whole); what only the whole document shows is checked here: the `symbols` table defined
    /// once, and each symbol once.
    pub fn parse(text: &str, origin: &str) -> Result<Self, RulesError> {
        Self::parse_in_pieces(text, origin, split::BODY_BYTES)
    }

    /// [`Rules::parse`] with pieces of `body_bytes` (tests cut at every statement).
    fn parse_in_pieces(text: &str, origin: &str, body_bytes: usize) -> Result<Self, RulesError> {
        let invalid = |offset: usize, reason: String| RulesError::Invalid {
            path: origin.to_owned(),
            line: line_of(text, offset),
            reason,
        };
        let mut rules = Rules::default();
        // Byte offset of each symbol's key, in the order pushed: for a symbol listed twice.
        let mut keys_at = Vec::new();
        // Byte offset of the piece that defined the `symbols` table.
        let mut defined_at: Option<usize> = None;
        let mut scratch = Vec::new();
        for piece in split::pieces(text, body_bytes) {
            let entries = match piece.kind {
                split::Kind::Root | split::Kind::Header => {
                    let root: Root = parse_toml(piece.text)
                        .map_err(|(offset, why)| invalid(piece.start + offset, why))?;
                    let Some(entries) = root.symbols else {
                        continue;
                    };
                    if let Some(first) = defined_at {
                        return Err(invalid(
                            piece.start,
                            format!(
                                "table `symbols` is defined twice (first on line {})",
                                line_of(text, first)
                            ),
                        ));
                    }
                    defined_at = Some(piece.start);
                    entries
                }
                // Body pieces follow a header piece that parsed, and with `symbols` the only key
                // of the root, that header was `[symbols]`: these are its entries.
                split::Kind::Body => parse_toml::<Entries>(piece.text)
                    .map_err(|(offset, why)| invalid(piece.start + offset, why))?,
            };
            for (symbol, list) in entries {
                let at = piece.start + symbol.span().start;
                thresholds(&symbol, list, &mut scratch)
                    .map_err(|(offset, why)| invalid(piece.start + offset, why))?;
                rules.push(symbol.get_ref(), &scratch);
                keys_at.push(at);
            }
        }
        if defined_at.is_none() {
            return Err(invalid(0, "missing field `symbols`".to_owned()));
        }
        rules.sorted().map_err(|(first, second, symbol)| {
            invalid(
                keys_at[second],
                format!(
                    "symbol {symbol} is listed twice (first on line {})",
                    line_of(text, keys_at[first])
                ),
            )
        })
    }

    /// Thresholds of `symbol`, ascending; `None` when the symbol has no rules.
    pub fn thresholds(&self, symbol: &str) -> Option<&[Decimal]> {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (name, thresholds) = self.entry(mid);
            match name.cmp(symbol) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Some(thresholds),
            }
        }
        None
    }

    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).map(|i| self.entry(i).0)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Renders the rules as a TOML file that [`Rules::parse`] reads back identically.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(
            "# symbol = [thresholds]; decimals as strings keep them exact\n[symbols]\n",
        );
        for i in 0..self.len() {
            let (s, ts) = self.entry(i);
            let list: Vec<String> = ts.iter().map(|t| format!("\"{t}\"")).collect();
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{s:?} = [{}]", list.join(", "));
        }
        out
    }

    /// Name and thresholds of the `i`-th symbol.
    fn entry(&self, i: usize) -> (&str, &[Decimal]) {
        let (name_start, thresholds_start) = match i {
            0 => (0, 0),
            _ => self.ends[i - 1],
        };
        let (name_end, thresholds_end) = self.ends[i];
        (
            &self.names[name_start..name_end],
            &self.thresholds[thresholds_start..thresholds_end],
        )
    }

    /// Appends a symbol after the others.
    fn push(&mut self, symbol: &str, thresholds: &[Decimal]) {
        self.names.push_str(symbol);
        self.thresholds.extend_from_slice(thresholds);
        self.ends.push((self.names.len(), self.thresholds.len()));
    }

    /// The same rules in ascending order of symbol, with no spare capacity; or the push indices
    /// (first, second) and the name of a symbol pushed twice. A file written in order (as
    /// [`Rules::to_toml`] writes it) needs no second copy.
    fn sorted(mut self) -> Result<Rules, (usize, usize, String)> {
        let n = self.len();
        if (1..n).all(|i| self.entry(i - 1).0 < self.entry(i).0) {
            self.names.shrink_to_fit();
            self.ends.shrink_to_fit();
            self.thresholds.shrink_to_fit();
            return Ok(self);
        }
        let mut order: Vec<usize> = (0..n).collect();
        // Stable: of two equal names, the first pushed comes first.
        order.sort_by(|&a, &b| self.entry(a).0.cmp(self.entry(b).0));
        if let Some(pair) = order
            .windows(2)
            .find(|w| self.entry(w[0]).0 == self.entry(w[1]).0)
        {
            return Err((pair[0], pair[1], self.entry(pair[0]).0.to_owned()));
        }
        let mut out = Rules {
            names: String::with_capacity(self.names.len()),
            ends: Vec::with_capacity(n),
            thresholds: Vec::with_capacity(self.thresholds.len()),
        };
        for i in order {
            let (s, ts) = self.entry(i);
            out.push(s, ts);
        }
        Ok(out)
    }
}

/// The thresholds of one rule, validated and sorted, into `out`; or where (byte offset in the
/// piece) and why not.
fn thresholds(
    symbol: &Spanned<String>,
    list: Spanned<Vec<Spanned<toml::Value>>>,
    out: &mut Vec<Decimal>,
) -> Result<(), (usize, String)> {
    let name = symbol.get_ref();
    if !valid_symbol(name) {
        return Err((
            symbol.span().start,
            format!("symbol {name:?} must be 1 to 32 bytes of A-Z, 0-9, '.', '-', '_'"),
        ));
    }
    if list.get_ref().is_empty() {
        return Err((
            list.span().start,
            format!("symbol {name} has no thresholds"),
        ));
    }
    out.clear();
    for v in list.into_inner() {
        let at = v.span().start;
        let t = match v.get_ref() {
            toml::Value::String(s) => parse_decimal(s)
                .ok_or_else(|| (at, format!("threshold {s:?} of {name} is not a decimal")))?,
            toml::Value::Integer(i) => Decimal::from(*i),
            toml::Value::Float(f) => {
                return Err((
                    at,
                    format!("threshold {f} of {name} is a float; write it as a string (\"{f}\") to keep it exact"),
                ))
            }
            other => {
                return Err((
                    at,
                    format!("threshold of {name} must be a decimal string or an integer, not a {}", other.type_str()),
                ))
            }
        };
        if t <= Decimal::ZERO {
            return Err((at, format!("threshold {t} of {name} must be > 0")));
        }
        if out.contains(&t) {
            return Err((at, format!("threshold {t} of {name} is listed twice")));
        }
        out.push(t);
    }
    out.sort();
    Ok(())
}

/// Parses a TOML file, or says where and why not: the byte offset of the error (0 when toml gives
/// none) and its message. Shared by every TOML file the project reads (rules, subscriptions).
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, (usize, String)> {
    toml::from_str(text).map_err(|e| {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        (offset, e.message().trim().to_owned())
    })
}

/// 1-based line number of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (usize, String) {
        match Rules::parse(text, "rules.toml").unwrap_err() {
            RulesError::Invalid { line, reason, .. } => (line, reason),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn parses_strings_and_integers_sorted() {
        let r = Rules::parse(
            "[symbols]\nBBCA = [\"10000\", 9500]\n\"BRK.B\" = [\"1.25\"]\n",
            "x",
        )
        .unwrap();
        assert_eq!(
            r.thresholds("BBCA").unwrap(),
            &[Decimal::from(9500), Decimal::from(10000)]
        );
        assert_eq!(r.thresholds("BRK.B").unwrap(), &[Decimal::new(125, 2)]);
        assert_eq!(r.thresholds("NOPE"), None);
        assert_eq!(
            Rules::parse(&r.to_toml(), "x").unwrap(),
            r,
            "to_toml round-trips"
        );
    }

    #[test]
    fn mistakes_name_their_line() {
        assert_eq!(err("[symbols]\nA = [\"1\"]\nB = [1.5]\n").0, 3);
        assert!(err("[symbols]\nA = [\"1\"]\nB = [1.5]\n")
            .1
            .contains("float"));
        assert_eq!(err("[symbols]\nA = [\"x\"]\n").0, 2);
        assert_eq!(err("[symbols]\n\nA = [\"0\"]\n").0, 3);
        assert_eq!(
            err("[symbols]\nA = [\"1\", 1]\n").1,
            "threshold 1 of A is listed twice"
        );
        assert_eq!(err("[symbols]\nlower = [1]\n").0, 2);
        assert_eq!(err("[symbols]\nA = []\n").0, 2);
        assert_eq!(err("[symbols]\nA = [true]\n").0, 2);
        let (line, reason) = err("[symbols]\nA = [1\n");
        assert!(line >= 2, "syntax error line {line}: {reason}");
        assert!(err("[symbolz]\nA = [1]\n").1.contains("symbolz"));
    }
}
