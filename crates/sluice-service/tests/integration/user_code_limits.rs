//! User code through the service is bounded (issue 38, item 5): a job's `map` op runs only
//! a module the operator allowed (named, with the flag, when refused) and only by its own
//! name; its Python children belong to the job and end with it, a worker runs at most
//! `--max-python-children` of them, a call that hangs is killed after the op's
//! `timeout_ms` while another job keeps running, and the worker's current folder is not
//! on a child's import path. Workers are processes (their children are counted in
//! `/proc`); the functions are tests/python/service_map_fns.py.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sluice_client::RemoteLoader;
use sluice_core::{ErrorPolicy, OpSpec};

use crate::service_map::{check_epoch, children_running, local_images, map_spec, python_worker, ALLOW_FNS};
use crate::support::*;

/// The connect error for `func` (the job refused at submission).
fn refused(addr: &str, root: &std::path::Path, func: &str, job: &str) -> String {
    match RemoteLoader::connect(&map_spec(root, func), options(addr, job)) {
        Ok(_) => panic!("a job with `{func}` was taken"),
        Err(e) => e.to_string(),
    }
}

/// Every sample's error of one epoch of `func` under `on_error = "skip"`, with the keys
/// that came.
fn skipped_epoch(addr: &str, root: &std::path::Path, func: &str, job: &str) -> (Vec<u64>, Vec<(u64, String)>) {
    let mut s = map_spec(root, func);
    s.on_error = ErrorPolicy::Skip;
    let mut remote = RemoteLoader::connect(&s, options(addr, job)).unwrap();
    within(60, "an epoch of a refused function", move || {
        let mut keys: Vec<u64> = remote.iter().flat_map(|b| b.unwrap().keys).collect();
        keys.sort_unstable();
        (keys, remote.skipped().iter().map(|s| (s.key, s.error.clone())).collect())
    })
}

#[test]
fn a_map_runs_only_a_module_the_operator_allowed_and_only_by_its_own_name() {
    let _watchdog = watchdog("a_map_runs_only_a_module_the_operator_allowed_and_only_by_its_own_name", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());

    // No module allowed (the default): a job with a map op is refused, naming the module
    // and the flag.
    let addr = free_addr();
    let d = dispatcher(&addr, &dir.path().join("journal-none"), &root, &[]);
    let e = refused(&addr, &root, "service_map_fns:mark", "none");
    assert!(e.contains("`service_map_fns`") && e.contains("--allow-python-module service_map_fns"), "{e}");
    drop(d);

    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    let _w = python_worker(&addr, &root, &[]);
    // An unlisted module is never imported (`this` prints the Zen of Python when it is).
    let e = refused(&addr, &root, "this:nothing", "zen");
    assert!(e.contains("`this`") && e.contains("--allow-python-module this"), "{e}");
    assert!(e.contains("allowed: service_map_fns"), "{e}");
    // A listed module's function by another name: through a dunder attribute.
    let e = refused(&addr, &root, "service_map_fns:mark.__call__.__call__", "dunder");
    assert!(e.contains("`__call__`") && e.contains("dunder"), "{e}");
    // Through a module the listed one imported, or to a function it imported: the child
    // refuses to import it, and every sample fails saying why.
    for (func, why) in [
        ("service_map_fns:np.load", "walks through module `numpy`"),
        ("service_map_fns:time.sleep", "walks through module `time`"),
        ("service_map_fns:Any", "is defined in `typing`, not in `service_map_fns`"),
    ] {
        let (keys, skipped) = skipped_epoch(&addr, &root, func, func);
        assert!(keys.is_empty(), "{func}: samples came: {keys:?}");
        assert_eq!(skipped.len(), IMAGES, "{func}: {skipped:?}");
        assert!(skipped[0].1.contains(func) && skipped[0].1.contains(why), "{func}: {}", skipped[0].1);
    }
}

/// Counts `worker`'s Python children every 20 ms while `run` runs: the most at once, and
/// what `run` returned.
fn most_children<T: Send + 'static>(
    worker: u32,
    run: impl FnOnce() -> T + Send + 'static,
    within_s: u64,
    what: &str,
) -> (usize, T) {
    let handle = std::thread::spawn(run);
    let t0 = Instant::now();
    let mut most = 0;
    while !handle.is_finished() {
        most = most.max(children_running(worker, "service_map_fns").len());
        assert!(t0.elapsed() < Duration::from_secs(within_s), "{what} did not end within {within_s} s");
        std::thread::sleep(Duration::from_millis(20));
    }
    (most, handle.join().unwrap())
}

#[test]
fn python_children_end_with_their_job_and_a_worker_runs_at_most_its_cap() {
    let _watchdog = watchdog("python_children_end_with_their_job_and_a_worker_runs_at_most_its_cap", 240);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    // Idle job loaders go after a second; at most two children over all jobs.
    let w = python_worker(&addr, &root, &["--job-idle-secs", "1", "--max-python-children", "2"]);
    let worker = w.id();
    assert!(children_running(worker, "service_map_fns").is_empty());

    // Five jobs one after another: each has its child, which ends when the job does (its
    // loader idle for a second).
    for j in 0..5u64 {
        let s = map_spec(&root, "service_map_fns:mark");
        let s = sluice_core::PipelineSpec { seed: 100 + j, ..s };
        let local = local_images(&s);
        let mut remote = RemoteLoader::connect(&s, options(&addr, &format!("one-of-five-{j}"))).unwrap();
        let (most, ()) = most_children(worker, move || check_epoch(&mut remote, &local, |_| {}), 60, "a job's epoch");
        assert_eq!(most, 1, "job {j}: children of one job of one thread");
        let t0 = Instant::now();
        let left = loop {
            let left = children_running(worker, "service_map_fns");
            if left.is_empty() || t0.elapsed() > Duration::from_secs(10) {
                break left;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(left.is_empty(), "job {j}: children left 10 s after it went idle (--job-idle-secs 1): {left:?}");
    }

    // Three jobs at once under a cap of two: each gets its samples, never more than two
    // children alive.
    let (most, ()) = most_children(
        worker,
        move || {
            let jobs: Vec<_> = (0..3u64)
                .map(|j| {
                    let addr = addr.clone();
                    let root = root.clone();
                    std::thread::spawn(move || {
                        let s = map_spec(&root, "service_map_fns:mark");
                        let s = sluice_core::PipelineSpec { seed: 200 + j, ..s };
                        let local = local_images(&s);
                        let mut remote = RemoteLoader::connect(&s, options(&addr, &format!("capped-{j}"))).unwrap();
                        check_epoch(&mut remote, &local, |_| {});
                    })
                })
                .collect();
            jobs.into_iter().for_each(|j| j.join().unwrap());
        },
        150,
        "three capped jobs",
    );
    assert!((1..=2).contains(&most), "{most} children alive under --max-python-children 2");
}

#[test]
fn a_hanging_call_is_killed_after_its_timeout_while_another_job_keeps_running() {
    let _watchdog = watchdog("a_hanging_call_is_killed_after_its_timeout_while_another_job_keeps_running", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    let mut w = python_worker(&addr, &root, &[]);

    let mut hang = map_spec(&root, "service_map_fns:hang_on_key_5");
    if let Some(OpSpec::Map { timeout_ms, .. }) = hang.ops.last_mut() {
        *timeout_ms = 1500;
    }
    hang.on_error = ErrorPolicy::Skip;
    let mut hanging = RemoteLoader::connect(&hang, options(&addr, "hangs")).unwrap();
    let hung = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut keys: Vec<u64> = hanging.iter().flat_map(|b| b.unwrap().keys).collect();
        keys.sort_unstable();
        (keys, hanging.skipped().to_vec(), t0.elapsed())
    });
    // Meanwhile a real job on the same worker gets its whole epoch.
    let s = map_spec(&root, "service_map_fns:slow_mark");
    let local = local_images(&s);
    let mut remote = RemoteLoader::connect(&s, options(&addr, "real")).unwrap();
    within(90, "the real job's epoch beside a hanging one", move || check_epoch(&mut remote, &local, |_| {}));

    let (keys, skipped, took) = within(60, "the hanging job's epoch", move || hung.join().unwrap());
    assert_eq!(keys, (0..IMAGES as u64).filter(|&k| k != 5).collect::<Vec<_>>());
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].key, 5);
    let e = &skipped[0].error;
    assert!(e.contains("`service_map_fns:hang_on_key_5` ran past the op's timeout_ms (1500 ms) on sample 5"), "{e}");
    assert!(took >= Duration::from_millis(1500), "the epoch took {took:?}, under the timeout");
    assert!(w.0.try_wait().unwrap().is_none(), "the worker exited");
}

#[test]
fn the_working_folder_is_not_on_a_python_childs_import_path() {
    let _watchdog = watchdog("the_working_folder_is_not_on_a_python_childs_import_path", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    let _w = python_worker(&addr, &root, &[]);
    let (keys, skipped) = skipped_epoch(&addr, &root, "service_map_fns:off_the_working_folder", "cwd");
    assert!(skipped.is_empty(), "{:?}", skipped.first());
    assert_eq!(keys.len(), IMAGES);
}
