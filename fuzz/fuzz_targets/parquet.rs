//! An untrusted Parquet file through the Parquet source: footer decoding, column lookup,
//! the label column at indexing, then every row's image column chunk through the storage
//! the loader uses. Properties: nothing panics or aborts (a lying footer or page header
//! must not make it allocate past the file's size or the chunk limit); an indexed file
//! has at most one entry per byte of file, and each row either reads or fails with an
//! error naming the file, read whole and read by its page (offset index, page headers).
//!
//! Input: the file's bytes. Seeds (fuzz/seeds/parquet) are small files in the layouts the
//! source takes; the fuzzer damages them.

#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use sluice_core::{LocationRef, SourceSpec, StorageSpec};
use sluice_pipeline::source::build_manifest;
use sluice_pipeline::storage::{open_storage, RowGroupCache};

fuzz_target!(|data: &[u8]| {
    // The `parquet` crate panics on some damaged headers (e.g. a DATA_PAGE header without
    // its data_page_header: an unwrap in its PageMetadata conversion). sluice runs the
    // crate under `catch_unwind` (`guarded` in storage/parquet.rs), so such a panic becomes
    // an error naming the file; libFuzzer's hook would abort on it before the catch. The
    // property kept: a panic anywhere else still aborts, and an uncaught one aborts too.
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.location().is_some_and(|l| l.file().contains("/parquet-")) {
                abort(info);
            }
        }));
    });
    // One file per fuzzing process, rewritten for every input.
    let path = std::env::temp_dir().join(format!("sluice-fuzz-{}.parquet", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else { return };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    // A chunk limit far below the default, so a damaged size cannot exhaust memory.
    std::env::set_var("SLUICE_PARQUET_MAX_CHUNK_BYTES", "1048576");
    let spec = SourceSpec::Parquet { path: path.clone(), image_column: "image".into(), label_column: None };
    let Ok(manifest) = build_manifest(&spec) else { return };
    assert!(manifest.len() as u64 <= data.len() as u64);
    let Ok(storage) = open_storage(&StorageSpec::Local) else { return };
    let mut buf = Vec::new();
    for e in manifest.entries().take(4096) {
        if let Err(err) = storage.read(&manifest.root, e.location, 1 << 20, &mut buf) {
            assert!(!err.to_string().is_empty());
        }
    }
    // A cache of no bytes reads each row's page alone (offset index or page headers): the
    // same rows through the page reader.
    let pages = RowGroupCache::with_max_chunk(0, 1 << 20, None);
    for e in manifest.entries().take(4096) {
        let LocationRef::ParquetRow { file, row_group, row, column } = e.location else { continue };
        if let Err(err) = pages.read(&manifest.root.join(file), row_group, row, column, 1 << 20, &mut buf) {
            assert!(!err.to_string().is_empty());
        }
    }
});
