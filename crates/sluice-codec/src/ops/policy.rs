//! Augmentation policies (torchvision.transforms.v2's `TrivialAugmentWide`, `RandAugment`,
//! `AutoAugment`): per sample, draw sub-ops from an op space and a magnitude for each, then
//! run the colour and geometric kernels of [`super::color`] and [`super::geometry`] with it,
//! as torchvision's `_apply_image_or_video_transform` dispatches to its functionals.
//!
//! The magnitude tables are torchvision's `_AUGMENTATION_SPACE`, computed in float32 as its
//! `torch.linspace` does; [`space`] exposes them as data so the Python tests compare them
//! with torchvision's own. Draws, all from the sample's RNG and in this order: the op (or
//! AutoAugment's sub-policy, then each op's `p`), the magnitude bin (TrivialAugmentWide
//! only), the sign of a signed op (`rand <= 0.5` negates, as there).

use std::cell::RefCell;

use sluice_core::{AutoAugmentPolicy, Interpolation, OpSpec, SampleRng};

use super::color;
use super::geometry::{self, AffineParams, Warp};
use super::{frames, not_mine, Frame};
use crate::CodecError;

/// One op of a policy's space (torchvision's `transform_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOp {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

impl PolicyOp {
    const ALL: [PolicyOp; 15] = [
        PolicyOp::Identity,
        PolicyOp::ShearX,
        PolicyOp::ShearY,
        PolicyOp::TranslateX,
        PolicyOp::TranslateY,
        PolicyOp::Rotate,
        PolicyOp::Brightness,
        PolicyOp::Color,
        PolicyOp::Contrast,
        PolicyOp::Sharpness,
        PolicyOp::Posterize,
        PolicyOp::Solarize,
        PolicyOp::AutoContrast,
        PolicyOp::Equalize,
        PolicyOp::Invert,
    ];

    /// torchvision's name for it.
    pub fn name(self) -> &'static str {
        match self {
            PolicyOp::Identity => "Identity",
            PolicyOp::ShearX => "ShearX",
            PolicyOp::ShearY => "ShearY",
            PolicyOp::TranslateX => "TranslateX",
            PolicyOp::TranslateY => "TranslateY",
            PolicyOp::Rotate => "Rotate",
            PolicyOp::Brightness => "Brightness",
            PolicyOp::Color => "Color",
            PolicyOp::Contrast => "Contrast",
            PolicyOp::Sharpness => "Sharpness",
            PolicyOp::Posterize => "Posterize",
            PolicyOp::Solarize => "Solarize",
            PolicyOp::AutoContrast => "AutoContrast",
            PolicyOp::Equalize => "Equalize",
            PolicyOp::Invert => "Invert",
        }
    }

    pub fn from_name(name: &str) -> Option<PolicyOp> {
        PolicyOp::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// Which `_AUGMENTATION_SPACE`: TrivialAugmentWide's, RandAugment's, AutoAugment's or
/// AugMix's (its `all_ops` space; the first 9 ops are its partial one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    TrivialAugmentWide,
    RandAugment,
    AutoAugment,
    AugMix,
}

/// AugMix's ops without `all_ops` (its `_PARTIAL_AUGMENTATION_SPACE`, which comes first).
const AUGMIX_PARTIAL: usize = 9;
/// AugMix's magnitude bins (torchvision's `_PARAMETER_MAX`).
const AUGMIX_BINS: u32 = 10;

impl Space {
    pub fn from_name(name: &str) -> Option<Space> {
        match name {
            "trivial_augment_wide" => Some(Space::TrivialAugmentWide),
            "rand_augment" => Some(Space::RandAugment),
            "auto_augment" => Some(Space::AutoAugment),
            "augmix" => Some(Space::AugMix),
            _ => None,
        }
    }

    /// The ops in torchvision's order (the order `randint` indexes).
    pub fn ops(self) -> &'static [PolicyOp] {
        // `ALL` is in torchvision's order: TrivialAugmentWide's and RandAugment's space is
        // all but Invert, AutoAugment's all but Identity. AugMix's has its own order.
        const WIDE: &[PolicyOp] = PolicyOp::ALL.split_at(14).0;
        const AUTO: &[PolicyOp] = PolicyOp::ALL.split_at(1).1;
        use PolicyOp::*;
        const AUGMIX: [PolicyOp; 13] = [
            ShearX,
            ShearY,
            TranslateX,
            TranslateY,
            Rotate,
            Posterize,
            Solarize,
            AutoContrast,
            Equalize,
            Brightness,
            Color,
            Contrast,
            Sharpness,
        ];
        match self {
            Space::TrivialAugmentWide | Space::RandAugment => WIDE,
            Space::AutoAugment => AUTO,
            Space::AugMix => &AUGMIX,
        }
    }

    /// Whether `op` takes a random sign.
    pub fn signed(self, op: PolicyOp) -> bool {
        use PolicyOp::*;
        matches!(op, ShearX | ShearY | TranslateX | TranslateY | Rotate | Brightness | Color | Contrast | Sharpness)
    }

    /// `magnitudes_fn(bins, height, width)[i]`, or `None` for an op without a magnitude.
    pub fn magnitude(self, op: PolicyOp, bins: u32, i: u32, height: u32, width: u32) -> Option<f32> {
        use PolicyOp::*;
        let wide = self == Space::TrivialAugmentWide;
        let lin = |end: f64| Some(linspace(0.0, end as f32, bins, i));
        if self == Space::AugMix {
            return match op {
                Identity | AutoContrast | Equalize | Invert => None,
                ShearX | ShearY => lin(0.3),
                Brightness | Color | Contrast | Sharpness => lin(0.9),
                TranslateX => lin(f64::from(width) / 3.0),
                TranslateY => lin(f64::from(height) / 3.0),
                Rotate => lin(30.0),
                // (4 - (arange(bins) / ((bins - 1) / 4))).round().int(), in float32.
                Posterize => Some((4.0 - i as f32 / ((f64::from(bins) - 1.0) / 4.0) as f32).round_ties_even()),
                Solarize => Some(linspace(1.0, 0.0, bins, i)),
            };
        }
        match op {
            Identity | AutoContrast | Equalize | Invert => None,
            ShearX | ShearY => lin(if wide { 0.99 } else { 0.3 }),
            Brightness | Color | Contrast | Sharpness => lin(if wide { 0.99 } else { 0.9 }),
            TranslateX if wide => lin(32.0),
            TranslateY if wide => lin(32.0),
            TranslateX => lin(150.0 / 331.0 * f64::from(width)),
            TranslateY => lin(150.0 / 331.0 * f64::from(height)),
            Rotate => lin(if wide { 135.0 } else { 30.0 }),
            Posterize => {
                // (8 - (arange(bins) / ((bins - 1) / k))).round().int(), in float32.
                let k = if wide { 6.0 } else { 4.0 };
                let div = ((f64::from(bins) - 1.0) / k) as f32;
                Some((8.0 - i as f32 / div).round_ties_even())
            }
            Solarize => Some(linspace(1.0, 0.0, bins, i)),
        }
    }
}

/// Element `i` of `torch.linspace(start, end, steps)` in float32 as its CPU kernel computes
/// it: from the start for the first half, from the end for the rest, each a fused
/// multiply-add (its vectorized path), so one rounding.
fn linspace(start: f32, end: f32, steps: u32, i: u32) -> f32 {
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if i < steps / 2 {
        step.mul_add(i as f32, start)
    } else {
        (-step).mul_add((steps - 1 - i) as f32, end)
    }
}

/// torchvision's AutoAugment sub-policies: `(op, p, magnitude bin)` pairs.
type SubPolicy = [(PolicyOp, f32, u8); 2];

fn sub_policies(policy: AutoAugmentPolicy) -> &'static [SubPolicy; 25] {
    use PolicyOp::*;
    const IMAGENET: [SubPolicy; 25] = [
        [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
        [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
        [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
        [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
        [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
        [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
        [(Rotate, 0.8, 8), (Color, 0.4, 0)],
        [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
        [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Rotate, 0.8, 8), (Color, 1.0, 2)],
        [(Color, 0.8, 8), (Solarize, 0.8, 7)],
        [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
        [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
        [(Color, 0.4, 0), (Equalize, 0.6, 0)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
    ];
    const CIFAR10: [SubPolicy; 25] = [
        [(Invert, 0.1, 0), (Contrast, 0.2, 6)],
        [(Rotate, 0.7, 2), (TranslateX, 0.3, 9)],
        [(Sharpness, 0.8, 1), (Sharpness, 0.9, 3)],
        [(ShearY, 0.5, 8), (TranslateY, 0.7, 9)],
        [(AutoContrast, 0.5, 0), (Equalize, 0.9, 0)],
        [(ShearY, 0.2, 7), (Posterize, 0.3, 7)],
        [(Color, 0.4, 3), (Brightness, 0.6, 7)],
        [(Sharpness, 0.3, 9), (Brightness, 0.7, 9)],
        [(Equalize, 0.6, 0), (Equalize, 0.5, 0)],
        [(Contrast, 0.6, 7), (Sharpness, 0.6, 5)],
        [(Color, 0.7, 7), (TranslateX, 0.5, 8)],
        [(Equalize, 0.3, 0), (AutoContrast, 0.4, 0)],
        [(TranslateY, 0.4, 3), (Sharpness, 0.2, 6)],
        [(Brightness, 0.9, 6), (Color, 0.2, 8)],
        [(Solarize, 0.5, 2), (Invert, 0.0, 0)],
        [(Equalize, 0.2, 0), (AutoContrast, 0.6, 0)],
        [(Equalize, 0.2, 0), (Equalize, 0.6, 0)],
        [(Color, 0.9, 9), (Equalize, 0.6, 0)],
        [(AutoContrast, 0.8, 0), (Solarize, 0.2, 8)],
        [(Brightness, 0.1, 3), (Color, 0.7, 0)],
        [(Solarize, 0.4, 5), (AutoContrast, 0.9, 0)],
        [(TranslateY, 0.9, 9), (TranslateY, 0.7, 9)],
        [(AutoContrast, 0.9, 0), (Solarize, 0.8, 3)],
        [(Equalize, 0.8, 0), (Invert, 0.1, 0)],
        [(TranslateY, 0.7, 9), (AutoContrast, 0.9, 0)],
    ];
    const SVHN: [SubPolicy; 25] = [
        [(ShearX, 0.9, 4), (Invert, 0.2, 0)],
        [(ShearY, 0.9, 8), (Invert, 0.7, 0)],
        [(Equalize, 0.6, 0), (Solarize, 0.6, 6)],
        [(Invert, 0.9, 0), (Equalize, 0.6, 0)],
        [(Equalize, 0.6, 0), (Rotate, 0.9, 3)],
        [(ShearX, 0.9, 4), (AutoContrast, 0.8, 0)],
        [(ShearY, 0.9, 8), (Invert, 0.4, 0)],
        [(ShearY, 0.9, 5), (Solarize, 0.2, 6)],
        [(Invert, 0.9, 0), (AutoContrast, 0.8, 0)],
        [(Equalize, 0.6, 0), (Rotate, 0.9, 3)],
        [(ShearX, 0.9, 4), (Solarize, 0.3, 3)],
        [(ShearY, 0.8, 8), (Invert, 0.7, 0)],
        [(Equalize, 0.9, 0), (TranslateY, 0.6, 6)],
        [(Invert, 0.9, 0), (Equalize, 0.6, 0)],
        [(Contrast, 0.3, 3), (Rotate, 0.8, 4)],
        [(Invert, 0.8, 0), (TranslateY, 0.0, 2)],
        [(ShearY, 0.7, 6), (Solarize, 0.4, 8)],
        [(Invert, 0.6, 0), (Rotate, 0.8, 4)],
        [(ShearY, 0.3, 7), (TranslateX, 0.9, 3)],
        [(ShearX, 0.1, 6), (Invert, 0.6, 0)],
        [(Solarize, 0.7, 2), (TranslateY, 0.6, 7)],
        [(ShearY, 0.8, 4), (Invert, 0.8, 0)],
        [(ShearX, 0.7, 9), (TranslateY, 0.8, 3)],
        [(ShearY, 0.8, 5), (AutoContrast, 0.7, 0)],
        [(ShearX, 0.7, 2), (Invert, 0.1, 0)],
    ];
    match policy {
        AutoAugmentPolicy::Imagenet => &IMAGENET,
        AutoAugmentPolicy::Cifar10 => &CIFAR10,
        AutoAugmentPolicy::Svhn => &SVHN,
    }
}

pub(super) fn runs(op: &OpSpec) -> bool {
    matches!(
        op,
        OpSpec::TrivialAugmentWide { .. }
            | OpSpec::RandAugment { .. }
            | OpSpec::AutoAugment { .. }
            | OpSpec::AugMix { .. }
    )
}

thread_local! {
    /// The image between two sub-ops of one sample (RandAugment, AutoAugment).
    static BETWEEN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn apply(op: &OpSpec, f: Frame<'_>) -> Result<(u32, u32), CodecError> {
    if let OpSpec::AugMix { .. } = op {
        return augmix(op, f);
    }
    let Frame { src, w, h, rng, max_pixels, dst } = f;
    // The sub-ops drawn, each with its signed magnitude, in order.
    let mut chosen: Vec<(PolicyOp, f32)> = Vec::with_capacity(2);
    let (interpolation, fill) = match *op {
        OpSpec::TrivialAugmentWide { num_magnitude_bins: bins, interpolation, fill } => {
            let space = Space::TrivialAugmentWide;
            let ops = space.ops();
            let pick = ops[rng.below(ops.len() as u64) as usize];
            // torchvision draws the bin only for an op with magnitudes.
            let m = match space.magnitude(pick, bins, 0, h, w) {
                Some(_) => {
                    let bin = rng.below(u64::from(bins)) as u32;
                    space.magnitude(pick, bins, bin, h, w).map(|m| signed(space, pick, m, rng))
                }
                None => None,
            };
            chosen.push((pick, m.unwrap_or(0.0)));
            (interpolation, fill)
        }
        OpSpec::RandAugment { num_ops, magnitude, num_magnitude_bins: bins, interpolation, fill } => {
            let space = Space::RandAugment;
            let ops = space.ops();
            for _ in 0..num_ops {
                let pick = ops[rng.below(ops.len() as u64) as usize];
                let m = space.magnitude(pick, bins, magnitude, h, w).map(|m| signed(space, pick, m, rng));
                chosen.push((pick, m.unwrap_or(0.0)));
            }
            (interpolation, fill)
        }
        OpSpec::AutoAugment { policy, interpolation, fill } => {
            let space = Space::AutoAugment;
            let subs = sub_policies(policy);
            let sub = subs[rng.below(subs.len() as u64) as usize];
            for (pick, p, bin) in sub {
                // torchvision: skip unless torch.rand(()) <= p.
                if rng.next_f64() > f64::from(p) {
                    continue;
                }
                let m = space.magnitude(pick, 10, u32::from(bin), h, w).map(|m| signed(space, pick, m, rng));
                chosen.push((pick, m.unwrap_or(0.0)));
            }
            (interpolation, fill)
        }
        _ => return Err(not_mine(op, "policy")),
    };
    let warp = Warp { interpolation, fill };
    let Some((&(first, m), rest)) = chosen.split_first() else {
        let (src, out) = frames(src, dst, w, h)?;
        out.copy_from_slice(src);
        return Ok((w, h));
    };
    apply_op(first, m, src, w, h, warp, max_pixels, dst)?;
    BETWEEN.with(|between| {
        let mut between = between.borrow_mut();
        for &(next, m) in rest {
            std::mem::swap(&mut *between, dst);
            apply_op(next, m, &between, w, h, warp, max_pixels, dst)?;
        }
        Ok((w, h))
    })
}

thread_local! {
    /// AugMix's buffers: the f32 mix, and a chain's image before and after each op.
    static AUGMIX: RefCell<(Vec<f32>, Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// torchvision's `AugMix.forward` on one image: draws, in its order, the Beta blend
/// `m ~ Dirichlet([alpha, alpha])` and the chain weights `Dirichlet([alpha] * width)`,
/// then per chain its depth (when drawn) and per op the op, its bin below `severity` and
/// its sign; mixes in float32 as `m[0] * image + sum(m[1] * w_i * chain_i)` and truncates
/// to u8 as `.to(uint8)` does.
fn augmix(op: &OpSpec, f: Frame<'_>) -> Result<(u32, u32), CodecError> {
    let Frame { src, w, h, rng, max_pixels, dst } = f;
    let OpSpec::AugMix { severity, mixture_width, chain_depth, alpha, all_ops, interpolation, fill } = *op else {
        return Err(not_mine(op, "augmix"));
    };
    let space = Space::AugMix;
    let ops = &space.ops()[..if all_ops { space.ops().len() } else { AUGMIX_PARTIAL }];
    let warp = Warp { interpolation, fill };
    let blend = dirichlet(alpha, 2, rng);
    let weights: Vec<f32> =
        dirichlet(alpha, mixture_width as usize, rng).into_iter().map(|d| d as f32 * blend[1] as f32).collect();
    let (src, out) = frames(src, dst, w, h)?;
    AUGMIX.with(|bufs| {
        let (mix, a, b) = &mut *bufs.borrow_mut();
        let keep = blend[0] as f32;
        mix.clear();
        mix.extend(src.iter().map(|&v| keep * f32::from(v)));
        for &weight in &weights {
            let depth = if chain_depth > 0 { chain_depth as u64 } else { 1 + rng.below(3) };
            // The chain's image: `src` until the first op writes `a`.
            let mut in_a = false;
            for _ in 0..depth {
                let pick = ops[rng.below(ops.len() as u64) as usize];
                let m = match space.magnitude(pick, AUGMIX_BINS, 0, h, w) {
                    Some(_) => {
                        let bin = rng.below(u64::from(severity)) as u32;
                        space.magnitude(pick, AUGMIX_BINS, bin, h, w).map_or(0.0, |m| signed(space, pick, m, rng))
                    }
                    None => 0.0,
                };
                apply_op(pick, m, if in_a { a } else { src }, w, h, warp, max_pixels, b)?;
                std::mem::swap(a, b);
                in_a = true;
            }
            let chain: &[u8] = if in_a { a } else { src };
            for (acc, &v) in mix.iter_mut().zip(chain) {
                *acc += weight * f32::from(v);
            }
        }
        for (o, &v) in out.iter_mut().zip(mix.iter()) {
            // `.to(uint8)`: truncated (the weights sum to 1, so v is in [0, 255]).
            *o = v as u8;
        }
        Ok((w, h))
    })
}

/// A Dirichlet draw with all `n` concentrations `alpha`: Gamma(alpha) draws, normalised.
fn dirichlet(alpha: f64, n: usize, rng: &mut SampleRng) -> Vec<f64> {
    let g: Vec<f64> = (0..n).map(|_| gamma(alpha, rng)).collect();
    let sum: f64 = g.iter().sum();
    if sum > 0.0 {
        g.iter().map(|v| v / sum).collect()
    } else {
        // Every draw underflowed (a tiny alpha): one component takes all, as the limit does.
        let one = rng.below(n as u64) as usize;
        (0..n).map(|i| if i == one { 1.0 } else { 0.0 }).collect()
    }
}

/// A Gamma(alpha, 1) draw (Marsaglia and Tsang; `alpha < 1` through `Gamma(alpha + 1) *
/// U^(1 / alpha)`).
fn gamma(alpha: f64, rng: &mut SampleRng) -> f64 {
    if alpha < 1.0 {
        let u = 1.0 - rng.next_f64();
        return gamma(alpha + 1.0, rng) * u.powf(1.0 / alpha);
    }
    let d = alpha - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = color::standard_normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// `m`, negated if `op` is signed and `rand <= 0.5`.
fn signed(space: Space, op: PolicyOp, m: f32, rng: &mut SampleRng) -> f32 {
    if space.signed(op) && rng.next_f64() <= 0.5 {
        -m
    } else {
        m
    }
}

/// One sub-op at magnitude `m` on `src` (`w x h` RGB8) into `dst`: torchvision's
/// `_apply_image_or_video_transform`. The size is kept.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_op(
    op: PolicyOp,
    m: f32,
    src: &[u8],
    w: u32,
    h: u32,
    warp: Warp,
    max_pixels: u64,
    dst: &mut Vec<u8>,
) -> Result<(), CodecError> {
    // torchvision works on `float(magnitudes[i])`: the f32 value as a double.
    let m = f64::from(m);
    if op == PolicyOp::Rotate {
        geometry::rotate(src, w, h, m, false, None, warp, max_pixels, dst)?;
        return Ok(());
    }
    let (src, out) = frames(src, dst, w, h)?;
    let shift =
        |translate: [f64; 2]| AffineParams { angle: 0.0, translate, scale: 1.0, shear: [0.0, 0.0], center: None };
    // Shears about the top-left corner (`center=[0, 0]`) by atan(m) in degrees.
    let shear = |shear: [f64; 2]| AffineParams {
        angle: 0.0,
        translate: [0.0, 0.0],
        scale: 1.0,
        shear,
        center: Some([0.0, 0.0]),
    };
    match op {
        PolicyOp::Identity | PolicyOp::Rotate => out.copy_from_slice(src),
        PolicyOp::ShearX => geometry::affine(src, w, h, &shear([m.atan().to_degrees(), 0.0]), warp, out),
        PolicyOp::ShearY => geometry::affine(src, w, h, &shear([0.0, m.atan().to_degrees()]), warp, out),
        // `int(magnitude)`: truncated towards zero.
        PolicyOp::TranslateX => geometry::affine(src, w, h, &shift([m.trunc(), 0.0]), warp, out),
        PolicyOp::TranslateY => geometry::affine(src, w, h, &shift([0.0, m.trunc()]), warp, out),
        PolicyOp::Brightness => {
            out.copy_from_slice(src);
            color::adjust_brightness(out, 1.0 + m);
        }
        PolicyOp::Color => {
            out.copy_from_slice(src);
            color::adjust_saturation(out, 1.0 + m);
        }
        PolicyOp::Contrast => {
            out.copy_from_slice(src);
            color::adjust_contrast(out, 1.0 + m);
        }
        PolicyOp::Sharpness => color::adjust_sharpness(src, w as usize, h as usize, 1.0 + m, out),
        PolicyOp::Posterize => {
            let bits = m.trunc().clamp(0.0, 8.0) as u32;
            let mask = !(0xffu8.checked_shr(bits).unwrap_or(0));
            for (o, s) in out.iter_mut().zip(src) {
                *o = s & mask;
            }
        }
        PolicyOp::Solarize => {
            // `image >= 255.0 * m`, compared in float32 (uint8 against a Python float).
            let threshold = (255.0 * m) as f32;
            let lut = std::array::from_fn(|v| if v as f32 >= threshold { 255 - v as u8 } else { v as u8 });
            color::map(&lut, src, out);
        }
        PolicyOp::AutoContrast => color::autocontrast(src, out),
        PolicyOp::Equalize => color::equalize(src, out),
        PolicyOp::Invert => color::invert(src, out),
    }
    Ok(())
}

/// A policy's op space as data: each op's torchvision name, its magnitudes for `bins` bins
/// on a `width x height` image (`None` for ops without one), and whether it is signed.
pub fn space(space: Space, bins: u32, height: u32, width: u32) -> Vec<(&'static str, Option<Vec<f32>>, bool)> {
    space
        .ops()
        .iter()
        .map(|&op| {
            let m = space
                .magnitude(op, bins, 0, height, width)
                .map(|_| (0..bins).filter_map(|i| space.magnitude(op, bins, i, height, width)).collect::<Vec<_>>());
            (op.name(), m, space.signed(op))
        })
        .collect()
}

/// Runs one policy sub-op at magnitude `m` on a `width x height` RGB8 image, as a policy
/// that drew it does (for tests that compare each branch with torchvision's functional).
pub fn run_op(
    op: PolicyOp,
    m: f32,
    src: &[u8],
    (width, height): (u32, u32),
    interpolation: Interpolation,
    fill: Option<[u8; 3]>,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    apply_op(op, m, src, width, height, Warp { interpolation, fill }, u64::MAX, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use sluice_core::SampleKey;

    use super::*;

    fn image(w: u32, h: u32) -> Vec<u8> {
        (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect()
    }

    #[test]
    fn augmix_weights_are_dirichlet_and_the_mix_stays_within_the_chains() {
        let mut rng = SampleRng::new(1, 0, SampleKey(0), 0);
        let n = 4000;
        for alpha in [0.3, 1.0, 4.0] {
            let mean = (0..n).map(|_| gamma(alpha, &mut rng)).sum::<f64>() / f64::from(n);
            assert!((mean - alpha).abs() < 0.1 * alpha.max(1.0), "Gamma({alpha}) mean {mean}");
            let d = dirichlet(alpha, 3, &mut rng);
            assert!((d.iter().sum::<f64>() - 1.0).abs() < 1e-12 && d.iter().all(|v| *v >= 0.0), "{d:?}");
        }
        // One chain of one op, only tone ops that keep a flat image flat or map it to a
        // flat image: the mix of two flat images is flat, between them.
        let (w, h) = (8, 6);
        let flat = vec![100u8; (w * h * 3) as usize];
        let op = OpSpec::AugMix {
            severity: 10,
            mixture_width: 1,
            chain_depth: 1,
            alpha: 1.0,
            all_ops: false,
            interpolation: Interpolation::Bilinear,
            fill: None,
        };
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for key in 0..40 {
            let mut rng = SampleRng::new(3, 0, SampleKey(key), 0);
            apply(&op, Frame { src: &flat, w, h, rng: &mut rng, max_pixels: u64::MAX, dst: &mut out }).unwrap();
            assert_eq!(out.len(), flat.len());
            seen.insert(out[(w * 3 * 3 + 12) as usize]);
        }
        // Different samples draw different ops and weights.
        assert!(seen.len() > 3, "{seen:?}");
    }

    #[test]
    fn tables_are_torchvisions() {
        // torch.linspace(0, 0.99, 31)[30] and the posterize bins of TrivialAugmentWide.
        let wide = space(Space::TrivialAugmentWide, 31, 10, 20);
        assert_eq!(wide.len(), 14);
        assert_eq!(wide[0], ("Identity", None, false));
        let (name, m, signed) = &wide[10];
        assert_eq!((*name, *signed), ("Posterize", false));
        let m = m.as_ref().unwrap();
        assert_eq!((m[0], m[2], m[3], m[30]), (8.0, 8.0, 7.0, 2.0));
        assert_eq!(wide[1].1.as_ref().unwrap()[30], 0.99f32);
        // RandAugment's translation is a fraction of the image's side.
        let ra = space(Space::RandAugment, 31, 10, 331);
        assert_eq!(ra[3].0, "TranslateX");
        assert_eq!(ra[3].1.as_ref().unwrap()[30], 150.0);
        assert_eq!(space(Space::AutoAugment, 10, 8, 8)[13], ("Invert", None, false));
    }

    #[test]
    fn a_sample_draws_the_same_pixels_each_time_and_samples_differ() {
        let (w, h) = (24, 16);
        let src = image(w, h);
        let ops = [
            OpSpec::TrivialAugmentWide { num_magnitude_bins: 31, interpolation: Interpolation::Bilinear, fill: None },
            OpSpec::RandAugment {
                num_ops: 3,
                magnitude: 9,
                num_magnitude_bins: 31,
                interpolation: Interpolation::Nearest,
                fill: Some([1, 2, 3]),
            },
            OpSpec::AutoAugment {
                policy: AutoAugmentPolicy::Imagenet,
                interpolation: Interpolation::Nearest,
                fill: None,
            },
        ];
        for op in &ops {
            let run = |key: u64| {
                let mut rng = SampleRng::new(7, 1, SampleKey(key), 0);
                let mut dst = Vec::new();
                let f = Frame { src: &src, w, h, rng: &mut rng, max_pixels: u64::MAX, dst: &mut dst };
                assert_eq!(apply(op, f).unwrap(), (w, h));
                dst
            };
            let outs: Vec<_> = (0..20).map(run).collect();
            assert_eq!(run(3), outs[3], "{op:?}");
            assert!(outs.iter().any(|o| *o != outs[0]), "{op:?}: every sample drew the same");
        }
    }

    #[test]
    fn sub_ops_match_their_kernels() {
        let (w, h) = (9, 7);
        let src = image(w, h);
        let run = |op, m| run_op(op, m, &src, (w, h), Interpolation::Nearest, None).unwrap();
        assert_eq!(run(PolicyOp::Identity, 0.0), src);
        assert_eq!(run(PolicyOp::Invert, 0.0), src.iter().map(|v| 255 - v).collect::<Vec<_>>());
        assert_eq!(run(PolicyOp::Posterize, 4.0), src.iter().map(|v| v & 0xf0).collect::<Vec<_>>());
        // Threshold 255 * 1.0: only 255 is inverted.
        let sol = run(PolicyOp::Solarize, 1.0);
        assert!(src.iter().zip(&sol).all(|(s, o)| if *s == 255 { *o == 0 } else { o == s }));
        // A shift of one pixel right: the first column is zero (no fill), the rest moves.
        let t = run(PolicyOp::TranslateX, 1.9);
        for y in 0..h as usize {
            let row = y * w as usize * 3;
            assert_eq!(&t[row..row + 3], &[0, 0, 0]);
            assert_eq!(&t[row + 3..row + w as usize * 3], &src[row..row + (w as usize - 1) * 3]);
        }
    }
}
