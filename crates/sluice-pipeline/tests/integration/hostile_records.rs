//! The hostile-input corpus for samples with boxes (docs/records.md, "Bad input"): sidecars
//! and a COCO file that are malformed, hold NaN, infinite, inverted, negative or outside
//! coordinates, mismatched labels, 10^6 boxes in one sample, or over 16 MiB, read from a
//! folder or from the members of a tar shard (`sidecars = true`). Each either fails its
//! sample with an error naming the sample and what is wrong (`on_error = "fail"` stops the
//! run with it; `"skip"` drops the sample and lists it) or is clamped by the stated rule;
//! nothing panics, also when the spec asks the sidecars for metadata fields (hostile field
//! values themselves, a 1 MiB caption or JSON nested 5000 deep, are in records_fields.rs).

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sluice_core::{Batch, ErrorPolicy, OpSpec, PipelineSpec, Size, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

const SIDE: u32 = 64;

fn options() -> DatasetOptions {
    DatasetOptions { images: 10, classes: 1, texture: 4, boxes: true, ..Default::default() }
}

/// `n` boxes in a sidecar or a COCO file's annotations for one image.
fn many_boxes(n: usize) -> String {
    let mut s = String::with_capacity(n * 12);
    for i in 0..n {
        let _ = write!(s, "{}[0,0,5,5]", if i == 0 { "" } else { "," });
    }
    s
}

fn spec(source: SourceSpec, on_error: ErrorPolicy) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, SIDE, 16);
    // Deterministic: resize the shorter side to SIDE, then the centre square.
    s.ops = vec![OpSpec::Decode, OpSpec::resize(SIDE), OpSpec::CenterCrop { size: Size::square(SIDE) }];
    s.shuffle = sluice_core::ShuffleSpec::None;
    s.threads = 2.into();
    s.on_error = on_error;
    s
}

fn all(loader: &Loader) -> Result<Vec<Batch>, String> {
    loader.iter().map(|b| b.map_err(|e| e.to_string())).collect()
}

/// The generated sample `i`'s sidecar.
fn sidecar(root: &Path, i: usize) -> PathBuf {
    root.join("class_000").join(format!("img_{i:07}.json"))
}

/// A box over the whole image and beyond, after the decode's clamp, the resize and the
/// centre crop: the whole output.
const CLAMPED: [f32; 4] = [0.0, 0.0, SIDE as f32, SIDE as f32];

/// The hostile sidecars: (sample, sidecar text or None to delete it, what its error
/// says; "" = loads, clamped). Sample 0 keeps its good sidecar.
fn hostile_sidecars() -> Vec<(usize, Option<String>, &'static str)> {
    let million =
        format!("{{\"boxes\": [{}], \"labels\": [{}]}}", many_boxes(1_000_000), vec!["1"; 1_000_000].join(","));
    let too_large = format!("{}{{}}", " ".repeat(16 << 20));
    vec![
        (1, Some(r#"{"boxes": [[1, 2, 3, 4]"#.into()), "not a boxes sidecar"),
        (2, Some(r#"{"boxes": [[NaN, 1, 2, 3]], "labels": [0]}"#.into()), "not a boxes sidecar"),
        (3, Some(r#"{"boxes": [[1, 2, 1e39, 4]], "labels": [0]}"#.into()), "finite"),
        (4, Some(r#"{"boxes": [[-50, -20, 1e6, 1e6], [-9, -9, -1, -1]], "labels": [4, 5]}"#.into()), ""),
        (5, Some(million), "limits.max_boxes"),
        (6, Some(r#"{"boxes": [[9, 0, 5, 5]], "labels": [0]}"#.into()), "x2 < x1"),
        (7, Some(r#"{"boxes": [[0, 0, 5, 5], [1, 1, 6, 6]], "labels": [0]}"#.into()), "2 boxes but 1 labels"),
        (8, None, "img_0000008.json"),
        (9, Some(too_large), "is over 16 MiB"),
    ]
}

/// Loads `source` (the generated folder with [`hostile_sidecars`] written in, as a folder
/// or packed into a shard) and checks every hostile sample: skipped naming `where_(i)` and
/// what is wrong, or clamped; under "fail", the run stops on sample 1.
fn check_hostile(source: SourceSpec, where_: &dyn Fn(usize) -> String) {
    let corpus = hostile_sidecars();
    // Skipped: the good and the clamped samples load; each bad one is listed by name.
    let loader = Loader::new(spec(source.clone(), ErrorPolicy::Skip), Shard::default()).unwrap();
    let batches = all(&loader).unwrap();
    let keys: Vec<u64> = batches.iter().flat_map(|b| b.keys.clone()).collect();
    assert_eq!(keys.len(), 2, "the good sample and the clamped one: {keys:?}");
    let b = &batches[0];
    let boxes = b.boxes.as_ref().unwrap();
    let at = keys
        .iter()
        .position(|&k| loader.manifest().display_path(sluice_core::SampleKey(k)).ends_with("img_0000004.jpg"));
    let at = at.unwrap_or_else(|| panic!("the sample with outside boxes loads: {keys:?}"));
    assert_eq!(boxes.counts[at], 1, "the box wholly outside is dropped");
    let row = at * boxes.max_boxes;
    let got: [f32; 4] = boxes.boxes[row * 4..row * 4 + 4].try_into().unwrap();
    assert_eq!(got, CLAMPED, "clamped to the image");
    assert_eq!(boxes.labels[row], 4);
    let skipped = loader.stats().skipped;
    for (i, _, says) in corpus.iter().filter(|c| !c.2.is_empty()) {
        let sample = format!("img_{i:07}.jpg");
        let s = skipped
            .iter()
            .find(|s| s.path.ends_with(&sample))
            .unwrap_or_else(|| panic!("{sample} not skipped: {skipped:?}"));
        let name = where_(*i);
        assert!(
            s.error.contains("bad boxes") && s.error.contains(says) && s.error.contains(&name),
            "{name}: {}",
            s.error
        );
    }

    // Failing: the run stops with the first bad sample's key, path and reason.
    let e = all(&Loader::new(spec(source, ErrorPolicy::Fail), Shard::default()).unwrap()).unwrap_err();
    assert!(e.contains(&where_(1)) && e.contains("not a boxes sidecar"), "{e}");
}

/// The generated folder, with the hostile sidecars written over its own.
fn hostile_folder(root: &Path) {
    write_dataset(root, &options(), &|_| {}).unwrap();
    for (i, text, _) in &hostile_sidecars() {
        match text {
            Some(t) => std::fs::write(sidecar(root, *i), t).unwrap(),
            None => std::fs::remove_file(sidecar(root, *i)).unwrap(),
        }
    }
}

#[test]
fn hostile_sidecars_fail_their_sample_by_name_or_are_clamped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    hostile_folder(&root);
    let shown = |i: usize| sidecar(&root, i).display().to_string();
    check_hostile(SourceSpec::Sidecar { root: root.clone(), masks: false }, &|i| {
        // Over `limits.max_boxes` is found at load time, naming the sample.
        if i == 5 {
            root.join(format!("class_000/img_{i:07}.jpg")).display().to_string()
        } else {
            shown(i)
        }
    });
}

#[test]
fn hostile_tar_sidecars_fail_their_sample_naming_shard_and_member_or_are_clamped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    hostile_folder(&root);
    let shard = dir.path().join("hostile.tar");
    crate::source_tar_sidecars::pack_folder(&root, &shard);
    let shown = shard.display().to_string();
    check_hostile(SourceSpec::Tar { shards: vec![shard.clone()], sidecars: true, masks: false }, &|i| {
        // A missing sidecar and one over `limits.max_boxes` are named by the image member.
        let member = if i == 5 || i == 8 { format!("img_{i:07}.jpg") } else { format!("img_{i:07}.json") };
        format!("{shown}:class_000/{member}")
    });
}

#[test]
fn a_hostile_coco_file_fails_only_the_images_it_damages_or_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    write_dataset(&root, &options(), &|_| {}).unwrap();
    let images: Vec<String> =
        (0..5).map(|i| format!(r#"{{"id": {i}, "file_name": "class_000/img_{i:07}.jpg"}}"#)).collect();
    let million: Vec<String> =
        (0..1_000_000).map(|_| r#"{"image_id":3,"bbox":[0,0,5,5],"category_id":1}"#.to_string()).collect();
    let annotations = [
        r#"{"id": 10, "image_id": 0, "bbox": [2, 3, 10, 10], "category_id": 1}"#.to_string(),
        r#"{"id": 11, "image_id": 1, "bbox": [1, 2, 3], "category_id": 1}"#.to_string(),
        r#"{"id": 12, "image_id": 2, "bbox": [1, 2, -3, 4], "category_id": 1}"#.to_string(),
        r#"{"id": 14, "image_id": 4, "bbox": [-50, -20, 1000050, 1000050], "category_id": 4}"#.to_string(),
        r#"{"id": 15, "image_id": 4, "bbox": [-9, -9, 8, 8], "category_id": 5}"#.to_string(),
        r#"{"id": 16, "image_id": 77, "bbox": [0, 0, 1, 1], "category_id": 5}"#.to_string(),
    ]
    .into_iter()
    .chain(million)
    .collect::<Vec<_>>();
    let path = root.join("instances.json");
    std::fs::write(
        &path,
        format!(r#"{{"images": [{}], "annotations": [{}]}}"#, images.join(","), annotations.join(",")),
    )
    .unwrap();
    let source = SourceSpec::Coco { annotations: path.clone(), images: root.clone(), masks: false };
    let loader = Loader::new(spec(source.clone(), ErrorPolicy::Skip), Shard::default()).unwrap();
    let batches = all(&loader).unwrap();
    let keys: Vec<u64> = batches.iter().flat_map(|b| b.keys.clone()).collect();
    assert_eq!(keys.len(), 2, "images 0 and 4 load: {keys:?}");
    let boxes = batches[0].boxes.as_ref().unwrap();
    let row = boxes.max_boxes;
    assert_eq!(boxes.counts[1], 1, "image 4's box wholly outside is dropped");
    let got: [f32; 4] = boxes.boxes[row * 4..row * 4 + 4].try_into().unwrap();
    assert_eq!(got, CLAMPED, "clamped to the image");
    let skipped = loader.stats().skipped;
    for (i, says) in [(1, "annotation 11"), (2, "negative width"), (3, "limits.max_boxes")] {
        let name = format!("img_{i:07}");
        let s = skipped
            .iter()
            .find(|s| s.path.contains(&name))
            .unwrap_or_else(|| panic!("{name} not skipped: {skipped:?}"));
        assert!(s.error.contains("bad boxes") && s.error.contains(says), "{name}: {}", s.error);
    }

    // NaN is not JSON: the whole file is refused, naming it with the line and column.
    std::fs::write(&path, r#"{"images": [{"id": 0, "file_name": "a.jpg"}], "annotations": [{"image_id": 0, "bbox": [NaN, 0, 1, 1], "category_id": 1}]}"#).unwrap();
    let e = Loader::new(spec(source, ErrorPolicy::Skip), Shard::default()).err().unwrap().to_string();
    assert!(e.contains("instances.json") && e.contains("column"), "{e}");
}

#[test]
fn hostile_sidecars_with_fields_asked_for_fail_each_sample_by_name_without_a_panic() {
    // The same corpus, read for a `score` field none of them has, from a folder and a shard:
    // every sample fails (naming its sidecar's own fault where it has one, else the missing
    // field), and none panics the enumeration or the loader.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    hostile_folder(&root);
    let shard = dir.path().join("hostile.tar");
    crate::source_tar_sidecars::pack_folder(&root, &shard);
    for source in [
        SourceSpec::Sidecar { root: root.clone(), masks: false },
        SourceSpec::Tar { shards: vec![shard.clone()], sidecars: true, masks: false },
    ] {
        let mut s = spec(source.clone(), ErrorPolicy::Skip);
        s.fields = vec![sluice_core::FieldSpec {
            name: "score".into(),
            kind: sluice_core::FieldKindName::Float,
            classes: None,
        }];
        let loader = Loader::new(s, Shard::default()).unwrap();
        let batches = all(&loader).unwrap();
        assert_eq!(batches.iter().map(Batch::len).sum::<usize>(), 0, "{source:?}: no sample has a score");
        let skipped = loader.stats().skipped;
        assert_eq!(skipped.len(), 10, "{source:?}: {skipped:?}");
        for (i, _, says) in hostile_sidecars() {
            let sample = format!("img_{i:07}.jpg");
            let s = skipped.iter().find(|s| s.path.ends_with(&sample)).unwrap();
            // Over `limits.max_boxes` is found at load time, after the fields.
            let want = if says.is_empty() || i == 5 { "field `score` is missing" } else { says };
            assert!(s.error.contains("bad field") && s.error.contains(want), "{sample}: {} should say {want}", s.error);
        }
        let good = skipped.iter().find(|s| s.path.ends_with("img_0000000.jpg")).unwrap();
        assert!(good.error.contains("field `score` is missing"), "{}", good.error);
    }
}

/// The width and height of the JPEG at `path`, from its header.
fn jpeg_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    let header = sluice_codec::JpegDecoder::new(1 << 26).unwrap().header(&bytes).unwrap();
    (header.width, header.height)
}

#[test]
fn a_coco_mask_bomb_fails_its_sample_before_anything_is_painted() {
    // Issue 38 item 6: a small image whose annotations declare it 8192x8192, with eight RLE
    // masks each setting all of those pixels (0.5 G pixel writes), beside an honest image.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    write_dataset(&root, &options(), &|_| {}).unwrap();
    let honest = "class_000/img_0000001.jpg";
    let (w, h) = jpeg_size(&root.join(honest));
    let bomb: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "image_id": 1, "bbox": [0, 0, 1, 1], "category_id": 1,
                    "segmentation": {{"counts": [0, 67108864], "size": [8192, 8192]}}}}"#
            )
        })
        .collect();
    let fine = format!(
        r#"{{"id": 9, "image_id": 2, "bbox": [0, 0, 1, 1], "category_id": 3,
            "segmentation": {{"counts": [0, {}], "size": [{h}, {w}]}}}}"#,
        w * h
    );
    let json = format!(
        r#"{{"images": [{{"id": 1, "file_name": "class_000/img_0000000.jpg", "width": 8192, "height": 8192}},
                        {{"id": 2, "file_name": "{honest}", "width": {w}, "height": {h}}}],
            "annotations": [{}, {fine}]}}"#,
        bomb.join(",")
    );
    assert!(json.len() < 2048, "the bomb is a small file: {} bytes", json.len());
    let path = root.join("instances.json");
    std::fs::write(&path, json).unwrap();
    let source = SourceSpec::Coco { annotations: path, images: root.clone(), masks: true };
    let loader = Loader::new(spec(source, ErrorPolicy::Skip), Shard::default()).unwrap();
    let t0 = std::time::Instant::now();
    let batches = all(&loader).unwrap();
    let took = t0.elapsed();
    let keys: Vec<u64> = batches.iter().flat_map(|b| b.keys.clone()).collect();
    assert_eq!(keys.len(), 1, "the honest image loads: {keys:?}");
    let mask = batches[0].boxes.as_ref().unwrap().masks.as_ref().unwrap();
    assert!(mask.as_bytes().iter().all(|&v| v == 3), "the honest mask covers its whole image");
    let skipped = loader.stats().skipped;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    let why = &skipped[0].error;
    let (bw, bh) = jpeg_size(&root.join("class_000/img_0000000.jpg"));
    assert!(
        skipped[0].path.contains("img_0000000")
            && why.contains("declare a 8192x8192")
            && why.contains(&format!("{bw}x{bh}")),
        "{why}"
    );
    assert!(took.as_secs_f64() < 10.0, "the bomb took {:.1} s to refuse: {why}", took.as_secs_f64());
}
