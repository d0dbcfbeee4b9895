//! Commands that moved, under their old names for one release: each says where it went on
//! stderr, then runs. The service's commands went under `sluice service`; the benchmarks
//! went to the `sluice-bench` binary, which the old names run from beside this one.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::ServiceCommand;

/// Old `sluice` benchmark commands and their `sluice-bench` subcommands (flags unchanged).
const BENCHES: [(&str, &str); 6] = [
    ("bench", "engine"),
    ("bench-cache", "cache"),
    ("bench-service", "service"),
    ("bench-autoscale", "autoscale"),
    ("bench-locality", "locality"),
    ("bench-workers", "workers"),
];

/// The old benchmark command `arg` names, as (old, new), if it is one.
pub fn bench_command(arg: &OsStr) -> Option<(&'static str, &'static str)> {
    BENCHES.iter().copied().find(|(old, _)| OsStr::new(old) == arg)
}

/// Runs `service` (`sluice service NAME`) after saying where `sluice NAME` went.
pub fn service(name: &str, service: ServiceCommand) -> anyhow::Result<()> {
    eprintln!("note: \"sluice {name}\" moved to \"sluice service {name}\"");
    service.run()
}

/// Says where `sluice OLD` went and runs `sluice-bench NEW ARGS...` from the folder of this
/// executable in its place (exec: its exit status is ours).
pub fn to_sluice_bench((old, new): (&str, &str), args: &[OsString]) -> ExitCode {
    eprintln!("note: \"sluice {old}\" moved to \"sluice-bench {new}\"");
    let exe = match sluice_bench_path() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg(new).args(args);
    #[cfg(unix)]
    let e = std::os::unix::process::CommandExt::exec(&mut cmd);
    #[cfg(not(unix))]
    let e = match cmd.status() {
        Ok(s) => return ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => e,
    };
    eprintln!("error: running {}: {e}", exe.display());
    ExitCode::FAILURE
}

/// `sluice-bench` beside the running `sluice`.
fn sluice_bench_path() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find the running sluice binary: {e}"))?;
    let exe = me.with_file_name(format!("sluice-bench{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.is_file(),
        "the benchmarks are the sluice-bench binary, and there is none beside {} (looked for {}); \
         build it with `cargo build --release -p sluice-bench` (or without --release for target/debug)",
        me.display(),
        exe.display()
    );
    Ok(exe)
}
