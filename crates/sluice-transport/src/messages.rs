//! The request and reply bodies of the two peer protocols, described once. Integers are
//! little-endian. Every decoder checks what a peer says against the receiver's limits
//! before it allocates or builds anything from it.
//!
//! **`sluice-locality/1`** (the collaborative cache, `sluice-pipeline`):
//! * request: `u32` manifest position;
//! * reply: `u8` kind (0 none, 1 raw bytes, 2 decoded, 3 resized), then for images `u32`
//!   width and `u32` height, then the bytes (RGB8 HWC pixels for images). An image must
//!   be within the receiver's `max_pixels`, raw bytes within its `max_file_bytes`.
//!
//! **`sluice-rehearsal/1`** (the distributed rehearsal buffer, `sluice-stream`):
//! * request: `u32` how many samples (at most [`rehearsal::MAX_ASK`] are sent);
//! * reply: `u64` the shard's length (at most [`rehearsal::MAX_SHARD_LEN`]), then per
//!   sample `u64` id, `i64` label, `u32` image length and the encoded image bytes: up to
//!   the number asked, distinct, drawn uniformly from the shard.

/// What is wrong with a peer's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("truncated at byte {at}")]
    Truncated { at: usize },
    #[error("{len} bytes where {expected} were expected")]
    WrongLength { len: usize, expected: usize },
    #[error("unknown reply kind {0}")]
    UnknownKind(u8),
    #[error("a {width}x{height} image with {bytes} bytes of pixels")]
    ImageSize { width: u32, height: u32, bytes: usize },
    #[error("a {width}x{height} image: more than the {max} pixels allowed")]
    TooManyPixels { width: u32, height: u32, max: u64 },
    #[error("{what} of {len} bytes (at most {max})")]
    TooLarge { what: &'static str, len: u64, max: u64 },
    #[error("more than the {asked} samples asked for")]
    TooManySamples { asked: u32 },
    #[error("{samples} samples from a shard of {shard_len}")]
    MoreThanTheShard { samples: usize, shard_len: u64 },
    #[error("a shard of {0} samples")]
    AbsurdShard(u64),
    #[error("sample {id}: an empty image")]
    EmptyImage { id: u64 },
}

fn u32_at(body: &[u8], at: usize) -> Result<u32, Malformed> {
    body.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes).ok_or(Malformed::Truncated { at })
}

fn u64_at(body: &[u8], at: usize) -> Result<u64, Malformed> {
    body.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).ok_or(Malformed::Truncated { at })
}

/// A request that is one `u32`, as both protocols' are.
pub fn encode_u32(n: u32) -> [u8; 4] {
    n.to_le_bytes()
}

/// Parses a one-`u32` request.
pub fn decode_u32(body: &[u8]) -> Result<u32, Malformed> {
    let word: [u8; 4] = body.try_into().map_err(|_| Malformed::WrongLength { len: body.len(), expected: 4 })?;
    Ok(u32::from_le_bytes(word))
}

pub mod locality {
    use sluice_core::{Image, Limits, Pixels};

    use super::{u32_at, Malformed};

    pub const PROTOCOL: &str = "sluice-locality/1";

    /// What a peer sends for a sample.
    #[derive(Debug, Clone, Copy)]
    pub enum Reply<'a> {
        None,
        Raw(&'a [u8]),
        Decoded(&'a Image),
        Resized(&'a Image),
    }

    /// A received sample.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Received {
        None,
        Raw(Vec<u8>),
        Decoded(Image),
        Resized(Image),
    }

    /// The largest reply a learner with `limits` reads: an image of `max_pixels`, or raw
    /// bytes of `max_file_bytes`, with its header.
    pub fn max_reply(limits: &Limits) -> u32 {
        let image = limits.max_pixels.saturating_mul(Image::CHANNELS as u64);
        let largest = image.max(limits.max_file_bytes).saturating_add(9);
        u32::try_from(largest).unwrap_or(u32::MAX)
    }

    pub fn encode(reply: Reply<'_>) -> Vec<u8> {
        let image = |kind: u8, img: &Image| -> Vec<u8> {
            if !matches!(img.pixels, Pixels::U8(_)) {
                return vec![0]; // only u8 images travel; the peer loads the others itself
            }
            let mut body = Vec::with_capacity(9 + img.as_bytes().len());
            body.push(kind);
            body.extend_from_slice(&img.width.to_le_bytes());
            body.extend_from_slice(&img.height.to_le_bytes());
            body.extend_from_slice(img.as_bytes());
            body
        };
        match reply {
            Reply::None => vec![0],
            Reply::Raw(bytes) => {
                let mut body = Vec::with_capacity(1 + bytes.len());
                body.push(1);
                body.extend_from_slice(bytes);
                body
            }
            Reply::Decoded(img) => image(2, img),
            Reply::Resized(img) => image(3, img),
        }
    }

    /// Parses a reply, with the same limits as the receiver's own decodes.
    pub fn decode(body: &[u8], limits: &Limits) -> Result<Received, Malformed> {
        let (&kind, rest) = body.split_first().ok_or(Malformed::Truncated { at: 0 })?;
        let image = |rest: &[u8]| -> Result<Image, Malformed> {
            let (width, height) = (u32_at(rest, 0)?, u32_at(rest, 4)?);
            let pixels = &rest[8..];
            let count = u64::from(width) * u64::from(height); // u32 × u32 fits a u64
            if count > limits.max_pixels {
                return Err(Malformed::TooManyPixels { width, height, max: limits.max_pixels });
            }
            let expected = count.checked_mul(Image::CHANNELS as u64);
            if count == 0 || expected != Some(pixels.len() as u64) {
                return Err(Malformed::ImageSize { width, height, bytes: pixels.len() });
            }
            Ok(Image::rgb8(width, height, pixels.to_vec()))
        };
        Ok(match kind {
            0 if rest.is_empty() => Received::None,
            0 => return Err(Malformed::WrongLength { len: body.len(), expected: 1 }),
            1 => {
                if rest.len() as u64 > limits.max_file_bytes {
                    return Err(Malformed::TooLarge {
                        what: "raw sample",
                        len: rest.len() as u64,
                        max: limits.max_file_bytes,
                    });
                }
                Received::Raw(rest.to_vec())
            }
            2 => Received::Decoded(image(rest)?),
            3 => Received::Resized(image(rest)?),
            k => return Err(Malformed::UnknownKind(k)),
        })
    }
}

pub mod rehearsal {
    use super::{u32_at, u64_at, Malformed};

    pub const PROTOCOL: &str = "sluice-rehearsal/1";
    /// Most samples one request gets.
    pub const MAX_ASK: u32 = 1024;
    /// Largest shard length a peer may report: the sum over every learner still fits a u64.
    pub const MAX_SHARD_LEN: u64 = 1 << 40;
    /// Bytes of a reply besides the images: the shard length, and per sample id, label, length.
    const HEADER: usize = 8;
    const PER_SAMPLE: usize = 8 + 8 + 4;

    /// A sample of a peer's shard.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Sample {
        pub id: u64,
        pub label: i64,
        pub image: Vec<u8>,
    }

    /// The largest reply to a request for `asked` samples of at most `max_image` bytes.
    pub fn max_reply(asked: u32, max_image: u64) -> u32 {
        let per = (PER_SAMPLE as u64).saturating_add(max_image);
        let largest = (HEADER as u64).saturating_add(u64::from(asked.min(MAX_ASK)).saturating_mul(per));
        u32::try_from(largest).unwrap_or(u32::MAX)
    }

    /// A reply: the shard's length and `(id, label, image)` per sample.
    pub fn encode<'a>(shard_len: u64, samples: impl IntoIterator<Item = (u64, i64, &'a [u8])>) -> Vec<u8> {
        let mut body = shard_len.to_le_bytes().to_vec();
        for (id, label, image) in samples {
            // An image past u32 cannot be framed; the frame writer refuses the whole reply.
            let len = u32::try_from(image.len()).unwrap_or(u32::MAX);
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&label.to_le_bytes());
            body.extend_from_slice(&len.to_le_bytes());
            body.extend_from_slice(image);
        }
        body
    }

    /// Parses a reply to a request for `asked` samples, each image at most `max_image` bytes.
    pub fn decode(body: &[u8], asked: u32, max_image: u64) -> Result<(u64, Vec<Sample>), Malformed> {
        let shard_len = u64_at(body, 0)?;
        if shard_len > MAX_SHARD_LEN {
            return Err(Malformed::AbsurdShard(shard_len));
        }
        let mut at = HEADER;
        let mut samples = Vec::new();
        while at < body.len() {
            if samples.len() as u64 >= u64::from(asked.min(MAX_ASK)) {
                return Err(Malformed::TooManySamples { asked: asked.min(MAX_ASK) });
            }
            let id = u64_at(body, at)?;
            let label = u64_at(body, at + 8)? as i64;
            let len = u32_at(body, at + 16)?;
            if u64::from(len) > max_image {
                return Err(Malformed::TooLarge { what: "a rehearsal image", len: len.into(), max: max_image });
            }
            if len == 0 {
                return Err(Malformed::EmptyImage { id });
            }
            at += PER_SAMPLE;
            let image = body.get(at..at + len as usize).ok_or(Malformed::Truncated { at: body.len() })?;
            at += len as usize;
            samples.push(Sample { id, label, image: image.to_vec() });
        }
        if samples.len() as u64 > shard_len {
            return Err(Malformed::MoreThanTheShard { samples: samples.len(), shard_len });
        }
        Ok((shard_len, samples))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sluice_core::{Image, Limits};

    use super::*;

    #[test]
    fn locality_replies_round_trip_and_malformed_ones_are_refused() {
        let limits = Limits::default();
        let img = Image::rgb8(2, 1, vec![1, 2, 3, 4, 5, 6]);
        let raw = [9u8, 8];
        for (reply, back) in [
            (locality::Reply::Raw(&raw), locality::Received::Raw(raw.to_vec())),
            (locality::Reply::Decoded(&img), locality::Received::Decoded(img.clone())),
            (locality::Reply::Resized(&img), locality::Received::Resized(img.clone())),
            (locality::Reply::None, locality::Received::None),
        ] {
            assert_eq!(locality::decode(&locality::encode(reply), &limits), Ok(back));
        }
        let bad = |body: &[u8]| locality::decode(body, &limits).unwrap_err().to_string();
        assert_eq!(bad(&[2, 2, 0, 0, 0, 1, 0, 0, 0, 7]), "a 2x1 image with 1 bytes of pixels");
        assert_eq!(bad(&[2, 0, 0, 0, 0, 0, 0, 0, 0]), "a 0x0 image with 0 bytes of pixels");
        assert_eq!(bad(&[]), "truncated at byte 0");
        assert_eq!(bad(&[9]), "unknown reply kind 9");
        assert_eq!(bad(&[2, 1, 0]), "truncated at byte 0");
    }

    /// Issue 29 item 6: `w * h * 3` wrapped (a release build then handed fast_image_resize
    /// a 2-byte "image" of billions of pixels) and peer images skipped `max_pixels`.
    #[test]
    fn a_peer_image_is_checked_with_checked_arithmetic_and_max_pixels() {
        // u32::MAX² × 3 overflows a u64 (a debug build panicked, a release build wrapped).
        let mut body = vec![2];
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        body.extend_from_slice(&[1, 2]);
        let unlimited =
            Limits { max_pixels: u64::MAX, max_file_bytes: u64::MAX, max_boxes: u64::MAX, max_field_bytes: u64::MAX };
        assert!(matches!(locality::decode(&body, &unlimited), Err(Malformed::ImageSize { .. })));

        let limits = Limits { max_pixels: 100, ..Limits::default() };
        let big = Image::rgb8(20, 10, vec![0; 600]);
        assert_eq!(
            locality::decode(&locality::encode(locality::Reply::Decoded(&big)), &limits),
            Err(Malformed::TooManyPixels { width: 20, height: 10, max: 100 })
        );
        let small = Limits { max_file_bytes: 1, ..Limits::default() };
        assert!(matches!(locality::decode(&[1, 5, 5], &small), Err(Malformed::TooLarge { len: 2, max: 1, .. })));
    }

    #[test]
    fn rehearsal_replies_round_trip_and_bad_ones_are_refused() {
        let images: Vec<Vec<u8>> = (0..3).map(|i| vec![7; 5 + i]).collect();
        let samples = || images.iter().enumerate().map(|(i, im)| (i as u64, i as i64 - 1, im.as_slice()));
        let body = rehearsal::encode(40, samples());
        let (len, back) = rehearsal::decode(&body, 3, 100).unwrap();
        assert_eq!(len, 40);
        assert_eq!(
            back.iter().map(|s| (s.id, s.label, s.image.len())).collect::<Vec<_>>(),
            [(0, -1, 5), (1, 0, 6), (2, 1, 7)]
        );
        let bad = |body: &[u8], asked, max| rehearsal::decode(body, asked, max).unwrap_err().to_string();
        assert_eq!(bad(&body, 2, 100), "more than the 2 samples asked for");
        assert_eq!(bad(&body, 3, 6), "a rehearsal image of 7 bytes (at most 6)");
        assert_eq!(bad(&body[..body.len() - 1], 3, 100), format!("truncated at byte {}", body.len() - 1));
        assert_eq!(bad(&rehearsal::encode(1, samples()), 3, 100), "3 samples from a shard of 1");
        assert_eq!(bad(&[1, 2, 3], 3, 100), "truncated at byte 0");
    }

    /// Issue 29: a peer's shard length was unbounded; the loader sums them (a u64::MAX
    /// overflowed that sum).
    #[test]
    fn an_absurd_shard_length_is_refused() {
        let body = rehearsal::encode(u64::MAX, std::iter::empty());
        assert_eq!(rehearsal::decode(&body, 4, 100), Err(Malformed::AbsurdShard(u64::MAX)));
        assert_eq!(rehearsal::max_reply(u32::MAX, u64::MAX), u32::MAX);
        assert_eq!(rehearsal::max_reply(2, 10), 8 + 2 * 30);
    }
}
