//! A batch's image buffer while the workers fill it: one contiguous tensor, each worker
//! writing the slots of its own chunk in place, so a batch is assembled without copies.

use std::cell::UnsafeCell;

use sluice_core::{DType, Tensor, TensorData};

/// One batch's buffer while workers fill it. Each worker writes only the slots of its own
/// chunk, so the writes never overlap.
pub(super) struct Slab {
    tensor: UnsafeCell<Tensor>,
    base: *mut u8,
    pub(super) slot_bytes: usize,
    slots: usize,
}

// SAFETY: workers write disjoint slots (one chunk each) through `base`; the consumer reads
// the tensor only after every chunk has reported done and dropped its handle.
unsafe impl Send for Slab {}
// SAFETY: shared handles only write disjoint slots (see Send); nothing reads the tensor
// while more than one handle exists.
unsafe impl Sync for Slab {}

impl Slab {
    /// A buffer for `slots` samples (at most `batch.size`, so its size products cannot wrap:
    /// `Loader::build` bounds a full batch's bytes): the given one (from a
    /// [`BufferSource`](super::BufferSource), or recycled by [`Loader::recycle`](super::Loader::recycle))
    /// when it fits, else zeroed memory. Every slot is overwritten or dropped before the batch
    /// is handed out, so what a recycled buffer held never shows.
    pub(super) fn new(dtype: DType, slots: usize, shape: [usize; 3], spare: Option<Tensor>) -> Self {
        let dims = vec![slots, shape[0], shape[1], shape[2]];
        let n = dims.iter().product();
        let mut tensor = match spare {
            Some(Tensor { data: TensorData::U8(mut v), .. }) if dtype == DType::U8 => {
                v.resize(n, 0);
                Tensor { shape: dims, data: TensorData::U8(v) }
            }
            Some(Tensor { data: TensorData::F32(mut v), .. }) if dtype == DType::F32 => {
                v.resize(n, 0.0);
                Tensor { shape: dims, data: TensorData::F32(v) }
            }
            Some(Tensor { data: TensorData::SharedU8(mut b), .. }) if dtype == DType::U8 && n <= b.capacity() => {
                b.set_len(n);
                Tensor { shape: dims, data: TensorData::SharedU8(b) }
            }
            _ => Tensor::zeros(dtype, dims),
        };
        let base = tensor.as_bytes_mut().as_mut_ptr();
        let slot_bytes = shape.iter().product::<usize>() * dtype.size();
        Self { tensor: UnsafeCell::new(tensor), base, slot_bytes, slots }
    }

    /// # Safety
    /// No other reference to slot `i` may exist while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slot(&self, i: usize) -> &mut [u8] {
        debug_assert!(i < self.slots);
        // SAFETY: in bounds (i < slots); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.slot_bytes), self.slot_bytes) }
    }

    pub(super) fn into_tensor(self) -> Tensor {
        self.tensor.into_inner()
    }
}
