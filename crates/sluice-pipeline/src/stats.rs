//! What a loader has done and where its time went: samples, bytes, skipped samples (with
//! key and path), time per op summed over workers, and how long the consumer waited.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_core::SampleError;

/// A sample left out under the `skip` policy.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedSample {
    pub key: u64,
    pub path: String,
    pub error: String,
}

impl From<&SampleError> for SkippedSample {
    fn from(e: &SampleError) -> Self {
        Self { key: e.key.0, path: e.path.display().to_string(), error: e.to_string() }
    }
}

/// Totals since the loader was built. Only the consuming thread writes them.
#[derive(Debug)]
pub(crate) struct Stats {
    started: Instant,
    samples: u64,
    batches: u64,
    bytes_read: u64,
    skipped: Vec<SkippedSample>,
    /// Keys already warned about: a bad file is logged once per run, not once per epoch.
    warned: HashSet<u64>,
    /// Index 0 is `read`; then one per plan step.
    op_times: Vec<Duration>,
    op_names: Vec<String>,
    wait: Duration,
}

impl Stats {
    pub(crate) fn new(op_names: Vec<String>) -> Self {
        Self {
            started: Instant::now(),
            samples: 0,
            batches: 0,
            bytes_read: 0,
            skipped: Vec::new(),
            warned: HashSet::new(),
            op_times: vec![Duration::ZERO; op_names.len()],
            op_names,
            wait: Duration::ZERO,
        }
    }

    pub(crate) fn add_work(&mut self, times: &[Duration], bytes: u64) {
        for (total, t) in self.op_times.iter_mut().zip(times) {
            *total += *t;
        }
        self.bytes_read += bytes;
    }

    pub(crate) fn add_batch(&mut self, samples: usize) {
        self.batches += 1;
        self.samples += samples as u64;
    }

    pub(crate) fn add_skipped(&mut self, e: &SampleError) {
        if self.warned.insert(e.key.0) {
            // The error names the key and path; fields would print them a second time.
            tracing::warn!("{e}; skipping it (each bad sample is reported once per run)");
        }
        self.skipped.push(e.into());
    }

    pub(crate) fn add_wait(&mut self, d: Duration) {
        self.wait += d;
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let elapsed = self.started.elapsed().as_secs_f64();
        StatsSnapshot {
            samples: self.samples,
            batches: self.batches,
            bytes_read: self.bytes_read,
            elapsed_s: elapsed,
            samples_per_s: if elapsed > 0.0 { self.samples as f64 / elapsed } else { 0.0 },
            wait_s: self.wait.as_secs_f64(),
            op_seconds: self.op_names.iter().cloned().zip(self.op_times.iter().map(Duration::as_secs_f64)).collect(),
            skipped: self.skipped.clone(),
            cache: None,
            autoscale: None,
        }
    }
}

/// A copy of the stats at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct StatsSnapshot {
    pub samples: u64,
    pub batches: u64,
    pub bytes_read: u64,
    pub elapsed_s: f64,
    pub samples_per_s: f64,
    /// Time the consumer spent blocked waiting for a batch (input stall).
    pub wait_s: f64,
    /// Busy time per op, summed over worker threads: `read`, then the plan's steps.
    pub op_seconds: Vec<(String, f64)>,
    pub skipped: Vec<SkippedSample>,
    /// Cache hits, misses, hit rate, bytes, evictions, estimated time saved and the level
    /// decision, when the pipeline has a cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheStats>,
    /// Threads now, decisions counted up and down, and the latest decisions with their
    /// inputs, when the loader autoscales (`threads = "auto"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<sluice_autoscale::AutoscaleStats>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::sync::Arc;

    use parking_lot::Mutex;
    use sluice_core::{SampleErrorKind, SampleKey, Stage};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_bad_sample_is_warned_about_once_per_run_naming_its_key_and_path_once() {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .finish();
        let bad = SampleError {
            key: SampleKey(603),
            path: "/p/x.jpg".into(),
            stage: Stage::Decode,
            kind: SampleErrorKind::Corrupt("bad Huffman code".into()),
        };
        let mut stats = Stats::new(vec!["read".into()]);
        tracing::subscriber::with_default(subscriber, || {
            for _epoch in 0..3 {
                stats.add_skipped(&bad);
            }
        });
        let text = String::from_utf8(log.0.lock().clone()).unwrap();
        assert_eq!(
            text.trim(),
            "WARN sample #603 (/p/x.jpg) failed at decode: corrupt or truncated image: bad Huffman code; skipping it \
             (each bad sample is reported once per run)",
            "{text}"
        );
        assert_eq!(stats.snapshot().skipped.len(), 3, "the stats still count every skip");
    }
}
