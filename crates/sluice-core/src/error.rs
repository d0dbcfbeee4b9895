//! Errors of the core layer: a spec that does not make sense, and a sample that could not be
//! turned into pixels. Both carry what a user needs to find the culprit.

use std::fmt;
use std::path::PathBuf;

use crate::manifest::SampleKey;

/// A pipeline spec that cannot be parsed or does not make sense. `field` is the path of the
/// offending field, e.g. `ops[2].size`, so the user knows what to fix.
#[derive(Debug, thiserror::Error)]
#[error("invalid pipeline spec at `{field}`: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// The pipeline stage at which a sample failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Read,
    Decode,
    Transform,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Read => "read",
            Stage::Decode => "decode",
            Stage::Transform => "transform",
        })
    }
}

/// Why a sample failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleErrorKind {
    /// The file or member does not exist.
    Missing,
    /// Any other I/O failure (permissions, short read...).
    Io(String),
    /// Zero bytes.
    Empty,
    /// The bytes are not an image format sluice knows.
    UnknownFormat,
    /// The decoder rejected the data (corrupt or truncated).
    Corrupt(String),
    /// The header declares more pixels (or bytes) than the configured limit.
    TooLarge { width: u64, height: u64, limit: u64 },
    /// The decoded image does not fit the op (e.g. batch shapes differ).
    Shape(String),
    /// Not read on purpose: not a regular file, or outside the roots reads are confined to.
    Refused(String),
    /// sluice itself panicked on this sample: a bug, caught so the run does not hang.
    Panicked(String),
    /// A `map` op's user function failed (for Python, `message` is the exception's type
    /// and text).
    UserOp { op: String, message: String },
    /// The sample's boxes could not be read (malformed JSON, a NaN coordinate, too many).
    BadAnnotation(String),
    /// The sample's segmentation mask could not be read or does not fit its image (a
    /// missing or undecodable mask file, a size other than the image's).
    BadMask(String),
    /// One of the sample's metadata fields is missing or not of its kind (the message
    /// names the field and what was found).
    BadField(String),
}

impl fmt::Display for SampleErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SampleErrorKind::Missing => f.write_str("file not found"),
            SampleErrorKind::Io(m) => write!(f, "I/O error: {m}"),
            SampleErrorKind::Empty => f.write_str("file is empty (0 bytes)"),
            SampleErrorKind::UnknownFormat => f.write_str("not a JPEG or PNG image"),
            SampleErrorKind::Corrupt(m) => write!(f, "corrupt or truncated image: {m}"),
            SampleErrorKind::TooLarge { width, height, limit } => write!(
                f,
                "image is {width}x{height} = {} pixels, over the limit of {limit} (limits.max_pixels)",
                width * height
            ),
            SampleErrorKind::Shape(m) => write!(f, "{m}"),
            SampleErrorKind::Refused(m) => write!(f, "refused: {m}"),
            SampleErrorKind::Panicked(m) => write!(f, "sluice panicked on this sample (a bug, please report it): {m}"),
            SampleErrorKind::UserOp { op, message } => write!(f, "`map` op `{op}` failed: {message}"),
            SampleErrorKind::BadAnnotation(m) => write!(f, "bad boxes: {m}"),
            SampleErrorKind::BadMask(m) => write!(f, "bad mask (field `mask`): {m}"),
            SampleErrorKind::BadField(m) => write!(f, "bad field: {m}"),
        }
    }
}

/// A sample that could not be produced. Carries its key and path: the message alone is
/// enough to find and fix the file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("sample {key} ({}) failed at {stage}: {kind}", path.display())]
pub struct SampleError {
    pub key: SampleKey,
    pub path: PathBuf,
    pub stage: Stage,
    pub kind: SampleErrorKind,
}
