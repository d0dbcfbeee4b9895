//! The autoscaler: a meter, a policy and the bounds, plus the record of every decision.
//! It names unit counts; its caller turns them into threads, processes or replicas.

use serde::{Deserialize, Serialize};

use crate::policy::{Policy, PolicyKind};
use crate::signals::{Meter, Window, WindowBy};

/// Decisions kept for [`AutoscaleStats`] (the counters count them all).
const KEEP_DECISIONS: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleConfig {
    pub policy: PolicyKind,
    pub min_units: usize,
    pub max_units: usize,
    pub window: WindowBy,
    /// Batches ignored after each change (Cachew pauses metric collection for 150).
    pub settle_batches: u64,
}

impl AutoscaleConfig {
    /// `policy` between `min_units` and `max_units`, deciding every 20 batches and
    /// ignoring the 5 batches after each change.
    pub fn new(policy: PolicyKind, min_units: usize, max_units: usize) -> Self {
        Self { policy, min_units, max_units, window: WindowBy::Batches(20), settle_batches: 5 }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("autoscaling needs 1 <= min units <= max units, got min {min}, max {max}")]
    Bounds { min: usize, max: usize },
    #[error("an autoscaling window must span at least one batch or millisecond")]
    EmptyWindow,
}

/// One decision and what it was made on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub t_ms: u64,
    pub from: usize,
    pub to: usize,
    /// Batches per second the units could make.
    pub production: f64,
    /// Batches per second the trainer takes.
    pub consumption: f64,
    pub stall: f64,
    pub reason: String,
}

/// What [`crate::Autoscaler::stats`] reports: the shape `GET /api/autoscale` serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleStats {
    pub policy: String,
    pub units: usize,
    pub windows: u64,
    pub ups: u64,
    pub downs: u64,
    /// The latest decisions, oldest first.
    pub decisions: Vec<Decision>,
}

pub struct Autoscaler {
    config: AutoscaleConfig,
    policy: Box<dyn Policy>,
    meter: Meter,
    units: usize,
    started_s: f64,
    windows: u64,
    ups: u64,
    downs: u64,
    decisions: Vec<Decision>,
}

impl Autoscaler {
    /// Starts at `units` (clamped to the bounds; Cachew starts at the lower bound) at
    /// `now_s` on the caller's clock.
    pub fn new(config: AutoscaleConfig, units: usize, now_s: f64) -> Result<Self, ConfigError> {
        let (min, max) = (config.min_units, config.max_units);
        if min == 0 || min > max {
            return Err(ConfigError::Bounds { min, max });
        }
        if matches!(config.window, WindowBy::Batches(0) | WindowBy::Millis(0)) {
            return Err(ConfigError::EmptyWindow);
        }
        let units = match config.policy {
            PolicyKind::Cachew => min,
            _ => units.clamp(min, max),
        };
        Ok(Self {
            policy: config.policy.build(min),
            meter: Meter::new(config.window, now_s),
            units,
            started_s: now_s,
            windows: 0,
            ups: 0,
            downs: 0,
            decisions: Vec::new(),
            config,
        })
    }

    /// The units the caller should be running.
    pub fn units(&self) -> usize {
        self.units
    }

    pub fn config(&self) -> &AutoscaleConfig {
        &self.config
    }

    /// A batch reached the trainer at `now_s` after it waited `wait_s` for it.
    pub fn record_batch(&mut self, now_s: f64, wait_s: f64) {
        self.meter.record_batch(now_s, wait_s);
    }

    /// Units spent `busy_s` unit-seconds making `batches` batches' worth of samples.
    pub fn record_work(&mut self, busy_s: f64, batches: f64) {
        self.meter.record_work(busy_s, batches);
    }

    /// The window, if full at `now_s` (`queue`: batches ready and waiting). Pass it to
    /// [`Autoscaler::observe`]; [`Autoscaler::tick`] does both.
    pub fn close_window(&mut self, now_s: f64, queue: f64) -> Option<Window> {
        let t_ms = ((now_s - self.started_s).max(0.0) * 1000.0) as u64;
        self.meter.close(now_s, t_ms, self.units, queue)
    }

    /// Closes the window if it is full and lets the policy decide on it.
    pub fn tick(&mut self, now_s: f64, queue: f64) -> Option<Decision> {
        let w = self.close_window(now_s, queue)?;
        self.observe(&w, now_s)
    }

    /// Lets the policy decide on `w`; a change is recorded, logged and returned, and the
    /// meter restarts (settling) at `now_s`.
    pub fn observe(&mut self, w: &Window, now_s: f64) -> Option<Decision> {
        self.windows += 1;
        let verdict = self.policy.decide(w, self.units)?;
        let to = verdict.to.clamp(self.config.min_units, self.config.max_units);
        if to == self.units {
            return None;
        }
        let d = Decision {
            t_ms: w.t_ms,
            from: self.units,
            to,
            production: w.production(),
            consumption: w.consumption(),
            stall: w.stall(),
            reason: verdict.reason,
        };
        self.record(d, now_s)
    }

    /// An operator's order: go to `to` units (clamped) at `now_s`, recorded as a decision
    /// with `w`'s readings (the latest window, if any); the policy goes on from there.
    pub fn set_units(&mut self, to: usize, w: Option<&Window>, now_s: f64) -> Option<Decision> {
        let to = to.clamp(self.config.min_units, self.config.max_units);
        if to == self.units {
            return None;
        }
        let w = w.cloned().unwrap_or_default();
        let d = Decision {
            t_ms: ((now_s - self.started_s).max(0.0) * 1000.0) as u64,
            from: self.units,
            to,
            production: w.production(),
            consumption: w.consumption(),
            stall: w.stall(),
            reason: format!("set to {to} by an operator"),
        };
        self.policy.moved(to);
        self.record(d, now_s)
    }

    /// Resumes at `units` (clamped), the count a restarted caller had reached before:
    /// not a decision, so nothing is recorded; the policy goes on from there.
    pub fn resume(&mut self, units: usize) {
        self.units = units.clamp(self.config.min_units, self.config.max_units);
        self.policy.moved(self.units);
    }

    /// Logs, counts and keeps `d`, moves to its unit count and restarts the meter.
    fn record(&mut self, d: Decision, now_s: f64) -> Option<Decision> {
        let to = d.to;
        tracing::info!(
            policy = %self.config.policy,
            from = d.from,
            to = d.to,
            production = d.production,
            consumption = d.consumption,
            stall = d.stall,
            "autoscale: {}",
            d.reason
        );
        if to > self.units {
            self.ups += 1;
        } else {
            self.downs += 1;
        }
        self.units = to;
        if self.decisions.len() == KEEP_DECISIONS {
            self.decisions.remove(0);
        }
        self.decisions.push(d.clone());
        self.meter.restart(now_s, self.config.settle_batches);
        Some(d)
    }

    pub fn stats(&self) -> AutoscaleStats {
        AutoscaleStats {
            policy: self.config.policy.name().to_string(),
            units: self.units,
            windows: self.windows,
            ups: self.ups,
            downs: self.downs,
            decisions: self.decisions.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(policy: PolicyKind) -> AutoscaleConfig {
        AutoscaleConfig { window: WindowBy::Batches(10), settle_batches: 2, ..AutoscaleConfig::new(policy, 1, 6) }
    }

    /// Feeds one window: 10 batches 0.1 s apart, the trainer waiting `wait` of each, the
    /// units making `per_unit` batches per busy second.
    fn feed(a: &mut Autoscaler, now: &mut f64, wait: f64, per_unit: f64) -> Option<Decision> {
        for _ in 0..10 {
            *now += 0.1;
            a.record_batch(*now, wait);
            a.record_work(a.units() as f64 * 0.1, per_unit * a.units() as f64 * 0.1);
            if let Some(d) = a.tick(*now, 0.0) {
                return Some(d);
            }
        }
        None
    }

    #[test]
    fn a_decision_is_clamped_recorded_with_its_inputs_and_counted() {
        let mut now = 0.0;
        let mut a = Autoscaler::new(config(PolicyKind::Fastmatch), 2, now).unwrap_or_else(|e| panic!("{e}"));
        // The trainer computes 0.05 s of each 0.1 s: 20 batches/s; one unit makes 1/s.
        assert_eq!(feed(&mut a, &mut now, 0.05, 1.0), None, "the first reading waits for a second");
        let d = feed(&mut a, &mut now, 0.05, 1.0).unwrap_or_else(|| panic!("no decision"));
        assert_eq!((d.from, d.to), (2, 6), "21 units wanted, 6 allowed");
        assert!((d.consumption - 20.0).abs() < 1e-6 && (d.production - 2.0).abs() < 1e-6, "{d:?}");
        assert!((d.stall - 0.5).abs() < 1e-6);
        assert!(d.reason.contains("δ = +19"), "{}", d.reason);
        let s = a.stats();
        assert_eq!((s.policy.as_str(), s.units, s.ups, s.downs, s.windows), ("fastmatch", 6, 1, 0, 2));
        assert_eq!(s.decisions, vec![d]);
    }

    #[test]
    fn an_operator_order_is_clamped_and_recorded_like_a_decision() {
        let mut a = Autoscaler::new(config(PolicyKind::Fixed), 2, 0.0).unwrap_or_else(|e| panic!("{e}"));
        let d = a.set_units(9, None, 1.5).unwrap_or_else(|| panic!("no decision"));
        assert_eq!((d.from, d.to, d.t_ms), (2, 6, 1500));
        assert_eq!(d.reason, "set to 6 by an operator");
        assert_eq!(a.set_units(6, None, 2.0), None, "no change, no decision");
        assert_eq!(a.set_units(1, None, 2.0).map(|d| d.to), Some(1));
        let s = a.stats();
        assert_eq!((s.units, s.ups, s.downs, s.decisions.len()), (1, 1, 1, 2));
    }

    #[test]
    fn cachew_goes_on_from_an_operators_order() {
        let mut a = Autoscaler::new(config(PolicyKind::Cachew), 1, 0.0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.set_units(4, None, 0.0).map(|d| d.to), Some(4));
        // Held at 4, with 2 batches waiting in the result queue; then the queue grows ×4.
        // After 20 stable windows Cachew removes a unit. Before, it waited for its own last
        // target (1) for good and never decided again.
        let mut now = 0.0;
        let mut decided = None;
        for i in 0..40 {
            let queue = if i < 5 { 2.0 } else { 8.0 };
            for _ in 0..10 {
                now += 0.1;
                a.record_batch(now, 0.0);
                a.record_work(0.4, 4.0);
            }
            decided = decided.or(a.tick(now, queue));
        }
        let d = decided.unwrap_or_else(|| panic!("no decision after the order: {:?}", a.stats()));
        assert_eq!((d.from, d.to), (4, 3), "{d:?}");
    }

    #[test]
    fn a_resumed_count_is_clamped_and_not_a_decision() {
        let mut a = Autoscaler::new(config(PolicyKind::Cachew), 1, 0.0).unwrap_or_else(|e| panic!("{e}"));
        a.resume(5);
        assert_eq!(a.units(), 5, "Cachew too resumes where it was, not at the lower bound");
        a.resume(9);
        let s = a.stats();
        assert_eq!((s.units, s.ups, s.downs, s.decisions.len()), (6, 0, 0, 0));
    }

    #[test]
    fn cachew_starts_at_the_lower_bound_and_fixed_never_moves() {
        let a = Autoscaler::new(config(PolicyKind::Cachew), 4, 0.0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.units(), 1);
        let mut now = 0.0;
        let mut f = Autoscaler::new(config(PolicyKind::Fixed), 3, now).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..5 {
            assert_eq!(feed(&mut f, &mut now, 0.09, 1.0), None);
        }
        assert_eq!(f.stats().windows, 5);
    }

    #[test]
    fn bad_bounds_and_empty_windows_are_refused() {
        let c = AutoscaleConfig::new(PolicyKind::Fastmatch, 3, 2);
        assert_eq!(Autoscaler::new(c, 1, 0.0).err(), Some(ConfigError::Bounds { min: 3, max: 2 }));
        let c = AutoscaleConfig { window: WindowBy::Millis(0), ..AutoscaleConfig::new(PolicyKind::Fixed, 1, 2) };
        assert_eq!(Autoscaler::new(c, 1, 0.0).err(), Some(ConfigError::EmptyWindow));
    }
}
