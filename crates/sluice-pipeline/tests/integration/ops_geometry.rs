//! Every op the spec defines, run on a sidecar source with boxes and masks: each either moves
//! the boxes and the mask with the pixels (as torchvision v2 moves `BoundingBoxes` and
//! `Mask`), leaves all three where they were (colour ops, conversions), or is refused by
//! validation naming the op (as torchvision v2 raises for boxes in its policies). An op
//! added to `OpSpec` does not compile here until [`variant`] numbers it, and the walk fails
//! until [`examples`] runs it.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::Path;
use std::sync::Arc;

use sluice_codec::{encode_png_mask, register_user_op, ImageRef, SampleInfo, UserOp, UserOpError};
use sluice_core::{Batch, ErrorPolicy, Geometry, Layout, OpSpec, PipelineSpec, ShuffleSpec, Size, SourceSpec};
use sluice_pipeline::{Loader, Shard};

const W: u32 = 64;
const H: u32 = 48;
/// Background and rectangle grey levels (the background is not black, so a colour op that
/// maps 0 and 255 alike, as `solarize` does, still tells them apart); the mask's class.
const BACKGROUND: u8 = 60;
const RECT: u8 = 255;
const CLASS: u8 = 7;
/// How far (pixels) a box may be from the bounds of its rectangle's pixels: 1 for the
/// crops, resizes, flips and pads; for the warps, whose box is the bounds of the turned
/// corners (as torchvision's), a turned corner is a sharp tip that the sampled pixel
/// centres may miss by up to about 1.6 pixels (measured here), so 2.
const TOLERANCE: f32 = 1.0;
const WARP_TOLERANCE: f32 = 2.0;

/// One rectangle per sample, `[x1, y1, x2, y2]`, inside the image by at least 4 pixels.
const RECTS: [[u32; 4]; 8] = [
    [10, 8, 30, 24],
    [30, 20, 54, 40],
    [5, 25, 25, 43],
    [40, 5, 59, 20],
    [20, 10, 44, 38],
    [6, 6, 18, 40],
    [26, 30, 58, 42],
    [14, 14, 50, 34],
];

/// Each `OpSpec` variant's number, by an exhaustive match: a new variant fails to compile
/// here until it gets one (and then the walk fails until an example runs it).
fn variant(op: &OpSpec) -> usize {
    match op {
        OpSpec::Decode => 0,
        OpSpec::Resize { .. } => 1,
        OpSpec::CenterCrop { .. } => 2,
        OpSpec::RandomResizedCrop { .. } => 3,
        OpSpec::RandomHorizontalFlip { .. } => 4,
        OpSpec::Normalize { .. } => 5,
        OpSpec::Dtype { .. } => 6,
        OpSpec::Layout { .. } => 7,
        OpSpec::RandomVerticalFlip { .. } => 8,
        OpSpec::Invert => 9,
        OpSpec::ColorJitter { .. } => 10,
        OpSpec::RandomGrayscale { .. } => 11,
        OpSpec::Grayscale => 12,
        OpSpec::Solarize { .. } => 13,
        OpSpec::Posterize { .. } => 14,
        OpSpec::Equalize { .. } => 15,
        OpSpec::Autocontrast { .. } => 16,
        OpSpec::AdjustSharpness { .. } => 17,
        OpSpec::GaussianBlur { .. } => 18,
        OpSpec::RandomErasing { .. } => 19,
        OpSpec::RandomRotation { .. } => 20,
        OpSpec::RandomAffine { .. } => 21,
        OpSpec::RandomPerspective { .. } => 22,
        OpSpec::RandomCrop { .. } => 23,
        OpSpec::Pad { .. } => 24,
        OpSpec::RandomIouCrop { .. } => 25,
        OpSpec::TrivialAugmentWide { .. } => 26,
        OpSpec::RandAugment { .. } => 27,
        OpSpec::AutoAugment { .. } => 28,
        OpSpec::AugMix { .. } => 29,
        OpSpec::Sleep { .. } => 30,
        OpSpec::Map { .. } => 31,
    }
}
const VARIANTS: usize = 32;

/// What an op must do to a sample's boxes and mask.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Move them with the pixels (and move something in this example).
    Moves,
    /// Leave them, and the rectangle's pixels, where they were.
    Keeps,
    /// Be refused by validation on a source with boxes.
    Refused,
}

/// The registered `map` op the walk runs: inverts every pixel, moves none.
struct InvertMap;

impl UserOp for InvertMap {
    fn apply(&self, image: ImageRef<'_>, _: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
        out.clear();
        out.extend(image.pixels.iter().map(|v| 255 - v));
        Ok((image.width, image.height))
    }
}
const MAP_FN: &str = "ops_geometry:invert";

/// At least one example of every variant (as JSON, torchvision's parameters where they
/// matter, probabilities at 1 so the op runs), with what it must do.
fn examples() -> Vec<(OpSpec, Expect)> {
    use Expect::*;
    let cases = [
        (r#"{"op": "decode"}"#, Keeps),
        (r#"{"op": "resize", "size": 60}"#, Moves),
        (r#"{"op": "center_crop", "size": [40, 50]}"#, Moves),
        (r#"{"op": "random_resized_crop", "size": [48, 64], "scale": [0.4, 1.0]}"#, Moves),
        (r#"{"op": "random_horizontal_flip", "p": 1}"#, Moves),
        (r#"{"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}"#, Keeps),
        (r#"{"op": "dtype", "dtype": "f32"}"#, Keeps),
        (r#"{"op": "layout", "order": "chw"}"#, Keeps),
        (r#"{"op": "random_vertical_flip", "p": 1}"#, Moves),
        (r#"{"op": "invert"}"#, Keeps),
        (r#"{"op": "color_jitter", "brightness": 0.5, "contrast": 0.5, "saturation": 0.5, "hue": 0.2}"#, Keeps),
        (r#"{"op": "random_grayscale", "p": 1}"#, Keeps),
        (r#"{"op": "grayscale"}"#, Keeps),
        (r#"{"op": "solarize", "threshold": 128}"#, Keeps),
        (r#"{"op": "posterize", "bits": 3}"#, Keeps),
        (r#"{"op": "equalize"}"#, Keeps),
        (r#"{"op": "autocontrast"}"#, Keeps),
        (r#"{"op": "adjust_sharpness", "sharpness_factor": 2}"#, Keeps),
        (r#"{"op": "gaussian_blur", "kernel_size": 5, "sigma": [0.5, 1.5]}"#, Keeps),
        (r#"{"op": "random_erasing", "p": 1}"#, Keeps),
        (r#"{"op": "random_rotation", "degrees": [15, 40]}"#, Moves),
        (r#"{"op": "random_rotation", "degrees": [-90, 90], "expand": true, "interpolation": "bilinear"}"#, Moves),
        (
            r#"{"op": "random_affine", "degrees": [-20, 20], "translate": [0.1, 0.1], "scale": [0.8, 1.2],
                "shear": [-10, 10, -5, 5]}"#,
            Moves,
        ),
        (r#"{"op": "random_perspective", "distortion_scale": 0.4, "p": 1}"#, Moves),
        (r#"{"op": "random_crop", "size": [40, 56], "padding": [4, 4, 4, 4]}"#, Moves),
        (r#"{"op": "pad", "padding": [3, 5, 7, 2]}"#, Moves),
        (r#"{"op": "random_iou_crop"}"#, Moves),
        (r#"{"op": "trivial_augment_wide"}"#, Refused),
        (r#"{"op": "rand_augment"}"#, Refused),
        (r#"{"op": "auto_augment"}"#, Refused),
        (r#"{"op": "augmix"}"#, Refused),
        (r#"{"op": "sleep", "us": 1}"#, Keeps),
    ];
    let mut all: Vec<(OpSpec, Expect)> = cases
        .iter()
        .map(|(json, e)| (serde_json::from_str(json).unwrap_or_else(|x| panic!("{json}: {x}")), *e))
        .collect();
    all.push((OpSpec::map(MAP_FN), Keeps));
    all
}

/// A sidecar folder of `RECTS.len()` grey PNGs, each its rectangle on the background, its
/// box and its mask (the rectangle painted `CLASS`).
fn write_dataset(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    for (i, r) in RECTS.iter().enumerate() {
        let inside = |x: u32, y: u32| x >= r[0] && x < r[2] && y >= r[1] && y < r[3];
        let paint = |a: u8, b: u8| (0..W * H).map(|p| if inside(p % W, p / W) { a } else { b }).collect::<Vec<u8>>();
        std::fs::write(root.join(format!("{i}.png")), encode_png_mask(&paint(RECT, BACKGROUND), W, H).unwrap())
            .unwrap();
        std::fs::write(root.join(format!("{i}.mask.png")), encode_png_mask(&paint(CLASS, 0), W, H).unwrap()).unwrap();
        let sidecar = serde_json::json!({"boxes": [r], "labels": [1], "mask": format!("{i}.mask.png")});
        std::fs::write(root.join(format!("{i}.json")), sidecar.to_string()).unwrap();
    }
}

/// `decode`, `op` where its phase allows (after the fixed-size crop for the conversions and
/// erasing), and a center crop back to `H x W` that fixes the batch size.
fn spec(root: &Path, op: &OpSpec) -> PipelineSpec {
    let source = SourceSpec::Sidecar { root: root.to_path_buf(), masks: true };
    let mut s = PipelineSpec::train_default(source, W, RECTS.len());
    let crop = OpSpec::CenterCrop { size: Size { height: H, width: W } };
    let after = matches!(
        op,
        OpSpec::Normalize { .. } | OpSpec::Dtype { .. } | OpSpec::Layout { .. } | OpSpec::RandomErasing { .. }
    );
    s.ops = match op {
        OpSpec::Decode => vec![OpSpec::Decode, crop],
        _ if after => vec![OpSpec::Decode, crop, op.clone()],
        _ => vec![OpSpec::Decode, op.clone(), crop],
    };
    s.shuffle = ShuffleSpec::None;
    s.threads = 2.into();
    s.seed = 11;
    s.on_error = ErrorPolicy::Fail;
    s
}

/// Per sample: its boxes (`[x1, y1, x2, y2]`) and its mask.
struct Sample {
    boxes: Vec<[f32; 4]>,
    mask: Vec<u8>,
    /// u8 HWC pixels, when the output is that.
    pixels: Option<Vec<u8>>,
}

fn run(spec: PipelineSpec) -> Vec<Sample> {
    let hwc_u8 = spec.output().0 == sluice_core::DType::U8 && spec.output().1 == Layout::Hwc;
    let batches: Vec<Batch> = Loader::new(spec, Shard::default()).unwrap().iter().collect::<Result<_, _>>().unwrap();
    let mut out = Vec::new();
    for b in &batches {
        let t = b.boxes.as_ref().unwrap();
        let masks = t.masks.as_ref().unwrap().as_bytes();
        let px = b.images.as_bytes();
        let (n_mask, n_px) = ((W * H) as usize, (W * H * 3) as usize);
        for i in 0..b.len() {
            let boxes = (0..t.counts[i] as usize)
                .map(|j| {
                    let at = (i * t.max_boxes + j) * 4;
                    [t.boxes[at], t.boxes[at + 1], t.boxes[at + 2], t.boxes[at + 3]]
                })
                .collect();
            let mask = masks[i * n_mask..(i + 1) * n_mask].to_vec();
            let pixels = hwc_u8.then(|| px[i * n_px..(i + 1) * n_px].to_vec());
            out.push(Sample { boxes, mask, pixels });
        }
    }
    assert_eq!(out.len(), RECTS.len());
    out
}

/// `[x1, y1, x2, y2]` of the pixels `hit` selects (`x2`, `y2` one past the last), or None.
fn bounds(hit: impl Fn(u32, u32) -> bool) -> Option<[f32; 4]> {
    let mut b: Option<[u32; 4]> = None;
    for y in 0..H {
        for x in 0..W {
            if hit(x, y) {
                let c = b.get_or_insert([x, y, x + 1, y + 1]);
                *c = [c[0].min(x), c[1].min(y), c[2].max(x + 1), c[3].max(y + 1)];
            }
        }
    }
    b.map(|c| c.map(|v| v as f32))
}

fn near(a: [f32; 4], b: [f32; 4], tolerance: f32) -> bool {
    a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= tolerance)
}

/// The box of a `Moves` op bounds its rectangle's pixels and its mask, within
/// [`TOLERANCE`] ([`WARP_TOLERANCE`] for the warps); a dropped box leaves neither.
fn check_moved(what: &str, op: &OpSpec, i: usize, s: &Sample) {
    let warp =
        matches!(op, OpSpec::RandomRotation { .. } | OpSpec::RandomAffine { .. } | OpSpec::RandomPerspective { .. });
    let tolerance = if warp { WARP_TOLERANCE } else { TOLERANCE };
    let px = s.pixels.as_ref().unwrap();
    // Halfway between the rectangle and the background, where a bilinear edge crosses.
    let rect = bounds(|x, y| px[((y * W + x) * 3) as usize] > (RECT / 2 + BACKGROUND / 2));
    let mask = bounds(|x, y| s.mask[(y * W + x) as usize] == CLASS);
    assert!(
        s.mask.iter().all(|&m| m == 0 || m == CLASS),
        "{what} sample {i}: a nearest-neighbour mask holds only its classes"
    );
    match s.boxes.as_slice() {
        [] => assert_eq!((rect, mask), (None, None), "{what} sample {i}: the box was dropped, its pixels kept"),
        [b] => {
            let r = rect.unwrap_or_else(|| panic!("{what} sample {i}: box {b:?} kept, its rectangle gone"));
            assert!(near(*b, r, tolerance), "{what} sample {i}: box {b:?}, its rectangle's pixels {r:?}");
            let m = mask.unwrap_or_else(|| panic!("{what} sample {i}: box {b:?} kept, its mask gone"));
            assert!(near(*b, m, tolerance), "{what} sample {i}: box {b:?}, its mask {m:?}");
        }
        more => panic!("{what} sample {i}: one box became {more:?}"),
    }
}

/// A `Keeps` op leaves boxes and mask as the baseline has them and the rectangle where it
/// was: the pixels 3 away from its edge (blur and sharpness reach 2) are one value inside
/// and one outside.
fn check_kept(what: &str, op: &OpSpec, i: usize, s: &Sample, base: &Sample) {
    assert_eq!(s.boxes, base.boxes, "{what} sample {i}: boxes moved");
    assert!(s.mask == base.mask, "{what} sample {i}: the mask changed");
    let (Some(px), false) = (&s.pixels, matches!(op, OpSpec::RandomErasing { .. })) else { return };
    let r = RECTS[i];
    let (mut inside, mut outside) = (None, None);
    for y in 0..H {
        for x in 0..W {
            let d = [
                x as i64 - r[0] as i64,
                r[2] as i64 - 1 - x as i64,
                y as i64 - r[1] as i64,
                r[3] as i64 - 1 - y as i64,
            ];
            let v = px[((y * W + x) * 3) as usize];
            let (slot, far) = if d.iter().all(|&d| d >= 0) {
                (&mut inside, d.iter().all(|&d| d >= 3))
            } else {
                (&mut outside, d.iter().any(|&d| d <= -4))
            };
            if far {
                let want = *slot.get_or_insert(v);
                assert_eq!(v, want, "{what} sample {i}: ({x}, {y}) is {v}, the rest of its side {want}: pixels moved");
            }
        }
    }
}

#[test]
fn every_op_moves_boxes_and_masks_with_the_pixels_keeps_them_or_is_refused_with_boxes() {
    register_user_op(MAP_FN, Arc::new(InvertMap));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    write_dataset(&root);
    let base = run(spec(&root, &OpSpec::Decode));
    for (i, s) in base.iter().enumerate() {
        assert_eq!(s.boxes, vec![RECTS[i].map(|v| v as f32)], "the baseline is the dataset");
    }

    let examples = examples();
    let mut covered = [false; VARIANTS];
    for (op, expect) in &examples {
        covered[variant(op)] = true;
        let what = op.name();
        let want = match expect {
            Expect::Moves => Geometry::Moves,
            Expect::Keeps if matches!(op, OpSpec::Map { .. }) => Geometry::User,
            Expect::Keeps => Geometry::Keeps,
            Expect::Refused => Geometry::RefusesBoxes,
        };
        assert_eq!(op.geometry(), want, "{what}: its geometry says otherwise");
        let spec = spec(&root, op);
        if *expect == Expect::Refused {
            let Err(e) = spec.validate() else { panic!("{what}: a source with boxes was not refused") };
            assert_eq!(e.field, "ops[1]", "{what}: {e}");
            assert!(e.message.contains(&format!("`{what}`")) && e.message.contains("boxes"), "{what}: {e}");
            let e = Loader::new(spec, Shard::default()).err().unwrap_or_else(|| panic!("{what}: a loader was built"));
            assert!(e.to_string().contains(what), "{what}: {e}");
            continue;
        }
        let got = run(spec);
        let mut moved = 0;
        for (i, (s, b)) in got.iter().zip(&base).enumerate() {
            match expect {
                Expect::Moves => {
                    check_moved(what, op, i, s);
                    moved += usize::from(s.boxes != b.boxes || s.mask != b.mask);
                }
                _ => check_kept(what, op, i, s, b),
            }
        }
        assert!(*expect != Expect::Moves || moved > 0, "{what}: moved no sample, so this example checks nothing");
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&v| !covered[v]).collect();
    assert!(missing.is_empty(), "OpSpec variants {missing:?} (see `variant`) have no example: add one to `examples`");
}
