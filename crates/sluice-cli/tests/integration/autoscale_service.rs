//! `sluice up --autoscale`: the dispatcher's autoscaler decides, `up` starts and drains
//! real worker processes to follow it, and a distributed epoch read through a dozen scale
//! events (and SIGKILLs of workers among them) still delivers every key exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_client::{RemoteLoader, ScaleClient};
use sluice_core::OpSpec;

/// The worker processes (`sluice service worker`) `up` (pid `up`) runs now: (pid, `--name`), zombies left out.
fn workers_of(up: u32) -> Vec<(u32, String)> {
    children_of(up)
        .into_iter()
        .filter(|(_, args)| args.get(1..3) == Some(&["service".to_string(), "worker".to_string()][..]))
        .filter_map(|(pid, args)| {
            let i = args.iter().position(|a| a == "--name")?;
            Some((pid, args.get(i + 1).cloned().unwrap_or_default()))
        })
        .collect()
}

/// The dispatcher process `up` runs now.
fn dispatcher_of(up: u32) -> Option<u32> {
    children_of(up)
        .into_iter()
        .find(|(_, args)| args.get(1..3) == Some(&["service".to_string(), "dispatcher".to_string()][..]))
        .map(|c| c.0)
}

/// The live child processes of `up`: (pid, command line).
fn children_of(up: u32) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command's name in parentheses: state, then the parent's pid.
        let mut rest = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace()).into_iter().flatten();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid != Some(up) || state == Some("Z") {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        found.push((pid, args));
    }
    found
}

fn number(name: &str) -> usize {
    name.trim_start_matches("worker-").parse().unwrap_or(0)
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a pid read from /proc just now; no memory is involved.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

fn up_autoscaled(addr: &str, metrics_port: u16, root: &Path, policy: &str, max: &str, window_ms: &str) -> Proc {
    sluice(&[
        "service",
        "up",
        "--listen",
        addr,
        "--allow-root",
        root.to_str().unwrap(),
        "--autoscale",
        policy,
        "--min-workers",
        "1",
        "--max-workers",
        max,
        "--autoscale-window-ms",
        window_ms,
        "--threads",
        "1",
        "--metrics-port",
        &metrics_port.to_string(),
    ])
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn an_epoch_through_a_dozen_scale_events_and_sigkills_delivers_every_key_exactly_once() {
    let _watchdog = watchdog("an_epoch_through_a_dozen_scale_events_and_sigkills_delivers_every_key_exactly_once", 120);
    let t_test = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let metrics = free_addr();
    // `fixed`: only the test's orders move the target, so every event is the test's own.
    let up = up_autoscaled(&addr, port_of(&metrics), &root, "fixed", "4", "1000");
    let up_pid = up.0.id();
    let mut o = options(&addr, "scaled");
    o.task_batches = 1;
    // A batch per sample: the epoch's 48 batches take the trainer 7 s.
    let mut spec = spec(&root, 7);
    spec.batch.size = 1;
    let mut loader = within(30, "connect", move || RemoteLoader::connect(&spec, o).unwrap());

    eprintln!("connected after {:.1} s", t_test.elapsed().as_secs_f64());
    let t_start = Instant::now();
    // The events, 400 ms apart while the trainer reads: up and down between 1 and 4
    // workers; after the 4th (4 → 2: two drain) the highest-numbered worker is SIGKILLed,
    // likely mid-drain; after the 7th a serving one is (a crash: `up` restarts it).
    let targets = [3u64, 1, 4, 2, 4, 1, 3, 2, 4, 1, 3, 1];
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let epoch_over = done.clone();
    let driver = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut client = ScaleClient::new(&addr, None, None).unwrap();
            let mut pids = BTreeSet::new();
            let mut in_epoch = 0;
            let mut killed = Vec::new();
            let watch = |pids: &mut BTreeSet<u32>, for_ms: u64| {
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_millis(for_ms) {
                    pids.extend(workers_of(up_pid).into_iter().map(|(p, _)| p));
                    std::thread::sleep(Duration::from_millis(50));
                }
            };
            for (k, &target) in targets.iter().enumerate() {
                watch(&mut pids, 400);
                let t0 = Instant::now();
                while client.set_workers(target).is_err() {
                    assert!(t0.elapsed() < Duration::from_secs(10), "the dispatcher does not take SetScale");
                    std::thread::sleep(Duration::from_millis(100));
                }
                if !epoch_over.load(std::sync::atomic::Ordering::SeqCst) {
                    in_epoch += 1;
                }
                if k == 3 || k == 6 {
                    watch(&mut pids, 300);
                    let mut running = workers_of(up_pid);
                    running.sort_by_key(|(_, name)| number(name));
                    let victim = if k == 3 { running.last() } else { running.first() };
                    if let Some((pid, name)) = victim {
                        sigkill(*pid);
                        killed.push(name.clone());
                    }
                }
            }
            (pids, in_epoch, killed)
        })
    };
    let mut keys = Vec::new();
    for b in loader.iter() {
        keys.extend(b.unwrap().keys);
        std::thread::sleep(Duration::from_millis(150));
    }
    eprintln!("epoch read in {:.1} s", t_start.elapsed().as_secs_f64());
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (pids, in_epoch, killed) = driver.join().unwrap();
    eprintln!("{in_epoch} events in the epoch; {} worker processes; killed {killed:?}", pids.len());
    assert_exactly_once(keys, "an epoch through scale events");
    assert!(in_epoch >= 10, "only {in_epoch} scale events happened within the epoch");
    assert_eq!(killed.len(), 2, "a worker to kill was found each time: {killed:?}");
    assert!(pids.len() >= 8, "only {} worker processes ever ran: {pids:?}", pids.len());
    let text = get(&metrics, "/metrics").unwrap().1;
    let ups = metric_value(&text, "sluice_autoscale_decisions_total{direction=\"up\"}");
    let downs = metric_value(&text, "sluice_autoscale_decisions_total{direction=\"down\"}");
    assert!(ups + downs >= targets.len() as f64 - 1.0, "{ups} up and {downs} down decisions counted");
    // The last order was 1: the drained workers exit and are not started again.
    let t0 = Instant::now();
    loop {
        let running = workers_of(up_pid);
        if running.len() == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "still {running:?} after scaling to 1");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "one worker left {:.1} s after the events; test {:.1} s",
        t0.elapsed().as_secs_f64(),
        t_test.elapsed().as_secs_f64()
    );
}

#[test]
fn api_autoscale_serves_each_decision_with_its_inputs_and_up_follows_it() {
    let _watchdog = watchdog("api_autoscale_serves_each_decision_with_its_inputs_and_up_follows_it", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let metrics = free_addr();
    let _up = up_autoscaled(&addr, port_of(&metrics), &root, "fastmatch", "3", "500");
    // One worker thread makes a batch of 4 in 80 ms at best (a sleep of 20 ms a sample):
    // 12.5 batches/s, well below a trainer that takes them as fast as they come.
    let mut spec = spec(&root, 3);
    spec.ops.push(OpSpec::Sleep { us: 20_000 });
    let o = options(&addr, "fast-trainer");
    let mut loader = within(30, "connect", move || RemoteLoader::connect(&spec, o).unwrap());
    let t0 = Instant::now();
    let decided = loop {
        for b in loader.iter() {
            b.unwrap();
        }
        let (code, body) = get(&metrics, "/api/autoscale").unwrap();
        assert_eq!(code, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        if json["decisions"].as_array().is_some_and(|d| !d.is_empty()) {
            break json;
        }
        assert!(t0.elapsed() < Duration::from_secs(40), "no decision yet: {body}");
    };
    assert_eq!(decided["policy"], "fastmatch");
    let d = &decided["decisions"][0];
    let num = |k: &str| d[k].as_f64().unwrap_or_else(|| panic!("decision without {k}: {d}"));
    assert_eq!(num("from"), 1.0, "{d}");
    assert!(num("to") > 1.0 && num("to") <= 3.0, "a trainer starved by one worker scales up: {d}");
    assert!(num("production") > 0.0 && num("consumption") > num("production"), "{d}");
    assert!(num("stall") > 0.0 && num("stall") <= 1.0, "{d}");
    assert!(num("t_ms") > 0.0);
    assert!(d["reason"].as_str().is_some_and(|r| r.contains("units")), "{d}");
    let units = decided["units"].as_f64().unwrap();
    let text = get(&metrics, "/metrics").unwrap().1;
    assert!(metric_value(&text, "sluice_autoscale_decisions_total{direction=\"up\"}") >= 1.0);
    // `up` follows the target: the workers taking tasks reach it.
    let t0 = Instant::now();
    loop {
        let text = get(&metrics, "/metrics").unwrap().1;
        let target = metric_value(&text, "sluice_autoscale_target_workers");
        if metric_value(&text, "sluice_dispatcher_workers_live") == target {
            assert!(target >= units.min(2.0), "target {target}, first decision to {units}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "the workers never reached the target:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restarted_dispatcher_resumes_its_target_and_up_keeps_its_workers() {
    let _watchdog = watchdog("a_restarted_dispatcher_resumes_its_target_and_up_keeps_its_workers", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let (addr, metrics) = (free_addr(), free_addr());
    let up = up_autoscaled(&addr, port_of(&metrics), &root, "fixed", "4", "1000");
    let up_pid = up.0.id();
    let mut client = ScaleClient::new(&addr, None, None).unwrap();
    let t0 = Instant::now();
    while client.set_workers(3).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the dispatcher does not take SetScale");
        std::thread::sleep(Duration::from_millis(100));
    }
    let t0 = Instant::now();
    while workers_of(up_pid).len() != 3 {
        assert!(t0.elapsed() < Duration::from_secs(15), "up did not start 3 workers: {:?}", workers_of(up_pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = dispatcher_of(up_pid).expect("up runs no dispatcher");
    sigkill(killed);
    // `up` restarts the dispatcher on the same journal; the target it tells is the one
    // before the kill, not --min-workers.
    let t0 = Instant::now();
    let target = loop {
        let restarted = dispatcher_of(up_pid).is_some_and(|pid| pid != killed);
        if let (true, Ok(reply)) = (restarted, client.scale()) {
            break reply.target;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the dispatcher was not restarted");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(target, 3, "the restarted dispatcher's target");
    // `up` polls the target every 250 ms: over 3 s its 3 workers stay (none drains).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let running = workers_of(up_pid);
        assert_eq!(running.len(), 3, "up's workers after the restart: {running:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_client_asking_for_autoscaling_is_refused_by_a_dispatcher_without_it() {
    let _watchdog = watchdog("a_client_asking_for_autoscaling_is_refused_by_a_dispatcher_without_it", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut o = options(&addr, "wants-scaling");
    o.autoscale = true;
    let spec = spec(&root, 1);
    let e = within(30, "connect", move || RemoteLoader::connect(&spec, o).err()).expect("connected anyway");
    assert_eq!(e.kind(), sluice_client::ServiceErrorKind::FailedPrecondition, "{e}");
    let message = e.to_string();
    assert!(
        message.contains("`autoscale`") && message.contains("--autoscale POLICY"),
        "the error names neither the option nor the flag: {message}"
    );
}
