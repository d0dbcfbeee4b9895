//! Bounding boxes moved with the pixels, as torchvision v2's box kernels move
//! `tv_tensors.BoundingBoxes`: each geometric op reports the [`Motion`] it applied to the
//! image, and [`move_boxes`] maps every box through it, then applies the stated rule
//! ([`BoxTargets::sanitize`]: clamp to the new image, drop boxes under one pixel a side).
//!
//! Axis-aligned motions (crop, pad, resize, flips) map the corners exactly. Warps (rotation,
//! affine, perspective) map the four corners of each box and take the box that encloses
//! them, as torchvision does (`_affine_bounding_boxes_with_expand`,
//! `perspective_bounding_boxes`).

use sluice_core::BoxTargets;

/// How an op moved the image's pixels, in pixel coordinates of its input and output
/// (a point `(x, y)` of the input lands at the returned point of the output).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Motion {
    /// Nothing moved (an op that drew not to act, or a colour op).
    #[default]
    Identity,
    /// `x' = x * sx + tx`, `y' = y * sy + ty`: crops, pads, resizes and their fusions.
    Scale { sx: f64, sy: f64, tx: f64, ty: f64 },
    /// Mirrored left to right in an image `w` wide: `x' = w - x`.
    HorizontalFlip { w: f64 },
    /// Mirrored top to bottom in an image `h` tall: `y' = h - y`.
    VerticalFlip { h: f64 },
    /// `[a, b, c, d, e, f]`: `x' = a x + b y + c`, `y' = d x + e y + f`.
    Affine([f64; 6]),
    /// `x' = (c0 x + c1 y + c2) / (c6 x + c7 y + 1)`, `y' = (c3 x + c4 y + c5) / (...)`.
    Perspective([f64; 8]),
}

impl Motion {
    /// A crop whose top-left corner is input pixel `(left, top)` (negative: padding).
    pub fn crop(left: f64, top: f64) -> Self {
        Motion::Scale { sx: 1.0, sy: 1.0, tx: -left, ty: -top }
    }

    /// A crop of the `cw x ch` window at `(left, top)` resized to `ow x oh`.
    pub fn resized_crop(left: f64, top: f64, (cw, ch): (f64, f64), (ow, oh): (f64, f64)) -> Self {
        let (sx, sy) = (ow / cw, oh / ch);
        Motion::Scale { sx, sy, tx: -left * sx, ty: -top * sy }
    }

    fn map(&self, x: f64, y: f64) -> (f64, f64) {
        match *self {
            Motion::Identity => (x, y),
            Motion::Scale { sx, sy, tx, ty } => (x * sx + tx, y * sy + ty),
            Motion::HorizontalFlip { w } => (w - x, y),
            Motion::VerticalFlip { h } => (x, h - y),
            Motion::Affine([a, b, c, d, e, f]) => (a * x + b * y + c, d * x + e * y + f),
            Motion::Perspective(k) => {
                let den = k[6] * x + k[7] * y + 1.0;
                ((k[0] * x + k[1] * y + k[2]) / den, (k[3] * x + k[4] * y + k[5]) / den)
            }
        }
    }
}

/// Maps every box of `targets` through `motion` and applies the stated rule for the new
/// `w x h` image. An `Identity` motion only re-applies the rule.
pub fn move_boxes(targets: &mut BoxTargets, motion: Motion, w: u32, h: u32) {
    if motion != Motion::Identity {
        for b in &mut targets.boxes {
            let [x1, y1, x2, y2] = b.map(f64::from);
            let corners = [motion.map(x1, y1), motion.map(x2, y1), motion.map(x2, y2), motion.map(x1, y2)];
            let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
            for (x, y) in corners {
                lo = [lo[0].min(x), lo[1].min(y)];
                hi = [hi[0].max(x), hi[1].max(y)];
            }
            *b = [lo[0] as f32, lo[1] as f32, hi[0] as f32, hi[1] as f32];
        }
    }
    targets.sanitize(w, h);
}

/// torchvision's `_get_inverse_affine_matrix(..., inverted=False)`: the forward map of
/// `affine(angle, translate, scale, shear)` about `center` (pixel coordinates).
pub(crate) fn forward_affine(
    center: [f64; 2],
    angle: f64,
    translate: [f64; 2],
    scale: f64,
    shear: [f64; 2],
) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let a = (rot - sy).cos() / sy.cos();
    let b = -(a * sx.tan() + rot.sin());
    let c = (rot - sy).sin() / sy.cos();
    let d = rot.cos() - c * sx.tan();
    let mut m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0];
    m[2] += cx + tx - m[0] * cx - m[1] * cy;
    m[5] += cy + ty - m[3] * cx - m[4] * cy;
    m
}

/// The forward map of torchvision `rotate(angle, expand, center)` on a `w x h` image whose
/// output is `ow x oh`: its box kernel rotates by `-angle` about the centre and, when the
/// canvas was expanded, moves the rotated image's top-left corner to the origin.
pub(crate) fn rotation(angle: f64, expand: bool, center: Option<[f64; 2]>, (w, h): (u32, u32)) -> Motion {
    let (wf, hf) = (f64::from(w), f64::from(h));
    let center = center.unwrap_or([wf * 0.5, hf * 0.5]);
    let mut m = forward_affine(center, -angle, [0.0, 0.0], 1.0, [0.0, 0.0]);
    if expand {
        let corners = [(0.0, 0.0), (0.0, hf), (wf, hf), (wf, 0.0)];
        let (mut mx, mut my) = (f64::INFINITY, f64::INFINITY);
        for (x, y) in corners {
            mx = mx.min(m[0] * x + m[1] * y + m[2]);
            my = my.min(m[3] * x + m[4] * y + m[5]);
        }
        m[2] -= mx;
        m[5] -= my;
    }
    Motion::Affine(m)
}

/// The forward map of torchvision `perspective` given its `coefficients` (which map output
/// to input): their inverse, as `_compute_perspective_thetas` takes it. `Identity` when they
/// cannot be inverted (the pixels were copied then, too).
pub(crate) fn perspective(coeffs: Option<[f32; 8]>) -> Motion {
    let Some(c) = coeffs else { return Motion::Identity };
    let c = c.map(f64::from);
    let den = c[0] * c[4] - c[1] * c[3];
    if den == 0.0 || !den.is_finite() {
        return Motion::Identity;
    }
    Motion::Perspective([
        (c[4] - c[5] * c[7]) / den,
        (-c[1] + c[2] * c[7]) / den,
        (c[1] * c[5] - c[2] * c[4]) / den,
        (-c[3] + c[5] * c[6]) / den,
        (c[0] - c[2] * c[6]) / den,
        (-c[0] * c[5] + c[2] * c[3]) / den,
        (-c[4] * c[6] + c[3] * c[7]) / den,
        (-c[0] * c[7] + c[1] * c[6]) / den,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(b: [f32; 4]) -> BoxTargets {
        BoxTargets { boxes: vec![b], labels: vec![5] }
    }

    fn close(a: [f32; 4], b: [f32; 4]) -> bool {
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-3)
    }

    #[test]
    fn flips_crops_and_resizes_move_corners_exactly() {
        let mut t = one([10.0, 20.0, 30.0, 50.0]);
        move_boxes(&mut t, Motion::HorizontalFlip { w: 100.0 }, 100, 80);
        assert_eq!(t.boxes, vec![[70.0, 20.0, 90.0, 50.0]]);
        move_boxes(&mut t, Motion::VerticalFlip { h: 80.0 }, 100, 80);
        assert_eq!(t.boxes, vec![[70.0, 30.0, 90.0, 60.0]]);
        move_boxes(&mut t, Motion::crop(60.0, 25.0), 20, 20);
        assert_eq!(t.boxes, vec![[10.0, 5.0, 20.0, 20.0]], "clamped to the 20x20 crop");
        move_boxes(&mut t, Motion::resized_crop(10.0, 0.0, (10.0, 20.0), (40.0, 40.0)), 40, 40);
        assert_eq!(t.boxes, vec![[0.0, 10.0, 40.0, 40.0]]);
        assert_eq!(t.labels, vec![5]);
        // A box the crop leaves out is dropped with its label.
        move_boxes(&mut t, Motion::crop(-50.0, 0.0), 45, 40);
        assert!(t.is_empty() && t.labels.is_empty(), "{t:?}");
    }

    #[test]
    fn a_quarter_turn_with_expand_swaps_the_axes() {
        // torchvision rotate(90, expand=True) of a 100x50 image: counter-clockwise, 50x100.
        let mut t = one([10.0, 5.0, 30.0, 15.0]);
        move_boxes(&mut t, rotation(90.0, true, None, (100, 50)), 50, 100);
        assert!(close(t.boxes[0], [5.0, 70.0, 15.0, 90.0]), "{:?}", t.boxes);
    }

    #[test]
    fn a_rotated_box_is_the_one_enclosing_its_corners() {
        // 45 degrees about the centre of a 100x100 image: a centred 20x20 square becomes a
        // diamond whose enclosing box is 20*sqrt(2) a side.
        let mut t = one([40.0, 40.0, 60.0, 60.0]);
        move_boxes(&mut t, rotation(45.0, false, None, (100, 100)), 100, 100);
        let half = 10.0 * std::f32::consts::SQRT_2;
        assert!(close(t.boxes[0], [50.0 - half, 50.0 - half, 50.0 + half, 50.0 + half]), "{:?}", t.boxes);
    }

    #[test]
    fn affine_translation_and_scale_follow_torchvision() {
        // scale 2 about the centre (50, 50), then translate by (5, -3).
        let m = forward_affine([50.0, 50.0], 0.0, [5.0, -3.0], 2.0, [0.0, 0.0]);
        let mut t = one([40.0, 40.0, 50.0, 45.0]);
        move_boxes(&mut t, Motion::Affine(m), 100, 100);
        assert!(close(t.boxes[0], [35.0, 27.0, 55.0, 37.0]), "{:?}", t.boxes);
    }

    #[test]
    fn perspective_inverts_the_pixel_coefficients() {
        // Coefficients of a pure shift by (+3, +2) from output to input: x_in = x_out + 3.
        let coeffs = [1.0, 0.0, 3.0, 0.0, 1.0, 2.0, 0.0, 0.0];
        let mut t = one([10.0, 10.0, 20.0, 20.0]);
        move_boxes(&mut t, perspective(Some(coeffs)), 100, 100);
        assert!(close(t.boxes[0], [7.0, 8.0, 17.0, 18.0]), "{:?}", t.boxes);
        assert_eq!(perspective(Some([0.0; 8])), Motion::Identity);
    }

    #[test]
    fn a_degenerate_warp_drops_the_box_instead_of_keeping_nan() {
        let mut t = one([10.0, 10.0, 20.0, 20.0]);
        move_boxes(&mut t, Motion::Perspective([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), 100, 100);
        assert!(t.is_empty(), "{t:?}");
        let mut t = one([10.0, 10.0, 20.0, 20.0]);
        move_boxes(&mut t, Motion::Affine([f64::NAN; 6]), 100, 100);
        assert!(t.is_empty(), "{t:?}");
    }
}
