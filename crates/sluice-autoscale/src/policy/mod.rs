//! The policies, all reading the same [`Window`]s and selectable by name.

mod cachew;
mod fastmatch;
mod tfdata;
mod utilisation;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use cachew::Cachew;
pub use fastmatch::FastMatch;
pub use tfdata::TfData;
pub use utilisation::Utilisation;

use crate::signals::Window;

/// A policy's answer to a window: go to `to` units, for `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub to: usize,
    pub reason: String,
}

/// Reads one window at a time (taken while `units` ran) and names a unit count when it
/// wants a change. The caller clamps it to its bounds and actuates it.
pub trait Policy: Send {
    fn decide(&mut self, w: &Window, units: usize) -> Option<Verdict>;

    /// The count became `units` from outside the policy: an operator's order, or a
    /// restarted dispatcher resuming the count it had journaled. The policy goes on from
    /// there; readings taken before no longer apply.
    fn moved(&mut self, units: usize);
}

/// The policies by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// sluice's one-step reading of FastMatch's Algorithm 2: close the P−Q gap in one step
    /// sized by the per-unit rate (the paper leaves the step δ open).
    Fastmatch,
    /// Cachew's incremental policy, as in its `scaling_utils.cc`.
    Cachew,
    /// tf.data service's AutoScaler rule: Σ consumer rates ÷ mean per-unit rate.
    Tfdata,
    /// The Kubernetes Horizontal Pod Autoscaler's rule, Cachew's baseline:
    /// ⌈units × utilisation ÷ target⌉ with its tolerance and scale-down stabilisation.
    Utilisation,
    /// No scaling.
    Fixed,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [Self::Fastmatch, Self::Cachew, Self::Tfdata, Self::Utilisation, Self::Fixed];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fastmatch => "fastmatch",
            Self::Cachew => "cachew",
            Self::Tfdata => "tfdata",
            Self::Utilisation => "utilisation",
            Self::Fixed => "fixed",
        }
    }

    /// A fresh policy of this kind; `min` is the fewest units it may ask for (the
    /// controller clamps every answer to its bounds as well).
    pub fn build(self, min: usize) -> Box<dyn Policy> {
        match self {
            Self::Fastmatch => Box::new(FastMatch::default()),
            Self::Cachew => Box::new(Cachew::new(min)),
            Self::Tfdata => Box::new(TfData::default()),
            Self::Utilisation => Box::new(Utilisation::new(min)),
            Self::Fixed => Box::new(Fixed),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown autoscaling policy {0:?} (choose fastmatch, cachew, tfdata, utilisation or fixed)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Today's behaviour: the unit count never changes.
struct Fixed;

impl Policy for Fixed {
    fn decide(&mut self, _w: &Window, _units: usize) -> Option<Verdict> {
        None
    }

    fn moved(&mut self, _units: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_chosen_by_name_and_unknown_names_are_refused() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>().ok(), Some(k));
        }
        let e = "fastmath".parse::<PolicyKind>().err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("unknown autoscaling policy \"fastmath\" (choose fastmatch, cachew, tfdata, utilisation or fixed)")
        );
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::signals::Window;

    /// A one-second window in which each of `units` makes `rate` batches per busy second
    /// and the trainer takes `consumption` batches per second without waiting.
    pub(crate) fn window(units: usize, rate: f64, consumption: f64) -> Window {
        Window {
            units,
            batches: consumption.round().max(1.0) as u64,
            elapsed_s: consumption.round().max(1.0) / consumption,
            busy_s: units as f64,
            produced: rate * units as f64,
            ..Window::default()
        }
    }

    /// A small deterministic generator (xorshift64*) for noisy readings.
    pub(crate) struct Noise(u64);

    impl Noise {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed.max(1))
        }

        /// A factor uniform in `1 ± spread`.
        pub(crate) fn factor(&mut self, spread: f64) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let u = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
            1.0 + spread * (2.0 * u - 1.0)
        }
    }
}
