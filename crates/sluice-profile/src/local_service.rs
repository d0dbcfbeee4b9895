//! A dispatcher and worker processes of the `sluice` binary on this machine, for a workers
//! sweep (`sluice profile --sweep workers=...`) and the service benchmarks
//! (`sluice-bench service|workers|cache --service`): started on a free loopback port, killed
//! when dropped, and their CPU time read from `/proc`.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::{self_cpu, ProfileError};

/// A child process, killed and reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system) child `pid` has used, from /proc (0 where it cannot be read).
pub fn proc_cpu(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// CPU seconds of this process and of `procs` together.
pub fn tree_cpu(procs: &[Proc]) -> f64 {
    self_cpu() + procs.iter().map(|p| proc_cpu(p.0.id())).sum::<f64>()
}

fn spawn(sluice: &Path, args: &[String]) -> Result<Proc, ProfileError> {
    let child =
        Command::new(sluice).args(args).stdout(Stdio::null()).env_remove("SLUICE_TOKEN").spawn().map_err(|source| {
            ProfileError::Spawn { command: format!("{} {}", sluice.display(), args.join(" ")), source }
        })?;
    Ok(Proc(child))
}

/// Starts `sluice service dispatcher` (its journal in `dir`, `dispatcher_args` besides) on a
/// free loopback port and `workers` `sluice service worker` processes of `threads` threads
/// each, all allowed to read `root`, from the binary `sluice`. Returns the dispatcher's
/// address and the processes, dispatcher first (without a token: loopback only).
pub fn start(
    sluice: &Path,
    dir: &Path,
    root: &Path,
    workers: usize,
    threads: usize,
    dispatcher_args: &[&str],
) -> Result<(String, Vec<Proc>), ProfileError> {
    let free = || -> std::io::Result<String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(l.local_addr()?.to_string())
    };
    let addr = free().map_err(|source| ProfileError::Spawn { command: "binding a loopback port".into(), source })?;
    // One journal per dispatcher: a run may start several.
    let port = addr.rsplit(':').next().unwrap_or_default();
    let journal = dir.join(format!("journal-{}-{port}", std::process::id()));
    let _ = std::fs::remove_file(&journal);
    let r = root.display().to_string();
    let mut args: Vec<String> = ["service", "dispatcher", "--listen", &addr, "--journal"].map(String::from).to_vec();
    args.extend([journal.display().to_string(), "--allow-root".into(), r.clone()]);
    args.extend(dispatcher_args.iter().map(|a| a.to_string()));
    let mut procs = vec![spawn(sluice, &args)?];
    for _ in 0..workers {
        let t = threads.to_string();
        let args = ["service", "worker", "--dispatcher", &addr, "--threads", &t, "--allow-root", &r];
        procs.push(spawn(sluice, &args.map(String::from))?);
    }
    Ok((addr, procs))
}
