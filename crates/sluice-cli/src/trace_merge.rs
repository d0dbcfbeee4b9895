//! `sluice trace-merge`: one Perfetto timeline from a client's trace and its workers'
//! `--trace-dir` files, each worker's events moved into the client's clock
//! (`docs/profiling.md`, "Service traces").

use std::path::PathBuf;

use anyhow::Result;
use clap::Args as ClapArgs;

#[derive(ClapArgs)]
pub struct Args {
    /// The client's trace (`RemoteLoader(..., trace=...)` or `sluice remote-run --trace`), Perfetto.
    client: PathBuf,
    /// Worker traces (`sluice worker --trace-dir DIR` writes DIR/job-<job>-worker-<id>.pftrace).
    #[arg(required = true)]
    workers: Vec<PathBuf>,
    /// The merged trace to write.
    #[arg(long, short)]
    out: PathBuf,
}

pub fn main(a: Args) -> Result<()> {
    for w in sluice_service::merge_traces(&a.client, &a.workers, &a.out)? {
        println!(
            "{}: worker (trace id {}), {} packets moved by {} ns (± {} ns)",
            w.path.display(),
            w.pid,
            w.packets,
            -w.clock.offset_ns,
            w.clock.bound_ns
        );
    }
    println!("wrote {}", a.out.display());
    Ok(())
}
