//! Cachew's autoscaler, following its code (eth-easl/cachew,
//! `tensorflow/core/data/service/easl/scaling_utils.cc`, `DynamicWorkerCountUpdate`):
//!
//! * scaling starts at one unit (here: the lower bound) and adds one per window while
//!   the client's batch time improves by more than 7% against the last window at a
//!   different count; when it does not, it steps back to that count and calls it converged;
//! * scaling down removes one per window while the batch time worsens by less than 3%;
//! * a relative change beyond ±1.2 is discarded as unstable;
//! * once converged, after more than 20 stable windows it compares the latest window with
//!   the converged one: result queue grown by more than 50% → one unit down and scale
//!   again; batch time grown by more than 50% → one unit up and scale again.
//!
//! Their pause in metric collection after each change (150 batches) and their window
//! (500 batches in the code) are the controller's `settle` and window settings.

use super::{Policy, Verdict};
use crate::signals::Window;

const MIN_IMPROVEMENT_UP: f64 = 0.07;
const MIN_IMPROVEMENT_DOWN: f64 = 0.03;
const STABLE_WINDOWS_BEFORE_RESCALING: u32 = 20;
const MIN_QUEUE_GROWTH: f64 = 1.5;
const MIN_BATCH_TIME_GROWTH: f64 = 1.5;
const UNSTABLE_CHANGE: f64 = 1.2;

#[derive(Debug, Clone, Copy)]
struct Reading {
    units: usize,
    batch_time_ms: f64,
    queue: f64,
}

#[derive(Debug, Clone)]
pub struct Cachew {
    min: usize,
    scaling: bool,
    history: Vec<Reading>,
    converged: Option<Reading>,
    stable_windows: u32,
    target: usize,
}

impl Cachew {
    pub fn new(min: usize) -> Self {
        let min = min.max(1);
        Self { min, scaling: true, history: Vec::new(), converged: None, stable_windows: 0, target: min }
    }

    fn go(&mut self, to: usize, reason: String) -> Option<Verdict> {
        self.target = to;
        Some(Verdict { to, reason })
    }

    fn converge(&mut self, at: Reading) {
        self.converged = Some(at);
        self.scaling = false;
        self.stable_windows = 0;
    }

    fn while_scaling(&mut self, last: Reading) -> Option<Verdict> {
        // The last window at a different count.
        let Some(before) = self.history.iter().rev().find(|r| r.units != last.units).copied() else {
            if self.history.len() == 1 {
                return self.go(last.units + 1, "first reading: add a unit".into());
            }
            // Their "should not enter here": scaling is not justified, converge in place.
            self.converge(last);
            return None;
        };
        let improvement = 1.0 - last.batch_time_ms / before.batch_time_ms;
        if !improvement.is_finite() || improvement.abs() > UNSTABLE_CHANGE {
            return None;
        }
        let pct = improvement * 100.0;
        let (b0, b1) = (before.batch_time_ms, last.batch_time_ms);
        if before.units < last.units {
            if improvement > MIN_IMPROVEMENT_UP {
                return self.go(last.units + 1, format!("batch time {b0:.1} → {b1:.1} ms ({pct:+.1}% > 7%): add one"));
            }
            self.converge(before);
            self.go(before.units, format!("batch time {b0:.1} → {b1:.1} ms ({pct:+.1}% ≤ 7%): back one, converged"))
        } else if improvement > -MIN_IMPROVEMENT_DOWN && last.units > self.min {
            self.go(last.units - 1, format!("batch time {b0:.1} → {b1:.1} ms (loss {:.1}% < 3%): remove one", -pct))
        } else {
            self.converge(before);
            self.go(before.units, format!("batch time {b0:.1} → {b1:.1} ms (loss {:.1}%): back one, converged", -pct))
        }
    }

    fn while_stable(&mut self, last: Reading) -> Option<Verdict> {
        let converged = *self.converged.get_or_insert(last);
        self.stable_windows += 1;
        if self.stable_windows <= STABLE_WINDOWS_BEFORE_RESCALING {
            return None;
        }
        self.stable_windows = 0;
        let queue_growth = last.queue / converged.queue;
        let batch_time_growth = last.batch_time_ms / converged.batch_time_ms;
        if queue_growth.is_finite() && queue_growth > MIN_QUEUE_GROWTH && converged.units > self.min {
            self.scaling = true;
            return self.go(
                converged.units - 1,
                format!("after a stable period the result queue grew ×{queue_growth:.2} (> 1.5): remove one"),
            );
        }
        if queue_growth.is_finite() && batch_time_growth > MIN_BATCH_TIME_GROWTH {
            self.scaling = true;
            return self.go(
                converged.units + 1,
                format!("after a stable period the batch time grew ×{batch_time_growth:.2} (> 1.5): add one"),
            );
        }
        None
    }
}

impl Policy for Cachew {
    fn decide(&mut self, w: &Window, units: usize) -> Option<Verdict> {
        if w.batches == 0 {
            return None;
        }
        let last = Reading { units, batch_time_ms: w.batch_time_ms(), queue: w.queue };
        self.history.push(last);
        if units != self.target {
            // "Target metrics count not fulfilled": wait for the units asked for.
            return None;
        }
        if self.scaling {
            self.while_scaling(last)
        } else {
            self.while_stable(last)
        }
    }

    /// Holds the new count as converged, measured from its first window there: without
    /// this the policy waited for its own last target for good.
    fn moved(&mut self, units: usize) {
        self.target = units;
        self.history.clear();
        self.converged = None;
        self.scaling = false;
        self.stable_windows = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's batch time with `units` units each making `rate` batches/s, for a
    /// trainer that needs `step_ms` per batch: whichever side is slower sets the pace.
    fn reading(units: usize, rate: f64, step_ms: f64, queue: f64) -> Window {
        let batch_ms = step_ms.max(1000.0 / (rate * units as f64));
        Window { units, batches: 100, elapsed_s: batch_ms / 10.0, queue, ..Window::default() }
    }

    /// Runs the policy to convergence; returns the counts it went through.
    fn walk(p: &mut Cachew, mut units: usize, rate: f64, step_ms: f64, windows: usize) -> Vec<usize> {
        let mut seen = vec![units];
        for _ in 0..windows {
            if let Some(v) = p.decide(&reading(units, rate, step_ms, 2.0), units) {
                units = v.to;
                seen.push(units);
            }
        }
        seen
    }

    #[test]
    fn adds_one_unit_per_window_then_steps_back_when_the_gain_is_under_seven_percent() {
        let mut p = Cachew::new(1);
        // One unit makes 10 batches/s; the trainer needs 4.5 units' worth (22.2 ms per batch).
        let seen = walk(&mut p, 1, 10.0, 1000.0 / 45.0, 10);
        assert_eq!(seen, vec![1, 2, 3, 4, 5, 6, 5], "N+1 windows to reach N, then one back");
        assert!(!p.scaling);
    }

    #[test]
    fn after_twenty_stable_windows_a_grown_queue_scales_down_one_by_one() {
        let mut p = Cachew::new(1);
        let mut units = *walk(&mut p, 1, 10.0, 1000.0 / 45.0, 10).last().unwrap_or(&0);
        assert_eq!(units, 5);
        // The trainer slows to 1.5 units' worth; the result queue fills up.
        let mut seen = vec![];
        for _ in 0..40 {
            if let Some(v) = p.decide(&reading(units, 10.0, 1000.0 / 15.0, 8.0), units) {
                units = v.to;
                seen.push(units);
            }
        }
        assert_eq!(seen.first(), Some(&4), "{seen:?}");
        assert_eq!(units, 2, "{seen:?}: removes units while the loss is under 3%, then steps back");
    }

    #[test]
    fn a_batch_time_grown_by_half_after_a_stable_period_adds_a_unit() {
        let mut p = Cachew::new(1);
        let units = *walk(&mut p, 1, 10.0, 1000.0 / 25.0, 10).last().unwrap_or(&0);
        assert_eq!(units, 3);
        // Each unit now makes half as much (heavier samples): batch time 40 → 67 ms.
        let mut to = None;
        for _ in 0..21 {
            to = to.or(p.decide(&reading(units, 5.0, 1000.0 / 25.0, 2.0), units).map(|v| v.to));
        }
        assert_eq!(to, Some(4));
    }

    #[test]
    fn unstable_readings_are_discarded() {
        let mut p = Cachew::new(1);
        assert_eq!(p.decide(&reading(1, 10.0, 1.0, 1.0), 1).map(|v| v.to), Some(2));
        // Batch time 100 ms → 1000 ms: a relative change of −9, beyond ±1.2.
        let w = Window { units: 2, batches: 10, elapsed_s: 10.0, ..Window::default() };
        assert_eq!(p.decide(&w, 2), None);
        assert!(p.scaling);
    }
}
