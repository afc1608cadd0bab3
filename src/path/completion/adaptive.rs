//! `adaptive`: switch among interrupt, hybrid and poll at run time.
//!
//! Seed 001 found that polling, fastest on an idle machine, loses badly once
//! other work competes for the CPU, and left the choice between the two as
//! future work. This policy makes it per queue, every epoch (64 completions
//! or 5 ms), from what it measures (../shared/notes/adaptive-completion.md §7,
//! "CAPS", simplified):
//!
//! - contention: this thread's run delay (`/proc/thread-self/schedstat`),
//!   its involuntary context switches, and the system's CPU pressure
//!   (`/proc/pressure/cpu`), condensed into a level LOW / MID / HIGH with
//!   hysteresis (2 epochs to raise, 4 to lower);
//! - the device: mean latency `L` (exact samples only), the timer's
//!   overshoot `W` (from the hybrid policy it embeds) and the cost each mode
//!   was seen to have (latency and CPU per I/O, per mode, learned while in it);
//! - a cost `J = latency + lambda x CPU` with lambda growing with contention
//!   (0.25 / 1 / 3): on an idle machine CPU is cheap, under contention every
//!   CPU microsecond taken from others counts.
//!
//! Overrides come first: a preempted poller (2+ involuntary switches or 5% run
//! delay in an epoch) leaves polling at once for hybrid; hybrid is never
//! chosen when a sleep cannot end before the device does (`L` below `W` plus
//! the shortest sleep: a timer-floor device, the DRAM-SSD here); polling is
//! not chosen for I/Os over 200 µs. Otherwise a switch needs `J` 10% better
//! for 2 epochs in a row, so the policy does not oscillate. Every decision is
//! counted (switches, time in each mode). [`Controller`] holds the decision
//! logic as a pure function of its inputs and is tested with synthetic
//! traces; [`Adaptive`] samples the signals and runs the chosen mode.

use super::hybrid::{Hybrid, MIN_SLEEP_NS};
use super::interrupt::Interrupt;
use super::poll::Poll;
use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::{Command, Queue};
use crate::error::Result;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Completions per epoch.
pub const EPOCH_IOS: u64 = 64;
/// Longest epoch.
pub const EPOCH_NS: u64 = 5_000_000;

/// A completion mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Spin.
    Poll = 0,
    /// Sleep, then spin.
    Hybrid = 1,
    /// Sleep until woken.
    Interrupt = 2,
}

impl Mode {
    /// All modes.
    pub const ALL: [Mode; 3] = [Mode::Poll, Mode::Hybrid, Mode::Interrupt];

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Hybrid => "hybrid",
            Mode::Interrupt => "interrupt",
        }
    }
}

/// CPU contention as seen by one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The thread gets its CPU when it wants it.
    Low,
    /// Some waiting.
    Mid,
    /// Others are competing for this CPU.
    High,
}

/// What one epoch measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EpochSignals {
    /// Wall time of the epoch.
    pub wall_ns: u64,
    /// I/Os completed.
    pub ios: u64,
    /// Time this thread was runnable but waiting for a CPU.
    pub run_delay_ns: u64,
    /// Involuntary context switches of this thread.
    pub involuntary_ctx: u64,
    /// System CPU pressure ("some" time), if readable.
    pub pressure_ns: u64,
    /// CPU time this thread used.
    pub cpu_ns: u64,
    /// Sum of the latencies of the epoch's I/Os (submission to completion seen).
    pub latency_sum_ns: u64,
    /// Mean device latency from exact samples (0 = unknown).
    pub device_latency_ns: f64,
    /// The timer's measured overshoot.
    pub overshoot_ns: f64,
}

/// The decision logic: a pure function of epoch signals.
#[derive(Debug, Clone)]
pub struct Controller {
    mode: Mode,
    level: Level,
    raise_votes: u32,
    lower_votes: u32,
    candidate: Option<(Mode, u32)>,
    /// (latency per I/O, CPU per I/O) observed in each mode (0 = not yet).
    cost: [(f64, f64); 3],
    /// Mode changes so far.
    pub switches: u64,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::new()
    }
}

impl Controller {
    /// Starts in poll mode (the cheapest way to learn the device's latency).
    pub fn new() -> Controller {
        Controller {
            mode: Mode::Poll,
            level: Level::Low,
            raise_votes: 0,
            lower_votes: 0,
            candidate: None,
            cost: [(0.0, 0.0); 3],
            switches: 0,
        }
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The current contention level.
    pub fn level(&self) -> Level {
        self.level
    }

    /// The contention an epoch saw, from run delay and CPU pressure: both say
    /// directly that a thread waited for a CPU. Involuntary switches are too
    /// noisy for this in sleeping modes (measured here: thousands per second
    /// with no competing load); they serve only to catch a preempted poller.
    fn epoch_level(s: &EpochSignals) -> Level {
        let wall = s.wall_ns.max(1) as f64;
        let rd = s.run_delay_ns as f64 / wall;
        let psi = s.pressure_ns as f64 / wall;
        if rd >= 0.10 || psi >= 0.20 {
            Level::High
        } else if rd < 0.02 && psi < 0.05 {
            Level::Low
        } else {
            Level::Mid
        }
    }

    /// Estimated (latency, CPU) per I/O of `mode`: observed if it was used, else modelled.
    fn estimate(&self, mode: Mode, l: f64, w: f64) -> (f64, f64) {
        let seen = self.cost[mode as usize];
        if seen.0 > 0.0 {
            return seen;
        }
        match mode {
            Mode::Poll => (l, l),
            // ~10% of wake-ups oversleep by about the overshoot; the spin is the tail.
            Mode::Hybrid => (l + 0.1 * w, 3_000.0 + (w / 2.0).min(l)),
            Mode::Interrupt => (l + w, 3_000.0 + 0.2 * l.min(w)),
        }
    }

    /// Feeds one epoch; returns the mode for the next one.
    pub fn on_epoch(&mut self, s: &EpochSignals) -> Mode {
        if s.ios > 0 {
            let lat = s.latency_sum_ns as f64 / s.ios as f64;
            let cpu = s.cpu_ns as f64 / s.ios as f64;
            let c = &mut self.cost[self.mode as usize];
            *c = if c.0 == 0.0 { (lat, cpu) } else { (c.0 + (lat - c.0) / 4.0, c.1 + (cpu - c.1) / 4.0) };
        }
        // Contention level with hysteresis: 2 epochs to raise, 4 to lower.
        let seen = Self::epoch_level(s);
        if seen > self.level {
            self.raise_votes += 1;
            self.lower_votes = 0;
            if self.raise_votes >= 2 {
                self.level = seen;
                self.raise_votes = 0;
            }
        } else if seen < self.level {
            self.lower_votes += 1;
            self.raise_votes = 0;
            if self.lower_votes >= 4 {
                self.level = seen;
                self.lower_votes = 0;
            }
        } else {
            self.raise_votes = 0;
            self.lower_votes = 0;
        }
        let l = s.device_latency_ns;
        if l <= 0.0 {
            return self.mode; // nothing learned yet
        }
        let w = s.overshoot_ns;
        let hybrid_feasible = l > w + 2.0 * MIN_SLEEP_NS as f64;
        let wall = s.wall_ns.max(1) as f64;
        let preempted = s.involuntary_ctx >= 2 || s.run_delay_ns as f64 / wall >= 0.05;
        // Overrides, in priority order.
        // A preempted poller leaves at once for hybrid; where hybrid cannot work (the
        // device is faster than a wake-up) the preemption is priced into polling's
        // latency below instead, since interrupts cost a wake-up on every I/O.
        let forced = if self.mode == Mode::Poll && preempted && hybrid_feasible {
            Some(Mode::Hybrid)
        } else if self.mode == Mode::Hybrid && !hybrid_feasible {
            Some(if self.level == Level::Low { Mode::Poll } else { Mode::Interrupt })
        } else {
            None
        };
        if let Some(mode) = forced {
            return self.switch_to(mode);
        }
        let lambda = match self.level {
            Level::Low => 0.25,
            Level::Mid => 1.0,
            Level::High => 3.0,
        };
        let preemption_per_io = s.run_delay_ns as f64 / s.ios.max(1) as f64;
        let cost = |m: Mode| {
            let (mut lat, cpu) = self.estimate(m, l, w);
            if m == Mode::Poll && self.mode == Mode::Poll {
                lat += preemption_per_io;
            }
            lat + lambda * cpu
        };
        let allowed = |m: Mode| match m {
            // Under contention polling is priced by its CPU (lambda) and its observed
            // latency, not banned: on a device faster than a wake-up it still wins.
            Mode::Poll => l <= 200_000.0,
            Mode::Hybrid => hybrid_feasible,
            Mode::Interrupt => true,
        };
        let best = Mode::ALL.into_iter().filter(|&m| allowed(m)).min_by(|&a, &b| cost(a).total_cmp(&cost(b)));
        let Some(best) = best else { return self.mode };
        if best == self.mode || (allowed(self.mode) && cost(best) >= 0.9 * cost(self.mode)) {
            self.candidate = None;
            return self.mode;
        }
        // A better mode must win two epochs in a row.
        match self.candidate {
            Some((m, n)) if m == best && n + 1 >= 2 => self.switch_to(best),
            Some((m, n)) if m == best => {
                self.candidate = Some((m, n + 1));
                self.mode
            }
            _ => {
                self.candidate = Some((best, 1));
                self.mode
            }
        }
    }

    fn switch_to(&mut self, mode: Mode) -> Mode {
        self.candidate = None;
        if mode != self.mode {
            self.mode = mode;
            self.switches += 1;
        }
        mode
    }
}

/// Reads this thread's run delay (ns waiting for a CPU) from schedstat.
fn read_run_delay(file: &Option<File>, buf: &mut [u8; 128]) -> u64 {
    let Some(f) = file else { return 0 };
    let n = f.read_at(buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Reads the system's CPU "some" pressure total (ns).
fn read_pressure(file: &Option<File>, buf: &mut [u8; 128]) -> u64 {
    let Some(f) = file else { return 0 };
    let n = f.read_at(buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| {
            s.lines().next()?.split_whitespace().find_map(|kv| kv.strip_prefix("total="))?.parse::<u64>().ok()
        })
        .map_or(0, |us| us * 1000)
}

/// This thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID: exact, unlike
/// getrusage, which may count in scheduler ticks).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is valid and writable; the clock exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Debug, Clone, Copy, Default)]
struct Snapshot {
    at_ns: u64,
    cpu_ns: u64,
    usage: ThreadUsage,
    run_delay_ns: u64,
    pressure_ns: u64,
}

/// The adaptive policy (one per channel).
pub struct Adaptive {
    controller: Controller,
    hybrid: Hybrid,
    schedstat: Option<File>,
    pressure: Option<File>,
    buf: [u8; 128],
    start: Option<Snapshot>,
    ios: u64,
    latency_sum_ns: u64,
    mode_since_ns: u64,
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
            // Opened lazily on the waiting thread (thread-self must be that thread).
            schedstat: None,
            pressure: None,
            buf: [0; 128],
            start: None,
            ios: 0,
            latency_sum_ns: 0,
            mode_since_ns: 0,
        }
    }

    /// The controller (mode, level, switches).
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    fn snapshot(&mut self, now: u64) -> Snapshot {
        Snapshot {
            at_ns: now,
            cpu_ns: thread_cpu_ns(),
            usage: ThreadUsage::now(),
            run_delay_ns: read_run_delay(&self.schedstat, &mut self.buf),
            pressure_ns: read_pressure(&self.pressure, &mut self.buf),
        }
    }

    fn end_epoch(&mut self, now: u64, stats: &mut WaitStats) {
        let Some(start) = self.start else { return };
        let end = self.snapshot(now);
        let used = end.usage.since(&start.usage);
        let signals = EpochSignals {
            wall_ns: now - start.at_ns,
            ios: self.ios,
            run_delay_ns: end.run_delay_ns.saturating_sub(start.run_delay_ns),
            involuntary_ctx: used.involuntary_ctx,
            pressure_ns: end.pressure_ns.saturating_sub(start.pressure_ns),
            cpu_ns: end.cpu_ns.saturating_sub(start.cpu_ns),
            latency_sum_ns: self.latency_sum_ns,
            device_latency_ns: self.hybrid.bucket_latency_any(),
            overshoot_ns: self.hybrid.overshoot_ns(),
        };
        let before = self.controller.mode();
        let after = self.controller.on_epoch(&signals);
        // Time is booked to the mode every epoch, so reports are right at any moment.
        stats.mode_ns[before as usize] += now - self.mode_since_ns;
        self.mode_since_ns = now;
        if after != before {
            stats.mode_switches += 1;
        }
        self.ios = 0;
        self.latency_sum_ns = 0;
        self.start = Some(end);
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
        let now = now_ns();
        if self.start.is_none() {
            self.schedstat = File::open("/proc/thread-self/schedstat").ok();
            self.pressure = File::open("/proc/pressure/cpu").ok();
            self.mode_since_ns = now;
            self.start = Some(self.snapshot(now));
        }
        let mode = self.controller.mode();
        let n = match mode {
            // Poll and interrupt still teach the embedded hybrid the device latency.
            Mode::Hybrid => self.hybrid.wait(queue, out, stats, limit_ns, expect)?,
            Mode::Poll => {
                let n = Poll.wait(queue, out, stats, limit_ns, expect)?;
                if n > 0 && expect.since_ns > 0 {
                    self.hybrid.learn(expect, now_ns());
                }
                n
            }
            Mode::Interrupt => Interrupt.wait(queue, out, stats, limit_ns, expect)?,
        };
        let done = now_ns();
        if n > 0 {
            self.ios += n as u64;
            if expect.since_ns > 0 {
                // One preempted wait can take milliseconds; cap each sample at 4 L so the
                // epoch's mean reflects the mode, not one outlier.
                let l = self.hybrid.bucket_latency_any();
                let sample = done.saturating_sub(expect.since_ns);
                let sample = if l > 0.0 { sample.min((4.0 * l) as u64) } else { sample };
                self.latency_sum_ns += sample * n as u64;
            }
        }
        let start = self.start.map_or(done, |s| s.at_ns);
        if self.ios >= EPOCH_IOS || done.saturating_sub(start) >= EPOCH_NS {
            self.end_epoch(done, stats);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(latency_us: f64, run_delay_pct: f64, inv: u64) -> EpochSignals {
        let wall = 5_000_000;
        EpochSignals {
            wall_ns: wall,
            ios: 64,
            run_delay_ns: (wall as f64 * run_delay_pct / 100.0) as u64,
            involuntary_ctx: inv,
            pressure_ns: 0,
            cpu_ns: 0,
            latency_sum_ns: 0,
            device_latency_ns: latency_us * 1000.0,
            overshoot_ns: 25_000.0,
        }
    }

    #[test]
    fn a_device_faster_than_a_wake_up_is_polled() {
        let mut c = Controller::new();
        for _ in 0..20 {
            c.on_epoch(&epoch(7.0, 0.0, 0));
        }
        assert_eq!(c.mode(), Mode::Poll);
        assert_eq!(c.switches, 0, "no switch, no oscillation");
    }

    #[test]
    fn a_slow_device_on_an_idle_machine_goes_hybrid_and_stays() {
        let mut c = Controller::new();
        let mut modes = Vec::new();
        for _ in 0..40 {
            modes.push(c.on_epoch(&epoch(80.0, 0.0, 0)));
        }
        assert_eq!(c.mode(), Mode::Hybrid);
        assert_eq!(c.switches, 1, "one switch after two agreeing epochs: {modes:?}");
        assert_eq!(modes[0], Mode::Poll, "a switch needs two epochs in a row");
    }

    #[test]
    fn a_preempted_poller_leaves_polling_at_once() {
        let mut c = Controller::new();
        c.on_epoch(&epoch(80.0, 0.0, 0));
        assert_eq!(c.mode(), Mode::Poll);
        assert_eq!(c.on_epoch(&epoch(80.0, 20.0, 5)), Mode::Hybrid);
        // On a timer-floor device hybrid cannot help and an interrupt costs a wake-up
        // per I/O: the preemption is priced into polling instead of forcing a switch.
        let mut c = Controller::new();
        assert_eq!(c.on_epoch(&epoch(7.0, 20.0, 5)), Mode::Poll);
    }

    #[test]
    fn sustained_contention_moves_to_interrupts_and_calm_brings_hybrid_back() {
        let mut c = Controller::new();
        for _ in 0..10 {
            c.on_epoch(&epoch(80.0, 30.0, 6));
        }
        assert_eq!(c.level(), Level::High);
        assert_ne!(c.mode(), Mode::Poll, "a slow device is not polled under high contention");
        let under_load = c.switches;
        for _ in 0..40 {
            c.on_epoch(&epoch(80.0, 0.0, 0));
        }
        assert_eq!(c.level(), Level::Low, "lowering takes 4 calm epochs");
        assert_eq!(c.mode(), Mode::Hybrid);
        assert!(c.switches <= under_load + 1, "settles without oscillating");
    }

    #[test]
    fn alternating_noise_does_not_make_it_oscillate() {
        let mut c = Controller::new();
        for i in 0..100 {
            let noisy = if i % 2 == 0 { epoch(80.0, 0.0, 0) } else { epoch(80.0, 3.0, 1) };
            c.on_epoch(&noisy);
        }
        assert!(c.switches <= 2, "{} switches", c.switches);
    }
}
