//! A local loader's dashboard on request (`sluice run --dashboard`) in a real browser:
//! headless Chromium loads the page from a running `sluice run` whose threads autoscale,
//! and the numbers it shows are the loader's metrics endpoint's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::*;
use sluice_core::{ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, Threads};

#[test]
fn local_loader_dashboard_in_headless_chromium_shows_its_metrics() {
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED local_loader_dashboard_in_headless_chromium_shows_its_metrics: no chromium on PATH");
        return;
    };
    let _watchdog = watchdog("local_loader_dashboard_in_headless_chromium_shows_its_metrics", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let mut s = spec(&root, 3);
    s.threads = Threads::Auto;
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 28),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_string(&s).unwrap()).unwrap();
    let addr = free_addr();
    let epochs = 3;
    let _run = sluice(&[
        "run",
        spec_path.to_str().unwrap(),
        "--epochs",
        &epochs.to_string(),
        "--dashboard",
        &addr,
        "--dashboard-hold-s",
        "60",
    ]);

    // Wait for the run to finish its epochs: from then on the numbers hold still.
    let batches = (epochs * IMAGES.div_ceil(BATCH)) as f64;
    let t0 = Instant::now();
    let metrics = loop {
        let text = http_get(&addr);
        if metric_value(&text, "sluice_loader_batches_total") >= batches {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the run did not finish 3 epochs in 60 s:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(metric_value(&metrics, "sluice_loader_batches_total"), batches);

    let dom = headless(&browser, dir.path(), &format!("http://{addr}/"), 4000, &["--dump-dom"]);
    let after = http_get(&addr);
    for name in ["sluice_loader_batches_total", "sluice_loader_stall_fraction", "sluice_loader_threads"] {
        assert_eq!(metric_value(&after, name), metric_value(&metrics, name), "{name} moved while the page loaded");
    }
    assert_eq!(shown(&dom, "id=\"role\""), "loader");
    assert_eq!(shown_number(&dom, "id=\"workers-live\""), 1.0);
    assert_eq!(shown_number(&dom, "id=\"batches-consumed\""), batches);
    assert_eq!(shown_number(&dom, "class=\"batches\""), batches);
    let stall = metric_value(&metrics, "sluice_loader_stall_fraction");
    let page_stall = shown_number(&dom, "id=\"stall-fraction\"");
    assert!((page_stall - stall).abs() <= 0.5e-4, "the page shows stall {page_stall}, the metrics {stall}");
    let hit_rate = metric_value(&metrics, "sluice_loader_cache_hit_rate");
    assert!(hit_rate > 0.5, "epochs 2 and 3 hit the cache: {hit_rate}");
    let page_hits = shown_number(&dom, "id=\"cache-hit-rate\"");
    assert!((page_hits - hit_rate).abs() <= 0.5e-4, "the page shows hit rate {page_hits}, the metrics {hit_rate}");
    // threads = "auto": the page names the policy and the threads the metrics report.
    let threads = metric_value(&metrics, "sluice_loader_threads");
    assert_eq!(shown(&dom, "id=\"autoscale\""), format!("policy fastmatch, {threads} units"));
    assert_eq!(shown_number(&dom, "class=\"tasks-running\""), threads);

    let png = dir.path().join("dashboard.png");
    let screenshot = format!("--screenshot={}", png.display());
    headless(
        &browser,
        dir.path(),
        &format!("http://{addr}/dashboard"),
        3000,
        &[&screenshot, "--window-size=1280,1400"],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "screenshot of {} bytes", bytes.len());
}
