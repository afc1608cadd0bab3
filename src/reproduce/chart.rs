//! Charts as SVG, drawn with plotters: lines where the x axis is a quantity,
//! grouped bars where it is a category. Axes carry units, the legend sits
//! in a band of its own under the plot so it never covers data.

use super::{Chart, ChartKind};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

const WIDTH: u32 = 760;
const PLOT_HEIGHT: u32 = 380;
const LEGEND_ROW: u32 = 22;

/// Colours that stay apart for people with the common colour-vision deficiencies (Okabe-Ito).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(100, 100, 100),
];

/// The chart as a standalone SVG document.
pub fn svg(chart: &Chart) -> String {
    let legend_rows = chart.series.len().div_ceil(3) as u32;
    let height = PLOT_HEIGHT + 20 + legend_rows * LEGEND_ROW;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        // Drawing into a String cannot fail for want of room or a file; errors would be bugs.
        let _ = draw(chart, &root);
        let _ = root.present();
    }
    out
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Draws each series as a line with its points marked, and the reference
/// line across `x_span`, on a chart whose x axis is linear or logarithmic.
fn lines<DB: DrawingBackend, X: Ranged<ValueType = f64>>(
    c: &mut ChartContext<'_, DB, Cartesian2d<X, RangedCoordf64>>,
    chart: &Chart,
    x_span: (f64, f64),
) -> Option<()> {
    for (si, s) in chart.series.iter().enumerate() {
        c.draw_series(LineSeries::new(s.points.clone(), colour(si).stroke_width(2))).ok()?;
        c.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, colour(si).filled()))).ok()?;
    }
    if let Some(r) = chart.reference {
        c.draw_series(LineSeries::new(vec![(x_span.0, r), (x_span.1, r)], BLACK.mix(0.5))).ok()?;
    }
    Some(())
}

/// Draws `chart` on `root`; None if plotters refused (a bug: drawing into a String cannot run out of room).
fn draw(chart: &Chart, root: &Area) -> Option<()> {
    root.fill(&WHITE).ok()?;
    let (plot, legend) = root.split_vertically(PLOT_HEIGHT);
    let y_max = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(chart.reference)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.12;
    match chart.kind {
        ChartKind::Bars => {
            let n = chart.categories.len().max(1);
            let mut c = ChartBuilder::on(&plot)
                .caption(&chart.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(48)
                .y_label_area_size(64)
                .build_cartesian_2d(0f64..n as f64, 0f64..y_max)
                .ok()?;
            let categories = chart.categories.clone();
            c.configure_mesh()
                .disable_x_mesh()
                .x_labels(n * 2 + 1)
                .x_label_formatter(&|x| {
                    let i = x.floor() as usize;
                    // One label per category, at its middle.
                    if (x - (i as f64 + 0.5)).abs() < 0.01 {
                        categories.get(i).cloned().unwrap_or_default()
                    } else {
                        String::new()
                    }
                })
                .x_desc(&chart.x_label)
                .y_desc(&chart.y_label)
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .ok()?;
            let groups = chart.series.len().max(1) as f64;
            let width = 0.8 / groups;
            for (si, s) in chart.series.iter().enumerate() {
                let fill = colour(si).filled();
                c.draw_series(s.points.iter().filter(|p| p.1.is_finite()).map(|&(x, y)| {
                    let left = x + 0.1 + si as f64 * width;
                    Rectangle::new([(left, 0.0), (left + width * 0.92, y)], fill)
                }))
                .ok()?;
            }
            if let Some(r) = chart.reference {
                c.draw_series(LineSeries::new(vec![(0.0, r), (n as f64, r)], BLACK.mix(0.5))).ok()?;
            }
        }
        ChartKind::Line => {
            let xs = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
            let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
            let (lo, hi) = if lo.is_finite() { (lo, hi.max(lo + 1.0)) } else { (0.0, 1.0) };
            let caption = ("sans-serif", 18);
            if chart.x_log2 {
                let mut c = ChartBuilder::on(&plot)
                    .caption(&chart.title, caption)
                    .margin(12)
                    .x_label_area_size(48)
                    .y_label_area_size(64)
                    .build_cartesian_2d((lo.max(0.5)..hi * 1.2).log_scale().base(2.0), 0f64..y_max)
                    .ok()?;
                c.configure_mesh()
                    .x_desc(&chart.x_label)
                    .y_desc(&chart.y_label)
                    .axis_desc_style(("sans-serif", 14))
                    .x_label_formatter(&|x| format!("{x:.0}"))
                    .draw()
                    .ok()?;
                lines(&mut c, chart, (lo.max(0.5), hi * 1.2))?;
            } else {
                let pad = (hi - lo) * 0.05;
                let mut c = ChartBuilder::on(&plot)
                    .caption(&chart.title, caption)
                    .margin(12)
                    .x_label_area_size(48)
                    .y_label_area_size(64)
                    .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..y_max)
                    .ok()?;
                c.configure_mesh()
                    .x_desc(&chart.x_label)
                    .y_desc(&chart.y_label)
                    .axis_desc_style(("sans-serif", 14))
                    .draw()
                    .ok()?;
                lines(&mut c, chart, (lo - pad, hi + pad))?;
            }
        }
    }
    // The legend: three entries per row, under the plot.
    let per_row = 3;
    for (i, s) in chart.series.iter().enumerate() {
        let (row, col) = ((i / per_row) as i32, (i % per_row) as i32);
        let x = 80 + col * ((WIDTH as i32 - 100) / per_row as i32);
        let y = 8 + row * LEGEND_ROW as i32;
        legend.draw(&Rectangle::new([(x, y), (x + 18, y + 12)], colour(i).filled())).ok()?;
        legend.draw(&Text::new(s.name.clone(), (x + 26, y), ("sans-serif", 14).into_font())).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::Series;
    use super::*;

    fn chart(kind: ChartKind) -> Chart {
        Chart {
            kind,
            title: "t".into(),
            x_label: "threads".into(),
            y_label: "IOPS (K)".into(),
            x_log2: kind == ChartKind::Line,
            categories: vec!["a".into(), "b".into()],
            series: vec![
                Series { name: "one".into(), points: vec![(0.0, 1.0), (1.0, 2.0)] },
                Series { name: "two".into(), points: vec![(0.0, 3.0), (1.0, f64::NAN)] },
            ],
            reference: Some(1.0),
        }
    }

    #[test]
    fn charts_have_axes_units_and_a_legend() {
        for kind in [ChartKind::Bars, ChartKind::Line] {
            let svg = svg(&chart(kind));
            assert!(svg.starts_with("<svg"), "{svg}");
            for text in ["threads", "IOPS (K)", "one", "two"] {
                assert!(svg.contains(text), "{kind:?} lacks {text}");
            }
        }
    }
}
