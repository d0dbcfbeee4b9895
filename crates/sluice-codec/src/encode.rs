//! JPEG encoding (TurboJPEG `tj3Compress8`), for the dataset generator and test fixtures.
//! Not on the loading hot path: each call creates and destroys its own compressor.

use libc::c_int;
use turbojpeg_sys as tj;

use crate::error::CodecError;
use crate::handle::TjHandle;
use crate::jpeg::Subsampling;

/// The layout of the pixels handed to [`encode_jpeg_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePixels {
    /// 3 bytes per pixel.
    Rgb,
    /// 1 byte per pixel; pair with [`Subsampling::Gray`].
    Gray,
    /// 4 bytes per pixel, stored inverted as Adobe does (written as YCCK).
    Cmyk,
}

impl SourcePixels {
    fn bytes_per_pixel(self) -> usize {
        match self {
            Self::Rgb => 3,
            Self::Gray => 1,
            Self::Cmyk => 4,
        }
    }

    fn tj_format(self) -> tj::TJPF {
        match self {
            Self::Rgb => tj::TJPF_TJPF_RGB,
            Self::Gray => tj::TJPF_TJPF_GRAY,
            Self::Cmyk => tj::TJPF_TJPF_CMYK,
        }
    }
}

/// Encodes interleaved RGB8 as a baseline 4:2:0 JPEG of the given quality (1..=100).
pub fn encode_jpeg(rgb: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, CodecError> {
    encode_jpeg_with(rgb, width, height, SourcePixels::Rgb, Subsampling::S420, quality)
}

/// Encodes `pixels` (`width x height` in the `source` layout) with the given chroma
/// subsampling and quality (1..=100).
pub fn encode_jpeg_with(
    pixels: &[u8],
    width: u32,
    height: u32,
    source: SourcePixels,
    subsampling: Subsampling,
    quality: u8,
) -> Result<Vec<u8>, CodecError> {
    encode(pixels, width, height, Settings { source, subsampling, quality, progressive: false, optimize: false })
}

/// [`encode_jpeg_with`] with Huffman tables optimised for the image, as many photo tools
/// and web images have them (such tables lack the codes the image does not use).
pub fn encode_jpeg_optimized(
    pixels: &[u8],
    width: u32,
    height: u32,
    source: SourcePixels,
    subsampling: Subsampling,
    quality: u8,
) -> Result<Vec<u8>, CodecError> {
    encode(pixels, width, height, Settings { source, subsampling, quality, progressive: false, optimize: true })
}

/// Encodes interleaved RGB8 as a progressive 4:2:0 JPEG (common in web-scraped datasets).
pub fn encode_jpeg_progressive(rgb: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, CodecError> {
    encode(
        rgb,
        width,
        height,
        Settings {
            source: SourcePixels::Rgb,
            subsampling: Subsampling::S420,
            quality,
            progressive: true,
            optimize: false,
        },
    )
}

/// How [`encode`] writes the JPEG: the source layout, chroma subsampling, quality,
/// whether progressive and whether with optimised Huffman tables.
struct Settings {
    source: SourcePixels,
    subsampling: Subsampling,
    quality: u8,
    progressive: bool,
    optimize: bool,
}

fn encode(pixels: &[u8], width: u32, height: u32, settings: Settings) -> Result<Vec<u8>, CodecError> {
    let Settings { source, subsampling, quality, progressive, optimize } = settings;
    let bad = |m: String| Err(CodecError::Shape(m));
    let need = width as usize * height as usize * source.bytes_per_pixel();
    if width == 0 || height == 0 || pixels.len() != need {
        return bad(format!("{width}x{height} {source:?} needs {need} bytes, got {}", pixels.len()));
    }
    let (Ok(w), Ok(h)) = (c_int::try_from(width), c_int::try_from(height)) else {
        return bad(format!("{width}x{height} is too large to encode"));
    };
    let Some(samp) = subsampling.to_tj() else {
        return bad("cannot encode with unknown subsampling".into());
    };
    let c = TjHandle::new(tj::TJINIT_TJINIT_COMPRESS, "compressor")?;
    c.set(tj::TJPARAM_TJPARAM_QUALITY, c_int::from(quality.clamp(1, 100)))?;
    c.set(tj::TJPARAM_TJPARAM_SUBSAMP, samp)?;
    if progressive {
        c.set(tj::TJPARAM_TJPARAM_PROGRESSIVE, 1)?;
    }
    if optimize {
        c.set(tj::TJPARAM_TJPARAM_OPTIMIZE, 1)?;
    }
    if source == SourcePixels::Cmyk {
        c.set(tj::TJPARAM_TJPARAM_COLORSPACE, tj::TJCS_TJCS_YCCK as c_int)?;
    }
    let mut buf: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: `pixels` holds `h` rows of `w * bytes_per_pixel` bytes (checked above);
    // TurboJPEG allocates `buf` (we free it below) and writes its size.
    let rc = unsafe {
        tj::tj3Compress8(c.as_ptr(), pixels.as_ptr(), w, 0, h, source.tj_format() as c_int, &mut buf, &mut size)
    };
    let result = if rc == 0 && !buf.is_null() {
        // SAFETY: on success `buf` points to `size` initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts(buf, size as usize) }.to_vec())
    } else {
        Err(CodecError::Unsupported(format!("JPEG encoding failed: {}", c.message())))
    };
    // SAFETY: `buf` is NULL or was allocated by TurboJPEG.
    unsafe { tj::tj3Free(buf.cast()) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_a_jpeg_and_rejects_wrong_buffer_sizes() {
        let rgb = vec![77u8; 20 * 10 * 3];
        let jpg = encode_jpeg(&rgb, 20, 10, 90).unwrap();
        assert_eq!(&jpg[..2], &[0xFF, 0xD8]);
        assert_eq!(&jpg[jpg.len() - 2..], &[0xFF, 0xD9]);
        assert!(encode_jpeg(&rgb[1..], 20, 10, 90).is_err());
        assert!(encode_jpeg(&[], 0, 0, 90).is_err());
        let gray = vec![5u8; 8 * 8];
        assert!(encode_jpeg_with(&gray, 8, 8, SourcePixels::Gray, Subsampling::Gray, 90).is_ok());
    }
}
