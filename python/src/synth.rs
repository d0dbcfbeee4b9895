//! `generate_dataset`: sluice-synth's deterministic ImageNet-like datasets, for tests,
//! examples and benchmarks that make their own data.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_synth::{write_dataset, DatasetOptions};

use crate::errors::synth_error;

/// Writes `images` JPEGs under `root/class_XXX/` (plus `corrupt` bad files) and returns a
/// summary dict: `root`, `images`, `bad_files`, `bytes`. Options left out take
/// sluice-synth's defaults; `boxes` also writes each image's boxes (sidecars and
/// `root/instances.json`), `masks` each image's mask too, `fields` metadata fields in
/// each sidecar (docs/records.md). The GIL is
/// released meanwhile.
#[pyfunction]
#[pyo3(signature = (root, images = None, classes = None, seed = None, quality = None, texture = None, corrupt = None, boxes = false, masks = false, fields = false))]
#[allow(clippy::too_many_arguments)]
pub fn generate_dataset<'py>(
    py: Python<'py>,
    root: PathBuf,
    images: Option<usize>,
    classes: Option<usize>,
    seed: Option<u64>,
    quality: Option<u8>,
    texture: Option<u8>,
    corrupt: Option<usize>,
    boxes: bool,
    masks: bool,
    fields: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = DatasetOptions::default();
    let options = DatasetOptions {
        images: images.unwrap_or(d.images),
        classes: classes.unwrap_or(d.classes),
        seed: seed.unwrap_or(d.seed),
        quality: quality.unwrap_or(d.quality),
        texture: texture.unwrap_or(d.texture),
        corrupt: corrupt.unwrap_or(d.corrupt),
        boxes,
        masks,
        fields,
    };
    if !(1..=100).contains(&options.quality) {
        return Err(PyValueError::new_err(format!("quality must be in 1..=100, got {}", options.quality)));
    }
    if options.classes == 0 {
        return Err(PyValueError::new_err("classes must be at least 1"));
    }
    let summary = py.detach(|| write_dataset(&root, &options, &|_| {})).map_err(|e| synth_error(py, e))?;
    let out = PyDict::new(py);
    out.set_item("root", root.display().to_string())?;
    out.set_item("images", summary.images)?;
    let bad: Vec<String> = summary.bad_files.iter().map(|p| p.display().to_string()).collect();
    out.set_item("bad_files", bad)?;
    out.set_item("bytes", summary.bytes)?;
    Ok(out)
}
