//! Thread counts of a process, for tests that check a server does not spend a thread per
//! connection.

use std::sync::{Mutex, MutexGuard};

/// The threads of process `pid` now (from `/proc`).
pub fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Held by each test that counts this process's threads, so such tests run one at a time.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}
