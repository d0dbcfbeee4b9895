//! The TCP data plane: batches from a worker to a client as a header and the raw pixel
//! buffer, written straight from the batch and read straight into the client's batch, so a
//! batch costs what the kernel's copies cost (gRPC over HTTP/2 moves 16 KiB frames and
//! copies each message twice more; see BENCHMARKS). Control stays on gRPC.
//!
//! One task per connection. Client → worker:
//!   `b"SLDP1"`, u32 token length, token, u32 request length, `RunTaskRequest` (prost).
//! Worker → client, repeated, each frame starting with a kind byte:
//!   `1` batch: u32 header length, `BatchMessage` without `data` (prost), u64 data length, data
//!       (the pixels, compressed when the request asked and the header says so), then, when
//!       the request asked for `masks_in_body`, the batch's masks (as many bytes as the
//!       header's `BatchMasks.body_bytes`; a header then carries none of their bytes);
//!   `2` end of task;
//!   `3` error: u32 gRPC status code, u32 message length, message (UTF-8).
//! Integers are little-endian. Sizes are bounded before anything is allocated, and so are
//! connections that have not yet authenticated ([`ConnectionLimits`]: 64, 5 s each).
//! With TLS configured the same bytes travel inside a rustls session.
//!
//! The local data plane (Linux) is the same protocol over a Unix socket in the abstract
//! namespace, for clients on the worker's machine, with the pixels in shared memory
//! ([`sluice_client::shm`]). After the request the worker sends
//!   `4` region: u64 id, u32 slots, u64 slot bytes, with the region's memfd attached;
//! and then sends each batch as
//!   `5` batch in a slot: u32 header length, header, u32 slot, u64 data length, then the
//!       masks as in `1`;
//! (or as `1`, inline, when no slot is free or the batch is larger). The client copies the
//! pixels out and hands the slot back with a u32 slot number; the worker reuses a slot
//! only after that.
//! Nothing on this socket leaves the machine, so it carries no TLS; the token is checked
//! as on TCP.
//!
//! The worker's end (serving tasks) is here and in `local`; the client's end is
//! [`TaskStream`] (`stream`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::Status;

use sluice_client::dataplane::{
    frame_status, io_status, Io, KIND_BATCH, KIND_END, KIND_ERROR, MAGIC, MAX_ERROR_MESSAGE, MAX_REQUEST, MAX_TOKEN,
};
use sluice_client::proto::RunTaskRequest;
use sluice_client::security::constant_time_eq;
use sluice_client::wire::Outgoing;
use sluice_transport::frame::nonblocking::{read_frame, write_frame, write_len};
use sluice_transport::frame::Prefix;

#[cfg(target_os = "linux")]
mod local;
#[cfg(target_os = "linux")]
pub use local::{serve_local, RegionPool};

/// A running task's batches, in order; an error ends them.
pub struct TaskBatches {
    pub rx: mpsc::Receiver<Result<Outgoing, Status>>,
    /// The most pixel bytes one of its batches can carry (a full batch, uncompressed):
    /// the slot size of the local data plane.
    pub max_batch_bytes: usize,
    /// Batches the task can have in flight at once (being built, queued, being sent): the
    /// slot count of the local data plane.
    pub in_flight: usize,
    /// The local data plane sends here the memory to build the batches in; the task waits
    /// for it before it starts (other transports drop it).
    pub buffers: Option<tokio::sync::oneshot::Sender<sluice_pipeline::BufferSource>>,
    /// Takes each batch back once its pixels are sent (the worker's loader builds later
    /// batches in its buffer).
    pub recycle: Option<Recycle>,
}

pub type Recycle = Arc<dyn Fn(Outgoing) + Send + Sync>;

impl TaskBatches {
    fn sent(&self, out: Outgoing) {
        if let Some(recycle) = &self.recycle {
            recycle(out);
        }
    }
}

/// What runs a task: the worker's loader (or, in benchmarks, a no-op producer).
pub type StartTask =
    Arc<dyn Fn(RunTaskRequest) -> Pin<Box<dyn Future<Output = Result<TaskBatches, Status>> + Send>> + Send + Sync>;

/// What the data plane grants connections that have not authenticated yet (opened TLS and
/// sent a request with the right token): a bounded number of them, for a short time, so
/// idle or slow connections cannot pile up.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections at most waiting to authenticate; more are turned away at once.
    pub pending: usize,
    /// Time a connection has to open TLS and send its request.
    pub auth_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { pending: 64, auth_timeout: Duration::from_secs(5) }
    }
}

/// Admits connections to authenticate, up to [`ConnectionLimits::pending`] at once.
#[derive(Clone)]
pub(crate) struct Gate {
    permits: Arc<tokio::sync::Semaphore>,
    limits: ConnectionLimits,
}

impl Gate {
    pub(crate) fn new(limits: ConnectionLimits) -> Self {
        Self { permits: Arc::new(tokio::sync::Semaphore::new(limits.pending)), limits }
    }

    /// A place among the connections waiting to authenticate (held until the request is
    /// read), and the deadline for it; `None` when all are taken.
    pub(crate) fn admit(&self) -> Option<(tokio::sync::OwnedSemaphorePermit, tokio::time::Instant)> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some((permit, tokio::time::Instant::now() + self.limits.auth_timeout))
    }

    pub(crate) fn full(&self) -> Status {
        Status::resource_exhausted(format!(
            "{} data-plane connections already wait to authenticate; try again",
            self.limits.pending
        ))
    }

    pub(crate) fn late(&self) -> Status {
        Status::deadline_exceeded(format!("no request within {:?}", self.limits.auth_timeout))
    }
}

/// Answers a connection turned away by the gate (briefly: it is not waited on).
pub(crate) async fn refuse(mut w: impl AsyncWriteExt + Unpin, status: Status) {
    let _ = tokio::time::timeout(Duration::from_secs(1), write_error(&mut w, &status)).await;
}

/// Serves the data plane on `listener` until the runtime stops; with `tls`, every
/// connection must open a TLS session first.
pub async fn serve(
    listener: TcpListener,
    service: StartTask,
    token: Option<String>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: ConnectionLimits,
) {
    let gate = Gate::new(limits);
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "data plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((permit, deadline)) = gate.admit() else {
            tracing::debug!(%peer, "data plane: too many connections waiting to authenticate; turned one away");
            // A TLS client would not understand a plain frame: it just sees the close.
            if tls.is_none() {
                tokio::spawn(refuse(sock, gate.full()));
            }
            continue;
        };
        let (service, token, tls, gate) = (service.clone(), token.clone(), tls.clone(), gate.clone());
        tokio::spawn(async move {
            if let Err(e) = sock.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "data plane: nodelay");
            }
            let sock: Box<dyn Io> = match tls {
                None => Box::new(sock),
                Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(sock)).await {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "data plane: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "data plane: no TLS handshake in time");
                        return;
                    }
                },
            };
            if let Err(e) = connection(sock, service, token.as_deref(), (permit, deadline), &gate).await {
                tracing::debug!(%peer, error = %e, "data plane connection ended");
            }
        });
    }
}

/// Reads a connection's request by its deadline, then lets the next connection wait.
pub(crate) async fn authenticate(
    r: &mut (impl AsyncReadExt + Unpin),
    token: Option<&str>,
    (permit, deadline): (tokio::sync::OwnedSemaphorePermit, tokio::time::Instant),
    gate: &Gate,
) -> Result<RunTaskRequest, Status> {
    let req = match tokio::time::timeout_at(deadline, read_request(r, token)).await {
        Ok(req) => req,
        Err(_) => Err(gate.late()),
    };
    drop(permit);
    req
}

async fn read_request(r: &mut (impl AsyncReadExt + Unpin), token: Option<&str>) -> Result<RunTaskRequest, Status> {
    let mut magic = [0u8; 5];
    r.read_exact(&mut magic).await.map_err(io_status)?;
    if &magic != MAGIC {
        return Err(Status::invalid_argument("not a sluice data-plane request (bad magic)"));
    }
    let given = read_frame(r, Prefix::U32, MAX_TOKEN.into()).await.map_err(frame_status("token"))?;
    if let Some(expected) = token {
        if !constant_time_eq(&given, expected.as_bytes()) {
            return Err(Status::unauthenticated(
                "missing or wrong token (set --token or SLUICE_TOKEN to the service's token)",
            ));
        }
    }
    let buf = read_frame(r, Prefix::U32, MAX_REQUEST.into()).await.map_err(frame_status("request"))?;
    RunTaskRequest::decode(buf.as_slice()).map_err(|e| Status::invalid_argument(format!("malformed request: {e}")))
}

async fn write_error(w: &mut (impl AsyncWriteExt + Unpin), s: &Status) -> std::io::Result<()> {
    let msg = s.message().as_bytes();
    let msg = &msg[..msg.len().min(MAX_ERROR_MESSAGE as usize)];
    w.write_u8(KIND_ERROR).await?;
    w.write_u32_le(s.code() as i32 as u32).await?;
    write_frame(w, Prefix::U32, msg).await?;
    w.flush().await
}

/// A batch with its pixels in the frame (and its masks after them, `masks_in_body`).
async fn write_inline(
    w: &mut (impl AsyncWriteExt + Unpin),
    out: &Outgoing,
    masks_in_body: bool,
) -> std::io::Result<()> {
    let head = out.header(masks_in_body).encode_to_vec();
    let data = out.payload();
    w.write_u8(KIND_BATCH).await?;
    write_frame(w, Prefix::U32, &head).await?;
    write_len(w, Prefix::U64, data.len()).await?;
    // Large writes bypass the BufWriter's buffer: straight from the batch.
    w.write_all(data).await?;
    write_masks(w, out, masks_in_body).await?;
    w.flush().await
}

/// The masks that follow a batch's pixels in its frame, when the request asked for them
/// there (`RunTaskRequest.masks_in_body`; the header gives their length).
async fn write_masks(w: &mut (impl AsyncWriteExt + Unpin), out: &Outgoing, masks_in_body: bool) -> std::io::Result<()> {
    match masks_in_body {
        true => w.write_all(out.masks()).await,
        false => Ok(()),
    }
}

async fn connection(
    sock: Box<dyn Io>,
    service: StartTask,
    token: Option<&str>,
    admitted: (tokio::sync::OwnedSemaphorePermit, tokio::time::Instant),
    gate: &Gate,
) -> std::io::Result<()> {
    let (r, w) = tokio::io::split(sock);
    let mut r = BufReader::new(r);
    let mut w = BufWriter::with_capacity(64 << 10, w);
    let req = match authenticate(&mut r, token, admitted, gate).await {
        Ok(req) => req,
        Err(s) => return write_error(&mut w, &s).await,
    };
    let masks_in_body = req.masks_in_body;
    let mut task = match service(req).await {
        Ok(task) => task,
        Err(s) => return write_error(&mut w, &s).await,
    };
    // Batches are built in the worker's own memory.
    drop(task.buffers.take());
    while let Some(item) = task.rx.recv().await {
        match item {
            Ok(out) => {
                write_inline(&mut w, &out, masks_in_body).await?;
                task.sent(out);
            }
            Err(s) => return write_error(&mut w, &s).await,
        }
    }
    w.write_u8(KIND_END).await?;
    w.flush().await?;
    // Close the TLS session cleanly (a plain socket just shuts its write side).
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::dataplane::TaskStream;
    use sluice_client::wire::Compression;
    use sluice_core::{Batch, BatchBoxes, BoxTargets, DType, Layout, Tensor, TensorData};
    use tokio::net::TcpStream;
    use tonic::Code;

    /// Batch `index`'s boxes (none) and mask: 2x3 bytes of `index + 1`.
    pub(super) fn masks_of(index: u64) -> BatchBoxes {
        let mut boxes = BatchBoxes::pad(&[BoxTargets::default()]);
        boxes.masks = Some(Tensor { shape: vec![1, 2, 3], data: TensorData::U8(vec![index as u8 + 1; 6]) });
        boxes
    }

    pub(super) fn start() -> StartTask {
        Arc::new(|req: RunTaskRequest| {
            Box::pin(async move {
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(async move {
                    for index in req.start..req.end {
                        // Pixels that name their batch: a mixed-up slot shows.
                        let mut images = Tensor::zeros(DType::F32, vec![1, 2, 2, 3]);
                        images.as_bytes_mut().fill(index as u8);
                        let b = Batch {
                            epoch: req.epoch,
                            index,
                            keys: vec![index],
                            labels: vec![1],
                            images,
                            layout: Layout::Chw,
                            weights: None,
                            // Job 9's source reads masks: 2x3, the images' size, naming the batch.
                            boxes: (req.job_id == 9).then(|| Box::new(masks_of(index))),
                            fields: None,
                        };
                        let _ = tx.send(Ok(Outgoing::new(b, Compression::from_wire(req.compression).unwrap()))).await;
                    }
                    if req.end == 99 {
                        let _ = tx.send(Err(Status::failed_precondition("bad sample #3"))).await;
                    }
                });
                // Job 7 claims smaller batches than it sends: they must go inline.
                let max_batch_bytes = if req.job_id == 7 { 10 } else { 2 * 2 * 3 * 4 };
                Ok(TaskBatches { rx, max_batch_bytes, in_flight: 2, buffers: None, recycle: None })
            })
        })
    }

    #[tokio::test]
    async fn batches_arrive_in_order_and_bad_tokens_and_garbage_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, start(), Some("tok".into()), None, ConnectionLimits::default()));
        for compression in [Compression::None, Compression::Zstd] {
            let req = RunTaskRequest {
                job_id: 1,
                epoch: 2,
                start: 3,
                end: 6,
                compression: compression.to_wire(),
                ..Default::default()
            };
            let mut s = TaskStream::open(&addr, Some("tok"), &req, None).await.unwrap();
            let mut got = Vec::new();
            while let Some(b) = s.next().await.unwrap() {
                assert_eq!((b.epoch, b.layout, b.images.shape.clone()), (2, Layout::Chw, vec![1, 2, 2, 3]));
                assert!(b.images.as_bytes().iter().all(|&x| x == b.index as u8));
                got.push(b.index);
            }
            assert_eq!(got, vec![3, 4, 5]);
        }
        // Masks come to a client that reads them after the pixels, and in the header to one
        // that predates that.
        for masks_in_body in [true, false] {
            let req = RunTaskRequest { job_id: 9, start: 0, end: 3, masks_in_body, ..Default::default() };
            let mut s = TaskStream::open(&addr, Some("tok"), &req, None).await.unwrap();
            let mut got = Vec::new();
            while let Some(b) = s.next().await.unwrap() {
                assert_eq!(b.boxes.as_deref(), Some(&masks_of(b.index)), "masks_in_body {masks_in_body}");
                got.push(b.index);
            }
            assert_eq!(got, vec![0, 1, 2]);
        }
        let req = RunTaskRequest { job_id: 1, epoch: 2, start: 3, end: 6, compression: 0, ..Default::default() };

        let mut s = TaskStream::open(&addr, Some("nope"), &req, None).await.unwrap();
        assert_eq!(s.next().await.unwrap_err().code(), Code::Unauthenticated);

        let bad = RunTaskRequest { job_id: 1, epoch: 0, start: 98, end: 99, compression: 0, ..Default::default() };
        let mut s = TaskStream::open(&addr, Some("tok"), &bad, None).await.unwrap();
        assert!(s.next().await.unwrap().is_some());
        let e = s.next().await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::FailedPrecondition, "bad sample #3"));

        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut r = TaskStream::new(BufReader::new(Box::new(raw)));
        assert_eq!(r.next().await.unwrap_err().code(), Code::InvalidArgument);
    }

    #[tokio::test]
    async fn connections_that_never_authenticate_are_capped_and_timed_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let limits = ConnectionLimits { pending: 2, auth_timeout: Duration::from_millis(300) };
        tokio::spawn(serve(listener, start(), Some("tok".into()), None, limits));
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TaskStream::new(BufReader::new(Box::new(TcpStream::connect(&addr).await.unwrap()))));
        }
        // One more is turned away at once, with the reason, rather than left waiting.
        let extra = TcpStream::connect(&addr).await.unwrap();
        let mut r = TaskStream::new(BufReader::new(Box::new(extra)));
        let e = tokio::time::timeout(Duration::from_secs(2), r.next())
            .await
            .expect("no answer within 2 s to a connection over the cap")
            .unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        // The silent ones are cut off at their deadline, which frees their places.
        for s in &mut idle {
            let e = tokio::time::timeout(Duration::from_secs(2), s.next()).await.expect("no deadline").unwrap_err();
            assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        }
        let req = RunTaskRequest { job_id: 1, epoch: 0, start: 0, end: 2, compression: 0, ..Default::default() };
        let mut s = TaskStream::open(&addr, Some("tok"), &req, None).await.unwrap();
        assert!(s.next().await.unwrap().is_some(), "a real client is served again");
    }
}

#[cfg(all(test, target_os = "linux"))]
mod local_tests {
    use super::tests::start;
    use super::*;
    use sluice_client::dataplane::{hello, MappedRegions, TaskStream, KIND_REGION};
    use sluice_client::shm;
    use sluice_client::wire::Compression;
    use tonic::Code;

    async fn read_all(s: &mut TaskStream) -> Result<Vec<u64>, Status> {
        let mut got = Vec::new();
        while let Some(b) = s.next().await? {
            assert!(
                b.images.as_bytes().iter().all(|&x| x == b.index as u8),
                "batch {} has another batch's pixels",
                b.index
            );
            got.push(b.index);
        }
        Ok(got)
    }

    #[tokio::test]
    async fn a_region_from_one_jobs_connection_is_never_handed_to_another_jobs() {
        let name = format!("sluice-test-{:x}", shm::random_u64());
        let listener = shm::listen_abstract(&name).unwrap();
        tokio::spawn(serve_local(
            listener,
            start(),
            None,
            Arc::new(RegionPool::default()),
            ConnectionLimits::default(),
        ));
        let maps = MappedRegions::default();
        let mut regions = Vec::new();
        for job_id in [1, 2, 1, 3] {
            let req = RunTaskRequest { job_id, epoch: 0, start: 0, end: 3, compression: 0, ..Default::default() };
            let sock = shm::connect_abstract(&name).unwrap();
            let mut s = TaskStream::open_local(sock, &name, None, &req, &maps).await.unwrap();
            let id = s.region_id().unwrap();
            assert_eq!(read_all(&mut s).await.unwrap(), vec![0, 1, 2]);
            drop(s);
            // Time for the worker to take every slot back and pool the region.
            tokio::time::sleep(Duration::from_millis(100)).await;
            regions.push((job_id, id));
        }
        for (i, &(job, id)) in regions.iter().enumerate() {
            for &(other_job, other_id) in &regions[..i] {
                assert!(
                    other_job == job || other_id != id,
                    "job {job}'s connection got the region job {other_job}'s used: {regions:?}"
                );
            }
        }
        // The same job and client get their own region back (its pages stay faulted in).
        assert_eq!(regions[0].1, regions[2].1, "{regions:?}");
    }

    #[tokio::test]
    async fn the_local_plane_delivers_through_reused_slots_and_refuses_what_the_tcp_plane_refuses() {
        let name = format!("sluice-test-{:x}", shm::random_u64());
        let listener = shm::listen_abstract(&name).unwrap();
        tokio::spawn(serve_local(
            listener,
            start(),
            Some("tok".into()),
            Arc::new(RegionPool::default()),
            ConnectionLimits::default(),
        ));
        let maps = MappedRegions::default();
        let open = |req: RunTaskRequest, token: &'static str| {
            let (name, maps) = (name.clone(), &maps);
            async move {
                TaskStream::open_local(shm::connect_abstract(&name).unwrap(), &name, Some(token), &req, maps).await
            }
        };
        // Five batches through two slots, plain and compressed; task after task, the
        // worker's one region is reused and mapped once.
        for compression in [Compression::None, Compression::Zstd, Compression::None] {
            let req = RunTaskRequest {
                job_id: 1,
                epoch: 2,
                start: 3,
                end: 8,
                compression: compression.to_wire(),
                ..Default::default()
            };
            let mut s = open(req, "tok").await.unwrap();
            assert!(s.is_local());
            assert_eq!(read_all(&mut s).await.unwrap(), vec![3, 4, 5, 6, 7]);
            // The worker pools the region once every slot is back (it reads them behind
            // the batches); give it that moment before the next task asks for one.
            drop(s);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(maps.len(), 1, "one region, reused for every task");

        // Masks follow a batch in a slot, or travel in its header to an older client.
        for masks_in_body in [true, false] {
            let req = RunTaskRequest { job_id: 9, start: 0, end: 3, masks_in_body, ..Default::default() };
            let mut s = open(req, "tok").await.unwrap();
            let mut got = Vec::new();
            while let Some(b) = s.next().await.unwrap() {
                assert_eq!(b.boxes.as_deref(), Some(&super::tests::masks_of(b.index)), "masks_in_body {masks_in_body}");
                got.push(b.index);
            }
            assert_eq!(got, vec![0, 1, 2]);
        }

        // Batches larger than a slot travel inline on the same socket.
        let req = RunTaskRequest { job_id: 7, epoch: 2, start: 0, end: 3, compression: 0, ..Default::default() };
        assert_eq!(read_all(&mut open(req, "tok").await.unwrap()).await.unwrap(), vec![0, 1, 2]);

        let req = RunTaskRequest { job_id: 1, epoch: 2, start: 3, end: 6, compression: 0, ..Default::default() };
        let e = open(req.clone(), "nope").await.err().expect("a wrong token is refused");
        assert_eq!(e.code(), Code::Unauthenticated);

        let bad = RunTaskRequest { job_id: 1, epoch: 0, start: 98, end: 99, compression: 0, ..Default::default() };
        let mut s = open(bad, "tok").await.unwrap();
        assert!(s.next().await.unwrap().is_some());
        let e = s.next().await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::FailedPrecondition, "bad sample #3"));

        // A client handing back a slot it does not hold is cut off; others are still served.
        let mut raw = shm::connect_abstract(&name).unwrap();
        raw.write_all(&hello(Some("tok"), &req).unwrap()).await.unwrap();
        let mut kind = [0u8; 1];
        let (_, fd) = shm::recv_with_fd(&raw, &mut kind).await.unwrap();
        assert_eq!((kind[0], fd.is_some()), (KIND_REGION, true));
        raw.write_all(&99u32.to_le_bytes()).await.unwrap();
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest)).await;
        assert!(matches!(ended, Ok(Ok(_))), "the worker closes the connection: {ended:?}");
        assert_eq!(read_all(&mut open(req, "tok").await.unwrap()).await.unwrap(), vec![3, 4, 5]);
    }
}
