//! sluice's engine: sources enumerate a dataset into a manifest, storage reads sample bytes,
//! the sampler orders each epoch, and the loader runs the op plan on a resizable pool of
//! native threads, handing out contiguous batches with bounded prefetch and exact
//! checkpoints.

pub mod cache;
pub mod counters;
pub mod error;
pub mod executor;
pub mod importance;
pub mod loader;
pub mod locality;
pub mod pack;
pub mod sampler;
pub mod source;
pub mod stats;
pub mod storage;
pub mod trace;

pub use cache::{CacheStats, CachedData};
pub use counters::{CounterSource, OpCounters, COUNTER_NAMES};
pub use error::PipelineError;
pub use importance::ImportanceState;
pub use loader::{BufferSource, EpochIter, Loader, LoaderState, LocalityOrder, OrderSpec, PrefetchStats};
pub use sampler::{epoch_order, EpochDraw, ImportanceParams, Shard};
/// User-defined ops (the spec's `map` op): implement [`UserOp`] and [`register_user_op`] it
/// under the name a spec's `{op = "map", fn = "..."}` gives, before building the loader.
pub use sluice_codec::user_op::{
    register_user_op, unregister_user_op, user_op, ImageRef, SampleInfo, UserOp, UserOpError,
};
pub use stats::{OpPercentiles, SkippedSample, StatsSnapshot};
pub use trace::{TraceData, TraceError, TraceFormat};
