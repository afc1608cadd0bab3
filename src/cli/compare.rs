//! `iopath compare`: a matrix of paths x workloads on one device.

use super::bench::{DEVICES_HELP, OutputFormat};
use super::path_args::{PathKnobs, duration_arg, presets_help, resolve_path};
use clap::Args;
use iopath::bench::compare::compare;
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
         iopath compare --output-format json > compare.json\n",
        presets_help()
    )
}

#[derive(Args, Debug)]
#[command(after_long_help = compare_help())]
pub struct CompareArgs {
    /// Device spec, as for `bench`.
    #[arg(long, default_value = "emu:dram-ssd")]
    device: String,
    /// Comma-separated paths: presets or DISPATCH+COMPLETION.
    #[arg(long, default_value = "scsi-intr,sync-path,stm,atm,htm,2q", value_delimiter = ',')]
    paths: Vec<String>,
    /// Comma-separated workloads.
    #[arg(long, default_value = "read,write,randread,randwrite", value_delimiter = ',')]
    workloads: Vec<String>,
    /// Override every path's completion policy (poll, interrupt).
    #[arg(long)]
    completion: Option<String>,
    /// Path throughput is normalized to.
    #[arg(long, default_value = "scsi-intr")]
    baseline: String,
    /// Threads issuing I/O in every run.
    #[arg(long, default_value_t = 16)]
    threads: usize,
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
    let workloads = args.workloads.iter().map(|w| Rw::parse(w.trim())).collect::<iopath::Result<Vec<_>>>()?;
    let mut configs = Vec::new();
    for name in &args.paths {
        let (path, path_name) = resolve_path(name.trim(), None, args.completion.as_deref(), &args.knobs)?;
        configs.push(BenchConfig {
            device: args.device.clone(),
            path,
            path_name,
            rw: Rw::Read,
            rwmixread: args.rwmixread,
            block_size: args.bs,
            size: args.size,
            threads: args.threads,
            iodepth: args.iodepth,
            runtime: Some(args.runtime),
            ios: None,
            verify: false,
            seed: 0x10_9a7,
            progress: false,
            hogs: Default::default(),
        });
    }
    let show = !args.no_progress && std::io::stderr().is_terminal();
    let comparison = compare(&configs, &workloads, args.repeat, &args.baseline, |cell, done, total| {
        if show {
            eprintln!(
                "[{done}/{total}] {} {}: {} IOPS",
                cell.rw.name(),
                cell.path,
                format_count(cell.result.measurements.total_iops())
            );
        }
    })?;
    match args.output_format {
        OutputFormat::Table => print!("{}", comparison.to_table()),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&comparison.to_json()).expect("JSON")),
    }
    if let Some(file) = &args.plot {
        std::fs::write(file, comparison.to_svg()).map_err(|source| iopath::Error::Target {
            action: "write the chart to",
            path: file.clone(),
            source,
        })?;
        if matches!(args.output_format, OutputFormat::Table) {
            println!("\nchart written to {}", file.display());
        }
    }
    Ok(())
}
