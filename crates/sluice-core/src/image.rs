//! The image that flows between ops: RGB, u8 or f32, interleaved (HWC) or planar (CHW).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Height, width, channels: interleaved RGB, what decoders produce.
    #[default]
    Hwc,
    /// Channels, height, width: planar, what most torch models take.
    Chw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    #[default]
    U8,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F32 => 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    U8(Vec<u8>),
    F32(Vec<f32>),
}

impl Pixels {
    pub fn dtype(&self) -> DType {
        match self {
            Pixels::U8(_) => DType::U8,
            Pixels::F32(_) => DType::F32,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Pixels::U8(v) => v.len(),
            Pixels::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An RGB image (3 channels).
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub layout: Layout,
    pub pixels: Pixels,
}

impl Image {
    pub const CHANNELS: usize = 3;

    /// An interleaved u8 RGB image; `data.len()` must be `width * height * 3`.
    pub fn rgb8(width: u32, height: u32, data: Vec<u8>) -> Self {
        debug_assert_eq!(data.len(), width as usize * height as usize * Self::CHANNELS);
        Self { width, height, layout: Layout::Hwc, pixels: Pixels::U8(data) }
    }

    pub fn dtype(&self) -> DType {
        self.pixels.dtype()
    }

    /// The tensor shape this image has in its layout.
    pub fn shape(&self) -> [usize; 3] {
        let (h, w, c) = (self.height as usize, self.width as usize, Self::CHANNELS);
        match self.layout {
            Layout::Hwc => [h, w, c],
            Layout::Chw => [c, h, w],
        }
    }

    /// Raw bytes in native endianness, for copying into a batch buffer.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.pixels {
            Pixels::U8(v) => v,
            Pixels::F32(v) => {
                // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4) }
            }
        }
    }
}
