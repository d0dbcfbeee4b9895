//! The ops of a pipeline spec: what each one does, the bounds on its parameters, and the
//! image size it leaves (so a spec is known to make one batch shape before it runs).
//! docs/ops.md lists every op with its torchvision counterpart.

use serde::{Deserialize, Serialize};

use super::{check_count, Size, MAX_OPS, MAX_SIDE, MAX_SLEEP_US};
use crate::error::SpecError;
use crate::image::{DType, Layout};

mod color;
#[cfg(test)]
mod color_tests;

pub use color::{ErasingValue, KernelSize, RandomTag, Range};

/// One preprocessing op. `decode` comes first; geometric ops next; then at most one of
/// `normalize`/`dtype`; then `layout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpSpec {
    /// JPEG (libjpeg-turbo) or PNG to RGB u8. Fused with a following `random_resized_crop`
    /// so only the crop window is decoded.
    Decode,
    /// Resize so the shorter side is `size` (aspect ratio kept).
    Resize {
        size: u32,
    },
    CenterCrop {
        size: Size,
    },
    /// torchvision semantics: area fraction in `scale`, aspect ratio (log-uniform) in
    /// `ratio`, 10 tries, then the center fallback; the crop is resized to `size`.
    RandomResizedCrop {
        size: Size,
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    RandomHorizontalFlip {
        #[serde(default = "default_flip_p")]
        p: f64,
    },
    /// `(x / 255 - mean) / std` per channel, as f32. mean and std in [0, 1] units.
    Normalize {
        mean: [f32; 3],
        std: [f32; 3],
    },
    /// `u8` keeps pixels; `f32` gives `x / 255`.
    Dtype {
        dtype: DType,
    },
    Layout {
        order: Layout,
    },
    /// Flips top-bottom with probability `p` (torchvision's RandomVerticalFlip).
    RandomVerticalFlip {
        #[serde(default = "default_flip_p")]
        p: f64,
    },
    /// `255 - x` on every channel (torchvision's `invert`).
    Invert,
    // ---- colour ops (docs/ops.md, "Colour"). Those torchvision has as `Random*(p)`
    // take an optional `p` here (default 1: always), drawn before anything else.
    /// torchvision's ColorJitter: each factor a number or `[min, max]`, drawn per sample,
    /// applied in a random order.
    ColorJitter {
        #[serde(default)]
        brightness: Option<Range>,
        #[serde(default)]
        contrast: Option<Range>,
        #[serde(default)]
        saturation: Option<Range>,
        #[serde(default)]
        hue: Option<Range>,
    },
    /// Grayscale (3 equal channels) with probability `p` (torchvision's RandomGrayscale).
    RandomGrayscale {
        #[serde(default = "default_grayscale_p")]
        p: f64,
    },
    /// torchvision's `Grayscale(num_output_channels=3)`.
    Grayscale,
    /// Inverts values `>= threshold` (RandomSolarize).
    Solarize {
        threshold: f64,
        #[serde(default = "default_always")]
        p: f64,
    },
    /// Keeps the top `bits` bits of each value (RandomPosterize).
    Posterize {
        bits: u8,
        #[serde(default = "default_always")]
        p: f64,
    },
    /// Histogram equalization per channel (RandomEqualize).
    Equalize {
        #[serde(default = "default_always")]
        p: f64,
    },
    /// Stretches each channel to [0, 255] (RandomAutocontrast).
    Autocontrast {
        #[serde(default = "default_always")]
        p: f64,
    },
    /// Blends with a 3x3 smoothed image, borders kept (RandomAdjustSharpness).
    AdjustSharpness {
        sharpness_factor: f64,
        #[serde(default = "default_always")]
        p: f64,
    },
    /// torchvision's GaussianBlur: sigma drawn per sample from `sigma`, reflect padding.
    GaussianBlur {
        kernel_size: KernelSize,
        #[serde(default = "default_sigma")]
        sigma: Range,
    },
    /// torchvision's RandomErasing, on the output as written (after `normalize`/`dtype`/
    /// `layout`), so `value` is in the output's units.
    RandomErasing {
        #[serde(default = "default_erasing_p")]
        p: f64,
        #[serde(default = "default_erasing_scale")]
        scale: [f64; 2],
        #[serde(default = "default_erasing_ratio")]
        ratio: [f64; 2],
        #[serde(default)]
        value: ErasingValue,
    },
    /// Emulated per-sample cost: the thread sleeps `us` microseconds. For benchmarks that
    /// need more preprocessing units than the machine has cores (autoscaling, many
    /// learners): a sleeping unit costs wall time, not CPU. Runs after the cache seam, so a
    /// cache hit pays it too, like any augmentation.
    Sleep {
        us: u32,
    },
}

pub(super) fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
pub(super) fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
pub(super) fn default_flip_p() -> f64 {
    0.5
}
fn default_always() -> f64 {
    1.0
}
fn default_grayscale_p() -> f64 {
    0.1
}
fn default_sigma() -> Range {
    Range::Two([0.1, 2.0])
}
fn default_erasing_p() -> f64 {
    0.5
}
fn default_erasing_scale() -> [f64; 2] {
    [0.02, 0.33]
}
fn default_erasing_ratio() -> [f64; 2] {
    [0.3, 3.3]
}

impl OpSpec {
    pub fn name(&self) -> &'static str {
        match self {
            OpSpec::Decode => "decode",
            OpSpec::Resize { .. } => "resize",
            OpSpec::CenterCrop { .. } => "center_crop",
            OpSpec::RandomResizedCrop { .. } => "random_resized_crop",
            OpSpec::RandomHorizontalFlip { .. } => "random_horizontal_flip",
            OpSpec::Normalize { .. } => "normalize",
            OpSpec::Dtype { .. } => "dtype",
            OpSpec::Layout { .. } => "layout",
            OpSpec::RandomVerticalFlip { .. } => "random_vertical_flip",
            OpSpec::Invert => "invert",
            OpSpec::ColorJitter { .. } => "color_jitter",
            OpSpec::RandomGrayscale { .. } => "random_grayscale",
            OpSpec::Grayscale => "grayscale",
            OpSpec::Solarize { .. } => "solarize",
            OpSpec::Posterize { .. } => "posterize",
            OpSpec::Equalize { .. } => "equalize",
            OpSpec::Autocontrast { .. } => "autocontrast",
            OpSpec::AdjustSharpness { .. } => "adjust_sharpness",
            OpSpec::GaussianBlur { .. } => "gaussian_blur",
            OpSpec::RandomErasing { .. } => "random_erasing",
            OpSpec::Sleep { .. } => "sleep",
        }
    }

    /// Random ops draw from the per-sample RNG; their output changes every epoch, so
    /// nothing after the first of them can be cached.
    pub fn is_random(&self) -> bool {
        match self {
            OpSpec::RandomResizedCrop { .. }
            | OpSpec::RandomHorizontalFlip { .. }
            | OpSpec::RandomVerticalFlip { .. }
            | OpSpec::ColorJitter { .. }
            | OpSpec::RandomGrayscale { .. }
            | OpSpec::RandomErasing { .. } => true,
            OpSpec::Solarize { p, .. }
            | OpSpec::Posterize { p, .. }
            | OpSpec::Equalize { p }
            | OpSpec::Autocontrast { p }
            | OpSpec::AdjustSharpness { p, .. } => *p < 1.0,
            OpSpec::GaussianBlur { sigma, .. } => {
                let [lo, hi] = sigma.fixed_or_range();
                lo < hi
            }
            _ => false,
        }
    }

    /// The image size after this op, given the size before it (`None`: it depends on the
    /// image, as after `decode` or `resize`). Batches need `Some` after the last op.
    pub fn out_size(&self, before: Option<Size>) -> Option<Size> {
        match self {
            OpSpec::Decode | OpSpec::Resize { .. } => None,
            OpSpec::CenterCrop { size } | OpSpec::RandomResizedCrop { size, .. } => Some(*size),
            OpSpec::RandomHorizontalFlip { .. }
            | OpSpec::RandomVerticalFlip { .. }
            | OpSpec::Invert
            | OpSpec::ColorJitter { .. }
            | OpSpec::RandomGrayscale { .. }
            | OpSpec::Grayscale
            | OpSpec::Solarize { .. }
            | OpSpec::Posterize { .. }
            | OpSpec::Equalize { .. }
            | OpSpec::Autocontrast { .. }
            | OpSpec::AdjustSharpness { .. }
            | OpSpec::GaussianBlur { .. }
            | OpSpec::RandomErasing { .. }
            | OpSpec::Normalize { .. }
            | OpSpec::Dtype { .. }
            | OpSpec::Layout { .. }
            | OpSpec::Sleep { .. } => before,
        }
    }

    /// Checks this op's own parameters; `field` names one of them in the error
    /// (`ops[2].size`).
    fn validate(&self, field: impl Fn(&str) -> String) -> Result<(), SpecError> {
        match self {
            OpSpec::Decode | OpSpec::Layout { .. } | OpSpec::Dtype { .. } | OpSpec::Invert | OpSpec::Grayscale => {
                Ok(())
            }
            OpSpec::Resize { size } => check_count(&field("size"), u64::from(*size), 1, u64::from(MAX_SIDE)),
            OpSpec::CenterCrop { size } => check_size(size, &field("size")),
            OpSpec::RandomResizedCrop { size, scale, ratio } => {
                check_size(size, &field("size"))?;
                if !(scale[0] > 0.0 && scale[0] <= scale[1] && scale[1] <= 1.0) {
                    return Err(SpecError::new(field("scale"), "needs 0 < min <= max <= 1"));
                }
                if !(ratio[0] > 0.0 && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
                    return Err(SpecError::new(field("ratio"), "needs 0 < min <= max"));
                }
                Ok(())
            }
            OpSpec::RandomHorizontalFlip { p } | OpSpec::RandomVerticalFlip { p } => check_probability(*p, &field("p")),
            OpSpec::Normalize { std, .. } => {
                if std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
                    return Err(SpecError::new(field("std"), "every std must be > 0"));
                }
                Ok(())
            }
            OpSpec::Sleep { us } => check_count(&field("us"), u64::from(*us), 0, u64::from(MAX_SLEEP_US)),
            OpSpec::ColorJitter { brightness, contrast, saturation, hue } => {
                let factor = [0.0, color::MAX_FACTOR];
                for (name, r) in [("brightness", brightness), ("contrast", contrast), ("saturation", saturation)] {
                    if let Some(r) = r {
                        color::check_jitter(r, 1.0, factor, &field(name))?;
                    }
                }
                match hue {
                    Some(h) => color::check_jitter(h, 0.0, [-0.5, 0.5], &field("hue")),
                    None => Ok(()),
                }
            }
            OpSpec::RandomGrayscale { p } | OpSpec::Equalize { p } | OpSpec::Autocontrast { p } => {
                check_probability(*p, &field("p"))
            }
            OpSpec::Solarize { threshold, p } => {
                if !(0.0..=255.0).contains(threshold) {
                    return Err(SpecError::new(field("threshold"), "must be in [0, 255] (u8 units)"));
                }
                check_probability(*p, &field("p"))
            }
            OpSpec::Posterize { bits, p } => {
                check_count(&field("bits"), u64::from(*bits), 0, 8)?;
                check_probability(*p, &field("p"))
            }
            OpSpec::AdjustSharpness { sharpness_factor, p } => {
                color::check_factor(*sharpness_factor, &field("sharpness_factor"))?;
                check_probability(*p, &field("p"))
            }
            OpSpec::GaussianBlur { kernel_size, sigma } => {
                color::check_kernel(kernel_size, &field("kernel_size"))?;
                color::check_sigma(sigma, &field("sigma"))
            }
            OpSpec::RandomErasing { p, scale, ratio, value } => {
                check_probability(*p, &field("p"))?;
                color::check_erasing(*scale, *ratio, value, field)
            }
        }
    }

    fn phase(&self) -> u8 {
        match self {
            OpSpec::Decode => 0,
            OpSpec::Resize { .. }
            | OpSpec::CenterCrop { .. }
            | OpSpec::RandomResizedCrop { .. }
            | OpSpec::RandomHorizontalFlip { .. }
            | OpSpec::RandomVerticalFlip { .. }
            | OpSpec::Invert
            | OpSpec::ColorJitter { .. }
            | OpSpec::RandomGrayscale { .. }
            | OpSpec::Grayscale
            | OpSpec::Solarize { .. }
            | OpSpec::Posterize { .. }
            | OpSpec::Equalize { .. }
            | OpSpec::Autocontrast { .. }
            | OpSpec::AdjustSharpness { .. }
            | OpSpec::GaussianBlur { .. }
            | OpSpec::Sleep { .. } => 1,
            OpSpec::Normalize { .. } | OpSpec::Dtype { .. } => 2,
            OpSpec::Layout { .. } => 3,
            // Erases the output as written, so it follows every conversion.
            OpSpec::RandomErasing { .. } => 4,
        }
    }
}

/// Checks an op list: every op's parameters, the order, and a fixed output size.
pub(super) fn validate_ops(ops: &[OpSpec]) -> Result<(), SpecError> {
    if ops.len() > MAX_OPS {
        return Err(SpecError::new("ops", format!("at most {MAX_OPS} ops")));
    }
    if ops.first() != Some(&OpSpec::Decode) {
        return Err(SpecError::new("ops[0]", "the first op must be `decode`"));
    }
    let mut phase = 0;
    let mut size = None;
    for (i, op) in ops.iter().enumerate() {
        let field = |name: &str| format!("ops[{i}].{name}");
        if i > 0 && op.phase() == 0 {
            return Err(SpecError::new(format!("ops[{i}]"), "`decode` may appear only once, first"));
        }
        if op.phase() < phase || (op.phase() >= 2 && op.phase() == phase && i > 0) {
            return Err(SpecError::new(
                format!("ops[{i}]"),
                format!(
                    "`{}` is out of order: decode, then resize/crops/flip, then at most one of \
                     normalize/dtype, then layout, then random_erasing",
                    op.name()
                ),
            ));
        }
        phase = op.phase();
        op.validate(field)?;
        size = op.out_size(size);
    }
    if size.is_none() {
        return Err(SpecError::new(
            "ops",
            "batches need one image size: end the geometric ops with `center_crop` or \
             `random_resized_crop`",
        ));
    }
    Ok(())
}

fn check_size(size: &Size, field: &str) -> Result<(), SpecError> {
    if !(1..=MAX_SIDE).contains(&size.height) || !(1..=MAX_SIDE).contains(&size.width) {
        return Err(SpecError::new(
            field,
            format!("height and width must be in 1..={MAX_SIDE}; got {}x{}", size.height, size.width),
        ));
    }
    Ok(())
}

/// A probability: in [0, 1].
fn check_probability(p: f64, field: &str) -> Result<(), SpecError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(SpecError::new(field, "must be in [0, 1]"));
    }
    Ok(())
}
