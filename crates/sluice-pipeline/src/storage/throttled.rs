//! Emulated network storage over any other storage: every read waits its latency (reads
//! in flight overlap their latencies, as on a real network), then its bytes cross one
//! link shared by all reads. The link is a timeline: a read reserves `len / bandwidth`
//! seconds starting when both its latency has elapsed and the link is free, then sleeps
//! until its reservation ends.
//!
//! The timeline lives in this process (a mutex), or, when several processes on a machine
//! name the same link file, in that file: 8 bytes (when the link is next free, in
//! nanoseconds of the system clock) updated under an exclusive `flock`, so all learner
//! processes share one bandwidth as they would share one file system.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rustix::fs::{flock, FlockOperation};
use sluice_core::{LocationRef, SampleErrorKind};

use super::Storage;

/// A shared link file that cannot be opened or used.
#[derive(Debug, thiserror::Error)]
#[error("shared storage link {path}: {source}")]
pub struct LinkError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Where the link's timeline is kept.
enum Link {
    /// When the link is next free, for this process alone.
    Local(Mutex<Instant>),
    /// In a file every process on the machine can open.
    Shared { file: File, path: PathBuf },
}

pub struct ThrottledStorage {
    inner: Arc<dyn Storage>,
    latency: Duration,
    bandwidth_bytes_per_s: f64,
    link: Link,
    name: String,
}

impl ThrottledStorage {
    /// `bandwidth_bytes_per_s` that is not a positive finite number means no bandwidth cap.
    pub fn new(inner: Arc<dyn Storage>, latency: Duration, bandwidth_bytes_per_s: f64) -> Self {
        let name = format!("throttled({})", inner.name());
        Self { inner, latency, bandwidth_bytes_per_s, link: Link::Local(Mutex::new(Instant::now())), name }
    }

    /// As [`ThrottledStorage::new`], with the link's timeline in `link_file` (created if
    /// missing): every storage, in any process, that names the same file shares one
    /// bandwidth.
    pub fn shared(
        inner: Arc<dyn Storage>,
        latency: Duration,
        bandwidth_bytes_per_s: f64,
        link_file: &Path,
    ) -> Result<Self, LinkError> {
        let err = |source| LinkError { path: link_file.to_path_buf(), source };
        let file = File::options().read(true).write(true).create(true).truncate(false).open(link_file).map_err(err)?;
        let name = format!("throttled({}, shared)", inner.name());
        let link = Link::Shared { file, path: link_file.to_path_buf() };
        Ok(Self { inner, latency, bandwidth_bytes_per_s, link, name })
    }

    pub fn latency(&self) -> Duration {
        self.latency
    }

    pub fn bandwidth_bytes_per_s(&self) -> f64 {
        self.bandwidth_bytes_per_s
    }

    fn transfer_time(&self, bytes: usize) -> Duration {
        if !(self.bandwidth_bytes_per_s > 0.0 && self.bandwidth_bytes_per_s.is_finite()) {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(bytes as f64 / self.bandwidth_bytes_per_s).unwrap_or(Duration::MAX)
    }

    /// Books `bytes` on the link no earlier than `ready` and returns how long from now
    /// until they have crossed it.
    fn reserve(&self, ready: Instant, bytes: usize) -> Duration {
        let transfer = self.transfer_time(bytes);
        match &self.link {
            Link::Local(free_at) => {
                // A timeline stays valid whatever a panicking holder was doing.
                let mut free_at = free_at.lock();
                let start = ready.max(*free_at);
                let end = start.checked_add(transfer).unwrap_or(start);
                *free_at = end;
                end.saturating_duration_since(Instant::now())
            }
            Link::Shared { file, path } => match reserve_in_file(file, ready, transfer) {
                Ok(wait) => wait,
                Err(e) => {
                    // The emulation degrades to this read's own transfer time; the read
                    // itself is not at fault.
                    tracing::warn!(path = %path.display(), error = %e, "shared storage link unusable");
                    ready.saturating_duration_since(Instant::now()) + transfer
                }
            },
        }
    }
}

/// The file behind the shared link named `name` (a name the spec has checked).
pub fn link_path(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    dir.join(format!("sluice-link-{name}"))
}

/// Nanoseconds of the system clock: the one clock every process on the machine shares.
fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn reserve_in_file(file: &File, ready: Instant, transfer: Duration) -> std::io::Result<Duration> {
    let now = now_ns();
    let ready_ns = now.saturating_add(ready.saturating_duration_since(Instant::now()).as_nanos() as u64);
    flock(file, FlockOperation::LockExclusive)?;
    let booked = (|| -> std::io::Result<u64> {
        let mut word = [0u8; 8];
        // A new (empty) file reads short: the link has never been busy.
        let free_at = match file.read_at(&mut word, 0)? {
            8 => u64::from_le_bytes(word),
            _ => 0,
        };
        let end = ready_ns.max(free_at).saturating_add(transfer.as_nanos() as u64);
        file.write_all_at(&end.to_le_bytes(), 0)?;
        Ok(end)
    })();
    flock(file, FlockOperation::Unlock)?;
    Ok(Duration::from_nanos(booked?.saturating_sub(now_ns())))
}

impl Storage for ThrottledStorage {
    fn read(&self, root: &Path, loc: LocationRef<'_>, max: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind> {
        let asked = Instant::now();
        let result = self.inner.read(root, loc, max, buf);
        // Failed reads still pay the round trip, but move no data.
        let bytes = if result.is_ok() { buf.len() } else { 0 };
        let ready = asked.checked_add(self.latency).unwrap_or(asked);
        let wait = if bytes > 0 { self.reserve(ready, bytes) } else { ready.saturating_duration_since(Instant::now()) };
        std::thread::sleep(wait);
        result
    }

    fn name(&self) -> &str {
        &self.name
    }
}
