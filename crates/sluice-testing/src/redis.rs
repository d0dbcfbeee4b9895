//! A real `redis-server` on a free loopback port, killed with the test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::die_with_parent;

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
