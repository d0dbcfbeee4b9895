//! `sluice up` keeps its runtime state out of the folder it runs in, and hands its
//! workers what they need (here: where to write their traces).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_client::RemoteLoader;

/// `sluice up` with one worker and the `extra` flags, started in `cwd`; its stdout lines arrive on the channel
/// (drained to the end, so its children never write into a closed pipe).
fn up_in(cwd: &Path, addr: &str, root: &Path, extra: &[&str]) -> (Proc, mpsc::Receiver<String>) {
    up_in_env(cwd, addr, root, extra, &[])
}

/// [`up_in`] with `env` set too (a `PYTHONPATH` for its workers' `map` children).
fn up_in_env(
    cwd: &Path,
    addr: &str,
    root: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Proc, mpsc::Receiver<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.envs(env.iter().copied());
    cmd.args([
        "service",
        "up",
        "--workers",
        "1",
        "--threads",
        "1",
        "--listen",
        addr,
        "--allow-root",
        root.to_str().unwrap(),
    ])
    .args(extra)
    .current_dir(cwd)
    .env("TMPDIR", sluice_testing::for_process::process_dir())
    .env("SLUICE_LOG", "warn")
    .env_remove("SLUICE_TOKEN")
    .stdout(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Proc(child), rx)
}

/// The journal `up` announced on stdout, and whether it said it is temporary.
fn announced_journal(lines: &mpsc::Receiver<String>) -> Option<(PathBuf, bool)> {
    let rest = lines.try_iter().find_map(|line| line.strip_prefix("journal: ").map(str::to_string))?;
    Some(match rest.split_once(" (temporary; pass --journal to keep state across restarts)") {
        Some((path, _)) => (PathBuf::from(path), true),
        None => (PathBuf::from(rest), false),
    })
}

#[test]
fn sluice_up_starts_fresh_and_writes_nothing_into_its_folder() {
    let _watchdog = watchdog("sluice_up_starts_fresh_and_writes_nothing_into_its_folder", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let cwd = dir.path().join("checkout");
    std::fs::create_dir(&cwd).unwrap();

    let addr = free_addr();
    let (up, lines) = up_in(&cwd, &addr, &root, &[]);
    let mut loader = RemoteLoader::connect(&spec(&root, 1), options(&addr, "first")).unwrap();
    assert_eq!(loader.job().job_id, 1);
    assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "the first `up`");
    drop(loader);
    let announced = announced_journal(&lines);
    let journal_existed = announced.as_ref().is_some_and(|(journal, _)| journal.exists());
    sigterm_and_wait(up, "sluice up");
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "sluice up wrote into its folder: {left:?}");
    let (journal, temporary) = announced.expect("sluice up did not say where its journal is");
    assert!(temporary, "no --journal: the journal should be temporary");
    assert!(journal_existed, "{} missing while `up` ran", journal.display());
    assert!(!journal.exists(), "the temporary journal {} outlived `up`", journal.display());

    // A second `up` in the same folder knows nothing of the first one's job.
    let addr = free_addr();
    let (up, _lines) = up_in(&cwd, &addr, &root, &[]);
    let loader = RemoteLoader::connect(&spec(&root, 2), options(&addr, "second")).unwrap();
    assert_eq!(loader.job().job_id, 1, "the second `up` replayed a job of the first");
    assert_eq!(loader.job().epoch, 0);
    drop(loader);
    sigterm_and_wait(up, "sluice up");
}

#[test]
fn sluice_up_hands_trace_dir_to_its_workers() {
    let _watchdog = watchdog("sluice_up_hands_trace_dir_to_its_workers", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();

    let addr = free_addr();
    let (up, _lines) = up_in(dir.path(), &addr, &root, &["--trace-dir", traces.to_str().unwrap()]);
    let mut loader = RemoteLoader::connect(&spec(&root, 1), options(&addr, "traced")).unwrap();
    assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "a traced job");
    let job = loader.job().job_id;
    drop(loader);
    // The worker appends a task's events once the task is done: poll for the file.
    let written = within(30, "the worker's trace file", move || loop {
        let files: Vec<_> = std::fs::read_dir(&traces).unwrap().map(|e| e.unwrap().path()).collect();
        let named = |p: &PathBuf| p.file_name().unwrap().to_str().unwrap().starts_with(&format!("job-{job}-worker-"));
        if let Some(f) = files.iter().find(|p| named(p) && p.metadata().unwrap().len() > 0) {
            break f.clone();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    });
    assert_eq!(written.extension().unwrap(), "pftrace");
    sigterm_and_wait(up, "sluice up");
}

/// `sluice up` with `args`, its stderr lines (time of arrival, text) on the channel.
fn up_logging(args: &[&str]) -> (Proc, mpsc::Receiver<(Instant, String)>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("up").args(args).env("SLUICE_LOG", "warn").env_remove("SLUICE_TOKEN").stdout(Stdio::null());
    cmd.env("TMPDIR", sluice_testing::for_process::process_dir());
    cmd.stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    (Proc(child), rx)
}

#[test]
fn sluice_up_refuses_metrics_ports_its_workers_cannot_have() {
    let _watchdog = watchdog("sluice_up_refuses_metrics_ports_its_workers_cannot_have", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    for (port, workers) in [("65535", "1"), ("65534", "2"), ("0", "1")] {
        let addr = free_addr();
        let args = ["--workers", workers, "--metrics-port", port, "--listen", &addr, "--allow-root", root];
        let (mut up, lines) = up_logging(&args);
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = up.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "up --metrics-port {port} --workers {workers}: still running after 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Up to its end: the process is gone, so is the pipe's writer.
        let stderr: Vec<String> = lines.iter().map(|(_, l)| l).collect();
        assert!(!status.success(), "up --metrics-port {port} --workers {workers}: {status}");
        assert!(stderr.iter().any(|l| l.contains(&format!("--metrics-port {port}"))), "{stderr:?}");
    }
}

#[test]
fn sluice_up_restarts_a_failing_worker_ever_more_slowly() {
    let _watchdog = watchdog("sluice_up_restarts_a_failing_worker_ever_more_slowly", 60);
    let dir = tempfile::tempdir().unwrap();
    // A --trace-dir that is a file: the worker exits as it starts, every time.
    let not_a_dir = dir.path().join("not-a-dir");
    std::fs::write(&not_a_dir, b"").unwrap();
    let addr = free_addr();
    let root = dir.path().to_str().unwrap();
    let args = ["--workers", "1", "--threads", "1", "--listen", &addr, "--allow-root", root];
    let (up, lines) = up_logging(&[&args[..], &["--trace-dir", not_a_dir.to_str().unwrap()]].concat());
    std::thread::sleep(Duration::from_secs(5));
    drop(up);
    let restarts: Vec<Instant> = lines
        .try_iter()
        .filter(|(_, l)| l.contains("worker-0") && l.contains("restarting it"))
        .map(|(t, _)| t)
        .collect();
    // Delays of 0.1, 0.2, 0.4, 0.8, 1.6 s: 5 restarts in 5 s, plus the worker's own start each
    // time. Restarted every 100 ms instead, it starts over 20 times.
    assert!((3..=7).contains(&restarts.len()), "{} restarts of the failing worker in 5 s", restarts.len());
    let gaps: Vec<Duration> = restarts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] > g[0]), "the delay between restarts grows: {gaps:?}");
}

#[test]
fn sluice_up_serves_a_job_with_its_own_worker_processes() {
    let _watchdog = watchdog("sluice_up_serves_a_job_with_its_own_worker_processes", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let journal = dir.path().join("up.journal");
    let _up = sluice(&[
        "up",
        "--workers",
        "2",
        "--listen",
        &addr,
        "--journal",
        journal.to_str().unwrap(),
        "--threads",
        "1",
        "--allow-root",
        root.to_str().unwrap(),
    ]);
    let mut loader = RemoteLoader::connect(&spec(&root, 5), options(&addr, "up")).unwrap();
    let keys: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
    assert_exactly_once(keys, "through `sluice up`");
    assert!(journal.exists());
    // SIGTERM stops `up` and, through it, the dispatcher and workers.
    sigterm_and_wait(_up, "sluice up");
    let stopped = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        std::net::TcpStream::connect(&addr).is_err()
    });
    assert!(stopped, "the dispatcher still listens after `sluice up` stopped");
}

/// The repository's venv Python (the project's tests run with it: it has numpy), else
/// `python3`.
fn python() -> String {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if venv.exists() {
        venv.display().to_string()
    } else {
        "python3".into()
    }
}

#[test]
fn sluice_up_hands_python_to_its_workers_and_they_run_map_ops() {
    let _watchdog = watchdog("sluice_up_hands_python_to_its_workers_and_they_run_map_ops", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    // The function's module on the workers' PYTHONPATH (never their current folder), and
    // allowed by `up` to the dispatcher and every worker.
    let fns = dir.path().join("fns");
    std::fs::create_dir(&fns).unwrap();
    std::fs::write(fns.join("up_map_fns.py"), "def invert(image, sample):\n    return 255 - image\n").unwrap();
    let cwd = dir.path().join("project");
    std::fs::create_dir(&cwd).unwrap();
    let mut s = spec(&root, 4);
    s.ops.truncate(2);
    let mut plain = s.clone();
    plain.threads = 1.into();
    s.ops.push(sluice_core::OpSpec::map("up_map_fns:invert"));

    let addr = free_addr();
    let flags = ["--python", &python(), "--allow-python-module", "up_map_fns"];
    let (up, _lines) = up_in_env(&cwd, &addr, &root, &flags, &[("PYTHONPATH", fns.to_str().unwrap())]);
    let mut loader = RemoteLoader::connect(&s, options(&addr, "mapped")).unwrap();
    let remote: Vec<_> =
        within(60, "an epoch of a map op under `up`", move || loader.iter().map(|b| b.unwrap()).collect());
    let local = sluice_pipeline::Loader::new(plain, sluice_pipeline::Shard::default()).unwrap();
    let mut expected = std::collections::HashMap::new();
    for b in local.iter().map(|b| b.unwrap()) {
        let per = b.images.as_bytes().len() / b.keys.len();
        for (k, px) in b.keys.iter().zip(b.images.as_bytes().chunks(per)) {
            expected.insert(*k, px.iter().map(|v| 255 - v).collect::<Vec<u8>>());
        }
    }
    let mut keys = Vec::new();
    for b in &remote {
        let per = b.images.as_bytes().len() / b.keys.len();
        for (k, px) in b.keys.iter().zip(b.images.as_bytes().chunks(per)) {
            assert!(expected[k] == px, "sample {k}: not the local pixels inverted");
            keys.push(*k);
        }
    }
    assert_exactly_once(keys, "a map op under `up`");
    sigterm_and_wait(up, "sluice up");
}
