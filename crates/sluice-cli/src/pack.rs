//! `sluice pack`: copy a dataset with every JPEG rewritten losslessly with restart markers,
//! so random crops decode only what they cover (`sluice_pipeline::pack`).

use std::path::PathBuf;

use anyhow::Result;
use sluice_pipeline::pack::{pack_dataset, PackOptions};

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The dataset to read (any directory tree, e.g. an ImageFolder).
    pub src: PathBuf,
    /// Where to write the packed copy (created; must not lie inside `src`).
    pub out: PathBuf,
    /// MCUs per restart interval (lowered to divide each image's MCU row). Smaller
    /// intervals let crops skip more, and cost ~2.5 bytes each.
    #[arg(long, default_value_t = PackOptions::default().interval, value_parser = clap::value_parser!(u32).range(1..))]
    pub interval: u32,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn main(a: Args) -> Result<()> {
    let bar = progress::bar(0, "packing");
    let o = PackOptions { interval: a.interval, threads: a.threads, ..PackOptions::default() };
    let s = pack_dataset(&a.src, &a.out, &o, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    println!(
        "packed {} JPEGs with restart markers every {} MCUs, copied {} other files, into {} ({:.1} MB -> {:.1} MB, {:+.1}%)",
        s.packed,
        a.interval,
        s.copied,
        a.out.display(),
        s.bytes_in as f64 / 1e6,
        s.bytes_out as f64 / 1e6,
        100.0 * (s.bytes_out as f64 / s.bytes_in.max(1) as f64 - 1.0)
    );
    if !s.not_packed.is_empty() {
        println!("{} JPEGs could not be rewritten and were copied unchanged:", s.not_packed.len());
        for (path, why) in &s.not_packed {
            println!("  {}: {why}", path.display());
        }
    }
    Ok(())
}
