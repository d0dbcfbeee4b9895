//! Batches to and from their wire form. u8 pixels move without a copy; f32 pixels are
//! reinterpreted as little-endian bytes.

use sluice_core::{Batch, Layout, Tensor, TensorData};

use crate::error::ServiceError;
use crate::proto::{dtype, layout, BatchMessage};

pub fn batch_to_message(batch: Batch) -> BatchMessage {
    let Batch { epoch, index, keys, labels, images, layout: lay, weights } = batch;
    let Tensor { shape, data } = images;
    let (dt, data) = match data {
        TensorData::U8(v) => (dtype::U8, v),
        TensorData::F32(v) => (dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    BatchMessage {
        epoch,
        index,
        keys,
        labels,
        shape: shape.iter().map(|&d| d as u64).collect(),
        dtype: dt,
        layout: match lay {
            Layout::Hwc => layout::HWC,
            Layout::Chw => layout::CHW,
        },
        data,
        has_weights: weights.is_some(),
        weights: weights.unwrap_or_default(),
    }
}

pub fn message_to_batch(m: BatchMessage) -> Result<Batch, ServiceError> {
    let shape: Vec<usize> = m.shape.iter().map(|&d| d as usize).collect();
    let elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(elements) = elements else {
        return Err(ServiceError::BadBatch(format!("shape {shape:?} overflows")));
    };
    if shape.first().copied() != Some(m.keys.len()) || m.labels.len() != m.keys.len() {
        return Err(ServiceError::BadBatch(format!(
            "batch {} of epoch {}: shape {shape:?} does not match {} keys and {} labels",
            m.index,
            m.epoch,
            m.keys.len(),
            m.labels.len()
        )));
    }
    let data = match m.dtype {
        dtype::U8 if m.data.len() == elements => TensorData::U8(m.data),
        dtype::F32 if m.data.len() == elements * 4 => TensorData::F32(
            m.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        ),
        other => {
            return Err(ServiceError::BadBatch(format!(
                "batch {}: {} bytes of dtype {other} for shape {shape:?}",
                m.index,
                m.data.len()
            )))
        }
    };
    let lay = match m.layout {
        layout::HWC => Layout::Hwc,
        layout::CHW => Layout::Chw,
        other => return Err(ServiceError::BadBatch(format!("unknown layout {other}"))),
    };
    if m.has_weights && m.weights.len() != m.keys.len() {
        return Err(ServiceError::BadBatch(format!("batch {}: {} weights for {} keys", m.index, m.weights.len(), m.keys.len())));
    }
    Ok(Batch {
        epoch: m.epoch,
        index: m.index,
        keys: m.keys,
        labels: m.labels,
        images: Tensor { shape, data },
        layout: lay,
        weights: m.has_weights.then_some(m.weights),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::DType;

    #[test]
    fn batches_round_trip_and_bad_shapes_are_refused() {
        for dt in [DType::U8, DType::F32] {
            let mut images = Tensor::zeros(dt, vec![2, 3, 4, 3]);
            images.as_bytes_mut()[5] = 7;
            let b = Batch {
                epoch: 3,
                index: 9,
                keys: vec![4, 8],
                labels: vec![1, -1],
                images,
                layout: Layout::Chw,
                weights: Some(vec![0.5, 2.0]),
            };
            let back = message_to_batch(batch_to_message(b.clone())).map_err(|e| e.to_string());
            assert_eq!(back, Ok(b));
        }
        let mut m = batch_to_message(Batch {
            epoch: 0,
            index: 0,
            keys: vec![1],
            labels: vec![0],
            images: Tensor::zeros(DType::U8, vec![1, 2, 2, 3]),
            layout: Layout::Hwc,
            weights: None,
        });
        m.data.pop();
        assert!(matches!(message_to_batch(m), Err(ServiceError::BadBatch(_))));
    }
}
