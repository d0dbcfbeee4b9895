//! Resizing of RGB8 images with torchvision v2's `interpolation` and `antialias`.
//!
//! Bilinear and bicubic go through `fast_image_resize` (SIMD picked at run time: AVX2,
//! SSE4.1 or NEON): "convolution" widens the filter when shrinking, like PIL and
//! torchvision's `antialias=True`, so a 4x downscale averages, not aliases; "interpolation"
//! keeps the filter's own width (`antialias=False`). torchvision's antialiased bicubic is
//! PIL's (a = -0.5, fir's Catmull-Rom, rows first as PIL); its plain bicubic is OpenCV's
//! (a = -0.75, border pixels repeated), computed here. Nearest and nearest-exact pick source
//! pixels with torch's own f32 index arithmetic.
//!
//! A rectangle with whole-pixel edges is resized as an image of its own (torchvision crops,
//! then resizes), so no filter tap reads outside it; a fractional one (a window the IDCT
//! scaled) is resampled in place.

use fast_image_resize as fir;
use fir::images::{CroppedImage, Image as FirImage, ImageRef};
use fir::{FilterType, PixelType, ResizeAlg, ResizeOptions};
use sluice_core::Interpolation;

use crate::error::CodecError;

/// How a resize samples: torchvision's `interpolation` and `antialias`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resample {
    pub interpolation: Interpolation,
    /// Widen the filter when shrinking; `nearest` and `nearest_exact` ignore it.
    pub antialias: bool,
}

impl Default for Resample {
    /// torchvision v2's default: bilinear, antialiased.
    fn default() -> Self {
        Self { interpolation: Interpolation::Bilinear, antialias: true }
    }
}

impl Resample {
    pub fn new(interpolation: Interpolation, antialias: bool) -> Self {
        Self { interpolation, antialias }
    }

    /// Whether a JPEG window may be decoded at 1/2, 1/4 or 1/8 before this resample. The
    /// IDCT's scaling averages blocks, which an antialiased filter shrinking by at least as
    /// much nearly does too; a filter that samples single pixels (nearest, or bilinear and
    /// bicubic without antialiasing) would give other pixels than torchvision's.
    pub fn allows_dct_scaling(&self) -> bool {
        self.antialias && matches!(self.interpolation, Interpolation::Bilinear | Interpolation::Bicubic)
    }

    fn algorithm(&self) -> Option<ResizeAlg> {
        let filter = match self.interpolation {
            Interpolation::Nearest | Interpolation::NearestExact => return None,
            Interpolation::Bilinear => FilterType::Bilinear,
            // Antialiased (PIL's, a = -0.5); without, `bicubic_replicate` runs instead.
            Interpolation::Bicubic => FilterType::CatmullRom,
        };
        Some(if self.antialias { ResizeAlg::Convolution(filter) } else { ResizeAlg::Interpolation(filter) })
    }
}

/// The cubic convolution kernel with a = -0.75 (torch's `bicubic` without antialiasing).
fn opencv_cubic(x: f64) -> f64 {
    const A: f64 = -0.75;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// A rectangle in pixel coordinates; fractional edges are honoured by the resampler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubRect {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

impl SubRect {
    pub fn full(width: u32, height: u32) -> Self {
        Self { left: 0.0, top: 0.0, width: width.into(), height: height.into() }
    }

    /// The part of this rectangle inside a `width x height` image; `None` when nothing is
    /// (or the rectangle is not finite).
    pub fn clamp_to(self, width: u32, height: u32) -> Option<Self> {
        if ![self.left, self.top, self.width, self.height].iter().all(|v| v.is_finite()) {
            return None;
        }
        let (w, h) = (f64::from(width), f64::from(height));
        let l = self.left.max(0.0);
        let t = self.top.max(0.0);
        let r = (self.left + self.width).min(w);
        let b = (self.top + self.height).min(h);
        (r > l && b > t).then_some(Self { left: l, top: t, width: r - l, height: b - t })
    }
}

/// `(left, top, width, height)` when every edge of `rect` is a whole pixel.
fn whole_pixels(rect: SubRect) -> Option<(u32, u32, u32, u32)> {
    let edges = [rect.left, rect.top, rect.width, rect.height];
    edges.iter().all(|v| v.fract() == 0.0).then_some((
        rect.left as u32,
        rect.top as u32,
        rect.width as u32,
        rect.height as u32,
    ))
}

/// The images of one of [`Resizer`]'s own kernels: `src` (rows `stride` bytes apart) with
/// the whole-pixel window `in_w x in_h` at `(left, top)` that is resampled, and `dst`, a
/// `dst_w x dst_h` RGB8 image. `src` and `dst` sizes were checked by the caller.
struct Pass<'a> {
    src: &'a [u8],
    stride: usize,
    left: usize,
    top: usize,
    in_w: usize,
    in_h: usize,
    dst: &'a mut [u8],
    dst_w: u32,
    dst_h: u32,
}

impl<'a> Pass<'a> {
    /// The whole-pixel part of `rect` (which lies inside the `src_w x src_h` image, clamped
    /// by the caller, so `left < src_w`), at least one pixel a side.
    fn new(
        src: &'a [u8],
        src_w: u32,
        src_h: u32,
        rect: SubRect,
        dst: &'a mut [u8],
        (dst_w, dst_h): (u32, u32),
    ) -> Self {
        let (left, top) = (rect.left.floor() as usize, rect.top.floor() as usize);
        let in_w = (rect.width.round() as usize).clamp(1, (src_w as usize).saturating_sub(left).max(1));
        let in_h = (rect.height.round() as usize).clamp(1, (src_h as usize).saturating_sub(top).max(1));
        Self { src, stride: src_w as usize * 3, left, top, in_w, in_h, dst, dst_w, dst_h }
    }
}

/// Shorter side to `size`, aspect ratio kept (torchvision `Resize(int)`: the longer side is
/// `int(size * long / short)`, truncated).
pub fn shorter_side_size(width: u32, height: u32, size: u32) -> (u32, u32) {
    // Saturates: a side past u32::MAX is refused by the caller's pixel limit anyway.
    let long_of = |short: u32, long: u32| {
        let side = (u64::from(size) * u64::from(long)) / u64::from(short.max(1));
        u32::try_from(side).unwrap_or(u32::MAX)
    };
    if width <= height {
        (size, long_of(width, height).max(1))
    } else {
        (long_of(height, width).max(1), size)
    }
}

/// A reusable resizer: keeps `fast_image_resize`'s intermediate buffers between calls, so
/// keep one per worker thread.
#[derive(Debug, Clone)]
pub struct Resizer {
    inner: fir::Resizer,
    /// Source columns of a nearest resize, one per output column (reused).
    columns: Vec<usize>,
    /// A bicubic resize's image between its two passes (reused).
    between_passes: Vec<u8>,
}

impl Default for Resizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Resizer {
    pub fn new() -> Self {
        Self { inner: fir::Resizer::new(), columns: Vec::new(), between_passes: Vec::new() }
    }

    /// The SIMD extensions the resampler uses on this CPU.
    pub fn cpu_extensions(&self) -> fir::CpuExtensions {
        self.inner.cpu_extensions()
    }

    /// Resamples the rectangle `rect` of the RGB8 image `src` (`src_w x src_h`) into `dst`,
    /// an RGB8 image of exactly `dst_w x dst_h` (`dst.len() == dst_w * dst_h * 3`), with
    /// `resample` (`Resample::default()`: torchvision's default, antialiased bilinear).
    #[allow(clippy::too_many_arguments)]
    pub fn resize_rect(
        &mut self,
        resample: Resample,
        src: &[u8],
        src_w: u32,
        src_h: u32,
        rect: SubRect,
        dst: &mut [u8],
        dst_w: u32,
        dst_h: u32,
    ) -> Result<(), CodecError> {
        let need = dst_w as usize * dst_h as usize * 3;
        if dst.len() != need {
            return Err(CodecError::Shape(format!(
                "resize output buffer has {} bytes, {dst_w}x{dst_h} RGB needs {need}",
                dst.len()
            )));
        }
        let rect = rect.clamp_to(src_w, src_h).ok_or_else(|| {
            CodecError::Shape(format!("resize window {rect:?} lies outside the {src_w}x{src_h} image"))
        })?;
        let src_img = ImageRef::new(src_w, src_h, src, PixelType::U8x3)
            .map_err(|e| CodecError::Shape(format!("resize source: {e}")))?;
        let Some(alg) = resample.algorithm() else {
            self.nearest(resample.interpolation, Pass::new(src, src_w, src_h, rect, dst, (dst_w, dst_h)));
            return Ok(());
        };
        if resample.interpolation == Interpolation::Bicubic {
            if !resample.antialias {
                self.bicubic_replicate(Pass::new(src, src_w, src_h, rect, dst, (dst_w, dst_h)));
                return Ok(());
            }
            return self.rows_then_columns(alg, &src_img, rect, dst, dst_w, dst_h);
        }
        let mut dst_img = FirImage::from_slice_u8(dst_w, dst_h, dst, PixelType::U8x3)
            .map_err(|e| CodecError::Shape(format!("resize destination: {e}")))?;
        let failed = |e: fir::ResizeError| CodecError::Shape(format!("resize {src_w}x{src_h} -> {dst_w}x{dst_h}: {e}"));
        match whole_pixels(rect) {
            // torchvision resizes the crop alone: filter taps stop at its edges.
            Some((left, top, width, height)) => {
                let crop = CroppedImage::new(&src_img, left, top, width, height)
                    .map_err(|e| CodecError::Shape(format!("resize window {rect:?}: {e}")))?;
                self.inner.resize(&crop, &mut dst_img, &ResizeOptions::new().resize_alg(alg)).map_err(failed)
            }
            None => {
                let opts = ResizeOptions::new().resize_alg(alg).crop(rect.left, rect.top, rect.width, rect.height);
                self.inner.resize(&src_img, &mut dst_img, &opts).map_err(failed)
            }
        }
    }

    /// Resizes along rows, then along columns, each pass rounded and clamped to u8, as PIL
    /// and torch's u8 kernels do (fir goes columns first; a bicubic filter overshoots, so
    /// the clamp between the passes makes the order show at hard edges).
    fn rows_then_columns(
        &mut self,
        alg: ResizeAlg,
        src: &ImageRef<'_>,
        rect: SubRect,
        dst: &mut [u8],
        dst_w: u32,
        dst_h: u32,
    ) -> Result<(), CodecError> {
        let shape = |what: &str, e: &dyn std::fmt::Display| CodecError::Shape(format!("bicubic resize {what}: {e}"));
        // A whole-pixel rectangle is an image of its own; a fractional one is resampled in
        // place (its rows first, then the rows' part of the result).
        let ((left, top, width, height), inner) = match whole_pixels(rect) {
            Some(r) => (r, SubRect::full(r.2, r.3)),
            None => ((0, 0, src.width(), src.height()), rect),
        };
        let view = CroppedImage::new(src, left, top, width, height).map_err(|e| shape("window", &e))?;
        let mut tmp = std::mem::take(&mut self.between_passes);
        tmp.resize(dst_w as usize * height as usize * 3, 0);
        let mut passes = || {
            let mut mid =
                FirImage::from_slice_u8(dst_w, height, &mut tmp, PixelType::U8x3).map_err(|e| shape("buffer", &e))?;
            let rows = ResizeOptions::new().resize_alg(alg).crop(inner.left, 0.0, inner.width, height.into());
            self.inner.resize(&view, &mut mid, &rows).map_err(|e| shape("rows", &e))?;
            let mid = ImageRef::new(dst_w, height, &tmp, PixelType::U8x3).map_err(|e| shape("buffer", &e))?;
            let mut out =
                FirImage::from_slice_u8(dst_w, dst_h, dst, PixelType::U8x3).map_err(|e| shape("destination", &e))?;
            let columns = ResizeOptions::new().resize_alg(alg).crop(0.0, inner.top, dst_w.into(), inner.height);
            self.inner.resize(&mid, &mut out, &columns).map_err(|e| shape("columns", &e))
        };
        let result = passes();
        self.between_passes = tmp;
        result
    }

    /// torch's u8 `bicubic` without antialiasing (OpenCV's): four taps at
    /// `(i + 0.5) * scale - 0.5`, a = -0.75, border pixels repeated past the edges (not
    /// renormalized like the antialiased filter), rows first, each pass rounded to u8.
    fn bicubic_replicate(&mut self, pass: Pass<'_>) {
        let Pass { src, stride, left, top, in_w, in_h, dst, dst_w, dst_h } = pass;
        // Per output index: the four source indices (clamped) and their weights.
        let taps = |n_in: usize, n_out: u32| -> Vec<([usize; 4], [f64; 4])> {
            let scale = n_in as f64 / f64::from(n_out);
            (0..n_out as usize)
                .map(|i| {
                    let at = (i as f64 + 0.5) * scale - 0.5;
                    let (f, t) = (at.floor(), at - at.floor());
                    let idx = [-1.0, 0.0, 1.0, 2.0].map(|k| (f + k).clamp(0.0, (n_in - 1) as f64) as usize);
                    (idx, [opencv_cubic(t + 1.0), opencv_cubic(t), opencv_cubic(1.0 - t), opencv_cubic(2.0 - t)])
                })
                .collect()
        };
        let to_u8 = |v: f64| v.round().clamp(0.0, 255.0) as u8;
        let (xs, ys) = (taps(in_w, dst_w), taps(in_h, dst_h));
        let mid_stride = dst_w as usize * 3;
        let mut mid = std::mem::take(&mut self.between_passes);
        mid.resize(mid_stride * in_h, 0);
        for (y, row) in mid.chunks_exact_mut(mid_stride).enumerate() {
            let src_row = &src[(top + y) * stride + left * 3..];
            for (px, (idx, w)) in row.chunks_exact_mut(3).zip(&xs) {
                for (c, v) in px.iter_mut().enumerate() {
                    *v = to_u8((0..4).map(|k| w[k] * f64::from(src_row[idx[k] * 3 + c])).sum());
                }
            }
        }
        for (row, (idx, w)) in dst.chunks_exact_mut(mid_stride).zip(&ys) {
            for (i, v) in row.iter_mut().enumerate() {
                *v = to_u8((0..4).map(|k| w[k] * f64::from(mid[idx[k] * mid_stride + i])).sum());
            }
        }
        self.between_passes = mid;
    }

    /// torch's `nearest` (source index `floor(i * scale)`) or `nearest_exact`
    /// (`floor((i + 0.5) * scale)`), `scale = in / out` in f32 as torch computes it, on the
    /// whole-pixel part of `rect`. `src` and `dst` sizes were checked by the caller.
    fn nearest(&mut self, mode: Interpolation, pass: Pass<'_>) {
        let Pass { src, stride, left, top, in_w, in_h, dst, dst_w, dst_h } = pass;
        let index = |i: usize, n_in: usize, n_out: u32| {
            let scale = n_in as f32 / n_out as f32;
            let at = if mode == Interpolation::NearestExact {
                ((i as f64 + 0.5) * f64::from(scale)) as f32
            } else {
                i as f32 * scale
            };
            (at.floor() as usize).min(n_in - 1)
        };
        self.columns.clear();
        self.columns.extend((0..dst_w as usize).map(|x| (left + index(x, in_w, dst_w)) * 3));
        for (y, row) in dst.chunks_exact_mut(dst_w as usize * 3).take(dst_h as usize).enumerate() {
            let from = (top + index(y, in_h, dst_h)) * stride;
            let src_row = &src[from..];
            for (px, &x) in row.chunks_exact_mut(3).zip(&self.columns) {
                px.copy_from_slice(&src_row[x..x + 3]);
            }
        }
    }

    /// Resizes the whole image so its shorter side is `size`, into `dst` (resized to fit).
    /// Returns the new (width, height).
    pub fn resize_shorter_side(
        &mut self,
        src: &[u8],
        src_w: u32,
        src_h: u32,
        size: u32,
        dst: &mut Vec<u8>,
    ) -> Result<(u32, u32), CodecError> {
        let (w, h) = shorter_side_size(src_w, src_h, size);
        dst.resize(w as usize * h as usize * 3, 0);
        self.resize_rect(Resample::default(), src, src_w, src_h, SubRect::full(src_w, src_h), dst, w, h)?;
        Ok((w, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorter_side_follows_torchvision() {
        assert_eq!(shorter_side_size(500, 375, 256), (341, 256));
        assert_eq!(shorter_side_size(375, 500, 256), (256, 341));
        assert_eq!(shorter_side_size(100, 100, 32), (32, 32));
        assert_eq!(shorter_side_size(1000, 10, 5), (500, 5));
    }

    #[test]
    fn uniform_image_stays_uniform_and_rect_selects_the_region() {
        let mut r = Resizer::new();
        // Left half red, right half blue.
        let (w, h) = (64u32, 32u32);
        let mut src = vec![0u8; (w * h * 3) as usize];
        for (i, p) in src.chunks_exact_mut(3).enumerate() {
            if (i as u32 % w) < 32 {
                p[0] = 200;
            } else {
                p[2] = 100;
            }
        }
        let mut dst = vec![0u8; 8 * 8 * 3];
        r.resize_rect(
            Resample::default(),
            &src,
            w,
            h,
            SubRect { left: 2.0, top: 0.5, width: 28.0, height: 30.0 },
            &mut dst,
            8,
            8,
        )
        .unwrap();
        assert!(dst.chunks_exact(3).all(|p| p == [200, 0, 0]), "{dst:?}");
        r.resize_rect(
            Resample::default(),
            &src,
            w,
            h,
            SubRect { left: 33.5, top: 0.0, width: 30.0, height: 32.0 },
            &mut dst,
            8,
            8,
        )
        .unwrap();
        assert!(dst.chunks_exact(3).all(|p| p == [0, 0, 100]));

        let mut out = Vec::new();
        assert_eq!(r.resize_shorter_side(&src, w, h, 16, &mut out).unwrap(), (32, 16));
        assert_eq!(out.len(), 32 * 16 * 3);
        assert_eq!(&out[..3], &[200, 0, 0]);
        assert_eq!(&out[out.len() - 3..], &[0, 0, 100]);
    }

    #[test]
    fn downscale_averages_instead_of_aliasing() {
        // A 1-pixel checkerboard shrunk 4x must come out mid-grey (antialiased), not b/w.
        let (w, h) = (32u32, 32u32);
        let src = checkerboard(w, h);
        let mut dst = vec![0u8; 8 * 8 * 3];
        Resizer::new().resize_rect(Resample::default(), &src, w, h, SubRect::full(w, h), &mut dst, 8, 8).unwrap();
        assert!(dst.iter().all(|&v| (120..=135).contains(&v)), "{dst:?}");
    }

    /// A `w x h` 1-pixel black and white checkerboard.
    fn checkerboard(w: u32, h: u32) -> Vec<u8> {
        (0..w * h)
            .flat_map(|i| {
                let v = if (i % w + i / w).is_multiple_of(2) { 255 } else { 0 };
                [v, v, v]
            })
            .collect()
    }

    /// A 6x1 image: a black 4-pixel run between two white pixels.
    fn bar() -> Vec<u8> {
        [255u8, 0, 0, 0, 0, 255].iter().flat_map(|&v| [v, v, v]).collect()
    }

    #[test]
    fn a_whole_pixel_crop_is_resized_alone_as_torchvision_crops_first() {
        // Shrinking the black run 4 -> 1 must give black: the white pixels beside the crop
        // are not the crop's. (Resampled in place, the widened filter reached them.)
        let mut dst = vec![0u8; 3];
        let rect = SubRect { left: 1.0, top: 0.0, width: 4.0, height: 1.0 };
        Resizer::new().resize_rect(Resample::default(), &bar(), 6, 1, rect, &mut dst, 1, 1).unwrap();
        assert_eq!(dst, [0, 0, 0]);
    }

    #[test]
    fn nearest_picks_torchs_source_pixels() {
        // 5 -> 3: scale 5/3; nearest takes floor(i * s) = 0, 1, 3; nearest-exact
        // floor((i + 0.5) * s) = 0, 2, 4.
        let src: Vec<u8> = (0..5u8).flat_map(|v| [v * 10, v, 0]).collect();
        let mut dst = vec![0u8; 9];
        let mut r = Resizer::new();
        for (mode, want) in [(Interpolation::Nearest, [0, 10, 30]), (Interpolation::NearestExact, [0, 20, 40])] {
            r.resize_rect(Resample::new(mode, true), &src, 5, 1, SubRect::full(5, 1), &mut dst, 3, 1).unwrap();
            assert_eq!([dst[0], dst[3], dst[6]], want, "{mode:?}");
        }
        // Within a crop: columns 1..4 of 5, enlarged 3 -> 6 (each pixel twice).
        let mut dst = vec![0u8; 18];
        let rect = SubRect { left: 1.0, top: 0.0, width: 3.0, height: 1.0 };
        r.resize_rect(Resample::new(Interpolation::Nearest, false), &src, 5, 1, rect, &mut dst, 6, 1).unwrap();
        assert_eq!(dst.chunks(3).map(|p| p[0]).collect::<Vec<_>>(), [10, 10, 20, 20, 30, 30]);
    }

    #[test]
    fn antialias_widens_the_filter_only_when_asked() {
        // The 1-pixel checkerboard shrunk 4x: antialiased averages to grey; without
        // antialiasing bilinear samples between two pixels at the output centers.
        let (w, h) = (32u32, 32u32);
        let src = checkerboard(w, h);
        let mut dst = vec![0u8; 8 * 8 * 3];
        let mut r = Resizer::new();
        for interpolation in [Interpolation::Bilinear, Interpolation::Bicubic] {
            r.resize_rect(Resample::new(interpolation, true), &src, w, h, SubRect::full(w, h), &mut dst, 8, 8).unwrap();
            assert!(dst.iter().all(|&v| (110..=145).contains(&v)), "{interpolation:?}: {dst:?}");
        }
        // Output center 4i + 2 falls exactly on a pixel boundary: an even mix, 127/128.
        r.resize_rect(Resample::new(Interpolation::Bilinear, false), &src, w, h, SubRect::full(w, h), &mut dst, 8, 8)
            .unwrap();
        assert!(dst.iter().all(|&v| (127..=128).contains(&v)), "{dst:?}");
        // The bicubic kernels: a = -0.75 without antialiasing, 0 at the integers but 1 at 0.
        assert_eq!(opencv_cubic(0.0), 1.0);
        assert_eq!([opencv_cubic(1.0), opencv_cubic(2.0), opencv_cubic(-2.5)], [0.0, 0.0, 0.0]);
        assert!((opencv_cubic(0.5) - 0.59375).abs() < 1e-12);
        assert!(Resample::default().allows_dct_scaling());
        assert!(!Resample::new(Interpolation::Bilinear, false).allows_dct_scaling());
        assert!(!Resample::new(Interpolation::Nearest, true).allows_dct_scaling());
    }

    #[test]
    fn bad_buffers_and_windows_are_errors_not_panics() {
        let mut r = Resizer::new();
        let src = vec![0u8; 4 * 4 * 3];
        let mut dst = vec![0u8; 2 * 2 * 3];
        assert!(r.resize_rect(Resample::default(), &src, 4, 4, SubRect::full(4, 4), &mut dst[..5], 2, 2).is_err());
        assert!(r.resize_rect(Resample::default(), &src[..10], 4, 4, SubRect::full(4, 4), &mut dst, 2, 2).is_err());
        let outside = SubRect { left: 10.0, top: 0.0, width: 2.0, height: 2.0 };
        assert!(r.resize_rect(Resample::default(), &src, 4, 4, outside, &mut dst, 2, 2).is_err());
        let nan = SubRect { left: f64::NAN, top: 0.0, width: 2.0, height: 2.0 };
        assert!(r.resize_rect(Resample::default(), &src, 4, 4, nan, &mut dst, 2, 2).is_err());
    }
}
