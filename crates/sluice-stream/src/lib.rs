//! Streaming sources for continual learning. Samples arrive as entries of a Redis stream;
//! each job reads them through a consumer group, runs them through the same op plan as a
//! file pipeline, and hands out batches of `r` new samples plus `b` rehearsal samples
//! drawn from a buffer of past ones. Deliveries are at-least-once; a ledger of sample ids,
//! carried in the checkpoint, makes training exactly-once per job.
//!
//! `entry`: the entry layout. `broker`: the Redis commands, reconnecting. `ledger`: the
//! ids handled lately. `liveness`: which learners of a group are alive. `rehearsal`: the buffer and its policies. `shards`: the distributed buffer's peers. `rate`: rates and counters.
//! `loader`: the batches. `push`: the producer.

pub mod broker;
pub mod entry;
pub mod error;
pub mod ledger;
pub mod liveness;
pub mod loader;
pub mod monitor;
pub mod push;
pub mod rate;
pub mod rehearsal;
pub mod shards;
pub mod spec;

pub use error::StreamError;
pub use loader::{StreamBatch, StreamLoader, StreamState};
pub use monitor::{StreamLoaderStats, StreamMonitor};
pub use push::{push_dataset, PushOptions, PushOrder, PushReport};
pub use rate::{Counters, StreamStats};
pub use rehearsal::RehearsalPolicy;
pub use spec::{Overflow, RateSpec, RehearsalSpec, StreamSpec, Underflow};
