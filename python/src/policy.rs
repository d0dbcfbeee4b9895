//! The augmentation policies' op tables and sub-ops, as data and as one-op runs, so the
//! Python tests can check each branch a policy may draw against torchvision's functional
//! (the policies themselves run inside the pipeline like any op).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_codec::{policy_space as space, run_policy_op, PolicyOp, PolicySpace};
use sluice_core::Interpolation;

/// One entry of a policy's op space: torchvision's name, the magnitudes per bin (`None` for
/// an op without one) and whether the op takes a random sign.
type SpaceEntry = (&'static str, Option<Vec<f32>>, bool);

/// The op space of `policy` (`trivial_augment_wide`, `rand_augment` or `auto_augment`) for
/// `num_bins` magnitude bins on a `width x height` image, in torchvision's order.
#[pyfunction]
pub fn policy_space(policy: &str, num_bins: u32, height: u32, width: u32) -> PyResult<Vec<SpaceEntry>> {
    let s = PolicySpace::from_name(policy).ok_or_else(|| PyValueError::new_err(format!("no policy `{policy}`")))?;
    if num_bins < 2 {
        return Err(PyValueError::new_err("num_bins must be at least 2"));
    }
    Ok(space(s, num_bins, height, width))
}

/// Runs the policy sub-op `op` (torchvision's name, e.g. `"ShearX"`) at `magnitude` on a
/// `width x height` RGB8 HWC image, as a policy that drew it does; returns the pixels.
#[pyfunction]
#[pyo3(signature = (op, magnitude, image, width, height, interpolation = "nearest", fill = None))]
#[allow(clippy::too_many_arguments)]
pub fn policy_op<'py>(
    py: Python<'py>,
    op: &str,
    magnitude: f32,
    image: &[u8],
    width: u32,
    height: u32,
    interpolation: &str,
    fill: Option<[u8; 3]>,
) -> PyResult<Bound<'py, PyBytes>> {
    let op = PolicyOp::from_name(op).ok_or_else(|| PyValueError::new_err(format!("no policy op `{op}`")))?;
    let interpolation = match interpolation {
        "nearest" => Interpolation::Nearest,
        "bilinear" => Interpolation::Bilinear,
        other => return Err(PyValueError::new_err(format!("interpolation must be nearest or bilinear; got {other}"))),
    };
    let out = run_policy_op(op, magnitude, image, (width, height), interpolation, fill)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &out))
}
