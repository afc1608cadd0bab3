//! `iopath fsbench`: the file layer's read and fsync paths side by side.

use super::bench::{OutputFormat, SafetyArgs};
use super::path_args::{IdleArgs, duration_arg};
use clap::Args;
use iopath::Error;
use iopath::bench::fsbench::{self, FsBenchConfig, FsPaths, FsRun, FsWorkload};
use iopath::bench::stats::median;
use iopath::path::PathSpec;
use iopath::units::{format_size, parse_size};
use serde_json::json;
use std::time::Duration;

const FSBENCH_HELP: &str = "\
Makes an iopath file system on the device (erasing it), writes one file of --file-size, and runs
each workload on each file-layer path, one after another (with --repeat, in alternating rounds):

  randread   buffered random reads over a file larger than the cache: misses
  hitsweep   random reads with the cache at 25/50/75/100% of the file, after a warm-up pass
             (read-ahead off: the pass would otherwise keep loading into the measured run)
  seqread    each thread reads its share of the file sequentially (read-ahead)
  region     random reads inside the first --region bytes: read-ahead must stay off
  fsync      each thread appends --bs to its own file, fsync every --fsync-every appends
  logsync    each thread overwrites --bs records at its own slots of one shared 1 MiB log and
             fdatasyncs after each (a redo log with no group commit: the syncs meet on its blocks;
             not in the default list)

Paths: conventional (Linux's steps, one after another: allocate, index, map, submit, wait, copy;
fsync: data, journal, flush, commit) and aios (seed 002: pooled pages, submit first, lazy indexing;
journal written with the data, one ordering point). READ/FSYNC mixes them (aios/conventional).
Read-around (a mount's default while its cache has room) is off here: each workload measures
what it names.

The table gives ops/s, latency, CPU per op, hit ratio, read-ahead pages, what the device moved
against what the application got (goodput), and the time of each step per op (the breakdown seed
002 draws), then each path's mean latency against the first path's.

EXAMPLES:
  iopath fsbench                                        # emu:optane, 1 thread, all workloads
  iopath fsbench --workloads randread,fsync --repeat 3
  iopath fsbench --workloads logsync --bs 512 --threads 16 --paths aios/journaled
  iopath fsbench --device uring:/dev/loop0 --allow-overwrite --workloads seqread,region
";

/// Arguments of `iopath fsbench`.
#[derive(Args, Debug)]
#[command(after_long_help = FSBENCH_HELP)]
pub struct FsBenchArgs {
    /// Device spec (formatted first): emu:PRESET[,k=v], uring:PATH, psync:PATH, aio:PATH.
    #[arg(long, default_value = "emu:optane,wcache=1")]
    device: String,
    /// Workloads: randread, hitsweep, seqread, region, fsync, logsync.
    #[arg(long, value_delimiter = ',', default_value = "randread,hitsweep,seqread,region,fsync")]
    workloads: Vec<String>,
    /// File-layer paths: conventional, aios, or READ/FSYNC, where a read path
    /// is conventional or aios and an fsync path conventional, aios or
    /// journaled (e.g. `aios/journaled`: a small fsync journals its data and
    /// sends data, journal and commit block in one round trip, the journal
    /// written with forced unit access).
    #[arg(long, value_delimiter = ',', default_value = "conventional,aios")]
    paths: Vec<String>,
    /// The engine's path under the file layer, as `bench --path` takes it
    /// (`auto`, the default, `sync-yield`, `sync-path`, `sync-intr`, `stm`, ...).
    /// The default chooses per thread how to wait (yield, poll, hybrid or
    /// interrupt) from what each costs, and yields while the threads
    /// outnumber the CPUs.
    #[arg(long, default_value = "auto")]
    engine_path: String,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Time per run.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    runtime: Duration,
    /// Size of the file the read workloads read.
    #[arg(long, default_value = "256m", value_parser = size_arg)]
    file_size: u64,
    /// The region of the `region` workload.
    #[arg(long, default_value = "64m", value_parser = size_arg)]
    region: u64,
    /// Bytes per op.
    #[arg(long, default_value = "4k", value_parser = size_arg)]
    bs: u64,
    /// Page cache bound (all workloads but hitsweep).
    #[arg(long, default_value = "16m", value_parser = size_arg)]
    cache: u64,
    /// Largest read-ahead window (0 turns read-ahead off).
    #[arg(long, default_value = "1m", value_parser = size_arg)]
    readahead: u64,
    /// fsync workload: appends per fsync.
    #[arg(long, default_value_t = 1)]
    fsync_every: u64,
    /// Rounds; each runs every path once, alternating.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// table or json.
    #[arg(long, value_enum, default_value = "table")]
    output_format: OutputFormat,
    #[command(flatten)]
    safety: SafetyArgs,
    #[command(flatten)]
    idle: IdleArgs,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Runs `iopath fsbench`.
pub fn run(args: FsBenchArgs) -> iopath::Result<()> {
    super::warn_if_busy();
    let workloads = args.workloads.iter().map(|w| FsWorkload::parse(w)).collect::<iopath::Result<Vec<_>>>()?;
    let paths = args.paths.iter().map(|p| FsPaths::parse(p)).collect::<iopath::Result<Vec<_>>>()?;
    if paths.is_empty() || workloads.is_empty() {
        return Err(Error::spec("--paths/--workloads", "", "give at least one of each"));
    }
    let config = FsBenchConfig {
        device: args.device.clone(),
        guard: args.safety.guard(),
        engine_path: PathSpec::parse(&args.engine_path)?.config()?,
        workloads,
        paths,
        threads: args.threads,
        runtime: args.runtime,
        file_size: args.file_size,
        region: args.region,
        bs: args.bs,
        cache_bytes: args.cache,
        readahead_bytes: args.readahead,
        fsync_every: args.fsync_every,
        repeat: args.repeat,
    };
    config.validate()?;
    let table = matches!(args.output_format, OutputFormat::Table);
    if table {
        if config.lays_out_file() {
            eprintln!("formatting {} and writing a {} file...", config.device, format_size(config.file_size));
        } else {
            eprintln!("formatting {}...", config.device);
        }
    }
    let idle_request = args.idle.hold()?;
    let idle_polling = iopath::idle::polling_now();
    let runs = fsbench::run(&config, |r| {
        if table {
            eprintln!(
                "  {:<9} {:<13} cache {:>8}: {:>9.0} ops/s, mean {:>7.1} us",
                r.workload.name(),
                r.paths.name(),
                format_size(r.cache_bytes),
                r.ops_per_sec(),
                r.mean_ns / 1e3
            );
        }
    })?;
    drop(idle_request);
    match args.output_format {
        OutputFormat::Table => print!("{}", to_table(&config, &runs, idle_polling)),
        OutputFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&to_json(&config, &runs, idle_polling)).expect("JSON"))
        }
    }
    if iopath::signal::interrupted() {
        eprintln!("interrupted: the table holds the runs that finished");
    }
    Ok(())
}

/// Runs of one (workload, cache, path) cell.
fn cells(runs: &[FsRun]) -> Vec<Vec<&FsRun>> {
    let mut out: Vec<Vec<&FsRun>> = Vec::new();
    for r in runs {
        match out
            .iter_mut()
            .find(|c| c[0].workload == r.workload && c[0].cache_bytes == r.cache_bytes && c[0].paths == r.paths)
        {
            Some(c) => c.push(r),
            None => out.push(vec![r]),
        }
    }
    out
}

fn to_table(config: &FsBenchConfig, runs: &[FsRun], idle_polling: bool) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\niopath fsbench: {} threads, {} ops, {} file, engine path {}, {} (medians of {} round(s))",
        config.threads,
        format_size(config.bs),
        format_size(config.file_size),
        config.engine_path.label(),
        config.device,
        config.repeat.max(1)
    );
    if idle_polling {
        let _ = writeln!(s, "idle CPUs polled instead of halting during the runs (a 0 us PM QoS CPU latency limit)");
    }
    let _ = writeln!(
        s,
        "{:<9} {:<13} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>9} {:>8}",
        "workload",
        "path",
        "cache",
        "ops/s",
        "MB/s",
        "mean us",
        "p50 us",
        "p99 us",
        "cpu us",
        "hit%",
        "RA pgs",
        "dev MB/s",
        "goodput"
    );
    let cells = cells(runs);
    for c in &cells {
        let r = c[0];
        let m = |f: &dyn Fn(&FsRun) -> f64| median(c.iter().map(|r| f(r)).collect());
        let app = m(&|r| r.app_bandwidth());
        let dev = m(&|r| r.device_bandwidth());
        let _ = writeln!(
            s,
            "{:<9} {:<13} {:>8} {:>10.0} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>6.1} {:>8.0} {:>9.1} {:>8}",
            r.workload.name(),
            r.paths.name(),
            format_size(r.cache_bytes),
            m(&|r| r.ops_per_sec()),
            app / 1e6,
            m(&|r| r.mean_ns) / 1e3,
            m(&|r| r.p50_ns as f64) / 1e3,
            m(&|r| r.p99_ns as f64) / 1e3,
            m(&|r| r.cpu_ns_per_op) / 1e3,
            m(&|r| r.hit_ratio()) * 100.0,
            m(&|r| (r.cache.readahead_pages + r.cache.read_around_pages) as f64),
            dev / 1e6,
            if dev > 0.0 { format!("{:.0}%", 100.0 * (app / dev).min(9.99)) } else { "-".into() },
        );
        if r.workload == fsbench_seq() && r.device_peak.is_some() {
            let peak = r.device_peak.unwrap_or(0.0);
            let _ = writeln!(
                s,
                "{:<24} application at {:.0}% of the device's peak ({:.0} MB/s)",
                "",
                100.0 * app / peak,
                peak / 1e6
            );
        }
    }
    let _ =
        writeln!(s, "\nstep times, us per op (summed over the steps that ran; aios inserts while the device works):");
    for c in &cells {
        let r = c[0];
        let parts: Vec<String> = r
            .steps
            .iter()
            .map(|(name, _, _)| {
                let v = median(c.iter().map(|x| x.steps.iter().find(|s| s.0 == *name).map_or(0.0, |s| s.1)).collect());
                format!("{name} {:.2}", v / 1e3)
            })
            .collect();
        let _ = writeln!(
            s,
            "  {:<9} {:<13} {:>8}  {}",
            r.workload.name(),
            r.paths.name(),
            format_size(r.cache_bytes),
            parts.join(", ")
        );
    }
    if config.paths.len() > 1 {
        let base = config.paths[0];
        let _ = writeln!(s, "\nmean latency against {}:", base.name());
        for c in cells.iter().filter(|c| c[0].paths != base) {
            let r = c[0];
            let Some(b) = cells
                .iter()
                .find(|b| b[0].paths == base && b[0].workload == r.workload && b[0].cache_bytes == r.cache_bytes)
            else {
                continue;
            };
            let ratio = median(c.iter().map(|x| x.mean_ns).collect()) / median(b.iter().map(|x| x.mean_ns).collect());
            let _ = writeln!(
                s,
                "  {:<9} {:>8} {:<13} {:.2}x",
                r.workload.name(),
                format_size(r.cache_bytes),
                r.paths.name(),
                ratio
            );
        }
    }
    s
}

fn fsbench_seq() -> FsWorkload {
    FsWorkload::SeqRead
}

fn to_json(config: &FsBenchConfig, runs: &[FsRun], idle_polling: bool) -> serde_json::Value {
    json!({
        "fsbench": {
            "device": config.device,
            "idle_polling": idle_polling,
            "engine_path": config.engine_path.label(),
            "threads": config.threads,
            "bs": config.bs,
            "file_size": config.file_size,
            "region": config.region,
            "runtime_ms": config.runtime.as_millis() as u64,
            "fsync_every": config.fsync_every,
            "repeat": config.repeat,
        },
        "runs": runs.iter().map(|r| json!({
            "workload": r.workload.name(),
            "read_path": r.paths.read.name(),
            "fsync_path": r.paths.fsync.name(),
            "cache_bytes": r.cache_bytes,
            "round": r.round,
            "ops": r.ops,
            "seconds": r.seconds,
            "ops_per_sec": r.ops_per_sec(),
            "lat_ns": {"mean": r.mean_ns, "p50": r.p50_ns, "p99": r.p99_ns},
            "cpu_ns_per_op": r.cpu_ns_per_op,
            "hit_ratio": r.hit_ratio(),
            "cache": {
                "hits": r.cache.hits, "misses": r.cache.misses, "readahead_pages": r.cache.readahead_pages,
                "readahead_used": r.cache.readahead_used, "read_around_pages": r.cache.read_around_pages,
                "read_around_used": r.cache.read_around_used, "evictions": r.cache.evictions,
                "writebacks": r.cache.writebacks, "duplicates": r.cache.duplicates,
            },
            "app_bytes": r.app_bytes,
            "device_bytes": r.device_bytes,
            "device_peak_bytes_per_sec": r.device_peak,
            "steps_ns_per_op": r.steps.iter().map(|(n, v, _)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
    })
}
