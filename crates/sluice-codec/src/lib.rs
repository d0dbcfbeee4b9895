//! Image decoding and the op library.
//!
//! * [`jpeg`]: libjpeg-turbo (TurboJPEG 3) decoding, including crop-window decodes with DCT
//!   scaling, so a crop never decodes pixels it throws away.
//! * [`png`](mod@png): PNG to RGB8.
//! * [`resize`]: antialiased bilinear resize of a (fractional) source rectangle.
//! * [`crop`]: torchvision's RandomResizedCrop and CenterCrop geometry.
//! * [`plan`]: the op library: a validated op list compiled into steps, with decode fused
//!   into the crop that follows it.
//! * `ops` (private): the colour and geometric ops the plan runs after decode, with
//!   torchvision v2 semantics.
//! * [`encode`]: JPEG encoding, for dataset generators and test fixtures.
//! * [`user_op`]: the `map` op's registry of user functions ([`UserOp`]), the escape hatch
//!   for Rust crates and the Python binding's `Pipeline.map`.
//! * [`transcode`]: lossless rewriting with restart markers (`sluice pack`), which lets a crop
//!   decode only its own MCUs (the private `restart` module).

#[cfg(test)]
mod alloc_probe;
pub mod boxes;
pub mod crop;
pub mod encode;
mod entropy_index;
pub mod error;
mod handle;
mod huffman;
pub mod index_store;
pub mod jpeg;
mod masks;
mod ops;
pub mod plan;
pub mod png;
pub mod resize;
mod restart;
pub mod transcode;
pub mod user_op;
mod window;

pub use boxes::{move_boxes, Motion};
pub use crop::{center_crop_window, random_resized_crop_params, CenterCropWindow, CropRect};
pub use encode::{encode_jpeg, encode_jpeg_optimized, encode_jpeg_progressive, encode_jpeg_with, SourcePixels};
pub use error::CodecError;
pub use index_store::{IndexStats, IndexStore};
pub use jpeg::{ColorSpace, JpegDecoder, JpegHeader, RegionDecode, Subsampling};
pub use masks::resize_mask;
pub use ops::policy::{run_op as run_policy_op, space as policy_space, PolicyOp, Space as PolicySpace};
pub use plan::{image_size, sniff_format, ImageFormat, Plan, Records, Scratch, StepProbe};
pub use png::{decode_png, decode_png_mask, encode_png_mask};
pub use resize::{Resample, Resizer, SubRect};
pub use transcode::add_restart_markers;
pub use user_op::{register_user_op, user_op, ImageRef, SampleInfo, UserOp, UserOpError};
