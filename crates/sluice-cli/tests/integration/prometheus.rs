//! Prometheus for real: Debian's `prometheus` server scrapes `sluice up` over loopback, and
//! the client's stall fraction read back through PromQL is the one the endpoint serves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_client::RemoteLoader;

fn prometheus() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("prometheus")).find(|p| p.is_file())
}

/// The value of the one series `query` selects, once Prometheus has it.
fn promql(addr: &str, query: &str, deadline: Instant) -> f64 {
    loop {
        let encoded: String = query
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let answer = get(addr, &format!("/api/v1/query?query={encoded}")).map(|(_, body)| body);
        if let Some(value) = answer.as_deref().and_then(|body| {
            let v: serde_json::Value = serde_json::from_str(body).ok()?;
            let result = v["data"]["result"].as_array()?;
            assert!(result.len() <= 1, "{query} selects {} series: {body}", result.len());
            result.first()?["value"][1].as_str()?.parse::<f64>().ok()
        }) {
            return value;
        }
        assert!(Instant::now() < deadline, "prometheus never answered {query}: {answer:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn prometheus_scrapes_sluice_up_and_promql_reads_the_stall_fraction() {
    let Some(prometheus) = prometheus() else {
        eprintln!("SKIPPED prometheus_scrapes_sluice_up_and_promql_reads_the_stall_fraction: no prometheus on PATH");
        return;
    };
    let _watchdog = watchdog("prometheus_scrapes_sluice_up_and_promql_reads_the_stall_fraction", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let metrics = free_addr();
    let port = metrics.rsplit(':').next().unwrap().to_string();
    let root_arg = root.to_str().unwrap();
    let _up = sluice(&[
        "up",
        "--workers",
        "1",
        "--threads",
        "1",
        "--listen",
        &addr,
        "--allow-root",
        root_arg,
        "--metrics-port",
        &port,
    ]);

    // A trainer that takes 10 ms per batch: it waits for some batches, not for all.
    let mut loader = RemoteLoader::connect(&spec(&root, 5), options(&addr, "promql")).unwrap();
    let mut keys = Vec::new();
    for b in loader.iter() {
        keys.extend(b.unwrap().keys);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_exactly_once(keys, "the epoch");
    wait_for_heartbeat(&metrics, IMAGES.div_ceil(BATCH));
    drop(loader); // its last heartbeat stands from here on
    std::thread::sleep(Duration::from_millis(1000));
    let served = metric_value(&http_get(&metrics), "sluice_client_stall_fraction");
    assert!(served > 0.0 && served < 1.0, "a non-trivial stall fraction: {served}");

    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: sluice\n    \
             static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let web = free_addr();
    let mut cmd = Command::new(prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address={web}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    die_with_parent(&mut cmd);
    let _prometheus = Proc(cmd.spawn().unwrap());

    let deadline = Instant::now() + Duration::from_secs(60);
    assert_eq!(promql(&web, "up{job=\"sluice\"}", deadline), 1.0, "the scrape of sluice up failed");
    let queried = promql(&web, "sluice_client_stall_fraction{job=\"sluice\",job_id=\"1\"}", deadline);
    assert_eq!(queried, served, "PromQL reads {queried}, the endpoint serves {served}");
    // PromQL over it, not only the raw sample: the worst client's stall.
    assert_eq!(promql(&web, "max(sluice_client_stall_fraction)", deadline), served);
    let batches = promql(&web, "sum(sluice_client_batches_total)", deadline);
    assert_eq!(batches, metric_value(&http_get(&metrics), "sluice_client_batches_total"));
}
