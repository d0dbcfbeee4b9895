//! Crop geometry with torchvision's semantics. Only rectangles here; pixels move elsewhere.

use sluice_core::SampleRng;

/// An integer rectangle inside an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropRect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// torchvision `RandomResizedCrop.get_params`: up to 10 tries of an area fraction uniform in
/// `scale` and an aspect ratio log-uniform in `ratio`; a try that fits the image is placed
/// uniformly at random. If none fits, the largest centred crop whose aspect ratio is within
/// `ratio`. Draws, in order: two per try, then two for the position.
pub fn random_resized_crop_params(
    width: u32,
    height: u32,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut SampleRng,
) -> CropRect {
    let (fw, fh) = (f64::from(width), f64::from(height));
    let area = fw * fh;
    let (log_r0, log_r1) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale[0], scale[1]);
        let aspect = rng.uniform(log_r0, log_r1).exp();
        // Python's round() rounds half to even.
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= fw && h > 0.0 && h <= fh {
            let (w, h) = (w as u32, h as u32);
            let y = rng.below(u64::from(height - h) + 1) as u32;
            let x = rng.below(u64::from(width - w) + 1) as u32;
            return CropRect { x, y, w, h };
        }
    }
    let in_ratio = fw / fh;
    let (w, h) = if in_ratio < ratio[0] {
        (width, (fw / ratio[0]).round_ties_even() as u32)
    } else if in_ratio > ratio[1] {
        ((fh * ratio[1]).round_ties_even() as u32, height)
    } else {
        (width, height)
    };
    let (w, h) = (w.clamp(1, width.max(1)), h.clamp(1, height.max(1)));
    CropRect { x: (width - w) / 2, y: (height - h) / 2, w, h }
}

/// Where a `CenterCrop` of `out_w x out_h` reads from: output pixel `(ox, oy)` is source
/// pixel `(ox + left, oy + top)`, and zero where that falls outside the image. Offsets are
/// negative when the crop is larger than the image: torchvision pads with zeros (left/top
/// padding `(crop - size) // 2`), and that is what happens here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CenterCropWindow {
    pub left: i64,
    pub top: i64,
    pub out_w: u32,
    pub out_h: u32,
}

fn center_offset(size: u32, crop: u32) -> i64 {
    if crop > size {
        -i64::from((crop - size) / 2)
    } else {
        // int(round((size - crop) / 2.0)), Python rounding (half to even).
        (f64::from(size - crop) / 2.0).round_ties_even() as i64
    }
}

/// torchvision `CenterCrop` geometry for a `width x height` image.
pub fn center_crop_window(width: u32, height: u32, out_w: u32, out_h: u32) -> CenterCropWindow {
    CenterCropWindow { left: center_offset(width, out_w), top: center_offset(height, out_h), out_w, out_h }
}

impl CenterCropWindow {
    /// The source pixels the crop reads (its intersection with the image); `None` if empty.
    pub fn source_rect(&self, width: u32, height: u32) -> Option<CropRect> {
        let x0 = self.left.max(0);
        let y0 = self.top.max(0);
        let x1 = (self.left + i64::from(self.out_w)).min(i64::from(width));
        let y1 = (self.top + i64::from(self.out_h)).min(i64::from(height));
        (x1 > x0 && y1 > y0).then(|| CropRect { x: x0 as u32, y: y0 as u32, w: (x1 - x0) as u32, h: (y1 - y0) as u32 })
    }

    /// Whether the crop needs zero padding (it reaches outside the image).
    pub fn pads(&self, width: u32, height: u32) -> bool {
        self.left < 0
            || self.top < 0
            || self.left + i64::from(self.out_w) > i64::from(width)
            || self.top + i64::from(self.out_h) > i64::from(height)
    }

    /// Writes the crop of the RGB8 image `src` (`src_w x src_h`, whose pixel (0,0) is image
    /// pixel `(origin_x, origin_y)`) into `dst` (`out_w x out_h` RGB8), zero-padding.
    pub(crate) fn copy_rgb(&self, src: &[u8], src_w: u32, origin: (u32, u32), image: (u32, u32), dst: &mut [u8]) {
        if self.pads(image.0, image.1) {
            dst.fill(0);
        }
        let Some(r) = self.source_rect(image.0, image.1) else { return };
        let row_bytes = r.w as usize * 3;
        for row in 0..r.h {
            let sy = (r.y + row - origin.1) as usize;
            let sx = (r.x - origin.0) as usize;
            let dy = (i64::from(r.y + row) - self.top) as usize;
            let dx = (i64::from(r.x) - self.left) as usize;
            let s = (sy * src_w as usize + sx) * 3;
            let d = (dy * self.out_w as usize + dx) * 3;
            if let (Some(from), Some(to)) = (src.get(s..s + row_bytes), dst.get_mut(d..d + row_bytes)) {
                to.copy_from_slice(from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SampleKey;

    const SCALE: [f64; 2] = [0.08, 1.0];
    const RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

    #[test]
    fn rrc_stays_inside_and_respects_scale_and_ratio() {
        for key in 0..2000u64 {
            let mut rng = SampleRng::new(1, 0, SampleKey(key), 0);
            let (w, h) = (500, 375);
            let r = random_resized_crop_params(w, h, SCALE, RATIO, &mut rng);
            assert!(r.w > 0 && r.h > 0 && r.x + r.w <= w && r.y + r.h <= h, "{r:?}");
            let frac = f64::from(r.w * r.h) / f64::from(w * h);
            // Rounding w and h moves the area a little; allow a pixel's worth on each side.
            let slack = f64::from(r.w + r.h + 1) / f64::from(w * h);
            assert!(frac >= SCALE[0] - slack && frac <= SCALE[1] + slack, "{r:?} frac {frac}");
            let aspect = f64::from(r.w) / f64::from(r.h);
            let tol = 1.0 / f64::from(r.h.min(r.w)) + 1e-9;
            assert!(aspect >= RATIO[0] * (1.0 - tol) - tol && aspect <= RATIO[1] * (1.0 + tol) + tol, "{r:?}");
        }
    }

    #[test]
    fn rrc_is_deterministic_for_the_same_rng_and_varies_across_keys() {
        let params = |key| {
            let mut rng = SampleRng::new(9, 3, SampleKey(key), 0);
            random_resized_crop_params(640, 480, SCALE, RATIO, &mut rng)
        };
        assert_eq!(params(5), params(5));
        let distinct: std::collections::HashSet<_> = (0..50)
            .map(|k| {
                let r = params(k);
                (r.x, r.y, r.w, r.h)
            })
            .collect();
        assert!(distinct.len() > 40);
    }

    #[test]
    fn rrc_falls_back_to_a_centred_crop_for_extreme_aspect_ratios() {
        // 1000x10: no crop with aspect <= 4/3 and area >= 8% fits, so every try fails.
        let mut rng = SampleRng::new(0, 0, SampleKey(0), 0);
        let r = random_resized_crop_params(1000, 10, SCALE, RATIO, &mut rng);
        // in_ratio 100 > 4/3: h = 10, w = round(10 * 4/3) = 13, centred.
        assert_eq!(r, CropRect { x: (1000 - 13) / 2, y: 0, w: 13, h: 10 });
        let r = random_resized_crop_params(10, 1000, SCALE, RATIO, &mut rng);
        assert_eq!(r, CropRect { x: 0, y: (1000 - 13) / 2, w: 10, h: 13 });
        // 1x1 always fits.
        assert_eq!(random_resized_crop_params(1, 1, SCALE, RATIO, &mut rng), CropRect { x: 0, y: 0, w: 1, h: 1 });
        // Scale exactly 1 with ratio exactly 1 on a square image: the whole image.
        let r = random_resized_crop_params(64, 64, [1.0, 1.0], [1.0, 1.0], &mut rng);
        assert_eq!(r, CropRect { x: 0, y: 0, w: 64, h: 64 });
    }

    #[test]
    fn center_crop_matches_torchvision_rounding_and_padding() {
        // (size - crop) / 2 rounded half to even: 1.5 -> 2, 2.5 -> 2, 0.5 -> 0.
        assert_eq!(center_crop_window(13, 10, 10, 10).left, 2);
        assert_eq!(center_crop_window(15, 10, 10, 10).left, 2);
        assert_eq!(center_crop_window(11, 10, 10, 10).left, 0);
        assert_eq!(
            center_crop_window(256, 341, 224, 224),
            CenterCropWindow { left: 16, top: 58, out_w: 224, out_h: 224 }
        );
        // Larger than the image: pad (crop - size) // 2 on the left/top.
        let c = center_crop_window(3, 2, 6, 5);
        assert_eq!((c.left, c.top), (-1, -1));
        assert!(c.pads(3, 2));
        assert_eq!(c.source_rect(3, 2), Some(CropRect { x: 0, y: 0, w: 3, h: 2 }));

        let src: Vec<u8> = (1..=18).collect(); // 3x2 RGB
        let mut dst = vec![7u8; 6 * 5 * 3];
        c.copy_rgb(&src, 3, (0, 0), (3, 2), &mut dst);
        let px = |x: usize, y: usize| &dst[(y * 6 + x) * 3..(y * 6 + x) * 3 + 3];
        assert_eq!(px(0, 0), &[0, 0, 0]);
        assert_eq!(px(1, 1), &[1, 2, 3]);
        assert_eq!(px(3, 2), &[16, 17, 18]);
        assert_eq!(px(4, 2), &[0, 0, 0]);
        assert_eq!(px(1, 3), &[0, 0, 0]);
        assert_eq!(dst.iter().filter(|&&v| v != 0).count(), 18);
    }
}
