//! `sluice profile --sweep`: a real sweep over thread counts and worker processes; the
//! table's numbers hang together, and the HTML report's plots render in headless Chromium.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// `sluice profile spec.json --sweep SWEEP --json`: the table, and what it said on stderr.
fn profile(dir: &Path, sweep: &str, report: &str) -> (Vec<serde_json::Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["profile", "spec.json", "--sweep", sweep, "--report", report, "--json"])
        .current_dir(dir)
        .env("SLUICE_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    (rows, stderr)
}

/// Pixels of the screenshot exactly `rgb`.
fn count_color(rgb: &[u8], color: [u8; 3]) -> usize {
    rgb.chunks_exact(3).filter(|p| *p == color).count()
}

/// Drawn SVG elements (`<rect`, `<circle`, `<polyline`, `<path`, `<line`) inside the figure
/// with id `id` of a DOM dump.
fn drawn_in(dom: &str, id: &str) -> usize {
    let start = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no figure {id}"));
    let end = start + dom[start..].find("</figure>").unwrap();
    let fig = &dom[start..end];
    assert!(fig.contains("<svg"), "figure {id} holds no svg");
    ["<rect", "<circle", "<polyline", "<path", "<line"].iter().map(|t| fig.matches(t).count()).sum()
}

#[test]
fn profile_sweeps_threads_and_its_html_report_renders_in_chromium() {
    let _watchdog = watchdog("sluice profile --sweep threads", 180);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    std::fs::write(dir.path().join("spec.json"), spec(&root, 3).to_json_string().unwrap()).unwrap();

    let (rows, stderr) = profile(dir.path(), "threads=1,2", "report.html");
    assert!(stderr.contains("[1/2] run 0: 1 threads") && stderr.contains("[2/2] run 0: 2 threads"), "{stderr}");
    assert_eq!(rows.len(), 2);
    for (r, units) in rows.iter().zip([1, 2]) {
        assert_eq!(r["units"], units);
        assert_eq!(r["images"], IMAGES, "one measured epoch");
        assert!(r["images_per_s"].as_f64().unwrap() > 0.0 && r["cpu_s_per_image"].as_f64().unwrap() > 0.0);
        let ops = r["ops"].as_array().unwrap();
        assert_eq!(ops[0]["op"], "read");
        assert!(ops.len() >= 3, "read, decode+crop and more: {ops:?}");
        for o in ops {
            let (p50, p99) = (o["p50_us"].as_f64().unwrap(), o["p99_us"].as_f64().unwrap());
            assert!(p50 > 0.0 && p50 <= p99, "{o}");
            let c = &o["counters"];
            // Counters run on the worker threads, at op boundaries: an op's CPU time can
            // not exceed its wall time (plus one counter read, a few µs, more on a loaded machine).
            let cpu_ns = c["task_clock_ns"].as_u64().unwrap() as f64 / IMAGES as f64;
            let wall_ns = 1e3 * o["busy_us_per_image"].as_f64().unwrap();
            assert!(cpu_ns <= 1.05 * wall_ns + 100_000.0, "{o}");
            assert!(c["source"] != "perf_hardware" || c["cycles"].as_u64().unwrap() > 0, "{o}");
        }
        let decode = &ops[1]["counters"];
        assert!(decode["task_clock_ns"].as_u64().unwrap() > 0, "decoding takes CPU: {decode}");
    }
    assert!(rows[1]["gain_pct"].is_number() && rows[0]["gain_pct"].is_null());

    let report = dir.path().join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(!html.contains("<script src") && !html.contains("<link"), "self-contained: nothing fetched");
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED the Chromium half of this test: no chromium on PATH");
        return;
    };
    let url = format!("file://{}", report.display());
    let headless = |what: &[&str]| headless(&browser, dir.path(), &url, 1000, what);
    let dom = headless(&["--dump-dom"]);
    assert!(dom.contains("id=\"knee\""), "{dom}");
    for fig in ["throughput", "op-cpu", "counter"] {
        let n = drawn_in(&dom, fig);
        assert!(n >= 10, "figure {fig}: only {n} drawn elements");
    }
    let png = dir.path().join("report.png");
    headless(&[&format!("--screenshot={}", png.display()), "--window-size=1280,3200"]);
    let mut rgb = Vec::new();
    let (w, h) = sluice_codec::decode_png(&std::fs::read(&png).unwrap(), 1 << 24, &mut rgb).unwrap();
    assert_eq!((w, h), (1280, 3200));
    // The chart writer (sluice_profile::chart) draws each plot's first series in plotters'
    // Palette99 colour 0 (230, 25, 75): the throughput line and its points, and the first
    // op's counter line and points (its stacked CPU bar is that colour mixed with white).
    // A page without the plots has none of it.
    let first = count_color(&rgb, [230, 25, 75]);
    assert!(first > 300, "the throughput and counter plots drew {first} pixels of the first series' colour");
    eprintln!("plot pixels: {first} of the first series' colour");
    let white = count_color(&rgb, [255, 255, 255]);
    assert!(white < rgb.len() / 3 * 98 / 100, "the page is blank");
}

#[test]
fn profile_sweeps_service_workers() {
    let _watchdog = watchdog("sluice profile --sweep workers", 180);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let mut s = spec(&root, 4);
    s.threads = 2.into();
    std::fs::write(dir.path().join("spec.json"), s.to_json_string().unwrap()).unwrap();
    let (rows, stderr) = profile(dir.path(), "workers=1,2", "workers.html");
    assert!(stderr.contains("[2/2] run 0: 2 workers"), "{stderr}");
    assert_eq!(rows.len(), 2);
    for (r, units) in rows.iter().zip([1, 2]) {
        assert_eq!((r["unit"].as_str(), r["units"].as_u64()), (Some("workers"), Some(units)));
        assert_eq!(r["images"], IMAGES, "every image of the measured epoch came back");
        // Worker processes and the dispatcher count too: more than this process alone.
        assert!(r["images_per_s"].as_f64().unwrap() > 0.0 && r["cpu_s_per_image"].as_f64().unwrap() > 0.0);
    }
    let html = std::fs::read_to_string(dir.path().join("workers.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("Throughput vs workers"));
}
