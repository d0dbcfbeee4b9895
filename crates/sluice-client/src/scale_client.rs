//! The autoscaler's side of the dispatcher, for a supervisor (`sluice up`) or an operator:
//! the worker count it wants, setting it by hand, and draining a worker by name. Blocking
//! calls, each bounded by a short deadline: a supervisor polls and tries again.

use std::path::Path;
use std::time::Duration;

use crate::dispatcher_client::{dispatcher_client, DispatcherConn};
use crate::error::ClientError;
use crate::proto::{DrainWorkerReply, DrainWorkerRequest, GetScaleRequest, ScaleReply, SetScaleRequest};
use crate::runtime::{runtime, Threads};
use crate::tls::ClientTls;

/// Longest one call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(2);

pub struct ScaleClient {
    rt: tokio::runtime::Runtime,
    conn: DispatcherConn,
}

impl ScaleClient {
    /// A client of the dispatcher at `addr` (connects on first use); over TLS with `tls_ca`.
    pub fn new(addr: &str, token: Option<&str>, tls_ca: Option<&Path>) -> Result<Self, ClientError> {
        let rt = runtime("scale client", Threads::Caller)?;
        let tls = tls_ca.map(ClientTls::load).transpose()?;
        // Tonic's lazy channel spawns its worker on the runtime it is made in.
        let conn = rt.block_on(async { dispatcher_client(addr, token, tls.as_ref()) })?;
        Ok(Self { rt, conn })
    }

    /// What the autoscaler wants now (`enabled` false without `--autoscale`).
    pub fn scale(&mut self) -> Result<ScaleReply, ClientError> {
        let mut c = self.conn.clone();
        self.call("GetScale", async move { c.get_scale(GetScaleRequest {}).await })
    }

    /// Sets the target by hand (clamped to the dispatcher's bounds).
    pub fn set_workers(&mut self, workers: u64) -> Result<ScaleReply, ClientError> {
        let mut c = self.conn.clone();
        self.call("SetScale", async move { c.set_scale(SetScaleRequest { workers }).await })
    }

    /// Asks the dispatcher to drain the worker named `name` (again: it is idempotent).
    pub fn drain(&mut self, name: &str) -> Result<DrainWorkerReply, ClientError> {
        let mut c = self.conn.clone();
        let name = name.to_string();
        self.call("DrainWorker", async move { c.drain_worker(DrainWorkerRequest { name }).await })
    }

    fn call<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ClientError> {
        match self.rt.block_on(async { tokio::time::timeout(CALL_DEADLINE, f).await }) {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(ClientError::rpc(what, status)),
            Err(_) => Err(ClientError::rpc(what, tonic::Status::deadline_exceeded("no answer within 2 s"))),
        }
    }
}
