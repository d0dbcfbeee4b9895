//! Value parsers for the flags whose value becomes a `Duration` (a wait, a run length, the
//! time between two samples): clap refuses a value no wait can last (negative, NaN,
//! infinite, longer than [`MAX_SECONDS`], or a rate so small that its interval is) with an
//! error naming the flag, where `Duration::from_secs_f64` would panic later.

use std::time::Duration;

/// The longest wait a flag may ask for, in seconds (about 31 years): far past any run, and
/// far from where `Instant + Duration` overflows.
pub const MAX_SECONDS: f64 = 1e9;

/// The least positive rate a flag takes (per second): one event per 11.6 days, so that
/// `n / rate` stays a `Duration` for any count of samples.
pub const MIN_RATE: f64 = 1e-6;

/// Seconds, 0 to [`MAX_SECONDS`]: `--dashboard-hold-s 2.5`.
pub fn seconds(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=MAX_SECONDS).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("`{s}` is not a number of seconds from 0 to {MAX_SECONDS:e}")),
    }
}

/// A rate per second: 0 (no limit), or from [`MIN_RATE`] up (finite).
pub fn rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v == 0.0 || (v.is_finite() && v >= MIN_RATE) => Ok(v),
        _ => Err(format!("`{s}` is not a rate: 0 (no limit) or from {MIN_RATE:e} per second up, finite")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_values_a_duration_can_hold_pass() {
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("0"), Ok(Duration::ZERO));
        for bad in ["inf", "-1", "NaN", "1e10", "1e400", "soon", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(rate("0"), Ok(0.0));
        assert_eq!(rate("1e-6"), Ok(1e-6));
        for bad in ["1e-310", "-5", "inf", "NaN", "fast"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
    }
}
