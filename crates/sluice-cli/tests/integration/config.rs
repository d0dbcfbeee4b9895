//! `--config FILE`: the service's processes take their settings from one TOML file, flags
//! override it, and a key the file does not know stops them with the key and the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_client::RemoteLoader;

/// A config file for a service at `addr` serving `root`, with the dispatcher's metrics on
/// `metrics` and one single-threaded worker; `extra` is appended.
fn config_file(dir: &Path, addr: &str, root: &Path, metrics: &str, extra: &str) -> PathBuf {
    let port = metrics.rsplit(':').next().unwrap();
    let text = format!(
        "[dispatcher]\nlisten = \"{addr}\"\nmetrics_port = {port}\n\n\
         [worker]\ndispatcher = \"{addr}\"\nthreads = 1\n\n\
         [serve]\nallow_roots = [\"{}\"]\n\n\
         [up]\nworkers = 1\n{extra}",
        root.display()
    );
    let path = dir.join("service.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Whether something accepts connections at `addr` (tried for up to `secs`).
fn listening(addr: &str, secs: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if std::net::TcpStream::connect(addr).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_dispatcher_and_a_worker_started_from_a_config_file_serve_with_its_settings() {
    let _watchdog = watchdog("a_dispatcher_and_a_worker_started_from_a_config_file_serve_with_its_settings", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let (addr, metrics) = (free_addr(), free_addr());
    let file = config_file(dir.path(), &addr, &root, &metrics, "");
    let file = file.to_str().unwrap();
    // No flag but --config: the address, the metrics port, the allowed root and the
    // worker's dispatcher all come from the file.
    let _d = sluice(&["service", "dispatcher", "--config", file]);
    let _w = sluice(&["service", "worker", "--config", file]);
    let mut loader = RemoteLoader::connect(&spec(&root, 1), options(&addr, "from-file")).unwrap();
    assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "a service from a config file");
    assert!(http_get(&metrics).contains("sluice_"), "the dispatcher serves metrics on the file's port");
}

#[test]
fn a_flag_overrides_the_config_file() {
    let _watchdog = watchdog("a_flag_overrides_the_config_file", 60);
    let dir = tempfile::tempdir().unwrap();
    let (addr, in_file, on_flag) = (free_addr(), free_addr(), free_addr());
    let file = config_file(dir.path(), &addr, dir.path(), &in_file, "");
    let port = on_flag.rsplit(':').next().unwrap();
    let _d = sluice(&["service", "dispatcher", "--config", file.to_str().unwrap(), "--metrics-port", port]);
    assert!(http_get(&on_flag).contains("sluice_"), "metrics on the flag's port");
    assert!(listening(&addr, 10), "the file's listen address still holds");
    assert!(!listening(&in_file, 1), "nothing on the file's metrics port, which the flag replaced");
}

#[test]
fn an_unknown_key_stops_a_process_with_the_key_and_the_file() {
    let _watchdog = watchdog("an_unknown_key_stops_a_process_with_the_key_and_the_file", 60);
    let dir = tempfile::tempdir().unwrap();
    let (addr, metrics) = (free_addr(), free_addr());
    let file = config_file(dir.path(), &addr, dir.path(), &metrics, "\n[limits]\nmax_thread = 4\n");
    for command in ["dispatcher", "worker", "up"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["service", command, "--config", file.to_str().unwrap()])
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command} started with an unknown key");
        assert!(err.contains("limits.max_thread") && err.contains("service.toml"), "{command}: {err}");
    }
}

/// A free port P whose P + 1 is free too (for `up`'s worker 0).
fn free_port_pair() -> u16 {
    loop {
        let port: u16 = free_addr().rsplit(':').next().unwrap().parse().unwrap();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

#[test]
fn sluice_up_hands_its_config_file_to_every_child() {
    let _watchdog = watchdog("sluice_up_hands_its_config_file_to_every_child", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let (addr, port) = (free_addr(), free_port_pair());
    let file = config_file(dir.path(), &addr, &root, &format!("127.0.0.1:{port}"), "");
    let _up = sluice(&["service", "up", "--config", file.to_str().unwrap()]);
    let mut loader = RemoteLoader::connect(&spec(&root, 2), options(&addr, "up-from-file")).unwrap();
    assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "`up` from a config file");
    // The dispatcher's metrics on the file's port, worker 0's on the next one (as with
    // `up --metrics-port`).
    assert!(http_get(&format!("127.0.0.1:{port}")).contains("sluice_"), "the dispatcher's metrics");
    assert!(http_get(&format!("127.0.0.1:{}", port + 1)).contains("sluice_"), "worker 0's metrics");
}
