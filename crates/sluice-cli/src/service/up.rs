//! `sluice up`: a dispatcher and its workers as child processes of this one. Any that
//! dies is restarted. With `--autoscale` the worker count follows the dispatcher's target:
//! workers are started up to it, and above it the highest-numbered ones are drained (the
//! dispatcher gives them no new task; each finishes what it holds, then exits 0) and not
//! started again. A child that keeps exiting is restarted after a delay that doubles each
//! time (up to [`RESTART_MAX`]), not in a loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_client::ScaleClient;

use super::{operator_token, roots, token, AutoscaleArgs, LimitArgs};

/// How often `up` asks the dispatcher for its target (and repeats its drain requests).
const SCALE_POLL: Duration = Duration::from_millis(250);
/// The delay before restarting a child that exited; it doubles at each exit, up to
/// [`RESTART_MAX`], and starts over once a child has run [`RESTART_RESET`].
const RESTART_MIN: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(30);
const RESTART_RESET: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct UpArgs {
    /// Worker processes to start (with --autoscale: --min-workers).
    #[arg(long, default_value_t = 2, conflicts_with = "autoscale")]
    workers: usize,
    /// The dispatcher's gRPC address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// The dispatcher's journal, kept across restarts of `up`. Without it, a temporary
    /// one (removed when `up` stops) still lets a crashed dispatcher resume its jobs.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Decode threads per worker (default: cores / workers; with --autoscale, cores /
    /// --max-workers, so that every worker is the same unit).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long = "allow-root")]
    allow_root: Vec<PathBuf>,
    #[arg(long)]
    token: Option<String>,
    /// The dispatcher's operator token (scaling, draining), which `up` itself uses
    /// (default: $SLUICE_OPERATOR_TOKEN, else a random one when --token is set). Workers do
    /// not get it.
    #[arg(long)]
    operator_token: Option<String>,
    /// Metrics: the dispatcher on PORT, worker i on PORT+1+i (all of them at most 65535).
    #[arg(long)]
    metrics_port: Option<u16>,
    /// TLS for the dispatcher and every worker: certificate chain (PEM; valid for the
    /// listen addresses), its key, and the CA workers check the dispatcher's against.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Every worker records each job's pipeline events into
    /// DIR/job-<job id>-worker-<worker id>.pftrace (as `sluice worker --trace-dir`).
    #[arg(long, value_name = "DIR")]
    trace_dir: Option<PathBuf>,
    #[command(flatten)]
    autoscale: AutoscaleArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

struct Supervised {
    name: String,
    args: Vec<String>,
    child: Child,
    /// Asked to drain: when it exits (drained, or killed) it is not started again.
    draining: bool,
    started: Instant,
    /// The delay before the next restart.
    backoff: Duration,
    /// It exited and is started again at this time.
    restart_at: Option<Instant>,
}

impl Supervised {
    fn new(name: String, args: Vec<String>, child: Child) -> Self {
        Self { name, args, child, draining: false, started: Instant::now(), backoff: RESTART_MIN, restart_at: None }
    }

    /// Whether it has exited, and if so when it is started again; restarts it when due. A
    /// draining child that exits is not started again: `Some(status)` says it is gone.
    fn supervise(&mut self, spawner: &Spawner) -> Result<Option<ExitStatus>> {
        if let Some(at) = self.restart_at {
            if self.draining {
                return Ok(self.child.try_wait()?);
            }
            if Instant::now() >= at {
                self.child = spawner.spawn(&self.args)?;
                self.started = Instant::now();
                self.restart_at = None;
            }
            return Ok(None);
        }
        let Ok(Some(status)) = self.child.try_wait() else { return Ok(None) };
        if self.draining {
            tracing::info!(process = %self.name, %status, "drained worker exited; not restarting it");
            return Ok(Some(status));
        }
        if self.started.elapsed() >= RESTART_RESET {
            self.backoff = RESTART_MIN;
        }
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(RESTART_MAX);
        self.restart_at = Some(Instant::now() + delay);
        tracing::warn!(process = %self.name, %status, ?delay, "exited; restarting it");
        Ok(None)
    }
}

/// How `up` starts its children.
struct Spawner {
    exe: PathBuf,
    token: Option<String>,
    /// Given to the dispatcher only.
    operator_token: Option<String>,
    /// What every worker gets; its number adds `--name worker-I` and its metrics port.
    worker_args: Vec<String>,
    metrics_port: Option<u16>,
}

impl Spawner {
    fn spawn(&self, args: &[String]) -> Result<Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args);
        if let Some(t) = &self.token {
            // Through the environment, not argv, so `ps` does not show it.
            cmd.env("SLUICE_TOKEN", t);
        }
        match &self.operator_token {
            Some(t) if args.first().map(String::as_str) == Some("dispatcher") => {
                cmd.env("SLUICE_OPERATOR_TOKEN", t);
            }
            _ => {
                cmd.env_remove("SLUICE_OPERATOR_TOKEN");
            }
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; the closure touches no memory of ours.
            // Children get SIGTERM if `up` itself dies, even by SIGKILL.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        cmd.spawn().with_context(|| format!("cannot start `sluice {}`", args.join(" ")))
    }

    fn worker(&self, i: usize) -> Result<Supervised> {
        let name = format!("worker-{i}");
        let mut args = self.worker_args.clone();
        args.extend(["--name".to_string(), name.clone()]);
        if let Some(p) = self.metrics_port {
            args.extend(["--metrics-port".into(), worker_metrics_port(p, i)?.to_string()]);
        }
        let child = self.spawn(&args)?;
        Ok(Supervised::new(name, args, child))
    }
}

/// Worker `i`'s metrics port: the dispatcher's `port` + 1 + `i`.
fn worker_metrics_port(port: u16, i: usize) -> Result<u16> {
    anyhow::ensure!(port > 0, "--metrics-port 0: worker i gets PORT+1+i, so name a port from 1");
    let p = usize::from(port) + 1 + i;
    u16::try_from(p).ok().with_context(|| {
        format!("--metrics-port {port}: worker {i} would get port {p}, past 65535 (take one at most {})", 65534 - i)
    })
}

/// Starts a dispatcher and its workers as child processes of this one, restarts any that
/// dies (but a drained worker), follows the autoscaler's target, and stops them all on
/// Ctrl-C/SIGTERM.
pub fn up(a: UpArgs) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the sluice binary")?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let autoscale = a.autoscale.config();
    let (start_workers, unit_of) = match &autoscale {
        Some(c) => (c.min_units, c.max_units),
        None => (a.workers, a.workers),
    };
    let threads = a.threads.unwrap_or((cores / unit_of.max(1)).max(1));
    if let Some(p) = a.metrics_port {
        // Before starting anything: a worker given no valid port would fail and be
        // restarted forever.
        worker_metrics_port(p, unit_of.saturating_sub(1))?;
    }
    let roots = roots(a.allow_root)?;
    let token = token(a.token);
    // With a clients' token, operator calls need their own (an open service takes them).
    let operator = match (operator_token(a.operator_token), &token) {
        (Some(t), _) => Some(t),
        (None, Some(_)) => Some(sluice_client::random_token()?),
        (None, None) => None,
    };
    let mut root_args = Vec::new();
    for r in &roots {
        root_args.push("--allow-root".to_string());
        root_args.push(r.display().to_string());
    }
    let mut tls_args = Vec::new();
    for (flag, v) in [("--tls-cert", &a.tls_cert), ("--tls-key", &a.tls_key)] {
        if let Some(p) = v {
            tls_args.extend([flag.to_string(), p.display().to_string()]);
        }
    }
    // Declared before the children: removed only after they have stopped.
    let (journal, temp_dir) = match a.journal {
        Some(path) => (path, None),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("sluice-up-")
                .tempdir()
                .context("cannot create a temporary folder for the dispatcher's journal")?;
            (dir.path().join("dispatcher.journal"), Some(dir))
        }
    };
    let mut d = vec!["dispatcher".into(), "--listen".into(), a.listen.clone(), "--journal".into()];
    d.push(journal.display().to_string());
    d.extend(root_args.iter().cloned());
    d.extend(tls_args.iter().cloned());
    d.extend(a.autoscale.to_args());
    if let Some(p) = a.metrics_port {
        d.extend(["--metrics-port".into(), p.to_string()]);
    }
    let mut w = vec!["worker".into(), "--dispatcher".into(), a.listen.clone(), "--threads".into()];
    w.push(threads.to_string());
    w.extend(root_args.iter().cloned());
    w.extend(tls_args.iter().cloned());
    w.extend(a.limits.to_args());
    if let Some(ca) = &a.tls_ca {
        w.extend(["--tls-ca".to_string(), ca.display().to_string()]);
    }
    if let Some(dir) = &a.trace_dir {
        w.extend(["--trace-dir".to_string(), dir.display().to_string()]);
    }
    let spawner =
        Spawner { exe, token, operator_token: operator.clone(), worker_args: w, metrics_port: a.metrics_port };

    let stop = sluice_service::signal_flag()?;
    let child = spawner.spawn(&d)?;
    let mut dispatcher = Supervised::new("dispatcher".into(), d, child);
    let mut workers: BTreeMap<usize, Supervised> = BTreeMap::new();
    for i in 0..start_workers {
        workers.insert(i, spawner.worker(i)?);
    }
    match &autoscale {
        Some(c) => println!(
            "sluice up: dispatcher on {} autoscaling {} to {} workers ({}; {threads} threads each); Ctrl-C stops",
            a.listen, c.min_units, c.max_units, c.policy
        ),
        None => println!(
            "sluice up: dispatcher on {} with {} workers ({threads} threads each); Ctrl-C stops",
            a.listen, a.workers
        ),
    }
    match &temp_dir {
        Some(_) => println!("journal: {} (temporary; pass --journal to keep state across restarts)", journal.display()),
        None => println!("journal: {}", journal.display()),
    }
    let mut scale = match autoscale {
        Some(_) => Some(ScaleClient::new(&a.listen, operator.as_deref(), a.tls_ca.as_deref())?),
        None => None,
    };
    let mut next_poll = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        dispatcher.supervise(&spawner)?;
        let mut gone = Vec::new();
        for (i, s) in &mut workers {
            if s.supervise(&spawner)?.is_some() {
                gone.push(*i);
            }
        }
        for i in gone {
            workers.remove(&i);
        }
        if let Some(client) = scale.as_mut() {
            if Instant::now() >= next_poll {
                next_poll = Instant::now() + SCALE_POLL;
                follow(client, &spawner, &mut workers)?;
            }
        }
    }
    for s in workers.values_mut().chain([&mut dispatcher]) {
        let _ = terminate(&mut s.child);
    }
    Ok(())
}

/// One step towards the dispatcher's target: start workers (lowest free numbers first) up
/// to it, mark the highest-numbered ones above it draining, and (again) ask the dispatcher
/// to drain every worker marked so. A dispatcher that does not answer changes nothing.
fn follow(client: &mut ScaleClient, spawner: &Spawner, workers: &mut BTreeMap<usize, Supervised>) -> Result<()> {
    let target = match client.scale() {
        Ok(r) if r.enabled => r.target as usize,
        Ok(_) => return Ok(()),
        Err(e) => {
            tracing::debug!(error = %e, "no target from the dispatcher yet");
            return Ok(());
        }
    };
    let serving: Vec<usize> = workers.iter().filter(|(_, s)| !s.draining).map(|(i, _)| *i).collect();
    if serving.len() < target {
        let mut i = 0;
        for _ in serving.len()..target {
            while workers.contains_key(&i) {
                i += 1;
            }
            tracing::info!(worker = i, target, "scaling up: starting worker-{i}");
            workers.insert(i, spawner.worker(i)?);
        }
    }
    for i in serving.iter().rev().take(serving.len().saturating_sub(target)) {
        if let Some(s) = workers.get_mut(i) {
            tracing::info!(process = %s.name, target, "scaling down: draining it");
            s.draining = true;
        }
    }
    for s in workers.values().filter(|s| s.draining) {
        if let Err(e) = client.drain(&s.name) {
            tracing::debug!(process = %s.name, error = %e, "drain request not answered; asking again");
        }
    }
    Ok(())
}

/// SIGTERM (a clean stop), then SIGKILL if it lingers. Nothing for a child already
/// reaped (one waiting to be restarted): its pid may be another process's by now.
fn terminate(child: &mut Child) -> std::io::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    #[cfg(unix)]
    {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        for _ in 0..50 {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    child.kill()?;
    child.wait().map(|_| ())
}
