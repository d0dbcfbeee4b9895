//! Which learners of a group are alive. Each loader keeps a key of its own in the broker
//! (`<stream>:sluice-alive:<group>:<consumer>`) set with a time to live of
//! `claim_idle_ms`, refreshed by a background thread four times per period, whatever
//! the trainer does between batches. A learner whose key has expired (its process died,
//! or it was closed) is dead: only its pending entries may be claimed by another learner.
//! A slow learner, however long its steps, keeps what it holds.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::broker::Broker;
use crate::error::StreamError;

/// Beats per time to live: a beat may be late by three quarters of the period (a stalled
/// thread, a slow broker) before the learner looks dead.
const BEATS_PER_TTL: u32 = 4;

/// The key that says `consumer` of `group` on `stream` is alive.
pub fn alive_key(stream: &str, group: &str, consumer: &str) -> String {
    format!("{stream}:sluice-alive:{group}:{consumer}")
}

/// This learner's liveness key, kept alive by a background thread until dropped.
pub struct Heartbeat {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    last_beat: Arc<Mutex<Beat>>,
    ttl: Duration,
}

/// When the key was last set, and whether it had expired by then (the process stalled,
/// the broker was unreachable) without the loader having been told.
struct Beat {
    at: Instant,
    lapsed: bool,
}

impl Heartbeat {
    /// Sets the key once (so the learner is alive before it reads anything; waiting out
    /// a broker restart for up to `reconnect`), then refreshes it in the background. The
    /// key is deleted when the heartbeat is dropped.
    pub fn start(url: &str, key: String, ttl: Duration, reconnect: Duration) -> Result<Self, StreamError> {
        let mut broker = Broker::open(url, reconnect)?;
        broker.set_alive(&key, ttl)?;
        let every = ttl / BEATS_PER_TTL;
        // A beat gives up soon (the next one tries again), so that a close does not wait
        // long on a broker that is down.
        let mut broker = Broker::open(url, every.min(Duration::from_secs(1)))?;
        let last_beat = Arc::new(Mutex::new(Beat { at: Instant::now(), lapsed: false }));
        let last = Arc::clone(&last_beat);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("stream-heartbeat".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    match broker.set_alive(&key, ttl) {
                        Ok(()) => {
                            let mut beat = last.lock();
                            beat.lapsed |= beat.at.elapsed() >= ttl;
                            beat.at = Instant::now();
                        }
                        Err(e) => tracing::warn!(error = %e, key, "cannot refresh this learner's liveness key"),
                    }
                }
                if let Err(e) = broker.del(&key) {
                    tracing::debug!(error = %e, key, "cannot delete this learner's liveness key");
                }
            })
            .map_err(|source| StreamError::Thread { what: "the liveness heartbeat", source })?;
        Ok(Self { stop: Some(stop), thread: Some(thread), last_beat, ttl })
    }

    /// Whether the key may have expired since it was last set (other learners may have
    /// taken this one for dead and claimed what it holds); true once per lapse.
    pub fn take_lapse(&self) -> bool {
        let mut beat = self.last_beat.lock();
        let lapsed = beat.lapsed || beat.at.elapsed() >= self.ttl;
        if lapsed {
            // Told: the next report needs another whole period without a beat.
            beat.lapsed = false;
            beat.at = Instant::now();
        }
        lapsed
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
