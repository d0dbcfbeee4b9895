//! torchvision v2's `RandomIoUCrop` (SSD): a crop chosen against the sample's boxes.
//! [`params`] follows `RandomIoUCrop.make_params` draw for draw: an option from
//! `sampler_options` (1: leave the image as it is), then up to `trials` tries of a side
//! fraction each for width and height in `[min_scale, max_scale]` (truncated to pixels), an
//! aspect-ratio check, a position (truncated), and the test that some box has its centre
//! strictly inside the crop and an IoU with it of at least the option. [`apply`] cuts the
//! window, drops the boxes whose centre lies outside it (torchvision zeroes them for a later
//! `SanitizeBoundingBoxes`; sluice's box rule drops them at once), clips the rest, and says
//! how to move the mask.
//!
//! Two rules torchvision leaves open: a sample without boxes is left as it is and draws
//! nothing; and where torchvision would draw options for ever (no crop can satisfy any
//! option below 1), the image is left as it is after [`IOU_CROP_MAX_ROUNDS`] options.

use sluice_core::{BoxTargets, OpSpec, PaddingMode, SampleRng, IOU_CROP_MAX_ROUNDS};

use super::{frames, not_mine, Frame};
use crate::boxes::{move_boxes, Motion};
use crate::masks::MaskMove;
use crate::CodecError;

/// The parameters of a `random_iou_crop` op (read, and validated, by sluice-core).
pub(crate) type IouCropSpec<'a> = sluice_core::spec::IouCropParams<'a>;

/// A chosen crop: the `w x h` window whose top-left pixel is `(left, top)`, and for each
/// box whether its centre lies strictly inside it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IouCrop {
    pub left: u32,
    pub top: u32,
    pub w: u32,
    pub h: u32,
    pub within: Vec<bool>,
}

/// torchvision's `box_iou` of one XYXY box with another.
pub(crate) fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let area = |r: [f64; 4]| (r[2] - r[0]) * (r[3] - r[1]);
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    inter / (area(a) + area(b) - inter)
}

/// `RandomIoUCrop.make_params` on a `w x h` image with `boxes` (XYXY pixels): the crop, or
/// `None` to leave the image as it is (an option of 1 drawn, no boxes, or no crop found in
/// [`IOU_CROP_MAX_ROUNDS`] options).
pub(crate) fn params(
    w: u32,
    h: u32,
    boxes: &[[f32; 4]],
    spec: &IouCropSpec<'_>,
    rng: &mut SampleRng,
) -> Option<IouCrop> {
    if boxes.is_empty() || spec.options.is_empty() {
        return None;
    }
    let boxes: Vec<[f64; 4]> = boxes.iter().map(|b| b.map(f64::from)).collect();
    let (fw, fh) = (f64::from(w), f64::from(h));
    let [lo, hi] = spec.scale;
    for _ in 0..IOU_CROP_MAX_ROUNDS {
        let idx = rng.below(spec.options.len() as u64) as usize;
        let min_iou = spec.options.get(idx).copied().unwrap_or(1.0);
        if min_iou >= 1.0 {
            return None;
        }
        for _ in 0..spec.trials {
            let (rw, rh) = (rng.uniform(lo, hi), rng.uniform(lo, hi));
            // Python's int(): truncation toward zero.
            let (new_w, new_h) = ((fw * rw) as u32, (fh * rh) as u32);
            // torchvision divides by new_h (a zero raises there); no crop of zero area.
            if new_w == 0 || new_h == 0 {
                continue;
            }
            let aspect = f64::from(new_w) / f64::from(new_h);
            if !(spec.aspect[0] <= aspect && aspect <= spec.aspect[1]) {
                continue;
            }
            let (px, py) = (rng.next_f64(), rng.next_f64());
            let left = (f64::from(w - new_w) * px) as u32;
            let top = (f64::from(h - new_h) * py) as u32;
            let (right, bottom) = (f64::from(left + new_w), f64::from(top + new_h));
            let crop = [f64::from(left), f64::from(top), right, bottom];
            let within: Vec<bool> = boxes
                .iter()
                .map(|b| {
                    let (cx, cy) = (0.5 * (b[0] + b[2]), 0.5 * (b[1] + b[3]));
                    crop[0] < cx && cx < crop[2] && crop[1] < cy && cy < crop[3]
                })
                .collect();
            let best = boxes
                .iter()
                .zip(&within)
                .filter(|(_, &k)| k)
                .map(|(b, _)| iou(*b, crop))
                .fold(f64::NEG_INFINITY, f64::max);
            // No box centre inside: `best` stays -inf and the trial fails, as torchvision's.
            if best < min_iou || best == f64::NEG_INFINITY {
                continue;
            }
            return Some(IouCrop { left, top, w: new_w, h: new_h, within });
        }
    }
    None
}

/// Runs `random_iou_crop` on `src` (`w x h` RGB8) into `dst` against `boxes` (none: the
/// image is copied as it is). The boxes whose centre lies outside the crop are dropped, the
/// rest move with the pixels and are clipped ([`move_boxes`]). Returns the output size and
/// what to replay on a mask.
pub(crate) fn apply(
    op: &OpSpec,
    f: Frame<'_>,
    boxes: Option<&mut BoxTargets>,
) -> Result<((u32, u32), MaskMove), CodecError> {
    let Frame { src, w, h, rng, dst, .. } = f;
    let spec = IouCropSpec::of(op).ok_or_else(|| not_mine(op, "random_iou_crop"))?;
    let crop = match boxes.as_deref() {
        Some(t) => params(w, h, &t.boxes, &spec, rng),
        None => None,
    };
    let Some(c) = crop else {
        let (src, out) = frames(src, dst, w, h)?;
        out.copy_from_slice(src);
        return Ok(((w, h), MaskMove::Identity));
    };
    let row = w as usize * 3;
    let src = src.get(..row * h as usize).ok_or_else(|| {
        CodecError::Shape(format!("a {w}x{h} RGB image needs {} bytes; got {}", row * h as usize, src.len()))
    })?;
    let (x0, x1) = (c.left as usize * 3, (c.left + c.w) as usize * 3);
    dst.clear();
    for r in src.chunks_exact(row).skip(c.top as usize).take(c.h as usize) {
        // `params` keeps the window inside the image.
        dst.extend_from_slice(r.get(x0..x1).unwrap_or_default());
    }
    if let Some(t) = boxes {
        // torchvision zeroes the boxes whose centre is outside for SanitizeBoundingBoxes to
        // drop; they are dropped here at once.
        let mut kept = 0;
        for i in 0..t.boxes.len() {
            if c.within.get(i).copied().unwrap_or(false) {
                t.boxes[kept] = t.boxes[i];
                t.labels[kept] = t.labels[i];
                kept += 1;
            }
        }
        t.boxes.truncate(kept);
        t.labels.truncate(kept);
        move_boxes(t, Motion::crop(f64::from(c.left), f64::from(c.top)), c.w, c.h);
    }
    let origin = (i64::from(c.left), i64::from(c.top));
    Ok(((c.w, c.h), MaskMove::Window { origin, size: (c.w, c.h), mode: PaddingMode::Constant }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SampleKey;

    fn frame<'a>(src: &'a [u8], (w, h): (u32, u32), rng: &'a mut SampleRng, dst: &'a mut Vec<u8>) -> Frame<'a> {
        Frame { src, w, h, rng, max_pixels: u64::MAX, dst }
    }

    const DEFAULT_OPTIONS: [f64; 7] = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0];

    fn spec(options: &[f64]) -> IouCropSpec<'_> {
        IouCropSpec { scale: [0.3, 1.0], aspect: [0.5, 2.0], options, trials: 40 }
    }

    fn rng(key: u64) -> SampleRng {
        SampleRng::new(7, 0, SampleKey(key), 0)
    }

    const BOXES: [[f32; 4]; 3] = [[10.0, 12.0, 60.0, 50.0], [100.0, 20.0, 180.0, 140.0], [30.0, 90.0, 70.0, 118.0]];

    #[test]
    fn the_crop_is_inside_the_image_within_the_bounds_and_holds_a_box_centre() {
        let (w, h) = (200, 120);
        let mut crops = 0;
        for key in 0..400 {
            let mut r = rng(key);
            let Some(c) = params(w, h, &BOXES, &spec(&DEFAULT_OPTIONS), &mut r) else { continue };
            crops += 1;
            assert!(c.w >= 1 && c.h >= 1 && c.left + c.w <= w && c.top + c.h <= h, "{c:?} leaves {w}x{h}");
            // Truncated sides: each at least floor(0.3 * side), at most the side.
            assert!(c.w >= (0.3 * f64::from(w)) as u32 && c.h >= (0.3 * f64::from(h)) as u32, "{c:?}");
            let aspect = f64::from(c.w) / f64::from(c.h);
            assert!((0.5..=2.0).contains(&aspect), "{c:?}: aspect {aspect}");
            let crop = [c.left, c.top, c.left + c.w, c.top + c.h].map(f64::from);
            assert!(c.within.iter().any(|&k| k), "{c:?}: no box centre inside");
            for (b, &k) in BOXES.iter().zip(&c.within) {
                let (cx, cy) = (0.5 * (b[0] + b[2]), 0.5 * (b[1] + b[3]));
                let inside = crop[0] < f64::from(cx) && f64::from(cx) < crop[2];
                let inside = inside && crop[1] < f64::from(cy) && f64::from(cy) < crop[3];
                assert_eq!(k, inside, "{c:?}: box {b:?}");
            }
        }
        assert!(crops > 200, "only {crops} of 400 samples cropped");
    }

    #[test]
    fn a_single_option_is_the_iou_every_crop_meets() {
        // (threshold, samples, how many must find a crop within the bounded rounds)
        for (min_iou, key_count, need) in [(0.3, 60, 60), (0.5, 100, 100), (0.7, 60, 30)] {
            let options = [min_iou];
            let mut found = 0;
            for key in 0..key_count {
                let Some(c) = params(200, 120, &BOXES, &spec(&options), &mut rng(key)) else { continue };
                found += 1;
                let crop = [c.left, c.top, c.left + c.w, c.top + c.h].map(f64::from);
                let best = BOXES
                    .iter()
                    .zip(&c.within)
                    .filter(|(_, &k)| k)
                    .map(|(b, _)| iou(b.map(f64::from), crop))
                    .fold(0.0, f64::max);
                assert!(best >= min_iou, "min IoU {min_iou}, key {key}: {c:?} reaches only {best}");
            }
            assert!(found >= need, "min IoU {min_iou}: {found} of {key_count} found a crop");
        }
    }

    #[test]
    fn an_option_of_one_no_boxes_or_no_possible_crop_leave_the_image() {
        let img: Vec<u8> = (0..40 * 30 * 3).map(|i| i as u8).collect();
        let op = OpSpec::RandomIouCrop {
            min_scale: 0.3,
            max_scale: 1.0,
            min_aspect_ratio: 0.5,
            max_aspect_ratio: 2.0,
            sampler_options: vec![1.0],
            trials: 40,
        };
        let mut t = BoxTargets { boxes: vec![[1.0, 2.0, 20.0, 25.0]], labels: vec![4] };
        let before = t.clone();
        let mut dst = Vec::new();
        let (size, mm) = apply(&op, frame(&img, (40, 30), &mut rng(1), &mut dst), Some(&mut t)).unwrap();
        assert_eq!((size, mm, &dst, &t), ((40, 30), MaskMove::Identity, &img, &before), "option 1.0");
        // No boxes: the image as it is and nothing drawn (the next draw is the same).
        let default_op = OpSpec::RandomIouCrop {
            min_scale: 0.3,
            max_scale: 1.0,
            min_aspect_ratio: 0.5,
            max_aspect_ratio: 2.0,
            sampler_options: DEFAULT_OPTIONS.to_vec(),
            trials: 40,
        };
        for boxes in [None, Some(&mut BoxTargets::default())] {
            let (mut r, mut fresh) = (rng(2), rng(2));
            let (size, _) = apply(&default_op, frame(&img, (40, 30), &mut r, &mut dst), boxes).unwrap();
            assert_eq!((size, &dst), ((40, 30), &img));
            assert_eq!(r.next_u64(), fresh.next_u64(), "a sample without boxes drew from its RNG");
        }
        // A box no crop of at most half the image can overlap by 0.9: bounded, then left.
        let tiny = [[0.0, 0.0, 1.0, 1.0]];
        let tight = IouCropSpec { scale: [0.3, 0.5], aspect: [0.5, 2.0], options: &[0.9], trials: 5 };
        assert_eq!(params(40, 30, &tiny, &tight, &mut rng(3)), None);
    }

    #[test]
    fn the_same_seed_draws_the_same_crop_and_others_differ() {
        let draw = |key| params(200, 120, &BOXES, &spec(&[0.0, 0.3, 0.5]), &mut rng(key));
        let crops: Vec<_> = (0..20).map(draw).collect();
        assert_eq!(crops, (0..20).map(draw).collect::<Vec<_>>());
        let distinct: std::collections::HashSet<_> =
            crops.iter().flatten().map(|c| (c.left, c.top, c.w, c.h)).collect();
        assert!(distinct.len() > 10, "{distinct:?}");
    }

    #[test]
    fn apply_cuts_the_window_drops_outside_centres_and_clips_the_rest() {
        let (w, h) = (200u32, 120u32);
        let img: Vec<u8> = (0..h).flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, 0])).collect();
        let op = OpSpec::RandomIouCrop {
            min_scale: 0.3,
            max_scale: 1.0,
            min_aspect_ratio: 0.5,
            max_aspect_ratio: 2.0,
            sampler_options: vec![0.0, 0.3],
            trials: 40,
        };
        let mut checked = 0;
        for key in 0..30 {
            let spec = IouCropSpec::of(&op).unwrap();
            let c = params(w, h, &BOXES, &spec, &mut rng(key)).unwrap();
            let mut t = BoxTargets { boxes: BOXES.to_vec(), labels: vec![1, 2, 3] };
            let mut dst = Vec::new();
            let (size, mm) = apply(&op, frame(&img, (w, h), &mut rng(key), &mut dst), Some(&mut t)).unwrap();
            assert_eq!(size, (c.w, c.h));
            let origin = (i64::from(c.left), i64::from(c.top));
            assert_eq!(mm, MaskMove::Window { origin, size, mode: PaddingMode::Constant });
            assert_eq!(&dst[..3], &[c.left as u8, c.top as u8, 0], "the window's top-left pixel");
            let last = dst.len() - 3;
            assert_eq!(&dst[last..], &[(c.left + c.w - 1) as u8, (c.top + c.h - 1) as u8, 0]);
            let (cw, ch) = (c.w as f32, c.h as f32);
            let (l, tp) = (c.left as f32, c.top as f32);
            let want: Vec<(i64, [f32; 4])> = BOXES
                .iter()
                .zip([1, 2, 3])
                .zip(&c.within)
                .filter(|(_, &k)| k)
                .map(|((b, l2), _)| {
                    (
                        l2,
                        [
                            (b[0] - l).clamp(0.0, cw),
                            (b[1] - tp).clamp(0.0, ch),
                            (b[2] - l).clamp(0.0, cw),
                            (b[3] - tp).clamp(0.0, ch),
                        ],
                    )
                })
                .filter(|(_, b)| b[2] - b[0] >= 1.0 && b[3] - b[1] >= 1.0)
                .collect();
            let got: Vec<(i64, [f32; 4])> = t.labels.iter().copied().zip(t.boxes.iter().copied()).collect();
            assert_eq!(got, want, "key {key}: {c:?}");
            checked += 1;
        }
        assert_eq!(checked, 30);
    }
}
