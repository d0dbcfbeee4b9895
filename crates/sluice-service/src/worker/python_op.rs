//! A job's Python `map` ops on a worker: the worker is Rust and links no Python, so each
//! `{op = "map", fn = "module:qualname"}` of a spec becomes a [`UserOp`] that hands the
//! sample to a Python child process running `python/sluice/map_server.py` (embedded here,
//! run with `--python`'s interpreter as `python -c SOURCE module:qualname`; the child
//! inherits the worker's environment and folder, so `PYTHONPATH` and the current folder
//! find the module, as they would for `python -m`).
//!
//! Children are a pool: a pipeline thread takes an idle one or starts one, so there are as
//! many as threads ran the op at once. A child that dies (killed, crashed, out of memory)
//! is reaped and the sample retried on a fresh one, up to [`TRIES`] times; then the
//! sample fails naming the op, and `on_error` decides. Whatever the function raises is the
//! sample's error, with the in-process op's message. The op runs inside the plan like any
//! op, so its time is the `map` op's in stats, metrics and traces. Where the source has
//! masks, each request carries the sample's mask too and the reply the mask the function
//! left ([`UserOp::apply_masked`]); the protocol is described in `map_server.py`'s
//! docstring.

use std::collections::HashSet;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sluice_core::{Mask, OpSpec, PipelineSpec};
use sluice_pipeline::{register_user_op, user_op, ImageRef, SampleInfo, UserOp, UserOpError};

/// The child's program (see its docstring for the protocol).
const SERVER_SOURCE: &str = include_str!("../../../../python/sluice/map_server.py");

/// Attempts at one sample, each on a fresh child after the one before died.
pub const TRIES: usize = 3;

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
    #[error(
        "the Python process (pid {pid}) answered status {status}, not a reply (is its map_server.py another version?)"
    )]
    Protocol { pid: u32, status: u32 },
    /// Checked before the pixels are read: the child is dropped, its pipe unread.
    #[error("it returned a {w}x{h} image; an image needs 1..={limit} pixels (limits.max_pixels)")]
    TooLarge { w: u32, h: u32, limit: u64 },
}

/// A child's answer to a sample: the image's `(width, height)` and, for a sample with a
/// mask, the mask of that size the function left.
type Served = ((u32, u32), Option<Vec<u8>>);

/// One `map_server.py` process.
struct MapChild {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl MapChild {
    fn start(python: &Path, name: &str) -> Result<Self, ChildError> {
        let mut child = Command::new(python)
            .arg("-c")
            .arg(SERVER_SOURCE)
            .arg(name)
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
        let mut c = Self { child, stdin: BufWriter::with_capacity(1 << 16, stdin), stdout: BufReader::new(stdout) };
        match c.read_reply()? {
            (READY, _, _) => {
                tracing::debug!(pid = c.child.id(), op = name, "Python map process started");
                Ok(c)
            }
            (FAILED, len, _) => Err(ChildError::Import(c.read_message(len)?)),
            (status, _, _) => Err(ChildError::Protocol { pid: c.child.id(), status }),
        }
    }

    /// What became of a child whose pipe broke: it is killed (if alive) and reaped.
    fn gone(&mut self, what: &'static str, source: std::io::Error) -> ChildError {
        let _ = self.child.kill();
        let status = match self.child.wait() {
            Ok(s) => format!("it {s}"),
            Err(e) => format!("its exit is unknown ({e})"),
        };
        ChildError::Gone { pid: self.child.id(), what, source, status }
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

    /// Runs the function on one sample (and its mask, if it has one): the new size and
    /// the mask that goes with it, or the function's error.
    fn call(
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
        // Closing stdin ends the server; kill in case the function is still running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `map` op whose function runs in Python children of this worker.
pub struct PythonMapOp {
    name: String,
    python: PathBuf,
    idle: Mutex<Vec<MapChild>>,
    /// Set once the function failed to import: every sample fails with it at once.
    import_error: OnceLock<String>,
}

impl PythonMapOp {
    pub fn new(name: &str, python: &Path) -> Self {
        Self {
            name: name.to_owned(),
            python: python.to_owned(),
            idle: Mutex::new(Vec::new()),
            import_error: OnceLock::new(),
        }
    }

    fn child(&self) -> Result<MapChild, ChildError> {
        if let Some(child) = self.idle.lock().pop() {
            return Ok(child);
        }
        MapChild::start(&self.python, &self.name)
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
                self.idle.lock().push(child);
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

/// Names of the ops registered here: the ones a later job may replace (an op a Rust
/// program embedding the worker registered itself is left alone).
fn ours() -> &'static Mutex<HashSet<String>> {
    static OURS: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    OURS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Registers a [`PythonMapOp`] for each `map` op of `spec` (before its loader is built,
/// which takes the op registered then), with a fresh pool of children for this job.
pub fn register_spec_maps(spec: &PipelineSpec, python: &Path) {
    let mut ours = ours().lock();
    for op in &spec.ops {
        let OpSpec::Map { func } = op else { continue };
        if user_op(func).is_some() && !ours.contains(func) {
            continue;
        }
        register_user_op(func, Arc::new(PythonMapOp::new(func, python)));
        ours.insert(func.clone());
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
        let op = PythonMapOp::new("service_map_fns:grow", &python());
        let pixels = vec![7u8; 4 * 4 * 3];
        let image = ImageRef { pixels: &pixels, width: 4, height: 4 };
        // The function returns 16x16 (256 pixels) where the limit is 100.
        let sample = SampleInfo { key: 1, label: 0, epoch: 0, seed: 0, max_pixels: 100 };
        let mut out = Vec::new();
        let err = op.apply(image, &sample, &mut out).expect_err("a 16x16 image passed a 100-pixel limit");
        assert!(err.0.contains("16x16") && err.0.contains("1..=100"), "{}", err.0);
        assert!(out.is_empty(), "the pixels were read: {} bytes", out.len());
        assert!(op.idle.lock().is_empty(), "a child with an unread reply went back to the pool");
        // Within the limit the same function's image comes back whole.
        let sample = SampleInfo { max_pixels: 256, ..sample };
        assert_eq!(op.apply(image, &sample, &mut out).map_err(|e| e.0), Ok((16, 16)));
        assert_eq!(out.len(), 16 * 16 * 3);
    }
}
