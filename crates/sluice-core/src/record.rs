//! The fields a sample carries besides its image and label: bounding boxes with their own
//! labels. Sources read them once into the [`Manifest`](crate::Manifest) (a COCO
//! `instances_*.json`, a per-sample JSON sidecar); the ops move them with the pixels;
//! batches carry them padded ([`BatchBoxes`]).
//!
//! Boxes are XYXY in pixels of the current image, f32, as `torchvision.tv_tensors.BoundingBoxes`
//! with `format="XYXY"`. The rule after decode and after every geometric op is
//! torchvision's `ClampBoundingBoxes` + `SanitizeBoundingBoxes(min_size=1)`: clamp each box
//! to the image, then drop those narrower or shorter than [`MIN_BOX_SIDE`] pixels.
//!
//! A source may also give each sample a segmentation [`Mask`] (one u8 class id per pixel,
//! the size of the image), as `torchvision.tv_tensors.Mask`: where it comes from is the
//! manifest's [`MaskSource`]; the ops move it with nearest-neighbour sampling.

use serde::{Deserialize, Serialize};

/// Boxes narrower or shorter than this (in pixels, after clamping) are dropped.
pub const MIN_BOX_SIDE: f32 = 1.0;

/// One sample's boxes: `boxes[i]` is `[x1, y1, x2, y2]` with label `labels[i]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoxTargets {
    pub boxes: Vec<[f32; 4]>,
    pub labels: Vec<i64>,
}

impl BoxTargets {
    /// Checks boxes as a source read them: XYXY, every coordinate finite, `x2 >= x1` and
    /// `y2 >= y1`, one label per box, at most `max_boxes`. Coordinates outside the image
    /// (negative ones too) are not an error: the clamp after decode handles them. On error,
    /// says what is wrong (the caller adds which sample).
    pub fn checked(boxes: Vec<[f32; 4]>, labels: Vec<i64>, max_boxes: usize) -> Result<Self, String> {
        if boxes.len() != labels.len() {
            return Err(format!("{} boxes but {} labels", boxes.len(), labels.len()));
        }
        if boxes.len() > max_boxes {
            return Err(format!("{} boxes, over the limit of {max_boxes} (limits.max_boxes)", boxes.len()));
        }
        for (i, b) in boxes.iter().enumerate() {
            if !b.iter().all(|v| v.is_finite()) {
                return Err(format!("box {i} {b:?} has a coordinate that is not a finite number"));
            }
            if b[2] < b[0] || b[3] < b[1] {
                return Err(format!("box {i} {b:?} has x2 < x1 or y2 < y1 (boxes are [x1, y1, x2, y2])"));
            }
        }
        Ok(Self { boxes, labels })
    }

    pub fn len(&self) -> usize {
        self.boxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    /// The stated rule: clamp every box to a `w x h` image, then drop those with a side
    /// under [`MIN_BOX_SIDE`] (their labels with them). Keeps the order of the rest.
    pub fn sanitize(&mut self, w: u32, h: u32) {
        let (w, h) = (w as f32, h as f32);
        let mut kept = 0;
        for i in 0..self.boxes.len() {
            let [x1, y1, x2, y2] = self.boxes[i];
            let b = [x1.clamp(0.0, w), y1.clamp(0.0, h), x2.clamp(0.0, w), y2.clamp(0.0, h)];
            // NaN compares false: a box made NaN by a degenerate warp is dropped too.
            if b[2] - b[0] >= MIN_BOX_SIDE && b[3] - b[1] >= MIN_BOX_SIDE {
                self.boxes[kept] = b;
                self.labels[kept] = self.labels[i];
                kept += 1;
            }
        }
        self.boxes.truncate(kept);
        self.labels.truncate(kept);
    }

    /// Feeds the boxes and labels to a hash (the manifest's fingerprint).
    pub(crate) fn hash_into(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        h.update(&(self.boxes.len() as u64).to_le_bytes());
        for (b, l) in self.boxes.iter().zip(&self.labels) {
            for v in b {
                h.update(&v.to_le_bytes());
            }
            h.update(&l.to_le_bytes());
        }
    }
}

/// What a source read for one sample besides its image: its boxes, or why they could not
/// be read (malformed JSON, a NaN coordinate, too many boxes). An invalid annotation fails
/// that sample when it is loaded, under the spec's `on_error`, naming the sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Annotation {
    Boxes(BoxTargets),
    Invalid(String),
}

/// A batch's boxes, padded to the longest list in the batch: `boxes` is `[n, max_boxes, 4]`
/// f32 (zeros in the padding), `labels` `[n, max_boxes]` i64 (-1 in the padding) and
/// `counts` `[n]` i32 (how many rows of each sample are real).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchBoxes {
    pub max_boxes: usize,
    pub boxes: Vec<f32>,
    pub labels: Vec<i64>,
    pub counts: Vec<i32>,
    /// The samples' masks, u8 `[n, h, w]`, when the source reads masks.
    pub masks: Option<crate::batch::Tensor>,
}

impl BatchBoxes {
    /// Pads the per-sample lists into one batch.
    pub fn pad(samples: &[BoxTargets]) -> Self {
        let max_boxes = samples.iter().map(BoxTargets::len).max().unwrap_or(0);
        let n = samples.len();
        let mut boxes = vec![0f32; n * max_boxes * 4];
        let mut labels = vec![-1i64; n * max_boxes];
        let mut counts = Vec::with_capacity(n);
        for (i, s) in samples.iter().enumerate() {
            for (j, (b, l)) in s.boxes.iter().zip(&s.labels).enumerate() {
                let at = i * max_boxes + j;
                boxes[at * 4..at * 4 + 4].copy_from_slice(b);
                labels[at] = *l;
            }
            counts.push(i32::try_from(s.len()).unwrap_or(i32::MAX));
        }
        Self { max_boxes, boxes, labels, counts, masks: None }
    }
}

/// One sample's segmentation mask: `width x height` u8 values, row-major (a class id per
/// pixel, 0 for the background, as `tv_tensors.Mask` holds a semantic mask).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mask {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

/// A COCO `segmentation`: polygons (`[[x1, y1, x2, y2, ...], ...]` in pixels) or a
/// run-length encoding of a `size = [height, width]` mask (column-major runs starting with
/// zeros, `counts` as numbers or in COCO's compressed string form).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Segmentation {
    Polygons(Vec<Vec<f64>>),
    Rle { counts: Vec<u32>, size: [u32; 2] },
    RleString { counts: String, size: [u32; 2] },
}

/// Where a sample's mask comes from, read when the sample is loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MaskSource {
    /// A single-channel PNG (grey or palette indices), relative to the manifest's root.
    File(std::path::PathBuf),
    /// A single-channel PNG stored elsewhere than a file of its own: a tar shard's member
    /// (`Location::TarMember`, its shard relative to the manifest's root), read by offset.
    Member(crate::Location),
    /// COCO objects painted in order onto a `width x height` canvas of zeros, each object's
    /// pixels set to its class id (so a later object covers an earlier one).
    Objects { width: u32, height: u32, objects: Vec<(u8, Segmentation)> },
    /// The mask cannot be had; the sample fails with this reason when loaded.
    Invalid(String),
}

impl MaskSource {
    /// Feeds the source to a hash (the manifest's fingerprint).
    pub(crate) fn hash_into(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        // serde_json of these plain types cannot fail; an empty hash input is still a hash.
        h.update(serde_json::to_string(self).unwrap_or_default().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use super::*;

    #[test]
    fn checked_refuses_what_cannot_be_a_box_and_names_it() {
        let ok = BoxTargets::checked(vec![[-5.0, 1.0, 900.0, 2.0]], vec![3], 10).unwrap();
        assert_eq!(ok.len(), 1, "outside the image is for the clamp, not an error");
        let err = BoxTargets::checked(vec![[0.0, f32::NAN, 1.0, 2.0]], vec![1], 10).unwrap_err();
        assert!(err.contains("box 0") && err.contains("finite"), "{err}");
        let err = BoxTargets::checked(vec![[5.0, 0.0, 1.0, 2.0]], vec![1], 10).unwrap_err();
        assert!(err.contains("x2 < x1"), "{err}");
        let err = BoxTargets::checked(vec![[0.0; 4]; 3], vec![1; 2], 10).unwrap_err();
        assert!(err.contains("3 boxes but 2 labels"), "{err}");
        let err = BoxTargets::checked(vec![[0.0; 4]; 11], vec![1; 11], 10).unwrap_err();
        assert!(err.contains("limits.max_boxes"), "{err}");
    }

    #[test]
    fn sanitize_clamps_then_drops_boxes_under_one_pixel() {
        let mut t = BoxTargets {
            boxes: vec![[-3.0, -1.0, 5.0, 4.0], [9.5, 0.0, 12.0, 3.0], [2.0, 2.0, 2.5, 8.0], [1.0, 1.0, 2.0, 2.0]],
            labels: vec![1, 2, 3, 4],
        };
        t.sanitize(10, 6);
        assert_eq!(t.boxes, vec![[0.0, 0.0, 5.0, 4.0], [1.0, 1.0, 2.0, 2.0]]);
        assert_eq!(t.labels, vec![1, 4]);
    }

    #[test]
    fn pad_fills_with_zero_boxes_and_minus_one_labels() {
        let a = BoxTargets { boxes: vec![[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], labels: vec![7, 8] };
        let b = BoxTargets::default();
        let p = BatchBoxes::pad(&[b.clone(), a]);
        assert_eq!(p.max_boxes, 2);
        assert_eq!(p.counts, vec![0, 2]);
        assert_eq!(p.labels, vec![-1, -1, 7, 8]);
        assert_eq!(&p.boxes[8..], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert_eq!(BatchBoxes::pad(&[b]).boxes.len(), 0);
    }
}
