//! A batch: columnar and contiguous, one buffer per field, ready to hand to numpy/torch
//! without copying.

use std::any::Any;
use std::ptr::NonNull;

use crate::image::{DType, Layout};

#[derive(Debug)]
pub enum TensorData {
    U8(Vec<u8>),
    F32(Vec<f32>),
    /// u8 pixels in memory the tensor borrows from an owner: a slot of a service worker's
    /// shared memory, which the loader fills in place so the batch is never copied there.
    SharedU8(SharedBytes),
}

impl Clone for TensorData {
    /// A clone owns its bytes: shared memory is copied out, never aliased.
    fn clone(&self) -> Self {
        match self {
            Self::U8(v) => Self::U8(v.clone()),
            Self::F32(v) => Self::F32(v.clone()),
            Self::SharedU8(s) => Self::U8(s.as_slice().to_vec()),
        }
    }
}

impl PartialEq for TensorData {
    /// Equal values, wherever they live.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::F32(a), Self::F32(b)) => a == b,
            (Self::F32(_), _) | (_, Self::F32(_)) => false,
            (a, b) => a.u8_bytes() == b.u8_bytes(),
        }
    }
}

impl TensorData {
    fn u8_bytes(&self) -> &[u8] {
        match self {
            Self::U8(v) => v,
            Self::SharedU8(s) => s.as_slice(),
            Self::F32(_) => &[],
        }
    }
}

/// Bytes borrowed from an owner that keeps them valid while it lives (see
/// [`TensorData::SharedU8`]). Up to `capacity` bytes are usable; `len` are in use.
pub struct SharedBytes {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are reached only through this value (see `new`), and the owner is
// Send + Sync.
unsafe impl Send for SharedBytes {}
// SAFETY: as for Send: shared references only read the bytes, and mutation needs `&mut`.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `capacity` initialised bytes for as long
    /// as `owner` lives, and nothing else may touch them meanwhile.
    pub unsafe fn new(ptr: NonNull<u8>, capacity: usize, owner: Box<dyn Any + Send + Sync>) -> Self {
        Self { ptr, len: capacity, capacity, owner }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len ≤ capacity bytes, valid and initialised while `owner` lives (`new`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Uses the first `len` bytes (at most `capacity`); whatever they hold stays.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    pub fn owner(&self) -> &(dyn Any + Send + Sync) {
        &*self.owner
    }

    /// Gives up the bytes, returning their owner.
    pub fn into_owner(self) -> Box<dyn Any + Send + Sync> {
        self.owner
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} of {} bytes)", self.len, self.capacity)
    }
}

/// A dense, C-contiguous tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    /// A zeroed tensor of `shape`.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        let data = match dtype {
            DType::U8 => TensorData::U8(vec![0; n]),
            DType::F32 => TensorData::F32(vec![0.0; n]),
        };
        Self { shape, data }
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::U8(_) | TensorData::SharedU8(_) => DType::U8,
            TensorData::F32(_) => DType::F32,
        }
    }

    /// The whole buffer as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            TensorData::U8(v) => v,
            TensorData::SharedU8(s) => s.as_slice(),
            // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1.
            TensorData::F32(v) => unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4) },
        }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            TensorData::U8(v) => v,
            TensorData::SharedU8(s) => s.as_mut_slice(),
            // SAFETY: as above; every bit pattern is a valid f32.
            TensorData::F32(v) => unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 4) },
        }
    }

    /// Keeps the first `n` rows (along the first axis).
    pub fn truncate_rows(&mut self, n: usize) {
        if self.shape.is_empty() {
            return;
        }
        let row: usize = self.shape[1..].iter().product();
        match &mut self.data {
            TensorData::U8(v) => v.truncate(n * row),
            TensorData::F32(v) => v.truncate(n * row),
            TensorData::SharedU8(s) => s.set_len(s.as_slice().len().min(n * row)),
        }
        self.shape[0] = n;
    }
}

/// One batch of samples, in epoch order.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub epoch: u64,
    /// Index of this batch within its epoch.
    pub index: u64,
    pub keys: Vec<u64>,
    pub labels: Vec<i64>,
    /// `[n, h, w, 3]` (HWC) or `[n, 3, h, w]` (CHW), u8 or f32.
    pub images: Tensor,
    pub layout: Layout,
    /// Per-sample weights that keep an importance-sampled loss unbiased; `None` when
    /// sampling is uniform.
    pub weights: Option<Vec<f32>>,
    /// The samples' boxes, padded, when the source carries boxes; `None` otherwise.
    /// Boxed: most batches have none, and a `Batch` is moved around in enums.
    pub boxes: Option<Box<crate::record::BatchBoxes>>,
    /// The samples' metadata fields, when the spec asks for fields; `None` otherwise.
    pub fields: Option<Box<crate::fields::BatchFields>>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_rows_keeps_leading_samples() {
        let mut t = Tensor::zeros(DType::F32, vec![4, 2, 3]);
        if let TensorData::F32(v) = &mut t.data {
            for (i, x) in v.iter_mut().enumerate() {
                *x = i as f32;
            }
        }
        t.truncate_rows(2);
        assert_eq!(t.shape, vec![2, 2, 3]);
        assert_eq!(t.as_bytes().len(), 2 * 6 * 4);
        match &t.data {
            TensorData::F32(v) => assert_eq!(v.last().copied(), Some(11.0)),
            _ => panic!("dtype changed"),
        }
    }

    #[test]
    fn shared_bytes_truncate_compare_and_clone_into_owned_memory() {
        let mut backing = vec![1u8, 2, 3, 4, 5, 6];
        let owner: Box<dyn Any + Send + Sync> = Box::new("the slot");
        // SAFETY: `backing` outlives the tensor and is not touched while it lives.
        let shared = unsafe { SharedBytes::new(NonNull::new(backing.as_mut_ptr()).unwrap(), 6, owner) };
        let mut t = Tensor { shape: vec![3, 2], data: TensorData::SharedU8(shared) };
        assert_eq!(t.dtype(), DType::U8);
        t.as_bytes_mut()[0] = 9;
        t.truncate_rows(2);
        assert_eq!(t.as_bytes(), &[9, 2, 3, 4]);
        assert_eq!(t, Tensor { shape: vec![2, 2], data: TensorData::U8(vec![9, 2, 3, 4]) });
        let copy = t.clone();
        assert!(matches!(copy.data, TensorData::U8(_)), "a clone owns its bytes");
        let TensorData::SharedU8(s) = t.data else { panic!("still shared") };
        assert_eq!(s.capacity(), 6);
        assert_eq!(s.into_owner().downcast_ref::<&str>(), Some(&"the slot"));
        assert_eq!(backing[0], 9);
    }
}
