//! What the service's end-to-end tests share: real `sluice` processes (killed with the test),
//! free loopback ports, a small generated dataset, specs and options, and a watchdog.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_client::RemoteOptions;
use sluice_core::{PipelineSpec, SourceSpec};
use sluice_synth::DatasetOptions;

pub const IMAGES: usize = 48;
pub const BATCH: usize = 4;

/// A child process killed (SIGKILL) and reaped when dropped. One started by [`sluice`]
/// leads its own process group, which is killed with it while it runs: `up`'s dispatcher
/// and workers go at once, instead of draining for up to 50 s with no dispatcher left.
pub struct Proc(pub Child);

impl Proc {
    pub fn kill(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on the group our running child leads, if it leads one (a
            // group's id is its leader's pid, so no other group has it); no memory is
            // involved.
            unsafe {
                libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL);
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Children die with the test process (SIGKILL), even if it exits without running
/// destructors.
pub fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: the pre-exec hook only calls prctl, which is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub fn sluice(args: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args).env("SLUICE_LOG", "warn").env_remove("SLUICE_TOKEN").stdout(Stdio::null());
    die_with_parent(&mut cmd);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    Proc(cmd.spawn().unwrap())
}

/// Sends SIGTERM and waits (10 s at most) for the process to exit on its own.
pub fn sigterm_and_wait(mut p: Proc, what: &str) {
    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
    unsafe {
        libc::kill(p.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let t0 = std::time::Instant::now();
    while p.0.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what} did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn dispatcher(addr: &str, journal: &Path, root: &Path, extra: &[&str]) -> Proc {
    let mut args = vec!["dispatcher", "--listen", addr, "--allow-root", root.to_str().unwrap()];
    args.extend(["--journal", journal.to_str().unwrap()]);
    args.extend(extra);
    sluice(&args)
}

pub fn worker(dispatcher: &str, root: &Path, extra: &[&str]) -> Proc {
    let mut args = vec!["worker", "--dispatcher", dispatcher, "--threads", "1", "--allow-root", root.to_str().unwrap()];
    args.extend(extra);
    sluice(&args)
}

pub fn dataset(dir: &Path) -> PathBuf {
    dataset_and_bytes(dir).0
}

/// [`dataset`], and the bytes of its files.
pub fn dataset_and_bytes(dir: &Path) -> (PathBuf, u64) {
    let root = dir.join("data");
    let options = DatasetOptions { images: IMAGES, classes: 4, texture: 8, ..Default::default() };
    let written = sluice_synth::write_dataset(&root, &options, &|_| {}).unwrap();
    (root, written.bytes)
}

pub fn spec(root: &Path, seed: u64) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, BATCH);
    s.seed = seed;
    s.threads = 1.into();
    s
}

pub fn options(addr: &str, job: &str) -> RemoteOptions {
    let mut o = RemoteOptions::new(addr, job);
    o.token = None;
    o.task_batches = 2;
    o.tasks_in_flight = 4;
    o.give_up_after = Duration::from_secs(30);
    o
}

/// Asserts that `keys` hold every sample exactly once.
pub fn assert_exactly_once(mut keys: Vec<u64>, what: &str) {
    keys.sort_unstable();
    let expected: Vec<u64> = (0..IMAGES as u64).collect();
    assert_eq!(keys, expected, "{what}: not every sample exactly once");
}

/// Fails the whole test binary if a test hangs (a lost task would otherwise block CI
/// forever): dropped at the end of the test, it disarms.
pub struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

pub fn watchdog(what: &'static str, secs: u64) -> Watchdog {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            if d.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{what}: still running after {secs} s; failing the test run");
        std::process::exit(101);
    });
    Watchdog(done)
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A small deterministic RNG (xorshift), seeded per run and printed so a failure replays.
pub struct Rng(pub u64);
impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub fn http_get(addr: &str) -> String {
    use std::io::{Read, Write};
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            return body;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no metrics endpoint at {addr}");
}

pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until the dispatcher's metrics at `metrics` count `batches` consumed by the
/// client: a heartbeat reported them all (a dropped client sends no last one).
pub fn wait_for_heartbeat(metrics: &str, batches: usize) {
    let t0 = std::time::Instant::now();
    loop {
        let text = http_get(metrics);
        let reported = text
            .lines()
            .find_map(|l| l.strip_prefix("sluice_client_batches_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if reported == Some(batches as f64) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no heartbeat reported {batches} batches: {reported:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `f` on a thread and fails the test (instead of hanging it) if it takes over `secs`.
pub fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => panic!("{what}: still not done after {secs} s"),
    }
}

/// The text of the first element after `marker` (an `id="…"` or `class="…"` attribute).
pub fn shown<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no {marker} in the page:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    rest[start..start + end].trim()
}

/// The number [`shown`] at `marker`.
pub fn shown_number(dom: &str, marker: &str) -> f64 {
    let text = shown(dom, marker);
    text.parse().unwrap_or_else(|_| panic!("{marker} shows {text:?}, not a number"))
}

/// Debian's `chromium` (or another Chromium on PATH).
pub fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name)))
        .find(|p| p.is_file())
}

/// Runs headless Chromium on `url` with a profile of its own under `dir`, letting the
/// page run for `budget_ms` of virtual time first; returns its stdout.
pub fn headless(browser: &Path, dir: &Path, url: &str, budget_ms: u64, what: &[&str]) -> String {
    let out = Command::new(browser)
        .args(["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile").display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8(out.stdout).unwrap()
}
