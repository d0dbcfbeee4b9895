//! `Pipeline.map(fn)`: the spec's `map` op calls a Python function imported by name
//! (`module:qualname`), registered with the engine as a `UserOp` when a loader is built.
//!
//! The function gets the image as a numpy array (`[h, w, 3]` uint8), a writable view of
//! sluice's buffer for the call's duration (nothing copied; an array returned as given is
//! not copied back either), and a
//! [`MapSample`] (key, label, epoch, and `rng`, a `numpy.random.Generator` seeded from the
//! seed the engine drew from the sample's RNG), and returns a `[h', w', 3]` uint8 array.
//! Where the source has masks, `sample.mask` is the sample's mask (`[h, w]` uint8), a
//! writable view of sluice's buffer like the image: the function edits it in place, or
//! returns `(image, mask)` with a new one (`UserOp::apply_masked`).
//! Whatever it raises becomes the sample's error, naming the op; the engine adds key and
//! path and applies `on_error`. It runs on sluice's worker threads and takes the GIL for
//! each call: `sluice.Loader` runs such pipelines in worker processes to scale
//! (`sluice/map_workers.py`).

use std::sync::Arc;

use numpy::ndarray::{ArrayView2, ArrayView3};
use numpy::{PyArray2, PyArray3, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use sluice_core::{Mask, OpSpec, PipelineSpec};
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
    /// The sample's segmentation mask (uint8 `[h, w]`, a writable view for the call);
    /// None where the source has no masks.
    #[pyo3(get)]
    mask: Option<Py<PyAny>>,
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

/// The base object of the array a map function gets: the array is a view of sluice's
/// buffer, valid while the call runs. Should the array (or a view of it) outlive the call,
/// the buffer is moved in here, so the array stays valid and sluice goes on with a copy.
#[pyclass(module = "sluice._sluice", name = "MapPixels", frozen)]
struct MapPixels {
    kept: std::sync::OnceLock<Vec<u8>>,
}

/// A Python function as the engine's `UserOp`.
struct PyMapOp {
    name: String,
    func: Py<PyAny>,
}

impl PyMapOp {
    /// Calls the function on a writable view of `pixels[..w * h * 3]` (and of the mask,
    /// lent with its own base object); the image goes back to `pixels` (nothing to copy
    /// when the function returned the view itself, C-contiguous and whole, i.e. edited the
    /// image in place), else through `spare`. Returns the image's size and the new mask
    /// the function returned, if any (one edited in place is where it was).
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        base: &Bound<'_, MapPixels>,
        pixels: &mut Vec<u8>,
        (w, h): (usize, usize),
        mask: Option<(&Bound<'_, MapPixels>, &mut Mask)>,
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> PyResult<((u32, u32), Option<Mask>)> {
        let n = w * h * 3;
        let view = pixels.get(..n).ok_or_else(|| PyValueError::new_err(format!("a {w}x{h} image needs {n} bytes")))?;
        let view = ArrayView3::from_shape((h, w, 3), view).map_err(|e| PyValueError::new_err(e.to_string()))?;
        // SAFETY: the array points into `pixels`, which this call holds mutably and does
        // not reallocate while the array may be used: `apply_in_place` moves the buffer
        // into `base` if the array outlives the call. The array is writable: the caller
        // lent `pixels` mutably and reads it only after the call.
        let array = unsafe { PyArray3::<u8>::borrow_from_array(&view, base.clone().into_any()) };
        let mask_array = match mask {
            Some((mask_base, m)) => {
                let (mw, mh) = (m.width as usize, m.height as usize);
                let bytes = m
                    .data
                    .get(..mw * mh)
                    .ok_or_else(|| PyValueError::new_err(format!("a {mw}x{mh} mask needs {} bytes", mw * mh)))?;
                let view = ArrayView2::from_shape((mh, mw), bytes).map_err(|e| PyValueError::new_err(e.to_string()))?;
                // SAFETY: as for the image: `m.data` is held mutably by this call and moved
                // into `mask_base` if the array outlives it.
                Some(unsafe { PyArray2::<u8>::borrow_from_array(&view, mask_base.clone().into_any()) })
            }
            None => None,
        };
        let info = MapSample {
            key: sample.key,
            label: sample.label,
            epoch: sample.epoch,
            seed: sample.seed,
            mask: mask_array.as_ref().map(|a| a.clone().into_any().unbind()),
            rng: PyOnceLock::new(),
        };
        let result = self.func.bind(py).call1((&array, info))?;
        let (image, new_mask) = match result.cast::<PyTuple>() {
            Ok(pair) if mask_array.is_none() => {
                return Err(PyValueError::new_err(format!(
                    "it returned a tuple of {}, but the sample has no mask (the source has no masks): return the image",
                    pair.len()
                )));
            }
            Ok(pair) if pair.len() != 2 => {
                return Err(PyValueError::new_err(format!(
                    "it must return an image or (image, mask); got a tuple of {}",
                    pair.len()
                )));
            }
            Ok(pair) => (pair.get_item(0)?, Some(pair.get_item(1)?)),
            Err(_) => (result, None),
        };
        let size = Self::image_back(&image, &array, pixels, (w, h), spare)?;
        let new_mask = match (new_mask, &mask_array) {
            (Some(m), Some(lent)) if !m.is(lent) => Some(Self::mask_back(&m, size)?),
            _ => None,
        };
        Ok((size, new_mask))
    }

    /// The image the function returned, left in `pixels` (see [`call`](Self::call)).
    fn image_back(
        result: &Bound<'_, PyAny>,
        array: &Bound<'_, PyArray3<u8>>,
        pixels: &mut Vec<u8>,
        (w, h): (usize, usize),
        spare: &mut Vec<u8>,
    ) -> PyResult<(u32, u32)> {
        if result.is(array) {
            return Ok((w as u32, h as u32)); // edited in place: the pixels are where they were
        }
        let Ok(out) = result.cast::<PyArray3<u8>>() else {
            let (dtype, shape) = describe(result);
            return Err(PyValueError::new_err(format!(
                "it must return a uint8 numpy array [h, w, 3]; got {dtype} with shape {shape}"
            )));
        };
        let &[oh, ow, c] = out.shape() else {
            return Err(PyValueError::new_err(format!("it must return a 3-d array; got shape {:?}", out.shape())));
        };
        if c != 3 {
            return Err(PyValueError::new_err(format!("it must return [h, w, 3] RGB; got shape [{oh}, {ow}, {c}]")));
        }
        let too_big = |_| PyValueError::new_err(format!("it returned a {ow}x{oh} image, too large"));
        let size = (u32::try_from(ow).map_err(too_big)?, u32::try_from(oh).map_err(too_big)?);
        let out = out.try_readonly().map_err(|e| PyValueError::new_err(e.to_string()))?;
        if out.is_c_contiguous() && (oh, ow) == (h, w) && out.data().cast_const() == pixels.as_ptr() {
            return Ok(size); // a new array object over the same pixels (e.g. `image[...]`)
        }
        spare.clear();
        match out.as_slice() {
            Ok(contiguous) => spare.extend_from_slice(contiguous),
            Err(_) => spare.extend(out.as_array().iter().copied()),
        }
        std::mem::swap(pixels, spare);
        Ok(size)
    }

    /// The mask the function returned with an image of `(width, height)`: uint8 `[h, w]`
    /// of that size, copied.
    fn mask_back(result: &Bound<'_, PyAny>, (width, height): (u32, u32)) -> PyResult<Mask> {
        let Ok(out) = result.cast::<PyArray2<u8>>() else {
            let (dtype, shape) = describe(result);
            return Err(PyValueError::new_err(format!(
                "it must return the mask as a uint8 numpy array [h, w]; got {dtype} with shape {shape}"
            )));
        };
        let &[mh, mw] = out.shape() else {
            return Err(PyValueError::new_err(format!("the mask must be [h, w]; got shape {:?}", out.shape())));
        };
        if (mw, mh) != (width as usize, height as usize) {
            return Err(PyValueError::new_err(format!(
                "it returned a {mw}x{mh} mask with a {width}x{height} image; the mask must have the image's size"
            )));
        }
        let out = out.try_readonly().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let data = match out.as_slice() {
            Ok(contiguous) => contiguous.to_vec(),
            Err(_) => out.as_array().iter().copied().collect(),
        };
        Ok(Mask { width, height, data })
    }
}

/// A returned object's dtype and shape, for an error message.
fn describe(result: &Bound<'_, PyAny>) -> (String, String) {
    let shape = result.getattr("shape").map_or_else(|_| "no shape".to_owned(), |s| s.to_string());
    let dtype = result.getattr("dtype").map_or_else(|_| result.get_type().to_string(), |d| d.to_string());
    (dtype, shape)
}

impl UserOp for PyMapOp {
    fn apply(&self, image: ImageRef<'_>, sample: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
        let mut pixels = image.pixels.to_vec();
        let size = self.apply_in_place(&mut pixels, (image.width, image.height), sample, out)?;
        std::mem::swap(out, &mut pixels);
        Ok(size)
    }

    fn apply_in_place(
        &self,
        pixels: &mut Vec<u8>,
        size: (u32, u32),
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        self.run(pixels, size, None, sample, spare)
    }

    fn apply_masked(
        &self,
        pixels: &mut Vec<u8>,
        size: (u32, u32),
        mask: &mut Mask,
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        self.run(pixels, size, Some(mask), sample, spare)
    }
}

impl PyMapOp {
    /// One call of the function, with the GIL, on the image and (where the source has
    /// masks) the mask; a buffer the function kept a view of is handed over to that view.
    fn run(
        &self,
        pixels: &mut Vec<u8>,
        (w, h): (u32, u32),
        mut mask: Option<&mut Mask>,
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        keep_thread_state();
        Python::attach(|py| {
            let fail = |e: PyErr| {
                let kind = e.get_type(py).name().map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
                UserOpError(format!("{} raised {kind}: {}", self.name, e.value(py)))
            };
            let kept = || MapPixels { kept: std::sync::OnceLock::new() };
            let base = Bound::new(py, kept()).map_err(fail)?;
            let mask_base = match mask {
                Some(_) => Some(Bound::new(py, kept()).map_err(fail)?),
                None => None,
            };
            let lent = pixels.as_ptr();
            // The error (and its traceback, which may hold the arrays) is dropped before
            // the checks below.
            let lent_mask = mask_base.as_ref().zip(mask.as_deref_mut());
            let result = self.call(py, &base, pixels, (w as usize, h as usize), lent_mask, sample, spare).map_err(fail);
            // SAFETY: `base` is a live object; reading its count needs the GIL, held here.
            if unsafe { pyo3::ffi::Py_REFCNT(base.as_ptr()) } > 1 {
                // The function kept the array (or a view of it): it keeps the buffer.
                let buffer = if spare.as_ptr() == lent {
                    std::mem::take(spare)
                } else {
                    let copy = pixels.clone();
                    std::mem::replace(pixels, copy)
                };
                let _ = base.get().kept.set(buffer);
            }
            if let (Some(mask_base), Some(m)) = (&mask_base, mask.as_deref_mut()) {
                // SAFETY: as above.
                if unsafe { pyo3::ffi::Py_REFCNT(mask_base.as_ptr()) } > 1 {
                    let copy = m.data.clone();
                    let _ = mask_base.get().kept.set(std::mem::replace(&mut m.data, copy));
                }
            }
            let (size, new_mask) = result?;
            if let (Some(new), Some(m)) = (new_mask, mask) {
                *m = new;
            }
            Ok(size)
        })
    }
}

std::thread_local! {
    static THREAD_STATE_KEPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives a sluice worker thread (not a Python thread) one Python thread state for its
/// whole life. Without it, each `Python::attach` creates a thread state and destroys it
/// on release, a large part of a cheap function's cost. The state is made with the GIL
/// taken once and kept (its count never drops to zero); the GIL is then released, so a
/// later `attach` only takes the GIL. Threads that already have a state (Python's own, or
/// one that is attached now) are left alone. The state is not freed when the thread ends
/// (one per worker thread; the interpreter frees them at exit): freeing it would take the
/// GIL from a thread that may be joined by a Python thread holding it.
fn keep_thread_state() {
    if THREAD_STATE_KEPT.with(std::cell::Cell::get) {
        return;
    }
    THREAD_STATE_KEPT.with(|k| k.set(true));
    // SAFETY: `Py_IsInitialized` is always safe; the interpreter is running (a loader
    // built from Python registered this op). A thread with no thread state is attached
    // to nothing, so taking the GIL with `PyGILState_Ensure` and releasing it with
    // `PyEval_SaveThread` leaves it as it was, plus its own (kept) thread state.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() == 0 || !pyo3::ffi::PyGILState_GetThisThreadState().is_null() {
            return;
        }
        let _ = pyo3::ffi::PyGILState_Ensure();
        pyo3::ffi::PyEval_SaveThread();
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
        if let OpSpec::Map { func, .. } = op {
            register_map(py, func)?;
        }
    }
    Ok(())
}
