//! The producer: streams a dataset's samples into a Redis stream at a given rate and in a
//! given order (class-incremental for continual learning), then an end marker.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_core::{Manifest, SampleKey, SampleRng};
use sluice_pipeline::storage::{LocalStorage, Storage};

use crate::broker::Broker;
use crate::entry::{FIELD_END, FIELD_ID, FIELD_IMAGE, FIELD_LABEL};
use crate::error::StreamError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushOrder {
    /// The dataset's own order.
    #[default]
    AsListed,
    /// Shuffled with the seed.
    Shuffled,
    /// Tasks of `classes_per_task` classes, one after another (labels ascending), the
    /// samples within a task shuffled with the seed: split-MNIST style.
    ClassIncremental,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushOptions {
    pub url: String,
    pub stream: String,
    /// Samples per second; 0 pushes as fast as the broker takes them.
    pub rate: f64,
    pub order: PushOrder,
    pub classes_per_task: usize,
    pub seed: u64,
    /// Push only the first `limit` samples of the order.
    pub limit: Option<usize>,
    /// Append the end marker after the last sample.
    pub end: bool,
    pub reconnect_ms: u64,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PushReport {
    pub pushed: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// The order in which `manifest`'s samples are pushed, as indices into its entries.
pub fn push_order(manifest: &Manifest, order: PushOrder, classes_per_task: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..manifest.len()).collect();
    let shuffle_key = |i: &usize| SampleRng::new(seed, 0, SampleKey(*i as u64), 0x7075_7368).next_u64();
    match order {
        PushOrder::AsListed => {}
        PushOrder::Shuffled => idx.sort_by_key(shuffle_key),
        PushOrder::ClassIncremental => {
            let per = classes_per_task.max(1) as i64;
            idx.sort_by_key(|i| (manifest.labels()[*i].div_euclid(per), shuffle_key(i)));
        }
    }
    idx
}

/// The slowest rate a push takes (samples per second), other than 0 (as fast as it can):
/// below it, a sample's due time is past any `Duration`.
pub const MIN_PUSH_RATE: f64 = 1e-6;

/// Pushes `manifest`'s samples (read from its storage) as stream entries.
pub fn push_dataset(manifest: &Manifest, opts: &PushOptions) -> Result<PushReport, StreamError> {
    if !(opts.rate == 0.0 || (opts.rate.is_finite() && opts.rate >= MIN_PUSH_RATE)) {
        return Err(StreamError::Config {
            field: "rate",
            problem: format!(
                "must be 0 (as fast as the broker takes them) or in [{MIN_PUSH_RATE}, inf); got {}",
                opts.rate
            ),
        });
    }
    let mut broker = Broker::open(&opts.url, Duration::from_millis(opts.reconnect_ms))?;
    let storage = LocalStorage::new();
    let mut order = push_order(manifest, opts.order, opts.classes_per_task, opts.seed);
    if let Some(limit) = opts.limit {
        order.truncate(limit);
    }
    let started = Instant::now();
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    for (n, &i) in order.iter().enumerate() {
        let e = manifest.at(i);
        if opts.rate > 0.0 {
            let due = Duration::from_secs_f64(n as f64 / opts.rate);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        storage.read(&manifest.root, e.location, u64::MAX, &mut buf).map_err(|kind| StreamError::ReadSample {
            key: e.key.0,
            path: manifest.display_path(e.key).display().to_string(),
            kind,
        })?;
        let id = e.key.0.to_string();
        let label = e.label.to_string();
        broker.add(
            &opts.stream,
            &[(FIELD_ID, id.as_bytes()), (FIELD_LABEL, label.as_bytes()), (FIELD_IMAGE, buf.as_slice())],
        )?;
        bytes += buf.len() as u64;
    }
    if opts.end {
        broker.add(&opts.stream, &[(FIELD_END, b"1".as_slice())])?;
    }
    Ok(PushReport { pushed: order.len() as u64, bytes, seconds: started.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::manifest::Location;

    #[test]
    fn a_rate_no_duration_can_hold_is_refused_before_anything_is_pushed() {
        let items = (0..2).map(|i| (Location::File { path: format!("{i}.jpg").into() }, 0, 0)).collect();
        let manifest = Manifest::new("/nonexistent".into(), items, vec![]);
        for rate in [1e-310, -1.0, f64::NAN, f64::INFINITY] {
            let opts = PushOptions {
                url: "redis://127.0.0.1:1/".into(),
                stream: "s".into(),
                rate,
                order: PushOrder::AsListed,
                classes_per_task: 1,
                seed: 0,
                limit: None,
                end: false,
                reconnect_ms: 10,
            };
            match push_dataset(&manifest, &opts) {
                Err(StreamError::Config { field: "rate", .. }) => {}
                other => panic!("rate {rate}: {other:?}"),
            }
        }
    }
}
