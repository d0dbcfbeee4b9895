//! A pool of native worker threads whose size can change while it runs: the knob the
//! autoscaler turns. Jobs come from one shared queue; each worker owns reusable scratch
//! state (decoder handles, buffers) so the hot path allocates nothing per sample.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use sluice_codec::Scratch;

/// What a worker thread keeps between jobs.
#[derive(Default)]
pub struct WorkerLocal {
    pub scratch: Scratch,
    pub read_buf: Vec<u8>,
    /// This thread's trace events since its last job ended.
    pub trace: crate::trace::ThreadBuf,
}

pub type Job = Box<dyn FnOnce(&mut WorkerLocal) + Send + 'static>;

/// How often an idle worker wakes to see whether the pool has shrunk.
const IDLE_CHECK: Duration = Duration::from_millis(50);

struct PoolInner {
    /// Threads the pool should have.
    target: AtomicUsize,
    /// Threads alive (or about to start).
    live: AtomicUsize,
    rx: Receiver<Job>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

/// Cloning gives another handle to the same pool. The threads stop when the last handle
/// is dropped.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
    tx: Sender<Job>,
    _shutdown: Arc<Shutdown>,
}

/// Stops the workers when the last pool handle goes away.
struct Shutdown {
    inner: Arc<PoolInner>,
}

impl Drop for Shutdown {
    fn drop(&mut self) {
        self.inner.target.store(0, Ordering::SeqCst);
        let handles = std::mem::take(&mut *self.inner.handles.lock());
        for h in handles {
            // Workers catch their jobs' panics, so a join error is not expected; nothing to do.
            let _ = h.join();
        }
    }
}

impl Pool {
    pub fn new(threads: usize) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(PoolInner {
            target: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            rx,
            handles: Mutex::new(Vec::new()),
        });
        let pool = Self { tx, _shutdown: Arc::new(Shutdown { inner: inner.clone() }), inner };
        pool.set_threads(threads);
        pool
    }

    pub fn submit(&self, job: Job) {
        // The receiver lives in `inner`, which this handle keeps alive: send cannot fail.
        let _ = self.tx.send(job);
    }

    /// The number of threads the pool is running (or converging to).
    pub fn threads(&self) -> usize {
        self.inner.target.load(Ordering::SeqCst)
    }

    /// Grows at once; shrinks as workers finish their current job (idle ones within ~50 ms).
    pub fn set_threads(&self, threads: usize) {
        let threads = threads.max(1);
        let mut handles = self.inner.handles.lock();
        self.inner.target.store(threads, Ordering::SeqCst);
        handles.retain(|h| !h.is_finished());
        while self.inner.live.load(Ordering::SeqCst) < threads {
            self.inner.live.fetch_add(1, Ordering::SeqCst);
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new().name("sluice-worker".into()).spawn(move || worker_loop(&inner));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    self.inner.live.fetch_sub(1, Ordering::SeqCst);
                    tracing::error!("cannot start a worker thread: {e}");
                    break;
                }
            }
        }
    }

    /// Threads currently alive (lags `threads()` briefly after a shrink).
    pub fn live_threads(&self) -> usize {
        self.inner.live.load(Ordering::SeqCst)
    }
}

fn worker_loop(inner: &PoolInner) {
    let mut local = WorkerLocal::default();
    loop {
        let live = inner.live.load(Ordering::SeqCst);
        if live > inner.target.load(Ordering::SeqCst) {
            if inner.live.compare_exchange(live, live - 1, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                return;
            }
            continue;
        }
        match inner.rx.recv_timeout(IDLE_CHECK) {
            Ok(job) => {
                // A bug in one job must not take the thread (and the jobs queued behind it)
                // down; the job itself tells its consumer what failed (see `ChunkJob`).
                if std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut local))).is_err() {
                    tracing::error!("a worker job panicked; the thread goes on with fresh scratch state");
                    local = WorkerLocal::default();
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                inner.live.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Instant;

    fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_panicking_job_leaves_its_thread_running_the_next_jobs() {
        let pool = Pool::new(1);
        pool.submit(Box::new(|_| panic!("a bug in a job")));
        let (tx, rx) = crossbeam_channel::unbounded();
        pool.submit(Box::new(move |_| {
            let _ = tx.send(7);
        }));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(7), "the pool's only thread died with the job");
        assert_eq!(pool.live_threads(), 1);
    }

    #[test]
    fn runs_every_job_and_resizes_while_running() {
        let pool = Pool::new(1);
        let (tx, rx) = crossbeam_channel::unbounded();
        for i in 0..50 {
            let tx = tx.clone();
            pool.submit(Box::new(move |_| {
                std::thread::sleep(Duration::from_millis(2));
                let _ = tx.send((i, std::thread::current().id()));
            }));
        }
        pool.set_threads(4);
        assert_eq!(pool.threads(), 4);
        let got: Vec<_> = (0..50).map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap()).collect();
        let ids: HashSet<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(ids.len(), 50);
        let threads: HashSet<_> = got.iter().map(|g| g.1).collect();
        assert!(threads.len() > 1, "growing the pool added no parallelism");

        pool.set_threads(1);
        assert!(wait_until(|| pool.live_threads() == 1), "pool did not shrink");
        let tx2 = tx.clone();
        pool.submit(Box::new(move |_| {
            let _ = tx2.send((99, std::thread::current().id()));
        }));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap().0, 99);
    }
}
