//! Deterministic, ImageNet-like datasets: an ImageFolder tree of JPEGs around 500×375 and
//! ~100 KB each, whose content depends on the class (so a model can learn something) and
//! on a seed (so two runs write identical bytes). Optionally adds bad files of every kind
//! the loader must survive.

use std::path::{Path, PathBuf};

use sluice_core::SampleKey;
use sluice_core::SampleRng;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot encode image {index}: {message}")]
    Encode { index: usize, message: String },
}

#[derive(Debug, Clone)]
pub struct DatasetOptions {
    pub images: usize,
    pub classes: usize,
    pub seed: u64,
    /// JPEG quality (1-100).
    pub quality: u8,
    /// Per-pixel texture noise amplitude; sets how much the JPEGs weigh (~100 KB at 35, quality 90).
    pub texture: u8,
    /// Bad files to add (cycling through the kinds in [`BAD_KINDS`]).
    pub corrupt: usize,
    /// Also write each image's boxes (the shapes drawn on it, labelled with its class): a
    /// JSON sidecar beside each image (`img_XXXXXXX.json`, the `sidecar` source) and
    /// `instances.json` at the root (the `coco` source, `images` = the root).
    pub boxes: bool,
    /// Also write each image's segmentation mask (implies `boxes`): `img_XXXXXXX.mask.png`
    /// beside it (grey, each shape's pixels set to its box label, 0 elsewhere, later shapes
    /// over earlier ones as drawn), named by the sidecar's `"mask"`, and each shape as an
    /// RLE `segmentation` in `instances.json`. Box labels then count from 1 (class + 1),
    /// so that 0 is the background.
    pub masks: bool,
    /// Also write metadata fields into each sidecar (implies `boxes`), see
    /// [`SIDECAR_FIELDS`]: image `i` gets `"id": i`, `"caption": "image i of class c"`,
    /// `"score": i / 8` and `"tags": [c, (c + 1) % classes]` (c = its class), so a reader
    /// can check each value arrived in its sample's row.
    pub fields: bool,
}

/// The fields `fields` writes, as a spec names them (`tags` has `classes` classes).
pub const SIDECAR_FIELDS: [(&str, &str); 4] =
    [("id", "int"), ("caption", "text"), ("score", "float"), ("tags", "multi_label")];

impl Default for DatasetOptions {
    fn default() -> Self {
        Self {
            images: 1000,
            classes: 10,
            seed: 0,
            quality: 90,
            texture: 35,
            corrupt: 0,
            boxes: false,
            masks: false,
            fields: false,
        }
    }
}

/// The bad files `corrupt` cycles through, by file-name tag.
pub const BAD_KINDS: [&str; 5] = ["truncated", "empty", "notimage", "garbage", "huge"];

/// What was written.
#[derive(Debug, Clone, Default)]
pub struct DatasetSummary {
    pub images: usize,
    pub bad_files: Vec<PathBuf>,
    pub bytes: u64,
}

/// Class folder name for class `c`.
pub fn class_name(c: usize) -> String {
    format!("class_{c:03}")
}

/// Writes `options.images` JPEGs under `root/class_XXX/`, image `i` in class `i % classes`.
/// `progress` is called after each image with the number written so far.
pub fn write_dataset(
    root: &Path,
    options: &DatasetOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<DatasetSummary, SynthError> {
    let classes = options.classes.max(1);
    for c in 0..classes {
        let dir = root.join(class_name(c));
        std::fs::create_dir_all(&dir).map_err(|source| SynthError::Io { path: dir, source })?;
    }
    let write =
        |path: PathBuf, bytes: &[u8]| std::fs::write(&path, bytes).map_err(|source| SynthError::Io { path, source });
    let done = std::sync::atomic::AtomicUsize::new(0);
    let bytes = in_parallel(options.images, |i| {
        let sample = render(i, options)?;
        let path = root.join(class_name(i % classes)).join(format!("{}.jpg", sample_stem(i)));
        write(path.clone(), &sample.jpeg)?;
        if let Some(png) = &sample.mask {
            write(path.with_extension("mask.png"), png)?;
        }
        if let Some(json) = &sample.sidecar {
            write(path.with_extension("json"), json.as_bytes())?;
        }
        progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        Ok(sample.jpeg.len() as u64)
    })?;
    let mut summary = DatasetSummary { images: options.images, bytes, ..Default::default() };
    for k in 0..options.corrupt {
        let path = write_bad_file(root, k, classes, options)?;
        summary.bad_files.push(path);
    }
    if options.boxes || options.masks || options.fields {
        write_coco(root, options)?;
    }
    Ok(summary)
}

/// The file stem of image `i`, in a class folder or as a tar shard's sample key.
fn sample_stem(i: usize) -> String {
    format!("img_{i:07}")
}

/// The name of tar shard `s` of [`write_tar_shards`].
pub fn shard_name(s: usize) -> String {
    format!("shard-{s:06}.tar")
}

/// Writes the same samples as [`write_dataset`] as `shards` WebDataset tar shards,
/// `root/shard-000000.tar`, ... ([`shard_name`]), consecutive images in each (shard `s`
/// holds images `s·n/shards ..`): each image `img_XXXXXXX.jpg` with its label as text in
/// `img_XXXXXXX.cls`, and with `boxes`/`masks`/`fields` its sidecar `img_XXXXXXX.json`
/// (and mask `img_XXXXXXX.mask.png`, which the sidecar names), what a `tar` source with
/// `sidecars = true` (and `masks = true`) reads. Bad files go into the last shard, as
/// `bad_XXXX_<kind>.jpg`, without sidecars. No `instances.json` (COCO names files).
pub fn write_tar_shards(
    root: &Path,
    options: &DatasetOptions,
    shards: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<DatasetSummary, SynthError> {
    let shards = shards.clamp(1, options.images.max(1));
    std::fs::create_dir_all(root).map_err(|source| SynthError::Io { path: root.to_path_buf(), source })?;
    let classes = options.classes.max(1);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let bad_files = std::sync::Mutex::new(Vec::new());
    let bytes = in_parallel(shards, |s| {
        let path = root.join(shard_name(s));
        let io = |source| SynthError::Io { path: path.clone(), source };
        let file = std::fs::File::create(&path).map_err(io)?;
        let mut shard = tar::Builder::new(std::io::BufWriter::new(file));
        let mut append = |name: &str, data: &[u8]| -> Result<(), SynthError> {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            shard.append_data(&mut header, name, data).map_err(io)
        };
        let mut bytes = 0;
        for i in s * options.images / shards..(s + 1) * options.images / shards {
            let sample = render(i, options)?;
            let stem = sample_stem(i);
            append(&format!("{stem}.jpg"), &sample.jpeg)?;
            append(&format!("{stem}.cls"), (i % classes).to_string().as_bytes())?;
            if let Some(json) = &sample.sidecar {
                append(&format!("{stem}.json"), json.as_bytes())?;
            }
            if let Some(png) = &sample.mask {
                append(&format!("{stem}.mask.png"), png)?;
            }
            bytes += sample.jpeg.len() as u64;
            progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        }
        if s + 1 == shards {
            for k in 0..options.corrupt {
                let (name, data) = bad_file(k, options)?;
                append(&name, &data)?;
                if let Ok(mut names) = bad_files.lock() {
                    names.push(PathBuf::from(format!("{}:{name}", path.display())));
                }
            }
        }
        let mut out = shard.into_inner().map_err(io)?;
        std::io::Write::flush(&mut out).map_err(io)?;
        Ok(bytes)
    })?;
    let bad_files = bad_files.into_inner().unwrap_or_default();
    Ok(DatasetSummary { images: options.images, bad_files, bytes })
}

/// Runs `unit(0..units)` over the machine's threads (unit `u` on thread `u % threads`);
/// returns the sum of what they return, or the first error.
fn in_parallel(units: usize, unit: impl Fn(usize) -> Result<u64, SynthError> + Sync) -> Result<u64, SynthError> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let unit = &unit;
    let results: Vec<Result<u64, SynthError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (t..units).step_by(threads).map(unit).sum::<Result<u64, SynthError>>()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(SynthError::Encode { index: 0, message: "generator thread panicked".into() })
                })
            })
            .collect()
    });
    results.into_iter().sum()
}

/// One generated sample's files: its JPEG, and its mask PNG and sidecar JSON where asked for.
struct Rendered {
    jpeg: Vec<u8>,
    mask: Option<Vec<u8>>,
    sidecar: Option<String>,
}

/// Draws and encodes image `i` with the records `options` asks for.
fn render(i: usize, options: &DatasetOptions) -> Result<Rendered, SynthError> {
    let classes = options.classes.max(1);
    let encode = |e: sluice_codec::CodecError| SynthError::Encode { index: i, message: e.to_string() };
    let (w, h, rgb, shapes) = draw(i, options);
    let jpeg = sluice_codec::encode_jpeg(&rgb, w, h, options.quality).map_err(encode)?;
    let mask = match options.masks {
        true => Some(sluice_codec::encode_png_mask(&paint_mask(w, h, &shapes, i % classes + 1), w, h).map_err(encode)?),
        false => None,
    };
    let sidecar = (options.boxes || options.masks || options.fields).then(|| {
        let boxes: Vec<[u32; 4]> = shapes.iter().map(|s| s.bbox).collect();
        let json = sidecar_json(&boxes, i % classes, options.masks.then_some(i));
        if options.fields {
            with_fields(&json, i, classes)
        } else {
            json
        }
    });
    Ok(Rendered { jpeg, mask, sidecar })
}

/// The sidecar `json` of image `i` with its metadata fields added ([`DatasetOptions::fields`]).
fn with_fields(json: &str, i: usize, classes: usize) -> String {
    let c = i % classes;
    let fields = format!(
        ", \"id\": {i}, \"caption\": \"image {i} of class {c}\", \"score\": {}, \"tags\": [{c}, {}]}}\n",
        i as f64 / 8.0,
        (c + 1) % classes
    );
    format!("{}{fields}", json.trim_end().trim_end_matches('}'))
}

/// A sidecar: `{"boxes": [[x1, y1, x2, y2], ...], "labels": [...], "label": class}`, with
/// `"mask"` (and box labels from 1) when image `mask_of` has a mask.
fn sidecar_json(boxes: &[[u32; 4]], class: usize, mask_of: Option<usize>) -> String {
    let b: Vec<String> = boxes.iter().map(|b| format!("[{}, {}, {}, {}]", b[0], b[1], b[2], b[3])).collect();
    let l = vec![(class + usize::from(mask_of.is_some())).to_string(); boxes.len()];
    let mask = mask_of.map_or(String::new(), |i| format!(", \"mask\": \"img_{i:07}.mask.png\""));
    format!("{{\"boxes\": [{}], \"labels\": [{}], \"label\": {class}{mask}}}\n", b.join(", "), l.join(", "))
}

/// One shape drawn on an image: its box, and whether it is the ellipse inscribed in it
/// (centre `c`, radii `r`) or the whole box.
#[derive(Debug, Clone, Copy)]
struct Shape {
    bbox: [u32; 4],
    ellipse: Option<([f32; 2], [f32; 2])>,
}

impl Shape {
    /// Whether the shape covers pixel `(x, y)` (inside its box): the drawing's own test.
    fn covers(&self, x: usize, y: usize) -> bool {
        self.ellipse.is_none_or(|([cx, cy], [rx, ry])| {
            let (nx, ny) = ((x as f32 - cx) / rx, (y as f32 - cy) / ry);
            nx * nx + ny * ny <= 1.0
        })
    }
}

/// The `w x h` mask of `shapes` painted in order with `value`.
fn paint_mask(w: u32, h: u32, shapes: &[Shape], value: usize) -> Vec<u8> {
    let mut mask = vec![0u8; w as usize * h as usize];
    let v = u8::try_from(value).unwrap_or(u8::MAX);
    for s in shapes {
        let [x0, y0, x1, y1] = s.bbox.map(|c| c as usize);
        for y in y0..y1 {
            for x in x0..x1 {
                if s.covers(x, y) {
                    mask[y * w as usize + x] = v;
                }
            }
        }
    }
    mask
}

/// One shape's pixels as COCO's uncompressed RLE counts (column-major, from a run of zeros).
fn shape_rle(w: u32, h: u32, s: &Shape) -> Vec<u32> {
    let (mut counts, mut run, mut ones) = (Vec::new(), 0u32, false);
    let [x0, y0, x1, y1] = s.bbox.map(|c| c as usize);
    for x in 0..w as usize {
        for y in 0..h as usize {
            let on = (x0..x1).contains(&x) && (y0..y1).contains(&y) && s.covers(x, y);
            if on != ones {
                counts.push(run);
                (run, ones) = (0, on);
            }
            run += 1;
        }
    }
    counts.push(run);
    counts
}

/// `root/instances.json`: the good images with their boxes, COCO style (`bbox` as
/// `[x, y, width, height]`, `category_id` the class, image ids from 1).
fn write_coco(root: &Path, options: &DatasetOptions) -> Result<(), SynthError> {
    let classes = options.classes.max(1);
    let mut images = Vec::with_capacity(options.images);
    let mut annotations = Vec::new();
    for i in 0..options.images {
        let (w, h, _, shapes) = draw(i, &DatasetOptions { texture: 0, ..options.clone() });
        let file = format!("{}/img_{i:07}.jpg", class_name(i % classes));
        images.push(format!("{{\"id\": {}, \"file_name\": \"{file}\", \"width\": {w}, \"height\": {h}}}", i + 1));
        for s in shapes {
            let b = s.bbox;
            let (bw, bh) = (b[2] - b[0], b[3] - b[1]);
            let seg = if options.masks {
                let counts: Vec<String> = shape_rle(w, h, &s).iter().map(u32::to_string).collect();
                format!(", \"segmentation\": {{\"counts\": [{}], \"size\": [{h}, {w}]}}", counts.join(", "))
            } else {
                String::new()
            };
            annotations.push(format!(
                "{{\"id\": {}, \"image_id\": {}, \"bbox\": [{}, {}, {bw}, {bh}], \"category_id\": {}, \"area\": {}, \"iscrowd\": 0{seg}}}",
                annotations.len() + 1,
                i + 1,
                b[0],
                b[1],
                i % classes + usize::from(options.masks),
                bw * bh
            ));
        }
    }
    let categories: Vec<String> =
        (0..classes).map(|c| format!("{{\"id\": {c}, \"name\": \"{}\"}}", class_name(c))).collect();
    let json = format!(
        "{{\"images\": [\n{}\n], \"annotations\": [\n{}\n], \"categories\": [{}]}}\n",
        images.join(",\n"),
        annotations.join(",\n"),
        categories.join(", ")
    );
    let path = root.join("instances.json");
    std::fs::write(&path, json).map_err(|source| SynthError::Io { path, source })
}

/// The dataset the benchmarks and the demo use, in `root`: `images` JPEGs in 10 classes
/// (seed 0, quality 90) and `corrupt` bad files, written only where `root` is not a folder
/// yet. `None`: the folder was there and is used as it is (whatever it holds).
pub fn ensure_dataset(
    root: &Path,
    images: usize,
    corrupt: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Option<DatasetSummary>, SynthError> {
    if root.is_dir() {
        return Ok(None);
    }
    let options = DatasetOptions { images, corrupt, ..Default::default() };
    write_dataset(root, &options, progress).map(Some)
}

/// Image `i` of a dataset of noise: `side`×`side` pixels of uniform noise as a JPEG of
/// quality 90, the same bytes for the same `i`. Noise does not compress, so every sample
/// weighs about the same (what a benchmark of storage and network bandwidth needs).
pub fn noise_jpeg(i: usize, side: u32) -> Result<Vec<u8>, SynthError> {
    let mut rng = SampleRng::new(16, 0, SampleKey(i as u64), 0);
    let px: Vec<u8> = (0..side as usize * side as usize * 3).map(|_| rng.below(256) as u8).collect();
    sluice_codec::encode_jpeg(&px, side, side, 90).map_err(|e| SynthError::Encode { index: i, message: e.to_string() })
}

/// The JPEG bytes of image `i`.
pub fn image_jpeg(i: usize, options: &DatasetOptions) -> Result<Vec<u8>, SynthError> {
    let (w, h, rgb) = image_pixels(i, options);
    sluice_codec::encode_jpeg(&rgb, w, h, options.quality)
        .map_err(|e| SynthError::Encode { index: i, message: e.to_string() })
}

/// Pixels of image `i`: a two-colour gradient, class-coloured shapes and texture noise.
pub fn image_pixels(i: usize, options: &DatasetOptions) -> (u32, u32, Vec<u8>) {
    let (w, h, rgb, _) = image_pixels_with_boxes(i, options);
    (w, h, rgb)
}

/// The size of image `i` and the boxes of its shapes, without drawing it.
pub fn image_boxes(i: usize, options: &DatasetOptions) -> (u32, u32, Vec<[u32; 4]>) {
    let (w, h, _, boxes) = image_pixels_with_boxes(i, &DatasetOptions { texture: 0, ..options.clone() });
    (w, h, boxes)
}

/// [`image_pixels`] and the box of each shape drawn, `[x1, y1, x2, y2]` in pixels (a shape
/// covers pixels `x1..x2`, `y1..y2`; later shapes may hide parts of earlier ones).
pub fn image_pixels_with_boxes(i: usize, options: &DatasetOptions) -> (u32, u32, Vec<u8>, Vec<[u32; 4]>) {
    let (w, h, rgb, shapes) = draw(i, options);
    (w, h, rgb, shapes.iter().map(|s| s.bbox).collect())
}

/// Draws image `i`: its size, pixels and shapes.
fn draw(i: usize, options: &DatasetOptions) -> (u32, u32, Vec<u8>, Vec<Shape>) {
    let mut boxes = Vec::new();
    let class = i % options.classes.max(1);
    let mut rng = SampleRng::new(options.seed, 0, SampleKey(i as u64), 0);
    let mut class_rng = SampleRng::new(options.seed, 1, SampleKey(class as u64), 0);
    // ImageNet-like sizes: mostly landscape around 500×375, some portrait.
    let (mut w, mut h) = (440 + rng.below(121) as u32, 330 + rng.below(91) as u32);
    if rng.below(5) == 0 {
        std::mem::swap(&mut w, &mut h);
    }
    let color = |r: &mut SampleRng| [r.below(256) as f32, r.below(256) as f32, r.below(256) as f32];
    let class_colors = [color(&mut class_rng), color(&mut class_rng), color(&mut class_rng)];
    let (c0, c1) = (color(&mut rng), color(&mut rng));
    let angle = rng.uniform(0.0, std::f64::consts::TAU);
    let (dx, dy) = (angle.cos() as f32, angle.sin() as f32);
    let freq = rng.uniform(0.01, 0.05) as f32;

    let (wu, hu) = (w as usize, h as usize);
    let mut rgb = vec![0u8; wu * hu * 3];
    let scale = 1.0 / (w.max(h) as f32);
    for y in 0..hu {
        for x in 0..wu {
            let t = ((x as f32 * dx + y as f32 * dy) * scale * 0.5 + 0.5).clamp(0.0, 1.0);
            let wave = 20.0 * ((x as f32 + y as f32) * freq).sin();
            let o = (y * wu + x) * 3;
            for ch in 0..3 {
                rgb[o + ch] = (c0[ch] * (1.0 - t) + c1[ch] * t + wave).clamp(0.0, 255.0) as u8;
            }
        }
    }
    // Shapes in the class's colours: what a classifier can learn.
    for s in 0..(4 + rng.below(5) as usize) {
        let col = class_colors[s % 3];
        let (cx, cy) = (rng.below(w as u64) as f32, rng.below(h as u64) as f32);
        let (rx, ry) = (rng.uniform(20.0, 120.0) as f32, rng.uniform(20.0, 120.0) as f32);
        let ellipse = (class + s).is_multiple_of(2);
        let (x0, x1) = ((cx - rx).max(0.0) as usize, ((cx + rx) as usize).min(wu));
        let (y0, y1) = ((cy - ry).max(0.0) as usize, ((cy + ry) as usize).min(hu));
        if x1 > x0 && y1 > y0 {
            let bbox = [x0 as u32, y0 as u32, x1 as u32, y1 as u32];
            boxes.push(Shape { bbox, ellipse: ellipse.then_some(([cx, cy], [rx, ry])) });
        }
        for y in y0..y1 {
            for x in x0..x1 {
                let (nx, ny) = ((x as f32 - cx) / rx, (y as f32 - cy) / ry);
                if !ellipse || nx * nx + ny * ny <= 1.0 {
                    let o = (y * wu + x) * 3;
                    rgb[o..o + 3].copy_from_slice(&[col[0] as u8, col[1] as u8, col[2] as u8]);
                }
            }
        }
    }
    add_texture(&mut rgb, w, h, options.texture, &mut rng);
    (w, h, rgb, boxes)
}

/// Adds luminance texture with a natural-image (1/f-like) spectrum: value noise summed
/// over octaves from 128-pixel cells down to single pixels, the amplitude falling slowly
/// with the scale, plus a little per-pixel grain. JPEGs of such images cost what photos
/// cost to decode, unlike white noise (all high frequencies) or flat colour (none).
fn add_texture(rgb: &mut [u8], w: u32, h: u32, amplitude: u8, rng: &mut SampleRng) {
    if amplitude == 0 {
        return;
    }
    let (wu, hu) = (w as usize, h as usize);
    let mut lum = vec![0f32; wu * hu];
    let mut amp = f32::from(amplitude);
    let mut cell = 128usize;
    while cell >= 1 {
        let (gw, gh) = (wu / cell + 2, hu / cell + 2);
        let grid: Vec<f32> = (0..gw * gh).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let inv = 1.0 / cell as f32;
        for y in 0..hu {
            let (gy, fy) = (y / cell, (y % cell) as f32 * inv);
            let (row0, row1) = (&grid[gy * gw..], &grid[(gy + 1) * gw..]);
            for x in 0..wu {
                let (gx, fx) = (x / cell, (x % cell) as f32 * inv);
                let top = row0[gx] + (row0[gx + 1] - row0[gx]) * fx;
                let bottom = row1[gx] + (row1[gx + 1] - row1[gx]) * fx;
                lum[y * wu + x] += amp * (top + (bottom - top) * fy);
            }
        }
        cell /= 2;
        amp *= TEXTURE_FALLOFF;
    }
    let mut state = rng.next_u64() | 1;
    for (i, px) in rgb.iter_mut().enumerate() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let grain = ((state >> 40) % (2 * GRAIN + 1)) as f32 - GRAIN as f32;
        *px = (f32::from(*px) + lum[i / 3] + grain).clamp(0.0, 255.0) as u8;
    }
}

/// Amplitude ratio between successive texture octaves, and the grain amplitude.
const TEXTURE_FALLOFF: f32 = 0.95;
const GRAIN: u64 = 10;

/// Writes bad file number `k` ([`bad_file`]) into a class folder.
fn write_bad_file(root: &Path, k: usize, classes: usize, options: &DatasetOptions) -> Result<PathBuf, SynthError> {
    let (name, bytes) = bad_file(k, options)?;
    let path = root.join(class_name(k % classes)).join(name);
    std::fs::write(&path, bytes).map_err(|source| SynthError::Io { path: path.clone(), source })?;
    Ok(path)
}

/// Bad file number `k`, of kind `BAD_KINDS[k % 5]`: its name `bad_XXXX_<kind>.jpg` and bytes.
fn bad_file(k: usize, options: &DatasetOptions) -> Result<(String, Vec<u8>), SynthError> {
    let kind = BAD_KINDS[k % BAD_KINDS.len()];
    let good = image_jpeg(k, options)?;
    let bytes = match kind {
        "truncated" => good[..good.len() / 2].to_vec(),
        "empty" => Vec::new(),
        "notimage" => b"this is a text file that claims to be a JPEG\n".to_vec(),
        "garbage" => {
            let mut r = SampleRng::new(options.seed, 2, SampleKey(k as u64), 0);
            let mut g: Vec<u8> = (0..4096).map(|_| r.below(256) as u8).collect();
            g[..3].copy_from_slice(&[0xFF, 0xD8, 0xFF]);
            g
        }
        _ => huge_header_jpeg(&good),
    };
    Ok((format!("bad_{k:04}_{kind}.jpg"), bytes))
}

/// A small valid JPEG whose frame header claims 60000×60000 pixels.
pub fn huge_header_jpeg(jpeg: &[u8]) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    let mut i = 2;
    while i + 9 < out.len() {
        if out[i] != 0xFF {
            break;
        }
        let marker = out[i + 1];
        let len = u16::from_be_bytes([out[i + 2], out[i + 3]]) as usize;
        if (0xC0..=0xC2).contains(&marker) {
            out[i + 5..i + 7].copy_from_slice(&60000u16.to_be_bytes());
            out[i + 7..i + 9].copy_from_slice(&60000u16.to_be_bytes());
            break;
        }
        i += 2 + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_classes_differ() {
        let o = DatasetOptions { images: 4, classes: 2, ..Default::default() };
        assert_eq!(image_jpeg(1, &o).unwrap(), image_jpeg(1, &o).unwrap());
        assert_ne!(image_jpeg(1, &o).unwrap(), image_jpeg(3, &o).unwrap());
        let other = DatasetOptions { seed: 1, ..o.clone() };
        assert_ne!(image_jpeg(1, &o).unwrap(), image_jpeg(1, &other).unwrap());
    }

    #[test]
    fn writes_an_image_folder_with_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let o = DatasetOptions { images: 6, classes: 3, corrupt: 5, ..Default::default() };
        let s = write_dataset(dir.path(), &o, &|_| {}).unwrap();
        assert_eq!(s.bad_files.len(), 5);
        let jpgs = walk(dir.path());
        assert_eq!(jpgs.len(), 11);
        assert!(dir.path().join("class_002/img_0000005.jpg").is_file());
        let avg = s.bytes / 6;
        assert!((50_000..200_000).contains(&avg), "average JPEG is {avg} bytes");
        let empty = s.bad_files.iter().find(|p| p.to_string_lossy().contains("empty")).unwrap();
        assert_eq!(std::fs::metadata(empty).unwrap().len(), 0);
    }

    #[test]
    fn writes_tar_shards_of_consecutive_samples_with_labels_sidecars_and_masks() {
        let dir = tempfile::tempdir().unwrap();
        let o = DatasetOptions {
            images: 7,
            classes: 3,
            texture: 2,
            masks: true,
            fields: true,
            corrupt: 2,
            ..Default::default()
        };
        let s = write_tar_shards(dir.path(), &o, 3, &|_| {}).unwrap();
        assert_eq!((s.images, s.bad_files.len()), (7, 2));
        let members = |shard: usize| -> Vec<(String, Vec<u8>)> {
            let file = std::fs::File::open(dir.path().join(shard_name(shard))).unwrap();
            let mut archive = tar::Archive::new(file);
            let entries = archive.entries().unwrap().map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            });
            entries.collect()
        };
        // Shard 0 holds images 0 and 1 (7 / 3 per shard, rounded down), four members each.
        let first = members(0);
        let names: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "img_0000000.jpg",
                "img_0000000.cls",
                "img_0000000.json",
                "img_0000000.mask.png",
                "img_0000001.jpg",
                "img_0000001.cls",
                "img_0000001.json",
                "img_0000001.mask.png"
            ]
        );
        assert_eq!(first[0].1, image_jpeg(0, &o).unwrap(), "the folder layout's bytes");
        assert_eq!(first[5].1, b"1");
        let sidecar = String::from_utf8(first[6].1.clone()).unwrap();
        assert!(sidecar.contains("\"mask\": \"img_0000001.mask.png\"") && sidecar.contains("\"id\": 1,"), "{sidecar}");
        assert_eq!(members(1).len(), 8);
        let last = members(2);
        assert_eq!(last.len(), 3 * 4 + 2, "images 4, 5, 6 and the bad files");
        assert_eq!(last[12].0, "bad_0000_truncated.jpg");
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
}
