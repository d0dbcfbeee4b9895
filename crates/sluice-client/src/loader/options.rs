//! What a [`super::RemoteLoader`] is told: the dispatcher, the job, and how batches travel.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ClientError;
use crate::wire::Compression;

#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// The dispatcher, `host:port` or `http://host:port`.
    pub dispatcher: String,
    /// Clients naming the same job share one stream, each getting disjoint batches.
    pub job_name: String,
    pub token: Option<String>,
    /// Tasks fetched at once (keeps every worker busy); default 4.
    pub tasks_in_flight: usize,
    /// Batches per task when this client creates the job; 0 = the dispatcher's default.
    pub task_batches: u64,
    /// When this client creates the job: 0 or 1 for a distributed epoch (every sample once
    /// per epoch across all workers); N ≥ 2 for parallel epochs (each epoch N full passes,
    /// each in its own order, e.g. N = workers). Part of the job's fingerprint.
    pub parallel_epochs: u64,
    /// How long to keep retrying an unreachable dispatcher before failing.
    pub give_up_after: Duration,
    /// How batches travel from workers.
    pub data_plane: DataPlane,
    /// Whether workers compress pixels for this client (delta + zstd): pays only on links
    /// slower than the compressor (BENCHMARKS has its speed and ratio). Default: none.
    pub compression: Compression,
    /// The CA (PEM) of the service's certificates: talk TLS to the dispatcher and workers
    /// (default: $SLUICE_TLS_CA; none: plain TCP).
    pub tls_ca: Option<PathBuf>,
    /// The trainer relies on the service scaling its workers to what it consumes: refuse
    /// to start against a dispatcher without `--autoscale`. Either way the client's
    /// heartbeats carry the signals the autoscaler reads (batches taken, time waited).
    pub autoscale: bool,
}

/// The transport for batches; control always uses gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPlane {
    /// Shared memory from workers on this machine (their local data plane), the TCP data
    /// plane from the others.
    #[default]
    Auto,
    /// The workers' TCP data plane (header + raw buffer), gRPC where a worker has none.
    Tcp,
    /// gRPC server streaming (`Worker.RunTask`).
    Grpc,
}

impl DataPlane {
    /// `"auto"`, `"tcp"` or `"grpc"`.
    pub fn parse(name: &str) -> Result<Self, ClientError> {
        match name {
            "auto" => Ok(Self::Auto),
            "tcp" => Ok(Self::Tcp),
            "grpc" => Ok(Self::Grpc),
            other => Err(ClientError::InvalidArgument(format!(
                "unknown data plane {other:?} (use \"auto\", \"tcp\" or \"grpc\")"
            ))),
        }
    }
}

impl RemoteOptions {
    pub fn new(dispatcher: impl Into<String>, job_name: impl Into<String>) -> Self {
        Self {
            dispatcher: dispatcher.into(),
            job_name: job_name.into(),
            token: std::env::var("SLUICE_TOKEN").ok(),
            tasks_in_flight: 4,
            task_batches: 0,
            parallel_epochs: 0,
            give_up_after: Duration::from_secs(60),
            data_plane: DataPlane::Auto,
            compression: Compression::None,
            tls_ca: std::env::var_os("SLUICE_TLS_CA").filter(|v| !v.is_empty()).map(PathBuf::from),
            autoscale: false,
        }
    }
}
