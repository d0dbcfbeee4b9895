//! The native streaming loader and producer: thin shells over `sluice_stream`. Specs and
//! states cross as JSON; batches leave as numpy arrays like the file loader's, with a
//! per-sample rehearsal flag.
//!
//! `next()` holds the loader for as long as the stream is empty, so while it runs
//! `stats()` and `rehearsal_ids()` read the loader's [`StreamMonitor`] instead, and the
//! state calls wait for the batch in progress with the GIL released ([`Serial`]).

use std::sync::Arc;

use numpy::PyArray1;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_core::SourceSpec;
use sluice_stream::{push_dataset, PushOptions, StreamLoader, StreamMonitor, StreamSpec, StreamState};

use crate::buffers::BufferPool;
use crate::errors::{source_error, state_error, stream_error};
use crate::loader::RawBatch;
use crate::serial::Serial;

#[pyclass(module = "sluice._sluice", name = "StreamLoader", frozen)]
pub struct PyStreamLoader {
    loader: Serial<StreamLoader>,
    /// Stats and rehearsal ids, read without waiting for `next()`.
    monitor: StreamMonitor,
    buffers: Arc<BufferPool>,
}

#[pymethods]
impl PyStreamLoader {
    /// Connects to the broker (GIL released) and creates the job's consumer group.
    #[new]
    fn new(py: Python<'_>, spec_json: &str) -> PyResult<Self> {
        let spec: StreamSpec = serde_json::from_str(spec_json).map_err(|e| {
            stream_error(py, sluice_stream::StreamError::Config { field: "spec", problem: e.to_string() })
        })?;
        let loader = py.detach(|| StreamLoader::new(spec)).map_err(|e| stream_error(py, e))?;
        let monitor = loader.monitor();
        Ok(Self { loader: Serial::new(loader, "StreamLoader"), monitor, buffers: BufferPool::new(4) })
    }

    /// The next batch and its rehearsal flags (a bool array), or None at the end of the
    /// stream. Waits with the GIL released; Ctrl-C raises `KeyboardInterrupt`.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(RawBatch, Py<PyAny>)>> {
        let mut signal: Option<PyErr> = None;
        let next = self.loader.with(py, "next", |loader| {
            loader.next_batch_interruptible(&mut crate::serial::signal_check(&mut signal))
        })?;
        match next {
            Ok(Some(b)) => {
                let flags = PyArray1::from_vec(py, b.rehearsal).into_any().unbind();
                Ok(Some((RawBatch::new(py, b.batch, &self.buffers)?, flags)))
            }
            Ok(None) => match signal {
                Some(e) => Err(e),
                None => Ok(None),
            },
            Err(e) => Err(stream_error(py, e)),
        }
    }

    /// The state (writes the rehearsal buffer's file); waits for a `next()` in progress.
    fn state_json(&self, py: Python<'_>) -> PyResult<String> {
        let state = self.loader.with(py, "state_dict", StreamLoader::state)?.map_err(|e| stream_error(py, e))?;
        serde_json::to_string(&state).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    fn load_state_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state: StreamState = serde_json::from_str(state)
            .map_err(|e| state_error(py, format!("cannot restore stream state: not a sluice stream state: {e}")))?;
        self.loader.with(py, "load_state_dict", |loader| loader.restore(&state))?.map_err(|e| stream_error(py, e))
    }

    /// The stats now, or while a `next()` is in progress, as it last published them (at
    /// most 50 ms ago while it waits for the stream).
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let stats = match self.loader.try_with(py, |loader| loader.stats()) {
            Some(stats) => stats,
            None => py.detach(|| self.monitor.stats()),
        };
        serde_json::to_string(&stats).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Ids of the samples in the rehearsal buffer.
    fn rehearsal_ids(&self, py: Python<'_>) -> Vec<u64> {
        py.detach(|| self.monitor.rehearsal_ids())
    }
}

/// Pushes a dataset (an ImageFolder root, a file list or a .tar shard) into a stream;
/// `options_json` is `sluice_stream::PushOptions`. Returns the report as JSON.
#[pyfunction]
pub fn stream_push(py: Python<'_>, dataset: &str, options_json: &str) -> PyResult<String> {
    let opts: PushOptions = serde_json::from_str(options_json).map_err(|e| {
        stream_error(py, sluice_stream::StreamError::Config { field: "options", problem: e.to_string() })
    })?;
    let path = std::path::PathBuf::from(dataset);
    let source = if path.is_dir() {
        SourceSpec::ImageFolder { root: path }
    } else if path.extension().is_some_and(|e| e == "tar") {
        SourceSpec::Tar { shards: vec![path], sidecars: false, masks: false }
    } else {
        SourceSpec::FileList { path, root: None }
    };
    let manifest = py.detach(|| sluice_pipeline::source::build_manifest(&source)).map_err(|e| source_error(py, e))?;
    let report = py.detach(|| push_dataset(&manifest, &opts)).map_err(|e| stream_error(py, e))?;
    serde_json::to_string(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}
