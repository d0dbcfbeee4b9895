//! `Pipeline.map(fn)`: the spec's `map` op calls a Python function imported by name
//! (`module:qualname`), registered with the engine as a `UserOp` when a loader is built.
//!
//! The function gets the image as a fresh numpy array (`[h, w, 3]` uint8) and a
//! [`MapSample`] (key, label, epoch, and `rng`, a `numpy.random.Generator` seeded from the
//! seed the engine drew from the sample's RNG), and returns a `[h', w', 3]` uint8 array.
//! Whatever it raises becomes the sample's error, naming the op; the engine adds key and
//! path and applies `on_error`. It runs on sluice's worker threads and takes the GIL for
//! each call: `sluice.Loader` runs such pipelines in worker processes to scale
//! (`sluice/map_workers.py`).

use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use sluice_core::{OpSpec, PipelineSpec};
use sluice_pipeline::{register_user_op, ImageRef, SampleInfo, UserOp, UserOpError};

/// What a map function is told about its sample besides the pixels.
#[pyclass(module = "sluice._sluice", name = "MapSample", frozen)]
pub struct MapSample {
    /// The sample's key (its position in the manifest).
    #[pyo3(get)]
    key: u64,
    /// Its class index; -1 where the source has none.
    #[pyo3(get)]
    label: i64,
    #[pyo3(get)]
    epoch: u64,
    /// The seed drawn for this op from the sample's RNG (seed, epoch, key).
    #[pyo3(get)]
    seed: u64,
    rng: PyOnceLock<Py<PyAny>>,
}

#[pymethods]
impl MapSample {
    /// A `numpy.random.Generator` seeded with `seed`, made on first use (a function that
    /// draws nothing does not pay for it).
    #[getter]
    fn rng(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rng = self.rng.get_or_try_init(py, || {
            let random = py.import("numpy.random")?;
            Ok::<_, PyErr>(random.getattr("default_rng")?.call1((self.seed,))?.unbind())
        })?;
        Ok(rng.clone_ref(py))
    }

    fn __repr__(&self) -> String {
        format!("MapSample(key={}, label={}, epoch={}, seed={})", self.key, self.label, self.epoch, self.seed)
    }
}

/// A Python function as the engine's `UserOp`.
struct PyMapOp {
    name: String,
    func: Py<PyAny>,
}

impl PyMapOp {
    fn call(
        &self,
        py: Python<'_>,
        image: ImageRef<'_>,
        sample: &SampleInfo,
        out: &mut Vec<u8>,
    ) -> PyResult<(u32, u32)> {
        let (w, h) = (image.width as usize, image.height as usize);
        let array = PyArray1::from_slice(py, image.pixels).reshape([h, w, 3])?;
        let info = MapSample {
            key: sample.key,
            label: sample.label,
            epoch: sample.epoch,
            seed: sample.seed,
            rng: PyOnceLock::new(),
        };
        let result = self.func.bind(py).call1((array, info))?;
        let Ok(pixels) = result.extract::<PyReadonlyArray3<'_, u8>>() else {
            let shape = result.getattr("shape").map_or_else(|_| "no shape".to_owned(), |s| s.to_string());
            let dtype = result.getattr("dtype").map_or_else(|_| result.get_type().to_string(), |d| d.to_string());
            return Err(PyValueError::new_err(format!(
                "it must return a uint8 numpy array [h, w, 3]; got {dtype} with shape {shape}"
            )));
        };
        let &[oh, ow, c] = pixels.shape() else {
            return Err(PyValueError::new_err(format!("it must return a 3-d array; got shape {:?}", pixels.shape())));
        };
        if c != 3 {
            return Err(PyValueError::new_err(format!("it must return [h, w, 3] RGB; got shape [{oh}, {ow}, {c}]")));
        }
        let too_big = |_| PyValueError::new_err(format!("it returned a {ow}x{oh} image, too large"));
        let (ow, oh) = (u32::try_from(ow).map_err(too_big)?, u32::try_from(oh).map_err(too_big)?);
        out.clear();
        match pixels.as_slice() {
            Ok(contiguous) => out.extend_from_slice(contiguous),
            Err(_) => out.extend(pixels.as_array().iter().copied()),
        }
        Ok((ow, oh))
    }
}

impl UserOp for PyMapOp {
    fn apply(&self, image: ImageRef<'_>, sample: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
        Python::attach(|py| {
            self.call(py, image, sample, out).map_err(|e| {
                let kind = e.get_type(py).name().map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
                UserOpError(format!("{} raised {kind}: {}", self.name, e.value(py)))
            })
        })
    }
}

/// Imports `module:qualname` and checks that it is a callable.
fn import_function<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let Some((module, qualname)) = name.split_once(':') else {
        return Err(PyValueError::new_err(format!("map needs `module:qualname`; got `{name}`")));
    };
    let mut obj = py.import(module)?.into_any();
    for part in qualname.split('.') {
        obj = obj.getattr(part)?;
    }
    if !obj.is_callable() {
        return Err(PyValueError::new_err(format!("map: `{name}` is not callable")));
    }
    Ok(obj)
}

/// Imports the function `name` (`module:qualname`) and registers it for `map` ops.
#[pyfunction]
pub fn register_map(py: Python<'_>, name: &str) -> PyResult<()> {
    let func = import_function(py, name)?.unbind();
    register_user_op(name, Arc::new(PyMapOp { name: name.to_owned(), func }));
    Ok(())
}

/// Registers the function of every `map` op in `spec`.
pub fn register_spec_maps(py: Python<'_>, spec: &PipelineSpec) -> PyResult<()> {
    for op in &spec.ops {
        if let OpSpec::Map { func } = op {
            register_map(py, func)?;
        }
    }
    Ok(())
}
