//! What a loader has done and where its time went: samples, bytes, skipped samples (with
//! key and path), time per op summed over workers with its per-sample p50/p99, and how
//! long the consumer waited.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::counters::{CounterSource, OpCounters};
use crate::importance::ReportCounts as ImportanceReportCounts;
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
    /// Per op, the nanoseconds each sample spent in it (samples that skipped the op, e.g.
    /// `read` on a cache hit, are not counted).
    op_hist: Vec<Histogram<u64>>,
    /// Per op, what the CPU counters moved, once any chunk ran with them on.
    op_counters: Option<(CounterSource, Vec<[u64; crate::counters::N]>)>,
    wait: Duration,
    importance_reports: ImportanceReportCounts,
}

/// Two significant digits: a percentile is within 1% of the true sample's time.
const SIGFIG: u8 = 2;

/// 1 ns to an hour: longer samples count as an hour.
const MAX_NS: u64 = 3_600_000_000_000;

fn op_histogram() -> Histogram<u64> {
    // Fixed, valid bounds and precision: the only ways `new_with_bounds` fails.
    Histogram::new_with_bounds(1, MAX_NS, SIGFIG).unwrap_or_else(|_| unreachable!("valid histogram bounds"))
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
            op_hist: (0..op_names.len()).map(|_| op_histogram()).collect(),
            op_names,
            op_counters: None,
            wait: Duration::ZERO,
            importance_reports: ImportanceReportCounts::default(),
        }
    }

    /// A chunk's work: its op totals, and `per_sample`, each sample's op times laid end to
    /// end (`times.len()` per sample; zero where the sample skipped the op).
    pub(crate) fn add_work(&mut self, times: &[Duration], per_sample: &[Duration], bytes: u64) {
        for (total, t) in self.op_times.iter_mut().zip(times) {
            *total += *t;
        }
        if !times.is_empty() {
            for sample in per_sample.chunks(times.len()) {
                for (hist, t) in self.op_hist.iter_mut().zip(sample) {
                    if !t.is_zero() {
                        hist.saturating_record(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1));
                    }
                }
            }
        }
        self.bytes_read += bytes;
    }

    /// A chunk's per-op counter deltas.
    pub(crate) fn add_counters(&mut self, source: CounterSource, per_op: &[[u64; crate::counters::N]]) {
        let (src, totals) =
            self.op_counters.get_or_insert_with(|| (source, vec![[0; crate::counters::N]; self.op_names.len()]));
        // Threads agree on the source but for a racing fallback: the weakest one names it.
        if source == CounterSource::Rusage
            || (source == CounterSource::PerfSoftware && *src == CounterSource::PerfHardware)
        {
            *src = source;
        }
        for (t, c) in totals.iter_mut().zip(per_op) {
            for (a, b) in t.iter_mut().zip(c) {
                *a += b;
            }
        }
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

    /// What became of one importance report's values (see [`crate::Loader::report`]).
    pub(crate) fn add_importance_report(&mut self, counts: ImportanceReportCounts) {
        self.importance_reports.add(counts);
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
            op_percentiles: self
                .op_names
                .iter()
                .zip(&self.op_hist)
                .map(|(op, h)| OpPercentiles {
                    op: op.clone(),
                    samples: h.len(),
                    p50_s: h.value_at_quantile(0.5) as f64 / 1e9,
                    p99_s: h.value_at_quantile(0.99) as f64 / 1e9,
                })
                .collect(),
            op_counters: self.op_counters.as_ref().map(|(source, totals)| {
                self.op_names.iter().zip(totals).map(|(op, c)| OpCounters::new(op.clone(), *source, c)).collect()
            }),
            skipped: self.skipped.clone(),
            importance_reports: self.importance_reports,
            cache: None,
            entropy_index: None,
            autoscale: None,
            prefetch: None,
            read_ahead: None,
            accelerator: None,
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
    /// Per op, in `op_seconds`' order: how long one sample spent in it, median and 99th
    /// percentile, over the samples that ran it.
    pub op_percentiles: Vec<OpPercentiles>,
    /// Per op, CPU counters summed over threads, when [`crate::Loader::set_op_counters`]
    /// turned them on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_counters: Option<Vec<OpCounters>>,
    pub skipped: Vec<SkippedSample>,
    /// Importance values reported through [`crate::Loader::report`]: accepted (the clamped
    /// included), clamped to [`crate::importance::MAX_IMPORTANCE`], and refused (NaN,
    /// infinite, negative).
    pub importance_reports: ImportanceReportCounts,
    /// Cache hits, misses, hit rate, bytes, evictions, estimated time saved and the level
    /// decision, when the pipeline has a cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheStats>,
    /// Files indexed for crops (and the bytes their indexes hold), files the index cannot
    /// serve (progressive, arithmetic-coded, damaged: decoded whole), files left out once
    /// its memory was full, and decodes cut down to their window; with
    /// `decode.entropy_index` on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_index: Option<sluice_codec::IndexStats>,
    /// Threads now, decisions counted up and down, and the latest decisions with their
    /// inputs, when the loader autoscales (`threads = "auto"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<sluice_autoscale::AutoscaleStats>,
    /// The batches a loader keeps in flight now, and for `prefetch = "auto"` how its
    /// autotuner got there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::loader::PrefetchStats>,
    /// Object storage's reads started ahead of the worker threads: reads they served,
    /// read-aheads given up unread, and failed ones (read again); absent while none ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<crate::storage::ReadAheadStats>,
    /// The consumer's accelerator busy fraction over the last few seconds: its own report
    /// ([`crate::Loader::report_accelerator_busy`]) while fresh, else its step timing
    /// (compute ÷ (compute + wait) between its `next()` calls); `None` before a step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<sluice_autoscale::AcceleratorBusy>,
}

/// One op's per-sample time distribution.
#[derive(Debug, Clone, Serialize)]
pub struct OpPercentiles {
    pub op: String,
    /// Samples that ran the op.
    pub samples: u64,
    pub p50_s: f64,
    pub p99_s: f64,
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
    fn percentiles_per_op_follow_a_known_distribution_within_one_percent() {
        let mut stats = Stats::new(vec!["read".into(), "decode".into()]);
        // Chunks of 8 samples: read takes 1..=1000 µs uniformly, decode a constant 5 ms,
        // and every 4th sample is a cache hit that skips the read.
        let mut per_sample = Vec::new();
        for i in 1..=1000u64 {
            per_sample.push(Duration::from_micros(i));
            per_sample.push(Duration::from_millis(5));
            per_sample.push(Duration::ZERO);
            per_sample.push(Duration::from_millis(5));
        }
        for chunk in per_sample.chunks(2 * 8) {
            let times = [chunk.iter().step_by(2).sum(), chunk.iter().skip(1).step_by(2).sum()];
            stats.add_work(&times, chunk, 0);
        }
        let s = stats.snapshot();
        let [read, decode] = &s.op_percentiles[..] else { panic!("{:?}", s.op_percentiles) };
        assert_eq!((read.op.as_str(), read.samples), ("read", 1000), "hits skip the read: {read:?}");
        assert_eq!((decode.op.as_str(), decode.samples), ("decode", 2000));
        let near = |got: f64, want: f64| (got - want).abs() <= 0.01 * want;
        assert!(near(read.p50_s, 500e-6) && near(read.p99_s, 990e-6), "{read:?}");
        assert!(near(decode.p50_s, 5e-3) && near(decode.p99_s, 5e-3), "{decode:?}");
        let total: f64 = s.op_seconds.iter().map(|(_, t)| t).sum();
        assert!((total - (0.5005 + 10.0)).abs() < 1e-9, "the sums still add up: {total}");
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
