//! Line plots as SVG files for the benchmarks (`plotters`, no network, no fonts to ship):
//! one figure of panels stacked vertically, each panel a few labelled series.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

const PANEL: (u32, u32) = (820, 300);

pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn as a staircase (a value that holds until the next point), e.g. unit counts.
    pub steps: bool,
    /// Marks each point (measured values), rather than a bare line (a reference).
    pub marks: bool,
}

impl Series {
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, steps: false, marks: false }
    }

    pub fn steps(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { steps: true, ..Self::line(label, points) }
    }

    pub fn marked(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { marks: true, ..Self::line(label, points) }
    }
}

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

/// Writes `panels` stacked into one SVG file at `path`.
pub fn write_svg(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let size = (PANEL.0, PANEL.1 * panels.len().max(1) as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    let failed = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len().max(1), 1))) {
        let all = || panel.series.iter().flat_map(|s| s.points.iter().copied());
        let (x0, x1) = range(all().map(|p| p.0));
        let (_, y1) = range(all().map(|p| p.1));
        if !x0.is_finite() {
            continue;
        }
        let (x0, x1) = if panel.log_x { (x0.max(1e-9).log2(), x1.max(1e-9).log2()) } else { (x0, x1) };
        let pad = ((x1 - x0) * 0.03).max(0.1);
        let x = |v: f64| if panel.log_x { v.max(1e-9).log2() } else { v };
        let mut chart = ChartBuilder::on(&area)
            .caption(&panel.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(x0 - pad..x1 + pad, 0.0..(y1 * 1.12).max(1.0))
            .map_err(|e| failed(&e))?;
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
            .map_err(|e| failed(&e))?;
        for (i, s) in panel.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let color = RGBColor(color.0, color.1, color.2);
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(a, b)| (x(a), b)).collect();
            let line = if s.steps { staircase(&pts) } else { pts.clone() };
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))
                .map_err(|e| failed(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            if s.marks {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| failed(&e))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| failed(&e))?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staircase_holds_each_value_until_the_next_point() {
        assert_eq!(
            staircase(&[(0.0, 1.0), (2.0, 3.0), (5.0, 2.0)]),
            vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0), (5.0, 2.0)]
        );
    }

    #[test]
    fn a_figure_has_one_titled_panel_per_panel_and_every_series_label() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
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
                series: vec![Series::marked("measured", vec![(1.0, 10.0), (64.0, 500.0)])],
                log_x: true,
            },
        ];
        write_svg(&path, &panels).unwrap_or_else(|e| panic!("{e}"));
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        // plotters writes each text on a line of its own.
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        for text in ["units", "scaling", "fastmatch", "oracle", "measured", "1", "64"] {
            assert!(texts.contains(&text), "{text} missing from the SVG");
        }
    }
}
