//! Tar shards with per-sample JSON sidecars (WebDataset's `0001.jpg` + `0001.json` [+
//! `0001.mask.png`]): the same samples packed into a shard give what the sidecar folder
//! source gives, and a shard's hostile members (a name climbing out with `..`, a header
//! declaring more bytes than the shard holds, a mask named outside the sidecar's folder)
//! are refused by name or read only as what they are: keys into the shard.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::fs::File;
use std::path::{Path, PathBuf};

use sluice_core::{Annotation, Batch, ErrorPolicy, MaskSource, OpSpec, PipelineSpec, Size, SourceSpec};
use sluice_pipeline::source::{build_manifest, SourceError};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};
use tar::{Builder, EntryType, Header};

const SIDE: u32 = 48;

/// Writes `members` (name, bytes) as a tar shard, in order; names are written raw, `..`
/// and all, as a hostile archiver would.
pub(crate) fn write_shard(path: &Path, members: &[(String, Vec<u8>)]) {
    let mut b = Builder::new(File::create(path).unwrap());
    for (name, data) in members {
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap();
}

/// The generated folder's samples (`class_000/img_*.jpg` with their sidecars and masks),
/// as members of one shard in the folder source's order.
pub(crate) fn pack_folder(root: &Path, shard: &Path) {
    let class = root.join("class_000");
    let mut images: Vec<PathBuf> = std::fs::read_dir(&class)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    images.sort();
    let mut members = Vec::new();
    for image in images {
        let stem = image.file_stem().unwrap().to_string_lossy().into_owned();
        for suffix in [".jpg", ".json", ".mask.png"] {
            let file = class.join(format!("{stem}{suffix}"));
            if file.exists() {
                members.push((format!("class_000/{stem}{suffix}"), std::fs::read(file).unwrap()));
            }
        }
    }
    write_shard(shard, &members);
}

fn spec(source: SourceSpec) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, SIDE, 4);
    s.ops = vec![OpSpec::Decode, OpSpec::resize(SIDE), OpSpec::CenterCrop { size: Size::square(SIDE) }];
    s.shuffle = sluice_core::ShuffleSpec::None;
    s.threads = 2.into();
    s.on_error = ErrorPolicy::Fail;
    s
}

fn batches(source: SourceSpec) -> Vec<Batch> {
    let loader = Loader::new(spec(source), Shard::default()).unwrap();
    loader.iter().collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn a_shard_with_sidecars_gives_the_folder_sources_boxes_labels_and_masks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let options = DatasetOptions { images: 6, classes: 1, texture: 4, boxes: true, masks: true, ..Default::default() };
    write_dataset(&root, &options, &|_| {}).unwrap();
    let shard = dir.path().join("shard-000.tar");
    pack_folder(&root, &shard);

    for masks in [false, true] {
        let folder = batches(SourceSpec::Sidecar { root: root.clone(), masks });
        let tar = batches(SourceSpec::Tar { shards: vec![shard.clone()], sidecars: true, masks });
        assert_eq!(folder.len(), tar.len());
        let mut boxes_seen = 0;
        for (f, t) in folder.iter().zip(&tar) {
            assert_eq!(f.labels, t.labels);
            assert_eq!(f.images, t.images, "the same pixels");
            let (fb, tb) = (f.boxes.as_ref().unwrap(), t.boxes.as_ref().unwrap());
            assert_eq!(fb, tb, "boxes, box labels and masks (masks = {masks})");
            assert_eq!(tb.masks.is_some(), masks);
            boxes_seen += tb.counts.iter().sum::<i32>();
        }
        assert!(boxes_seen > 0, "the generated samples have boxes");
    }

    // Without `sidecars`, the same shard is images only: no boxes reach the batch.
    let plain = batches(SourceSpec::Tar { shards: vec![shard], sidecars: false, masks: false });
    assert!(plain.iter().all(|b| b.boxes.is_none()));
}

#[test]
fn an_image_without_its_sidecar_fails_when_loaded_and_a_sidecar_without_its_image_is_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    write_dataset(&root, &DatasetOptions { images: 3, classes: 1, texture: 4, ..Default::default() }, &|_| {}).unwrap();
    let jpg = |i: usize| std::fs::read(root.join(format!("class_000/img_{i:07}.jpg"))).unwrap();
    let shard = dir.path().join("s.tar");
    let json = br#"{"boxes": [[1, 2, 10, 12]], "labels": [3], "label": 5}"#.to_vec();
    write_shard(
        &shard,
        &[
            ("a.json".into(), json.clone()),
            ("a.jpg".into(), jpg(0)), // its sidecar before it: still paired
            ("b.jpg".into(), jpg(1)), // no sidecar
            ("orphan.json".into(), json.clone()),
            ("c.jpg".into(), jpg(2)),
            ("c.json".into(), json),
        ],
    );
    let source = SourceSpec::Tar { shards: vec![shard.clone()], sidecars: true, masks: false };
    let m = build_manifest(&source).unwrap();
    assert_eq!(m.len(), 3, "a, b and c; the orphan sidecar is not a sample");
    assert_eq!(m.entries().map(|e| e.label).collect::<Vec<_>>(), vec![5, -1, 5], "the sidecar's `label`");
    let Some(Annotation::Invalid(why)) = m.annotation(1) else { panic!("{:?}", m.annotation(1)) };
    assert!(why.contains("s.tar:b.jpg") && why.contains("no sidecar b.json"), "{why}");

    // Skipped by name under `on_error = "skip"`; the run stops on it under "fail".
    let mut s = spec(source.clone());
    s.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(s, Shard::default()).unwrap();
    let got: Vec<Batch> = loader.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(got.iter().map(Batch::len).sum::<usize>(), 2);
    let skipped = loader.stats().skipped;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].path.ends_with("s.tar:b.jpg") && skipped[0].error.contains("no sidecar"), "{skipped:?}");
    let e = Loader::new(spec(source), Shard::default()).unwrap().iter().find_map(Result::err).unwrap().to_string();
    assert!(e.contains("s.tar:b.jpg") && e.contains("no sidecar b.json"), "{e}");
}

#[test]
fn hostile_members_are_keys_not_paths_and_huge_declared_sizes_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let options = DatasetOptions { images: 1, classes: 1, texture: 4, boxes: true, masks: true, ..Default::default() };
    write_dataset(&root, &options, &|_| {}).unwrap();
    let jpg = std::fs::read(root.join("class_000/img_0000000.jpg")).unwrap();
    let png = std::fs::read(root.join("class_000/img_0000000.mask.png")).unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    // A real sidecar where `../` from the shard's folder would land: never read.
    std::fs::write(dir.path().join("up.json"), r#"{"boxes": [[0, 0, 2, 2]], "labels": [9]}"#).unwrap();
    let shard = shards.join("evil.tar");
    write_shard(
        &shard,
        &[
            ("../up.jpg".into(), jpg.clone()),
            ("../up.json".into(), br#"{"boxes": [[1, 1, 20, 20]], "labels": [1], "mask": "../m.mask.png"}"#.to_vec()),
            ("/abs/x.jpg".into(), jpg.clone()),
            ("/abs/x.json".into(), br#"{"boxes": [], "labels": [], "mask": "/etc/m.mask.png"}"#.to_vec()),
            ("y.jpg".into(), jpg),
            ("y.json".into(), br#"{"boxes": [], "labels": [], "mask": "gone.mask.png"}"#.to_vec()),
            ("y.mask.png".into(), png),
        ],
    );
    let m = build_manifest(&SourceSpec::Tar { shards: vec![shard.clone()], sidecars: true, masks: true }).unwrap();
    assert_eq!(m.len(), 3);
    let Some(Annotation::Boxes(t)) = m.annotation(0) else { panic!("{:?}", m.annotation(0)) };
    assert_eq!(t.labels, vec![1], "the member's own sidecar, not the file `..` names");
    for (i, says) in [
        (0, "evil.tar:../up.json: mask ../m.mask.png must be a relative path without `..`"),
        (1, "must be a relative path without `..`"),
        (2, "evil.tar:y.json: its mask"),
    ] {
        let Some(MaskSource::Invalid(why)) = m.mask_source(i) else { panic!("{i}: {:?}", m.mask_source(i)) };
        assert!(why.contains(says), "{i}: {why}");
    }

    // A sidecar whose header declares a terabyte: the shard is refused naming the member.
    let mut bytes = std::fs::read(&shard).unwrap();
    let header = bytes.windows(8).position(|w| w == b"y.json\0\0").unwrap();
    let mut h = Header::new_old();
    h.as_mut_bytes().copy_from_slice(&bytes[header..header + 512]);
    h.set_size(1 << 40);
    h.set_cksum();
    bytes[header..header + 512].copy_from_slice(h.as_bytes());
    std::fs::write(&shard, bytes).unwrap();
    let e = build_manifest(&SourceSpec::Tar { shards: vec![shard], sidecars: true, masks: false }).unwrap_err();
    assert!(matches!(e, SourceError::TruncatedShard { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("evil.tar:y.json") && e.contains("truncated"), "{e}");
}
