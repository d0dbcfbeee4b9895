//! The signals every policy reads, measured over windows of batches or of time.
//!
//! * consumption Q: batches per second the trainer would take if it never waited, i.e.
//!   batches ÷ (time between its `next()` calls − time it waited for data);
//! * stall: waited ÷ elapsed;
//! * production P: what the current units can make, i.e. batches per unit-second of busy
//!   time × units. Busy time, not wall time, so an over-provisioned (idle) unit still
//!   reads its true rate.
//!
//! Times are plain seconds from the caller's clock, so the meter is testable without one.

use serde::{Deserialize, Serialize};

/// How a window ends: after so many batches handed to the trainer, or so much time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowBy {
    Batches(u64),
    Millis(u64),
}

/// One window's readings: the inputs of a decision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// End of the window, milliseconds since the autoscaler started.
    pub t_ms: u64,
    /// Units that produced during the window.
    pub units: usize,
    /// Batches handed to the trainer.
    pub batches: u64,
    /// Wall time the window spans (seconds).
    pub elapsed_s: f64,
    /// Time the trainer waited for data within it.
    pub wait_s: f64,
    /// Unit-seconds spent producing.
    pub busy_s: f64,
    /// Batches' worth of samples produced.
    pub produced: f64,
    /// Batches ready and waiting for the trainer at the window's end (Cachew's result queue).
    pub queue: f64,
    /// Batches per busy second of each unit, where a caller measures units apart (service
    /// workers); empty means every unit reads the window's mean rate.
    pub unit_rates: Vec<f64>,
}

impl Window {
    /// Batches per busy second of one unit (0 when nothing was produced).
    pub fn per_unit_rate(&self) -> f64 {
        if self.busy_s > 0.0 {
            self.produced / self.busy_s
        } else {
            0.0
        }
    }

    /// P: batches per second the window's units can make.
    pub fn production(&self) -> f64 {
        self.per_unit_rate() * self.units as f64
    }

    /// Q: batches per second the trainer takes when not waiting.
    pub fn consumption(&self) -> f64 {
        let working = self.elapsed_s - self.wait_s;
        if working > 0.0 {
            self.batches as f64 / working
        } else {
            0.0
        }
    }

    /// Fraction of the window the trainer spent waiting for data.
    pub fn stall(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            (self.wait_s / self.elapsed_s).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The client's mean time per batch, waits included (Cachew's signal), in ms.
    pub fn batch_time_ms(&self) -> f64 {
        if self.batches > 0 {
            self.elapsed_s * 1000.0 / self.batches as f64
        } else {
            0.0
        }
    }

    /// Both rates are known: something was produced and consumed.
    pub fn is_complete(&self) -> bool {
        self.production() > 0.0 && self.consumption() > 0.0
    }
}

/// Accumulates counters into windows. The trainer's side calls [`Meter::record_batch`]
/// for each batch it receives, the producers' side [`Meter::record_work`].
#[derive(Debug, Clone)]
pub struct Meter {
    by: WindowBy,
    /// When the current window started (the arrival of the batch before its first).
    start_s: f64,
    /// Arrival of the last batch counted.
    last_s: f64,
    batches: u64,
    wait_s: f64,
    busy_s: f64,
    produced: f64,
    /// Batches still to ignore after a change (their readings straddle it).
    settle: u64,
}

impl Meter {
    pub fn new(by: WindowBy, now_s: f64) -> Self {
        Self { by, start_s: now_s, last_s: now_s, batches: 0, wait_s: 0.0, busy_s: 0.0, produced: 0.0, settle: 0 }
    }

    pub fn by(&self) -> WindowBy {
        self.by
    }

    /// A batch reached the trainer at `now_s` after it waited `wait_s` for it.
    pub fn record_batch(&mut self, now_s: f64, wait_s: f64) {
        if self.settle > 0 {
            self.settle -= 1;
            self.start_s = now_s;
            self.last_s = now_s;
            return;
        }
        self.batches += 1;
        self.wait_s += wait_s.max(0.0);
        self.last_s = now_s;
    }

    /// Units spent `busy_s` unit-seconds producing `batches` batches' worth of samples.
    pub fn record_work(&mut self, busy_s: f64, batches: f64) {
        if self.settle > 0 {
            return;
        }
        self.busy_s += busy_s.max(0.0);
        self.produced += batches.max(0.0);
    }

    /// The window, if it is full at `now_s`; the meter then starts the next one.
    pub fn close(&mut self, now_s: f64, t_ms: u64, units: usize, queue: f64) -> Option<Window> {
        let full = match self.by {
            WindowBy::Batches(n) => self.batches >= n.max(1),
            WindowBy::Millis(ms) => self.batches > 0 && (now_s - self.start_s) * 1000.0 >= ms as f64,
        };
        if !full {
            return None;
        }
        let w = Window {
            t_ms,
            units,
            batches: self.batches,
            elapsed_s: self.last_s - self.start_s,
            wait_s: self.wait_s,
            busy_s: self.busy_s,
            produced: self.produced,
            queue,
            unit_rates: Vec::new(),
        };
        self.start_s = self.last_s;
        (self.batches, self.wait_s, self.busy_s, self.produced) = (0, 0.0, 0.0, 0.0);
        Some(w)
    }

    /// Drops the current window and ignores the next `settle_batches` batches: readings
    /// taken while units start or stop describe neither the old count nor the new one.
    pub fn restart(&mut self, now_s: f64, settle_batches: u64) {
        *self = Self { settle: settle_batches, ..Self::new(self.by, now_s) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumption_excludes_waits_and_production_reads_busy_time() {
        let mut m = Meter::new(WindowBy::Batches(4), 0.0);
        // The trainer computes 0.1 s per batch and waits 0.05 s for each.
        for i in 1..=4 {
            m.record_batch(i as f64 * 0.15, 0.05);
        }
        // 2 units, 0.5 busy s each, made 5 batches' worth.
        m.record_work(1.0, 5.0);
        let w = m.close(0.6, 600, 2, 1.0).unwrap_or_default();
        assert_eq!(w.batches, 4);
        assert!((w.consumption() - 10.0).abs() < 1e-9, "{}", w.consumption());
        assert!((w.stall() - 1.0 / 3.0).abs() < 1e-9, "{}", w.stall());
        assert!((w.per_unit_rate() - 5.0).abs() < 1e-9);
        assert!((w.production() - 10.0).abs() < 1e-9);
        assert!((w.batch_time_ms() - 150.0).abs() < 1e-9);
    }

    #[test]
    fn windows_by_time_close_on_the_first_batch_past_the_span() {
        let mut m = Meter::new(WindowBy::Millis(100), 0.0);
        m.record_batch(0.05, 0.0);
        assert_eq!(m.close(0.05, 50, 1, 0.0), None);
        m.record_batch(0.12, 0.0);
        let w = m.close(0.12, 120, 1, 0.0);
        assert_eq!(w.map(|w| w.batches), Some(2));
        assert_eq!(m.close(0.2, 200, 1, 0.0), None, "a new window started empty");
    }

    #[test]
    fn restart_skips_the_batches_that_straddle_a_change() {
        let mut m = Meter::new(WindowBy::Batches(2), 0.0);
        m.record_batch(0.1, 0.0);
        m.restart(0.1, 2);
        m.record_batch(0.2, 0.1);
        m.record_work(1.0, 1.0);
        m.record_batch(0.3, 0.1);
        assert_eq!(m.close(0.3, 300, 1, 0.0), None, "settling batches are not counted");
        m.record_batch(0.4, 0.0);
        m.record_batch(0.5, 0.0);
        let w = m.close(0.5, 500, 1, 0.0).unwrap_or_default();
        assert_eq!((w.batches, w.wait_s), (2, 0.0));
        assert!((w.elapsed_s - 0.2).abs() < 1e-9, "the window starts at the last settling batch");
    }
}
