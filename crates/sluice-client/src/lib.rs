//! The client of the sluice service, and the protocol both sides speak: what a trainer
//! (or the Python package) links to read batches from the service, without the servers.
//!
//! # Public surface
//!
//! * [`RemoteLoader`] (with [`RemoteEpoch`], its iterator), configured by
//!   [`RemoteOptions`] and [`DataPlane`], checkpointed as [`RemoteState`]; [`RemoteTrace`]
//!   is its timeline of where and when each batch was built.
//! * [`ScaleClient`]: the autoscaler's side of the dispatcher, for a supervisor or an
//!   operator.
//! * [`ClientError`] (with [`ServiceErrorKind`] for callers that map errors, like the
//!   Python binding), and [`Compression`], the pixel compression a client may ask for.
//! * The protocol, shared with the servers (`sluice-service`): [`proto`] (messages and
//!   gRPC stubs generated from `proto/sluice.proto`), [`wire`] (batches to messages and
//!   back), [`dataplane`] (the data plane's frames and the client's end, [`TaskStream`]),
//!   on Linux [`shm`] (the local data plane's shared memory and socket primitives),
//!   [`security`] ([`TokenAttach`] to send the service's token, [`ClientSecret`]) and
//!   [`tls`] (the client's TLS).
//! * [`runtime`]: the one place tokio runtimes are built, for this crate and the servers.
//!
//! [`TaskStream`]: dataplane::TaskStream

pub mod dataplane;
mod dispatcher_client;
mod error;
mod loader;
pub mod proto;
pub mod runtime;
mod scale_client;
pub mod security;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod tls;
pub mod wire;

pub use dispatcher_client::{dispatcher_client, DispatcherConn};
pub use error::{AutoscaleOff, ClientError, ReportLengths, ServiceErrorKind};
pub use loader::{
    CacheStatsProbe, ClockOffset, DataPlane, RemoteEpoch, RemoteLoader, RemoteOptions, RemoteState, RemoteTrace,
    WorkerBuild,
};
pub use proto::{JobCacheStats, ReportKind, ReportReply};
pub use scale_client::ScaleClient;
pub use security::{random_token, ClientSecret, TokenAttach};
pub use wire::Compression;

/// Largest batch message either side sends or accepts (worker → client, gRPC or the data
/// plane): a batch of 256 f32 images at 224×224 is ~154 MB.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Largest control message (the dispatcher's RPCs, and task requests to a worker): specs
/// and task lists are small, and a server that accepted batch-sized requests would let any
/// caller make it buffer 256 MiB per call.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 4 << 20;
