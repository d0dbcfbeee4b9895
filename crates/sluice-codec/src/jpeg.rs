//! JPEG decoding through libjpeg-turbo's TurboJPEG 3 API.
//!
//! [`JpegDecoder::decode_region`] is the reason this module exists: it decodes only a window of
//! the image (`tj3SetCroppingRegion`: rows above are skipped, columns outside are never
//! IDCT'd or colour-converted) and, when the window is at least twice the size the caller will
//! resize it to, lets the IDCT scale it by 1/2, 1/4 or 1/8 (`tj3SetScalingFactor`), which is
//! far cheaper than decoding full size and resizing.
//!
//! Warnings: libjpeg-turbo reports a truncated file as a *warning* and fills the missing rows
//! with grey. sluice treats every warning as corruption except a short list of harmless ones
//! (extraneous bytes before a marker, unknown JFIF revision, ...), so a truncated JPEG is an
//! error, never a silently grey sample.

use std::ffi::CStr;
use std::ptr::NonNull;

use libc::{c_int, c_void};
use turbojpeg_sys as tj;

use std::sync::Arc;

use crate::error::CodecError;
use crate::index_store::IndexStore;
use crate::resize::SubRect;
use crate::restart::RestartLayout;

/// Chrominance subsampling, as TurboJPEG classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    S444,
    S422,
    S420,
    Gray,
    S440,
    S411,
    S441,
    /// Sampling factors TurboJPEG has no name for. Such images decode, but not cropped.
    Unknown,
}

/// `tjMCUWidth` / `tjMCUHeight` from turbojpeg.h, indexed by `TJSAMP`. Copied (the C statics
/// need `unsafe` to read); a test checks them against the library.
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];
const MCU_HEIGHT: [u32; 7] = [8, 8, 16, 8, 16, 8, 32];

impl Subsampling {
    pub(crate) fn from_tj(v: c_int) -> Self {
        match v {
            0 => Self::S444,
            1 => Self::S422,
            2 => Self::S420,
            3 => Self::Gray,
            4 => Self::S440,
            5 => Self::S411,
            6 => Self::S441,
            _ => Self::Unknown,
        }
    }

    /// The `TJSAMP` value, `None` for [`Subsampling::Unknown`].
    pub(crate) fn to_tj(self) -> Option<c_int> {
        Some(match self {
            Self::S444 => 0,
            Self::S422 => 1,
            Self::S420 => 2,
            Self::Gray => 3,
            Self::S440 => 4,
            Self::S411 => 5,
            Self::S441 => 6,
            Self::Unknown => return None,
        })
    }

    /// Width and height in pixels of one iMCU (the unit a crop's left edge aligns to).
    pub fn mcu_size(self) -> Option<(u32, u32)> {
        let i = self.to_tj()? as usize;
        Some((MCU_WIDTH[i], MCU_HEIGHT[i]))
    }
}

/// The colour space the JPEG stores. All of them decode to RGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorSpace {
    Rgb,
    YCbCr,
    Gray,
    /// Decoded to CMYK, then converted to RGB the way TurboJPEG does (Adobe's inverted CMYK).
    Cmyk,
    Ycck,
}

impl ColorSpace {
    fn from_tj(v: c_int) -> Option<Self> {
        Some(match v {
            0 => Self::Rgb,
            1 => Self::YCbCr,
            2 => Self::Gray,
            3 => Self::Cmyk,
            4 => Self::Ycck,
            _ => return None,
        })
    }

    fn is_cmyk(self) -> bool {
        matches!(self, Self::Cmyk | Self::Ycck)
    }
}

/// What the header says, read without decoding any pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    pub width: u32,
    pub height: u32,
    pub subsampling: Subsampling,
    pub colorspace: ColorSpace,
    /// Bits per sample; only 8 decodes.
    pub precision: u8,
    /// Lossless JPEG (decodes, but never cropped or scaled).
    pub lossless: bool,
}

impl JpegHeader {
    /// Whether crop-window and DCT-scaled decodes apply to this image.
    fn can_crop(&self) -> bool {
        !self.lossless && self.subsampling.mcu_size().is_some()
    }
}

/// Where [`JpegDecoder::decode_region`] put the requested window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionDecode {
    /// Size of the decoded RGB8 buffer.
    pub width: u32,
    pub height: u32,
    /// The IDCT scaled the image by `1 / scale_denom` (1, 2, 4 or 8).
    pub scale_denom: u32,
    /// The requested window in the decoded buffer's pixel coordinates (fractional): resize
    /// exactly this rectangle.
    pub rect: SubRect,
}

/// One TurboJPEG decompressor. Make one per worker thread and reuse it: creating a handle
/// allocates, decoding with a warm one does not (beyond the output buffers you pass in).
pub struct JpegDecoder {
    handle: NonNull<c_void>,
    max_pixels: u64,
    /// Scratch for CMYK images, converted to RGB afterwards.
    cmyk: Vec<u8>,
    /// Scratch for the window cut out of a JPEG.
    window: Vec<u8>,
    /// Where files without restart markers get their entropy index (none: they decode
    /// the ordinary way).
    index: Option<Arc<IndexStore>>,
}

// SAFETY: a TurboJPEG handle is plain heap state with no thread affinity; `&mut self` on every
// method keeps it to one thread at a time.
unsafe impl Send for JpegDecoder {}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed exactly once.
        unsafe { tj::tj3Destroy(self.handle.as_ptr()) }
    }
}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder").field("max_pixels", &self.max_pixels).finish_non_exhaustive()
    }
}

/// The IDCT scale for decoding `rect` to be resized to `target`: the largest of 1/8, 1/4,
/// 1/2 that keeps the window at least `target` pixels, else 1.
fn scale_denom(rect: SubRect, target: (u32, u32)) -> u32 {
    [8u32, 4, 2]
        .into_iter()
        .find(|&d| {
            rect.width / f64::from(d) >= f64::from(target.0) && rect.height / f64::from(d) >= f64::from(target.1)
        })
        .unwrap_or(1)
}

/// `TJSCALED(dim, 1/denom)`: libjpeg's rounded-up scaled size.
fn scaled(dim: u32, denom: u32) -> u32 {
    dim.div_ceil(denom)
}

/// libjpeg warnings that leave every pixel intact. Anything else (premature end of file,
/// bad Huffman code, missing restart marker...) means some pixels are made up.
fn is_benign_warning(msg: &str) -> bool {
    const BENIGN: [&str; 5] = [
        "extraneous bytes before marker",
        "unknown JFIF revision",
        "Unknown Adobe color transform",
        "Inconsistent progression sequence",
        "bad ICC marker",
    ];
    BENIGN.iter().any(|b| msg.contains(b))
}

/// Walks the marker segments from SOI and says whether a frame header (SOFn) comes before the
/// scan data. libjpeg accepts a tables-only stream (SOI, tables, EOI) as a "header" and
/// TurboJPEG then reports the previous image's dimensions, so this guards [`JpegDecoder::header`].
/// Returns `true` when the walk cannot decide (running out of bytes): libjpeg judges those.
fn has_frame_header(b: &[u8]) -> bool {
    let mut i = 2; // after SOI
    loop {
        // Markers may be preceded by any number of 0xFF fill bytes.
        while b.get(i) == Some(&0xFF) && b.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let (Some(&0xFF), Some(&m)) = (b.get(i), b.get(i + 1)) else { return true };
        match m {
            0xC0..=0xCF if m != 0xC4 && m != 0xC8 && m != 0xCC => return true,
            0xD9 | 0xDA => return false, // EOI or SOS before any frame
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let (Some(&hi), Some(&lo)) = (b.get(i + 2), b.get(i + 3)) else { return true };
                i += 2 + usize::from(u16::from_be_bytes([hi, lo]));
            }
        }
    }
}

/// TurboJPEG's own CMYK to RGB (cmyk.h): libjpeg hands back Adobe's inverted CMYK, so a
/// channel is `c * k / 255`.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    for (s, d) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let k = u32::from(s[3]);
        for c in 0..3 {
            // round(x * k / 255) in integers
            d[c] = ((u32::from(s[c]) * k * 2 + 255) / 510) as u8;
        }
    }
}

impl JpegDecoder {
    /// A decompressor that rejects images whose header declares more than `max_pixels`
    /// pixels (before allocating anything for them).
    pub fn new(max_pixels: u64) -> Result<Self, CodecError> {
        let mut d = Self { handle: new_handle()?, max_pixels: 0, cmyk: Vec::new(), window: Vec::new(), index: None };
        d.configure(max_pixels)?;
        Ok(d)
    }

    fn configure(&mut self, max_pixels: u64) -> Result<(), CodecError> {
        // Warnings are judged by `check`, not by aborting mid-decode.
        self.set(tj::TJPARAM_TJPARAM_STOPONWARNING, 0)?;
        self.set_max_pixels(max_pixels)
    }

    /// Replaces the handle after a failure. TurboJPEG 3.1 returns from a failed
    /// `tj3DecompressHeader` without aborting libjpeg's header reader, and every later call
    /// on that handle then re-parses the stale state ("Bogus marker length" forever): one
    /// corrupt file would poison every image the worker decodes after it.
    fn recover(&mut self) {
        match new_handle() {
            Ok(fresh) => {
                let old = std::mem::replace(&mut self.handle, fresh);
                // SAFETY: `old` came from tj3Init and nothing else refers to it now.
                unsafe { tj::tj3Destroy(old.as_ptr()) };
                if let Err(e) = self.configure(self.max_pixels) {
                    tracing::warn!("resetting the JPEG decoder: {e}");
                }
            }
            // The old handle stays; the next decode reports its own error.
            Err(e) => tracing::warn!("resetting the JPEG decoder: {e}"),
        }
    }

    /// Runs a TurboJPEG step; on failure resets the handle so the next image starts clean.
    fn guarded<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T, CodecError>) -> Result<T, CodecError> {
        let result = step(self);
        if matches!(result, Err(CodecError::Corrupt(_))) {
            self.recover();
        }
        result
    }

    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// Where [`Self::decode_region`] keeps and finds the entropy indexes of files without
    /// restart markers; `None` decodes them the ordinary way.
    pub fn set_index(&mut self, index: Option<&Arc<IndexStore>>) {
        if !IndexStore::same(self.index.as_ref(), index) {
            self.index = index.cloned();
        }
    }

    pub fn set_max_pixels(&mut self, max_pixels: u64) -> Result<(), CodecError> {
        // TurboJPEG's own limit is an int; above that only our header check applies.
        let tj_limit = c_int::try_from(max_pixels).unwrap_or(0);
        self.set(tj::TJPARAM_TJPARAM_MAXPIXELS, tj_limit)?;
        self.max_pixels = max_pixels;
        Ok(())
    }

    fn set(&mut self, param: tj::TJPARAM, value: c_int) -> Result<(), CodecError> {
        // SAFETY: valid handle; tj3Set only reads its arguments.
        let rc = unsafe { tj::tj3Set(self.handle.as_ptr(), param as c_int, value) };
        if rc == 0 {
            Ok(())
        } else {
            Err(CodecError::Unsupported(format!("libjpeg-turbo setting {param}: {}", self.error_message())))
        }
    }

    fn get(&self, param: tj::TJPARAM) -> c_int {
        // SAFETY: valid handle; tj3Get only reads.
        unsafe { tj::tj3Get(self.handle.as_ptr(), param as c_int) }
    }

    fn error_message(&self) -> String {
        // SAFETY: valid handle; the returned string is NUL-terminated and lives in the
        // handle (or thread-local storage) until the next call, and we copy it at once.
        let p = unsafe { tj::tj3GetErrorStr(self.handle.as_ptr()) };
        if p.is_null() {
            return "unknown libjpeg-turbo error".into();
        }
        // SAFETY: non-null, NUL-terminated (see above).
        let s = unsafe { CStr::from_ptr(p) };
        s.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Turns a TurboJPEG return code into a result: fatal errors and data-losing warnings
    /// are `Corrupt`.
    fn check(&self, rc: c_int) -> Result<(), CodecError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: valid handle.
        let code = unsafe { tj::tj3GetErrorCode(self.handle.as_ptr()) };
        let msg = self.error_message();
        if code == tj::TJERR_TJERR_WARNING as c_int && is_benign_warning(&msg) {
            Ok(())
        } else {
            Err(CodecError::Corrupt(msg))
        }
    }

    /// Reads the header: size, subsampling, colour space. Fails with `TooLarge` when the
    /// image has more pixels than the limit, before anything is allocated for it.
    pub fn header(&mut self, bytes: &[u8]) -> Result<JpegHeader, CodecError> {
        if bytes.is_empty() {
            return Err(CodecError::Empty);
        }
        self.guarded(|d| {
            // SAFETY: valid handle; the buffer is valid for `len` bytes and only read.
            let rc = unsafe { tj::tj3DecompressHeader(d.handle.as_ptr(), bytes.as_ptr(), bytes.len() as tj::size_t) };
            d.check(rc)
        })?;
        if !has_frame_header(bytes) {
            return Err(CodecError::Corrupt("no image frame (SOF marker) in the JPEG stream".into()));
        }
        let (w, h) = (self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH), self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT));
        let (Ok(width), Ok(height)) = (u32::try_from(w), u32::try_from(h)) else {
            return Err(CodecError::Corrupt(format!("invalid JPEG dimensions {w}x{h}")));
        };
        if width == 0 || height == 0 {
            return Err(CodecError::Corrupt(format!("invalid JPEG dimensions {w}x{h}")));
        }
        if u64::from(width) * u64::from(height) > self.max_pixels {
            return Err(CodecError::TooLarge { width: width.into(), height: height.into(), limit: self.max_pixels });
        }
        let colorspace = ColorSpace::from_tj(self.get(tj::TJPARAM_TJPARAM_COLORSPACE))
            .ok_or_else(|| CodecError::Unsupported("JPEG with an unknown colour space".into()))?;
        Ok(JpegHeader {
            width,
            height,
            subsampling: Subsampling::from_tj(self.get(tj::TJPARAM_TJPARAM_SUBSAMP)),
            colorspace,
            precision: u8::try_from(self.get(tj::TJPARAM_TJPARAM_PRECISION)).unwrap_or(0),
            lossless: self.get(tj::TJPARAM_TJPARAM_LOSSLESS) == 1,
        })
    }

    fn check_decodable(hdr: &JpegHeader) -> Result<(), CodecError> {
        if hdr.precision != 8 {
            return Err(CodecError::Unsupported(format!("{}-bit JPEG (only 8-bit decodes)", hdr.precision)));
        }
        Ok(())
    }

    /// Scaling and cropping persist in the handle: set both before every decode.
    fn set_geometry(&mut self, denom: u32, region: Option<tj::tjregion>) -> Result<(), CodecError> {
        let sf = tj::tjscalingfactor { num: 1, denom: denom as c_int };
        // SAFETY: valid handle; plain struct argument.
        let rc = unsafe { tj::tj3SetScalingFactor(self.handle.as_ptr(), sf) };
        self.check(rc)?;
        let region = region.unwrap_or(tj::tjregion { x: 0, y: 0, w: 0, h: 0 });
        // SAFETY: as above; the header was read by the caller just before.
        let rc = unsafe { tj::tj3SetCroppingRegion(self.handle.as_ptr(), region) };
        self.check(rc)
    }

    /// Decompresses (with the geometry already set) into `out` as `w x h` RGB8.
    fn decompress(
        &mut self,
        bytes: &[u8],
        hdr: &JpegHeader,
        w: u32,
        h: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let px = w as usize * h as usize;
        out.resize(px * 3, 0);
        let (dst, pitch, format) = if hdr.colorspace.is_cmyk() {
            self.cmyk.resize(px * 4, 0);
            (self.cmyk.as_mut_ptr(), w * 4, tj::TJPF_TJPF_CMYK)
        } else {
            (out.as_mut_ptr(), w * 3, tj::TJPF_TJPF_RGB)
        };
        // SAFETY: valid handle; `bytes` is only read. TurboJPEG writes `h` rows of `pitch`
        // bytes: `w x h` is exactly the scaled (and cropped) size that the geometry set for
        // this same header yields (TJSCALED, or the cropping region), and `dst` holds
        // `px * 3` (RGB) or `px * 4` (CMYK) bytes.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.handle.as_ptr(),
                bytes.as_ptr(),
                bytes.len() as tj::size_t,
                dst,
                pitch as c_int,
                format as c_int,
            )
        };
        self.guarded(|d| d.check(rc))?;
        if hdr.colorspace.is_cmyk() {
            cmyk_to_rgb(&self.cmyk[..px * 4], &mut out[..px * 3]);
        }
        Ok(())
    }

    /// The whole image at full size as RGB8 (grayscale and CMYK converted), with
    /// libjpeg-turbo's default (accurate) IDCT and upsampling: the plain baseline.
    pub fn decode_full(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(u32, u32), CodecError> {
        let hdr = self.header(bytes)?;
        Self::check_decodable(&hdr)?;
        self.set_geometry(1, None)?;
        self.decompress(bytes, &hdr, hdr.width, hdr.height, out)?;
        Ok((hdr.width, hdr.height))
    }

    /// Decodes only the window `rect` (full-resolution pixel coordinates, may be fractional)
    /// into `out` as RGB8, the IDCT scaling by the largest of 1/8, 1/4, 1/2 that keeps the
    /// window at least `target` (width, height) pixels. The decoded buffer is a little larger
    /// than the window (its left edge aligns down to the scaled iMCU, partial pixels round
    /// outwards); [`RegionDecode::rect`] says where the window lies in it.
    ///
    /// Images that cannot be cropped (lossless, unusual sampling factors) decode whole, and
    /// the returned rectangle still points at the window.
    ///
    /// JPEGs with restart markers aligned to the MCU rows (`sluice pack` writes them), and
    /// baseline ones with an entropy index (see [`Self::set_index`]), are first cut down to
    /// the MCUs around the window (see [`crate::restart`], [`crate::entropy_index`]), so
    /// the entropy decoding above and beside the window is skipped too. The pixels are the
    /// same either way.
    pub fn decode_region(
        &mut self,
        bytes: &[u8],
        rect: SubRect,
        target: (u32, u32),
        out: &mut Vec<u8>,
    ) -> Result<RegionDecode, CodecError> {
        let mut cut = std::mem::take(&mut self.window);
        let result = match self.cut_window(bytes, rect, target, &mut cut) {
            Some(shifted) => self.decode_region_in_place((&cut, shifted), target, out),
            None => self.decode_region_in_place((bytes, rect), target, out),
        };
        self.window = cut;
        result
    }

    /// Cuts the MCUs around `rect` out of a seekable JPEG into `cut` and returns `rect`
    /// moved into that window; `None` when the file is not seekable or the cut would not
    /// save anything.
    pub(crate) fn cut_window(
        &self,
        bytes: &[u8],
        rect: SubRect,
        target: (u32, u32),
        cut: &mut Vec<u8>,
    ) -> Option<SubRect> {
        // Too many pixels: `None`, and the ordinary path reports it.
        let restart = RestartLayout::parse(bytes, self.max_pixels);
        let indexed = match (&restart, &self.index) {
            (None, Some(store)) => store.index_of(bytes, self.max_pixels),
            _ => None,
        };
        let grid = match (&restart, &indexed) {
            (Some(layout), _) => *layout.grid(),
            (None, Some((frame, index))) => frame.grid(index.spacing),
            (None, None) => return None,
        };
        let (w, h) = (grid.width, grid.height);
        let rect = rect.clamp_to(w, h)?;
        // One MCU (at the decode scale) of margin on every side: the fancy upsampler and
        // libjpeg's context rows then see the same neighbours as in the whole image, so the
        // window decodes to exactly the same pixels.
        let (mw, mh) = grid.mcu;
        let denom = scale_denom(rect, target);
        let (mx, my) = (f64::from(mw * denom), f64::from(mh * denom));
        let clamp = |v: f64, hi: u32| v.clamp(0.0, f64::from(hi)) as u32;
        let win = grid.window_covering(
            clamp((rect.left - mx).floor(), w),
            clamp((rect.top - my).floor(), h),
            clamp((rect.left + rect.width + mx).ceil(), w),
            clamp((rect.top + rect.height + my).ceil(), h),
        );
        if grid.is_whole(win) {
            return None;
        }
        match (&restart, &indexed) {
            (Some(layout), _) => layout.write_window(bytes, win, cut),
            (None, Some((frame, index))) => {
                // A window the index cannot cut (damaged data) decodes the ordinary way,
                // and libjpeg judges the file.
                index.write_window(bytes, frame, win, cut)?;
                if let Some(store) = &self.index {
                    store.count_cut();
                }
            }
            (None, None) => return None,
        }
        let (ox, oy) = grid.origin(win);
        Some(SubRect { left: rect.left - f64::from(ox), top: rect.top - f64::from(oy), ..rect })
    }

    /// [`Self::decode_region`] on the whole of `bytes`: `rect` is a window of that JPEG.
    pub(crate) fn decode_region_in_place(
        &mut self,
        (bytes, rect): (&[u8], SubRect),
        target: (u32, u32),
        out: &mut Vec<u8>,
    ) -> Result<RegionDecode, CodecError> {
        let hdr = self.header(bytes)?;
        Self::check_decodable(&hdr)?;
        let rect = rect.clamp_to(hdr.width, hdr.height).ok_or_else(|| {
            CodecError::Shape(format!("crop window {rect:?} lies outside the {}x{} image", hdr.width, hdr.height))
        })?;

        let denom = if hdr.lossless { 1 } else { scale_denom(rect, target) };
        let d = f64::from(denom);
        let (full_w, full_h) = (scaled(hdr.width, denom), scaled(hdr.height, denom));
        let (sx, sy, sw, sh) = (rect.left / d, rect.top / d, rect.width / d, rect.height / d);

        let mut x0 = (sx.floor() as u32).min(full_w - 1);
        let x1 = ((sx + sw).ceil() as u32).clamp(x0 + 1, full_w);
        let y0 = (sy.floor() as u32).min(full_h - 1);
        let y1 = ((sy + sh).ceil() as u32).clamp(y0 + 1, full_h);
        let mut region = None;
        if let (true, Some((mcu_w, mcu_h))) = (hdr.can_crop(), hdr.subsampling.mcu_size()) {
            // The upsampler reads the chroma beyond the window's edges: a region ending
            // there would treat them as the image's edges and change the pixels next to
            // them. One iMCU more on each side lets it see what a full decode sees.
            let imcu = scaled(mcu_w, denom);
            x0 = (x0 - x0 % imcu).saturating_sub(imcu);
            let x1 = (x1 + imcu).min(full_w);
            let y1 = (y1 + scaled(mcu_h, denom)).min(full_h);
            region = Some((x0, y0, x1 - x0, y1 - y0));
        }
        let (rx, ry, rw, rh) = region.unwrap_or((0, 0, full_w, full_h));
        let as_tj = |(x, y, w, h): (u32, u32, u32, u32)| {
            if (x, y, w, h) == (0, 0, full_w, full_h) {
                None
            } else {
                Some(tj::tjregion { x: x as c_int, y: y as c_int, w: w as c_int, h: h as c_int })
            }
        };
        self.set_geometry(denom, as_tj((rx, ry, rw, rh)))?;
        let (rx, rw) = match self.decompress(bytes, &hdr, rw, rh, out) {
            Ok(()) => (rx, rw),
            // Sampling factors written in a non-standard way can make libjpeg's iMCU wider
            // than TurboJPEG's table says; decode the full width of the rows instead.
            Err(CodecError::Corrupt(m)) if m.contains("mismatch") && region.is_some() => {
                self.header(bytes)?;
                self.set_geometry(denom, as_tj((0, ry, full_w, rh)))?;
                self.decompress(bytes, &hdr, full_w, rh, out)?;
                (0, full_w)
            }
            Err(e) => return Err(e),
        };
        let left = sx - f64::from(rx);
        let top = sy - f64::from(ry);
        Ok(RegionDecode {
            width: rw,
            height: rh,
            scale_denom: denom,
            rect: SubRect { left, top, width: sw.min(f64::from(rw) - left), height: sh.min(f64::from(rh) - top) },
        })
    }
}

fn new_handle() -> Result<NonNull<c_void>, CodecError> {
    // SAFETY: no preconditions; returns NULL on failure.
    let raw = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as c_int) };
    NonNull::new(raw).ok_or_else(|| {
        CodecError::Unsupported(format!("cannot create a libjpeg-turbo decompressor: {}", global_error_message()))
    })
}

/// The thread-local TurboJPEG error string (for failures without a handle).
fn global_error_message() -> String {
    // SAFETY: a null handle asks for the global message; the string is NUL-terminated.
    let p = unsafe { tj::tj3GetErrorStr(std::ptr::null_mut()) };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::encode::{encode_jpeg, encode_jpeg_with, SourcePixels};

    /// A smooth, textured RGB test image (no flat areas, so decode differences show).
    pub(crate) fn test_rgb(w: u32, h: u32) -> Vec<u8> {
        let mut v = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f64, y as f64);
                v.push((128.0 + 100.0 * (fx / 17.0).sin() * (fy / 23.0).cos()) as u8);
                v.push(((x * 255) / w.max(1)) as u8);
                v.push((128.0 + 90.0 * ((fx + fy) / 31.0).sin()) as u8);
            }
        }
        v
    }

    pub(crate) fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs()).sum::<f64>() / a.len() as f64
    }

    /// Copies an integer window out of an RGB8 image.
    pub(crate) fn crop_rgb(src: &[u8], w: u32, x: u32, y: u32, cw: u32, ch: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for row in y..y + ch {
            let s = ((row * w + x) * 3) as usize;
            out.extend_from_slice(&src[s..s + (cw * 3) as usize]);
        }
        out
    }

    fn decoder() -> JpegDecoder {
        JpegDecoder::new(1 << 26).unwrap()
    }

    #[test]
    fn a_corrupt_file_does_not_poison_the_decoder_for_the_next_one() {
        let (w, h) = (64, 48);
        let good = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let mut garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        garbage[..3].copy_from_slice(&[0xFF, 0xD8, 0xFF]);
        let truncated = good[..good.len() / 2].to_vec();
        let mut d = decoder();
        let mut out = Vec::new();
        for bad in [&garbage, &truncated] {
            assert!(matches!(d.decode_full(bad, &mut out), Err(CodecError::Corrupt(_))));
            assert_eq!(d.decode_full(&good, &mut out).unwrap(), (w, h), "decoder broken after a bad file");
            assert!(matches!(d.header(bad), Err(CodecError::Corrupt(_))) || d.decode_full(bad, &mut out).is_err());
            assert_eq!(d.header(&good).unwrap().width, w);
            let rect = SubRect { left: 8.0, top: 8.0, width: 32.0, height: 32.0 };
            d.decode_region(&good, rect, (16, 16), &mut out).unwrap();
        }
    }

    #[test]
    fn every_subsampling_crops_on_its_imcu_grid() {
        // A wrong MCU table would make TurboJPEG reject the left edge ("not divisible").
        let (w, h) = (160, 128);
        let rgb = test_rgb(w, h);
        let all = [
            Subsampling::S444,
            Subsampling::S422,
            Subsampling::S420,
            Subsampling::S440,
            Subsampling::S411,
            Subsampling::S441,
        ];
        let mut d = decoder();
        for s in all {
            let jpg = encode_jpeg_with(&rgb, w, h, SourcePixels::Rgb, s, 95).unwrap();
            assert_eq!(d.header(&jpg).unwrap().subsampling, s);
            let mut full = Vec::new();
            d.decode_full(&jpg, &mut full).unwrap();
            let (mcu_w, _) = s.mcu_size().unwrap();
            for denom in [1u32, 2, 4, 8] {
                let x = mcu_w * 2 + 3;
                let rect = SubRect { left: x as f64, top: 5.0, width: 64.0, height: 48.0 };
                let target = (64 / denom, 48 / denom);
                let mut buf = Vec::new();
                let r =
                    d.decode_region(&jpg, rect, target, &mut buf).unwrap_or_else(|e| panic!("{s:?} 1/{denom}: {e}"));
                assert_eq!(r.scale_denom, denom);
                // Aligned down to the iMCU, then one iMCU of context for the upsampler.
                assert!(r.rect.left < f64::from(2 * mcu_w), "{s:?} 1/{denom}: {r:?}");
                if denom == 1 {
                    let got = crop_rgb(&buf, r.width, r.rect.left as u32, r.rect.top as u32, 64, 48);
                    let diff = mean_abs_diff(&got, &crop_rgb(&full, w, x, 5, 64, 48));
                    assert!(diff < 2.0, "{s:?}: {diff}");
                }
            }
        }
    }

    #[test]
    fn header_and_full_decode_round_trip() {
        let rgb = test_rgb(97, 61);
        let jpg = encode_jpeg(&rgb, 97, 61, 95).unwrap();
        let mut d = decoder();
        let hdr = d.header(&jpg).unwrap();
        assert_eq!((hdr.width, hdr.height), (97, 61));
        assert_eq!(hdr.subsampling, Subsampling::S420);
        assert_eq!(hdr.colorspace, ColorSpace::YCbCr);
        let mut out = Vec::new();
        assert_eq!(d.decode_full(&jpg, &mut out).unwrap(), (97, 61));
        assert_eq!(out.len(), 97 * 61 * 3);
        assert!(mean_abs_diff(&out, &rgb) < 3.0, "{}", mean_abs_diff(&out, &rgb));
    }

    /// [`test_rgb`] as a `w x h` JPEG of `quality`, a decoder, and the JPEG decoded whole.
    fn test_jpeg_decoded(w: u32, h: u32, quality: u8) -> (Vec<u8>, JpegDecoder, Vec<u8>) {
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, quality).unwrap();
        let mut d = decoder();
        let mut full = Vec::new();
        d.decode_full(&jpg, &mut full).unwrap();
        (jpg, d, full)
    }

    #[test]
    fn unscaled_region_matches_cropping_the_full_decode_with_unaligned_edges() {
        let (w, h) = (300, 200);
        let (jpg, mut d, full) = test_jpeg_decoded(w, h, 90);
        // Left edges on and off the 16-pixel iMCU grid, including the right and bottom edges.
        for (x, y, cw, ch) in [(0, 0, 64, 64), (13, 7, 100, 90), (37, 101, 263, 99), (16, 0, 50, 200), (299, 199, 1, 1)]
        {
            let rect = SubRect { left: x as f64, top: y as f64, width: cw as f64, height: ch as f64 };
            let mut buf = Vec::new();
            // Target as big as the window: no DCT scaling.
            let r = d.decode_region(&jpg, rect, (cw, ch), &mut buf).unwrap();
            assert_eq!(r.scale_denom, 1);
            assert_eq!(buf.len(), (r.width * r.height * 3) as usize);
            assert_eq!(r.rect.left.fract(), 0.0);
            let context = if x >= 16 { 16.0 } else { 0.0 };
            assert!(r.rect.left < 16.0 + context, "left edge aligned down to the iMCU, one more of context: {r:?}");
            assert_eq!((r.rect.width, r.rect.height), (cw as f64, ch as f64));
            let got = crop_rgb(&buf, r.width, r.rect.left as u32, r.rect.top as u32, cw, ch);
            let want = crop_rgb(&full, w, x, y, cw, ch);
            assert!(got == want, "window {x},{y} {cw}x{ch}: mean abs diff {}", mean_abs_diff(&got, &want));
        }
    }

    #[test]
    fn half_scaled_region_matches_a_downscaled_full_decode() {
        let (w, h) = (320, 240);
        let (jpg, mut d, full) = test_jpeg_decoded(w, h, 92);
        // 2x2 box filter of the full decode: what a 1/2 IDCT approximates.
        let half: Vec<u8> = {
            let mut v = Vec::new();
            for y in 0..h / 2 {
                for x in 0..w / 2 {
                    for c in 0..3 {
                        let at = |xx: u32, yy: u32| u32::from(full[((yy * w + xx) * 3 + c) as usize]);
                        let s =
                            at(2 * x, 2 * y) + at(2 * x + 1, 2 * y) + at(2 * x, 2 * y + 1) + at(2 * x + 1, 2 * y + 1);
                        v.push(((s + 2) / 4) as u8);
                    }
                }
            }
            v
        };
        let rect = SubRect { left: 50.0, top: 30.0, width: 200.0, height: 160.0 };
        let mut buf = Vec::new();
        let r = d.decode_region(&jpg, rect, (100, 80), &mut buf).unwrap();
        assert_eq!(r.scale_denom, 2);
        assert_eq!((r.rect.width, r.rect.height), (100.0, 80.0));
        // 50/2 = 25 aligns down to the scaled iMCU (8), then one more of context: decoded
        // from x = 16.
        assert_eq!((r.rect.left, r.rect.top), (9.0, 0.0));
        let got = crop_rgb(&buf, r.width, 9, 0, 100, 80);
        let want = crop_rgb(&half, w / 2, 25, 15, 100, 80);
        let diff = mean_abs_diff(&got, &want);
        assert!(diff < 2.0, "mean abs diff {diff}");

        // A window big enough for 1/8 picks 1/8.
        let r = d
            .decode_region(&jpg, SubRect { left: 0.0, top: 0.0, width: 320.0, height: 240.0 }, (40, 30), &mut buf)
            .unwrap();
        assert_eq!((r.scale_denom, r.width, r.height), (8, 40, 30));
    }

    #[test]
    fn grayscale_jpeg_decodes_to_rgb() {
        let (w, h) = (40, 30);
        let gray: Vec<u8> = (0..w * h).map(|i| (i % 251) as u8).collect();
        let jpg = encode_jpeg_with(&gray, w, h, SourcePixels::Gray, Subsampling::Gray, 95).unwrap();
        let window = SubRect { left: 9.0, top: 3.0, width: 20.0, height: 20.0 };
        let (colorspace, size, out) = decode_whole_and_window_to_rgb(&jpg, window, (20, 20));
        assert_eq!((colorspace, size), (ColorSpace::Gray, (w, h)));
        assert_eq!(out.len(), (w * h * 3) as usize);
        assert!(out.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    /// Decodes `jpg` whole, then its `window` at `size`, both as RGB (the window's pixels
    /// checked for its size); returns its colour space and the whole image's size and pixels.
    fn decode_whole_and_window_to_rgb(
        jpg: &[u8],
        window: SubRect,
        size: (u32, u32),
    ) -> (ColorSpace, (u32, u32), Vec<u8>) {
        let mut d = decoder();
        let colorspace = d.header(jpg).unwrap().colorspace;
        let mut whole = Vec::new();
        let whole_size = d.decode_full(jpg, &mut whole).unwrap();
        let mut out = Vec::new();
        let r = d.decode_region(jpg, window, size, &mut out).unwrap();
        assert_eq!(out.len(), (r.width * r.height * 3) as usize);
        (colorspace, whole_size, whole)
    }

    #[test]
    fn cmyk_jpeg_decodes_to_rgb_like_turbojpeg() {
        let (w, h) = (32, 16);
        // Uniform CMYK colour, stored inverted as Adobe does: RGB = c*k/255 per channel.
        let px = [200u8, 100, 50, 180];
        let cmyk: Vec<u8> = px.iter().copied().cycle().take((w * h * 4) as usize).collect();
        let jpg = encode_jpeg_with(&cmyk, w, h, SourcePixels::Cmyk, Subsampling::S444, 100).unwrap();
        let window = SubRect { left: 8.0, top: 4.0, width: 16.0, height: 8.0 };
        let (colorspace, _, out) = decode_whole_and_window_to_rgb(&jpg, window, (16, 8));
        assert!(colorspace.is_cmyk());
        let want = [200 * 180 / 255, 100 * 180 / 255, 50 * 180 / 255];
        for p in out.chunks_exact(3) {
            for c in 0..3 {
                assert!((i32::from(p[c]) - want[c]).abs() <= 3, "{p:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn corrupt_truncated_empty_and_foreign_bytes_are_errors() {
        let (w, h) = (128, 96);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let mut d = decoder();
        let mut out = Vec::new();

        assert_eq!(d.decode_full(&[], &mut out), Err(CodecError::Empty));
        assert!(matches!(d.decode_full(b"hello, I am text", &mut out), Err(CodecError::Corrupt(_))));

        // Truncated at 50%: libjpeg only warns ("Premature end of JPEG file"); we refuse.
        let half = &jpg[..jpg.len() / 2];
        match d.decode_full(half, &mut out) {
            Err(CodecError::Corrupt(m)) => assert!(m.contains("Premature end"), "{m}"),
            other => panic!("{other:?}"),
        }
        let rect = SubRect { left: 0.0, top: 0.0, width: 64.0, height: 64.0 };
        assert!(matches!(d.decode_region(half, rect, (64, 64), &mut out), Err(CodecError::Corrupt(_))));

        // Garbage in the entropy-coded data.
        let mut bad = jpg.clone();
        let n = bad.len();
        for b in &mut bad[n / 3..n / 3 + 64] {
            *b = 0xFF;
        }
        assert!(matches!(d.decode_full(&bad, &mut out), Err(CodecError::Corrupt(_))));

        // Only the header survives.
        assert!(d.decode_full(&jpg[..4], &mut out).is_err());

        // A tables-only stream must not report the previous image's header.
        assert!(matches!(d.header(&[0xFF, 0xD8, 0xFF, 0xD9]), Err(CodecError::Corrupt(_))));

        // The decoder is still fine afterwards.
        assert_eq!(d.decode_full(&jpg, &mut out).unwrap(), (w, h));
    }

    /// Rewrites the SOF0 dimensions of a baseline JPEG.
    pub(crate) fn patch_sof_dims(jpg: &mut [u8], w: u16, h: u16) {
        let i = jpg.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        // FF C0, length(2), precision(1), height(2), width(2)
        jpg[i + 5..i + 7].copy_from_slice(&h.to_be_bytes());
        jpg[i + 7..i + 9].copy_from_slice(&w.to_be_bytes());
    }

    #[test]
    fn huge_declared_dimensions_are_too_large_before_decoding() {
        let mut jpg = encode_jpeg(&test_rgb(16, 16), 16, 16, 90).unwrap();
        patch_sof_dims(&mut jpg, 60000, 60000);
        let mut d = decoder();
        let mut out = Vec::new();
        let want = CodecError::TooLarge { width: 60000, height: 60000, limit: 1 << 26 };
        assert_eq!(d.header(&jpg), Err(want.clone()));
        assert_eq!(d.decode_full(&jpg, &mut out), Err(want.clone()));
        let rect = SubRect { left: 0.0, top: 0.0, width: 10.0, height: 10.0 };
        assert_eq!(d.decode_region(&jpg, rect, (10, 10), &mut out), Err(want));
        assert!(out.capacity() == 0, "nothing allocated for the huge image");

        // A limit just below a real image's size applies too.
        let jpg = encode_jpeg(&test_rgb(16, 16), 16, 16, 90).unwrap();
        d.set_max_pixels(255).unwrap();
        assert!(matches!(d.decode_full(&jpg, &mut out), Err(CodecError::TooLarge { .. })));
        d.set_max_pixels(256).unwrap();
        assert!(d.decode_full(&jpg, &mut out).is_ok());
    }

    #[test]
    fn progressive_jpegs_decode_whole_and_cropped() {
        let (w, h) = (200, 120);
        let rgb = test_rgb(w, h);
        let jpg = crate::encode::encode_jpeg_progressive(&rgb, w, h, 90).unwrap();
        let mut d = decoder();
        let mut full = Vec::new();
        assert_eq!(d.decode_full(&jpg, &mut full).unwrap(), (w, h));
        assert!(mean_abs_diff(&full, &rgb) < 3.0);
        let rect = SubRect { left: 21.0, top: 33.0, width: 120.0, height: 80.0 };
        let mut buf = Vec::new();
        let r = d.decode_region(&jpg, rect, (120, 80), &mut buf).unwrap();
        let got = crop_rgb(&buf, r.width, r.rect.left as u32, r.rect.top as u32, 120, 80);
        assert!(mean_abs_diff(&got, &crop_rgb(&full, w, 21, 33, 120, 80)) < 2.0);
        // Truncated progressive data is corrupt too.
        assert!(matches!(d.decode_full(&jpg[..jpg.len() * 2 / 3], &mut full), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn twelve_bit_jpegs_are_unsupported_not_garbage() {
        let (w, h) = (16, 16);
        let samples: Vec<i16> = (0..w * h * 3).map(|i| (i * 13 % 4096) as i16).collect();
        // SAFETY: test-only FFI; buffers sized for a w x h RGB 12-bit image.
        let jpg = unsafe {
            let c = tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as c_int);
            assert!(!c.is_null());
            assert_eq!(tj::tj3Set(c, tj::TJPARAM_TJPARAM_QUALITY as c_int, 90), 0);
            assert_eq!(tj::tj3Set(c, tj::TJPARAM_TJPARAM_SUBSAMP as c_int, 2), 0);
            assert_eq!(tj::tj3Set(c, tj::TJPARAM_TJPARAM_PRECISION as c_int, 12), 0);
            let mut buf: *mut u8 = std::ptr::null_mut();
            let mut size: tj::size_t = 0;
            let rc = tj::tj3Compress12(c, samples.as_ptr(), w, 0, h, tj::TJPF_TJPF_RGB as c_int, &mut buf, &mut size);
            assert_eq!(rc, 0);
            let v = std::slice::from_raw_parts(buf, size as usize).to_vec();
            tj::tj3Free(buf.cast());
            tj::tj3Destroy(c);
            v
        };
        let mut d = decoder();
        assert_eq!(d.header(&jpg).unwrap().precision, 12);
        let mut out = Vec::new();
        assert!(matches!(d.decode_full(&jpg, &mut out), Err(CodecError::Unsupported(m)) if m.contains("12-bit")));
    }

    #[test]
    fn benign_warnings_are_accepted() {
        let (w, h) = (64, 48);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        // Junk bytes before EOI: "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9".
        let mut junk = jpg[..jpg.len() - 2].to_vec();
        junk.extend_from_slice(&[0x12, 0x34, 0x56, 0xFF, 0xD9]);
        let mut d = decoder();
        let mut out = Vec::new();
        assert_eq!(d.decode_full(&junk, &mut out).unwrap(), (w, h));
    }
}
