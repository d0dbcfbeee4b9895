//! Emulated network storage over any other storage: every read waits its latency (reads
//! in flight overlap their latencies, as on a real network), then its bytes cross one
//! link shared by all reads. The link is a timeline under a mutex: a read reserves
//! `len / bandwidth` seconds starting when both its latency has elapsed and the link is
//! free, then sleeps until its reservation ends.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::{Location, SampleErrorKind};

use super::Storage;

pub struct ThrottledStorage {
    inner: Arc<dyn Storage>,
    latency: Duration,
    bandwidth_bytes_per_s: f64,
    /// When the shared link is next free.
    link_free_at: Mutex<Instant>,
    name: String,
}

impl ThrottledStorage {
    /// `bandwidth_bytes_per_s` that is not a positive finite number means no bandwidth cap.
    pub fn new(inner: Arc<dyn Storage>, latency: Duration, bandwidth_bytes_per_s: f64) -> Self {
        let name = format!("throttled({})", inner.name());
        Self { inner, latency, bandwidth_bytes_per_s, link_free_at: Mutex::new(Instant::now()), name }
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

    /// Books `bytes` on the link no earlier than `ready` and returns when they have crossed it.
    fn reserve(&self, ready: Instant, bytes: usize) -> Instant {
        let transfer = self.transfer_time(bytes);
        // A timeline stays valid whatever a panicking holder was doing.
        let mut free_at = self.link_free_at.lock();
        let start = ready.max(*free_at);
        let end = start.checked_add(transfer).unwrap_or(start);
        *free_at = end;
        end
    }
}

impl Storage for ThrottledStorage {
    fn read(&self, root: &Path, location: &Location, max_bytes: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind> {
        let asked = Instant::now();
        let result = self.inner.read(root, location, max_bytes, buf);
        // Failed reads still pay the round trip, but move no data.
        let bytes = if result.is_ok() { buf.len() } else { 0 };
        let ready = asked.checked_add(self.latency).unwrap_or(asked);
        let done = if bytes > 0 { self.reserve(ready, bytes) } else { ready };
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
        result
    }

    fn name(&self) -> &str {
        &self.name
    }
}
