//! The native loader: a thin shell over `sluice_pipeline::Loader`. Batches leave Rust as
//! numpy arrays over the Rust buffers (no copy), and the buffers come back for later
//! batches when Python frees them (`buffers.rs`); every blocking call releases the GIL,
//! and a wait for a batch still answers Ctrl-C. An epoch iterator's `next()` holds the
//! iterator while it waits ([`Serial`]); `remaining()` reads a count it leaves behind.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyIndexError, PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use sluice_core::{Batch, BatchField, BatchFields, FieldValues, Layout, PipelineSpec, SampleKey, TensorData};
use sluice_pipeline::{EpochIter, Loader, LoaderState, PipelineError, Shard};

use crate::buffers::{image_array, BufferPool};
use crate::errors::{pipeline_error, spec_error, state_error};
use crate::map_op::register_spec_maps;
use crate::serial::Serial;

/// A loader over one pipeline spec, for one rank of `world_size`.
#[pyclass(module = "sluice._sluice", name = "Loader", frozen)]
pub struct PyLoader {
    /// Dropped with the GIL released (see `Drop`).
    loader: ManuallyDrop<Loader>,
    buffers: Arc<BufferPool>,
}

impl Drop for PyLoader {
    /// The worker pool joins its threads on drop; one of them may be waiting for the GIL
    /// to run a `map` function, so the GIL is released while they finish.
    fn drop(&mut self) {
        // SAFETY: `loader` is never used again: this is the last thing done with `self`.
        let loader = unsafe { ManuallyDrop::take(&mut self.loader) };
        Python::attach(|py| py.detach(move || drop(loader)));
    }
}

#[pymethods]
impl PyLoader {
    /// Enumerates the dataset of `spec_json` (GIL released) and prepares the pipeline.
    #[new]
    #[pyo3(signature = (spec_json, rank = 0, world_size = 1))]
    fn new(py: Python<'_>, spec_json: &str, rank: usize, world_size: usize) -> PyResult<Self> {
        let spec = PipelineSpec::from_json_str(spec_json).map_err(|e| spec_error(py, e))?;
        register_spec_maps(py, &spec)?;
        let loader = py.detach(|| Loader::new(spec, Shard { rank, world_size })).map_err(|e| pipeline_error(py, e))?;
        // Enough spare buffers for the prefetch window and the batches being freed.
        let buffers = BufferPool::new(loader.prefetch_max_depth() + 2);
        Ok(Self { loader: ManuallyDrop::new(loader), buffers })
    }

    /// An iterator over the rest of the current epoch (all of it unless resuming).
    /// Starting one retires any older iterator of this loader. Computing the epoch order
    /// (a permutation of the dataset) runs with the GIL released.
    fn iter(&self, py: Python<'_>) -> PyEpochIterator {
        let iter = py.detach(|| self.loader.iter().with_buffers(self.buffers.source()));
        PyEpochIterator {
            epoch: iter.epoch(),
            remaining: AtomicU64::new(iter.remaining()),
            iter: ManuallyDrop::new(Serial::new(iter, "EpochIterator")),
            buffers: self.buffers.clone(),
        }
    }

    /// The order (manifest positions, little-endian u32) and weights (f32, or None) of
    /// `epoch`, drawn once from this loader's importance state: what the `map` worker
    /// processes run with `iter_draw`, so their epochs follow the trainer's reports.
    fn epoch_draw<'py>(&self, py: Python<'py>, epoch: u64) -> (Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>) {
        let (order, weights) = py.detach(|| self.loader.epoch_draw(epoch));
        let order: Vec<u8> = order.iter().flat_map(|p| p.to_le_bytes()).collect();
        let weights = weights.map(|w| w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        (PyBytes::new(py, &order), weights.map(|w| PyBytes::new(py, &w)))
    }

    /// Batches `start..end` of `epoch` over an order another loader of the same spec
    /// drew (`epoch_draw`).
    fn iter_draw(
        &self,
        py: Python<'_>,
        epoch: u64,
        start: u64,
        end: u64,
        order: &[u8],
        weights: Option<&[u8]>,
    ) -> PyResult<PyEpochIterator> {
        let samples = self.loader.manifest().len();
        let order: Vec<u32> = order.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let weights: Option<Vec<f32>> =
            weights.map(|w| w.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect());
        if let Some(bad) = order.iter().find(|&&p| p as usize >= samples) {
            return Err(state_error(
                py,
                format!("epoch {epoch}'s draw names sample {bad}, past the {samples} samples"),
            ));
        }
        if weights.as_ref().is_some_and(|w| w.len() != order.len()) {
            return Err(state_error(py, format!("epoch {epoch}'s draw has weights for another number of samples")));
        }
        let (order, weights) = (Arc::new(order), weights.map(Arc::new));
        let iter =
            py.detach(|| self.loader.iter_draw(epoch, start, end, order, weights).with_buffers(self.buffers.source()));
        Ok(PyEpochIterator {
            epoch: iter.epoch(),
            remaining: AtomicU64::new(iter.remaining()),
            iter: ManuallyDrop::new(Serial::new(iter, "EpochIterator")),
            buffers: self.buffers.clone(),
        })
    }

    /// Tells the disk tier which samples this process will look up: its batches
    /// (`i % count == index`) of `epoch` over `order` (as `iter_draw` takes it) from batch
    /// `first` on, then its batches of the next epoch where the seed alone decides it.
    fn tell_future_of_share(&self, py: Python<'_>, epoch: u64, order: &[u8], first: u64, index: u64, count: u64) {
        let order: Vec<u32> = order.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        py.detach(|| self.loader.tell_future_of_share(epoch, &order, first, index, count));
    }

    /// Bytes of one full batch's images.
    fn batch_bytes(&self) -> usize {
        self.loader.batch_bytes()
    }

    fn batches_per_epoch(&self) -> u64 {
        self.loader.batches_per_epoch()
    }

    fn samples_per_epoch(&self) -> usize {
        self.loader.samples_per_epoch()
    }

    /// Samples in the whole dataset (all ranks).
    fn num_samples(&self) -> usize {
        self.loader.manifest().len()
    }

    /// Class names by label (ImageFolder), else empty.
    fn classes(&self) -> Vec<String> {
        self.loader.manifest().classes.clone()
    }

    /// The file (or `shard.tar:member`) of sample `key`.
    fn path_of(&self, key: u64) -> PyResult<String> {
        let manifest = self.loader.manifest();
        if key >= manifest.len() as u64 {
            return Err(PyIndexError::new_err(format!("no sample with key {key} ({} samples)", manifest.len())));
        }
        Ok(manifest.display_path(SampleKey(key)).display().to_string())
    }

    fn fingerprint(&self) -> String {
        self.loader.manifest().fingerprint_hex()
    }

    /// The spec this loader runs, as canonical JSON.
    fn spec_json(&self, py: Python<'_>) -> PyResult<String> {
        self.loader.spec().to_json_string().map_err(|e| spec_error(py, e))
    }

    /// `(epoch, batches of it already handed out)`.
    fn position(&self) -> (u64, u64) {
        let s = self.loader.state();
        (s.epoch, s.batch)
    }

    fn set_epoch(&self, epoch: u64) {
        self.loader.set_epoch(epoch);
    }

    fn state_json(&self, py: Python<'_>) -> PyResult<String> {
        let state = py.detach(|| self.loader.state());
        serde_json::to_string(&state).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    fn load_state_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state: LoaderState = serde_json::from_str(state)
            .map_err(|e| state_error(py, format!("cannot restore loader state: not a sluice loader state: {e}")))?;
        py.detach(|| self.loader.load_state(&state)).map_err(|e| pipeline_error(py, e))
    }

    /// Per-sample importance from the trainer (losses or gradient norms) for `keys`.
    /// Returns the (accepted, refused, clamped) counts.
    fn report(&self, py: Python<'_>, keys: Vec<u64>, values: Vec<f64>) -> PyResult<(u64, u64, u64)> {
        let c = py.detach(|| self.loader.report(&keys, &values)).map_err(|e| pipeline_error(py, e))?;
        Ok((c.accepted, c.refused, c.clamped))
    }

    /// Starts recording profiling events (per sample and op, per batch).
    fn start_trace(&self, py: Python<'_>) -> PyResult<()> {
        self.loader.start_trace().map_err(|e| pipeline_error(py, e))
    }

    /// Stops recording and writes the trace to `path` (Chrome JSON for `.json`, else
    /// Perfetto protobuf), with the GIL released; the number of events written, or `None`
    /// if no trace was being recorded.
    fn stop_trace(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<usize>> {
        let Some(trace) = self.loader.stop_trace() else { return Ok(None) };
        py.detach(|| trace.write(&path)).map_err(|e| pipeline_error(py, e.into()))?;
        Ok(Some(trace.events.len()))
    }

    fn stats_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.loader.stats()).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Resizes the worker pool while it runs; 0 means one thread per core.
    fn set_threads(&self, threads: usize) {
        let threads = match threads {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        };
        self.loader.set_threads(threads);
    }

    fn threads(&self) -> usize {
        self.loader.threads()
    }

    /// Batches built in a buffer freed by an earlier batch rather than in fresh memory.
    fn buffers_reused(&self) -> u64 {
        self.buffers.reused()
    }

    /// The trainer's own reading of its accelerator's busy fraction (0..=1).
    fn report_accelerator_busy(&self, fraction: f64) {
        self.loader.report_accelerator_busy(fraction);
    }
}

/// The batches of one epoch, in order.
#[pyclass(module = "sluice._sluice", name = "EpochIterator", frozen)]
pub struct PyEpochIterator {
    epoch: u64,
    /// Dropped with the GIL released, as the loader is.
    iter: ManuallyDrop<Serial<EpochIter>>,
    /// Batches left as of the last one handed out: read without waiting for `next()`.
    remaining: AtomicU64,
    buffers: Arc<BufferPool>,
}

impl Drop for PyEpochIterator {
    fn drop(&mut self) {
        // SAFETY: `iter` is never used again: this is the last thing done with `self`.
        let iter = unsafe { ManuallyDrop::take(&mut self.iter) };
        Python::attach(|py| py.detach(move || drop(iter)));
    }
}

impl PyEpochIterator {
    /// Waits for the next batch with the GIL released, checking for signals every 50 ms:
    /// Ctrl-C gives the `KeyboardInterrupt` (and a later call picks up the same batch).
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        let mut signal: Option<PyErr> = None;
        let next = self.iter.with(py, "__next__", |iter| {
            let next = iter.next_interruptible(&mut crate::serial::signal_check(&mut signal));
            self.remaining.store(iter.remaining(), Ordering::Relaxed);
            next
        })?;
        match next {
            None => Ok(None),
            Some(Ok(batch)) => Ok(Some(batch)),
            Some(Err(PipelineError::Interrupted)) => {
                Err(signal.unwrap_or_else(|| PyKeyboardInterrupt::new_err("interrupted while waiting for a batch")))
            }
            Some(Err(e)) => Err(pipeline_error(py, e)),
        }
    }
}

#[pymethods]
impl PyEpochIterator {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Waits for the next batch with the GIL released, checking for signals every 50 ms:
    /// Ctrl-C raises `KeyboardInterrupt` and a later call picks up the same batch.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<RawBatch>> {
        match self.next_batch(py)? {
            Some(batch) => RawBatch::new(py, batch, &self.buffers).map(Some),
            None => Ok(None),
        }
    }

    /// Runs the rest of the epoch in Rust, handing no batch to Python (each buffer goes
    /// straight back to the pool): what a native consumer gets, for benchmarks. Returns
    /// `(batches, samples)`.
    fn drain(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        let (mut batches, mut samples) = (0, 0);
        while let Some(batch) = self.next_batch(py)? {
            batches += 1;
            samples += batch.len() as u64;
            self.buffers.recycle(batch.images);
        }
        Ok((batches, samples))
    }

    /// The epoch this iterator runs.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches left in this epoch (as of the last batch handed out, also while another
    /// thread waits in `next()`).
    fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed)
    }
}

/// One batch as numpy arrays that own sluice's buffers.
#[pyclass(module = "sluice._sluice", name = "RawBatch", frozen)]
pub struct RawBatch {
    /// `[n, h, w, 3]` (hwc) or `[n, 3, h, w]` (chw), uint8 or float32.
    #[pyo3(get)]
    image: Py<PyAny>,
    /// int64 `[n]`; -1 where the source has no label.
    #[pyo3(get)]
    label: Py<PyAny>,
    /// int64 `[n]`: the samples' keys (manifest positions).
    #[pyo3(get)]
    key: Py<PyAny>,
    /// float32 `[n]` importance weights, or None under uniform sampling.
    #[pyo3(get)]
    weight: Option<Py<PyAny>>,
    /// float32 `[n, max_boxes, 4]` XYXY boxes padded with zeros, or None when the source
    /// has no boxes.
    #[pyo3(get)]
    boxes: Option<Py<PyAny>>,
    /// int64 `[n, max_boxes]` box labels, -1 in the padding (None without boxes).
    #[pyo3(get)]
    box_labels: Option<Py<PyAny>>,
    /// int32 `[n]`: how many of each sample's box rows are real (None without boxes).
    #[pyo3(get)]
    box_count: Option<Py<PyAny>>,
    /// uint8 `[n, h, w]` segmentation masks (class ids), or None when the source reads none.
    #[pyo3(get)]
    masks: Option<Py<PyAny>>,
    /// The spec's metadata fields by name (float32 `[n]`, int64 `[n]`, multi-hot float32
    /// `[n, classes]`, or a list of str for text and JSON), or None when it asks for none.
    #[pyo3(get)]
    fields: Option<Py<PyAny>>,
    #[pyo3(get)]
    epoch: u64,
    #[pyo3(get)]
    index: u64,
    /// `"hwc"` or `"chw"`.
    #[pyo3(get)]
    layout: &'static str,
    /// Address of the image buffer Rust filled; the numpy array's data pointer is this one.
    #[pyo3(get)]
    buffer_address: usize,
}

impl RawBatch {
    /// Hands a batch (local or from the service) to numpy without copying its own buffers
    /// (borrowed memory, a service worker's, is copied into a pooled one); its image
    /// buffer goes back to `buffers` when numpy frees it.
    pub(crate) fn new(py: Python<'_>, batch: Batch, buffers: &Arc<BufferPool>) -> PyResult<Self> {
        let Batch { epoch, index, keys, labels, images, layout, weights, boxes, fields } = batch;
        let fields = fields.map(|f| fields_dict(py, *f, keys.len())).transpose()?;
        let n = keys.len();
        let (boxes, box_labels, box_count, masks) = match boxes {
            Some(b) => {
                let mut b = *b;
                let masks = match b.masks.take() {
                    Some(t) => match t.data {
                        TensorData::U8(v) => Some(PyArray1::from_vec(py, v).reshape(t.shape)?.into_any().unbind()),
                        _ => None,
                    },
                    None => None,
                };
                let m = b.max_boxes;
                let arr = PyArray1::from_vec(py, b.boxes).reshape([n, m, 4])?.into_any().unbind();
                let labels = PyArray1::from_vec(py, b.labels).reshape([n, m])?.into_any().unbind();
                (Some(arr), Some(labels), Some(PyArray1::from_vec(py, b.counts).into_any().unbind()), masks)
            }
            None => (None, None, None, None),
        };
        let (image, buffer_address) = image_array(py, images, buffers)?;
        // Keys are manifest positions, far below i64::MAX; int64 is what torch indexes with.
        let keys: Vec<i64> = keys.into_iter().map(|k| k as i64).collect();
        Ok(Self {
            image,
            label: PyArray1::from_vec(py, labels).into_any().unbind(),
            key: PyArray1::from_vec(py, keys).into_any().unbind(),
            weight: weights.map(|w| PyArray1::from_vec(py, w).into_any().unbind()),
            boxes,
            box_labels,
            box_count,
            masks,
            fields,
            epoch,
            index,
            layout: match layout {
                Layout::Hwc => "hwc",
                Layout::Chw => "chw",
            },
            buffer_address,
        })
    }
}

/// A batch's metadata fields as a dict of numpy arrays (numbers) and lists of str.
fn fields_dict(py: Python<'_>, fields: BatchFields, n: usize) -> PyResult<Py<PyAny>> {
    let dict = PyDict::new(py);
    for BatchField { name, values } in fields.fields {
        let value = match values {
            FieldValues::Float(v) => PyArray1::from_vec(py, v).into_any().unbind(),
            FieldValues::Int(v) => PyArray1::from_vec(py, v).into_any().unbind(),
            FieldValues::MultiHot { classes, values } => {
                PyArray1::from_vec(py, values).reshape([n, classes])?.into_any().unbind()
            }
            FieldValues::Text(v) | FieldValues::Json(v) => PyList::new(py, v)?.into_any().unbind(),
        };
        dict.set_item(name, value)?;
    }
    Ok(dict.into_any().unbind())
}
