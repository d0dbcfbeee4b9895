//! The dispatcher's live dashboard in a real browser: headless Chromium loads the page
//! from a running `sluice up`, and the numbers it shows are the metrics endpoint's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::*;
use sluice_client::RemoteLoader;
use sluice_core::{ByteBudget, CacheLevel, CachePolicyKind, CacheSpec};

/// The value of attribute `name` of the element at `marker`.
fn attribute<'a>(dom: &'a str, marker: &str, name: &str) -> &'a str {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no {marker} in the page:\n{dom}"));
    let element = &dom[dom[..at + 1].rfind('<').unwrap()..];
    let element = &element[..element.find('>').unwrap()];
    let key = format!(" {name}=\"");
    let start = element.find(&key).unwrap_or_else(|| panic!("{marker} has no {name}: {element}")) + key.len();
    &element[start..start + element[start..].find('"').unwrap()]
}

/// The page rounds fractions to 4 decimals.
fn assert_shows(dom: &str, marker: &str, metric: f64) {
    let page = shown_number(dom, marker);
    assert!((page - metric).abs() <= 0.5e-4, "the page shows {page} for {marker}, the metrics {metric}");
}

#[test]
fn dashboard_in_headless_chromium_shows_the_metrics_numbers() {
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED dashboard_in_headless_chromium_shows_the_metrics_numbers: no chromium on PATH");
        return;
    };
    let _watchdog = watchdog("dashboard_in_headless_chromium_shows_the_metrics_numbers", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let metrics = free_addr();
    let port: u16 = metrics.rsplit(':').next().unwrap().parse().unwrap();
    let worker_metrics = format!("127.0.0.1:{}", port + 1);
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
        &port.to_string(),
    ]);

    // Two epochs through a cache: the second one hits.
    let mut s = spec(&root, 7);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 28),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let mut loader = RemoteLoader::connect(&s, options(&addr, "dash")).unwrap();
    for _ in 0..2 {
        assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "an epoch");
    }
    // The client's last heartbeat stands from here on, and the workers' catch up.
    wait_for_heartbeat(&metrics, 2 * IMAGES.div_ceil(BATCH));
    drop(loader);
    std::thread::sleep(Duration::from_millis(1500));

    let before = (http_get(&metrics), http_get(&worker_metrics));
    let dom = headless(&browser, dir.path(), &format!("http://{metrics}/"), 5000, &["--dump-dom"]);
    let (d, w) = (http_get(&metrics), http_get(&worker_metrics));
    let names = [
        "sluice_dispatcher_jobs",
        "sluice_dispatcher_workers_live",
        "sluice_dispatcher_batches_acked_total",
        "sluice_client_batches_total",
        "sluice_client_stall_fraction",
    ];
    for name in names {
        assert_eq!(metric_value(&before.0, name), metric_value(&d, name), "{name} moved while the page loaded");
    }
    let hit_rate = metric_value(&w, "sluice_worker_cache_hit_rate");
    assert_eq!(metric_value(&before.1, "sluice_worker_cache_hit_rate"), hit_rate, "the hit rate moved");

    // The page polled more than once, and drew every panel.
    let polls: u32 = attribute(&dom, "<body", "data-polls").parse().unwrap();
    assert!(polls >= 2, "the page polled {polls} times in 5 s of virtual time:\n{dom}");
    assert_eq!(shown(&dom, "id=\"role\""), "dispatcher");
    let autoscale = shown(&dom, "id=\"autoscale\"");
    assert!(autoscale == "autoscaling off" || autoscale.starts_with("policy "), "autoscale panel: {autoscale:?}");
    for line in ["id=\"line-production\"", "id=\"line-consumption\"", "id=\"line-stall\""] {
        let points = attribute(&dom, line, "points");
        assert!(points.split(' ').count() >= 1 && points.contains(','), "{line} has no points: {points:?}");
    }

    // The numbers are the metrics endpoint's.
    assert_eq!(shown_number(&dom, "id=\"jobs\""), metric_value(&d, "sluice_dispatcher_jobs"));
    assert_eq!(shown_number(&dom, "id=\"workers-live\""), 1.0);
    assert_eq!(shown_number(&dom, "id=\"workers-live\""), metric_value(&d, "sluice_dispatcher_workers_live"));
    let acked = metric_value(&d, "sluice_dispatcher_batches_acked_total");
    assert!(acked >= (2 * IMAGES.div_ceil(BATCH)) as f64, "two epochs acked: {acked}");
    assert_eq!(shown_number(&dom, "id=\"batches-acked\""), acked);
    assert_eq!(shown_number(&dom, "id=\"batches-consumed\""), metric_value(&d, "sluice_client_batches_total"));
    assert_eq!(shown_number(&dom, "id=\"batches-consumed\""), acked, "every acked batch was consumed");
    assert_eq!(shown_number(&dom, "class=\"batches\""), metric_value(&d, "sluice_client_batches_total"));
    let stall = metric_value(&d, "sluice_client_stall_fraction");
    assert!(stall > 0.0 && stall <= 1.0, "stall fraction {stall}");
    assert_shows(&dom, "class=\"stall-fraction\"", stall);
    assert_shows(&dom, "id=\"stall-fraction\"", stall);
    assert!(hit_rate > 0.0, "the second epoch hit the cache: {hit_rate}");
    assert_shows(&dom, "id=\"cache-hit-rate\"", hit_rate);
    assert_eq!(shown(&dom, "class=\"name\""), "dash");

    let png = dir.path().join("dashboard.png");
    let screenshot = format!("--screenshot={}", png.display());
    headless(
        &browser,
        dir.path(),
        &format!("http://{metrics}/dashboard"),
        3000,
        &[&screenshot, "--window-size=1280,1400"],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "screenshot of {} bytes", bytes.len());
    eprintln!("screenshot: {}", png.display());
    // Kept for a look when asked: SLUICE_DASHBOARD_SCREENSHOT=/some/path.png
    if let Some(keep) = std::env::var_os("SLUICE_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}
