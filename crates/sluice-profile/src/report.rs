//! The report of `sluice profile`: a text table for the terminal, and one self-contained
//! HTML file (no network: styles and SVG plots drawn by `plotters` are inline).

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::{ProfileError, Row};

type Result<T> = std::result::Result<T, ProfileError>;

const SIZE: (u32, u32) = (720, 400);

/// A plotters error while drawing `plot`.
fn failed(plot: &'static str) -> impl Fn(&dyn std::fmt::Display) -> ProfileError {
    move |e| ProfileError::Plot { plot, message: e.to_string() }
}

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

fn x_range(rows: &[Row]) -> std::ops::Range<f64> {
    let max = rows.iter().map(|r| r.units).max().unwrap_or(1) as f64;
    0.0..max + 1.0
}

fn throughput_plot(rows: &[Row], unit: &str) -> Result<String> {
    let plot_err = failed("throughput");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(&e))?;
        let ymax = rows.iter().map(|r| r.images_per_s).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("Throughput vs {unit}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range(rows), 0.0..ymax)
            .map_err(|e| plot_err(&e))?;
        chart.configure_mesh().x_desc(unit).y_desc("images/s").draw().map_err(|e| plot_err(&e))?;
        let points: Vec<(f64, f64)> = rows.iter().map(|r| (r.units as f64, r.images_per_s)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))
            .map_err(|e| plot_err(&e))?
            .label("images/s")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 5, BLUE.filled()))).map_err(|e| plot_err(&e))?;
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(|e| plot_err(&e))?;
        root.present().map_err(|e| plot_err(&e))?;
    }
    Ok(svg)
}

/// Stacked per-op CPU time per image at each setting (total CPU per image in a workers
/// sweep, where the ops are in other processes).
fn op_cpu_plot(rows: &[Row], unit: &str) -> Result<String> {
    let plot_err = failed("CPU per op");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(&e))?;
        let per_op = rows.iter().any(|r| !r.ops.is_empty());
        // CPU time from the counters (task-clock); busy wall time where there are none.
        let op_cpu = |r: &Row, o: &crate::OpRow| {
            o.counters.as_ref().map_or(o.busy_us_per_image, |c| c.task_clock_ns as f64 / 1e3 / r.images.max(1) as f64)
        };
        let height = |r: &Row| {
            if per_op {
                r.ops.iter().map(|o| op_cpu(r, o)).sum::<f64>()
            } else {
                1e6 * r.cpu_s_per_image
            }
        };
        let ymax = rows.iter().map(height).fold(1.0, f64::max) * 1.25;
        let caption = if per_op { "CPU time per image, stacked by op" } else { "CPU time per image, all processes" };
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range(rows), 0.0..ymax)
            .map_err(|e| plot_err(&e))?;
        chart.configure_mesh().x_desc(unit).y_desc("CPU µs / image").draw().map_err(|e| plot_err(&e))?;
        let bar = |x: f64, y0: f64, y1: f64, color: RGBColor| {
            Rectangle::new([(x - 0.3, y0), (x + 0.3, y1)], color.mix(0.85).filled())
        };
        if per_op {
            let ops: Vec<&str> =
                rows.iter().flat_map(|r| r.ops.iter().map(|o| o.op.as_str())).take(rows[0].ops.len()).collect();
            for (i, op) in ops.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let color = RGBColor(color.0, color.1, color.2);
                let bars: Vec<_> = rows
                    .iter()
                    .filter_map(|r| {
                        let below: f64 = r.ops.iter().take(i).map(|o| op_cpu(r, o)).sum();
                        let v = op_cpu(r, r.ops.get(i)?);
                        Some(bar(r.units as f64, below, below + v, color))
                    })
                    .collect();
                chart
                    .draw_series(bars)
                    .map_err(|e| plot_err(&e))?
                    .label(*op)
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
            }
        } else {
            let bars: Vec<_> = rows.iter().map(|r| bar(r.units as f64, 0.0, 1e6 * r.cpu_s_per_image, BLUE)).collect();
            chart
                .draw_series(bars)
                .map_err(|e| plot_err(&e))?
                .label("all processes")
                .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], BLUE.filled()));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(|e| plot_err(&e))?;
        root.present().map_err(|e| plot_err(&e))?;
    }
    Ok(svg)
}

/// One counter per op vs the setting: instructions per image where the machine has a PMU,
/// page faults per image otherwise; context switches per image in a workers sweep has no
/// per-op data, so it shows images per CPU-second instead.
fn counter_plot(rows: &[Row], unit: &str) -> Result<String> {
    let plot_err = failed("counter");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(&e))?;
        let hardware =
            rows.iter().flat_map(|r| &r.ops).any(|o| o.counters.as_ref().is_some_and(|c| c.instructions.is_some()));
        let per_op = rows.iter().flat_map(|r| &r.ops).any(|o| o.counters.is_some());
        let value = |r: &Row, i: usize| -> Option<f64> {
            let c = r.ops.get(i)?.counters.as_ref()?;
            let v = if hardware { c.instructions? } else { c.page_faults };
            Some(v as f64 / r.images.max(1) as f64)
        };
        let (caption, ylabel) = match (per_op, hardware) {
            (true, true) => ("Instructions per image, by op", "instructions / image"),
            (true, false) => ("Page faults per image, by op (software counter; no PMU)", "page faults / image"),
            (false, _) => ("Images per CPU-second", "images / CPU-s"),
        };
        let series: Vec<(String, Vec<(f64, f64)>)> = if per_op {
            (0..rows[0].ops.len())
                .map(|i| {
                    let pts = rows.iter().filter_map(|r| Some((r.units as f64, value(r, i)?))).collect();
                    (rows[0].ops[i].op.clone(), pts)
                })
                .collect()
        } else {
            let pts = rows.iter().map(|r| (r.units as f64, 1.0 / r.cpu_s_per_image.max(1e-12))).collect();
            vec![("images / CPU-s".to_string(), pts)]
        };
        let ymax = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.25;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range(rows), 0.0..ymax)
            .map_err(|e| plot_err(&e))?;
        chart.configure_mesh().x_desc(unit).y_desc(ylabel).draw().map_err(|e| plot_err(&e))?;
        for (i, (name, pts)) in series.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let color = RGBColor(color.0, color.1, color.2);
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|e| plot_err(&e))?;
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| plot_err(&e))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(|e| plot_err(&e))?;
        root.present().map_err(|e| plot_err(&e))?;
    }
    Ok(svg)
}
