//! How a streaming job is configured (serde; JSON from Python, TOML or flags from the CLI).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sluice_core::{ErrorPolicy, Limits, OpSpec, PipelineSpec, SourceSpec, Threads};

use crate::error::StreamError;
use crate::rehearsal::RehearsalPolicy;

/// The largest rehearsal buffer, in samples (its slots are held in memory).
pub const MAX_REHEARSAL_CAPACITY: usize = 1 << 24;
/// The most entries held unacknowledged without a checkpoint.
pub const MAX_UNACKED: usize = 1 << 24;
/// The most samples read ahead.
pub const MAX_BUFFER: usize = 1 << 20;
/// The shortest liveness period: the heartbeat thread refreshes the key four times per
/// period, and a shorter one would take a briefly stalled learner for dead.
pub const MIN_CLAIM_IDLE_MS: u64 = 100;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    /// `redis://127.0.0.1:6379`
    pub url: String,
    /// The stream's key.
    pub stream: String,
    /// The consumer group: one per job. Every job reads the whole stream.
    pub group: String,
    /// This reader's name in the group (one per learner). A restarted trainer keeps its
    /// name (the checkpoint carries it) so it reads back its own unacknowledged entries.
    #[serde(default = "default_consumer")]
    pub consumer: String,
    /// The same op list as a file pipeline's (decode, crops, flips, normalize...).
    pub ops: Vec<OpSpec>,
    /// New samples per batch (r).
    pub new_per_batch: usize,
    /// Rehearsal samples per batch (b); needs a `rehearsal` section.
    #[serde(default)]
    pub rehearsal_per_batch: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehearsal: Option<RehearsalSpec>,
    #[serde(default)]
    pub rate: RateSpec,
    #[serde(default)]
    pub seed: u64,
    /// Decoding threads of the engine: a count (0: one per core) or `"auto"`, where the
    /// autoscaler sizes the pool to what the trainer consumes.
    #[serde(default)]
    pub threads: Threads,
    #[serde(default)]
    pub on_error: ErrorPolicy,
    #[serde(default)]
    pub limits: Limits,
    /// Liveness: each learner refreshes a key of its own in the broker with this time to
    /// live (from a background thread, four times per period, however long its steps). A
    /// learner whose key has expired is dead; its entries pending at least this long are
    /// claimed by a live learner. A live learner's entries are never claimed.
    #[serde(default = "default_claim_idle_ms")]
    pub claim_idle_ms: u64,
    /// Entries held unacknowledged for want of a `state()` that covers them, at most.
    /// Beyond, the oldest batches are acknowledged without one (logged once): the broker's
    /// pending list stays bounded for a trainer that never checkpoints, but a restore from
    /// a state older than these entries does not train them again. Checkpoint at least
    /// every `max_unacked` new samples. The ledger keeps the newest `max_unacked +
    /// rate.buffer` ids.
    #[serde(default = "default_max_unacked")]
    pub max_unacked: usize,
    /// How long to wait out a broker that is down or restarting before failing.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RehearsalSpec {
    pub capacity: usize,
    #[serde(default)]
    pub policy: RehearsalPolicy,
    /// Where `state()` writes the buffer's contents (the state names the file): required.
    #[serde(default)]
    pub dir: PathBuf,
    /// Persist the exemplars as they are kept, in `dir/<stream>-<group>-<consumer>.exemplars`
    /// (Liu, Nicolae et al. §4.2's second option): a loader started again with the same
    /// spec and no checkpoint to restore reads its buffer back from there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persist: bool,
    /// A distributed buffer: every learner's `host:port`, by rank. Each learner serves its
    /// shard on its own entry and draws from all shards.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// This learner's index in `peers`.
    #[serde(default)]
    pub rank: usize,
    /// The job's shared secret for the shard servers, the same on every learner; without
    /// it here, `SLUICE_PEER_TOKEN`. With `peers` and neither, the loader refuses to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<sluice_core::PeerToken>,
}

/// What to do when the stream and the trainer run at different rates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    /// Samples read ahead of the trainer, at most.
    #[serde(default = "default_buffer")]
    pub buffer: usize,
    /// Under `overflow = "backpressure"`: batches of new samples a learner takes from the
    /// group ahead of its trainer, at most (`read_ahead × new_per_batch` entries, and no
    /// more than `buffer`). It reads more only as batches are taken, so learners sharing
    /// a group split the backlog by how fast they train: a slow one holds no more than it
    /// trains soon, and the rest goes to the others.
    #[serde(default = "default_read_ahead")]
    pub read_ahead: usize,
    #[serde(default)]
    pub overflow: Overflow,
    #[serde(default)]
    pub underflow: Underflow,
    /// Under `underflow = "rehearsal"`: how long a batch waits for new samples before
    /// the rest is filled from the rehearsal buffer.
    #[serde(default = "default_fill_after_ms")]
    pub fill_after_ms: u64,
}

impl Default for RateSpec {
    fn default() -> Self {
        Self {
            buffer: default_buffer(),
            read_ahead: default_read_ahead(),
            overflow: Overflow::default(),
            underflow: Underflow::default(),
            fill_after_ms: default_fill_after_ms(),
        }
    }
}

/// The stream is faster than the trainer and the read-ahead buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Stop reading: the broker keeps the backlog.
    #[default]
    Backpressure,
    /// Drop the oldest sample read ahead (counted, never trained on).
    DropOldest,
    /// Drop a sample read ahead chosen at random (counted, never trained on), as Liu,
    /// Nicolae et al. §4.2 ask ("simply drop them at random"); the choice is a function of
    /// the spec's seed, the drops so far and the arriving sample's id.
    DropRandom,
    /// Move the oldest sample read ahead into the rehearsal buffer (counted).
    Spill,
}

/// The stream is slower than the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Underflow {
    /// Wait for `new_per_batch` new samples.
    #[default]
    Wait,
    /// Fill what is missing with rehearsal samples (counted), after `fill_after_ms`.
    Rehearsal,
}

fn default_consumer() -> String {
    "learner-0".into()
}
fn default_claim_idle_ms() -> u64 {
    30_000
}
fn default_max_unacked() -> usize {
    65_536
}
fn default_reconnect_ms() -> u64 {
    30_000
}
fn default_buffer() -> usize {
    1024
}
fn default_read_ahead() -> usize {
    2
}
fn default_fill_after_ms() -> u64 {
    5
}

impl RateSpec {
    /// The most new samples a learner takes from the group ahead of its trainer under
    /// `overflow = "backpressure"`: `read_ahead` batches, within `buffer`.
    pub fn read_ahead_samples(&self, new_per_batch: usize) -> usize {
        self.read_ahead.saturating_mul(new_per_batch).min(self.buffer)
    }
}

impl StreamSpec {
    pub fn validate(&self) -> Result<(), StreamError> {
        let bad = |field, problem: &str| Err(StreamError::Config { field, problem: problem.to_string() });
        if self.new_per_batch == 0 {
            return bad("new_per_batch", "must be at least 1");
        }
        if self.rate.buffer < self.new_per_batch {
            return bad("rate.buffer", "must hold at least one batch of new samples (new_per_batch)");
        }
        if self.rate.read_ahead == 0 {
            return bad("rate.read_ahead", "must be at least 1 (batches of new samples read ahead of the trainer)");
        }
        if self.stream.is_empty() || self.group.is_empty() || self.consumer.is_empty() {
            return bad("stream/group/consumer", "must not be empty");
        }
        if self.claim_idle_ms < MIN_CLAIM_IDLE_MS {
            return bad(
                "claim_idle_ms",
                &format!("must be at least {MIN_CLAIM_IDLE_MS} ms (the liveness key's time to live)"),
            );
        }
        if self.max_unacked > MAX_UNACKED {
            return bad("max_unacked", &format!("must be at most {MAX_UNACKED} (the ledger keeps that many ids)"));
        }
        if self.rate.buffer > MAX_BUFFER {
            return bad("rate.buffer", &format!("must be at most {MAX_BUFFER} samples"));
        }
        if let Some(r) = &self.rehearsal {
            if r.capacity > MAX_REHEARSAL_CAPACITY {
                return bad("rehearsal.capacity", &format!("must be at most {MAX_REHEARSAL_CAPACITY} samples"));
            }
            if r.dir.as_os_str().is_empty() {
                return bad(
                    "rehearsal.dir",
                    "is required: the directory where state() writes the rehearsal buffer's contents for a checkpoint",
                );
            }
        }
        let capacity = self.rehearsal.as_ref().map_or(0, |r| r.capacity);
        if self.rehearsal_per_batch > 0 && capacity == 0 {
            return bad("rehearsal_per_batch", "needs a rehearsal buffer (`rehearsal.capacity` > 0)");
        }
        if let Some(r) = self.rehearsal.as_ref().filter(|r| !r.peers.is_empty()) {
            if r.rank >= r.peers.len() {
                return bad("rehearsal.rank", &format!("{} is not below the {} peers listed", r.rank, r.peers.len()));
            }
        }
        if self.rate.underflow == Underflow::Rehearsal && capacity == 0 {
            return bad("rate.underflow", "`rehearsal` needs a rehearsal buffer");
        }
        if self.rate.overflow == Overflow::Spill && capacity == 0 {
            return bad("rate.overflow", "`spill` needs a rehearsal buffer");
        }
        // The ops, limits and threads are checked as a file pipeline's would be.
        let source = SourceSpec::FileList { path: PathBuf::from(&self.stream), root: None };
        let mut pipeline = PipelineSpec::train_default(source, 1, self.new_per_batch + self.rehearsal_per_batch);
        pipeline.ops = self.ops.clone();
        pipeline.limits = self.limits;
        pipeline.threads = self.threads;
        pipeline.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rehearsal: &str) -> Result<StreamSpec, String> {
        let text = format!(
            r#"{{"url": "redis://127.0.0.1:1/", "stream": "s", "group": "g", "ops": [{{"op": "decode"}}, {{"op": "center_crop", "size": 16}}],
                "new_per_batch": 4, "rehearsal_per_batch": 2, "rehearsal": {rehearsal}}}"#
        );
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    fn problem(spec: &StreamSpec) -> String {
        spec.validate().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn a_rehearsal_buffer_without_a_dir_is_refused_naming_the_field_and_what_it_is_for() {
        let parsed = spec(r#"{"capacity": 8}"#);
        let e = parsed.as_ref().map(problem).unwrap_or_else(|e| e.clone());
        assert!(e.starts_with("stream config: `rehearsal.dir` is required") && e.contains("state()"), "{e}");
    }

    #[test]
    fn read_ahead_defaults_to_two_batches_within_the_buffer_and_zero_is_refused_naming_the_field() {
        let mut spec = spec(r#"{"capacity": 8, "dir": "/tmp/r"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.rate.read_ahead, 2);
        assert_eq!(spec.rate.read_ahead_samples(spec.new_per_batch), 8, "two batches of 4");
        spec.rate.buffer = 6;
        assert_eq!(spec.rate.read_ahead_samples(spec.new_per_batch), 6, "never past the buffer");
        spec.rate.read_ahead = usize::MAX;
        assert_eq!(spec.rate.read_ahead_samples(spec.new_per_batch), 6, "no overflow");
        spec.rate.read_ahead = 0;
        assert!(
            problem(&spec).starts_with("stream config: `rate.read_ahead` must be at least 1"),
            "{}",
            problem(&spec)
        );
    }

    #[test]
    fn a_rehearsal_capacity_past_the_bound_is_refused_naming_the_field() {
        let parsed = spec(&format!(r#"{{"capacity": {}, "dir": "/tmp/r"}}"#, usize::MAX));
        let e = parsed.as_ref().map(problem).unwrap_or_else(|e| e.clone());
        assert!(e.starts_with("stream config: `rehearsal.capacity` must be at most"), "{e}");
        let fits = spec(r#"{"capacity": 1000, "dir": "/tmp/r"}"#).map(|s| s.validate().is_ok());
        assert_eq!(fits, Ok(true));
    }
}
