//! Reads of object storage started before a worker thread asks for them. The loader knows
//! the samples of every batch it has submitted (up to `prefetch` batches ahead of the
//! consumer), so it names them here ([`super::Storage::read_ahead`]) and their `GET`s run
//! on the object-storage runtime while the worker threads decode earlier samples: the
//! link's latency is paid by many requests at once instead of by one thread per sample.
//!
//! The window is bounded: at most `SLUICE_OBJECT_READ_AHEAD` objects (default
//! [`DEFAULT_OBJECTS`]; 0 turns read-ahead off) and `SLUICE_OBJECT_READ_AHEAD_MB` bytes
//! (default [`DEFAULT_MB`]) are held or in flight. A read that finds its object here
//! waits for it, and one that does not (the window was full) reads it itself: the
//! read-ahead is the same request, with the same retries, size checks and errors (which
//! the sample gets), only started sooner. Objects named
//! but never read (the sample was served by a cache that filled meanwhile, or the epoch
//! was dropped) are given up once [`STALE_AFTER`] windows of newer names have passed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use sluice_core::SampleErrorKind;
use tokio::task::JoinHandle;

/// Objects held or in flight at once, unless `SLUICE_OBJECT_READ_AHEAD` says otherwise.
pub const DEFAULT_OBJECTS: usize = 512;
/// Megabytes held or in flight at once, unless `SLUICE_OBJECT_READ_AHEAD_MB` says otherwise.
pub const DEFAULT_MB: u64 = 256;
/// An object named this many windows before the newest name and still unread is given up.
pub const STALE_AFTER: u64 = 4;

/// What one read-ahead is for: an object, or a byte range of one (a tar member).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Wanted {
    pub url: super::ObjectUrl,
    /// Offset and length.
    pub range: Option<(u64, u64)>,
}

struct Pending {
    task: JoinHandle<Result<Bytes, SampleErrorKind>>,
    /// When it was named, counted in names.
    seq: u64,
    /// The bytes it holds (or will): its size as enumerated.
    bytes: u64,
}

#[derive(Default)]
struct Window {
    pending: HashMap<Wanted, Pending>,
    next_seq: u64,
    bytes: u64,
}

/// Counters of the read-ahead, for `stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadAheadStats {
    /// Reads served by an object read ahead.
    pub hits: u64,
    /// Objects read ahead and given up unread.
    pub dropped: u64,
    /// Reads served by a read-ahead that failed: the sample failed with its error.
    pub failed: u64,
}

/// The window of reads started ahead; see the module docs.
pub(crate) struct ReadAhead {
    max_objects: usize,
    max_bytes: u64,
    window: Mutex<Window>,
    hits: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl ReadAhead {
    pub fn new(max_objects: usize, max_bytes: u64) -> Self {
        Self {
            max_objects,
            max_bytes,
            window: Mutex::new(Window::default()),
            hits: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// The window the environment asks for.
    pub fn from_env() -> Self {
        let objects = super::object::env_number("SLUICE_OBJECT_READ_AHEAD", DEFAULT_OBJECTS);
        let mb = super::object::env_number("SLUICE_OBJECT_READ_AHEAD_MB", DEFAULT_MB);
        Self::new(objects, mb.saturating_mul(1 << 20))
    }

    pub fn is_off(&self) -> bool {
        self.max_objects == 0
    }

    /// Starts `start(wanted)` for each of `wanted` (with its size) not already held, in
    /// order, while the window has room; gives up the stale ones first.
    pub fn name(
        &self,
        wanted: impl IntoIterator<Item = (Wanted, u64)>,
        mut start: impl FnMut(&Wanted) -> JoinHandle<Result<Bytes, SampleErrorKind>>,
    ) {
        let mut w = self.window.lock();
        let horizon = w.next_seq.saturating_sub(STALE_AFTER.saturating_mul(self.max_objects as u64));
        let stale: Vec<Wanted> = w.pending.iter().filter(|(_, p)| p.seq < horizon).map(|(k, _)| k.clone()).collect();
        for k in stale {
            if let Some(p) = w.pending.remove(&k) {
                p.task.abort();
                w.bytes -= p.bytes;
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (k, bytes) in wanted {
            w.next_seq += 1;
            if w.pending.contains_key(&k) {
                continue;
            }
            if w.pending.len() >= self.max_objects || w.bytes.saturating_add(bytes) > self.max_bytes {
                continue;
            }
            let task = start(&k);
            w.bytes += bytes;
            let seq = w.next_seq;
            w.pending.insert(k, Pending { task, seq, bytes });
        }
    }

    /// The read-ahead of `wanted`, if one was started: its task, to wait for.
    pub fn take(&self, wanted: &Wanted) -> Option<JoinHandle<Result<Bytes, SampleErrorKind>>> {
        let mut w = self.window.lock();
        let p = w.pending.remove(wanted)?;
        w.bytes -= p.bytes;
        Some(p.task)
    }

    /// A read served by its read-ahead, whole (`ok`) or with its error.
    pub fn served(&self, ok: bool) {
        let counter = if ok { &self.hits } else { &self.failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ReadAheadStats {
        ReadAheadStats {
            hits: self.hits.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(i: u64) -> Wanted {
        let url = super::super::ObjectUrl::parse(std::path::Path::new(&format!("s3://b/{i}"))).unwrap();
        Wanted { url, range: None }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn the_window_holds_at_most_its_objects_and_bytes_and_gives_up_stale_names() {
        let rt = runtime();
        let ra = ReadAhead::new(4, 1000);
        let started = std::cell::Cell::new(0);
        let start = |_: &Wanted| {
            started.set(started.get() + 1);
            rt.spawn(async { Ok(Bytes::from_static(b"x")) })
        };
        // Six named, four fit.
        ra.name((0..6).map(|i| (wanted(i), 10)), start);
        assert_eq!(started.get(), 4);
        assert!(ra.take(&wanted(4)).is_none(), "the fifth did not fit the window");
        let got = rt.block_on(ra.take(&wanted(0)).unwrap()).unwrap().unwrap();
        assert_eq!(&got[..], b"x");
        assert!(ra.take(&wanted(0)).is_none(), "taken once");
        // Bytes bound the window too: one of 995 bytes does not fit beside three of 10.
        ra.name([(wanted(10), 995)], |_| panic!("must not start: over the byte budget"));
        // Names move on (one more starts, filling the window again); the three left unread
        // are given up once STALE_AFTER windows of newer names have passed, the newer not.
        let ready = |_: &Wanted| rt.spawn(async { Ok(Bytes::new()) });
        ra.name((100..100 + STALE_AFTER * 4 + 1).map(|i| (wanted(i), 1)), ready);
        assert_eq!(ra.stats().dropped, 0);
        ra.name((200..204).map(|i| (wanted(i), 1)), ready);
        assert_eq!(ra.stats().dropped, 3);
        assert!(ra.take(&wanted(1)).is_none());
        assert!(ra.take(&wanted(100)).is_some());
        assert!(ra.take(&wanted(200)).is_some(), "started in the room the stale ones left");
    }

    #[test]
    fn off_starts_nothing() {
        let ra = ReadAhead::new(0, 1 << 30);
        assert!(ra.is_off());
        ra.name([(wanted(0), 1)], |_| panic!("read-ahead is off"));
    }
}
