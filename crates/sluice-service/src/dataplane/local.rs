//! The local data plane: the TCP data plane's protocol over a Unix socket, with the
//! pixels in shared memory (see the parent module's docs for the frames). A worker keeps
//! a pool of regions; a client maps each region once and copies each batch out of its
//! slot, handing the slot back at once.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tonic::Status;

use super::{
    hello, io_status, read_request, write_error, write_inline, StartTask, TaskStream, HANDSHAKE_TIMEOUT, KIND_END,
    KIND_REGION, KIND_SLOT, MAX_SLOTS, SLOTS,
};
use crate::proto::RunTaskRequest;
use crate::shm::{self, Region};
use crate::MAX_MESSAGE_BYTES;

/// A region as a client knows it: the worker's local address and the region's id.
type RegionKey = (String, u64);

/// Shared regions a worker keeps between tasks, so their pages are faulted in once
/// (a fresh region per task would have the kernel zero and map every slot again).
#[derive(Default)]
pub struct RegionPool {
    idle: Mutex<Vec<Region>>,
}

impl RegionPool {
    /// Regions kept idle at most (one per task a worker streams at once is enough).
    const MAX_IDLE: usize = 8;

    /// An idle region with slots of at least `slot_bytes` (and not more than twice that),
    /// or a new one.
    fn take(&self, slot_bytes: usize) -> std::io::Result<Region> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let fits = |r: &Region| r.slot_bytes() >= slot_bytes && r.slot_bytes() / 2 <= slot_bytes;
        match idle.iter().position(fits) {
            Some(i) => Ok(idle.swap_remove(i)),
            None => Region::create(SLOTS, slot_bytes),
        }
    }

    fn put(&self, region: Region) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < Self::MAX_IDLE {
            idle.push(region);
        }
    }
}

/// Serves the local data plane on `listener` until the runtime stops.
pub async fn serve_local(listener: tokio::net::UnixListener, service: StartTask, token: Option<String>, pool: Arc<RegionPool>) {
    loop {
        let sock = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "local data plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (service, token, pool) = (service.clone(), token.clone(), pool.clone());
        tokio::spawn(async move {
            if let Err(e) = local_connection(sock, service, token.as_deref(), &pool).await {
                tracing::debug!(error = %e, "local data plane connection ended");
            }
        });
    }
}

async fn local_connection(
    mut sock: tokio::net::UnixStream,
    service: StartTask,
    token: Option<&str>,
    pool: &RegionPool,
) -> std::io::Result<()> {
    let req = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut sock, token)).await {
        Ok(Ok(req)) => req,
        Ok(Err(s)) => return write_error(&mut sock, &s).await,
        Err(_) => return write_error(&mut sock, &Status::deadline_exceeded("no request within 10 s")).await,
    };
    let mut task = match service(req).await {
        Ok(task) => task,
        Err(s) => return write_error(&mut sock, &s).await,
    };
    let region = match pool.take(task.max_batch_bytes.max(1)) {
        Ok(r) => r,
        Err(e) => return write_error(&mut sock, &Status::internal(format!("shared memory: {e}"))).await,
    };
    let mut frame = Vec::with_capacity(21);
    frame.push(KIND_REGION);
    frame.extend_from_slice(&region.id().to_le_bytes());
    frame.extend_from_slice(&region.slots().to_le_bytes());
    frame.extend_from_slice(&(region.slot_bytes() as u64).to_le_bytes());
    shm::send_with_fd(&sock, &frame, region.fd()).await?;

    let (r, w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut w = BufWriter::with_capacity(64 << 10, w);
    let mut slots = Slots::new(region.slots());
    while let Some(item) = task.rx.recv().await {
        let out = match item {
            Ok(out) => out,
            // The client stops reading here; its slots may still be in use, so the region
            // is not pooled again.
            Err(s) => return write_error(&mut w, &s).await,
        };
        let data = out.payload();
        if data.len() > region.slot_bytes() {
            write_inline(&mut w, &out).await?;
            task.sent(out);
            continue;
        }
        let slot = match slots.take() {
            Some(s) => s,
            None => {
                let back = r.read_u32_le().await?;
                slots.hand_back(back)?;
                slots.take().unwrap_or(back)
            }
        };
        region.write(slot, data)?;
        let head = out.header().encode_to_vec();
        w.write_u8(KIND_SLOT).await?;
        w.write_u32_le(head.len() as u32).await?;
        w.write_all(&head).await?;
        w.write_u32_le(slot).await?;
        w.write_u64_le(data.len() as u64).await?;
        w.flush().await?;
        task.sent(out);
    }
    w.write_u8(KIND_END).await?;
    w.flush().await?;
    // The client hands each slot back once it has copied it out; with all back, the
    // region can serve another task.
    let drained = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        while !slots.all_free() {
            let back = r.read_u32_le().await?;
            slots.hand_back(back)?;
        }
        std::io::Result::Ok(())
    })
    .await;
    if matches!(drained, Ok(Ok(()))) {
        pool.put(region);
    }
    w.shutdown().await
}

/// Which slots of a region the client holds.
struct Slots {
    held: Vec<bool>,
}

impl Slots {
    fn new(n: u32) -> Self {
        Self { held: vec![false; n as usize] }
    }

    fn take(&mut self) -> Option<u32> {
        let i = self.held.iter().position(|h| !h)?;
        self.held[i] = true;
        Some(i as u32)
    }

    fn hand_back(&mut self, slot: u32) -> std::io::Result<()> {
        match self.held.get_mut(slot as usize) {
            Some(h) if *h => {
                *h = false;
                Ok(())
            }
            _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("client handed back slot {slot}, which it does not hold"))),
        }
    }

    fn all_free(&self) -> bool {
        !self.held.iter().any(|h| *h)
    }
}

/// The regions a client has mapped, by worker and region id: a worker reuses its regions
/// task after task, so each is mapped once.
#[derive(Default)]
pub struct MappedRegions {
    /// ((worker, region id), mapping), least recently used first.
    maps: Mutex<Vec<(RegionKey, Arc<Region>)>>,
}

impl MappedRegions {
    /// Mappings kept at most (the least recently used goes first).
    const MAX: usize = 32;

    /// Regions mapped now.
    pub fn len(&self) -> usize {
        self.maps.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get_or_map(
        &self,
        worker: &str,
        id: u64,
        fd: OwnedFd,
        slots: u32,
        slot_bytes: usize,
    ) -> std::io::Result<Arc<Region>> {
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        let key = (worker.to_string(), id);
        if let Some(i) = maps.iter().position(|(k, r)| *k == key && r.slots() == slots && r.slot_bytes() == slot_bytes) {
            let entry = maps.remove(i);
            let region = entry.1.clone();
            maps.push(entry);
            return Ok(region);
        }
        let region = Arc::new(Region::open(fd, id, slots, slot_bytes)?);
        maps.retain(|(k, _)| *k != key);
        if maps.len() >= Self::MAX {
            maps.remove(0);
        }
        maps.push((key, region.clone()));
        Ok(region)
    }
}

impl TaskStream {
    /// Opens a task's stream on a worker's local data plane (`sock`, connected to the
    /// worker's abstract socket `worker`): the pixels come through shared memory.
    pub async fn open_local(
        sock: tokio::net::UnixStream,
        worker: &str,
        token: Option<&str>,
        req: &RunTaskRequest,
        maps: &MappedRegions,
    ) -> Result<Self, Status> {
        let mut sock = sock;
        sock.write_all(&hello(token, req)).await.map_err(io_status)?;
        // The region's fd comes with the first byte the worker sends; a plain (buffered)
        // read would drop it.
        let mut kind = [0u8; 1];
        let (n, fd) = tokio::time::timeout(Duration::from_secs(60), shm::recv_with_fd(&sock, &mut kind))
            .await
            .map_err(|_| Status::unavailable("worker sent nothing for 60 s"))?
            .map_err(io_status)?;
        if n == 0 {
            return Err(io_status(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let mut stream = Self::new(BufReader::with_capacity(64 << 10, Box::new(sock)));
        if kind[0] != KIND_REGION {
            // An error frame (the request was refused), or a stream without a region.
            return match stream.frame(kind[0]).await? {
                None => Ok(stream),
                Some(_) => Err(Status::invalid_argument("a batch before the shared region")),
            };
        }
        let r = &mut stream.r;
        let id = r.read_u64_le().await.map_err(io_status)?;
        let slots = r.read_u32_le().await.map_err(io_status)?;
        let slot_bytes = r.read_u64_le().await.map_err(io_status)?;
        if slots == 0 || slots > MAX_SLOTS || slot_bytes == 0 || slot_bytes > MAX_MESSAGE_BYTES as u64 {
            return Err(Status::invalid_argument(format!("shared region of {slots} slots of {slot_bytes} bytes")));
        }
        let fd = fd.ok_or_else(|| Status::invalid_argument("shared region announced without its memory"))?;
        let region = maps
            .get_or_map(worker, id, fd, slots, slot_bytes as usize)
            .map_err(|e| Status::unavailable(format!("mapping the worker's shared region: {e}")))?;
        stream.region = Some(region);
        Ok(stream)
    }
}

