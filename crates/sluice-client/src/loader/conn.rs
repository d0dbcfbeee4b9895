//! The client's connections: the dispatcher (with retry while it is away), the workers'
//! gRPC endpoints and local data planes, and the heartbeat that keeps this client's leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_autoscale::{AcceleratorBusy, AcceleratorMeter, BusySource};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::options::{DataPlane, RemoteOptions};
use crate::dispatcher_client::{dispatcher_client, DispatcherConn};
use crate::error::ClientError;
use crate::proto::worker_client::WorkerClient;
use crate::proto::ClientHeartbeatRequest;
use crate::security::{ClientSecret, TokenAttach};
use crate::tls::ClientTls;
use crate::wire::Compression;
use crate::MAX_MESSAGE_BYTES;

type WorkerConn = WorkerClient<InterceptedService<Channel, TokenAttach>>;

pub(super) struct Conn {
    pub(super) dispatcher: DispatcherConn,
    token: TokenAttach,
    pub(super) raw_token: Option<String>,
    pub(super) data_plane: DataPlane,
    pub(super) compression: Compression,
    pub(super) tls: Option<ClientTls>,
    workers: Mutex<HashMap<String, WorkerConn>>,
    /// Shared regions of workers on this machine, mapped once each.
    #[cfg(target_os = "linux")]
    pub(super) regions: crate::dataplane::MappedRegions,
    /// Local data planes that refused a connection (the worker is on another machine).
    #[cfg(target_os = "linux")]
    pub(super) unreachable_local: Mutex<std::collections::HashSet<String>>,
    give_up_after: Duration,
    pub(super) job_id: u64,
    /// The job's fingerprint, sent with every task so a worker never serves another job
    /// that had this id.
    pub(super) fingerprint: String,
    /// The job's source reads masks: a batch without them is refused (a worker that
    /// predates masks on the wire would send none).
    pub(super) masks: bool,
    /// This client's public id and the secret that proves it (every call in its name
    /// carries the secret).
    pub(super) client_id: String,
    pub(super) client_secret: String,
    /// Trainer-side counters, reported in heartbeats (per-client metrics).
    pub(super) batches: AtomicU64,
    pub(super) stall_ns: AtomicU64,
    /// The trainer's accelerator busy fraction: its step timing and its reports, on the
    /// clock of `started`.
    pub(super) accelerator: Mutex<AcceleratorMeter>,
    pub(super) started: Instant,
    pub(super) next_request: AtomicU64,
    /// The loader traces: tasks opened now ask their workers for batch times.
    pub(super) tracing: AtomicBool,
}

impl Conn {
    /// The trainer's accelerator busy fraction now (its fresh report, else step timing).
    pub(super) fn accelerator_busy(&self) -> Option<AcceleratorBusy> {
        self.accelerator.lock().busy(self.started.elapsed().as_secs_f64())
    }

    /// The trainer's own reading of its accelerator's busy fraction.
    pub(super) fn report_accelerator_busy(&self, fraction: f64) {
        self.accelerator.lock().report(self.started.elapsed().as_secs_f64(), fraction);
    }

    /// The trainer computed `compute` since its last batch, then waited `waited`.
    pub(super) fn step_done(&self, compute: Duration, waited: Duration) {
        let now = self.started.elapsed().as_secs_f64();
        self.accelerator.lock().record_step(now, compute.as_secs_f64(), waited.as_secs_f64());
    }

    /// Connects (lazily) to the dispatcher named in `options`; the job is not known yet.
    /// Needs `rt`'s context, where the dispatcher's channel runs.
    pub(super) fn new(options: &RemoteOptions, rt: &tokio::runtime::Runtime) -> Result<Self, ClientError> {
        let token = TokenAttach::new(options.token.as_deref())?;
        let tls = options.tls_ca.as_deref().map(ClientTls::load).transpose()?;
        let dispatcher = {
            let _g = rt.enter();
            dispatcher_client(&options.dispatcher, options.token.as_deref(), tls.as_ref())?
        };
        let identity = ClientSecret::generate(&format!("{}-{}", hostname(), std::process::id()))?;
        Ok(Self {
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
            unreachable_local: Mutex::new(Default::default()),
            give_up_after: options.give_up_after,
            job_id: 0,
            fingerprint: String::new(),
            masks: false,
            client_id: identity.id().to_string(),
            client_secret: identity.secret().to_string(),
            batches: AtomicU64::new(0),
            stall_ns: AtomicU64::new(0),
            // Step timing over the last 5 seconds.
            accelerator: Mutex::new(AcceleratorMeter::new(5.0)),
            started: Instant::now(),
            next_request: AtomicU64::new(1),
            tracing: AtomicBool::new(false),
        })
    }

    pub(super) fn worker(&self, addr: &str) -> Result<WorkerConn, ClientError> {
        let mut map = self.workers.lock();
        if let Some(w) = map.get(addr) {
            return Ok(w.clone());
        }
        let uri = format!("{}://{addr}", if self.tls.is_some() { "https" } else { "http" });
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| ClientError::Connect { addr: uri.clone(), message: e.to_string() })?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20));
        if let Some(tls) = &self.tls {
            endpoint =
                endpoint.tls_config(tls.grpc(addr)).map_err(|e| ClientError::Tls(format!("worker {addr}: {e}")))?;
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
pub(super) fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted | Code::Internal
    )
}

/// Calls the dispatcher, retrying with backoff while it is unreachable (e.g. restarting),
/// for up to `give_up_after`.
pub(super) async fn with_retry<T, F, Fut>(conn: &Conn, what: &'static str, call: F) -> Result<T, ClientError>
where
    F: FnMut(DispatcherConn) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    retry(conn, what, Some(conn.give_up_after), call).await
}

/// [`with_retry`], giving up after `give_up_after` if given, else never.
pub(super) async fn retry<T, F, Fut>(
    conn: &Conn,
    what: &'static str,
    give_up_after: Option<Duration>,
    mut call: F,
) -> Result<T, ClientError>
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
                    return Err(ClientError::Unavailable { seconds: t0.elapsed().as_secs_f64(), last: s.to_string() });
                }
                tracing::debug!(what, error = %s, "dispatcher unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(s) => return Err(ClientError::rpc(what, s)),
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "client".into())
}

pub(super) async fn heartbeat(conn: Arc<Conn>) {
    loop {
        let busy = conn.accelerator_busy();
        let req = ClientHeartbeatRequest {
            job_id: conn.job_id,
            client_id: conn.client_id.clone(),
            batches: conn.batches.load(Ordering::Relaxed),
            stall_s: conn.stall_ns.load(Ordering::Relaxed) as f64 / 1e9,
            elapsed_s: conn.started.elapsed().as_secs_f64(),
            client_secret: conn.client_secret.clone(),
            accelerator_busy: busy.map(|b| b.busy),
            accelerator_reported: busy.is_some_and(|b| b.source == BusySource::Reported),
        };
        match conn.dispatcher.clone().client_heartbeat(req).await {
            Ok(_) => {}
            // Refused (the dispatcher has as many clients as it may): the leases of this
            // client run out while it is refused.
            Err(e) if !retryable(e.code()) => tracing::warn!(error = %e, "the dispatcher refused a heartbeat"),
            Err(e) => tracing::debug!(error = %e, "client heartbeat failed"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
