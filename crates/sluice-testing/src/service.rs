//! What the service's tests share (sluice-service's and the `sluice` command's): the small
//! dataset, spec and client options, and checks on what a client read. Starting the
//! servers is sluice-service's own test support (`crates/sluice-service/tests/integration/support.rs`), so
//! that this crate does not depend on the crate it tests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_client::RemoteOptions;
use sluice_core::{PipelineSpec, SourceSpec};
use sluice_synth::DatasetOptions;

use crate::net::http_get;

pub const IMAGES: usize = 48;
pub const BATCH: usize = 4;

/// [`IMAGES`] generated images in 4 classes under `dir/data`.
pub fn dataset(dir: &Path) -> PathBuf {
    dataset_and_bytes(dir).0
}

/// [`dataset`], and the bytes of its files.
pub fn dataset_and_bytes(dir: &Path) -> (PathBuf, u64) {
    let root = dir.join("data");
    let options = DatasetOptions { images: IMAGES, classes: 4, texture: 8, ..Default::default() };
    let written = sluice_synth::write_dataset(&root, &options, &|_| {}).unwrap();
    (root, written.bytes)
}

/// The training spec on `root`: 32 px, [`BATCH`] per batch, one thread.
pub fn spec(root: &Path, seed: u64) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, BATCH);
    s.seed = seed;
    s.threads = 1.into();
    s
}

/// A client of job `job` at dispatcher `addr`: no token, small tasks, giving up after 30 s.
pub fn options(addr: &str, job: &str) -> RemoteOptions {
    let mut o = RemoteOptions::new(addr, job);
    o.token = None;
    o.task_batches = 2;
    o.tasks_in_flight = 4;
    o.give_up_after = Duration::from_secs(30);
    o
}

/// Asserts that `keys` hold every sample of [`dataset`] exactly once.
pub fn assert_exactly_once(keys: Vec<u64>, what: &str) {
    crate::assert_each_once(keys, IMAGES, what);
}

/// Waits until the dispatcher's metrics at `metrics` count `batches` consumed by the
/// client: a heartbeat reported them all (a dropped client sends no last one).
pub fn wait_for_heartbeat(metrics: &str, batches: usize) {
    let t0 = Instant::now();
    loop {
        let text = http_get(metrics);
        let reported = text
            .lines()
            .find_map(|l| l.strip_prefix("sluice_client_batches_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if reported == Some(batches as f64) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no heartbeat reported {batches} batches: {reported:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
