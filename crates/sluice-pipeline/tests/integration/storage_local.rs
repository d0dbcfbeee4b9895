//! Local storage: whole files and tar members, errors mapped to sample error kinds.
// Fixture helpers sit outside #[test] fns; a failed setup should fail the test.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_core::{Location, SampleErrorKind, StorageSpec};
use sluice_pipeline::storage::{open_storage, LocalStorage, Roots, Storage};

fn file(p: impl Into<PathBuf>) -> Location {
    Location::File { path: p.into() }
}

#[test]
fn reads_whole_files_relative_or_absolute_reusing_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    fs::write(dir.path().join("a.jpg"), &data).unwrap();
    fs::write(dir.path().join("b.jpg"), &data[..4000]).unwrap();
    let s = LocalStorage::new();

    let mut buf = vec![9u8; 3];
    s.read(dir.path(), file("a.jpg").view(), 5000, &mut buf).unwrap();
    assert_eq!(buf, data);

    // A smaller sample fits the capacity: same allocation, old bytes gone.
    let ptr = buf.as_ptr();
    s.read(dir.path(), file("b.jpg").view(), 5000, &mut buf).unwrap();
    assert_eq!(buf, &data[..4000]);
    assert_eq!(buf.as_ptr(), ptr);

    // An absolute location ignores the root.
    s.read(Path::new("/nonexistent-root"), file(dir.path().join("a.jpg")).view(), 5000, &mut buf).unwrap();
    assert_eq!(buf, data);
}

#[test]
fn missing_empty_oversized_and_directory_samples_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("empty.jpg"), b"").unwrap();
    fs::write(dir.path().join("big.jpg"), vec![1u8; 101]).unwrap();
    fs::create_dir(dir.path().join("folder.jpg")).unwrap();
    let s = LocalStorage::new();
    let mut buf = Vec::new();

    assert_eq!(s.read(dir.path(), file("nope.jpg").view(), 100, &mut buf), Err(SampleErrorKind::Missing));
    assert_eq!(s.read(dir.path(), file("empty.jpg").view(), 100, &mut buf), Err(SampleErrorKind::Empty));
    match s.read(dir.path(), file("big.jpg").view(), 100, &mut buf) {
        Err(SampleErrorKind::Io(msg)) => {
            assert!(msg.contains("limits.max_file_bytes") && msg.contains("101"), "{msg}");
        }
        other => panic!("expected an over-limit error, got {other:?}"),
    }
    s.read(dir.path(), file("big.jpg").view(), 101, &mut buf).unwrap();
    assert_eq!(buf.len(), 101);
    assert!(matches!(s.read(dir.path(), file("folder.jpg").view(), 100, &mut buf), Err(SampleErrorKind::Refused(_))));
}

#[test]
fn tar_members_are_read_by_offset_with_limits_and_missing_shards() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let content = b"0123456789abcdef";
    fs::write(&shard, content).unwrap();
    let member = |offset, len| Location::TarMember { shard: "s.tar".into(), member: "m.jpg".into(), offset, len };
    let s = LocalStorage::new();
    let mut buf = Vec::new();

    s.read(dir.path(), member(4, 6).view(), 100, &mut buf).unwrap();
    assert_eq!(buf, b"456789");
    assert_eq!(s.read(dir.path(), member(4, 0).view(), 100, &mut buf), Err(SampleErrorKind::Empty));
    assert!(
        matches!(s.read(dir.path(), member(4, 6).view(), 5, &mut buf), Err(SampleErrorKind::Io(m)) if m.contains("limits.max_file_bytes"))
    );
    assert!(
        matches!(s.read(dir.path(), member(10, 7).view(), 100, &mut buf), Err(SampleErrorKind::Io(m)) if m.contains("short read"))
    );
    assert!(buf.is_empty(), "a failed read leaves no stale bytes");
    let gone = Location::TarMember { shard: "gone.tar".into(), member: "m.jpg".into(), offset: 0, len: 4 };
    assert_eq!(s.read(dir.path(), gone.view(), 100, &mut buf), Err(SampleErrorKind::Missing));
}

#[test]
fn more_shards_than_open_handles_still_read_correctly_from_many_threads() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5u8 {
        fs::write(dir.path().join(format!("{i}.tar")), vec![i; 64]).unwrap();
    }
    let s = LocalStorage::with_max_open_shards(2);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (s, root) = (&s, dir.path());
            scope.spawn(move || {
                let mut buf = Vec::new();
                for round in 0..50u64 {
                    let i = (t + round) % 5;
                    let loc = Location::TarMember {
                        shard: format!("{i}.tar").into(),
                        member: "x.jpg".into(),
                        offset: round % 8,
                        len: 8,
                    };
                    s.read(root, loc.view(), 100, &mut buf).unwrap();
                    assert_eq!(buf, vec![i as u8; 8]);
                }
            });
        }
    });
    assert_eq!(s.open_shards(), 2);
}

#[test]
fn open_storage_builds_what_the_spec_names() {
    assert_eq!(open_storage(&StorageSpec::Local).unwrap().name(), "local");
    let s =
        open_storage(&StorageSpec::Throttled { latency_ms: 0.0, bandwidth_mb_s: 1000.0, shared_link: None }).unwrap();
    assert_eq!(s.name(), "throttled(local)");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.jpg"), b"abc").unwrap();
    let mut buf = Vec::new();
    s.read(dir.path(), file("a.jpg").view(), 10, &mut buf).unwrap();
    assert_eq!(buf, b"abc");
}

/// Reads `location` on another thread; `None` if it did not return within 10 s.
fn read_with_timeout(s: Arc<LocalStorage>, root: &Path, location: Location) -> Option<Result<(), SampleErrorKind>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = tx.send(s.read(&root, location.view(), 1 << 20, &mut buf));
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
}

#[test]
fn fifos_and_devices_are_refused_at_once_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.jpg");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let s = Arc::new(LocalStorage::new());
    let got = read_with_timeout(s.clone(), dir.path(), file("pipe.jpg")).expect("reading a FIFO blocked the thread");
    match got {
        Err(SampleErrorKind::Refused(m)) => assert!(m.contains("FIFO"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    match read_with_timeout(s, dir.path(), file("/dev/null")).unwrap() {
        Err(SampleErrorKind::Refused(m)) => assert!(m.contains("character device"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn confined_reads_refuse_whatever_resolves_out_of_the_roots_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let outside = dir.path().join("secret");
    fs::create_dir_all(data.join("sub")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(data.join("a.jpg"), b"inside").unwrap();
    fs::write(data.join("sub/b.jpg"), b"inside too").unwrap();
    fs::write(outside.join("a.jpg"), b"secret").unwrap();
    fs::write(outside.join("b.jpg"), b"secret").unwrap();
    let s = Arc::new(LocalStorage::confined(Arc::new(Roots::open(std::slice::from_ref(&data)).unwrap())));
    let mut buf = Vec::new();
    s.read(&data, file("a.jpg").view(), 100, &mut buf).unwrap();
    assert_eq!(buf, b"inside");
    // A symlink that stays inside the root is fine.
    std::os::unix::fs::symlink(data.join("a.jpg"), data.join("alias.jpg")).unwrap();
    s.read(&data, file("alias.jpg").view(), 100, &mut buf).unwrap();
    assert_eq!(buf, b"inside");
    let refused = |location: Location| match s.read(&data, location.view(), 100, &mut Vec::new()) {
        Err(SampleErrorKind::Refused(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // The file, then a folder on its path, swapped for symlinks out of the root.
    fs::remove_file(data.join("a.jpg")).unwrap();
    std::os::unix::fs::symlink(outside.join("a.jpg"), data.join("a.jpg")).unwrap();
    let m = refused(file("a.jpg"));
    assert!(m.contains("outside the allowed roots"), "{m}");
    fs::remove_dir_all(data.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, data.join("sub")).unwrap();
    assert!(refused(file("sub/b.jpg")).contains("outside the allowed roots"));
    assert!(refused(file("../secret/b.jpg")).contains("outside the allowed roots"));
    assert!(refused(file(outside.join("b.jpg"))).contains("outside the allowed roots"));
}

#[test]
fn enumerating_within_roots_refuses_every_file_a_source_opens_out_of_them() {
    use sluice_core::SourceSpec;
    use sluice_pipeline::source::{build_manifest, build_manifest_within, SourceError};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let outside = dir.path().join("secret");
    fs::create_dir_all(data.join("s")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("key.json"), br#"{"boxes": [], "private_key": "k"}"#).unwrap();
    fs::write(outside.join("list.txt"), "a.jpg 1\n").unwrap();
    fs::write(outside.join("instances.json"), r#"{"images": [{"id": 1, "file_name": "a.jpg"}]}"#).unwrap();
    fs::write(outside.join("s.tar"), [0u8; 1024]).unwrap();
    fs::write(data.join("s/a.jpg"), b"x").unwrap();
    let link = |name: &str, to: &str| std::os::unix::fs::symlink(outside.join(to), data.join(name)).unwrap();
    link("s/a.json", "key.json");
    link("list.txt", "list.txt");
    link("instances.json", "instances.json");
    link("s.tar", "s.tar");
    let roots = Roots::open(std::slice::from_ref(&data)).unwrap();
    for (spec, what, names) in [
        (SourceSpec::Sidecar { root: data.join("s"), masks: false }, "sidecar", "a.json"),
        (SourceSpec::FileList { path: data.join("list.txt"), root: None }, "file list", "list.txt"),
        (
            SourceSpec::Coco { annotations: data.join("instances.json"), images: data.clone(), masks: false },
            "COCO annotations",
            "instances.json",
        ),
        (SourceSpec::Tar { shards: vec![data.join("s.tar")], sidecars: true, masks: false }, "tar shard", "s.tar"),
    ] {
        match build_manifest_within(&spec, Some(&roots)) {
            Err(e @ SourceError::OutsideRoots { what: w, .. }) if w == what => {
                let text = e.to_string();
                assert!(text.contains(names) && text.contains("outside the allowed roots"), "{text}");
            }
            other => panic!("{what}: {:?}", other.map(|m| m.len())),
        }
    }
    // Without roots (the library on its own machine) the sidecar is read.
    assert!(build_manifest(&SourceSpec::Sidecar { root: data.join("s"), masks: false }).is_ok());
}
