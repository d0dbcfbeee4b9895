//! The MCU grid of a JPEG and the windows of whole MCUs that can be cut out of it: what
//! the two ways of seeking into a file ([`crate::restart`], [`crate::entropy_index`])
//! share.

/// A window of whole MCUs, in MCU units: columns `c0..c1`, rows `r0..r1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct McuWindow {
    pub c0: u32,
    pub c1: u32,
    pub r0: u32,
    pub r1: u32,
}

/// An image's MCUs and the columns a cut may start at (every `step`-th).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    pub width: u32,
    pub height: u32,
    /// MCU size in pixels, and MCUs per row and column.
    pub mcu: (u32, u32),
    pub mcus: (u32, u32),
    pub step: u32,
}

impl Grid {
    /// The grid of a `width x height` image with `mcu`-pixel MCUs.
    pub(crate) fn new(width: u32, height: u32, mcu: (u32, u32), step: u32) -> Self {
        Self { width, height, mcu, mcus: (width.div_ceil(mcu.0), height.div_ceil(mcu.1)), step }
    }

    /// The smallest step-aligned window of whole MCUs that covers the pixels
    /// `x0..x1, y0..y1` (clamped to the image); it ends at a step or at the row's end.
    pub(crate) fn window_covering(&self, x0: u32, y0: u32, x1: u32, y1: u32) -> McuWindow {
        let (mw, mh) = self.mcu;
        let step = self.step;
        let c0 = (x0.min(self.width - 1) / mw) / step * step;
        let c1 = (x1.clamp(1, self.width).div_ceil(mw)).div_ceil(step) * step;
        let r0 = y0.min(self.height - 1) / mh;
        let r1 = y1.clamp(1, self.height).div_ceil(mh);
        McuWindow { c0, c1: c1.min(self.mcus.0), r0, r1: r1.max(r0 + 1).min(self.mcus.1) }
    }

    /// Whether cutting `w` out saves anything over decoding the file as it is.
    pub(crate) fn is_whole(&self, w: McuWindow) -> bool {
        w.c0 == 0 && w.c1 == self.mcus.0 && w.r0 == 0
    }

    /// The window's pixel origin in the full image.
    pub(crate) fn origin(&self, w: McuWindow) -> (u32, u32) {
        (w.c0 * self.mcu.0, w.r0 * self.mcu.1)
    }

    /// The window's size in pixels (the image's edge cuts the last MCUs).
    pub(crate) fn pixels(&self, w: McuWindow) -> (u32, u32) {
        let (ox, oy) = self.origin(w);
        ((w.c1 * self.mcu.0).min(self.width) - ox, (w.r1 * self.mcu.1).min(self.height) - oy)
    }
}

/// Writes the frame header segment `sof` (marker included) with the size `(w, h)`.
pub(crate) fn push_sof_with_size(out: &mut Vec<u8>, sof: &[u8], (w, h): (u32, u32)) {
    out.extend_from_slice(&sof[..5]);
    out.extend_from_slice(&(h as u16).to_be_bytes());
    out.extend_from_slice(&(w as u16).to_be_bytes());
    out.extend_from_slice(&sof[9..]);
}
