//! Lossless JPEG rewriting (TurboJPEG `tj3Transform`): the DCT coefficients are kept as they
//! are, so every pixel decodes exactly as before. Used by `sluice pack` to make a dataset
//! seekable (see [`crate::restart`]).

use libc::{c_int, c_void};
use turbojpeg_sys as tj;

use crate::error::CodecError;
use crate::handle::TjHandle;
use crate::jpeg::Subsampling;

/// The restart interval (in MCUs) actually used for an image `mcus_per_row` MCUs wide: the
/// largest divisor of the row that is at most `wanted`, so intervals never straddle rows.
pub fn restart_interval_for(mcus_per_row: u32, wanted: u32) -> u32 {
    (1..=wanted.clamp(1, mcus_per_row.max(1))).rev().find(|d| mcus_per_row.is_multiple_of(*d)).unwrap_or(1)
}

/// Rewrites a JPEG losslessly with a restart marker every `interval` MCUs (adjusted down to
/// divide the MCU row, see [`restart_interval_for`]), Huffman tables optimised, as a
/// baseline (sequential) JPEG even if it was progressive; markers (EXIF, ICC, comments) are
/// copied. Images with more than `max_pixels` pixels are refused before any work.
pub fn add_restart_markers(jpeg: &[u8], interval: u32, max_pixels: u64) -> Result<Vec<u8>, CodecError> {
    if jpeg.is_empty() {
        return Err(CodecError::Empty);
    }
    let t = TjHandle::new(tj::TJINIT_TJINIT_TRANSFORM, "transformer")?;
    // SAFETY: valid handle; the buffer is only read.
    let rc = unsafe { tj::tj3DecompressHeader(t.as_ptr(), jpeg.as_ptr(), jpeg.len() as tj::size_t) };
    if rc != 0 {
        return Err(CodecError::Corrupt(t.message()));
    }
    let (w, h) = (t.get(tj::TJPARAM_TJPARAM_JPEGWIDTH), t.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT));
    let (width, height) = (u64::try_from(w).unwrap_or(0), u64::try_from(h).unwrap_or(0));
    if width == 0 || height == 0 {
        return Err(CodecError::Corrupt(format!("invalid JPEG dimensions {w}x{h}")));
    }
    if width * height > max_pixels {
        return Err(CodecError::TooLarge { width, height, limit: max_pixels });
    }
    let (mcu_w, _) = Subsampling::from_tj(t.get(tj::TJPARAM_TJPARAM_SUBSAMP))
        .mcu_size()
        .ok_or_else(|| CodecError::Unsupported("JPEG with unusual sampling factors".into()))?;
    let per_row = (width as u32).div_ceil(mcu_w);
    t.set(tj::TJPARAM_TJPARAM_RESTARTBLOCKS, restart_interval_for(per_row, interval) as c_int)?;
    t.set(tj::TJPARAM_TJPARAM_SAVEMARKERS, 4)?; // every marker
    let transform = tj::tjtransform {
        r: tj::tjregion { x: 0, y: 0, w: 0, h: 0 },
        op: tj::TJXOP_TJXOP_NONE as c_int,
        options: tj::TJXOPT_OPTIMIZE as c_int,
        data: std::ptr::null_mut(),
        customFilter: None,
    };
    let mut buf: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: valid handle; one transform, one destination buffer that TurboJPEG allocates
    // (freed below) and whose size it writes.
    let rc = unsafe {
        tj::tj3Transform(t.as_ptr(), jpeg.as_ptr(), jpeg.len() as tj::size_t, 1, &mut buf, &mut size, &transform)
    };
    // Any failure, warnings included (a truncated input), is an error: never write a
    // "repaired" copy.
    let result = if rc == 0 && !buf.is_null() {
        // SAFETY: on success `buf` holds `size` initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts(buf, size as usize) }.to_vec())
    } else {
        Err(CodecError::Corrupt(t.message()))
    };
    // SAFETY: `buf` is NULL or was allocated by TurboJPEG.
    unsafe { tj::tj3Free(buf.cast::<c_void>()) };
    result
}
