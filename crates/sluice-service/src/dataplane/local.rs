//! The local data plane: the TCP data plane's protocol over a Unix socket, with the
//! pixels in shared memory (see the parent module's docs for the frames). Each task
//! connection has a region of batch-sized slots from the worker's pool; the worker's
//! loader builds u8 batches straight in free slots (anything else is copied into one, or
//! sent inline when none is free), and the client copies each batch out of its slot and
//! hands the slot back at once. A client maps each region once. A pooled region goes back
//! only to the job and client process it served, never to another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use sluice_core::{DType, SharedBytes, Tensor, TensorData};
use sluice_pipeline::BufferSource;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tonic::Status;

use sluice_client::dataplane::{HANDSHAKE_TIMEOUT, KIND_END, KIND_REGION, KIND_SLOT, MAX_SLOTS};
use sluice_client::shm::{self, Region};
use sluice_client::wire::Outgoing;
use sluice_client::MAX_MESSAGE_BYTES;
use sluice_transport::frame::nonblocking::{write_frame, write_len};
use sluice_transport::frame::Prefix;

use super::{authenticate, refuse, write_error, write_inline, write_masks, ConnectionLimits, Gate, StartTask};

/// Who a pooled region may be handed to again: the job, and the client process (uid and
/// pid from the socket's credentials). A region goes back only to the task connections of
/// the job and client it served, which still hold its mapping: another client would read
/// this one's later batches through the mapping it kept, and another job's client this
/// job's earlier ones.
type PoolKey = (u64, u32, i32);

/// Shared regions a worker keeps between tasks, so their pages are faulted in once
/// (a fresh region per task would have the kernel zero and map every slot again).
#[derive(Default)]
pub struct RegionPool {
    idle: Mutex<Vec<(PoolKey, Region)>>,
}

impl RegionPool {
    /// Regions kept idle at most (the least recently pooled go first).
    const MAX_IDLE: usize = 8;

    /// An idle region of `key`'s with `slots` slots of at least `slot_bytes` (and not more
    /// than twice that), or a new one.
    fn take(&self, key: Option<PoolKey>, slots: u32, slot_bytes: usize) -> std::io::Result<Region> {
        let mut idle = self.idle.lock();
        let fits = |(k, r): &(PoolKey, Region)| {
            Some(*k) == key && r.slots() == slots && r.slot_bytes() >= slot_bytes && r.slot_bytes() / 2 <= slot_bytes
        };
        match idle.iter().position(fits) {
            Some(i) => Ok(idle.remove(i).1),
            None => Region::create(slots, slot_bytes),
        }
    }

    fn put(&self, key: PoolKey, region: Region) {
        let mut idle = self.idle.lock();
        if idle.len() >= Self::MAX_IDLE {
            idle.remove(0);
        }
        idle.push((key, region));
    }
}

/// What a slot of a connection's region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// Lent to the loader, which is building a batch in it.
    Filling,
    /// Sent; the client has not handed it back yet.
    Client,
}

/// One task connection's region and what each of its slots is doing.
struct LocalRegion {
    region: Region,
    slots: Mutex<Vec<Slot>>,
    /// Told whenever a slot comes free.
    freed: tokio::sync::Notify,
}

impl LocalRegion {
    fn new(region: Region) -> Self {
        let slots = Mutex::new(vec![Slot::Free; region.slots() as usize]);
        Self { region, slots, freed: tokio::sync::Notify::new() }
    }

    /// A free slot, now `to`.
    fn take(&self, to: Slot) -> Option<u32> {
        let mut slots = self.slots.lock();
        let i = slots.iter().position(|s| *s == Slot::Free)?;
        slots[i] = to;
        Some(i as u32)
    }

    /// Moves `slot` from `from` to `to`; false if it was not in `from`.
    fn set(&self, slot: u32, from: Slot, to: Slot) -> bool {
        let mut slots = self.slots.lock();
        match slots.get_mut(slot as usize) {
            Some(s) if *s == from => {
                *s = to;
                if to == Slot::Free {
                    self.freed.notify_waiters();
                }
                true
            }
            _ => false,
        }
    }

    fn all_free(&self) -> bool {
        self.slots.lock().iter().all(|s| *s == Slot::Free)
    }
}

/// A slot lent to the loader for one batch. Dropped without being sent (task cancelled,
/// batch compressed into other memory), it is free again.
struct SlotLease {
    region: Arc<LocalRegion>,
    slot: u32,
    sent: AtomicBool,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if !self.sent.load(Ordering::Acquire) {
            self.region.set(self.slot, Slot::Filling, Slot::Free);
        }
    }
}

/// Lends the loader free slots to build u8 batches in, so they need no copy here.
fn buffer_source(region: Arc<LocalRegion>) -> BufferSource {
    Arc::new(move |dtype, n| {
        if dtype != DType::U8 || n > region.region.slot_bytes() {
            return None;
        }
        let slot = region.take(Slot::Filling)?;
        let Ok(ptr) = region.region.slot_ptr(slot) else {
            region.set(slot, Slot::Filling, Slot::Free);
            return None;
        };
        let lease = SlotLease { region: region.clone(), slot, sent: AtomicBool::new(false) };
        // SAFETY: the slot is slot_bytes of mapped, initialised memory that lives as long
        // as the region the lease holds, and nothing else touches it while it is Filling.
        let bytes = unsafe { SharedBytes::new(ptr, region.region.slot_bytes(), Box::new(lease)) };
        Some(Tensor { shape: vec![n], data: TensorData::SharedU8(bytes) })
    })
}

/// The slot `out`'s pixels were built in, if they were built in one of `region`'s and
/// travel as they are (not compressed into other memory); it is marked sent.
fn built_in(out: &Outgoing, region: &Arc<LocalRegion>) -> Option<u32> {
    let TensorData::SharedU8(bytes) = &out.batch().images.data else { return None };
    let lease = bytes.owner().downcast_ref::<SlotLease>()?;
    if !Arc::ptr_eq(&lease.region, region) || out.payload().as_ptr() != bytes.as_slice().as_ptr() {
        return None;
    }
    lease.sent.store(true, Ordering::Release);
    region.set(lease.slot, Slot::Filling, Slot::Client).then_some(lease.slot)
}

/// Serves the local data plane on `listener` until the runtime stops.
pub async fn serve_local(
    listener: tokio::net::UnixListener,
    service: StartTask,
    token: Option<String>,
    pool: Arc<RegionPool>,
    limits: ConnectionLimits,
) {
    let gate = Gate::new(limits);
    loop {
        let sock = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "local data plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = gate.admit() else {
            tracing::debug!("local data plane: too many connections waiting to authenticate; turned one away");
            tokio::spawn(refuse(sock, gate.full()));
            continue;
        };
        let (service, token, pool, gate) = (service.clone(), token.clone(), pool.clone(), gate.clone());
        tokio::spawn(async move {
            if let Err(e) = local_connection(sock, service, token.as_deref(), &pool, admitted, &gate).await {
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
    admitted: (tokio::sync::OwnedSemaphorePermit, tokio::time::Instant),
    gate: &Gate,
) -> std::io::Result<()> {
    let req = match authenticate(&mut sock, token, admitted, gate).await {
        Ok(req) => req,
        Err(s) => return write_error(&mut sock, &s).await,
    };
    let (job_id, masks_in_body) = (req.job_id, req.masks_in_body);
    let mut task = match service(req).await {
        Ok(task) => task,
        Err(s) => return write_error(&mut sock, &s).await,
    };
    let slots = task.in_flight.clamp(2, MAX_SLOTS as usize) as u32;
    // Batches larger than a client accepts in a slot go inline.
    let slot_bytes = task.max_batch_bytes.clamp(1, MAX_MESSAGE_BYTES);
    let key = sock.peer_cred().ok().and_then(|c| Some((job_id, c.uid(), c.pid()?)));
    let region = match pool.take(key, slots, slot_bytes) {
        Ok(r) => Arc::new(LocalRegion::new(r)),
        Err(e) => return write_error(&mut sock, &Status::internal(format!("shared memory: {e}"))).await,
    };
    if let Some(buffers) = task.buffers.take() {
        // The task waits for this before it starts; a task gone already does not need it.
        let _ = buffers.send(buffer_source(region.clone()));
    }
    let mut frame = Vec::with_capacity(21);
    frame.push(KIND_REGION);
    frame.extend_from_slice(&region.region.id().to_le_bytes());
    frame.extend_from_slice(&region.region.slots().to_le_bytes());
    frame.extend_from_slice(&(region.region.slot_bytes() as u64).to_le_bytes());
    shm::send_with_fd(&sock, &frame, region.region.fd()).await?;

    let (r, w) = sock.into_split();
    let mut w = BufWriter::with_capacity(64 << 10, w);
    // Slots come back from the client while batches go out.
    let mut handed_back = tokio::spawn(take_back(BufReader::new(r), region.clone()));
    let mut ended = false;
    while !ended {
        let item = tokio::select! {
            item = task.rx.recv() => item,
            r = &mut handed_back => {
                // The client hung up, or handed back a slot it did not hold.
                return match r {
                    Ok(Err(e)) => Err(e),
                    _ => Ok(()),
                };
            }
        };
        let out = match item {
            Some(Ok(out)) => out,
            None => {
                ended = true;
                continue;
            }
            // The client stops reading here; its slots may still be in use, so the region
            // is not pooled again.
            Some(Err(s)) => return write_error(&mut w, &s).await,
        };
        let data = out.payload();
        let slot = match built_in(&out, &region) {
            Some(slot) => Some(slot),
            // Built elsewhere: copied into a free slot, or sent inline if none is free.
            None if data.len() <= region.region.slot_bytes() => match region.take(Slot::Client) {
                Some(slot) => {
                    region.region.write(slot, data)?;
                    Some(slot)
                }
                None => None,
            },
            None => None,
        };
        match slot {
            Some(slot) => {
                let head = out.header(masks_in_body).encode_to_vec();
                w.write_u8(KIND_SLOT).await?;
                write_frame(&mut w, Prefix::U32, &head).await?;
                w.write_u32_le(slot).await?;
                write_len(&mut w, Prefix::U64, data.len()).await?;
                write_masks(&mut w, &out, masks_in_body).await?;
                w.flush().await?;
            }
            None => write_inline(&mut w, &out, masks_in_body).await?,
        }
        task.sent(out);
    }
    w.write_u8(KIND_END).await?;
    w.flush().await?;
    // The client hands each slot back once it has copied it out; with all back, the
    // region can serve another task.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    loop {
        let freed = region.freed.notified();
        if region.all_free() || handed_back.is_finished() || tokio::time::Instant::now() >= deadline {
            break;
        }
        // The reader's end is seen within 10 ms; a slot coming free at once.
        let _ = tokio::time::timeout(Duration::from_millis(10), freed).await;
    }
    let pooled = region.all_free();
    handed_back.abort();
    let _ = handed_back.await;
    if let (true, Some(key)) = (pooled, key) {
        if let Ok(r) = Arc::try_unwrap(region) {
            pool.put(key, r.region);
        }
    }
    w.shutdown().await
}

/// Reads the slots the client hands back, until it hangs up; a slot it does not hold ends
/// the connection.
async fn take_back(mut r: BufReader<tokio::net::unix::OwnedReadHalf>, region: Arc<LocalRegion>) -> std::io::Result<()> {
    loop {
        let slot = match r.read_u32_le().await {
            Ok(slot) => slot,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        if !region.set(slot, Slot::Client, Slot::Free) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("client handed back slot {slot}, which it does not hold"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::wire::Compression;
    use sluice_core::{Batch, Layout};

    fn batch(images: Tensor) -> Batch {
        Batch {
            epoch: 0,
            index: 0,
            keys: vec![0],
            labels: vec![0],
            images,
            layout: Layout::Hwc,
            weights: None,
            boxes: None,
            fields: None,
        }
    }

    #[test]
    fn a_pooled_region_goes_back_only_to_the_job_and_client_it_served() {
        let pool = RegionPool::default();
        let key = (1, 1000, 42);
        let r = pool.take(Some(key), 2, 64).unwrap();
        let id = r.id();
        pool.put(key, r);
        assert_ne!(pool.take(Some((1, 1000, 43)), 2, 64).unwrap().id(), id, "another client of the job got it");
        assert_ne!(pool.take(Some((2, 1000, 42)), 2, 64).unwrap().id(), id, "another job of the client got it");
        assert_ne!(pool.take(None, 2, 64).unwrap().id(), id, "a client of unknown credentials got it");
        assert_eq!(pool.take(Some(key), 2, 64).unwrap().id(), id, "its own client gets it back");
    }

    #[test]
    fn batches_are_built_in_lent_slots_and_unsent_slots_come_back() {
        let region = Arc::new(LocalRegion::new(Region::create(2, 12).unwrap()));
        let source = buffer_source(region.clone());
        assert!(source(DType::F32, 3).is_none(), "f32 batches are built in the loader's memory");
        assert!(source(DType::U8, 13).is_none(), "larger than a slot");

        let mut a = source(DType::U8, 12).unwrap();
        a.as_bytes_mut().fill(7);
        let b = source(DType::U8, 12).unwrap();
        assert!(source(DType::U8, 12).is_none(), "both slots are lent");

        // Sent as built: the slot holds the pixels and now waits for the client.
        let out = Outgoing::new(batch(a), Compression::None);
        let slot = built_in(&out, &region).expect("built in a slot");
        assert_eq!(region.slots.lock()[slot as usize], Slot::Client);
        drop(out);
        assert_eq!(region.slots.lock()[slot as usize], Slot::Client, "a sent slot stays with the client");

        // Compressed into other memory: not sent from its slot, which comes free on drop.
        let packed = Outgoing::new(batch(b), Compression::Zstd);
        assert_eq!(built_in(&packed, &region), None);
        drop(packed);
        assert!(source(DType::U8, 12).is_some(), "the unsent slot is free again");
        assert!(region.set(slot, Slot::Client, Slot::Free), "the client hands the sent one back");
    }
}
