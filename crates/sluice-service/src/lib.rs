//! sluice as a service: a dispatcher that owns jobs and cuts each epoch into tasks,
//! workers that run the local engine on those tasks, and [`RemoteLoader`], the client that
//! streams the batches to a trainer, exactly once per epoch even when workers die or the
//! dispatcher restarts.
//!
//! # Public surface
//!
//! * The client: [`RemoteLoader`] (with [`RemoteEpoch`], its iterator), configured by
//!   [`RemoteOptions`] and [`DataPlane`], checkpointed as [`RemoteState`].
//! * The servers: [`serve_dispatcher`] / [`serve_worker`] run one in this process until
//!   SIGINT or SIGTERM ([`signal_flag`] gives a client the same signal as a flag);
//!   [`run_dispatcher`] / [`run_worker`] are the async forms, stopped by a future. They are
//!   configured by [`DispatcherConfig`], [`WorkerConfig`], [`WorkerLimits`] and
//!   [`TlsFiles`].
//! * [`ServiceError`] (with [`ServiceErrorKind`] for callers that map errors, like the
//!   Python binding) and [`Compression`], the pixel compression a client may ask for.
//! * The protocol, for clients of its own: [`proto`] (messages and gRPC stubs generated
//!   from `proto/sluice.proto`), [`TokenAttach`] to send the service's token with them, and
//!   on Linux [`shm`]'s socket primitives of the local (shared-memory) data plane.
//! * [`metrics::serve`], the `/metrics` endpoint both servers use, and [`dashboard`], the
//!   live page the dispatcher serves beside it (and a local loader, on request).
//! * sluice's own data plane, for a worker or client of your own (and the measurements of
//!   `sluice-bench service`): [`dataplane`]'s server ends ([`dataplane::serve`], and on
//!   Linux the shared-memory [`dataplane::serve_local`]) and its client end
//!   ([`dataplane::TaskStream`]), with the batch encoding they share ([`Outgoing`],
//!   [`message_to_batch`]).
//!
//! Everything else (the dispatcher's state machine and journal, the worker's job table,
//! the rest of the wire conversions) is internal.

mod client;
pub mod dashboard;
pub mod dataplane;
mod dispatcher;
mod dispatcher_client;
mod error;
mod job_table;
mod journal;
mod limits;
pub mod metrics;
mod process;
pub mod proto;
mod scale_client;
mod security;
#[cfg(target_os = "linux")]
pub mod shm;
#[cfg(feature = "kube")]
mod statefulset;
mod tls;
mod trace_merge;
mod wire;
mod worker;

pub use client::{
    CacheStatsProbe, ClockOffset, DataPlane, RemoteEpoch, RemoteLoader, RemoteOptions, RemoteState, RemoteTrace,
    WorkerBuild,
};
pub use dispatcher::{run_dispatcher, DispatcherConfig};
pub use error::{ServiceError, ServiceErrorKind};
pub use limits::WorkerLimits;
pub use process::{serve_dispatcher, serve_worker, signal_flag};
pub use proto::{JobCacheStats, ReportKind, ReportReply};
pub use scale_client::ScaleClient;
pub use security::{random_token, ClientSecret, TokenAttach};
#[cfg(feature = "kube")]
pub use statefulset::StatefulSetScaler;
pub use tls::TlsFiles;
pub use trace_merge::{merge_traces, MergedWorker};
pub use wire::{message_to_batch, Compression, Outgoing};
pub use worker::{run_worker, WorkerConfig};

/// Largest batch message either side sends or accepts (worker → client, gRPC or the data
/// plane): a batch of 256 f32 images at 224×224 is ~154 MB.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Largest control message (the dispatcher's RPCs, and task requests to a worker): specs
/// and task lists are small, and a server that accepted batch-sized requests would let any
/// caller make it buffer 256 MiB per call.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 4 << 20;
