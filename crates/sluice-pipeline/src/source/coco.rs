//! COCO-style detection: an `instances_*.json` and the folder its images are in. Samples are
//! the file's `images` in `id` order (`file_name` relative to the image folder); each
//! annotation's `bbox` (`[x, y, width, height]` in pixels) becomes an XYXY box labelled
//! with its `category_id`, as torchvision's `wrap_dataset_for_transforms_v2(CocoDetection)`
//! gives them. With `masks`, each image also gets a semantic mask: its annotations'
//! `segmentation`s (polygons or RLE) painted in file order onto zeros, each with its
//! `category_id` (1..=255), rasterised when the sample is loaded (see
//! [`super::segmentation`]). Other fields (`area`, `iscrowd`, ...) are ignored.
//!
//! A malformed file fails enumeration (serde names the line and column); a malformed
//! annotation (a `bbox` that is not 4 numbers, a negative width) fails only its image's
//! sample, when it is loaded, under `on_error`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_core::spec::MAX_BOXES;
use sluice_core::{Annotation, BoxTargets, Location, Manifest, MaskSource, Segmentation};

use super::{open_source_file, SourceError};
use crate::storage::Roots;

#[derive(Deserialize)]
struct CocoFile {
    images: Vec<CocoImage>,
    #[serde(default)]
    annotations: Vec<CocoAnnotation>,
}

#[derive(Deserialize)]
struct CocoImage {
    id: u64,
    file_name: String,
    #[serde(default)]
    width: Option<u32>,
    #[serde(default)]
    height: Option<u32>,
}

#[derive(Deserialize)]
struct CocoAnnotation {
    #[serde(default)]
    id: Option<u64>,
    image_id: u64,
    bbox: Vec<f64>,
    category_id: i64,
    #[serde(default)]
    segmentation: Option<CocoSegmentation>,
}

/// A `segmentation` as COCO writes it: polygons, or an RLE with numeric or compressed counts.
#[derive(Deserialize)]
#[serde(untagged)]
enum CocoSegmentation {
    Polygons(Vec<Vec<f64>>),
    Rle { counts: Vec<u32>, size: [u32; 2] },
    RleString { counts: String, size: [u32; 2] },
}

impl From<CocoSegmentation> for Segmentation {
    fn from(s: CocoSegmentation) -> Self {
        match s {
            CocoSegmentation::Polygons(p) => Segmentation::Polygons(p),
            CocoSegmentation::Rle { counts, size } => Segmentation::Rle { counts, size },
            CocoSegmentation::RleString { counts, size } => Segmentation::RleString { counts, size },
        }
    }
}

/// Where an image's mask stands while the annotations are read.
enum MaskCollecting {
    Objects(Vec<(u8, Segmentation)>),
    Invalid(String),
}

/// Where an image's boxes stand while the annotations are read.
enum Collecting {
    Boxes(Vec<[f32; 4]>, Vec<i64>),
    Invalid(String),
}

/// Enumerates a COCO detection dataset; with `masks`, each sample's mask source too.
pub fn enumerate(annotations: &Path, images: &Path, masks: bool) -> Result<Manifest, SourceError> {
    enumerate_within(annotations, images, masks, None)
}

/// As [`enumerate`], the annotation file opened beneath `roots` when given.
pub fn enumerate_within(
    annotations: &Path,
    images: &Path,
    masks: bool,
    roots: Option<&Roots>,
) -> Result<Manifest, SourceError> {
    let file = open_source_file("COCO annotations", annotations, roots)?;
    let coco: CocoFile = serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| SourceError::BadAnnotations { path: annotations.to_path_buf(), message: e.to_string() })?;
    let meta = fs::metadata(images).map_err(|e| SourceError::io("COCO image folder", images, e))?;
    if !meta.is_dir() {
        return Err(SourceError::NotADirectory { path: images.to_path_buf() });
    }
    let mut list = coco.images;
    list.sort_by_key(|i| i.id);
    if let Some(w) = list.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(SourceError::BadAnnotations {
            path: annotations.to_path_buf(),
            message: format!("image id {} is listed twice", w[0].id),
        });
    }
    let index: HashMap<u64, usize> = list.iter().enumerate().map(|(i, img)| (img.id, i)).collect();
    let mut boxes: Vec<Collecting> = (0..list.len()).map(|_| Collecting::Boxes(Vec::new(), Vec::new())).collect();
    let mut objects: Vec<MaskCollecting> = (0..list.len()).map(|_| MaskCollecting::Objects(Vec::new())).collect();
    let mut orphans = 0usize;
    for a in coco.annotations {
        let Some(&at) = index.get(&a.image_id) else {
            orphans += 1;
            continue;
        };
        if masks {
            if let MaskCollecting::Objects(o) = &mut objects[at] {
                let what = a.id.map_or_else(|| "an annotation".to_string(), |id| format!("annotation {id}"));
                match (u8::try_from(a.category_id), a.segmentation) {
                    (Ok(class), Some(seg)) if class > 0 => o.push((class, seg.into())),
                    (_, None) => objects[at] = MaskCollecting::Invalid(format!("{what} has no `segmentation`")),
                    _ => {
                        objects[at] = MaskCollecting::Invalid(format!(
                            "{what}: category_id {} does not fit a u8 mask (1..=255)",
                            a.category_id
                        ))
                    }
                }
            }
        }
        let Collecting::Boxes(b, l) = &mut boxes[at] else { continue };
        let what = a.id.map_or_else(|| "an annotation".to_string(), |id| format!("annotation {id}"));
        let bad = match a.bbox[..] {
            [x, y, w, h] if w >= 0.0 && h >= 0.0 => {
                if b.len() as u64 >= MAX_BOXES {
                    Some(format!("more than {MAX_BOXES} boxes"))
                } else {
                    b.push([x as f32, y as f32, (x + w) as f32, (y + h) as f32]);
                    l.push(a.category_id);
                    None
                }
            }
            [_, _, _, _] => Some(format!("{what}: bbox {:?} has a negative width or height", a.bbox)),
            _ => Some(format!("{what}: bbox {:?} is not [x, y, width, height]", a.bbox)),
        };
        if let Some(why) = bad {
            boxes[at] = Collecting::Invalid(why);
        }
    }
    if orphans > 0 {
        tracing::warn!(orphans, file = %annotations.display(), "annotations whose image_id is not in `images` were ignored");
    }
    let mut items = Vec::with_capacity(list.len());
    let mut anns = Vec::with_capacity(list.len());
    let mut mask_sources = Vec::with_capacity(list.len());
    for ((img, collected), objects) in list.into_iter().zip(boxes).zip(objects) {
        let where_ = || format!("image id {} in {}", img.id, annotations.display());
        mask_sources.push(match (objects, img.width, img.height) {
            (MaskCollecting::Invalid(why), _, _) => MaskSource::Invalid(format!("{}: {why}", where_())),
            (MaskCollecting::Objects(objects), Some(width), Some(height)) => {
                MaskSource::Objects { width, height, objects }
            }
            _ => MaskSource::Invalid(format!("{}: no `width` and `height` to paint its mask on", where_())),
        });
        let path = PathBuf::from(&img.file_name);
        let size = fs::metadata(images.join(&path)).map(|m| m.len()).unwrap_or(0);
        items.push((Location::File { path }, -1, size));
        anns.push(match collected {
            Collecting::Boxes(b, l) => match BoxTargets::checked(b, l, MAX_BOXES as usize) {
                Ok(t) => Annotation::Boxes(t),
                Err(why) => Annotation::Invalid(format!("image id {} in {}: {why}", img.id, annotations.display())),
            },
            Collecting::Invalid(why) => {
                Annotation::Invalid(format!("image id {} in {}: {why}", img.id, annotations.display()))
            }
        });
    }
    if items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: annotations.display().to_string(),
            hint: "the annotation file lists no `images`",
        });
    }
    let manifest = Manifest::new(images.to_path_buf(), items, Vec::new()).with_annotations(anns);
    Ok(if masks { manifest.with_masks(mask_sources) } else { manifest })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use super::*;

    fn write(dir: &Path, json: &str) -> PathBuf {
        let path = dir.join("instances_train.json");
        fs::write(&path, json).unwrap();
        path
    }

    #[test]
    fn images_in_id_order_with_xyxy_boxes_and_bad_annotations_failing_only_their_image() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("b.jpg"), b"12345").unwrap();
        let path = write(
            dir.path(),
            r#"{"images": [{"id": 5, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}, {"id": 9, "file_name": "c.jpg"}],
                "annotations": [
                  {"id": 1, "image_id": 2, "bbox": [10, 20, 30, 40.5], "category_id": 18, "segmentation": [[1, 2]]},
                  {"id": 2, "image_id": 2, "bbox": [0, 0, 1, 1], "category_id": 1},
                  {"id": 3, "image_id": 5, "bbox": [0, 0, 1], "category_id": 1},
                  {"id": 4, "image_id": 9, "bbox": [0, 0, -3, 1], "category_id": 1},
                  {"id": 5, "image_id": 77, "bbox": [0, 0, 1, 1], "category_id": 1}],
                "categories": []}"#,
        );
        let m = enumerate(&path, dir.path(), false).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.at(0).location, Location::File { path: "b.jpg".into() });
        assert_eq!((m.at(0).label, m.at(0).size, m.at(1).size), (-1, 5, 0));
        let want = BoxTargets { boxes: vec![[10.0, 20.0, 40.0, 60.5], [0.0, 0.0, 1.0, 1.0]], labels: vec![18, 1] };
        assert_eq!(m.annotation(0), Some(&Annotation::Boxes(want)));
        let Some(Annotation::Invalid(why)) = m.annotation(1) else { panic!("{:?}", m.annotation(1)) };
        assert!(why.contains("image id 5") && why.contains("annotation 3") && why.contains("not [x, y"), "{why}");
        let Some(Annotation::Invalid(why)) = m.annotation(2) else { panic!("{:?}", m.annotation(2)) };
        assert!(why.contains("negative width"), "{why}");
        // The boxes are part of the fingerprint.
        let other = write(dir.path(), &fs::read_to_string(&path).unwrap().replace("30, 40.5", "30, 41"));
        assert_ne!(enumerate(&other, dir.path(), false).unwrap().fingerprint, m.fingerprint);
    }

    #[test]
    fn masks_take_each_images_segmentations_or_say_why_they_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            r#"{"images": [{"id": 1, "file_name": "a.jpg", "width": 8, "height": 6}, {"id": 2, "file_name": "b.jpg"},
                           {"id": 3, "file_name": "c.jpg", "width": 8, "height": 6}, {"id": 4, "file_name": "d.jpg", "width": 8, "height": 6}],
                "annotations": [
                  {"id": 1, "image_id": 1, "bbox": [0, 0, 2, 2], "category_id": 4, "segmentation": [[0, 0, 2, 0, 2, 2]]},
                  {"id": 2, "image_id": 1, "bbox": [0, 0, 2, 2], "category_id": 5, "segmentation": {"counts": [3, 2], "size": [6, 8]}},
                  {"id": 3, "image_id": 3, "bbox": [0, 0, 2, 2], "category_id": 300, "segmentation": [[0, 0, 2, 0, 2, 2]]},
                  {"id": 4, "image_id": 4, "bbox": [0, 0, 2, 2], "category_id": 1}]}"#,
        );
        let m = enumerate(&path, dir.path(), true).unwrap();
        let Some(MaskSource::Objects { width: 8, height: 6, objects }) = m.mask_source(0) else {
            panic!("{:?}", m.mask_source(0))
        };
        assert_eq!(objects.iter().map(|o| o.0).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(objects[1].1, Segmentation::Rle { counts: vec![3, 2], size: [6, 8] });
        for (pos, says) in
            [(1, "no `width` and `height`"), (2, "category_id 300"), (3, "annotation 4 has no `segmentation`")]
        {
            let Some(MaskSource::Invalid(why)) = m.mask_source(pos) else { panic!("{:?}", m.mask_source(pos)) };
            assert!(why.contains(says) && why.contains("instances_train.json"), "{why}");
        }
        assert_ne!(m.fingerprint, enumerate(&path, dir.path(), false).unwrap().fingerprint);
        assert!(enumerate(&path, dir.path(), false).unwrap().masks.is_none());
    }

    #[test]
    fn a_file_that_is_not_coco_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        for (json, says) in [
            (r#"{"images": [{"id": 1}]}"#, "file_name"),
            (r#"{"images": [{"id": 1, "file_name": "a"}, {"id": 1, "file_name": "b"}]}"#, "listed twice"),
            (r#"{"images": ["#, "EOF"),
            (r#"{"images": []}"#, "no `images`"),
        ] {
            let path = write(dir.path(), json);
            let err = enumerate(&path, dir.path(), false).unwrap_err().to_string();
            assert!(err.contains(says), "{json}: {err}");
            assert!(says == "no `images`" || err.contains("instances_train.json"), "{err}");
        }
    }
}
