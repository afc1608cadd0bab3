//! `iopath reproduce`: the seeds' experiments in one command, the papers'
//! figures beside iopath's, with a verdict per finding and a chart per
//! experiment.
//!
//! An experiment ([`experiments`]) runs `bench` jobs and turns them into a
//! [`Section`]: a data table, the findings (claim, the paper's figure,
//! iopath's, whether it holds and by which rule, all computed from the
//! measurements), a chart and a paragraph. The whole [`Report`] is saved as
//! `results.json`; [`render`] writes `REPORT.md` and a self-contained
//! `report.html` (charts inline, drawn by [`chart`] with plotters) from it,
//! so `iopath report DIR` redraws them without running anything.

pub mod apps;
pub mod chart;
pub mod experiments;
pub mod render;

use crate::bench::run::{BenchConfig, run};
use crate::bench::stats::Measurements;
use crate::error::{Error, Result};
use crate::path::PathSpec;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// One experiment's results, ready to render.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Section {
    /// Its name on the command line (`latency`).
    pub key: String,
    /// Its heading.
    pub title: String,
    /// Where the paper's figures come from.
    pub source: String,
    /// What was run (device, threads, run time).
    pub setup: String,
    /// Why the findings come out as they do here.
    pub explanation: String,
    /// The measured values (the first table is the main one).
    pub tables: Vec<DataTable>,
    /// The paper's claims, checked.
    pub findings: Vec<Finding>,
    /// The picture.
    pub chart: Chart,
}

/// A table of measured values.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DataTable {
    /// What it shows (empty for a section's main table).
    pub caption: String,
    /// Column headings.
    pub columns: Vec<String>,
    /// One row per design or setting.
    pub rows: Vec<Vec<String>>,
}

impl DataTable {
    /// A table without a caption.
    pub fn new(columns: Vec<String>, rows: Vec<Vec<String>>) -> DataTable {
        DataTable { caption: String::new(), columns, rows }
    }
}

/// A claim of a paper and whether it holds here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// The claim.
    pub claim: String,
    /// The paper's figure.
    pub paper: String,
    /// iopath's figure.
    pub iopath: String,
    /// Whether it holds, by `rule`.
    pub holds: bool,
    /// How `holds` is decided from the measurements.
    pub rule: String,
    /// Why it most likely does not hold on this machine, where the
    /// experiment can say (empty: the report falls back to the first sentence
    /// of the experiment's explanation).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why_not: String,
}

/// What kind of chart.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ChartKind {
    /// Lines over a quantity on the x axis.
    Line,
    /// Grouped bars over categories.
    Bars,
}

/// A chart's data.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Chart {
    /// Line or bars.
    pub kind: ChartKind,
    /// The title.
    pub title: String,
    /// The x axis (with unit).
    pub x_label: String,
    /// The y axis (with unit).
    pub y_label: String,
    /// A logarithmic (base 2) x axis.
    pub x_log2: bool,
    /// Bar charts: the categories (x = index).
    pub categories: Vec<String>,
    /// The series.
    pub series: Vec<Series>,
    /// A horizontal reference line (e.g. 1.0 for a ratio), if any.
    pub reference: Option<f64>,
}

/// One line or one colour of bars.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points; for bars x is the category index.
    pub points: Vec<(f64, f64)>,
}

/// Where the report was made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// Kernel release and architecture.
    pub kernel: String,
    /// CPUs online.
    pub cpus: usize,
    /// When (UTC).
    pub date: String,
    /// iopath's version.
    pub version: String,
    /// Idle CPUs polled instead of halting while the experiments ran
    /// (`--idle-poll`, or another process's request): wake-ups were cheap.
    #[serde(default)]
    pub idle_polling: bool,
    /// What waking a sleeping thread on another CPU cost as the experiments
    /// began (ns; `iopath doctor`'s measurement): the likely reason behind
    /// many findings about sleeping and polling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_ns: Option<f64>,
}

impl Machine {
    /// This machine, now.
    pub fn here() -> Machine {
        let (kernel, arch) = crate::sys::kernel_release();
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Machine {
            kernel: format!("{kernel} ({arch})"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            date: crate::units::utc_date(secs),
            version: env!("CARGO_PKG_VERSION").to_string(),
            idle_polling: crate::idle::polling_now(),
            wake_ns: crate::doctor::cross_cpu_wake_ns(),
        }
    }
}

/// Everything `reproduce` found.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Where and when.
    pub machine: Machine,
    /// Whether the runs were the short ones of `--quick`.
    pub quick: bool,
    /// One per experiment, in the order run.
    pub sections: Vec<Section>,
}

impl Report {
    /// Writes `results.json`, `REPORT.md`, `report.html` and one SVG per chart into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Target { action, path, source }
        };
        std::fs::create_dir_all(dir).map_err(io("create the report directory", dir))?;
        let json = serde_json::to_string_pretty(self).expect("a report serializes");
        let file = dir.join("results.json");
        std::fs::write(&file, json).map_err(io("write", &file))?;
        render::write_all(self, dir)
    }

    /// Reads `results.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Report> {
        let file = dir.join("results.json");
        let text = std::fs::read_to_string(&file).map_err(|source| Error::Target {
            action: "read (run `iopath reproduce --out DIR` first)",
            path: file.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            Error::spec("report", file.display().to_string(), format!("not a results.json of iopath reproduce: {e}"))
        })
    }
}

/// How long each run lasts, and which experiments to run.
#[derive(Debug, Clone)]
pub struct ReproduceConfig {
    /// The experiments, by key; empty = all.
    pub experiments: Vec<String>,
    /// Short runs (the whole set in under three minutes on 2 vCPUs).
    pub quick: bool,
}

/// Runs `bench` jobs for the experiments and counts them for progress.
pub struct Runner<'a> {
    /// Each run's length.
    pub runtime: Duration,
    /// Called after every run with (runs done, runs planned).
    pub on_run: &'a mut dyn FnMut(u64, u64),
    done: u64,
    planned: u64,
}

impl Runner<'_> {
    /// Plans `n` more runs (for the progress bar's time left).
    pub fn plan(&mut self, n: u64) {
        self.planned += n;
    }

    /// Counts a run made outside [`Runner::measure`] (the file layer's).
    pub fn tick(&mut self) {
        self.done += 1;
        (self.on_run)(self.done, self.planned.max(self.done));
    }

    /// One run: `path` on `device`, `rw`, `threads` blocking threads, with `hogs` CPU hogs.
    pub fn measure(&mut self, device: &str, path: &str, rw: &str, threads: usize, hogs: usize) -> Result<Measurements> {
        let bench = BenchConfig {
            device: device.to_string(),
            path: PathSpec::parse(path)?.config()?,
            path_name: path.to_string(),
            rw: crate::bench::workload::Rw::parse(rw)?,
            threads,
            runtime: Some(self.runtime),
            size: Some(256 << 20),
            hogs: crate::bench::hogs::HogConfig { count: hogs, duty_pct: 100, cpus: Vec::new() },
            ..BenchConfig::default()
        };
        let result = run(&bench)?;
        self.done += 1;
        (self.on_run)(self.done, self.planned.max(self.done));
        Ok(result.measurements)
    }
}

/// The experiments' keys, in the order `reproduce` runs them.
pub const EXPERIMENTS: &[&str] =
    &["latency", "peak", "threads", "sensitivity", "cpu", "contention", "merge", "aios", "real", "apps"];

/// Runs the experiments; `on_section` is called as each finishes, `on_run`
/// after every run with (done, planned) for the section under way.
pub fn reproduce(
    config: &ReproduceConfig,
    mut on_start: impl FnMut(&str),
    on_run: &mut dyn FnMut(u64, u64),
    mut on_section: impl FnMut(&Section),
) -> Result<Report> {
    let keys: Vec<String> = if config.experiments.is_empty() {
        EXPERIMENTS.iter().map(|s| s.to_string()).collect()
    } else {
        config.experiments.clone()
    };
    for k in &keys {
        if !EXPERIMENTS.contains(&k.as_str()) {
            return Err(Error::spec("experiment", k.clone(), format!("known experiments: {}", EXPERIMENTS.join(", "))));
        }
    }
    // The machine as the experiments begin: its wake-up cost measured after them
    // came out at 0.4 us where it is 20 us (something the runs leave behind).
    let machine = Machine::here();
    let runtime = Duration::from_millis(if config.quick { 200 } else { 1000 });
    let mut sections = Vec::new();
    for key in &keys {
        if crate::signal::interrupted() {
            break;
        }
        on_start(key);
        let mut runner = Runner { runtime, on_run: &mut *on_run, done: 0, planned: 0 };
        let section = experiments::run(key, &mut runner, config.quick)?;
        on_section(&section);
        sections.push(section);
    }
    Ok(Report { machine, quick: config.quick, sections })
}
