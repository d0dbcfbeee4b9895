//! Bounds on a test's time: a hung test fails instead of blocking CI forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Fails the whole test binary if a test hangs; disarmed when dropped (at the end of the
/// test).
pub struct Watchdog(Arc<AtomicBool>);

pub fn watchdog(what: &'static str, secs: u64) -> Watchdog {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            if d.load(Ordering::SeqCst) {
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
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `f` on a thread and fails the test (instead of hanging it) if it takes over `secs`;
/// a panic in `f` is the test's panic, at once and with its own message.
pub fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        // The sender went away without sending: `f` panicked.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Err(payload) => std::panic::resume_unwind(payload),
            Ok(()) => panic!("{what}: ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still not done after {secs} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_within_is_reported_at_once_with_its_message() {
        let t0 = std::time::Instant::now();
        let caught = std::panic::catch_unwind(|| within(20, "the work", || -> u32 { panic!("the real reason") }));
        let payload = caught.expect_err("within returned although f panicked");
        let message = payload.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_default();
        assert_eq!(message, "the real reason");
        assert!(t0.elapsed() < Duration::from_secs(10), "waited {:?} for a panicked closure", t0.elapsed());
    }
}
