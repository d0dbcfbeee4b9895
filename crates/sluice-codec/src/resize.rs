//! Antialiased bilinear resizing of RGB8 images through `fast_image_resize` (SIMD picked at
//! run time: AVX2, SSE4.1 or NEON). "Convolution bilinear" widens the filter when shrinking,
//! like PIL and torchvision's `antialias=True`, so a 4x downscale averages, not aliases.

use fast_image_resize as fir;
use fir::images::{Image as FirImage, ImageRef};
use fir::{FilterType, PixelType, ResizeAlg, ResizeOptions};

use crate::error::CodecError;

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
}

impl Default for Resizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Resizer {
    pub fn new() -> Self {
        Self { inner: fir::Resizer::new() }
    }

    /// The SIMD extensions the resampler uses on this CPU.
    pub fn cpu_extensions(&self) -> fir::CpuExtensions {
        self.inner.cpu_extensions()
    }

    /// Resamples the rectangle `rect` of the RGB8 image `src` (`src_w x src_h`) into `dst`,
    /// an RGB8 image of exactly `dst_w x dst_h` (`dst.len() == dst_w * dst_h * 3`).
    #[allow(clippy::too_many_arguments)]
    pub fn resize_rect(
        &mut self,
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
        let mut dst_img = FirImage::from_slice_u8(dst_w, dst_h, dst, PixelType::U8x3)
            .map_err(|e| CodecError::Shape(format!("resize destination: {e}")))?;
        let opts = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear)).crop(
            rect.left,
            rect.top,
            rect.width,
            rect.height,
        );
        self.inner
            .resize(&src_img, &mut dst_img, &opts)
            .map_err(|e| CodecError::Shape(format!("resize {src_w}x{src_h} -> {dst_w}x{dst_h}: {e}")))
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
        self.resize_rect(src, src_w, src_h, SubRect::full(src_w, src_h), dst, w, h)?;
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
        r.resize_rect(&src, w, h, SubRect { left: 2.0, top: 0.5, width: 28.0, height: 30.0 }, &mut dst, 8, 8).unwrap();
        assert!(dst.chunks_exact(3).all(|p| p == [200, 0, 0]), "{dst:?}");
        r.resize_rect(&src, w, h, SubRect { left: 33.5, top: 0.0, width: 30.0, height: 32.0 }, &mut dst, 8, 8).unwrap();
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
        let src: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let v = if (i % w + i / w) % 2 == 0 { 255 } else { 0 };
                [v, v, v]
            })
            .collect();
        let mut dst = vec![0u8; 8 * 8 * 3];
        Resizer::new().resize_rect(&src, w, h, SubRect::full(w, h), &mut dst, 8, 8).unwrap();
        assert!(dst.iter().all(|&v| (120..=135).contains(&v)), "{dst:?}");
    }

    #[test]
    fn bad_buffers_and_windows_are_errors_not_panics() {
        let mut r = Resizer::new();
        let src = vec![0u8; 4 * 4 * 3];
        let mut dst = vec![0u8; 2 * 2 * 3];
        assert!(r.resize_rect(&src, 4, 4, SubRect::full(4, 4), &mut dst[..5], 2, 2).is_err());
        assert!(r.resize_rect(&src[..10], 4, 4, SubRect::full(4, 4), &mut dst, 2, 2).is_err());
        let outside = SubRect { left: 10.0, top: 0.0, width: 2.0, height: 2.0 };
        assert!(r.resize_rect(&src, 4, 4, outside, &mut dst, 2, 2).is_err());
        let nan = SubRect { left: f64::NAN, top: 0.0, width: 2.0, height: 2.0 };
        assert!(r.resize_rect(&src, 4, 4, nan, &mut dst, 2, 2).is_err());
    }
}
