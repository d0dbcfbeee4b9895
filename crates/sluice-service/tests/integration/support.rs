//! The service under test: a dispatcher and workers in this process (on runtimes of their
//! own, stopped when dropped) or, for the scenarios that SIGKILL them, as child processes
//! (this test binary re-run; see [`serve_entry!`]). Both are configured by the `sluice
//! service dispatcher` / `worker` flags a test names, so a scenario reads the same either
//! way. The dataset, spec and client options come from `sluice_testing::service`
//! (re-exported here with the rest of its prelude).
//!
//! Each test file takes it with `mod support;` and `use support::*;`; one that starts
//! processes also puts `serve_entry!();` at its root.

#![allow(dead_code, unused_imports, unused_macros, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_service::{DispatcherConfig, TlsFiles, WorkerConfig, WorkerLimits};
pub use sluice_testing::prelude::*;
use sluice_testing::process::spawn_self;

/// `(flag, value)` pairs of `flags`; a flag without a value (`--no-shared-memory`) gets "".
fn pairs<'a>(flags: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < flags.len() {
        let flag = flags[i];
        assert!(flag.starts_with("--"), "{flag:?} in {flags:?} is not a flag");
        if flag == "--no-shared-memory" {
            out.push((flag, ""));
            i += 1;
        } else {
            let value = flags.get(i + 1).unwrap_or_else(|| panic!("{flag} has no value in {flags:?}"));
            out.push((flag, *value));
            i += 2;
        }
    }
    out
}

fn tls(cert: Option<&str>, key: Option<&str>) -> Option<TlsFiles> {
    match (cert, key) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.into(), key: key.into() }),
        (None, None) => None,
        _ => panic!("--tls-cert and --tls-key go together"),
    }
}

/// The configuration `sluice dispatcher FLAGS` runs (the flags the tests use), with no
/// token from the environment.
pub fn dispatcher_config(flags: &[&str]) -> DispatcherConfig {
    let mut c = DispatcherConfig {
        listen: "127.0.0.1:7070".into(),
        journal: None,
        allow_roots: Vec::new(),
        token: None,
        operator_token: None,
        metrics_listen: None,
        tls: None,
        autoscale: None,
        cache_aware: true,
        allow_python_modules: Vec::new(),
    };
    let (mut cert, mut key) = (None, None);
    let (mut policy, mut min, mut max, mut window_ms) = (None, 1, 8, 1000);
    for (flag, v) in pairs(flags) {
        match flag {
            "--listen" => c.listen = v.into(),
            "--autoscale" => policy = Some(v.parse::<sluice_autoscale::PolicyKind>().unwrap()),
            "--min-workers" => min = v.parse().unwrap(),
            "--max-workers" => max = v.parse().unwrap(),
            "--autoscale-window-ms" => window_ms = v.parse().unwrap(),
            "--journal" => c.journal = Some(v.into()),
            "--allow-root" => c.allow_roots.push(v.into()),
            "--allow-python-module" => c.allow_python_modules.push(v.into()),
            "--token" => c.token = Some(v.into()),
            "--operator-token" => c.operator_token = Some(v.into()),
            "--metrics-port" => c.metrics_listen = Some(format!("127.0.0.1:{v}")),
            "--tls-cert" => cert = Some(v),
            "--tls-key" => key = Some(v),
            "--cache-assignment" => {
                c.cache_aware = match v {
                    "aware" => true,
                    "blind" => false,
                    other => panic!("--cache-assignment {other}: aware or blind"),
                }
            }
            other => panic!("the test support does not know the dispatcher flag {other}"),
        }
    }
    c.tls = tls(cert, key);
    c.autoscale = policy.map(|policy| sluice_autoscale::AutoscaleConfig {
        window: sluice_autoscale::WindowBy::Millis(window_ms),
        ..sluice_autoscale::AutoscaleConfig::new(policy, min, max)
    });
    c
}

/// The configuration `sluice worker FLAGS` runs (the flags the tests use), with no token
/// or CA from the environment.
pub fn worker_config(flags: &[&str]) -> WorkerConfig {
    let mut c = WorkerConfig {
        listen: "127.0.0.1:0".into(),
        advertise: None,
        data_listen: "127.0.0.1:0".into(),
        advertise_data: None,
        dispatcher: "127.0.0.1:7070".into(),
        allow_roots: Vec::new(),
        token: None,
        metrics_listen: None,
        threads: 0,
        tls: None,
        dispatcher_ca: None,
        shared_memory: true,
        limits: WorkerLimits::default(),
        trace_dir: None,
        name: String::new(),
        python: "python3".into(),
        allow_python_modules: Vec::new(),
    };
    let (mut cert, mut key) = (None, None);
    for (flag, v) in pairs(flags) {
        match flag {
            "--dispatcher" => c.dispatcher = v.into(),
            "--listen" => c.listen = v.into(),
            "--data-listen" => c.data_listen = v.into(),
            "--threads" => c.threads = v.parse().unwrap(),
            "--allow-root" => c.allow_roots.push(v.into()),
            "--token" => c.token = Some(v.into()),
            "--metrics-port" => c.metrics_listen = Some(format!("127.0.0.1:{v}")),
            "--tls-cert" => cert = Some(v),
            "--tls-key" => key = Some(v),
            "--tls-ca" => c.dispatcher_ca = Some(v.into()),
            "--no-shared-memory" => c.shared_memory = false,
            "--trace-dir" => c.trace_dir = Some(v.into()),
            "--name" => c.name = v.into(),
            "--python" => c.python = v.into(),
            "--max-jobs" => c.limits.max_jobs = v.parse().unwrap(),
            "--job-idle-secs" => c.limits.job_idle = Duration::from_secs(v.parse().unwrap()),
            "--allow-python-module" => c.allow_python_modules.push(v.into()),
            "--max-python-children" => c.limits.max_python_children = v.parse().unwrap(),
            other => panic!("the test support does not know the worker flag {other}"),
        }
    }
    c.tls = tls(cert, key);
    c
}

fn dispatcher_flags(addr: &str, journal: &Path, root: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--listen", addr, "--allow-root", root.to_str().unwrap()];
    args.extend(["--journal", journal.to_str().unwrap()]);
    args.extend(extra);
    args.into_iter().map(String::from).collect()
}

fn worker_flags(dispatcher: &str, root: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--dispatcher", dispatcher, "--threads", "1", "--allow-root", root.to_str().unwrap()];
    args.extend(extra);
    args.into_iter().map(String::from).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A dispatcher or worker running in this process on a runtime of its own. Dropping (or
/// [`Server::kill`]) drops the runtime's tasks without draining: its sockets close, its
/// journal gets no more writes, as when a process is killed.
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    /// The bound gRPC address.
    pub addr: SocketAddr,
}

impl Server {
    fn start(
        what: &str,
        run: impl FnOnce(
            std::sync::mpsc::Sender<Result<SocketAddr, String>>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("test-{what}"))
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(run(tx));
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => panic!("the {what} did not start: {e}"),
            Err(_) => panic!("the {what} was not listening after 30 s"),
        };
        Self { runtime: Some(runtime), addr }
    }

    /// Stops it at once (see [`Server`]).
    pub fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A dispatcher in this process, as `sluice dispatcher --listen ADDR --allow-root ROOT
/// --journal JOURNAL EXTRA...` runs one; returns once it listens.
pub fn dispatcher(addr: &str, journal: &Path, root: &Path, extra: &[&str]) -> Server {
    let config = dispatcher_config(&strs(&dispatcher_flags(addr, journal, root, extra)));
    Server::start("dispatcher", move |tx| {
        Box::pin(async move {
            let listening = tx.clone();
            let on = move |a| {
                let _ = listening.send(Ok(a));
            };
            if let Err(e) = sluice_service::run_dispatcher(config, std::future::pending(), on).await {
                let _ = tx.send(Err(e.to_string()));
            }
        })
    })
}

/// A worker in this process, as `sluice worker --dispatcher DISPATCHER --threads 1
/// --allow-root ROOT EXTRA...` runs one; returns once it listens (it registers with the
/// dispatcher on its own time, as a process does).
pub fn worker(dispatcher: &str, root: &Path, extra: &[&str]) -> Server {
    let config = worker_config(&strs(&worker_flags(dispatcher, root, extra)));
    Server::start("worker", move |tx| {
        Box::pin(async move {
            let listening = tx.clone();
            let on = move |a| {
                let _ = listening.send(Ok(a));
            };
            if let Err(e) = sluice_service::run_worker(config, std::future::pending(), on).await {
                let _ = tx.send(Err(e.to_string()));
            }
        })
    })
}

/// What the child entry ([`serve_entry!`]) reads: `dispatcher` or `worker`, then its flags,
/// separated by U+001F.
pub const SERVE_ENV: &str = "SLUICE_TEST_SERVE";

/// The name of the entry test [`serve_entry!`] defines.
pub const SERVE_ENTRY: &str = "service_process_entry";

/// Defines the `#[ignore]`d test a test binary is re-run as to be a dispatcher or worker
/// process ([`dispatcher_process`], [`worker_process`]). Put it at the root of each test
/// file that starts them; run on its own, it does nothing.
macro_rules! serve_entry {
    () => {
        #[test]
        #[ignore = "a dispatcher or worker process other tests start; does nothing on its own"]
        fn service_process_entry() {
            support::serve_from_env();
        }
    };
}
pub(crate) use serve_entry;

/// The body of [`serve_entry!`]: serves what [`SERVE_ENV`] names until SIGTERM (or
/// SIGKILL), as the `sluice` command does; returns at once without it.
pub fn serve_from_env() {
    let Ok(args) = std::env::var(SERVE_ENV) else { return };
    let args: Vec<&str> = args.split('\u{1f}').collect();
    let (what, flags) = args.split_first().unwrap();
    match *what {
        "dispatcher" => sluice_service::serve_dispatcher(dispatcher_config(flags), |_| {}).unwrap(),
        "worker" => sluice_service::serve_worker(worker_config(flags), |_| {}).unwrap(),
        other => panic!("{SERVE_ENV}: {other} is neither dispatcher nor worker"),
    }
}

/// A `what` (`dispatcher` or `worker`) process configured by exactly `flags`, as `sluice
/// what FLAGS` runs one (this test binary re-run; the file needs [`serve_entry!`]).
pub fn serve_process(what: &str, flags: &[&str]) -> Proc {
    let env = std::iter::once(what).chain(flags.iter().copied()).collect::<Vec<_>>().join("\u{1f}");
    spawn_self(SERVE_ENTRY, &[(SERVE_ENV, &env)])
}

fn process(what: &str, flags: &[String]) -> Proc {
    serve_process(what, &strs(flags))
}

/// [`worker_process`] with `env` set too (a `PYTHONPATH` for its `map` ops' children).
pub fn worker_process_env(dispatcher: &str, root: &Path, extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let flags = worker_flags(dispatcher, root, extra);
    let serve = std::iter::once("worker").chain(strs(&flags)).collect::<Vec<_>>().join("\u{1f}");
    let mut all = vec![(SERVE_ENV, serve.as_str())];
    all.extend_from_slice(env);
    spawn_self(SERVE_ENTRY, &all)
}

/// A dispatcher process (this test binary re-run; the file needs [`serve_entry!`]), as
/// [`dispatcher`] configures one; returns once it listens.
pub fn dispatcher_process(addr: &str, journal: &Path, root: &Path, extra: &[&str]) -> Proc {
    let mut p = process("dispatcher", &dispatcher_flags(addr, journal, root, extra));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = p.0.try_wait() {
            panic!("the dispatcher process exited ({status}) before listening on {addr}: does the test file have serve_entry!()?");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the dispatcher process was not listening on {addr} after 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    p
}

/// A worker process (this test binary re-run; the file needs [`serve_entry!`]), as
/// [`worker`] configures one.
pub fn worker_process(dispatcher: &str, root: &Path, extra: &[&str]) -> Proc {
    process("worker", &worker_flags(dispatcher, root, extra))
}
