//! File-list enumeration against fixtures built in temp dirs.
// Fixture helpers sit outside #[test] fns; a failed setup should fail the test.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::PathBuf;

use sluice_core::{Location, SampleErrorKind, SourceSpec};
use sluice_pipeline::source::{build_manifest, file_list, SourceError};
use sluice_pipeline::storage::{LocalStorage, Storage};

fn file(p: impl Into<PathBuf>) -> Location {
    Location::File { path: p.into() }
}

#[test]
fn labels_comments_blanks_missing_labels_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir(d.join("img")).unwrap();
    fs::write(d.join("img/a.jpg"), b"aaaa").unwrap();
    fs::write(d.join("img/b c.png"), b"bb").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let abs = outside.path().join("abs.jpg");
    fs::write(&abs, b"abs!!").unwrap();

    let list = d.join("train.txt");
    let text = format!(
        "\u{feff}# a comment\n\nimg/a.jpg\t3\n   img/b c.png   12\r\nimg/unlabelled.jpg\n  # indented comment\n{} -1\nimg/gone.jpg 5\n",
        abs.display()
    );
    fs::write(&list, text).unwrap();
    fs::write(d.join("img/unlabelled.jpg"), b"u").unwrap();

    let m = build_manifest(&SourceSpec::FileList { path: list.clone(), root: None }).unwrap();
    assert_eq!(m.root, d);
    let got: Vec<_> = m.entries().map(|e| (e.location.owned(), e.label, e.size)).collect();
    assert_eq!(
        got,
        vec![
            (file("img/a.jpg"), 3, 4),
            (file("img/b c.png"), 12, 2),
            (file("img/unlabelled.jpg"), -1, 1),
            (file(&abs), -1, 5),
            // Listed but absent: kept, size 0, reported when read.
            (file("img/gone.jpg"), 5, 0),
        ]
    );
    assert!(m.classes.is_empty());

    let storage = LocalStorage::new();
    let mut buf = Vec::new();
    storage.read(&m.root, m.at(3).location, 100, &mut buf).unwrap();
    assert_eq!(buf, b"abs!!");
    assert_eq!(storage.read(&m.root, m.at(4).location, 100, &mut buf), Err(SampleErrorKind::Missing));
}

#[test]
fn explicit_root_resolves_relative_paths() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fs::create_dir(&data).unwrap();
    fs::write(data.join("x.jpg"), b"xyz").unwrap();
    let list = dir.path().join("lists/val.txt");
    fs::create_dir(list.parent().unwrap()).unwrap();
    fs::write(&list, "x.jpg 1\n").unwrap();

    let m = file_list::enumerate(&list, Some(&data)).unwrap();
    assert_eq!(m.root, data);
    assert_eq!(m.at(0).location, file("x.jpg"));
    assert_eq!((m.at(0).label, m.at(0).size), (1, 3));

    // Without the root the same line points next to the list, where nothing is.
    let m = file_list::enumerate(&list, None).unwrap();
    assert_eq!(m.at(0).size, 0);
}

#[test]
fn a_bad_label_names_the_list_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("bad.txt");
    fs::write(&list, "# header\na.jpg 1\nb.jpg cat\n").unwrap();
    let e = file_list::enumerate(&list, None).unwrap_err();
    match &e {
        SourceError::BadLabel { path, line, text } => {
            assert_eq!(path, &list);
            assert_eq!(*line, 3);
            assert_eq!(text, "cat");
        }
        other => panic!("expected BadLabel, got {other:?}"),
    }
    assert!(e.to_string().contains(&format!("{}:3:", list.display())), "{e}");
}

#[test]
fn missing_or_empty_lists_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.txt");
    let e = file_list::enumerate(&missing, None).unwrap_err();
    assert!(matches!(e, SourceError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("missing.txt"), "{e}");

    let empty = dir.path().join("empty.txt");
    fs::write(&empty, "# only comments\n\n").unwrap();
    let e = file_list::enumerate(&empty, None).unwrap_err();
    assert!(matches!(e, SourceError::NoSamples { .. }), "{e:?}");
}

#[test]
fn fingerprint_tracks_labels() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("l.txt");
    fs::write(&list, "a.jpg 1\n").unwrap();
    let a = file_list::enumerate(&list, None).unwrap();
    assert_eq!(a.fingerprint, file_list::enumerate(&list, None).unwrap().fingerprint);
    fs::write(&list, "a.jpg 2\n").unwrap();
    assert_ne!(a.fingerprint, file_list::enumerate(&list, None).unwrap().fingerprint);
}
