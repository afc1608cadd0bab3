//! `iopath fsbench`: the file layer's workloads with its read and fsync paths
//! side by side, in one run, on one freshly made file system.
//!
//! Workloads (each thread has its own random stream; `bs` bytes per op):
//!
//! - `randread`: buffered random reads over a file larger than the cache
//!   (almost every read a miss);
//! - `hitsweep`: the same with the cache at 25, 50, 75 and 100% of the file
//!   (after a warm-up pass), to see hit ratios and hit cost;
//! - `seqread`: each thread reads its share of the file from start to end
//!   (read-ahead at work), reported against the device's bandwidth;
//! - `region`: random reads confined to the first `region` bytes of the
//!   file: read-ahead must stay off (goodput = what the device moved);
//! - `fsync`: each thread appends `bs` to its own log file, fsync every N.
//!
//! Every op's latency goes into a histogram; the file layer's step times
//! (lookup, alloc, insert, submit, device, copy; fsync data, journal, flush,
//! commit) are divided by the ops that ran.

use super::run::{check_threads, thread_refused};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::DeviceSpec;
use crate::device::target::Guard;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::fs::cache::CacheStats;
use crate::fs::{FileSystem, FormatOptions, FsyncPath, MountOptions, ReadPath};
use crate::path::PathConfig;
use crate::units::format_size;
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One file-layer workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsWorkload {
    /// Buffered random reads, mostly misses.
    RandRead,
    /// Random reads at several cache sizes.
    HitSweep,
    /// Sequential reads (read-ahead).
    SeqRead,
    /// Random reads inside a small region.
    Region,
    /// Appends with an fsync every N.
    Fsync,
    /// Records overwritten in one shared log, an fdatasync after each: every
    /// thread writes `bs` bytes at its own slots of a [`LOG_RING_BYTES`] ring
    /// (a database's redo log with no group commit of its own: the threads'
    /// syncs meet on the same blocks).
    LogSync,
    /// Random reads of a direct file: the block map, then the device straight
    /// into the caller's memory (no cache, no copy: seed 004's bypass).
    Direct,
    /// The same through a bounce buffer and a copy (the path seed 004 removed).
    DirectCopy,
}

impl FsWorkload {
    /// Parses a workload name.
    pub fn parse(text: &str) -> Result<FsWorkload> {
        Ok(match text {
            "randread" => FsWorkload::RandRead,
            "hitsweep" => FsWorkload::HitSweep,
            "seqread" => FsWorkload::SeqRead,
            "region" => FsWorkload::Region,
            "fsync" => FsWorkload::Fsync,
            "logsync" => FsWorkload::LogSync,
            "direct" => FsWorkload::Direct,
            "direct-copy" => FsWorkload::DirectCopy,
            _ => {
                return Err(Error::spec(
                    "workload",
                    text,
                    "randread, hitsweep, seqread, region, fsync, logsync, direct or direct-copy",
                ));
            }
        })
    }

    /// Whether it reads the file of `--file-size` (laid out before the runs).
    pub fn reads_data(self) -> bool {
        !matches!(self, FsWorkload::Fsync | FsWorkload::LogSync)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            FsWorkload::RandRead => "randread",
            FsWorkload::HitSweep => "hitsweep",
            FsWorkload::SeqRead => "seqread",
            FsWorkload::Region => "region",
            FsWorkload::Fsync => "fsync",
            FsWorkload::LogSync => "logsync",
            FsWorkload::Direct => "direct",
            FsWorkload::DirectCopy => "direct-copy",
        }
    }
}

/// A read path and an fsync path, run together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsPaths {
    /// What a cache miss does.
    pub read: ReadPath,
    /// How fsync orders its writes.
    pub fsync: FsyncPath,
}

impl FsPaths {
    /// `conventional` or `aios` (both paths), or `READ/FSYNC` (e.g. `aios/conventional`).
    pub fn parse(text: &str) -> Result<FsPaths> {
        let (r, f) = text.split_once('/').unwrap_or((text, text));
        Ok(FsPaths { read: ReadPath::parse(r)?, fsync: FsyncPath::parse(f)? })
    }

    /// Its name, as parsed.
    pub fn name(&self) -> String {
        if self.read.name() == self.fsync.name() {
            self.read.name().to_string()
        } else {
            format!("{}/{}", self.read.name(), self.fsync.name())
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FsBenchConfig {
    /// Device spec (formatted first).
    pub device: String,
    /// What may be overwritten.
    pub guard: Guard,
    /// The engine's path (dispatch x completion) under the file layer.
    pub engine_path: PathConfig,
    /// Workloads, in order.
    pub workloads: Vec<FsWorkload>,
    /// File-layer paths, each run on every workload.
    pub paths: Vec<FsPaths>,
    /// Threads.
    pub threads: usize,
    /// Time per run.
    pub runtime: Duration,
    /// Size of the file read.
    pub file_size: u64,
    /// The `region` workload's region.
    pub region: u64,
    /// Bytes per op.
    pub bs: u64,
    /// Page cache bound (read workloads other than `hitsweep`).
    pub cache_bytes: u64,
    /// Largest read-ahead window in bytes.
    pub readahead_bytes: u64,
    /// `fsync` workload: appends per fsync.
    pub fsync_every: u64,
    /// Rounds (each round runs every path once, alternating).
    pub repeat: usize,
}

impl FsBenchConfig {
    /// Whether some workload reads the file of `--file-size` (laid out
    /// before the runs; fsync and logsync alone write their own).
    pub fn lays_out_file(&self) -> bool {
        self.workloads.iter().any(|w| w.reads_data())
    }

    /// Checks the settings before anything is formatted: each wrong one
    /// gets a message that names it and says what would do.
    pub fn validate(&self) -> Result<()> {
        check_threads(self.threads)?;
        if self.runtime.is_zero() {
            return Err(Error::spec("--runtime", "0", "a run must last longer than 0, e.g. --runtime 2s"));
        }
        if self.repeat == 0 {
            return Err(Error::spec("--repeat", "0", "at least one round"));
        }
        if self.bs == 0 || !self.bs.is_multiple_of(512) {
            return Err(Error::spec("--bs", format_size(self.bs), "a multiple of 512 bytes, e.g. 4k"));
        }
        if self.file_size < self.bs * self.threads as u64 {
            return Err(Error::spec(
                "--file-size",
                format_size(self.file_size),
                format!(
                    "at least --bs ({}) per thread ({} thread(s)): {} or more, or a smaller --bs",
                    format_size(self.bs),
                    self.threads,
                    format_size(self.bs * self.threads as u64)
                ),
            ));
        }
        let reads_through_cache = self.workloads.iter().any(|w| *w != FsWorkload::HitSweep);
        if reads_through_cache && self.cache_bytes < MIN_CACHE_BYTES {
            return Err(Error::spec(
                "--cache",
                format_size(self.cache_bytes),
                format!(
                    "at least {} (the page cache keeps {} pages whatever its bound)",
                    format_size(MIN_CACHE_BYTES),
                    crate::fs::cache::MIN_PAGES
                ),
            ));
        }
        if self.workloads.contains(&FsWorkload::Region) && !(self.bs..=self.file_size).contains(&self.region) {
            return Err(Error::spec(
                "--region",
                format_size(self.region),
                format!(
                    "from --bs ({}) to --file-size ({}): the region lies inside the file",
                    format_size(self.bs),
                    format_size(self.file_size)
                ),
            ));
        }
        if self.workloads.contains(&FsWorkload::LogSync) && self.bs * self.threads as u64 > LOG_RING_BYTES {
            return Err(Error::spec(
                "--bs",
                format_size(self.bs),
                format!(
                    "the logsync workload's log is a {} ring with a slot per thread: --bs times --threads ({}) must \
                     fit in it, e.g. --bs 512",
                    format_size(LOG_RING_BYTES),
                    self.threads
                ),
            ));
        }
        if self.workloads.contains(&FsWorkload::Fsync) && self.fsync_every == 0 {
            return Err(Error::spec("--fsync-every", "0", "at least 1 append per fsync"));
        }
        Ok(())
    }
}

/// The size of the `logsync` workload's log, a ring its threads' records go around.
pub const LOG_RING_BYTES: u64 = 1 << 20;

/// The smallest page cache bound `fsbench` takes: what the page cache keeps
/// whatever its bound.
const MIN_CACHE_BYTES: u64 = crate::fs::cache::MIN_PAGES as u64 * crate::fs::format::BLOCK_U64;

/// One run: a workload on a path.
#[derive(Debug, Clone)]
pub struct FsRun {
    /// The workload.
    pub workload: FsWorkload,
    /// The paths.
    pub paths: FsPaths,
    /// Cache bound of this run.
    pub cache_bytes: u64,
    /// Round number (0-based).
    pub round: usize,
    /// Ops done.
    pub ops: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Mean op latency in ns.
    pub mean_ns: f64,
    /// Median op latency in ns.
    pub p50_ns: u64,
    /// 99th percentile in ns.
    pub p99_ns: u64,
    /// CPU (user + system) of the benchmark threads per op, ns.
    pub cpu_ns_per_op: f64,
    /// Step times per op in ns: (step, ns per op, share of ops that ran it).
    pub steps: Vec<(&'static str, f64, f64)>,
    /// Cache counters of the run.
    pub cache: CacheStats,
    /// Bytes the device moved (read + written) during the run.
    pub device_bytes: u64,
    /// Bytes the application moved.
    pub app_bytes: u64,
    /// The device's peak bandwidth for this mix, if known (emulated devices).
    pub device_peak: Option<f64>,
}

impl FsRun {
    /// Ops per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.seconds
    }

    /// Application bytes per second.
    pub fn app_bandwidth(&self) -> f64 {
        self.app_bytes as f64 / self.seconds
    }

    /// Device bytes per second.
    pub fn device_bandwidth(&self) -> f64 {
        self.device_bytes as f64 / self.seconds
    }

    /// Cache hit ratio.
    pub fn hit_ratio(&self) -> f64 {
        let looks = self.cache.hits + self.cache.misses;
        if looks == 0 { 0.0 } else { self.cache.hits as f64 / looks as f64 }
    }
}

fn engine(device: &Arc<dyn crate::device::Device>, path: &PathConfig) -> Result<Arc<Engine>> {
    Ok(Arc::new(Engine::with_device(Arc::clone(device), path.clone())?))
}

/// Runs every workload on every path; `progress` is told about each run as it ends.
pub fn run(config: &FsBenchConfig, mut progress: impl FnMut(&FsRun)) -> Result<Vec<FsRun>> {
    config.validate()?;
    let mut spec = DeviceSpec::parse(&config.device, Some(config.file_size * 2 + (256 << 20)))?;
    if let Some(target) = spec.target_mut()
        && std::fs::metadata(&target.path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
    {
        // A block device has the size it has: the whole of it is formatted.
        target.size = None;
    }
    spec.protect(config.guard, false);
    let device = spec.open()?;
    // The file, its metadata and the journal must fit.
    const RESERVE: u64 = 64 << 20;
    let needed = config.file_size + config.file_size / 8 + RESERVE;
    if device.size() < needed {
        // The largest file that fits, in whole MiB (whole blocks below that): what to ask for instead.
        let fits = device.size().saturating_sub(RESERVE) / 9 * 8;
        let unit = if fits >= 1 << 20 { (1 << 20).max(config.bs) } else { config.bs };
        let fits = fits / unit * unit;
        let instead = if fits >= config.bs * config.threads as u64 {
            format!("--file-size {} or less fits", format_size(fits))
        } else {
            format!("no file fits: use a device of at least {}", format_size(needed))
        };
        return Err(Error::spec(
            "--file-size",
            format_size(config.file_size),
            format!(
                "{} holds {}; a file of this size needs about {} of device (the file, its metadata and {} \
                 for the journal and the rest): {instead}",
                config.device,
                format_size(device.size()),
                format_size(needed),
                format_size(RESERVE)
            ),
        ));
    }
    let eng = engine(&device, &config.engine_path)?;
    FileSystem::format(Arc::clone(&eng), FormatOptions::default())?;
    if config.lays_out_file() {
        lay_out(&eng, config)?;
    }
    let mut out = Vec::new();
    for &workload in &config.workloads {
        let caches: Vec<u64> = match workload {
            FsWorkload::HitSweep => (1..=4).map(|q| config.file_size * q / 4).collect(),
            _ => vec![config.cache_bytes],
        };
        for cache_bytes in caches {
            for round in 0..config.repeat {
                for &paths in &config.paths {
                    if crate::signal::interrupted() {
                        return Ok(out);
                    }
                    let r = run_one(&device, config, workload, paths, cache_bytes, round)?;
                    progress(&r);
                    out.push(r);
                }
            }
        }
    }
    Ok(out)
}

/// The file every read workload reads: `file_size` bytes of a known pattern.
fn lay_out(eng: &Arc<Engine>, config: &FsBenchConfig) -> Result<()> {
    let (fs, _) = FileSystem::mount(Arc::clone(eng))?;
    fs.create("data")?;
    let f = fs.open_direct("data")?;
    let chunk = 1 << 20;
    let mut buf = vec![0u8; chunk];
    let mut at = 0;
    while at < config.file_size {
        let n = (config.file_size - at).min(chunk as u64) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = ((at + i as u64) / 4096 % 251) as u8;
        }
        f.write_at(&buf[..n], at)?;
        at += n as u64;
    }
    f.fsync()?;
    drop(f);
    fs.unmount()
}

fn run_one(
    device: &Arc<dyn crate::device::Device>,
    config: &FsBenchConfig,
    workload: FsWorkload,
    paths: FsPaths,
    cache_bytes: u64,
    round: usize,
) -> Result<FsRun> {
    let eng = engine(device, &config.engine_path)?;
    let options = MountOptions {
        cache_bytes,
        read_path: paths.read,
        fsync_path: paths.fsync,
        // The sweep warms the cache with one sequential pass; read-ahead would then go on
        // loading after it and count in the measured run.
        readahead_bytes: if workload == FsWorkload::HitSweep { 0 } else { config.readahead_bytes },
        step_times: true,
        direct_copy: workload == FsWorkload::DirectCopy,
        // Each workload measures what it names: randread the miss path, region that
        // nothing is read beyond what is asked (read-around would read around misses
        // until the cache is full; `scripts/real-apps` measures it on programs).
        read_around_bytes: 0,
        ..MountOptions::default()
    };
    let (fs, _) = FileSystem::mount_with(eng, options)?;
    if workload == FsWorkload::HitSweep {
        // Warm the cache: one pass over the file.
        let f = fs.open("data")?;
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < config.file_size {
            at += f.read_at(&mut buf, at)?.max(1) as u64;
        }
    }
    if workload == FsWorkload::LogSync {
        // The log exists at its full size, durable: every record is an overwrite.
        let log = fs.open_or_create("ring")?;
        log.write_at(&vec![0; LOG_RING_BYTES as usize], 0)?;
        log.fsync()?;
    }
    let before = fs.stats();
    let stop = Arc::new(AtomicBool::new(false));
    let start = now_ns();
    let mut threads = Vec::with_capacity(config.threads);
    for t in 0..config.threads {
        let (fs, thread_stop, thread_config) = (fs.clone(), Arc::clone(&stop), config.clone());
        match std::thread::Builder::new()
            .name(format!("iopath-fs-{t}"))
            .spawn(move || worker(&fs, &thread_config, workload, t, &thread_stop))
        {
            Ok(thread) => threads.push(thread),
            Err(source) => {
                stop.store(true, Ordering::Release);
                for thread in threads {
                    let _ = thread.join();
                }
                return Err(thread_refused(t, config.threads, source));
            }
        }
    }
    let deadline = start + config.runtime.as_nanos() as u64;
    while now_ns() < deadline && !crate::signal::interrupted() {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Release);
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut ops = 0;
    let mut app_bytes = 0;
    let mut cpu = 0;
    for t in threads {
        let r = t.join().map_err(|_| Error::Interrupted { during: "a benchmark thread panicked".into() })??;
        hist.add(&r.hist).expect("same histogram bounds");
        ops += r.ops;
        app_bytes += r.bytes;
        cpu += r.cpu_ns;
    }
    let seconds = (now_ns() - start) as f64 / 1e9;
    let after = fs.stats();
    let steps = fs
        .steps()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, _, n)| *n > 0)
        .map(|(name, ns, n)| (name, ns as f64 / ops.max(1) as f64, n as f64 / ops.max(1) as f64))
        .collect();
    let read_fraction = if workload.reads_data() { 1.0 } else { 0.0 };
    let run = FsRun {
        workload,
        paths,
        cache_bytes,
        round,
        ops,
        seconds,
        mean_ns: hist.mean(),
        p50_ns: hist.value_at_quantile(0.5),
        p99_ns: hist.value_at_quantile(0.99),
        cpu_ns_per_op: cpu as f64 / ops.max(1) as f64,
        steps,
        cache: CacheStats {
            hits: after.cache.hits - before.cache.hits,
            misses: after.cache.misses - before.cache.misses,
            readahead_pages: after.cache.readahead_pages - before.cache.readahead_pages,
            readahead_used: after.cache.readahead_used - before.cache.readahead_used,
            read_around_pages: after.cache.read_around_pages - before.cache.read_around_pages,
            read_around_used: after.cache.read_around_used - before.cache.read_around_used,
            evictions: after.cache.evictions - before.cache.evictions,
            writebacks: after.cache.writebacks - before.cache.writebacks,
            duplicates: after.cache.duplicates - before.cache.duplicates,
            ..after.cache
        },
        device_bytes: (after.device_read_bytes + after.device_written_bytes)
            - (before.device_read_bytes + before.device_written_bytes),
        app_bytes,
        device_peak: device.peak_bandwidth(read_fraction),
    };
    fs.unmount()?;
    Ok(run)
}

struct WorkerResult {
    hist: Histogram<u64>,
    ops: u64,
    bytes: u64,
    cpu_ns: u64,
}

fn worker(
    fs: &FileSystem,
    config: &FsBenchConfig,
    workload: FsWorkload,
    t: usize,
    stop: &AtomicBool,
) -> Result<WorkerResult> {
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut rng = fastrand::Rng::with_seed(t as u64 * 7919 + 1);
    let bs = config.bs;
    // Aligned, as a direct transfer into it needs.
    let mut buf = crate::IoBuf::new(bs as usize);
    let usage = ThreadUsage::now();
    let mut ops = 0u64;
    let blocks = config.file_size / bs;
    let region_blocks = (config.region.min(config.file_size) / bs).max(1);
    let share = blocks / config.threads as u64;
    let mut seq = share * t as u64;
    let (file, log) = match workload {
        FsWorkload::Fsync => {
            let name = format!("log{t}");
            let f = fs.open_or_create(&name)?;
            f.truncate(0)?;
            (None, Some(f))
        }
        FsWorkload::LogSync => (None, Some(fs.open("ring")?)),
        FsWorkload::Direct | FsWorkload::DirectCopy => (Some(fs.open_direct("data")?), None),
        _ => (Some(fs.open("data")?), None),
    };
    rng.fill(&mut buf);
    // logsync: this thread's slots, one every `threads` records around the ring.
    let mut record = t as u64 * bs;
    let stride = config.threads as u64 * bs;
    while !stop.load(Ordering::Relaxed) {
        let t0 = now_ns();
        match workload {
            FsWorkload::RandRead | FsWorkload::HitSweep | FsWorkload::Direct | FsWorkload::DirectCopy => {
                let f = file.as_ref().expect("data file");
                f.read_at(&mut buf, rng.u64(..blocks) * bs)?;
            }
            FsWorkload::Region => {
                let f = file.as_ref().expect("data file");
                f.read_at(&mut buf, rng.u64(..region_blocks) * bs)?;
            }
            FsWorkload::SeqRead => {
                let f = file.as_ref().expect("data file");
                f.read_at(&mut buf, seq * bs)?;
                seq += 1;
                if seq >= share * (t as u64 + 1) {
                    seq = share * t as u64;
                }
            }
            FsWorkload::Fsync => {
                let f = log.as_ref().expect("log file");
                if f.len() >= 64 << 20 {
                    f.truncate(0)?;
                    f.fsync()?;
                }
                f.append(&buf)?;
                if (ops + 1).is_multiple_of(config.fsync_every) {
                    f.fsync()?;
                }
            }
            FsWorkload::LogSync => {
                let f = log.as_ref().expect("log file");
                f.write_at(&buf, record)?;
                f.fdatasync()?;
                record += stride;
                if record + bs > LOG_RING_BYTES {
                    record = t as u64 * bs;
                }
            }
        }
        let _ = hist.record((now_ns() - t0).max(1));
        ops += 1;
    }
    let used = ThreadUsage::now().since(&usage);
    Ok(WorkerResult { hist, ops, bytes: ops * bs, cpu_ns: used.user_ns + used.sys_ns })
}
