//! Errors of the servers (dispatcher, worker, their supervisors), what kind of failure
//! each is ([`ServiceErrorKind`], shared with the client), and how they map to gRPC
//! status codes. The client's own failures are `sluice_client::ClientError`; a server
//! that fails in the parts it shares with the client (its dispatcher client, a batch's
//! wire form, a runtime) carries one.

use std::path::PathBuf;

use sluice_client::runtime::RuntimeError;
use sluice_client::{AutoscaleOff, ClientError, ReportLengths, ServiceErrorKind};
use sluice_core::SpecError;
use sluice_pipeline::PipelineError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A spec or request that does not make sense; names the field.
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// A spec naming a path outside the roots the operator allowed.
    #[error("{} is outside the allowed roots ({allowed}); start the service with --allow-root to allow it", path.display())]
    PathNotAllowed { path: PathBuf, allowed: String },
    /// A file the job's source opens while enumerating (a sidecar, a list, an annotation
    /// file, a shard) that resolves outside the allowed roots; `why` says how and names them.
    #[error("{what} {}: refused: {why}; start the service with --allow-root to allow it", path.display())]
    ReadNotAllowed { what: &'static str, path: PathBuf, why: String },
    /// A spec asking a worker for more than its operator allows.
    #[error("spec field `{field}` asks for {asked}, over this worker's limit of {limit} ({flag})")]
    OverLimit { field: &'static str, asked: String, limit: String, flag: &'static str },
    /// A job's `map` op naming a Python module the operator did not allow (`user_code`).
    #[error(
        "spec field `{field}` names `{func}`: this service does not run Python module `{module}` (allowed: {allowed}); \
         the operator allows it with --allow-python-module {module} on the dispatcher and workers \
         (`sluice service up` passes it to both)"
    )]
    PythonModuleNotAllowed { field: String, func: String, module: String, allowed: String },
    /// An operator's `--allow-python-module` that is no module name.
    #[error("--allow-python-module `{name}` is not a Python module name (dotted identifiers, e.g. `mypkg.augment`)")]
    PythonModuleName { name: String },
    #[error("this worker already runs {max} jobs (--max-jobs); try again when one ends")]
    TooManyJobs { max: usize },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("job `{name}` exists with another pipeline (fingerprint {existing}, this spec has {requested})")]
    JobConflict { name: String, existing: String, requested: String },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("journal {}: {message}", path.display())]
    Journal { path: PathBuf, message: String },
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    /// A certificate or key file that is missing or not usable.
    #[error("TLS: {0}")]
    Tls(String),
    /// An importance report whose keys and values do not pair up.
    #[error(transparent)]
    ReportLengths(#[from] ReportLengths),
    /// An importance report of another kind than the job's earlier ones.
    #[error("importance report for job {job_id}: {reported}, but the job's reports are {job}")]
    ReportKind { job_id: u64, job: String, reported: String },
    /// An importance report for an epoch long over (or not begun).
    #[error("importance report for job {job_id}, epoch {epoch}: the job is in epoch {current}; reports are taken for it and the one before")]
    ReportEpoch { job_id: u64, epoch: u64, current: u64 },
    /// Importance reports or draws asked of a job that samples uniformly.
    #[error(
        "job {job_id} samples uniformly: it takes no importance reports and has no draws (set `sampling` in its spec)"
    )]
    NotImportanceSampled { job_id: u64 },
    /// A draw that is not (or no longer) kept: an epoch not begun, or long over.
    #[error("job {job_id} has no draw for epoch {epoch} (it is in epoch {current})")]
    NoDraw { job_id: u64, epoch: u64, current: u64 },
    /// Autoscaling bounds or window that make no sense (`--min-workers`, `--max-workers`).
    #[error("autoscaling: {0}")]
    AutoscaleConfig(#[from] sluice_autoscale::ConfigError),
    /// An autoscaling request (`SetScale`, a client's `autoscale` option) to a dispatcher
    /// started without `--autoscale`.
    #[error(transparent)]
    AutoscaleOff(#[from] AutoscaleOff),
    /// The Kubernetes API refused or could not be reached (the autoscaler's actuator).
    #[error("Kubernetes, StatefulSet {statefulset}: {what}: {message}")]
    Kubernetes { statefulset: String, what: String, message: String },
    /// The dispatcher remembers as many live clients as it may (`MAX_CLIENTS`).
    #[error("the dispatcher already serves {max} live clients; try again when some stop")]
    TooManyClients { max: usize },
    /// An operator call (`SetScale`, `DrainWorker`) made without the operator token.
    #[error("{what} is an operator call: start the dispatcher with --operator-token (or $SLUICE_OPERATOR_TOKEN) and make the call with that token, not the clients' one")]
    OperatorOnly { what: &'static str },
    /// A call in a client's name without the secret that client alone holds.
    #[error("client {client}: {why}")]
    ClientSecret { client: String, why: &'static str },
    /// An importance-sampled job got more report values this epoch than its bound.
    #[error("importance report for job {job_id}: the job took {limit} values in epoch {epoch} already ({per_sample} per sample of the epoch); more are refused until the next epoch")]
    ReportBudget { job_id: u64, epoch: u64, limit: u64, per_sample: u64 },
    /// What a server does as a client of the service (a worker's dispatcher client, the
    /// wire form of a batch, a runtime) failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A thread the server needs (`what`) could not be started.
    #[error("cannot start {what}'s thread: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The thread that turns Ctrl-C and SIGTERM into a flag could not be started.
    #[error("cannot start the signal thread: {0}")]
    SignalThread(#[source] std::io::Error),
    /// Blocking work handed off the runtime (`what`: reading a manifest, building a job's
    /// loader) stopped without an answer (it panicked).
    #[error("{what} stopped without an answer: {source}")]
    Blocking {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// A spec that could not be written as JSON (to fingerprint and journal it).
    #[error("cannot write the spec of job `{job}` as JSON: {source}")]
    SpecJson {
        job: String,
        #[source]
        source: serde_json::Error,
    },
    /// A gRPC server (`what`: dispatcher, worker) stopped with an error.
    #[error("the {what}'s gRPC server failed: {source}")]
    Serve {
        what: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
    /// A job's next epoch taken up that was not leased ahead (a journal or state out of
    /// order).
    #[error("job {job_id}: advance to epoch {epoch}, which was not leased ahead")]
    NotLeasedAhead { job_id: u64, epoch: u64 },
    /// A draw asked for again right after its record was journaled, and still missing.
    #[error("job {job_id}: epoch {epoch} is not drawn after its draw was journaled")]
    DrawLost { job_id: u64, epoch: u64 },
    /// A GetTask of a stream its client stopped (it restarted its iteration since): it
    /// leases nothing, since no fetcher of the client would read the task.
    #[error("client {client}: request {request} belongs to a stream it stopped (its requests now start at {first})")]
    StoppedStream { client: String, request: u64, first: u64 },
    /// The journal cannot write now (the disk is full, say): nothing that depends on the
    /// record is answered; the journal writes it again until the disk takes it.
    #[error("journal {}: {message}; retrying, and refusing changes until it is written", path.display())]
    JournalStalled { path: PathBuf, message: String },
}

/// The metrics endpoint (and the dashboard beside it) not served: its address, or the
/// runtime, as for the servers' own listeners.
impl From<sluice_dashboard::DashboardError> for ServiceError {
    fn from(e: sluice_dashboard::DashboardError) -> Self {
        match e {
            sluice_dashboard::DashboardError::Listen { addr, source } => {
                ServiceError::Listen { addr, message: source.to_string() }
            }
            sluice_dashboard::DashboardError::Runtime(e) => ServiceError::Runtime(e),
        }
    }
}

impl ServiceError {
    pub fn kind(&self) -> ServiceErrorKind {
        use ServiceErrorKind as K;
        match self {
            ServiceError::Spec(_)
            | ServiceError::InvalidArgument(_)
            | ServiceError::OverLimit { .. }
            | ServiceError::PythonModuleName { .. }
            | ServiceError::ReportLengths(_)
            | ServiceError::ReportKind { .. } => K::InvalidRequest,
            ServiceError::AutoscaleConfig(_) => K::InvalidRequest,
            ServiceError::ReportEpoch { .. }
            | ServiceError::NotImportanceSampled { .. }
            | ServiceError::NoDraw { .. }
            | ServiceError::StoppedStream { .. }
            | ServiceError::AutoscaleOff(_) => K::FailedPrecondition,
            ServiceError::PathNotAllowed { .. }
            | ServiceError::ReadNotAllowed { .. }
            | ServiceError::PythonModuleNotAllowed { .. }
            | ServiceError::OperatorOnly { .. }
            | ServiceError::ClientSecret { .. } => K::PermissionDenied,
            ServiceError::NotFound { .. } => K::NotFound,
            ServiceError::JobConflict { .. } => K::Conflict,
            ServiceError::Pipeline(e) => K::of_pipeline(e),
            ServiceError::Client(e) => e.kind(),
            ServiceError::Journal { .. }
            | ServiceError::Runtime(_)
            | ServiceError::SignalThread(_)
            | ServiceError::Thread { .. }
            | ServiceError::Blocking { .. }
            | ServiceError::SpecJson { .. }
            | ServiceError::Serve { .. }
            | ServiceError::NotLeasedAhead { .. }
            | ServiceError::DrawLost { .. } => K::Internal,
            // A worker at its job limit: like one that cannot be reached, try again later.
            ServiceError::Listen { .. }
            | ServiceError::TooManyJobs { .. }
            | ServiceError::TooManyClients { .. }
            | ServiceError::ReportBudget { .. }
            | ServiceError::JournalStalled { .. }
            | ServiceError::Kubernetes { .. } => K::Unavailable,
            ServiceError::Tls(_) => K::Tls,
        }
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let code = match &e {
            ServiceError::Spec(_)
            | ServiceError::InvalidArgument(_)
            | ServiceError::OverLimit { .. }
            | ServiceError::PythonModuleName { .. }
            | ServiceError::ReportLengths(_)
            | ServiceError::ReportKind { .. } => Code::InvalidArgument,
            ServiceError::AutoscaleConfig(_) => Code::InvalidArgument,
            ServiceError::ReportEpoch { .. }
            | ServiceError::NotImportanceSampled { .. }
            | ServiceError::NoDraw { .. }
            | ServiceError::StoppedStream { .. }
            | ServiceError::AutoscaleOff(_) => Code::FailedPrecondition,
            ServiceError::Pipeline(e) => ServiceErrorKind::pipeline_code(e),
            ServiceError::Client(e) => e.code(),
            ServiceError::PathNotAllowed { .. }
            | ServiceError::ReadNotAllowed { .. }
            | ServiceError::PythonModuleNotAllowed { .. }
            | ServiceError::OperatorOnly { .. }
            | ServiceError::ClientSecret { .. } => Code::PermissionDenied,
            ServiceError::NotFound { .. } => Code::NotFound,
            ServiceError::JobConflict { .. } => Code::AlreadyExists,
            ServiceError::Kubernetes { .. } => Code::Unavailable,
            ServiceError::TooManyJobs { .. }
            | ServiceError::TooManyClients { .. }
            | ServiceError::ReportBudget { .. } => Code::ResourceExhausted,
            // Clients retry it: the journal writes again until the disk takes it.
            ServiceError::JournalStalled { .. } => Code::Unavailable,
            ServiceError::Tls(_) => Code::FailedPrecondition,
            _ => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_has_the_same_kind_after_crossing_grpc() {
        let errors: [ServiceError; 17] = [
            ServiceError::InvalidArgument("bad".into()),
            ServiceError::PathNotAllowed { path: "/x".into(), allowed: "/data".into() },
            ServiceError::ReadNotAllowed { what: "sidecar", path: "/data/a.json".into(), why: "out".into() },
            ServiceError::NotFound { what: "job", id: "7".into() },
            ServiceError::JobConflict { name: "j".into(), existing: "a".into(), requested: "b".into() },
            ServiceError::Client(ClientError::Connect { addr: "127.0.0.1:1".into(), message: "refused".into() }),
            ServiceError::NotLeasedAhead { job_id: 1, epoch: 2 },
            ServiceError::Journal { path: "/j".into(), message: "full".into() },
            ReportLengths { job_id: 1, keys: 2, values: 1 }.into(),
            ServiceError::ReportEpoch { job_id: 1, epoch: 0, current: 5 },
            AutoscaleOff { what: "SetScale" }.into(),
            ServiceError::TooManyClients { max: 10 },
            ServiceError::OperatorOnly { what: "SetScale" },
            ServiceError::ClientSecret { client: "c#00".into(), why: "no secret" },
            ServiceError::ReportBudget { job_id: 1, epoch: 0, limit: 64, per_sample: 4 },
            ServiceError::JournalStalled { path: "/j".into(), message: "full".into() },
            ServiceError::StoppedStream { client: "c".into(), request: 3, first: 5 },
        ];
        // A client hears each with the kind the server gave it (the status codes'
        // kinds are the client's test).
        for e in errors {
            let kind = e.kind();
            assert_eq!(ClientError::rpc("Call", Status::from(e)).kind(), kind);
        }
    }
}
