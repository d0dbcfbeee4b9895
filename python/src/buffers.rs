//! Batch image buffers that come back when Python frees a batch.
//!
//! A batch's image array is a view of memory owned by an [`ImageBuffer`] (its numpy base
//! object). When numpy and torch let go of it, the buffer goes back to its loader's
//! [`BufferPool`], and the loader builds a later batch in it: no fresh allocation, which
//! the kernel would fault in and zero page by page on the consumer's core. A buffer is
//! only reused after every array over it is gone, so a batch still referenced is never
//! overwritten.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use numpy::ndarray::{ArrayView, IxDyn};
use numpy::{Element, PyArray};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_core::{DType, Tensor, TensorData};
use sluice_pipeline::BufferSource;

/// Freed image buffers of one loader, waiting for its next batches.
pub struct BufferPool {
    spare: Mutex<Vec<TensorData>>,
    /// At most this many are kept (the prefetch window and a little more); the rest are
    /// freed.
    keep: usize,
    /// Buffers handed out again.
    reused: AtomicU64,
}

impl BufferPool {
    pub fn new(keep: usize) -> Arc<Self> {
        Arc::new(Self { spare: Mutex::new(Vec::new()), keep, reused: AtomicU64::new(0) })
    }

    /// A spare buffer of `dtype` that holds `len` elements without growing, if any.
    fn take(&self, dtype: DType, len: usize) -> Option<TensorData> {
        let mut spare = self.spare.lock();
        let fits = |d: &TensorData| match (d, dtype) {
            (TensorData::U8(v), DType::U8) => v.capacity() >= len,
            (TensorData::F32(v), DType::F32) => v.capacity() >= len,
            _ => false,
        };
        let i = spare.iter().position(fits)?;
        self.reused.fetch_add(1, Ordering::Relaxed);
        Some(spare.swap_remove(i))
    }

    /// Batches built in (or copied into) a buffer that came back, rather than fresh memory.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// A spare u8 buffer of at least `len` bytes, emptied, or a new one.
    pub fn take_u8(&self, len: usize) -> Vec<u8> {
        match self.take(DType::U8, len) {
            Some(TensorData::U8(mut v)) => {
                v.clear();
                v
            }
            _ => Vec::with_capacity(len),
        }
    }

    /// Takes back the image buffer of a batch that never reached Python.
    pub fn recycle(&self, images: Tensor) {
        if !matches!(images.data, TensorData::SharedU8(_)) {
            self.give_back(images.data);
        }
    }

    fn give_back(&self, data: TensorData) {
        let mut spare = self.spare.lock();
        if spare.len() < self.keep {
            spare.push(data);
        }
    }

    /// Hands the loader spare buffers to build batches in.
    pub fn source(self: &Arc<Self>) -> BufferSource {
        let pool = self.clone();
        Arc::new(move |dtype, len| pool.take(dtype, len).map(|data| Tensor { shape: vec![len], data }))
    }
}

/// The memory under a batch's image array (its numpy base object). Dropping it (when
/// the last array or tensor over it goes away) returns the buffer to the pool.
#[pyclass(module = "sluice._sluice", name = "ImageBuffer", frozen)]
pub struct ImageBuffer {
    data: Option<TensorData>,
    pool: Weak<BufferPool>,
}

impl Drop for ImageBuffer {
    fn drop(&mut self) {
        if let (Some(data), Some(pool)) = (self.data.take(), self.pool.upgrade()) {
            pool.give_back(data);
        }
    }
}

/// A numpy array of `shape` over `v`, which goes back to `pool` once the array is freed.
fn pooled_array<T: Element>(
    py: Python<'_>,
    shape: &[usize],
    mut v: Vec<T>,
    wrap: fn(Vec<T>) -> TensorData,
    pool: &Arc<BufferPool>,
) -> PyResult<Py<PyAny>> {
    let ptr = v.as_mut_ptr();
    let len = v.len();
    if shape.iter().product::<usize>() != len {
        return Err(PyRuntimeError::new_err(format!("a batch of {len} elements cannot have shape {shape:?}")));
    }
    let owner = Bound::new(py, ImageBuffer { data: Some(wrap(v)), pool: Arc::downgrade(pool) })?;
    // SAFETY: `ptr` points at `len` initialised elements (checked against `shape`) owned by
    // `owner`'s vector, which moving did not reallocate and which nothing touches until
    // `owner` is dropped; `owner` becomes the array's base object, so it outlives the array.
    let array = unsafe {
        let view = ArrayView::from_shape_ptr(IxDyn(shape), ptr as *const T);
        PyArray::borrow_from_array(&view, owner.into_any())
    };
    Ok(array.into_any().unbind())
}

/// The image array of a batch: over the batch's own buffer (returned to `pool` when freed),
/// or, for memory the batch only borrows (a service worker's), over a copy in a pooled one.
/// Returns the array and the address of its data.
pub fn image_array(py: Python<'_>, images: Tensor, pool: &Arc<BufferPool>) -> PyResult<(Py<PyAny>, usize)> {
    let Tensor { shape, data } = images;
    match data {
        TensorData::U8(v) => {
            let addr = v.as_ptr() as usize;
            Ok((pooled_array(py, &shape, v, TensorData::U8, pool)?, addr))
        }
        TensorData::SharedU8(s) => {
            let mut v = pool.take_u8(s.as_slice().len());
            v.extend_from_slice(s.as_slice());
            let addr = v.as_ptr() as usize;
            Ok((pooled_array(py, &shape, v, TensorData::U8, pool)?, addr))
        }
        TensorData::F32(v) => {
            let addr = v.as_ptr() as usize;
            Ok((pooled_array(py, &shape, v, TensorData::F32, pool)?, addr))
        }
    }
}
