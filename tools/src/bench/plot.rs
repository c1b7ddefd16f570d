//! SVG plots of all-reduce results: busbw against size (log2 axis), one line per mode,
//! and the link-rate bound as a dashed line where there is one.
//!
//! plotters' SVG backend without font crates: labels are SVG `<text>`
//! elements that the viewer draws, so no system fonts are needed here.
use crate::bench::report::Row;
use plotters::prelude::*;
use std::path::Path;
use tally_engine::host::units::format_size;

/// One line: (bytes per rank, busbw in GB/s) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line: a bound in busbw GB/s.
pub struct Bound {
    pub label: String,
    pub busbw_gbps: f64,
}

/// One series per mode, in the order the modes first appear.
pub fn series_by_mode(rows: &[Row], suffix: &str) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let label = format!("{}{suffix}", r.mode);
        let i = match out.iter().position(|s| s.label == label) {
            Some(i) => i,
            None => {
                out.push(Series { label, points: Vec::new() });
                out.len() - 1
            }
        };
        out[i].points.push((r.bytes as f64, r.busbw_gbps));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Writes busbw against size (log x axis) to `path` as SVG.
pub fn busbw_svg(path: &Path, title: &str, series: &[Series], bounds: &[Bound]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, 0f64, 0f64);
    for &(x, y) in pts {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymax = ymax.max(y);
    }
    if xmax <= 0.0 {
        return Err(format!("plot {}: nothing to plot", path.display()));
    }
    for b in bounds {
        ymax = ymax.max(b.busbw_gbps);
    }
    // x is log2(bytes), so that ticks fall on powers of two.
    let (xmin, xmax) = (xmin.log2() - 0.5, xmax.log2() + 0.5);
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(xmin..xmax, 0f64..ymax * 1.15)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("bytes per rank")
        .y_desc("busbw (GB/s)")
        .x_labels(((xmax - xmin).ceil() as usize + 1).min(16))
        .x_label_formatter(&|x| if (x - x.round()).abs() < 1e-9 { format_size(2f64.powf(x.round()) as u64) } else { String::new() })
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().map(|&(x, y)| (x.log2(), y)), c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|&(x, y)| Circle::new((x.log2(), y), 3, c.filled()))).map_err(|e| err(&e))?;
    }
    for (i, b) in bounds.iter().enumerate() {
        let c = COLORS[i % COLORS.len()].mix(0.6);
        let y = b.busbw_gbps;
        chart
            .draw_series(DashedLineSeries::new(vec![(xmin, y), (xmax, y)], 8, 6, c.stroke_width(1)))
            .map_err(|e| err(&e))?
            .label(b.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
