//! The lock between a native loader's `next()` and the methods that need the loader
//! between batches.
//!
//! `next()` holds its loader for the whole of a wait, with the GIL released, and takes the
//! GIL back every 50 ms to check for signals. A thread that waited for that loader while
//! holding the GIL would block it for good (and Ctrl-C with it). So a [`Serial`] is only
//! ever taken with the GIL released, and its waiters check for signals too. What other
//! threads read while `next()` waits (stats, epoch, lengths) lives outside it: in atomics
//! or a snapshot behind a short lock that is never held across a wait.

use std::thread::ThreadId;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::errors::reentrant_error;

/// How often a waiter checks for signals.
const POLL: Duration = Duration::from_millis(50);

/// A loader that one thread at a time uses, taken only with the GIL released.
pub struct Serial<T> {
    value: Mutex<T>,
    /// The thread using it, so that a call from that same thread (a signal handler that
    /// runs while its `next()` waits) is refused instead of waiting for itself.
    holder: Mutex<Option<ThreadId>>,
    /// The Python class, for errors.
    class: &'static str,
}

/// Marks the calling thread as the holder until dropped.
struct Holding<'a>(&'a Mutex<Option<ThreadId>>);

impl<'a> Holding<'a> {
    fn new(holder: &'a Mutex<Option<ThreadId>>, me: ThreadId) -> Self {
        *holder.lock() = Some(me);
        Self(holder)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        *self.0.lock() = None;
    }
}

impl<T: Send> Serial<T> {
    pub fn new(value: T, class: &'static str) -> Self {
        Self { value: Mutex::new(value), holder: Mutex::new(None), class }
    }

    /// Runs `f` on the value with the GIL released, once the thread using it (if any) is
    /// done, checking for signals every 50 ms while it waits: Ctrl-C raises
    /// `KeyboardInterrupt` and leaves the value alone. A call from the thread already
    /// inside (a signal handler run during its `next()`) raises `SluiceError`; `method`
    /// names the Python method for it.
    /// `f` on the value, with the GIL released, if no thread is using it; else `None`
    /// at once. For reads that fall back on what the user left behind.
    pub fn try_with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R + Send) -> Option<R> {
        py.detach(|| self.value.try_lock().map(|mut value| f(&mut value)))
    }

    pub fn with<R: Send>(&self, py: Python<'_>, method: &str, f: impl FnOnce(&mut T) -> R + Send) -> PyResult<R> {
        let me = std::thread::current().id();
        if *self.holder.lock() == Some(me) {
            return Err(reentrant_error(py, self.class, method));
        }
        let mut f = Some(f);
        loop {
            let done = py.detach(|| {
                let mut value = self.value.try_lock_for(POLL)?;
                let f = f.take()?;
                let _holding = Holding::new(&self.holder, me);
                Some(f(&mut value))
            });
            match done {
                Some(r) => return Ok(r),
                None => py.check_signals()?,
            }
        }
    }
}

/// The stop check of a wait with the GIL released (`next()`'s, every 50 ms): it takes the
/// GIL to run Python's signal handlers, and stops the wait when one raises (Ctrl-C's
/// `KeyboardInterrupt`), keeping the exception in `raised` for the caller to raise.
pub fn signal_check(raised: &mut Option<PyErr>) -> impl FnMut() -> bool + Send + '_ {
    move || {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                *raised = Some(e);
                true
            }
        })
    }
}
