//! Subscriptions: which webhook receives which symbols' notifications, from a TOML file.
//!
//! ```toml
//! [subscribers.ops-desk]
//! url = "https://ops.example/hooks/alerts"
//! symbols = ["BBCA", "TLKM"]      # or ["*"] for every symbol
//! max_in_flight = 4               # optional: concurrent requests to this subscriber (default 8)
//! ```
//!
//! The subscriber's name goes into the `Idempotency-Key` (`<notification id>/<subscriber>`), the
//! `retry.subscriber` header and metric labels, so it is held to a small alphabet (a-z, 0-9, `-`,
//! `_`, `.`, at most 64 bytes) and may not contain `/`. A file with a mistake is refused as a
//! whole at start, with the line and the reason, as the rules file is: a deliverer that silently
//! dropped a subscriber would silently drop its alerts.

use crate::rules::{line_of, parse_toml};
use crate::tick::valid_symbol;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use toml::Spanned;

/// Default bound on concurrent requests to one subscriber.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;

/// One subscriber, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    pub name: String,
    /// http or https.
    pub url: reqwest::Url,
    /// The symbols it receives; `None`: every symbol.
    pub symbols: Option<Vec<String>>,
    /// Concurrent requests to it, at most.
    pub max_in_flight: usize,
}

impl Subscriber {
    /// Whether it receives `symbol`'s notifications.
    pub fn wants(&self, symbol: &str) -> bool {
        self.symbols
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == symbol))
    }
}

/// Every subscriber, by name, and an index from symbol to its subscribers.
///
/// Why the index: every notification asks who wants its symbol. A scan of every subscriber's
/// list costs a file of 10,000 subscribers a fifth of its deliveries/s (`deliver-bench`, issue
/// 23); the index answers in the time of a hash lookup and the answer's own length.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscriptions {
    by_name: BTreeMap<String, Subscriber>,
    /// Names of the subscribers of every symbol (`["*"]`), in name order.
    every: Vec<String>,
    /// Names of the subscribers of each listed symbol, in name order.
    by_symbol: HashMap<String, Vec<String>>,
}

/// A subscriptions file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum SubscriptionsError {
    #[error("cannot read subscriptions file {path}: {source}")]
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
struct File {
    subscribers: BTreeMap<Spanned<String>, Spanned<Entry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    url: Spanned<String>,
    symbols: Spanned<Vec<Spanned<String>>>,
    max_in_flight: Option<Spanned<i64>>,
}

/// Whether `name` may name a subscriber.
pub fn valid_name(name: &str) -> bool {
    crate::rules::live::valid_subscriber(name)
}

impl Subscriptions {
    /// Reads and validates a subscriptions file.
    pub fn load(path: &Path) -> Result<Self, SubscriptionsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SubscriptionsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses subscriptions text; `origin` names it in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SubscriptionsError> {
        let invalid = |offset: usize, reason: String| SubscriptionsError::Invalid {
            path: origin.to_owned(),
            line: line_of(text, offset),
            reason,
        };
        let file: File = parse_toml(text).map_err(|(offset, why)| invalid(offset, why))?;
        if file.subscribers.is_empty() {
            return Err(invalid(
                0,
                "no subscribers: add a [subscribers.<name>] table".into(),
            ));
        }
        let mut by_name = BTreeMap::new();
        for (name, entry) in file.subscribers {
            let at = name.span().start;
            let name = name.into_inner();
            if !valid_name(&name) {
                return Err(invalid(
                    at,
                    format!(
                        "subscriber name {name:?} must be 1 to 64 bytes of a-z, 0-9, '-', '_', '.'"
                    ),
                ));
            }
            let entry = entry.into_inner();
            let url_at = entry.url.span().start;
            let url = reqwest::Url::parse(entry.url.get_ref())
                .map_err(|e| invalid(url_at, format!("url of {name} is not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(invalid(
                    url_at,
                    format!("url of {name} must be http:// or https:// with a host"),
                ));
            }
            let symbols_at = entry.symbols.span().start;
            let list: Vec<Spanned<String>> = entry.symbols.into_inner();
            let symbols = if list.len() == 1 && list[0].get_ref() == "*" {
                None
            } else {
                if list.is_empty() {
                    return Err(invalid(
                        symbols_at,
                        format!("subscriber {name} has no symbols (use [\"*\"] for all)"),
                    ));
                }
                let mut symbols = Vec::new();
                for s in list {
                    let (at, s) = (s.span().start, s.into_inner());
                    if !valid_symbol(&s) {
                        return Err(invalid(at, format!("symbol {s:?} of {name} must be 1 to 32 bytes of A-Z, 0-9, '.', '-', '_' (or \"*\" alone)")));
                    }
                    if symbols.contains(&s) {
                        return Err(invalid(at, format!("symbol {s} of {name} is listed twice")));
                    }
                    symbols.push(s);
                }
                Some(symbols)
            };
            let max_in_flight = match entry.max_in_flight {
                None => DEFAULT_MAX_IN_FLIGHT,
                Some(m) if (1..=1024).contains(m.get_ref()) => *m.get_ref() as usize,
                Some(m) => {
                    return Err(invalid(
                        m.span().start,
                        format!("max_in_flight of {name} must be 1 to 1024"),
                    ))
                }
            };
            by_name.insert(
                name.clone(),
                Subscriber {
                    name,
                    url,
                    symbols,
                    max_in_flight,
                },
            );
        }
        Ok(Subscriptions::index(by_name))
    }

    /// Builds the symbol index of `by_name` (whose order makes each list sorted).
    fn index(by_name: BTreeMap<String, Subscriber>) -> Self {
        let mut every = Vec::new();
        let mut by_symbol: HashMap<String, Vec<String>> = HashMap::new();
        for (name, s) in &by_name {
            match &s.symbols {
                None => every.push(name.clone()),
                Some(symbols) => {
                    for symbol in symbols {
                        by_symbol
                            .entry(symbol.clone())
                            .or_default()
                            .push(name.clone());
                    }
                }
            }
        }
        Subscriptions {
            by_name,
            every,
            by_symbol,
        }
    }

    /// The subscriber called `name`.
    pub fn get(&self, name: &str) -> Option<&Subscriber> {
        self.by_name.get(name)
    }

    /// The subscribers of `symbol`, by name.
    pub fn of_symbol<'a>(&'a self, symbol: &'a str) -> impl Iterator<Item = &'a Subscriber> + 'a {
        let listed = self.by_symbol.get(symbol).map_or(&[][..], Vec::as_slice);
        // Two sorted lists of distinct names, merged: name order, as the subscribers are kept.
        let (mut a, mut b) = (self.every.iter().peekable(), listed.iter().peekable());
        std::iter::from_fn(move || {
            let name = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x <= y => a.next(),
                (Some(_), Some(_)) | (None, Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, None) => None,
            }?;
            self.by_name.get(name)
        })
    }

    /// How many deliveries a notification keyed `key` (its symbol) makes, at least one: what a
    /// batch counts against `--max-batch-deliveries` before reading the payload.
    pub fn deliveries_of_key(&self, key: Option<&[u8]>) -> usize {
        key.and_then(|k| std::str::from_utf8(k).ok())
            .map_or(1, |symbol| self.of_symbol(symbol).count().max(1))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Subscriber> {
        self.by_name.values()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (usize, String) {
        match Subscriptions::parse(text, "subs.toml").unwrap_err() {
            SubscriptionsError::Invalid { line, reason, .. } => (line, reason),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn parses_and_matches_symbols() {
        let s = Subscriptions::parse(
            "[subscribers.desk]\nurl = \"http://127.0.0.1:9/h\"\nsymbols = [\"BBCA\"]\n\n\
             [subscribers.all]\nurl = \"https://x.example/\"\nsymbols = [\"*\"]\nmax_in_flight = 2\n",
            "x",
        )
        .unwrap();
        let names = |sym| s.of_symbol(sym).map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(names("BBCA"), ["all", "desk"]);
        assert_eq!(names("TLKM"), ["all"]);
        assert_eq!(s.deliveries_of_key(Some(b"BBCA")), 2);
        assert_eq!(s.deliveries_of_key(Some(b"TLKM")), 1);
        // No key, or not a symbol: one delivery, so a batch's record bound still holds.
        assert_eq!(s.deliveries_of_key(None), 1);
        assert_eq!(s.deliveries_of_key(Some(&[0xff, 0xfe])), 1);
        assert_eq!(s.get("all").unwrap().max_in_flight, 2);
        assert_eq!(s.get("desk").unwrap().max_in_flight, DEFAULT_MAX_IN_FLIGHT);
    }

    #[test]
    fn the_index_answers_as_a_scan_of_every_subscriber_would() {
        let mut text = String::new();
        for i in 0..60 {
            let symbols = match i % 4 {
                0 => "\"*\"".to_owned(),
                r => (0..r)
                    .map(|k| format!("\"S{}\"", (i + k) % 7))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            text += &format!(
                "[subscribers.s{i:02}]\nurl = \"http://h/{i}\"\nsymbols = [{symbols}]\n\n"
            );
        }
        let s = Subscriptions::parse(&text, "x").unwrap();
        for symbol in ["S0", "S3", "S6", "NONE"] {
            let indexed: Vec<&str> = s.of_symbol(symbol).map(|s| s.name.as_str()).collect();
            let scanned: Vec<&str> = s
                .iter()
                .filter(|s| s.wants(symbol))
                .map(|s| s.name.as_str())
                .collect();
            assert_eq!(indexed, scanned, "{symbol}");
            assert!(
                indexed.len() >= 15,
                "{symbol}: every fourth subscriber wants all"
            );
        }
    }

    #[test]
    fn mistakes_name_their_line() {
        let ok_url = "url = \"http://h/\"\n";
        assert!(
            err("[subscribers.A]\nurl = \"http://h/\"\nsymbols = [\"X\"]\n")
                .1
                .contains("name")
        );
        assert_eq!(
            err(&format!(
                "[subscribers.a]\n{ok_url}symbols = [\"X\", \"bad sym\"]\n"
            ))
            .0,
            3
        );
        assert!(
            err("[subscribers.a]\nurl = \"ftp://h/\"\nsymbols = [\"X\"]\n")
                .1
                .contains("http")
        );
        assert!(
            err("[subscribers.a]\nurl = \"not a url\"\nsymbols = [\"X\"]\n")
                .1
                .contains("not a URL")
        );
        assert!(err(&format!("[subscribers.a]\n{ok_url}symbols = []\n"))
            .1
            .contains("no symbols"));
        assert!(err(&format!(
            "[subscribers.a]\n{ok_url}symbols = [\"X\", \"X\"]\n"
        ))
        .1
        .contains("twice"));
        assert!(err(&format!(
            "[subscribers.a]\n{ok_url}symbols = [\"X\"]\nmax_in_flight = 0\n"
        ))
        .1
        .contains("1 to 1024"));
        assert!(err(&format!(
            "[subscribers.a]\n{ok_url}symbols = [\"X\"]\nurls = 1\n"
        ))
        .1
        .contains("urls"));
        assert!(err(&format!("[subscribers.a]\n{ok_url}"))
            .1
            .contains("symbols"));
        assert!(err("subscribers = {}\n").1.contains("no subscribers"));
    }
}
