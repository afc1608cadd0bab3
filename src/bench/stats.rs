//! Measurements of a benchmark run and the figures derived from them.
//!
//! Collection (per-thread histograms and counters, merged at the end) is kept
//! apart from rendering ([`super::report`]), as fio keeps `thread_stat` apart
//! from its output formats.

use crate::clock::ThreadUsage;
use crate::device::DeviceStats;
use crate::path::PathStats;
use hdrhistogram::Histogram;

/// Latencies are recorded with 3 significant digits (0.1% error) up to 1 hour.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// One direction's measurements.
#[derive(Debug, Clone)]
pub struct DirStats {
    /// Latency of every request in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// Requests completed.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
}

impl Default for DirStats {
    fn default() -> Self {
        DirStats { latency_ns: new_histogram(), ios: 0, bytes: 0 }
    }
}

impl DirStats {
    /// Records one request.
    #[inline]
    pub fn record(&mut self, latency_ns: u64, bytes: u64) {
        self.latency_ns.saturating_record(latency_ns.max(1));
        self.ios += 1;
        self.bytes += bytes;
    }

    /// Adds another thread's measurements.
    pub fn add(&mut self, other: &DirStats) {
        self.latency_ns.add(&other.latency_ns).expect("histograms with equal bounds");
        self.ios += other.ios;
        self.bytes += other.bytes;
    }

    /// Requests per second over `wall_ns`.
    pub fn iops(&self, wall_ns: u64) -> f64 {
        per_second(self.ios as f64, wall_ns)
    }

    /// Bytes per second over `wall_ns`.
    pub fn bw_bytes(&self, wall_ns: u64) -> f64 {
        per_second(self.bytes as f64, wall_ns)
    }
}

fn per_second(count: f64, wall_ns: u64) -> f64 {
    if wall_ns == 0 { 0.0 } else { count * 1e9 / wall_ns as f64 }
}

/// Everything one benchmark run measured.
#[derive(Debug, Clone)]
pub struct Measurements {
    /// Wall time of the timed phase.
    pub wall_ns: u64,
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// CPU and context switches of the I/O threads only.
    pub usage: ThreadUsage,
    /// The path's counters.
    pub path: PathStats,
    /// What the device counted during the timed phase.
    pub device: DeviceStats,
    /// The device's peak bandwidth for this mix, if known.
    pub peak_bw_bytes: Option<f64>,
    /// Blocks whose content `--verify` checked.
    pub verified_blocks: u64,
    /// What the competing CPU hogs got done, if any ran.
    pub hogs: Option<super::hogs::HogReport>,
    /// Flushes the workload asked for (`fsync=N`, `end_fsync`) and their latency.
    pub sync: DirStats,
    /// Trims (`--rw trim`, `randtrim`): counted as requests, not as bandwidth.
    pub trim: DirStats,
}

impl Measurements {
    /// Requests in every direction (trims too).
    pub fn total_ios(&self) -> u64 {
        self.read.ios + self.write.ios + self.trim.ios
    }

    /// Bytes per second in both directions.
    pub fn total_bw_bytes(&self) -> f64 {
        self.read.bw_bytes(self.wall_ns) + self.write.bw_bytes(self.wall_ns)
    }

    /// Requests per second in every direction (trims too).
    pub fn total_iops(&self) -> f64 {
        self.read.iops(self.wall_ns) + self.write.iops(self.wall_ns) + self.trim.iops(self.wall_ns)
    }

    fn per_io(&self, value: f64) -> f64 {
        match self.total_ios() {
            0 => 0.0,
            n => value / n as f64,
        }
    }

    /// Achieved bandwidth as a share of the device's peak for this mix.
    pub fn share_of_peak(&self) -> Option<f64> {
        self.peak_bw_bytes.map(|peak| self.total_bw_bytes() / peak)
    }

    /// Share of wall time with a command in service (timed devices).
    pub fn device_utilization(&self) -> Option<f64> {
        (self.peak_bw_bytes.is_some() && self.wall_ns > 0).then(|| self.device.busy_ns as f64 / self.wall_ns as f64)
    }

    /// Mean device time per request (timed devices).
    pub fn device_ns_mean(&self) -> f64 {
        self.per_io(self.path.device_ns as f64)
    }

    /// The latencies of every direction in one histogram.
    pub fn latency_histogram(&self) -> Histogram<u64> {
        let mut lat = self.read.latency_ns.clone();
        lat.add(&self.write.latency_ns).expect("histograms with equal bounds");
        lat.add(&self.trim.latency_ns).expect("histograms with equal bounds");
        lat
    }

    /// Mean latency over both directions.
    pub fn latency_ns_mean(&self) -> f64 {
        let sum =
            self.read.latency_ns.mean() * self.read.ios as f64 + self.write.latency_ns.mean() * self.write.ios as f64;
        self.per_io(sum)
    }

    /// Mean latency minus mean device time: the seeds' "software latency".
    pub fn software_ns_mean(&self) -> f64 {
        self.latency_ns_mean() - self.device_ns_mean()
    }

    /// Context switches (voluntary + involuntary) per request.
    pub fn ctx_per_io(&self) -> f64 {
        self.per_io((self.usage.voluntary_ctx + self.usage.involuntary_ctx) as f64)
    }

    /// Voluntary context switches (the thread slept) per request.
    pub fn voluntary_ctx_per_io(&self) -> f64 {
        self.per_io(self.usage.voluntary_ctx as f64)
    }

    /// Involuntary context switches (preemptions, and yields that handed the CPU on) per request.
    pub fn involuntary_ctx_per_io(&self) -> f64 {
        self.per_io(self.usage.involuntary_ctx as f64)
    }

    /// CPU time (user + system) per request.
    pub fn cpu_ns_per_io(&self) -> f64 {
        self.per_io((self.usage.user_ns + self.usage.sys_ns) as f64)
    }

    /// Looks at the completion queue per request.
    pub fn polls_per_io(&self) -> f64 {
        self.per_io(self.path.wait.polls as f64)
    }

    /// Sleeps per request.
    pub fn sleeps_per_io(&self) -> f64 {
        self.per_io(self.path.wait.sleeps as f64)
    }

    /// Mean segments per device command (the seed's temporal merge count).
    pub fn mean_segments(&self) -> f64 {
        if self.path.commands == 0 { 0.0 } else { self.path.segments as f64 / self.path.commands as f64 }
    }

    /// Mean time from the device finishing a request until the path noticed
    /// it (timed devices, with [`crate::path::timing`] on; 0 otherwise).
    pub fn noticed_ns_mean(&self) -> f64 {
        if self.path.noticed == 0 { 0.0 } else { self.path.noticed_ns as f64 / self.path.noticed as f64 }
    }

    /// Mean time from another thread completing a request until its owner ran
    /// again (paths that hand requests over, with timing on; 0 otherwise).
    pub fn woken_ns_mean(&self) -> f64 {
        if self.path.woken == 0 { 0.0 } else { self.path.woken_ns as f64 / self.path.woken as f64 }
    }

    /// Share of requests that were completed by another thread (timing on).
    pub fn woken_share(&self) -> f64 {
        let n = self.total_ios();
        if n == 0 { 0.0 } else { self.path.woken as f64 / n as f64 }
    }

    /// Mean time a merged request waited between arrival and submission.
    pub fn merge_wait_ns_mean(&self) -> f64 {
        if self.path.merged_requests == 0 {
            0.0
        } else {
            self.path.merge_wait_ns as f64 / self.path.merged_requests as f64
        }
    }

    /// User CPU as a percentage of wall time (fio's `usr_cpu`).
    pub fn usr_cpu_pct(&self) -> f64 {
        100.0 * self.usage.user_ns as f64 / self.wall_ns.max(1) as f64
    }

    /// System CPU as a percentage of wall time (fio's `sys_cpu`).
    pub fn sys_cpu_pct(&self) -> f64 {
        100.0 * self.usage.sys_ns as f64 / self.wall_ns.max(1) as f64
    }
}

/// The median of `values` (the upper one of an even count; 0 when empty):
/// what repeated runs are summarised by.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
