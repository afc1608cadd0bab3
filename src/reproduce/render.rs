//! `REPORT.md` and `report.html` from a [`Report`]: per experiment the
//! findings table (claim | paper | iopath | holds?), the measured values,
//! the chart and the explanation, and the machine it ran on.

use super::{DataTable, Finding, Machine, Report, Section, chart};
use crate::error::{Error, Result};
use std::path::Path;

/// Writes `REPORT.md`, `report.html` and `<key>.svg` per experiment into `dir`.
pub fn write_all(report: &Report, dir: &Path) -> Result<()> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| Error::Target { action: "write", path, source })
    };
    for s in &report.sections {
        write(&format!("{}.svg", s.key), chart::svg(&s.chart))?;
    }
    write("REPORT.md", markdown(report))?;
    write("report.html", html(report))
}

fn summary(report: &Report) -> (usize, usize) {
    let all: Vec<bool> = report.sections.iter().flat_map(|s| s.findings.iter().map(|f| f.holds)).collect();
    (all.iter().filter(|h| **h).count(), all.len())
}

/// The findings that did not hold, each with its experiment.
pub fn failed(report: &Report) -> Vec<(&Section, &Finding)> {
    report.sections.iter().flat_map(|s| s.findings.iter().filter(|f| !f.holds).map(move |f| (s, f))).collect()
}

/// The most likely reason `finding` of `section` did not hold here: the
/// finding's own (`why_not`), where the experiment could say, else the first
/// sentence of the experiment's explanation, which says what on this machine
/// differs from the paper's (its device, its wake-ups, its CPUs).
pub fn likely_reason(machine: &Machine, section: &Section, finding: &Finding) -> String {
    if !finding.why_not.is_empty() {
        return finding.why_not.clone();
    }
    let text = section.explanation.trim();
    let first = text.find(". ").map_or(text, |end| &text[..=end]);
    match machine.wake_ns {
        // Where a wake-up costs more than a fast device's I/O, every comparison of
        // sleeping and spinning turns on it: say it beside the section's own account.
        Some(wake) if wake >= EXPENSIVE_WAKE_NS && !machine.idle_polling => format!(
            "{first} On this machine a wake-up of a sleeping thread on another CPU takes {:.0} us (idle CPUs halt; \
             `iopath doctor` measures it): every request a sleeping policy waits for pays that.",
            wake / 1e3
        ),
        _ => first.to_string(),
    }
}

/// A cross-CPU wake-up this slow (ns) is named among the likely reasons.
const EXPENSIVE_WAKE_NS: f64 = 10_000.0;

fn machine_line(report: &Report) -> String {
    let m = &report.machine;
    format!(
        "iopath {} on Linux {}, {} CPU(s), {}{}{}{}",
        m.version,
        m.kernel,
        m.cpus,
        m.date,
        if m.idle_polling { "; idle CPUs polled instead of halting (--idle-poll: cheap wake-ups)" } else { "" },
        m.wake_ns.map_or(String::new(), |w| format!("; a cross-CPU wake-up took {:.0} us", w / 1e3)),
        if report.quick { "; --quick (short runs: figures are noisier)" } else { "" }
    )
}

/// The report as Markdown (charts as the SVG files beside it).
pub fn markdown(report: &Report) -> String {
    let (held, total) = summary(report);
    let mut out = format!(
        "# iopath reproduce\n\n{}\n\n{held} of {total} findings hold here. Each verdict is computed from the \
         measurements by the rule under its row.\n\n",
        machine_line(report)
    );
    let failed = failed(report);
    if !failed.is_empty() {
        out.push_str("## Did not hold here\n\n| experiment | finding | paper | iopath | most likely reason |\n|---|---|---|---|---|\n");
        for (s, f) in &failed {
            out.push_str(&format!(
                "| [`{}`](#{}) | {}<br><sub>rule: {}</sub> | {} | {} | {} |\n",
                s.key,
                s.key,
                f.claim,
                f.rule,
                f.paper,
                f.iopath,
                likely_reason(&report.machine, s, f)
            ));
        }
        out.push('\n');
    }
    for s in &report.sections {
        out.push_str(&format!(
            "<a id=\"{}\"></a>\n\n## {} (`{}`)\n\nPaper: {}.  \nRun: {}.\n\n",
            s.key, s.title, s.key, s.source, s.setup
        ));
        out.push_str("| finding | paper | iopath | holds? |\n|---|---|---|---|\n");
        for f in &s.findings {
            out.push_str(&format!(
                "| {}<br><sub>rule: {}</sub> | {} | {} | {} |\n",
                f.claim,
                f.rule,
                f.paper,
                f.iopath,
                if f.holds { "yes" } else { "**no**" }
            ));
        }
        out.push_str(&format!("\n![{}]({}.svg)\n\n{}\n\n", s.chart.title, s.key, s.explanation));
        for t in &s.tables {
            out.push_str(&table_md(t));
            out.push('\n');
        }
    }
    out
}

fn table_md(t: &DataTable) -> String {
    let mut out = if t.caption.is_empty() { String::new() } else { format!("{}\n\n", t.caption) };
    out.push_str(&format!("| {} |\n|{}\n", t.columns.join(" | "), "---|".repeat(t.columns.len())));
    for row in &t.rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The report as one self-contained HTML page (charts inline).
pub fn html(report: &Report) -> String {
    let (held, total) = summary(report);
    let mut out = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>iopath reproduce</title><style>\
         body{font-family:sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
         table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;\
         text-align:left;vertical-align:top}th{background:#f4f4f4}.yes{color:#0a6b2d;font-weight:bold}\
         .no{color:#b00020;font-weight:bold}.rule{color:#666;font-size:12px}svg{max-width:100%;height:auto}\
         .meta{color:#555}</style></head><body>\n<h1>iopath reproduce</h1>\n",
    );
    out.push_str(&format!(
        "<p class=\"meta\">{}</p><p>{held} of {total} findings hold here. Each verdict is computed from the \
         measurements by the rule under its row.</p>\n",
        esc(&machine_line(report))
    ));
    let failed = failed(report);
    if !failed.is_empty() {
        out.push_str(
            "<h2>Did not hold here</h2><table><tr><th>experiment</th><th>finding</th><th>paper</th><th>iopath</th>\
             <th>most likely reason</th></tr>\n",
        );
        for (s, f) in &failed {
            out.push_str(&format!(
                "<tr><td><a href=\"#{}\">{}</a></td><td>{}<div class=\"rule\">rule: {}</div></td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>\n",
                s.key,
                esc(&s.key),
                esc(&f.claim),
                esc(&f.rule),
                esc(&f.paper),
                esc(&f.iopath),
                esc(&likely_reason(&report.machine, s, f))
            ));
        }
        out.push_str("</table>\n");
    }
    for s in &report.sections {
        out.push_str(&format!(
            "<h2 id=\"{}\">{}</h2><p class=\"meta\">Paper: {}.<br>Run: {}.</p>\n",
            s.key,
            esc(&s.title),
            esc(&s.source),
            esc(&s.setup)
        ));
        out.push_str("<table><tr><th>finding</th><th>paper</th><th>iopath</th><th>holds?</th></tr>\n");
        for f in &s.findings {
            out.push_str(&format!(
                "<tr><td>{}<div class=\"rule\">rule: {}</div></td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>\n",
                esc(&f.claim),
                esc(&f.rule),
                esc(&f.paper),
                esc(&f.iopath),
                if f.holds { "yes" } else { "no" },
                if f.holds { "yes" } else { "no" }
            ));
        }
        out.push_str("</table>\n");
        let svg = chart::svg(&s.chart);
        // Inline: drop the XML prologue if any, keep the <svg> element.
        out.push_str(&svg[svg.find("<svg").unwrap_or(0)..]);
        out.push_str(&format!("\n<p>{}</p>\n", esc(&s.explanation)));
        for t in &s.tables {
            if !t.caption.is_empty() {
                out.push_str(&format!("<p>{}</p>", esc(&t.caption)));
            }
            out.push_str("<table><tr>");
            for c in &t.columns {
                out.push_str(&format!("<th>{}</th>", esc(c)));
            }
            out.push_str("</tr>\n");
            for row in &t.rows {
                out.push_str("<tr>");
                for cell in row {
                    out.push_str(&format!("<td>{}</td>", esc(cell)));
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</table>\n");
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::{Chart, ChartKind, Machine};

    fn finding(claim: &str, holds: bool) -> Finding {
        Finding {
            claim: claim.into(),
            paper: "2x".into(),
            iopath: "1.1x".into(),
            holds,
            rule: "at least 1.5x".into(),
            why_not: String::new(),
        }
    }

    fn section(key: &str, findings: Vec<Finding>) -> Section {
        Section {
            key: key.into(),
            title: format!("The {key} experiment"),
            source: "seed 000".into(),
            setup: "a run".into(),
            explanation: format!("Wake-ups cost {key} here. More text follows."),
            tables: vec![],
            findings,
            chart: Chart {
                kind: ChartKind::Bars,
                title: "t".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                x_log2: false,
                categories: vec![],
                series: vec![],
                reference: None,
            },
        }
    }

    #[test]
    fn the_findings_that_did_not_hold_come_first_with_a_reason() {
        let report = Report {
            machine: Machine {
                kernel: "6.18".into(),
                cpus: 2,
                date: "today".into(),
                version: "0".into(),
                idle_polling: false,
                wake_ns: None,
            },
            quick: true,
            sections: vec![
                section("alpha", vec![finding("alpha holds", true)]),
                section("beta", vec![finding("beta merges", false), finding("beta polls", true)]),
            ],
        };
        let failed = failed(&report);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].1.claim, "beta merges");
        assert_eq!(likely_reason(&report.machine, failed[0].0, failed[0].1), "Wake-ups cost beta here.");
        let mut own = failed[0].1.clone();
        own.why_not = "Its own reason.".into();
        assert_eq!(likely_reason(&report.machine, failed[0].0, &own), "Its own reason.");
        // An expensive wake-up is named beside the section's account, unless idle CPUs polled.
        let mut slow = report.machine.clone();
        slow.wake_ns = Some(25_000.0);
        let reason = likely_reason(&slow, failed[0].0, failed[0].1);
        assert!(reason.starts_with("Wake-ups cost beta here. ") && reason.contains("takes 25 us"), "{reason}");
        assert_eq!(likely_reason(&slow, failed[0].0, &own), "Its own reason.");
        slow.idle_polling = true;
        assert_eq!(likely_reason(&slow, failed[0].0, failed[0].1), "Wake-ups cost beta here.");
        for doc in [markdown(&report), html(&report)] {
            let top = doc.find("Did not hold here").expect("a list of what did not hold");
            let listed = doc.find("beta merges").unwrap();
            let first_section = doc.find("The alpha experiment").unwrap();
            assert!(top < listed && listed < first_section, "{doc}");
            assert!(doc[top..first_section].contains("Wake-ups cost beta here."), "{doc}");
            assert!(!doc[top..first_section].contains("alpha holds"), "{doc}");
        }
        let all_held = Report { sections: vec![section("alpha", vec![finding("a", true)])], ..report };
        assert!(!markdown(&all_held).contains("Did not hold"));
    }
}
