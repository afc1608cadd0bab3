//! Running one benchmark: threads, the timed phase, verification, progress.
//!
//! Every thread opens its own [`Handle`] with one pre-registered buffer per
//! queue slot, lays out its slice first when `--verify` is on, then waits at
//! a start gate so that all threads (and the device counters) start the timed
//! phase together. Blocking I/O (`--iodepth 1`) goes through `read_into` /
//! `write_from`; deeper queues use submit / commit / reap.

use super::distribution::Distribution;
use super::hogs::{HogConfig, Hogs};
use super::logs::{LogConfig, ThreadLog};
use super::stats::{DirStats, Measurements};
use super::workload::{Generator, Rw};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::target::Guard;
use crate::device::{DeviceSpec, Op};
use crate::engine::{Engine, Handle, HandleOptions};
use crate::error::{Error, Result};
use crate::path::{PathConfig, PathStats};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Largest write used to lay out a slice for `--verify`.
const PREFILL_CHUNK: u64 = 1 << 20;
/// How many requests a thread completes between two updates of the progress counter.
const PROGRESS_BATCH: u64 = 64;

/// One benchmark.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Device spec.
    pub device: String,
    /// The path.
    pub path: PathConfig,
    /// Preset name, or `custom` when dispatch/completion were set by hand.
    pub path_name: String,
    /// Access pattern.
    pub rw: Rw,
    /// Percentage of reads in mixed patterns.
    pub rwmixread: u32,
    /// Bytes per request.
    pub block_size: u64,
    /// Region to use; `None` = the whole device.
    pub size: Option<u64>,
    /// Threads issuing I/O.
    pub threads: usize,
    /// Requests in flight per thread.
    pub iodepth: u32,
    /// Time limit (time-based run).
    pub runtime: Option<Duration>,
    /// Request limit per thread.
    pub ios: Option<u64>,
    /// Write self-describing blocks and check every byte read.
    pub verify: bool,
    /// Seed of the offset generators.
    pub seed: u64,
    /// Show a progress line on a terminal.
    pub progress: bool,
    /// Competing busy threads run during the timed phase.
    pub hogs: HogConfig,
    /// What may be written to a file or block device iopath did not create.
    /// A read-only workload opens its target read-only whatever this says.
    pub guard: Guard,
    /// fio's skew, pacing, warm-up, logs and reporting options.
    pub fio: FioOptions,
    /// Ask that idle CPUs poll rather than halt while the run lasts
    /// ([`IdlePolling`](crate::idle::IdlePolling)); a run that cannot ask fails.
    pub idle_poll: bool,
}

/// fio options beyond the basic workload (`random_distribution`,
/// `rate_iops`, `ramp_time`, logs, `percentile_list`, the job's name).
#[derive(Debug, Clone, PartialEq)]
pub struct FioOptions {
    /// Where random requests land.
    pub distribution: Distribution,
    /// Most requests per second each thread issues, reads and writes apart
    /// (fio's `rate_iops=R[,W]`; `rate=` is turned into this).
    pub rate_iops: [Option<f64>; 2],
    /// Run this long before measuring (`ramp_time`).
    pub ramp: Option<Duration>,
    /// Logs to write.
    pub logs: LogConfig,
    /// Latency percentiles to report (`percentile_list`).
    pub percentiles: Vec<f64>,
    /// The job's name (a job file's section) for the JSON and the logs.
    pub job_name: Option<String>,
    /// The options as the job file gave them, for the JSON's `job options`.
    pub job_options: Vec<(String, String)>,
    /// Request sizes with weights, reads and writes (`bssplit`, `bsrange`);
    /// empty: every request is `block_size`, which is then the smallest size.
    pub bs_split: [Vec<(u64, u32)>; 2],
    /// Where the region starts on the device (`offset`).
    pub offset: u64,
    /// `offset=P%`: the region starts at this share of the device (aligned
    /// down to the block size); replaces `offset`.
    pub offset_percent: Option<f64>,
    /// `size=P%`: the region is this share of the device (aligned down to
    /// the block size); replaces `BenchConfig::size`.
    pub size_percent: Option<f64>,
    /// Passes over the region when the run is not time-based (`loops`).
    pub loops: u64,
    /// Pause after each `thinktime_blocks` requests: spin `thinktime_spin`,
    /// then sleep the rest of `thinktime`.
    pub thinktime: Duration,
    /// The spinning part of `thinktime`.
    pub thinktime_spin: Duration,
    /// Requests between two pauses.
    pub thinktime_blocks: u64,
    /// A flush after every this many writes (`fsync=N`).
    pub fsync_every: Option<u64>,
    /// A flush when the job ends (`end_fsync`).
    pub end_fsync: bool,
    /// CPUs the I/O threads may run on (`cpus_allowed`); empty: any.
    pub cpus: Vec<usize>,
    /// Wait this long before the job starts (`startdelay`; job files).
    pub startdelay: Duration,
    /// The job file's group (jobs between two `stonewall`s run together).
    pub group: u32,
    /// Print interim figures this often (`--status-interval`), on standard error.
    pub status_interval: Option<Duration>,
    /// Interim figures as JSON lines rather than text.
    pub status_json: bool,
    /// With `--verify` on a workload that writes: read every block back and
    /// check it when the run ends (fio's `verify=` with `do_verify=1`).
    pub verify_readback: bool,
}

impl Default for FioOptions {
    fn default() -> Self {
        FioOptions {
            distribution: Distribution::Uniform,
            rate_iops: [None, None],
            ramp: None,
            logs: LogConfig::default(),
            percentiles: super::report::FIO_PERCENTILES.to_vec(),
            job_name: None,
            job_options: Vec::new(),
            bs_split: [Vec::new(), Vec::new()],
            offset: 0,
            offset_percent: None,
            size_percent: None,
            loops: 1,
            thinktime: Duration::ZERO,
            thinktime_spin: Duration::ZERO,
            thinktime_blocks: 1,
            fsync_every: None,
            end_fsync: false,
            cpus: Vec::new(),
            startdelay: Duration::ZERO,
            group: 0,
            status_interval: None,
            status_json: false,
            verify_readback: false,
        }
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            device: "emu:dram-ssd".into(),
            path: PathConfig::default(),
            path_name: "sync-path".into(),
            rw: Rw::RandRead,
            rwmixread: 50,
            block_size: 4096,
            size: None,
            threads: 1,
            iodepth: 1,
            runtime: None,
            ios: None,
            verify: false,
            seed: 0x10_9a7,
            progress: false,
            hogs: HogConfig::default(),
            guard: Guard::Protect { allow_overwrite: false, allow_fs: false },
            fio: FioOptions::default(),
            idle_poll: false,
        }
    }
}

/// How `--verify` knows what a block must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VerifyMode {
    /// Not verifying.
    Off,
    /// Each thread lays its slice out first and tracks what it writes.
    LayOut,
    /// A read-only run on a file or device: every sector must be an intact
    /// iopath sector laid out earlier (by iopath creating the file, or by an
    /// earlier write run with `--verify`), whatever its version.
    Existing,
}

/// The outcome of one benchmark.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// What was run.
    pub config: BenchConfig,
    /// The device as it describes itself.
    pub device_description: String,
    /// What the completion policy waited on (user-space spin, kernel polling, interrupts).
    pub completion_source: String,
    /// Region size actually used.
    pub size: u64,
    /// What was measured.
    pub measurements: Measurements,
    /// The run was cut short by Ctrl-C or SIGTERM: the figures cover only
    /// the time it ran.
    pub interrupted: bool,
    /// The job's bandwidth and IOPS per 500 ms (all threads summed).
    pub samples: ThreadLog,
    /// Log files written.
    pub logs_written: Vec<std::path::PathBuf>,
    /// When the measured phase began, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Idle CPUs polled during the run (a 0 µs PM QoS CPU latency limit was in
    /// force, asked for by `idle_poll` or by another process): wake-ups were cheap.
    pub idle_polling: bool,
}

impl BenchResult {
    /// Jobs that ran together as one (fio's `group_reporting` over a group of
    /// different jobs): requests, latencies, CPU and counters summed, the
    /// longest wall time, the first job's name and settings, the threads of all.
    pub fn merge(results: Vec<BenchResult>) -> Option<BenchResult> {
        let mut results = results.into_iter();
        let mut out = results.next()?;
        for r in results {
            let (m, o) = (&mut out.measurements, &r.measurements);
            m.wall_ns = m.wall_ns.max(o.wall_ns);
            m.read.add(&o.read);
            m.write.add(&o.write);
            m.trim.add(&o.trim);
            m.sync.add(&o.sync);
            m.usage.add(&o.usage);
            m.path.add(&o.path);
            m.device.add(&o.device);
            m.verified_blocks += o.verified_blocks;
            out.config.threads += r.config.threads;
            out.interrupted |= r.interrupted;
            out.samples.add_samples(&r.samples);
            out.logs_written.extend(r.logs_written);
            out.started_unix_ms = out.started_unix_ms.min(r.started_unix_ms);
            out.idle_polling &= r.idle_polling;
        }
        Some(out)
    }
}

/// Most benchmark threads a run takes.
pub const MAX_THREADS: usize = 4096;

/// Checks a count of benchmark threads: at least 1, at most [`MAX_THREADS`].
pub fn check_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Err(Error::spec("--threads", "0", "at least one thread is needed"));
    }
    if threads > MAX_THREADS {
        return Err(Error::spec(
            "--threads",
            threads.to_string(),
            format!("at most {MAX_THREADS} (fio's limit too): each thread has its own stack and device queue"),
        ));
    }
    Ok(())
}

/// The error for a benchmark thread (`index`, from 0) the system would not
/// create: what to lower or raise.
pub fn thread_refused(index: usize, threads: usize, source: std::io::Error) -> Error {
    Error::Os {
        context: format!(
            "cannot start benchmark thread {} of {threads} (fewer --threads, or raise the limit on processes: \
             `ulimit -u`, the cgroup's pids.max, vm.max_map_count)",
            index + 1
        ),
        source,
    }
}

/// Opens the device and engine a config names and runs the benchmark.
pub fn run(config: &BenchConfig) -> Result<BenchResult> {
    check_threads(config.threads)?;
    if config.iodepth == 0 {
        return Err(Error::spec("--iodepth", "0", "the queue depth must be at least 1"));
    }
    if config.block_size == 0 {
        return Err(Error::ZeroLength { offset: 0 });
    }
    if config.runtime == Some(Duration::ZERO) {
        return Err(Error::spec("--runtime", "0", "a run must last longer than 0, e.g. --runtime 2s"));
    }
    if config.ios == Some(0) {
        return Err(Error::spec("--ios", "0", "each thread must issue at least one request"));
    }
    if config.rwmixread > 100 {
        return Err(Error::spec("--rwmixread", config.rwmixread.to_string(), "a percentage from 0 to 100"));
    }
    config.fio.logs.validate()?;
    if !config.fio.startdelay.is_zero() {
        let until = now_ns() + config.fio.startdelay.as_nanos() as u64;
        while now_ns() < until && !crate::signal::interrupted() {
            std::thread::sleep(Duration::from_nanos(until.saturating_sub(now_ns())).min(Duration::from_millis(50)));
        }
    }
    if config.fio.rate_iops.iter().flatten().any(|r| !(*r > 0.0 && r.is_finite())) {
        return Err(Error::spec("rate_iops", format!("{:?}", config.fio.rate_iops), "a rate above 0"));
    }
    if config.fio.percentiles.iter().any(|p| !(*p > 0.0 && *p <= 100.0)) || config.fio.percentiles.is_empty() {
        return Err(Error::spec(
            "percentile_list",
            format!("{:?}", config.fio.percentiles),
            "percentiles above 0 and at most 100, separated by ':' (e.g. 50:99:99.9)",
        ));
    }
    // A share of the device is known once the device is open; a file that does
    // not exist yet then needs its size given.
    let in_bytes = config.fio.size_percent.is_none() && config.fio.offset_percent.is_none();
    let mut spec = DeviceSpec::parse(&config.device, config.size.filter(|_| in_bytes).map(|s| s + config.fio.offset))?;
    if let Some(target) = spec.target()
        && !in_bytes
        && target.size.is_none()
        && !target.path.exists()
    {
        let (option, share) = match config.fio.size_percent {
            Some(p) => ("size", p),
            None => ("offset", config.fio.offset_percent.unwrap_or_default()),
        };
        return Err(Error::spec(
            option,
            format!("{share}%"),
            format!(
                "a share of {}, which does not exist yet: give its size in bytes (size=1g) to create it",
                target.path.display()
            ),
        ));
    }
    let read_only = !config.rw.writes();
    spec.protect(config.guard, read_only);
    let verify = match (config.verify, read_only && spec.holds_user_data()) {
        (false, _) => VerifyMode::Off,
        (true, false) => VerifyMode::LayOut,
        (true, true) => VerifyMode::Existing,
    };
    if verify == VerifyMode::Existing && !config.block_size.is_multiple_of(crate::pattern::SECTOR as u64) {
        return Err(Error::spec(
            "--bs",
            config.block_size.to_string(),
            "a read-only run with --verify checks the 512-byte sectors iopath laid out earlier: use a block \
             size that is a multiple of 512",
        ));
    }
    let device = spec.open()?;
    let align = device.capabilities().alignment as u64;
    if !config.block_size.is_multiple_of(align) {
        return Err(Error::spec(
            "--bs",
            config.block_size.to_string(),
            format!(
                "{} needs every request aligned to {align} bytes (O_DIRECT): use a block size that is a \
                 multiple of {align} (e.g. --bs 4k), or open it buffered with direct=0 in the device spec",
                config.device
            ),
        ));
    }
    let largest = device.capabilities().max_segment_bytes as u64;
    let split_sizes = config.fio.bs_split.iter().flatten().map(|&(b, _)| b);
    if let Some(bad) = split_sizes.clone().find(|b| *b == 0 || !b.is_multiple_of(config.block_size) || *b > largest) {
        return Err(Error::spec(
            "bssplit/bsrange",
            bad.to_string(),
            format!(
                "every size must be a multiple of the smallest ({} bytes) and at most {largest} bytes",
                config.block_size
            ),
        ));
    }
    if config.verify && config.rw.trims() {
        return Err(Error::spec(
            "--verify",
            config.rw.name(),
            "a trimmed block reads back as zeros, not as what was written: verify a read or write workload",
        ));
    }
    if config.verify && split_sizes.clone().next().is_some() {
        return Err(Error::spec(
            "--verify",
            "bssplit/bsrange",
            "--verify tracks whole blocks of one size; verify with a single --bs",
        ));
    }
    if config.block_size > largest {
        return Err(Error::spec(
            "--bs",
            config.block_size.to_string(),
            format!("{} takes at most {largest} bytes in one request: use a smaller --bs", config.device),
        ));
    }
    let share = |percent: f64, unit: u64| (device.size() as f64 * percent / 100.0) as u64 / unit * unit;
    let offset = config.fio.offset_percent.map_or(config.fio.offset, |p| share(p, align.max(config.block_size)));
    if offset >= device.size() || !offset.is_multiple_of(align) {
        return Err(Error::spec(
            "offset",
            offset.to_string(),
            format!("the region must start inside the device ({} bytes) at a multiple of {align}", device.size()),
        ));
    }
    let size = match config.fio.size_percent {
        Some(p) => share(p, config.block_size),
        None => config.size.unwrap_or(device.size() - offset),
    };
    if offset + size > device.size() {
        return Err(Error::OutOfRange { offset, len: size, size: device.size() });
    }
    if !config.fio.cpus.is_empty() && config.fio.cpus.iter().any(|&c| c >= crate::sys::cpu_count()) {
        return Err(Error::spec(
            "cpus_allowed",
            format!("{:?}", config.fio.cpus),
            format!("this machine has CPUs 0-{}", crate::sys::cpu_count() - 1),
        ));
    }
    if config.fio.thinktime_blocks == 0 || config.fio.loops == 0 || config.fio.fsync_every == Some(0) {
        return Err(Error::spec("thinktime_blocks/loops/fsync", "0", "at least 1 (or leave it out)"));
    }
    if config.verify && !device.capabilities().stores_data {
        return Err(Error::spec(
            "--verify",
            config.device.clone(),
            "this device moves no data, so nothing can be read back; verify on emu, uring or psync",
        ));
    }
    let engine = Engine::with_device(device, config.path.clone())?;
    if in_bytes {
        return run_with(&engine, config, size, verify);
    }
    // The shares, resolved: what the threads and the report use.
    let mut resolved = config.clone();
    resolved.size = Some(size);
    resolved.fio.offset = offset;
    run_with(&engine, &resolved, size, verify)
}

struct ThreadOutcome {
    read: DirStats,
    write: DirStats,
    trim: DirStats,
    sync: DirStats,
    usage: ThreadUsage,
    path: PathStats,
    verified_blocks: u64,
    end_ns: u64,
    log: ThreadLog,
}

/// Runs the benchmark on an engine that is already open. With `--verify`,
/// the engine's device is treated as scratch space: each thread lays its
/// slice out first.
pub fn run_on(engine: &Engine, config: &BenchConfig, size: u64) -> Result<BenchResult> {
    run_with(engine, config, size, if config.verify { VerifyMode::LayOut } else { VerifyMode::Off })
}

fn run_with(engine: &Engine, config: &BenchConfig, size: u64, verify: VerifyMode) -> Result<BenchResult> {
    // Each run is a program of its own to `auto`'s judge: what it chose in the
    // last run (other threads, other hogs) says nothing about this one.
    crate::path::completion::judge::reset();
    let gate = Arc::new(StartGate::default());
    // When the threads were let go: a warm-up (`ramp_time`) ends the same time after it for all.
    let released_at = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let idle_request = if config.idle_poll { Some(crate::idle::IdlePolling::request()?) } else { None };
    let idle_polling = crate::idle::polling_now();
    let hogs = Hogs::start(&config.hogs)?;
    let mut hog_units_before = 0;
    let mut start_ns = 0;
    let mut device_before = Default::default();
    let mut background_before = Default::default();
    let outcomes: Vec<Result<ThreadOutcome>> = std::thread::scope(|scope| {
        let mut workers = Vec::with_capacity(config.threads);
        for thread in 0..config.threads {
            let job = Job {
                engine,
                config,
                size,
                verify,
                gate: Arc::clone(&gate),
                released_at: Arc::clone(&released_at),
                stop: Arc::clone(&stop),
                progress: Arc::clone(&progress),
            };
            match std::thread::Builder::new()
                .name(format!("iopath-io-{thread}"))
                .spawn_scoped(scope, move || worker(&job, thread))
            {
                Ok(w) => workers.push(w),
                Err(source) => {
                    // The threads started so far are let go at once and stop: none waits
                    // for the ones that could not start.
                    stop.store(true, Ordering::Relaxed);
                    gate.open_when(workers.len());
                    let started = workers.len();
                    // The refusal first: it is what the run reports.
                    let mut outcomes = vec![Err(thread_refused(started, config.threads, source))];
                    outcomes.extend(workers.into_iter().map(|w| w.join().expect("benchmark thread panicked")));
                    return outcomes;
                }
            }
        }
        // Everything "before" is read before the workers are let go: read after, on a
        // machine with more I/O threads than CPUs, this thread could wait a time slice
        // for its CPU while they work, and the run would look that much faster
        // (sync-path showed 0.80 of the DRAM-SSD's peak, above the 0.78 it can reach).
        device_before = engine.device().stats();
        background_before = (engine.background_stats(), engine.background_usage());
        hog_units_before = hogs.units();
        start_ns = now_ns();
        released_at.store(start_ns, Ordering::Release);
        gate.open_when(config.threads);
        if let Some(ramp) = config.fio.ramp {
            // Measured from the end of the warm-up, which every thread leaves at this time.
            let ramp_end = start_ns + ramp.as_nanos() as u64;
            while now_ns() < ramp_end && !workers.iter().all(|w| w.is_finished()) {
                std::thread::sleep(
                    Duration::from_millis(5).min(Duration::from_nanos(ramp_end.saturating_sub(now_ns()))),
                );
            }
            device_before = engine.device().stats();
            background_before = (engine.background_stats(), engine.background_usage());
            hog_units_before = hogs.units();
            start_ns = ramp_end;
        }
        let bar = (config.progress && std::io::stderr().is_terminal()).then(|| progress_bar(config));
        let mut status = config.fio.status_interval.map(|every| Status::new(every, start_ns));
        while !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let ios = progress.load(Ordering::Relaxed);
            if let Some(bar) = &bar {
                update_progress(bar, config, start_ns, ios);
            }
            if let Some(status) = &mut status {
                status.maybe_print(config, ios, bar.as_ref());
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        workers.into_iter().map(|w| w.join().expect("benchmark thread panicked")).collect()
    });
    let hog_report = hogs.stop(&config.hogs, hog_units_before, start_ns);
    drop(idle_request);
    let device_after = engine.device().stats();
    // The path's own threads (an ATM dispatcher) count as part of the I/O path.
    let (stats_before, usage_before): (PathStats, ThreadUsage) = background_before;
    let background_stats = engine.background_stats().since(&stats_before);
    let background_usage = engine.background_usage().since(&usage_before);
    let mut m = Measurements {
        wall_ns: 0,
        read: DirStats::default(),
        write: DirStats::default(),
        usage: background_usage,
        path: background_stats,
        device: device_after.since(&device_before),
        peak_bw_bytes: None,
        verified_blocks: 0,
        hogs: (config.hogs.count > 0).then_some(hog_report),
        sync: DirStats::default(),
        trim: DirStats::default(),
    };
    let mut end_ns = start_ns;
    let mut samples = ThreadLog::default();
    let mut logs_written = Vec::new();
    for (index, outcome) in outcomes.into_iter().enumerate() {
        let o = outcome?;
        samples.add_samples(&o.log);
        if config.fio.logs.any() {
            logs_written.extend(o.log.write(&config.fio.logs, index + 1)?);
        }
        m.read.add(&o.read);
        m.write.add(&o.write);
        m.sync.add(&o.sync);
        m.trim.add(&o.trim);
        m.usage.add(&o.usage);
        m.path.add(&o.path);
        m.verified_blocks += o.verified_blocks;
        end_ns = end_ns.max(o.end_ns);
    }
    m.wall_ns = end_ns - start_ns;
    let since_start = Duration::from_nanos(now_ns().saturating_sub(start_ns));
    let started_unix_ms = std::time::SystemTime::now()
        .checked_sub(since_start)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    if crate::signal::interrupted() && m.total_ios() == 0 {
        return Err(Error::Interrupted { during: "setting up, before any I/O was measured".into() });
    }
    let bytes = (m.read.bytes + m.write.bytes).max(1);
    let read_fraction = if m.read.bytes + m.write.bytes == 0 {
        config.rw.read_fraction(config.rwmixread)
    } else {
        m.read.bytes as f64 / bytes as f64
    };
    // A trim moves no data: no share of the device's bandwidth to speak of.
    m.peak_bw_bytes = if config.rw.trims() { None } else { engine.device().peak_bandwidth(read_fraction) };
    let polled = config.path.completion != crate::path::CompletionKind::Interrupt;
    Ok(BenchResult {
        config: config.clone(),
        device_description: engine.device().describe(),
        completion_source: engine.device().completion_source(polled),
        size,
        measurements: m,
        interrupted: crate::signal::interrupted(),
        samples,
        logs_written,
        started_unix_ms,
        idle_polling,
    })
}

fn progress_bar(config: &BenchConfig) -> indicatif::ProgressBar {
    let len = match (config.runtime, config.ios) {
        (Some(t), _) => t.as_millis() as u64,
        (None, Some(n)) => n * config.threads as u64,
        (None, None) => 0,
    };
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
            .expect("valid template"),
    );
    bar
}

fn update_progress(bar: &indicatif::ProgressBar, config: &BenchConfig, start_ns: u64, ios: u64) {
    let elapsed = (now_ns() - start_ns) as f64 / 1e9;
    let iops = if elapsed > 0.0 { ios as f64 / elapsed } else { 0.0 };
    let position = if config.runtime.is_some() { (elapsed * 1000.0) as u64 } else { ios };
    bar.set_position(position);
    bar.set_message(format!("{} IOs, {:.0} IOPS", ios, iops));
}

/// Interim figures every `--status-interval` (fio's), on standard error:
/// requests so far, IOPS over the run and over the last interval, bandwidth.
struct Status {
    every_ns: u64,
    start_ns: u64,
    next_ns: u64,
    last: (u64, u64),
}

impl Status {
    fn new(every: Duration, start_ns: u64) -> Status {
        let every_ns = (every.as_nanos() as u64).max(1);
        Status { every_ns, start_ns, next_ns: start_ns + every_ns, last: (start_ns, 0) }
    }

    fn maybe_print(&mut self, config: &BenchConfig, ios: u64, bar: Option<&indicatif::ProgressBar>) {
        let now = now_ns();
        if now < self.next_ns {
            return;
        }
        self.next_ns += self.every_ns * ((now - self.next_ns) / self.every_ns + 1);
        let secs = (now - self.start_ns) as f64 / 1e9;
        let iops = ios as f64 / secs.max(1e-9);
        let interval = (ios - self.last.1) as f64 / ((now - self.last.0) as f64 / 1e9).max(1e-9);
        self.last = (now, ios);
        // Requests are counted, not bytes: with mixed sizes the bandwidth waits for the report.
        let bw = config.fio.bs_split.iter().all(Vec::is_empty).then_some(iops * config.block_size as f64);
        let name = config.fio.job_name.clone().unwrap_or_else(|| format!("{}-{}", config.rw.name(), config.path_name));
        let line = if config.fio.status_json {
            serde_json::json!({"status": {
                "jobname": name, "time_ms": (secs * 1000.0) as u64, "total_ios": ios, "iops": iops,
                "iops_interval": interval, "bw_bytes": bw.map(|b| b as u64),
            }})
            .to_string()
        } else {
            format!(
                "[{name}] {secs:.1}s: {ios} IOs, {} IOPS (last {:.1}s: {} IOPS){}",
                super::report::format_count(iops),
                self.every_ns as f64 / 1e9,
                super::report::format_count(interval),
                bw.map_or(String::new(), |b| format!(", {}", super::report::format_bw(b))),
            )
        };
        match bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

/// Holds the benchmark threads until every one has set up, then lets them
/// go together (and the timed phase starts). Unlike a `Barrier` it opens for
/// however many threads did start: a thread the system refused to create
/// must not leave the others waiting.
#[derive(Default)]
struct StartGate {
    /// Threads arrived, and whether the gate is open.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

impl StartGate {
    /// A thread arrives and waits for the gate to open.
    fn arrive_and_wait(&self) {
        let mut state = self.state.lock().expect("start gate poisoned");
        state.0 += 1;
        self.changed.notify_all();
        while !state.1 {
            state = self.changed.wait(state).expect("start gate poisoned");
        }
    }

    /// Waits until `threads` have arrived, then opens the gate.
    fn open_when(&self, threads: usize) {
        let mut state = self.state.lock().expect("start gate poisoned");
        while state.0 < threads {
            state = self.changed.wait(state).expect("start gate poisoned");
        }
        state.1 = true;
        self.changed.notify_all();
    }
}

/// What every benchmark thread shares.
struct Job<'a> {
    engine: &'a Engine,
    config: &'a BenchConfig,
    size: u64,
    verify: VerifyMode,
    gate: Arc<StartGate>,
    released_at: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
}

/// Where a thread's run stands.
struct ThreadRun<'a> {
    config: &'a BenchConfig,
    verify: VerifyMode,
    generator: Generator,
    /// Last version written to each block of the slice (verify only).
    versions: Vec<u64>,
    read: DirStats,
    write: DirStats,
    trim: DirStats,
    verified_blocks: u64,
    stop: &'a AtomicBool,
    progress: &'a AtomicU64,
    deadline_ns: u64,
    issued: u64,
    limit: u64,
    unreported: u64,
    /// Requests completing before this are the warm-up's: not counted.
    measure_from_ns: u64,
    /// Usage and path counters when the measured phase began (`None` during the warm-up).
    measured_since: Option<(ThreadUsage, PathStats)>,
    /// Per direction: when the next request may go (rate limit), and the interval.
    next_due_ns: [u64; 2],
    interval_ns: [Option<u64>; 2],
    log: ThreadLog,
    /// Flushes (`fsync=N`, `end_fsync`).
    sync: DirStats,
    /// Writes since the last flush, and whether one is due (`fsync=N`).
    unsynced_writes: u64,
    flush_due: bool,
    /// Requests completed (for `thinktime_blocks`).
    completions: u64,
}

impl ThreadRun<'_> {
    fn should_stop(&self, now: u64) -> bool {
        now >= self.deadline_ns
            || self.issued >= self.limit
            || self.stop.load(Ordering::Relaxed)
            || crate::signal::interrupted()
    }

    fn fail(&self, error: Error) -> Error {
        self.stop.store(true, Ordering::Relaxed);
        error
    }

    /// Ends the warm-up once its time has come: what the thread did so far is not counted.
    fn tick(&mut self, handle: &Handle, now: u64) {
        if self.measured_since.is_none() && now >= self.measure_from_ns {
            self.measured_since = Some((ThreadUsage::now(), handle.stats()));
        }
    }

    /// The direction the next request takes, held to the rate limits: a
    /// direction ahead of its rate gives way to the other one if that one
    /// may go now (as fio does; both then run at their rates), or else the
    /// thread sleeps until it is due. A thread that fell behind catches up
    /// back to back, however far behind (fio's schedule).
    fn pace(&mut self, wanted: Op) -> Op {
        if self.interval_ns == [None, None] {
            return wanted;
        }
        let due = |run: &Self, d: usize| run.interval_ns[d].map_or(0, |_| run.next_due_ns[d]);
        let mix = self.config.rw.read_fraction(self.config.rwmixread);
        let mut d = usize::from(wanted != Op::Read);
        let now = now_ns();
        if now < due(self, d) && mix > 0.0 && mix < 1.0 && now >= due(self, 1 - d) {
            d = 1 - d;
        }
        if now < due(self, d) {
            crate::clock::sleep_until_ns(due(self, d));
        }
        if let Some(interval) = self.interval_ns[d] {
            // fio's schedule (`usec_for_io`): the Nth request is due N intervals after
            // the start, so a thread held up (a loaded machine) makes the time up
            // back to back and the rate holds over the run, as fio's does.
            self.next_due_ns[d] += interval;
        }
        if d == 0 { Op::Read } else { Op::Write }
    }

    fn completed(&mut self, op: Op, latency_ns: u64, now: u64, block: u64, bytes: u64) {
        if self.measured_since.is_none() {
            return;
        }
        let offset = self.generator.offset(block);
        self.log.record(now.saturating_sub(self.measure_from_ns), latency_ns, op, bytes, offset);
        match op {
            Op::Read => self.read.record(latency_ns, bytes),
            Op::Trim => self.trim.record(latency_ns, bytes),
            _ => self.write.record(latency_ns, bytes),
        }
        self.unreported += 1;
        if self.unreported == PROGRESS_BATCH {
            self.progress.fetch_add(PROGRESS_BATCH, Ordering::Relaxed);
            self.unreported = 0;
        }
    }

    /// A request is about to go: a write counts toward `fsync=N`; the Nth
    /// makes a flush due, and nothing more is issued until it is done (as
    /// fio syncs after every N writes issued).
    fn issuing(&mut self, op: Op) {
        if op == Op::Write {
            self.unsynced_writes += 1;
            if self.config.fio.fsync_every.is_some_and(|n| self.unsynced_writes >= n) {
                self.flush_due = true;
            }
        }
    }

    /// After a request completed: pauses for `thinktime` every
    /// `thinktime_blocks`; returns whether it paused (the caller's clock
    /// reading is stale then).
    fn after(&mut self) -> bool {
        let fio = &self.config.fio;
        self.completions += 1;
        if fio.thinktime.is_zero() || !self.completions.is_multiple_of(fio.thinktime_blocks) {
            return false;
        }
        let start = now_ns();
        let spin_until = start + fio.thinktime_spin.as_nanos() as u64;
        while now_ns() < spin_until {
            std::hint::spin_loop();
        }
        crate::clock::sleep_until_ns(start + fio.thinktime.as_nanos() as u64);
        true
    }

    /// Makes the writes so far durable, timing it as a sync.
    fn flush(&mut self, handle: &mut Handle) -> Result<()> {
        let start = now_ns();
        handle.flush().map_err(|e| self.fail(e))?;
        if self.measured_since.is_some() {
            self.sync.record(now_ns() - start, 0);
        }
        self.unsynced_writes = 0;
        self.flush_due = false;
        Ok(())
    }

    /// Prepares a buffer for a write (verify) and returns the version it carries.
    fn prepare_write(&mut self, buf: &mut [u8], block: u64) {
        if self.verify == VerifyMode::LayOut {
            let offset = self.generator.offset(block);
            crate::pattern::fill(buf, offset, self.versions[block as usize] + 1);
        }
    }

    /// Records a finished write or checks a finished read (verify).
    fn settle(&mut self, op: Op, buf: &[u8], block: u64) -> Result<()> {
        let b = block as usize;
        let offset = self.generator.offset(block);
        let checked = match (self.verify, op) {
            (VerifyMode::Off, _) => return Ok(()),
            (VerifyMode::LayOut, Op::Write) => {
                self.versions[b] += 1;
                return Ok(());
            }
            (VerifyMode::LayOut, _) => crate::pattern::check(buf, offset, self.versions[b]),
            (VerifyMode::Existing, _) => crate::pattern::check_any(buf, offset).map_err(|detail| {
                format!(
                    "{detail}. A read-only run with --verify checks the pattern iopath laid out earlier and \
                     writes nothing: lay one out first with `iopath bench --device {} --rw write --verify \
                     --bs {}` (plus --allow-overwrite if iopath did not create the target, which destroys \
                     what it holds; iopath lays the pattern out in any file it creates)",
                    self.config.device, self.config.block_size
                )
            }),
        };
        checked.map_err(|detail| self.fail(Error::Verify { offset, detail }))?;
        self.verified_blocks += 1;
        Ok(())
    }
}

fn worker(job: &Job, thread: usize) -> Result<ThreadOutcome> {
    let config = job.config;
    // Every thread must reach the gate, even when its set-up fails.
    let setup = setup_thread(job, thread);
    if setup.is_err() {
        job.stop.store(true, Ordering::Relaxed);
    }
    job.gate.arrive_and_wait();
    let (mut handle, mut run) = setup?;
    let now = now_ns();
    // The measured phase starts now, or when the warm-up ends (the same time for all threads).
    let start = config.fio.ramp.map_or(now, |r| job.released_at.load(Ordering::Acquire) + r.as_nanos() as u64);
    run.measure_from_ns = start;
    run.next_due_ns = [now; 2];
    run.tick(&handle, now);
    run.deadline_ns = config.runtime.map_or(u64::MAX, |t| start + t.as_nanos() as u64);
    let result =
        if config.iodepth == 1 { run_blocking(&mut handle, &mut run) } else { run_queued(&mut handle, &mut run) };
    let end_ns = now_ns();
    run.tick(&handle, end_ns);
    result?;
    let (usage_before, path_before) = match run.measured_since.take() {
        Some(since) => since,
        // Stopped before its warm-up ended: nothing was measured.
        None => {
            if crate::signal::interrupted() {
                return Err(Error::Interrupted {
                    during: "in the warm-up (ramp_time), before anything was measured".into(),
                });
            }
            if !job.stop.load(Ordering::Relaxed) {
                return Err(Error::spec(
                    "ramp_time (--ramp-time)",
                    format!("{:?}", config.fio.ramp.unwrap_or_default()),
                    "the job moved all it had to move before its warm-up ended, so nothing was measured: \
                     shorten the warm-up, or run for a time (time_based with runtime; --runtime)",
                ));
            }
            // Another thread stopped the run (its error is the one reported): this
            // one measured nothing.
            (ThreadUsage::now(), handle.stats())
        }
    };
    let usage = ThreadUsage::now().since(&usage_before);
    let path = handle.stats().since(&path_before);
    if config.fio.verify_readback && run.verify == VerifyMode::LayOut && config.rw.writes() {
        read_back(&mut handle, &mut run)?;
    }
    Ok(ThreadOutcome {
        read: run.read,
        write: run.write,
        trim: run.trim,
        sync: run.sync,
        usage,
        path,
        verified_blocks: run.verified_blocks,
        end_ns,
        log: run.log,
    })
}

fn setup_thread<'a>(job: &'a Job, thread: usize) -> Result<(Handle, ThreadRun<'a>)> {
    let (engine, config) = (job.engine, job.config);
    let generator =
        Generator::new(config.rw, config.rwmixread, job.size, config.block_size, config.threads, thread, config.seed)?
            .with_distribution(&config.fio.distribution)
            .with_offset(config.fio.offset)
            .with_sizes(&config.fio.bs_split);
    if config.verify && generator.blocks < config.iodepth as u64 {
        return Err(Error::spec(
            "--iodepth",
            config.iodepth.to_string(),
            format!("--verify needs at least as many blocks per thread ({}) as requests in flight", generator.blocks),
        ));
    }
    if !config.fio.cpus.is_empty() {
        crate::sys::pin_to_cpus(&config.fio.cpus)
            .map_err(|source| Error::Os { context: "pinning an I/O thread to cpus_allowed".into(), source })?;
    }
    // Buffers fit the largest request (`bssplit`/`bsrange`).
    let bs = config.fio.bs_split.iter().flatten().map(|&(b, _)| b).fold(config.block_size, u64::max) as usize;
    let handle =
        engine.handle(HandleOptions { depth: config.iodepth, buffers: config.iodepth as usize, buffer_size: bs })?;
    let versions = if job.verify == VerifyMode::LayOut { lay_out(engine, &generator)? } else { Vec::new() };
    let limit = match (config.ios, config.runtime) {
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) => generator.blocks * config.fio.loops,
    };
    let run = ThreadRun {
        config,
        verify: job.verify,
        generator,
        versions,
        read: DirStats::default(),
        write: DirStats::default(),
        trim: DirStats::default(),
        verified_blocks: 0,
        stop: &job.stop,
        progress: &job.progress,
        deadline_ns: u64::MAX,
        issued: 0,
        limit,
        unreported: 0,
        measure_from_ns: 0,
        measured_since: None,
        next_due_ns: [0; 2],
        interval_ns: config.fio.rate_iops.map(|r| r.map(|r| (1e9 / r).max(1.0) as u64)),
        log: ThreadLog::new(&config.fio.logs),
        sync: DirStats::default(),
        unsynced_writes: 0,
        flush_due: false,
        completions: 0,
    };
    Ok((handle, run))
}

/// Writes version 1 of every block of the thread's slice, in large writes
/// (no larger than the device takes in one request).
fn lay_out(engine: &Engine, generator: &Generator) -> Result<Vec<u64>> {
    let bs = generator.block_size;
    let largest = PREFILL_CHUNK.min(engine.device().capabilities().max_segment_bytes as u64);
    let per_write = (largest / bs).max(1);
    let chunk = (per_write * bs) as usize;
    let mut handle = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: chunk })?;
    let mut block = 0;
    while block < generator.blocks {
        if crate::signal::interrupted() {
            return Err(Error::Interrupted { during: "laying out the region for --verify".into() });
        }
        let n = per_write.min(generator.blocks - block);
        let buf = handle.buffer(0).expect("prefill buffer is idle");
        for i in 0..n {
            let at = (i * bs) as usize;
            crate::pattern::fill(&mut buf[at..at + bs as usize], generator.offset(block + i), 1);
        }
        handle.write_from(0, generator.offset(block), (n * bs) as usize)?;
        block += n;
    }
    Ok(vec![1; generator.blocks as usize])
}

/// After the run (not measured): reads every block of the thread's slice back
/// and checks it holds the last version written (fio's verify phase).
fn read_back(handle: &mut Handle, run: &mut ThreadRun) -> Result<()> {
    let bs = run.generator.block_size as usize;
    for block in 0..run.generator.blocks {
        if crate::signal::interrupted() {
            return Err(Error::Interrupted { during: "reading back what was written (verify)".into() });
        }
        handle.read_into(0, run.generator.offset(block), bs).map_err(|e| run.fail(e))?;
        let buf = handle.buffer(0).expect("buffer 0 is idle").to_vec();
        run.settle(Op::Read, &buf, block)?;
    }
    Ok(())
}

fn run_blocking(handle: &mut Handle, run: &mut ThreadRun) -> Result<()> {
    let mut now = now_ns();
    while !run.should_stop(now) {
        let (op, block, len) = run.generator.next_request();
        let bs = len as usize;
        let op = run.pace(op);
        run.issuing(op);
        let offset = run.generator.offset(block);
        if op == Op::Write {
            let buf = handle.buffer(0).expect("buffer 0 is idle between requests");
            run.prepare_write(buf, block);
        }
        run.issued += 1;
        let start = now_ns();
        let result = match op {
            Op::Read => handle.read_into(0, offset, bs),
            Op::Trim => handle.trim(offset, bs),
            _ => handle.write_from(0, offset, bs),
        };
        now = now_ns();
        result.map_err(|e| run.fail(e))?;
        run.tick(handle, now);
        run.completed(op, now - start, now, block, len);
        run.settle(op, handle.buffer(0).expect("buffer 0 is idle"), block)?;
        // One clock reading per request: a new one only after a pause or a flush.
        let mut stale = run.after();
        if run.flush_due {
            run.flush(handle)?;
            stale = true;
        }
        if stale {
            now = now_ns();
        }
    }
    if run.config.fio.end_fsync && run.unsynced_writes > 0 {
        run.flush(handle)?;
    }
    Ok(())
}

fn run_queued(handle: &mut Handle, run: &mut ThreadRun) -> Result<()> {
    let depth = run.config.iodepth as usize;
    // Per buffer: what it carries (direction, block, length) and when it was submitted.
    let mut slots: Vec<(Op, u64, u64, u64)> = vec![(Op::Read, u64::MAX, 0, 0); depth];
    let mut done = Vec::with_capacity(depth);
    let issue =
        |handle: &mut Handle, run: &mut ThreadRun, slots: &mut [(Op, u64, u64, u64)], index: usize| -> Result<()> {
            let (op, mut block, len) = run.generator.next_request();
            let op = run.pace(op);
            if run.config.verify {
                // Never two requests on one block at once: the outcome would be undefined.
                while slots.iter().any(|s| s.1 == block) {
                    block = if run.config.rw.is_random() {
                        run.generator.random_block()
                    } else {
                        run.generator.next_request().1
                    };
                }
            }
            if op == Op::Write {
                run.prepare_write(handle.buffer(index).expect("slot buffer is idle"), block);
            }
            slots[index] = (op, block, len, now_ns());
            run.issued += 1;
            run.issuing(op);
            handle.submit(op, index, run.generator.offset(block), len as usize).map_err(|e| run.fail(e))
        };
    // Slots left idle while a flush waits for the queue to drain (`fsync=N`: the
    // flush covers every write before it, as fio's does).
    let mut idle = Vec::with_capacity(depth);
    let mut now = now_ns();
    for index in 0..depth {
        if run.should_stop(now) {
            break;
        }
        if run.flush_due {
            idle.push(index);
        } else {
            issue(handle, run, &mut slots, index)?;
        }
    }
    handle.commit()?;
    while handle.queued() > 0 {
        handle.reap(1, &mut done).map_err(|e| run.fail(e))?;
        now = now_ns();
        for completed in done.drain(..) {
            let index = completed.tag as usize;
            let (op, block, len, submitted) = slots[index];
            slots[index].1 = u64::MAX;
            completed.result.map_err(|e| run.fail(e))?;
            run.tick(handle, now);
            run.completed(op, now - submitted, now, block, len);
            run.settle(op, handle.buffer(index).expect("reaped buffer is idle"), block)?;
            if run.after() {
                now = now_ns();
            }
            if run.flush_due || run.should_stop(now) {
                idle.push(index);
            } else {
                issue(handle, run, &mut slots, index)?;
            }
        }
        if run.flush_due && handle.queued() == 0 {
            run.flush(handle)?;
            now = now_ns();
            let waiting = std::mem::take(&mut idle);
            for index in waiting {
                if run.should_stop(now) || run.flush_due {
                    idle.push(index);
                } else {
                    issue(handle, run, &mut slots, index)?;
                }
            }
        }
        handle.commit()?;
    }
    if run.config.fio.end_fsync && run.unsynced_writes > 0 {
        run.flush(handle)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_gate_lets_go_the_threads_that_did_start() {
        // Five threads were planned and three started: the three must not wait for the rest.
        let gate = StartGate::default();
        let released = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    gate.arrive_and_wait();
                    released.fetch_add(1, Ordering::Relaxed);
                });
            }
            gate.open_when(3);
        });
        assert_eq!(released.load(Ordering::Relaxed), 3);
        // Opening waits for the arrivals it is told of: none of them is let go early.
        let gate = StartGate::default();
        let arrived_first = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                arrived_first.store(true, Ordering::Relaxed);
                gate.arrive_and_wait();
            });
            gate.open_when(1);
            assert!(arrived_first.load(Ordering::Relaxed), "opened before the thread arrived");
        });
    }
}
