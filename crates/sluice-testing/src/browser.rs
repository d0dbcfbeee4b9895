//! Headless Chromium, for tests of the pages sluice serves and writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The text of the first element after `marker` (an `id="…"` or `class="…"` attribute).
pub fn shown<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no {marker} in the page:\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    rest[start..start + end].trim()
}

/// The number [`shown`] at `marker`.
pub fn shown_number(dom: &str, marker: &str) -> f64 {
    let text = shown(dom, marker);
    text.parse().unwrap_or_else(|_| panic!("{marker} shows {text:?}, not a number"))
}

/// Debian's `chromium` (or another Chromium on PATH).
pub fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name)))
        .find(|p| p.is_file())
}

/// Runs headless Chromium on `url` with a profile of its own under `dir`, letting the
/// page run for `budget_ms` of virtual time first; returns its stdout.
pub fn headless(browser: &Path, dir: &Path, url: &str, budget_ms: u64, what: &[&str]) -> String {
    let out = Command::new(browser)
        .args(["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile").display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8(out.stdout).unwrap()
}
