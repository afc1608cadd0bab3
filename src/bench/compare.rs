//! `compare`: a matrix of paths x workloads on one device, run side by side.
//!
//! Every cell is one [`run`](fn@super::run) with the same device spec, block
//! size, threads and run time; with `repeat` > 1 the run whose throughput is
//! the median is kept. Throughput is normalized to a baseline path (the
//! seed's Table 7 normalizes to `scsi-intr`), and shown as a share of the
//! device's peak bandwidth (seed 003's table).

use super::report::{format_count, format_ns, job_json};
use super::run::{BenchConfig, BenchResult, run};
use super::workload::Rw;
use crate::error::Result;
use serde_json::{Value, json};

/// One cell's outcome.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Path name as shown.
    pub path: String,
    /// Workload.
    pub rw: Rw,
    /// The kept run.
    pub result: BenchResult,
    /// Total throughput of every repetition, in run order.
    pub repeats_iops: Vec<f64>,
}

/// Throughput within this share of the fastest counts as "as fast" when the
/// advice looks for the path that costs the least CPU.
pub const AS_FAST: f64 = 0.95;

/// A p99 counts as "lowest" only for a path whose p99.9 is at most this many
/// times its p99.
pub const STEADY_TAIL: u64 = 10;

/// Which path to use for one workload, from the measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The workload.
    pub rw: Rw,
    /// The path with the highest throughput.
    pub fastest: String,
    /// Among paths with at least [`AS_FAST`] of the fastest's throughput, the
    /// one with the least CPU per I/O.
    pub frugal: String,
    /// The path with the lowest p99 latency among those whose p99.9 is at most
    /// [`STEADY_TAIL`] times their p99 (any path, if none is).
    pub lowest_p99: String,
    /// A path with a still lower p99 whose p99.9 is not steady (named so that
    /// the advice says why it was passed over).
    pub lowest_p99_unsteady: Option<String>,
    /// The path with the lowest p99.9 latency: with more threads than CPUs a
    /// spinning path can have the lowest p99 and starve one request in a
    /// thousand for a time slice.
    pub lowest_p99_9: String,
}

/// A finished comparison.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Paths in the order given.
    pub paths: Vec<String>,
    /// Workloads in the order given.
    pub workloads: Vec<Rw>,
    /// Cells, workload-major.
    pub cells: Vec<Cell>,
    /// The path throughput is normalized to, if it was run.
    pub baseline: Option<String>,
    /// Cells the matrix has; fewer ran if it was interrupted.
    pub planned: usize,
    /// Ctrl-C or SIGTERM ended the comparison early: `cells` holds what ran
    /// (the last one possibly cut short).
    pub interrupted: bool,
}

/// Runs every (path, workload) pair. `configs` gives one bench config per
/// path (its name in `path_name`), all else equal; `on_cell` is called after
/// each cell (for progress).
pub fn compare(
    configs: &[BenchConfig],
    workloads: &[Rw],
    repeat: usize,
    baseline: &str,
    mut on_cell: impl FnMut(&Cell, usize, usize),
) -> Result<Comparison> {
    let total = configs.len() * workloads.len();
    let mut cells = Vec::with_capacity(total);
    'matrix: for &rw in workloads {
        for config in configs {
            if crate::signal::interrupted() {
                break 'matrix;
            }
            let config = BenchConfig { rw, ..config.clone() };
            let mut runs = Vec::new();
            for _ in 0..repeat.max(1) {
                match run(&config) {
                    Ok(result) => runs.push(result),
                    // Interrupted before it measured anything (while laying out): nothing to keep.
                    Err(crate::Error::Interrupted { .. }) => break 'matrix,
                    Err(e) => return Err(e),
                }
                if crate::signal::interrupted() {
                    break;
                }
            }
            let repeats_iops: Vec<f64> = runs.iter().map(|r| r.measurements.total_iops()).collect();
            runs.sort_by(|a, b| a.measurements.total_iops().total_cmp(&b.measurements.total_iops()));
            let result = runs.swap_remove(runs.len() / 2);
            let cell = Cell { path: config.path_name.clone(), rw, result, repeats_iops };
            on_cell(&cell, cells.len() + 1, total);
            cells.push(cell);
        }
    }
    let paths: Vec<String> = configs.iter().map(|c| c.path_name.clone()).collect();
    let baseline = paths.iter().find(|p| p.as_str() == baseline).cloned();
    let interrupted = crate::signal::interrupted();
    Ok(Comparison { paths, workloads: workloads.to_vec(), cells, baseline, planned: total, interrupted })
}

/// A latency quantile of a cell, both directions together (`u64::MAX` if it has none).
fn latency_quantile(cell: &Cell, q: f64) -> u64 {
    let lat = cell.result.measurements.latency_histogram();
    if lat.is_empty() { u64::MAX } else { lat.value_at_quantile(q) }
}

impl Comparison {
    /// The cell of a path and workload.
    pub fn cell(&self, path: &str, rw: Rw) -> Option<&Cell> {
        self.cells.iter().find(|c| c.path == path && c.rw == rw)
    }

    /// Throughput of a cell relative to the baseline path on the same workload.
    pub fn normalized(&self, cell: &Cell) -> Option<f64> {
        let base = self.cell(self.baseline.as_deref()?, cell.rw)?;
        let b = base.result.measurements.total_iops();
        (b > 0.0).then(|| cell.result.measurements.total_iops() / b)
    }

    /// Which path to use, per workload.
    pub fn advice(&self) -> Vec<Advice> {
        let p99 = |c: &Cell| latency_quantile(c, 0.99);
        let p99_9 = |c: &Cell| latency_quantile(c, 0.999);
        let iops = |c: &Cell| c.result.measurements.total_iops();
        self.workloads
            .iter()
            .filter_map(|&rw| {
                let cells: Vec<&Cell> = self.cells.iter().filter(|c| c.rw == rw).collect();
                let fastest = cells.iter().copied().max_by(|a, b| iops(a).total_cmp(&iops(b)))?;
                let frugal = cells
                    .iter()
                    .copied()
                    .filter(|c| iops(c) >= AS_FAST * iops(fastest))
                    .min_by(|a, b| {
                        a.result.measurements.cpu_ns_per_io().total_cmp(&b.result.measurements.cpu_ns_per_io())
                    })
                    .unwrap_or(fastest);
                // A p99 means little when the same path's p99.9 is far above it (with
                // more threads than CPUs a spinning path can answer 99% of requests at
                // once and starve the rest for a scheduler slice): prefer a steady tail.
                let steady = |c: &&Cell| p99_9(c) <= STEADY_TAIL * p99(c).max(1);
                let lowest_any = cells.iter().copied().min_by_key(|c| p99(c))?;
                let lowest = cells.iter().copied().filter(steady).min_by_key(|c| p99(c)).unwrap_or(lowest_any);
                let lowest_tail = cells.iter().copied().min_by_key(|c| p99_9(c))?;
                Some(Advice {
                    rw,
                    fastest: fastest.path.clone(),
                    frugal: frugal.path.clone(),
                    lowest_p99: lowest.path.clone(),
                    lowest_p99_unsteady: (lowest_any.path != lowest.path).then(|| lowest_any.path.clone()),
                    lowest_p99_9: lowest_tail.path.clone(),
                })
            })
            .collect()
    }

    fn advice_text(&self) -> String {
        let mut out = String::from("\nWhich path to use\n");
        for a in self.advice() {
            let cell = |path: &str| self.cell(path, a.rw).map(|c| &c.result.measurements);
            let Some(fast) = cell(&a.fastest) else { continue };
            out.push_str(&format!(
                "{:<10} fastest: {} ({} IOPS)",
                a.rw.name(),
                a.fastest,
                format_count(fast.total_iops())
            ));
            if a.frugal != a.fastest
                && let Some(frugal) = cell(&a.frugal)
                && frugal.cpu_ns_per_io() < 0.9 * fast.cpu_ns_per_io()
            {
                out.push_str(&format!(
                    "; {} is as fast (within {:.0}%) for {} CPU per I/O instead of {}",
                    a.frugal,
                    100.0 * (1.0 - AS_FAST),
                    format_ns(frugal.cpu_ns_per_io()),
                    format_ns(fast.cpu_ns_per_io()),
                ));
            }
            let quantile = |path: &str, q: f64| {
                self.cell(path, a.rw).map_or("-".to_string(), |c| format_ns(latency_quantile(c, q) as f64))
            };
            if a.lowest_p99 != a.fastest {
                out.push_str(&format!(
                    "; lowest p99: {} ({}, p99.9 {})",
                    a.lowest_p99,
                    quantile(&a.lowest_p99, 0.99),
                    quantile(&a.lowest_p99, 0.999)
                ));
            }
            if let Some(unsteady) = &a.lowest_p99_unsteady {
                out.push_str(&format!(
                    "{}{} has a lower p99 ({}), but one request in a thousand waits {}{}",
                    if a.lowest_p99 != a.fastest { " (" } else { "; " },
                    unsteady,
                    quantile(unsteady, 0.99),
                    quantile(unsteady, 0.999),
                    if a.lowest_p99 != a.fastest { ")" } else { "" },
                ));
            }
            if a.lowest_p99_9 != a.lowest_p99 {
                out.push_str(&format!("; lowest p99.9: {} ({})", a.lowest_p99_9, quantile(&a.lowest_p99_9, 0.999)));
            }
            out.push('\n');
        }
        out
    }

    /// Width of the path column: the longest path name (`stm@pipeline=1`), at least 18.
    fn path_width(&self) -> usize {
        self.paths.iter().map(|p| p.chars().count()).max().unwrap_or(0).max(18)
    }

    fn matrix(&self, title: &str, value: impl Fn(&Cell) -> Option<String>) -> String {
        let w = self.path_width();
        let mut out = format!("{title}\n{:<w$}", "path");
        for rw in &self.workloads {
            out.push_str(&format!("{:>11}", rw.name()));
        }
        out.push('\n');
        for path in &self.paths {
            out.push_str(&format!("{path:<w$}"));
            for &rw in &self.workloads {
                let v = self.cell(path, rw).and_then(&value).unwrap_or_else(|| "-".into());
                out.push_str(&format!("{v:>11}"));
            }
            out.push('\n');
        }
        out
    }

    /// The readable report: two matrices and a detail table.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        if let Some(first) = self.cells.first() {
            let c = &first.result.config;
            out.push_str(&format!(
                "iopath compare: {} {} requests, {} thread(s), {}, {:.1} s per run\ndevice: {}\n\n",
                crate::units::format_size(c.block_size),
                if c.iodepth == 1 { "blocking".to_string() } else { format!("iodepth {}", c.iodepth) },
                c.threads,
                c.device,
                first.result.measurements.wall_ns as f64 / 1e9,
                first.result.device_description,
            ));
        }
        if self.interrupted {
            out.push_str(&format!(
                "PARTIAL: interrupted after {} of {} cells; cells that did not run show -\n\n",
                self.cells.len(),
                self.planned
            ));
        }
        if let Some(base) = &self.baseline {
            let source = if base == "scsi-intr" {
                " (as in seed 000, Yu's 2012 thesis on the block I/O subsystem for fast storage, Table 7)"
            } else {
                ""
            };
            out.push_str(&self.matrix(&format!("Throughput relative to {base}{source}"), |cell| {
                self.normalized(cell).map(|x| format!("{x:.2}x"))
            }));
            out.push('\n');
        }
        out.push_str(&self.matrix(
            "Share of the device's peak bandwidth (as in seed 003, the Sync+Poll and temporal merge slides)",
            |cell| cell.result.measurements.share_of_peak().map(|s| format!("{:.0}%", s * 100.0)),
        ));
        out.push('\n');
        let w = self.path_width();
        let hogs = self.cells.iter().any(|c| c.result.measurements.hogs.is_some());
        out.push_str(&format!(
            "{:<10} {:<w$} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>9} {:>9} {:>10}{}\n",
            "workload",
            "path",
            "IOPS",
            "p50",
            "p99",
            "p99.9",
            "CPU/IO",
            "cores",
            "sleep/IO",
            "preempt/IO",
            "req/cmd",
            "merge wait",
            if hogs { format!(" {:>9}", "hog ops/s") } else { String::new() },
        ));
        for cell in &self.cells {
            let m = &cell.result.measurements;
            let lat = m.latency_histogram();
            let q = |p: f64| if lat.is_empty() { "-".into() } else { format_ns(lat.value_at_quantile(p) as f64) };
            out.push_str(&format!(
                "{:<10} {:<w$} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6.2} {:>8.2} {:>10.2} {:>9.2} {:>10}{}\n",
                cell.rw.name(),
                cell.path,
                format_count(m.total_iops()),
                q(0.5),
                q(0.99),
                q(0.999),
                format_ns(m.cpu_ns_per_io()),
                m.cpu_ns_per_io() * m.total_iops() / 1e9,
                m.voluntary_ctx_per_io(),
                m.involuntary_ctx_per_io(),
                m.mean_segments(),
                format_ns(m.merge_wait_ns_mean()),
                if hogs {
                    format!(" {:>9}", m.hogs.map_or("-".to_string(), |h| format_count(h.ops_per_sec)))
                } else {
                    String::new()
                },
            ));
        }
        out.push_str(
            "sleep/IO: the I/O threads' voluntary context switches (they slept); preempt/IO: involuntary ones \
             (the\nscheduler took the CPU, and every sched_yield of a spinning waiter that hands the CPU on counts \
             here).\nA sleep whose wake-up came before the thread switched out costs no context switch at all.\n",
        );
        out.push_str(&self.advice_text());
        out
    }

    /// fio-style JSON: every run as a job (exactly what `bench` prints for it),
    /// plus the matrices in `compare`.
    pub fn to_json(&self) -> Value {
        let jobs: Vec<Value> = self.cells.iter().map(|c| job_json(&c.result)).collect();
        let cells: Vec<Value> = self
            .cells
            .iter()
            .map(|c| {
                json!({
                    "path": c.path,
                    "rw": c.rw.name(),
                    "iops": c.result.measurements.total_iops(),
                    "bw_bytes": c.result.measurements.total_bw_bytes(),
                    "normalized": self.normalized(c),
                    "share_of_peak": c.result.measurements.share_of_peak(),
                    "repeats_iops": c.repeats_iops,
                })
            })
            .collect();
        json!({
            "fio version": format!("iopath-{}", env!("CARGO_PKG_VERSION")),
            "jobs": jobs,
            "compare": {
                "partial": self.interrupted,
                "cells_planned": self.planned,
                "baseline": self.baseline,
                "paths": self.paths,
                "workloads": self.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
                "cells": cells,
                "advice": self.advice().iter().map(|a| json!({
                    "workload": a.rw.name(),
                    "fastest": a.fastest,
                    "frugal": a.frugal,
                    "lowest_p99": a.lowest_p99,
                    "lowest_p99_unsteady": a.lowest_p99_unsteady,
                    "lowest_p99_9": a.lowest_p99_9,
                })).collect::<Vec<_>>(),
            },
        })
    }

    /// A grouped bar chart (SVG) of the share of peak bandwidth, or of
    /// throughput when the device has no known peak.
    pub fn to_svg(&self) -> String {
        let share = self.cells.iter().all(|c| c.result.measurements.share_of_peak().is_some());
        let value = |c: &Cell| {
            if share {
                c.result.measurements.share_of_peak().unwrap_or(0.0)
            } else {
                c.result.measurements.total_iops()
            }
        };
        let max = if share { 1.0 } else { self.cells.iter().map(value).fold(0.0, f64::max).max(1.0) };
        super::svg::grouped_bars(
            if share { "Share of the device's peak bandwidth" } else { "Throughput (IOPS)" },
            &self.workloads.iter().map(|w| w.name().to_string()).collect::<Vec<_>>(),
            &self.paths,
            |group, series| self.cell(&self.paths[series], self.workloads[group]).map(value).unwrap_or(0.0),
            max,
            if share { |v: f64| format!("{:.0}%", v * 100.0) } else { |v: f64| format_count(v) },
        )
    }
}
