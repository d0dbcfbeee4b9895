//! The wire messages, written as prost structs (the schema lives here, not in a `.proto`
//! file, so building needs no `protoc`), and the generated client/server code.
//!
//! Package `sluice.v1`. Two services: `Dispatcher` (control plane: workers, jobs, tasks)
//! and `Worker` (data plane: `RunTask` streams the batches of one task).

#![allow(missing_docs, clippy::all)]

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterWorkerRequest {
    /// Address clients use to reach the worker's data plane (`host:port`).
    #[prost(string, tag = "1")]
    pub addr: String,
    /// Address of the worker's TCP data plane (`host:port`); empty: gRPC only.
    #[prost(string, tag = "2")]
    pub data_addr: String,
    /// The worker's local data plane (shared memory), an abstract Unix socket name that
    /// clients on its machine can connect to; empty: none.
    #[prost(string, tag = "3")]
    pub local_data_addr: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterWorkerReply {
    #[prost(uint64, tag = "1")]
    pub worker_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkerHeartbeatRequest {
    #[prost(uint64, tag = "1")]
    pub worker_id: u64,
    #[prost(uint64, tag = "2")]
    pub tasks_running: u64,
    #[prost(uint64, tag = "3")]
    pub batches_produced: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkerHeartbeatReply {
    /// False when the dispatcher does not know this worker (e.g. it restarted): register again.
    #[prost(bool, tag = "1")]
    pub known: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateJobRequest {
    /// Clients naming the same job share its stream.
    #[prost(string, tag = "1")]
    pub job_name: String,
    /// A `PipelineSpec` as JSON.
    #[prost(string, tag = "2")]
    pub spec_json: String,
    /// Batches per task; 0 picks the default.
    #[prost(uint64, tag = "3")]
    pub task_batches: u64,
    /// 0 or 1: distributed epoch (every sample once per epoch, across all workers).
    /// N ≥ 2: parallel epochs, each epoch N full passes over the data, each in its own
    /// order and augmentation (e.g. N = workers, as if each produced its own epoch).
    #[prost(uint64, tag = "4")]
    pub parallel_epochs: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JobInfo {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub job_name: String,
    /// Manifest fingerprint and spec together, 16 hex digits: jobs that share it can share caches.
    #[prost(string, tag = "3")]
    pub fingerprint: String,
    #[prost(uint64, tag = "4")]
    pub batches_per_epoch: u64,
    #[prost(uint64, tag = "5")]
    pub samples_per_epoch: u64,
    /// The epoch the job is in now.
    #[prost(uint64, tag = "6")]
    pub epoch: u64,
    #[prost(uint64, tag = "7")]
    pub task_batches: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetJobRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JobDefinition {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub spec_json: String,
    /// The dataset's manifest fingerprint as the dispatcher enumerated it (16 hex digits).
    #[prost(string, tag = "3")]
    pub manifest_fingerprint: String,
    /// Passes per epoch (see `CreateJobRequest::parallel_epochs`); 0 means 1.
    #[prost(uint64, tag = "4")]
    pub passes: u64,
    /// The job's fingerprint (`JobInfo::fingerprint`): workers share one cache among the
    /// jobs that have it.
    #[prost(string, tag = "5")]
    pub fingerprint: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTaskRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub client_id: String,
    /// The epoch the client is reading.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    /// Unique per client and request, the same on retries: a retried request whose first
    /// reply was lost gets the same task back instead of leaking a lease. 0: none.
    #[prost(uint64, tag = "4")]
    pub request_id: u64,
    /// When `epoch` has no task left to hand out (its last ones are still streaming), a
    /// task of the next epoch may be leased instead, so workers do not idle at the epoch's
    /// end. The client holds such a task's batches until it starts that epoch.
    #[prost(bool, tag = "5")]
    pub lookahead: bool,
    /// The task this client just finished streaming (all its batches are in the client):
    /// its worker is free of it, though it stays leased until the trainer has taken them.
    #[prost(message, optional, tag = "6")]
    pub streamed: Option<TaskRef>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskRef {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub task_index: u64,
    #[prost(uint64, tag = "3")]
    pub generation: u64,
}

pub mod task_status {
    /// A task is assigned.
    pub const TASK: i32 = 0;
    /// Nothing to hand out now, but the epoch is not done: ask again shortly.
    pub const WAIT: i32 = 1;
    /// Every task of the epoch has been acknowledged.
    pub const EPOCH_DONE: i32 = 2;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTaskReply {
    /// One of [`task_status`].
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(message, optional, tag = "2")]
    pub task: Option<TaskAssignment>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskAssignment {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(uint64, tag = "3")]
    pub task_index: u64,
    /// Batches `start..end` of the epoch.
    #[prost(uint64, tag = "4")]
    pub start: u64,
    #[prost(uint64, tag = "5")]
    pub end: u64,
    #[prost(uint64, tag = "6")]
    pub worker_id: u64,
    #[prost(string, tag = "7")]
    pub worker_addr: String,
    /// The worker's TCP data plane; empty when it has none.
    #[prost(string, tag = "8")]
    pub worker_data_addr: String,
    /// Bumped whenever the epoch's task list is rebuilt (a resumed checkpoint): an ack or
    /// failure report for an older list is ignored instead of hitting another task.
    #[prost(uint64, tag = "9")]
    pub generation: u64,
    /// The worker's local data plane (see `RegisterWorkerRequest`); empty when it has none.
    #[prost(string, tag = "10")]
    pub worker_local_data_addr: String,
    /// The lease this assignment is: acks and failure reports name it, and one for a lease
    /// that is no longer the task's (it ran out and the task went elsewhere) is ignored.
    #[prost(uint64, tag = "11")]
    pub lease: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AckTaskRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub client_id: String,
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(uint64, tag = "4")]
    pub task_index: u64,
    /// The assignment's `generation`.
    #[prost(uint64, tag = "5")]
    pub generation: u64,
    /// The assignment's `lease`.
    #[prost(uint64, tag = "6")]
    pub lease: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FailTaskRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub client_id: String,
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(uint64, tag = "4")]
    pub task_index: u64,
    /// Batches the client did receive, from the task's start: they are not sent again.
    #[prost(uint64, tag = "5")]
    pub received: u64,
    #[prost(uint64, tag = "6")]
    pub worker_id: u64,
    /// The assignment's `generation`.
    #[prost(uint64, tag = "7")]
    pub generation: u64,
    /// The assignment's `lease`.
    #[prost(uint64, tag = "8")]
    pub lease: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientHeartbeatRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(string, tag = "2")]
    pub client_id: String,
    /// Batches handed to the trainer so far.
    #[prost(uint64, tag = "3")]
    pub batches: u64,
    /// Seconds the trainer spent waiting for a batch (stall).
    #[prost(double, tag = "4")]
    pub stall_s: f64,
    /// Seconds since the client started.
    #[prost(double, tag = "5")]
    pub elapsed_s: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResetJobRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    /// Batches of `epoch` already delivered: the epoch restarts without them.
    #[prost(uint64, repeated, tag = "3")]
    pub delivered: Vec<u64>,
    /// When set: only the leases this client holds are handed back (the parts of `epoch`'s
    /// tasks not in `delivered`, and any task of the next epoch); the epoch goes on for the
    /// job's other clients. A client restarting its own iteration sends this.
    #[prost(string, tag = "4")]
    pub release_client: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunTaskRequest {
    #[prost(uint64, tag = "1")]
    pub job_id: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(uint64, tag = "3")]
    pub start: u64,
    #[prost(uint64, tag = "4")]
    pub end: u64,
    /// How the worker packs pixels (`compression::NONE` or `compression::ZSTD`).
    #[prost(uint32, tag = "5")]
    pub compression: u32,
    /// The job's fingerprint as the client knows it (`JobInfo::fingerprint`): a worker that
    /// cached another job under this id (a dispatcher restarted without its journal) loads
    /// the job afresh, and refuses the task if the dispatcher's job differs too.
    #[prost(string, tag = "6")]
    pub fingerprint: String,
}

pub mod compression {
    pub const NONE: u32 = 0;
    /// Each byte minus the same byte of the previous pixel (`wire::delta_stride`), then
    /// zstd level 1 over the whole buffer.
    pub const ZSTD: u32 = 1;
}

pub mod dtype {
    pub const U8: u32 = 0;
    pub const F32: u32 = 1;
}

pub mod layout {
    pub const HWC: u32 = 0;
    pub const CHW: u32 = 1;
}

/// One batch on the wire: the columns of [`sluice_core::Batch`], pixels as raw bytes
/// (little-endian for f32).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchMessage {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub index: u64,
    #[prost(uint64, repeated, tag = "3")]
    pub keys: Vec<u64>,
    #[prost(int64, repeated, tag = "4")]
    pub labels: Vec<i64>,
    #[prost(uint64, repeated, tag = "5")]
    pub shape: Vec<u64>,
    #[prost(uint32, tag = "6")]
    pub dtype: u32,
    #[prost(uint32, tag = "7")]
    pub layout: u32,
    #[prost(bytes = "vec", tag = "8")]
    pub data: Vec<u8>,
    #[prost(float, repeated, tag = "9")]
    pub weights: Vec<f32>,
    #[prost(bool, tag = "10")]
    pub has_weights: bool,
    /// How `data` is packed (`compression::*`); the unpacked size follows from the shape.
    #[prost(uint32, tag = "11")]
    pub compression: u32,
    /// Samples of this batch left out under `on_error = "skip"`. A batch whose samples were
    /// all skipped still comes, with no rows, so a task's batch indices stay dense.
    #[prost(message, repeated, tag = "12")]
    pub skipped: Vec<SkippedSample>,
}

/// A sample a worker left out under `on_error = "skip"`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SkippedSample {
    #[prost(uint64, tag = "1")]
    pub key: u64,
    #[prost(string, tag = "2")]
    pub path: String,
    #[prost(string, tag = "3")]
    pub error: String,
}

pub mod dispatcher {
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.Dispatcher.rs"));
}

pub mod worker {
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.Worker.rs"));
}
