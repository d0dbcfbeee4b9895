//! Geometric ops: pixels move (torchvision's `vertical_flip`, ...). Each returns the size
//! its output has; `OpSpec::out_size` states the same rule for validation.

use sluice_core::{OpSpec, SampleRng};

use super::{frames, not_mine};
use crate::CodecError;

pub(super) fn runs(op: &OpSpec) -> bool {
    matches!(op, OpSpec::RandomVerticalFlip { .. })
}

pub(super) fn apply(
    op: &OpSpec,
    src: &[u8],
    w: u32,
    h: u32,
    rng: &mut SampleRng,
    dst: &mut Vec<u8>,
) -> Result<(u32, u32), CodecError> {
    let (src, out) = frames(src, dst, w, h)?;
    match *op {
        OpSpec::RandomVerticalFlip { p } => {
            // torchvision: flip if torch.rand(1) < p.
            if rng.next_f64() < p {
                vertical_flip(src, w, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        _ => return Err(not_mine(op, "geometric")),
    }
    Ok((w, h))
}

/// Rows of width `w` in reverse order.
fn vertical_flip(src: &[u8], w: u32, out: &mut [u8]) {
    let row = w as usize * 3;
    for (o, s) in out.chunks_exact_mut(row).zip(src.chunks_exact(row).rev()) {
        o.copy_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SampleKey;

    #[test]
    fn vertical_flip_reverses_rows_when_drawn_and_copies_otherwise() {
        // 2 wide, 3 tall: rows 0, 1, 2.
        let src: Vec<u8> = (0..3).flat_map(|r| [r * 10; 6]).collect();
        let mut dst = Vec::new();
        let mut rng = SampleRng::new(0, 0, SampleKey(0), 0);
        let always = OpSpec::RandomVerticalFlip { p: 1.0 };
        assert_eq!(apply(&always, &src, 2, 3, &mut rng, &mut dst).unwrap(), (2, 3));
        assert_eq!(dst, [[20; 6], [10; 6], [0; 6]].concat());
        let never = OpSpec::RandomVerticalFlip { p: 0.0 };
        apply(&never, &src, 2, 3, &mut rng, &mut dst).unwrap();
        assert_eq!(dst, src);
    }
}
