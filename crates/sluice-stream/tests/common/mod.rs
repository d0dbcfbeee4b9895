//! What the streaming tests share: a real `redis-server` on a free loopback port (killed
//! with the test), a small generated dataset pushed into a stream, specs and a watchdog.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_core::{Manifest, OpSpec, Size, SourceSpec};
use sluice_stream::{PushOptions, PushOrder, RateSpec, RehearsalPolicy, RehearsalSpec, StreamSpec};

/// A `redis-server` child, killed (SIGKILL) and reaped when dropped.
pub struct Redis {
    pub port: u16,
    pub dir: PathBuf,
    aof: bool,
    child: Option<Child>,
}

impl Redis {
    /// Starts one on a free port, persisting nothing unless `aof` (then an append-only
    /// file, fsynced on every write, in `dir`).
    pub fn start(dir: &Path, aof: bool) -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut r = Self { port, dir: dir.to_path_buf(), aof, child: None };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", ""])
            .args(["--dir", self.dir.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        }
        die_with_parent(&mut cmd);
        self.child = Some(cmd.spawn().expect("redis-server must be installed (scripts/setup.sh)"));
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL: the broker dies without a chance to flush anything more.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

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

/// `images` small (32×24) JPEGs in `classes` classes, enumerated. Small, so that a test
/// spends its time streaming, not making and decoding images (in a debug build).
pub fn dataset(dir: &Path, images: usize, classes: usize) -> Manifest {
    let root = dir.join("data");
    for i in 0..images {
        let class_dir = root.join(format!("class_{:03}", i % classes));
        std::fs::create_dir_all(&class_dir).unwrap();
        let rgb: Vec<u8> = (0..32 * 24 * 3).map(|p| (p * 7 + i * 13 + (i % classes) * 50) as u8).collect();
        let jpeg = sluice_codec::encode_jpeg(&rgb, 32, 24, 85).unwrap();
        std::fs::write(class_dir.join(format!("img_{i:07}.jpg")), jpeg).unwrap();
    }
    sluice_pipeline::source::build_manifest(&SourceSpec::ImageFolder { root }).unwrap()
}

pub fn push_options(url: &str, stream: &str, rate: f64) -> PushOptions {
    PushOptions {
        url: url.to_string(),
        stream: stream.to_string(),
        rate,
        order: PushOrder::ClassIncremental,
        classes_per_task: 2,
        seed: 1,
        limit: None,
        end: true,
        reconnect_ms: 20_000,
    }
}

pub fn stream_spec(url: &str, stream: &str, group: &str, r: usize, b: usize, dir: Option<&Path>) -> StreamSpec {
    StreamSpec {
        url: url.to_string(),
        stream: stream.to_string(),
        group: group.to_string(),
        consumer: "learner-0".into(),
        ops: vec![
            OpSpec::Decode,
            OpSpec::Resize { size: 20 },
            OpSpec::CenterCrop { size: Size::square(16) },
            OpSpec::RandomHorizontalFlip { p: 0.5 },
        ],
        new_per_batch: r,
        rehearsal_per_batch: b,
        rehearsal: dir.map(|d| RehearsalSpec {
            capacity: 16,
            policy: RehearsalPolicy::Reservoir,
            dir: d.to_path_buf(),
            peers: Vec::new(),
            rank: 0,
            token: None,
        }),
        rate: RateSpec::default(),
        seed: 7,
        threads: 1.into(),
        on_error: Default::default(),
        limits: Default::default(),
        claim_idle_ms: 30_000,
        max_unacked: 65_536,
        reconnect_ms: 20_000,
    }
}

/// Asserts that `ids` hold each of `0..n` exactly once.
pub fn assert_exactly_once(mut ids: Vec<u64>, n: usize, what: &str) {
    ids.sort_unstable();
    let expected: Vec<u64> = (0..n as u64).collect();
    assert_eq!(ids, expected, "{what}: not every entry exactly once");
}

/// Fails the whole test binary if a test hangs; disarmed when dropped.
pub struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

pub fn watchdog(what: &'static str, secs: u64) -> Watchdog {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
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
