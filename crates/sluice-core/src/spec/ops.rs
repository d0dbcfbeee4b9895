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
mod policy;
mod scalar;

pub use color::{ErasingValue, KernelSize, RandomTag, Range};
pub use policy::{AutoAugmentPolicy, MAX_POLICY_OPS};

/// One preprocessing op. `decode` comes first; geometric ops next; then at most one of
/// `normalize`/`dtype`; then `layout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpSpec {
    /// JPEG (libjpeg-turbo) or PNG to RGB u8. Fused with a following `random_resized_crop`
    /// so only the crop window is decoded.
    Decode,
    /// Resize so the shorter side is `size` (aspect ratio kept), torchvision's
    /// `Resize(size, interpolation, antialias)`.
    Resize {
        size: u32,
        /// How pixels are sampled (`bilinear` by default, as torchvision's).
        #[serde(default, skip_serializing_if = "is_default_interpolation")]
        interpolation: Interpolation,
        /// Widen the filter when shrinking (torchvision v2's default `true`); `nearest`
        /// ignores it, as torchvision does.
        #[serde(default = "default_antialias", skip_serializing_if = "is_true")]
        antialias: bool,
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
        /// As `resize`'s. The crop is resized on its own, so no pixel outside it counts.
        #[serde(default, skip_serializing_if = "is_default_interpolation")]
        interpolation: Interpolation,
        #[serde(default = "default_antialias", skip_serializing_if = "is_true")]
        antialias: bool,
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
    // ---- geometric ops (torchvision.transforms.v2; pixels in sluice-codec's ops/geometry.rs).
    // Their parameters take torchvision's short forms too (`scalar.rs`): `degrees` d for
    // `[-d, d]`, `shear` s for x in `[-s, s]`, `padding` one value or two, `fill` one value.
    /// Rotates by an angle uniform in `degrees` (counter-clockwise) about `center` (pixel
    /// coordinates; the image center by default), torchvision's RandomRotation. `expand`
    /// grows the canvas to hold the whole rotated image (its size then depends on the image
    /// and the angle).
    RandomRotation {
        #[serde(deserialize_with = "scalar::degrees")]
        degrees: [f64; 2],
        #[serde(default = "default_warp_interpolation")]
        interpolation: Interpolation,
        #[serde(default)]
        expand: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        center: Option<[f64; 2]>,
        #[serde(default, deserialize_with = "scalar::fill")]
        fill: [u8; 3],
    },
    /// torchvision's RandomAffine: angle uniform in `degrees`, translation up to
    /// `translate` of the width/height (rounded to whole pixels), scale uniform in `scale`,
    /// shear uniform in `[shear[0], shear[1]]` along x and `[shear[2], shear[3]]` along y.
    RandomAffine {
        #[serde(deserialize_with = "scalar::degrees")]
        degrees: [f64; 2],
        #[serde(default, skip_serializing_if = "Option::is_none")]
        translate: Option<[f64; 2]>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scale: Option<[f64; 2]>,
        #[serde(default, deserialize_with = "scalar::shear", skip_serializing_if = "Option::is_none")]
        shear: Option<[f64; 4]>,
        #[serde(default = "default_warp_interpolation")]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill")]
        fill: [u8; 3],
    },
    /// torchvision's RandomPerspective: with probability `p`, each corner moves inwards by
    /// up to `distortion_scale` of half the side.
    RandomPerspective {
        #[serde(default = "default_distortion_scale")]
        distortion_scale: f64,
        #[serde(default = "default_flip_p")]
        p: f64,
        #[serde(default)]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill")]
        fill: [u8; 3],
    },
    /// torchvision's RandomCrop: pads by `padding` (`[left, top, right, bottom]`, or one
    /// value, or `[left/right, top/bottom]`), also to
    /// `size` when `pad_if_needed`, then crops `size` at a uniform position.
    RandomCrop {
        size: Size,
        #[serde(default, deserialize_with = "scalar::padding_opt", skip_serializing_if = "Option::is_none")]
        padding: Option<[u32; 4]>,
        #[serde(default)]
        pad_if_needed: bool,
        #[serde(default, deserialize_with = "scalar::fill")]
        fill: [u8; 3],
        #[serde(default)]
        padding_mode: PaddingMode,
    },
    /// torchvision's Pad: `padding` is `[left, top, right, bottom]`, one value for every side,
    /// or `[left/right, top/bottom]`.
    Pad {
        #[serde(deserialize_with = "scalar::padding")]
        padding: [u32; 4],
        #[serde(default, deserialize_with = "scalar::fill")]
        fill: [u8; 3],
        #[serde(default)]
        padding_mode: PaddingMode,
    },
    /// torchvision v2's RandomIoUCrop (SSD): draws a minimum IoU from `sampler_options`
    /// (1 keeps the image as it is), then up to `trials` crops of `[min_scale, max_scale]`
    /// of each side with an aspect ratio in `[min_aspect_ratio, max_aspect_ratio]` until one
    /// holds a box centre and overlaps such a box by that IoU. Boxes whose centre falls
    /// outside the crop are dropped, the rest clipped. The crop's size depends on the draw.
    /// A sample without boxes is left as it is (nothing drawn); after
    /// [`IOU_CROP_MAX_ROUNDS`] options without a crop, the image is left as it is too.
    RandomIouCrop {
        #[serde(default = "default_iou_min_scale")]
        min_scale: f64,
        #[serde(default = "default_always")]
        max_scale: f64,
        #[serde(default = "default_iou_min_aspect")]
        min_aspect_ratio: f64,
        #[serde(default = "default_iou_max_aspect")]
        max_aspect_ratio: f64,
        #[serde(default = "default_iou_sampler_options")]
        sampler_options: Vec<f64>,
        #[serde(default = "default_iou_trials")]
        trials: u32,
    },
    // ---- augmentation policies (torchvision.transforms.v2; sluice-codec's ops/policy.rs):
    // each draws one or more sub-ops and their magnitudes per sample. `fill` left out is
    // torchvision's `fill=None` (zeros outside, no mask), which differs from `[0, 0, 0]`
    // for bilinear warps.
    /// torchvision's TrivialAugmentWide: one op of its 14, at a magnitude bin uniform in
    /// `num_magnitude_bins`, with a random sign for signed ops.
    TrivialAugmentWide {
        #[serde(default = "default_magnitude_bins")]
        num_magnitude_bins: u32,
        #[serde(default = "default_warp_interpolation")]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill_opt", skip_serializing_if = "Option::is_none")]
        fill: Option<[u8; 3]>,
    },
    /// torchvision's RandAugment: `num_ops` ops of its 14 in turn, each at bin `magnitude`.
    RandAugment {
        #[serde(default = "default_rand_augment_ops")]
        num_ops: u32,
        #[serde(default = "default_rand_augment_magnitude")]
        magnitude: u32,
        #[serde(default = "default_magnitude_bins")]
        num_magnitude_bins: u32,
        #[serde(default = "default_warp_interpolation")]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill_opt", skip_serializing_if = "Option::is_none")]
        fill: Option<[u8; 3]>,
    },
    /// torchvision's AutoAugment: one of the policy's 25 sub-policies, each of its two ops
    /// applied with its probability.
    AutoAugment {
        #[serde(default)]
        policy: AutoAugmentPolicy,
        #[serde(default = "default_warp_interpolation")]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill_opt", skip_serializing_if = "Option::is_none")]
        fill: Option<[u8; 3]>,
    },
    /// torchvision's AugMix: `mixture_width` chains of `chain_depth` ops (1 to 3, drawn per
    /// chain, when `chain_depth <= 0`) at a bin below `severity` of 10, mixed with the
    /// image by Dirichlet(`alpha`) weights and a Beta(`alpha`, `alpha`) blend. `all_ops`
    /// adds brightness, colour, contrast and sharpness to the 9 geometric/tone ops.
    #[serde(rename = "augmix")]
    AugMix {
        #[serde(default = "default_augmix_severity")]
        severity: u32,
        #[serde(default = "default_augmix_width")]
        mixture_width: u32,
        #[serde(default = "default_augmix_depth")]
        chain_depth: i32,
        #[serde(default = "default_augmix_alpha")]
        alpha: f64,
        #[serde(default = "default_antialias")]
        all_ops: bool,
        #[serde(default)]
        interpolation: Interpolation,
        #[serde(default, deserialize_with = "scalar::fill_opt", skip_serializing_if = "Option::is_none")]
        fill: Option<[u8; 3]>,
    },
    /// Emulated per-sample cost: the thread sleeps `us` microseconds. For benchmarks that
    /// need more preprocessing units than the machine has cores (autoscaling, many
    /// learners): a sleeping unit costs wall time, not CPU. Runs after the cache seam, so a
    /// cache hit pays it too, like any augmentation.
    Sleep {
        us: u32,
    },
    /// A user function, called by name on each sample's RGB8 HWC image (docs/map.md):
    /// `module:qualname` of an importable Python function (`Pipeline.map`), or the name a
    /// Rust crate registered a `UserOp` under. It draws one number from the per-sample RNG
    /// (the seed it is handed), so it counts as random and is never cached.
    Map {
        #[serde(rename = "fn")]
        func: String,
        /// Through the service (docs/service.md), the longest one call may run: a worker
        /// kills the Python child still running it after this many milliseconds and fails
        /// the sample (then `on_error` decides). 1..=[`MAX_MAP_TIMEOUT_MS`].
        #[serde(default = "default_map_timeout_ms", skip_serializing_if = "is_default_map_timeout")]
        timeout_ms: u64,
    },
}

/// The longest `fn` name a `map` op may give.
pub const MAX_MAP_NAME: usize = 512;

/// A `map` op's `timeout_ms` when the spec gives none: one minute.
pub const DEFAULT_MAP_TIMEOUT_MS: u64 = 60_000;

/// The longest `timeout_ms` a `map` op may give: one hour.
pub const MAX_MAP_TIMEOUT_MS: u64 = 3_600_000;

fn default_map_timeout_ms() -> u64 {
    DEFAULT_MAP_TIMEOUT_MS
}

fn is_default_map_timeout(ms: &u64) -> bool {
    *ms == DEFAULT_MAP_TIMEOUT_MS
}

impl OpSpec {
    /// A `map` op calling `func`, with the default timeout.
    pub fn map(func: impl Into<String>) -> Self {
        OpSpec::Map { func: func.into(), timeout_ms: DEFAULT_MAP_TIMEOUT_MS }
    }
}

pub(super) fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
pub(super) fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_iou_min_scale() -> f64 {
    0.3
}
fn default_iou_min_aspect() -> f64 {
    0.5
}
fn default_iou_max_aspect() -> f64 {
    2.0
}
fn default_iou_sampler_options() -> Vec<f64> {
    vec![0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
}
fn default_iou_trials() -> u32 {
    40
}
/// The parameters of a `random_iou_crop` op, read from its [`OpSpec`] (sluice-codec's
/// `ops/iou_crop.rs` draws its crops from them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IouCropParams<'a> {
    /// `[min_scale, max_scale]`.
    pub scale: [f64; 2],
    /// `[min_aspect_ratio, max_aspect_ratio]`.
    pub aspect: [f64; 2],
    /// `sampler_options`: the minimum IoUs drawn from.
    pub options: &'a [f64],
    pub trials: u32,
}

impl<'a> IouCropParams<'a> {
    /// `op`'s parameters when it is a `random_iou_crop`.
    pub fn of(op: &'a OpSpec) -> Option<Self> {
        match op {
            OpSpec::RandomIouCrop {
                min_scale,
                max_scale,
                min_aspect_ratio,
                max_aspect_ratio,
                sampler_options,
                trials,
            } => Some(Self {
                scale: [*min_scale, *max_scale],
                aspect: [*min_aspect_ratio, *max_aspect_ratio],
                options: sampler_options,
                trials: *trials,
            }),
            _ => None,
        }
    }

    fn validate(&self, field: impl Fn(&str) -> String) -> Result<(), SpecError> {
        let ([min_scale, max_scale], [min_aspect_ratio, max_aspect_ratio]) = (self.scale, self.aspect);
        if !(min_scale > 0.0 && min_scale <= max_scale && max_scale <= 1.0) {
            return Err(SpecError::new(
                field("min_scale"),
                format!("needs 0 < min_scale <= max_scale <= 1; got {min_scale} and {max_scale}"),
            ));
        }
        if !(min_aspect_ratio > 0.0 && min_aspect_ratio <= max_aspect_ratio && max_aspect_ratio.is_finite()) {
            return Err(SpecError::new(
                field("min_aspect_ratio"),
                format!(
                    "needs 0 < min_aspect_ratio <= max_aspect_ratio (finite); got {min_aspect_ratio} and \
                     {max_aspect_ratio}"
                ),
            ));
        }
        if self.options.is_empty() || self.options.len() > IOU_CROP_MAX_OPTIONS {
            return Err(SpecError::new(
                field("sampler_options"),
                format!("needs 1 to {IOU_CROP_MAX_OPTIONS} values; got {}", self.options.len()),
            ));
        }
        if let Some(v) = self.options.iter().find(|v| !(0.0..=1.0).contains(*v)) {
            return Err(SpecError::new(
                field("sampler_options"),
                format!("each minimum IoU must be in [0, 1] (1: no crop); got {v}"),
            ));
        }
        check_count(&field("trials"), u64::from(self.trials), 1, u64::from(IOU_CROP_MAX_TRIALS))
    }
}

/// The most `sampler_options` a `random_iou_crop` may list.
pub const IOU_CROP_MAX_OPTIONS: usize = 64;
/// The most `trials` per option of a `random_iou_crop`.
pub const IOU_CROP_MAX_TRIALS: u32 = 1000;
/// How many options a `random_iou_crop` draws before it gives up and leaves the image as it
/// is (torchvision draws for ever; a sample whose boxes no crop can satisfy would hang).
pub const IOU_CROP_MAX_ROUNDS: u32 = 100;
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
fn default_antialias() -> bool {
    true
}
fn is_true(v: &bool) -> bool {
    *v
}
fn is_default_interpolation(i: &Interpolation) -> bool {
    *i == Interpolation::default()
}
fn default_augmix_severity() -> u32 {
    3
}
fn default_augmix_width() -> u32 {
    3
}
fn default_augmix_depth() -> i32 {
    -1
}
fn default_augmix_alpha() -> f64 {
    1.0
}
fn default_warp_interpolation() -> Interpolation {
    Interpolation::Nearest
}
fn default_distortion_scale() -> f64 {
    0.5
}
fn default_magnitude_bins() -> u32 {
    31
}
fn default_rand_augment_ops() -> u32 {
    2
}
fn default_rand_augment_magnitude() -> u32 {
    9
}

/// How a geometric op samples the input (torchvision's `InterpolationMode`). The warps
/// (`random_rotation`, `random_affine`, `random_perspective`) take `nearest` or `bilinear`,
/// as torchvision's tensor kernels do; `resize` and `random_resized_crop` take all four.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpolation {
    Nearest,
    #[default]
    Bilinear,
    Bicubic,
    /// torchvision's `NEAREST_EXACT`: the source pixel under the output pixel's center
    /// (`nearest` takes the one under its top-left corner).
    NearestExact,
}

/// What padding puts outside the image (torchvision's `padding_mode`): the `fill` colour,
/// the edge pixel repeated, a mirror without the edge (`reflect`) or with it (`symmetric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaddingMode {
    #[default]
    Constant,
    Edge,
    Reflect,
    Symmetric,
}

/// How an op treats a sample's boxes and mask ([`OpSpec::geometry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// Moves no pixel: boxes and mask stay as they are (colour ops, conversions, erasing,
    /// sleep), as torchvision v2 passes them through.
    Keeps,
    /// Moves pixels, and the boxes and mask with them as torchvision v2 moves
    /// `BoundingBoxes` and `Mask`.
    Moves,
    /// Moves pixels but cannot move boxes or masks (torchvision v2 raises for them too):
    /// refused on a source with boxes.
    RefusesBoxes,
    /// A user function (`map`): it gets the mask and moves it itself; boxes pass through
    /// unchanged (docs/map.md).
    User,
}

/// The largest `|angle|` in degrees a rotation or affine range may name.
pub const MAX_DEGREES: f64 = 360.0;
/// The largest `|shear|` in degrees (90 is a degenerate map).
pub const MAX_SHEAR: f64 = 80.0;
/// The largest affine scale factor.
pub const MAX_AFFINE_SCALE: f64 = 100.0;

impl OpSpec {
    /// `resize` to a shorter side of `size`, resampled as torchvision's default (bilinear,
    /// antialiased).
    pub fn resize(size: u32) -> Self {
        OpSpec::Resize { size, interpolation: Interpolation::default(), antialias: true }
    }

    /// `random_resized_crop`, resampled as torchvision's default (bilinear, antialiased).
    pub fn random_resized_crop(size: Size, scale: [f64; 2], ratio: [f64; 2]) -> Self {
        OpSpec::RandomResizedCrop { size, scale, ratio, interpolation: Interpolation::default(), antialias: true }
    }

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
            OpSpec::RandomRotation { .. } => "random_rotation",
            OpSpec::RandomAffine { .. } => "random_affine",
            OpSpec::RandomPerspective { .. } => "random_perspective",
            OpSpec::RandomCrop { .. } => "random_crop",
            OpSpec::Pad { .. } => "pad",
            OpSpec::RandomIouCrop { .. } => "random_iou_crop",
            OpSpec::TrivialAugmentWide { .. } => "trivial_augment_wide",
            OpSpec::RandAugment { .. } => "rand_augment",
            OpSpec::AutoAugment { .. } => "auto_augment",
            OpSpec::AugMix { .. } => "augmix",
            OpSpec::Sleep { .. } => "sleep",
            OpSpec::Map { .. } => "map",
        }
    }

    /// How this op treats a sample's boxes and mask: the one place that says so. Validation
    /// refuses a [`Geometry::RefusesBoxes`] op on a source with boxes, and sluice-codec's
    /// `ops::apply` reports motion only for [`Geometry::Moves`] ops (and refuses to run a
    /// `RefusesBoxes` op on a sample with boxes or a mask).
    pub fn geometry(&self) -> Geometry {
        // No `_` arm: a new op does not compile until it says how it treats geometry.
        match self {
            OpSpec::Decode
            | OpSpec::Normalize { .. }
            | OpSpec::Dtype { .. }
            | OpSpec::Layout { .. }
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
            // torchvision v2's RandomErasing passes boxes and masks through (with a warning).
            | OpSpec::RandomErasing { .. }
            | OpSpec::Sleep { .. } => Geometry::Keeps,
            OpSpec::Resize { .. }
            | OpSpec::CenterCrop { .. }
            | OpSpec::RandomResizedCrop { .. }
            | OpSpec::RandomHorizontalFlip { .. }
            | OpSpec::RandomVerticalFlip { .. }
            | OpSpec::RandomRotation { .. }
            | OpSpec::RandomAffine { .. }
            | OpSpec::RandomPerspective { .. }
            | OpSpec::RandomCrop { .. }
            | OpSpec::Pad { .. }
            | OpSpec::RandomIouCrop { .. } => Geometry::Moves,
            // torchvision v2's `_AutoAugmentBase._flatten_and_extract_image_or_video` raises
            // `TypeError` for `BoundingBoxes` and `Mask` in all four.
            OpSpec::TrivialAugmentWide { .. }
            | OpSpec::RandAugment { .. }
            | OpSpec::AutoAugment { .. }
            | OpSpec::AugMix { .. } => Geometry::RefusesBoxes,
            OpSpec::Map { .. } => Geometry::User,
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
            | OpSpec::RandomErasing { .. }
            | OpSpec::RandomRotation { .. }
            | OpSpec::RandomAffine { .. }
            | OpSpec::RandomPerspective { .. }
            | OpSpec::RandomCrop { .. }
            | OpSpec::RandomIouCrop { .. }
            | OpSpec::TrivialAugmentWide { .. }
            | OpSpec::RandAugment { .. }
            | OpSpec::AutoAugment { .. }
            | OpSpec::AugMix { .. }
            | OpSpec::Map { .. } => true,
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
            OpSpec::Decode | OpSpec::Resize { .. } | OpSpec::RandomIouCrop { .. } => None,
            OpSpec::CenterCrop { size } | OpSpec::RandomResizedCrop { size, .. } | OpSpec::RandomCrop { size, .. } => {
                Some(*size)
            }
            // An expanded canvas depends on the image and the angle.
            OpSpec::RandomRotation { expand: true, .. } => None,
            OpSpec::Pad { padding: [l, t, r, b], .. } => before.map(|s| Size {
                height: s.height.saturating_add(*t).saturating_add(*b),
                width: s.width.saturating_add(*l).saturating_add(*r),
            }),
            // Every other op keeps the size: pixel ops, flips, warps without `expand` (the
            // policies' too), conversions, erasing, sleep.
            _ => before,
        }
    }

    /// Checks this op's own parameters; `field` names one of them in the error
    /// (`ops[2].size`).
    fn validate(&self, field: impl Fn(&str) -> String) -> Result<(), SpecError> {
        match self {
            OpSpec::Decode | OpSpec::Layout { .. } | OpSpec::Dtype { .. } | OpSpec::Invert | OpSpec::Grayscale => {
                Ok(())
            }
            OpSpec::Resize { size, .. } => check_count(&field("size"), u64::from(*size), 1, u64::from(MAX_SIDE)),
            OpSpec::CenterCrop { size } => check_size(size, &field("size")),
            OpSpec::RandomResizedCrop { size, scale, ratio, .. } => {
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
            OpSpec::RandomRotation { degrees, interpolation, center, .. } => {
                check_range(degrees, -MAX_DEGREES, MAX_DEGREES, &field("degrees"))?;
                check_warp_interpolation(*interpolation, &field("interpolation"))?;
                if let Some(c) = center {
                    let side = f64::from(MAX_SIDE);
                    if !c.iter().all(|v| v.is_finite() && v.abs() <= side) {
                        return Err(SpecError::new(
                            field("center"),
                            format!("each coordinate must be in [-{side}, {side}]"),
                        ));
                    }
                }
                Ok(())
            }
            OpSpec::RandomAffine { degrees, translate, scale, shear, interpolation, .. } => {
                check_range(degrees, -MAX_DEGREES, MAX_DEGREES, &field("degrees"))?;
                if let Some(t) = translate {
                    if !t.iter().all(|v| (0.0..=1.0).contains(v)) {
                        return Err(SpecError::new(field("translate"), "each fraction must be in [0, 1]"));
                    }
                }
                if let Some(s) = scale {
                    check_range(s, f64::MIN_POSITIVE, MAX_AFFINE_SCALE, &field("scale"))?;
                }
                if let Some([x0, x1, y0, y1]) = shear {
                    check_range(&[*x0, *x1], -MAX_SHEAR, MAX_SHEAR, &field("shear"))?;
                    check_range(&[*y0, *y1], -MAX_SHEAR, MAX_SHEAR, &field("shear"))?;
                }
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::RandomPerspective { distortion_scale, p, interpolation, .. } => {
                if !(0.0..=1.0).contains(distortion_scale) {
                    return Err(SpecError::new(field("distortion_scale"), "must be in [0, 1]"));
                }
                check_probability(*p, &field("p"))?;
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::RandomCrop { size, padding, .. } => {
                check_size(size, &field("size"))?;
                if let Some(p) = padding {
                    check_padding(p, &field("padding"))?;
                }
                Ok(())
            }
            OpSpec::Pad { padding, .. } => check_padding(padding, &field("padding")),
            OpSpec::RandomIouCrop { .. } => IouCropParams::of(self).map_or(Ok(()), |p| p.validate(field)),
            OpSpec::TrivialAugmentWide { num_magnitude_bins, interpolation, .. } => {
                policy::check_bins(*num_magnitude_bins, &field("num_magnitude_bins"))?;
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::RandAugment { num_ops, magnitude, num_magnitude_bins, interpolation, .. } => {
                check_count(&field("num_ops"), u64::from(*num_ops), 0, u64::from(MAX_POLICY_OPS))?;
                policy::check_bins(*num_magnitude_bins, &field("num_magnitude_bins"))?;
                if magnitude >= num_magnitude_bins {
                    return Err(SpecError::new(
                        field("magnitude"),
                        format!("must be a bin below num_magnitude_bins ({num_magnitude_bins}); got {magnitude}"),
                    ));
                }
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::AutoAugment { interpolation, .. } => {
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::AugMix { severity, mixture_width, chain_depth, alpha, interpolation, .. } => {
                check_count(&field("severity"), u64::from(*severity), 1, u64::from(policy::AUGMIX_SEVERITY_MAX))?;
                check_count(&field("mixture_width"), u64::from(*mixture_width), 1, u64::from(MAX_POLICY_OPS))?;
                if *chain_depth > MAX_POLICY_OPS as i32 {
                    return Err(SpecError::new(
                        field("chain_depth"),
                        format!("must be at most {MAX_POLICY_OPS} (<= 0: drawn from 1..=3); got {chain_depth}"),
                    ));
                }
                if !(*alpha > 0.0 && *alpha <= policy::AUGMIX_ALPHA_MAX) {
                    return Err(SpecError::new(
                        field("alpha"),
                        format!("must be in (0, {}]; got {alpha}", policy::AUGMIX_ALPHA_MAX),
                    ));
                }
                check_warp_interpolation(*interpolation, &field("interpolation"))
            }
            OpSpec::Map { func, timeout_ms } => {
                check_map_name(func, &field("fn"))?;
                if !(1..=MAX_MAP_TIMEOUT_MS).contains(timeout_ms) {
                    return Err(SpecError::new(
                        field("timeout_ms"),
                        format!("must be in 1..={MAX_MAP_TIMEOUT_MS} (an hour); got {timeout_ms}"),
                    ));
                }
                Ok(())
            }
        }
    }

    fn phase(&self) -> u8 {
        match self {
            OpSpec::Decode => 0,
            OpSpec::Normalize { .. } | OpSpec::Dtype { .. } => 2,
            OpSpec::Layout { .. } => 3,
            // Erases the output as written, so it follows every conversion.
            OpSpec::RandomErasing { .. } => 4,
            // Every op on the image: crops, flips, warps, colour, policies, sleep.
            _ => 1,
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
        if size.is_some_and(|s| s.height > MAX_SIDE || s.width > MAX_SIDE) {
            return Err(SpecError::new(
                field("padding"),
                format!("the padded image must stay within {MAX_SIDE} a side"),
            ));
        }
    }
    if size.is_none() {
        return Err(SpecError::new(
            "ops",
            "batches need one image size: end the geometric ops with `center_crop`, \
             `random_resized_crop` or `random_crop`",
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

/// A `[min, max]` range inside `[lo, hi]`.
fn check_range(r: &[f64; 2], lo: f64, hi: f64, field: &str) -> Result<(), SpecError> {
    if !(r[0] >= lo && r[0] <= r[1] && r[1] <= hi) {
        return Err(SpecError::new(field, format!("needs {lo} <= min <= max <= {hi}; got [{}, {}]", r[0], r[1])));
    }
    Ok(())
}

/// The warps sample with `nearest` or `bilinear` (torchvision's tensor kernels).
fn check_warp_interpolation(i: Interpolation, field: &str) -> Result<(), SpecError> {
    if matches!(i, Interpolation::Bicubic | Interpolation::NearestExact) {
        return Err(SpecError::new(field, "must be `nearest` or `bilinear`"));
    }
    Ok(())
}

/// Each side's padding is at most `MAX_SIDE`, and so is what two sides add.
fn check_padding(p: &[u32; 4], field: &str) -> Result<(), SpecError> {
    if p.iter().any(|v| *v > MAX_SIDE) || p[0] + p[2] > MAX_SIDE || p[1] + p[3] > MAX_SIDE {
        return Err(SpecError::new(field, format!("left + right and top + bottom must each be at most {MAX_SIDE}")));
    }
    Ok(())
}

/// A `map` op's function name: `module:qualname`, each part dotted identifiers. A
/// lambda, a closure or a function defined inside another one (`<lambda>`, `<locals>`)
/// has no such name: worker processes could not import it.
pub(super) fn check_map_name(name: &str, field: &str) -> Result<(), SpecError> {
    let dotted = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|part| {
                let mut chars = part.chars();
                chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                    && chars.all(|c| c.is_alphanumeric() || c == '_')
            })
    };
    if name.len() > MAX_MAP_NAME {
        return Err(SpecError::new(field, format!("at most {MAX_MAP_NAME} bytes; got {}", name.len())));
    }
    if name.contains("<lambda>") || name.contains("<locals>") {
        return Err(SpecError::new(
            field,
            format!(
                "`{name}` is a lambda or a function defined inside another one: map needs a function \
                 importable by name (defined at the top level of a module)"
            ),
        ));
    }
    if let Some(dunder) = name
        .split_once(':')
        .and_then(|(_, qualname)| qualname.split('.').find(|p| p.len() > 4 && p.starts_with("__") && p.ends_with("__")))
    {
        return Err(SpecError::new(
            field,
            format!(
                "`{name}` reaches through `{dunder}`: map names a function by its own name, with no \
                 dunder attributes (`__call__`, `__class__`, `__globals__`)"
            ),
        ));
    }
    match name.split_once(':') {
        Some((module, qualname)) if dotted(module) && dotted(qualname) => Ok(()),
        _ => Err(SpecError::new(field, format!("must be `module:qualname` (e.g. `mypkg.augment:blur`); got `{name}`"))),
    }
}

/// A probability: in [0, 1].
fn check_probability(p: f64, field: &str) -> Result<(), SpecError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(SpecError::new(field, "must be in [0, 1]"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validates `decode`, the op given as JSON, then a 16-pixel center crop.
    fn check(op: &str) -> Result<(), SpecError> {
        let op: OpSpec = serde_json::from_str(op).map_err(|e| SpecError::new("json", e.to_string()))?;
        validate_ops(&[OpSpec::Decode, op, OpSpec::CenterCrop { size: Size::square(16) }])
    }

    fn field_of(op: &str) -> String {
        match check(op) {
            Err(e) => e.field,
            Ok(()) => panic!("{op} validated"),
        }
    }

    #[test]
    fn random_iou_crop_defaults_are_torchvisions_and_its_parameters_are_bounded() {
        let op: OpSpec = serde_json::from_str(r#"{"op": "random_iou_crop"}"#).unwrap();
        let OpSpec::RandomIouCrop {
            min_scale,
            max_scale,
            min_aspect_ratio,
            max_aspect_ratio,
            ref sampler_options,
            trials,
        } = op
        else {
            panic!("{op:?}")
        };
        assert_eq!((min_scale, max_scale, min_aspect_ratio, max_aspect_ratio, trials), (0.3, 1.0, 0.5, 2.0, 40));
        assert_eq!(sampler_options, &[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]);
        assert!(op.is_random());
        assert_eq!(op.out_size(Some(Size::square(9))), None, "the crop's size depends on the draw");
        assert!(check(r#"{"op": "random_iou_crop"}"#).is_ok());
        // min_scale > max_scale, scale over 1, aspect bounds reversed.
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "min_scale": 0.8, "max_scale": 0.5}"#), "ops[1].min_scale");
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "max_scale": 1.5}"#), "ops[1].min_scale");
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "min_scale": 0}"#), "ops[1].min_scale");
        assert_eq!(
            field_of(r#"{"op": "random_iou_crop", "min_aspect_ratio": 3, "max_aspect_ratio": 2}"#),
            "ops[1].min_aspect_ratio"
        );
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "sampler_options": []}"#), "ops[1].sampler_options");
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "sampler_options": [0.5, 1.5]}"#), "ops[1].sampler_options");
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "trials": 0}"#), "ops[1].trials");
        assert_eq!(field_of(r#"{"op": "random_iou_crop", "trials": 1001}"#), "ops[1].trials");
        // NaN (TOML can spell it; JSON cannot) in any float field names that field.
        let nan = |f: &dyn Fn(&mut OpSpec)| {
            let mut op = OpSpec::RandomIouCrop {
                min_scale: 0.3,
                max_scale: 1.0,
                min_aspect_ratio: 0.5,
                max_aspect_ratio: 2.0,
                sampler_options: vec![0.0, 1.0],
                trials: 40,
            };
            f(&mut op);
            let ops = [OpSpec::Decode, op, OpSpec::CenterCrop { size: Size::square(16) }];
            validate_ops(&ops).err().map(|e| (e.field, e.message))
        };
        let set = |name: &'static str| {
            move |op: &mut OpSpec| {
                if let OpSpec::RandomIouCrop {
                    min_scale,
                    max_scale,
                    min_aspect_ratio,
                    max_aspect_ratio,
                    sampler_options,
                    ..
                } = op
                {
                    match name {
                        "min_scale" => *min_scale = f64::NAN,
                        "max_scale" => *max_scale = f64::NAN,
                        "min_aspect_ratio" => *min_aspect_ratio = f64::NAN,
                        "max_aspect_ratio" => *max_aspect_ratio = f64::NAN,
                        _ => sampler_options[0] = f64::NAN,
                    }
                }
            }
        };
        for (name, field) in [
            ("min_scale", "ops[1].min_scale"),
            ("max_scale", "ops[1].min_scale"),
            ("min_aspect_ratio", "ops[1].min_aspect_ratio"),
            ("max_aspect_ratio", "ops[1].min_aspect_ratio"),
            ("sampler_options", "ops[1].sampler_options"),
        ] {
            let got = nan(&set(name));
            assert_eq!(got.as_ref().map(|g| g.0.as_str()), Some(field), "NaN {name}: {got:?}");
        }
        // Its size is the draw's: a fixed-size op must follow it before batching.
        let alone = [OpSpec::Decode, serde_json::from_str(r#"{"op": "random_iou_crop"}"#).unwrap()];
        assert_eq!(validate_ops(&alone).unwrap_err().field, "ops");
    }

    #[test]
    fn warp_parameters_are_bounded_and_the_error_names_the_field() {
        assert!(check(r#"{"op": "random_rotation", "degrees": [-30, 30]}"#).is_ok());
        assert_eq!(field_of(r#"{"op": "random_rotation", "degrees": [30, -30]}"#), "ops[1].degrees");
        assert_eq!(field_of(r#"{"op": "random_rotation", "degrees": [0, 1e9]}"#), "ops[1].degrees");
        assert_eq!(field_of(r#"{"op": "random_rotation", "degrees": [0, 1], "center": [1e12, 0]}"#), "ops[1].center");
        assert_eq!(
            field_of(r#"{"op": "random_rotation", "degrees": [0, 1], "interpolation": "bicubic"}"#),
            "ops[1].interpolation"
        );
        let affine = r#"{"op": "random_affine", "degrees": [0, 0], "translate": [0.1, 0.2], "scale": [0.5, 2],
                         "shear": [-10, 10, -5, 5], "interpolation": "bilinear", "fill": [1, 2, 3]}"#;
        assert!(check(affine).is_ok());
        assert_eq!(field_of(&affine.replace("[0.1, 0.2]", "[0.1, 1.5]")), "ops[1].translate");
        assert_eq!(field_of(&affine.replace("[0.5, 2]", "[0, 2]")), "ops[1].scale");
        assert_eq!(field_of(&affine.replace("[0.5, 2]", "[0.5, 1e6]")), "ops[1].scale");
        assert_eq!(field_of(&affine.replace("-5, 5]", "-5, 90]")), "ops[1].shear");
        assert_eq!(field_of(r#"{"op": "random_perspective", "distortion_scale": 1.5}"#), "ops[1].distortion_scale");
        assert_eq!(field_of(r#"{"op": "random_perspective", "p": -0.1}"#), "ops[1].p");
        // A fill colour is three u8 values.
        assert!(check(r#"{"op": "random_perspective", "fill": [256, 0, 0]}"#).is_err());
    }

    #[test]
    fn padding_is_bounded_and_pad_and_random_crop_state_their_sizes() {
        let pad = r#"{"op": "pad", "padding": [1, 2, 3, 4], "padding_mode": "reflect"}"#;
        assert!(check(pad).is_ok());
        assert_eq!(field_of(r#"{"op": "pad", "padding": [65535, 0, 1, 0]}"#), "ops[1].padding");
        assert_eq!(field_of(r#"{"op": "pad", "padding": [4294967295, 0, 4294967295, 0]}"#), "ops[1].padding");
        assert_eq!(field_of(r#"{"op": "random_crop", "size": 0}"#), "ops[1].size");
        assert_eq!(field_of(r#"{"op": "random_crop", "size": 8, "padding": [70000, 0, 0, 0]}"#), "ops[1].padding");

        let size = |ops: &[OpSpec]| ops.iter().fold(None, |s, op| op.out_size(s));
        let crop = OpSpec::CenterCrop { size: Size::square(30) };
        let pad: OpSpec = serde_json::from_str(pad).unwrap();
        // A pad after a fixed size has a known size; after a resize it does not.
        assert_eq!(size(&[crop.clone(), pad.clone()]), Some(Size { height: 36, width: 34 }));
        assert_eq!(size(&[OpSpec::resize(30), pad.clone()]), None);
        let e = validate_ops(&[OpSpec::Decode, OpSpec::resize(30), pad.clone()]).unwrap_err();
        assert_eq!(e.field, "ops");
        assert!(validate_ops(&[OpSpec::Decode, crop.clone(), pad]).is_ok());
        // The padded size stays within MAX_SIDE.
        let wide = OpSpec::Pad { padding: [40_000, 0, 0, 0], fill: [0; 3], padding_mode: PaddingMode::Edge };
        let big = OpSpec::CenterCrop { size: Size::square(30_000) };
        assert_eq!(validate_ops(&[OpSpec::Decode, big, wide]).unwrap_err().field, "ops[2].padding");
        // random_crop fixes the size (the CIFAR recipe ends with it).
        let cifar: OpSpec =
            serde_json::from_str(r#"{"op": "random_crop", "size": 32, "padding": [4, 4, 4, 4]}"#).unwrap();
        assert_eq!(size(&[OpSpec::resize(30), cifar.clone()]), Some(Size::square(32)));
        assert!(validate_ops(&[OpSpec::Decode, cifar.clone()]).is_ok());
        // An expanded rotation's size depends on the image: a crop must follow.
        let turn: OpSpec =
            serde_json::from_str(r#"{"op": "random_rotation", "degrees": [0, 90], "expand": true}"#).unwrap();
        assert_eq!(size(&[crop.clone(), turn.clone()]), None);
        assert_eq!(validate_ops(&[OpSpec::Decode, crop.clone(), turn.clone()]).unwrap_err().field, "ops");
        assert!(validate_ops(&[OpSpec::Decode, turn, cifar]).is_ok());
    }

    /// `op` read from JSON and from a TOML table, which must agree.
    fn both(json: &str, toml_src: &str) -> OpSpec {
        let a: OpSpec = serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
        let b: OpSpec = toml::from_str(toml_src).unwrap_or_else(|e| panic!("{toml_src}: {e}"));
        assert_eq!(a, b, "{json} and {toml_src}");
        // Written back as the array it stands for, which reads back the same.
        assert_eq!(serde_json::from_str::<OpSpec>(&serde_json::to_string(&a).unwrap()).unwrap(), a);
        a
    }

    fn refused(json: &str) -> String {
        match serde_json::from_str::<OpSpec>(json) {
            Err(e) => e.to_string(),
            Ok(op) => panic!("{json} read as {op:?}"),
        }
    }

    #[test]
    fn degrees_take_torchvisions_single_number_for_minus_d_to_d() {
        let r = both(r#"{"op": "random_rotation", "degrees": 30}"#, "op = \"random_rotation\"\ndegrees = 30");
        assert!(matches!(r, OpSpec::RandomRotation { degrees: [-30.0, 30.0], .. }), "{r:?}");
        let r = both(r#"{"op": "random_rotation", "degrees": 12.5}"#, "op = \"random_rotation\"\ndegrees = 12.5");
        assert!(matches!(r, OpSpec::RandomRotation { degrees: [-12.5, 12.5], .. }), "{r:?}");
        let a = both(r#"{"op": "random_affine", "degrees": 0}"#, "op = \"random_affine\"\ndegrees = 0");
        assert!(matches!(a, OpSpec::RandomAffine { degrees: [0.0, 0.0], .. }), "{a:?}");
        let a = both(r#"{"op": "random_affine", "degrees": [-5, 10]}"#, "op = \"random_affine\"\ndegrees = [-5, 10]");
        assert!(matches!(a, OpSpec::RandomAffine { degrees: [-5.0, 10.0], .. }), "{a:?}");
        // torchvision: "If degrees is a number, it must be positive".
        let e = refused(r#"{"op": "random_rotation", "degrees": -30}"#);
        assert!(e.contains("degrees") && e.contains("at least 0"), "{e}");
        let e = refused(r#"{"op": "random_affine", "degrees": [1, 2, 3]}"#);
        assert!(e.contains("degrees") && e.contains("[min, max]"), "{e}");
        // Validation still bounds what the number stands for.
        assert_eq!(field_of(r#"{"op": "random_rotation", "degrees": 1000}"#), "ops[1].degrees");
    }

    #[test]
    fn shear_takes_torchvisions_number_pair_or_four_values() {
        let shear = |json: &str, toml_src: &str| match both(json, toml_src) {
            OpSpec::RandomAffine { shear, .. } => shear,
            op => panic!("{op:?}"),
        };
        let base = r#"{"op": "random_affine", "degrees": 0, "shear": "#;
        let t = "op = \"random_affine\"\ndegrees = 0\nshear = ";
        assert_eq!(shear(&format!("{base}10}}"), &format!("{t}10")), Some([-10.0, 10.0, 0.0, 0.0]));
        assert_eq!(shear(&format!("{base}[-5, 15]}}"), &format!("{t}[-5, 15]")), Some([-5.0, 15.0, 0.0, 0.0]));
        assert_eq!(shear(&format!("{base}[1, 2, 3, 4]}}"), &format!("{t}[1, 2, 3, 4]")), Some([1.0, 2.0, 3.0, 4.0]));
        assert_eq!(shear(r#"{"op": "random_affine", "degrees": 0}"#, "op = \"random_affine\"\ndegrees = 0"), None);
        assert!(refused(&format!("{base}-10}}")).contains("at least 0"));
        assert!(refused(&format!("{base}[1, 2, 3]}}")).contains("shear"));
    }

    #[test]
    fn padding_takes_torchvisions_one_two_or_four_values() {
        let pad = |json: &str, toml_src: &str| match both(json, toml_src) {
            OpSpec::Pad { padding, .. } => padding,
            op => panic!("{op:?}"),
        };
        assert_eq!(pad(r#"{"op": "pad", "padding": 8}"#, "op = \"pad\"\npadding = 8"), [8; 4]);
        assert_eq!(pad(r#"{"op": "pad", "padding": [8]}"#, "op = \"pad\"\npadding = [8]"), [8; 4]);
        assert_eq!(pad(r#"{"op": "pad", "padding": [1, 2]}"#, "op = \"pad\"\npadding = [1, 2]"), [1, 2, 1, 2]);
        assert_eq!(
            pad(r#"{"op": "pad", "padding": [1, 2, 3, 4]}"#, "op = \"pad\"\npadding = [1, 2, 3, 4]"),
            [1, 2, 3, 4]
        );
        // The CIFAR recipe, `RandomCrop(32, padding=4)`.
        let crop =
            both(r#"{"op": "random_crop", "size": 32, "padding": 4}"#, "op = \"random_crop\"\nsize = 32\npadding = 4");
        assert!(matches!(crop, OpSpec::RandomCrop { padding: Some([4, 4, 4, 4]), .. }), "{crop:?}");
        let crop = both(
            r#"{"op": "random_crop", "size": 32, "padding": [2, 6]}"#,
            "op = \"random_crop\"\nsize = 32\npadding = [2, 6]",
        );
        assert!(matches!(crop, OpSpec::RandomCrop { padding: Some([2, 6, 2, 6]), .. }), "{crop:?}");
        let crop = both(r#"{"op": "random_crop", "size": 32}"#, "op = \"random_crop\"\nsize = 32");
        assert!(matches!(crop, OpSpec::RandomCrop { padding: None, .. }), "{crop:?}");
        for bad in ["-1", "1.5", "[1, 2, 3]", "4294967296"] {
            let e = refused(&format!(r#"{{"op": "pad", "padding": {bad}}}"#));
            assert!(e.contains("padding"), "{bad}: {e}");
        }
        assert_eq!(field_of(r#"{"op": "pad", "padding": 70000}"#), "ops[1].padding");
    }

    #[test]
    fn fill_takes_one_value_for_every_channel_as_torchvision_does() {
        let ops = [
            r#"{"op": "random_rotation", "degrees": 5"#,
            r#"{"op": "random_affine", "degrees": 5"#,
            r#"{"op": "random_perspective""#,
            r#"{"op": "pad", "padding": 1"#,
            r#"{"op": "random_crop", "size": 8"#,
        ];
        for op in ops {
            let json = format!(r#"{op}, "fill": 128}}"#);
            let read: OpSpec = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            let rgb = serde_json::to_value(&read).unwrap()["fill"].clone();
            assert_eq!(rgb, serde_json::json!([128, 128, 128]), "{json}");
            let one: OpSpec = serde_json::from_str(&json.replace("128", "[128]")).unwrap();
            assert_eq!(one, read, "{json}: [v] is v");
        }
        let t = both(r#"{"op": "pad", "padding": 2, "fill": 7}"#, "op = \"pad\"\npadding = 2\nfill = 7");
        assert!(matches!(t, OpSpec::Pad { fill: [7, 7, 7], .. }), "{t:?}");
        for policy in ["trivial_augment_wide", "rand_augment", "auto_augment", "augmix"] {
            let op = both(&format!(r#"{{"op": "{policy}", "fill": 9}}"#), &format!("op = \"{policy}\"\nfill = 9"));
            assert_eq!(serde_json::to_value(&op).unwrap()["fill"], serde_json::json!([9, 9, 9]), "{policy}");
            let none = both(&format!(r#"{{"op": "{policy}"}}"#), &format!("op = \"{policy}\""));
            assert!(!serde_json::to_string(&none).unwrap().contains("fill"), "{policy}: fill=None stays None");
        }
        for bad in ["256", "-1", "0.5", "[1, 2]"] {
            let e = refused(&format!(r#"{{"op": "random_perspective", "fill": {bad}}}"#));
            assert!(e.contains("fill"), "{bad}: {e}");
        }
    }

    #[test]
    fn geometric_ops_say_whether_they_draw() {
        let ops = [
            (r#"{"op": "random_rotation", "degrees": [0, 0]}"#, true),
            (r#"{"op": "random_affine", "degrees": [0, 0]}"#, true),
            (r#"{"op": "random_perspective"}"#, true),
            (r#"{"op": "random_crop", "size": 8}"#, true),
            (r#"{"op": "pad", "padding": [1, 1, 1, 1]}"#, false),
        ];
        for (json, random) in ops {
            let op: OpSpec = serde_json::from_str(json).unwrap();
            assert_eq!(op.is_random(), random, "{json}");
            // Defaults are torchvision's and round-trip.
            let back: OpSpec = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
            assert_eq!(back, op);
        }
        let r: OpSpec = serde_json::from_str(r#"{"op": "random_rotation", "degrees": [0, 0]}"#).unwrap();
        assert!(matches!(
            r,
            OpSpec::RandomRotation { interpolation: Interpolation::Nearest, expand: false, fill: [0, 0, 0], .. }
        ));
        let p: OpSpec = serde_json::from_str(r#"{"op": "random_perspective"}"#).unwrap();
        assert_eq!(
            p,
            OpSpec::RandomPerspective {
                distortion_scale: 0.5,
                p: 0.5,
                interpolation: Interpolation::Bilinear,
                fill: [0; 3]
            }
        );
    }

    #[test]
    fn resize_modes_default_to_torchvisions_and_stay_out_of_the_json() {
        let r: OpSpec = serde_json::from_str(r#"{"op": "resize", "size": 8}"#).unwrap();
        assert_eq!(r, OpSpec::resize(8));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"op":"resize","size":8}"#);
        let rrc = r#"{"op": "random_resized_crop", "size": 16, "interpolation": "nearest_exact", "antialias": false}"#;
        let op: OpSpec = serde_json::from_str(rrc).unwrap();
        assert!(matches!(
            op,
            OpSpec::RandomResizedCrop { interpolation: Interpolation::NearestExact, antialias: false, .. }
        ));
        assert_eq!(serde_json::from_str::<OpSpec>(&serde_json::to_string(&op).unwrap()).unwrap(), op);
        for mode in ["nearest", "nearest_exact", "bilinear", "bicubic"] {
            assert!(check(&format!(r#"{{"op": "resize", "size": 20, "interpolation": "{mode}"}}"#)).is_ok(), "{mode}");
        }
        assert!(serde_json::from_str::<OpSpec>(r#"{"op": "resize", "size": 8, "interpolation": "area"}"#).is_err());
        // The warps have no nearest-exact kernel.
        assert_eq!(
            field_of(r#"{"op": "random_affine", "degrees": [0, 0], "interpolation": "nearest_exact"}"#),
            "ops[1].interpolation"
        );
    }

    #[test]
    fn augmix_defaults_are_torchvisions_and_its_parameters_are_bounded() {
        let op: OpSpec = serde_json::from_str(r#"{"op": "augmix"}"#).unwrap();
        assert_eq!(
            op,
            OpSpec::AugMix {
                severity: 3,
                mixture_width: 3,
                chain_depth: -1,
                alpha: 1.0,
                all_ops: true,
                interpolation: Interpolation::Bilinear,
                fill: None
            }
        );
        assert!(op.is_random());
        assert_eq!(serde_json::from_str::<OpSpec>(&serde_json::to_string(&op).unwrap()).unwrap(), op);
        assert!(check(r#"{"op": "augmix", "severity": 10, "chain_depth": 0, "all_ops": false}"#).is_ok());
        for (json, field) in [
            (r#"{"op": "augmix", "severity": 0}"#, "ops[1].severity"),
            (r#"{"op": "augmix", "severity": 11}"#, "ops[1].severity"),
            (r#"{"op": "augmix", "mixture_width": 0}"#, "ops[1].mixture_width"),
            (r#"{"op": "augmix", "mixture_width": 100000}"#, "ops[1].mixture_width"),
            (r#"{"op": "augmix", "chain_depth": 2147483647}"#, "ops[1].chain_depth"),
            (r#"{"op": "augmix", "alpha": 0}"#, "ops[1].alpha"),
            (r#"{"op": "augmix", "alpha": 1e300}"#, "ops[1].alpha"),
            (r#"{"op": "augmix", "interpolation": "bicubic"}"#, "ops[1].interpolation"),
        ] {
            assert_eq!(field_of(json), field, "{json}");
        }
    }

    #[test]
    fn policy_parameters_are_bounded_and_the_error_names_the_field() {
        let ta: OpSpec = serde_json::from_str(r#"{"op": "trivial_augment_wide"}"#).unwrap();
        assert_eq!(
            ta,
            OpSpec::TrivialAugmentWide { num_magnitude_bins: 31, interpolation: Interpolation::Nearest, fill: None }
        );
        assert!(ta.is_random());
        assert_eq!(ta.out_size(Some(Size::square(16))), Some(Size::square(16)));
        assert!(check(r#"{"op": "trivial_augment_wide", "num_magnitude_bins": 2, "fill": [1, 2, 3]}"#).is_ok());
        assert_eq!(field_of(r#"{"op": "trivial_augment_wide", "num_magnitude_bins": 1}"#), "ops[1].num_magnitude_bins");
        assert_eq!(
            field_of(r#"{"op": "trivial_augment_wide", "num_magnitude_bins": 4294967295}"#),
            "ops[1].num_magnitude_bins"
        );
        assert_eq!(field_of(r#"{"op": "trivial_augment_wide", "interpolation": "bicubic"}"#), "ops[1].interpolation");
        let ra: OpSpec = serde_json::from_str(r#"{"op": "rand_augment"}"#).unwrap();
        assert!(matches!(ra, OpSpec::RandAugment { num_ops: 2, magnitude: 9, num_magnitude_bins: 31, .. }));
        assert!(check(r#"{"op": "rand_augment", "num_ops": 0}"#).is_ok());
        assert_eq!(field_of(r#"{"op": "rand_augment", "magnitude": 31}"#), "ops[1].magnitude");
        assert_eq!(field_of(r#"{"op": "rand_augment", "num_ops": 100000}"#), "ops[1].num_ops");
        assert_eq!(field_of(r#"{"op": "rand_augment", "num_magnitude_bins": 0}"#), "ops[1].num_magnitude_bins");
        for policy in ["imagenet", "cifar10", "svhn"] {
            assert!(check(&format!(r#"{{"op": "auto_augment", "policy": "{policy}"}}"#)).is_ok());
        }
        assert!(check(r#"{"op": "auto_augment", "policy": "mnist"}"#).is_err());
        assert_eq!(field_of(r#"{"op": "auto_augment", "interpolation": "bicubic"}"#), "ops[1].interpolation");
        // Round trip, `fill` left out when None.
        let json = serde_json::to_string(&ta).unwrap();
        assert!(!json.contains("fill"), "{json}");
        assert_eq!(serde_json::from_str::<OpSpec>(&json).unwrap(), ta);
    }

    #[test]
    fn a_map_op_names_an_importable_function_and_the_error_names_the_field() {
        let op: OpSpec = serde_json::from_str(r#"{"op": "map", "fn": "my_pkg.aug:Blur.apply"}"#).unwrap();
        assert_eq!(op, OpSpec::map("my_pkg.aug:Blur.apply"));
        assert!(op.is_random());
        assert_eq!(op.out_size(Some(Size::square(8))), Some(Size::square(8)));
        assert_eq!(serde_json::from_str::<OpSpec>(&serde_json::to_string(&op).unwrap()).unwrap(), op);
        assert!(check(r#"{"op": "map", "fn": "m:f"}"#).is_ok());
        for bad in ["f", ":f", "m:", "m:f:g", "m:1f", "m..n:f", "m:f.", "m:f g", ""] {
            assert_eq!(field_of(&format!(r#"{{"op": "map", "fn": "{bad}"}}"#)), "ops[1].fn", "{bad}");
        }
        let lambda = check(r#"{"op": "map", "fn": "tests:<lambda>"}"#).unwrap_err();
        assert!(lambda.message.contains("lambda") && lambda.message.contains("importable"), "{lambda}");
        let closure = check(r#"{"op": "map", "fn": "tests:outer.<locals>.inner"}"#).unwrap_err();
        assert!(closure.message.contains("tests:outer.<locals>.inner"), "{closure}");
        let long = format!(r#"{{"op": "map", "fn": "m:{}"}}"#, "f".repeat(MAX_MAP_NAME));
        assert_eq!(field_of(&long), "ops[1].fn");
        // A name reaches its function, not through one: no dunder attributes.
        for bad in ["mod:f.__call__.__call__", "mod:f.__globals__", "mod:Blur.__class__", "mod:__call__"] {
            let e = check(&format!(r#"{{"op": "map", "fn": "{bad}"}}"#)).unwrap_err();
            assert_eq!(e.field, "ops[1].fn", "{bad}");
            assert!(e.message.contains(bad) && e.message.contains("dunder"), "{e}");
        }
        assert!(check(r#"{"op": "map", "fn": "m:_private.__x"}"#).is_ok());
        // The call's timeout: a minute unless given, within an hour, and left out of the
        // JSON at its default (the fingerprints of jobs written before it stay the same).
        let timed: OpSpec = serde_json::from_str(r#"{"op": "map", "fn": "m:f", "timeout_ms": 1500}"#).unwrap();
        assert_eq!(timed, OpSpec::Map { func: "m:f".into(), timeout_ms: 1500 });
        assert_eq!(serde_json::to_string(&OpSpec::map("m:f")).unwrap(), r#"{"op":"map","fn":"m:f"}"#);
        assert!(check(r#"{"op": "map", "fn": "m:f", "timeout_ms": 3600000}"#).is_ok());
        for bad in ["0", "3600001"] {
            let e = check(&format!(r#"{{"op": "map", "fn": "m:f", "timeout_ms": {bad}}}"#)).unwrap_err();
            assert_eq!(e.field, "ops[1].timeout_ms", "{bad}");
        }
        // Like any image op, it runs before the conversions.
        let after = [
            OpSpec::Decode,
            OpSpec::CenterCrop { size: Size::square(8) },
            OpSpec::Dtype { dtype: DType::F32 },
            OpSpec::map("m:f"),
        ];
        assert_eq!(validate_ops(&after).unwrap_err().field, "ops[3]");
    }
}
