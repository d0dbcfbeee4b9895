//! `sluice index`: make the entropy index of every JPEG of a dataset ahead, into the folder
//! a pipeline names in `decode.index_dir`, so its first epoch cuts crops too
//! (`sluice_pipeline::pack::index_dataset`).

use std::path::PathBuf;

use anyhow::Result;
use sluice_core::{DecodeSpec, Limits};
use sluice_pipeline::pack::index_dataset;

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The dataset to read (any directory tree, e.g. an ImageFolder).
    pub src: PathBuf,
    /// The folder to write the indexes into (created); name it in the pipeline's
    /// `decode.index_dir`.
    pub out: PathBuf,
    /// MCUs between index points (the pipeline's `decode.index_spacing`).
    #[arg(long, default_value_t = DecodeSpec::default().index_spacing,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(sluice_core::spec::MAX_INDEX_SPACING)))]
    pub spacing: u32,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn main(a: Args) -> Result<()> {
    let bar = progress::bar(0, "indexing");
    let s = index_dataset(&a.src, &a.out, a.spacing, a.threads, Limits::default().max_pixels, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    println!(
        "indexed {} JPEGs ({} already indexed) into {}: {:.2} MB of indexes for {:.1} MB of JPEGs ({:.2}%)",
        s.indexed,
        s.already,
        a.out.display(),
        s.index_bytes as f64 / 1e6,
        s.bytes_in as f64 / 1e6,
        100.0 * s.index_bytes as f64 / s.bytes_in.max(1) as f64
    );
    if !s.unservable.is_empty() {
        println!(
            "{} JPEGs cannot be indexed (progressive, arithmetic-coded or damaged) and decode the ordinary way:",
            s.unservable.len()
        );
        for path in s.unservable.iter().take(20) {
            println!("  {}", path.display());
        }
        if s.unservable.len() > 20 {
            println!("  ... and {} more", s.unservable.len() - 20);
        }
    }
    Ok(())
}
