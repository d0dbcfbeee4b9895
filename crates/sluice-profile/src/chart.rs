//! The project's one chart writer: SVG line and bar charts drawn by `plotters` (no network,
//! no fonts to ship), for the profile report and the benchmarks' plots. A figure is a few
//! panels stacked vertically, each panel a few labelled series.

use std::collections::HashMap;
use std::path::Path;

use plotters::prelude::*;

use crate::ProfileError;

/// The size of one panel in a figure written to a file, in pixels.
pub const PANEL: (u32, u32) = (820, 300);

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A bare line (a reference, e.g. linear scaling).
    Line,
    /// A staircase: each value holds until the next point (e.g. unit counts over time).
    Steps,
    /// A line with each point marked (measured values).
    Marked,
    /// A bar at each point; the bar series of a panel stack in the order given.
    Bars,
}

/// One labelled series of (x, y) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

impl Series {
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, style: Style::Line }
    }

    pub fn steps(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { style: Style::Steps, ..Self::line(label, points) }
    }

    pub fn marked(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { style: Style::Marked, ..Self::line(label, points) }
    }

    pub fn bars(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { style: Style::Bars, ..Self::line(label, points) }
    }
}

/// One chart: a title, axis names and its series (the y axis starts at 0).
pub struct Panel {
    pub title: String,
    pub x: String,
    pub y: String,
    pub series: Vec<Series>,
    /// Log-2 x axis (for counts 1, 2, 4 ... 64).
    pub log_x: bool,
}

fn staircase(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// Each bar series' bars as (x, bottom, top), stacked on the bar series before it.
fn stacked(panel: &Panel) -> Vec<Vec<(f64, f64, f64)>> {
    let mut base: HashMap<u64, f64> = HashMap::new();
    panel
        .series
        .iter()
        .map(|s| {
            if s.style != Style::Bars {
                return Vec::new();
            }
            s.points
                .iter()
                .map(|&(x, y)| {
                    let below = base.entry(x.to_bits()).or_insert(0.0);
                    let bar = (x, *below, *below + y);
                    *below += y;
                    bar
                })
                .collect()
        })
        .collect()
}

fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, panel: &Panel) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let bars = stacked(panel);
    let all = || panel.series.iter().flat_map(|s| s.points.iter().copied());
    let (x0, x1) = range(all().map(|p| p.0));
    let tops = bars.iter().flatten().map(|b| b.2);
    let (_, y1) = range(all().map(|p| p.1).chain(tops));
    if !x0.is_finite() {
        return Ok(());
    }
    let x = |v: f64| if panel.log_x { v.max(1e-9).log2() } else { v };
    let (x0, x1) = (x(x0), x(x1));
    // Bars are 60% of the narrowest gap between two x values wide (0.6 with one x value).
    let mut xs: Vec<f64> = bars.iter().flatten().map(|b| x(b.0)).collect();
    xs.sort_by(f64::total_cmp);
    let gap = xs.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > 1e-9).fold(1.0, f64::min);
    let half = 0.3 * gap;
    let pad = ((x1 - x0) * 0.03).max(0.1).max(if xs.is_empty() { 0.0 } else { 1.5 * half });
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(x0 - pad..x1 + pad, 0.0..(y1 * 1.15).max(1.0))
        .map_err(|e| err(&e))?;
    let log_x = panel.log_x;
    // On a log-2 axis only whole powers of two get a label.
    let label = |v: &f64| match (log_x, (v - v.round()).abs() < 1e-6) {
        (true, true) => format!("{:.0}", v.round().exp2()),
        (true, false) => String::new(),
        (false, _) => format!("{v:.0}"),
    };
    chart
        .configure_mesh()
        .x_labels(if log_x { 20 } else { 10 })
        .x_desc(panel.x.as_str())
        .y_desc(panel.y.as_str())
        .x_label_formatter(&label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (s, bars)) in panel.series.iter().zip(&bars).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let color = RGBColor(color.0, color.1, color.2);
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(a, b)| (x(a), b)).collect();
        if s.style == Style::Bars {
            let rects = bars.iter().map(|&(bx, lo, hi)| {
                Rectangle::new([(x(bx) - half, lo), (x(bx) + half, hi)], color.mix(0.85).filled())
            });
            chart
                .draw_series(rects)
                .map_err(|e| err(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
            continue;
        }
        let line = if s.style == Style::Steps { staircase(&pts) } else { pts.clone() };
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        if s.style == Style::Marked {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

fn draw_all<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, panels: &[Panel]) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len().max(1), 1))) {
        draw(&area, panel).map_err(|e| format!("{}: {e}", panel.title))?;
    }
    root.present().map_err(|e| e.to_string())
}

fn figure_size(panels: &[Panel], panel: (u32, u32)) -> (u32, u32) {
    (panel.0, panel.1 * panels.len().max(1) as u32)
}

/// `panels` stacked into one SVG document, each `panel` pixels (width, height).
pub fn svg(panels: &[Panel], panel: (u32, u32)) -> Result<String, ProfileError> {
    let mut out = String::new();
    draw_all(SVGBackend::with_string(&mut out, figure_size(panels, panel)).into_drawing_area(), panels)
        .map_err(|message| ProfileError::Chart { what: "an SVG figure".into(), message })?;
    Ok(out)
}

/// Writes `panels` stacked into one SVG file at `path`, each panel [`PANEL`] pixels.
pub fn write_svg(path: &Path, panels: &[Panel]) -> Result<(), ProfileError> {
    draw_all(SVGBackend::new(path, figure_size(panels, PANEL)).into_drawing_area(), panels)
        .map_err(|message| ProfileError::Chart { what: path.display().to_string(), message })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_staircase_holds_each_value_until_the_next_point() {
        assert_eq!(
            staircase(&[(0.0, 1.0), (2.0, 3.0), (5.0, 2.0)]),
            vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0), (5.0, 2.0)]
        );
    }

    #[test]
    fn bar_series_stack_on_the_bar_series_before_them() {
        let panel = Panel {
            title: "t".into(),
            x: "x".into(),
            y: "y".into(),
            series: vec![
                Series::bars("decode", vec![(1.0, 3.0), (2.0, 4.0)]),
                Series::line("reference", vec![(1.0, 100.0)]),
                Series::bars("crop", vec![(1.0, 1.0), (2.0, 2.0)]),
            ],
            log_x: false,
        };
        let s = stacked(&panel);
        assert_eq!(s[0], vec![(1.0, 0.0, 3.0), (2.0, 0.0, 4.0)]);
        assert!(s[1].is_empty());
        assert_eq!(s[2], vec![(1.0, 3.0, 4.0), (2.0, 4.0, 6.0)]);
    }

    #[test]
    fn a_figure_has_one_titled_panel_per_panel_and_every_series_label() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.svg");
        let panels = [
            Panel {
                title: "units".into(),
                x: "s".into(),
                y: "units".into(),
                series: vec![
                    Series::steps("fastmatch", vec![(0.0, 1.0), (3.0, 4.0)]),
                    Series::line("oracle", vec![(0.0, 4.0)]),
                ],
                log_x: false,
            },
            Panel {
                title: "scaling".into(),
                x: "workers".into(),
                y: "img/s".into(),
                series: vec![
                    Series::marked("measured", vec![(1.0, 10.0), (64.0, 500.0)]),
                    Series::bars("cpu", vec![(1.0, 5.0), (64.0, 50.0)]),
                ],
                log_x: true,
            },
        ];
        write_svg(&path, &panels).unwrap();
        let file = std::fs::read_to_string(&path).unwrap();
        assert_eq!(file, svg(&panels, PANEL).unwrap(), "the file and the string are one drawing");
        // plotters writes each text on a line of its own.
        let texts: Vec<&str> = file.lines().map(str::trim).collect();
        for text in ["units", "scaling", "fastmatch", "oracle", "measured", "cpu", "1", "64"] {
            assert!(texts.contains(&text), "{text} missing from the SVG");
        }
    }
}
