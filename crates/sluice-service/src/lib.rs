//! sluice as a service: a dispatcher that owns jobs and cuts each epoch into tasks,
//! workers that run the local engine on those tasks, and [`RemoteLoader`], the client that
//! streams the batches to a trainer, exactly once per epoch even when workers die or the
//! dispatcher restarts.

pub mod bench;
pub mod client;
pub mod dataplane;
pub mod dispatcher;
mod dispatcher_client;
pub mod error;
pub mod job_table;
pub mod journal;
pub mod limits;
pub mod metrics;
pub mod process;
pub mod proto;
pub mod security;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod tls;
pub mod wire;
pub mod worker;

pub use client::{DataPlane, RemoteLoader, RemoteOptions, RemoteState};
pub use dispatcher::{run_dispatcher, DispatcherConfig};
pub use error::{ServiceError, ServiceErrorKind};
pub use limits::WorkerLimits;
pub use process::{serve_dispatcher, serve_worker, signal_flag};
pub use tls::{ClientTls, ServerTls, TlsFiles};
pub use wire::Compression;
pub use worker::{run_worker, WorkerConfig};

/// Largest batch message either side sends or accepts (worker → client, gRPC or the data
/// plane): a batch of 256 f32 images at 224×224 is ~154 MB.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Largest control message (the dispatcher's RPCs, and task requests to a worker): specs
/// and task lists are small, and a server that accepted batch-sized requests would let any
/// caller make it buffer 256 MiB per call.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 4 << 20;
