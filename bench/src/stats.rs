//! The statistics of the benchmark report, as pure functions.
//!
//! Throughput is summarised by its median and its range (min-max) over the repeats: with three
//! repeats on a shared, noisy machine a mean would be dragged by one disturbed run, the median is
//! not, and the range shows how much to trust it. Latencies use the nearest-rank percentile (the
//! smallest sample with at least p% of the samples at or below it), so every reported figure is a
//! value that was actually measured, as with HdrHistogram-style tools.
//!
//! Empty inputs give `None` rather than a made-up zero or NaN; NaN samples are ignored.

/// Median, min and max of one configuration's repeats.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spread {
    /// Number of samples summarised.
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `samples`, or `None` when there is no (non-NaN) sample.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        let sorted = sorted(samples);
        Some(Spread {
            n: sorted.len(),
            median: median_sorted(&sorted)?,
            min: *sorted.first()?,
            max: *sorted.last()?,
        })
    }
}

/// The samples without NaNs, in ascending order.
fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The median (the mean of the two middle samples for an even count).
pub fn median(samples: &[f64]) -> Option<f64> {
    median_sorted(&sorted(samples))
}

/// The smallest sample.
pub fn min(samples: &[f64]) -> Option<f64> {
    sorted(samples).first().copied()
}

/// The largest sample.
pub fn max(samples: &[f64]) -> Option<f64> {
    sorted(samples).last().copied()
}

/// Nearest-rank percentile, `p` in (0, 100]: the sample at rank ceil(p/100 * n). `p` <= 0 gives the
/// minimum, `p` > 100 the maximum.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    let sorted = sorted(samples);
    if sorted.is_empty() || p.is_nan() {
        return None;
    }
    let n = sorted.len();
    // `p` is clamped, so the rank is within 1..=n and the cast cannot truncate a large value.
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// `numerator / denominator`, or `None` when the denominator is zero or either side is not finite
/// (a ratio against a failed or missing run is no figure).
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    if denominator == 0.0 || !numerator.is_finite() || !denominator.is_finite() {
        return None;
    }
    Some(numerator / denominator)
}

/// Records per second over `elapsed_s` seconds (`None` for a zero or negative duration).
pub fn per_second(count: f64, elapsed_s: f64) -> Option<f64> {
    if elapsed_s <= 0.0 || !elapsed_s.is_finite() {
        return None;
    }
    Some(count / elapsed_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn median_ignores_nan() {
        assert_eq!(median(&[f64::NAN, 5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn min_and_max() {
        assert_eq!(min(&[3.0, -1.0, 2.0]), Some(-1.0));
        assert_eq!(max(&[3.0, -1.0, 2.0]), Some(3.0));
        assert_eq!(min(&[]), None);
        assert_eq!(max(&[]), None);
    }

    #[test]
    fn spread_summarises_repeats() {
        let s = Spread::of(&[120.0, 100.0, 90.0]).unwrap();
        assert_eq!(
            s,
            Spread {
                n: 3,
                median: 100.0,
                min: 90.0,
                max: 120.0
            }
        );
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), Some(50.0));
        assert_eq!(percentile(&samples, 99.0), Some(99.0));
        assert_eq!(percentile(&samples, 100.0), Some(100.0));
        assert_eq!(percentile(&samples, 0.0), Some(1.0));
        // Few samples: p99 is the largest, p50 the lower middle one (a measured value).
        assert_eq!(percentile(&[10.0, 30.0, 20.0, 40.0], 99.0), Some(40.0));
        assert_eq!(percentile(&[10.0, 30.0, 20.0, 40.0], 50.0), Some(20.0));
        assert_eq!(percentile(&[5.0], 99.0), Some(5.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0], f64::NAN), None);
    }

    #[test]
    fn ratios_refuse_meaningless_denominators() {
        assert_eq!(ratio(97.0, 100.0), Some(0.97));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
    }

    #[test]
    fn rates() {
        assert_eq!(per_second(1000.0, 2.0), Some(500.0));
        assert_eq!(per_second(1000.0, 0.0), None);
    }
}
