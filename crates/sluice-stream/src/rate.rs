//! Rates and counts of a streaming job: how fast samples arrive at the broker and how fast
//! the trainer takes them (measured by [`sluice_autoscale::RateMeter`]), the backlog, and
//! what each rate policy did.

use serde::{Deserialize, Serialize};

/// How far back the rates look, in seconds.
pub(crate) const RATE_WINDOW_S: f64 = 5.0;

/// What the rate policies and the ledger did, over the whole job (carried in the state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// New samples handed to the trainer.
    pub trained: u64,
    /// Rehearsal samples mixed into batches (including fills).
    pub rehearsed: u64,
    /// Rehearsal samples that stood in for new ones the stream had not delivered yet.
    pub filled: u64,
    /// Samples dropped (oldest first) because the read-ahead buffer was full.
    pub dropped: u64,
    /// Samples moved into the rehearsal buffer instead of being trained on as new.
    pub spilled: u64,
    /// Deliveries of a sample id already handled (at-least-once redeliveries).
    pub duplicates: u64,
    /// Entries or images skipped as malformed (`on_error = "skip"`).
    pub malformed: u64,
    /// Entries claimed from dead readers (XAUTOCLAIM).
    pub claimed: u64,
    /// Batches handed out.
    pub batches: u64,
    /// Of the rehearsal samples, those drawn from peers' shards (distributed buffer).
    #[serde(default)]
    pub rehearsed_remote: u64,
    /// Draws that fell on a peer whose samples had not arrived yet: drawn locally instead.
    #[serde(default)]
    pub remote_missed: u64,
}

/// A point-in-time view for `stats()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Entries appended to the stream per second (last few seconds).
    pub arrival_rate: f64,
    /// New samples the trainer took per second (last few seconds).
    pub consumption_rate: f64,
    /// Entries not yet trained on: undelivered in the broker plus read ahead here.
    pub backlog: u64,
    /// Of the backlog, read ahead into this loader.
    pub read_ahead: u64,
    pub rehearsal_len: u64,
    pub ledger_len: u64,
    /// Peers' samples fetched and waiting to be drawn (distributed buffer).
    pub peer_ready: u64,
    /// Requests to peers that failed (unreachable, timed out, malformed reply).
    pub peer_errors: u64,
    #[serde(flatten)]
    pub counters: Counters,
}
