//! The signals every policy reads, measured over windows of batches or of time.
//!
//! * consumption Q: batches per second the trainer would take if it never waited, i.e.
//!   batches ÷ (time between its `next()` calls − time it waited for data);
//! * stall: waited ÷ elapsed;
//! * production P: what the current units can make, i.e. batches per unit-second of busy
//!   time × units. Busy time, not wall time, so an over-provisioned (idle) unit still
//!   reads its true rate.
//!
//! [`RateMeter`] is the plain one: counts per second over the last few seconds, from
//! cumulative counters sampled now and then (a stream's arrivals and consumption).
//!
//! Times are plain seconds from the caller's clock, so the meters are testable without one.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// `count` per second over `seconds` (0 over an empty or negative span).
pub fn per_second(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count / seconds
    } else {
        0.0
    }
}

/// `N` cumulative counters sampled at times on the caller's clock, kept over a sliding
/// window: [`RateMeter::rates`] is each counter's growth per second across it.
#[derive(Debug, Clone)]
pub struct RateMeter<const N: usize> {
    window_s: f64,
    points: VecDeque<(f64, [u64; N])>,
}

impl<const N: usize> RateMeter<N> {
    /// Rates over the last `window_s` seconds.
    pub fn new(window_s: f64) -> Self {
        Self { window_s, points: VecDeque::new() }
    }

    /// The counters' values at `now_s`. Points older than the window go, but the newest
    /// two stay so a rate is known between samples.
    pub fn record(&mut self, now_s: f64, counts: [u64; N]) {
        self.points.push_back((now_s, counts));
        while self.points.len() > 2 && self.points.front().is_some_and(|p| now_s - p.0 > self.window_s) {
            self.points.pop_front();
        }
    }

    /// Whether no point was recorded yet, or the last is `every_s` old at `now_s`.
    pub fn due(&self, now_s: f64, every_s: f64) -> bool {
        self.points.back().is_none_or(|p| now_s - p.0 >= every_s)
    }

    /// Each counter's growth per second over the window (0 before two points).
    pub fn rates(&self) -> [f64; N] {
        let (Some(a), Some(b)) = (self.points.front(), self.points.back()) else { return [0.0; N] };
        let dt = b.0 - a.0;
        std::array::from_fn(|i| per_second(b.1[i].saturating_sub(a.1[i]) as f64, dt))
    }
}

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
    /// Each job's rates, where several jobs share the units (the service); empty means one
    /// job, whose rates are the window's own.
    #[serde(default)]
    pub jobs: Vec<JobRates>,
    /// The accelerator's busy fraction (0..=1) as its trainers reported it from a device
    /// counter (e.g. `torch.cuda.utilization()`, DCGM), FastMatch's GPU signal; `None`
    /// when none reported one. The step-timing reading is `1 − stall` and needs no field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_busy: Option<f64>,
}

/// One job's share of a window: its trainers' consumption and what a unit makes of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRates {
    pub job: u64,
    /// q_i: batches per second the job's trainers take when not waiting.
    pub consumption: f64,
    /// Batches of this job per busy unit-second (0: no unit worked on it in the window).
    pub per_unit_rate: f64,
    /// Fraction of its trainers' time spent waiting for data.
    pub stall: f64,
}

impl Window {
    /// Batches per busy second of one unit (0 when nothing was produced).
    pub fn per_unit_rate(&self) -> f64 {
        per_second(self.produced, self.busy_s)
    }

    /// P: batches per second the window's units can make.
    pub fn production(&self) -> f64 {
        self.per_unit_rate() * self.units as f64
    }

    /// Q: batches per second the trainer takes when not waiting.
    pub fn consumption(&self) -> f64 {
        per_second(self.batches as f64, self.elapsed_s - self.wait_s)
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

    /// Units that match consumption: Σ over jobs of each job's consumption ÷ what a unit
    /// makes of that job (FastMatch's objective, Σ |p_i − q_i| over jobs). A job no unit
    /// worked on in the window reads the window's mean rate. With no jobs listed, the
    /// window's consumption ÷ its per-unit rate. 0 when no rate is known.
    pub fn units_needed(&self) -> f64 {
        let mean = self.per_unit_rate();
        if self.jobs.is_empty() {
            return if mean > 0.0 { self.consumption() / mean } else { 0.0 };
        }
        self.jobs
            .iter()
            .map(|j| {
                let rate = if j.per_unit_rate > 0.0 { j.per_unit_rate } else { mean };
                if rate > 0.0 && j.consumption.is_finite() {
                    j.consumption.max(0.0) / rate
                } else {
                    0.0
                }
            })
            .sum()
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
            jobs: Vec::new(),
            accelerator_busy: None,
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

/// Where an [`AcceleratorMeter`]'s busy fraction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusySource {
    /// The trainer reported it (a device counter, or its own measure of device time).
    Reported,
    /// The trainer's step timing: time between its `next()` calls not spent waiting for
    /// data, over all of that time (compute ÷ (compute + wait)).
    StepTiming,
}

impl BusySource {
    pub fn name(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::StepTiming => "step_timing",
        }
    }
}

/// The accelerator's busy fraction now, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AcceleratorBusy {
    pub busy: f64,
    pub source: BusySource,
}

/// A reported fraction older than this no longer counts (the trainer stopped reporting).
pub const REPORT_FRESH_S: f64 = 10.0;

/// The accelerator's busy fraction over the last few seconds, from the trainer's step
/// timing (each step's compute and wait, on the caller's clock) or, where the trainer
/// reports one, its own reading, which wins while it is fresh.
#[derive(Debug, Clone)]
pub struct AcceleratorMeter {
    /// Cumulative compute and wait, in microseconds.
    totals: [u64; 2],
    steps: RateMeter<2>,
    reported: Option<(f64, f64)>,
}

impl AcceleratorMeter {
    /// Step timing over the last `window_s` seconds.
    pub fn new(window_s: f64) -> Self {
        Self { totals: [0; 2], steps: RateMeter::new(window_s), reported: None }
    }

    /// A step ended at `now_s`: the trainer computed `compute_s` since it took its last
    /// batch and then waited `wait_s` for the next one.
    pub fn record_step(&mut self, now_s: f64, compute_s: f64, wait_s: f64) {
        let us = |s: f64| (s.max(0.0) * 1e6) as u64;
        self.totals[0] = self.totals[0].saturating_add(us(compute_s));
        self.totals[1] = self.totals[1].saturating_add(us(wait_s));
        self.steps.record(now_s, self.totals);
    }

    /// The trainer's own reading at `now_s`, clamped to 0..=1; NaN is ignored.
    pub fn report(&mut self, now_s: f64, busy: f64) {
        if !busy.is_nan() {
            self.reported = Some((now_s, busy.clamp(0.0, 1.0)));
        }
    }

    /// The fresh reported reading at `now_s`, if any.
    pub fn reported(&self, now_s: f64) -> Option<f64> {
        self.reported.filter(|&(t, _)| now_s - t <= REPORT_FRESH_S).map(|(_, b)| b)
    }

    /// The busy fraction at `now_s`: the fresh report, else step timing over the window
    /// (the whole run while it is shorter than two steps apart); `None` before a step.
    pub fn busy(&self, now_s: f64) -> Option<AcceleratorBusy> {
        if let Some(busy) = self.reported(now_s) {
            return Some(AcceleratorBusy { busy, source: BusySource::Reported });
        }
        let [c, w] = self.steps.rates();
        let (c, w) = if c + w > 0.0 { (c, w) } else { (self.totals[0] as f64, self.totals[1] as f64) };
        (c + w > 0.0).then(|| AcceleratorBusy { busy: (c / (c + w)).clamp(0.0, 1.0), source: BusySource::StepTiming })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_compute_over_step_time_unless_a_fresh_report_says_otherwise() {
        let mut m = AcceleratorMeter::new(5.0);
        assert_eq!(m.busy(0.0), None, "no step yet");
        m.record_step(0.1, 0.07, 0.03);
        let b = m.busy(0.1).unwrap_or(AcceleratorBusy { busy: -1.0, source: BusySource::Reported });
        assert!((b.busy - 0.7).abs() < 1e-6 && b.source == BusySource::StepTiming, "{b:?}");
        // Steps of 30 ms compute and 10 ms wait for a while: 0.75 over the window.
        for i in 1..=200 {
            m.record_step(0.1 + i as f64 * 0.04, 0.03, 0.01);
        }
        let b = m.busy(8.1).map(|b| b.busy).unwrap_or(-1.0);
        assert!((b - 0.75).abs() < 1e-3, "{b}");
        m.report(8.1, 1.7);
        assert_eq!(m.busy(9.0), Some(AcceleratorBusy { busy: 1.0, source: BusySource::Reported }), "clamped");
        m.report(9.0, f64::NAN);
        assert_eq!(m.reported(9.0), Some(1.0), "NaN is ignored");
        assert_eq!(m.busy(8.1 + REPORT_FRESH_S + 1.0).map(|b| b.source), Some(BusySource::StepTiming), "stale");
    }

    #[test]
    fn rates_are_growth_per_second_over_the_sliding_window() {
        let mut m = RateMeter::<2>::new(5.0);
        assert_eq!(m.rates(), [0.0, 0.0], "no rate before two points");
        assert!(m.due(0.0, 0.2));
        m.record(0.0, [100, 0]);
        assert!(!m.due(0.1, 0.2) && m.due(0.2, 0.2));
        m.record(2.0, [120, 10]);
        assert_eq!(m.rates(), [10.0, 5.0]);
        // Points past the window go: the rates are the last 5 seconds'.
        m.record(6.0, [200, 10]);
        m.record(8.0, [260, 10]);
        assert_eq!(m.rates(), [30.0, 0.0]);
        // A counter that goes back (a recreated stream) reads 0, not a huge rate.
        m.record(9.0, [0, 10]);
        assert_eq!(m.rates()[0], 0.0);
    }

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
    fn units_needed_add_up_per_job_and_a_job_without_work_reads_the_mean_rate() {
        let w = Window { batches: 10, elapsed_s: 1.0, busy_s: 2.0, produced: 8.0, ..Window::default() };
        assert!((w.units_needed() - 2.5).abs() < 1e-9, "10/s at 4 per unit: {}", w.units_needed());
        let jobs = vec![
            JobRates { job: 1, consumption: 6.0, per_unit_rate: 6.0, stall: 0.0 },
            JobRates { job: 2, consumption: 2.0, per_unit_rate: 0.0, stall: 1.0 },
        ];
        let w = Window { jobs, ..w };
        assert!((w.units_needed() - 1.5).abs() < 1e-9, "1 + 2/4: {}", w.units_needed());
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
