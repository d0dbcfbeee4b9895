//! A batch from a hostile worker, decoded the way a client's data plane decodes it: a
//! header (a `BatchMessage` without its pixels), the pixels, then the masks the header
//! announces after them (`BatchMasks.body_bytes`). The first byte picks how the header is
//! made: its bytes straight from the input (prost decodes them), or a message built from
//! the input's bytes (a shape, dtype, layout and compression; keys and labels; padded boxes
//! with labels and counts; masks in the header or after the pixels; metadata fields of
//! every kind), so the checks past prost are reached too. The rest of the input is the
//! frame's body.
//!
//! Properties: nothing panics or aborts, and nothing allocates past the message cap; a
//! batch that is accepted is consistent: one key, label (and weight) per row of its
//! pixels, pixels as many bytes as its shape and dtype say, boxes padded as their counts
//! say, masks `n * height * width` bytes of the images' size, and one value per sample
//! in each field.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sluice_client::proto::{BatchField, BatchMasks, BatchMessage, BatchTargets};
use sluice_client::wire::{decode_header, frame_to_received, masks_body_len};
use sluice_core::{Batch, FieldValues, Layout, TensorData};

/// Reads the input's bytes as a message's parts, 0 once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn small(&mut self, below: u8) -> usize {
        usize::from(self.u8() % below)
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head.to_vec()
    }
}

/// A message from the input's bytes: mostly consistent, with whatever the bytes say where
/// they disagree.
fn built(b: &mut Bytes) -> BatchMessage {
    let n = b.small(5);
    let (h, w, c) = (b.small(5), b.small(5), b.small(4));
    let layout = i32::from(b.u8() % 3);
    let shape = match layout {
        1 => vec![n, c, h, w],
        _ => vec![n, h, w, c],
    };
    let mut shape: Vec<u64> = shape.into_iter().map(|d| d as u64).collect();
    if b.u8() % 8 == 0 {
        // A hostile dimension now and then.
        shape[1] = u64::from(b.u8()) << 40;
    }
    let keys: Vec<u64> = (0..n + b.small(2)).map(|k| k as u64).collect();
    let mut m = BatchMessage {
        epoch: u64::from(b.u8()),
        index: u64::from(b.u8()),
        labels: keys.iter().map(|&k| k as i64 - 1).collect(),
        keys,
        shape,
        dtype: i32::from(b.u8() % 3),
        layout,
        compression: i32::from(b.u8() % 3),
        ..Default::default()
    };
    if b.u8() % 2 == 0 {
        m.has_weights = true;
        m.weights = (0..n + b.small(2)).map(|i| i as f32).collect();
    }
    if b.u8() % 2 == 0 {
        let max_boxes = b.small(4);
        let rows = n * max_boxes + b.small(2);
        let masks = match b.u8() % 3 {
            0 => None,
            in_body => {
                let (mh, mw) = (h + b.small(2), w + b.small(2));
                let len = n * mh * mw + b.small(2);
                Some(BatchMasks {
                    height: mh as u32,
                    width: mw as u32,
                    data: if in_body == 1 { b.take(len) } else { Vec::new() },
                    body_bytes: if in_body == 2 { len as u64 } else { u64::from(b.u8() % 2) },
                })
            }
        };
        m.targets = Some(BatchTargets {
            max_boxes: max_boxes as u64,
            boxes: b.take(rows * 16),
            labels: (0..rows).map(|i| i as i64).collect(),
            counts: (0..n).map(|_| i32::from(b.u8() % 6) - 1).collect(),
            masks,
        });
    }
    for name in ["f", "i", "m", "t", "j"].iter().take(b.small(6)) {
        let count = n + b.small(2);
        let classes = b.small(4);
        m.fields.push(BatchField {
            name: (*name).into(),
            kind: i32::from(b.u8() % 6),
            floats: (0..count * classes.max(1)).map(|i| i as f32).collect(),
            ints: (0..count).map(|i| i as i64).collect(),
            classes: classes as u64,
            texts: (0..count).map(|i| i.to_string()).collect(),
        });
    }
    m
}

/// What an accepted batch must hold to be handed to a trainer.
fn check(batch: &Batch) {
    let n = batch.keys.len();
    assert_eq!(batch.images.shape.first().copied(), Some(n));
    assert_eq!(batch.labels.len(), n);
    if let Some(w) = &batch.weights {
        assert_eq!(w.len(), n);
    }
    let elements: usize = batch.images.shape.iter().product();
    match &batch.images.data {
        TensorData::U8(v) => assert_eq!(v.len(), elements),
        TensorData::F32(v) => assert_eq!(v.len(), elements),
        TensorData::SharedU8(_) => unreachable!("a client's batch owns its pixels"),
    }
    if let Some(t) = &batch.boxes {
        assert_eq!(t.counts.len(), n);
        assert_eq!(t.labels.len(), n * t.max_boxes);
        assert_eq!(t.boxes.len(), n * t.max_boxes * 4);
        assert!(t.counts.iter().all(|&c| c >= 0 && c as usize <= t.max_boxes));
        if let Some(masks) = &t.masks {
            let (h, w) = match (batch.layout, batch.images.shape.as_slice()) {
                (Layout::Hwc, [_, h, w, _]) | (Layout::Chw, [_, _, h, w]) => (*h, *w),
                _ => panic!("masks on images of shape {:?}", batch.images.shape),
            };
            assert_eq!(masks.shape, vec![n, h, w]);
            assert_eq!(masks.as_bytes().len(), n * h * w);
        }
    }
    for f in batch.fields.iter().flat_map(|f| &f.fields) {
        let values = match &f.values {
            FieldValues::Float(v) => v.len(),
            FieldValues::Int(v) => v.len(),
            FieldValues::MultiHot { classes, values } => {
                assert!(*classes > 0);
                values.len() / classes
            }
            FieldValues::Text(v) | FieldValues::Json(v) => v.len(),
        };
        assert_eq!(values, n, "field {}", f.name);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let head = match b.u8() % 2 {
        0 => {
            let len = usize::from(b.u8()) | usize::from(b.u8()) << 8;
            b.take(len)
        }
        _ => built(&mut b).encode_to_vec(),
    };
    let body = b.0;
    let Ok(m) = decode_header(&head) else { return };
    // The masks are the body's tail, as many bytes as the header says (a body too short
    // for them is what a worker that closed mid-frame leaves: the stream's read fails).
    let (pixels, masks) = match masks_body_len(&m) {
        Ok(len) if len <= body.len() => body.split_at(body.len() - len),
        Ok(_) => (body, &[][..]),
        Err(e) => {
            assert!(e.to_string().contains("mask"), "{e}");
            return;
        }
    };
    if let Ok(received) = frame_to_received(m, pixels.to_vec(), masks.to_vec()) {
        check(&received.batch);
    }
});
