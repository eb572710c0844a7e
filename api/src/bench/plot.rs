//! Charts of benchmark results, drawn with plotters as SVG or PNG (by the file's extension)
//! with an embedded DejaVu Sans, so they look the same on every machine: line charts of
//! labelled series (sweeps, speculation, latency distributions) and bar charts.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Series colours, distinguishable in print.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

const SIZE: (u32, u32) = (760, 460);

fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        [FontStyle::Normal, FontStyle::Bold]
            .into_iter()
            .all(|style| register_font_bytes(style).is_ok())
    });
    if ok {
        Ok(())
    } else {
        bail!("the embedded font could not be loaded")
    }
}

fn register_font_bytes(style: FontStyle) -> Result<(), ()> {
    let bytes = match style {
        FontStyle::Bold => dejavu::sans::bold(),
        _ => dejavu::sans::regular(),
    };
    plotters::style::register_font("sans-serif", style, bytes).map_err(|_| ())
}

/// A line chart: what it shows and its series.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Plot x on a log2 axis (labels show the original values).
    pub log2_x: bool,
    /// `(label, points)`.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// Put the legend in the upper right corner (for falling lines) instead of the left.
    pub legend_right: bool,
}

/// A chart that can be drawn on any plotters backend.
trait Chart {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> anyhow::Result<()>;
}

/// Draws `chart` to `path`: PNG for a `.png` name, SVG otherwise.
fn render(chart: &impl Chart, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if is_png {
        chart.draw_on(BitMapBackend::new(path, SIZE).into_drawing_area())
    } else {
        chart.draw_on(SVGBackend::new(path, SIZE).into_drawing_area())
    }
}

impl LineChart {
    /// Draws the chart to `path` (`.png` for a bitmap, anything else SVG).
    pub fn draw(&self, path: &Path) -> anyhow::Result<()> {
        render(self, path)
    }
}

impl Chart for LineChart {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a chart: {e:?}");
        let transform = |x: f64| if self.log2_x { x.max(1e-9).log2() } else { x };
        let points = self.series.iter().flat_map(|(_, p)| p.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &(x, y) in points {
            x0 = x0.min(transform(x));
            x1 = x1.max(transform(x));
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            bail!("nothing to plot in '{}'", self.title);
        }
        if !self.log2_x {
            x0 = x0.min(0.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        root.fill(&WHITE).map_err(fail)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(fail)?;
        let log2 = self.log2_x;
        let x_format = move |x: &f64| {
            if log2 {
                format!("{}", 2f64.powf(*x).round())
            } else {
                format!("{x}")
            }
        };
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&x_format)
            .x_labels(if log2 { (x1 - x0) as usize + 1 } else { 10 })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(fail)?;
        for (i, (label, points)) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let line: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (transform(x), y)).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(fail)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(fail)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .position(if self.legend_right {
                SeriesLabelPosition::UpperRight
            } else {
                SeriesLabelPosition::UpperLeft
            })
            .draw()
            .map_err(fail)?;
        root.present().map_err(fail)?;
        Ok(())
    }
}

/// A bar chart: one labelled value per bar, the value printed above it.
#[derive(Debug, Clone)]
pub struct BarChart {
    /// Caption.
    pub title: String,
    /// Y axis label.
    pub y_label: String,
    /// `(label, value)`.
    pub bars: Vec<(String, f64)>,
}

impl BarChart {
    /// Draws the chart to `path` (`.png` for a bitmap, anything else SVG).
    pub fn draw(&self, path: &Path) -> anyhow::Result<()> {
        if self.bars.is_empty() {
            bail!("nothing to plot in '{}'", self.title);
        }
        render(self, path)
    }
}

impl Chart for BarChart {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a chart: {e:?}");
        let top = self.bars.iter().map(|b| b.1).fold(0.0, f64::max);
        let top = if top > 0.0 { top * 1.2 } else { 1.0 };
        root.fill(&WHITE).map_err(fail)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(20)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..self.bars.len() as f64, 0.0..top)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(&self.y_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(fail)?;
        for (i, (label, value)) in self.bars.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let x = i as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x + 0.15, 0.0), (x + 0.85, *value)],
                    color.filled(),
                )))
                .map_err(fail)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{label}: {value:.2}"),
                    (x + 0.15, value + top * 0.03),
                    ("sans-serif", 13),
                )))
                .map_err(fail)?;
        }
        root.present().map_err(fail)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_written_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let chart = LineChart {
            title: "throughput".into(),
            x_label: "concurrency".into(),
            y_label: "tok/s".into(),
            log2_x: true,
            legend_right: false,
            series: vec![
                ("on".into(), vec![(1.0, 10.0), (2.0, 18.0), (4.0, 30.0)]),
                ("off".into(), vec![(1.0, 8.0), (2.0, 15.0), (4.0, 26.0)]),
            ],
        };
        let svg = dir.path().join("c.svg");
        chart.draw(&svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        assert!(text.contains("throughput") && text.contains("concurrency"));
        assert!(text.contains("<polyline"), "lines are drawn");
        let png = dir.path().join("c.png");
        chart.draw(&png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let bars = BarChart {
            title: "MAT".into(),
            y_label: "tokens per step".into(),
            bars: vec![("none".into(), 1.0), ("recycling".into(), 1.6)],
        };
        let bar_svg = dir.path().join("b.svg");
        bars.draw(&bar_svg).unwrap();
        let text = std::fs::read_to_string(&bar_svg).unwrap();
        assert!(
            text.contains("recycling: 1.60") && text.contains("<rect"),
            "{text}"
        );
        let empty = LineChart {
            series: vec![],
            ..chart
        };
        assert!(empty.draw(&dir.path().join("e.svg")).is_err());
    }
}
