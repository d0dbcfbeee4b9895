//! Parquet sources: files written here with the `parquet` crate's own writer in the
//! Hugging Face layout (`image` a struct `{bytes, path}`, `label` an int64) or with a plain
//! binary column, indexed from their footers, read back row by row through the storage
//! the loader uses, shuffled through the loader, and hostile files refused with errors
//! naming the file and row group.
#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use sluice_core::{Batch, ErrorPolicy, Location, LocationRef, PipelineSpec, ShuffleSpec, SourceSpec, StorageSpec};
use sluice_pipeline::source::{build_manifest, SourceError};
use sluice_pipeline::storage::{open_storage, ParquetError, RowGroupCache};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::noise_jpeg;

/// How the image column is laid out.
#[derive(Clone, Copy)]
enum Layout {
    /// `image: struct {bytes: binary, path: string}`, `label: int64` (what `datasets` writes).
    HuggingFace,
    /// `image: binary`, no label.
    Binary,
}

/// Writes `images` (with labels `i % 5`) to `path` in row groups of `per_group` rows.
fn write_parquet(path: &Path, images: &[Vec<u8>], per_group: usize, layout: Layout) {
    write_parquet_with(path, images, per_group, layout, WriterProperties::builder());
}

/// As [`write_parquet`], with the writer's properties from `props` (Snappy added).
fn write_parquet_with(
    path: &Path,
    images: &[Vec<u8>],
    per_group: usize,
    layout: Layout,
    props: parquet::file::properties::WriterPropertiesBuilder,
) {
    let schema = match layout {
        Layout::HuggingFace => {
            "message schema { optional group image { optional binary bytes; optional binary path (STRING); } \
             optional int64 label; }"
        }
        Layout::Binary => "message schema { required binary image; }",
    };
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let props = Arc::new(props.set_compression(Compression::SNAPPY).build());
    let mut w = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
    for (g, group) in images.chunks(per_group).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        let bytes: Vec<ByteArray> = group.iter().map(|b| ByteArray::from(b.clone())).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        match layout {
            Layout::HuggingFace => {
                let defs = vec![2i16; group.len()];
                col.typed::<ByteArrayType>().write_batch(&bytes, Some(&defs), None).unwrap();
                col.close().unwrap();
                let names: Vec<ByteArray> =
                    (0..group.len()).map(|i| ByteArray::from(format!("{}.jpg", g * per_group + i).as_str())).collect();
                let mut col = rg.next_column().unwrap().unwrap();
                col.typed::<ByteArrayType>().write_batch(&names, Some(&defs), None).unwrap();
                col.close().unwrap();
                let labels: Vec<i64> = (0..group.len()).map(|i| ((g * per_group + i) % 5) as i64).collect();
                let mut col = rg.next_column().unwrap().unwrap();
                col.typed::<Int64Type>().write_batch(&labels, Some(&vec![1i16; group.len()]), None).unwrap();
                col.close().unwrap();
            }
            Layout::Binary => {
                col.typed::<ByteArrayType>().write_batch(&bytes, None, None).unwrap();
                col.close().unwrap();
            }
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

pub(crate) fn jpegs(n: usize, offset: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| noise_jpeg(offset + i, 24).unwrap()).collect()
}

fn source(path: &Path) -> SourceSpec {
    SourceSpec::Parquet { path: path.to_path_buf(), image_column: "image".into(), label_column: None }
}

#[test]
fn rows_of_a_folder_index_in_order_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (jpegs(23, 0), jpegs(9, 100));
    std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
    write_parquet(&dir.path().join("data/train-00000.parquet"), &a, 7, Layout::HuggingFace);
    write_parquet(&dir.path().join("data/sub/train-00001.parquet"), &b, 4, Layout::HuggingFace);
    std::fs::write(dir.path().join("data/README.md"), "not a parquet file").unwrap();

    let m = build_manifest(&source(&dir.path().join("data"))).unwrap();
    assert_eq!(m.len(), 32);
    // Files in path order: sub/train-00001 sorts before train-00000.
    let expected: Vec<&Vec<u8>> = b.iter().chain(&a).collect();
    let first = &m.at(0).location;
    assert_eq!(
        first,
        &Location::ParquetRow { file: PathBuf::from("sub/train-00001.parquet"), row_group: 0, row: 0, column: 0 }
    );
    match m.at(9 + 15).location {
        LocationRef::ParquetRow { row_group, row, .. } => assert_eq!((row_group, row), (2, 1)),
        other => panic!("not a row: {other:?}"),
    }
    let storage = open_storage(&StorageSpec::Local).unwrap();
    let mut buf = Vec::new();
    for (e, want) in m.entries().zip(&expected) {
        storage.read(&m.root, e.location, 1 << 20, &mut buf).unwrap();
        assert_eq!(&buf, *want, "sample {}", e.key);
    }
    let labels: Vec<i64> = m.entries().map(|e| e.label).collect();
    let want: Vec<i64> = (0..9).chain(0..23).map(|i| i % 5).collect();
    assert_eq!(labels, want);

    // A plain binary column without labels; a single file as the path.
    let file = dir.path().join("plain.parquet");
    write_parquet(&file, &a, 10, Layout::Binary);
    let m = build_manifest(&source(&file)).unwrap();
    assert_eq!(m.len(), 23);
    assert!(m.entries().all(|e| e.label == -1));
    storage.read(&m.root, m.at(22).location, 1 << 20, &mut buf).unwrap();
    assert_eq!(buf, a[22]);
}

#[test]
fn the_fingerprint_covers_the_files_bytes_not_only_the_row_counts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.parquet");
    write_parquet(&file, &jpegs(12, 0), 5, Layout::HuggingFace);
    let before = build_manifest(&source(&file)).unwrap().fingerprint;
    assert_eq!(build_manifest(&source(&file)).unwrap().fingerprint, before, "same files, same fingerprint");
    // Same rows, row groups and labels; other images.
    write_parquet(&file, &jpegs(12, 50), 5, Layout::HuggingFace);
    assert_ne!(build_manifest(&source(&file)).unwrap().fingerprint, before);
}

#[test]
fn a_shuffled_epoch_reads_each_row_group_once_when_the_window_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.parquet");
    write_parquet(&file, &jpegs(60, 0), 10, Layout::HuggingFace);
    let m = build_manifest(&source(&file)).unwrap();
    // A scrambled order (a fixed permutation: 7 is coprime with 60).
    let order: Vec<usize> = (0..60).map(|i| (i * 7 + 3) % 60).collect();
    let read_all = |cache: &RowGroupCache| {
        let mut buf = Vec::new();
        for &i in &order {
            let LocationRef::ParquetRow { file, row_group, row, column } = m.at(i).location else { unreachable!() };
            cache.read(&m.root.join(file), row_group, row, column, 1 << 20, &mut buf).unwrap();
        }
    };
    let roomy = RowGroupCache::new(64 << 20, None);
    read_all(&roomy);
    assert_eq!(roomy.reads(), 6, "6 row groups, each read once");
    // A window of one row group's bytes: at most one read per sample, never more.
    let tight = RowGroupCache::new(1, None);
    read_all(&tight);
    let reads = tight.reads() + tight.pages_read();
    assert!(reads <= 60 && reads > 6, "{} reads, {} of pages", reads, tight.pages_read());
}

/// Where sample `i` of a [`write_paged`] file lies: (row group, row); its image is leaf 0.
pub(crate) fn paged_row(i: usize) -> (u32, u32) {
    ((i / 20) as u32, (i % 20) as u32)
}

/// Row groups of 20 rows in pages of 2 rows each, with or without an offset index (the
/// page index `datasets` writes; pyarrow's own default writes none).
pub(crate) fn write_paged(path: &Path, images: &[Vec<u8>], offset_index: bool) {
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(2)
        .set_write_batch_size(1)
        .set_dictionary_enabled(false)
        .set_offset_index_disabled(!offset_index);
    write_parquet_with(path, images, 20, Layout::HuggingFace, props);
}

#[test]
fn a_small_window_reads_only_the_pages_of_its_rows_and_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let images = jpegs(60, 0);
    for offset_index in [true, false] {
        let file = dir.path().join(format!("paged-{offset_index}.parquet"));
        write_paged(&file, &images, offset_index);
        assert_eq!(build_manifest(&source(&file)).unwrap().len(), 60);
        let meta = parquet::file::reader::FileReader::metadata(
            &parquet::file::serialized_reader::SerializedFileReader::new(File::open(&file).unwrap()).unwrap(),
        )
        .clone();
        assert_eq!(meta.num_row_groups(), 3);
        assert_eq!(meta.row_group(0).column(0).offset_index_range().is_some(), offset_index);
        let chunks: u64 = meta.row_groups().iter().map(|rg| rg.column(0).compressed_size() as u64).sum();
        let order: Vec<usize> = (0..60).map(|i| (i * 7 + 3) % 60).collect();
        let read_all = |cache: &RowGroupCache| -> Vec<Vec<u8>> {
            order
                .iter()
                .map(|&i| {
                    let (row_group, row) = paged_row(i);
                    let mut buf = Vec::new();
                    cache.read(&file, row_group, row, 0, 1 << 20, &mut buf).unwrap();
                    buf
                })
                .collect()
        };
        let want: Vec<Vec<u8>> = order.iter().map(|&i| images[i].clone()).collect();
        // A window holding the dataset: each row group read whole, once.
        let roomy = RowGroupCache::new(64 << 20, None);
        assert!(read_all(&roomy) == want, "offset index {offset_index}: the roomy window's bytes differ");
        assert_eq!((roomy.reads(), roomy.bytes_read()), (3, chunks), "offset index {offset_index}");
        // A window of one page: each sample reads its own page (2 rows of 20), not its row
        // group (before: a whole row group for each sample not following one of its group).
        let tight = RowGroupCache::new(1, None);
        assert!(read_all(&tight) == want, "offset index {offset_index}: the tight window's bytes differ");
        assert!(
            tight.bytes_read() < 3 * chunks,
            "offset index {offset_index}: {} bytes read for 60 samples of {chunks} bytes of row groups",
            tight.bytes_read()
        );
        assert_eq!((tight.reads(), tight.pages_read()), (0, 60), "offset index {offset_index}: one page per sample");
    }
}

#[test]
fn a_page_read_from_a_truncated_file_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cut.parquet");
    let images = jpegs(40, 0);
    write_paged(&file, &images, true);
    let m = build_manifest(&source(&file)).unwrap();
    let cache = RowGroupCache::new(1, None);
    let read = |row_group: u32, row: u32| {
        let mut buf = Vec::new();
        cache.read(&file, row_group, row, 0, 1 << 20, &mut buf).map(|()| buf).map_err(|e| e.to_string())
    };
    assert_eq!(m.len(), 40);
    assert_eq!(read(0, 1).unwrap(), images[1]);
    // The footer and offset index are kept; the pages of row group 1 are cut off.
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::serialized_reader::SerializedFileReader::new(File::open(&file).unwrap()).unwrap(),
    )
    .clone();
    let cut = usize::try_from(meta.row_group(1).column(0).data_page_offset()).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..cut]).unwrap();
    assert_eq!(read(0, 10).unwrap(), images[10], "another page of row group 0 is still there");
    let e = read(1, 5).unwrap_err();
    assert!(e.contains("cut.parquet: cannot read bytes"), "{e}");
    assert_eq!(cache.pages_read(), 3);
}

#[test]
fn a_garbled_offset_index_is_not_trusted_and_the_rows_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("garbled.parquet");
    let images = jpegs(40, 0);
    write_paged(&file, &images, true);
    assert_eq!(build_manifest(&source(&file)).unwrap().len(), 40);
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::serialized_reader::SerializedFileReader::new(File::open(&file).unwrap()).unwrap(),
    )
    .clone();
    // Row group 0's index: bytes that decode to nothing (or to pages outside the chunk).
    // Row group 1's: its pages' offsets moved past the end of the file.
    let mut bytes = std::fs::read(&file).unwrap();
    let r = meta.row_group(0).column(0).offset_index_range().unwrap();
    bytes[r.start as usize..r.end as usize].fill(0x15);
    let r = meta.row_group(1).column(0).offset_index_range().unwrap();
    let index =
        parquet::file::page_index::index_reader::decode_offset_index(&bytes[r.start as usize..r.end as usize]).unwrap();
    let first = index.page_locations()[0].offset;
    // The first page's offset, as the index stores it (a zigzag varint), made huge in place.
    let needle = {
        let mut v = ((first << 1) ^ (first >> 63)) as u64;
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    };
    let at = bytes[r.start as usize..r.end as usize].windows(needle.len()).position(|w| w == needle).unwrap();
    let at = r.start as usize + at + needle.len() - 1;
    bytes[at] = 0x7f;
    let moved = parquet::file::page_index::index_reader::decode_offset_index(&bytes[r.start as usize..r.end as usize])
        .unwrap()
        .page_locations()[0]
        .offset;
    assert!(moved > bytes.len() as i64, "{first} -> {moved}");
    std::fs::write(&file, &bytes).unwrap();
    let cache = RowGroupCache::new(1, None);
    for (i, image) in images.iter().enumerate() {
        let (row_group, row) = paged_row(i);
        let mut buf = Vec::new();
        cache.read(&file, row_group, row, 0, 1 << 20, &mut buf).unwrap();
        assert!(buf == *image, "row {i} differs");
    }
    // The pages were found by their headers instead.
    assert_eq!(cache.reads(), 0);
}

fn loader_spec(path: &Path, on_error: ErrorPolicy) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source(path), 16, 5);
    s.threads = 2.into();
    s.seed = 5;
    s.shuffle = ShuffleSpec::Global;
    s.on_error = on_error;
    s
}

fn keys(batches: &[Batch]) -> Vec<u64> {
    batches.iter().flat_map(|b| b.keys.clone()).collect()
}

#[test]
fn the_loader_shuffles_rows_exactly_and_skips_a_non_image_by_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.parquet");
    let mut images = jpegs(30, 0);
    images[13] = b"this is not an image".to_vec();
    write_parquet(&file, &images, 8, Layout::HuggingFace);
    let run = || -> Vec<Batch> {
        let l = Loader::new(loader_spec(&file, ErrorPolicy::Skip), Shard::default()).unwrap();
        l.iter().map(|b| b.unwrap()).collect()
    };
    let (one, two) = (run(), run());
    assert_eq!(one, two, "same seed, same batches");
    let mut k = keys(&one);
    assert_ne!(k, (0..30).filter(|&i| i != 13).collect::<Vec<_>>(), "shuffled");
    k.sort_unstable();
    assert_eq!(k, (0..30).filter(|&i| i != 13).collect::<Vec<_>>(), "every row but the bad one, once");
    for b in &one {
        for (key, label) in b.keys.iter().zip(&b.labels) {
            assert_eq!(*label, (*key % 5) as i64);
        }
    }
    // Failing instead: the error names the file, row group and row.
    let l = Loader::new(loader_spec(&file, ErrorPolicy::Fail), Shard::default()).unwrap();
    let err = l.iter().find_map(Result::err).expect("the bad row fails the run");
    let text = err.to_string();
    assert!(text.contains("d.parquet:row_group=1:row=5"), "{text}");
}

// ---- hostile files ----------------------------------------------------------------------

fn index_error(path: &Path, spec: SourceSpec) -> String {
    let _ = path;
    match build_manifest(&spec) {
        Ok(m) => panic!("indexed {} rows of a bad file", m.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    write_parquet(&good, &jpegs(10, 0), 4, Layout::HuggingFace);
    let bytes = std::fs::read(&good).unwrap();

    // Truncated: the end (and its magic) is gone.
    let truncated = dir.path().join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = index_error(&truncated, source(&truncated));
    assert!(e.contains("truncated.parquet") && e.contains("not a Parquet file"), "{e}");

    // Corrupt footer: garbage metadata in front of a valid length and magic.
    let corrupt = dir.path().join("corrupt.parquet");
    let mut b = bytes.clone();
    let meta_len = u32::from_le_bytes(b[b.len() - 8..b.len() - 4].try_into().unwrap()) as usize;
    let start = b.len() - 8 - meta_len;
    for (i, x) in b[start..start + meta_len].iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    std::fs::write(&corrupt, &b).unwrap();
    let e = index_error(&corrupt, source(&corrupt));
    assert!(e.contains("corrupt.parquet") && e.contains("corrupt footer"), "{e}");

    // A footer length past the start of the file.
    let lying = dir.path().join("lying.parquet");
    let mut b = bytes.clone();
    let n = b.len();
    b[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&lying, &b).unwrap();
    let e = index_error(&lying, source(&lying));
    assert!(e.contains("lying.parquet") && e.contains("declares 4294967295 bytes of metadata"), "{e}");

    // Not Parquet at all, and an empty file.
    let text = dir.path().join("text.parquet");
    std::fs::write(&text, "hello, I am a CSV file\n1,2,3\n").unwrap();
    assert!(index_error(&text, source(&text)).contains("no PAR1 magic"));
    let empty = dir.path().join("empty.parquet");
    std::fs::write(&empty, "").unwrap();
    assert!(index_error(&empty, source(&empty)).contains("0 bytes"));

    // A missing column, and columns of the wrong type.
    let spec = |image: &str, label: Option<&str>| SourceSpec::Parquet {
        path: good.clone(),
        image_column: image.into(),
        label_column: label.map(String::from),
    };
    let e = index_error(&good, spec("picture", None));
    assert!(e.contains("good.parquet: no column `picture`") && e.contains("image.bytes"), "{e}");
    let e = index_error(&good, spec("label", None));
    assert!(e.contains("column `label` is INT64; expected binary"), "{e}");
    let e = index_error(&good, spec("image", Some("image.path")));
    assert!(e.contains("column `image.path` is BYTE_ARRAY; expected an integer"), "{e}");
    let e = index_error(&good, spec("image", Some("class")));
    assert!(e.contains("no column `class`"), "{e}");
    assert!(matches!(build_manifest(&spec("image", Some("nope"))), Err(SourceError::Parquet(_))));
}

#[test]
fn a_row_group_over_the_limit_fails_its_samples_not_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.parquet");
    write_parquet(&file, &jpegs(6, 0), 3, Layout::Binary);
    let cache = RowGroupCache::with_max_chunk(1 << 20, 100, None);
    let mut buf = Vec::new();
    let e = cache.read(&file, 1, 2, 0, 1 << 20, &mut buf).unwrap_err().to_string();
    assert!(e.contains("big.parquet: row group 1: column chunk of") && e.contains("over the limit of 100"), "{e}");
    // A row past the end of its group, and a group past the end of the file.
    let cache = RowGroupCache::new(1 << 20, None);
    let e = cache.read(&file, 0, 3, 0, 1 << 20, &mut buf).unwrap_err().to_string();
    assert!(e.contains("row group 0 has 3 rows"), "{e}");
    let e = cache.read(&file, 9, 0, 0, 1 << 20, &mut buf).unwrap_err().to_string();
    assert!(e.contains("row group 9") && e.contains("has 2 row groups"), "{e}");
    let _: Option<ParquetError> = None;
}

#[test]
fn a_file_truncated_after_indexing_fails_its_rows_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shrinks.parquet");
    write_parquet(&file, &jpegs(10, 0), 5, Layout::HuggingFace);
    let m = build_manifest(&source(&file)).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let storage = open_storage(&StorageSpec::Local).unwrap();
    let mut buf = Vec::new();
    let e = storage.read(&m.root, m.at(0).location, 1 << 20, &mut buf).unwrap_err().to_string();
    assert!(e.contains("shrinks.parquet"), "{e}");
}

// ---- list columns as multi-label fields --------------------------------------------------

/// The rows of [`write_label_lists`]: `Some(list)` of (possibly null) class indices, or a null list.
fn label_lists() -> Vec<Option<Vec<Option<i64>>>> {
    vec![
        Some(vec![Some(3), Some(0)]),
        Some(vec![Some(1)]),
        Some(vec![]),                 // no classes: an all-zero row
        Some(vec![Some(2), Some(2)]), // a repeat counts once
        None,                         // a null list: the field is missing
        Some(vec![Some(1), None]),    // a null element
        Some(vec![Some(9)]),          // outside 0..4
        Some(vec![Some(-1)]),         // not a class index
        Some(vec![Some(0), Some(1), Some(2), Some(3)]),
    ]
}

/// Writes `image` (a JPEG per row) and `labels` as `datasets` writes a
/// `Sequence(ClassLabel)`: `optional group labels (LIST) { repeated group list { optional
/// <element> element; } }`, `element` of `element_type`, in row groups of 4.
fn write_label_lists(path: &Path, element_type: &str) {
    use parquet::data_type::{ByteArray, Int32Type, Int64Type};
    let schema = format!(
        "message schema {{ required binary image; optional group labels (LIST) {{ repeated group list {{ \
         optional {element_type} element; }} }} }}"
    );
    let schema = Arc::new(parse_message_type(&schema).unwrap());
    let mut w =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(WriterProperties::default())).unwrap();
    let rows = label_lists();
    for (g, group) in rows.chunks(4).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        let images: Vec<ByteArray> =
            (0..group.len()).map(|i| ByteArray::from(noise_jpeg(g * 4 + i, 24).unwrap())).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>().write_batch(&images, None, None).unwrap();
        col.close().unwrap();
        // Levels: a null list is def 0, an empty one def 1, a null element def 2, a value def 3.
        let (mut values, mut defs, mut reps) = (Vec::new(), Vec::new(), Vec::new());
        for row in group {
            match row.as_deref() {
                None | Some([]) => {
                    defs.push(i16::from(row.is_some()));
                    reps.push(0);
                }
                Some(list) => {
                    for (k, v) in list.iter().enumerate() {
                        reps.push(i16::from(k > 0));
                        defs.push(if v.is_some() { 3 } else { 2 });
                        values.extend(*v);
                    }
                }
            }
        }
        let mut col = rg.next_column().unwrap().unwrap();
        match element_type {
            "int64" => col.typed::<Int64Type>().write_batch(&values, Some(&defs), Some(&reps)).unwrap(),
            "int32" => {
                let values: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                col.typed::<Int32Type>().write_batch(&values, Some(&defs), Some(&reps)).unwrap()
            }
            _ => {
                let values: Vec<ByteArray> = values.iter().map(|v| ByteArray::from(v.to_string().as_str())).collect();
                col.typed::<ByteArrayType>().write_batch(&values, Some(&defs), Some(&reps)).unwrap()
            }
        };
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

fn multi_label_spec(path: &Path) -> PipelineSpec {
    let mut s = loader_spec(path, ErrorPolicy::Skip);
    s.fields = vec![sluice_core::FieldSpec {
        name: "labels".into(),
        kind: sluice_core::FieldKindName::MultiLabel,
        classes: Some(4),
    }];
    s
}

#[test]
fn a_list_column_of_class_indices_is_a_multi_label_field_as_a_sidecar_list_is() {
    use sluice_core::fields::FieldValue;
    use sluice_core::FieldValues;
    let dir = tempfile::tempdir().unwrap();
    for element_type in ["int64", "int32"] {
        let file = dir.path().join(format!("{element_type}.parquet"));
        write_label_lists(&file, element_type);
        let spec = multi_label_spec(&file);
        spec.validate().unwrap();
        // What a sidecar holding the same list gives, row by row (None: its error).
        let as_sidecar = |row: usize| -> Result<Vec<f32>, String> {
            let json = serde_json::to_value(&label_lists()[row]).unwrap();
            let value = if json.is_null() { None } else { Some(&json) };
            match spec.fields[0].read(value, 1 << 16)? {
                FieldValue::Classes(c) => Ok((0..4).map(|k| if c.contains(&k) { 1.0 } else { 0.0 }).collect()),
                other => panic!("{other:?}"),
            }
        };
        let loader = Loader::new(spec.clone(), Shard::default()).unwrap();
        let mut seen = Vec::new();
        for b in loader.iter().map(|b| b.unwrap()) {
            let f = &b.fields.as_ref().unwrap().fields;
            let FieldValues::MultiHot { classes: 4, values } = &f[0].values else { panic!("{f:?}") };
            for (i, &key) in b.keys.iter().enumerate() {
                let row = key as usize;
                assert_eq!(&values[i * 4..i * 4 + 4], as_sidecar(row).unwrap().as_slice(), "row {row}");
                seen.push(row);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 8], "{element_type}");
        // [3, 0] is classes 0 and 3; [] none; [2, 2] class 2 once.
        assert_eq!(as_sidecar(0).unwrap(), [1.0, 0.0, 0.0, 1.0]);
        assert_eq!(as_sidecar(2).unwrap(), [0.0; 4]);
        let skipped = loader.stats().skipped;
        for (row, says, at) in [
            (4, "field `labels` is missing", "row_group=1:row=0"),
            (5, "field `labels`: item 1 is null, not a class index", "row_group=1:row=1"),
            (6, "field `labels`: class 9 (item 0) is not in 0..4", "row_group=1:row=2"),
            (7, "field `labels`: item 0 is a number -1, not a class index", "row_group=1:row=3"),
        ] {
            let s = skipped.iter().find(|s| s.key == row).unwrap_or_else(|| panic!("row {row}: {skipped:?}"));
            assert!(s.error.contains(says) && s.path.contains(at), "row {row}: {s:?}");
            let sidecar = as_sidecar(row as usize).unwrap_err();
            assert!(s.error.contains(&sidecar), "row {row}: a sidecar says {sidecar:?}; got {s:?}");
        }
    }
    // A list of strings is not a list of class indices: the dataset is refused by column.
    let file = dir.path().join("strings.parquet");
    write_label_lists(&file, "binary");
    let e = Loader::new(multi_label_spec(&file), Shard::default()).err().unwrap().to_string();
    assert!(e.contains("strings.parquet") && e.contains("labels") && e.contains("list of integers"), "{e}");
}
