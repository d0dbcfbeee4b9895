//! Colour ops: each output pixel from the input's pixels, the size unchanged
//! (torchvision's `adjust_*`, `invert`, ... in `transforms.v2.functional`).
//!
//! Each kernel reproduces torchvision's u8 arithmetic: float32 maths, then a cast that
//! truncates (`.to(uint8)`) or a `round_()` where torchvision rounds. Ops that map a value
//! to a value (brightness, contrast, solarize, posterize, equalize, autocontrast) build a
//! 256-entry table once per image and run one lookup per byte.

use std::cell::RefCell;

use sluice_core::spec::{ErasingValue, Range};
use sluice_core::{DType, Layout, OpSpec, SampleRng};

use super::{frames, not_mine, Frame};
use crate::CodecError;

pub(super) fn runs(op: &OpSpec) -> bool {
    matches!(
        op,
        OpSpec::Invert
            | OpSpec::ColorJitter { .. }
            | OpSpec::RandomGrayscale { .. }
            | OpSpec::Grayscale
            | OpSpec::Solarize { .. }
            | OpSpec::Posterize { .. }
            | OpSpec::Equalize { .. }
            | OpSpec::Autocontrast { .. }
            | OpSpec::AdjustSharpness { .. }
            | OpSpec::GaussianBlur { .. }
    )
}

/// Ops whose output pixel depends only on the same input pixel (see
/// [`super::commutes_with_flip`]). Contrast, equalize and autocontrast read whole-image
/// statistics and sharpness and blur read neighbours, so they are not.
pub(super) fn is_pointwise(op: &OpSpec) -> bool {
    match op {
        OpSpec::ColorJitter { contrast, .. } => contrast.is_none(),
        _ => matches!(
            op,
            OpSpec::Invert
                | OpSpec::RandomGrayscale { .. }
                | OpSpec::Grayscale
                | OpSpec::Solarize { .. }
                | OpSpec::Posterize { .. }
        ),
    }
}

pub(super) fn apply(op: &OpSpec, f: Frame<'_>) -> Result<(u32, u32), CodecError> {
    let Frame { src, w, h, rng, dst, .. } = f;
    let (src, out) = frames(src, dst, w, h)?;
    // torchvision's Random*(p): apply if torch.rand(1) < p. p = 1 draws nothing.
    let mut drawn = |p: f64| p >= 1.0 || rng.next_f64() < p;
    match *op {
        OpSpec::Invert => invert(src, out),
        OpSpec::ColorJitter { brightness, contrast, saturation, hue } => {
            let jitter = Jitter::draw(brightness, contrast, saturation, hue, rng);
            jitter.apply(src, out);
        }
        OpSpec::RandomGrayscale { p } => {
            if drawn(p) {
                grayscale(src, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::Grayscale => grayscale(src, out),
        OpSpec::Solarize { threshold, p } => {
            if drawn(p) {
                let lut = std::array::from_fn(|v| if v as f64 >= threshold { 255 - v as u8 } else { v as u8 });
                map(&lut, src, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::Posterize { bits, p } => {
            if drawn(p) && bits < 8 {
                let mask = !(0xffu8.checked_shr(u32::from(bits)).unwrap_or(0));
                for (o, s) in out.iter_mut().zip(src) {
                    *o = s & mask;
                }
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::Equalize { p } => {
            if drawn(p) {
                equalize(src, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::Autocontrast { p } => {
            if drawn(p) {
                autocontrast(src, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::AdjustSharpness { sharpness_factor, p } => {
            if drawn(p) {
                adjust_sharpness(src, w as usize, h as usize, sharpness_factor, out);
            } else {
                out.copy_from_slice(src);
            }
        }
        OpSpec::GaussianBlur { kernel_size, sigma } => {
            let [lo, hi] = sigma.fixed_or_range();
            // torchvision: sigma = uniform(lo, hi), the same for x and y.
            let s = if lo < hi { rng.uniform(lo, hi) } else { lo };
            let [kx, ky] = kernel_size.xy();
            gaussian_blur(src, w as usize, h as usize, [kx as usize, ky as usize], s, out);
        }
        _ => return Err(not_mine(op, "colour")),
    }
    Ok((w, h))
}

/// torchvision `invert` on u8: `255 - x`.
pub(super) fn invert(src: &[u8], out: &mut [u8]) {
    for (o, s) in out.iter_mut().zip(src) {
        *o = 255 - s;
    }
}

pub(super) fn map(lut: &[u8; 256], src: &[u8], out: &mut [u8]) {
    for (o, s) in out.iter_mut().zip(src) {
        *o = lut[usize::from(*s)];
    }
}

/// torchvision's `_rgb_to_grayscale_image` in float32, before any cast.
#[inline]
fn gray_f32(r: u8, g: u8, b: u8) -> f32 {
    f32::from(r) * 0.2989 + f32::from(g) * 0.587 + f32::from(b) * 0.114
}

/// `x.clamp(0, 255).to(uint8)`: clamp, then truncate.
#[inline]
fn to_u8(x: f32) -> u8 {
    x.clamp(0.0, 255.0) as u8
}

/// `rgb_to_grayscale(num_output_channels=3)`: the weighted sum truncated to u8.
fn grayscale(src: &[u8], out: &mut [u8]) {
    for (o, s) in out.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
        let g = gray_f32(s[0], s[1], s[2]) as u8;
        o.copy_from_slice(&[g, g, g]);
    }
}

/// ColorJitter's parameters for one sample: the order and the factors drawn.
struct Jitter {
    order: [u8; 4],
    factors: [Option<f64>; 4],
}

impl Jitter {
    /// torchvision's `ColorJitter.make_params`: `randperm(4)`, then brightness, contrast,
    /// saturation and hue factors in that order, each uniform in its range. A range that is
    /// exactly the identity (`[1, 1]`, hue `[0, 0]`) is dropped and draws nothing, as there.
    fn draw(b: Option<Range>, c: Option<Range>, s: Option<Range>, h: Option<Range>, rng: &mut SampleRng) -> Jitter {
        let mut order = [0u8, 1, 2, 3];
        for i in (1..4).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let mut factors = [None; 4];
        let ranges = [(b, 1.0, true), (c, 1.0, true), (s, 1.0, true), (h, 0.0, false)];
        for (f, (r, center, clip)) in factors.iter_mut().zip(ranges) {
            if let Some(r) = r {
                let [lo, hi] = r.jitter(center, clip);
                if !(lo == center && hi == center) {
                    *f = Some(if lo < hi { rng.uniform(lo, hi) } else { lo });
                }
            }
        }
        Jitter { order, factors }
    }

    fn apply(&self, src: &[u8], out: &mut [u8]) {
        out.copy_from_slice(src);
        for &fn_id in &self.order {
            let Some(f) = self.factors[usize::from(fn_id)] else { continue };
            match fn_id {
                0 => adjust_brightness(out, f),
                1 => adjust_contrast(out, f),
                2 => adjust_saturation(out, f),
                _ => adjust_hue(out, f),
            }
        }
    }
}

/// `x * f`, clamped and truncated: a table.
pub(super) fn adjust_brightness(img: &mut [u8], f: f64) {
    let f = f as f32;
    let lut: [u8; 256] = std::array::from_fn(|v| to_u8(v as f32 * f));
    for x in img.iter_mut() {
        *x = lut[usize::from(*x)];
    }
}

/// `_blend(x, mean(floor(gray)), f)`: a table once the mean is known.
pub(super) fn adjust_contrast(img: &mut [u8], f: f64) {
    let n = img.len() / 3;
    if n == 0 {
        return;
    }
    let sum: u64 = img.chunks_exact(3).map(|p| gray_f32(p[0], p[1], p[2]) as u64).sum();
    let mean = (sum as f64 / n as f64) as f32;
    let (f, rest) = (f as f32, (1.0 - f) as f32);
    let lut: [u8; 256] = std::array::from_fn(|v| to_u8(v as f32 * f + mean * rest));
    for x in img.iter_mut() {
        *x = lut[usize::from(*x)];
    }
}

/// `_blend(x, floor(gray(x)), f)` per pixel.
pub(super) fn adjust_saturation(img: &mut [u8], f: f64) {
    let (f, rest) = (f as f32, (1.0 - f) as f32);
    // x * f for every value, and floor(gray) * (1 - f) for every gray level.
    let scaled: [f32; 256] = std::array::from_fn(|v| v as f32 * f);
    let gray: [f32; 256] = std::array::from_fn(|g| g as f32 * rest);
    for p in img.chunks_exact_mut(3) {
        let g = gray[gray_f32(p[0], p[1], p[2]) as usize];
        for x in p.iter_mut() {
            *x = to_u8(scaled[usize::from(*x)] + g);
        }
    }
}

/// torchvision's `adjust_hue`: to [0, 1] floats, `_rgb_to_hsv`, shift, `_hsv_to_rgb`, and
/// back with `x * (255 + 1 - 1e-3)` truncated, all in float32 as there.
fn adjust_hue(img: &mut [u8], hue: f64) {
    let hue = hue as f32;
    let unit: [f32; 256] = std::array::from_fn(|v| v as f32 * (1.0f32 / 255.0));
    for p in img.chunks_exact_mut(3) {
        let (r, g, b) = (unit[usize::from(p[0])], unit[usize::from(p[1])], unit[usize::from(p[2])]);
        let maxc = r.max(g).max(b);
        let minc = r.min(g).min(b);
        let eqc = maxc == minc;
        let range = maxc - minc;
        let s = range / if eqc { 1.0 } else { maxc };
        let div = if eqc { 1.0 } else { range };
        let (rc, gc, bc) = ((maxc - r) / div, (maxc - g) / div, (maxc - b) / div);
        let h = if maxc == r {
            bc - gc
        } else if maxc == g {
            (rc + 2.0) - bc
        } else {
            (gc + 4.0) - rc
        };
        // `fmod(h / 6 + 1, 1)` and `remainder(h + hue, 1)` on values within one period of
        // [0, 1): the same as adding or subtracting 1, which is exact there (and avoids
        // libm calls per pixel).
        let h = wrap_unit(wrap_unit(h * (1.0 / 6.0) + 1.0));
        let h = wrap_unit(h + hue);
        // _hsv_to_rgb; h6 >= 0, so truncation is floor.
        let h6 = h * 6.0;
        let i = (h6 as i32) as f32;
        let f = h6 - i;
        let sxf = s * f;
        let one_minus_s = 1.0 - s;
        let v = maxc;
        let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
        let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
        let pp = (one_minus_s * v).clamp(0.0, 1.0);
        let (r, g, b) = match (i as i32).rem_euclid(6) {
            0 => (v, t, pp),
            1 => (q, v, pp),
            2 => (pp, v, t),
            3 => (pp, q, v),
            4 => (t, pp, v),
            _ => (v, pp, q),
        };
        const SCALE: f32 = 255.0 + 1.0 - 1e-3;
        p.copy_from_slice(&[(r * SCALE) as u8, (g * SCALE) as u8, (b * SCALE) as u8]);
    }
}

/// `x` moved into [0, 1) by one period, for `x` in [-1, 2).
#[inline]
fn wrap_unit(x: f32) -> f32 {
    if x >= 1.0 {
        x - 1.0
    } else if x < 0.0 {
        x + 1.0
    } else {
        x
    }
}

/// torchvision's `equalize` per channel: `lut[k] = (cum[k-1] + step / 2) / step` with
/// `step = (pixels - count of the largest value) / 255`; a channel with `step == 0` stays.
pub(super) fn equalize(src: &[u8], out: &mut [u8]) {
    let mut hist = [[0u32; 256]; 3];
    for p in src.chunks_exact(3) {
        for c in 0..3 {
            hist[c][usize::from(p[c])] += 1;
        }
    }
    let n = (src.len() / 3) as u64;
    let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
        let hist = &hist[c];
        let last = hist.iter().rposition(|&k| k > 0).unwrap_or(0);
        let step = (n - u64::from(hist[last])) / 255;
        if step == 0 {
            return std::array::from_fn(|v| v as u8);
        }
        let mut lut = [0u8; 256];
        let mut cum = 0u64;
        for k in 1..256 {
            cum += u64::from(hist[k - 1]);
            lut[k] = ((cum + step / 2) / step).min(255) as u8;
        }
        lut
    });
    for (o, s) in out.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
        for c in 0..3 {
            o[c] = luts[c][usize::from(s[c])];
        }
    }
}

/// torchvision's `autocontrast` per channel: `(x - min) / ((max - min) / 255)`, clamped and
/// truncated; a flat channel stays.
pub(super) fn autocontrast(src: &[u8], out: &mut [u8]) {
    let (mut lo, mut hi) = ([255u8; 3], [0u8; 3]);
    for p in src.chunks_exact(3) {
        for c in 0..3 {
            lo[c] = lo[c].min(p[c]);
            hi[c] = hi[c].max(p[c]);
        }
    }
    let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
        if lo[c] == hi[c] {
            return std::array::from_fn(|v| v as u8);
        }
        let min = f32::from(lo[c]);
        let inv_scale = (f32::from(hi[c]) - min) * (1.0 / 255.0);
        std::array::from_fn(|v| to_u8((v as f32 - min) / inv_scale))
    });
    for (o, s) in out.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
        for c in 0..3 {
            o[c] = luts[c][usize::from(s[c])];
        }
    }
}

/// torchvision's `adjust_sharpness`: the 3x3 kernel `[1 1 1; 1 5 1; 1 1 1] / 13`, rounded,
/// blended as `x + (1 - f) * (blur - x)` in the interior; the one-pixel border is kept.
/// The blur is exact in integers: `sum / 13` is never a tie, so rounding is `(2 sum + 13) / 26`.
pub(super) fn adjust_sharpness(src: &[u8], w: usize, h: usize, f: f64, out: &mut [u8]) {
    out.copy_from_slice(src);
    if w <= 2 || h <= 2 {
        return;
    }
    let alpha = (1.0 - f) as f32;
    let row = w * 3;
    for y in 1..h - 1 {
        let (up, mid, down) =
            (&src[(y - 1) * row..y * row], &src[y * row..(y + 1) * row], &src[(y + 1) * row..(y + 2) * row]);
        let o = &mut out[y * row..(y + 1) * row];
        for i in 3..row - 3 {
            let around = u32::from(up[i - 3])
                + u32::from(up[i])
                + u32::from(up[i + 3])
                + u32::from(mid[i - 3])
                + u32::from(mid[i + 3])
                + u32::from(down[i - 3])
                + u32::from(down[i])
                + u32::from(down[i + 3]);
            let sum = around + 5 * u32::from(mid[i]);
            let blur = (2 * sum + 13) / 26;
            let x = f32::from(mid[i]);
            o[i] = to_u8(x + alpha * (blur as f32 - x));
        }
    }
}

/// torchvision's 1-D Gaussian: `softmax(-(x / sigma)^2)` over `k` points evenly spaced in
/// `[-lim, lim]`, `lim = (k - 1) / (2 sqrt 2)`.
fn gaussian_kernel(k: usize, sigma: f64, out: &mut Vec<f32>) {
    out.clear();
    let lim = (k as f64 - 1.0) / (2.0 * std::f64::consts::SQRT_2);
    let half = (k as f64 - 1.0) / 2.0;
    out.extend((0..k).map(|i| {
        // Symmetric and exactly 0 in the middle, so the sum is never 0 (however small sigma).
        let x = if k > 1 { lim * (i as f64 - half) / half } else { 0.0 };
        (-(x / sigma).powi(2)).exp() as f32
    }));
    let sum: f32 = out.iter().sum();
    for v in out.iter_mut() {
        *v /= sum;
    }
}

/// Index `i` (which may lie outside `0..n`) reflected into it, as torch's "reflect"
/// padding (the edge not repeated); repeats for a kernel wider than the image.
#[inline]
fn reflect(mut i: isize, n: usize) -> usize {
    let n = n as isize;
    if n == 1 {
        return 0;
    }
    loop {
        if i < 0 {
            i = -i;
        } else if i >= n {
            i = 2 * (n - 1) - i;
        } else {
            return i as usize;
        }
    }
}

/// Per-thread scratch of the blur: the horizontal pass (f32 HWC), one row of the vertical
/// pass, and the two kernels.
#[derive(Default)]
struct BlurScratch {
    tmp: Vec<f32>,
    acc: Vec<f32>,
    kern_x: Vec<f32>,
    kern_y: Vec<f32>,
}

thread_local! {
    static BLUR: RefCell<BlurScratch> = RefCell::new(BlurScratch::default());
}

/// torchvision's `gaussian_blur` on u8: float32 convolution with reflect padding, then
/// `round` (ties to even). Done as two 1-D passes (the 2-D kernel is their outer product).
fn gaussian_blur(src: &[u8], w: usize, h: usize, [kx, ky]: [usize; 2], sigma: f64, out: &mut [u8]) {
    BLUR.with(|cell| {
        let mut guard = cell.borrow_mut();
        let BlurScratch { tmp, acc, kern_x, kern_y } = &mut *guard;
        gaussian_kernel(kx, sigma, kern_x);
        gaussian_kernel(ky, sigma, kern_y);
        let row = w * 3;
        tmp.clear();
        tmp.resize(row * h, 0.0);
        let (hx, hy) = ((kx / 2) as isize, (ky / 2) as isize);
        for (s, t) in src.chunks_exact(row).zip(tmp.chunks_exact_mut(row)) {
            for (x, t) in t.chunks_exact_mut(3).enumerate() {
                let mut sum = [0f32; 3];
                for (k, wt) in kern_x.iter().enumerate() {
                    let sx = reflect(x as isize + k as isize - hx, w) * 3;
                    for c in 0..3 {
                        sum[c] += wt * f32::from(s[sx + c]);
                    }
                }
                t.copy_from_slice(&sum);
            }
        }
        for (y, o) in out.chunks_exact_mut(row).enumerate() {
            acc.clear();
            acc.resize(row, 0.0);
            for (k, wt) in kern_y.iter().enumerate() {
                let sy = reflect(y as isize + k as isize - hy, h);
                for (a, t) in acc.iter_mut().zip(&tmp[sy * row..(sy + 1) * row]) {
                    *a += wt * t;
                }
            }
            for (o, a) in o.iter_mut().zip(acc.iter()) {
                *o = to_u8(a.round_ties_even());
            }
        }
    });
}

/// torchvision's RandomErasing on the output slot as written (`dtype`, `layout` as the
/// plan writes them): with probability `p`, a rectangle of area fraction in `scale` and
/// aspect ratio (log-uniform) in `ratio`, 10 tries, else nothing. Draws, in order: the
/// `p` test, then per try the area and the log-ratio, then the top and left corners, then
/// (for `"random"`) the noise in CHW order.
#[allow(clippy::too_many_arguments)]
pub(super) fn random_erasing(
    p: f64,
    scale: [f64; 2],
    ratio: [f64; 2],
    value: ErasingValue,
    out: &mut [u8],
    w: u32,
    h: u32,
    dtype: DType,
    layout: Layout,
    rng: &mut SampleRng,
) {
    if rng.next_f64() >= p {
        return;
    }
    let (img_w, img_h) = (w as usize, h as usize);
    let area = (img_w * img_h) as f64;
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    let mut rect = None;
    for _ in 0..10 {
        let erase_area = area * rng.uniform(scale[0], scale[1]);
        let aspect = rng.uniform(lr0, lr1).exp();
        let eh = (erase_area * aspect).sqrt().round_ties_even() as usize;
        let ew = (erase_area / aspect).sqrt().round_ties_even() as usize;
        if !(eh < img_h && ew < img_w) {
            continue;
        }
        let top = rng.below((img_h - eh + 1) as u64) as usize;
        let left = rng.below((img_w - ew + 1) as u64) as usize;
        rect = Some((top, left, eh, ew));
        break;
    }
    let Some((top, left, eh, ew)) = rect else { return };
    for c in 0..3 {
        for y in top..top + eh {
            for x in left..left + ew {
                let v = match value {
                    ErasingValue::One(v) => v,
                    ErasingValue::PerChannel(v) => v[c],
                    ErasingValue::Random(_) => standard_normal(rng),
                };
                let i = match layout {
                    Layout::Hwc => (y * img_w + x) * 3 + c,
                    Layout::Chw => (c * img_h + y) * img_w + x,
                };
                match dtype {
                    DType::U8 => {
                        // torch casts a float assigned into a uint8 tensor by truncation.
                        out[i] = v.clamp(0.0, 255.0) as u8;
                    }
                    DType::F32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_ne_bytes()),
                }
            }
        }
    }
}

/// A standard normal draw (Box-Muller; one of the pair is used).
pub(super) fn standard_normal(rng: &mut SampleRng) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::spec::{KernelSize, RandomTag};
    use sluice_core::SampleKey;

    fn rng() -> SampleRng {
        SampleRng::new(0, 0, SampleKey(0), 0)
    }

    /// Runs `op` on a `w x h` image; returns the output.
    fn run(op: &OpSpec, src: &[u8], w: u32, h: u32) -> Vec<u8> {
        let mut dst = Vec::new();
        let f = Frame { src, w, h, rng: &mut rng(), max_pixels: u64::MAX, dst: &mut dst };
        assert_eq!(apply(op, f).unwrap(), (w, h));
        dst
    }

    #[test]
    fn invert_maps_each_value_to_its_complement() {
        let src: Vec<u8> = (0..=255).chain(0..=1).collect();
        let dst = run(&OpSpec::Invert, &src, 1, 86);
        assert!(dst.iter().zip(&src).all(|(d, s)| u16::from(*d) + u16::from(*s) == 255));
    }

    #[test]
    fn grayscale_truncates_the_weighted_sum_into_three_equal_channels() {
        let src = [255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30];
        // 76.2195, 149.685, 29.07, 2.989 + 11.74 + 3.42 = 18.149
        assert_eq!(run(&OpSpec::Grayscale, &src, 4, 1), [76, 76, 76, 149, 149, 149, 29, 29, 29, 18, 18, 18]);
        assert_eq!(run(&(OpSpec::RandomGrayscale { p: 0.0 }), &src, 4, 1), src);
        assert_eq!(run(&(OpSpec::RandomGrayscale { p: 1.0 }), &src, 4, 1), run(&OpSpec::Grayscale, &src, 4, 1));
    }

    #[test]
    fn solarize_inverts_from_the_threshold_up_and_posterize_masks_low_bits() {
        let src = [0, 127, 128, 200, 254, 255];
        assert_eq!(run(&(OpSpec::Solarize { threshold: 128.0, p: 1.0 }), &src, 2, 1), [0, 127, 127, 55, 1, 0]);
        assert_eq!(run(&(OpSpec::Solarize { threshold: 128.0, p: 0.0 }), &src, 2, 1), src);
        assert_eq!(run(&(OpSpec::Posterize { bits: 3, p: 1.0 }), &src, 2, 1), [0, 96, 128, 192, 224, 224]);
        assert_eq!(run(&(OpSpec::Posterize { bits: 8, p: 1.0 }), &src, 2, 1), src);
        assert_eq!(run(&(OpSpec::Posterize { bits: 0, p: 1.0 }), &src, 2, 1), [0; 6]);
    }

    #[test]
    fn equalize_spreads_each_channels_histogram() {
        // 600 pixels, each channel 0, 100, 200 (200 each): step = (600 - 200) / 255 = 1,
        // so 0 -> 0, 100 -> cum(0..100) = 200, 200 -> 400 clamped to 255.
        let src: Vec<u8> = (0..600).flat_map(|i| [(i % 3 * 100) as u8; 3]).collect();
        let dst = run(&(OpSpec::Equalize { p: 1.0 }), &src, 600, 1);
        for (d, s) in dst.iter().zip(&src) {
            assert_eq!(*d, [0, 200, 255][usize::from(*s / 100)]);
        }
        // Too few pixels below the maximum (step 0): unchanged, as torchvision.
        let small = [1, 2, 3, 4, 5, 6];
        assert_eq!(run(&(OpSpec::Equalize { p: 1.0 }), &small, 2, 1), small);
    }

    #[test]
    fn autocontrast_stretches_each_channel_and_keeps_a_flat_one() {
        let src = [50, 9, 0, 100, 9, 255, 150, 9, 128];
        let dst = run(&(OpSpec::Autocontrast { p: 1.0 }), &src, 3, 1);
        // 150 -> 254, not 255: float32 100 / (100 / 255) is just below 255, as in torchvision.
        assert_eq!(dst, [0, 9, 0, 127, 9, 255, 254, 9, 128]);
    }

    #[test]
    fn adjust_sharpness_blends_with_the_smoothed_interior_and_keeps_the_border() {
        // A 3x3 image, 13 in the centre: the smoothed centre is round(65 / 13) = 5.
        let mut src = vec![0u8; 27];
        src[12..15].copy_from_slice(&[13, 13, 13]);
        let blurred = run(&(OpSpec::AdjustSharpness { sharpness_factor: 0.0, p: 1.0 }), &src, 3, 3);
        let mut want = vec![0u8; 27];
        want[12..15].copy_from_slice(&[5, 5, 5]);
        assert_eq!(blurred, want);
        // Factor 2: 13 + (1 - 2) * (5 - 13) = 21.
        let sharp = run(&(OpSpec::AdjustSharpness { sharpness_factor: 2.0, p: 1.0 }), &src, 3, 3);
        assert_eq!(&sharp[12..15], &[21, 21, 21]);
        assert_eq!(run(&(OpSpec::AdjustSharpness { sharpness_factor: 1.0, p: 1.0 }), &src, 3, 3), src);
        // Two pixels high: no interior, unchanged.
        assert_eq!(run(&(OpSpec::AdjustSharpness { sharpness_factor: 0.0, p: 1.0 }), &src[..18], 3, 2), &src[..18]);
    }

    #[test]
    fn gaussian_blur_keeps_flat_images_and_spreads_a_point_symmetrically() {
        let flat = vec![77u8; 5 * 4 * 3];
        let blur = OpSpec::GaussianBlur { kernel_size: KernelSize::Two([5, 3]), sigma: Range::One(1.0) };
        assert_eq!(run(&blur, &flat, 5, 4), flat);
        let mut point = vec![0u8; 5 * 5 * 3];
        point[(2 * 5 + 2) * 3] = 250;
        let square = OpSpec::GaussianBlur { kernel_size: KernelSize::One(3), sigma: Range::One(1.0) };
        let out = run(&square, &point, 5, 5);
        let at = |x: usize, y: usize| out[(y * 5 + x) * 3];
        assert!(at(2, 2) > at(1, 2) && at(1, 2) > at(1, 1) && at(1, 1) > 0, "{out:?}");
        assert_eq!((at(1, 2), at(1, 1)), (at(3, 2), at(3, 3)));
        assert_eq!(at(0, 0), 0);
        // A vanishing sigma is the identity, never a 0/0 kernel.
        let tiny = OpSpec::GaussianBlur { kernel_size: KernelSize::One(5), sigma: Range::One(1e-300) };
        assert_eq!(run(&tiny, &point, 5, 5), point);
        // A sigma range draws per sample, from the sample's generator only.
        let ranged = OpSpec::GaussianBlur { kernel_size: KernelSize::One(3), sigma: Range::Two([0.1, 5.0]) };
        assert_eq!(run(&ranged, &point, 5, 5), run(&ranged, &point, 5, 5));
    }

    #[test]
    fn color_jitter_factors_follow_torchvision_and_the_order_is_drawn_per_sample() {
        let src = [10, 100, 200, 0, 50, 255];
        let bright = run(
            &(OpSpec::ColorJitter {
                brightness: Some(Range::Two([2.0, 2.0])),
                contrast: None,
                saturation: None,
                hue: None,
            }),
            &src,
            2,
            1,
        );
        assert_eq!(bright, [20, 200, 255, 0, 100, 255]);
        // Contrast 0: every value becomes the mean of floor(gray): (84 + 58) / 2.
        let flat = run(
            &(OpSpec::ColorJitter {
                brightness: None,
                contrast: Some(Range::Two([0.0, 0.0])),
                saturation: None,
                hue: None,
            }),
            &src,
            2,
            1,
        );
        assert_eq!(flat, [71; 6]);
        // Saturation 0: the pixel's own grayscale.
        let gray = run(
            &(OpSpec::ColorJitter {
                brightness: None,
                contrast: None,
                saturation: Some(Range::Two([0.0, 0.0])),
                hue: None,
            }),
            &src,
            2,
            1,
        );
        assert_eq!(gray, [84, 84, 84, 58, 58, 58]);
        // Hue 0.5 turns red into cyan; a zero shift keeps every pixel.
        let red = [255, 0, 0, 10, 100, 200];
        let shifted = run(
            &(OpSpec::ColorJitter {
                brightness: None,
                contrast: None,
                saturation: None,
                hue: Some(Range::Two([0.5, 0.5])),
            }),
            &red,
            2,
            1,
        );
        assert_eq!(&shifted[..3], &[0, 255, 255]);
        assert_eq!(
            run(
                &(OpSpec::ColorJitter {
                    brightness: None,
                    contrast: None,
                    saturation: None,
                    hue: Some(Range::Two([0.0, 0.0]))
                }),
                &red,
                2,
                1
            ),
            red
        );
        // With all four, the draws depend only on the sample's generator.
        let all = OpSpec::ColorJitter {
            brightness: Some(Range::One(0.4)),
            contrast: Some(Range::One(0.4)),
            saturation: Some(Range::One(0.4)),
            hue: Some(Range::One(0.1)),
        };
        let (mut a, mut b) = (rng(), rng());
        let (mut da, mut db) = (Vec::new(), Vec::new());
        apply(&all, Frame { src: &src, w: 2, h: 1, rng: &mut a, max_pixels: u64::MAX, dst: &mut da }).unwrap();
        apply(&all, Frame { src: &src, w: 2, h: 1, rng: &mut b, max_pixels: u64::MAX, dst: &mut db }).unwrap();
        assert_eq!(da, db);
        let orders: std::collections::HashSet<[u8; 4]> = (0..64)
            .map(|k| Jitter::draw(None, None, None, None, &mut SampleRng::new(0, 0, SampleKey(k), 0)).order)
            .collect();
        assert!(orders.len() > 12, "randperm(4) should reach most of the 24 orders: {orders:?}");
    }

    #[test]
    fn random_erasing_writes_its_value_in_the_output_units_and_layout() {
        // 10x10, scale 0.1, ratio 1: a 3x3 rectangle (round(sqrt(10)) = 3).
        let (w, h) = (10u32, 10u32);
        let (scale, ratio) = ([0.1, 0.1], [1.0, 1.0]);
        let mut out = vec![0u8; 300];
        random_erasing(1.0, scale, ratio, ErasingValue::One(7.0), &mut out, w, h, DType::U8, Layout::Hwc, &mut rng());
        assert_eq!(out.iter().filter(|&&v| v == 7).count(), 27);

        let per_channel = ErasingValue::PerChannel([1.0, -2.0, 3.5]);
        let mut out = vec![0u8; 400 * 3];
        random_erasing(1.0, scale, ratio, per_channel, &mut out, w, h, DType::F32, Layout::Chw, &mut rng());
        let floats: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
        for (c, want) in [1.0f32, -2.0, 3.5].into_iter().enumerate() {
            let plane = &floats[c * 100..(c + 1) * 100];
            assert_eq!(plane.iter().filter(|&&v| v == want).count(), 9, "channel {c}");
        }

        let noise = ErasingValue::Random(RandomTag::Random);
        let mut out = vec![0u8; 400 * 3];
        random_erasing(1.0, scale, ratio, noise, &mut out, w, h, DType::F32, Layout::Hwc, &mut rng());
        assert_eq!(out.chunks_exact(4).filter(|b| *b != [0; 4]).count(), 27);

        let mut out = vec![0u8; 300];
        random_erasing(0.0, scale, ratio, ErasingValue::One(7.0), &mut out, w, h, DType::U8, Layout::Hwc, &mut rng());
        assert!(out.iter().all(|&v| v == 0));
    }
}
