//! The one duration syntax of the project, in a leaf module: every flag (`crate::cli` takes its
//! value parsers from here) and every stage that reads a duration from elsewhere (alert-deliver's
//! bucket list, the test subscriber's behaviours) parse durations the same way, and none of them
//! has to import the command-line layer for it.

use std::time::Duration;

/// The one duration syntax of every flag: a number with its unit (`100ms`, `1s`, `2m`, `1h 30m`).
/// A bare number is refused: `--commit-interval 100` could mean milliseconds or seconds.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{t:?} needs a unit, e.g. {t}ms or {t}s"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("{t:?} is not a duration (e.g. 100ms, 1s): {e}"))
}

/// A [`duration`] of at least a millisecond (intervals that would otherwise spin).
pub fn interval(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!(
            "{:?} is below the smallest interval, 1ms",
            s.trim()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::{duration, interval};
    use std::time::Duration;

    #[test]
    fn a_duration_needs_its_unit_and_an_interval_a_millisecond() {
        assert_eq!(duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(duration(" 1h 30m "), Ok(Duration::from_secs(5400)));
        assert!(duration("100").unwrap_err().contains("needs a unit"));
        assert!(duration("soon").is_err());
        assert!(interval("0s").unwrap_err().contains("smallest interval"));
        assert_eq!(interval("1ms"), Ok(Duration::from_millis(1)));
    }
}
