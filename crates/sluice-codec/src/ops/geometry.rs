//! Geometric ops: pixels move (torchvision's `vertical_flip`, `affine`, `rotate`,
//! `perspective`, `pad`, `crop`). Each returns the size its output has;
//! `OpSpec::out_size` states the same rule for validation.
//!
//! The warps ([`affine`], [`rotate`], [`perspective`]) follow torchvision's tensor kernels:
//! an inverse map from each output pixel centre to input coordinates in f32, as
//! `_affine_grid`/`_perspective_grid` and `grid_sample(align_corners=False)` compute it,
//! then nearest (ties to even) or bilinear sampling with zeros outside, and the fill colour
//! mixed in by the sampled in-image mask (`_apply_grid_transform`): `(v - fill) * mask +
//! fill`, rounded half to even.

use sluice_core::{Interpolation, OpSpec, PaddingMode, SampleRng, Size};

use super::{frames, not_mine, Moved};
use crate::boxes::{self, Motion};
use crate::masks::MaskMove;
use crate::CodecError;

pub(super) fn runs(op: &OpSpec) -> bool {
    matches!(
        op,
        OpSpec::RandomVerticalFlip { .. }
            | OpSpec::RandomRotation { .. }
            | OpSpec::RandomAffine { .. }
            | OpSpec::RandomPerspective { .. }
            | OpSpec::RandomCrop { .. }
            | OpSpec::Pad { .. }
            | OpSpec::RandomIouCrop { .. }
    )
}

/// Runs `op` on `src` (`w x h` RGB8) into `dst`; an output larger than `max_pixels` (an
/// expanded rotation, a pad) is refused before anything is allocated.
/// Runs `op` on `f`; returns the output size and how the pixels moved (for the sample's
/// boxes and its mask).
pub(super) fn apply_moving(op: &OpSpec, f: super::Frame<'_>) -> Result<((u32, u32), Moved), CodecError> {
    let mut moved = Moved::NONE;
    let out = apply_into(op, f, &mut moved.motion, &mut moved.mask)?;
    Ok((out, moved))
}

fn apply_into(
    op: &OpSpec,
    f: super::Frame<'_>,
    motion: &mut Motion,
    mask_move: &mut MaskMove,
) -> Result<(u32, u32), CodecError> {
    let super::Frame { src, w, h, rng, max_pixels, dst } = f;
    match *op {
        OpSpec::RandomRotation { degrees, interpolation, expand, center, fill } => {
            // torchvision: angle = uniform(degrees[0], degrees[1]).
            let angle = rng.uniform(degrees[0], degrees[1]);
            let warp = Warp { interpolation, fill: Some(fill) };
            let out = rotate(src, w, h, angle, expand, center, warp, max_pixels, dst)?;
            *motion = boxes::rotation(angle.rem_euclid(360.0), expand, center, (w, h));
            *mask_move = MaskMove::Rotate { angle, expand, center };
            return Ok(out);
        }
        OpSpec::RandomAffine { degrees, translate, scale, shear, interpolation, fill } => {
            // torchvision's RandomAffine.make_params, draw for draw.
            let angle = rng.uniform(degrees[0], degrees[1]);
            let (tx, ty) = match translate {
                Some([fx, fy]) => {
                    let (max_dx, max_dy) = (fx * f64::from(w), fy * f64::from(h));
                    let tx = rng.uniform(-max_dx, max_dx).round_ties_even();
                    (tx, rng.uniform(-max_dy, max_dy).round_ties_even())
                }
                None => (0.0, 0.0),
            };
            let scale = scale.map_or(1.0, |[lo, hi]| rng.uniform(lo, hi));
            let shear = shear.map_or([0.0, 0.0], |[x0, x1, y0, y1]| {
                let sx = rng.uniform(x0, x1);
                [sx, rng.uniform(y0, y1)]
            });
            let params = AffineParams { angle, translate: [tx, ty], scale, shear, center: None };
            let (src, out) = frames(src, dst, w, h)?;
            affine(src, w, h, &params, Warp { interpolation, fill: Some(fill) }, out);
            let center = [f64::from(w) * 0.5, f64::from(h) * 0.5];
            *motion = Motion::Affine(boxes::forward_affine(center, angle, [tx, ty], scale, shear));
            *mask_move = MaskMove::Affine(params);
        }
        OpSpec::RandomPerspective { distortion_scale, p, interpolation, fill } => {
            let (src, out) = frames(src, dst, w, h)?;
            // torchvision: skip when torch.rand(1) >= p, else draw the four corners.
            if rng.next_f64() >= p {
                out.copy_from_slice(src);
            } else {
                let ends = perspective_endpoints(w, h, distortion_scale, rng);
                let (r, b) = (i64::from(w) - 1, i64::from(h) - 1);
                let starts = [[0, 0], [r, 0], [r, b], [0, b]];
                let coeffs = perspective_coefficients(&starts, &ends);
                perspective(src, w, h, coeffs, Warp { interpolation, fill: Some(fill) }, out);
                *motion = boxes::perspective(coeffs);
                *mask_move = MaskMove::Perspective(coeffs);
            }
        }
        OpSpec::Pad { padding, fill, padding_mode } => {
            let out = pad(src, w, h, padding, fill, padding_mode, max_pixels, dst)?;
            *motion = Motion::crop(-f64::from(padding[0]), -f64::from(padding[1]));
            let origin = (-i64::from(padding[0]), -i64::from(padding[1]));
            *mask_move = MaskMove::Window { origin, size: out, mode: padding_mode };
            return Ok(out);
        }
        OpSpec::RandomIouCrop { .. } => {
            // Without the sample's boxes (the plan passes them to `iou_crop::apply` itself)
            // the image is left as it is.
            let (out, mm) = super::iou_crop::apply(op, super::Frame { src, w, h, rng, max_pixels, dst }, None)?;
            *mask_move = mm;
            return Ok(out);
        }
        OpSpec::RandomCrop { size, padding, pad_if_needed, fill, padding_mode } => {
            let (out, (left, top)) =
                random_crop(src, w, h, size, padding, pad_if_needed, fill, padding_mode, rng, dst)?;
            *motion = Motion::crop(left as f64, top as f64);
            *mask_move = MaskMove::Window { origin: (left, top), size: out, mode: padding_mode };
            return Ok(out);
        }
        _ => {}
    }
    let (src, out) = frames(src, dst, w, h)?;
    match *op {
        OpSpec::RandomRotation { .. }
        | OpSpec::RandomAffine { .. }
        | OpSpec::RandomPerspective { .. }
        | OpSpec::Pad { .. }
        | OpSpec::RandomCrop { .. }
        | OpSpec::RandomIouCrop { .. } => {}
        OpSpec::RandomVerticalFlip { p } => {
            // torchvision: flip if torch.rand(1) < p.
            if rng.next_f64() < p {
                vertical_flip::<3>(src, w, out);
                *motion = Motion::VerticalFlip { h: f64::from(h) };
                *mask_move = MaskMove::VerticalFlip;
            } else {
                out.copy_from_slice(src);
            }
        }
        _ => return Err(not_mine(op, "geometric")),
    }
    Ok((w, h))
}

/// Rows of width `w` in reverse order.
pub(crate) fn vertical_flip<const C: usize>(src: &[u8], w: u32, out: &mut [u8]) {
    let row = w as usize * C;
    for (o, s) in out.chunks_exact_mut(row).zip(src.chunks_exact(row).rev()) {
        o.copy_from_slice(s);
    }
}

/// How a warp samples the input: nearest or bilinear, and the colour outside the image.
/// `fill: None` is torchvision's `fill=None`: zeros outside and no mask blend (the
/// augmentation policies' default), which differs from `Some([0, 0, 0])` when bilinear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Warp<const C: usize = 3> {
    pub interpolation: Interpolation,
    pub fill: Option<[u8; C]>,
}

/// torchvision `affine`'s parameters: `angle` in degrees (clockwise on screen, as
/// torchvision's), `translate` in pixels, `shear` `[x, y]` in degrees, `center` in pixel
/// coordinates (the image centre when `None`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AffineParams {
    pub angle: f64,
    pub translate: [f64; 2],
    pub scale: f64,
    pub shear: [f64; 2],
    pub center: Option<[f64; 2]>,
}

/// torchvision's `_get_inverse_affine_matrix` (`inverted=True`): the 2x3 map from output
/// to input coordinates, both relative to `center`.
fn inverse_affine_matrix(center: [f64; 2], angle: f64, translate: [f64; 2], scale: f64, shear: [f64; 2]) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let a = (rot - sy).cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = (rot - sy).sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty);
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty);
    m
}

/// The centre torchvision's tensor kernels use: relative to the image centre.
fn centred(center: Option<[f64; 2]>, w: u32, h: u32) -> [f64; 2] {
    center.map_or([0.0, 0.0], |[cx, cy]| [cx - f64::from(w) * 0.5, cy - f64::from(h) * 0.5])
}

/// torchvision `affine` on a `w x h` RGB8 image into `out` (the same size).
pub(crate) fn affine<const C: usize>(src: &[u8], w: u32, h: u32, p: &AffineParams, warp: Warp<C>, out: &mut [u8]) {
    let m = inverse_affine_matrix(centred(p.center, w, h), p.angle, p.translate, p.scale, p.shear);
    warp_affine(src, w, h, &m, (w, h), warp, out);
}

/// torchvision `rotate` (counter-clockwise by `angle` degrees) into `dst`, resized to the
/// output: the input's size, or with `expand` the size that holds the whole rotated image
/// (refused past `max_pixels`). Returns the output size.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotate<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    angle: f64,
    expand: bool,
    center: Option<[f64; 2]>,
    warp: Warp<C>,
    max_pixels: u64,
    dst: &mut Vec<u8>,
) -> Result<(u32, u32), CodecError> {
    let angle = angle.rem_euclid(360.0);
    if center.is_none() {
        // torchvision's exact fast paths (a copy and torch.rot90).
        let quarter = if angle == 0.0 {
            Some(0)
        } else if angle == 180.0 {
            Some(2)
        } else if angle == 90.0 && (expand || w == h) {
            Some(1)
        } else if angle == 270.0 && (expand || w == h) {
            Some(3)
        } else {
            None
        };
        if let Some(k) = quarter {
            let (src, out) = frames_of::<C>(src, dst, w, h)?;
            return Ok(rot90::<C>(src, w, h, k, out));
        }
    }
    // torchvision passes -angle: its rotate turns the other way from its affine.
    let m = inverse_affine_matrix(centred(center, w, h), -angle, [0.0, 0.0], 1.0, [0.0, 0.0]);
    let (ow, oh) = if expand { affine_output_size(&m, w, h) } else { (w.into(), h.into()) };
    if ow * oh > max_pixels || ow > u64::from(u32::MAX) || oh > u64::from(u32::MAX) {
        return Err(CodecError::OpTooLarge { op: "random_rotation", width: ow, height: oh, limit: max_pixels });
    }
    let (ow, oh) = (ow as u32, oh as u32);
    let src = src.get(..w as usize * h as usize * C).ok_or_else(|| too_short(src, w, h))?;
    let n = ow as usize * oh as usize * C;
    dst.resize(n, 0);
    warp_affine(src, w, h, &m, (ow, oh), warp, &mut dst[..n]);
    Ok((ow, oh))
}

/// The `w x h` image of `C` channels at the start of `src`, and `dst` sized to hold one.
fn frames_of<'a, const C: usize>(
    src: &'a [u8],
    dst: &'a mut Vec<u8>,
    w: u32,
    h: u32,
) -> Result<(&'a [u8], &'a mut [u8]), CodecError> {
    let n = (w as usize).checked_mul(h as usize).and_then(|p| p.checked_mul(C));
    let n = n.ok_or_else(|| CodecError::Shape(format!("a {w}x{h} image is too large to hold")))?;
    let src = src.get(..n).ok_or_else(|| too_short(src, w, h))?;
    dst.resize(n, 0);
    Ok((src, &mut dst[..n]))
}

fn too_short(src: &[u8], w: u32, h: u32) -> CodecError {
    CodecError::Shape(format!("a {w}x{h} RGB image needs {} bytes; got {}", w as usize * h as usize * 3, src.len()))
}

/// `torch.rot90(img, k)` (counter-clockwise quarter turns) into `out`; returns its size.
fn rot90<const C: usize>(src: &[u8], w: u32, h: u32, k: u8, out: &mut [u8]) -> (u32, u32) {
    let (wu, hu) = (w as usize, h as usize);
    let px = |x: usize, y: usize| &src[(y * wu + x) * C..(y * wu + x) * C + C];
    match k {
        1 => {
            // out[i][j] = in[j][w-1-i]: h wide, w tall.
            for (i, row) in out.chunks_exact_mut(hu * C).enumerate() {
                for (j, o) in row.chunks_exact_mut(C).enumerate() {
                    o.copy_from_slice(px(wu - 1 - i, j));
                }
            }
            (h, w)
        }
        2 => {
            for (i, row) in out.chunks_exact_mut(wu * C).enumerate() {
                for (j, o) in row.chunks_exact_mut(C).enumerate() {
                    o.copy_from_slice(px(wu - 1 - j, hu - 1 - i));
                }
            }
            (w, h)
        }
        3 => {
            // out[i][j] = in[h-1-j][i].
            for (i, row) in out.chunks_exact_mut(hu * C).enumerate() {
                for (j, o) in row.chunks_exact_mut(C).enumerate() {
                    o.copy_from_slice(px(i, hu - 1 - j));
                }
            }
            (h, w)
        }
        _ => {
            out.copy_from_slice(src);
            (w, h)
        }
    }
}

/// torchvision's `_compute_affine_output_size` (the tensor version, in f32): the canvas
/// that holds the `w x h` image mapped by `m`.
fn affine_output_size(m: &[f64; 6], w: u32, h: u32) -> (u64, u64) {
    let t = m.map(|v| v as f32);
    let (hw, hh) = (0.5 * w as f32, 0.5 * h as f32);
    let (mut min, mut max) = ([f32::INFINITY; 2], [f32::NEG_INFINITY; 2]);
    for (x, y) in [(-hw, -hh), (-hw, hh), (hw, hh), (hw, -hh)] {
        let p = [x * t[0] + y * t[1] + t[2], x * t[3] + y * t[4] + t[5]];
        for k in 0..2 {
            min[k] = min[k].min(p[k]);
            max[k] = max[k].max(p[k]);
        }
    }
    // torchvision: "Truncate precision to 1e-4 to avoid ceil of Xe-15 to 1.0".
    let side = |k: usize, half: f32| {
        let hi = ((max[k] + half) * 10_000.0).trunc() * 1e-4;
        let lo = ((min[k] + half) * 10_000.0).trunc() * 1e-4;
        let s = hi.ceil() - lo.floor();
        if s.is_finite() && s >= 1.0 {
            s as u64
        } else {
            1
        }
    };
    (side(0, hw), side(1, hh))
}

/// Samples `src` (`w x h`) through the inverse affine map `m` (centred coordinates, as
/// `_affine_grid` takes it) into `out` (`ow x oh`).
fn warp_affine<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    m: &[f64; 6],
    (ow, oh): (u32, u32),
    warp: Warp<C>,
    out: &mut [u8],
) {
    // _affine_grid: theta (f32) over half the input size, applied to the output pixel
    // centres relative to the output centre.
    let (sx, sy) = (0.5 * w as f32, 0.5 * h as f32);
    let t =
        [m[0] as f32 / sx, m[1] as f32 / sx, m[2] as f32 / sx, m[3] as f32 / sy, m[4] as f32 / sy, m[5] as f32 / sy];
    let (x0, y0) = ((1.0 - ow as f32) * 0.5, (1.0 - oh as f32) * 0.5);
    let (wf, hf) = (w as f32, h as f32);
    warp_rows(src, w, h, ow, warp, out, |y, row| {
        let by = y0 + y as f32;
        let (rx, ry) = (by * t[1], by * t[4]);
        for (x, c) in row.iter_mut().enumerate() {
            let bx = x0 + x as f32;
            let gx = bx * t[0] + rx + t[2];
            let gy = bx * t[3] + ry + t[5];
            *c = (((gx + 1.0) * wf - 1.0) / 2.0, ((gy + 1.0) * hf - 1.0) / 2.0);
        }
    });
}

/// The warp loop: for each output row, `coords` fills the input coordinates (grid_sample's
/// unnormalized `ix, iy`) of its pixels; each is sampled into `out` (`ow` wide). The one
/// allocation is a row of coordinates.
fn warp_rows<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    ow: u32,
    warp: Warp<C>,
    out: &mut [u8],
    mut coords: impl FnMut(usize, &mut [(f32, f32)]),
) {
    let (wi, hi) = (i64::from(w), i64::from(h));
    let outside = warp.fill.unwrap_or([0; C]);
    let mut buf = vec![(0f32, 0f32); ow as usize];
    let at = |x: i64, y: i64| ((y * wi + x) * C as i64) as usize;
    for (y, row) in out.chunks_exact_mut(ow as usize * C).enumerate() {
        coords(y, &mut buf);
        for (o, &(ix, iy)) in row.chunks_exact_mut(C).zip(&buf) {
            if !(ix.is_finite() && iy.is_finite()) {
                o.copy_from_slice(&outside);
                continue;
            }
            if warp.interpolation == Interpolation::Nearest {
                let (nx, ny) = (ix.round_ties_even() as i64, iy.round_ties_even() as i64);
                if (0..wi).contains(&nx) && (0..hi).contains(&ny) {
                    o.copy_from_slice(&src[at(nx, ny)..at(nx, ny) + C]);
                } else {
                    o.copy_from_slice(&outside);
                }
                continue;
            }
            let (fx, fy) = (ix.floor(), iy.floor());
            let (x0, y0) = (fx as i64, fy as i64);
            // grid_sampler_2d's bilinear weights.
            let (e, we, s, n) = (ix - fx, (fx + 1.0) - ix, iy - fy, (fy + 1.0) - iy);
            let weights = [we * n, e * n, we * s, e * s];
            let corners = [(x0, y0), (x0 + 1, y0), (x0, y0 + 1), (x0 + 1, y0 + 1)];
            let mut acc = [0f32; C];
            let mut mask = 0f32;
            for ((cx, cy), wt) in corners.into_iter().zip(weights) {
                if (0..wi).contains(&cx) && (0..hi).contains(&cy) {
                    let p = &src[at(cx, cy)..at(cx, cy) + C];
                    for c in 0..C {
                        acc[c] += f32::from(p[c]) * wt;
                    }
                    mask += wt;
                }
            }
            for c in 0..C {
                // _apply_grid_transform: (v - fill) * mask + fill, rounded half to even;
                // without a fill, v as grid_sample leaves it.
                let v = match warp.fill {
                    Some(fill) => (acc[c] - f32::from(fill[c])) * mask + f32::from(fill[c]),
                    None => acc[c],
                };
                o[c] = v.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// torchvision RandomPerspective's corners: each moves inwards by up to
/// `distortion_scale` of half the side. Draws, in order: x and y of the top-left,
/// top-right, bottom-right and bottom-left corners.
fn perspective_endpoints(w: u32, h: u32, distortion_scale: f64, rng: &mut SampleRng) -> [[i64; 2]; 4] {
    let (wi, hi) = (i64::from(w), i64::from(h));
    let bw = (distortion_scale * (wi / 2) as f64) as i64 + 1;
    let bh = (distortion_scale * (hi / 2) as f64) as i64 + 1;
    // torch.randint(lo, hi): uniform in [lo, hi).
    let mut randint = |lo: i64, hi: i64| lo + rng.below((hi - lo).max(1) as u64) as i64;
    let tl = [randint(0, bw), randint(0, bh)];
    let tr = [randint(wi - bw, wi), randint(0, bh)];
    let br = [randint(wi - bw, wi), randint(hi - bh, hi)];
    let bl = [randint(0, bw), randint(hi - bh, hi)];
    [tl, tr, br, bl]
}

/// torchvision's `_get_perspective_coeffs`: the 8 coefficients of the map from `ends` to
/// `starts` (solved in f64, kept as f32 as torchvision does). `None` when the corners are
/// degenerate (an image one pixel wide or tall).
fn perspective_coefficients(starts: &[[i64; 2]; 4], ends: &[[i64; 2]; 4]) -> Option<[f32; 8]> {
    let mut a = [[0f64; 9]; 8];
    for (i, (e, s)) in ends.iter().zip(starts).enumerate() {
        let (ex, ey, sx, sy) = (e[0] as f64, e[1] as f64, s[0] as f64, s[1] as f64);
        a[2 * i] = [ex, ey, 1.0, 0.0, 0.0, 0.0, -sx * ex, -sx * ey, sx];
        a[2 * i + 1] = [0.0, 0.0, 0.0, ex, ey, 1.0, -sy * ex, -sy * ey, sy];
    }
    // Gauss-Jordan elimination with partial pivoting on the augmented 8x9 matrix.
    for col in 0..8 {
        let piv = (col..8).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for k in col..9 {
                    row[k] -= f * pivot_row[k];
                }
            }
        }
    }
    let mut c = [0f32; 8];
    for (i, v) in c.iter_mut().enumerate() {
        *v = (a[i][8] / a[i][i]) as f32;
    }
    c.iter().all(|v| v.is_finite()).then_some(c)
}

/// torchvision `perspective` with `coefficients` on a `w x h` image into `out` (the same
/// size); degenerate coefficients (`None`) copy the image.
pub(crate) fn perspective<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    coeffs: Option<[f32; 8]>,
    warp: Warp<C>,
    out: &mut [u8],
) {
    let Some(c) = coeffs else {
        out.copy_from_slice(src);
        return;
    };
    // _perspective_grid: pixel centres (x + 0.5, y + 0.5); the numerator over half the
    // size, divided by the denominator, minus 1.
    let (sx, sy) = (0.5 * w as f32, 0.5 * h as f32);
    let n = [c[0] / sx, c[1] / sx, c[2] / sx, c[3] / sy, c[4] / sy, c[5] / sy];
    let (wf, hf) = (w as f32, h as f32);
    warp_rows(src, w, h, w, warp, out, |y, row| {
        let by = y as f32 + 0.5;
        let (rx, ry, rd) = (by * n[1], by * n[4], by * c[7]);
        for (x, p) in row.iter_mut().enumerate() {
            let bx = x as f32 + 0.5;
            let d = bx * c[6] + rd + 1.0;
            let gx = (bx * n[0] + rx + n[2]) / d - 1.0;
            let gy = (bx * n[3] + ry + n[5]) / d - 1.0;
            *p = (((gx + 1.0) * wf - 1.0) / 2.0, ((gy + 1.0) * hf - 1.0) / 2.0);
        }
    });
}

/// Where padded coordinate `i` (relative to the image's first pixel) reads from on a side
/// of `n` pixels; `None` for the fill colour.
fn pad_index(i: i64, n: i64, mode: PaddingMode) -> Option<usize> {
    let k = match mode {
        PaddingMode::Constant => (0..n).contains(&i).then_some(i)?,
        PaddingMode::Edge => i.clamp(0, n - 1),
        PaddingMode::Reflect if n == 1 => 0,
        PaddingMode::Reflect => {
            let period = 2 * (n - 1);
            let m = i.rem_euclid(period);
            if m >= n {
                period - m
            } else {
                m
            }
        }
        PaddingMode::Symmetric => {
            let m = i.rem_euclid(2 * n);
            if m >= n {
                2 * n - 1 - m
            } else {
                m
            }
        }
    };
    usize::try_from(k).ok()
}

/// The `ow x oh` window of the padded image whose top-left pixel is input pixel
/// `(left, top)` (negative: in the padding), into `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn padded_window<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    (left, top): (i64, i64),
    (ow, oh): (u32, u32),
    fill: [u8; C],
    mode: PaddingMode,
    out: &mut [u8],
) {
    let cols: Vec<Option<usize>> = (0..i64::from(ow)).map(|x| pad_index(left + x, i64::from(w), mode)).collect();
    let row_bytes = w as usize * C;
    for (y, row) in out.chunks_exact_mut(ow as usize * C).enumerate().take(oh as usize) {
        let Some(sy) = pad_index(top + y as i64, i64::from(h), mode) else {
            for o in row.chunks_exact_mut(C) {
                o.copy_from_slice(&fill);
            }
            continue;
        };
        let s = &src[sy * row_bytes..(sy + 1) * row_bytes];
        for (o, c) in row.chunks_exact_mut(C).zip(&cols) {
            match c {
                Some(x) => o.copy_from_slice(&s[x * C..x * C + C]),
                None => o.copy_from_slice(&fill),
            }
        }
    }
}

/// torchvision `pad` (`padding` is `[left, top, right, bottom]`) into `dst`; returns the
/// padded size, refused past `max_pixels`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pad<const C: usize>(
    src: &[u8],
    w: u32,
    h: u32,
    padding: [u32; 4],
    fill: [u8; C],
    mode: PaddingMode,
    max_pixels: u64,
    dst: &mut Vec<u8>,
) -> Result<(u32, u32), CodecError> {
    let [l, t, r, b] = padding.map(u64::from);
    let (ow, oh) = (u64::from(w) + l + r, u64::from(h) + t + b);
    if ow * oh > max_pixels || ow > u64::from(u32::MAX) || oh > u64::from(u32::MAX) {
        return Err(CodecError::OpTooLarge { op: "pad", width: ow, height: oh, limit: max_pixels });
    }
    let src = src.get(..w as usize * h as usize * C).ok_or_else(|| too_short(src, w, h))?;
    let (ow, oh) = (ow as u32, oh as u32);
    let n = ow as usize * oh as usize * C;
    dst.resize(n, 0);
    padded_window(src, w, h, (-(l as i64), -(t as i64)), (ow, oh), fill, mode, &mut dst[..n]);
    Ok((ow, oh))
}

/// An output's size, and the input pixel at its top-left corner (negative: in the padding).
type SizeAndOrigin = ((u32, u32), (i64, i64));

/// torchvision RandomCrop: pad by `padding` (and to `size` when `pad_if_needed`), then a
/// `size` window at a uniform position, read straight from the input (the padded image is
/// never built). Draws the top, then the left, each only when there is a choice.
#[allow(clippy::too_many_arguments)]
fn random_crop(
    src: &[u8],
    w: u32,
    h: u32,
    size: Size,
    padding: Option<[u32; 4]>,
    pad_if_needed: bool,
    fill: [u8; 3],
    mode: PaddingMode,
    rng: &mut SampleRng,
    dst: &mut Vec<u8>,
) -> Result<SizeAndOrigin, CodecError> {
    let src = src.get(..w as usize * h as usize * 3).ok_or_else(|| too_short(src, w, h))?;
    let [mut l, mut t, r, b] = padding.unwrap_or([0; 4]).map(i64::from);
    let (mut pw, mut ph) = (i64::from(w) + l + r, i64::from(h) + t + b);
    let (cw, ch) = (i64::from(size.width), i64::from(size.height));
    if pad_if_needed {
        if ph < ch {
            t += ch - ph;
            ph += 2 * (ch - ph);
        }
        if pw < cw {
            l += cw - pw;
            pw += 2 * (cw - pw);
        }
    }
    if ph < ch || pw < cw {
        return Err(CodecError::Shape(format!(
            "random_crop of {cw}x{ch} is larger than the {}image ({pw}x{ph})",
            if padding.is_some() { "padded " } else { "" }
        )));
    }
    let top = if ph > ch { rng.below((ph - ch + 1) as u64) as i64 } else { 0 };
    let left = if pw > cw { rng.below((pw - cw + 1) as u64) as i64 } else { 0 };
    let n = size.width as usize * size.height as usize * 3;
    dst.resize(n, 0);
    padded_window(src, w, h, (left - l, top - t), (size.width, size.height), fill, mode, &mut dst[..n]);
    Ok(((size.width, size.height), (left - l, top - t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SampleKey;

    /// [`apply_moving`] on `src`, returning only the output size.
    fn run(
        op: &OpSpec,
        src: &[u8],
        (w, h): (u32, u32),
        rng: &mut SampleRng,
        max_pixels: u64,
        dst: &mut Vec<u8>,
    ) -> Result<(u32, u32), CodecError> {
        apply_moving(op, super::super::Frame { src, w, h, rng, max_pixels, dst }).map(|(size, _)| size)
    }

    #[test]
    fn vertical_flip_reverses_rows_when_drawn_and_copies_otherwise() {
        // 2 wide, 3 tall: rows 0, 1, 2.
        let src: Vec<u8> = (0..3).flat_map(|r| [r * 10; 6]).collect();
        let mut dst = Vec::new();
        let mut rng = SampleRng::new(0, 0, SampleKey(0), 0);
        let always = OpSpec::RandomVerticalFlip { p: 1.0 };
        assert_eq!(run(&always, &src, (2, 3), &mut rng, u64::MAX, &mut dst).unwrap(), (2, 3));
        assert_eq!(dst, [[20; 6], [10; 6], [0; 6]].concat());
        let never = OpSpec::RandomVerticalFlip { p: 0.0 };
        run(&never, &src, (2, 3), &mut rng, u64::MAX, &mut dst).unwrap();
        assert_eq!(dst, src);
    }

    fn rng0() -> SampleRng {
        SampleRng::new(0, 0, SampleKey(0), 0)
    }

    /// A `w x h` image whose pixel (x, y) is `[x, y, x + 10 * y]`.
    fn coords(w: u32, h: u32) -> Vec<u8> {
        (0..h).flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, (x + 10 * y) as u8])).collect()
    }

    fn px(img: &[u8], w: u32, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * w + x) * 3) as usize;
        [img[i], img[i + 1], img[i + 2]]
    }

    const NEAREST: Warp = Warp { interpolation: Interpolation::Nearest, fill: Some([7, 8, 9]) };

    #[test]
    fn affine_translation_moves_pixels_and_fills_what_comes_in() {
        let (w, h) = (5, 4);
        let src = coords(w, h);
        let mut out = vec![0; src.len()];
        let p = AffineParams { angle: 0.0, translate: [2.0, -1.0], scale: 1.0, shear: [0.0, 0.0], center: None };
        for interpolation in [Interpolation::Nearest, Interpolation::Bilinear] {
            affine(&src, w, h, &p, Warp { interpolation, ..NEAREST }, &mut out);
            // Output (x, y) reads input (x - 2, y + 1).
            assert_eq!(px(&out, w, 2, 0), px(&src, w, 0, 1), "{interpolation:?}");
            assert_eq!(px(&out, w, 4, 2), px(&src, w, 2, 3), "{interpolation:?}");
            assert_eq!(px(&out, w, 1, 0), [7, 8, 9], "{interpolation:?}");
            assert_eq!(px(&out, w, 3, 3), [7, 8, 9], "{interpolation:?}");
        }
    }

    #[test]
    fn rotation_quarter_turns_are_exact_and_other_angles_keep_the_centre() {
        // 3 wide, 2 tall, counter-clockwise by 90 with expand: 2 wide, 3 tall.
        let src = coords(3, 2);
        let mut dst = Vec::new();
        assert_eq!(rotate(&src, 3, 2, 90.0, true, None, NEAREST, u64::MAX, &mut dst).unwrap(), (2, 3));
        // The top-right input pixel is the top-left output pixel.
        assert_eq!(px(&dst, 2, 0, 0), px(&src, 3, 2, 0));
        assert_eq!(px(&dst, 2, 1, 2), px(&src, 3, 0, 1));
        assert_eq!(rotate(&src, 3, 2, -360.0, false, None, NEAREST, u64::MAX, &mut dst).unwrap(), (3, 2));
        assert_eq!(dst, src);
        // 30 degrees on a 7x7 image: the centre stays, the corners are filled.
        let src = coords(7, 7);
        rotate(&src, 7, 7, 30.0, false, None, NEAREST, u64::MAX, &mut dst).unwrap();
        assert_eq!(px(&dst, 7, 3, 3), px(&src, 7, 3, 3));
        assert_eq!(px(&dst, 7, 0, 0), [7, 8, 9]);
        // The same turn through `affine` (which turns the other way) with angle -30.
        let p = AffineParams { angle: -30.0, translate: [0.0; 2], scale: 1.0, shear: [0.0; 2], center: None };
        let mut out = vec![0; src.len()];
        affine(&src, 7, 7, &p, NEAREST, &mut out);
        assert_eq!(out, dst);
        // expand grows the canvas: 45 degrees of a 10x10 image needs 16x16 (torchvision's size).
        let src = coords(10, 10);
        assert_eq!(rotate(&src, 10, 10, 45.0, true, None, NEAREST, u64::MAX, &mut dst).unwrap(), (16, 16));
    }

    #[test]
    fn an_expanded_rotation_past_max_pixels_is_refused_before_it_allocates() {
        // 2000x1 turned 45 degrees needs a 1416x1416 canvas: 2 M pixels for 2000.
        let src = vec![1u8; 2000 * 3];
        let mut dst = Vec::new();
        let err = rotate(&src, 2000, 1, 45.0, true, None, NEAREST, 1 << 20, &mut dst).unwrap_err();
        assert!(matches!(err, CodecError::OpTooLarge { op: "random_rotation", limit: 1048576, .. }), "{err:?}");
        assert!(dst.capacity() == 0);
        let op = OpSpec::Pad { padding: [600, 0, 600, 0], fill: [0; 3], padding_mode: PaddingMode::Constant };
        let err = run(&op, &src, (2000, 1), &mut rng0(), 3000, &mut dst).unwrap_err();
        assert_eq!(err, CodecError::OpTooLarge { op: "pad", width: 3200, height: 1, limit: 3000 });
    }

    #[test]
    fn random_rotation_and_affine_draw_their_parameters_from_the_range() {
        let src = coords(9, 7);
        let mut a = Vec::new();
        let mut b = Vec::new();
        let interpolation = Interpolation::Bilinear;
        let op = |d: f64| OpSpec::RandomRotation {
            degrees: [d, d],
            interpolation,
            expand: false,
            center: None,
            fill: [0; 3],
        };
        run(&op(20.0), &src, (9, 7), &mut rng0(), u64::MAX, &mut a).unwrap();
        rotate(&src, 9, 7, 20.0, false, None, Warp { interpolation, fill: Some([0; 3]) }, u64::MAX, &mut b).unwrap();
        assert_eq!(a, b);
        let spread = OpSpec::RandomAffine {
            degrees: [-30.0, 30.0],
            translate: Some([0.2, 0.2]),
            scale: Some([0.8, 1.2]),
            shear: Some([-10.0, 10.0, 0.0, 0.0]),
            interpolation,
            fill: [0; 3],
        };
        let outs: Vec<Vec<u8>> = (0..4)
            .map(|k| {
                let mut o = Vec::new();
                run(&spread, &src, (9, 7), &mut SampleRng::new(0, 0, SampleKey(k), 0), u64::MAX, &mut o).unwrap();
                o
            })
            .collect();
        assert!(outs.windows(2).all(|p| p[0] != p[1]), "different samples draw different parameters");
        let again = {
            let mut o = Vec::new();
            run(&spread, &src, (9, 7), &mut SampleRng::new(0, 0, SampleKey(2), 0), u64::MAX, &mut o).unwrap();
            o
        };
        assert_eq!(again, outs[2]);
    }

    #[test]
    fn perspective_coefficients_solve_the_corner_map() {
        let starts = [[0, 0], [9, 0], [9, 9], [0, 9]];
        let c = perspective_coefficients(&starts, &starts).unwrap();
        for (got, want) in c.iter().zip([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{c:?}");
        }
        // Ends shifted right by 2: the map back subtracts 2.
        let ends = starts.map(|[x, y]| [x + 2, y]);
        let c = perspective_coefficients(&starts, &ends).unwrap();
        assert!((c[2] + 2.0).abs() < 1e-5 && (c[0] - 1.0).abs() < 1e-6, "{c:?}");
        assert_eq!(perspective_coefficients(&[[0, 0]; 4], &[[0, 0]; 4]), None);
        // torchvision's _get_perspective_coeffs on the same corners.
        let c = perspective_coefficients(&[[0, 0], [7, 0], [7, 5], [0, 5]], &[[1, 2], [5, 1], [6, 3], [0, 4]]).unwrap();
        let want = [7.28, 3.64, -14.56, 3.1777778, 12.711111, -28.6, 0.35555556, 0.8622222];
        for (got, want) in c.iter().zip(want) {
            assert!((got - want).abs() < 1e-4 * want.abs().max(1.0), "{c:?}");
        }
        // p = 0 copies; distortion 0 keeps the corners, so the image is unchanged.
        let src = coords(8, 6);
        let mut dst = Vec::new();
        for (d, p) in [(0.9, 0.0), (0.0, 1.0)] {
            let op = OpSpec::RandomPerspective {
                distortion_scale: d,
                p,
                interpolation: Interpolation::Bilinear,
                fill: [0; 3],
            };
            run(&op, &src, (8, 6), &mut rng0(), u64::MAX, &mut dst).unwrap();
            assert_eq!(dst, src, "distortion {d}, p {p}");
        }
        let op = OpSpec::RandomPerspective {
            distortion_scale: 0.9,
            p: 1.0,
            interpolation: Interpolation::Nearest,
            fill: [0; 3],
        };
        // (Three collinear corners make no perspective map; that sample is left as it is.)
        let src = coords(16, 12);
        run(&op, &src, (16, 12), &mut rng0(), u64::MAX, &mut dst).unwrap();
        assert_ne!(dst, src);
    }

    #[test]
    fn pad_modes_follow_torchvision() {
        // One row: a b c (values 0, 1, 2 in the first channel), padded by 2 each side.
        let src = coords(3, 1);
        let mut dst = Vec::new();
        let row = |mode| {
            let mut d = Vec::new();
            pad(&src, 3, 1, [2, 0, 2, 0], [9, 9, 9], mode, u64::MAX, &mut d).unwrap();
            d.chunks_exact(3).map(|p| p[0]).collect::<Vec<u8>>()
        };
        assert_eq!(row(PaddingMode::Constant), [9, 9, 0, 1, 2, 9, 9]);
        assert_eq!(row(PaddingMode::Edge), [0, 0, 0, 1, 2, 2, 2]);
        assert_eq!(row(PaddingMode::Reflect), [2, 1, 0, 1, 2, 1, 0]);
        assert_eq!(row(PaddingMode::Symmetric), [1, 0, 0, 1, 2, 2, 1]);
        // Top and bottom rows of fill; the size grows by the padding.
        assert_eq!(pad(&src, 3, 1, [0, 1, 0, 2], [9; 3], PaddingMode::Constant, u64::MAX, &mut dst).unwrap(), (3, 4));
        assert_eq!(dst[..9], [9; 9]);
        assert_eq!(dst[9..18], src[..]);
    }

    #[test]
    fn random_crop_pads_then_crops_at_a_drawn_position() {
        // The CIFAR recipe: 32 with padding 4.
        let src = coords(32, 32);
        let mut dst = Vec::new();
        let op = OpSpec::RandomCrop {
            size: Size::square(32),
            padding: Some([4; 4]),
            pad_if_needed: false,
            fill: [0; 3],
            padding_mode: PaddingMode::Reflect,
        };
        let mut seen = std::collections::HashSet::new();
        for k in 0..40 {
            let mut rng = SampleRng::new(0, 0, SampleKey(k), 0);
            assert_eq!(run(&op, &src, (32, 32), &mut rng, u64::MAX, &mut dst).unwrap(), (32, 32));
            // Reading back the drawn offsets: the window is the padded image at (left, top).
            let mut rng = SampleRng::new(0, 0, SampleKey(k), 0);
            let (top, left) = (rng.below(9) as i64 - 4, rng.below(9) as i64 - 4);
            for (x, y) in [(0, 0), (31, 31), (5, 20)] {
                let sx = pad_index(left + x, 32, PaddingMode::Reflect).unwrap() as u32;
                let sy = pad_index(top + y, 32, PaddingMode::Reflect).unwrap() as u32;
                assert_eq!(px(&dst, 32, x as u32, y as u32), px(&src, 32, sx, sy));
            }
            seen.insert((top, left));
        }
        assert!(seen.len() > 10, "{seen:?}");
        // pad_if_needed grows a small image on both sides; without it the crop is an error.
        let small = coords(4, 3);
        let need = |pad_if_needed| OpSpec::RandomCrop {
            size: Size { height: 5, width: 4 },
            padding: None,
            pad_if_needed,
            fill: [1; 3],
            padding_mode: PaddingMode::Constant,
        };
        assert_eq!(run(&need(true), &small, (4, 3), &mut rng0(), u64::MAX, &mut dst).unwrap(), (4, 5));
        assert!(matches!(
            run(&need(false), &small, (4, 3), &mut rng0(), u64::MAX, &mut dst),
            Err(CodecError::Shape(_))
        ));
    }
}
