//! The report of `sluice profile`: a text table for the terminal, and one self-contained
//! HTML file (no network: styles and the SVG plots of [`crate::chart`] are inline).

use std::fmt::Write as _;

use crate::chart::{self, Panel, Series};
use crate::{ProfileError, Row};

type Result<T> = std::result::Result<T, ProfileError>;

const SIZE: (u32, u32) = (720, 400);

/// The terminal's table: one line per setting, then its ops.
pub fn text_table(rows: &[Row], knee: Option<usize>) -> String {
    let mut s = String::new();
    let Some(first) = rows.first() else { return s };
    let unit = first.unit.name();
    let _ = writeln!(s, "{unit:>8} {:>10} {:>7} {:>14}", "images/s", "gain", "CPU-ms/image");
    for r in rows {
        let gain = r.gain_pct.map_or("-".to_string(), |g| format!("{g:+.1}%"));
        let _ = writeln!(s, "{:>8} {:>10.0} {gain:>7} {:>14.2}", r.units, r.images_per_s, 1e3 * r.cpu_s_per_image);
        for o in &r.ops {
            let counters = o.counters.as_ref().map_or(String::new(), |c| {
                let per = |v: u64| v as f64 / r.images.max(1) as f64;
                let mut t = format!(
                    "  task-clock {:.0} us/img, {:.2} faults/img, {:.3} switches/img",
                    per(c.task_clock_ns) / 1e3,
                    per(c.page_faults),
                    per(c.context_switches)
                );
                if let (Some(cy), Some(ins)) = (c.cycles, c.instructions) {
                    let _ = write!(t, ", IPC {:.2}", ins as f64 / cy.max(1) as f64);
                }
                t
            });
            let _ = writeln!(
                s,
                "           {:<28} busy {:>8.0} us/img  p50 {:>7.0} us  p99 {:>7.0} us{counters}",
                o.op, o.busy_us_per_image, o.p50_us, o.p99_us
            );
        }
    }
    match knee {
        Some(k) => {
            let _ = writeln!(s, "knee: {k} {unit} (past it, one more adds < 3% throughput, or the sweep ends)");
        }
        None => {
            let _ = writeln!(s, "knee: none (no settings)");
        }
    }
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The whole report, one HTML document.
pub fn html(spec: &str, rows: &[Row], knee: Option<usize>) -> Result<String> {
    let unit = rows.first().map_or("units", |r| r.unit.name());
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>sluice profile {t}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:80em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}th{{background:#eee}}\
         td.op{{text-align:left}}figure{{display:inline-block;margin:1em}}</style></head><body>\n\
         <h1>sluice profile {t}</h1>\n",
        t = escape(spec)
    );
    let knee_text = knee.map_or("none".to_string(), |k| format!("{k} {unit}"));
    let _ = writeln!(
        h,
        "<p id=\"knee\">Knee: <b>{knee_text}</b> (the setting past which one more unit adds less than 3% throughput; the last setting if every step paid).</p>"
    );
    let _ = writeln!(
        h,
        "<table id=\"summary\"><tr><th>{unit}</th><th>images/s</th><th>gain</th><th>CPU-ms/image</th><th>images</th><th>seconds</th></tr>"
    );
    for r in rows {
        let gain = r.gain_pct.map_or("-".to_string(), |g| format!("{g:+.1}%"));
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{:.0}</td><td>{gain}</td><td>{:.2}</td><td>{}</td><td>{:.2}</td></tr>",
            r.units,
            r.images_per_s,
            1e3 * r.cpu_s_per_image,
            r.images,
            r.seconds
        );
    }
    h.push_str("</table>\n");
    if rows.iter().any(|r| !r.ops.is_empty()) {
        h.push_str(
            "<h2>Per op</h2><table id=\"ops\"><tr><th>units</th><th>op</th><th>busy µs/image</th><th>p50 µs</th>\
             <th>p99 µs</th><th>task-clock µs/image</th><th>page faults/image</th><th>context switches/image</th>\
             <th>IPC</th><th>cache misses/image</th><th>branch misses/image</th></tr>\n",
        );
        for r in rows {
            for o in &r.ops {
                let per = |v: u64| v as f64 / r.images.max(1) as f64;
                let c = o.counters.as_ref();
                let opt = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"op\">{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    r.units,
                    escape(&o.op),
                    o.busy_us_per_image,
                    o.p50_us,
                    o.p99_us,
                    opt(c.map(|c| per(c.task_clock_ns) / 1e3), 0),
                    opt(c.map(|c| per(c.page_faults)), 2),
                    opt(c.map(|c| per(c.context_switches)), 3),
                    opt(c.and_then(|c| Some(c.instructions? as f64 / c.cycles?.max(1) as f64)), 2),
                    opt(c.and_then(|c| c.cache_misses.map(per)), 1),
                    opt(c.and_then(|c| c.branch_misses.map(per)), 1),
                );
            }
        }
        h.push_str("</table>\n");
        if let Some(src) = rows.iter().flat_map(|r| &r.ops).find_map(|o| o.counters.as_ref().map(|c| c.source)) {
            let _ = writeln!(
                h,
                "<p>Counters from: <code>{src:?}</code> (hardware counters need a PMU; a VM often has none).</p>"
            );
        }
    } else {
        h.push_str("<p>The ops ran in the worker processes: per-op time is in their metrics and traces.</p>\n");
    }
    for (id, svg) in [
        ("throughput", throughput_plot(rows, unit)?),
        ("op-cpu", op_cpu_plot(rows, unit)?),
        ("counter", counter_plot(rows, unit)?),
    ] {
        let _ = writeln!(h, "<figure id=\"{id}\">{svg}</figure>");
    }
    h.push_str("</body></html>\n");
    Ok(h)
}

fn points(rows: &[Row], value: impl Fn(&Row) -> Option<f64>) -> Vec<(f64, f64)> {
    rows.iter().filter_map(|r| Some((r.units as f64, value(r)?))).collect()
}

fn plot(title: &str, unit: &str, y: &str, series: Vec<Series>) -> Result<String> {
    let panel = Panel { title: title.into(), x: unit.into(), y: y.into(), series, log_x: false };
    chart::svg(&[panel], SIZE)
}

fn throughput_plot(rows: &[Row], unit: &str) -> Result<String> {
    let measured = Series::marked("images/s", points(rows, |r| Some(r.images_per_s)));
    plot(&format!("Throughput vs {unit}"), unit, "images/s", vec![measured])
}

/// Stacked per-op CPU time per image at each setting (total CPU per image in a workers
/// sweep, where the ops are in other processes).
fn op_cpu_plot(rows: &[Row], unit: &str) -> Result<String> {
    // CPU time from the counters (task-clock); busy wall time where there are none.
    let op_cpu = |r: &Row, o: &crate::OpRow| {
        o.counters.as_ref().map_or(o.busy_us_per_image, |c| c.task_clock_ns as f64 / 1e3 / r.images.max(1) as f64)
    };
    let Some(first) = rows.first().filter(|r| !r.ops.is_empty()) else {
        let all = Series::bars("all processes", points(rows, |r| Some(1e6 * r.cpu_s_per_image)));
        return plot("CPU time per image, all processes", unit, "CPU µs / image", vec![all]);
    };
    let series = (0..first.ops.len())
        .map(|i| Series::bars(first.ops[i].op.clone(), points(rows, |r| Some(op_cpu(r, r.ops.get(i)?)))))
        .collect();
    plot("CPU time per image, stacked by op", unit, "CPU µs / image", series)
}

/// One counter per op vs the setting: instructions per image where the machine has a PMU,
/// page faults per image otherwise; a workers sweep has no per-op data, so it shows images
/// per CPU-second instead.
fn counter_plot(rows: &[Row], unit: &str) -> Result<String> {
    let hardware =
        rows.iter().flat_map(|r| &r.ops).any(|o| o.counters.as_ref().is_some_and(|c| c.instructions.is_some()));
    let per_op = rows.iter().flat_map(|r| &r.ops).any(|o| o.counters.is_some());
    let value = |r: &Row, i: usize| -> Option<f64> {
        let c = r.ops.get(i)?.counters.as_ref()?;
        let v = if hardware { c.instructions? } else { c.page_faults };
        Some(v as f64 / r.images.max(1) as f64)
    };
    let (title, ylabel) = match (per_op, hardware) {
        (true, true) => ("Instructions per image, by op", "instructions / image"),
        (true, false) => ("Page faults per image, by op (software counter; no PMU)", "page faults / image"),
        (false, _) => ("Images per CPU-second", "images / CPU-s"),
    };
    let series = match rows.first() {
        Some(first) if per_op => (0..first.ops.len())
            .map(|i| Series::marked(first.ops[i].op.clone(), points(rows, |r| value(r, i))))
            .collect(),
        _ => vec![Series::marked("images / CPU-s", points(rows, |r| Some(1.0 / r.cpu_s_per_image.max(1e-12))))],
    };
    plot(title, unit, ylabel, series)
}
