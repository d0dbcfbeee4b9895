//! Untrusted annotations through the record sources: the first byte picks a COCO
//! `instances_*.json` or a sample's JSON sidecar, the rest is the file. Each is enumerated
//! as the loader does it; every sample's boxes are then moved through a motion drawn from
//! the input and padded into a batch. Properties: nothing panics or aborts; a sample's
//! boxes either fail it with a reason, or are finite, XYXY and within the limit; after the
//! stated rule (clamp, then drop under one pixel) every box is inside the image and at
//! least one pixel a side. The first byte's second bit asks for masks too: every COCO
//! segmentation (polygons, RLE) is painted, and a sidecar's bytes are decoded as a PNG
//! mask; either gives a mask of its stated size or an error with a reason. The third bit
//! asks a sidecar for metadata fields of every kind: one row per sample, each a value of
//! its kind or the sample's error with a reason.
//!
//! Seeds (fuzz/seeds/records): a COCO file and sidecars in the shapes the sources take.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_codec::{decode_png_mask, move_boxes, Motion};
use sluice_core::spec::MAX_BOXES;
use sluice_core::record::MIN_BOX_SIDE;
use sluice_core::record::MaskSource;
use sluice_core::{Annotation, BatchBoxes, BoxTargets, FieldKindName, FieldSpec};
use sluice_pipeline::source::{coco, segmentation, sidecar};

/// Pixels a fuzzed mask may have: enough for any shape, small enough to stay fast.
const MAX_MASK_PIXELS: u64 = 1 << 20;

fn motion(bytes: &[u8]) -> Motion {
    let f = |i: usize| f64::from(bytes.get(i).copied().unwrap_or(0)) - 128.0;
    match bytes.first().copied().unwrap_or(0) % 5 {
        0 => Motion::Identity,
        1 => Motion::Scale { sx: f(1) / 16.0, sy: f(2) / 16.0, tx: f(3), ty: f(4) },
        2 => Motion::HorizontalFlip { w: f(1) },
        3 => Motion::Affine([f(1) / 64.0, f(2) / 64.0, f(3), f(4) / 64.0, f(5) / 64.0, f(6)]),
        _ => Motion::Perspective([f(1), f(2), f(3), f(4), f(5), f(6), f(7) / 1e3, f(8) / 1e3]),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else { return };
    // The motion's bytes come first, the file after them.
    let (how, file) = rest.split_at(rest.len().min(9));
    // One folder per fuzzing process, rewritten for every input.
    let dir = std::env::temp_dir().join(format!("sluice-fuzz-records-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let masks = kind & 2 != 0;
    let manifest = if kind % 2 == 0 {
        let path = dir.join("instances.json");
        if std::fs::write(&path, file).is_err() {
            return;
        }
        match coco::enumerate(&path, &dir, masks) {
            Ok(m) => m,
            Err(e) => {
                assert!(e.to_string().contains("instances.json"), "{e}");
                return;
            }
        }
    } else {
        if std::fs::write(dir.join("a.png"), b"not read").is_err() || std::fs::write(dir.join("a.json"), file).is_err()
        {
            return;
        }
        if masks {
            if let Ok(m) = decode_png_mask(file, MAX_MASK_PIXELS) {
                assert_eq!(m.data.len() as u64, u64::from(m.width) * u64::from(m.height));
            }
        }
        // The third bit asks the sidecar for a field of every kind too.
        let fields: Vec<FieldSpec> = [
            ("f", FieldKindName::Float, None),
            ("i", FieldKindName::Int, None),
            ("t", FieldKindName::MultiLabel, Some(5)),
            ("c", FieldKindName::Text, None),
            ("j", FieldKindName::Json, None),
        ]
        .into_iter()
        .map(|(name, kind, classes)| FieldSpec { name: name.into(), kind, classes })
        .collect();
        let read = (kind & 4 != 0).then(|| sidecar::FieldsRead { specs: &fields, max_bytes: 1 << 10 });
        let Ok(m) = sidecar::enumerate_with_fields(&dir, masks, read) else { return };
        if let Some(t) = &m.fields {
            // One row per sample; a sample's fields are values of their kinds or fail it.
            assert_eq!(t.rows(), m.len() as u64);
            let rows: Vec<u64> = (0..t.rows()).collect();
            let b = t.gather(&rows);
            assert_eq!(b.fields.len(), fields.len());
            for (p, why) in &t.invalid {
                assert!(*p < t.rows() && !why.is_empty());
            }
        }
        m
    };
    for i in 0..manifest.len().min(64) {
        match manifest.mask_source(i) {
            Some(MaskSource::Objects { width, height, objects }) => {
                match segmentation::paint(*width, *height, objects, MAX_MASK_PIXELS) {
                    Ok(m) => assert_eq!(m.data.len() as u64, u64::from(*width) * u64::from(*height)),
                    Err(why) => assert!(!why.is_empty()),
                }
            }
            Some(MaskSource::Invalid(why)) => assert!(!why.is_empty()),
            Some(MaskSource::File(_) | MaskSource::Member(_)) | None => {}
        }
    }
    let (w, h) = (u32::from(how.get(1).copied().unwrap_or(7)) + 1, u32::from(how.get(2).copied().unwrap_or(5)) + 1);
    let mut moved = Vec::new();
    for i in 0..manifest.len().min(64) {
        match manifest.annotation(i) {
            None => panic!("a record source's sample {i} has no annotation"),
            Some(Annotation::Invalid(why)) => assert!(!why.is_empty()),
            Some(Annotation::Boxes(t)) => {
                assert!(t.len() as u64 <= MAX_BOXES && t.boxes.len() == t.labels.len());
                for b in &t.boxes {
                    assert!(b.iter().all(|v| v.is_finite()) && b[2] >= b[0] && b[3] >= b[1], "{b:?}");
                }
                let mut t: BoxTargets = t.clone();
                move_boxes(&mut t, motion(how), w, h);
                for b in &t.boxes {
                    assert!(b[0] >= 0.0 && b[1] >= 0.0 && b[2] <= w as f32 && b[3] <= h as f32, "{b:?} in {w}x{h}");
                    assert!(b[2] - b[0] >= MIN_BOX_SIDE && b[3] - b[1] >= MIN_BOX_SIDE, "{b:?}");
                }
                moved.push(t);
            }
        }
    }
    let batch = BatchBoxes::pad(&moved);
    assert_eq!(batch.counts.len(), moved.len());
    assert_eq!(batch.boxes.len(), moved.len() * batch.max_boxes * 4);
});
