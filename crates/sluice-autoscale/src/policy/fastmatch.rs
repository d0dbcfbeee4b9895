//! FastMatch's Algorithm 2 made concrete. Each window gives production P and consumption
//! Q; the units the trainer needs are Q ÷ (P per unit). Where several jobs share the units
//! (the service), they are summed per job, Σ q_i ÷ (p_i per unit), as FastMatch's
//! objective (its equation 1, Σ |p_i − q_i| over tasks) matches each job: totals could
//! agree while one job starves. When the imbalance is beyond the tolerance, the step δ is
//! the whole gap in units (not ±1), so one decision closes it (sluice's design: the paper
//! leaves δ open).
//!
//! The noise guard: a reading only counts when it clears a tolerance band around the
//! current count (more to scale down, where overshooting stalls the trainer, than up), and
//! `persist` readings in a row must agree; the step is sized from the latest. With ±10%
//! noise on P and Q a lone reading crosses the band now and then, two in a row seldom.
//!
//! The GPU signal: FastMatch reads the GPU's utilisation (DCGM) next to the CPU's. Where
//! the trainers report their accelerator's busy fraction ([`Window::accelerator_busy`])
//! and it is at `busy_ceiling` or above, a scale-up is held: the accelerator is the
//! bottleneck and more units would only idle (sluice's design: FastMatch feeds both
//! utilisations to its matching; sluice reads the GPU's only as this guard, since the
//! step-timing reading of it, `1 − stall`, is already in Q).

use super::{Policy, Verdict};
use crate::signals::Window;

#[derive(Debug, Clone)]
pub struct FastMatch {
    /// Scale up when the trainer needs more than `units × (1 + up_tolerance)`.
    pub up_tolerance: f64,
    /// Scale down when `needed × (1 + down_tolerance)` fits in fewer units.
    pub down_tolerance: f64,
    /// Spare production kept above the measured need, so the trainer does not stall.
    pub headroom: f64,
    /// Readings in a row that must agree before acting.
    pub persist: usize,
    /// No scale-up while the reported accelerator busy fraction is at least this.
    pub busy_ceiling: f64,
    /// Units needed, per recent reading since the last change.
    needed: Vec<f64>,
}

impl Default for FastMatch {
    fn default() -> Self {
        Self {
            up_tolerance: 0.05,
            down_tolerance: 0.15,
            headroom: 0.02,
            persist: 2,
            busy_ceiling: 0.95,
            needed: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Lean {
    Up,
    Down,
    Stay,
}

impl FastMatch {
    fn lean(&self, needed: f64, units: usize) -> Lean {
        if needed > units as f64 * (1.0 + self.up_tolerance) {
            Lean::Up
        } else if ((needed * (1.0 + self.down_tolerance)).ceil() as usize) < units {
            Lean::Down
        } else {
            Lean::Stay
        }
    }
}

impl Policy for FastMatch {
    fn decide(&mut self, w: &Window, units: usize) -> Option<Verdict> {
        if !w.is_complete() {
            return None;
        }
        let needed = w.units_needed();
        self.needed.push(needed);
        let persist = self.persist.max(1);
        if self.needed.len() > persist {
            self.needed.remove(0);
        }
        if self.needed.len() < persist {
            return None;
        }
        let lean = self.lean(self.needed[0], units);
        if lean == Lean::Stay || self.needed.iter().any(|&n| self.lean(n, units) != lean) {
            return None;
        }
        if let Some(busy) = w.accelerator_busy.filter(|&b| lean == Lean::Up && b >= self.busy_ceiling) {
            tracing::debug!(busy, "fastmatch: the accelerator is busy; holding the scale-up");
            return None;
        }
        // Sized from the latest reading: the earlier ones only confirm the direction, and
        // one that straddles a change of demand would size the step short of it.
        let latest = self.needed[self.needed.len() - 1];
        let to = ((latest * (1.0 + self.headroom)).ceil() as usize).max(1);
        if to == units {
            return None;
        }
        self.needed.clear();
        let (p, q) = (w.production(), w.consumption());
        let basis = if w.jobs.is_empty() {
            format!("one unit makes {:.2}/s", w.per_unit_rate())
        } else {
            let each: Vec<String> = w
                .jobs
                .iter()
                .map(|j| format!("job {} {:.2}/s at {:.2} per unit", j.job, j.consumption, j.per_unit_rate))
                .collect();
            format!("per job: {}", each.join(", "))
        };
        Some(Verdict {
            to,
            reason: format!(
                "P {p:.2} vs Q {q:.2} batches/s; {basis}, so {latest:.2} units match ({persist} readings \
                 agree); δ = {:+}",
                to as i64 - units as i64
            ),
        })
    }

    fn moved(&mut self, _units: usize) {
        self.needed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{window, Noise};
    use crate::signals::JobRates;

    #[test]
    fn closes_the_whole_gap_in_one_step_sized_by_the_per_unit_rate() {
        let mut p = FastMatch::default();
        // One unit makes 2 batches/s; the trainer takes 15/s: 7.5 units match, 8 with headroom.
        assert_eq!(p.decide(&window(2, 2.0, 15.0), 2), None, "one reading is not enough");
        let v = p.decide(&window(2, 2.0, 15.0), 2);
        assert_eq!(v.as_ref().map(|v| v.to), Some(8), "{v:?}");
        // Demand falls to 5/s: 2.5 units, 3 with headroom.
        assert_eq!(p.decide(&window(8, 2.0, 5.0), 8), None);
        assert_eq!(p.decide(&window(8, 2.0, 5.0), 8).map(|v| v.to), Some(3));
    }

    #[test]
    fn a_reading_that_straddles_a_change_of_demand_does_not_size_the_step_short() {
        let mut p = FastMatch::default();
        // Demand rises from 3.5 to 9.5 units' worth (one unit: 12 batches/s) during the
        // first window, which reads a mix; the second reads the new demand.
        assert_eq!(p.decide(&window(4, 12.0, 78.0), 4), None);
        let v = p.decide(&window(4, 12.0, 114.0), 4);
        assert_eq!(v.as_ref().map(|v| v.to), Some(10), "9.5 units match, 10 with headroom: {v:?}");
    }

    #[test]
    fn readings_that_disagree_do_not_act() {
        let mut p = FastMatch::default();
        assert_eq!(p.decide(&window(4, 1.0, 9.0), 4), None);
        assert_eq!(p.decide(&window(4, 1.0, 4.2), 4), None, "a spike then a normal reading");
        assert_eq!(p.decide(&window(4, 1.0, 1.0), 4), None, "a normal reading then a dip");
    }

    #[test]
    fn two_jobs_of_different_speeds_are_matched_each_not_in_sum() {
        // Two jobs share 2 units. A unit makes 10 batches/s of job 1 but 0.5/s of job 2
        // (ten times the work per batch). Job 1's trainer takes 10/s: 1 unit's worth. Job
        // 2's takes 0.9/s: 1.8 units' worth, but it got 1 unit and waits half the time.
        // In sum the units made 10.5 batches in 2 busy s (5.25 per unit) against 10.9/s
        // taken: 2.08 units, within tolerance of 2, while job 2 starves. Per job, 2.8
        // units match: scale to 3.
        let mut w = window(2, 5.25, 10.9);
        w.jobs = vec![
            JobRates { job: 1, consumption: 10.0, per_unit_rate: 10.0, stall: 0.0 },
            JobRates { job: 2, consumption: 0.9, per_unit_rate: 0.5, stall: 0.5 },
        ];
        let mut p = FastMatch::default();
        assert_eq!(p.decide(&w, 2), None, "one reading is not enough");
        let v = p.decide(&w, 2);
        assert_eq!(v.as_ref().map(|v| v.to), Some(3), "job 2 needs 1.8 units, job 1 one: {v:?}");
        // Once both are fed, no job starves and the count stays.
        let mut fed = w.clone();
        fed.units = 3;
        for _ in 0..4 {
            assert_eq!(p.decide(&fed, 3), None);
        }
    }

    #[test]
    fn a_fully_busy_accelerator_holds_a_scale_up_but_not_a_scale_down() {
        let mut p = FastMatch::default();
        let busy = |units, rate, demand, b| Window { accelerator_busy: Some(b), ..window(units, rate, demand) };
        // 7.5 units' worth of demand on 2 units, but the GPU reports 97% busy: no more units.
        for _ in 0..4 {
            assert_eq!(p.decide(&busy(2, 2.0, 15.0, 0.97), 2), None);
        }
        // The GPU has room (60%): the same readings scale up.
        assert_eq!(p.decide(&busy(2, 2.0, 15.0, 0.6), 2).map(|v| v.to), Some(8));
        // Demand falls: a busy accelerator does not keep idle units.
        assert_eq!(p.decide(&busy(8, 2.0, 5.0, 0.99), 8), None);
        assert_eq!(p.decide(&busy(8, 2.0, 5.0, 0.99), 8).map(|v| v.to), Some(3));
    }

    #[test]
    fn stays_put_at_the_matching_count() {
        let mut p = FastMatch::default();
        for _ in 0..10 {
            // 4.5 units needed, 5 running: within tolerance both ways.
            assert_eq!(p.decide(&window(5, 1.0, 4.5), 5), None);
        }
    }

    #[test]
    fn ten_percent_noise_on_both_signals_costs_at_most_one_action_per_ten_windows() {
        for (rate, demand) in [(1.0, 10.0), (2.0, 7.0), (0.5, 3.3), (1.0, 20.0)] {
            let mut noise = Noise::new(17);
            let mut p = FastMatch::default();
            let mut units = ((demand / rate) * 1.02_f64).ceil() as usize;
            let mut actions = 0;
            for _ in 0..200 {
                let w = window(units, rate * noise.factor(0.1), demand * noise.factor(0.1));
                if let Some(v) = p.decide(&w, units) {
                    actions += 1;
                    units = v.to;
                }
            }
            assert!(actions <= 20, "{actions} actions in 200 windows at demand {demand}, rate {rate}");
        }
    }
}
