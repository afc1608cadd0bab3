//! `iopath doctor`: what this machine and a device support, what waiting
//! costs here, and which path to use.
//!
//! It reads what the kernel says (version, io_uring sysctls and seccomp,
//! which io_uring setup flags it accepts, the device's queue settings in
//! sysfs, the memlock limit, CPU pressure), measures what the brief of this
//! project says matters most on a given machine (a system call, a wake-up of
//! a sleeping thread on another CPU, a timer sleep's overshoot, an io_uring
//! no-op), how idle CPUs wait and what a wake-up costs while they poll
//! instead ([`crate::idle`]), and, for a device, runs a few short read-only
//! benchmarks of the paths that could win and recommends the fastest, with
//! the reasons. Nothing is ever written to the device.

use crate::bench::stats::median;
use crate::bench::{BenchConfig, Rw, run};
use crate::clock::now_ns;
use crate::device::target::Guard;
use crate::error::{Error, Result};
use crate::idle::{IdleFacts, IdlePolling, polling_now};
use crate::path::PathSpec;
use crate::sync::{AtomicU32, Ordering, Parking};
use crate::sys;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One io_uring setup flag and whether this kernel accepts it.
#[derive(Debug, Clone)]
pub struct RingFlag {
    /// Its name (`SINGLE_ISSUER`).
    pub name: &'static str,
    /// Accepted, or the error the kernel gave.
    pub result: std::result::Result<(), String>,
    /// What iopath uses it for.
    pub used_for: &'static str,
}

/// What io_uring can do here.
#[derive(Debug, Clone)]
pub struct IoUringFacts {
    /// `/proc/sys/kernel/io_uring_disabled` (0 on, 1 root/group only, 2 off), if present.
    pub disabled_sysctl: Option<u32>,
    /// The seccomp mode of this process (0 none, 1 strict, 2 filter).
    pub seccomp: Option<u32>,
    /// Whether a plain ring can be created.
    pub available: std::result::Result<(), String>,
    /// Setup flags probed one by one.
    pub flags: Vec<RingFlag>,
}

/// The queue of a block device as sysfs describes it.
#[derive(Debug, Clone, Default)]
pub struct DeviceFacts {
    /// The path examined.
    pub path: String,
    /// `block device`, `file on <fs>` ...
    pub kind: String,
    /// The kernel's name of the (whole) device, e.g. `loop0`, `nvme0n1`.
    pub block_name: Option<String>,
    /// Logical block size (bytes).
    pub logical_block_size: Option<u32>,
    /// O_DIRECT alignment (statx DIOALIGN for files, the logical block size for devices).
    pub dio_alignment: Option<u32>,
    /// `queue/io_poll`: whether the device has poll queues (kernel IOPOLL).
    pub io_poll: Option<String>,
    /// `queue/io_poll_delay`.
    pub io_poll_delay: Option<String>,
    /// `queue/scheduler`.
    pub scheduler: Option<String>,
    /// `queue/nomerges`.
    pub nomerges: Option<String>,
    /// `queue/nr_requests`: the queue depth of the block layer.
    pub nr_requests: Option<String>,
    /// `queue/rotational`.
    pub rotational: Option<String>,
    /// `queue/max_sectors_kb`: the largest request the device takes whole.
    pub max_sectors_kb: Option<String>,
    /// A loop device's backing file and whether it uses direct I/O.
    pub loop_backing: Option<String>,
    /// Why kernel polling is or is not available for it.
    pub polling: String,
}

/// Measured costs on this machine (ns; medians).
#[derive(Debug, Clone, Copy, Default)]
pub struct Costs {
    /// One no-op system call.
    pub syscall_ns: f64,
    /// Waking a thread that sleeps on a futex on another CPU, until it runs.
    pub cross_cpu_wake_ns: Option<f64>,
    /// The same while idle CPUs poll (measured holding an [`IdlePolling`]
    /// request; `None` where it cannot be asked for or polling was already in force).
    pub cross_cpu_wake_polling_ns: Option<f64>,
    /// How late a 50 µs timer sleep ends (timer slack 1 ns).
    pub timer_overshoot_ns: f64,
    /// One io_uring no-op in batches of 32.
    pub uring_nop_ns: Option<f64>,
}

/// The CPUs and how contended they are.
#[derive(Debug, Clone, Default)]
pub struct CpuFacts {
    /// CPUs this process may use.
    pub cpus: usize,
    /// `/proc/pressure/cpu` "some avg10" (%): share of time some task waited for a CPU.
    pub pressure_some_avg10: Option<f64>,
    /// The 1-minute load average.
    pub load1: Option<f64>,
}

/// One short benchmark of a candidate path.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The path name.
    pub path: String,
    /// Blocking threads.
    pub threads: usize,
    /// Reads per second.
    pub iops: f64,
    /// Mean latency (ns).
    pub mean_ns: f64,
    /// 99th percentile latency (ns).
    pub p99_ns: u64,
    /// CPU per I/O of the I/O threads and the path's own (ns).
    pub cpu_ns_per_io: f64,
}

/// What to use, for one number of threads.
#[derive(Debug, Clone)]
pub struct Recommendation {
    /// Blocking threads.
    pub threads: usize,
    /// The path.
    pub path: String,
    /// Why.
    pub why: String,
    /// The same path's trial again while idle CPUs polled, where the trials
    /// ran with them halting and polling would make wake-ups much cheaper.
    pub with_idle_polling: Option<Trial>,
}

/// Everything `doctor` found.
#[derive(Debug, Clone)]
pub struct Report {
    /// `uname -r`.
    pub kernel: String,
    /// `uname -m`.
    pub machine: String,
    /// io_uring.
    pub io_uring: IoUringFacts,
    /// RLIMIT_MEMLOCK soft and hard (bytes; `u64::MAX` = unlimited).
    pub memlock: (u64, u64),
    /// CPUs.
    pub cpu: CpuFacts,
    /// How idle CPUs wait (as found, before any request of doctor's own).
    pub idle: IdleFacts,
    /// What to do about expensive wake-ups of idle CPUs, when it pays.
    pub idle_advice: Option<String>,
    /// The trials ran while idle CPUs polled (`--idle-poll`, or another process's request).
    pub trials_idle_polling: bool,
    /// Measured costs.
    pub costs: Costs,
    /// The device, if one was named.
    pub device: Option<DeviceFacts>,
    /// The device spec the trials ran on.
    pub spec: Option<String>,
    /// Short benchmarks.
    pub trials: Vec<Trial>,
    /// What to use.
    pub recommendations: Vec<Recommendation>,
    /// One path for every thread count tried, when one comes close to the
    /// best at each (`threads` is 0): a program whose thread count varies
    /// need not choose.
    pub one_path: Option<Recommendation>,
}

/// What `doctor` should look at.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    /// A device spec (`uring:/dev/nvme0n1`, `emu:nand`) or a bare path (taken as `uring:PATH`).
    pub device: Option<String>,
    /// Run the short benchmarks (read-only) on the device.
    pub measure: bool,
    /// How long each trial runs.
    pub trial_time: Duration,
    /// Thread counts to try.
    pub threads: Vec<usize>,
    /// Run the trials while idle CPUs poll ([`IdlePolling`]).
    pub idle_poll: bool,
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

const RING_FLAGS: &[(&str, u32, &str)] = &[
    ("SQPOLL", 1 << 1, "uring:...,sqpoll=1 (a kernel thread submits)"),
    ("IOPOLL", 1 << 0, "kernel polling (the ring; the device must have poll queues too: see below)"),
    ("HYBRID_IOPOLL", (1 << 0) | (1 << 17), "the kernel's hybrid polling (6.13+; iopath sleeps in user space)"),
    ("COOP_TASKRUN", 1 << 8, "the ring the combining paths share between threads"),
    ("TASKRUN_FLAG", (1 << 8) | (1 << 9), "seeing pending completions on a shared ring without a system call"),
    ("SINGLE_ISSUER", 1 << 12, "per-thread rings (with DEFER_TASKRUN)"),
    ("DEFER_TASKRUN", (1 << 12) | (1 << 13), "per-thread rings: completions only when the owner asks"),
    ("NO_SQARRAY", 1 << 16, "(not used)"),
];

fn io_uring_facts() -> IoUringFacts {
    let disabled_sysctl = read_trim("/proc/sys/kernel/io_uring_disabled").and_then(|s| s.parse().ok());
    let seccomp = read_trim("/proc/self/status")
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok()));
    let explain = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::EPERM) => format!("{e} (io_uring_disabled, seccomp or a missing capability)"),
        Some(libc::EINVAL) => format!("{e} (this kernel does not know the flag)"),
        Some(libc::ENOSYS) => format!("{e} (no io_uring in this kernel)"),
        _ => e.to_string(),
    };
    let available = sys::io_uring_setup_works(8, 0).map_err(explain);
    let flags = RING_FLAGS
        .iter()
        .map(|&(name, bits, used_for)| RingFlag {
            name,
            result: sys::io_uring_setup_works(8, bits).map_err(explain),
            used_for,
        })
        .collect();
    IoUringFacts { disabled_sysctl, seccomp, available, flags }
}

fn measure_syscall() -> f64 {
    let rounds: Vec<f64> = (0..5)
        .map(|_| {
            let n = 20_000;
            let t = now_ns();
            for _ in 0..n {
                sys::null_syscall();
            }
            (now_ns() - t) as f64 / n as f64
        })
        .collect();
    median(rounds)
}

/// Two threads on two CPUs hand a token back and forth through futexes; a
/// hand-over is one wake-up of a sleeping thread on the other CPU. (Both are
/// threads of their own: pinning does not outlive the measurement.)
fn measure_cross_cpu_wake(cpus: usize) -> Option<f64> {
    measure_cross_cpu_wake_rounds(cpus, 400)
}

/// What waking a sleeping thread on another CPU costs now (ns, median of
/// 100 round trips; `None` on one CPU): the figure that decides how
/// sleeping policies compare with spinning ones on a machine, for a report
/// that says why a finding did not hold. A few milliseconds.
pub fn cross_cpu_wake_ns() -> Option<f64> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    measure_cross_cpu_wake_rounds(cpus, 100)
}

fn measure_cross_cpu_wake_rounds(cpus: usize, rounds: u32) -> Option<f64> {
    if cpus < 2 {
        return None;
    }
    // The token, a futex the answering side sleeps on, and one the asking side sleeps on.
    let shared = Arc::new((AtomicU32::new(0), Parking::default(), Parking::default()));
    let answering = {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            let _ = sys::pin_to_cpu(1);
            let (token, mine, theirs) = (&shared.0, &shared.1, &shared.2);
            for i in 0..rounds {
                wait_token(token, mine, 2 * i + 1);
                token.store(2 * i + 2, Ordering::Release);
                theirs.fetch_add(1, Ordering::Release);
                theirs.wake_all();
            }
        })
    };
    let asking = std::thread::spawn(move || {
        let _ = sys::pin_to_cpu(0);
        let (token, theirs, mine) = (&shared.0, &shared.1, &shared.2);
        let mut samples = Vec::with_capacity(rounds as usize);
        for i in 0..rounds {
            let start = now_ns();
            token.store(2 * i + 1, Ordering::Release);
            theirs.fetch_add(1, Ordering::Release);
            theirs.wake_all();
            wait_token(token, mine, 2 * i + 2);
            // A round trip is two wake-ups.
            samples.push((now_ns() - start) as f64 / 2.0);
        }
        samples
    });
    let samples = asking.join().ok()?;
    answering.join().ok()?;
    Some(median(samples))
}

/// Sleeps on `parking` until `token` reads `value`.
fn wait_token(token: &AtomicU32, parking: &Parking, value: u32) {
    while token.load(Ordering::Acquire) < value {
        let seen = parking.load(Ordering::Acquire);
        if token.load(Ordering::Acquire) >= value {
            break;
        }
        parking.wait(seen, Some(100_000_000));
    }
}

fn measure_timer_overshoot() -> f64 {
    crate::clock::minimize_timer_slack();
    let samples: Vec<f64> = (0..200)
        .map(|_| {
            let t = now_ns();
            sys::sleep_ns(50_000);
            (now_ns() - t).saturating_sub(50_000) as f64
        })
        .collect();
    median(samples)
}

fn measure_uring_nop() -> Option<f64> {
    let mut ring = io_uring::IoUring::new(64).ok()?;
    let nop = io_uring::opcode::Nop::new().build();
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let t = now_ns();
        for _ in 0..200 {
            for _ in 0..32 {
                // SAFETY: a NOP touches no memory.
                unsafe { ring.submission().push(&nop).ok()? };
            }
            ring.submit_and_wait(32).ok()?;
            ring.completion().for_each(drop);
        }
        rounds.push((now_ns() - t) as f64 / (200.0 * 32.0));
    }
    Some(median(rounds))
}

fn cpu_facts() -> CpuFacts {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pressure_some_avg10 = read_trim("/proc/pressure/cpu").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("some"))?
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("avg10="))?
            .parse()
            .ok()
    });
    let load1 = read_trim("/proc/loadavg").and_then(|s| s.split_whitespace().next()?.parse().ok());
    CpuFacts { cpus, pressure_some_avg10, load1 }
}

fn device_facts(target: &Path) -> Result<DeviceFacts> {
    let (major, minor, is_block) = sys::device_numbers(target).map_err(|source| Error::Target {
        action: "examine",
        path: target.to_path_buf(),
        source,
    })?;
    let mut facts = DeviceFacts { path: target.display().to_string(), ..Default::default() };
    if is_block {
        facts.kind = "block device".into();
    } else {
        let fs = sys::file_system_type(target).map(|t| format!("{t:#x}")).unwrap_or_default();
        facts.kind = format!("file (file system magic {fs}) on device {major}:{minor}");
        if let Ok(f) = std::fs::File::open(target) {
            facts.dio_alignment = sys::dio_alignment(&f);
        }
    }
    if let Some((name, dir)) = crate::device::target::block_queue_dir(major, minor) {
        let q = dir.join("queue");
        facts.logical_block_size = read_trim(q.join("logical_block_size")).and_then(|s| s.parse().ok());
        if is_block {
            facts.dio_alignment = facts.logical_block_size;
        }
        facts.io_poll = read_trim(q.join("io_poll"));
        facts.io_poll_delay = read_trim(q.join("io_poll_delay"));
        facts.scheduler = read_trim(q.join("scheduler"));
        facts.nomerges = read_trim(q.join("nomerges"));
        facts.nr_requests = read_trim(q.join("nr_requests"));
        facts.max_sectors_kb = read_trim(q.join("max_sectors_kb"));
        facts.rotational = read_trim(q.join("rotational"));
        if name.starts_with("loop") {
            let backing = read_trim(dir.join("loop/backing_file")).unwrap_or_default();
            let dio = read_trim(dir.join("loop/dio")).unwrap_or_default();
            facts.loop_backing = Some(format!("{backing} (direct I/O {})", if dio == "1" { "on" } else { "off" }));
        }
        facts.block_name = Some(name);
    }
    facts.polling = match (facts.io_poll.as_deref(), facts.block_name.as_deref()) {
        (Some("1"), _) => "the device has poll queues: kernel IOPOLL works (iopath probes it when it opens the device)".into(),
        (_, Some(n)) if n.starts_with("loop") => "no: a loop device has no poll queues (its completions come from a kernel worker thread); iopath polls the completion ring in user space instead".into(),
        (_, Some(n)) if n.starts_with("nvme") => "no poll queues: load the nvme driver with poll_queues=N (e.g. nvme.poll_queues=2 on the kernel command line) to let the kernel poll".into(),
        (_, Some(n)) if n.starts_with("vd") => "no: virtio-blk has no poll queues in this setup; iopath polls the completion ring in user space instead".into(),
        (Some(_), _) => "no poll queues (queue/io_poll is 0); iopath polls the completion ring in user space instead".into(),
        _ => "unknown (no sysfs queue found)".into(),
    };
    Ok(facts)
}

/// The candidate that runs the kernel's own synchronous path: pread on the
/// same target (`psync:` device), each thread sleeping in the kernel per read.
const PREAD_CANDIDATE: &str = "sync-intr on psync:";

fn trial(spec: &str, path_name: &str, threads: usize, time: Duration) -> Result<Trial> {
    // The pread candidate swaps the backend, keeping the target and its options.
    let pread_spec;
    let (spec, path_name, label) = match (path_name, spec.strip_prefix("uring:")) {
        (PREAD_CANDIDATE, Some(rest)) => {
            pread_spec = format!("psync:{}", rest.split(',').next().unwrap_or_default());
            (pread_spec.as_str(), "sync-intr", format!("sync-intr on {pread_spec}"))
        }
        _ => (spec, path_name, path_name.to_string()),
    };
    let config = BenchConfig {
        device: spec.to_string(),
        path: PathSpec::parse(path_name)?.config()?,
        path_name: path_name.to_string(),
        rw: Rw::RandRead,
        threads,
        runtime: Some(time),
        // Read-only: the target is opened read-only and nothing is written.
        guard: Guard::Protect { allow_overwrite: false, allow_fs: false },
        ..BenchConfig::default()
    };
    let r = run(&config)?;
    let m = &r.measurements;
    let lat = m.latency_histogram();
    Ok(Trial {
        path: label,
        threads,
        iops: m.total_iops(),
        mean_ns: m.latency_ns_mean(),
        p99_ns: if lat.is_empty() { 0 } else { lat.value_at_quantile(0.99) },
        cpu_ns_per_io: m.cpu_ns_per_io(),
    })
}

/// The paths worth trying for `threads` blocking threads. `sync-yield`
/// (each thread polls its own ring and yields between looks) is tried at
/// every count: where the device's work runs on the host's CPUs (a loop
/// device) it needs neither a wake-up nor the CPU the device needs (measured
/// on a loop device over /dev/shm, 16 threads: 416K IOPS against 238K for
/// the kernel's pread and 190-215K for the merging paths; ARCHITECTURE.md,
/// "Real devices"). Many threads also try plain pread (`psync:` on the same
/// target), the kernel's own path. Every count tries `auto`, the default,
/// which chooses for itself, as the candidate for one path for all counts.
fn candidates(threads: usize) -> &'static [&'static str] {
    if threads == 1 {
        &["sync-path", "sync-intr", "sync-yield", "sync-path+hybrid", "stm", AUTO_CANDIDATE]
    } else {
        &["sync-yield", "stm", "stm+hybrid", "2q+hybrid", "htm+hybrid", "sync-intr", PREAD_CANDIDATE, AUTO_CANDIDATE]
    }
}

/// The path tried at every thread count for [`Report::one_path`], and
/// recommended there whenever it qualifies: the default, which measures its
/// own costs and yields while its threads outnumber the CPUs.
const AUTO_CANDIDATE: &str = "auto";

/// The share of the best IOPS at every thread count that a path needs to be
/// recommended as [`Report::one_path`].
const ONE_PATH_SHARE: f64 = 0.9;

/// A path tried at every one of `threads` that comes within [`ONE_PATH_SHARE`]
/// of the best IOPS at each (the one that comes closest in its worst case).
fn recommend_one(trials: &[Trial], threads: &[usize]) -> Option<Recommendation> {
    if threads.len() < 2 {
        return None;
    }
    let best = |n: usize| trials.iter().filter(|t| t.threads == n).map(|t| t.iops).fold(0.0, f64::max);
    let worst_share = |path: &str| {
        threads
            .iter()
            .map(|&n| {
                let iops = trials.iter().find(|t| t.threads == n && t.path == path).map_or(0.0, |t| t.iops);
                iops / best(n).max(1.0)
            })
            .fold(f64::INFINITY, f64::min)
    };
    // The default is kept wherever it qualifies: one path less to configure.
    let (path, share) =
        Some((AUTO_CANDIDATE, worst_share(AUTO_CANDIDATE))).filter(|&(_, share)| share >= ONE_PATH_SHARE).or_else(
            || trials.iter().map(|t| (t.path.as_str(), worst_share(&t.path))).max_by(|a, b| a.1.total_cmp(&b.1)),
        )?;
    if share < ONE_PATH_SHARE {
        return None;
    }
    let each: Vec<String> = threads
        .iter()
        .filter_map(|&n| trials.iter().find(|t| t.threads == n && t.path == path))
        .map(|t| {
            format!("{} thread(s) {:.0} IOPS ({:.0}% of the best)", t.threads, t.iops, 100.0 * t.iops / best(t.threads))
        })
        .collect();
    Some(Recommendation {
        threads: 0,
        path: path.to_string(),
        why: format!(
            "within {:.0}% of the best at every thread count tried: {}",
            100.0 * (1.0 - share),
            each.join(", ")
        ),
        with_idle_polling: None,
    })
}

/// The best path for `threads` among the trials; `wake_ns` is what a
/// cross-CPU wake-up cost while they ran.
fn recommend(
    trials: &[Trial],
    threads: usize,
    wake_ns: Option<f64>,
    device: Option<&DeviceFacts>,
) -> Option<Recommendation> {
    let mine: Vec<&Trial> = trials.iter().filter(|t| t.threads == threads).collect();
    let best = mine.iter().copied().max_by(|a, b| a.iops.total_cmp(&b.iops))?;
    let frugal = mine
        .iter()
        .copied()
        .filter(|t| t.iops >= 0.95 * best.iops)
        .min_by(|a, b| a.cpu_ns_per_io.total_cmp(&b.cpu_ns_per_io))
        .unwrap_or(best);
    let pick = if frugal.cpu_ns_per_io < 0.85 * best.cpu_ns_per_io { frugal } else { best };
    let mut why = format!(
        "{:.0} IOPS, p99 {:.0} us, {:.1} us CPU per I/O in the trial",
        pick.iops,
        pick.p99_ns as f64 / 1e3,
        pick.cpu_ns_per_io / 1e3
    );
    if !std::ptr::eq(pick, best) {
        why.push_str(&format!("; within 5% of the fastest ({}) for less CPU", best.path));
    }
    let others: Vec<String> =
        mine.iter().filter(|t| !std::ptr::eq(**t, pick)).map(|t| format!("{} {:.0}", t.path, t.iops)).collect();
    if !others.is_empty() {
        why.push_str(&format!("; the others: {}", others.join(", ")));
    }
    let pick_sleeps = pick.path.contains("intr") || pick.path.contains("interrupt");
    if let (Some(wake), true, false) = (wake_ns, pick.mean_ns > 0.0, pick_sleeps)
        && wake > pick.mean_ns / 4.0
    {
        why.push_str(&format!(
            "; a wake-up of a sleeping thread costs {:.0} us here, a large share of the {:.0} us a read takes, so \
             paths that sleep per request lose",
            wake / 1e3,
            pick.mean_ns / 1e3
        ));
    }
    if pick.path.contains("psync:") {
        why.push_str(
            "; each read sleeps and is woken in the kernel, which here cost less than polling (the polling paths \
             took CPU the device needed)",
        );
    } else if pick.path.contains("yield") {
        why.push_str(
            "; each thread polls its own ring and gives the CPU to any other runnable thread (other callers, the \
             device's worker) between looks: no wake-up per request, and no CPU held from the device",
        );
    } else if device.is_some_and(|d| d.io_poll.as_deref() != Some("1")) {
        why.push_str("; no kernel polling on this device, so polling means user-space spinning on the ring");
    }
    Some(Recommendation { threads, path: pick.path.clone(), why, with_idle_polling: None })
}

/// Examines the machine and, if given, a device.
pub fn examine(config: &DoctorConfig, mut on_trial: impl FnMut(&Trial)) -> Result<Report> {
    let (kernel, machine) = sys::kernel_release();
    let cpu = cpu_facts();
    let idle = IdleFacts::read();
    let cross_cpu_wake_ns = measure_cross_cpu_wake(cpu.cpus);
    // Measured again while idle CPUs poll, where doctor may ask for it and no one has.
    let cross_cpu_wake_polling_ns = match (cross_cpu_wake_ns, idle.polling()) {
        (Some(_), false) => IdlePolling::request().ok().and_then(|_held| measure_cross_cpu_wake(cpu.cpus)),
        _ => None,
    };
    let costs = Costs {
        syscall_ns: measure_syscall(),
        cross_cpu_wake_ns,
        cross_cpu_wake_polling_ns,
        timer_overshoot_ns: measure_timer_overshoot(),
        uring_nop_ns: measure_uring_nop(),
    };
    let idle_advice = idle_advice(&idle, &costs);
    let idle_request = if config.idle_poll { Some(IdlePolling::request()?) } else { None };
    let trials_idle_polling = polling_now();
    let spec =
        config.device.as_ref().map(|d| if d.contains(':') || d == "null" { d.clone() } else { format!("uring:{d}") });
    let target = spec.as_deref().and_then(|s| {
        let rest = s.strip_prefix("uring:").or_else(|| s.strip_prefix("psync:"))?;
        Some(rest.split(',').next().unwrap_or_default().to_string())
    });
    let device = match &target {
        Some(t) if !Path::new(t).exists() => {
            return Err(Error::spec(
                "device",
                t.clone(),
                "no such file or device; doctor examines an existing one (it never creates or writes)",
            ));
        }
        Some(t) => Some(device_facts(Path::new(t))?),
        None => None,
    };
    let mut trials = Vec::new();
    if let (Some(spec), true) = (&spec, config.measure) {
        for &threads in &config.threads {
            for &path in candidates(threads) {
                if path == PREAD_CANDIDATE && !spec.starts_with("uring:") {
                    continue;
                }
                if crate::signal::interrupted() {
                    break;
                }
                let t = trial(spec, path, threads, config.trial_time)?;
                on_trial(&t);
                trials.push(t);
            }
        }
    }
    // Measured before the trials; where doctor itself made idle CPUs poll for them, the polling figure.
    let wake_ns = match (trials_idle_polling, costs.cross_cpu_wake_polling_ns) {
        (true, Some(polling)) => Some(polling),
        _ => costs.cross_cpu_wake_ns,
    };
    let mut recommendations: Vec<Recommendation> =
        config.threads.iter().filter_map(|&t| recommend(&trials, t, wake_ns, device.as_ref())).collect();
    let one_path = recommend_one(&trials, &config.threads);
    // Where idle CPUs halted and polling would make wake-ups much cheaper, each pick is
    // tried once more while they poll: what --idle-poll would give (often another ranking).
    if let (Some(spec), false, Some(_)) = (&spec, trials_idle_polling, &idle_advice)
        && let Ok(_polling) = IdlePolling::request()
    {
        for r in &mut recommendations {
            if crate::signal::interrupted() {
                break;
            }
            let name = if r.path.starts_with("sync-intr on psync:") { PREAD_CANDIDATE } else { r.path.as_str() };
            let mut t = trial(spec, name, r.threads, config.trial_time)?;
            t.path = format!("{} (idle CPUs polling)", r.path);
            on_trial(&t);
            r.why.push_str(&format!(
                "; with idle CPUs polling (--idle-poll) it made {:.0} IOPS, mean {:.1} us (iopath doctor ... \
                 --idle-poll tries every path that way)",
                t.iops,
                t.mean_ns / 1e3
            ));
            r.with_idle_polling = Some(t);
        }
    }
    drop(idle_request);
    Ok(Report {
        kernel,
        machine,
        io_uring: io_uring_facts(),
        memlock: sys::memlock_limit(),
        cpu,
        idle,
        idle_advice,
        trials_idle_polling,
        costs,
        device,
        spec,
        trials,
        recommendations,
        one_path,
    })
}

/// Advice when waking an idle CPU costs much more than waking a polling one.
/// Without the polling figure (doctor may not ask: not root), the idle states
/// the kernel lists and the halting wake-up's cost decide.
fn idle_advice(idle: &IdleFacts, costs: &Costs) -> Option<String> {
    let wake = costs.cross_cpu_wake_ns?;
    let mut text = match costs.cross_cpu_wake_polling_ns {
        Some(polling) if wake >= 5_000.0 && polling <= wake / 2.0 => format!(
            "a wake-up of a thread on an idle CPU costs {:.1} us here, {:.1} us while idle CPUs poll: where a \
             request sleeps or needs a kernel worker (interrupt completion, pread, a loop device), run with \
             --idle-poll",
            wake / 1e3,
            polling / 1e3
        ),
        None if wake >= 5_000.0 && idle.sleeps_deeply() && !idle.polling() => format!(
            "a wake-up of a thread on an idle CPU costs {:.1} us here and idle CPUs sleep deeply: as root, \
             --idle-poll makes them poll while a run lasts",
            wake / 1e3
        ),
        _ => return None,
    };
    let measured = costs.cross_cpu_wake_polling_ns.is_some();
    if idle.driver.as_deref() == Some("haltpoll") && idle.guest_halt_poll_ns == Some(0) {
        text.push_str(
            " or raise /sys/module/haltpoll/parameters/guest_halt_poll_ns (idle vCPUs poll that long before \
             halting, for every program)",
        );
    }
    if !measured {
        text.push_str("; `iopath doctor` run as root measures what polling saves");
    }
    text.push_str("; the price is idle CPUs spinning (power; host CPU time in a VM)");
    Some(text)
}

fn limit_text(v: u64) -> String {
    if v == u64::MAX { "unlimited".into() } else { crate::units::format_size(v) }
}

impl Report {
    /// The readable report.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let us = |ns: f64| format!("{:.2} us", ns / 1e3);
        out.push_str(&format!("kernel        {} ({})\n", self.kernel, self.machine));
        let u = &self.io_uring;
        out.push_str(&format!(
            "io_uring      {}; io_uring_disabled={}; seccomp={}\n",
            match &u.available {
                Ok(()) => "available".to_string(),
                Err(e) => format!("NOT available: {e}"),
            },
            u.disabled_sysctl.map_or("(absent)".into(), |v| v.to_string()),
            u.seccomp.map_or("?".into(), |v| v.to_string()),
        ));
        for f in &u.flags {
            out.push_str(&format!(
                "  {:<15} {:<48} {}\n",
                f.name,
                match &f.result {
                    Ok(()) => "accepted".to_string(),
                    Err(e) => format!("refused: {e}"),
                },
                f.used_for
            ));
        }
        out.push_str(&format!(
            "memlock       soft {}, hard {} (registered buffers need it; raise with ulimit -l)\n",
            limit_text(self.memlock.0),
            limit_text(self.memlock.1)
        ));
        out.push_str(&format!(
            "cpus          {}; CPU pressure (some, avg10) {}; load {}\n",
            self.cpu.cpus,
            self.cpu.pressure_some_avg10.map_or("unknown".into(), |p| format!("{p:.1}%")),
            self.cpu.load1.map_or("unknown".into(), |l| format!("{l:.2}")),
        ));
        if self.cpu.pressure_some_avg10.is_some_and(|p| p > 10.0) {
            out.push_str(
                "              the CPUs are contended: polling will lose to hybrid or interrupts (seed 001)\n",
            );
        }
        out.push_str(&format!("cpu idle      {}\n", self.idle.summary()));
        let c = &self.costs;
        out.push_str(&format!(
            "costs         system call {}; wake-up of a sleeping thread on another CPU {}{}; 50 us timer sleep ends {} late; io_uring no-op {}\n",
            us(c.syscall_ns),
            c.cross_cpu_wake_ns.map_or("(1 CPU)".into(), us),
            c.cross_cpu_wake_polling_ns.map_or(String::new(), |p| format!(" ({} while idle CPUs poll)", us(p))),
            us(c.timer_overshoot_ns),
            c.uring_nop_ns.map_or("(no io_uring)".into(), us),
        ));
        if let Some(advice) = &self.idle_advice {
            out.push_str(&format!("              {advice}\n"));
        }
        if let Some(d) = &self.device {
            out.push_str(&format!("device        {} ({})\n", d.path, d.kind));
            let show =
                |name: &str, v: &Option<String>| v.as_ref().map_or(String::new(), |v| format!("  {name:<21} {v}\n"));
            if let Some(n) = &d.block_name {
                out.push_str(&format!("  {:<21} {n}\n", "kernel name"));
            }
            out.push_str(&show("logical block size", &d.logical_block_size.map(|v| v.to_string())));
            out.push_str(&show(
                "O_DIRECT alignment",
                &d.dio_alignment.map(|v| format!("{v} bytes (--bs must be a multiple)")),
            ));
            out.push_str(&show("io_poll", &d.io_poll));
            out.push_str(&show("io_poll_delay", &d.io_poll_delay));
            out.push_str(&show("scheduler", &d.scheduler));
            out.push_str(&show("nomerges", &d.nomerges));
            out.push_str(&show("nr_requests", &d.nr_requests));
            out.push_str(&show("rotational", &d.rotational));
            out.push_str(&show("max_sectors_kb", &d.max_sectors_kb));
            out.push_str(&show("loop backing file", &d.loop_backing));
            out.push_str(&format!("  {:<21} {}\n", "kernel polling", d.polling));
        }
        if !self.trials.is_empty() {
            out.push_str(&format!(
                "trials        4 KiB random reads, read-only, on {}{}:\n",
                self.spec.as_deref().unwrap_or("?"),
                if self.trials_idle_polling { ", idle CPUs polling" } else { "" }
            ));
            let width = self.trials.iter().map(|t| t.path.len()).max().unwrap_or(0).max(14);
            for t in &self.trials {
                out.push_str(&format!(
                    "  {:>2} thread(s) {:<width$} {:>9.0} IOPS  mean {:>8}  p99 {:>8}  CPU/IO {:>8}\n",
                    t.threads,
                    t.path,
                    t.iops,
                    us(t.mean_ns),
                    us(t.p99_ns as f64),
                    us(t.cpu_ns_per_io)
                ));
            }
        }
        for r in &self.recommendations {
            out.push_str(&format!("recommended   {} thread(s): {} ({})\n", r.threads, r.path, r.why));
        }
        if let Some(r) = &self.one_path {
            out.push_str(&format!("one path      {} ({})\n", r.path, r.why));
        }
        if self.spec.is_none() {
            out.push_str(
                "recommended   name a device (iopath doctor uring:/dev/nvme0n1, or a file) for a recommendation\n",
            );
        }
        out
    }

    /// The same as JSON.
    pub fn to_json(&self) -> Value {
        let result = |r: &std::result::Result<(), String>| match r {
            Ok(()) => Value::Bool(true),
            Err(e) => Value::String(e.clone()),
        };
        json!({
            "kernel": self.kernel,
            "machine": self.machine,
            "io_uring": {
                "available": result(&self.io_uring.available),
                "io_uring_disabled": self.io_uring.disabled_sysctl,
                "seccomp": self.io_uring.seccomp,
                "setup_flags": self.io_uring.flags.iter().map(|f| json!({"flag": f.name, "accepted": result(&f.result), "used_for": f.used_for})).collect::<Vec<_>>(),
            },
            "memlock_bytes": {"soft": self.memlock.0, "hard": self.memlock.1},
            "cpu": {"cpus": self.cpu.cpus, "pressure_some_avg10": self.cpu.pressure_some_avg10, "load1": self.cpu.load1},
            "cpu_idle": {
                "driver": self.idle.driver,
                "governor": self.idle.governor,
                "states": self.idle.states.iter().map(|s| json!({"name": s.name, "exit_latency_us": s.exit_latency_us, "disabled": s.disabled})).collect::<Vec<_>>(),
                "guest_halt_poll_ns": self.idle.guest_halt_poll_ns,
                "latency_limit_us": self.idle.latency_limit_us,
                "advice": self.idle_advice,
            },
            "costs_ns": {
                "syscall": self.costs.syscall_ns,
                "cross_cpu_wake": self.costs.cross_cpu_wake_ns,
                "cross_cpu_wake_idle_polling": self.costs.cross_cpu_wake_polling_ns,
                "timer_overshoot_50us": self.costs.timer_overshoot_ns,
                "uring_nop": self.costs.uring_nop_ns,
            },
            "device": self.device.as_ref().map(|d| json!({
                "path": d.path,
                "kind": d.kind,
                "kernel_name": d.block_name,
                "logical_block_size": d.logical_block_size,
                "dio_alignment": d.dio_alignment,
                "io_poll": d.io_poll,
                "io_poll_delay": d.io_poll_delay,
                "scheduler": d.scheduler,
                "nomerges": d.nomerges,
                "nr_requests": d.nr_requests,
                "rotational": d.rotational,
                "max_sectors_kb": d.max_sectors_kb,
                "loop_backing": d.loop_backing,
                "kernel_polling": d.polling,
            })),
            "trials_idle_polling": self.trials_idle_polling,
            "trials": self.trials.iter().map(|t| json!({
                "path": t.path, "threads": t.threads, "iops": t.iops, "lat_ns_mean": t.mean_ns,
                "lat_ns_p99": t.p99_ns, "cpu_ns_per_io": t.cpu_ns_per_io,
            })).collect::<Vec<_>>(),
            "recommendations": self.recommendations.iter().map(|r| json!({
                "threads": r.threads, "path": r.path, "why": r.why,
                "with_idle_polling": r.with_idle_polling.as_ref().map(|t| json!({
                    "iops": t.iops, "lat_ns_mean": t.mean_ns, "lat_ns_p99": t.p99_ns, "cpu_ns_per_io": t.cpu_ns_per_io,
                })),
            })).collect::<Vec<_>>(),
            "one_path": self.one_path.as_ref().map(|r| json!({"path": r.path, "why": r.why})),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(path: &str, threads: usize, iops: f64) -> Trial {
        Trial { path: path.into(), threads, iops, mean_ns: 1e4, p99_ns: 20_000, cpu_ns_per_io: 5e3 }
    }

    #[test]
    fn idle_advice_is_given_where_idle_cpus_are_expensive_to_wake() {
        let halting =
            IdleFacts { driver: Some("haltpoll".into()), guest_halt_poll_ns: Some(0), ..IdleFacts::default() };
        let costs = |wake: f64, polling: Option<f64>| Costs {
            cross_cpu_wake_ns: Some(wake),
            cross_cpu_wake_polling_ns: polling,
            ..Costs::default()
        };
        // Measured both ways (root): the two figures and the flag.
        let text = idle_advice(&halting, &costs(40_000.0, Some(2_000.0))).unwrap();
        assert!(text.contains("40.0 us here, 2.0 us while idle CPUs poll") && text.contains("--idle-poll"), "{text}");
        assert!(text.contains("guest_halt_poll_ns"), "{text}");
        // Not measurable (not root): the idle states decide, and the text says how to measure.
        let text = idle_advice(&halting, &costs(40_000.0, None)).unwrap();
        assert!(text.contains("as root, --idle-poll") && text.contains("run as root measures"), "{text}");
        // Cheap wake-ups, or polling that saves little: nothing to advise.
        assert!(idle_advice(&halting, &costs(3_000.0, Some(1_000.0))).is_none());
        assert!(idle_advice(&halting, &costs(40_000.0, Some(30_000.0))).is_none());
        assert!(idle_advice(&IdleFacts::default(), &costs(40_000.0, None)).is_none(), "shallow idle states");
    }

    #[test]
    fn one_path_is_the_one_closest_to_the_best_at_every_thread_count() {
        let trials = [
            trial("sync-path", 1, 100.0),
            trial("sync-yield", 1, 95.0),
            trial("auto", 1, 85.0),
            trial("sync-yield", 16, 380.0),
            trial("auto", 16, 400.0),
            trial("stm", 16, 200.0),
        ];
        // sync-yield: 95% and 95%; auto: 85% and 100%; sync-path was not tried at 16.
        let one = recommend_one(&trials, &[1, 16]).unwrap();
        assert_eq!(one.path, "sync-yield");
        assert!(
            one.why.contains("within 5%") && one.why.contains("16 thread(s) 380 IOPS (95% of the best)"),
            "{}",
            one.why
        );
        // The default wherever it is within 10% at every count, even if another is closer.
        let mut close = trials.clone();
        close[2] = trial("auto", 1, 92.0);
        let one = recommend_one(&close, &[1, 16]).unwrap();
        assert_eq!(one.path, "auto", "{}", one.why);
        // Nothing within 10% at both counts: no single path is recommended.
        let apart = [
            trial("sync-path", 1, 100.0),
            trial("sync-path", 16, 100.0),
            trial("sync-yield", 1, 50.0),
            trial("sync-yield", 16, 400.0),
        ];
        assert!(recommend_one(&apart, &[1, 16]).is_none());
        // One thread count: the per-count recommendation says it all.
        assert!(recommend_one(&trials, &[16]).is_none());
    }
}
