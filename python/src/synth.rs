//! `generate_dataset`: sluice-synth's deterministic ImageNet-like datasets, for tests,
//! examples and benchmarks that make their own data.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_synth::{write_dataset, DatasetOptions};

use crate::errors::synth_error;

/// Writes `images` JPEGs under `root/class_XXX/` (plus `corrupt` bad files) and returns a
/// summary dict: `root`, `images`, `bad_files`, `bytes`. The GIL is released meanwhile.
#[pyfunction]
#[pyo3(signature = (root, images = 1000, classes = 10, seed = 0, quality = 90, texture = 14, corrupt = 0))]
#[allow(clippy::too_many_arguments)]
pub fn generate_dataset<'py>(
    py: Python<'py>,
    root: PathBuf,
    images: usize,
    classes: usize,
    seed: u64,
    quality: u8,
    texture: u8,
    corrupt: usize,
) -> PyResult<Bound<'py, PyDict>> {
    if !(1..=100).contains(&quality) {
        return Err(PyValueError::new_err(format!("quality must be in 1..=100, got {quality}")));
    }
    if classes == 0 {
        return Err(PyValueError::new_err("classes must be at least 1"));
    }
    let options = DatasetOptions { images, classes, seed, quality, texture, corrupt };
    let summary = py.detach(|| write_dataset(&root, &options, &|_| {})).map_err(|e| synth_error(py, e))?;
    let out = PyDict::new(py);
    out.set_item("root", root.display().to_string())?;
    out.set_item("images", summary.images)?;
    let bad: Vec<String> = summary.bad_files.iter().map(|p| p.display().to_string()).collect();
    out.set_item("bad_files", bad)?;
    out.set_item("bytes", summary.bytes)?;
    Ok(out)
}
