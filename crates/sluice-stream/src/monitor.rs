//! What other threads read about a [`crate::StreamLoader`] while it is busy: its stats, as
//! the loader publishes them at every step of a wait and after every batch, and its
//! rehearsal buffer's ids. Neither waits for the loader, which a trainer's `next()` holds
//! for as long as the stream is empty.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::loader::StreamLoaderStats;
use crate::shards::Shard;

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
