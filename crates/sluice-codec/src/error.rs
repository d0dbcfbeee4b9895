//! Errors of the codec layer. Each says what is wrong with the image; the pipeline adds the
//! sample key and path (see the `From` impl into [`SampleErrorKind`]).

use sluice_core::SampleErrorKind;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Zero bytes.
    #[error("file is empty (0 bytes)")]
    Empty,
    /// Neither JPEG nor PNG magic bytes.
    #[error("not a JPEG or PNG image")]
    UnknownFormat,
    /// The decoder rejected the data: corrupt or truncated.
    #[error("corrupt or truncated image: {0}")]
    Corrupt(String),
    /// The header declares more pixels than `limits.max_pixels`; nothing was decoded.
    #[error("image is {width}x{height}, over the limit of {limit} pixels (limits.max_pixels)")]
    TooLarge { width: u64, height: u64, limit: u64 },
    /// A `resize` would make an image of more pixels than `limits.max_pixels` (a very thin
    /// image scaled by its shorter side); nothing was allocated for it.
    #[error("resizing makes a {width}x{height} image, over the limit of {limit} pixels (limits.max_pixels)")]
    ResizeTooLarge { width: u64, height: u64, limit: u64 },
    /// A geometric op (an expanded rotation, a pad) would make an image of more pixels than
    /// `limits.max_pixels`; nothing was allocated for it.
    #[error("`{op}` makes a {width}x{height} image, over the limit of {limit} pixels (limits.max_pixels)")]
    OpTooLarge { op: &'static str, width: u64, height: u64, limit: u64 },
    /// A valid image sluice does not decode (e.g. 12-bit JPEG).
    #[error("unsupported image: {0}")]
    Unsupported(String),
    /// The ops produced an image of the wrong size for the batch, or the output slot has the
    /// wrong length. Only an op list that skipped `PipelineSpec::validate` can cause this.
    #[error("{0}")]
    Shape(String),
    /// A `map` op's function failed on the sample (its message: for Python, the
    /// exception's type and text).
    #[error("`map` op `{op}` failed: {message}")]
    UserOp { op: String, message: String },
    /// The sample's mask is not the size of its image.
    #[error("the mask is {}x{} but its image is {}x{}; a mask must be the size of its image", mask.0, mask.1, image.0, image.1)]
    MaskSize { mask: (u32, u32), image: (u32, u32) },
    /// An op that cannot move boxes or masks (an augmentation policy) met a sample with
    /// them. Validation refuses such a spec; only an op list that skipped it gets here.
    #[error("`{op}` cannot move boxes or masks (nor can torchvision's); a sample with them cannot use it")]
    RefusesBoxes { op: &'static str },
    /// A `map` op names a function nobody registered (see `register_user_op`).
    #[error("`map` op `{0}`: {NOT_REGISTERED}")]
    UnknownUserOp(String),
}

const NOT_REGISTERED: &str = "no function is registered under this name (Python registers it when a \
     sluice.Loader is built; Rust code calls sluice_codec::register_user_op first)";

impl From<CodecError> for SampleErrorKind {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Empty => SampleErrorKind::Empty,
            CodecError::UnknownFormat => SampleErrorKind::UnknownFormat,
            CodecError::Corrupt(m) => SampleErrorKind::Corrupt(m),
            CodecError::TooLarge { width, height, limit }
            | CodecError::ResizeTooLarge { width, height, limit }
            | CodecError::OpTooLarge { width, height, limit, .. } => SampleErrorKind::TooLarge { width, height, limit },
            // The core has no "unsupported" kind; the message keeps the distinction.
            CodecError::Unsupported(m) => SampleErrorKind::Corrupt(format!("unsupported image: {m}")),
            CodecError::Shape(m) => SampleErrorKind::Shape(m),
            CodecError::UserOp { op, message } => SampleErrorKind::UserOp { op, message },
            CodecError::UnknownUserOp(op) => SampleErrorKind::UserOp { op, message: NOT_REGISTERED.into() },
            e @ CodecError::MaskSize { .. } => SampleErrorKind::BadMask(e.to_string()),
            e @ CodecError::RefusesBoxes { .. } => SampleErrorKind::Shape(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_error_maps_to_the_matching_sample_error_kind() {
        assert_eq!(SampleErrorKind::from(CodecError::Empty), SampleErrorKind::Empty);
        assert_eq!(SampleErrorKind::from(CodecError::UnknownFormat), SampleErrorKind::UnknownFormat);
        assert_eq!(SampleErrorKind::from(CodecError::Corrupt("bad".into())), SampleErrorKind::Corrupt("bad".into()));
        assert_eq!(
            SampleErrorKind::from(CodecError::TooLarge { width: 3, height: 4, limit: 5 }),
            SampleErrorKind::TooLarge { width: 3, height: 4, limit: 5 }
        );
        assert_eq!(
            SampleErrorKind::from(CodecError::ResizeTooLarge { width: 3, height: 4, limit: 5 }),
            SampleErrorKind::TooLarge { width: 3, height: 4, limit: 5 }
        );
        match SampleErrorKind::from(CodecError::Unsupported("12-bit JPEG".into())) {
            SampleErrorKind::Corrupt(m) => assert!(m.contains("unsupported") && m.contains("12-bit")),
            other => panic!("{other:?}"),
        }
        assert_eq!(SampleErrorKind::from(CodecError::Shape("s".into())), SampleErrorKind::Shape("s".into()));
    }
}
