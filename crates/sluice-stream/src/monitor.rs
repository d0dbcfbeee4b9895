//! What other threads read about a [`crate::StreamLoader`] while it is busy: its stats, as
//! the loader publishes them at every step of a wait and after every batch, and its
//! rehearsal buffer's ids. Neither waits for the loader, which a trainer's `next()` holds
//! for as long as the stream is empty.

use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use sluice_autoscale::AutoscaleStats;
use sluice_pipeline::{OpCounters, OpPercentiles};

use crate::rate::StreamStats;
use crate::shards::Shard;

/// A stream loader's stats: the stream's, and those of the engine its batches are built on
/// (the same per-op times and percentiles as a file loader's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamLoaderStats {
    #[serde(flatten)]
    pub stream: StreamStats,
    /// Decoding threads now (under `threads = "auto"`, the autoscaler moves them).
    pub threads: usize,
    /// Time the trainer waited for samples to be decoded (not for the stream).
    pub wait_s: f64,
    /// Busy time per op of the plan, summed over threads.
    pub op_seconds: Vec<(String, f64)>,
    /// Per op: how long one sample spent in it, median and 99th percentile.
    pub op_percentiles: Vec<OpPercentiles>,
    /// Per op, CPU counters, when [`sluice_pipeline::loader::Engine::set_op_counters`] turned them on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_counters: Option<Vec<OpCounters>>,
    /// Threads, decisions and their inputs, under `threads = "auto"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleStats>,
}

/// A handle on a stream loader's stats and rehearsal buffer (from
/// [`crate::StreamLoader::monitor`]), for a monitoring thread.
#[derive(Clone, Default)]
pub struct StreamMonitor {
    stats: Arc<Mutex<StreamLoaderStats>>,
    rehearsal: Option<Shard>,
}

impl StreamMonitor {
    pub(crate) fn new(rehearsal: Option<Shard>) -> Self {
        Self { stats: Arc::default(), rehearsal }
    }

    pub(crate) fn publish(&self, stats: StreamLoaderStats) {
        *self.stats.lock() = stats;
    }

    /// The loader's stats as of its last batch, or its last step (at most 50 ms ago) while
    /// it waits for the stream.
    pub fn stats(&self) -> StreamLoaderStats {
        self.stats.lock().clone()
    }

    /// The samples in the rehearsal buffer, by id.
    pub fn rehearsal_ids(&self) -> Vec<u64> {
        self.rehearsal.as_ref().map(|r| r.lock().items().iter().map(|s| s.id).collect()).unwrap_or_default()
    }
}
