//! Utilisation-based scaling, the Kubernetes Horizontal Pod Autoscaler's algorithm, as
//! the baseline Cachew's headline is measured against (Kubernetes-style autoscaling on
//! CPU utilisation). It is a Kubernetes baseline, not a policy from the papers; it follows
//! the HPA documentation ("Horizontal Pod Autoscaling", section "Algorithm details") and
//! its controller's defaults:
//!
//! * utilisation = busy unit-seconds ÷ (units × elapsed seconds) of the window, at most 1
//!   (busy time of work that straddles windows can read a little over);
//! * desired = ⌈units × utilisation ÷ target⌉;
//! * tolerance: no change while |utilisation ÷ target − 1| ≤ 0.1
//!   (`--horizontal-pod-autoscaler-tolerance`, default 0.1);
//! * scale-down stabilisation: a scale-down goes to the highest recommendation of the
//!   last [`Utilisation::stabilisation_windows`] windows (`behavior.scaleDown.
//!   stabilizationWindowSeconds`, default 300 s); scale-ups act at once (its scale-up
//!   window defaults to 0 s) but add at most max(100%, 4 units) per decision (its default
//!   scale-up policies, per 15 s period).
//!
//! The target defaults to 80%: the HPA's own default when no target is given
//! (`targetCPUUtilizationPercentage` of `autoscaling/v1`, defaulted to 80). The 50% of the
//! documentation's walkthrough is an example for a web server that needs headroom for
//! bursts; a loader's units are saturated or idle, and 80% leaves 25% of headroom.
//! Kubernetes' 300 s window over its 15 s sync period is 20 decisions: the default here
//! is 20 windows, so the window the stabilisation spans scales with the controller's
//! window as the other policies' counts do (Cachew's 20 stable windows).

use std::collections::VecDeque;

use super::{Policy, Verdict};
use crate::signals::Window;

#[derive(Debug, Clone)]
pub struct Utilisation {
    /// Utilisation aimed at, in (0, 1].
    pub target: f64,
    /// No change while |utilisation ÷ target − 1| is at most this.
    pub tolerance: f64,
    /// Windows whose recommendations a scale-down considers (this one included).
    pub stabilisation_windows: usize,
    min: usize,
    /// Recommendations of the latest windows, oldest first.
    recent: VecDeque<usize>,
}

impl Utilisation {
    pub const DEFAULT_TARGET: f64 = 0.8;
    pub const DEFAULT_TOLERANCE: f64 = 0.1;
    pub const DEFAULT_STABILISATION_WINDOWS: usize = 20;

    /// The HPA's defaults, never asking for fewer than `min` units (at least 1).
    pub fn new(min: usize) -> Self {
        Self {
            target: Self::DEFAULT_TARGET,
            tolerance: Self::DEFAULT_TOLERANCE,
            stabilisation_windows: Self::DEFAULT_STABILISATION_WINDOWS,
            min: min.max(1),
            recent: VecDeque::new(),
        }
    }

    /// busy ÷ (units × elapsed) in [0, 1]; none when the window spans no unit-time.
    fn utilisation(w: &Window, units: usize) -> Option<f64> {
        let capacity = units as f64 * w.elapsed_s;
        (capacity > 0.0 && w.busy_s.is_finite()).then(|| (w.busy_s / capacity).clamp(0.0, 1.0))
    }

    fn remember(&mut self, recommendation: usize) {
        self.recent.push_back(recommendation);
        while self.recent.len() > self.stabilisation_windows.max(1) {
            self.recent.pop_front();
        }
    }
}

impl Policy for Utilisation {
    fn decide(&mut self, w: &Window, units: usize) -> Option<Verdict> {
        let u = Self::utilisation(w, units)?;
        let target = if self.target > 0.0 && self.target <= 1.0 { self.target } else { Self::DEFAULT_TARGET };
        let ratio = u / target;
        let recommendation = if (ratio - 1.0).abs() <= self.tolerance {
            units
        } else {
            let desired = ((units as f64 * ratio).ceil() as usize).max(self.min);
            desired.min((units * 2).max(units + 4))
        };
        self.remember(recommendation);
        let (to, how) = if recommendation > units {
            (recommendation, String::new())
        } else {
            let highest = self.recent.iter().copied().max().unwrap_or(recommendation);
            (highest.min(units), format!(", highest of the last {} windows {highest}", self.recent.len()))
        };
        (to != units).then(|| Verdict {
            to,
            reason: format!(
                "utilisation {:.0}% against target {:.0}%: {recommendation} units recommended{how}",
                u * 100.0,
                target * 100.0
            ),
        })
    }

    /// Starts the stabilisation over: the new count counts as a recommendation, so a
    /// scale-down below it waits a full stabilisation window.
    fn moved(&mut self, units: usize) {
        self.recent.clear();
        self.recent.push_back(units.max(self.min));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{AutoscaleConfig, Autoscaler};
    use crate::policy::PolicyKind;
    use crate::signals::WindowBy;

    /// A one-second window in which `units` were busy `utilisation` of the time.
    fn busy(units: usize, utilisation: f64) -> Window {
        Window {
            units,
            batches: 10,
            elapsed_s: 1.0,
            busy_s: units as f64 * utilisation,
            produced: 10.0,
            ..Window::default()
        }
    }

    fn to(v: Option<Verdict>) -> Option<usize> {
        v.map(|v| v.to)
    }

    #[test]
    fn saturated_units_scale_up_by_utilisation_over_target_with_capped_growth() {
        let mut p = Utilisation::new(1);
        // 4 × 1.0 ÷ 0.8 = 5.
        assert_eq!(to(p.decide(&busy(4, 1.0), 4)), Some(5));
        // 1 × 1.0 ÷ 0.8 = 1.25 → 2.
        assert_eq!(to(p.decide(&busy(1, 1.0), 1)), Some(2));
        // 20 × 1.0 ÷ 0.1 = 200, capped at 2 × 20.
        p.target = 0.1;
        assert_eq!(to(p.decide(&busy(20, 1.0), 20)), Some(40));
    }

    #[test]
    fn utilisation_within_the_tolerance_holds() {
        let mut p = Utilisation::new(1);
        // 0.8 × 1.1 = 0.88 and 0.8 × 0.9 = 0.72 are inside; 10 × 0.86 ÷ 0.8 would be 11.
        for u in [0.86, 0.8, 0.73] {
            assert_eq!(p.decide(&busy(10, u), 10), None, "utilisation {u}");
        }
        assert_eq!(to(p.decide(&busy(10, 0.9), 10)), Some(12), "just outside: ⌈11.25⌉");
    }

    #[test]
    fn scaling_down_waits_for_the_stabilisation_window() {
        let mut p = Utilisation::new(1);
        p.stabilisation_windows = 3;
        assert_eq!(p.decide(&busy(4, 0.8), 4), None, "on target: 4 recommended");
        // Idle at 20%: 1 recommended, but 4 was recommended within the last 3 windows.
        assert_eq!(p.decide(&busy(4, 0.2), 4), None);
        assert_eq!(p.decide(&busy(4, 0.2), 4), None);
        let v = p.decide(&busy(4, 0.2), 4);
        assert_eq!(to(v.clone()), Some(1), "the 4 left the window");
        assert!(v.is_some_and(|v| v.reason.contains("utilisation 20% against target 80%")));
        // After a move from outside, a scale-down waits a full window again.
        p.moved(3);
        assert_eq!(p.decide(&busy(3, 0.2), 3), None);
        assert_eq!(p.decide(&busy(3, 0.2), 3), None);
        assert_eq!(to(p.decide(&busy(3, 0.2), 3)), Some(1));
        // A scale-up is never held back.
        assert_eq!(to(p.decide(&busy(1, 1.0), 1)), Some(2));
    }

    #[test]
    fn a_scale_down_goes_to_the_highest_recent_recommendation() {
        let mut p = Utilisation::new(1);
        p.stabilisation_windows = 3;
        assert_eq!(p.decide(&busy(8, 0.75), 8), None, "within the tolerance: 8");
        assert_eq!(p.decide(&busy(8, 0.5), 8), None, "5 recommended, 8 within the window");
        assert_eq!(p.decide(&busy(8, 0.3), 8), None, "3 recommended, 8 within the window");
        assert_eq!(to(p.decide(&busy(8, 0.3), 8)), Some(5), "highest of 5, 3, 3");
    }

    #[test]
    fn idle_units_never_go_below_the_lower_bound_and_empty_windows_are_ignored() {
        let mut p = Utilisation::new(1);
        p.stabilisation_windows = 1;
        assert_eq!(to(p.decide(&busy(6, 0.0), 6)), Some(1), "never below one");
        let mut p = Utilisation::new(3);
        p.stabilisation_windows = 1;
        assert_eq!(to(p.decide(&busy(6, 0.0), 6)), Some(3), "never below the lower bound");
        // No elapsed time, no units, or a NaN reading: no decision, nothing remembered.
        let mut nan = busy(4, 1.0);
        nan.busy_s = f64::NAN;
        for (w, units) in [(Window { elapsed_s: 0.0, ..busy(4, 1.0) }, 4), (busy(0, 1.0), 0), (nan, 4)] {
            assert_eq!(p.decide(&w, units), None, "{w:?}");
        }
        assert!(p.recent.len() <= 1);
    }

    #[test]
    fn the_controller_keeps_it_within_its_bounds() {
        let c = AutoscaleConfig {
            window: WindowBy::Batches(10),
            settle_batches: 0,
            ..AutoscaleConfig::new(PolicyKind::Utilisation, 2, 5)
        };
        let mut now = 0.0;
        let mut a = Autoscaler::new(c, 4, now).unwrap_or_else(|e| panic!("{e}"));
        let mut run = |a: &mut Autoscaler, utilisation: f64| {
            let mut last = None;
            for _ in 0..10 {
                now += 0.1;
                a.record_batch(now, 0.0);
                a.record_work(a.units() as f64 * 0.1 * utilisation, 1.0);
                last = a.tick(now, 0.0).or(last);
            }
            last
        };
        // Saturated at 4: 5 wanted, 5 allowed; saturated at 5: 7 wanted, 5 allowed.
        assert_eq!(run(&mut a, 1.0).map(|d| d.to), Some(5));
        assert_eq!(run(&mut a, 1.0), None);
        assert_eq!(a.units(), 5);
        // Idle: 1 recommended, after the stabilisation window, clamped to 2.
        let downs: Vec<usize> = (0..Utilisation::DEFAULT_STABILISATION_WINDOWS + 1)
            .filter_map(|_| run(&mut a, 0.0).map(|d| d.to))
            .collect();
        assert_eq!(downs, vec![2]);
        assert_eq!(a.stats().policy, "utilisation");
    }
}
