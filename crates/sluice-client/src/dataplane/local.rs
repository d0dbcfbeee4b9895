//! The client's end of the local data plane (Linux): a task's stream over the worker's
//! Unix socket, with the pixels in a shared region the client maps once and reads each
//! batch out of (see the parent module's docs for the frames).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::Status;

use super::{hello, io_status, TaskStream, KIND_REGION, MAX_SLOTS};
use crate::proto::RunTaskRequest;
use crate::shm::{self, Region};
use crate::MAX_MESSAGE_BYTES;

/// A region as a client knows it: the worker's local address and the region's id.
type RegionKey = (String, u64);

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
        self.maps.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.maps.lock().is_empty()
    }

    fn get_or_map(
        &self,
        worker: &str,
        id: u64,
        fd: OwnedFd,
        slots: u32,
        slot_bytes: usize,
    ) -> std::io::Result<Arc<Region>> {
        let mut maps = self.maps.lock();
        let key = (worker.to_string(), id);
        if let Some(i) = maps.iter().position(|(k, r)| *k == key && r.slots() == slots && r.slot_bytes() == slot_bytes)
        {
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
        sock.write_all(&hello(token, req).map_err(io_status)?).await.map_err(io_status)?;
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
