//! `sluice stream-push`: streams a dataset into a Redis stream for continual learning.

use std::path::PathBuf;

use anyhow::Context;
use sluice_core::SourceSpec;
use sluice_stream::{push_dataset, PushOptions, PushOrder};

#[derive(clap::Args)]
pub struct Args {
    /// An ImageFolder root, a file list (`path [label]` per line) or a .tar shard.
    pub dataset: PathBuf,
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub url: String,
    /// The stream's key.
    #[arg(long, default_value = "sluice")]
    pub stream: String,
    /// Samples per second (`100` or `100/s`); 0 pushes as fast as the broker takes them.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub rate: f64,
    #[arg(long, value_enum, default_value = "as-listed")]
    pub order: Order,
    /// With `--order class-incremental`: classes per task (split MNIST: 2).
    #[arg(long, default_value_t = 2)]
    pub classes_per_task: usize,
    /// Seed of the shuffles.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Push only the first N samples of the order.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Do not append the end-of-stream marker.
    #[arg(long)]
    pub no_end: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Order {
    AsListed,
    Shuffled,
    ClassIncremental,
}

/// Samples per second: the time to the n-th sample, `n / rate`, must be a `Duration`.
fn parse_rate(s: &str) -> Result<f64, String> {
    crate::duration_flags::rate(s.strip_suffix("/s").unwrap_or(s))
        .map_err(|e| format!("{e} (samples per second, e.g. 100 or 100/s)"))
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let source = if a.dataset.is_dir() {
        SourceSpec::ImageFolder { root: a.dataset.clone() }
    } else if a.dataset.extension().is_some_and(|e| e == "tar") {
        SourceSpec::Tar { shards: vec![a.dataset.clone()], sidecars: false, masks: false }
    } else {
        SourceSpec::FileList { path: a.dataset.clone(), root: None }
    };
    let manifest = sluice_pipeline::source::build_manifest(&source)?;
    let order = match a.order {
        Order::AsListed => PushOrder::AsListed,
        Order::Shuffled => PushOrder::Shuffled,
        Order::ClassIncremental => PushOrder::ClassIncremental,
    };
    let opts = PushOptions {
        url: a.url.clone(),
        stream: a.stream.clone(),
        rate: a.rate,
        order,
        classes_per_task: a.classes_per_task,
        seed: a.seed,
        limit: a.limit,
        end: !a.no_end,
        reconnect_ms: 10_000,
    };
    let report = push_dataset(&manifest, &opts).with_context(|| format!("pushing {}", a.dataset.display()))?;
    println!(
        "pushed {} samples ({:.1} MB) to stream `{}` in {:.2} s ({:.0} samples/s)",
        report.pushed,
        report.bytes as f64 / 1e6,
        a.stream,
        report.seconds,
        report.pushed as f64 / report.seconds.max(1e-9)
    );
    Ok(())
}
