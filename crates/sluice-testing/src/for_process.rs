//! What a test process starts once and keeps to its end: servers started by the first test
//! that needs them (weed, Azurite) and the folder their data and caches live in. Statics
//! are never dropped, so at exit (`atexit`, which runs whether the tests passed or failed)
//! the servers are killed and reaped, then the folder is removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};

use crate::process::die_with_parent;

static DIR: OnceLock<PathBuf> = OnceLock::new();
static SERVERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// A folder of this test process's own (`$TMPDIR/sluice-test-…`), removed when it exits.
pub fn process_dir() -> &'static Path {
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("sluice-test-").tempdir().unwrap().keep();
        // SAFETY: registers a function of no arguments that only kills and reaps children
        // and removes files, through statics that live until the process is gone.
        let registered = unsafe { libc::atexit(clean_up) };
        assert_eq!(registered, 0, "atexit refused the clean-up of {}", dir.display());
        dir
    })
}

extern "C" fn clean_up() {
    let servers = std::mem::take(&mut *SERVERS.lock().unwrap_or_else(|e| e.into_inner()));
    for mut child in servers {
        let _ = child.kill();
        let _ = child.wait();
    }
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Starts a server for the rest of this process, killed and reaped at exit (before
/// [`process_dir`] is removed). It is spawned from a thread that lives as long as the
/// process, so that it also dies (`PR_SET_PDEATHSIG`) if the process is killed. Panics
/// with `missing` when it cannot start.
pub fn start_for_process(mut cmd: Command, missing: &str) {
    process_dir();
    die_with_parent(&mut cmd);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        match cmd.spawn() {
            Ok(child) => {
                SERVERS.lock().unwrap_or_else(|e| e.into_inner()).push(child);
                tx.send(Ok(())).unwrap();
            }
            Err(e) => {
                tx.send(Err(e)).unwrap();
                return;
            }
        }
        loop {
            std::thread::park();
        }
    });
    rx.recv().unwrap().expect(missing);
}
