//! The native remote loader: a thin shell over `sluice_service::RemoteLoader`. Batches
//! arrive from the service's workers and leave for Python as numpy arrays that own the
//! received buffers; blocking calls release the GIL, and a wait still answers Ctrl-C.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{
    PyConnectionError, PyFileExistsError, PyKeyboardInterrupt, PyLookupError, PyPermissionError, PyRuntimeError,
    PyValueError,
};
use pyo3::prelude::*;
use sluice_core::PipelineSpec;
use sluice_service::{Compression, DataPlane, RemoteLoader, RemoteOptions, RemoteState, ServiceError};
use tonic::Code;

use crate::errors::spec_error;
use crate::loader::RawBatch;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Service errors as the builtin exception a caller would catch.
fn service_error(py: Python<'_>, e: ServiceError) -> PyErr {
    let message = e.to_string();
    match e {
        ServiceError::Spec(s) => spec_error(py, s),
        ServiceError::Interrupted => PyKeyboardInterrupt::new_err(message),
        ServiceError::PathNotAllowed { .. } => PyPermissionError::new_err(message),
        ServiceError::InvalidArgument(_) | ServiceError::BadBatch(_) => PyValueError::new_err(message),
        ServiceError::Unavailable { .. } | ServiceError::Connect { .. } => PyConnectionError::new_err(message),
        ServiceError::Rpc { status, .. } => match status.code() {
            Code::PermissionDenied | Code::Unauthenticated => PyPermissionError::new_err(message),
            Code::InvalidArgument => PyValueError::new_err(message),
            Code::NotFound => PyLookupError::new_err(message),
            Code::AlreadyExists => PyFileExistsError::new_err(message),
            Code::Unavailable => PyConnectionError::new_err(message),
            _ => PyRuntimeError::new_err(message),
        },
        _ => PyRuntimeError::new_err(message),
    }
}

/// A loader whose batches come from a sluice dispatcher and its workers.
#[pyclass(module = "sluice._sluice", name = "RemoteLoader", frozen)]
pub struct PyRemoteLoader {
    inner: Mutex<RemoteLoader>,
}

#[pymethods]
impl PyRemoteLoader {
    /// Submits `spec_json` as job `job_name` to the dispatcher at `dispatcher` (or joins
    /// the job, if it exists with the same pipeline). GIL released while connecting.
    #[new]
    #[pyo3(signature = (spec_json, dispatcher, job_name, token = None, tasks_in_flight = 4, parallel_epochs = 0, compression = "none", data_plane = "auto"))]
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
    ) -> PyResult<Self> {
        let spec = PipelineSpec::from_json_str(spec_json).map_err(|e| spec_error(py, e))?;
        let mut options = RemoteOptions::new(dispatcher, job_name);
        if token.is_some() {
            options.token = token;
        }
        options.tasks_in_flight = tasks_in_flight.max(1);
        options.parallel_epochs = parallel_epochs;
        options.compression = Compression::parse(compression).map_err(|e| PyValueError::new_err(e.to_string()))?;
        options.data_plane = DataPlane::parse(data_plane).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let loader = py.detach(|| RemoteLoader::connect(&spec, options)).map_err(|e| service_error(py, e))?;
        Ok(Self { inner: Mutex::new(loader) })
    }

    /// Starts streaming the rest of the current epoch (restarting it exactly if an earlier
    /// iteration stopped midway).
    fn start_epoch(&self, py: Python<'_>) {
        py.detach(|| lock(&self.inner).start_epoch());
    }

    /// The next batch of the epoch, or None at its end. Waits with the GIL released and
    /// checks for signals every 50 ms: Ctrl-C raises KeyboardInterrupt, nothing is lost.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<RawBatch>> {
        let mut signal: Option<PyErr> = None;
        let next = py.detach(|| {
            lock(&self.inner).next_batch(&mut || {
                Python::attach(|py| match py.check_signals() {
                    Ok(()) => false,
                    Err(e) => {
                        signal = Some(e);
                        true
                    }
                })
            })
        });
        match next {
            None => Ok(None),
            Some(Ok(batch)) => RawBatch::new(py, batch).map(Some),
            Some(Err(ServiceError::Interrupted)) => {
                Err(signal.unwrap_or_else(|| PyKeyboardInterrupt::new_err("interrupted while waiting for a batch")))
            }
            Some(Err(e)) => Err(service_error(py, e)),
        }
    }

    fn epoch(&self) -> u64 {
        lock(&self.inner).epoch()
    }

    fn batches_per_epoch(&self) -> u64 {
        lock(&self.inner).batches_per_epoch()
    }

    fn samples_per_epoch(&self) -> u64 {
        lock(&self.inner).job().samples_per_epoch
    }

    fn job_id(&self) -> u64 {
        lock(&self.inner).job().job_id
    }

    fn job_name(&self) -> String {
        lock(&self.inner).job().job_name.clone()
    }

    /// The job's fingerprint (dataset and pipeline together).
    fn fingerprint(&self) -> String {
        lock(&self.inner).job().fingerprint.clone()
    }

    fn duplicates_dropped(&self) -> u64 {
        lock(&self.inner).duplicates_dropped()
    }

    fn shared_memory_batches(&self) -> u64 {
        lock(&self.inner).shared_memory_batches()
    }

    fn state_json(&self) -> PyResult<String> {
        serde_json::to_string(&lock(&self.inner).state()).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    fn load_state_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state: RemoteState = serde_json::from_str(state)
            .map_err(|e| PyValueError::new_err(format!("not a sluice remote loader state: {e}")))?;
        py.detach(|| lock(&self.inner).load_state(&state)).map_err(|e| service_error(py, e))
    }
}
