//! The client's end of the data plane: [`TaskStream`] opens a task on a worker (TCP, with
//! TLS when configured) and reads its frames back into batches.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic::{Code, Status};

use sluice_transport::frame::nonblocking::{read_body, read_frame, read_len};
use sluice_transport::frame::Prefix;

use super::{
    frame_status, hello, io_status, Io, HANDSHAKE_TIMEOUT, KIND_BATCH, KIND_END, KIND_ERROR, KIND_SLOT,
    MAX_ERROR_MESSAGE, MAX_HEADER,
};
use crate::error::ClientError;
use crate::proto::{BatchMessage, RunTaskRequest};
use crate::tls::ClientTls;
use crate::wire::{decode_header, frame_to_received, masks_body_len, Received};
use crate::MAX_MESSAGE_BYTES;

/// A task's batches from a worker's data plane, one at a time.
pub struct TaskStream {
    pub(super) r: BufReader<Box<dyn Io>>,
    pub(super) done: bool,
    /// The worker's shared region (local data plane).
    #[cfg(target_os = "linux")]
    pub(super) region: Option<Arc<crate::shm::Region>>,
}

impl TaskStream {
    /// Opens a task's stream; with `tls`, inside a TLS session checked against its CA.
    pub async fn open(
        addr: &str,
        token: Option<&str>,
        req: &RunTaskRequest,
        tls: Option<&ClientTls>,
    ) -> Result<Self, Status> {
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
        let mut r = BufReader::with_capacity(64 << 10, sock);
        r.get_mut().write_all(&hello(token, req).map_err(io_status)?).await.map_err(io_status)?;
        r.get_mut().flush().await.map_err(io_status)?;
        Ok(Self::new(r))
    }

    /// The id of the worker's shared region the batches come through (local data plane).
    pub fn region_id(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        return self.region.as_ref().map(|r| r.id());
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Whether the batches come through shared memory (the local data plane).
    pub fn is_local(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.region.is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Reads the frames of a connection whose hello was sent already.
    pub fn new(r: BufReader<Box<dyn Io>>) -> Self {
        Self {
            r,
            done: false,
            #[cfg(target_os = "linux")]
            region: None,
        }
    }

    /// The next batch, `None` at the end of the task.
    pub async fn next(&mut self) -> Result<Option<sluice_core::Batch>, Status> {
        Ok(self.next_received().await?.map(|r| r.batch))
    }

    /// The next batch with the samples of it the worker skipped, `None` at the end.
    pub async fn next_received(&mut self) -> Result<Option<Received>, Status> {
        if self.done {
            return Ok(None);
        }
        let kind = self.r.read_u8().await.map_err(io_status)?;
        self.frame(kind).await
    }

    /// The rest of a frame whose kind byte was read.
    pub(super) async fn frame(&mut self, kind: u8) -> Result<Option<Received>, Status> {
        let r = &mut self.r;
        match kind {
            KIND_END => {
                self.done = true;
                Ok(None)
            }
            KIND_ERROR => {
                let code = r.read_u32_le().await.map_err(io_status)?;
                let msg = read_frame(r, Prefix::U32, MAX_ERROR_MESSAGE.into())
                    .await
                    .map_err(frame_status("error message"))?;
                self.done = true;
                Err(Status::new(Code::from(code as i32), String::from_utf8_lossy(&msg).into_owned()))
            }
            KIND_BATCH => {
                let m = read_header(r).await?;
                let len = read_pixels_len(r).await?;
                let pixels = read_body(r, len).await.map_err(io_status)?;
                let masks = read_masks(r, &m).await?;
                frame_to_received(m, pixels, masks).map(Some).map_err(|e: ClientError| Status::from(e))
            }
            #[cfg(target_os = "linux")]
            KIND_SLOT => {
                let Some(region) = self.region.clone() else {
                    return Err(Status::invalid_argument("a shared-memory batch on a connection without a region"));
                };
                let m = read_header(r).await?;
                let slot = r.read_u32_le().await.map_err(io_status)?;
                let len = read_pixels_len(r).await?;
                let masks = read_masks(r, &m).await?;
                let pixels =
                    region.read(slot, len).map_err(|e| Status::invalid_argument(format!("batch {}: {e}", m.index)))?;
                // The slot is free again once its pixels are ours. A worker that has
                // already ended the task (with an error) no longer listens: the batch is
                // still good, and the next read reports the end.
                let w = r.get_mut();
                if let Err(e) = async {
                    w.write_all(&slot.to_le_bytes()).await?;
                    w.flush().await
                }
                .await
                {
                    tracing::debug!(error = %e, "could not hand a slot back");
                }
                frame_to_received(m, pixels, masks).map(Some).map_err(|e: ClientError| Status::from(e))
            }
            other => Err(Status::invalid_argument(format!("unknown data-plane frame kind {other}"))),
        }
    }
}

async fn read_header(r: &mut (impl AsyncReadExt + Unpin)) -> Result<BatchMessage, Status> {
    let head = read_frame(r, Prefix::U32, MAX_HEADER.into()).await.map_err(frame_status("batch header"))?;
    decode_header(&head).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The masks that follow a batch's pixels, as many bytes as its header says (none when
/// they travel in the header or the batch has none).
async fn read_masks(r: &mut (impl AsyncReadExt + Unpin), m: &BatchMessage) -> Result<Vec<u8>, Status> {
    match masks_body_len(m).map_err(Status::from)? {
        0 => Ok(Vec::new()),
        len => read_body(r, len).await.map_err(io_status),
    }
}

/// The length of a batch's pixels (a `u64`), at most [`MAX_MESSAGE_BYTES`].
async fn read_pixels_len(r: &mut (impl AsyncReadExt + Unpin)) -> Result<usize, Status> {
    read_len(r, Prefix::U64, MAX_MESSAGE_BYTES as u64).await.map_err(frame_status("batch"))
}
