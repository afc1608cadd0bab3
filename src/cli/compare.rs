//! `iopath compare`: a matrix of paths x workloads on one device.

use super::bench::{DEVICES_HELP, OutputFormat, SafetyArgs};
use super::path_args::{IdleArgs, PathKnobs, duration_arg, presets_help, resolve_path};
use clap::Args;
use iopath::bench::compare::Comparison;
use iopath::bench::compare::compare;
use iopath::bench::hogs::HogConfig;
use iopath::bench::report::format_count;
use iopath::bench::{BenchConfig, Rw};
use iopath::units::parse_size;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

fn compare_help() -> String {
    format!(
        "{DEVICES_HELP}\n{}\nEXAMPLES:\n  \
         iopath compare                                   # seed 000's designs on the emulated DRAM-SSD\n  \
         iopath compare --workloads randread,randwrite --threads 16 --plot share.svg\n  \
         iopath compare --paths sync-path,sync-intr --threads 1 --device emu:nand\n  \
         iopath compare --paths stm,stm@combine-polling=winner,2q,2q@pipeline=1 --workloads randwrite\n  \
         iopath compare --output-format json > compare.json\n  \
         iopath compare --device emu:nand --completions interrupt,poll,hybrid,adaptive --cpu-hogs 0,1,2\n",
        presets_help()
    )
}

#[derive(Args, Debug)]
#[command(after_long_help = compare_help())]
pub struct CompareArgs {
    /// Device spec, as for `bench`.
    #[arg(long, default_value = "emu:dram-ssd")]
    device: String,
    /// Comma-separated paths: presets or DISPATCH+COMPLETION, each optionally with
    /// @knob=value (stm@combine-polling=winner)
    /// [default: scsi-intr,sync-path,sync-yield,stm,atm,htm,2q; sync-path with --completions].
    #[arg(long, value_delimiter = ',')]
    paths: Vec<String>,
    /// Comma-separated workloads [default: read,write,randread,randwrite; randread with --completions].
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Override every path's completion policy (poll, interrupt, yield, hybrid, adaptive).
    #[arg(long)]
    completion: Option<String>,
    /// Compare completion policies instead: each path runs once with each of these
    /// (e.g. interrupt,poll,hybrid,adaptive).
    #[arg(long, value_delimiter = ',', conflicts_with = "completion")]
    completions: Vec<String>,
    /// Repeat the whole matrix at each of these numbers of competing CPU hogs (e.g. 0,1,2).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    cpu_hogs: Vec<usize>,
    /// Share of each millisecond a hog works, in percent.
    #[arg(long, default_value_t = 100)]
    hog_duty: u32,
    /// Pin hogs to these CPUs, round-robin.
    #[arg(long, value_delimiter = ',')]
    hog_cpus: Vec<usize>,
    /// Path throughput is normalized to.
    #[arg(long, default_value = "scsi-intr")]
    baseline: String,
    /// Threads issuing I/O in every run [default: 16; 1 with --completions].
    #[arg(long)]
    threads: Option<usize>,
    /// Requests in flight per thread; 1 means blocking calls.
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    bs: u64,
    /// Region to use (default: the whole device).
    #[arg(long, value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    size: Option<u64>,
    /// Percentage of reads in rw and randrw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u32,
    /// Time per run.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    runtime: Duration,
    /// Runs per cell; the median by throughput is kept.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    knobs: PathKnobs,
    #[command(flatten)]
    safety: SafetyArgs,
    #[command(flatten)]
    idle: IdleArgs,
    /// table or json.
    #[arg(long, value_enum, default_value = "table")]
    output_format: OutputFormat,
    /// Also write an SVG bar chart of the share of peak bandwidth here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Do not show progress.
    #[arg(long)]
    no_progress: bool,
}

/// Runs `iopath compare`.
pub fn run(args: CompareArgs) -> iopath::Result<()> {
    let policies = !args.completions.is_empty();
    let or = |given: &[String], default: &str| -> Vec<String> {
        if given.is_empty() { default.split(',').map(String::from).collect() } else { given.to_vec() }
    };
    let workloads = or(&args.workloads, if policies { "randread" } else { "read,write,randread,randwrite" });
    let workloads = workloads.iter().map(|w| Rw::parse(w.trim())).collect::<iopath::Result<Vec<_>>>()?;
    let paths = or(&args.paths, if policies { "sync-path" } else { "scsi-intr,sync-path,sync-yield,stm,atm,htm,2q" });
    let threads = args.threads.unwrap_or(if policies { 1 } else { 16 });
    super::warn_if_busy();
    // One run per (path, completion): the completion list multiplies the paths.
    let mut variants: Vec<(String, Option<String>)> = Vec::new();
    for path in &paths {
        if policies {
            variants.extend(args.completions.iter().map(|c| (path.trim().to_string(), Some(c.trim().to_string()))));
        } else {
            variants.push((path.trim().to_string(), args.completion.clone()));
        }
    }
    let mut configs = Vec::new();
    for (name, completion) in &variants {
        let (path, mut path_name) = resolve_path(name, None, completion.as_deref(), &args.knobs)?;
        if policies && let Some(c) = completion {
            // Rows say what was asked for ("sync-path+interrupt"), not what the
            // combination happens to be called ("sync-intr", "direct+hybrid").
            path_name = format!("{name}+{c}");
        }
        configs.push(BenchConfig {
            device: args.device.clone(),
            path,
            path_name,
            rw: Rw::Read,
            rwmixread: args.rwmixread,
            block_size: args.bs,
            size: args.size,
            threads,
            iodepth: args.iodepth,
            runtime: Some(args.runtime),
            ios: None,
            verify: false,
            seed: 0x10_9a7,
            progress: false,
            hogs: Default::default(),
            guard: args.safety.guard(),
            fio: Default::default(),
            // Held once below for the whole matrix, not asked for run by run.
            idle_poll: false,
        });
    }
    // Found out now, not after the whole matrix has run: the chart's file can be written.
    let chart = match &args.plot {
        Some(file) => Some(std::fs::File::create(file).map_err(|source| iopath::Error::Target {
            action: "create the chart file",
            path: file.clone(),
            source,
        })?),
        None => None,
    };
    let show = !args.no_progress && std::io::stderr().is_terminal();
    let baseline = if policies { configs[0].path_name.clone() } else { args.baseline.clone() };
    let idle_request = args.idle.hold()?;
    let mut sections = Vec::new();
    for &hogs in &args.cpu_hogs {
        let configs: Vec<BenchConfig> = configs
            .iter()
            .map(|c| BenchConfig {
                hogs: HogConfig { count: hogs, duty_pct: args.hog_duty, cpus: args.hog_cpus.clone() },
                ..c.clone()
            })
            .collect();
        let comparison = compare(&configs, &workloads, args.repeat, &baseline, |cell, done, total| {
            if show {
                eprintln!(
                    "[{done}/{total}] {hogs} hog(s), {} {}: {} IOPS",
                    cell.rw.name(),
                    cell.path,
                    format_count(cell.result.measurements.total_iops())
                );
            }
        })?;
        sections.push((hogs, comparison));
    }
    drop(idle_request);
    match args.output_format {
        OutputFormat::Table => {
            if args.idle.idle_poll {
                println!("idle CPUs polled instead of halting during every run (--idle-poll)");
            }
            for (hogs, comparison) in &sections {
                if args.cpu_hogs.len() > 1 || *hogs > 0 {
                    println!("=== {hogs} competing CPU hog(s) ===");
                }
                print!("{}", comparison.to_table());
                println!();
            }
        }
        OutputFormat::Json => {
            let value = if sections.len() == 1 {
                sections[0].1.to_json()
            } else {
                serde_json::json!({
                    "fio version": format!("iopath-{}", env!("CARGO_PKG_VERSION")),
                    "contention": sections
                        .iter()
                        .map(|(hogs, c)| serde_json::json!({ "cpu_hogs": hogs, "result": c.to_json() }))
                        .collect::<Vec<_>>(),
                })
            };
            println!("{}", serde_json::to_string_pretty(&value).expect("JSON"));
        }
    }
    if let (Some(file), Some(mut chart)) = (&args.plot, chart) {
        let svg = if sections.len() == 1 { sections[0].1.to_svg() } else { contention_svg(&sections) };
        use std::io::Write;
        chart.write_all(svg.as_bytes()).map_err(|source| iopath::Error::Target {
            action: "write the chart to",
            path: file.clone(),
            source,
        })?;
        if matches!(args.output_format, OutputFormat::Table) {
            println!("chart written to {}", file.display());
        }
    }
    Ok(())
}

/// Throughput per contention level (groups) and path (series).
fn contention_svg(sections: &[(usize, Comparison)]) -> String {
    let groups: Vec<String> = sections.iter().map(|(h, _)| format!("{h} hog(s)")).collect();
    let series = sections[0].1.paths.clone();
    let iops = |g: usize, s: usize| {
        let c = &sections[g].1;
        c.cells.iter().filter(|cell| cell.path == series[s]).map(|cell| cell.result.measurements.total_iops()).sum()
    };
    let max = (0..groups.len())
        .flat_map(|g| (0..series.len()).map(move |s| (g, s)))
        .map(|(g, s)| iops(g, s))
        .fold(1.0, f64::max);
    iopath::bench::svg::grouped_bars(
        "Throughput (IOPS) under CPU contention",
        &groups,
        &series,
        iops,
        max,
        format_count,
    )
}
