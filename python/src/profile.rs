//! `profile`: sluice_profile's threads sweep from Python (the same as `sluice profile
//! --sweep threads=...`).

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use sluice_core::PipelineSpec;
use sluice_profile::{html, knee, sweep, threads_point, ProfileError, Unit};

use crate::errors::{pipeline_error, spec_error};

/// Runs `spec_json` at each thread count of `threads` (one warm-up epoch, then `epochs`
/// measured ones, the whole sweep `runs` times interleaved) with per-op counters on; writes
/// the HTML report (headed `title`) to `report` when given. Returns `(rows_json, knee)`. Progress goes to
/// stderr; the GIL is released meanwhile.
#[pyfunction]
#[pyo3(signature = (spec_json, threads, epochs = 1, runs = 1, report = None, title = "pipeline"))]
pub fn profile_threads(
    py: Python<'_>,
    spec_json: &str,
    threads: Vec<usize>,
    epochs: u64,
    runs: usize,
    report: Option<PathBuf>,
    title: &str,
) -> PyResult<(String, Option<usize>)> {
    let spec = PipelineSpec::from_json_str(spec_json).map_err(|e| spec_error(py, e))?;
    if threads.is_empty() || threads.contains(&0) {
        return Err(PyValueError::new_err(format!("sweep threads={threads:?}: give positive thread counts")));
    }
    let point = |n, _run| threads_point(&spec, n, epochs);
    let rows = py.detach(|| sweep(Unit::Threads, &threads, runs, point, |line| eprintln!("{line}")));
    let rows = rows.map_err(|e| match e {
        ProfileError::Pipeline { source, .. } => pipeline_error(py, source),
        other => PyValueError::new_err(other.to_string()),
    })?;
    let knee = knee(&rows);
    if let Some(path) = report {
        let page = html(title, &rows, knee).map_err(|e| PyValueError::new_err(e.to_string()))?;
        std::fs::write(&path, page)
            .map_err(|e| PyOSError::new_err(format!("cannot write the report to {}: {e}", path.display())))?;
    }
    let json = serde_json::to_string(&rows).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((json, knee))
}
