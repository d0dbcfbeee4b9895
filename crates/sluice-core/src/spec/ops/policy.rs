//! Parameter types and bounds of the augmentation policies (`trivial_augment_wide`,
//! `rand_augment`, `auto_augment`), as torchvision's transform classes take them.

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// torchvision's `AutoAugmentPolicy`: the sub-policies learned on ImageNet, CIFAR-10 or SVHN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoAugmentPolicy {
    #[default]
    Imagenet,
    Cifar10,
    Svhn,
}

/// The most magnitude bins a policy may have (torchvision's default is 31).
pub const MAX_MAGNITUDE_BINS: u32 = 1024;
/// The most ops `rand_augment` may chain per sample.
pub const MAX_POLICY_OPS: u32 = 64;

/// AugMix's largest severity (torchvision's `_PARAMETER_MAX`: its magnitude tables have 10
/// bins and `severity` bounds the bin drawn).
pub const AUGMIX_SEVERITY_MAX: u32 = 10;
/// The largest AugMix `alpha`: far past any use, and small enough that the Gamma draws
/// behind its Dirichlet weights stay finite.
pub const AUGMIX_ALPHA_MAX: f64 = 1000.0;

/// A bin count: at least 2 (torchvision's posterize table divides by `bins - 1`).
pub(super) fn check_bins(bins: u32, field: &str) -> Result<(), SpecError> {
    if !(2..=MAX_MAGNITUDE_BINS).contains(&bins) {
        return Err(SpecError::new(field, format!("must be in 2..={MAX_MAGNITUDE_BINS}; got {bins}")));
    }
    Ok(())
}
