//! `iopath bench`: one workload, fio-like flags.

use super::path_args::{IdleArgs, PathKnobs, duration_arg, presets_help, resolve_path};
use clap::{Args, ValueEnum};
use iopath::bench::{self, BenchConfig, Rw, report};
use iopath::units::parse_size;
use std::time::Duration;

/// Competing CPU load (seed 001's contention experiment).
#[derive(Args, Debug, Clone)]
pub struct HogArgs {
    /// Start this many competing busy threads during the run.
    #[arg(long, default_value_t = 0, help_heading = "CPU contention")]
    pub cpu_hogs: usize,
    /// Share of each millisecond a hog works, in percent.
    #[arg(long, default_value_t = 100, help_heading = "CPU contention")]
    pub hog_duty: u32,
    /// Pin hogs to these CPUs, round-robin (e.g. 0 or 0,1); default: not pinned.
    #[arg(long, value_delimiter = ',', help_heading = "CPU contention")]
    pub hog_cpus: Vec<usize>,
}

impl HogArgs {
    /// The hog configuration for `count` hogs.
    pub fn config(&self, count: usize) -> iopath::bench::hogs::HogConfig {
        iopath::bench::hogs::HogConfig { count, duty_pct: self.hog_duty, cpus: self.hog_cpus.clone() }
    }
}

/// What a run may overwrite (shared with `compare`).
#[derive(Args, Debug, Clone)]
pub struct SafetyArgs {
    /// Let a write workload overwrite an existing file iopath did not create, or a block
    /// device. Without it such a target is refused, and a file iopath creates is marked
    /// (extended attribute user.iopath) so later runs may write to it.
    #[arg(long, help_heading = "Safety")]
    pub allow_overwrite: bool,
    /// With --allow-overwrite: also a target that holds a file system, partition table,
    /// LVM/RAID/LUKS volume or swap signature. A mounted device is refused even then.
    #[arg(long, requires = "allow_overwrite", help_heading = "Safety")]
    pub allow_fs_overwrite: bool,
}

impl SafetyArgs {
    /// The guard these flags ask for.
    pub fn guard(&self) -> iopath::device::target::Guard {
        iopath::device::target::Guard::Protect {
            allow_overwrite: self.allow_overwrite,
            allow_fs: self.allow_fs_overwrite,
        }
    }
}

/// Output formats.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OutputFormat {
    /// A table for people.
    Table,
    /// fio-compatible JSON (`jobs[].read.iops`, ...) with iopath's figures in `jobs[].iopath`.
    Json,
}

/// `bench`'s output formats: the shared ones and fio's json+.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BenchFormat {
    /// A table for people.
    Table,
    /// fio-compatible JSON (`jobs[].read.iops`, ...) with iopath's figures in `jobs[].iopath`.
    Json,
    /// JSON plus latency histograms (`clat_ns.bins`), as fio's json+ for fio_jsonplus_clat2csv.
    #[value(name = "json+")]
    JsonPlus,
}

impl BenchFormat {
    /// The report for `results` in this format.
    fn render(self, results: &[bench::BenchResult]) -> String {
        match self {
            BenchFormat::Table => results.iter().map(report::to_table).collect(),
            BenchFormat::Json => {
                format!("{}\n", serde_json::to_string_pretty(&report::to_json(results)).expect("JSON"))
            }
            BenchFormat::JsonPlus => {
                format!("{}\n", serde_json::to_string_pretty(&report::to_json_plus(results)).expect("JSON"))
            }
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn rw_arg(s: &str) -> Result<Rw, String> {
    Rw::parse(s).map_err(|e| e.to_string())
}

/// The DEVICES section of `--help`, shared with `compare`.
pub const DEVICES_HELP: &str = "\
DEVICES:
  emu:PRESET[,k=v...]   emulated SSD; presets dram-ssd (7 us/4KiB, seed 000), optane, zssd, nand, null, custom.
                        Options: size=, file= (data in a file, durable after flush), readonly=1 (with file=:
                        mapped copy-on-write), populate=0|1 (default 1: memory allocated up front, no page
                        faults during the run; the very first time on a fresh VM this takes ~3 s per GiB,
                        later ~0.1 s), slots=, channels=, cmd=, xfer= (per 4 KiB), rcmd=, rxfer=, wcmd=,
                        wxfer=, flush= (times take ns/us/ms; a bare number is us). wcache=1: a volatile
                        write cache (writes survive a power cut only once flushed); cut_after=N or
                        cut_random=N cuts the power before command N+1 (or at a random point), cut=tear|drop
                        (each unflushed write kept, lost or torn by sector; or all lost), cut_seed=S.
  null[:size=N]         completes at once, moves no data: pure software cost.
  uring:PATH[,k=v...]   io_uring, O_DIRECT. Options: direct=0|1, size=, readonly=1, taskrun=defer|coop|plain,
                        fixedbufs=0|1, fixedfiles=0|1, sqpoll=0|1, iopoll=auto|on|off.
  psync:PATH[,k=v...]   pread/pwrite. Options: direct=0|1, size=, readonly=1.
  aio:PATH[,k=v...]     Linux native AIO (io_submit), O_DIRECT; completions read from the ring the kernel
                        writes, by whichever thread looks (no task work on the submitter, unlike io_uring):
                        the backend for merging paths (stm) with many threads. Options: direct=0|1, size=,
                        readonly=1.
  PATH                  an existing file or block device, on io_uring (as uring:PATH; the same in every
                        subcommand, e.g. iopath bench --device /dev/loop0, iopath mkfs /dev/shm/fs.img).
  A missing file is created, laid out with iopath's self-describing pattern at --size, and marked
  as iopath's (xattr user.iopath); write workloads refuse other existing files and block devices
  unless --allow-overwrite is given, and file systems even then (see Safety below).
  FAULTS, on any device (the device is wrapped; the wrapper also audits that no buffer changes while
  the device owns it): fail_nth= (the Nth command is refused), fail_range=A-B, fail_rate= (segments
  fail), commit_fail_nth=, commit_fail_rate= (a commit fails: its commands come back failed),
  wait_fail_nth=, wait_fail_rate= (a wait fails: commands stay in flight), hang_nth= (never completes
  until cancelled at --timeout), spike_rate=, spike= (completion held back; cannot be cancelled),
  panic_nth= (a bug in a backend), errno=, seed=, audit=1 (the audit alone).
";

fn bench_help() -> String {
    format!(
        "{DEVICES_HELP}\n{}\nEXAMPLES:\n  \
         iopath bench --device emu:dram-ssd --path sync-path --rw randread --bs 4k --runtime 2s\n  \
         iopath bench --device emu:dram-ssd --completion interrupt --runtime 2s --output-format json\n  \
         iopath bench --device emu:dram-ssd --path stm --rw randwrite --threads 16 --runtime 2s\n  \
         iopath bench --device emu:dram-ssd --path atm --rw write --iodepth 32 --runtime 2s\n  \
         iopath bench --device uring:/tmp/iopath.img --size 256m --rw randrw --threads 8 --verify --runtime 2s\n",
        presets_help()
    )
}

#[derive(Args, Debug)]
#[command(after_long_help = bench_help())]
pub struct BenchArgs {
    /// An fio job file to run instead of the flags' single workload ([global] and [job] sections;
    /// see docs/fio.md). The flags still set what the file leaves out.
    #[arg(value_name = "JOBFILE")]
    job_file_arg: Option<std::path::PathBuf>,
    /// The same, as a flag.
    #[arg(long, conflicts_with = "job_file_arg")]
    job_file: Option<std::path::PathBuf>,
    /// Device spec: emu:PRESET[,k=v], null, uring:PATH[,k=v], psync:PATH[,k=v], aio:PATH[,k=v], or an existing PATH.
    #[arg(long, default_value = "emu:dram-ssd")]
    device: String,
    /// Path preset (auto, scsi-intr, sync-path, sync-intr, sync-yield, stm, atm, htm, 2q) or DISPATCH+COMPLETION,
    /// optionally with @knob=value settings (stm@pipeline=1). The default, auto, waits in whichever
    /// way is cheapest as the run goes (--explain says which and why).
    #[arg(long, default_value = "auto")]
    path: String,
    /// Override the preset's dispatch strategy (auto, direct, combine, queue, hybrid, twoq, elevator).
    #[arg(long)]
    dispatch: Option<String>,
    /// Override the preset's completion policy (poll, interrupt, yield, hybrid, adaptive, auto).
    #[arg(long)]
    completion: Option<String>,
    #[command(flatten)]
    knobs: PathKnobs,
    /// Access pattern: read, write, randread, randwrite, rw, randrw, trim, randtrim.
    #[arg(long, default_value = "randread", value_parser = rw_arg)]
    rw: Rw,
    /// Percentage of reads in rw and randrw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u32,
    /// Block size per request (4k, 128k, ...).
    #[arg(long, default_value = "4k", value_parser = size_arg)]
    bs: u64,
    /// Threads issuing I/O, each on its own slice of the region.
    #[arg(long, visible_alias = "numjobs", default_value_t = 1)]
    threads: usize,
    /// Requests in flight per thread; 1 means blocking read/write calls.
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
    /// Region to use (default: the whole device; required to create a missing file).
    #[arg(long, value_parser = size_arg)]
    size: Option<u64>,
    /// Run for this long (2s, 500ms); without it and --ios, each thread passes over its slice once.
    #[arg(long, value_parser = duration_arg)]
    runtime: Option<Duration>,
    /// Stop each thread after this many requests.
    #[arg(long)]
    ios: Option<u64>,
    /// Write self-describing blocks (laying out the region first) and check every byte read back.
    #[arg(long)]
    verify: bool,
    /// Seed for the offset generators.
    #[arg(long, default_value_t = 0x10_9a7)]
    seed: u64,
    #[command(flatten)]
    hogs: HogArgs,
    #[command(flatten)]
    idle: IdleArgs,
    #[command(flatten)]
    safety: SafetyArgs,
    /// table, json or json+ (json with latency histograms).
    #[arg(long, value_enum, default_value = "table")]
    output_format: BenchFormat,
    /// Do not show the progress line.
    #[arg(long)]
    no_progress: bool,
    /// Say what the self-choosing policies (auto, adaptive) decided and why: every mode change,
    /// probe and crowd or hog verdict, printed on standard error after the run (IOPATH_LOG=1 prints
    /// them as they happen, for any program on iopath).
    #[arg(long)]
    explain: bool,
    /// Write the report (table or JSON) to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Print interim figures every so often (e.g. 1s) on standard error, also when not on a
    /// terminal; as JSON lines with --output-format json.
    #[arg(long, value_parser = duration_arg, value_name = "TIME")]
    status_interval: Option<Duration>,
    #[command(flatten)]
    fio: FioArgs,
}

/// Where the report goes: standard output, or `--output FILE`.
struct Output(Option<std::fs::File>, Option<std::path::PathBuf>);

impl Output {
    fn open(path: Option<&std::path::Path>) -> iopath::Result<Output> {
        let Some(path) = path else { return Ok(Output(None, None)) };
        let file = std::fs::File::create(path).map_err(|source| iopath::Error::Target {
            action: "create the --output file",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Output(Some(file), Some(path.to_path_buf())))
    }

    fn write(&mut self, text: &str) -> iopath::Result<()> {
        use std::io::Write;
        match (&mut self.0, &self.1) {
            (Some(f), Some(path)) => f.write_all(text.as_bytes()).map_err(|source| iopath::Error::Target {
                action: "write the --output file",
                path: path.clone(),
                source,
            }),
            _ => {
                print!("{text}");
                Ok(())
            }
        }
    }
}

/// fio's options for skew, pacing, warm-up and logs, spelled as fio spells them.
#[derive(Args, Debug, Clone)]
pub struct FioArgs {
    /// Where random requests land: random (uniform), zipf:THETA, pareto:H, normal:DEV (percent).
    #[arg(long, value_name = "DIST", help_heading = "fio options")]
    random_distribution: Option<String>,
    /// Requests per second per thread, reads[,writes] (one value caps each direction).
    #[arg(long, value_name = "R[,W]", help_heading = "fio options")]
    rate_iops: Option<String>,
    /// Bytes per second per thread, reads[,writes] (e.g. 100m), turned into requests per second.
    #[arg(long, value_name = "R[,W]", help_heading = "fio options")]
    rate: Option<String>,
    /// Run this long first without measuring (2s, 500ms).
    #[arg(long, value_parser = duration_arg, help_heading = "fio options")]
    ramp_time: Option<Duration>,
    /// Write fio latency logs NAME_lat.N.log, NAME_clat.N.log, NAME_slat.N.log (one per thread).
    #[arg(long, value_name = "NAME", help_heading = "fio options")]
    write_lat_log: Option<String>,
    /// Write fio bandwidth logs NAME_bw.N.log (KiB/s; needs --log-avg-msec).
    #[arg(long, value_name = "NAME", help_heading = "fio options")]
    write_bw_log: Option<String>,
    /// Write fio IOPS logs NAME_iops.N.log (needs --log-avg-msec).
    #[arg(long, value_name = "NAME", help_heading = "fio options")]
    write_iops_log: Option<String>,
    /// Average the logs over windows of this many milliseconds.
    #[arg(long, value_name = "MS", help_heading = "fio options")]
    log_avg_msec: Option<u64>,
    /// Per-request latency log lines carry the request's offset (fio's log_offset=1).
    #[arg(long, help_heading = "fio options")]
    log_offset: bool,
    /// Latency percentiles to report, ':'-separated (e.g. 50:99:99.9).
    #[arg(long, value_name = "P:P:...", help_heading = "fio options")]
    percentile_list: Option<String>,
    /// Pause after each request (microseconds unless a unit is given: 100, 2ms).
    #[arg(long, value_name = "TIME", help_heading = "fio options")]
    thinktime: Option<String>,
    /// The part of --thinktime spent spinning rather than sleeping.
    #[arg(long, value_name = "TIME", help_heading = "fio options")]
    thinktime_spin: Option<String>,
    /// Pause only after every N requests.
    #[arg(long, value_name = "N", help_heading = "fio options")]
    thinktime_blocks: Option<String>,
    /// Flush after every N writes (the queue drains first, so the flush covers them all).
    #[arg(long, value_name = "N", help_heading = "fio options")]
    fsync: Option<String>,
    /// Flush once when each thread ends.
    #[arg(long, help_heading = "fio options")]
    end_fsync: bool,
    /// Start the region this far into the device (e.g. 1g).
    #[arg(long, value_name = "SIZE", help_heading = "fio options")]
    offset: Option<String>,
    /// Passes over the region when no --runtime is given.
    #[arg(long, value_name = "N", help_heading = "fio options")]
    loops: Option<String>,
    /// Wait this long before starting (seconds unless a unit is given).
    #[arg(long, value_name = "TIME", help_heading = "fio options")]
    startdelay: Option<String>,
    /// Request sizes with shares, reads[,writes]: 4k/10:64k/90 (sets --bs to the smallest).
    #[arg(long, value_name = "SPLIT", help_heading = "fio options")]
    bssplit: Option<String>,
    /// Request sizes from MIN to MAX in steps of MIN, reads[,writes]: 4k-64k.
    #[arg(long, value_name = "MIN-MAX", help_heading = "fio options")]
    bsrange: Option<String>,
    /// CPUs the I/O threads may run on, e.g. 0-1,3.
    #[arg(long, value_name = "CPUS", help_heading = "fio options")]
    cpus_allowed: Option<String>,
}

impl FioArgs {
    /// Applies the options given to `fio` (fio's spelling and meaning; see jobfile).
    fn apply(&self, config: &mut BenchConfig) -> iopath::Result<()> {
        use iopath::bench::jobfile::apply_option;
        let given = [
            ("random_distribution", &self.random_distribution),
            ("rate_iops", &self.rate_iops),
            ("rate", &self.rate),
            ("write_lat_log", &self.write_lat_log),
            ("write_bw_log", &self.write_bw_log),
            ("write_iops_log", &self.write_iops_log),
            ("percentile_list", &self.percentile_list),
            ("thinktime", &self.thinktime),
            ("thinktime_spin", &self.thinktime_spin),
            ("thinktime_blocks", &self.thinktime_blocks),
            ("fsync", &self.fsync),
            ("offset", &self.offset),
            ("loops", &self.loops),
            ("startdelay", &self.startdelay),
            ("cpus_allowed", &self.cpus_allowed),
            ("bssplit", &self.bssplit),
            ("bsrange", &self.bsrange),
        ];
        for (key, value) in given {
            if let Some(v) = value {
                apply_option(config, key, v)?;
            }
        }
        if let Some(ms) = self.log_avg_msec {
            apply_option(config, "log_avg_msec", &ms.to_string())?;
        }
        config.fio.ramp = self.ramp_time.or(config.fio.ramp);
        config.fio.logs.offsets |= self.log_offset;
        config.fio.end_fsync |= self.end_fsync;
        Ok(())
    }
}

/// Runs `iopath bench`.
pub fn run(args: BenchArgs) -> iopath::Result<()> {
    let (path, path_name) =
        resolve_path(&args.path, args.dispatch.as_deref(), args.completion.as_deref(), &args.knobs)?;
    let config = BenchConfig {
        device: args.device,
        path,
        path_name,
        rw: args.rw,
        rwmixread: args.rwmixread,
        block_size: args.bs,
        size: args.size,
        threads: args.threads,
        iodepth: args.iodepth,
        runtime: args.runtime,
        ios: args.ios,
        verify: args.verify,
        seed: args.seed,
        progress: !args.no_progress,
        hogs: args.hogs.config(args.hogs.cpu_hogs),
        guard: args.safety.guard(),
        fio: Default::default(),
        idle_poll: args.idle.idle_poll,
    };
    let mut config = config;
    args.fio.apply(&mut config)?;
    config.fio.status_interval = args.status_interval;
    config.fio.status_json = !matches!(args.output_format, BenchFormat::Table);
    // Found out now, not after the run: the report's file can be written.
    let mut out = Output::open(args.output.as_deref())?;
    super::warn_if_busy();
    if args.explain {
        iopath::path::completion::explain::collect();
    }
    let ran = match args.job_file_arg.as_ref().or(args.job_file.as_ref()) {
        Some(file) => run_job_file(file, &config, args.output_format, &mut out),
        None => bench::run(&config).and_then(|r| out.write(&args.output_format.render(std::slice::from_ref(&r)))),
    };
    if args.explain {
        print_explanation();
    }
    ran
}

/// Prints what the policies said during the run (`--explain`) on standard error.
fn print_explanation() {
    let (lines, left_out) = iopath::path::completion::explain::take();
    if lines.is_empty() {
        eprintln!("explain: no decisions (only the auto and adaptive policies make any)");
        return;
    }
    eprintln!("explain: {} decision(s) of the completion policy (at seconds since the tool started):", lines.len());
    for line in &lines {
        eprintln!("  {line}");
    }
    if left_out > 0 {
        eprintln!("  ({left_out} more not shown)");
    }
}

/// Runs the jobs of an fio job file as fio does (the jobs of a group at the
/// same time, groups one after another), each starting from `base`.
fn run_job_file(
    file: &std::path::Path,
    base: &BenchConfig,
    format: BenchFormat,
    out: &mut Output,
) -> iopath::Result<()> {
    let text = std::fs::read_to_string(file).map_err(|source| iopath::Error::Target {
        action: "read the job file",
        path: file.to_path_buf(),
        source,
    })?;
    let jobs = iopath::bench::jobfile::parse(&text)?;
    // Every job is checked before the first runs: a mistake in the last one is found now.
    let mut configs =
        jobs.iter().map(|j| iopath::bench::jobfile::to_config(j, base)).collect::<iopath::Result<Vec<_>>>()?;
    let mut results = Vec::new();
    for (group_id, group) in iopath::bench::jobfile::groups(&jobs).into_iter().enumerate() {
        if iopath::signal::interrupted() {
            break;
        }
        for c in &mut configs[group.clone()] {
            c.fio.group = group_id as u32;
        }
        if group.len() > 1 {
            // Progress lines of jobs running together would overwrite each other.
            for c in &mut configs[group.clone()] {
                c.progress = false;
            }
        }
        let outcomes: Vec<iopath::Result<bench::BenchResult>> = std::thread::scope(|scope| {
            let running: Vec<_> = configs[group.clone()]
                .iter()
                .enumerate()
                .map(|(index, config)| {
                    std::thread::Builder::new()
                        .name(format!("iopath-job-{}", config.fio.job_name.as_deref().unwrap_or("")))
                        .spawn_scoped(scope, move || bench::run(config))
                        .map_err(|source| bench::run::thread_refused(index, group.len(), source))
                })
                .collect();
            // A job whose thread could not start fails; the others run to their end.
            running.into_iter().map(|t| t.and_then(|t| t.join().expect("job thread panicked"))).collect()
        });
        let group_results = outcomes.into_iter().collect::<iopath::Result<Vec<_>>>()?;
        // fio's group_reporting: the jobs of a group reported as one, under the first's name.
        let reported = if group.len() > 1 && jobs[group.clone()].iter().any(|j| j.has("group_reporting")) {
            bench::BenchResult::merge(group_results).into_iter().collect()
        } else {
            group_results
        };
        for result in reported {
            if matches!(format, BenchFormat::Table) {
                let name = result.config.fio.job_name.clone().unwrap_or_default();
                out.write(&format!("[{name}]\n{}\n", report::to_table(&result)))?;
            }
            results.push(result);
        }
    }
    if !matches!(format, BenchFormat::Table) {
        out.write(&format.render(&results))?;
    }
    Ok(())
}
