//! `pack`: sluice_pipeline::pack from Python (the same as `sluice pack`).

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_pipeline::pack::{pack_dataset, PackOptions};

use crate::errors::pack_error;

/// Copies the tree `src` to `out` with every JPEG rewritten losslessly with restart markers
/// every `interval` MCUs; returns `packed`, `copied`, `not_packed` (list of (path, reason)),
/// `bytes_in`, `bytes_out`. The GIL is released meanwhile.
#[pyfunction]
#[pyo3(signature = (src, out, interval = None, threads = None))]
pub fn pack<'py>(
    py: Python<'py>,
    src: PathBuf,
    out: PathBuf,
    interval: Option<u32>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PackOptions::default();
    let o = PackOptions { interval: interval.unwrap_or(d.interval), threads: threads.unwrap_or(0), ..d };
    if o.interval == 0 {
        return Err(PyValueError::new_err("interval must be at least 1"));
    }
    let s = py.detach(|| pack_dataset(&src, &out, &o, &|_, _| {})).map_err(|e| pack_error(py, e))?;
    let r = PyDict::new(py);
    r.set_item("packed", s.packed)?;
    r.set_item("copied", s.copied)?;
    let not_packed: Vec<(String, String)> =
        s.not_packed.into_iter().map(|(p, why)| (p.display().to_string(), why)).collect();
    r.set_item("not_packed", not_packed)?;
    r.set_item("bytes_in", s.bytes_in)?;
    r.set_item("bytes_out", s.bytes_out)?;
    Ok(r)
}
