//! WebDataset-style tar shards: built with `tar::Builder` in temp dirs, indexed, and read
//! back by offset through local storage.
// Fixture helpers sit outside #[test] fns; a failed setup should fail the test.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use sluice_core::{LocationRef, SampleErrorKind, SourceSpec};
use sluice_pipeline::source::{build_manifest, tar as tar_source, SourceError};
use sluice_pipeline::storage::{LocalStorage, Storage};
use tar::{Builder, EntryType, Header};

fn write_shard(path: &Path, members: &[(&str, &[u8])]) {
    let mut b = Builder::new(File::create(path).unwrap());
    for (name, data) in members {
        let mut h = Header::new_gnu();
        if name.ends_with('/') {
            h.set_entry_type(EntryType::Directory);
            h.set_size(0);
        } else {
            h.set_entry_type(EntryType::Regular);
            h.set_size(data.len() as u64);
        }
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap();
}

fn image(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

fn member_of(loc: LocationRef<'_>) -> (&Path, &str, u64, u64) {
    match loc {
        LocationRef::TarMember { shard, member, offset, len } => (shard, member, offset, len),
        other => panic!("expected a tar member, got {other:?}"),
    }
}

#[test]
fn members_group_by_key_take_cls_labels_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let long_name = format!("long/{}.jpg", "x".repeat(120));
    let (a, b, c, d, l) = (image(1, 1000), image(2, 513), image(3, 1), image(4, 4096), image(5, 77));
    let s0 = dir.path().join("shard-000.tar");
    let s1 = dir.path().join("shard-001.tar");
    write_shard(
        &s0,
        &[
            ("a.cls", b"3\n"),
            ("a.jpg", &a),
            ("b.png", &b),
            ("b.cls", b" 7 "), // label after its image
            ("c.JPEG", &c),    // no label
            ("notes.txt", b"ignored"),
            ("sub/", b""),
            ("c.seg.png", b"not the image field"),
        ],
    );
    write_shard(&s1, &[("sub/d.cls", b"-2"), ("sub/d.jpg", &d), (long_name.as_str(), &l)]);

    let m = build_manifest(&SourceSpec::Tar { shards: vec![s0.clone(), s1.clone()], sidecars: false, masks: false })
        .unwrap();
    assert_eq!(m.root, dir.path());
    let got: Vec<_> = m
        .entries()
        .map(|e| {
            let (shard, member, _, len) = member_of(e.location);
            (shard.to_path_buf(), member.to_string(), e.label, len, e.size)
        })
        .collect();
    let p = PathBuf::from;
    assert_eq!(
        got,
        vec![
            (p("shard-000.tar"), "a.jpg".to_string(), 3, 1000, 1000),
            (p("shard-000.tar"), "b.png".to_string(), 7, 513, 513),
            (p("shard-000.tar"), "c.JPEG".to_string(), -1, 1, 1),
            (p("shard-001.tar"), "sub/d.jpg".to_string(), -2, 4096, 4096),
            (p("shard-001.tar"), long_name.clone(), -1, 77, 77),
        ]
    );

    let storage = LocalStorage::new();
    let mut buf = Vec::new();
    for (entry, want) in m.entries().zip([&a, &b, &c, &d, &l]) {
        storage.read(&m.root, entry.location, 1 << 20, &mut buf).unwrap();
        assert_eq!(&buf, want, "{}", m.display_path(entry.key).display());
        // The offset is where the member's data starts in the file.
        let (shard, _, offset, len) = member_of(entry.location);
        let raw = fs::read(m.root.join(shard)).unwrap();
        assert_eq!(&raw[offset as usize..(offset + len) as usize], want.as_slice());
    }
    assert_eq!(m.display_path(m.at(0).key), PathBuf::from(format!("{}:a.jpg", s0.display())));

    let again = tar_source::enumerate(&[s0, s1]).unwrap();
    assert_eq!(again.fingerprint, m.fingerprint);
}

#[test]
fn a_duplicate_image_for_one_key_keeps_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.tar");
    write_shard(&s, &[("k.jpg", b"first"), ("k.png", b"second"), ("k.cls", b"1")]);
    let m = tar_source::enumerate(&[s]).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(member_of(m.at(0).location).1, "k.jpg");
    assert_eq!(m.at(0).label, 1);
}

#[test]
fn a_non_integer_cls_names_shard_and_member() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.tar");
    write_shard(&s, &[("k.jpg", b"img"), ("k.cls", b"dog")]);
    let e = tar_source::enumerate(std::slice::from_ref(&s)).unwrap_err();
    match &e {
        SourceError::BadClassFile { shard, member, text } => {
            assert_eq!(shard, &s);
            assert_eq!(member, "k.cls");
            assert_eq!(text, "dog");
        }
        other => panic!("expected BadClassFile, got {other:?}"),
    }
    assert!(e.to_string().contains("s.tar:k.cls"), "{e}");
}

#[test]
fn a_corrupt_header_names_shard_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.tar");
    write_shard(&s, &[("a.jpg", &image(1, 700)), ("b.jpg", &image(2, 10))]);
    // The second header follows the first's data, padded to 512: 512 + 1024.
    let second = 512 + 1024;
    let mut raw = fs::read(&s).unwrap();
    assert_eq!(&raw[second..second + 5], b"b.jpg");
    raw[second] = b'X';
    fs::write(&s, raw).unwrap();

    let e = tar_source::enumerate(std::slice::from_ref(&s)).unwrap_err();
    match &e {
        SourceError::CorruptTar { shard, offset, .. } => {
            assert_eq!(shard, &s);
            assert_eq!(*offset, second as u64);
        }
        other => panic!("expected CorruptTar, got {other:?}"),
    }
    assert!(e.to_string().contains("1536"), "{e}");
}

#[test]
fn a_missing_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("absent.tar");
    let e = tar_source::enumerate(std::slice::from_ref(&s)).unwrap_err();
    assert!(matches!(e, SourceError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("absent.tar"), "{e}");
}

#[test]
fn a_shard_truncated_before_indexing_is_an_error_and_after_indexing_a_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.tar");
    write_shard(&s, &[("a.jpg", &image(1, 600)), ("b.jpg", &image(2, 2000))]);
    let m = tar_source::enumerate(std::slice::from_ref(&s)).unwrap();
    let (_, _, b_offset, _) = member_of(m.at(1).location);

    // Cut the file in the middle of b.jpg's data.
    OpenOptions::new().write(true).open(&s).unwrap().set_len(b_offset + 100).unwrap();

    let storage = LocalStorage::new();
    let mut buf = Vec::new();
    storage.read(&m.root, m.at(0).location, 1 << 20, &mut buf).unwrap();
    assert_eq!(buf, image(1, 600));
    match storage.read(&m.root, m.at(1).location, 1 << 20, &mut buf) {
        Err(SampleErrorKind::Io(msg)) => assert!(msg.contains("short read"), "{msg}"),
        other => panic!("expected a short-read error, got {other:?}"),
    }

    let e = tar_source::enumerate(std::slice::from_ref(&s)).unwrap_err();
    match e {
        SourceError::TruncatedShard { member, file_len, .. } => {
            assert_eq!(member, "b.jpg");
            assert_eq!(file_len, b_offset + 100);
        }
        other => panic!("expected TruncatedShard, got {other:?}"),
    }
}

#[test]
fn shards_without_images_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.tar");
    write_shard(&s, &[("a.txt", b"text"), ("a.cls", b"1")]);
    let e = tar_source::enumerate(&[s]).unwrap_err();
    assert!(matches!(e, SourceError::NoSamples { .. }), "{e:?}");
}
