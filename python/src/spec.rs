//! Pipeline specs between Python and Rust. The Python builder produces JSON; Rust parses
//! and validates it (so errors name the field), fills in defaults and converts formats.

use std::path::PathBuf;

use pyo3::prelude::*;
use sluice_core::PipelineSpec;

use crate::errors::spec_error;

/// Parses and validates a JSON spec; returns it canonical (defaults filled in).
#[pyfunction]
pub fn spec_canonical_json(py: Python<'_>, json: &str) -> PyResult<String> {
    let spec = PipelineSpec::from_json_str(json).map_err(|e| spec_error(py, e))?;
    spec.to_json_string().map_err(|e| spec_error(py, e))
}

/// The JSON spec of process `index` of `count` that run one loader (the `map` worker
/// processes): its cache's memory and disk budgets split between them, its disk tier in a
/// subfolder of its own (`CacheSpec::process_share`). A spec without a cache comes back as is.
#[pyfunction]
pub fn spec_process_share(py: Python<'_>, json: &str, index: usize, count: usize) -> PyResult<String> {
    let mut spec = PipelineSpec::from_json_str(json).map_err(|e| spec_error(py, e))?;
    if let Some(cache) = &spec.cache {
        spec.cache = Some(cache.process_share(index, count).map_err(|e| spec_error(py, e))?);
    }
    spec.to_json_string().map_err(|e| spec_error(py, e))
}

/// Converts a JSON spec to TOML (validating it).
#[pyfunction]
pub fn spec_json_to_toml(py: Python<'_>, json: &str) -> PyResult<String> {
    let spec = PipelineSpec::from_json_str(json).map_err(|e| spec_error(py, e))?;
    spec.to_toml_string().map_err(|e| spec_error(py, e))
}

/// Converts a TOML spec to canonical JSON (validating it).
#[pyfunction]
pub fn spec_toml_to_json(py: Python<'_>, toml: &str) -> PyResult<String> {
    let spec = PipelineSpec::from_toml_str(toml).map_err(|e| spec_error(py, e))?;
    spec.to_json_string().map_err(|e| spec_error(py, e))
}

/// Reads a `.toml` or `.json` spec file (relative source paths resolved against the file's
/// folder) and returns it as canonical JSON.
#[pyfunction]
pub fn spec_load_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let spec = PipelineSpec::from_path(&path).map_err(|e| spec_error(py, e))?;
    spec.to_json_string().map_err(|e| spec_error(py, e))
}
