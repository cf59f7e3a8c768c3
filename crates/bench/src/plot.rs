//! A PNG plot of cumulative distributions (creation→Running), drawn with plotters' bitmap
//! backend. Text needs a TrueType font: the first DejaVu/Liberation sans found in the usual
//! system font directories is registered; without one the plot is drawn without labels.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use plotters::prelude::*;

/// Font files tried for labels, relative to the system font directories.
const FONTS: &[&str] = &[
    "truetype/dejavu/DejaVuSans.ttf",
    "TTF/DejaVuSans.ttf",
    "dejavu/DejaVuSans.ttf",
    "truetype/liberation/LiberationSans-Regular.ttf",
];
const FONT_DIRS: &[&str] = &["/usr/share/fonts", "/usr/local/share/fonts"];

/// Registers a system font as "sans-serif"; false when none is found.
fn register_font() -> bool {
    for dir in FONT_DIRS {
        for font in FONTS {
            if let Ok(bytes) = std::fs::read(Path::new(dir).join(font)) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
    }
    false
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes the CDF of each `(name, samples)` series to `path` (x: seconds, y: fraction).
pub fn cdf_png(path: &Path, title: &str, series: &[(String, Vec<Duration>)]) -> anyhow::Result<()> {
    let labels = register_font();
    let max_s = series
        .iter()
        .flat_map(|(_, s)| s.iter())
        .map(Duration::as_secs_f64)
        .fold(0.0_f64, f64::max)
        .max(0.1)
        * 1.05;
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).context("plot background")?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if labels {
        builder
            .caption(title, ("sans-serif", 22))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..max_s, 0.0..1.0)
        .context("plot axes")?;
    let mut mesh = chart.configure_mesh();
    if labels {
        mesh.x_desc("VM create request → VMI Running seen by a watch (s)")
            .y_desc("fraction of VMIs")
            .label_style(("sans-serif", 15));
    } else {
        mesh.disable_x_mesh().disable_y_mesh();
    }
    mesh.draw().context("plot mesh")?;
    for (i, (name, samples)) in series.iter().enumerate() {
        let mut sorted: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let points: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
            .chain(
                sorted
                    .iter()
                    .enumerate()
                    .flat_map(|(k, x)| [(*x, k as f64 / n), (*x, (k + 1) as f64 / n)]),
            )
            .collect();
        let color = COLORS[i % COLORS.len()];
        let line = chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .context("plot series")?;
        if labels {
            line.label(format!("{name} (n = {})", samples.len()))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
    }
    if labels {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .context("plot legend")?;
    }
    root.present().context("writing the PNG")?;
    Ok(())
}
