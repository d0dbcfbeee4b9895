//! Parameter types and bounds of the colour ops (`color_jitter`, `gaussian_blur`,
//! `random_erasing`, ...), written the way torchvision's transform classes accept them.

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// A number or a `[min, max]` range, as torchvision's ColorJitter and GaussianBlur take
/// them: `b` means `[center - b, center + b]` for a jitter factor, `[b, b]` for a sigma.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Range {
    One(f64),
    Two([f64; 2]),
}

impl Range {
    /// torchvision's `ColorJitter._check_input`: a single number `v` is `[center - v,
    /// center + v]` (the low end clipped at 0 when `clip`), a pair is taken as is.
    pub fn jitter(&self, center: f64, clip: bool) -> [f64; 2] {
        match *self {
            Range::One(v) => {
                let lo = center - v;
                [if clip { lo.max(0.0) } else { lo }, center + v]
            }
            Range::Two(r) => r,
        }
    }

    /// A sigma: a single number is the range `[v, v]`.
    pub fn fixed_or_range(&self) -> [f64; 2] {
        match *self {
            Range::One(v) => [v, v],
            Range::Two(r) => r,
        }
    }
}

/// A kernel size: one odd number, or `[x, y]` (torchvision's order in `gaussian_blur`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KernelSize {
    One(u32),
    Two([u32; 2]),
}

impl KernelSize {
    /// `[x, y]`.
    pub fn xy(&self) -> [u32; 2] {
        match *self {
            KernelSize::One(k) => [k, k],
            KernelSize::Two(k) => k,
        }
    }
}

/// The marker `"random"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RandomTag {
    Random,
}

/// What `random_erasing` writes: one number for every channel, one per channel, or
/// `"random"` (standard normal noise, as torchvision's `value="random"`). In the output's
/// own units: after `normalize`, 0 is the mean.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErasingValue {
    Random(RandomTag),
    One(f64),
    PerChannel([f64; 3]),
}

impl Default for ErasingValue {
    fn default() -> Self {
        ErasingValue::One(0.0)
    }
}

/// Largest Gaussian kernel side (an odd number).
pub const MAX_KERNEL: u32 = 255;
/// Largest jitter factor, sharpness factor and sigma: far past any use, and small enough
/// that no arithmetic on a u8 pixel overflows.
pub const MAX_FACTOR: f64 = 1000.0;

/// A jitter range for a factor around `center`: a single number in [0, MAX_FACTOR]
/// (at most 0.5 for hue), or `lo <= hi` inside `bound`.
pub(super) fn check_jitter(r: &Range, center: f64, bound: [f64; 2], field: &str) -> Result<(), SpecError> {
    if let Range::One(v) = r {
        if !(0.0..=MAX_FACTOR).contains(v) {
            return Err(SpecError::new(field, format!("a single number must be in [0, {MAX_FACTOR}]; got {v}")));
        }
    }
    let [lo, hi] = r.jitter(center, center != 0.0);
    if !(bound[0] <= lo && lo <= hi && hi <= bound[1]) {
        return Err(SpecError::new(
            field,
            format!("needs {} <= min <= max <= {}; got [{lo}, {hi}]", bound[0], bound[1]),
        ));
    }
    Ok(())
}

/// A factor (brightness, sharpness): in [0, MAX_FACTOR].
pub(super) fn check_factor(v: f64, field: &str) -> Result<(), SpecError> {
    if !(0.0..=MAX_FACTOR).contains(&v) {
        return Err(SpecError::new(field, format!("must be in [0, {MAX_FACTOR}]; got {v}")));
    }
    Ok(())
}

pub(super) fn check_kernel(k: &KernelSize, field: &str) -> Result<(), SpecError> {
    if k.xy().iter().any(|&k| k % 2 == 0 || k > MAX_KERNEL) {
        return Err(SpecError::new(field, format!("needs odd sides in 1..={MAX_KERNEL}; got {:?}", k.xy())));
    }
    Ok(())
}

pub(super) fn check_sigma(s: &Range, field: &str) -> Result<(), SpecError> {
    let [lo, hi] = s.fixed_or_range();
    if !(lo > 0.0 && lo <= hi && hi <= MAX_FACTOR) {
        return Err(SpecError::new(field, format!("needs 0 < min <= max <= {MAX_FACTOR}; got [{lo}, {hi}]")));
    }
    Ok(())
}

pub(super) fn check_erasing(
    scale: [f64; 2],
    ratio: [f64; 2],
    value: &ErasingValue,
    field: impl Fn(&str) -> String,
) -> Result<(), SpecError> {
    if !(0.0 <= scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
        return Err(SpecError::new(field("scale"), "needs 0 <= min <= max <= 1"));
    }
    if !(ratio[0] > 0.0 && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
        return Err(SpecError::new(field("ratio"), "needs 0 < min <= max"));
    }
    let finite = match value {
        ErasingValue::Random(_) => true,
        ErasingValue::One(v) => v.is_finite(),
        ErasingValue::PerChannel(v) => v.iter().all(|v| v.is_finite()),
    };
    if !finite {
        return Err(SpecError::new(field("value"), "must be finite numbers or \"random\""));
    }
    Ok(())
}
