//! A small SVG writer for grouped bar charts.
//!
//! Written directly rather than with a plotting crate: a bar chart is a few
//! dozen elements, and the plotting crates need a font stack (fontconfig) to
//! lay out text, which a fresh machine does not have.

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

/// Draws `groups` x `series` bars; `value(group, series)` gives each height
/// on a scale from 0 to `max`; `label` formats values.
pub fn grouped_bars(
    title: &str,
    groups: &[String],
    series: &[String],
    value: impl Fn(usize, usize) -> f64,
    max: f64,
    label: fn(f64) -> String,
) -> String {
    let (left, top, plot_h, bar_w, gap): (f64, f64, f64, f64, f64) = (60.0, 40.0, 300.0, 18.0, 24.0);
    let group_w = bar_w * series.len() as f64 + gap;
    // The legend fits the longest series name (about 6.5 px per character at
    // 11 px): `stm@combine-polling=winner` ran off a fixed margin.
    let longest = series.iter().map(|s| s.chars().count()).max().unwrap_or(0) as f64;
    let width = left + group_w * groups.len() as f64 + 20.0 + 18.0 + 6.5 * longest + 20.0;
    let height = (top + plot_h + 60.0).max(top + 16.0 * series.len() as f64 + 20.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for tick in 0..=4 {
        let v = max * tick as f64 / 4.0;
        let y = top + plot_h - plot_h * tick as f64 / 4.0;
        svg.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            left + group_w * groups.len() as f64,
            left - 6.0,
            y + 4.0,
            escape(&label(v))
        ));
    }
    for (g, group) in groups.iter().enumerate() {
        let x0 = left + gap / 2.0 + group_w * g as f64;
        for s in 0..series.len() {
            let v = value(g, s).max(0.0);
            let h = plot_h * (v / max).min(1.0);
            let x = x0 + bar_w * s as f64;
            svg.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\">\
                 <title>{} {}: {}</title></rect>\n",
                top + plot_h - h,
                bar_w - 2.0,
                PALETTE[s % PALETTE.len()],
                escape(group),
                escape(&series[s]),
                escape(&label(v))
            ));
        }
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            x0 + bar_w * series.len() as f64 / 2.0,
            top + plot_h + 18.0,
            escape(group)
        ));
    }
    let legend_x = left + group_w * groups.len() as f64 + 20.0;
    for (s, name) in series.iter().enumerate() {
        let y = top + 16.0 * s as f64;
        svg.push_str(&format!(
            "<rect x=\"{legend_x:.1}\" y=\"{y:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            PALETTE[s % PALETTE.len()],
            legend_x + 18.0,
            y + 10.0,
            escape(name)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legend_fits_long_series_names() {
        let width = |series: &[String]| {
            let svg = grouped_bars("t", &["g".to_string()], series, |_, _| 1.0, 1.0, |v| format!("{v}"));
            let w = svg.split("width=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
            w.parse::<f64>().unwrap()
        };
        let short = width(&["stm".to_string()]);
        let long = width(&["stm".to_string(), "stm@combine-polling=winner@pipeline=1".to_string()]);
        // The second bar adds 18 px; the rest is room for the name.
        assert!(long - short - 18.0 > 6.0 * 30.0, "{short} -> {long}");
    }

    #[test]
    fn chart_has_a_bar_per_cell_and_escapes_text() {
        let svg = grouped_bars(
            "a < b",
            &["read".into(), "write".into()],
            &["stm".into(), "atm".into(), "2q".into()],
            |g, s| (g + s) as f64 / 4.0,
            1.0,
            |v| format!("{v:.2}"),
        );
        assert_eq!(svg.matches("<rect x=").count(), 6 + 3, "6 bars and 3 legend swatches");
        assert!(svg.contains("a &lt; b"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
