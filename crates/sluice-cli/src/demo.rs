//! `sluice demo`: the main job on data of sluice's own. Generates an ImageNet-like dataset
//! (once), writes the standard training spec next to it and runs it.

use std::path::PathBuf;

use anyhow::Context;
use sluice_core::{ErrorPolicy, PipelineSpec, SourceSpec};

use crate::{gen, run};

#[derive(clap::Args)]
pub struct Args {
    /// Where the generated dataset and spec go.
    #[arg(long, default_value = "data/demo")]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 2000)]
    pub images: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let train = a.dir.join("train");
    gen::ensure_dataset(&train, a.images, 5)?;
    let root = std::fs::canonicalize(&train).with_context(|| format!("resolving {}", train.display()))?;
    let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 224, 64);
    spec.on_error = ErrorPolicy::Skip;
    spec.threads = a.threads.into();
    let spec_path = a.dir.join("train.toml");
    std::fs::write(&spec_path, spec.to_toml_string()?).with_context(|| format!("writing {}", spec_path.display()))?;
    eprintln!("spec written to {} (edit it and run `sluice run {}`)", spec_path.display(), spec_path.display());
    run::run_spec(spec, a.epochs, false, None, &run::Learner::default(), &run::Dashboard::default())
}
