//! sluice as a service, the servers: a dispatcher that owns jobs and cuts each epoch into
//! tasks, and workers that run the local engine on those tasks and stream the batches to
//! clients (`sluice_client::RemoteLoader`), exactly once per epoch even when workers die
//! or the dispatcher restarts.
//!
//! # Public surface
//!
//! * [`serve_dispatcher`] / [`serve_worker`] run one in this process until SIGINT or
//!   SIGTERM ([`signal_flag`] gives a supervisor the same signal as a flag);
//!   [`run_dispatcher`] / [`run_worker`] are the async forms, stopped by a future. They are
//!   configured by [`DispatcherConfig`], [`WorkerConfig`], [`WorkerLimits`] and
//!   [`TlsFiles`].
//! * [`config`]: every setting of the dispatcher, the workers and `up` and its default,
//!   read from one TOML file ([`ServiceConfig`]) and turned into those configurations.
//! * [`up`]: the supervisor that runs a dispatcher and its workers as child processes
//!   (`sluice service up`).
//! * [`ServiceError`], the servers' errors (the kind of each, [`ServiceErrorKind`], is
//!   the client's).
//! * [`dataplane`]: the worker's end of the data planes (the frames and the client's end
//!   are `sluice_client::dataplane`'s).
//! * The `/metrics` endpoint both servers serve, and the live dashboard the dispatcher
//!   serves beside it, are `sluice_dashboard`'s (shared with a local loader); the
//!   dispatcher's metrics and dashboard state are drawn here.
//! * [`merge_traces`]: one timeline from a client's trace and its workers'.
//! * With the `kube` feature, [`StatefulSetScaler`]: the autoscaler's actuator.
//!
//! The protocol (messages, wire conversions, the data plane's frames and its client end)
//! is the client crate's, shared by both sides. Everything else (the dispatcher's state
//! machine and journal, the worker's job table) is internal.

pub mod config;
pub mod dataplane;
mod dispatcher;
mod error;
mod job_table;
mod limits;
mod process;
mod security;
#[cfg(feature = "kube")]
mod statefulset;
mod tls;
mod trace_merge;
pub mod up;
mod user_code;
mod worker;

pub use config::{ConfigError, ServiceConfig};
pub use dispatcher::{run_dispatcher, DispatcherConfig, DRAW_CHUNK};
pub use error::ServiceError;
pub use limits::WorkerLimits;
pub use process::{serve_dispatcher, serve_worker, signal_flag};
pub use sluice_client::ServiceErrorKind;
#[cfg(feature = "kube")]
pub use statefulset::StatefulSetScaler;
pub use tls::TlsFiles;
pub use trace_merge::{merge_traces, MergedWorker};
pub use worker::{run_worker, WorkerConfig};
