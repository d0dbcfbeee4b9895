//! Segmentation masks moved with the pixels, as torchvision v2's kernels move a
//! `tv_tensors.Mask`: each geometric op says what it did as a [`MaskMove`] (the window it
//! cut, the size it resized to, the warp it drew), and [`move_mask`] replays that on the
//! mask with nearest-neighbour sampling and 0 outside the image: the same window copies,
//! the same warp kernels run on one channel, and torch's `interpolate(mode="nearest")`
//! index rule for resizes. So the mask equals torchvision's on the same parameters, pixel
//! for pixel, with `fill={tv_tensors.Mask: 0}`.

use sluice_core::{Interpolation, Mask, PaddingMode};

use crate::crop::CropRect;
use crate::ops::geometry::{self, AffineParams, Warp};
use crate::CodecError;

/// What a geometric op did, to be replayed on a mask.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) enum MaskMove {
    /// Nothing moved.
    #[default]
    Identity,
    /// A `size` window whose top-left pixel is input pixel `origin` (negative: in the
    /// padding, read as `mode` pads; `constant` pads with 0).
    Window {
        origin: (i64, i64),
        size: (u32, u32),
        mode: PaddingMode,
    },
    /// The `rect` window resized to `size` (torch's nearest rule).
    Resized {
        rect: CropRect,
        size: (u32, u32),
    },
    HorizontalFlip,
    VerticalFlip,
    /// torchvision `rotate(angle, expand, center)`.
    Rotate {
        angle: f64,
        expand: bool,
        center: Option<[f64; 2]>,
    },
    /// torchvision `affine` with these parameters.
    Affine(AffineParams),
    /// torchvision `perspective` with these coefficients (`None`: a copy).
    Perspective(Option<[f32; 8]>),
}

/// The warps sample masks nearest, with 0 outside.
const MASK_WARP: Warp<1> = Warp { interpolation: Interpolation::Nearest, fill: Some([0]) };

/// Replays `mv` on `mask`; `tmp` is scratch. Refuses a warp whose output would pass
/// `max_pixels` as the image's op did.
pub(crate) fn move_mask(mask: &mut Mask, mv: MaskMove, tmp: &mut Vec<u8>, max_pixels: u64) -> Result<(), CodecError> {
    let (w, h) = (mask.width, mask.height);
    let n = w as usize * h as usize;
    if mask.data.len() != n {
        return Err(CodecError::Shape(format!("a {w}x{h} mask needs {n} bytes; got {}", mask.data.len())));
    }
    let (ow, oh) = match mv {
        MaskMove::Identity => return Ok(()),
        MaskMove::Window { origin, size, mode } => {
            tmp.resize(size.0 as usize * size.1 as usize, 0);
            geometry::padded_window::<1>(&mask.data, w, h, origin, size, [0], mode, tmp);
            size
        }
        MaskMove::Resized { rect, size } => {
            resize_nearest(&mask.data, w, rect, size, tmp);
            size
        }
        MaskMove::HorizontalFlip => {
            for row in mask.data.chunks_exact_mut(w as usize) {
                row.reverse();
            }
            return Ok(());
        }
        MaskMove::VerticalFlip => {
            tmp.resize(n, 0);
            geometry::vertical_flip::<1>(&mask.data, w, tmp);
            (w, h)
        }
        MaskMove::Rotate { angle, expand, center } => {
            geometry::rotate::<1>(&mask.data, w, h, angle, expand, center, MASK_WARP, max_pixels, tmp)?
        }
        MaskMove::Affine(p) => {
            tmp.resize(n, 0);
            geometry::affine::<1>(&mask.data, w, h, &p, MASK_WARP, tmp);
            (w, h)
        }
        MaskMove::Perspective(coeffs) => {
            tmp.resize(n, 0);
            geometry::perspective::<1>(&mask.data, w, h, coeffs, MASK_WARP, tmp);
            (w, h)
        }
    };
    tmp.truncate(ow as usize * oh as usize);
    std::mem::swap(&mut mask.data, tmp);
    (mask.width, mask.height) = (ow, oh);
    Ok(())
}

/// Resizes `mask` to `size` as torchvision's `F.resize(mask, size, NEAREST)` does (the
/// cache's resize moves a kept mask this way).
pub fn resize_mask(mask: &mut Mask, size: (u32, u32), max_pixels: u64) -> Result<(), CodecError> {
    let rect = CropRect { x: 0, y: 0, w: mask.width, h: mask.height };
    if rect.w == 0 || rect.h == 0 {
        return Err(CodecError::Shape(format!("cannot resize an empty {}x{} mask", rect.w, rect.h)));
    }
    move_mask(mask, MaskMove::Resized { rect, size }, &mut Vec::new(), max_pixels)
}

/// torch's `nearest_idx`: the same index for an unchanged size, `i >> 1` when doubling,
/// else `min(floor(i * (in as f32 / out as f32)), in - 1)` in f32.
fn nearest_index(i: u32, input: u32, output: u32) -> u32 {
    if output == input {
        i
    } else if output == 2 * input {
        i >> 1
    } else {
        let scale = input as f32 / output as f32;
        ((i as f32 * scale).floor() as u32).min(input - 1)
    }
}

/// `F.resized_crop(mask, top, left, h, w, size, NEAREST)`: the `rect` window of the
/// `w`-wide `src`, resized to `size` by torch's nearest rule, into `dst`.
fn resize_nearest(src: &[u8], w: u32, rect: CropRect, (ow, oh): (u32, u32), dst: &mut Vec<u8>) {
    dst.clear();
    dst.reserve(ow as usize * oh as usize);
    let cols: Vec<usize> = (0..ow).map(|x| (rect.x + nearest_index(x, rect.w, ow)) as usize).collect();
    for y in 0..oh {
        let sy = (rect.y + nearest_index(y, rect.h, oh)) as usize;
        let row = &src[sy * w as usize..(sy + 1) * w as usize];
        dst.extend(cols.iter().map(|&x| row[x]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(w: u32, h: u32) -> Mask {
        Mask { width: w, height: h, data: (0..w * h).map(|i| i as u8).collect() }
    }

    #[test]
    fn resize_mask_takes_torch_nearest_rows_and_columns_and_refuses_an_empty_mask() {
        // 5x3 -> 3x2: columns 0, 1, 3 (5 -> 3) and rows 0, 1 (3 -> 2, floor(i * 1.5)).
        let mut m = mask(5, 3);
        resize_mask(&mut m, (3, 2), u64::MAX).unwrap();
        assert_eq!((m.width, m.height, m.data), (3, 2, vec![0, 1, 3, 5, 6, 8]));
        let mut empty = Mask { width: 0, height: 0, data: Vec::new() };
        assert!(matches!(resize_mask(&mut empty, (2, 2), u64::MAX), Err(CodecError::Shape(_))));
    }

    #[test]
    fn nearest_follows_torch_index_rule() {
        // torch.nn.functional.interpolate(arange(5), size=3, mode="nearest") -> 0, 1, 3.
        let got: Vec<u32> = (0..3).map(|i| nearest_index(i, 5, 3)).collect();
        assert_eq!(got, [0, 1, 3]);
        let up: Vec<u32> = (0..6).map(|i| nearest_index(i, 3, 6)).collect();
        assert_eq!(up, [0, 0, 1, 1, 2, 2]);
        let mut m = mask(4, 2);
        let rect = CropRect { x: 1, y: 0, w: 3, h: 2 };
        move_mask(&mut m, MaskMove::Resized { rect, size: (2, 1) }, &mut Vec::new(), u64::MAX)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((m.width, m.height, m.data), (2, 1, vec![1, 2]));
    }

    #[test]
    fn windows_pad_with_zero_and_flips_mirror() {
        let mut m = mask(3, 2);
        let mv = MaskMove::Window { origin: (-1, 1), size: (3, 2), mode: PaddingMode::Constant };
        move_mask(&mut m, mv, &mut Vec::new(), u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.data, [0, 3, 4, 0, 0, 0]);
        move_mask(&mut m, MaskMove::HorizontalFlip, &mut Vec::new(), u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.data, [4, 3, 0, 0, 0, 0]);
        move_mask(&mut m, MaskMove::VerticalFlip, &mut Vec::new(), u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.data, [0, 0, 0, 4, 3, 0]);
        let bad = &mut Mask { width: 3, height: 3, data: vec![0; 4] };
        assert!(move_mask(bad, MaskMove::VerticalFlip, &mut Vec::new(), u64::MAX).is_err());
    }

    #[test]
    fn a_quarter_turn_transposes_the_mask() {
        let mut m = mask(3, 2);
        let mv = MaskMove::Rotate { angle: 90.0, expand: true, center: None };
        move_mask(&mut m, mv, &mut Vec::new(), u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        // torch.rot90 of [[0, 1, 2], [3, 4, 5]]: [[2, 5], [1, 4], [0, 3]].
        assert_eq!((m.width, m.height, m.data), (2, 3, vec![2, 5, 1, 4, 0, 3]));
    }
}
