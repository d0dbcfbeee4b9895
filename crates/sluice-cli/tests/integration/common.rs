//! What the `sluice` command's tests share: the command as a child process (killed with the
//! test), its `dispatcher` and `worker` with the flags given (these shadow the in-process
//! ones of the prelude); the rest (ports, the dataset, specs and options, watchdogs,
//! Chromium) comes from `sluice-testing`.

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};

pub use sluice_testing::prelude::*;

/// `sluice ARGS` (logging warnings only, no token from the environment), leading a process
/// group of its own. Its temporary files (`up`'s journal) go in the test process's folder:
/// a child killed (SIGKILL, when its `Proc` is dropped) cannot remove them itself.
pub fn sluice(args: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args).env("SLUICE_LOG", "warn").env_remove("SLUICE_TOKEN").stdout(Stdio::null());
    cmd.env("TMPDIR", sluice_testing::for_process::process_dir());
    sluice_testing::process::spawn(cmd)
}

/// `sluice service dispatcher --listen ADDR --allow-root ROOT --journal JOURNAL EXTRA...`.
pub fn dispatcher(addr: &str, journal: &Path, root: &Path, extra: &[&str]) -> Proc {
    let mut args = vec!["service", "dispatcher", "--listen", addr, "--allow-root", root.to_str().unwrap()];
    args.extend(["--journal", journal.to_str().unwrap()]);
    args.extend(extra);
    sluice(&args)
}

/// `sluice service worker --dispatcher DISPATCHER --threads 1 --allow-root ROOT EXTRA...`.
pub fn worker(dispatcher: &str, root: &Path, extra: &[&str]) -> Proc {
    let mut args =
        vec!["service", "worker", "--dispatcher", dispatcher, "--threads", "1", "--allow-root", root.to_str().unwrap()];
    args.extend(extra);
    sluice(&args)
}
