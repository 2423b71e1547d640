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

use crate::tick::{parse_decimal, valid_symbol};
use rust_decimal::Decimal;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use toml::Spanned;

/// Thresholds per symbol, each list sorted ascending without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    by_symbol: BTreeMap<String, Vec<Decimal>>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    symbols: BTreeMap<Spanned<String>, Spanned<Vec<Spanned<toml::Value>>>>,
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
        Rules { by_symbol }
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
    pub fn parse(text: &str, origin: &str) -> Result<Self, RulesError> {
        let invalid = |offset: usize, reason: String| RulesError::Invalid {
            path: origin.to_owned(),
            line: line_of(text, offset),
            reason,
        };
        let file: RulesFile = parse_toml(text).map_err(|(offset, why)| invalid(offset, why))?;
        let mut by_symbol = BTreeMap::new();
        for (symbol, list) in file.symbols {
            let at = symbol.span().start;
            let symbol = symbol.into_inner();
            if !valid_symbol(&symbol) {
                return Err(invalid(
                    at,
                    format!("symbol {symbol:?} must be 1 to 32 bytes of A-Z, 0-9, '.', '-', '_'"),
                ));
            }
            if list.get_ref().is_empty() {
                return Err(invalid(
                    list.span().start,
                    format!("symbol {symbol} has no thresholds"),
                ));
            }
            let mut thresholds = Vec::new();
            for v in list.into_inner() {
                let at = v.span().start;
                let t = match v.get_ref() {
                    toml::Value::String(s) => parse_decimal(s)
                        .ok_or_else(|| invalid(at, format!("threshold {s:?} of {symbol} is not a decimal")))?,
                    toml::Value::Integer(i) => Decimal::from(*i),
                    toml::Value::Float(f) => {
                        return Err(invalid(
                            at,
                            format!("threshold {f} of {symbol} is a float; write it as a string (\"{f}\") to keep it exact"),
                        ))
                    }
                    other => {
                        return Err(invalid(
                            at,
                            format!("threshold of {symbol} must be a decimal string or an integer, not a {}", other.type_str()),
                        ))
                    }
                };
                if t <= Decimal::ZERO {
                    return Err(invalid(
                        at,
                        format!("threshold {t} of {symbol} must be > 0"),
                    ));
                }
                if thresholds.contains(&t) {
                    return Err(invalid(
                        at,
                        format!("threshold {t} of {symbol} is listed twice"),
                    ));
                }
                thresholds.push(t);
            }
            thresholds.sort();
            by_symbol.insert(symbol, thresholds);
        }
        Ok(Rules { by_symbol })
    }

    /// Thresholds of `symbol`, ascending; `None` when the symbol has no rules.
    pub fn thresholds(&self, symbol: &str) -> Option<&[Decimal]> {
        self.by_symbol.get(symbol).map(Vec::as_slice)
    }

    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.by_symbol.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_symbol.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_symbol.is_empty()
    }

    /// Renders the rules as a TOML file that [`Rules::parse`] reads back identically.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(
            "# symbol = [thresholds]; decimals as strings keep them exact\n[symbols]\n",
        );
        for (s, ts) in &self.by_symbol {
            let list: Vec<String> = ts.iter().map(|t| format!("\"{t}\"")).collect();
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{s:?} = [{}]", list.join(", "));
        }
        out
    }
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
