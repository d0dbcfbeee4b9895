//! Pixel ops beyond the fused decode/crop/resize and the horizontal flip that the plan
//! runs itself: colour ops in [`color`], geometric ones in [`geometry`], and the
//! augmentation policies in [`policy`] (which draw sub-ops and run those kernels). Each
//! runs on an RGB8 HWC image, draws its randomness from the sample's RNG (so output is the same for
//! any thread count and resumes exactly), and follows `torchvision.transforms.v2`
//! (docs/ops.md lists each op with its counterpart; python/tests/test_ops.py checks the
//! pixels against torchvision's).
//!
//! An op joins by adding its `OpSpec` variant (sluice-core's `spec/ops.rs`: bounds, the
//! size it leaves, its `Geometry`: whether it moves boxes and masks), an arm in its module's [`color::runs`]/[`color::apply`] (or
//! geometry's), a builder method in python/sluice/pipeline.py and a row in docs/ops.md.

use sluice_core::{DType, Geometry, Layout, OpSpec, SampleRng};

use crate::boxes::Motion;
use crate::masks::MaskMove;
use crate::CodecError;

mod color;
pub(crate) mod geometry;
pub(crate) mod iou_crop;
pub(crate) mod policy;

/// Whether this module runs `op`.
pub(crate) fn runs(op: &OpSpec) -> bool {
    color::runs(op) || geometry::runs(op) || policy::runs(op)
}

/// Whether a horizontal flip still pending before `op` may stay pending past it: true for
/// ops that act on each pixel alone, so flipping before or after gives the same pixels.
pub(crate) fn commutes_with_flip(op: &OpSpec) -> bool {
    color::runs(op) && color::is_pointwise(op)
}

/// One op's run on one sample: the `w x h` RGB8 HWC image it reads (`src`), the sample's
/// RNG it draws from, the buffer it writes (`dst`, resized to fit) and the most pixels its
/// output may have (an expanded rotation or a pad past `max_pixels` is refused). Every op's
/// `apply` takes one, so the argument list lives here once.
pub(crate) struct Frame<'a> {
    pub src: &'a [u8],
    pub w: u32,
    pub h: u32,
    pub rng: &'a mut SampleRng,
    pub max_pixels: u64,
    pub dst: &'a mut Vec<u8>,
}

/// How an op moved the pixels: `motion` for the sample's boxes, `mask` what to replay on its
/// mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Moved {
    pub motion: Motion,
    pub mask: MaskMove,
}

impl Moved {
    /// Nothing moved.
    pub(crate) const NONE: Self = Self { motion: Motion::Identity, mask: MaskMove::Identity };
}

/// Runs `op` on `f`; returns the result's size and how the pixels moved, as the op's
/// [`Geometry`] says: only a `Moves` op (the geometry module) reports motion; a `Keeps` op
/// (colour) moves nothing; a `RefusesBoxes` op (the policies) runs only on a sample
/// without boxes or a mask (`has_records`), which validation already ensures.
pub(crate) fn apply(op: &OpSpec, f: Frame<'_>, has_records: bool) -> Result<((u32, u32), Moved), CodecError> {
    match op.geometry() {
        Geometry::Moves => geometry::apply_moving(op, f),
        Geometry::Keeps => Ok((color::apply(op, f)?, Moved::NONE)),
        Geometry::RefusesBoxes if has_records => Err(CodecError::RefusesBoxes { op: op.name() }),
        Geometry::RefusesBoxes => Ok((policy::apply(op, f)?, Moved::NONE)),
        Geometry::User => Err(not_mine(op, "pixel")),
    }
}

/// Runs `random_erasing` on the output slot `out`: a `w x h` RGB sample as the plan wrote
/// it (`dtype`, `layout`), so its `value` is in the output's units (after `normalize`).
pub(crate) fn erase_output(
    op: &OpSpec,
    out: &mut [u8],
    (w, h): (u32, u32),
    (dtype, layout): (DType, Layout),
    rng: &mut SampleRng,
) -> Result<(), CodecError> {
    let OpSpec::RandomErasing { p, scale, ratio, value } = *op else {
        return Err(not_mine(op, "output"));
    };
    let n = (w as usize).checked_mul(h as usize).and_then(|n| n.checked_mul(3 * dtype.size()));
    if n != Some(out.len()) {
        return Err(CodecError::Shape(format!("a {w}x{h} {dtype:?} sample does not fill a {}-byte slot", out.len())));
    }
    color::random_erasing(p, scale, ratio, value, out, w, h, dtype, layout, rng);
    Ok(())
}

/// The `w x h` RGB8 image at the start of `src`, and `dst` sized to hold one as large.
fn frames<'a>(src: &'a [u8], dst: &'a mut Vec<u8>, w: u32, h: u32) -> Result<(&'a [u8], &'a mut [u8]), CodecError> {
    let n = (w as usize).checked_mul(h as usize).and_then(|p| p.checked_mul(3));
    let n = n.ok_or_else(|| CodecError::Shape(format!("a {w}x{h} image is too large to hold")))?;
    let src = src
        .get(..n)
        .ok_or_else(|| CodecError::Shape(format!("a {w}x{h} RGB image needs {n} bytes; got {}", src.len())))?;
    dst.resize(n, 0);
    Ok((src, &mut dst[..n]))
}

/// The op was handed to a module that does not run it: a bug in the plan, reported as an
/// error rather than a panic.
fn not_mine(op: &OpSpec, module: &str) -> CodecError {
    CodecError::Unsupported(format!("`{}` is not a {module} op", op.name()))
}
