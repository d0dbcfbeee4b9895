//! The metrics server backs off when it cannot accept (out of file descriptors) instead
//! of retrying in a busy loop. Its own test binary: it lowers the process's fd limit.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn set_fd_limit(soft: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: get/setrlimit on a struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let old = lim.rlim_cur;
    lim.rlim_cur = soft;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    old
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_server_does_not_spin_when_accept_fails() {
    let addr = sluice_dashboard::metrics::serve("127.0.0.1:0", Arc::new(|| "up 1\n".to_string())).await.unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let old = set_fd_limit(open + 8);
    // Connect until no descriptor is left: the last connections wait in the backlog and
    // every accept() fails with EMFILE.
    let mut clients = Vec::new();
    while let Ok(c) = std::net::TcpStream::connect(addr) {
        clients.push(c);
        assert!(clients.len() < 64, "the fd limit did not bind");
    }
    let (cpu0, t0) = (cpu_seconds(), std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let busy = (cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64();
    set_fd_limit(old);
    drop(clients);
    assert!(busy < 0.3, "the process burnt {:.0}% of a core while accept() failed", busy * 100.0);
}
