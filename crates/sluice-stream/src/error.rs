//! What can go wrong while streaming: one variant per kind of failure, each naming what
//! to look at (the broker address, the stream entry, the sample, the file).

use std::path::PathBuf;
use std::time::Duration;

use sluice_core::SampleErrorKind;
use sluice_pipeline::loader::RunError;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("redis at {url}: {op} failed: {source}")]
    Broker {
        url: String,
        op: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis at {url} unreachable for {:.1} s while trying to {op}: {source}", after.as_secs_f64())]
    Unreachable {
        url: String,
        op: &'static str,
        after: Duration,
        #[source]
        source: redis::RedisError,
    },
    #[error("stream `{stream}` entry {entry}: field `{field}` {problem}")]
    MalformedEntry { stream: String, entry: String, field: &'static str, problem: String },
    #[error("stream `{stream}` entry {entry} (sample id {id}): cannot decode: {source}")]
    Decode {
        stream: String,
        entry: String,
        id: u64,
        #[source]
        source: RunError,
    },
    #[error(transparent)]
    Spec(#[from] sluice_core::SpecError),
    #[error("stream config: `{field}` {problem}")]
    Config { field: &'static str, problem: String },
    #[error("this checkpoint is for {what} `{theirs}`, this loader reads `{ours}`")]
    StateMismatch { what: &'static str, theirs: String, ours: String },
    #[error("checkpoint state: {0}")]
    BadLedger(#[from] crate::ledger::LedgerError),
    #[error(
        "rehearsal buffer file {} named by the checkpoint is gone: state() keeps only the {kept} newest \
         files in rehearsal.dir, so only a recent state can be restored",
        path.display()
    )]
    RehearsalGone { path: PathBuf, kept: usize },
    #[error("cannot write the rehearsal buffer file {}: {source}", path.display())]
    RehearsalWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {what}: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rehearsal buffer file {}: {source}", path.display())]
    RehearsalFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("rehearsal buffer: cannot serve this learner's shard on {addr}: {source}")]
    RehearsalListen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("rehearsal buffer file {}: {problem}", path.display())]
    RehearsalCorrupt { path: PathBuf, problem: String },
    #[error("cannot enumerate the dataset to push: {0}")]
    Dataset(#[from] sluice_pipeline::source::SourceError),
    #[error("cannot read sample {key} ({path}) to push: {kind}")]
    ReadSample { key: u64, path: String, kind: SampleErrorKind },
}
