//! Errors of the pipeline layer.

use sluice_core::{SampleError, SpecError};

use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The throttled storage's shared link file cannot be used.
    #[error(transparent)]
    StorageLink(#[from] crate::storage::LinkError),
    /// This learner's peer server (collaborative cache) cannot start, or it has no token.
    #[error(transparent)]
    Peer(#[from] crate::locality::peer::PeerError),
    /// A bad sample under the `fail` policy.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// A checkpoint that does not belong to this loader.
    #[error("cannot restore loader state: {0}")]
    State(String),
    /// A shard outside the job: `rank` must be in `0..world_size`.
    #[error("rank {rank} is not in 0..world_size ({world_size})")]
    BadRank { rank: usize, world_size: usize },
    /// The cache budget is a share of RAM on a system that does not say how much it has.
    #[error(
        "cache.budget is a fraction of RAM, but this system does not report its memory (/proc/meminfo); give the \
         budget in bytes"
    )]
    RamUnknown,
    /// The cache's disk tier cannot be opened.
    #[error(transparent)]
    DiskCache(#[from] crate::cache::DiskCacheError),
    /// A cache handed to [`crate::Loader::with_shared_cache`] that this loader cannot use.
    #[error("cannot share the cache: {0}")]
    SharedCache(String),
    /// [`crate::Loader::report`] got a different number of keys and values.
    #[error("report: {keys} keys but {values} values; give one value per key")]
    ReportLengths { keys: usize, values: usize },
    /// An allowed root that reads cannot be confined under (see [`crate::Loader::confine_reads`]).
    #[error(transparent)]
    Root(#[from] crate::storage::RootError),
    /// A manifest built without the spec's metadata fields (by `source::build_manifest`
    /// rather than `source::build_pipeline_manifest`): its batches would lack them.
    #[error(
        "the spec names metadata fields but the manifest was enumerated without them (build it with \
         source::build_pipeline_manifest)"
    )]
    ManifestWithoutFields,
    /// The loader's storage was to be changed after it had started handing out work.
    #[error("a loader's reads can only be confined before it starts")]
    AlreadyStarted,
    /// Autoscaling settings that cannot work (bounds, window).
    #[error(transparent)]
    Autoscale(#[from] sluice_autoscale::ConfigError),
    /// A batch's buffer was still held by a worker when the batch was complete: a bug.
    #[error("internal error: batch {batch}'s buffer is still shared after all its samples finished")]
    BufferStillShared { batch: u64 },
    /// The caller asked a waiting iterator to stop (Ctrl-C); iterating again continues.
    #[error("interrupted while waiting for a batch")]
    Interrupted,
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}
