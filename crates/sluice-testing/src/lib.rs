//! Test support shared by the crates' integration tests (a dev-dependency, never linked
//! into the product). A failed setup here is a failed test, so it unwraps.
//!
//! * [`process`]: child processes killed (with their process group) when dropped or when
//!   the test process dies, and a test binary re-run as a child.
//! * [`for_process`]: servers and a folder kept for the whole test process, gone at exit.
//! * [`net`]: free loopback ports and a plain HTTP GET of `/metrics`.
//! * [`watchdog`]: bounds on a test's time.
//! * [`redis`]: a real `redis-server` on a free port; [`browser`]: headless Chromium.
//! * [`service`] (feature `service`): the dataset, spec and options the service's tests
//!   use (starting its servers is sluice-service's own test support, so that this crate
//!   does not depend on it).
//! * [`hostile`], [`threads`]: a hostile peer client and thread counts.
//!
//! [`prelude`] has what most tests use.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod browser;
pub mod for_process;
pub mod hostile;
pub mod net;
pub mod process;
pub mod redis;
#[cfg(feature = "service")]
pub mod service;
pub mod threads;
pub mod watchdog;

/// What most tests use, for one glob import.
pub mod prelude {
    pub use crate::browser::{chromium, headless, shown, shown_number};
    pub use crate::net::{free_addr, free_addrs, get, http_get, metric_value, port_of};
    pub use crate::process::{die_with_parent, sigterm_and_wait, spawn, spawn_self, Proc};
    #[cfg(feature = "service")]
    pub use crate::service::{
        assert_exactly_once, dataset, dataset_and_bytes, options, spec, wait_for_heartbeat, BATCH, IMAGES,
    };
    pub use crate::watchdog::{watchdog, within, Watchdog};
    pub use crate::{assert_each_once, Rng};
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

/// Asserts that `ids` hold each of `0..n` exactly once.
pub fn assert_each_once(mut ids: Vec<u64>, n: usize, what: &str) {
    ids.sort_unstable();
    let expected: Vec<u64> = (0..n as u64).collect();
    assert_eq!(ids, expected, "{what}: not each of 0..{n} exactly once");
}

/// The harness's name of test `$f` in the calling module, as `--exact` wants it when a test
/// binary re-runs itself as a child: the module path without the crate (`liveness::learner_process`).
#[macro_export]
macro_rules! test_name {
    ($f:expr) => {
        match module_path!().split_once("::") {
            Some((_, module)) => format!("{module}::{}", $f),
            None => $f.to_string(),
        }
    };
}
