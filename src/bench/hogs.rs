//! CPU hogs: competing busy threads, so seed 001's contention experiment runs
//! with one command.
//!
//! Each hog does fixed units of arithmetic and counts them. With a duty cycle
//! below 100% it works that share of every millisecond and sleeps the rest.
//! Hogs can be pinned to CPUs. Their own progress (units per second) is
//! reported, so a completion policy that leaves them more CPU shows it.

use crate::clock::{minimize_timer_slack, now_ns, sleep_until_ns};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// Length of one duty-cycle period.
const PERIOD_NS: u64 = 1_000_000;

/// How to run the hogs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HogConfig {
    /// Number of hog threads.
    pub count: usize,
    /// Share of each period a hog works, in percent (1-100).
    pub duty_pct: u32,
    /// CPUs to pin hogs to, round-robin; empty = not pinned.
    pub cpus: Vec<usize>,
}

/// Running hogs.
pub struct Hogs {
    stop: Arc<AtomicBool>,
    work: Vec<Arc<AtomicU64>>,
    threads: Vec<JoinHandle<()>>,
    started_ns: u64,
}

/// What the hogs got done.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HogReport {
    /// Hog threads.
    pub count: usize,
    /// Their duty cycle in percent.
    pub duty_pct: u32,
    /// Work units per second, summed over hogs.
    pub ops_per_sec: f64,
}

/// One unit of hog work: a short dependent arithmetic chain (~1 µs).
#[inline(never)]
fn work_unit(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..256 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x ^= x >> 29;
    }
    x
}

fn pin_to(cpu: usize) -> Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Error::spec("--hog-cpus", cpu.to_string(), "no such CPU; see nproc"));
    }
    crate::sys::pin_to_cpu(cpu).map_err(|source| Error::Os {
        context: format!("cannot pin a hog to CPU {cpu} (see nproc for the CPUs there are)"),
        source,
    })
}

impl Hogs {
    /// Starts the hogs (none when `count` is 0).
    pub fn start(config: &HogConfig) -> Result<Hogs> {
        if config.count > 0 && !(1..=100).contains(&config.duty_pct) {
            return Err(Error::spec("--hog-duty", config.duty_pct.to_string(), "a percentage from 1 to 100"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut work = Vec::new();
        let mut threads = Vec::new();
        for i in 0..config.count {
            let counter = Arc::new(AtomicU64::new(0));
            work.push(Arc::clone(&counter));
            let (stop, ready) = (Arc::clone(&stop), ready_tx.clone());
            let cpu = (!config.cpus.is_empty()).then(|| config.cpus[i % config.cpus.len()]);
            let duty = config.duty_pct as u64;
            let thread = std::thread::Builder::new()
                .name(format!("iopath-hog-{i}"))
                .spawn(move || {
                    let pinned = cpu.map_or(Ok(()), pin_to);
                    let failed = pinned.is_err();
                    let _ = ready.send(pinned);
                    drop(ready);
                    if failed {
                        return;
                    }
                    minimize_timer_slack();
                    let mut units = 0u64;
                    let mut sink = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let period_start = now_ns();
                        let busy_until = period_start + PERIOD_NS * duty / 100;
                        while now_ns() < busy_until {
                            sink = sink.wrapping_add(work_unit(sink ^ units));
                            units += 1;
                        }
                        counter.store(units, Ordering::Relaxed);
                        if duty < 100 {
                            sleep_until_ns(period_start + PERIOD_NS);
                        }
                    }
                    std::hint::black_box(sink);
                })
                .map_err(|source| Error::Os { context: "cannot start a hog thread".into(), source })?;
            threads.push(thread);
        }
        drop(ready_tx);
        let hogs = Hogs { stop, work, threads, started_ns: now_ns() };
        for _ in 0..config.count {
            ready_rx
                .recv()
                .map_err(|_| Error::Unsupported { what: "hog thread".into(), why: "it exited at start".into() })??;
        }
        Ok(hogs)
    }

    /// Work units done so far, summed over hogs.
    pub fn units(&self) -> u64 {
        self.work.iter().map(|w| w.load(Ordering::Relaxed)).sum()
    }

    /// Stops the hogs and reports their progress since `since_units` at `since_ns`.
    pub fn stop(mut self, config: &HogConfig, since_units: u64, since_ns: u64) -> HogReport {
        let units = self.units();
        let now = now_ns();
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let elapsed = now.saturating_sub(since_ns.max(self.started_ns)).max(1);
        HogReport {
            count: config.count,
            duty_pct: config.duty_pct,
            ops_per_sec: (units - since_units) as f64 * 1e9 / elapsed as f64,
        }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hogs_make_progress_and_stop() {
        let config = HogConfig { count: 2, duty_pct: 50, cpus: vec![] };
        let hogs = Hogs::start(&config).unwrap();
        let (u0, t0) = (hogs.units(), now_ns());
        std::thread::sleep(std::time::Duration::from_millis(30));
        let report = hogs.stop(&config, u0, t0);
        assert!(report.ops_per_sec > 0.0);
        assert_eq!(report.count, 2);
    }

    #[test]
    fn bad_duty_and_cpu_are_errors() {
        assert!(Hogs::start(&HogConfig { count: 1, duty_pct: 0, cpus: vec![] }).is_err());
        let e = Hogs::start(&HogConfig { count: 1, duty_pct: 100, cpus: vec![1000] }).err().unwrap();
        assert!(e.to_string().contains("cannot pin"), "{e}");
        let e = Hogs::start(&HogConfig { count: 1, duty_pct: 100, cpus: vec![4095] }).err().unwrap();
        assert!(e.to_string().contains("no such CPU"), "{e}");
    }
}
