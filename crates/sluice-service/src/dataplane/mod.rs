//! The TCP data plane: batches from a worker to a client as a header and the raw pixel
//! buffer, written straight from the batch and read straight into the client's batch, so a
//! batch costs what the kernel's copies cost (gRPC over HTTP/2 moves 16 KiB frames and
//! copies each message twice more; see BENCHMARKS). Control stays on gRPC.
//!
//! One task per connection. Client → worker:
//!   `b"SLDP1"`, u32 token length, token, u32 request length, `RunTaskRequest` (prost).
//! Worker → client, repeated, each frame starting with a kind byte:
//!   `1` batch: u32 header length, `BatchMessage` without `data` (prost), u64 data length, data
//!       (the pixels, compressed when the request asked and the header says so);
//!   `2` end of task;
//!   `3` error: u32 gRPC status code, u32 message length, message (UTF-8).
//! Integers are little-endian. Sizes are bounded before anything is allocated.
//! With TLS configured the same bytes travel inside a rustls session.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use sluice_core::Batch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::{Code, Status};

use crate::error::ServiceError;
use crate::proto::{BatchMessage, RunTaskRequest};
use crate::security::constant_time_eq;
use crate::tls::ClientTls;
use crate::wire::{message_to_batch, Outgoing};
use crate::MAX_MESSAGE_BYTES;

const MAGIC: &[u8; 5] = b"SLDP1";
const KIND_BATCH: u8 = 1;
const KIND_END: u8 = 2;
const KIND_ERROR: u8 = 3;
const MAX_HEADER: u32 = 16 << 20;
const MAX_TOKEN: u32 = 4096;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn io_status(e: std::io::Error) -> Status {
    Status::unavailable(format!("data plane: {e}"))
}

/// What runs a task: the worker's loader (or, in benchmarks, a no-op producer).
pub type StartTask = Arc<
    dyn Fn(RunTaskRequest) -> Pin<Box<dyn Future<Output = Result<mpsc::Receiver<Result<Outgoing, Status>>, Status>> + Send>>
        + Send
        + Sync,
>;

/// A connection, plain or inside TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Serves the data plane on `listener` until the runtime stops; with `tls`, every
/// connection must open a TLS session first.
pub async fn serve(
    listener: TcpListener,
    service: StartTask,
    token: Option<String>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "data plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let service = service.clone();
        let token = token.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            if let Err(e) = sock.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "data plane: nodelay");
            }
            let sock: Box<dyn Io> = match tls {
                None => Box::new(sock),
                Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "data plane: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "data plane: no TLS handshake within 10 s");
                        return;
                    }
                },
            };
            if let Err(e) = connection(sock, service, token.as_deref()).await {
                tracing::debug!(%peer, error = %e, "data plane connection ended");
            }
        });
    }
}

async fn read_request(r: &mut (impl AsyncReadExt + Unpin), token: Option<&str>) -> Result<RunTaskRequest, Status> {
    let mut magic = [0u8; 5];
    r.read_exact(&mut magic).await.map_err(io_status)?;
    if &magic != MAGIC {
        return Err(Status::invalid_argument("not a sluice data-plane request (bad magic)"));
    }
    let n = r.read_u32_le().await.map_err(io_status)?;
    if n > MAX_TOKEN {
        return Err(Status::invalid_argument("token too long"));
    }
    let mut given = vec![0u8; n as usize];
    r.read_exact(&mut given).await.map_err(io_status)?;
    if let Some(expected) = token {
        if !constant_time_eq(&given, expected.as_bytes()) {
            return Err(Status::unauthenticated("missing or wrong token (set --token or SLUICE_TOKEN to the service's token)"));
        }
    }
    let n = r.read_u32_le().await.map_err(io_status)?;
    if n > 4096 {
        return Err(Status::invalid_argument("request too long"));
    }
    let mut buf = vec![0u8; n as usize];
    r.read_exact(&mut buf).await.map_err(io_status)?;
    RunTaskRequest::decode(buf.as_slice()).map_err(|e| Status::invalid_argument(format!("malformed request: {e}")))
}

async fn write_error(w: &mut (impl AsyncWriteExt + Unpin), s: &Status) -> std::io::Result<()> {
    let msg = s.message().as_bytes();
    let msg = &msg[..msg.len().min(64 << 10)];
    w.write_u8(KIND_ERROR).await?;
    w.write_u32_le(s.code() as i32 as u32).await?;
    w.write_u32_le(msg.len() as u32).await?;
    w.write_all(msg).await?;
    w.flush().await
}

async fn connection(sock: Box<dyn Io>, service: StartTask, token: Option<&str>) -> std::io::Result<()> {
    let (r, w) = tokio::io::split(sock);
    let mut r = BufReader::new(r);
    let mut w = BufWriter::with_capacity(64 << 10, w);
    let req = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut r, token)).await {
        Ok(Ok(req)) => req,
        Ok(Err(s)) => return write_error(&mut w, &s).await,
        Err(_) => return write_error(&mut w, &Status::deadline_exceeded("no request within 10 s")).await,
    };
    let mut rx = match service(req).await {
        Ok(rx) => rx,
        Err(s) => return write_error(&mut w, &s).await,
    };
    while let Some(item) = rx.recv().await {
        match item {
            Ok(out) => {
                let head = out.header().encode_to_vec();
                let data = out.payload();
                w.write_u8(KIND_BATCH).await?;
                w.write_u32_le(head.len() as u32).await?;
                w.write_all(&head).await?;
                w.write_u64_le(data.len() as u64).await?;
                // Large writes bypass the BufWriter's buffer: straight from the batch.
                w.write_all(data).await?;
                w.flush().await?;
            }
            Err(s) => return write_error(&mut w, &s).await,
        }
    }
    w.write_u8(KIND_END).await?;
    w.flush().await?;
    // Close the TLS session cleanly (a plain socket just shuts its write side).
    w.shutdown().await
}

/// A task's batches from a worker's data plane, one at a time.
pub struct TaskStream {
    r: BufReader<Box<dyn Io>>,
    done: bool,
}

impl TaskStream {
    /// Opens a task's stream; with `tls`, inside a TLS session checked against its CA.
    pub async fn open(addr: &str, token: Option<&str>, req: &RunTaskRequest, tls: Option<&ClientTls>) -> Result<Self, Status> {
        let sock = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .map_err(|_| Status::unavailable(format!("data plane {addr}: connect timed out")))?
            .map_err(io_status)?;
        sock.set_nodelay(true).map_err(io_status)?;
        let sock: Box<dyn Io> = match tls {
            None => Box::new(sock),
            Some(tls) => Box::new(
                tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(addr, sock))
                    .await
                    .map_err(|_| Status::unavailable(format!("data plane {addr}: TLS handshake timed out")))?
                    .map_err(|e| Status::unavailable(format!("data plane {addr}: TLS: {e}")))?,
            ),
        };
        let mut hello = Vec::with_capacity(64);
        hello.extend_from_slice(MAGIC);
        let t = token.unwrap_or("").as_bytes();
        hello.extend_from_slice(&(t.len() as u32).to_le_bytes());
        hello.extend_from_slice(t);
        let body = req.encode_to_vec();
        hello.extend_from_slice(&(body.len() as u32).to_le_bytes());
        hello.extend_from_slice(&body);
        let mut r = BufReader::with_capacity(64 << 10, sock);
        r.get_mut().write_all(&hello).await.map_err(io_status)?;
        r.get_mut().flush().await.map_err(io_status)?;
        Ok(Self { r, done: false })
    }

    /// The next batch, `None` at the end of the task.
    pub async fn next(&mut self) -> Result<Option<Batch>, Status> {
        if self.done {
            return Ok(None);
        }
        let r = &mut self.r;
        match r.read_u8().await.map_err(io_status)? {
            KIND_END => {
                self.done = true;
                Ok(None)
            }
            KIND_ERROR => {
                let code = r.read_u32_le().await.map_err(io_status)?;
                let n = r.read_u32_le().await.map_err(io_status)?.min(64 << 10);
                let mut msg = vec![0u8; n as usize];
                r.read_exact(&mut msg).await.map_err(io_status)?;
                self.done = true;
                Err(Status::new(Code::from(code as i32), String::from_utf8_lossy(&msg).into_owned()))
            }
            KIND_BATCH => {
                let n = r.read_u32_le().await.map_err(io_status)?;
                if n > MAX_HEADER {
                    return Err(Status::invalid_argument(format!("batch header of {n} bytes")));
                }
                let mut head = vec![0u8; n as usize];
                r.read_exact(&mut head).await.map_err(io_status)?;
                let mut m = BatchMessage::decode(head.as_slice())
                    .map_err(|e| Status::invalid_argument(format!("malformed batch header: {e}")))?;
                let len = r.read_u64_le().await.map_err(io_status)?;
                if len > MAX_MESSAGE_BYTES as u64 {
                    return Err(Status::invalid_argument(format!("batch of {len} bytes is over the limit")));
                }
                m.data = read_payload(r, len as usize).await.map_err(io_status)?;
                message_to_batch(m).map(Some).map_err(|e: ServiceError| Status::from(e))
            }
            other => Err(Status::invalid_argument(format!("unknown data-plane frame kind {other}"))),
        }
    }
}

/// Reads exactly `len` bytes into a fresh buffer without zeroing it first: the kernel's
/// copy is the only pass over the pixels (a zeroed `vec!` costs a second one per batch).
async fn read_payload(r: &mut (impl AsyncReadExt + Unpin), len: usize) -> std::io::Result<Vec<u8>> {
    use bytes::BufMut;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        // Never past `len`: the next frame follows on the same connection.
        let want = len - data.len();
        if r.read_buf(&mut (&mut data).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Compression;
    use sluice_core::{DType, Layout, Tensor};

    fn start() -> StartTask {
        Arc::new(|req: RunTaskRequest| {
            Box::pin(async move {
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(async move {
                    for index in req.start..req.end {
                        let b = Batch {
                            epoch: req.epoch,
                            index,
                            keys: vec![index],
                            labels: vec![1],
                            images: Tensor::zeros(DType::F32, vec![1, 2, 2, 3]),
                            layout: Layout::Chw,
                            weights: None,
                        };
                        let _ = tx.send(Ok(Outgoing::new(b, Compression::from_wire(req.compression).unwrap()))).await;
                    }
                    if req.end == 99 {
                        let _ = tx.send(Err(Status::failed_precondition("bad sample #3"))).await;
                    }
                });
                Ok(rx)
            })
        })
    }

    #[tokio::test]
    async fn batches_arrive_in_order_and_bad_tokens_and_garbage_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, start(), Some("tok".into()), None));
        for compression in [Compression::None, Compression::Zstd] {
            let req = RunTaskRequest { job_id: 1, epoch: 2, start: 3, end: 6, compression: compression.to_wire() };
            let mut s = TaskStream::open(&addr, Some("tok"), &req, None).await.unwrap();
            let mut got = Vec::new();
            while let Some(b) = s.next().await.unwrap() {
                assert_eq!((b.epoch, b.layout, b.images.shape.clone()), (2, Layout::Chw, vec![1, 2, 2, 3]));
                got.push(b.index);
            }
            assert_eq!(got, vec![3, 4, 5]);
        }
        let req = RunTaskRequest { job_id: 1, epoch: 2, start: 3, end: 6, compression: 0 };

        let mut s = TaskStream::open(&addr, Some("nope"), &req, None).await.unwrap();
        assert_eq!(s.next().await.unwrap_err().code(), Code::Unauthenticated);

        let bad = RunTaskRequest { job_id: 1, epoch: 0, start: 98, end: 99, compression: 0 };
        let mut s = TaskStream::open(&addr, Some("tok"), &bad, None).await.unwrap();
        assert!(s.next().await.unwrap().is_some());
        let e = s.next().await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::FailedPrecondition, "bad sample #3"));

        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut r = TaskStream { r: BufReader::new(Box::new(raw)), done: false };
        assert_eq!(r.next().await.unwrap_err().code(), Code::InvalidArgument);
    }
}
