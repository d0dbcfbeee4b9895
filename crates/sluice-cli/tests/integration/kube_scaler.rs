//! `sluice kube-scaler`, the autoscaler's Kubernetes actuator: it sets the worker
//! StatefulSet's replicas (the `scale` subresource) to the dispatcher's target, and the
//! workers Kubernetes stops (SIGTERM) drain before they exit, so an epoch read through the
//! scale events loses no task.
//!
//! No Kubernetes API server can be installed on this machine (none is packaged in Debian,
//! PyPI, npm or crates.io), so the test serves the scale subresource's two endpoints on
//! loopback (found through `$KUBECONFIG`, as in a real deployment) and plays the StatefulSet
//! controller: worker processes `sluice-worker-0..N` follow the replica count, the
//! highest ordinals stopped first with SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_client::{RemoteLoader, ScaleClient};
use sluice_synth::DatasetOptions;

/// The StatefulSet `sluice-worker`'s scale subresource, over HTTP/1.1: GET answers the
/// replica count as an `autoscaling/v1` Scale, a merge PATCH sets it. Every request line
/// and body is kept.
struct ScaleEndpoint {
    replicas: AtomicI64,
    requests: Mutex<Vec<String>>,
}

const PATH: &str = "/apis/apps/v1/namespaces/training/statefulsets/sluice-worker/scale";

fn serve(api: Arc<ScaleEndpoint>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let api = api.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                // Keep-alive: one request after another on the connection.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        reader.read_line(&mut h).unwrap();
                        if h == "\r\n" || h.is_empty() {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let body = String::from_utf8(body).unwrap();
                    let (method, path) = {
                        let mut p = line.split_whitespace();
                        (p.next().unwrap_or("").to_string(), p.next().unwrap_or("").to_string())
                    };
                    api.requests.lock().unwrap().push(format!("{method} {path} {body}"));
                    let code = match (method.as_str(), path.split('?').next() == Some(PATH)) {
                        ("GET", true) => 200,
                        ("PATCH", true) => {
                            let patch: serde_json::Value = serde_json::from_str(&body).unwrap();
                            api.replicas.store(patch["spec"]["replicas"].as_i64().unwrap(), Ordering::SeqCst);
                            200
                        }
                        _ => 404,
                    };
                    let n = api.replicas.load(Ordering::SeqCst);
                    let reply = serde_json::json!({
                        "kind": "Scale", "apiVersion": "autoscaling/v1",
                        "metadata": {"name": "sluice-worker", "namespace": "training"},
                        "spec": {"replicas": n}, "status": {"replicas": n}
                    })
                    .to_string();
                    let mut s = &stream;
                    let head = format!(
                        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        reply.len()
                    );
                    if s.write_all(head.as_bytes()).and_then(|()| s.write_all(reply.as_bytes())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn kubeconfig(dir: &Path, api: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
         clusters: [{{name: test, cluster: {{server: \"http://{api}\"}}}}]\n\
         contexts: [{{name: test, context: {{cluster: test, user: test, namespace: training}}}}]\n\
         users: [{{name: test, user: {{}}}}]\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn kube_scaler_follows_the_target_and_workers_stopped_by_kubernetes_drain_first() {
    let _watchdog = watchdog("kube_scaler_follows_the_target_and_workers_stopped_by_kubernetes_drain_first", 120);
    const IMAGES: usize = 160;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let data = DatasetOptions { images: IMAGES, classes: 4, texture: 8, ..Default::default() };
    sluice_synth::write_dataset(&root, &data, &|_| {}).unwrap();
    let addr = free_addr();
    let metrics = free_addr();
    let port = metrics.rsplit(':').next().unwrap();
    let journal = dir.path().join("journal");
    let _dispatcher = dispatcher(
        &addr,
        &journal,
        &root,
        &["--autoscale", "fixed", "--min-workers", "1", "--max-workers", "3", "--metrics-port", port],
    );
    let api = Arc::new(ScaleEndpoint { replicas: AtomicI64::new(1), requests: Mutex::new(Vec::new()) });
    let config = kubeconfig(dir.path(), &serve(api.clone()));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["kube-scaler", "--dispatcher", &addr, "--statefulset", "sluice-worker", "--every-ms", "100"])
        .env("KUBECONFIG", &config)
        .env("SLUICE_LOG", "warn")
        .stdout(std::process::Stdio::null());
    die_with_parent(&mut cmd);
    let _scaler = Proc(cmd.spawn().unwrap());

    // The StatefulSet controller: pods sluice-worker-0..replicas, the highest stopped first
    // (SIGTERM, then SIGKILL after a grace period, as the kubelet does).
    let stop = Arc::new(AtomicBool::new(false));
    let controller = {
        let (api, stop, addr, root) = (api.clone(), stop.clone(), addr.clone(), root.clone());
        std::thread::spawn(move || {
            let mut pods: Vec<Proc> = Vec::new();
            let mut stopped = Vec::new();
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                let want = api.replicas.load(Ordering::SeqCst).max(0) as usize;
                while pods.len() < want {
                    let name = format!("sluice-worker-{}", pods.len());
                    pods.push(worker(&addr, &root, &["--name", &name]));
                }
                while pods.len() > want {
                    let mut pod = pods.pop().unwrap();
                    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
                    unsafe {
                        libc::kill(pod.0.id() as libc::pid_t, libc::SIGTERM);
                    }
                    let t0 = Instant::now();
                    let status = loop {
                        if let Some(s) = pod.0.try_wait().unwrap() {
                            break Some(s);
                        }
                        if t0.elapsed() > Duration::from_secs(30) {
                            pod.kill();
                            break None;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    };
                    stopped.push(status.map(|s| s.success()));
                }
                most = most.max(pods.len());
                std::thread::sleep(Duration::from_millis(50));
            }
            (stopped, most)
        })
    };

    let mut o = options(&addr, "on-kubernetes");
    o.task_batches = 1;
    let spec = spec(&root, 11);
    let mut loader = within(30, "connect", move || RemoteLoader::connect(&spec, o).unwrap());
    let targets = [3u64, 1, 2, 3, 1, 2, 1];
    let driver = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut client = ScaleClient::new(&addr, None, None).unwrap();
            for target in targets {
                std::thread::sleep(Duration::from_millis(700));
                let t0 = Instant::now();
                while client.set_workers(target).is_err() {
                    assert!(t0.elapsed() < Duration::from_secs(10), "the dispatcher does not take SetScale");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    };
    let mut keys = Vec::new();
    for b in loader.iter() {
        keys.extend(b.unwrap().keys);
        std::thread::sleep(Duration::from_millis(120));
    }
    driver.join().unwrap();
    // The last target (1) reaches the StatefulSet.
    let t0 = Instant::now();
    while api.replicas.load(Ordering::SeqCst) != 1 {
        assert!(t0.elapsed() < Duration::from_secs(10), "replicas stayed at {}", api.replicas.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (stopped, most) = controller.join().unwrap();

    keys.sort_unstable();
    assert_eq!(keys, (0..IMAGES as u64).collect::<Vec<_>>(), "not every sample exactly once");
    assert_eq!(most, 3, "the StatefulSet never reached 3 replicas");
    assert!(stopped.len() >= 3, "only {} pods were stopped", stopped.len());
    assert!(stopped.iter().all(|s| *s == Some(true)), "a stopped worker did not exit cleanly: {stopped:?}");
    let patches: Vec<String> =
        api.requests.lock().unwrap().iter().filter(|r| r.starts_with("PATCH")).cloned().collect();
    assert!(patches.len() >= 5, "{patches:?}");
    assert!(
        patches.iter().all(|p| p.ends_with(r#"{"spec":{"replicas":1}}"#)
            || p.ends_with(r#"{"spec":{"replicas":2}}"#)
            || p.ends_with(r#"{"spec":{"replicas":3}}"#)),
        "{patches:?}"
    );
    // Stopped workers drained: no client lost a task to one of them.
    let failed = metric_value(&http_get(&metrics), "sluice_dispatcher_tasks_failed_total");
    assert_eq!(failed, 0.0, "tasks failed when workers were stopped");
}
