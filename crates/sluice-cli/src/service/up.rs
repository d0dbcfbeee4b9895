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

use super::config::{flag, ServiceConfig};
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
    /// Service config file (TOML; see docs/service.md) for the dispatcher and every
    /// worker; these flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Worker processes to start (with --autoscale: --min-workers) [default: 2].
    #[arg(long, conflicts_with = "autoscale")]
    workers: Option<usize>,
    /// The dispatcher's gRPC address [default: 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<String>,
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

impl UpArgs {
    /// The config file's settings with these flags over them.
    fn settings(self) -> Result<ServiceConfig> {
        let mut c = ServiceConfig::load(self.config.as_deref())?;
        flag(&mut c.up.workers, self.workers);
        flag(&mut c.dispatcher.listen, self.listen);
        c.dispatcher.journal = self.journal.or(c.dispatcher.journal.take());
        flag(&mut c.worker.threads, self.threads);
        if !self.allow_root.is_empty() {
            c.serve.allow_roots = self.allow_root;
        }
        c.serve.token = token(self.token).or(c.serve.token.take());
        c.dispatcher.operator_token = operator_token(self.operator_token).or(c.dispatcher.operator_token.take());
        c.dispatcher.metrics_port = self.metrics_port.or(c.dispatcher.metrics_port);
        if self.tls_cert.is_some() {
            (c.serve.tls_cert, c.serve.tls_key) = (self.tls_cert, self.tls_key);
            c.worker.tls_ca = self.tls_ca;
        }
        c.worker.trace_dir = self.trace_dir.or(c.worker.trace_dir.take());
        self.autoscale.apply(&mut c.autoscale);
        self.limits.apply(&mut c.limits);
        Ok(c)
    }
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
    /// The settings every child reads (`--config`).
    config: PathBuf,
    metrics_port: Option<u16>,
}

impl Spawner {
    fn spawn(&self, args: &[String]) -> Result<Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("service").args(args);
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
        let mut args = vec!["worker".into(), "--config".into(), self.config.display().to_string()];
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
    let mut c = a.settings()?;
    let autoscale = c.autoscale.config();
    let (start_workers, unit_of) = match &autoscale {
        Some(s) => (s.min_units, s.max_units),
        None => (c.up.workers, c.up.workers),
    };
    if c.worker.threads == 0 {
        c.worker.threads = (cores / unit_of.max(1)).max(1);
    }
    let threads = c.worker.threads;
    let metrics_port = c.dispatcher.metrics_port;
    if let Some(p) = metrics_port {
        // Before starting anything: a worker given no valid port would fail and be
        // restarted forever.
        worker_metrics_port(p, unit_of.saturating_sub(1))?;
    }
    c.serve.allow_roots = roots(std::mem::take(&mut c.serve.allow_roots))?;
    // Children get the tokens through the environment, never in their config file.
    let token = c.serve.token.take();
    // With a clients' token, operator calls need their own (an open service takes them).
    let operator = match (c.dispatcher.operator_token.take(), &token) {
        (Some(t), _) => Some(t),
        (None, Some(_)) => Some(sluice_client::random_token()?),
        (None, None) => None,
    };
    // Declared before the children: removed only after they have stopped.
    let dir = tempfile::Builder::new()
        .prefix("sluice-up-")
        .tempdir()
        .context("cannot create a temporary folder for the children's config and the journal")?;
    let temp_journal = c.dispatcher.journal.is_none();
    let journal = c.dispatcher.journal.get_or_insert_with(|| dir.path().join("dispatcher.journal")).clone();
    // Every worker reaches the dispatcher; each gets its own name and metrics port.
    c.worker.dispatcher = c.dispatcher.listen.clone();
    c.worker.metrics_port = None;
    let listen = c.dispatcher.listen.clone();
    let tls_ca = c.worker.tls_ca.clone();
    let config = dir.path().join("service.toml");
    c.write(&config)?;
    let d = vec!["dispatcher".into(), "--config".into(), config.display().to_string()];
    let spawner = Spawner { exe, token, operator_token: operator.clone(), config, metrics_port };

    let stop = sluice_service::signal_flag()?;
    let child = spawner.spawn(&d)?;
    let mut dispatcher = Supervised::new("dispatcher".into(), d, child);
    let mut workers: BTreeMap<usize, Supervised> = BTreeMap::new();
    for i in 0..start_workers {
        workers.insert(i, spawner.worker(i)?);
    }
    match &autoscale {
        Some(s) => println!(
            "sluice up: dispatcher on {listen} autoscaling {} to {} workers ({}; {threads} threads each); Ctrl-C stops",
            s.min_units, s.max_units, s.policy
        ),
        None => println!(
            "sluice up: dispatcher on {listen} with {start_workers} workers ({threads} threads each); Ctrl-C stops"
        ),
    }
    match temp_journal {
        true => println!("journal: {} (temporary; pass --journal to keep state across restarts)", journal.display()),
        false => println!("journal: {}", journal.display()),
    }
    let mut scale = match autoscale {
        Some(_) => Some(ScaleClient::new(&listen, operator.as_deref(), tls_ca.as_deref())?),
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
