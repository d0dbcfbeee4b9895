//! The one place tokio runtimes are built: the client's, the servers', a supervisor's
//! signal thread's and the dashboard's. A runtime that cannot start (no threads, no
//! epoll) is [`RuntimeError`], saying which.

use tokio::runtime::{Builder, Runtime};

/// A runtime that could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the {what} runtime: {source}")]
pub struct RuntimeError {
    /// What the runtime was for (`"client"`, `"dispatcher"`, …).
    pub what: &'static str,
    #[source]
    pub source: std::io::Error,
}

/// How many threads a runtime runs its tasks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// On the thread that calls `block_on` (a blocking client making one call at a time).
    Caller,
    /// On `n` threads of its own, named after `what`.
    Workers(usize),
}

/// A runtime with I/O and timers, for `what` (named in its threads and in the error).
pub fn runtime(what: &'static str, threads: Threads) -> Result<Runtime, RuntimeError> {
    let mut builder = match threads {
        Threads::Caller => Builder::new_current_thread(),
        Threads::Workers(n) => {
            let mut b = Builder::new_multi_thread();
            b.worker_threads(n.max(1)).thread_name(format!("sluice-{what}"));
            b
        }
    };
    builder.enable_all().build().map_err(|source| RuntimeError { what, source })
}
