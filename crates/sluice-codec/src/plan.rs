//! The op library: a validated op list compiled into steps and run per sample.
//!
//! **Fusion.** `decode` followed by `random_resized_crop`, `center_crop` or `resize` runs as
//! one step. For a JPEG it reads the header, picks the crop on full-resolution coordinates,
//! decodes only that window (with the IDCT scaling by 1/2, 1/4 or 1/8 while the window stays
//! at least the output size) and resizes the exact sub-rectangle: a crop never decodes
//! pixels it throws away. PNGs decode whole and take the same geometry.
//!
//! **Output.** `normalize`, `dtype` and `layout` are one final write into the caller's output
//! slot (the batch buffer), and a pending horizontal flip is folded into it. For u8 HWC
//! output the last crop resizes straight into the slot and a flip reverses rows in place.
//!
//! **Determinism.** Random ops draw from the `SampleRng` the caller passes, in op order, so
//! the output is a function of (bytes, seed, epoch, key) alone.
//!
//! **Cache seam.** [`Plan::run_deterministic_prefix`] runs the leading deterministic ops
//! (decode, resize, center_crop, up to the first random or output op) and returns the
//! image to cache; [`Plan::run_from_image`] runs the rest from such an image. The pair gives
//! the same geometry and random draws as [`Plan::run`] but not bit-identical pixels: `run`
//! fuses the decode into the crop (DCT scaling), the split path cannot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{BoxTargets, DType, Image, Layout, Limits, Mask, OpSpec, PaddingMode, Pixels, SampleRng, Size};

use crate::boxes::{move_boxes, Motion};
use crate::masks::{move_mask, MaskMove};

use crate::crop::{center_crop_window, random_resized_crop_params, CropRect};
use crate::error::CodecError;
use crate::index_store::IndexStore;
use crate::jpeg::JpegDecoder;
use crate::ops;
use crate::png::decode_png;
use crate::resize::{shorter_side_size, Resample, Resizer, SubRect};
use crate::user_op::{SampleInfo, UserOpSlot};

/// The image formats sluice decodes, told apart by their magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Jpeg,
    Png,
}

/// Sniffs the format from the first bytes (never from a file name).
pub fn sniff_format(bytes: &[u8]) -> Result<ImageFormat, CodecError> {
    const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.is_empty() {
        Err(CodecError::Empty)
    } else if bytes.starts_with(&[0xFF, 0xD8]) {
        Ok(ImageFormat::Jpeg)
    } else if bytes.starts_with(PNG_MAGIC) {
        Ok(ImageFormat::Png)
    } else {
        Err(CodecError::UnknownFormat)
    }
}

/// The `(width, height)` decoding `bytes` gives, read from the header alone (nothing is
/// decoded): what a mask made for the image must match, known before it is made.
pub fn image_size(bytes: &[u8], scratch: &mut Scratch, max_pixels: u64) -> Result<(u32, u32), CodecError> {
    match sniff_format(bytes)? {
        ImageFormat::Jpeg => {
            let header = scratch.jpeg(max_pixels)?.header(bytes)?;
            Ok((header.width, header.height))
        }
        ImageFormat::Png => crate::png::png_size(bytes),
    }
}

/// Per-worker state reused across samples: the JPEG decoder, the resizer's buffers and two
/// image buffers. Keep one per thread; after the first few samples nothing is allocated.
#[derive(Debug, Default)]
pub struct Scratch {
    jpeg: Option<JpegDecoder>,
    resizer: Resizer,
    /// The current image (RGB8, HWC).
    a: Vec<u8>,
    /// Where the next image is written before it becomes the current one.
    b: Vec<u8>,
    /// Told where each step starts and ends, when profiling counters are on.
    pub probe: Option<Box<dyn StepProbe>>,
    /// The sample being run (key, label, epoch), for `map` ops: the caller sets it before
    /// each run; `seed` is drawn by the op itself.
    pub sample: SampleInfo,
}

/// Something that measures each step of a run (e.g. CPU counters read at step
/// boundaries). `begin` comes before the first step, `step_done(i)` after step `i`, `i`
/// being the index into the `times` slice the run was given.
pub trait StepProbe: Send + std::fmt::Debug {
    fn begin(&mut self);
    fn step_done(&mut self, step: usize);
    /// The probe itself, for its owner to read what it measured.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// The JPEG decoder, created on first use (so `Scratch` can be `Default`).
    pub fn jpeg(&mut self, max_pixels: u64) -> Result<&mut JpegDecoder, CodecError> {
        jpeg_in(&mut self.jpeg, max_pixels)
    }

    pub fn resizer(&mut self) -> &mut Resizer {
        &mut self.resizer
    }
}

fn jpeg_in(slot: &mut Option<JpegDecoder>, max_pixels: u64) -> Result<&mut JpegDecoder, CodecError> {
    let dec = match slot {
        Some(d) => d,
        none => none.insert(JpegDecoder::new(max_pixels)?),
    };
    if dec.max_pixels() != max_pixels {
        dec.set_max_pixels(max_pixels)?;
    }
    Ok(dec)
}

/// A geometric op.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Geo {
    Resize { size: u32, resample: Resample },
    CenterCrop { size: Size },
    RandomResizedCrop { size: Size, scale: [f64; 2], ratio: [f64; 2], resample: Resample },
}

impl Geo {
    fn name(&self) -> &'static str {
        match self {
            Geo::Resize { .. } => "resize",
            Geo::CenterCrop { .. } => "center_crop",
            Geo::RandomResizedCrop { .. } => "random_resized_crop",
        }
    }

    fn fused_name(&self) -> &'static str {
        match self {
            Geo::Resize { .. } => "decode+resize",
            Geo::CenterCrop { .. } => "decode+center_crop",
            Geo::RandomResizedCrop { .. } => "decode+random_resized_crop",
        }
    }

    fn output_dims(&self, w: u32, h: u32) -> (u32, u32) {
        match *self {
            Geo::Resize { size, .. } => shorter_side_size(w, h, size),
            Geo::CenterCrop { size } | Geo::RandomResizedCrop { size, .. } => (size.width, size.height),
        }
    }

    fn fixes_size(&self) -> bool {
        !matches!(self, Geo::Resize { .. })
    }
}

/// What the final write produces.
#[derive(Debug, Clone, PartialEq)]
struct OutputFormat {
    dtype: DType,
    layout: Layout,
    /// f32 value of each u8 per channel: `x / 255`, or `(x / 255 - mean) / std`.
    lut: Option<Box<[[f32; 256]; 3]>>,
    name: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Decode the whole image.
    Decode,
    /// Decode fused with the geometric op after it.
    Fused {
        op: Geo,
        to_out: bool,
    },
    Geo {
        op: Geo,
        to_out: bool,
    },
    Flip {
        p: f64,
    },
    /// An op of the [`ops`](crate::ops) module (colour, geometry).
    Pixel {
        op: OpSpec,
    },
    /// A `map` op: a registered user function (`user_op.rs`).
    Map {
        op: UserOpSlot,
    },
    /// The `sleep` op's emulated cost.
    Sleep {
        us: u32,
    },
    /// normalize / dtype / layout and any pending flip, into the output slot.
    Write,
    /// `random_erasing`, on the output slot after the write.
    Erase {
        op: OpSpec,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Steps {
    steps: Vec<Step>,
    names: Vec<&'static str>,
}

/// A compiled op list. Cheap to share (`Arc<Plan>`) between worker threads; all per-sample
/// state lives in [`Scratch`].
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    full: Steps,
    prefix: Steps,
    suffix: Steps,
    split: usize,
    limits: Limits,
    out_w: u32,
    out_h: u32,
    format: OutputFormat,
    index: IndexHandle,
}

/// The entropy index store a plan's fused crops use (see [`Plan::with_index`]); plans are
/// equal when they share the same store.
#[derive(Debug, Clone, Default)]
struct IndexHandle(Option<Arc<IndexStore>>);

impl PartialEq for IndexHandle {
    fn eq(&self, other: &Self) -> bool {
        IndexStore::same(self.0.as_ref(), other.0.as_ref())
    }
}

/// Where a run starts from.
enum Input<'a> {
    Bytes(&'a [u8]),
    /// RGB8 HWC pixels, width, height.
    Pixels(&'a [u8], u32, u32),
}

impl Plan {
    /// Compiles an op list that passed `PipelineSpec::validate`. An unvalidated list does not
    /// panic: decode is implied first, and a list that does not end in a fixed size makes
    /// every run fail with [`CodecError::Shape`].
    /// Fused crops of baseline JPEGs keep their entropy indexes in `store` (made the first
    /// time a file is cropped) and decode only the crop's MCUs from then on; `None` (the
    /// default) decodes them the ordinary way. The pixels are the same either way.
    pub fn with_index(mut self, store: Option<Arc<IndexStore>>) -> Plan {
        self.index = IndexHandle(store);
        self
    }

    pub fn compile(ops: &[OpSpec], limits: Limits) -> Plan {
        let ops = match ops.first() {
            Some(OpSpec::Decode) => &ops[1..],
            _ => ops,
        };
        let mut size = None;
        let mut dtype = DType::U8;
        let mut layout = Layout::Hwc;
        let mut normalize = None;
        for op in ops {
            size = op.out_size(size);
            match op {
                OpSpec::Normalize { mean, std } => normalize = Some((*mean, *std)),
                OpSpec::Dtype { dtype: d } => dtype = *d,
                OpSpec::Layout { order } => layout = *order,
                _ => {}
            }
        }
        let (mut out_w, mut out_h) = size.map_or((0, 0), |s| (s.width, s.height));
        if normalize.is_some() {
            dtype = DType::F32;
        }
        // Validation bounds every side; an unvalidated size whose sample bytes do not even
        // fit in a usize leaves the plan without an output size, so every run fails (Shape).
        // `output_bytes` and `output_shape` can then multiply freely.
        let sample_bytes = [out_w as usize, out_h as usize, 3, dtype.size()];
        if sample_bytes.into_iter().try_fold(1usize, usize::checked_mul).is_none() {
            (out_w, out_h) = (0, 0);
        }
        let lut = (dtype == DType::F32).then(|| {
            let mut t = Box::new([[0f32; 256]; 3]);
            for (c, row) in t.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    let unit = v as f32 / 255.0;
                    *x = match normalize {
                        Some((mean, std)) => (unit - mean[c]) / std[c],
                        None => unit,
                    };
                }
            }
            t
        });
        let has = |f: fn(&OpSpec) -> bool| ops.iter().any(f);
        let name = match (
            has(|o| matches!(o, OpSpec::Normalize { .. })),
            has(|o| matches!(o, OpSpec::Dtype { .. })),
            has(|o| matches!(o, OpSpec::Layout { .. })),
        ) {
            (true, _, true) => "normalize+layout",
            (true, _, false) => "normalize",
            (false, true, true) => "dtype+layout",
            (false, true, false) => "dtype",
            (false, false, true) => "layout",
            (false, false, false) => "write",
        };
        let format = OutputFormat { dtype, layout, lut, name };
        let direct = dtype == DType::U8 && layout == Layout::Hwc;

        // The cache seam: leading deterministic geometric ops.
        let split = ops
            .iter()
            .position(|o| !matches!(o, OpSpec::Resize { .. } | OpSpec::CenterCrop { .. } | OpSpec::Decode))
            .unwrap_or(ops.len());

        let full = Self::compile_steps(ops, true, true, direct);
        let prefix = Self::compile_steps(&ops[..split], true, false, false);
        let suffix = Self::compile_steps(&ops[split..], false, true, direct);
        // `split` counts from the caller's list, which starts with `decode`.
        Plan { full, prefix, suffix, split: split + 1, limits, out_w, out_h, format, index: IndexHandle::default() }
    }

    fn compile_steps(ops: &[OpSpec], decode: bool, write: bool, direct: bool) -> Steps {
        let geo = |op: &OpSpec| match *op {
            OpSpec::Resize { size, interpolation, antialias } => {
                Some(Geo::Resize { size, resample: Resample::new(interpolation, antialias) })
            }
            OpSpec::CenterCrop { size } => Some(Geo::CenterCrop { size }),
            OpSpec::RandomResizedCrop { size, scale, ratio, interpolation, antialias } => {
                Some(Geo::RandomResizedCrop { size, scale, ratio, resample: Resample::new(interpolation, antialias) })
            }
            _ => None,
        };
        // The last geometric op may write straight into the output slot when it fixes the
        // output size, no pixel op runs after it, and the write is a plain u8 HWC copy.
        let last_geo = ops.iter().rposition(|o| geo(o).is_some() || ops::runs(o) || matches!(o, OpSpec::Map { .. }));
        let to_out_at = last_geo.filter(|&i| direct && geo(&ops[i]).is_some_and(|g| g.fixes_size()));

        let mut steps = Vec::new();
        let mut names = Vec::new();
        let mut i = 0;
        if decode {
            match ops.first().and_then(geo) {
                Some(op) => {
                    steps.push(Step::Fused { op, to_out: to_out_at == Some(0) });
                    names.push(op.fused_name());
                    i = 1;
                }
                None => {
                    steps.push(Step::Decode);
                    names.push("decode");
                }
            }
        }
        for (j, op) in ops.iter().enumerate().skip(i) {
            if let Some(g) = geo(op) {
                steps.push(Step::Geo { op: g, to_out: to_out_at == Some(j) });
                names.push(g.name());
            } else if let OpSpec::RandomHorizontalFlip { p } = *op {
                steps.push(Step::Flip { p });
                names.push("random_horizontal_flip");
            } else if ops::runs(op) {
                steps.push(Step::Pixel { op: op.clone() });
                names.push(op.name());
            } else if let OpSpec::Map { func, .. } = op {
                steps.push(Step::Map { op: UserOpSlot::resolve(func) });
                names.push("map");
            } else if let OpSpec::Sleep { us } = *op {
                steps.push(Step::Sleep { us });
                names.push("sleep");
            }
            // normalize / dtype / layout are the final write; a stray decode is a no-op.
        }
        if write {
            steps.push(Step::Write);
            names.push("write");
            for op in ops.iter().filter(|o| matches!(o, OpSpec::RandomErasing { .. })) {
                steps.push(Step::Erase { op: op.clone() });
                names.push(op.name());
            }
        }
        Steps { steps, names }
    }

    /// Names of the steps [`Plan::run`] times, index for index.
    pub fn step_names(&self) -> Vec<&'static str> {
        self.full.names.iter().zip(&self.full.steps).map(|(n, s)| self.step_name(n, s)).collect()
    }

    /// Names of the steps [`Plan::run_deterministic_prefix`] times.
    pub fn prefix_step_names(&self) -> Vec<&'static str> {
        self.prefix.names.clone()
    }

    /// Names of the steps [`Plan::run_from_image`] times.
    pub fn suffix_step_names(&self) -> Vec<&'static str> {
        self.suffix.names.iter().zip(&self.suffix.steps).map(|(n, s)| self.step_name(n, s)).collect()
    }

    fn step_name(&self, name: &'static str, step: &Step) -> &'static str {
        if *step == Step::Write {
            self.format.name
        } else {
            name
        }
    }

    /// Index into the op list where a cache of decoded pixels sits: ops before it are
    /// deterministic and run by [`Plan::run_deterministic_prefix`].
    pub fn cache_split(&self) -> usize {
        self.split
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn output_dtype(&self) -> DType {
        self.format.dtype
    }

    pub fn output_layout(&self) -> Layout {
        self.format.layout
    }

    /// Per-sample tensor shape: `[h, w, 3]` (HWC) or `[3, h, w]` (CHW).
    pub fn output_shape(&self) -> [usize; 3] {
        let (h, w) = (self.out_h as usize, self.out_w as usize);
        match self.format.layout {
            Layout::Hwc => [h, w, 3],
            Layout::Chw => [3, h, w],
        }
    }

    /// The output's `(width, height)`: every sample's, and its mask's.
    pub fn output_size(&self) -> (u32, u32) {
        (self.out_w, self.out_h)
    }

    /// Bytes of one output sample: the size of the slot `run` writes.
    pub fn output_bytes(&self) -> usize {
        self.out_w as usize * self.out_h as usize * 3 * self.format.dtype.size()
    }

    fn check_out(&self, out: &[u8]) -> Result<(), CodecError> {
        if out.len() != self.output_bytes() || self.out_w == 0 || self.out_h == 0 {
            return Err(CodecError::Shape(format!(
                "output slot has {} bytes; the plan writes {:?} {:?} = {} bytes",
                out.len(),
                self.output_shape(),
                self.format.dtype,
                self.output_bytes()
            )));
        }
        Ok(())
    }

    /// Decodes `bytes` and runs every op, writing the sample into `out` (exactly
    /// [`Plan::output_bytes`] long: u8, or f32 in native byte order, in the output layout).
    /// Adds each step's time to `times[step]` (see [`Plan::step_names`]; a short slice just
    /// records less).
    ///
    /// A sample's `records` (`Records::default()` for one without) move with it: `boxes`
    /// (XYXY pixels of the encoded image) move with the pixels through every geometric op,
    /// the fused decode included, and follow the stated rule after decode and after each
    /// op: clamped to the image, and dropped when under one pixel a side
    /// ([`BoxTargets::sanitize`]). `mask` (the size of the encoded image, else
    /// [`CodecError::MaskSize`]) moves as torchvision moves a `tv_tensors.Mask`
    /// (nearest-neighbour, 0 outside the image) and ends the size of the output.
    pub fn run(
        &self,
        bytes: &[u8],
        rng: &mut SampleRng,
        scratch: &mut Scratch,
        out: &mut [u8],
        times: &mut [Duration],
        records: Records<'_>,
    ) -> Result<(), CodecError> {
        self.check_out(out)?;
        self.exec(&self.full.steps, Input::Bytes(bytes), rng, scratch, out, times, records)?;
        Ok(())
    }

    /// Runs the deterministic ops before the cache split on `bytes` and returns the RGB8 HWC
    /// image to cache. Draws no random numbers. A sample's `boxes` (XYXY pixels of the
    /// encoded image) leave in pixels of the returned image, and its `mask` (the encoded
    /// image's size) the returned image's size, moved as in [`Plan::run`] (the
    /// cache keeps them with the image).
    pub fn run_deterministic_prefix(
        &self,
        bytes: &[u8],
        scratch: &mut Scratch,
        times: &mut [Duration],
        boxes: Option<&mut BoxTargets>,
        mask: Option<&mut Mask>,
    ) -> Result<Image, CodecError> {
        // No draws happen in the prefix; any generator will do.
        let mut rng = SampleRng::new(0, 0, sluice_core::SampleKey(0), 0);
        let records = Records { boxes, mask };
        let (w, h) = self.exec(&self.prefix.steps, Input::Bytes(bytes), &mut rng, scratch, &mut [], times, records)?;
        let n = w as usize * h as usize * 3;
        Ok(Image::rgb8(w, h, scratch.a[..n].to_vec()))
    }

    /// Runs the ops after the cache split on `image` (an RGB8 HWC image from
    /// [`Plan::run_deterministic_prefix`]) and writes the sample into `out`; a sample's
    /// `boxes` (in pixels of `image`) move with the pixels, and its `mask` (the size of
    /// `image`, else [`CodecError::MaskSize`]) ends the size of the output.
    #[allow(clippy::too_many_arguments)]
    pub fn run_from_image(
        &self,
        image: &Image,
        rng: &mut SampleRng,
        scratch: &mut Scratch,
        out: &mut [u8],
        times: &mut [Duration],
        boxes: Option<&mut BoxTargets>,
        mask: Option<&mut Mask>,
    ) -> Result<(), CodecError> {
        self.check_out(out)?;
        let Pixels::U8(px) = &image.pixels else {
            return Err(CodecError::Shape("a cached image must be u8 pixels".into()));
        };
        let n = image.width as usize * image.height as usize * 3;
        if image.layout != Layout::Hwc || px.len() != n || n == 0 {
            return Err(CodecError::Shape(format!(
                "a cached image must be non-empty RGB8 HWC; got {}x{} {:?} with {} values",
                image.width,
                image.height,
                image.layout,
                px.len()
            )));
        }
        let input = Input::Pixels(px, image.width, image.height);
        if let Some(m) = mask.as_deref() {
            check_mask(m, image.width, image.height)?;
        }
        self.exec(&self.suffix.steps, input, rng, scratch, out, times, Records { boxes, mask })?;
        Ok(())
    }

    /// Runs `steps`; returns the size of the image left in `scratch.a` (or in `out`).
    /// `boxes`, when the sample has them, move with the pixels.
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        steps: &[Step],
        input: Input<'_>,
        rng: &mut SampleRng,
        scratch: &mut Scratch,
        out: &mut [u8],
        times: &mut [Duration],
        records: Records<'_>,
    ) -> Result<(u32, u32), CodecError> {
        let Records { mut boxes, mut mask } = records;
        let mut mask_tmp = Vec::new();
        let max_pixels = self.limits.max_pixels;
        let (bytes, mut borrowed, (mut w, mut h)) = match input {
            Input::Bytes(b) => (b, None, (0, 0)),
            Input::Pixels(p, w, h) => (&[][..], Some(p), (w, h)),
        };
        let mut flip = false;
        let mut in_out = false;
        if let Some(p) = scratch.probe.as_mut() {
            p.begin();
        }
        for (i, step) in steps.iter().enumerate() {
            let t0 = Instant::now();
            match *step {
                Step::Decode => {
                    (w, h) = self.decode(bytes, scratch)?;
                    borrowed = None;
                    if let Some(b) = boxes.as_deref_mut() {
                        b.sanitize(w, h);
                    }
                    if let Some(m) = mask.as_deref() {
                        check_mask(m, w, h)?;
                    }
                }
                Step::Fused { op, to_out } => {
                    let records = Records { boxes: boxes.as_deref_mut(), mask: mask.as_deref_mut() };
                    (w, h) = self.fused(op, bytes, rng, scratch, out, to_out, records)?;
                    in_out = to_out;
                    borrowed = None;
                }
                Step::Geo { op, to_out } => {
                    if flip {
                        flip_into(borrowed.unwrap_or(&scratch.a), w, h, &mut scratch.b);
                        std::mem::swap(&mut scratch.a, &mut scratch.b);
                        borrowed = None;
                        flip = false;
                    }
                    self.output_dims(op, w, h)?;
                    let Scratch { a, b, resizer, .. } = &mut *scratch;
                    let src = borrowed.unwrap_or(a);
                    let (motion, mask_move);
                    ((w, h), motion, mask_move) = geometric(op, src, w, h, rng, resizer, b, out, to_out)?;
                    if !to_out {
                        std::mem::swap(a, b);
                    }
                    if let Some(t) = boxes.as_deref_mut() {
                        move_boxes(t, motion, w, h);
                    }
                    if let Some(m) = mask.as_deref_mut() {
                        move_mask(m, mask_move, &mut mask_tmp, max_pixels)?;
                    }
                    in_out = to_out;
                    borrowed = None;
                }
                Step::Pixel { ref op } => {
                    if flip && !ops::commutes_with_flip(op) {
                        flip_into(borrowed.unwrap_or(&scratch.a), w, h, &mut scratch.b);
                        std::mem::swap(&mut scratch.a, &mut scratch.b);
                        borrowed = None;
                        flip = false;
                    }
                    let Scratch { a, b, .. } = &mut *scratch;
                    let mask_move;
                    let f = ops::Frame { src: borrowed.unwrap_or(a), w, h, rng, max_pixels, dst: b };
                    if matches!(op, OpSpec::RandomIouCrop { .. }) {
                        // Chosen against the boxes, which it moves itself.
                        ((w, h), mask_move) = ops::iou_crop::apply(op, f, boxes.as_deref_mut())?;
                        std::mem::swap(a, b);
                    } else {
                        let moved;
                        let has_records = boxes.is_some() || mask.is_some();
                        ((w, h), moved) = ops::apply(op, f, has_records)?;
                        mask_move = moved.mask;
                        std::mem::swap(a, b);
                        if let Some(t) = boxes.as_deref_mut() {
                            if moved.motion != Motion::Identity {
                                move_boxes(t, moved.motion, w, h);
                            }
                        }
                    }
                    if let Some(m) = mask.as_deref_mut() {
                        move_mask(m, mask_move, &mut mask_tmp, max_pixels)?;
                    }
                    in_out = false;
                    borrowed = None;
                }
                Step::Flip { p } => {
                    // torchvision: flip if torch.rand(1) < p.
                    if rng.next_f64() < p {
                        flip = !flip;
                        if let Some(t) = boxes.as_deref_mut() {
                            move_boxes(t, Motion::HorizontalFlip { w: f64::from(w) }, w, h);
                        }
                        if let Some(m) = mask.as_deref_mut() {
                            move_mask(m, MaskMove::HorizontalFlip, &mut mask_tmp, max_pixels)?;
                        }
                    }
                }
                Step::Map { ref op } => {
                    if flip {
                        flip_into(borrowed.unwrap_or(&scratch.a), w, h, &mut scratch.b);
                        std::mem::swap(&mut scratch.a, &mut scratch.b);
                        borrowed = None;
                        flip = false;
                    }
                    if let Some(src) = borrowed {
                        scratch.a.clear();
                        scratch.a.extend_from_slice(src);
                    }
                    // The op edits `scratch.a` in place (a Python map gets a view of it).
                    let images = (&mut scratch.a, &mut scratch.b);
                    (w, h) = self.user_op(op, (w, h), rng, scratch.sample, images, mask.as_deref_mut())?;
                    in_out = false;
                    borrowed = None;
                }
                Step::Sleep { us } => std::thread::sleep(Duration::from_micros(u64::from(us))),
                Step::Write => {
                    if (w, h) != (self.out_w, self.out_h) {
                        return Err(CodecError::Shape(format!(
                            "the ops produced a {w}x{h} image; batches need {}x{}",
                            self.out_w, self.out_h
                        )));
                    }
                    if in_out {
                        if flip {
                            flip_in_place(out, w);
                        }
                    } else {
                        self.write(borrowed.unwrap_or(&scratch.a), w, h, flip, out);
                    }
                }
                Step::Erase { ref op } => {
                    let format = (self.format.dtype, self.format.layout);
                    ops::erase_output(op, out, (self.out_w, self.out_h), format, rng)?;
                }
            }
            if let Some(t) = times.get_mut(i) {
                *t += t0.elapsed();
            }
            if let Some(p) = scratch.probe.as_mut() {
                p.step_done(i);
            }
        }
        Ok((w, h))
    }

    /// What `op` makes of a `w x h` image. A resize's size depends on the image, so it is
    /// held to `max_pixels` like a decoded image is (crops have the size the spec fixed).
    fn output_dims(&self, op: Geo, w: u32, h: u32) -> Result<(u32, u32), CodecError> {
        let (ow, oh) = op.output_dims(w, h);
        let limit = self.limits.max_pixels;
        if matches!(op, Geo::Resize { .. }) && u64::from(ow) * u64::from(oh) > limit {
            return Err(CodecError::ResizeTooLarge { width: ow.into(), height: oh.into(), limit });
        }
        Ok((ow, oh))
    }

    /// Runs a `map` op on the `w x h` RGB8 image in `pixels`, leaving its result there
    /// (`spare` is scratch), and on the sample's `mask` if it has one; checks that what it
    /// made is an image within `max_pixels` that `pixels` holds, with a mask of its size.
    fn user_op(
        &self,
        slot: &UserOpSlot,
        (w, h): (u32, u32),
        rng: &mut SampleRng,
        sample: SampleInfo,
        (pixels, spare): (&mut Vec<u8>, &mut Vec<u8>),
        mut mask: Option<&mut Mask>,
    ) -> Result<(u32, u32), CodecError> {
        let op = slot.op().ok_or_else(|| CodecError::UnknownUserOp(slot.name.clone()))?;
        let n = w as usize * h as usize * 3;
        if pixels.len() < n {
            return Err(CodecError::Shape(format!("a {w}x{h} image needs {n} bytes")));
        }
        let info = SampleInfo { seed: rng.next_u64(), max_pixels: self.limits.max_pixels, ..sample };
        let fail = |message: String| CodecError::UserOp { op: slot.name.clone(), message };
        let result = match mask.as_deref_mut() {
            Some(m) => op.apply_masked(pixels, (w, h), m, &info, spare),
            None => op.apply_in_place(pixels, (w, h), &info, spare),
        };
        let (ow, oh) = result.map_err(|e| fail(e.0))?;
        let limit = self.limits.max_pixels;
        if ow == 0 || oh == 0 || u64::from(ow) * u64::from(oh) > limit {
            return Err(fail(format!("it returned a {ow}x{oh} image; an image needs 1..={limit} pixels")));
        }
        let need = ow as usize * oh as usize * 3;
        if pixels.len() < need {
            return Err(fail(format!("it returned {} bytes for a {ow}x{oh} RGB image ({need})", pixels.len())));
        }
        if let Some(m) = mask {
            let fits = (m.width, m.height) == (ow, oh) && m.data.len() == ow as usize * oh as usize;
            if !fits && (ow, oh) != (w, h) {
                return Err(fail(format!("it changed the image to {ow}x{oh} but returned no mask of that size")));
            }
            if !fits {
                let (mw, mh, n) = (m.width, m.height, m.data.len());
                return Err(fail(format!("it left a {mw}x{mh} mask of {n} bytes for a {ow}x{oh} image")));
            }
        }
        Ok((ow, oh))
    }

    /// Full decode of a JPEG or PNG into `scratch.a`.
    fn decode(&self, bytes: &[u8], scratch: &mut Scratch) -> Result<(u32, u32), CodecError> {
        match sniff_format(bytes)? {
            ImageFormat::Jpeg => jpeg_in(&mut scratch.jpeg, self.limits.max_pixels)?.decode_full(bytes, &mut scratch.a),
            ImageFormat::Png => decode_png(bytes, self.limits.max_pixels, &mut scratch.a),
        }
    }

    /// Decode fused with `op`: the result goes to `scratch.a`, or to `out` when `to_out`.
    /// `boxes` are clamped to the encoded image, then moved as the crop moved the pixels.
    #[allow(clippy::too_many_arguments)]
    fn fused(
        &self,
        op: Geo,
        bytes: &[u8],
        rng: &mut SampleRng,
        scratch: &mut Scratch,
        out: &mut [u8],
        to_out: bool,
        records: Records<'_>,
    ) -> Result<(u32, u32), CodecError> {
        if sniff_format(bytes)? == ImageFormat::Png {
            let (w, h) = decode_png(bytes, self.limits.max_pixels, &mut scratch.a)?;
            if let Some(m) = records.mask.as_deref() {
                check_mask(m, w, h)?;
            }
            self.output_dims(op, w, h)?;
            let Scratch { a, b, resizer, .. } = scratch;
            let ((ow, oh), motion, mask_move) = geometric(op, a, w, h, rng, resizer, b, out, to_out)?;
            if !to_out {
                std::mem::swap(a, b);
            }
            self.move_records(records, (w, h), motion, mask_move, (ow, oh))?;
            return Ok((ow, oh));
        }

        // Decode the window into `a`, then resample it into `b` (or `out`).
        let Scratch { jpeg, a, b, resizer, .. } = scratch;
        let dec = jpeg_in(jpeg, self.limits.max_pixels)?;
        dec.set_index(self.index.0.as_ref());
        let hdr = dec.header(bytes)?;
        let (fw, fh) = (hdr.width, hdr.height);
        if let Some(m) = records.mask.as_deref() {
            check_mask(m, fw, fh)?;
        }
        let (ow, oh) = self.output_dims(op, fw, fh)?;
        let (motion, mask_move) = match op {
            // The IDCT may shrink the window only for a filter that averages anyway
            // (`Resample::allows_dct_scaling`); the others get it at full size.
            Geo::RandomResizedCrop { size, scale, ratio, resample } => {
                let r = random_resized_crop_params(fw, fh, scale, ratio, rng);
                let shrink_to = if resample.allows_dct_scaling() { (size.width, size.height) } else { (r.w, r.h) };
                let got = dec.decode_region(bytes, rect_of(r), shrink_to, a)?;
                let dst = target(to_out, out, b, ow, oh)?;
                resizer.resize_rect(resample, a, got.width, got.height, got.rect, dst, ow, oh)?;
                (crop_motion(r, ow, oh), MaskMove::Resized { rect: r, size: (ow, oh) })
            }
            Geo::Resize { resample, .. } => {
                let shrink_to = if resample.allows_dct_scaling() { (ow, oh) } else { (fw, fh) };
                let got = dec.decode_region(bytes, SubRect::full(fw, fh), shrink_to, a)?;
                let dst = target(to_out, out, b, ow, oh)?;
                resizer.resize_rect(resample, a, got.width, got.height, got.rect, dst, ow, oh)?;
                let r = CropRect { x: 0, y: 0, w: fw, h: fh };
                (crop_motion(r, ow, oh), MaskMove::Resized { rect: r, size: (ow, oh) })
            }
            Geo::CenterCrop { .. } => {
                let win = center_crop_window(fw, fh, ow, oh);
                let dst = target(to_out, out, b, ow, oh)?;
                match win.source_rect(fw, fh) {
                    Some(r) => {
                        // Output pixels are source pixels: no scaling.
                        let got = dec.decode_region(bytes, rect_of(r), (r.w, r.h), a)?;
                        let origin = (r.x - got.rect.left as u32, r.y - got.rect.top as u32);
                        win.copy_rgb(a, got.width, origin, (fw, fh), dst);
                    }
                    None => dst.fill(0),
                }
                (Motion::crop(win.left as f64, win.top as f64), window_move(&win))
            }
        };
        if !to_out {
            std::mem::swap(a, b);
        }
        self.move_records(records, (fw, fh), motion, mask_move, (ow, oh))?;
        Ok((ow, oh))
    }

    /// After a fused decode of a `w x h` image to `ow x oh`: the boxes clamped to the
    /// encoded image and moved, the mask moved.
    fn move_records(
        &self,
        records: Records<'_>,
        (w, h): (u32, u32),
        motion: Motion,
        mask_move: MaskMove,
        (ow, oh): (u32, u32),
    ) -> Result<(), CodecError> {
        if let Some(t) = records.boxes {
            t.sanitize(w, h);
            move_boxes(t, motion, ow, oh);
        }
        if let Some(m) = records.mask {
            move_mask(m, mask_move, &mut Vec::new(), self.limits.max_pixels)?;
        }
        Ok(())
    }

    /// The final write: RGB8 HWC `src` (`w x h`) into `out` in the output dtype and layout,
    /// mirrored when `flip`. `out` has the right length (checked by the caller).
    fn write(&self, src: &[u8], w: u32, h: u32, flip: bool, out: &mut [u8]) {
        let (w, h) = (w as usize, h as usize);
        let src_x = |x: usize| if flip { w - 1 - x } else { x };
        match (&self.format.lut, self.format.layout) {
            (None, Layout::Hwc) => {
                if flip {
                    flip_into_slice(src, w, out);
                } else {
                    out.copy_from_slice(&src[..w * h * 3]);
                }
            }
            (None, Layout::Chw) => {
                for (c, plane) in out.chunks_exact_mut(w * h).enumerate().take(3) {
                    for (y, row) in plane.chunks_exact_mut(w).enumerate() {
                        let s = &src[y * w * 3..(y + 1) * w * 3];
                        for (x, d) in row.iter_mut().enumerate() {
                            *d = s[src_x(x) * 3 + c];
                        }
                    }
                }
            }
            (Some(lut), Layout::Hwc) => {
                for (y, row) in out.chunks_exact_mut(w * 12).enumerate() {
                    let s = &src[y * w * 3..(y + 1) * w * 3];
                    for (x, d) in row.chunks_exact_mut(12).enumerate() {
                        let p = &s[src_x(x) * 3..src_x(x) * 3 + 3];
                        for c in 0..3 {
                            d[c * 4..c * 4 + 4].copy_from_slice(&lut[c][usize::from(p[c])].to_ne_bytes());
                        }
                    }
                }
            }
            (Some(lut), Layout::Chw) => {
                for (c, plane) in out.chunks_exact_mut(w * h * 4).enumerate().take(3) {
                    for (y, row) in plane.chunks_exact_mut(w * 4).enumerate() {
                        let s = &src[y * w * 3..(y + 1) * w * 3];
                        for (x, d) in row.chunks_exact_mut(4).enumerate() {
                            d.copy_from_slice(&lut[c][usize::from(s[src_x(x) * 3 + c])].to_ne_bytes());
                        }
                    }
                }
            }
        }
    }
}

/// What a sample carries besides its pixels through [`Plan::run`]: its boxes and mask.
#[derive(Debug, Default)]
pub struct Records<'a> {
    pub boxes: Option<&'a mut BoxTargets>,
    pub mask: Option<&'a mut Mask>,
}

/// A mask must be the size of the image it was read with.
fn check_mask(m: &Mask, w: u32, h: u32) -> Result<(), CodecError> {
    if (m.width, m.height) != (w, h) {
        return Err(CodecError::MaskSize { mask: (m.width, m.height), image: (w, h) });
    }
    Ok(())
}

/// A centre crop's window, as a mask sees it (zeros outside).
fn window_move(win: &crate::crop::CenterCropWindow) -> MaskMove {
    MaskMove::Window { origin: (win.left, win.top), size: (win.out_w, win.out_h), mode: PaddingMode::Constant }
}

/// The motion of a crop of `r` resized to `ow x oh`.
fn crop_motion(r: CropRect, ow: u32, oh: u32) -> Motion {
    let size = (f64::from(r.w), f64::from(r.h));
    Motion::resized_crop(f64::from(r.x), f64::from(r.y), size, (f64::from(ow), f64::from(oh)))
}

fn rect_of(r: CropRect) -> SubRect {
    SubRect { left: r.x.into(), top: r.y.into(), width: r.w.into(), height: r.h.into() }
}

/// The buffer a geometric op writes: the output slot, or `b` sized for `w x h` RGB8.
fn target<'o>(to_out: bool, out: &'o mut [u8], b: &'o mut Vec<u8>, w: u32, h: u32) -> Result<&'o mut [u8], CodecError> {
    let n = (w as usize).checked_mul(h as usize).and_then(|p| p.checked_mul(3));
    let n = n.ok_or_else(|| CodecError::Shape(format!("a {w}x{h} image is too large to hold")))?;
    if to_out {
        if out.len() != n {
            return Err(CodecError::Shape(format!("output slot has {} bytes, {w}x{h} RGB needs {n}", out.len())));
        }
        Ok(out)
    } else {
        b.resize(n, 0);
        Ok(&mut b[..n])
    }
}

/// Runs one geometric op on the RGB8 image `src` (`w x h`), writing into `b` or `out`.
#[allow(clippy::too_many_arguments)]
fn geometric(
    op: Geo,
    src: &[u8],
    w: u32,
    h: u32,
    rng: &mut SampleRng,
    resizer: &mut Resizer,
    b: &mut Vec<u8>,
    out: &mut [u8],
    to_out: bool,
) -> Result<((u32, u32), Motion, MaskMove), CodecError> {
    let (ow, oh) = op.output_dims(w, h);
    let (motion, mask_move) = match op {
        Geo::Resize { resample, .. } => {
            let dst = target(to_out, out, b, ow, oh)?;
            resizer.resize_rect(resample, src, w, h, SubRect::full(w, h), dst, ow, oh)?;
            let r = CropRect { x: 0, y: 0, w, h };
            (crop_motion(r, ow, oh), MaskMove::Resized { rect: r, size: (ow, oh) })
        }
        Geo::CenterCrop { .. } => {
            let dst = target(to_out, out, b, ow, oh)?;
            let win = center_crop_window(w, h, ow, oh);
            win.copy_rgb(src, w, (0, 0), (w, h), dst);
            (Motion::crop(win.left as f64, win.top as f64), window_move(&win))
        }
        Geo::RandomResizedCrop { scale, ratio, resample, .. } => {
            let r = random_resized_crop_params(w, h, scale, ratio, rng);
            let dst = target(to_out, out, b, ow, oh)?;
            resizer.resize_rect(resample, src, w, h, rect_of(r), dst, ow, oh)?;
            (crop_motion(r, ow, oh), MaskMove::Resized { rect: r, size: (ow, oh) })
        }
    };
    Ok(((ow, oh), motion, mask_move))
}

/// Mirrors RGB8 rows of width `w` from `src` into `dst` (same length).
fn flip_into_slice(src: &[u8], w: usize, dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(w * 3).zip(dst.chunks_exact_mut(w * 3)) {
        for (sp, dp) in s.chunks_exact(3).rev().zip(d.chunks_exact_mut(3)) {
            dp.copy_from_slice(sp);
        }
    }
}

fn flip_into(src: &[u8], w: u32, h: u32, dst: &mut Vec<u8>) {
    let n = w as usize * h as usize * 3;
    dst.resize(n, 0);
    flip_into_slice(&src[..n], w as usize, dst);
}

fn flip_in_place(img: &mut [u8], w: u32) {
    let w = w as usize;
    for row in img.chunks_exact_mut(w * 3) {
        for x in 0..w / 2 {
            let (l, r) = row.split_at_mut((w - 1 - x) * 3);
            l[x * 3..x * 3 + 3].swap_with_slice(&mut r[..3]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::encode_jpeg;
    use crate::jpeg::tests::{mean_abs_diff, patch_sof_dims, test_rgb};
    use crate::png::tests::encode_png;
    use sluice_core::{BoxTargets, PipelineSpec, SampleKey, SourceSpec};

    const SCALE: [f64; 2] = [0.08, 1.0];
    const RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

    fn rrc(side: u32) -> OpSpec {
        OpSpec::random_resized_crop(Size::square(side), SCALE, RATIO)
    }

    fn rng(key: u64) -> SampleRng {
        SampleRng::new(42, 1, SampleKey(key), 0)
    }

    fn run(plan: &Plan, bytes: &[u8], key: u64, scratch: &mut Scratch) -> Result<Vec<u8>, CodecError> {
        let mut out = vec![0u8; plan.output_bytes()];
        let mut times = vec![Duration::ZERO; plan.step_names().len()];
        plan.run(bytes, &mut rng(key), scratch, &mut out, &mut times, Records::default())?;
        Ok(out)
    }

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn plan_is_shareable_and_scratch_can_move_to_a_worker() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send + Default>() {}
        send_sync::<Plan>();
        send::<Scratch>();
    }

    #[test]
    fn a_sleep_op_costs_its_time_per_sample_after_the_cache_seam_and_changes_no_pixel() {
        let (w, h) = (96, 64);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 92).unwrap();
        let crop = OpSpec::CenterCrop { size: Size::square(32) };
        let plain = Plan::compile(&[OpSpec::Decode, crop.clone()], Limits::default());
        let slow = Plan::compile(&[OpSpec::Decode, crop, OpSpec::Sleep { us: 20_000 }], Limits::default());
        assert_eq!(slow.step_names(), ["decode+center_crop", "sleep", "write"]);
        assert_eq!(slow.prefix_step_names(), ["decode+center_crop"], "the cached prefix stops before the sleep");
        let mut scratch = Scratch::new();
        let mut times = vec![Duration::ZERO; 3];
        let mut out = vec![0u8; slow.output_bytes()];
        for _ in 0..3 {
            slow.run(&jpg, &mut rng(1), &mut scratch, &mut out, &mut times, Records::default()).unwrap();
        }
        assert!(times[1] >= Duration::from_millis(60), "3 samples slept only {:?}", times[1]);
        assert_eq!(out, run(&plain, &jpg, 1, &mut scratch).unwrap());
    }

    #[test]
    fn sniffs_jpeg_png_and_rejects_the_rest() {
        assert_eq!(sniff_format(&[0xFF, 0xD8, 0xFF, 0xE0]), Ok(ImageFormat::Jpeg));
        assert_eq!(sniff_format(b"\x89PNG\r\n\x1a\n...."), Ok(ImageFormat::Png));
        assert_eq!(sniff_format(b""), Err(CodecError::Empty));
        assert_eq!(sniff_format(b"GIF89a"), Err(CodecError::UnknownFormat));
    }

    #[test]
    fn fused_decode_rrc_matches_full_decode_crop_resize() {
        let (w, h) = (320, 240);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 92).unwrap();
        let plan = Plan::compile(&[OpSpec::Decode, rrc(64)], Limits::default());
        assert_eq!(plan.step_names(), ["decode+random_resized_crop", "write"]);
        let mut scratch = Scratch::new();
        let mut full = Vec::new();
        let (fw, fh) = scratch.jpeg(1 << 26).unwrap().decode_full(&jpg, &mut full).unwrap();
        let mut worst = 0f64;
        for key in 0..40 {
            let got = run(&plan, &jpg, key, &mut scratch).unwrap();
            // Reference: full decode, same draws, crop, resize.
            let r = random_resized_crop_params(fw, fh, SCALE, RATIO, &mut rng(key));
            let mut want = vec![0u8; 64 * 64 * 3];
            Resizer::new().resize_rect(Resample::default(), &full, fw, fh, rect_of(r), &mut want, 64, 64).unwrap();
            let diff = mean_abs_diff(&got, &want);
            worst = worst.max(diff);
            assert!(diff < 3.0, "key {key} crop {r:?}: mean abs diff {diff}");

            // The unfused split path (cache seam) is the reference exactly.
            let img = plan.run_deterministic_prefix(&jpg, &mut scratch, &mut [], None, None).unwrap();
            assert_eq!((img.width, img.height), (w, h));
            let mut split = vec![0u8; plan.output_bytes()];
            plan.run_from_image(&img, &mut rng(key), &mut scratch, &mut split, &mut [], None, None).unwrap();
            assert_eq!(split, want, "key {key}");
        }
        assert!(worst > 0.0, "DCT scaling was never used");
    }

    #[test]
    fn fused_decode_center_crop_and_resize_match_the_unfused_ops() {
        let (w, h) = (300, 200);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 92).unwrap();
        let mut scratch = Scratch::new();
        let mut full = Vec::new();
        scratch.jpeg(1 << 26).unwrap().decode_full(&jpg, &mut full).unwrap();
        // Crops inside the image, wider than it (zero padding), and larger in both sides.
        for (cw, ch) in [(100, 60), (333, 120), (301, 260)] {
            let crop = OpSpec::CenterCrop { size: Size { width: cw, height: ch } };
            let plan = Plan::compile(&[OpSpec::Decode, crop.clone()], Limits::default());
            assert_eq!(plan.step_names()[0], "decode+center_crop");
            let got = run(&plan, &jpg, 0, &mut scratch).unwrap();
            let mut want = vec![0u8; (cw * ch * 3) as usize];
            center_crop_window(w, h, cw, ch).copy_rgb(&full, w, (0, 0), (w, h), &mut want);
            let diff = mean_abs_diff(&got, &want);
            assert!(diff < 1.0, "{cw}x{ch}: {diff}");
        }
        // decode+resize (DCT-scaled 1/2 here: 300x200 -> 150x100) then center crop.
        let ops = [OpSpec::Decode, OpSpec::resize(100), OpSpec::CenterCrop { size: Size::square(96) }];
        let plan = Plan::compile(&ops, Limits::default());
        assert_eq!(plan.step_names(), ["decode+resize", "center_crop", "write"]);
        let got = run(&plan, &jpg, 0, &mut scratch).unwrap();
        let mut resized = Vec::new();
        let (rw, rh) = Resizer::new().resize_shorter_side(&full, w, h, 100, &mut resized).unwrap();
        assert_eq!((rw, rh), (150, 100));
        let mut want = vec![0u8; 96 * 96 * 3];
        center_crop_window(rw, rh, 96, 96).copy_rgb(&resized, rw, (0, 0), (rw, rh), &mut want);
        let diff = mean_abs_diff(&got, &want);
        assert!(diff < 3.0, "{diff}");
    }

    /// A 4x2 PNG with distinct pixel values, decoded losslessly.
    fn tiny() -> (Vec<u8>, Vec<u8>) {
        let px: Vec<u8> = (0..24).map(|i| (i * 10) as u8).collect();
        (encode_png(&px, 4, 2, png::ColorType::Rgb, png::BitDepth::Eight, None), px)
    }

    fn tiny_plan(extra: &[OpSpec]) -> Plan {
        let mut ops = vec![OpSpec::Decode, OpSpec::CenterCrop { size: Size { height: 2, width: 4 } }];
        ops.extend_from_slice(extra);
        Plan::compile(&ops, Limits::default())
    }

    fn mirror(px: &[u8], w: usize) -> Vec<u8> {
        px.chunks_exact(w * 3)
            .flat_map(|row| row.chunks_exact(3).rev().flatten().copied().collect::<Vec<_>>())
            .collect()
    }

    fn chw(px: &[u8], w: usize, h: usize) -> Vec<u8> {
        (0..3).flat_map(|c| (0..w * h).map(move |i| px[i * 3 + c])).collect()
    }

    #[test]
    fn flip_dtype_normalize_and_layout_produce_known_values() {
        let (png, px) = tiny();
        let mut s = Scratch::new();
        let flip = |p| OpSpec::RandomHorizontalFlip { p };

        assert_eq!(run(&tiny_plan(&[]), &png, 0, &mut s).unwrap(), px);
        assert_eq!(run(&tiny_plan(&[flip(0.0)]), &png, 0, &mut s).unwrap(), px);
        let mirrored = mirror(&px, 4);
        assert_eq!(&mirrored[..6], &[9 * 10, 100, 110, 60, 70, 80]);
        assert_eq!(run(&tiny_plan(&[flip(1.0)]), &png, 0, &mut s).unwrap(), mirrored);
        assert_eq!(run(&tiny_plan(&[flip(1.0), flip(1.0)]), &png, 0, &mut s).unwrap(), px);

        let plan = tiny_plan(&[flip(1.0), OpSpec::Layout { order: Layout::Chw }]);
        assert_eq!(plan.output_shape(), [3, 2, 4]);
        assert_eq!(run(&plan, &png, 0, &mut s).unwrap(), chw(&mirrored, 4, 2));

        let plan = tiny_plan(&[OpSpec::Dtype { dtype: DType::F32 }]);
        assert_eq!((plan.output_dtype(), plan.output_bytes()), (DType::F32, 4 * 2 * 3 * 4));
        let want: Vec<f32> = px.iter().map(|&v| f32::from(v) / 255.0).collect();
        assert_eq!(f32s(&run(&plan, &png, 0, &mut s).unwrap()), want);

        let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
        let plan = tiny_plan(&[flip(1.0), OpSpec::Normalize { mean, std }, OpSpec::Layout { order: Layout::Chw }]);
        assert_eq!(plan.step_names(), ["decode+center_crop", "random_horizontal_flip", "normalize+layout"]);
        let got = f32s(&run(&plan, &png, 0, &mut s).unwrap());
        let want: Vec<f32> = chw(&mirrored, 4, 2)
            .iter()
            .enumerate()
            .map(|(i, &v)| (f32::from(v) / 255.0 - mean[i / 8]) / std[i / 8])
            .collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }

        // HWC f32 with flip.
        let plan = tiny_plan(&[flip(1.0), OpSpec::Dtype { dtype: DType::F32 }]);
        let want: Vec<f32> = mirrored.iter().map(|&v| f32::from(v) / 255.0).collect();
        assert_eq!(f32s(&run(&plan, &png, 0, &mut s).unwrap()), want);

        // A flip before a crop is applied before cropping: crop the mirrored image.
        let ops = [OpSpec::Decode, flip(1.0), OpSpec::CenterCrop { size: Size { height: 2, width: 2 } }];
        let got = run(&Plan::compile(&ops, Limits::default()), &png, 0, &mut s).unwrap();
        let want: Vec<u8> = mirrored.chunks_exact(12).flat_map(|row| row[3..9].to_vec()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn colour_ops_run_before_the_write_and_random_erasing_after_it() {
        let (png, px) = tiny();
        let mut s = Scratch::new();
        let flip = OpSpec::RandomHorizontalFlip { p: 1.0 };
        // A flip stays pending past pointwise ops (invert, then solarize at 0 inverts back)
        // and still lands in the write; a neighbourhood op (sharpness 1 is the identity)
        // applies it first.
        let twice = [flip.clone(), OpSpec::Invert, OpSpec::Solarize { threshold: 0.0, p: 1.0 }];
        assert_eq!(run(&tiny_plan(&twice), &png, 0, &mut s).unwrap(), mirror(&px, 4));
        let sharp = [flip, OpSpec::AdjustSharpness { sharpness_factor: 1.0, p: 1.0 }];
        assert_eq!(run(&tiny_plan(&sharp), &png, 0, &mut s).unwrap(), mirror(&px, 4));

        // 4x2, scale 1/4, ratio 1: one pixel (round(sqrt(2)) = 1), erased in normalized units.
        let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
        let value = sluice_core::spec::ErasingValue::One(-9.0);
        let erase = OpSpec::RandomErasing { p: 1.0, scale: [0.25, 0.25], ratio: [1.0, 1.0], value };
        let plan = tiny_plan(&[OpSpec::Normalize { mean, std }, OpSpec::Layout { order: Layout::Chw }, erase]);
        assert_eq!(plan.step_names(), ["decode+center_crop", "normalize+layout", "random_erasing"]);
        let got = f32s(&run(&plan, &png, 0, &mut s).unwrap());
        assert_eq!(got.iter().filter(|&&v| v == -9.0).count(), 3, "{got:?}");
        let pixel = got.iter().position(|&v| v == -9.0).unwrap_or(0);
        assert_eq!([got[pixel + 8], got[pixel + 16]], [-9.0, -9.0], "one pixel, every channel plane");
    }

    #[test]
    fn flip_probability_is_respected_and_drawn_per_sample() {
        let (png, px) = tiny();
        let plan = tiny_plan(&[OpSpec::RandomHorizontalFlip { p: 0.5 }]);
        let mut s = Scratch::new();
        let flipped = (0..200).filter(|&k| run(&plan, &png, k, &mut s).unwrap() != px).count();
        assert!((70..130).contains(&flipped), "{flipped} of 200 flipped");
    }

    #[test]
    fn output_is_a_function_of_bytes_seed_epoch_and_key() {
        let (w, h) = (200, 150);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: "/x".into() }, 32, 4);
        let plan = Plan::compile(&spec.ops, spec.limits);
        assert_eq!(plan.step_names(), ["decode+random_resized_crop", "random_horizontal_flip", "write"]);
        assert_eq!(plan.output_shape(), [32, 32, 3]);
        let mut s1 = Scratch::new();
        let mut s2 = Scratch::new();
        let a = run(&plan, &jpg, 7, &mut s1).unwrap();
        // A different scratch that has seen other images first gives the same bytes.
        run(&plan, &jpg, 8, &mut s2).unwrap();
        assert_eq!(run(&plan, &jpg, 7, &mut s2).unwrap(), a);
        assert_ne!(run(&plan, &jpg, 9, &mut s1).unwrap(), a);
    }

    #[test]
    fn step_times_accumulate_per_step() {
        let (w, h) = (200, 150);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let plan =
            Plan::compile(&[OpSpec::Decode, rrc(32), OpSpec::RandomHorizontalFlip { p: 0.5 }], Limits::default());
        let mut times = vec![Duration::ZERO; 3];
        let mut out = vec![0u8; plan.output_bytes()];
        let mut s = Scratch::new();
        plan.run(&jpg, &mut rng(1), &mut s, &mut out, &mut times, Records::default()).unwrap();
        let first = times[0];
        assert!(first > Duration::ZERO);
        plan.run(&jpg, &mut rng(2), &mut s, &mut out, &mut times, Records::default()).unwrap();
        assert!(times[0] > first);
        // A short slice records less and does not panic.
        plan.run(&jpg, &mut rng(3), &mut s, &mut out, &mut times[..1], Records::default()).unwrap();
    }

    #[test]
    fn cache_split_sits_before_the_first_random_op() {
        let plan =
            Plan::compile(&[OpSpec::Decode, rrc(32), OpSpec::RandomHorizontalFlip { p: 0.5 }], Limits::default());
        assert_eq!(plan.cache_split(), 1);
        assert_eq!(plan.prefix_step_names(), ["decode"]);
        assert_eq!(plan.suffix_step_names(), ["random_resized_crop", "random_horizontal_flip", "write"]);

        // Validation-style pipeline: everything geometric is deterministic.
        let (w, h) = (300, 200);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let ops = [
            OpSpec::Decode,
            OpSpec::resize(64),
            OpSpec::CenterCrop { size: Size::square(56) },
            OpSpec::Normalize { mean: [0.5; 3], std: [0.25; 3] },
        ];
        let plan = Plan::compile(&ops, Limits::default());
        assert_eq!(plan.cache_split(), 3);
        assert_eq!(plan.prefix_step_names(), ["decode+resize", "center_crop"]);
        assert_eq!(plan.suffix_step_names(), ["normalize"]);
        let mut s = Scratch::new();
        let img = plan.run_deterministic_prefix(&jpg, &mut s, &mut [], None, None).unwrap();
        assert_eq!((img.width, img.height), (56, 56));
        let mut from_cache = vec![0u8; plan.output_bytes()];
        plan.run_from_image(&img, &mut rng(0), &mut s, &mut from_cache, &mut [], None, None).unwrap();
        assert_eq!(from_cache, run(&plan, &jpg, 0, &mut s).unwrap());

        // A cached image of the wrong kind is an error.
        let bad = Image::rgb8(2, 2, vec![0; 12]);
        let mut small = vec![0u8; plan.output_bytes()];
        assert!(matches!(
            plan.run_from_image(&bad, &mut rng(0), &mut s, &mut small, &mut [], None, None),
            Err(CodecError::Shape(_))
        ));
    }

    #[test]
    fn png_and_grayscale_inputs_go_through_the_fused_step() {
        let (w, h) = (120, 90);
        let rgb = test_rgb(w, h);
        let png_bytes = encode_png(&rgb, w, h, png::ColorType::Rgb, png::BitDepth::Eight, None);
        let plan = Plan::compile(&[OpSpec::Decode, rrc(48)], Limits::default());
        let mut s = Scratch::new();
        let got = run(&plan, &png_bytes, 3, &mut s).unwrap();
        let r = random_resized_crop_params(w, h, SCALE, RATIO, &mut rng(3));
        let mut want = vec![0u8; 48 * 48 * 3];
        Resizer::new().resize_rect(Resample::default(), &rgb, w, h, rect_of(r), &mut want, 48, 48).unwrap();
        assert_eq!(got, want);

        let gray: Vec<u8> = (0..w * h).map(|i| (i % 200) as u8).collect();
        let jpg = crate::encode::encode_jpeg_with(&gray, w, h, crate::SourcePixels::Gray, crate::Subsampling::Gray, 90)
            .unwrap();
        let got = run(&plan, &jpg, 3, &mut s).unwrap();
        assert!(got.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    #[test]
    fn bad_inputs_are_errors_never_panics() {
        let (w, h) = (128, 96);
        let jpg = encode_jpeg(&test_rgb(w, h), w, h, 90).unwrap();
        let (png_bytes, _) = tiny();
        let fused = Plan::compile(&[OpSpec::Decode, rrc(32)], Limits::default());
        let unfused =
            Plan::compile(&[OpSpec::Decode, OpSpec::RandomHorizontalFlip { p: 0.5 }, rrc(32)], Limits::default());
        let mut s = Scratch::new();
        for plan in [&fused, &unfused] {
            assert_eq!(run(plan, b"", 0, &mut s), Err(CodecError::Empty));
            assert_eq!(run(plan, b"just some text", 0, &mut s), Err(CodecError::UnknownFormat));
            assert!(matches!(run(plan, &jpg[..jpg.len() / 2], 0, &mut s), Err(CodecError::Corrupt(_))));
            assert!(matches!(run(plan, &jpg[..3], 0, &mut s), Err(CodecError::Corrupt(_))));
            assert!(matches!(run(plan, &png_bytes[..png_bytes.len() - 20], 0, &mut s), Err(CodecError::Corrupt(_))));
            let mut huge = jpg.clone();
            patch_sof_dims(&mut huge, 60000, 60000);
            assert!(matches!(
                run(plan, &huge, 0, &mut s),
                Err(CodecError::TooLarge { width: 60000, height: 60000, .. })
            ));
            // The worker carries on.
            assert!(run(plan, &jpg, 0, &mut s).is_ok());
        }
        // Limits come from the plan.
        let tight = Plan::compile(&[OpSpec::Decode, rrc(32)], Limits { max_pixels: 1000, ..Limits::default() });
        assert_eq!(run(&tight, &jpg, 0, &mut s), Err(CodecError::TooLarge { width: 128, height: 96, limit: 1000 }));
        // Wrong slot size.
        let mut out = vec![0u8; 5];
        assert!(matches!(
            fused.run(&jpg, &mut rng(0), &mut s, &mut out, &mut [], Records::default()),
            Err(CodecError::Shape(_))
        ));
        // An unvalidated list without a fixed size fails cleanly.
        let bad = Plan::compile(&[OpSpec::Decode, OpSpec::resize(10)], Limits::default());
        assert_eq!(bad.output_bytes(), 0);
        assert!(matches!(
            bad.run(&jpg, &mut rng(0), &mut s, &mut [], &mut [], Records::default()),
            Err(CodecError::Shape(_))
        ));
        let no_decode = Plan::compile(&[rrc(16)], Limits::default());
        let mut out = vec![0u8; no_decode.output_bytes()];
        assert!(no_decode.run(&jpg, &mut rng(0), &mut s, &mut out, &mut [], Records::default()).is_ok());
    }

    #[test]
    fn a_resize_never_makes_more_pixels_than_max_pixels() {
        // A 2000x1 image resized to a shorter side of 64 is 128000x64 (8.2 M pixels); with a
        // shorter side of 256 and a 60000x1 image it would be 46 GB. A hostile image must
        // not make a worker allocate that: the resize output is held to `max_pixels`.
        let limits = Limits { max_pixels: 1 << 20, ..Limits::default() };
        let crop = OpSpec::CenterCrop { size: Size::square(32) };
        let thin_jpg = encode_jpeg(&test_rgb(2000, 1), 2000, 1, 90).unwrap();
        let thin_png = encode_png(&test_rgb(2000, 1), 2000, 1, png::ColorType::Rgb, png::BitDepth::Eight, None);
        let fused = Plan::compile(&[OpSpec::Decode, OpSpec::resize(64), crop.clone()], limits);
        let flip = OpSpec::RandomHorizontalFlip { p: 0.5 };
        let stepwise = Plan::compile(&[OpSpec::Decode, flip, OpSpec::resize(64), crop], limits);
        for (what, plan, bytes) in
            [("jpeg", &fused, &thin_jpg), ("png", &fused, &thin_png), ("after a flip", &stepwise, &thin_jpg)]
        {
            let mut s = Scratch::new();
            let (got, peak) = crate::alloc_probe::peak_bytes_during(|| run(plan, bytes, 0, &mut s).map(|v| v.len()));
            assert_eq!(got, Err(CodecError::ResizeTooLarge { width: 128_000, height: 64, limit: 1 << 20 }), "{what}");
            assert!(peak < 4 << 20, "{what}: held {peak} bytes");
        }
        // An ordinary image through the same plan is fine.
        let jpg = encode_jpeg(&test_rgb(128, 96), 128, 96, 90).unwrap();
        assert!(run(&fused, &jpg, 0, &mut Scratch::new()).is_ok());
    }

    /// A black `w x h` image with a white rectangle `[x1, y1, x2, y2]`.
    fn white_rect(w: u32, h: u32, r: [u32; 4]) -> Vec<u8> {
        let mut px = vec![0u8; (w * h * 3) as usize];
        for y in r[1]..r[3] {
            for x in r[0]..r[2] {
                let o = ((y * w + x) * 3) as usize;
                px[o..o + 3].copy_from_slice(&[255; 3]);
            }
        }
        px
    }

    /// Asserts the white pixels of the `w x h` u8 HWC output are where box `b` says:
    /// white more than `margin` inside it, black more than `margin` outside.
    fn assert_box_encloses_white(out: &[u8], w: u32, b: [f32; 4], margin: f32, what: &str) {
        for (i, p) in out.chunks_exact(3).enumerate() {
            let (x, y) = ((i as u32 % w) as f32 + 0.5, (i as u32 / w) as f32 + 0.5);
            let inside = x > b[0] + margin && x < b[2] - margin && y > b[1] + margin && y < b[3] - margin;
            let outside = x < b[0] - margin || x > b[2] + margin || y < b[1] - margin || y > b[3] + margin;
            assert!(!inside || p[0] > 128, "{what}: ({x}, {y}) inside {b:?} is {p:?}");
            assert!(!outside || p[0] < 128, "{what}: ({x}, {y}) outside {b:?} is {p:?}");
        }
    }

    /// The boxes tests' 200x150 image: its size, its white rectangle on black, its pixels
    /// and its PNG.
    fn rect_image() -> ((u32, u32), [u32; 4], Vec<u8>, Vec<u8>) {
        let (w, h) = (200u32, 150u32);
        let rect = [60, 40, 140, 110];
        let px = white_rect(w, h, rect);
        let png = encode_png(&px, w, h, png::ColorType::Rgb, png::BitDepth::Eight, None);
        ((w, h), rect, px, png)
    }

    #[test]
    fn boxes_move_with_the_pixels_through_fused_and_stepwise_ops() {
        let ((w, h), rect, px, png) = rect_image();
        let jpg = encode_jpeg(&px, w, h, 95).unwrap();
        let crop = |scale| OpSpec::random_resized_crop(Size::square(64), scale, RATIO);
        let flip = OpSpec::RandomHorizontalFlip { p: 1.0 };
        let vflip = OpSpec::RandomVerticalFlip { p: 1.0 };
        let rot = OpSpec::RandomRotation {
            degrees: [90.0, 90.0],
            interpolation: sluice_core::Interpolation::Nearest,
            expand: true,
            center: None,
            fill: [0; 3],
        };
        let pad = OpSpec::Pad { padding: [7, 3, 0, 9], fill: [0; 3], padding_mode: sluice_core::PaddingMode::Constant };
        let plans = [
            ("fused rrc + flip", vec![OpSpec::Decode, crop([0.6, 1.0]), flip.clone()]),
            ("vflip, rrc", vec![OpSpec::Decode, vflip.clone(), crop([0.6, 1.0])]),
            (
                "rotate 90, pad, center_crop",
                vec![OpSpec::Decode, rot, pad, OpSpec::CenterCrop { size: Size::square(120) }],
            ),
            (
                "resize, center_crop, flip",
                vec![OpSpec::Decode, OpSpec::resize(100), OpSpec::CenterCrop { size: Size::square(90) }, flip],
            ),
        ];
        let mut kept = 0;
        for (what, ops) in plans {
            let plan = Plan::compile(&ops, Limits::default());
            let mut out = vec![0u8; plan.output_bytes()];
            let ow = plan.output_shape()[1] as u32;
            for (fmt, bytes, margin) in [("png", &png, 1.0), ("jpeg", &jpg, 2.0)] {
                for key in 0..8 {
                    let mut t = BoxTargets { boxes: vec![rect.map(|v| v as f32)], labels: vec![3] };
                    let records = Records { boxes: Some(&mut t), mask: None };
                    plan.run(bytes, &mut rng(key), &mut Scratch::new(), &mut out, &mut [], records).unwrap();
                    let mut plain = vec![0u8; plan.output_bytes()];
                    plan.run(bytes, &mut rng(key), &mut Scratch::new(), &mut plain, &mut [], Records::default())
                        .unwrap();
                    assert_eq!(plain, out, "{what}: boxes must not change the pixels");
                    if let Some(&b) = t.boxes.first() {
                        kept += 1;
                        assert_eq!(t.labels, vec![3]);
                        assert_box_encloses_white(&out, ow, b, margin, &format!("{what} {fmt} key {key}"));
                    } else {
                        assert!(out.chunks_exact(3).all(|p| p[0] < 128), "{what}: box dropped but white left");
                    }
                }
            }
        }
        assert!(kept > 40, "only {kept} boxes kept");
    }

    #[test]
    fn random_iou_crop_crops_against_the_boxes_and_leaves_a_sample_without_them() {
        let ((w, h), rect, px, png) = rect_image();
        let iou = OpSpec::RandomIouCrop {
            min_scale: 0.3,
            max_scale: 1.0,
            min_aspect_ratio: 0.5,
            max_aspect_ratio: 2.0,
            sampler_options: vec![0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0],
            trials: 40,
        };
        let ops = [OpSpec::Decode, iou, OpSpec::CenterCrop { size: Size { height: h, width: w } }];
        let plan = Plan::compile(&ops, Limits::default());
        let mut out = vec![0u8; plan.output_bytes()];
        let mut cropped = 0;
        for key in 0..16 {
            let mut t = BoxTargets { boxes: vec![rect.map(|v| v as f32)], labels: vec![3] };
            let records = Records { boxes: Some(&mut t), mask: None };
            plan.run(&png, &mut rng(key), &mut Scratch::new(), &mut out, &mut [], records).unwrap();
            // The crop holds the box's centre, so the box stays, on its pixels.
            assert_eq!(t.labels, vec![3], "key {key}");
            assert_box_encloses_white(&out, w, t.boxes[0], 1.0, &format!("key {key}"));
            // A crop (re-centred by the center crop) moves the box.
            cropped += usize::from(t.boxes[0] != rect.map(|v| v as f32));
            // Without boxes (a source that has none) the image is left as it is.
            plan.run(&png, &mut rng(key), &mut Scratch::new(), &mut out, &mut [], Records::default()).unwrap();
            assert_eq!(out, px, "key {key}: a sample without boxes was changed");
        }
        assert!(cropped >= 4, "only {cropped} of 16 samples cropped");
    }

    #[test]
    fn an_op_that_refuses_boxes_fails_a_sample_with_boxes_or_a_mask_rather_than_leave_them() {
        // Validation refuses this spec with boxes; a plan compiled without it must not run
        // the policy and hand back boxes and a mask the pixels left behind.
        let ((w, h), rect, _, png) = rect_image();
        let augmix = OpSpec::AugMix {
            severity: 3,
            mixture_width: 3,
            chain_depth: -1,
            alpha: 1.0,
            all_ops: true,
            interpolation: sluice_core::Interpolation::Bilinear,
            fill: None,
        };
        let plan =
            Plan::compile(&[OpSpec::Decode, augmix, OpSpec::CenterCrop { size: Size::square(64) }], Limits::default());
        let mut out = vec![0u8; plan.output_bytes()];
        let mut t = BoxTargets { boxes: vec![rect.map(|v| v as f32)], labels: vec![3] };
        let e = plan.run(
            &png,
            &mut rng(1),
            &mut Scratch::new(),
            &mut out,
            &mut [],
            Records { boxes: Some(&mut t), mask: None },
        );
        assert_eq!(e, Err(CodecError::RefusesBoxes { op: "augmix" }));
        let mut m = Mask { width: w, height: h, data: vec![0; (w * h) as usize] };
        let e = plan.run(
            &png,
            &mut rng(1),
            &mut Scratch::new(),
            &mut out,
            &mut [],
            Records { boxes: None, mask: Some(&mut m) },
        );
        assert!(e.unwrap_err().to_string().contains("`augmix` cannot move boxes or masks"));
        // Without either, it runs.
        plan.run(&png, &mut rng(1), &mut Scratch::new(), &mut out, &mut [], Records::default()).unwrap();
    }

    #[test]
    fn an_output_too_large_to_count_leaves_the_plan_without_a_size() {
        // Only an unvalidated op list has one; `h × w × 3 × 4` does not fit in a usize.
        let huge = OpSpec::CenterCrop { size: Size { height: u32::MAX, width: u32::MAX } };
        let plan = Plan::compile(&[OpSpec::Decode, huge, OpSpec::Dtype { dtype: DType::F32 }], Limits::default());
        assert_eq!(plan.output_bytes(), 0);
        let jpg = encode_jpeg(&test_rgb(16, 16), 16, 16, 90).unwrap();
        assert!(matches!(run(&plan, &jpg, 0, &mut Scratch::new()), Err(CodecError::Shape(_))));
    }
}
