//! A job's Python `map` ops on a worker: the worker is Rust and links no Python, so each
//! `{op = "map", fn = "module:qualname"}` of a spec becomes a [`UserOp`] that hands the
//! sample to a Python child process running `python/sluice/map_server.py` (embedded here,
//! run with `--python`'s interpreter as `python -c SOURCE module:qualname`). The child
//! inherits the worker's environment, so `PYTHONPATH` finds the module; never the worker's
//! current folder (`PYTHONSAFEPATH`, and the server drops it from `sys.path` before it
//! imports anything). Which modules a job may name is the operator's (`user_code`).
//!
//! Children belong to their job: its ops are registered only while its loader is built
//! ([`JobMaps`]), so they live in the job's plan and end with the job's loader (evicted
//! when idle or for room), their children with them. All jobs' children share the
//! worker's [`ChildPool`], which caps how many run at once (`--max-python-children`):
//! past it an idle child of another job is ended to make room, else the call waits for
//! one (at most its timeout). A pipeline thread takes an idle child of its op or starts
//! one, so a job has as many as its threads ran the op at once.
//!
//! A child that dies (killed, crashed, out of memory) is reaped and the sample retried on a
//! fresh one, up to [`TRIES`] times; then the sample fails naming the op, and `on_error`
//! decides. A call (or the import) that runs past the op's `timeout_ms` is killed by the
//! pool's watchdog and fails the sample at once, naming the function and the sample.
//! Whatever the function raises is the sample's error, with the in-process op's message.
//! The op runs inside the plan like any op, so its time is the `map` op's in stats,
//! metrics and traces. Where the source has masks, each request carries the sample's mask
//! too and the reply the mask the function left ([`UserOp::apply_masked`]); the protocol
//! is described in `map_server.py`'s docstring.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use sluice_core::{Mask, OpSpec, PipelineSpec};
use sluice_pipeline::{register_user_op, unregister_user_op, user_op, ImageRef, SampleInfo, UserOp, UserOpError};

/// The child's program (see its docstring for the protocol).
const SERVER_SOURCE: &str = include_str!("../../../../python/sluice/map_server.py");

/// Attempts at one sample, each on a fresh child after the one before died.
pub const TRIES: usize = 3;

/// How often the watchdog looks for calls past their deadline.
const WATCH_EVERY: Duration = Duration::from_millis(20);

const READY: u32 = 0;
const IMAGE: u32 = 1;
const FAILED: u32 = 2;
/// `key u64, label i64, epoch u64, seed u64, width u32, height u32, mask u32`.
const REQUEST_BYTES: usize = 44;
/// `status u32, a u32, b u32`.
const REPLY_BYTES: usize = 12;
/// Longest error message read from a child (a longer length is a broken child).
const MAX_MESSAGE: u32 = 1 << 20;

/// Why a child could not serve a sample. `Gone` is retried on a fresh child.
#[derive(Debug, thiserror::Error)]
enum ChildError {
    #[error("cannot start `{python}`: {source} (set the worker's --python)")]
    Start { python: String, source: std::io::Error },
    /// The function cannot be imported: every child would say the same.
    #[error("{0}")]
    Import(String),
    #[error("the Python process (pid {pid}) {what}: {source}; {status}")]
    Gone { pid: u32, what: &'static str, source: std::io::Error, status: String },
    /// The watchdog killed it: the call (or the import, `starting`) ran past the timeout.
    #[error("the Python process (pid {pid}) ran past the op's timeout_ms ({ms} ms) and was killed")]
    TimedOut { pid: u32, ms: u128, starting: bool },
    #[error(
        "the Python process (pid {pid}) answered status {status}, not a reply (is its map_server.py another version?)"
    )]
    Protocol { pid: u32, status: u32 },
    /// Checked before the pixels are read: the child is dropped, its pipe unread.
    #[error("it returned a {w}x{h} image; an image needs 1..={limit} pixels (limits.max_pixels)")]
    TooLarge { w: u32, h: u32, limit: u64 },
    #[error("this worker runs its most Python processes ({max}, --max-python-children), all busy for {waited_ms} ms")]
    Full { max: usize, waited_ms: u128 },
}

/// A child's answer to a sample: the image's `(width, height)` and, for a sample with a
/// mask, the mask of that size the function left.
type Served = ((u32, u32), Option<Vec<u8>>);

/// The calls running now, by child pid, and the children the watchdog killed for running
/// past their deadline. A pid is only here between [`Watch::begin`] and [`Watch::end`],
/// which its owner calls before it reaps the child, so the watchdog never signals a pid
/// that was reaped (and could be another process's).
#[derive(Default)]
struct Watch {
    calls: HashMap<u32, Instant>,
    killed: HashSet<u32>,
}

/// The worker's Python children: how many are alive, the idle ones of every job's ops,
/// and the watchdog that kills a call past its deadline.
pub struct ChildPool {
    max: usize,
    state: Mutex<PoolState>,
    /// Signalled when a child goes idle or ends.
    freed: Condvar,
    watch: Mutex<Watch>,
    next_op: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    live: usize,
    /// Idle children, oldest first, each with the id of the op it imported.
    idle: VecDeque<(u64, MapChild)>,
}

impl ChildPool {
    /// A pool of at most `max` children (at least one), with its watchdog thread (which
    /// ends when the pool does).
    pub fn new(max: usize) -> std::io::Result<Arc<Self>> {
        let pool = Arc::new(Self {
            max: max.max(1),
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
            watch: Mutex::new(Watch::default()),
            next_op: AtomicU64::new(1),
        });
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new().name("python-map-watchdog".into()).spawn(move || watchdog(&weak))?;
        Ok(pool)
    }

    /// Children alive now, busy or idle.
    pub fn live(&self) -> usize {
        self.state.lock().live
    }

    fn begin(&self, pid: u32, timeout: Duration) {
        self.watch.lock().calls.insert(pid, Instant::now() + timeout);
    }

    /// Ends `pid`'s call: whether the watchdog killed it.
    fn end(&self, pid: u32) -> bool {
        let mut w = self.watch.lock();
        w.calls.remove(&pid);
        w.killed.remove(&pid)
    }

    /// An idle child of op `op`, or a slot to start one in: past the cap, an idle child of
    /// another op is ended first, else this waits up to `wait` for one to go idle or end.
    fn lease(self: &Arc<Self>, op: u64, wait: Duration) -> Result<Lease, ChildError> {
        let t0 = Instant::now();
        let mut state = self.state.lock();
        loop {
            if let Some(i) = state.idle.iter().rposition(|(id, _)| *id == op) {
                if let Some((_, child)) = state.idle.remove(i) {
                    return Ok(Lease::Idle(child));
                }
            }
            if state.live < self.max {
                state.live += 1;
                return Ok(Lease::Slot(Slot(self.clone())));
            }
            if let Some((_, other)) = state.idle.pop_front() {
                // Ended outside the lock (its slot takes it); then look again.
                drop(state);
                tracing::debug!(max = self.max, "at --max-python-children: ending another job's idle Python process");
                drop(other);
                state = self.state.lock();
                continue;
            }
            let left = wait.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Err(ChildError::Full { max: self.max, waited_ms: t0.elapsed().as_millis() });
            }
            let _ = self.freed.wait_for(&mut state, left);
        }
    }

    fn put(&self, op: u64, child: MapChild) {
        self.state.lock().idle.push_back((op, child));
        self.freed.notify_one();
    }

    /// Ends op `op`'s idle children (its job ended).
    fn forget(&self, op: u64) {
        let mut state = self.state.lock();
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = state.idle.drain(..).partition(|(id, _)| *id == op);
        state.idle = rest;
        drop(state);
        drop(mine);
    }
}

/// Kills the children whose call ran past its deadline, until the pool is gone.
fn watchdog(pool: &Weak<ChildPool>) {
    loop {
        std::thread::sleep(WATCH_EVERY);
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        let mut w = pool.watch.lock();
        let overdue: Vec<u32> = w.calls.iter().filter(|(_, deadline)| **deadline <= now).map(|(pid, _)| *pid).collect();
        for pid in overdue {
            w.calls.remove(&pid);
            let Ok(raw) = libc::pid_t::try_from(pid) else { continue };
            // SAFETY: kill(2) on a child of ours that its owner has not reaped: it is in
            // `calls` until the owner's `end`, which comes before any wait.
            unsafe { libc::kill(raw, libc::SIGKILL) };
            w.killed.insert(pid);
            tracing::warn!(pid, "a Python map call ran past its timeout; killed its process");
        }
    }
}

/// A place for one live child in the pool; given back when dropped.
struct Slot(Arc<ChildPool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.state.lock().live -= 1;
        self.0.freed.notify_one();
    }
}

enum Lease {
    Idle(MapChild),
    Slot(Slot),
}

/// One `map_server.py` process.
struct MapChild {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    timeout: Duration,
    /// Its place in the pool, given back after the process is reaped (fields drop after
    /// [`Drop::drop`]).
    slot: Slot,
}

impl MapChild {
    fn start(python: &Path, name: &str, timeout: Duration, slot: Slot) -> Result<Self, ChildError> {
        let mut child = Command::new(python)
            .arg("-c")
            .arg(SERVER_SOURCE)
            .arg(name)
            // Python 3.11+ leaves the working folder off `sys.path`; the server drops it
            // itself on older ones.
            .env("PYTHONSAFEPATH", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| ChildError::Start { python: python.display().to_string(), source })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ChildError::Start {
                python: python.display().to_string(),
                source: std::io::Error::other("no pipes to the child"),
            });
        };
        let mut c = Self {
            child,
            stdin: BufWriter::with_capacity(1 << 16, stdin),
            stdout: BufReader::new(stdout),
            timeout,
            slot,
        };
        // Importing the module may hang too.
        c.slot.0.begin(c.child.id(), timeout);
        let reply = c.read_reply().map_err(|e| match e {
            ChildError::TimedOut { pid, ms, .. } => ChildError::TimedOut { pid, ms, starting: true },
            e => e,
        });
        if c.slot.0.end(c.child.id()) {
            return Err(ChildError::TimedOut { pid: c.child.id(), ms: timeout.as_millis(), starting: true });
        }
        match reply? {
            (READY, _, _) => {
                tracing::debug!(pid = c.child.id(), op = name, "Python map process started");
                Ok(c)
            }
            (FAILED, len, _) => Err(ChildError::Import(c.read_message(len)?)),
            (status, _, _) => Err(ChildError::Protocol { pid: c.child.id(), status }),
        }
    }

    /// What became of a child whose pipe broke: timed out (the watchdog killed it), or
    /// gone; either way killed (if alive) and reaped.
    fn gone(&mut self, what: &'static str, source: std::io::Error) -> ChildError {
        let pid = self.child.id();
        let killed = self.slot.0.end(pid);
        let _ = self.child.kill();
        let status = match self.child.wait() {
            Ok(s) => format!("it {s}"),
            Err(e) => format!("its exit is unknown ({e})"),
        };
        if killed {
            return ChildError::TimedOut { pid, ms: self.timeout.as_millis(), starting: false };
        }
        ChildError::Gone { pid, what, source, status }
    }

    fn read_reply(&mut self) -> Result<(u32, u32, u32), ChildError> {
        let mut head = [0u8; REPLY_BYTES];
        if let Err(e) = self.stdout.read_exact(&mut head) {
            return Err(self.gone("closed its pipe", e));
        }
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        Ok((word(0), word(4), word(8)))
    }

    fn read_message(&mut self, len: u32) -> Result<String, ChildError> {
        if len > MAX_MESSAGE {
            return Err(ChildError::Protocol { pid: self.child.id(), status: FAILED });
        }
        let mut text = vec![0u8; len as usize];
        if let Err(e) = self.stdout.read_exact(&mut text) {
            return Err(self.gone("closed its pipe", e));
        }
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    /// Runs the function on one sample (and its mask, if it has one) within the timeout:
    /// the new size and the mask that goes with it, or the function's error.
    fn call(
        &mut self,
        image: ImageRef<'_>,
        mask: Option<&Mask>,
        sample: &SampleInfo,
        out: &mut Vec<u8>,
    ) -> Result<Result<Served, String>, ChildError> {
        let pid = self.child.id();
        self.slot.0.begin(pid, self.timeout);
        let result = self.exchange(image, mask, sample, out);
        // Killed just as it answered: the answer came late, and the process is gone.
        if self.slot.0.end(pid) {
            return Err(ChildError::TimedOut { pid, ms: self.timeout.as_millis(), starting: false });
        }
        result
    }

    fn exchange(
        &mut self,
        image: ImageRef<'_>,
        mask: Option<&Mask>,
        sample: &SampleInfo,
        out: &mut Vec<u8>,
    ) -> Result<Result<Served, String>, ChildError> {
        let mut head = [0u8; REQUEST_BYTES];
        head[0..8].copy_from_slice(&sample.key.to_le_bytes());
        head[8..16].copy_from_slice(&sample.label.to_le_bytes());
        head[16..24].copy_from_slice(&sample.epoch.to_le_bytes());
        head[24..32].copy_from_slice(&sample.seed.to_le_bytes());
        head[32..36].copy_from_slice(&image.width.to_le_bytes());
        head[36..40].copy_from_slice(&image.height.to_le_bytes());
        head[40..44].copy_from_slice(&u32::from(mask.is_some()).to_le_bytes());
        let mut sent = self.stdin.write_all(&head).and_then(|()| self.stdin.write_all(image.pixels));
        if let Some(m) = mask {
            // The plan checked that it has the image's size.
            sent = sent.and_then(|()| self.stdin.write_all(&m.data));
        }
        if let Err(e) = sent.and_then(|()| self.stdin.flush()) {
            return Err(self.gone("took no request", e));
        }
        match self.read_reply()? {
            (IMAGE, w, h) => {
                let limit = sample.max_pixels;
                if w == 0 || h == 0 || u64::from(w) * u64::from(h) > limit {
                    return Err(ChildError::TooLarge { w, h, limit });
                }
                out.clear();
                out.resize(w as usize * h as usize * 3, 0);
                if let Err(e) = self.stdout.read_exact(out) {
                    return Err(self.gone("closed its pipe", e));
                }
                let mut new_mask = None;
                if mask.is_some() {
                    let mut data = vec![0u8; w as usize * h as usize];
                    if let Err(e) = self.stdout.read_exact(&mut data) {
                        return Err(self.gone("closed its pipe", e));
                    }
                    new_mask = Some(data);
                }
                Ok(Ok(((w, h), new_mask)))
            }
            (FAILED, len, _) => Ok(Err(self.read_message(len)?)),
            (status, _, _) => Err(ChildError::Protocol { pid: self.child.id(), status }),
        }
    }
}

impl Drop for MapChild {
    fn drop(&mut self) {
        // Closing stdin ends the server; kill in case the function is still running. Out
        // of the watchdog's table first, so that it never signals a reaped pid.
        let _ = self.slot.0.end(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `map` op whose function runs in Python children of this worker, for one job.
pub struct PythonMapOp {
    name: String,
    python: PathBuf,
    timeout: Duration,
    pool: Arc<ChildPool>,
    /// This op's children in the pool.
    id: u64,
    /// Set once the function failed to import: every sample fails with it at once.
    import_error: OnceLock<String>,
}

impl PythonMapOp {
    pub fn new(name: &str, python: &Path, timeout: Duration, pool: &Arc<ChildPool>) -> Self {
        Self {
            name: name.to_owned(),
            python: python.to_owned(),
            timeout,
            pool: pool.clone(),
            id: pool.next_op.fetch_add(1, Ordering::Relaxed),
            import_error: OnceLock::new(),
        }
    }

    fn child(&self) -> Result<MapChild, ChildError> {
        match self.pool.lease(self.id, self.timeout)? {
            Lease::Idle(child) => Ok(child),
            Lease::Slot(slot) => MapChild::start(&self.python, &self.name, self.timeout, slot),
        }
    }
}

impl Drop for PythonMapOp {
    fn drop(&mut self) {
        self.pool.forget(self.id);
    }
}

impl UserOp for PythonMapOp {
    fn apply(&self, image: ImageRef<'_>, sample: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
        self.serve(image, None, sample, out)
    }

    fn apply_masked(
        &self,
        pixels: &mut Vec<u8>,
        (width, height): (u32, u32),
        mask: &mut Mask,
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        let n = width as usize * height as usize * 3;
        let image = ImageRef { pixels: pixels.get(..n).unwrap_or(pixels), width, height };
        let size = self.serve(image, Some(mask), sample, spare)?;
        std::mem::swap(pixels, spare);
        Ok(size)
    }
}

impl PythonMapOp {
    /// One sample through a child, retried on a fresh child when one dies; the image goes
    /// to `out`, the mask the function left (if the sample has one) to `mask`.
    fn serve(
        &self,
        image: ImageRef<'_>,
        mask: Option<&mut Mask>,
        sample: &SampleInfo,
        out: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        let mut last = None;
        for attempt in 1..=TRIES {
            if let Some(e) = self.import_error.get() {
                return Err(UserOpError(e.clone()));
            }
            let result = self.child().and_then(|mut child| {
                let result = child.call(image, mask.as_deref(), sample, out)?;
                self.pool.put(self.id, child);
                Ok(result)
            });
            match result {
                Ok(Ok(((width, height), new_mask))) => {
                    if let (Some(m), Some(data)) = (mask, new_mask) {
                        *m = Mask { width, height, data };
                    }
                    return Ok((width, height));
                }
                Ok(Err(message)) => return Err(UserOpError(message)),
                Err(ChildError::Import(message)) => {
                    tracing::warn!(op = %self.name, python = %self.python.display(), %message, "cannot import the map function");
                    let _ = self.import_error.set(message.clone());
                    return Err(UserOpError(message));
                }
                Err(ChildError::TimedOut { pid, ms, starting: true }) => {
                    // Every child would hang the same way: the job's samples fail at once.
                    let message = format!(
                        "importing `{}` ran past the op's timeout_ms ({ms} ms); its Python process (pid {pid}) was killed",
                        self.name
                    );
                    tracing::warn!(op = %self.name, %message, "the map function's import hung");
                    let _ = self.import_error.set(message.clone());
                    return Err(UserOpError(message));
                }
                Err(ChildError::TimedOut { pid, ms, starting: false }) => {
                    tracing::warn!(op = %self.name, key = sample.key, pid, ms, "a Python map call hung; killed it");
                    return Err(UserOpError(format!(
                        "`{}` ran past the op's timeout_ms ({ms} ms) on sample {}; its Python process (pid {pid}) was killed",
                        self.name, sample.key
                    )));
                }
                Err(e @ ChildError::Gone { .. }) => {
                    tracing::warn!(op = %self.name, key = sample.key, attempt, error = %e, "Python map process died; retrying the sample on a new one");
                    last = Some(e);
                }
                Err(e) => return Err(UserOpError(e.to_string())),
            }
        }
        let last = last.map_or_else(String::new, |e| format!(" (last: {e})"));
        Err(UserOpError(format!("the Python process running it died {TRIES} times on this sample{last}")))
    }
}

/// One job's `map` ops, registered while its loader is built (the plan takes each op it
/// names when it is compiled) and taken out of the registry when this is dropped: each op
/// then lives in its job's plan alone, and ends (its children with it) when the job's
/// loader does. The worker builds one job's loader at a time, so no other job sees them.
pub struct JobMaps {
    names: Vec<String>,
}

impl JobMaps {
    /// Registers a [`PythonMapOp`] for each `map` op of `spec`, unless a Rust program
    /// embedding the worker registered an op under that name itself.
    pub fn register(spec: &PipelineSpec, python: &Path, pool: &Arc<ChildPool>) -> Self {
        let mut names: Vec<String> = Vec::new();
        for op in &spec.ops {
            let OpSpec::Map { func, timeout_ms } = op else { continue };
            if names.contains(func) || user_op(func).is_some() {
                continue;
            }
            let timeout = Duration::from_millis(*timeout_ms);
            register_user_op(func, Arc::new(PythonMapOp::new(func, python, timeout, pool)));
            names.push(func.clone());
        }
        Self { names }
    }
}

impl Drop for JobMaps {
    fn drop(&mut self) {
        for name in &self.names {
            unregister_user_op(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's venv Python (it has numpy), else `python3`.
    fn python() -> PathBuf {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    }

    #[test]
    fn an_image_over_the_pixel_limit_is_refused_before_it_is_read() {
        // The child imports the function from the service tests' module.
        let fns = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python");
        std::env::set_var("PYTHONPATH", &fns);
        let pool = ChildPool::new(4).unwrap();
        let op = PythonMapOp::new("service_map_fns:grow", &python(), Duration::from_secs(30), &pool);
        let pixels = vec![7u8; 4 * 4 * 3];
        let image = ImageRef { pixels: &pixels, width: 4, height: 4 };
        // The function returns 16x16 (256 pixels) where the limit is 100.
        let sample = SampleInfo { key: 1, label: 0, epoch: 0, seed: 0, max_pixels: 100 };
        let mut out = Vec::new();
        let err = op.apply(image, &sample, &mut out).expect_err("a 16x16 image passed a 100-pixel limit");
        assert!(err.0.contains("16x16") && err.0.contains("1..=100"), "{}", err.0);
        assert!(out.is_empty(), "the pixels were read: {} bytes", out.len());
        assert!(pool.state.lock().idle.is_empty(), "a child with an unread reply went back to the pool");
        assert_eq!(pool.live(), 0, "the child with an unread reply is still alive");
        // Within the limit the same function's image comes back whole.
        let sample = SampleInfo { max_pixels: 256, ..sample };
        assert_eq!(op.apply(image, &sample, &mut out).map_err(|e| e.0), Ok((16, 16)));
        assert_eq!(out.len(), 16 * 16 * 3);
    }
}
