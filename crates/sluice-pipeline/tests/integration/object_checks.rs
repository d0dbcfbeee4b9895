//! What every object-URL scheme served by the shared SeaweedFS of `source_s3.rs` must do
//! (`source_gcs.rs`, `source_http.rs`): each check uploads its data through S3 under
//! `prefix` of the test bucket, then reads it through the scheme under test, whose URL of
//! the bucket's root is `base` (`gs://bucket`, `http://127.0.0.1:PORT/buckets/bucket`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;
use sluice_core::SourceSpec;
use sluice_pipeline::source::build_manifest;
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

use crate::source_s3::{bucket, collect, dataset, folder, put, runtime, spec, store, upload_tree, walk, write_parquet};

/// An image folder under `base/prefix` gives the batches (and the manifest) of the same
/// files on disk.
pub(crate) fn image_folder(base: &str, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 11, 0);
    upload_tree(&bucket(), prefix, &root);
    let url = format!("{base}/{prefix}");
    let local = collect(spec(SourceSpec::ImageFolder { root: root.clone() }));
    assert_eq!(local.len(), 3, "11 images in batches of 5");
    assert_eq!(collect(spec(folder(&url))), local, "{url} gives other batches than the files on disk");
    let remote = build_manifest(&folder(&url)).unwrap();
    let on_disk = build_manifest(&SourceSpec::ImageFolder { root }).unwrap();
    assert_eq!(remote.classes, on_disk.classes);
    assert_eq!(remote.fingerprint_hex(), on_disk.fingerprint_hex(), "same files, same manifest");
}

/// A tar shard at `base/prefix/det-000.tar`, indexed whole and then read member by member
/// (byte ranges), gives the images, boxes and masks of the same shard on disk.
pub(crate) fn tar_shard(base: &str, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("det");
    let o = DatasetOptions { images: 10, classes: 1, texture: 4, boxes: true, masks: true, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let shard = dir.path().join("det-000.tar");
    crate::source_tar_sidecars::pack_folder(&root, &shard);
    put(&store(&bucket()), &format!("{prefix}/det-000.tar"), std::fs::read(&shard).unwrap());

    let tar = |shard: PathBuf| SourceSpec::Tar { shards: vec![shard], sidecars: true, masks: true };
    let local = collect(spec(tar(shard)));
    let url = format!("{base}/{prefix}/det-000.tar");
    assert_eq!(local.len(), 2);
    let remote = collect(spec(tar(PathBuf::from(&url))));
    assert_eq!(remote, local, "{url} gives other samples than the shard on disk");
    let boxes = remote[0].boxes.as_ref().unwrap();
    assert!(boxes.counts.iter().any(|&n| n > 0) && boxes.masks.is_some(), "{boxes:?}");
}

/// Parquet files under `base/prefix` give the batches of the same files on disk: one named
/// by its URL and, when `list`, the prefix holding both.
pub(crate) fn parquet_files(base: &str, prefix: &str, list: bool) {
    let dir = tempfile::tempdir().unwrap();
    let jpegs: Vec<Vec<u8>> = (0..14).map(|i| sluice_synth::noise_jpeg(i, 20).unwrap()).collect();
    write_parquet(&dir.path().join("a.parquet"), &jpegs[..9], 4);
    write_parquet(&dir.path().join("b.parquet"), &jpegs[9..], 4);
    upload_tree(&bucket(), prefix, dir.path());
    let parquet = |path: PathBuf| SourceSpec::Parquet { path, image_column: "image".into(), label_column: None };

    let one = format!("{base}/{prefix}/b.parquet");
    let local = collect(spec(parquet(dir.path().join("b.parquet"))));
    assert_eq!(collect(spec(parquet(PathBuf::from(&one)))), local, "{one} gives other batches than on disk");
    if list {
        let local = collect(spec(parquet(dir.path().to_path_buf())));
        assert_eq!(local.len(), 3, "14 rows in batches of 5");
        let url = format!("{base}/{prefix}");
        assert_eq!(collect(spec(parquet(PathBuf::from(&url)))), local, "{url} gives other batches than on disk");
    }
}

/// An object listed and then deleted fails its read naming its URL, and a shard that is not
/// there fails the build naming its URL.
pub(crate) fn missing_objects(base: &str, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 4, 0);
    upload_tree(&bucket(), prefix, &root);
    let s = store(&bucket());
    put(&s, &format!("{prefix}/class_000/gone.jpg"), std::fs::read(walk(&root).first().unwrap()).unwrap());
    let url = format!("{base}/{prefix}");
    assert_eq!(build_manifest(&folder(&url)).unwrap().len(), 5);
    runtime().block_on(s.delete(&ObjectPath::from(format!("{prefix}/class_000/gone.jpg")))).unwrap();

    let loader = Loader::new(spec(folder(&url)), Shard::default()).unwrap();
    let err = loader.iter().find_map(Result::err).expect("reading a deleted object fails").to_string();
    assert!(err.contains(&format!("{url}/class_000/gone.jpg")) && err.contains("not found"), "{err}");

    let absent = format!("{base}/{prefix}/absent-000.tar");
    let tar = SourceSpec::Tar { shards: vec![PathBuf::from(&absent)], sidecars: false, masks: false };
    let err = build_manifest(&tar).unwrap_err().to_string();
    assert!(err.contains(&absent), "the error names the shard: {err}");
}

/// Reads confined to `base/prefix` are served; confined to any of `others`, refused before
/// any request, naming the object.
pub(crate) fn confined(base: &str, prefix: &str, others: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 3, 0);
    upload_tree(&bucket(), prefix, &root);
    let url = format!("{base}/{prefix}");
    let loader = |allowed: &str| {
        Loader::new(spec(folder(&url)), Shard::default()).unwrap().confine_reads(&[PathBuf::from(allowed)]).unwrap()
    };
    assert_eq!(loader(&url).iter().map(|b| b.unwrap().len()).sum::<usize>(), 3);
    for other in others {
        let err = loader(other).iter().next().unwrap().unwrap_err().to_string();
        assert!(err.contains("outside the allowed roots"), "allowed {other}: {err}");
        assert!(err.contains(&format!("{url}/class_")), "the error names the object: {err}");
    }
}
