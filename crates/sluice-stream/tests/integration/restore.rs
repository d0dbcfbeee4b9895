//! What a restore refuses, and what a state that cannot be written does: each with an
//! error that says what is wrong, before anything changes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::*;
use sluice_stream::{push_dataset, StreamLoader};

#[test]
fn a_state_that_does_not_fit_is_refused_with_an_error_naming_why() {
    let _w = watchdog("restore checks", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    push_dataset(&dataset(dir.path(), 24, 4), &push_options(&redis.url(), "s", 0.0)).unwrap();
    let spec = stream_spec(&redis.url(), "s", "job", 4, 2, Some(&dir.path().join("rehearsal")));
    let mut first = StreamLoader::new(spec.clone()).unwrap();
    let mut states = Vec::new();
    for _ in 0..3 {
        first.next_batch().unwrap().unwrap();
        states.push(first.state().unwrap());
    }
    drop(first);
    let mut second = StreamLoader::new(spec.clone()).unwrap();
    let error =
        |second: &mut StreamLoader, state| second.restore(state).err().map(|e| e.to_string()).unwrap_or_default();

    // A ledger larger than the loader keeps (a crafted one would run out of memory).
    let mut crafted = states[2].clone();
    crafted.ledger.ranges = vec![(0, 200_000)];
    let e = error(&mut second, &crafted);
    assert!(e.contains("ledger holds more than") && e.contains("max_unacked"), "{e}");

    // A rehearsal buffer of another capacity or policy than the spec's.
    let mut crafted = states[2].clone();
    crafted.rehearsal.as_mut().unwrap().capacity = 1 << 40;
    let e = error(&mut second, &crafted);
    assert!(e.contains("rehearsal.capacity"), "{e}");

    // Only the newest two states' rehearsal files are kept.
    let e = error(&mut second, &states[0]);
    assert!(e.contains("is gone") && e.contains("2 newest"), "{e}");

    // The newest state restores, and the stream goes on from it.
    second.restore(&states[2]).unwrap();
    let mut trained = 0;
    while let Some(b) = second.next_batch().unwrap() {
        trained += b.rehearsal.iter().filter(|r| !**r).count();
    }
    assert_eq!(trained, 24 - 12);
}

#[test]
fn a_rehearsal_file_that_cannot_be_written_is_a_write_error_naming_the_file() {
    let _w = watchdog("rehearsal write", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    push_dataset(&dataset(dir.path(), 8, 2), &push_options(&redis.url(), "s", 0.0)).unwrap();
    let rehearsal = dir.path().join("rehearsal");
    let mut loader = StreamLoader::new(stream_spec(&redis.url(), "s", "job", 4, 0, Some(&rehearsal))).unwrap();
    loader.next_batch().unwrap().unwrap();
    // The directory is replaced by a file: nothing can be written under it.
    std::fs::remove_dir_all(&rehearsal).unwrap();
    std::fs::write(&rehearsal, b"").unwrap();
    let e = loader.state().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("cannot write the rehearsal buffer file") && e.contains("rehearsal"), "{e}");
}

#[test]
fn persisted_exemplars_come_back_in_a_loader_started_again_without_a_checkpoint() {
    let _w = watchdog("persisted exemplars", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    push_dataset(&dataset(dir.path(), 24, 4), &push_options(&redis.url(), "s", 0.0)).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 2, Some(&dir.path().join("rehearsal")));
    spec.rehearsal.as_mut().unwrap().persist = true;
    let mut first = StreamLoader::new(spec.clone()).unwrap();
    let mut rehearsal_ids = std::collections::HashSet::new();
    let mut new_ids = std::collections::HashSet::new();
    for _ in 0..4 {
        let b = first.next_batch().unwrap().unwrap();
        for (key, rehearsed) in b.batch.keys.iter().zip(&b.rehearsal) {
            if !rehearsed {
                new_ids.insert(*key);
            }
        }
    }
    let held = first.stats().stream.rehearsal_len;
    assert_eq!(held, 16, "16 new samples offered to a buffer of 16");
    // No state() taken: only the exemplar file remains (the last batch's offers are
    // flushed to it when the loader is dropped).
    drop(first);

    let exemplars = dir.path().join("rehearsal").join("s-job-learner-0.exemplars");
    assert!(exemplars.exists(), "{} missing", exemplars.display());
    let mut second = StreamLoader::new(spec).unwrap();
    assert_eq!(second.stats().stream.rehearsal_len, held, "the buffer came back from the file");
    let b = second.next_batch().unwrap().unwrap();
    for (key, rehearsed) in b.batch.keys.iter().zip(&b.rehearsal) {
        if *rehearsed {
            rehearsal_ids.insert(*key);
        }
    }
    assert_eq!(rehearsal_ids.len(), 2, "the first batch after the restart rehearses 2 samples");
    assert!(rehearsal_ids.is_subset(&new_ids), "rehearsed {rehearsal_ids:?}, trained before {new_ids:?}");
}
