//! `sluice service up`: its flags, over the `--config` file; the supervisor is
//! `sluice_service::up`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_service::config::{flag, ServiceConfig};
use sluice_service::up::{ChildCommand, Started};

use super::{operator_token, token, AutoscaleArgs, LimitArgs};

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
    /// A Python module (with its package's modules) a job's `map` ops may import
    /// (repeatable; default: none), for the dispatcher and every worker.
    #[arg(long = "allow-python-module", value_name = "MODULE")]
    allow_python_module: Vec<String>,
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
    /// The Python every worker runs specs' `map` ops with (as `sluice worker --python`)
    /// [default: python3].
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
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
        if !self.allow_python_module.is_empty() {
            c.serve.allow_python_modules = self.allow_python_module;
        }
        c.serve.token = token(self.token).or(c.serve.token.take());
        c.dispatcher.operator_token = operator_token(self.operator_token).or(c.dispatcher.operator_token.take());
        c.dispatcher.metrics_port = self.metrics_port.or(c.dispatcher.metrics_port);
        if self.tls_cert.is_some() {
            (c.serve.tls_cert, c.serve.tls_key) = (self.tls_cert, self.tls_key);
            c.worker.tls_ca = self.tls_ca;
        }
        c.worker.trace_dir = self.trace_dir.or(c.worker.trace_dir.take());
        flag(&mut c.worker.python, self.python);
        self.autoscale.apply(&mut c.autoscale);
        self.limits.apply(&mut c.limits);
        Ok(c)
    }
}

/// Starts a dispatcher and its workers as child processes of this one (see
/// `sluice_service::up`) and says what it started.
pub fn up(a: UpArgs) -> Result<()> {
    let program = std::env::current_exe().context("cannot find the sluice binary")?;
    let command = ChildCommand { program, prefix: vec!["service".into()] };
    sluice_service::up::up(command, a.settings()?, announce)?;
    Ok(())
}

fn announce(s: &Started) {
    let (listen, threads) = (&s.listen, s.threads);
    match &s.autoscale {
        Some(a) => println!(
            "sluice up: dispatcher on {listen} autoscaling {} to {} workers ({}; {threads} threads each); Ctrl-C stops",
            a.min_units, a.max_units, a.policy
        ),
        None => {
            println!(
                "sluice up: dispatcher on {listen} with {} workers ({threads} threads each); Ctrl-C stops",
                s.workers
            )
        }
    }
    match s.temp_journal {
        true => println!("journal: {} (temporary; pass --journal to keep state across restarts)", s.journal.display()),
        false => println!("journal: {}", s.journal.display()),
    }
}
