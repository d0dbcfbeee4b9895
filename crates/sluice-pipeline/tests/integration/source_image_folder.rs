//! ImageFolder enumeration against fixtures built in temp dirs.
// Fixture helpers sit outside #[test] fns; a failed setup should fail the test.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use sluice_core::{LocationRef, SourceSpec};
use sluice_pipeline::source::{build_manifest, image_folder, SourceError};
use sluice_pipeline::storage::{LocalStorage, Storage};

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
}

fn paths(m: &sluice_core::Manifest) -> Vec<(String, i64, u64)> {
    m.entries()
        .map(|e| match e.location {
            LocationRef::File { path } => (path.to_string_lossy().into_owned(), e.label, e.size),
            other => panic!("unexpected location {other:?}"),
        })
        .collect()
}

/// A dataset whose expected order exercises class sorting, case-insensitive extensions,
/// ignored files and torchvision's `sorted(os.walk)` folder order.
fn fixture(root: &Path) {
    write(root, "dog/1.jpeg", b"dog-one");
    write(root, "cat/b.jpg", b"bb");
    write(root, "cat/a.PNG", b"a");
    write(root, "cat/notes.txt", b"not an image");
    write(root, "cat/sub/z.jpeg", b"zzz");
    write(root, "cat/sub/deeper/q.jpg", b"qqqq");
    write(root, "cat/sub-2/m.png", b"mmmmm");
    write(root, "Zebra/x.png", b"xxxxxx");
    write(root, "README.md", b"top-level files are not classes");
}

#[test]
fn classes_labels_order_and_relative_paths_follow_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let m = image_folder::enumerate(dir.path()).unwrap();

    assert_eq!(m.classes, vec!["Zebra", "cat", "dog"]);
    assert_eq!(m.root, dir.path());
    let want: Vec<(String, i64, u64)> = [
        ("Zebra/x.png", 0, 6),
        ("cat/a.PNG", 1, 1),
        ("cat/b.jpg", 1, 2),
        // "cat/sub" < "cat/sub-2" < "cat/sub/deeper" as strings ('-' sorts before '/').
        ("cat/sub/z.jpeg", 1, 3),
        ("cat/sub-2/m.png", 1, 5),
        ("cat/sub/deeper/q.jpg", 1, 4),
        ("dog/1.jpeg", 2, 7),
    ]
    .iter()
    .map(|(p, l, s)| (p.to_string(), *l, *s))
    .collect();
    assert_eq!(paths(&m), want);
    for (i, e) in m.entries().enumerate() {
        assert_eq!(e.key.0, i as u64);
    }
}

#[test]
fn entries_read_back_as_their_files() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let m = build_manifest(&SourceSpec::ImageFolder { root: dir.path().to_path_buf() }).unwrap();
    let storage = LocalStorage::new();
    let mut buf = Vec::new();
    for e in m.entries() {
        storage.read(&m.root, e.location, 1 << 20, &mut buf).unwrap();
        assert_eq!(buf, fs::read(m.display_path(e.key)).unwrap());
        assert_eq!(buf.len() as u64, e.size);
    }
}

#[test]
fn fingerprint_is_stable_survives_a_move_and_tracks_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    fixture(&root);
    let a = image_folder::enumerate(&root).unwrap();
    let b = image_folder::enumerate(&root).unwrap();
    assert_eq!(a.fingerprint, b.fingerprint);

    let moved = dir.path().join("moved");
    fs::rename(&root, &moved).unwrap();
    assert_eq!(image_folder::enumerate(&moved).unwrap().fingerprint, a.fingerprint);

    write(&moved, "cat/b.jpg", b"bbb");
    let c = image_folder::enumerate(&moved).unwrap();
    assert_eq!(c.len(), a.len());
    assert_ne!(c.fingerprint, a.fingerprint);
}

#[test]
fn missing_root_empty_root_and_imageless_classes_are_errors_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("nope");
    let e = image_folder::enumerate(&missing).unwrap_err();
    assert!(matches!(e, SourceError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");

    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let e = image_folder::enumerate(&empty).unwrap_err();
    assert!(matches!(e, SourceError::NoClasses { .. }), "{e:?}");
    assert!(e.to_string().contains(&*empty.to_string_lossy()), "{e}");

    let no_images = dir.path().join("no_images");
    write(&no_images, "cat/readme.txt", b"x");
    fs::create_dir_all(no_images.join("dog")).unwrap();
    let e = image_folder::enumerate(&no_images).unwrap_err();
    assert!(matches!(e, SourceError::NoSamples { .. }), "{e:?}");

    let file = dir.path().join("file.jpg");
    fs::write(&file, b"x").unwrap();
    let e = image_folder::enumerate(&file).unwrap_err();
    assert!(matches!(e, SourceError::NotADirectory { .. }), "{e:?}");
}

#[test]
fn symlinks_are_followed_without_looping_and_dangling_ones_are_kept_with_size_zero() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "real/a.jpg", b"aaa");
    std::os::unix::fs::symlink(root.join("real"), root.join("linked")).unwrap();
    // A loop back to the class folder itself.
    std::os::unix::fs::symlink(root.join("real"), root.join("real/loop")).unwrap();
    std::os::unix::fs::symlink(root.join("gone.jpg"), root.join("real/dangling.jpg")).unwrap();

    let m = image_folder::enumerate(root).unwrap();
    assert_eq!(m.classes, vec!["linked", "real"]);
    let got = paths(&m);
    assert_eq!(
        got,
        vec![
            ("linked/a.jpg".to_string(), 0, 3),
            ("linked/dangling.jpg".to_string(), 0, 0),
            ("real/a.jpg".to_string(), 1, 3),
            ("real/dangling.jpg".to_string(), 1, 0),
        ]
    );
    let mut buf = Vec::new();
    let dangling = m.at(3).location;
    assert_eq!(
        LocalStorage::new().read(&m.root, dangling, 1 << 20, &mut buf),
        Err(sluice_core::SampleErrorKind::Missing)
    );
    assert_eq!(m.display_path(m.at(0).key), PathBuf::from(root).join("linked/a.jpg"));
}
