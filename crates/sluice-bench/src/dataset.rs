//! What the benchmarks share besides the chart writer and the local service of
//! `sluice-profile`: their generated datasets and the `sluice` binary they start.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// A benchmark's dataset in `root` ([`sluice_synth::ensure_dataset`]: `images` generated
/// JPEGs in 10 classes plus `corrupt` bad files), made only if the folder is missing.
pub fn ensure(root: &Path, images: usize, corrupt: usize) -> anyhow::Result<()> {
    match sluice_synth::ensure_dataset(root, images, corrupt, &|_| {})
        .with_context(|| format!("generating a dataset in {}", root.display()))?
    {
        Some(s) => eprintln!("wrote {} images and {} bad files to {}", s.images, s.bad_files.len(), root.display()),
        None => eprintln!("using the dataset already in {}", root.display()),
    }
    Ok(())
}

/// The `sluice` binary the benchmarks start (service processes, learners): `SLUICE_BIN`,
/// else the one beside this executable.
pub fn sluice_exe() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("finding the sluice-bench binary")?;
    let exe = me.with_file_name(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.is_file(),
        "this benchmark starts `sluice` processes and there is no sluice binary beside {} (looked for {}); \
         build it with `cargo build --release -p sluice-cli` (or set SLUICE_BIN)",
        me.display(),
        exe.display()
    );
    Ok(exe)
}
