//! `prefetch = "auto"`: how many batches a loader keeps in flight.
//!
//! tf.data's rule (its `PrefetchAutotuner`, the buffer autotuning Liu et al. §3 describe):
//! the buffer limit starts small; once the consumer finds the buffer full it watches for
//! the buffer to run dry, and when it does (the consumer drained a full buffer faster than
//! the producers refill it: a burst) the limit doubles. A consumer that is never ahead of
//! its producers never sees a full buffer, so the limit never grows.
//!
//! sluice's design around it: a batch in flight here is either being built or ready,
//! whereas tf.data's buffer holds ready elements only (its map has its own parallelism).
//! So the depth is the batches the threads can build at once (`threads × CHUNK` samples)
//! plus tf.data's ready limit, and the buffer is full when the batches ready in order reach
//! the ready limit, as tf.data's buffer of finished elements is full at its limit. (Not
//! when every batch of the depth is ready: the batch submitted as the consumer took the
//! last one is still being built when a consumer whose step is shorter than one batch's
//! build comes back, so that buffer was never full however far ahead the producers ran.)
//! An epoch's first batch is not a reading: nothing was in flight to be ready. The ready
//! limit doubles only while the whole depth stays within the memory bound
//! (`prefetch_max_bytes ÷ batch bytes`), and the depth never passes it.

use serde::Serialize;

/// The prefetch depth now and how it got there, as [`crate::StatsSnapshot::prefetch`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrefetchStats {
    /// `prefetch = "auto"`: the depth moves.
    pub auto: bool,
    /// Batches in flight at most now (being built or ready).
    pub depth: usize,
    /// tf.data's buffer limit: ready batches the depth leaves room for.
    pub ready_limit: usize,
    /// The depth the memory bound allows.
    pub max_depth: usize,
    /// Times the ready limit doubled.
    pub grows: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Swing {
    /// Waiting for the consumer to find the buffer full.
    Up,
    /// It was full: waiting for it to run dry.
    Down,
}

/// The depth of one loader (a fixed one for a count).
#[derive(Debug, Clone)]
pub(super) struct PrefetchTuner {
    auto: bool,
    fixed: usize,
    max_depth: usize,
    ready_limit: usize,
    swing: Swing,
    grows: u64,
}

impl PrefetchTuner {
    /// A fixed depth of `n` batches.
    pub(super) fn fixed(n: usize) -> Self {
        let n = n.max(1);
        Self { auto: false, fixed: n, max_depth: n, ready_limit: n, swing: Swing::Up, grows: 0 }
    }

    /// An autotuned depth of at most `max_depth` batches.
    pub(super) fn auto(max_depth: usize) -> Self {
        Self { auto: true, fixed: 0, max_depth: max_depth.max(1), ready_limit: 1, swing: Swing::Up, grows: 0 }
    }

    /// Batches the pool can build at once: `threads × samples_per_job` samples, in batches.
    fn building(threads: usize, samples_per_job: usize, batch_size: usize) -> usize {
        (threads.max(1) * samples_per_job.max(1)).div_ceil(batch_size.max(1))
    }

    /// Batches to keep in flight now.
    pub(super) fn depth(&self, threads: usize, samples_per_job: usize, batch_size: usize) -> usize {
        if !self.auto {
            return self.fixed;
        }
        (Self::building(threads, samples_per_job, batch_size) + self.ready_limit).clamp(1, self.max_depth)
    }

    /// The consumer asked for a batch and found `ready` batches ready in order (0: it
    /// waits). tf.data's `RecordConsumption`.
    pub(super) fn record(&mut self, ready: usize, threads: usize, samples_per_job: usize, batch_size: usize) {
        if !self.auto {
            return;
        }
        match self.swing {
            Swing::Up if ready >= self.ready_limit => self.swing = Swing::Down,
            Swing::Down if ready == 0 => {
                let doubled = self.ready_limit.saturating_mul(2);
                let room = self.max_depth.saturating_sub(Self::building(threads, samples_per_job, batch_size));
                if doubled <= room.max(1) {
                    self.ready_limit = doubled;
                    self.grows += 1;
                    tracing::debug!(ready_limit = doubled, "prefetch: the consumer drained a full buffer; doubling");
                } else if self.ready_limit < room {
                    self.ready_limit = room;
                    self.grows += 1;
                }
                self.swing = Swing::Up;
            }
            _ => {}
        }
    }

    pub(super) fn stats(&self, threads: usize, samples_per_job: usize, batch_size: usize) -> PrefetchStats {
        PrefetchStats {
            auto: self.auto,
            depth: self.depth(threads, samples_per_job, batch_size),
            ready_limit: self.ready_limit,
            max_depth: self.max_depth,
            grows: self.grows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_that_runs_dry_doubles_the_ready_limit_within_the_bound() {
        // 2 threads × 8 samples in batches of 8: two batches being built, one ready.
        let mut t = PrefetchTuner::auto(9);
        assert_eq!(t.depth(2, 8, 8), 3);
        t.record(0, 2, 8, 8);
        t.record(1, 2, 8, 8);
        assert_eq!(t.depth(2, 8, 8), 3, "full (one ready of a limit of one), but not yet dry");
        t.record(0, 2, 8, 8);
        assert_eq!((t.depth(2, 8, 8), t.stats(2, 8, 8).grows), (4, 1), "full, then dry: the ready limit doubles");
        t.record(1, 2, 8, 8);
        t.record(0, 2, 8, 8);
        assert_eq!(t.depth(2, 8, 8), 4, "one ready of a limit of two: the buffer was never full");
        t.record(2, 2, 8, 8);
        t.record(0, 2, 8, 8);
        assert_eq!(t.depth(2, 8, 8), 6);
        t.record(4, 2, 8, 8);
        t.record(0, 2, 8, 8);
        assert_eq!(t.depth(2, 8, 8), 9, "the last step stops at the bound (2 building + 7 ready)");
        t.record(7, 2, 8, 8);
        t.record(0, 2, 8, 8);
        assert_eq!((t.depth(2, 8, 8), t.stats(2, 8, 8).grows), (9, 3), "and never passes it");
    }

    #[test]
    fn a_fixed_depth_stays_put() {
        let mut t = PrefetchTuner::fixed(4);
        t.record(4, 2, 8, 8);
        t.record(0, 2, 8, 8);
        assert_eq!(t.stats(16, 8, 8), PrefetchStats { auto: false, depth: 4, ready_limit: 4, max_depth: 4, grows: 0 });
    }
}
