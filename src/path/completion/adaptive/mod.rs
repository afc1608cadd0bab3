//! `adaptive`: switch among interrupt, hybrid and poll at run time.
//!
//! Seed 001 found that polling, fastest on an idle machine, loses badly once
//! other work competes for the CPU, and left the choice between the two as
//! future work. This policy makes it per queue from what it measures
//! (../shared/notes/adaptive-completion.md §7, "CAPS", simplified):
//!
//! - **costs are measured, not modelled**: for each mode the latency and the
//!   thread CPU time per I/O it was seen to cost (decayed sums, half-life
//!   50 ms). On this VM a timer wake-up costs ~25 µs of CPU, five times what
//!   a model of "a few µs per interrupt" says;
//! - a mode not in use is **probed** for a short epoch (16 I/Os; 64 on a
//!   device whose latency jumps from epoch to epoch) when it was
//!   never measured, when its figures are older than its probe interval
//!   (250 ms, x2 after a clear loss, x4 when it lost on both latency and CPU,
//!   up to 4 s), or (at most every 250 ms, and not if it lost on both axes)
//!   when they were measured at another contention level;
//! - **contention** from this thread's run delay (`/proc/thread-self/schedstat`)
//!   and the system's CPU pressure (`/proc/pressure/cpu`), smoothed (half-life
//!   50 ms) into LOW / MID / HIGH with hysteresis, sets how much a CPU
//!   microsecond is worth against a latency microsecond: `J = latency +
//!   lambda x CPU`, lambda 1 / 2 / 4;
//! - a mode replaces the current one when its `J` is 5% lower twice in a row,
//!   and only after a fresh probe confirms it;
//! - overrides: a preempted poller (2 stalls, i.e. gaps of over 20 µs between
//!   two looks at the queue, or 2 involuntary switches, or 5% run
//!   delay) leaves at once for hybrid; hybrid is never used where a sleep
//!   cannot end before the device does (the DRAM-SSD here: a preempted poller
//!   still beats a wake-up per I/O), with hysteresis; a mode that stops being
//!   usable gives way to the cheapest measured one; polling is not used for
//!   I/Os over 200 µs. Outside hybrid mode, a timer-overshoot estimate that
//!   rules hybrid out is refreshed by a calibration sleep per epoch;
//! - the crowd: while the process's adaptive waiters outnumber its CPUs,
//!   every wait yields between looks whatever the mode (see `WAITING`'s
//!   comment: no thread can learn that from its own measurements).
//!
//! An epoch is 64 completions (at least 2 ms) or 5 ms. While polling it is
//! 20-50 ms and makes no system call at all (CPU time and run delay are
//! estimated from its stalls): each system call of a polling thread under
//! contention is a point where the scheduler can take its CPU (measured:
//! p99.9 ~2 ms instead of ~60 µs with 2 hogs on the DRAM-SSD).
//! Every decision is counted (switches, probes, time in each mode) and, with
//! `IOPATH_TRACE_ADAPTIVE=1`, printed to stderr one line per epoch.
//! [`Controller`] holds the decision logic as a pure function of its inputs
//! and is tested with synthetic machines; [`Adaptive`] samples the signals and
//! runs the chosen mode.
//!
//! One file each: [`controller`] (the decision logic, a pure function of its
//! inputs, tested with synthetic machines), `signals` (what is sampled from
//! the kernel each epoch), and this module (the policy that samples, asks the
//! controller and waits in the chosen mode).

pub mod controller;
mod signals;

pub use controller::*;

use super::hybrid::{Hybrid, sleep_feasible};
use super::interrupt::Interrupt;
use super::poll::{self, Gaps};
use super::yielding::Yield;
use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::{Command, Queue};
use crate::error::Result;
use signals::{Snapshot, read_pressure, read_run_delay, thread_cpu_ns};
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads of this process inside an adaptive wait right now. While they
/// outnumber the CPUs every wait yields between its looks, whatever the
/// controller's mode: spinning waiters would take turns holding the CPUs
/// that the others (and a device's worker on the same CPUs) need, and
/// sleeping ones pay a wake-up each, often across CPUs. No thread can learn
/// that from its own measurements: one that yields among spinners or
/// sleepers only loses, so the choice is the crowd's. Measured on the loop
/// device, 16 threads on 2 CPUs: adaptive 161-164K IOPS before (80% of its
/// time in interrupt mode), `sync-yield` 383-415K.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// The adaptive policy (one per channel).
pub struct Adaptive {
    controller: Controller,
    hybrid: Hybrid,
    /// The waits while the waiters outnumber the CPUs.
    yielder: Yield,
    /// CPUs this process may run on.
    cpus: usize,
    /// A crowded wait came since the epoch began: the epoch starts afresh at
    /// the next wait the controller's mode runs (it measured the crowd, not the mode).
    crowd_seen: bool,
    schedstat: Option<File>,
    pressure: Option<File>,
    buf: [u8; 128],
    start: Option<Snapshot>,
    ios: u64,
    latency_sum_ns: u64,
    /// Time the poller was off its CPU this epoch.
    gaps: Gaps,
    mode_since_ns: u64,
    /// Print every epoch's signals and decision to stderr (`IOPATH_TRACE_ADAPTIVE=1`).
    trace: bool,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive::new()
    }
}

impl Adaptive {
    /// A policy that starts polling and learns.
    pub fn new() -> Adaptive {
        Adaptive {
            controller: Controller::new(),
            hybrid: Hybrid::new(),
            yielder: Yield::default(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            crowd_seen: false,
            // Opened lazily on the waiting thread (thread-self must be that thread).
            schedstat: None,
            pressure: None,
            buf: [0; 128],
            start: None,
            ios: 0,
            latency_sum_ns: 0,
            gaps: Gaps::default(),
            mode_since_ns: 0,
            trace: std::env::var_os("IOPATH_TRACE_ADAPTIVE").is_some_and(|v| v != "0"),
        }
    }

    fn trace_epoch(&self, before: Mode, s: &EpochSignals) {
        let c = &self.controller;
        let costs: Vec<String> = Mode::ALL
            .into_iter()
            .map(|m| match c.measured(m) {
                Some((lat, cpu)) => format!("{}={:.1}/{:.1}us", m.name(), lat / 1e3, cpu / 1e3),
                None => format!("{}=?", m.name()),
            })
            .collect();
        let wall = s.wall_ns.max(1) as f64;
        eprintln!(
            "adaptive: {:>9} -> {:<9}{} jitter={:.2} level={:?} ios={} wall={:.2}ms run_delay={:.1}% psi={:.1}% inv={} L={:.1}us W={:.1}us measured lat/cpu per io: {}",
            before.name(),
            c.mode().name(),
            if c.probing() { " (probe)" } else { "" },
            c.device_jitter,
            c.level(),
            s.ios,
            s.wall_ns as f64 / 1e6,
            100.0 * s.run_delay_ns as f64 / wall,
            100.0 * s.pressure_ns as f64 / wall,
            s.involuntary_ctx,
            s.device_latency_ns / 1e3,
            s.overshoot_ns / 1e3,
            costs.join(" "),
        );
    }

    /// The controller (mode, level, switches).
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// Reads the signals; `full` adds the thread's own counters. A polling
    /// thread does not read those: reading its own CPU time or schedstat makes
    /// the kernel account its run time then and there, and under contention
    /// that hands its CPU to a competitor at once instead of at the next tick
    /// (measured with 2 hogs on the DRAM-SSD: ms-scale p99.9 in 7 of 10 runs
    /// against polling's 3 of 10). Its CPU time and run delay are then
    /// estimated from its stalls.
    fn snapshot(&mut self, full: bool) -> Snapshot {
        // The clock is read last: a thread preempted on its way out of one of these
        // system calls has that delay counted in its run delay, so the epoch's wall
        // time must include it too.
        let (pressure_ns, run_delay_ns, usage, cpu_ns) = if full {
            (
                read_pressure(&self.pressure, &mut self.buf),
                read_run_delay(&self.schedstat, &mut self.buf),
                ThreadUsage::now(),
                thread_cpu_ns(),
            )
        } else {
            (0, 0, ThreadUsage::default(), 0)
        };
        Snapshot { at_ns: now_ns(), full, cpu_ns, usage, run_delay_ns, pressure_ns }
    }

    fn end_epoch(&mut self, stats: &mut WaitStats) {
        let Some(start) = self.start else { return };
        let before = self.controller.mode();
        if before != Mode::Hybrid && self.hybrid.overshoot_may_be_stale() {
            // Only hybrid's own sleeps measure the overshoot: outside it, hybrid would
            // stay ruled out by an estimate a burst of contention left high.
            self.hybrid.calibrate_overshoot();
        }
        let end = self.snapshot(before != Mode::Poll);
        let wall_ns = end.at_ns.saturating_sub(start.at_ns);
        let (run_delay_ns, involuntary_ctx, cpu_ns, pressure_ns) = if start.full && end.full {
            let used = end.usage.since(&start.usage);
            (
                end.run_delay_ns.saturating_sub(start.run_delay_ns),
                used.involuntary_ctx,
                end.cpu_ns.saturating_sub(start.cpu_ns),
                end.pressure_ns.saturating_sub(start.pressure_ns),
            )
        } else {
            // A poller is on its CPU except in the gaps between its looks; it reads no
            // pressure either.
            (self.gaps.total_ns, 0, wall_ns.saturating_sub(self.gaps.total_ns), 0)
        };
        let signals = EpochSignals {
            wall_ns,
            ios: self.ios,
            run_delay_ns,
            involuntary_ctx,
            stalls: self.gaps.count,
            pressure_ns,
            cpu_ns,
            latency_sum_ns: self.latency_sum_ns,
            device_latency_ns: self.hybrid.bucket_latency_any(),
            overshoot_ns: self.hybrid.overshoot_ns(),
        };
        let (switches, probes) = (self.controller.switches, self.controller.probes);
        self.controller.on_epoch(&signals);
        if self.trace {
            self.trace_epoch(before, &signals);
        }
        // Time is booked to the mode every epoch, so reports are right at any moment.
        stats.mode_ns[before as usize] += end.at_ns - self.mode_since_ns;
        self.mode_since_ns = end.at_ns;
        stats.mode_switches += self.controller.switches - switches;
        stats.mode_probes += self.controller.probes - probes;
        self.ios = 0;
        self.latency_sum_ns = 0;
        self.gaps = Gaps::default();
        // A sleeping mode's epoch needs the thread's counters at its start.
        self.start = Some(if self.controller.mode() != Mode::Poll && !end.full { self.snapshot(true) } else { end });
    }
}

impl CompletionPolicy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn uses_expect(&self) -> bool {
        true
    }

    fn spins(&self) -> bool {
        self.controller.mode() != Mode::Interrupt
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize> {
        if self.start.is_none() {
            self.schedstat = File::open("/proc/thread-self/schedstat").ok();
            self.pressure = File::open("/proc/pressure/cpu").ok();
            self.mode_since_ns = now_ns();
            self.start = Some(self.snapshot(self.controller.mode() != Mode::Poll));
        }
        if WAITING.fetch_add(1, Ordering::Relaxed) >= self.cpus {
            let began = now_ns();
            let waited = self.yielder.wait(queue, out, stats, limit_ns, expect);
            WAITING.fetch_sub(1, Ordering::Relaxed);
            stats.mode_ns[CROWD] += now_ns() - began;
            self.crowd_seen = true;
            return waited;
        }
        let waited = self.wait_in_mode(queue, out, stats, limit_ns, expect);
        WAITING.fetch_sub(1, Ordering::Relaxed);
        waited
    }
}

/// Where `WaitStats::mode_ns` books the waits of a crowd (after poll, hybrid, interrupt).
const CROWD: usize = 3;

impl Adaptive {
    /// One wait in the controller's mode, and the epoch bookkeeping.
    fn wait_in_mode(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize> {
        if std::mem::take(&mut self.crowd_seen) {
            // The epoch so far was the crowd's: it starts again now.
            self.ios = 0;
            self.latency_sum_ns = 0;
            self.gaps = Gaps::default();
            self.start = Some(self.snapshot(self.controller.mode() != Mode::Poll));
            self.mode_since_ns = now_ns();
        }
        let mode = self.controller.mode();
        let (n, done) = match mode {
            Mode::Hybrid => (self.hybrid.wait(queue, out, stats, limit_ns, expect)?, now_ns()),
            Mode::Poll => {
                // Polling still teaches the embedded hybrid the device latency.
                let (n, seen) = poll::spin(queue, out, stats, limit_ns, Some(&mut self.gaps))?;
                if n > 0 && expect.since_ns > 0 {
                    self.hybrid.learn(expect, seen);
                }
                (n, seen)
            }
            Mode::Interrupt => (Interrupt.wait(queue, out, stats, limit_ns, expect)?, now_ns()),
        };
        let l = self.hybrid.bucket_latency_any();
        if n > 0 {
            self.ios += n as u64;
            if expect.since_ns > 0 {
                // Not capped: a preempted wait of milliseconds is what the mode cost.
                self.latency_sum_ns += done.saturating_sub(expect.since_ns) * n as u64;
            }
        }
        let start = self.start.map_or(done, |s| s.at_ns);
        let age = done.saturating_sub(start);
        // A probe is short: it only has to measure, and a mode being probed may well
        // be a bad one (with hogs on a fast device, a sleeping I/O can wait a tick).
        let probing = self.controller.probing();
        let long = mode == Mode::Poll && !probing;
        let (min_ns, max_ns) = if long { POLL_EPOCH_NS } else { (MIN_EPOCH_NS, EPOCH_NS) };
        // A preempted poller is acted on at once, where there is something better to do.
        let stalled = self.gaps.count >= 2 && sleep_feasible(l, self.hybrid.overshoot_ns());
        let probed = probing && self.ios >= self.controller.probe_ios();
        if (self.ios >= EPOCH_IOS && age >= min_ns) || age >= max_ns || stalled || probed {
            self.end_epoch(stats);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::{DeviceSpec, Op, QueueConfig};

    /// Reads through `policy` one at a time; returns the counters.
    fn read_many(policy: &mut Adaptive, reads: usize) -> WaitStats {
        let dev = DeviceSpec::parse("emu:nand,size=1m", None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(1)).unwrap();
        let mut buf = IoBuf::new(4096);
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        for i in 0..reads {
            let mut c = Command::with_capacity(1);
            c.reset(Op::Read, i as u64);
            c.push(0, buf.as_mut_ptr(), 4096);
            let since_ns = now_ns();
            // SAFETY: the buffer outlives the read, which is waited for below.
            unsafe { q.submit(c) };
            q.commit().unwrap();
            let expect = Expect { since_ns, op: Op::Read, bytes: 4096 };
            while out.is_empty() {
                policy.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, expect).unwrap();
            }
            assert_eq!(out.pop().unwrap().segments[0].result, 4096);
        }
        stats
    }

    #[test]
    fn waiters_that_outnumber_the_cpus_yield_whatever_the_mode() {
        // Twice as many threads as CPUs, each waiting 80 us per read at the same time.
        let threads = 2 * std::thread::available_parallelism().map_or(1, |n| n.get());
        let crowded: Vec<u64> = std::thread::scope(|s| {
            let all: Vec<_> = (0..threads).map(|_| s.spawn(|| read_many(&mut Adaptive::new(), 300))).collect();
            all.into_iter().map(|t| t.join().unwrap().mode_ns[CROWD]).collect()
        });
        assert!(crowded.iter().any(|&ns| ns > 0), "no wait yielded in the crowd: {crowded:?}");
        assert_eq!(WAITING.load(Ordering::Relaxed), 0, "every wait left the count");
    }
}
