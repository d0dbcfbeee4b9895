//! The native remote loader: a thin shell over `sluice_client::RemoteLoader`. Batches
//! arrive from the service's workers and leave for Python as numpy arrays that own the
//! received buffers; blocking calls release the GIL, and a wait still answers Ctrl-C.
//!
//! `next_batch()` holds the loader for the whole of a wait ([`Serial`]): what the other
//! methods read (epoch, job, counters, skipped samples) is published after every call
//! that changes it, and `stats()` asks the dispatcher through a [`CacheStatsProbe`] of
//! its own, so none of them waits for a batch.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use sluice_client::proto::JobInfo;
use sluice_client::{
    CacheStatsProbe, ClientError, Compression, DataPlane, RemoteLoader, RemoteOptions, RemoteState, ReportKind,
};
use sluice_core::PipelineSpec;
use sluice_pipeline::SkippedSample;

use crate::buffers::BufferPool;
use crate::errors::{service_error, spec_error, state_error};
use crate::loader::RawBatch;
use crate::serial::Serial;

/// What this client has received since it connected.
#[derive(Default)]
struct Received {
    batches: u64,
    samples: u64,
    bytes: u64,
    wait: Duration,
}

/// What the methods other than `next_batch()` read, as of the loader's last call.
struct Published {
    epoch: u64,
    job: JobInfo,
    duplicates_dropped: u64,
    shared_memory_batches: u64,
    skipped: Vec<SkippedSample>,
}

impl Published {
    fn of(loader: &RemoteLoader) -> Self {
        Self {
            epoch: loader.epoch(),
            job: loader.job().clone(),
            duplicates_dropped: loader.duplicates_dropped(),
            shared_memory_batches: loader.shared_memory_batches(),
            skipped: loader.skipped().to_vec(),
        }
    }

    /// Catches up with `loader` (its skipped samples only grow).
    fn update(&mut self, loader: &RemoteLoader) {
        self.epoch = loader.epoch();
        self.job.clone_from(loader.job());
        self.duplicates_dropped = loader.duplicates_dropped();
        self.shared_memory_batches = loader.shared_memory_batches();
        if let Some(new) = loader.skipped().get(self.skipped.len()..) {
            self.skipped.extend_from_slice(new);
        }
    }
}

/// A loader whose batches come from a sluice dispatcher and its workers.
#[pyclass(module = "sluice._sluice", name = "RemoteLoader", frozen)]
pub struct PyRemoteLoader {
    inner: Serial<RemoteLoader>,
    /// Published by every call that holds `inner`; never held across a wait.
    published: Mutex<Published>,
    /// Asks the dispatcher for the job's cache stats without `inner`.
    probe: CacheStatsProbe,
    received: Mutex<Received>,
    started: Instant,
    /// Buffers for the copies of batches that arrive in a worker's shared memory.
    buffers: Arc<BufferPool>,
}

#[pymethods]
impl PyRemoteLoader {
    /// Submits `spec_json` as job `job_name` to the dispatcher at `dispatcher` (or joins
    /// the job, if it exists with the same pipeline). GIL released while connecting.
    /// `tls_ca` and `token` default to `$SLUICE_TLS_CA` and `$SLUICE_TOKEN`;
    /// `connect_timeout` is how long an unreachable dispatcher is retried, in seconds.
    #[new]
    #[pyo3(signature = (spec_json, dispatcher, job_name, token = None, tasks_in_flight = 4, parallel_epochs = 0, compression = "none", data_plane = "auto", tls_ca = None, connect_timeout = 60.0, autoscale = false))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn new(
        py: Python<'_>,
        spec_json: &str,
        dispatcher: &str,
        job_name: &str,
        token: Option<String>,
        tasks_in_flight: usize,
        parallel_epochs: u64,
        compression: &str,
        data_plane: &str,
        tls_ca: Option<PathBuf>,
        connect_timeout: f64,
        autoscale: bool,
    ) -> PyResult<Self> {
        let spec = PipelineSpec::from_json_str(spec_json).map_err(|e| spec_error(py, e))?;
        let mut options = RemoteOptions::new(dispatcher, job_name);
        if token.is_some() {
            options.token = token;
        }
        if tls_ca.is_some() {
            options.tls_ca = tls_ca;
        }
        options.give_up_after = Duration::try_from_secs_f64(connect_timeout).map_err(|_| {
            PyValueError::new_err(format!("connect_timeout must be >= 0 seconds, not {connect_timeout}"))
        })?;
        options.tasks_in_flight = tasks_in_flight.max(1);
        options.parallel_epochs = parallel_epochs;
        options.compression = Compression::parse(compression).map_err(|e| service_error(py, e))?;
        options.data_plane = DataPlane::parse(data_plane).map_err(|e| service_error(py, e))?;
        options.autoscale = autoscale;
        let loader = py.detach(|| RemoteLoader::connect(&spec, options)).map_err(|e| service_error(py, e))?;
        let buffers = BufferPool::new(tasks_in_flight.max(1) + 2);
        Ok(Self {
            published: Mutex::new(Published::of(&loader)),
            probe: loader.cache_stats_probe(),
            inner: Serial::new(loader, "RemoteLoader"),
            received: Mutex::default(),
            started: Instant::now(),
            buffers,
        })
    }

    /// Starts recording a trace: each batch's wait, hand-over and time with the trainer,
    /// and where and when a worker built it (see `sluice_client::RemoteTrace`).
    fn start_trace(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with(py, "start_trace", RemoteLoader::start_trace)?.map_err(|e| service_error(py, e))
    }

    /// Stops recording and writes the trace to `path` (Chrome JSON for `.json`, else
    /// Perfetto protobuf); the number of trainer events and worker builds written, or None
    /// if no trace was being recorded.
    fn stop_trace(&self, py: Python<'_>, path: PathBuf) -> PyResult<Option<usize>> {
        let Some(trace) = self.inner.with(py, "stop_trace", RemoteLoader::stop_trace)? else { return Ok(None) };
        py.detach(|| trace.write(&path)).map_err(|e| service_error(py, ClientError::Pipeline(e.into())))?;
        Ok(Some(trace.events.len() + trace.builds.len()))
    }

    /// Starts streaming the rest of the current epoch (restarting it exactly if an earlier
    /// iteration stopped midway).
    fn start_epoch(&self, py: Python<'_>) -> PyResult<()> {
        self.with_published(py, "start_epoch", RemoteLoader::start_epoch)
    }

    /// The next batch of the epoch, or None at its end. Waits with the GIL released and
    /// checks for signals every 50 ms: Ctrl-C raises KeyboardInterrupt, nothing is lost.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<RawBatch>> {
        let mut signal: Option<PyErr> = None;
        let t0 = Instant::now();
        let next = self.with_published(py, "next_batch", |loader| {
            loader.next_batch(&mut crate::serial::signal_check(&mut signal))
        })?;
        let mut received = self.received.lock();
        received.wait += t0.elapsed();
        match next {
            None => Ok(None),
            Some(Ok(batch)) => {
                received.batches += 1;
                received.samples += batch.len() as u64;
                received.bytes += batch.images.as_bytes().len() as u64;
                drop(received);
                RawBatch::new(py, batch, &self.buffers).map(Some)
            }
            Some(Err(ClientError::Interrupted)) => {
                Err(signal.unwrap_or_else(|| PyKeyboardInterrupt::new_err("interrupted while waiting for a batch")))
            }
            Some(Err(e)) => Err(service_error(py, e)),
        }
    }

    fn epoch(&self) -> u64 {
        self.published.lock().epoch
    }

    fn batches_per_epoch(&self) -> u64 {
        self.published.lock().job.batches_per_epoch
    }

    fn samples_per_epoch(&self) -> u64 {
        self.published.lock().job.samples_per_epoch
    }

    fn job_id(&self) -> u64 {
        self.published.lock().job.job_id
    }

    fn job_name(&self) -> String {
        self.published.lock().job.job_name.clone()
    }

    /// The job's fingerprint (dataset and pipeline together).
    fn fingerprint(&self) -> String {
        self.published.lock().job.fingerprint.clone()
    }

    fn duplicates_dropped(&self) -> u64 {
        self.published.lock().duplicates_dropped
    }

    fn shared_memory_batches(&self) -> u64 {
        self.published.lock().shared_memory_batches
    }

    /// What this client received since it connected: `batches`, `samples`, `bytes` (of
    /// images), `wait_s` (time spent waiting for batches), `elapsed_s`,
    /// `shared_memory_batches`, `duplicates_dropped`, `skipped` (samples the workers left
    /// out under `on_error = "skip"`: `{key, path, error}`, once per epoch met), and
    /// `cache` (the job's caches on all workers: `hits`, `misses`, `hit_rate`, `entries`,
    /// `hot`, `hot_held`, `workers_off`: workers whose `auto` cache decided not to cache;
    /// `None` when the dispatcher cannot say). Never waits for a batch;
    /// asks the dispatcher (a second at most) with the GIL released.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let cache = py.detach(|| self.probe.cache_stats()).ok();
        let (listed, shared, duplicates) = {
            let p = self.published.lock();
            (p.skipped.clone(), p.shared_memory_batches, p.duplicates_dropped)
        };
        let skipped = PyList::empty(py);
        for e in listed {
            let d = PyDict::new(py);
            d.set_item("key", e.key)?;
            d.set_item("path", e.path)?;
            d.set_item("error", e.error)?;
            skipped.append(d)?;
        }
        let r = self.received.lock();
        let out = PyDict::new(py);
        out.set_item("batches", r.batches)?;
        out.set_item("samples", r.samples)?;
        out.set_item("bytes", r.bytes)?;
        out.set_item("wait_s", r.wait.as_secs_f64())?;
        out.set_item("elapsed_s", self.started.elapsed().as_secs_f64())?;
        out.set_item("shared_memory_batches", shared)?;
        out.set_item("duplicates_dropped", duplicates)?;
        out.set_item("skipped", skipped)?;
        match cache {
            Some(c) => {
                let d = PyDict::new(py);
                d.set_item("hits", c.hits)?;
                d.set_item("misses", c.misses)?;
                d.set_item("hit_rate", c.hit_rate)?;
                d.set_item("entries", c.entries)?;
                d.set_item("hot", c.hot)?;
                d.set_item("hot_held", c.hot_held)?;
                d.set_item("workers_off", c.workers_off)?;
                out.set_item("cache", d)?;
            }
            None => out.set_item("cache", py.None())?,
        }
        match self.probe.accelerator_busy() {
            Some(a) => {
                let d = PyDict::new(py);
                d.set_item("busy", a.busy)?;
                d.set_item("source", a.source.name())?;
                out.set_item("accelerator", d)?;
            }
            None => out.set_item("accelerator", py.None())?,
        }
        Ok(out)
    }

    /// The trainer's own reading of its accelerator's busy fraction (0..=1), sent to the
    /// dispatcher with the next heartbeat. Never waits: callable while `next_batch` waits.
    fn report_accelerator_busy(&self, fraction: f64) {
        self.probe.report_accelerator_busy(fraction);
    }

    /// Waits for a `next_batch()` in progress: the state is the one after a batch.
    fn state_json(&self, py: Python<'_>) -> PyResult<String> {
        let state = self.inner.with(py, "state_dict", |loader| loader.state())?;
        serde_json::to_string(&state).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    fn load_state_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state: RemoteState = serde_json::from_str(state)
            .map_err(|e| state_error(py, format!("not a sluice remote loader state: {e}")))?;
        self.with_published(py, "load_state_dict", |loader| loader.load_state(&state))?
            .map_err(|e| service_error(py, e))
    }

    /// Per-sample importance for `keys` into the job's store at the dispatcher: `kind` is
    /// "loss" or "grad_norm". Returns (accepted, invalid, unknown, clamped) counts. GIL released.
    fn report(&self, py: Python<'_>, keys: Vec<u64>, values: Vec<f64>, kind: &str) -> PyResult<(u64, u64, u64, u64)> {
        let kind = match kind {
            "loss" => ReportKind::Loss,
            "grad_norm" => ReportKind::GradNorm,
            other => {
                return Err(PyValueError::new_err(format!(
                    "report kind must be \"loss\" or \"grad_norm\", not {other:?}"
                )))
            }
        };
        let r = self
            .inner
            .with(py, "report", |loader| loader.report(&keys, &values, kind))?
            .map_err(|e| service_error(py, e))?;
        Ok((r.accepted, r.invalid, r.unknown, r.clamped))
    }

    /// Restarts the job at the first batch of `epoch` (for every client of the job).
    fn set_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        self.with_published(py, "set_epoch", |loader| {
            let mut state = loader.state();
            state.epoch = epoch;
            state.delivered.clear();
            loader.load_state(&state)
        })?
        .map_err(|e| service_error(py, e))
    }
}

impl PyRemoteLoader {
    /// `f` on the loader between batches ([`Serial::with`]), publishing what it changed.
    fn with_published<R: Send>(
        &self,
        py: Python<'_>,
        method: &str,
        f: impl FnOnce(&mut RemoteLoader) -> R + Send,
    ) -> PyResult<R> {
        self.inner.with(py, method, |loader| {
            let r = f(loader);
            self.published.lock().update(loader);
            r
        })
    }
}
