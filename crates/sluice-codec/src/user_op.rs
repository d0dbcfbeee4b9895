//! User-defined ops: the `map` op of a spec calls a function registered here by name.
//!
//! This is the escape hatch for code sluice does not ship. A Rust crate implements
//! [`UserOp`] and registers it with [`register_user_op`] before it builds a loader; a spec
//! then names it in a `{op = "map", fn = "mycrate:blur"}` op. The Python binding does the
//! same for `Pipeline.map(fn)`, registering a `UserOp` that calls the function imported from
//! `module:qualname`.
//!
//! A user op sees one sample's RGB8 HWC image and its [`SampleInfo`] (key, label, epoch and
//! a seed drawn from the per-sample RNG at the op's place in the op list), so its output is
//! a function of (bytes, seed, epoch, key) like the native ops': the same for any thread
//! or process count, and exact across a checkpoint.
//!
//! Where the source has segmentation masks, the op is called through
//! [`UserOp::apply_masked`] with the sample's [`Mask`] as well: it may edit the mask in
//! place or replace it. The plan then checks that the mask has the size of the image the
//! op returned; an op that knows nothing of masks (the default) keeps the mask as it was,
//! so it must not change the image's size.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use sluice_core::Mask;

/// A sample's RGB8 HWC pixels, `width x height`, as a user op receives them.
#[derive(Debug, Clone, Copy)]
pub struct ImageRef<'a> {
    pub pixels: &'a [u8],
    pub width: u32,
    pub height: u32,
}

/// What a user op is told about its sample besides the pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleInfo {
    pub key: u64,
    /// -1 where the source has no labels.
    pub label: i64,
    pub epoch: u64,
    /// Drawn from the sample's RNG (seed, epoch, key) where the op stands in the op list:
    /// seed the op's own generator with it.
    pub seed: u64,
    /// The most pixels the op's output may have (the spec's `limits.max_pixels`): an op
    /// that reads its output from elsewhere checks it before allocating.
    pub max_pixels: u64,
}

/// Why a user op failed on a sample: the message the user's code gave. The pipeline adds
/// the sample's key and path, and `on_error` decides whether the sample is skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UserOpError(pub String);

/// An op a crate (or the Python binding) supplies. Called from sluice's worker threads,
/// once per sample, so it must be `Send + Sync`; keep per-call state on the stack.
pub trait UserOp: Send + Sync {
    /// Transforms `image` into `out` (cleared by the caller's previous use; resize it to
    /// fit) as RGB8 HWC and returns the new `(width, height)`. `out` must then hold at
    /// least `width * height * 3` bytes.
    fn apply(&self, image: ImageRef<'_>, sample: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError>;

    /// Like [`apply`](Self::apply), but the result ends up in `pixels`, which holds the
    /// `width x height` image (and may be longer): an op that edits the image in place
    /// writes nothing else. `spare` is scratch it may use (and swap with `pixels`). The
    /// default runs `apply` into `spare` and swaps.
    fn apply_in_place(
        &self,
        pixels: &mut Vec<u8>,
        (width, height): (u32, u32),
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        let n = width as usize * height as usize * 3;
        let image = ImageRef { pixels: pixels.get(..n).unwrap_or(pixels), width, height };
        let size = self.apply(image, sample, spare)?;
        std::mem::swap(pixels, spare);
        Ok(size)
    }

    /// Like [`apply_in_place`](Self::apply_in_place) for a sample with a segmentation
    /// mask (`width x height`, one byte a pixel, the image's size): the op may edit
    /// `mask.data` in place or replace the whole mask, which must then have the size of
    /// the image it returns (else the sample fails naming the op). The default runs
    /// `apply_in_place` and leaves the mask alone.
    fn apply_masked(
        &self,
        pixels: &mut Vec<u8>,
        size: (u32, u32),
        mask: &mut Mask,
        sample: &SampleInfo,
        spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        let _ = mask;
        self.apply_in_place(pixels, size, sample, spare)
    }
}

type Registry = RwLock<HashMap<String, Arc<dyn UserOp>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Makes `op` the function that `map` ops naming `name` call, in plans compiled from now
/// on (and in compiled plans that found no op under that name). Registering a name again
/// replaces the op.
pub fn register_user_op(name: &str, op: Arc<dyn UserOp>) {
    // A poisoned lock only means another registration panicked; the map is still whole.
    let mut map = registry().write().unwrap_or_else(|e| e.into_inner());
    map.insert(name.to_owned(), op);
}

/// Takes the op registered under `name` out of the registry: plans compiled before keep
/// the op they found, so it lives as long as they do.
pub fn unregister_user_op(name: &str) -> Option<Arc<dyn UserOp>> {
    let mut map = registry().write().unwrap_or_else(|e| e.into_inner());
    map.remove(name)
}

/// The op registered under `name`.
pub fn user_op(name: &str) -> Option<Arc<dyn UserOp>> {
    let map = registry().read().unwrap_or_else(|e| e.into_inner());
    map.get(name).cloned()
}

/// A `map` op in a compiled plan: its name and the op found under it at compile time.
#[derive(Clone)]
pub(crate) struct UserOpSlot {
    pub name: String,
    op: Option<Arc<dyn UserOp>>,
}

impl UserOpSlot {
    pub fn resolve(name: &str) -> Self {
        Self { name: name.to_owned(), op: user_op(name) }
    }

    /// The op, looked up again if none was registered when the plan was compiled.
    pub fn op(&self) -> Option<Arc<dyn UserOp>> {
        self.op.clone().or_else(|| user_op(&self.name))
    }
}

impl PartialEq for UserOpSlot {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl fmt::Debug for UserOpSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserOpSlot").field("name", &self.name).field("registered", &self.op.is_some()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use sluice_core::{BoxTargets, Limits, OpSpec, SampleKey, SampleRng, Size};

    use super::*;
    use crate::{encode_jpeg, CodecError, Plan, Records, Scratch};

    /// Inverts the image and remembers the sample it was told about.
    struct Invert(Mutex<Vec<SampleInfo>>);

    impl UserOp for Invert {
        fn apply(
            &self,
            image: ImageRef<'_>,
            sample: &SampleInfo,
            out: &mut Vec<u8>,
        ) -> Result<(u32, u32), UserOpError> {
            self.0.lock().map_err(|e| UserOpError(e.to_string()))?.push(*sample);
            out.clear();
            out.extend(image.pixels.iter().map(|v| 255 - v));
            Ok((image.width, image.height))
        }
    }

    /// Fails, or returns a size its output does not hold.
    struct Broken {
        lie: bool,
    }

    impl UserOp for Broken {
        fn apply(&self, image: ImageRef<'_>, _: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
            if self.lie {
                out.clear();
                return Ok((image.width * 2, image.height));
            }
            Err(UserOpError("ValueError: boom".into()))
        }
    }

    /// Inverts image and mask in place, or (`halve`) keeps the left half of the image and
    /// leaves the mask to the default `apply_masked`.
    struct Both {
        halve: bool,
    }

    impl UserOp for Both {
        fn apply(&self, image: ImageRef<'_>, _: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
            out.clear();
            let (w, h) = (image.width as usize, image.height as usize);
            let keep = if self.halve { w / 2 } else { w };
            for row in image.pixels.chunks(w * 3).take(h) {
                out.extend(row[..keep * 3].iter().map(|v| 255 - v));
            }
            Ok((keep as u32, image.height))
        }

        fn apply_masked(
            &self,
            pixels: &mut Vec<u8>,
            size: (u32, u32),
            mask: &mut Mask,
            sample: &SampleInfo,
            spare: &mut Vec<u8>,
        ) -> Result<(u32, u32), UserOpError> {
            if !self.halve {
                mask.data.iter_mut().for_each(|v| *v = 255 - *v);
            }
            self.apply_in_place(pixels, size, sample, spare)
        }
    }

    fn run_masked(plan: &Plan, key: u64) -> Result<(Vec<u8>, Mask), CodecError> {
        let rgb: Vec<u8> = (0..16 * 12 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let jpeg = encode_jpeg(&rgb, 16, 12, 95).map_err(|e| CodecError::Corrupt(e.to_string()))?;
        let mut mask = Mask { width: 16, height: 12, data: (0..16 * 12).map(|i| (i % 13) as u8).collect() };
        let mut scratch = Scratch::new();
        scratch.sample = SampleInfo { key, label: 3, epoch: 1, seed: 0, max_pixels: 0 };
        let mut out = vec![0u8; plan.output_bytes()];
        let mut times = vec![Duration::ZERO; plan.step_names().len()];
        let mut rng = SampleRng::new(5, 1, SampleKey(key), 0);
        let mut boxes = BoxTargets::default();
        plan.run(
            &jpeg,
            &mut rng,
            &mut scratch,
            &mut out,
            &mut times,
            Records { boxes: Some(&mut boxes), mask: Some(&mut mask) },
        )?;
        Ok((out, mask))
    }

    #[test]
    fn an_op_sees_and_edits_the_mask_and_one_that_resizes_the_image_alone_fails_the_sample() {
        register_user_op("tests:both", Arc::new(Both { halve: false }));
        register_user_op("tests:halve", Arc::new(Both { halve: true }));
        let plain = run_masked(&Plan::compile(&ops("tests:both")[..2], Limits::default()), 2).unwrap();
        let (image, mask) = run_masked(&Plan::compile(&ops("tests:both"), Limits::default()), 2).unwrap();
        assert_eq!(image, plain.0.iter().map(|v| 255 - v).collect::<Vec<_>>());
        assert_eq!((mask.width, mask.height), (8, 8));
        assert_eq!(mask.data, plain.1.data.iter().map(|v| 255 - v).collect::<Vec<_>>());
        let err = run_masked(&Plan::compile(&ops("tests:halve"), Limits::default()), 2).unwrap_err();
        assert_eq!(
            err,
            CodecError::UserOp {
                op: "tests:halve".into(),
                message: "it changed the image to 4x8 but returned no mask of that size".into()
            }
        );
    }

    fn ops(name: &str) -> Vec<OpSpec> {
        vec![OpSpec::Decode, OpSpec::CenterCrop { size: Size::square(8) }, OpSpec::map(name)]
    }

    fn run(plan: &Plan, key: u64) -> Result<Vec<u8>, CodecError> {
        let rgb: Vec<u8> = (0..16 * 12 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let jpeg = encode_jpeg(&rgb, 16, 12, 95).map_err(|e| CodecError::Corrupt(e.to_string()))?;
        let mut scratch = Scratch::new();
        scratch.sample = SampleInfo { key, label: 3, epoch: 1, seed: 0, max_pixels: 0 };
        let mut out = vec![0u8; plan.output_bytes()];
        let mut times = vec![Duration::ZERO; plan.step_names().len()];
        plan.run(
            &jpeg,
            &mut SampleRng::new(5, 1, SampleKey(key), 0),
            &mut scratch,
            &mut out,
            &mut times,
            Records::default(),
        )?;
        assert!(times.iter().all(|t| *t > Duration::ZERO), "every step timed: {times:?}");
        Ok(out)
    }

    #[test]
    fn a_registered_op_runs_between_native_ops_with_the_sample_and_a_seed_from_its_rng() {
        let invert = Arc::new(Invert(Mutex::new(Vec::new())));
        register_user_op("tests:invert", invert.clone());
        let plain = Plan::compile(&ops("tests:invert")[..2], Limits::default());
        let mapped = Plan::compile(&ops("tests:invert"), Limits::default());
        assert_eq!(mapped.step_names(), ["decode+center_crop", "map", "write"]);
        let (a, b) = (run(&plain, 7).unwrap(), run(&mapped, 7).unwrap());
        assert_eq!(b, a.iter().map(|v| 255 - v).collect::<Vec<_>>());
        // The seed is the sample RNG's next draw: the same for the same (seed, epoch, key).
        run(&mapped, 7).unwrap();
        run(&mapped, 8).unwrap();
        let seen = invert.0.lock().unwrap().clone();
        let first = SampleRng::new(5, 1, SampleKey(7), 0).next_u64();
        assert_eq!(seen[0], SampleInfo { key: 7, label: 3, epoch: 1, seed: first, max_pixels: 64 * 1024 * 1024 });
        assert_eq!(seen[1], seen[0]);
        assert_ne!(seen[2].seed, first);
    }

    #[test]
    fn a_failing_missing_or_lying_op_is_an_error_naming_the_op_not_a_panic() {
        register_user_op("tests:boom", Arc::new(Broken { lie: false }));
        register_user_op("tests:lie", Arc::new(Broken { lie: true }));
        let err = |name: &str| run(&Plan::compile(&ops(name), Limits::default()), 1).unwrap_err();
        assert_eq!(
            err("tests:boom"),
            CodecError::UserOp { op: "tests:boom".into(), message: "ValueError: boom".into() }
        );
        assert!(
            matches!(err("tests:lie"), CodecError::UserOp { op, message } if op == "tests:lie" && message.contains("16x8"))
        );
        assert_eq!(err("tests:nobody"), CodecError::UnknownUserOp("tests:nobody".into()));
        // A plan compiled before the registration finds the op when it runs.
        let early = Plan::compile(&ops("tests:late"), Limits::default());
        register_user_op("tests:late", Arc::new(Invert(Mutex::new(Vec::new()))));
        assert!(run(&early, 1).is_ok());
    }
}
