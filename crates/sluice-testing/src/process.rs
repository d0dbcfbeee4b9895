//! Child processes that die with the test: killed (SIGKILL, with the process group they
//! lead) when dropped, and by the kernel when the test process dies without dropping them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when dropped. One started by [`spawn`]
/// leads its own process group, which is killed with it while it runs (a supervisor's
/// children go at once, instead of draining with nobody left to drain to).
pub struct Proc(pub Child);

impl Proc {
    pub fn id(&self) -> u32 {
        self.0.id()
    }

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

/// Starts `cmd` as the leader of a process group of its own, dying with the test.
pub fn spawn(mut cmd: Command) -> Proc {
    die_with_parent(&mut cmd);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    Proc(cmd.spawn().unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program())))
}

/// Re-runs this test binary as a child that runs only the `#[ignore]`d test `entry`, with
/// `env` set (cargo builds no other package's binary for a test; the entry test reads
/// `env` to know what to run). Its stdout (the test harness's) goes nowhere.
pub fn spawn_self(entry: &str, env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", entry, "--ignored", "--nocapture", "--test-threads", "1"]).stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn(cmd)
}

/// Sends SIGTERM and waits (10 s at most) for the process to exit on its own.
pub fn sigterm_and_wait(mut p: Proc, what: &str) {
    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
    unsafe {
        libc::kill(p.0.id() as libc::pid_t, libc::SIGTERM);
    }
    let t0 = Instant::now();
    while p.0.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what} did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
