//! Batches to and from their wire form. u8 pixels move without a copy; f32 pixels are
//! reinterpreted as little-endian bytes. Pixels travel as they are or, when the client
//! asks, compressed: each byte minus the same byte of the previous pixel (so smooth areas
//! become runs of small values), then zstd level 1 (plain LZ4 left augmented pixels the
//! same size; see BENCHMARKS).

use sluice_core::{Batch, BatchBoxes, BatchField, BatchFields, FieldValues, Layout, Tensor, TensorData};

use crate::error::ClientError;
use crate::proto::{self, BatchMasks, BatchMessage, BatchTargets, BatchTrace, SkippedSample};
use crate::MAX_MESSAGE_BYTES;

/// How pixels travel from workers to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Raw bytes: the fastest on loopback and fast networks.
    #[default]
    None,
    /// Delta filter + zstd level 1: fewer bytes for CPU on both ends; pays only on links
    /// slower than the compressor (see BENCHMARKS).
    Zstd,
}

/// zstd's fastest level: the worker's CPU is what the loader is short of.
const ZSTD_LEVEL: i32 = 1;

impl Compression {
    /// `"none"` or `"zstd"`.
    pub fn parse(name: &str) -> Result<Self, ClientError> {
        match name {
            "none" => Ok(Self::None),
            "zstd" => Ok(Self::Zstd),
            other => {
                Err(ClientError::InvalidArgument(format!("unknown compression {other:?} (use \"none\" or \"zstd\")")))
            }
        }
    }

    pub fn to_wire(self) -> i32 {
        match self {
            Self::None => proto::Compression::None.into(),
            Self::Zstd => proto::Compression::Zstd.into(),
        }
    }

    pub fn from_wire(code: i32) -> Result<Self, ClientError> {
        match proto::Compression::try_from(code) {
            Ok(proto::Compression::None) => Ok(Self::None),
            Ok(proto::Compression::Zstd) => Ok(Self::Zstd),
            Err(_) => Err(ClientError::InvalidArgument(format!("unknown compression code {code}"))),
        }
    }
}

/// A batch as it leaves a worker: its pixels as they are, or compressed (done on the
/// producing thread, so the network side only copies bytes).
pub struct Outgoing {
    batch: Batch,
    packed: Option<Vec<u8>>,
    skipped: Vec<SkippedSample>,
    /// Its times on the worker, when the client traces; `sent_ns` is stamped as the header
    /// is made, just before the batch goes out.
    trace: Option<BatchTrace>,
}

impl Outgoing {
    pub fn new(batch: Batch, compression: Compression) -> Self {
        let packed = match compression {
            Compression::None => None,
            Compression::Zstd => {
                let stride = delta_stride(&batch.images.shape, batch.layout, batch.images.dtype().size());
                let filtered = delta(batch.images.as_bytes(), stride);
                // Should compressing ever fail, the pixels go as they are (the header says so).
                zstd::bulk::compress(&filtered, ZSTD_LEVEL)
                    .inspect_err(
                        |e| tracing::warn!(batch = batch.index, error = %e, "zstd failed; sending uncompressed"),
                    )
                    .ok()
            }
        };
        Self { batch, packed, skipped: Vec::new(), trace: None }
    }

    /// With the samples of the batch the worker skipped (`on_error = "skip"`).
    pub fn with_skipped(mut self, skipped: Vec<SkippedSample>) -> Self {
        self.skipped = skipped;
        self
    }

    /// With the batch's times on the worker (the client traces).
    pub fn with_trace(mut self, trace: BatchTrace) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The trace times as they go out: sent now.
    fn trace_now(&self) -> Option<BatchTrace> {
        self.trace.map(|t| BatchTrace { sent_ns: sluice_pipeline::trace::now_ns(), ..t })
    }

    /// The bytes that travel for the pixels.
    pub fn payload(&self) -> &[u8] {
        self.packed.as_deref().unwrap_or_else(|| self.batch.images.as_bytes())
    }

    /// The batch's columns without its pixels; with `masks_in_body` (the request asked for
    /// it), without its masks' bytes too: they follow the pixels ([`Outgoing::masks`]).
    pub fn header(&self, masks_in_body: bool) -> BatchMessage {
        let compression = if self.packed.is_some() { Compression::Zstd } else { Compression::None };
        BatchMessage {
            skipped: self.skipped.clone(),
            trace: self.trace_now(),
            ..header(&self.batch, compression, masks_in_body)
        }
    }

    /// The bytes of the batch's masks (empty without masks): a data-plane frame whose
    /// request asked for `masks_in_body` carries them after the pixels.
    pub fn masks(&self) -> &[u8] {
        self.batch.boxes.as_ref().and_then(|b| b.masks.as_ref()).map_or(&[], |m| m.as_bytes())
    }

    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// The batch, its pixels as they were produced.
    pub fn into_batch(self) -> Batch {
        self.batch
    }

    /// The whole message, for gRPC.
    pub fn into_message(self) -> BatchMessage {
        let trace = self.trace_now();
        let skipped = self.skipped;
        match self.packed {
            None => BatchMessage { skipped, trace, ..batch_to_message(self.batch) },
            Some(packed) => {
                BatchMessage { data: packed, skipped, trace, ..header(&self.batch, Compression::Zstd, false) }
            }
        }
    }
}

/// Bytes from one pixel to the next along a row: the delta filter's distance.
fn delta_stride(shape: &[usize], layout: Layout, width: usize) -> usize {
    match layout {
        Layout::Hwc => shape.last().copied().unwrap_or(1).max(1) * width,
        Layout::Chw => width,
    }
}

/// Each byte minus the byte `stride` before it (wrapping); the first `stride` kept.
fn delta(bytes: &[u8], stride: usize) -> Vec<u8> {
    let head = stride.min(bytes.len());
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..head]);
    // Zipped slices: no bounds checks, so the loop vectorizes.
    out.extend(bytes[head..].iter().zip(bytes).map(|(b, prev)| b.wrapping_sub(*prev)));
    out
}

/// Inverts [`delta`] in place.
fn undelta(bytes: &mut [u8], stride: usize) {
    if stride == 0 || bytes.len() <= stride {
        return;
    }
    let (head, rest) = bytes.split_at_mut(stride);
    let mut prev = head.to_vec();
    for pixel in rest.chunks_mut(stride) {
        for (x, p) in pixel.iter_mut().zip(prev.iter_mut()) {
            *x = x.wrapping_add(*p);
            *p = *x;
        }
    }
}

fn header(b: &Batch, compression: Compression, masks_in_body: bool) -> BatchMessage {
    BatchMessage {
        epoch: b.epoch,
        index: b.index,
        keys: b.keys.clone(),
        labels: b.labels.clone(),
        shape: b.images.shape.iter().map(|&d| d as u64).collect(),
        dtype: match b.images.data {
            TensorData::U8(_) | TensorData::SharedU8(_) => proto::Dtype::U8.into(),
            TensorData::F32(_) => proto::Dtype::F32.into(),
        },
        layout: match b.layout {
            Layout::Hwc => proto::Layout::Hwc.into(),
            Layout::Chw => proto::Layout::Chw.into(),
        },
        data: Vec::new(),
        has_weights: b.weights.is_some(),
        weights: b.weights.clone().unwrap_or_default(),
        compression: compression.to_wire(),
        skipped: Vec::new(),
        trace: None,
        targets: b.boxes.as_deref().map(|t| targets_to_message(t, masks_in_body)),
        fields: b.fields.as_deref().map(fields_to_message).unwrap_or_default(),
    }
}

/// A batch's metadata fields as they travel.
fn fields_to_message(f: &BatchFields) -> Vec<proto::BatchField> {
    f.fields
        .iter()
        .map(|f| {
            let mut m = proto::BatchField { name: f.name.clone(), ..Default::default() };
            match &f.values {
                FieldValues::Float(v) => {
                    m.kind = proto::FieldKind::Float.into();
                    m.floats = v.clone();
                }
                FieldValues::Int(v) => {
                    m.kind = proto::FieldKind::Int.into();
                    m.ints = v.clone();
                }
                FieldValues::MultiHot { classes, values } => {
                    m.kind = proto::FieldKind::MultiLabel.into();
                    m.classes = *classes as u64;
                    m.floats = values.clone();
                }
                FieldValues::Text(v) => {
                    m.kind = proto::FieldKind::Text.into();
                    m.texts = v.clone();
                }
                FieldValues::Json(v) => {
                    m.kind = proto::FieldKind::Json.into();
                    m.texts = v.clone();
                }
            }
            m
        })
        .collect()
}

/// A batch's metadata fields from the wire, checked against its `n` samples: one value
/// per sample (`classes` per sample for a multi-label field), the kind known.
fn message_to_fields(fields: Vec<proto::BatchField>, n: usize, what: &str) -> Result<BatchFields, ClientError> {
    let mut out = Vec::with_capacity(fields.len());
    for f in fields {
        let bad = |why: String| ClientError::BadBatch(format!("{what}: field `{}`: {why}", f.name));
        let kind = proto::FieldKind::try_from(f.kind).map_err(|_| bad(format!("unknown kind {}", f.kind)))?;
        let count = |len: usize, per: usize| -> Result<(), ClientError> {
            if Some(len) == n.checked_mul(per) {
                Ok(())
            } else {
                Err(bad(format!("{len} values for {n} samples of {per}")))
            }
        };
        let values = match kind {
            proto::FieldKind::Float => {
                count(f.floats.len(), 1)?;
                FieldValues::Float(f.floats)
            }
            proto::FieldKind::Int => {
                count(f.ints.len(), 1)?;
                FieldValues::Int(f.ints)
            }
            proto::FieldKind::MultiLabel => {
                let classes = usize::try_from(f.classes)
                    .ok()
                    .filter(|&c| c > 0 && c as u64 <= sluice_core::fields::MAX_FIELD_CLASSES)
                    .ok_or_else(|| bad(format!("{} classes", f.classes)))?;
                count(f.floats.len(), classes)?;
                FieldValues::MultiHot { classes, values: f.floats }
            }
            proto::FieldKind::Text => {
                count(f.texts.len(), 1)?;
                FieldValues::Text(f.texts)
            }
            proto::FieldKind::Json => {
                count(f.texts.len(), 1)?;
                FieldValues::Json(f.texts)
            }
        };
        out.push(BatchField { name: f.name, values });
    }
    Ok(BatchFields { fields: out })
}

fn targets_to_message(b: &BatchBoxes, masks_in_body: bool) -> BatchTargets {
    BatchTargets {
        max_boxes: b.max_boxes as u64,
        boxes: b.boxes.iter().flat_map(|v| v.to_le_bytes()).collect(),
        labels: b.labels.clone(),
        counts: b.counts.clone(),
        masks: b.masks.as_ref().map(|m| masks_to_message(m, masks_in_body)),
    }
}

/// A batch's `[n, h, w]` u8 masks as they travel: their bytes in the message, or (`in_body`)
/// only their length, the bytes following the pixels in the data-plane frame.
fn masks_to_message(m: &Tensor, in_body: bool) -> BatchMasks {
    let dim = |i: usize| m.shape.get(i).and_then(|&d| u32::try_from(d).ok()).unwrap_or(0);
    let (data, body_bytes) = match in_body {
        true => (Vec::new(), m.as_bytes().len() as u64),
        false => (m.as_bytes().to_vec(), 0),
    };
    BatchMasks { height: dim(1), width: dim(2), data, body_bytes }
}

/// A data-plane batch header (a `BatchMessage` without its pixels) from its bytes.
pub fn decode_header(head: &[u8]) -> Result<BatchMessage, ClientError> {
    use prost::Message;
    BatchMessage::decode(head).map_err(|e| ClientError::BadBatch(format!("malformed batch header: {e}")))
}

/// How many bytes of masks follow a data-plane batch's pixels, as its header says (0: none,
/// or they are in the header), at most [`MAX_MESSAGE_BYTES`]: read no more than that.
pub fn masks_body_len(m: &BatchMessage) -> Result<usize, ClientError> {
    let Some(masks) = m.targets.as_ref().and_then(|t| t.masks.as_ref()) else { return Ok(0) };
    let bad = |why: String| ClientError::BadBatch(format!("batch {} of epoch {}: {why}", m.index, m.epoch));
    if masks.body_bytes > MAX_MESSAGE_BYTES as u64 {
        return Err(bad(format!("{} mask bytes are over the limit of {MAX_MESSAGE_BYTES}", masks.body_bytes)));
    }
    if masks.body_bytes > 0 && !masks.data.is_empty() {
        return Err(bad(format!(
            "masks both in the header ({} bytes) and after the pixels ({} bytes)",
            masks.data.len(),
            masks.body_bytes
        )));
    }
    Ok(masks.body_bytes as usize)
}

/// A data-plane batch from its header, pixels and the masks that followed them (read as
/// [`masks_body_len`] said), checked as [`message_to_received`] checks it.
pub fn frame_to_received(mut m: BatchMessage, pixels: Vec<u8>, masks: Vec<u8>) -> Result<Received, ClientError> {
    let announced = masks_body_len(&m)?;
    if announced != masks.len() {
        return Err(ClientError::BadBatch(format!(
            "batch {} of epoch {}: {} mask bytes after the pixels where the header says {announced}",
            m.index,
            m.epoch,
            masks.len()
        )));
    }
    if let Some(header_masks) = m.targets.as_mut().and_then(|t| t.masks.as_mut()) {
        if header_masks.body_bytes > 0 {
            header_masks.data = masks;
        }
    }
    m.data = pixels;
    message_to_received(m)
}

/// A batch's masks from the wire, checked against its `n` samples of `size` (height,
/// width), the output images' size: each sample's mask is the size of its image.
fn message_to_masks(m: BatchMasks, n: usize, size: (usize, usize), what: &str) -> Result<Tensor, ClientError> {
    let (h, w) = (m.height as usize, m.width as usize);
    // Masks announced in the frame's body arrive there (`frame_to_received`); any other
    // path (gRPC) carries them in the message.
    if m.body_bytes != 0 && m.body_bytes != m.data.len() as u64 {
        return Err(ClientError::BadBatch(format!(
            "{what}: {} mask bytes announced after the pixels, {} came",
            m.body_bytes,
            m.data.len()
        )));
    }
    if (h, w) != size {
        return Err(ClientError::BadBatch(format!(
            "{what}: masks of {h}x{w} for images of {}x{} (height x width)",
            size.0, size.1
        )));
    }
    // `h * w` fits: it is the images' own size, whose bytes were counted already.
    if Some(m.data.len()) != n.checked_mul(h * w) {
        return Err(ClientError::BadBatch(format!("{what}: {} mask bytes for {n} masks of {h}x{w}", m.data.len())));
    }
    Ok(Tensor { shape: vec![n, h, w], data: TensorData::U8(m.data) })
}

/// A batch's targets from the wire, checked against its `n` samples: every length as the
/// padding implies, each count within `0..=max_boxes`.
fn message_to_targets(t: BatchTargets, n: usize, size: (usize, usize), what: &str) -> Result<BatchBoxes, ClientError> {
    let bad = |why: String| ClientError::BadBatch(format!("{what}: {why}"));
    let max_boxes = usize::try_from(t.max_boxes).map_err(|_| bad(format!("max_boxes {}", t.max_boxes)))?;
    let rows = n.checked_mul(max_boxes).ok_or_else(|| bad(format!("{n} samples of {max_boxes} boxes")))?;
    if t.counts.len() != n || t.labels.len() != rows || t.boxes.len() != rows.saturating_mul(16) {
        return Err(bad(format!(
            "targets of {} counts, {} labels and {} box bytes for {n} samples of {max_boxes} boxes",
            t.counts.len(),
            t.labels.len(),
            t.boxes.len()
        )));
    }
    if let Some(c) = t.counts.iter().find(|&&c| c < 0 || c as u64 > t.max_boxes) {
        return Err(bad(format!("a sample with {c} boxes of {max_boxes}")));
    }
    let masks = t.masks.map(|m| message_to_masks(m, n, size, what)).transpose()?;
    let boxes = t.boxes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(BatchBoxes { max_boxes, boxes, labels: t.labels, counts: t.counts, masks })
}

pub fn batch_to_message(batch: Batch) -> BatchMessage {
    let head = header(&batch, Compression::None, false);
    let data = match batch.images.data {
        TensorData::U8(v) => v,
        TensorData::SharedU8(s) => s.as_slice().to_vec(),
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    BatchMessage { data, ..head }
}

/// A batch as it reaches a client, with the samples of it the worker skipped.
#[derive(Debug)]
pub struct Received {
    pub batch: Batch,
    pub skipped: Vec<SkippedSample>,
    /// Its times on the worker, when the client asked for them.
    pub trace: Option<BatchTrace>,
}

/// [`message_to_batch`], keeping the batch's skipped samples (no more than it had slots).
pub fn message_to_received(mut m: BatchMessage) -> Result<Received, ClientError> {
    let skipped = std::mem::take(&mut m.skipped);
    let trace = m.trace.take();
    let batch = message_to_batch(m)?;
    if let Some(t) = &trace {
        check_trace(t, &batch)?;
    }
    if skipped.len() > MAX_SKIPPED_PER_BATCH {
        return Err(ClientError::BadBatch(format!(
            "batch {} of epoch {}: {} skipped samples",
            batch.index,
            batch.epoch,
            skipped.len()
        )));
    }
    Ok(Received { batch, skipped, trace })
}

/// A batch's worker times must come in order: request received and batch built before it
/// was sent (a build span of 0..0 is unknown).
fn check_trace(t: &BatchTrace, batch: &Batch) -> Result<(), ClientError> {
    let built_known = (t.built_start_ns, t.built_end_ns) != (0, 0);
    if t.request_received_ns > t.sent_ns
        || (built_known && (t.built_start_ns > t.built_end_ns || t.built_end_ns > t.sent_ns))
    {
        return Err(ClientError::BadBatch(format!(
            "batch {} of epoch {}: trace times out of order (request received {}, built {}..{}, sent {} ns)",
            batch.index, batch.epoch, t.request_received_ns, t.built_start_ns, t.built_end_ns, t.sent_ns
        )));
    }
    Ok(())
}

/// More skipped samples than any batch could hold is a broken worker.
const MAX_SKIPPED_PER_BATCH: usize = 1 << 20;

pub fn message_to_batch(mut m: BatchMessage) -> Result<Batch, ClientError> {
    let shape: Vec<usize> = m.shape.iter().map(|&d| d as usize).collect();
    let elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(elements) = elements else {
        return Err(ClientError::BadBatch(format!("shape {shape:?} overflows")));
    };
    if shape.first().copied() != Some(m.keys.len()) || m.labels.len() != m.keys.len() {
        return Err(ClientError::BadBatch(format!(
            "batch {} of epoch {}: shape {shape:?} does not match {} keys and {} labels",
            m.index,
            m.epoch,
            m.keys.len(),
            m.labels.len()
        )));
    }
    let Ok(dtype) = proto::Dtype::try_from(m.dtype) else {
        return Err(ClientError::BadBatch(format!("batch {}: unknown dtype {}", m.index, m.dtype)));
    };
    let layout = match proto::Layout::try_from(m.layout) {
        Ok(proto::Layout::Hwc) => Layout::Hwc,
        Ok(proto::Layout::Chw) => Layout::Chw,
        Err(_) => return Err(ClientError::BadBatch(format!("batch {}: unknown layout {}", m.index, m.layout))),
    };
    let width = match dtype {
        proto::Dtype::U8 => 1,
        proto::Dtype::F32 => 4,
    };
    match Compression::from_wire(m.compression)? {
        Compression::None => {}
        Compression::Zstd => {
            let want = elements.saturating_mul(width);
            if want > MAX_MESSAGE_BYTES {
                return Err(ClientError::BadBatch(format!(
                    "batch {}: shape {shape:?} is over the size limit",
                    m.index
                )));
            }
            // Bounded by `want`: a payload claiming more is refused, never allocated.
            m.data = zstd::bulk::decompress(&m.data, want).map_err(|e| {
                ClientError::BadBatch(format!("batch {} of epoch {}: corrupt compressed pixels: {e}", m.index, m.epoch))
            })?;
            undelta(&mut m.data, delta_stride(&shape, layout, width));
        }
    }
    let data = match dtype {
        proto::Dtype::U8 if m.data.len() == elements => TensorData::U8(m.data),
        proto::Dtype::F32 if m.data.len() == elements * 4 => {
            TensorData::F32(m.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        }
        _ => {
            return Err(ClientError::BadBatch(format!(
                "batch {}: {} bytes of dtype {} for shape {shape:?}",
                m.index,
                m.data.len(),
                dtype.as_str_name()
            )))
        }
    };
    if m.has_weights && m.weights.len() != m.keys.len() {
        return Err(ClientError::BadBatch(format!(
            "batch {}: {} weights for {} keys",
            m.index,
            m.weights.len(),
            m.keys.len()
        )));
    }
    let boxes = match m.targets {
        Some(t) => {
            let what = format!("batch {} of epoch {}", m.index, m.epoch);
            let size = match (layout, shape.as_slice()) {
                (Layout::Hwc, [_, h, w, _]) | (Layout::Chw, [_, _, h, w]) => (*h, *w),
                _ => (0, 0),
            };
            Some(Box::new(message_to_targets(t, m.keys.len(), size, &what)?))
        }
        None => None,
    };
    let fields = if m.fields.is_empty() {
        None
    } else {
        let what = format!("batch {} of epoch {}", m.index, m.epoch);
        Some(Box::new(message_to_fields(std::mem::take(&mut m.fields), m.keys.len(), &what)?))
    };
    Ok(Batch {
        epoch: m.epoch,
        index: m.index,
        keys: m.keys,
        labels: m.labels,
        images: Tensor { shape, data },
        layout,
        weights: m.has_weights.then_some(m.weights),
        boxes,
        fields,
    })
}

/// A batch as tests build one: no weights, boxes or fields.
#[cfg(test)]
pub(crate) fn test_batch(
    epoch: u64,
    index: u64,
    keys: Vec<u64>,
    labels: Vec<i64>,
    images: Tensor,
    layout: Layout,
) -> Batch {
    Batch { epoch, index, keys, labels, images, layout, weights: None, boxes: None, fields: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::DType;

    #[test]
    fn batches_round_trip_and_bad_shapes_are_refused() {
        for dt in [DType::U8, DType::F32] {
            let mut images = Tensor::zeros(dt, vec![2, 3, 4, 3]);
            images.as_bytes_mut()[5] = 7;
            let b = Batch {
                weights: Some(vec![0.5, 2.0]),
                ..test_batch(3, 9, vec![4, 8], vec![1, -1], images, Layout::Chw)
            };
            let back = message_to_batch(batch_to_message(b.clone())).map_err(|e| e.to_string());
            assert_eq!(back, Ok(b.clone()));
            for c in [Compression::None, Compression::Zstd] {
                let m = Outgoing::new(b.clone(), c).into_message();
                assert_eq!(m.compression, c.to_wire());
                assert_eq!(message_to_batch(m).map_err(|e| e.to_string()), Ok(b.clone()));
            }
        }
        let mut m = batch_to_message(test_batch(
            0,
            0,
            vec![1],
            vec![0],
            Tensor::zeros(DType::U8, vec![1, 2, 2, 3]),
            Layout::Hwc,
        ));
        m.data.pop();
        assert!(matches!(message_to_batch(m), Err(ClientError::BadBatch(_))));
    }

    #[test]
    fn boxes_travel_with_their_batch_and_inconsistent_targets_are_refused() {
        let targets =
            sluice_core::BoxTargets { boxes: vec![[1.0, 2.5, 3.0, 4.0], [0.0, 0.0, 9.0, 9.0]], labels: vec![7, 8] };
        let b = Batch {
            boxes: Some(Box::new(BatchBoxes::pad(&[sluice_core::BoxTargets::default(), targets]))),
            ..test_batch(1, 4, vec![3, 5], vec![-1, -1], Tensor::zeros(DType::U8, vec![2, 2, 2, 3]), Layout::Hwc)
        };
        for c in [Compression::None, Compression::Zstd] {
            let out = Outgoing::new(b.clone(), c);
            assert!(out.header(false).targets.is_some(), "the data plane's header carries them");
            assert_eq!(message_to_batch(out.into_message()).map_err(|e| e.to_string()), Ok(b.clone()));
        }
        let good = batch_to_message(b.clone()).targets.unwrap();
        for (t, says) in [
            (BatchTargets { counts: vec![0, 3], ..good.clone() }, "a sample with 3 boxes of 2"),
            (BatchTargets { counts: vec![-1, 2], ..good.clone() }, "a sample with -1 boxes"),
            (BatchTargets { counts: vec![2], ..good.clone() }, "1 counts"),
            (BatchTargets { boxes: vec![0; 3], ..good.clone() }, "3 box bytes"),
            (BatchTargets { max_boxes: u64::MAX, ..good.clone() }, "boxes"),
        ] {
            let m = BatchMessage { targets: Some(t), ..batch_to_message(b.clone()) };
            let e = message_to_batch(m).unwrap_err().to_string();
            assert!(e.contains("batch 4 of epoch 1") && e.contains(says), "{e}");
        }
    }

    #[test]
    fn fields_travel_with_their_batch_and_inconsistent_fields_are_refused() {
        let field = |name: &str, values| BatchField { name: name.into(), values };
        let fields = BatchFields {
            fields: vec![
                field("score", FieldValues::Float(vec![0.5, 1.5])),
                field("id", FieldValues::Int(vec![7, -2])),
                field("tags", FieldValues::MultiHot { classes: 3, values: vec![1., 0., 1., 0., 1., 0.] }),
                field("caption", FieldValues::Text(vec!["a".into(), "é".into()])),
                field("meta", FieldValues::Json(vec!["{}".into(), "[1]".into()])),
            ],
        };
        let b = Batch {
            fields: Some(Box::new(fields)),
            ..test_batch(1, 4, vec![3, 5], vec![-1, -1], Tensor::zeros(DType::U8, vec![2, 2, 2, 3]), Layout::Hwc)
        };
        for c in [Compression::None, Compression::Zstd] {
            let out = Outgoing::new(b.clone(), c);
            assert_eq!(out.header(false).fields.len(), 5, "the data plane's header carries them");
            assert_eq!(message_to_batch(out.into_message()).map_err(|e| e.to_string()), Ok(b.clone()));
        }
        let good = batch_to_message(b.clone()).fields;
        for (edit, says) in [
            (
                &(|f: &mut Vec<proto::BatchField>| f[0].floats.push(1.0)) as &dyn Fn(&mut Vec<proto::BatchField>),
                "field `score`: 3 values for 2 samples",
            ),
            (&|f| f[1].ints.clear(), "field `id`: 0 values"),
            (&|f| f[2].classes = 4, "field `tags`: 6 values for 2 samples of 4"),
            (&|f| f[2].classes = u64::MAX, "classes"),
            (
                &|f| {
                    f[3].texts.pop();
                },
                "field `caption`: 1 values",
            ),
            (&|f| f[4].kind = 99, "unknown kind 99"),
        ] {
            let mut fields = good.clone();
            edit(&mut fields);
            let m = BatchMessage { fields, ..batch_to_message(b.clone()) };
            let e = message_to_batch(m).unwrap_err().to_string();
            assert!(e.contains("batch 4 of epoch 1") && e.contains(says), "{e}");
        }
        // A batch without fields sends none.
        assert!(batch_to_message(Batch { fields: None, ..b }).fields.is_empty());
    }

    /// Batch 6 of epoch 2: two 3x2 images (CHW) with their masks, bytes 0..12.
    fn masked_batch() -> Batch {
        let mut boxes = BatchBoxes::pad(&vec![sluice_core::BoxTargets::default(); 2]);
        boxes.masks = Some(Tensor { shape: vec![2, 3, 2], data: TensorData::U8((0..12).collect()) });
        Batch {
            boxes: Some(Box::new(boxes)),
            ..test_batch(2, 6, vec![3, 5], vec![-1, -1], Tensor::zeros(DType::U8, vec![2, 3, 3, 2]), Layout::Chw)
        }
    }

    #[test]
    fn masks_travel_with_their_batch_and_malformed_or_hostile_masks_are_refused() {
        let b = masked_batch();
        for c in [Compression::None, Compression::Zstd] {
            let out = Outgoing::new(b.clone(), c);
            let head = out.header(false).targets.and_then(|t| t.masks);
            assert_eq!(head.map(|m| (m.height, m.width, m.data.len())), Some((3, 2, 12)), "the header carries them");
            assert_eq!(message_to_batch(out.into_message()).map_err(|e| e.to_string()), Ok(b.clone()));
        }
        let good = batch_to_message(b.clone()).targets.unwrap().masks.unwrap();
        for (m, says) in [
            (BatchMasks { data: vec![0; 11], ..good.clone() }, "11 mask bytes for 2 masks of 3x2"),
            (BatchMasks { data: vec![0; 18], ..good.clone() }, "18 mask bytes for 2 masks of 3x2"),
            (BatchMasks { height: 2, width: 3, ..good.clone() }, "masks of 2x3 for images of 3x2"),
            (BatchMasks { height: u32::MAX, width: u32::MAX, ..good.clone() }, "for images of 3x2"),
            (BatchMasks { height: 0, width: 0, data: Vec::new(), body_bytes: 0 }, "masks of 0x0"),
            (BatchMasks { body_bytes: 5, ..good.clone() }, "5 mask bytes announced after the pixels, 12 came"),
        ] {
            let mut msg = batch_to_message(b.clone());
            msg.targets.as_mut().unwrap().masks = Some(m);
            let e = message_to_batch(msg).unwrap_err().to_string();
            assert!(e.contains("batch 6 of epoch 2") && e.contains(says), "{e}");
        }
        // A batch of a source without masks still comes without them.
        let mut plain = b.clone();
        plain.boxes.as_mut().unwrap().masks = None;
        assert!(batch_to_message(plain.clone()).targets.unwrap().masks.is_none());
        assert_eq!(message_to_batch(batch_to_message(plain.clone())).map_err(|e| e.to_string()), Ok(plain));
    }

    #[test]
    fn masks_after_the_pixels_come_back_whole_and_a_frame_that_disagrees_with_its_header_is_refused() {
        let b = masked_batch();
        let frame = |c| {
            let out = Outgoing::new(b.clone(), c);
            let head = out.header(true);
            (head, out.payload().to_vec(), out.masks().to_vec())
        };
        for c in [Compression::None, Compression::Zstd] {
            let (head, pixels, masks) = frame(c);
            let m = head.targets.as_ref().and_then(|t| t.masks.clone()).unwrap();
            assert_eq!((m.data.len(), m.body_bytes, masks.len()), (0, 12, 12), "the header has only their length");
            let back = decode_header(&prost::Message::encode_to_vec(&head)).unwrap();
            assert_eq!(masks_body_len(&back).unwrap(), 12);
            let got = frame_to_received(back, pixels, masks).map(|r| r.batch).map_err(|e| e.to_string());
            assert_eq!(got, Ok(b.clone()));
        }
        // An older worker's masks, in the header, are read as before.
        let out = Outgoing::new(b.clone(), Compression::None);
        let got = frame_to_received(out.header(false), out.payload().to_vec(), Vec::new()).map(|r| r.batch);
        assert_eq!(got.map_err(|e| e.to_string()), Ok(b.clone()));
        let (head, pixels, masks) = frame(Compression::None);
        let e = frame_to_received(head.clone(), pixels.clone(), masks[..11].to_vec()).unwrap_err().to_string();
        assert!(e.contains("batch 6 of epoch 2: 11 mask bytes after the pixels where the header says 12"), "{e}");
        let mut both = head.clone();
        both.targets.as_mut().unwrap().masks.as_mut().unwrap().data = vec![1];
        let e = frame_to_received(both, pixels.clone(), masks.clone()).unwrap_err().to_string();
        assert!(e.contains("batch 6 of epoch 2: masks both in the header"), "{e}");
        let mut huge = head.clone();
        huge.targets.as_mut().unwrap().masks.as_mut().unwrap().body_bytes = u64::MAX;
        let e = masks_body_len(&huge).unwrap_err().to_string();
        assert!(e.contains("batch 6 of epoch 2") && e.contains("over the limit"), "{e}");
        let e = decode_header(&[0xff, 0xff]).unwrap_err().to_string();
        assert!(e.contains("malformed batch header"), "{e}");
    }

    #[test]
    fn a_batchs_trace_times_travel_stamped_when_sent_and_out_of_order_ones_are_refused() {
        let b = test_batch(2, 5, vec![1], vec![0], Tensor::zeros(DType::U8, vec![1, 2, 2, 3]), Layout::Hwc);
        let t = BatchTrace { pid: 9, request_received_ns: 10, built_start_ns: 20, built_end_ns: 30, sent_ns: 0 };
        let before = sluice_pipeline::trace::now_ns();
        let out = Outgoing::new(b.clone(), Compression::None).with_trace(t);
        let head = out.header(false);
        let got = message_to_received(out.into_message()).unwrap().trace.unwrap();
        assert!(got.sent_ns >= before && head.trace.unwrap().sent_ns >= before, "stamped as it goes out");
        assert_eq!(BatchTrace { sent_ns: 0, ..got }, t);
        assert!(message_to_received(batch_to_message(b.clone())).unwrap().trace.is_none());

        for bad in [
            BatchTrace { built_end_ns: 40, sent_ns: 35, ..t },
            BatchTrace { built_start_ns: 31, sent_ns: 35, ..t },
            BatchTrace { request_received_ns: 36, sent_ns: 35, ..t },
        ] {
            let m = BatchMessage { trace: Some(bad), ..batch_to_message(b.clone()) };
            let e = message_to_received(m).unwrap_err().to_string();
            assert!(e.contains("batch 5 of epoch 2: trace times out of order"), "{e}");
        }
    }

    #[test]
    fn compressed_pixels_shrink_and_corrupt_or_oversized_payloads_are_refused() {
        let mut images = Tensor::zeros(DType::U8, vec![4, 32, 32, 3]);
        for (i, px) in images.as_bytes_mut().iter_mut().enumerate() {
            *px = (i / 97 % 7) as u8; // runs, like flat image areas
        }
        let b = test_batch(1, 2, vec![0, 1, 2, 3], vec![0; 4], images, Layout::Hwc);
        let out = Outgoing::new(b.clone(), Compression::Zstd);
        assert!(out.payload().len() < b.images.as_bytes().len() / 4, "{} bytes", out.payload().len());

        let mut m = out.into_message();
        m.data.truncate(m.data.len() / 2);
        let e = message_to_batch(m).unwrap_err().to_string();
        assert!(e.contains("batch 2 of epoch 1: corrupt compressed pixels"), "{e}");

        let mut m = Outgoing::new(b.clone(), Compression::Zstd).into_message();
        m.shape = vec![4, 1 << 20, 1 << 20, 3];
        assert!(message_to_batch(m).unwrap_err().to_string().contains("over the size limit"));

        let mut m = batch_to_message(b);
        m.compression = 9;
        assert!(message_to_batch(m).unwrap_err().to_string().contains("unknown compression code 9"));
        assert!(Compression::parse("zip").unwrap_err().to_string().contains("unknown compression \"zip\""));
    }
}
