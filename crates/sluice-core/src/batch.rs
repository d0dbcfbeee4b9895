//! A batch: columnar and contiguous, one buffer per field, ready to hand to numpy/torch
//! without copying.

use crate::image::{DType, Layout};

#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    U8(Vec<u8>),
    F32(Vec<f32>),
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
            TensorData::U8(_) => DType::U8,
            TensorData::F32(_) => DType::F32,
        }
    }

    /// The whole buffer as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            TensorData::U8(v) => v,
            // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1.
            TensorData::F32(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4)
            },
        }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            TensorData::U8(v) => v,
            // SAFETY: as above; every bit pattern is a valid f32.
            TensorData::F32(v) => unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 4)
            },
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
            TensorData::U8(_) => panic!("dtype changed"),
        }
    }
}
