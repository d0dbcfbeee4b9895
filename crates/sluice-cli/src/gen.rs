//! `sluice gen-images`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sluice_synth::{shard_name, write_dataset, write_tar_shards, DatasetOptions, DatasetSummary};

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// Output folder (ImageFolder layout: OUT/class_XXX/img_XXXXXXX.jpg; or tar shards, see
    /// --tar-shards).
    #[arg(long, default_value = "data/imagenet-like")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 2000)]
    pub images: usize,
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// JPEG quality, 1-100.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: u8,
    /// Also write this many bad files (truncated, empty, not an image, garbage, huge header).
    #[arg(long, default_value_t = 0)]
    pub corrupt: usize,
    /// Also write each image's boxes (the shapes drawn on it): a JSON sidecar beside each
    /// image and OUT/instances.json (COCO), for the `sidecar` and `coco` sources.
    #[arg(long)]
    pub boxes: bool,
    /// Also write each image's segmentation mask (implies --boxes): a grey
    /// `img_XXXXXXX.mask.png` beside each image (the shapes' pixels set to their box label,
    /// counted from 1), named by the sidecar, and RLE segmentations in instances.json.
    #[arg(long)]
    pub masks: bool,
    /// Also write metadata fields into each sidecar (implies --boxes): `id` (int),
    /// `caption` (text), `score` (float) and `tags` (multi_label, --classes classes), for a
    /// spec's `fields` (docs/records.md).
    #[arg(long)]
    pub fields: bool,
    /// Write the samples into this many WebDataset tar shards, OUT/shard-000000.tar, ...,
    /// instead of class folders: `img_XXXXXXX.jpg` with its label in `.cls`, and with
    /// --boxes/--masks/--fields its `.json` sidecar (and `.mask.png`), for a `tar` source
    /// (with `sidecars = true`). Bad files go into the last shard.
    #[arg(long, value_name = "N")]
    pub tar_shards: Option<usize>,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    generate(&a)
}

/// The demo's dataset in `out` ([`sluice_synth::ensure_dataset`]): `images` generated JPEGs
/// in 10 classes plus `corrupt` bad files, made only if the folder is missing.
pub fn ensure_dataset(out: &Path, images: usize, corrupt: usize) -> anyhow::Result<()> {
    let pb = progress::bar(images as u64, "generating");
    let made = sluice_synth::ensure_dataset(out, images, corrupt, &|n| pb.set_position(n as u64))
        .with_context(|| format!("generating a dataset in {}", out.display()))?;
    pb.finish_and_clear();
    match made {
        Some(summary) => report(&summary, 10, out),
        None => eprintln!("using the dataset already in {}", out.display()),
    }
    Ok(())
}

fn generate(a: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.images > 0, "--images must be at least 1");
    anyhow::ensure!(a.classes > 0, "--classes must be at least 1");
    let options = DatasetOptions {
        images: a.images,
        classes: a.classes,
        seed: a.seed,
        quality: a.quality,
        corrupt: a.corrupt,
        boxes: a.boxes,
        masks: a.masks,
        fields: a.fields,
        ..Default::default()
    };
    anyhow::ensure!(a.tar_shards != Some(0), "--tar-shards must be at least 1");
    let pb = progress::bar(a.images as u64, "generating");
    let on_progress = |n: usize| pb.set_position(n as u64);
    let summary = match a.tar_shards {
        Some(shards) => write_tar_shards(&a.out, &options, shards, &on_progress),
        None => write_dataset(&a.out, &options, &on_progress),
    }
    .with_context(|| format!("generating a dataset in {}", a.out.display()))?;
    pb.finish_and_clear();
    report(&summary, a.classes, &a.out);
    if let Some(shards) = a.tar_shards {
        let shards = shards.min(a.images);
        let sidecars = if a.boxes || a.masks || a.fields { ", with sidecars = true" } else { "" };
        eprintln!(
            "tar shards: {} .. {} (a `tar` source{sidecars})",
            a.out.join(shard_name(0)).display(),
            a.out.join(shard_name(shards - 1)).display()
        );
    }
    if a.masks {
        eprintln!("masks: an .mask.png beside each image, named by its sidecar");
    }
    if a.fields {
        eprintln!(
            "fields in each sidecar: id (int), caption (text), score (float), tags (multi_label, {} classes)",
            a.classes
        );
    }
    if (a.boxes || a.masks || a.fields) && a.tar_shards.is_none() {
        eprintln!("boxes: a .json sidecar beside each image, and {}", a.out.join("instances.json").display());
    }
    Ok(())
}

fn report(summary: &DatasetSummary, classes: usize, out: &Path) {
    eprintln!(
        "wrote {} images ({classes} classes, {:.0} KB average) and {} bad files to {}",
        summary.images,
        summary.bytes as f64 / summary.images.max(1) as f64 / 1000.0,
        summary.bad_files.len(),
        out.display()
    );
}
