//! Colour ops: each output pixel from the input's pixels, the size unchanged
//! (torchvision's `adjust_*`, `invert`, ... in `transforms.v2.functional`).

use sluice_core::{OpSpec, SampleRng};

use super::{frames, not_mine};
use crate::CodecError;

pub(super) fn runs(op: &OpSpec) -> bool {
    matches!(op, OpSpec::Invert)
}

/// Ops whose output pixel depends only on the same input pixel (see
/// [`super::commutes_with_flip`]).
pub(super) fn is_pointwise(op: &OpSpec) -> bool {
    matches!(op, OpSpec::Invert)
}

pub(super) fn apply(
    op: &OpSpec,
    src: &[u8],
    w: u32,
    h: u32,
    _rng: &mut SampleRng,
    dst: &mut Vec<u8>,
) -> Result<(u32, u32), CodecError> {
    let (src, out) = frames(src, dst, w, h)?;
    match op {
        OpSpec::Invert => invert(src, out),
        _ => return Err(not_mine(op, "colour")),
    }
    Ok((w, h))
}

/// torchvision `invert` on u8: `255 - x`.
fn invert(src: &[u8], out: &mut [u8]) {
    for (o, s) in out.iter_mut().zip(src) {
        *o = 255 - s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SampleKey;

    #[test]
    fn invert_maps_each_value_to_its_complement() {
        let src: Vec<u8> = (0..=255).chain(0..=1).collect();
        let mut dst = Vec::new();
        let mut rng = SampleRng::new(0, 0, SampleKey(0), 0);
        let (w, h) = apply(&OpSpec::Invert, &src, 1, 86, &mut rng, &mut dst).unwrap();
        assert_eq!((w, h), (1, 86));
        assert!(dst.iter().zip(&src).all(|(d, s)| u16::from(*d) + u16::from(*s) == 255));
    }
}
