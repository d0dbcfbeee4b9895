//! The supervisor behind `sluice service up`: a dispatcher and its workers as child
//! processes of this one, each the same program run with `service dispatcher|worker
//! --config FILE` ([`ChildCommand`]), all reading one config file. Any that dies is
//! restarted. With `--autoscale` the worker count follows the dispatcher's target:
//! workers are started up to it, and above it the highest-numbered ones are drained (the
//! dispatcher gives them no new task; each finishes what it holds, then exits 0) and not
//! started again. A child that keeps exiting is restarted after a delay that doubles each
//! time (up to [`RESTART_MAX`]), not in a loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_autoscale::AutoscaleConfig;
use sluice_client::{ClientError, ScaleClient};

use crate::config::{ConfigError, ServiceConfig};
use crate::ServiceError;

/// Why the supervisor stopped (or did not start), naming the child or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker would get no valid metrics port (worker `i` gets the dispatcher's + 1 + `i`).
    #[error("--metrics-port 0: worker i gets PORT+1+i, so name a port from 1")]
    MetricsPortZero,
    #[error("--metrics-port {port}: worker {worker} would get port {past}, past 65535 (take one at most {most})")]
    MetricsPortPast { port: u16, worker: usize, past: usize, most: usize },
    #[error("cannot create a temporary folder for the children's config and the journal")]
    TempDir(#[source] std::io::Error),
    #[error("cannot start `sluice {args}`")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    /// Asking whether a child has exited (or stopping one) failed.
    #[error("cannot watch the child process {name}")]
    Watch {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The operator token could not be made, or the dispatcher's scale client set up.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The signal thread could not be started.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// How the children are started: `program` with `prefix` before `dispatcher ...` or
/// `worker ...` (for the `sluice` binary: itself, then `service`).
#[derive(Debug, Clone)]
pub struct ChildCommand {
    pub program: PathBuf,
    pub prefix: Vec<String>,
}

/// What [`up`] started, for its caller to announce.
#[derive(Debug, Clone)]
pub struct Started {
    /// The dispatcher's gRPC address.
    pub listen: String,
    /// Workers started (with autoscaling: the least it keeps).
    pub workers: usize,
    /// Decode threads per worker.
    pub threads: usize,
    pub autoscale: Option<AutoscaleConfig>,
    pub journal: PathBuf,
    /// The journal is a temporary one, removed when the supervisor stops.
    pub temp_journal: bool,
}

/// How often `up` asks the dispatcher for its target (and repeats its drain requests).
const SCALE_POLL: Duration = Duration::from_millis(250);
/// The delay before restarting a child that exited; it doubles at each exit, up to
/// [`RESTART_MAX`], and starts over once a child has run [`RESTART_RESET`].
const RESTART_MIN: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(30);
const RESTART_RESET: Duration = Duration::from_secs(30);

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
    fn supervise(&mut self, spawner: &Spawner) -> Result<Option<ExitStatus>, UpError> {
        if let Some(at) = self.restart_at {
            if self.draining {
                return self.child.try_wait().map_err(|source| UpError::Watch { name: self.name.clone(), source });
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
    command: ChildCommand,
    token: Option<String>,
    /// Given to the dispatcher only.
    operator_token: Option<String>,
    /// The settings every child reads (`--config`).
    config: PathBuf,
    metrics_port: Option<u16>,
}

impl Spawner {
    fn spawn(&self, args: &[String]) -> Result<Child, UpError> {
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.prefix).args(args);
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
        cmd.spawn().map_err(|source| UpError::Spawn { args: args.join(" "), source })
    }

    fn worker(&self, i: usize) -> Result<Supervised, UpError> {
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
fn worker_metrics_port(port: u16, i: usize) -> Result<u16, UpError> {
    if port == 0 {
        return Err(UpError::MetricsPortZero);
    }
    let p = usize::from(port) + 1 + i;
    u16::try_from(p).map_err(|_| UpError::MetricsPortPast {
        port,
        worker: i,
        past: p,
        most: 65534usize.saturating_sub(i),
    })
}

/// Starts a dispatcher and its workers with the settings `c` as child processes of this
/// one (`command`), tells `on_start` what it started, restarts any child that dies (but a
/// drained worker), follows the autoscaler's target, and stops them all on Ctrl-C/SIGTERM.
pub fn up(command: ChildCommand, mut c: ServiceConfig, on_start: impl FnOnce(&Started)) -> Result<(), UpError> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
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
    c.serve.allow_roots = c.serve.roots()?;
    // Children get the tokens through the environment, never in their config file.
    let token = c.serve.token.take();
    // With a clients' token, operator calls need their own (an open service takes them).
    let operator = match (c.dispatcher.operator_token.take(), &token) {
        (Some(t), _) => Some(t),
        (None, Some(_)) => Some(sluice_client::random_token()?),
        (None, None) => None,
    };
    // Declared before the children: removed only after they have stopped.
    let dir = tempfile::Builder::new().prefix("sluice-up-").tempdir().map_err(UpError::TempDir)?;
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
    let spawner = Spawner { command, token, operator_token: operator.clone(), config, metrics_port };

    let stop = crate::signal_flag()?;
    let child = spawner.spawn(&d)?;
    let mut dispatcher = Supervised::new("dispatcher".into(), d, child);
    let mut workers: BTreeMap<usize, Supervised> = BTreeMap::new();
    for i in 0..start_workers {
        workers.insert(i, spawner.worker(i)?);
    }
    on_start(&Started {
        listen: listen.clone(),
        workers: start_workers,
        threads,
        autoscale: autoscale.clone(),
        journal,
        temp_journal,
    });
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
fn follow(
    client: &mut ScaleClient,
    spawner: &Spawner,
    workers: &mut BTreeMap<usize, Supervised>,
) -> Result<(), UpError> {
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
