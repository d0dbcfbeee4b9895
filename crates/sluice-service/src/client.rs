//! [`RemoteLoader`]: a loader whose batches come from the service. Same shape as the local
//! [`sluice_pipeline::Loader`]: `iter()` yields the epoch's batches, `state()`/`load_state()`
//! checkpoint and resume exactly.
//!
//! Exactly once: the client acknowledges a task only after the trainer has taken every
//! batch of it; when a worker dies mid-task the client reports how many batches it got, and
//! the dispatcher queues only the rest. Batches are also deduplicated by index, so a batch
//! can never reach the trainer twice in an epoch.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_core::{Batch, PipelineSpec};
use sluice_pipeline::SkippedSample;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::dataplane::TaskStream;
use crate::dispatcher_client::{dispatcher_client, DispatcherConn};
use crate::error::ServiceError;
use crate::proto::worker_client::WorkerClient;
use crate::proto::*;
use crate::security::TokenAttach;
use crate::tls::ClientTls;
use crate::wire::{message_to_received, Compression, Received};
use crate::MAX_MESSAGE_BYTES;

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
    pub fn parse(name: &str) -> Result<Self, ServiceError> {
        match name {
            "auto" => Ok(Self::Auto),
            "tcp" => Ok(Self::Tcp),
            "grpc" => Ok(Self::Grpc),
            other => Err(ServiceError::InvalidArgument(format!(
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
        }
    }
}

/// Where a remote loader stands: the job, its epoch and the batches of that epoch already
/// handed to the trainer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteState {
    pub job_name: String,
    pub fingerprint: String,
    pub epoch: u64,
    pub delivered: Vec<u64>,
}

type WorkerConn = WorkerClient<InterceptedService<Channel, TokenAttach>>;

struct Conn {
    dispatcher: DispatcherConn,
    token: TokenAttach,
    raw_token: Option<String>,
    data_plane: DataPlane,
    compression: Compression,
    tls: Option<ClientTls>,
    workers: Mutex<HashMap<String, WorkerConn>>,
    /// Shared regions of workers on this machine, mapped once each.
    #[cfg(target_os = "linux")]
    regions: crate::dataplane::MappedRegions,
    /// Local data planes that refused a connection (the worker is on another machine).
    #[cfg(target_os = "linux")]
    unreachable_local: Mutex<HashSet<String>>,
    give_up_after: Duration,
    job_id: u64,
    /// The job's fingerprint, sent with every task so a worker never serves another job
    /// that had this id.
    fingerprint: String,
    client_id: String,
    /// Trainer-side counters, reported in heartbeats (per-client metrics).
    batches: AtomicU64,
    stall_ns: AtomicU64,
    started: Instant,
    next_request: AtomicU64,
}

impl Conn {
    fn worker(&self, addr: &str) -> Result<WorkerConn, ServiceError> {
        let mut map = self.workers.lock();
        if let Some(w) = map.get(addr) {
            return Ok(w.clone());
        }
        let uri = format!("{}://{addr}", if self.tls.is_some() { "https" } else { "http" });
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| ServiceError::Connect { addr: uri.clone(), message: e.to_string() })?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20));
        if let Some(tls) = &self.tls {
            endpoint =
                endpoint.tls_config(tls.grpc(addr)).map_err(|e| ServiceError::Tls(format!("worker {addr}: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        let client = WorkerClient::with_interceptor(channel, self.token.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        map.insert(addr.to_string(), client.clone());
        Ok(client)
    }
}

/// Codes worth retrying. Every dispatcher call is idempotent (GetTask by request id, acks
/// and failure reports by task and generation), so a request cut off by a dying dispatcher
/// (whatever code the transport makes of it) is simply sent again.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted | Code::Internal
    )
}

/// Calls the dispatcher, retrying with backoff while it is unreachable (e.g. restarting),
/// for up to `give_up_after`.
async fn with_retry<T, F, Fut>(conn: &Conn, what: &'static str, call: F) -> Result<T, ServiceError>
where
    F: FnMut(DispatcherConn) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    retry(conn, what, Some(conn.give_up_after), call).await
}

/// [`with_retry`], giving up after `give_up_after` if given, else never.
async fn retry<T, F, Fut>(
    conn: &Conn,
    what: &'static str,
    give_up_after: Option<Duration>,
    mut call: F,
) -> Result<T, ServiceError>
where
    F: FnMut(DispatcherConn) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let t0 = Instant::now();
    let mut backoff = Duration::from_millis(20);
    loop {
        match call(conn.dispatcher.clone()).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if retryable(s.code()) => {
                if give_up_after.is_some_and(|limit| t0.elapsed() > limit) {
                    return Err(ServiceError::Unavailable { seconds: t0.elapsed().as_secs_f64(), last: s.to_string() });
                }
                tracing::debug!(what, error = %s, "dispatcher unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(s) => return Err(ServiceError::rpc(what, s)),
        }
    }
}

/// One assignment of a task: index, generation, lease and first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TaskKey {
    task: u64,
    generation: u64,
    lease: u64,
    start: u64,
}

impl TaskKey {
    fn of(t: &TaskAssignment) -> Self {
        Self { task: t.task_index, generation: t.generation, lease: t.lease, start: t.start }
    }
}

/// What fetchers hand the consumer.
enum Item {
    /// `local`: it came through shared memory.
    Batch {
        task: TaskKey,
        end: u64,
        batch: Batch,
        /// Samples of this batch the worker skipped (`on_error = "skip"`).
        skipped: Vec<crate::proto::SkippedSample>,
        local: bool,
    },
    /// The dispatcher says every batch of this epoch was delivered (to some client).
    EpochEnd(u64),
    Error(ServiceError),
}

/// Where one stream's fetchers stand, shared with the consumer. The stream outlives an
/// epoch: at an epoch's end its fetchers already hold tasks of the next one (lookahead),
/// so workers do not idle while the trainer finishes the epoch and starts the next.
struct Flow {
    /// The lowest epoch not known to be done: what fetchers ask for.
    floor: AtomicU64,
    /// The epoch the trainer reads. Batches of a later epoch are held by their fetcher
    /// (a whole task each, at most `tasks_in_flight - 1` tasks) until it gets there.
    reading: watch::Sender<u64>,
    /// Tasks of a later epoch than `reading` held at once: at most `tasks_in_flight - 1`,
    /// so one fetcher is always free for the current epoch (e.g. a task handed back).
    ahead: Arc<Semaphore>,
}

pub struct RemoteLoader {
    rt: Runtime,
    conn: Arc<Conn>,
    job: JobInfo,
    epoch: u64,
    tasks_in_flight: usize,
    delivered: HashSet<u64>,
    /// Assignments with batches delivered, not yet acknowledged: (end, batches taken).
    open: HashMap<TaskKey, (u64, u64)>,
    /// Samples the workers skipped (`on_error = "skip"`), in the order their batches came.
    skipped: Vec<SkippedSample>,
    duplicates: u64,
    shared_memory_batches: u64,
    /// An iterator was dropped mid-epoch: the next one restarts the epoch from `state()`.
    abandoned: bool,
    current: Option<EpochStream>,
}

/// The stream of batches, from the epoch it was started at on.
struct EpochStream {
    rx: mpsc::Receiver<Item>,
    driver: tokio::task::JoinHandle<()>,
    flow: Arc<Flow>,
    /// An error ended the stream; the epoch is not over.
    failed: bool,
}

impl RemoteLoader {
    /// Submits `spec` as job `options.job_name` (or joins it, if it exists with the same
    /// fingerprint) and starts heartbeating.
    pub fn connect(spec: &PipelineSpec, options: RemoteOptions) -> Result<Self, ServiceError> {
        spec.validate()?;
        let spec_json = serde_json::to_string(spec).map_err(|e| ServiceError::Internal(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-remote")
            .enable_all()
            .build()
            .map_err(|e| ServiceError::Internal(format!("cannot start the client runtime: {e}")))?;
        let token = TokenAttach::new(options.token.as_deref())?;
        let tls = options.tls_ca.as_deref().map(ClientTls::load).transpose()?;
        let dispatcher = {
            let _g = rt.enter();
            dispatcher_client(&options.dispatcher, options.token.as_deref(), tls.as_ref())?
        };
        let client_id = format!(
            "{}-{}-{:x}",
            hostname(),
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
        );
        let mut conn = Conn {
            dispatcher,
            token,
            raw_token: options.token.clone().filter(|t| !t.is_empty()),
            data_plane: options.data_plane,
            compression: options.compression,
            tls,
            workers: Mutex::new(HashMap::new()),
            #[cfg(target_os = "linux")]
            regions: Default::default(),
            #[cfg(target_os = "linux")]
            unreachable_local: Mutex::new(HashSet::new()),
            give_up_after: options.give_up_after,
            job_id: 0,
            fingerprint: String::new(),
            client_id,
            batches: AtomicU64::new(0),
            stall_ns: AtomicU64::new(0),
            started: Instant::now(),
            next_request: AtomicU64::new(1),
        };
        let req = CreateJobRequest {
            job_name: options.job_name.clone(),
            spec_json,
            task_batches: options.task_batches,
            parallel_epochs: options.parallel_epochs,
        };
        let job = rt.block_on(with_retry(&conn, "CreateJob", |mut d| {
            let req = req.clone();
            async move { d.create_job(req).await }
        }))?;
        conn.job_id = job.job_id;
        conn.fingerprint = job.fingerprint.clone();
        let conn = Arc::new(conn);
        rt.spawn(heartbeat(conn.clone()));
        tracing::info!(job_id = job.job_id, name = %job.job_name, epoch = job.epoch, "joined job");
        Ok(Self {
            rt,
            conn,
            epoch: job.epoch,
            job,
            tasks_in_flight: options.tasks_in_flight.max(1),
            delivered: HashSet::new(),
            open: HashMap::new(),
            skipped: Vec::new(),
            duplicates: 0,
            shared_memory_batches: 0,
            abandoned: false,
            current: None,
        })
    }

    pub fn job(&self) -> &JobInfo {
        &self.job
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn batches_per_epoch(&self) -> u64 {
        self.job.batches_per_epoch
    }

    /// Batches handed to the trainer that came through shared memory from workers on this
    /// machine (the rest came over the network).
    pub fn shared_memory_batches(&self) -> u64 {
        self.shared_memory_batches
    }

    /// Samples the workers left out under `on_error = "skip"`, each with its key, path and
    /// error, as the local loader's `stats().skipped` lists them: once per epoch a bad
    /// sample is met. A batch whose samples were all skipped is not handed out.
    pub fn skipped(&self) -> &[SkippedSample] {
        &self.skipped
    }

    /// Batches that arrived twice and were dropped (after worker failures).
    pub fn duplicates_dropped(&self) -> u64 {
        self.duplicates
    }

    pub fn state(&self) -> RemoteState {
        let mut delivered: Vec<u64> = self.delivered.iter().copied().collect();
        delivered.sort_unstable();
        RemoteState {
            job_name: self.job.job_name.clone(),
            fingerprint: self.job.fingerprint.clone(),
            epoch: self.epoch,
            delivered,
        }
    }

    /// Restarts the job at `state`: its epoch, minus the batches already delivered. Meant for
    /// a job with one client (a shared job restarts for everyone).
    pub fn load_state(&mut self, state: &RemoteState) -> Result<(), ServiceError> {
        if state.fingerprint != self.job.fingerprint {
            return Err(ServiceError::InvalidArgument(format!(
                "checkpoint is for pipeline {}, this job is {}",
                state.fingerprint, self.job.fingerprint
            )));
        }
        // The stream may be past `state` (an epoch ended since) or before it: it goes, with
        // whatever it fetched ahead, and the next iterator starts one at `state`.
        if let Some(old) = self.current.take() {
            old.driver.abort();
        }
        self.abandoned = false;
        let req = ResetJobRequest {
            job_id: self.job.job_id,
            epoch: state.epoch,
            delivered: state.delivered.clone(),
            release_client: String::new(),
        };
        self.job = self.reset(req)?;
        self.epoch = state.epoch;
        self.delivered = state.delivered.iter().copied().collect();
        self.open.clear();
        Ok(())
    }

    fn reset(&self, req: ResetJobRequest) -> Result<JobInfo, ServiceError> {
        self.rt.block_on(with_retry(&self.conn, "ResetJob", |mut d| {
            let req = req.clone();
            async move { d.reset_job(req).await }
        }))
    }

    /// After an iterator was dropped mid-epoch: hands this client's tasks back to the
    /// dispatcher, less the batches the trainer already has. Only this client's: in a
    /// shared job the others go on with the epoch (a reset would give them their batches
    /// again).
    fn release(&mut self) -> Result<(), ServiceError> {
        let RemoteState { epoch, delivered, .. } = self.state();
        let req =
            ResetJobRequest { job_id: self.job.job_id, epoch, delivered, release_client: self.conn.client_id.clone() };
        self.job = self.reset(req)?;
        self.open.clear();
        Ok(())
    }

    /// The rest of the current epoch's batches, in arrival order. When it ends, the loader
    /// moves to the next epoch.
    pub fn iter(&mut self) -> RemoteEpoch<'_> {
        self.start_epoch();
        RemoteEpoch { loader: self }
    }

    /// Starts streaming the rest of the current epoch; [`RemoteLoader::next_batch`] takes
    /// its batches. (What [`RemoteLoader::iter`] does, for callers that cannot hold a
    /// borrowing iterator, like the Python binding.)
    pub fn start_epoch(&mut self) {
        // The stream that ended the last epoch goes on into this one (its fetchers may
        // already hold tasks of it).
        if let Some(s) = &self.current {
            if !self.abandoned && !s.failed && !s.driver.is_finished() {
                s.flow.reading.send_replace(self.epoch);
                self.abandoned = true;
                return;
            }
        }
        if let Some(old) = self.current.take() {
            old.driver.abort();
        }
        // An earlier iterator was dropped mid-epoch: its leases and half-read tasks are
        // handed back, without what the trainer already has.
        if self.abandoned {
            if let Err(e) = self.release() {
                tracing::warn!(error = %e, "could not hand back the abandoned epoch's tasks");
            }
        }
        self.abandoned = true;
        let (tx, rx) = mpsc::channel(2 * self.tasks_in_flight);
        let flow = Arc::new(Flow {
            floor: AtomicU64::new(self.epoch),
            reading: watch::Sender::new(self.epoch),
            ahead: Arc::new(Semaphore::new(self.tasks_in_flight - 1)),
        });
        let driver = self.rt.spawn(drive(self.conn.clone(), flow.clone(), self.tasks_in_flight, tx));
        self.current = Some(EpochStream { rx, driver, flow, failed: false });
    }

    /// The next batch of the epoch started by [`RemoteLoader::start_epoch`]; `None` at its
    /// end (the loader then moves to the next epoch). While waiting it asks `interrupted`
    /// every 50 ms and returns [`ServiceError::Interrupted`] if it says so; nothing is lost.
    pub fn next_batch(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Option<Result<Batch, ServiceError>> {
        loop {
            let stream = self.current.as_mut()?;
            if stream.failed {
                return None;
            }
            let t0 = Instant::now();
            // The timer must be made inside the runtime: build it in the async block.
            let item =
                self.rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), stream.rx.recv()).await });
            self.conn.stall_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let item = match item {
                Ok(item) => item,
                Err(_) => {
                    if interrupted() {
                        return Some(Err(ServiceError::Interrupted));
                    }
                    continue;
                }
            };
            match item {
                None => {
                    stream.failed = true;
                    return Some(Err(ServiceError::Internal("the batch stream ended early".into())));
                }
                Some(Item::EpochEnd(e)) if e == self.epoch => {
                    self.abandoned = false;
                    self.epoch += 1;
                    self.delivered.clear();
                    self.open.clear();
                    return None;
                }
                // An end reported twice (or of an epoch before a reset): nothing to do.
                Some(Item::EpochEnd(_)) => {}
                Some(Item::Error(e)) => {
                    stream.failed = true;
                    return Some(Err(e));
                }
                Some(Item::Batch { batch, .. }) if batch.epoch != self.epoch => {
                    stream.failed = true;
                    return Some(Err(ServiceError::Internal(format!(
                        "a batch of epoch {} arrived while reading epoch {}",
                        batch.epoch, self.epoch
                    ))));
                }
                Some(Item::Batch { task, end, batch, skipped, local }) => {
                    let entry = self.open.entry(task).or_insert((end, 0));
                    entry.1 += 1;
                    if entry.1 == end - task.start {
                        self.open.remove(&task);
                        self.ack(task);
                    }
                    if self.delivered.insert(batch.index) {
                        self.skipped.extend(skipped.into_iter().map(|s| SkippedSample {
                            key: s.key,
                            path: s.path,
                            error: s.error,
                        }));
                        if batch.is_empty() {
                            // Every sample of it was skipped: nothing for the trainer.
                            continue;
                        }
                        self.conn.batches.fetch_add(1, Ordering::Relaxed);
                        if local {
                            self.shared_memory_batches += 1;
                        }
                        return Some(Ok(batch));
                    }
                    self.duplicates += 1;
                    tracing::warn!(index = batch.index, "dropped a duplicate batch");
                }
            }
        }
    }

    /// Acknowledges a task whose batches the trainer has all taken, in the background,
    /// retried for as long as this client lives: its heartbeats keep the task's lease, so
    /// an ack given up on would hold the epoch open for good.
    fn ack(&self, task: TaskKey) {
        let conn = self.conn.clone();
        let req = AckTaskRequest {
            job_id: self.job.job_id,
            client_id: conn.client_id.clone(),
            epoch: self.epoch,
            task_index: task.task,
            generation: task.generation,
            lease: task.lease,
        };
        self.rt.spawn(async move {
            let r = retry(&conn, "AckTask", None, |mut d| {
                let req = req.clone();
                async move { d.ack_task(req).await }
            })
            .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, task = task.task, "the dispatcher refused an ack");
            }
        });
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "client".into())
}

async fn heartbeat(conn: Arc<Conn>) {
    loop {
        let req = ClientHeartbeatRequest {
            job_id: conn.job_id,
            client_id: conn.client_id.clone(),
            batches: conn.batches.load(Ordering::Relaxed),
            stall_s: conn.stall_ns.load(Ordering::Relaxed) as f64 / 1e9,
            elapsed_s: conn.started.elapsed().as_secs_f64(),
        };
        if let Err(e) = conn.dispatcher.clone().client_heartbeat(req).await {
            tracing::debug!(error = %e, "client heartbeat failed");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs `k` fetchers, epoch after epoch, until an error or the consumer goes away.
async fn drive(conn: Arc<Conn>, flow: Arc<Flow>, k: usize, tx: mpsc::Sender<Item>) {
    let mut set = JoinSet::new();
    for _ in 0..k {
        set.spawn(fetcher(conn.clone(), flow.clone(), tx.clone()));
    }
    while let Some(r) = set.join_next().await {
        let failed = match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(ServiceError::Internal(format!("fetcher: {e}"))),
        };
        if let Some(e) = failed {
            let _ = tx.send(Item::Error(e)).await;
            set.abort_all();
            return;
        }
    }
}

async fn fetcher(conn: Arc<Conn>, flow: Arc<Flow>, tx: mpsc::Sender<Item>) -> Result<(), ServiceError> {
    let mut wait = Duration::from_millis(1);
    let mut reading = flow.reading.subscribe();
    // One id until a task comes back: a WAIT, or a reply lost in a restart, is retried
    // under the same id, so a task assigned to it is never leaked.
    let mut request_id = conn.next_request.fetch_add(1, Ordering::Relaxed);
    // The task this fetcher last streamed to the end, told to the dispatcher with the next
    // request (it balances workers by what they have left to stream).
    let mut streamed: Option<TaskRef> = None;
    loop {
        let epoch = flow.floor.load(Ordering::SeqCst);
        let now_reading = *reading.borrow_and_update();
        // Any task for `epoch` is ahead of the trainer: only with a permit. For the epoch
        // being read, a permit lets the dispatcher hand out the next epoch's tasks instead
        // of making us wait for the last ones to stream.
        let permit: Option<OwnedSemaphorePermit> = if epoch > now_reading {
            tokio::select! {
                p = flow.ahead.clone().acquire_owned() => p.ok(),
                _ = reading.changed() => continue,
            }
        } else {
            flow.ahead.clone().try_acquire_owned().ok()
        };
        let lookahead = permit.is_some() && epoch <= now_reading;
        let req = GetTaskRequest {
            job_id: conn.job_id,
            client_id: conn.client_id.clone(),
            epoch,
            request_id,
            lookahead,
            streamed,
        };
        let reply = with_retry(&conn, "GetTask", |mut d| {
            let req = req.clone();
            async move { d.get_task(req).await }
        })
        .await?;
        match (reply.status(), reply.task) {
            (get_task_reply::Status::EpochDone, _) => {
                // Whoever moves the floor first tells the consumer, before any batch of
                // a later epoch can reach it (those wait for `reading`).
                if flow.floor.compare_exchange(epoch, epoch + 1, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                    && tx.send(Item::EpochEnd(epoch)).await.is_err()
                {
                    return Ok(());
                }
            }
            (get_task_reply::Status::Task, Some(task)) => {
                wait = Duration::from_millis(1);
                request_id = conn.next_request.fetch_add(1, Ordering::Relaxed);
                let gate = (task.epoch > *reading.borrow()).then(|| (reading.clone(), permit));
                if !run_task(&conn, &task, &tx, gate).await? {
                    return Ok(());
                }
                streamed =
                    Some(TaskRef { epoch: task.epoch, task_index: task.task_index, generation: task.generation });
            }
            _ => {
                drop(permit);
                // The dispatcher already held the request (long poll): ask again soon.
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(20));
            }
        }
    }
}

/// A task of an epoch the trainer has not reached: its batches are held until it does,
/// and the lookahead permit with them.
type Gate = (watch::Receiver<u64>, Option<OwnedSemaphorePermit>);

/// Streams one task's batches into `tx`. On a worker failure, tells the dispatcher how many
/// batches arrived so only the rest runs again. Ok(false) when the consumer has gone.
async fn run_task(
    conn: &Conn,
    task: &TaskAssignment,
    tx: &mpsc::Sender<Item>,
    gate: Option<Gate>,
) -> Result<bool, ServiceError> {
    let mut received = 0u64;
    let outcome: Result<(), Status> = async {
        let req = RunTaskRequest {
            job_id: task.job_id,
            epoch: task.epoch,
            start: task.start,
            end: task.end,
            compression: conn.compression.to_wire(),
            fingerprint: conn.fingerprint.clone(),
        };
        let mut source = if let Some(stream) = open_local(conn, task, &req).await? {
            Source::Tcp(stream)
        } else if conn.data_plane != DataPlane::Grpc && !task.worker_data_addr.is_empty() {
            Source::Tcp(
                TaskStream::open(&task.worker_data_addr, conn.raw_token.as_deref(), &req, conn.tls.as_ref()).await?,
            )
        } else {
            let mut worker = conn.worker(&task.worker_addr).map_err(Status::from)?;
            Source::Grpc(Box::new(worker.run_task(req).await?.into_inner()))
        };
        let local = matches!(&source, Source::Tcp(s) if s.is_local());
        // A task ahead of the trainer is read to the end into `held` first: its worker
        // runs only two tasks of a job at a time, so leaving it blocked on a full socket
        // would stall that job's current-epoch tasks queued behind it (and the epoch with
        // them). Memory: at most `tasks_in_flight - 1` such tasks.
        let mut held: Vec<Received> = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(60), source.next())
                .await
                .map_err(|_| Status::unavailable("worker sent nothing for 60 s"))??;
            let Some(Received { batch, skipped }) = next else { break };
            let expected = task.start + received + held.len() as u64;
            if batch.epoch != task.epoch || batch.index != expected {
                return Err(Status::invalid_argument(format!(
                    "worker sent batch {} of epoch {}, expected batch {expected} of epoch {}",
                    batch.index, batch.epoch, task.epoch
                )));
            }
            if gate.is_some() {
                held.push(Received { batch, skipped });
                continue;
            }
            let item = Item::Batch { task: TaskKey::of(task), end: task.end, batch, skipped, local };
            if tx.send(item).await.is_err() {
                return Err(Status::cancelled("consumer gone"));
            }
            received += 1;
        }
        if task.start + received + held.len() as u64 != task.end {
            return Err(Status::unavailable(format!(
                "stream ended after {} of {} batches",
                received + held.len() as u64,
                task.end - task.start
            )));
        }
        if let Some((mut reading, permit)) = gate {
            // The worker is done with it: the batches wait for the trainer on their own
            // (holding the lookahead permit), and this fetcher goes on to the next task.
            let (tx, task) = (tx.clone(), task.clone());
            tokio::spawn(async move {
                if reading.wait_for(|&r| r >= task.epoch).await.is_err() {
                    return;
                }
                drop(permit);
                for Received { batch, skipped } in held {
                    let item = Item::Batch { task: TaskKey::of(&task), end: task.end, batch, skipped, local };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
            });
        }
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => Ok(true),
        Err(s) if s.code() == Code::Cancelled && tx.is_closed() => Ok(false),
        Err(s) => {
            tracing::warn!(task = task.task_index, worker = %task.worker_addr, received, error = %s, "task failed; handing the rest back");
            let req = FailTaskRequest {
                job_id: task.job_id,
                client_id: conn.client_id.clone(),
                epoch: task.epoch,
                task_index: task.task_index,
                received,
                worker_id: task.worker_id,
                generation: task.generation,
                lease: task.lease,
            };
            with_retry(conn, "FailTask", |mut d| {
                let req = req.clone();
                async move { d.fail_task(req).await }
            })
            .await?;
            if retryable(s.code()) || s.code() == Code::Internal {
                Ok(true)
            } else {
                // The worker refused the job (path not allowed, bad data under `fail`...):
                // retrying elsewhere would fail the same way.
                Err(ServiceError::rpc("RunTask", s))
            }
        }
    }
}

/// The task's stream over the worker's local data plane (shared memory), when the worker
/// has one and is on this machine; `None` otherwise (its abstract socket name exists only
/// in the worker's network namespace: elsewhere connecting fails at once, and is not tried
/// again for that worker).
#[cfg(target_os = "linux")]
async fn open_local(conn: &Conn, task: &TaskAssignment, req: &RunTaskRequest) -> Result<Option<TaskStream>, Status> {
    let name = &task.worker_local_data_addr;
    if conn.data_plane != DataPlane::Auto || name.is_empty() {
        return Ok(None);
    }
    if conn.unreachable_local.lock().contains(name) {
        return Ok(None);
    }
    match crate::shm::connect_abstract(name) {
        Ok(sock) => TaskStream::open_local(sock, name, conn.raw_token.as_deref(), req, &conn.regions).await.map(Some),
        Err(e) => {
            tracing::debug!(worker = %task.worker_addr, error = %e, "worker not on this machine: TCP data plane");
            conn.unreachable_local.lock().insert(name.clone());
            Ok(None)
        }
    }
}

#[cfg(not(target_os = "linux"))]
async fn open_local(_: &Conn, _: &TaskAssignment, _: &RunTaskRequest) -> Result<Option<TaskStream>, Status> {
    Ok(None)
}

/// Where a task's batches come from.
enum Source {
    Grpc(Box<tonic::Streaming<BatchMessage>>),
    Tcp(TaskStream),
}

impl Source {
    async fn next(&mut self) -> Result<Option<Received>, Status> {
        match self {
            Source::Grpc(s) => match s.message().await? {
                Some(m) => message_to_received(m).map(Some).map_err(Status::from),
                None => Ok(None),
            },
            Source::Tcp(s) => s.next_received().await,
        }
    }
}

/// The batches of one epoch from the service.
pub struct RemoteEpoch<'a> {
    loader: &'a mut RemoteLoader,
}

impl Iterator for RemoteEpoch<'_> {
    type Item = Result<Batch, ServiceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.loader.next_batch(&mut || false)
    }
}

impl Drop for RemoteEpoch<'_> {
    fn drop(&mut self) {
        // Stop fetching if the epoch is unfinished (the next `iter` restarts it exactly);
        // after its end the stream goes on into the next epoch.
        if self.loader.abandoned {
            if let Some(s) = self.loader.current.take() {
                s.driver.abort();
            }
        }
    }
}
