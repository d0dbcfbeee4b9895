//! Errors of the pipeline layer.

use sluice_core::{SampleError, SpecError};

use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A bad sample under the `fail` policy.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// A checkpoint that does not belong to this loader.
    #[error("cannot restore loader state: {0}")]
    State(String),
    /// The caller asked a waiting iterator to stop (Ctrl-C); iterating again continues.
    #[error("interrupted while waiting for a batch")]
    Interrupted,
}
