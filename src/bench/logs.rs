//! fio's per-job logs (`write_lat_log`, `write_bw_log`, `write_iops_log`,
//! `log_avg_msec`) and the bandwidth/IOPS samples fio's JSON summarizes.
//!
//! Lines are fio's: `time (ms), value, direction (0 read, 1 write), block
//! size, offset` (the offset is 0 unless `log_offset=1`), one file per thread as fio writes one per job clone:
//! `NAME_lat.1.log`, `NAME_clat.1.log`, `NAME_slat.1.log` (latencies in ns;
//! iopath measures each request end to end, so `clat` equals `lat` and
//! `slat` is 0, as in its JSON), `NAME_bw.1.log` (KiB/s), `NAME_iops.1.log`.
//! Without `log_avg_msec` the latency logs have a line per request; with
//! it, a line per window and direction holding the window's mean, stamped
//! at the window's end, with block size and offset 0 (as fio does).
//! `fio_generate_plots` and `fiologparser.py` read them.

use crate::device::Op;
use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Window of the bandwidth and IOPS samples in the JSON (fio's default).
pub const SAMPLE_WINDOW_NS: u64 = 500_000_000;

/// Which logs to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogConfig {
    /// `write_lat_log=NAME`.
    pub lat: Option<String>,
    /// `write_bw_log=NAME`.
    pub bw: Option<String>,
    /// `write_iops_log=NAME`.
    pub iops: Option<String>,
    /// `log_avg_msec`: average over windows of this many milliseconds.
    pub avg_ms: Option<u64>,
    /// `log_offset=1`: per-request lines carry the request's offset (else 0).
    pub offsets: bool,
}

impl LogConfig {
    /// Whether any log is asked for.
    pub fn any(&self) -> bool {
        self.lat.is_some() || self.bw.is_some() || self.iops.is_some()
    }

    /// Checks what can be written: bandwidth and IOPS logs are averaged.
    pub fn validate(&self) -> Result<()> {
        if (self.bw.is_some() || self.iops.is_some()) && self.avg_ms.is_none() {
            return Err(Error::spec(
                "write_bw_log/write_iops_log",
                self.bw.clone().or(self.iops.clone()).unwrap_or_default(),
                "iopath writes bandwidth and IOPS logs averaged over windows: add log_avg_msec (e.g. 500)",
            ));
        }
        if self.avg_ms == Some(0) {
            return Err(Error::spec("log_avg_msec", "0", "a window of at least 1 ms, or leave it out"));
        }
        Ok(())
    }
}

/// Per-window counts of one direction.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    ios: u64,
    bytes: u64,
    lat_ns: u64,
}

/// What one thread records for the logs and the JSON samples.
#[derive(Debug, Clone, Default)]
pub struct ThreadLog {
    /// One entry per request: (ms since the measured phase began, latency ns, direction, offset, bytes).
    requests: Vec<(u32, u64, u8, u64, u32)>,
    keep_requests: bool,
    /// Windows of `window_ns` (the log's averaging window), per direction
    /// (read, write, trim: fio's 0, 1, 2).
    windows: Vec<[Window; 3]>,
    window_ns: u64,
    /// 500 ms windows for the JSON's bw/iops samples.
    samples: Vec<[Window; 3]>,
    /// The sample window being filled, and where it ends (ns): requests come
    /// in time order, so most need no division to find their window.
    sample_index: usize,
    sample_end_ns: u64,
}

impl ThreadLog {
    /// A recorder for `config`.
    pub fn new(config: &LogConfig) -> ThreadLog {
        ThreadLog {
            keep_requests: config.lat.is_some() && config.avg_ms.is_none(),
            window_ns: config.avg_ms.unwrap_or(0) * 1_000_000,
            ..ThreadLog::default()
        }
    }

    /// Records a request at `offset` that completed `at_ns` after the measured phase began.
    pub fn record(&mut self, at_ns: u64, latency_ns: u64, op: Op, bytes: u64, offset: u64) {
        let d = direction(op);
        if self.keep_requests {
            self.requests.push(((at_ns / 1_000_000) as u32, latency_ns, d as u8, offset, bytes as u32));
        }
        if let Some(i) = at_ns.checked_div(self.window_ns) {
            add(&mut self.windows, i as usize, d, latency_ns, bytes);
        }
        if at_ns >= self.sample_end_ns || self.samples.is_empty() {
            self.sample_index = (at_ns / SAMPLE_WINDOW_NS) as usize;
            self.sample_end_ns = (self.sample_index as u64 + 1) * SAMPLE_WINDOW_NS;
        }
        add(&mut self.samples, self.sample_index, d, latency_ns, bytes);
    }

    /// Adds another thread's 500 ms samples to this one's (a job's sum).
    pub fn add_samples(&mut self, other: &ThreadLog) {
        if self.samples.len() < other.samples.len() {
            self.samples.resize(other.samples.len(), Default::default());
        }
        for (mine, theirs) in self.samples.iter_mut().zip(&other.samples) {
            for (m, t) in mine.iter_mut().zip(theirs) {
                m.ios += t.ios;
                m.bytes += t.bytes;
                m.lat_ns += t.lat_ns;
            }
        }
    }

    /// The job's bandwidth (KiB/s) and IOPS samples for direction `op`: whole
    /// 500 ms windows only (the last, partial one is left out).
    pub fn samples(&self, op: Op, wall_ns: u64) -> (Vec<f64>, Vec<f64>) {
        let d = direction(op);
        let whole = (wall_ns / SAMPLE_WINDOW_NS) as usize;
        let secs = SAMPLE_WINDOW_NS as f64 / 1e9;
        let take = |f: &dyn Fn(&Window) -> f64| -> Vec<f64> {
            (0..whole).map(|i| self.samples.get(i).map_or(0.0, |w| f(&w[d]))).collect()
        };
        (take(&|w| w.bytes as f64 / 1024.0 / secs), take(&|w| w.ios as f64 / secs))
    }

    /// Writes this thread's logs (thread `index`, 1-based in the file names).
    pub fn write(&self, config: &LogConfig, index: usize) -> Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        if let Some(name) = &config.lat {
            let lines = if self.window_ns == 0 {
                self.requests
                    .iter()
                    .map(|&(ms, lat, d, offset, bytes)| {
                        let offset = if config.offsets { offset } else { 0 };
                        format!("{ms}, {lat}, {d}, {bytes}, {offset}")
                    })
                    .collect()
            } else {
                self.window_lines(|w| w.lat_ns.checked_div(w.ios))
            };
            let zeros: Vec<String> = lines.iter().map(|l| zero_value(l)).collect();
            written.push(write_log(&format!("{name}_lat.{index}.log"), &lines)?);
            written.push(write_log(&format!("{name}_clat.{index}.log"), &lines)?);
            written.push(write_log(&format!("{name}_slat.{index}.log"), &zeros)?);
        }
        let secs = self.window_ns as f64 / 1e9;
        if let Some(name) = &config.bw {
            let lines = self.window_lines(|w| Some((w.bytes as f64 / 1024.0 / secs).round() as u64));
            written.push(write_log(&format!("{name}_bw.{index}.log"), &lines)?);
        }
        if let Some(name) = &config.iops {
            let lines = self.window_lines(|w| Some((w.ios as f64 / secs).round() as u64));
            written.push(write_log(&format!("{name}_iops.{index}.log"), &lines)?);
        }
        Ok(written)
    }

    /// A line per averaging window and direction that had requests.
    fn window_lines(&self, value: impl Fn(&Window) -> Option<u64>) -> Vec<String> {
        let window_ms = self.window_ns / 1_000_000;
        let mut lines = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            for (d, x) in w.iter().enumerate() {
                if x.ios > 0
                    && let Some(v) = value(x)
                {
                    lines.push(format!("{}, {v}, {d}, 0, 0", (i as u64 + 1) * window_ms));
                }
            }
        }
        lines
    }
}

/// fio's direction number: 0 read, 1 write, 2 trim.
fn direction(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Trim => 2,
        _ => 1,
    }
}

fn add(windows: &mut Vec<[Window; 3]>, i: usize, d: usize, latency_ns: u64, bytes: u64) {
    if windows.len() <= i {
        windows.resize(i + 1, Default::default());
    }
    let w = &mut windows[i][d];
    w.ios += 1;
    w.bytes += bytes;
    w.lat_ns += latency_ns;
}

/// The same line with its value set to 0 (the submission-latency log).
fn zero_value(line: &str) -> String {
    let mut parts: Vec<&str> = line.split(", ").collect();
    parts[1] = "0";
    parts.join(", ")
}

fn write_log(name: &str, lines: &[String]) -> Result<PathBuf> {
    let path = Path::new(name).to_path_buf();
    let fail = |source| Error::Target { action: "write the log", path: path.clone(), source };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).map_err(fail)?);
    for line in lines {
        writeln!(f, "{line}").map_err(fail)?;
    }
    f.flush().map_err(fail)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_request_and_averaged_lines_are_fios() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("job").display().to_string();
        let config = LogConfig { lat: Some(name.clone()), ..LogConfig::default() };
        let mut log = ThreadLog::new(&config);
        log.record(1_500_000, 20_000, Op::Read, 4096, 0);
        log.record(2_500_000, 30_000, Op::Write, 4096, 0);
        let files = log.write(&config, 1).unwrap();
        assert_eq!(files.len(), 3);
        let lat = std::fs::read_to_string(format!("{name}_lat.1.log")).unwrap();
        assert_eq!(lat, "1, 20000, 0, 4096, 0\n2, 30000, 1, 4096, 0\n");
        let slat = std::fs::read_to_string(format!("{name}_slat.1.log")).unwrap();
        assert_eq!(slat, "1, 0, 0, 4096, 0\n2, 0, 1, 4096, 0\n");

        let config =
            LogConfig { lat: Some(name.clone()), iops: Some(name.clone()), avg_ms: Some(100), ..LogConfig::default() };
        let mut log = ThreadLog::new(&config);
        for i in 0..10 {
            log.record(i * 10_000_000, 1000 * (i + 1), Op::Read, 4096, 0);
        }
        log.record(150_000_000, 7000, Op::Write, 4096, 0);
        log.write(&config, 2).unwrap();
        let lat = std::fs::read_to_string(format!("{name}_lat.2.log")).unwrap();
        assert_eq!(lat, "100, 5500, 0, 0, 0\n200, 7000, 1, 0, 0\n");
        let iops = std::fs::read_to_string(format!("{name}_iops.2.log")).unwrap();
        assert_eq!(iops, "100, 100, 0, 0, 0\n200, 10, 1, 0, 0\n");
    }

    #[test]
    fn samples_cover_whole_windows_and_sum_over_threads() {
        let mut a = ThreadLog::new(&LogConfig::default());
        let mut b = ThreadLog::new(&LogConfig::default());
        for i in 0..100 {
            a.record(i * 12_000_000, 1, Op::Read, 4096, 0); // 1.2 s
            b.record(i * 12_000_000, 1, Op::Read, 4096, 0);
        }
        a.add_samples(&b);
        let (bw, iops) = a.samples(Op::Read, 1_200_000_000);
        assert_eq!(iops.len(), 2, "the partial third window is left out");
        assert!(iops.iter().all(|&x| (x - 2.0 * 42.0 / 0.5).abs() <= 2.0 * 2.0 / 0.5), "{iops:?}");
        assert!((bw[0] - iops[0] * 4.0).abs() < 1e-9);
    }

    #[test]
    fn bandwidth_logs_need_a_window() {
        let c = LogConfig { bw: Some("x".into()), ..LogConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("log_avg_msec"));
        assert!(LogConfig { avg_ms: Some(100), ..c }.validate().is_ok());
    }
}
