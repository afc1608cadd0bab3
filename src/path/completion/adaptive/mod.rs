//! `adaptive` and `auto`: switch among waiting modes at run time.
//!
//! Seed 001 found that polling, fastest on an idle machine, loses badly once
//! other work competes for the CPU, and left the choice between the two as
//! future work. This policy makes it per queue from what it measures
//! (../shared/notes/adaptive-completion.md §7, "CAPS", simplified). Two
//! flavours share it: `adaptive` chooses among poll, hybrid and interrupt;
//! `auto`, the default path's policy, adds yield (poll, handing the CPU to
//! any other runnable thread between looks) and starts there.
//!
//! - **costs are measured, not modelled**: for each mode the latency per
//!   I/O and the CPU time its waits took (a poller's wait less its gaps; in
//!   other modes read on one wait in 8, not counting the program's own work
//!   between waits), as decayed sums (half-life 50 ms). On this VM a timer
//!   wake-up costs ~25 µs of CPU, five times what a model of "a few µs per
//!   interrupt" says;
//! - a mode not in use is **probed** for a short epoch (16 I/Os; 64 on a
//!   device whose latency jumps from epoch to epoch) when it was
//!   never measured, when its figures are older than its probe interval
//!   (250 ms, x2 after a clear loss, x4 when it lost on both latency and CPU,
//!   up to 4 s), or (at most every 250 ms, and not if it lost on both axes)
//!   when they were measured at another contention level; a probe's wait
//!   that has taken [`PROBE_GIVE_UP_IOS`] I/Os' worth of the kept mode's
//!   cost gives up (the probe has lost: it cannot win any more), and the I/O
//!   is waited for again in the kept mode;
//! - **contention** from this thread's run delay (`/proc/thread-self/schedstat`)
//!   and the system's CPU pressure (`/proc/pressure/cpu`), smoothed (half-life
//!   50 ms) into LOW / MID / HIGH with hysteresis, sets how much a CPU
//!   microsecond is worth against a latency microsecond: `J = latency +
//!   lambda x CPU`, lambda 1 / 2 / 4;
//! - a mode replaces the current one when its `J` is 5% lower twice in a row,
//!   and only after a fresh probe confirms it;
//! - **sparse waits** (an epoch with fewer I/Os than a probe, waiting under
//!   a quarter of its time) yield: so few samples cannot tell the modes
//!   apart, and a yield costs no wake-up;
//! - overrides: a preempted poller (2 stalls, i.e. gaps of over 20 µs between
//!   two looks at the queue, or 2 involuntary switches, or 5% run
//!   delay) leaves at once for hybrid; hybrid is never used where a sleep
//!   cannot end before the device does (the DRAM-SSD here: a preempted poller
//!   still beats a wake-up per I/O), with hysteresis; where the CPUs are
//!   oversubscribed (HIGH, or others want them) `auto` does not poll, nor use
//!   hybrid on a device it cannot sleep through half of: both spin on a CPU
//!   another thread wanted, which no figure of the waiter's own shows (a yield
//!   spins only while nobody else wants it); a mode that stops being
//!   usable gives way to the cheapest measured one; polling and yielding are
//!   not used for I/Os over 200 µs. Outside hybrid mode, a timer-overshoot
//!   estimate that rules hybrid out is refreshed by a calibration sleep per epoch;
//! - the crowd: while the process's waiters outnumber its CPUs, every wait
//!   yields between looks whatever the mode, and sleeps instead when the
//!   [crowd's verdict](super::crowd::Verdict) says a long yield went to a
//!   thread that is not waiting (a hog, the program's own computing threads).
//!   No thread can learn that from its own measurements: one that yields
//!   among spinners or sleepers only loses, so the choice is the crowd's.
//!   Measured on the loop device, 16 threads on 2 CPUs: adaptive 161-164K
//!   IOPS before (80% of its time in interrupt mode), yielding 383-415K.
//!
//! An epoch is 64 completions (at least 2 ms) or 5 ms. While polling it is
//! 20-50 ms and makes no system call at all (CPU time and run delay are
//! estimated from its stalls): each system call of a polling thread under
//! contention is a point where the scheduler can take its CPU (measured:
//! p99.9 ~2 ms instead of ~60 µs with 2 hogs on the DRAM-SSD).
//! Every decision is counted (switches, probes, time in each mode) and said
//! in words through [`explain`] (`IOPATH_LOG=1`, `iopath
//! bench --explain`); with `IOPATH_TRACE_ADAPTIVE=1` every epoch's signals
//! are printed to stderr.
//!
//! One file each: [`controller`] (the decision logic, a pure function of its
//! inputs, tested with synthetic machines), `signals` (what is sampled from
//! the kernel each epoch), and this module (the policy that samples, asks the
//! controller and waits in the chosen mode).

pub mod controller;
mod signals;

pub use controller::*;

use super::crowd::{self, Waiting};
use super::explain::{self, CROWD, FLUSH, JUDGED_SLEEPING};
use super::hybrid::{Hybrid, sleep_feasible};
use super::interrupt::Interrupt;
use super::judge::{self, Way};
use super::poll::{self, Gaps};
use super::yielding::{Yield, YieldOutcome};
use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::{Command, Op, Queue};
use crate::error::Result;
use signals::{Snapshot, read_pressure, read_run_delay, thread_cpu_ns};
use std::fs::File;

/// Outside polling, one wait in this many (half as many while a mode is
/// probed) has its CPU time read: reading it is a system call (0.6 us here),
/// a tenth of a device time if every wait paid it twice.
const CPU_SAMPLE_EVERY: u64 = 8;

/// The adaptive or auto policy (one per channel).
pub struct Adaptive {
    /// `adaptive` or `auto`.
    name: &'static str,
    controller: Controller,
    hybrid: Hybrid,
    /// Yield mode's waits, and every wait while the waiters outnumber the CPUs.
    yielder: Yield,
    /// The last wait was in the crowd (for saying when it starts and ends).
    in_crowd: bool,
    /// When the crowd's coming or going was last said: at most once a second
    /// per thread (a program whose waiters number about its CPUs crosses the
    /// line all the time).
    crowd_said_ns: u64,
    /// A crowded wait, or one the judge made sleep, came since the epoch
    /// began: the epoch starts afresh at the next wait the controller's mode
    /// runs (it measured the crowd or the judge's way, not the mode).
    set_aside: bool,
    /// The process's [judge](super::judge) may make every wait sleep (`auto`).
    judged: bool,
    /// The judge's window this thread last noted itself waiting in.
    noted_window: u64,
    schedstat: Option<File>,
    pressure: Option<File>,
    buf: [u8; 128],
    start: Option<Snapshot>,
    ios: u64,
    latency_sum_ns: u64,
    /// This epoch's waits in the controller's mode: how many, and their wall time.
    waits: u64,
    waiting_ns: u64,
    /// The waits whose CPU time was read (see [`CPU_SAMPLE_EVERY`]): their wall
    /// and CPU time.
    sampled_wall_ns: u64,
    sampled_cpu_ns: u64,
    /// A polled wait of this epoch gave up without its completion (see `EpochSignals::starved`).
    starved: bool,
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
    /// `adaptive`: poll, hybrid and interrupt; starts polling and learns.
    pub fn new() -> Adaptive {
        Adaptive::with(Controller::new(), "adaptive")
    }

    /// `auto`: yield, poll, hybrid and interrupt; starts yielding and learns.
    pub fn auto() -> Adaptive {
        Adaptive::with(Controller::auto(), "auto")
    }

    fn with(controller: Controller, name: &'static str) -> Adaptive {
        Adaptive {
            name,
            judged: controller.modes().contains(&Mode::Yield),
            noted_window: u64::MAX,
            controller,
            hybrid: Hybrid::new(),
            yielder: Yield::default(),
            in_crowd: false,
            crowd_said_ns: 0,
            set_aside: false,
            // Opened lazily on the waiting thread (thread-self must be that thread).
            schedstat: None,
            pressure: None,
            buf: [0; 128],
            start: None,
            ios: 0,
            latency_sum_ns: 0,
            waits: 0,
            waiting_ns: 0,
            sampled_wall_ns: 0,
            sampled_cpu_ns: 0,
            starved: false,
            gaps: Gaps::default(),
            mode_since_ns: 0,
            trace: std::env::var_os("IOPATH_TRACE_ADAPTIVE").is_some_and(|v| v != "0"),
        }
    }

    fn trace_epoch(&self, before: Mode, s: &EpochSignals) {
        let c = &self.controller;
        let costs: Vec<String> = c
            .modes()
            .iter()
            .map(|&m| match c.measured(m) {
                Some((lat, cpu)) => format!("{}={:.1}/{:.1}us", m.name(), lat / 1e3, cpu / 1e3),
                None => format!("{}=?", m.name()),
            })
            .collect();
        let wall = s.wall_ns.max(1) as f64;
        super::explain::write_line(format_args!(
            "{}: {:>9} -> {:<9}{} jitter={:.2} level={:?} ios={} wall={:.2}ms run_delay={:.1}% psi={:.1}% inv={} L={:.1}us W={:.1}us measured lat/cpu per io: {}",
            self.name,
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
        ));
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
        let (pressure_ns, run_delay_ns, usage) = if full {
            (
                read_pressure(&self.pressure, &mut self.buf),
                read_run_delay(&self.schedstat, &mut self.buf),
                ThreadUsage::now(),
            )
        } else {
            (0, 0, ThreadUsage::default())
        };
        Snapshot { at_ns: now_ns(), full, usage, run_delay_ns, pressure_ns }
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
        let (run_delay_ns, involuntary_ctx, pressure_ns) = if start.full && end.full {
            let used = end.usage.since(&start.usage);
            (
                end.run_delay_ns.saturating_sub(start.run_delay_ns),
                used.involuntary_ctx,
                end.pressure_ns.saturating_sub(start.pressure_ns),
            )
        } else {
            // A poller reads none of its counters: it waits for a CPU only in the gaps
            // between its looks.
            (self.gaps.total_ns, 0, 0)
        };
        let cpu_ns = self.waiting_cpu_ns(before);
        let signals = EpochSignals {
            wall_ns,
            ios: self.ios,
            run_delay_ns,
            involuntary_ctx,
            stalls: self.gaps.count,
            pressure_ns,
            cpu_ns,
            latency_sum_ns: self.latency_sum_ns,
            waiting_ns: self.waiting_ns,
            device_latency_ns: self.hybrid.bucket_latency_any(),
            overshoot_ns: self.hybrid.overshoot_ns(),
            cpus_wanted: crowd::cpus_wanted(),
            starved: std::mem::take(&mut self.starved),
        };
        let (switches, probes, was_probing) =
            (self.controller.switches, self.controller.probes, self.controller.probing());
        self.controller.on_epoch(&signals);
        if self.trace {
            self.trace_epoch(before, &signals);
        }
        let c = &self.controller;
        if (c.mode() != before || c.probes != probes || was_probing != c.probing()) && explain::enabled() {
            let (mode, level, device_us) = (c.mode().name(), c.level(), signals.device_latency_ns / 1e3);
            let step = if c.probing() && c.probes != probes {
                format!("{} -> {mode}, probing", before.name())
            } else if c.mode() == before {
                format!("{mode} kept")
            } else {
                format!("{} -> {mode}", before.name())
            };
            explain::say(
                self.name,
                format_args!("{step} ({}; device {device_us:.1} us, contention {level:?})", c.reason),
            );
        }
        // Time is booked to the mode every epoch, so reports are right at any moment.
        stats.mode_ns[before as usize] += end.at_ns - self.mode_since_ns;
        self.mode_since_ns = end.at_ns;
        stats.mode_switches += self.controller.switches - switches;
        stats.mode_probes += self.controller.probes - probes;
        explain::tally_steps(self.controller.switches - switches, self.controller.probes - probes);
        self.restart_counts();
        // A sleeping mode's epoch needs the thread's counters at its start.
        self.start = Some(if self.controller.mode() != Mode::Poll && !end.full { self.snapshot(true) } else { end });
    }
}

impl Adaptive {
    /// The CPU time this epoch's waits in `mode` took: the program's own work
    /// between them is not the mode's doing. (Counting it made every mode's
    /// cost grow with the program's work per I/O: sysbench's random reads on
    /// a mount went from 55 us to 3.6 ms per I/O as its cache warmed, so a
    /// mode measured late always lost, and auto spent 39% of its waiting in
    /// interrupt mode at twice yield's latency.)
    fn waiting_cpu_ns(&self, mode: Mode) -> u64 {
        if mode == Mode::Poll {
            return self.waiting_ns.saturating_sub(self.gaps.total_ns);
        }
        if self.sampled_wall_ns == 0 {
            return 0;
        }
        let share = (self.sampled_cpu_ns as f64 / self.sampled_wall_ns as f64).min(1.0);
        (self.waiting_ns as f64 * share) as u64
    }

    /// Starts the epoch's counts afresh.
    fn restart_counts(&mut self) {
        self.ios = 0;
        self.latency_sum_ns = 0;
        self.waits = 0;
        self.waiting_ns = 0;
        self.sampled_wall_ns = 0;
        self.sampled_cpu_ns = 0;
        self.gaps = Gaps::default();
    }
}

impl CompletionPolicy for Adaptive {
    fn name(&self) -> &'static str {
        self.name
    }

    fn uses_expect(&self) -> bool {
        true
    }

    fn spins(&self) -> bool {
        self.controller.mode() != Mode::Interrupt
    }

    fn wait_blocking(&mut self, stats: &mut WaitStats, call: &mut dyn FnMut() -> bool) -> bool {
        if !self.judged {
            return false;
        }
        judge::note_waiter(&mut self.noted_window);
        let began = now_ns();
        if self.judged_way(began) != Way::Sleep {
            return false;
        }
        // The judge's sleeping way, as the kernel's blocking calls sleep: with them.
        let _waiting = Waiting::enter();
        if !call() {
            return false;
        }
        judge::note_progress(1);
        stats.sleeps += 1;
        self.book_judged_sleep(stats, 1, began);
        true
    }

    fn flush_blocking(&mut self, stats: &mut WaitStats, call: &mut dyn FnMut() -> bool) -> bool {
        // In a crowd only: a waiter with a CPU to itself finds the flush sooner by
        // looking. Counted as a waiter meanwhile and tallied as the flushes waited
        // for otherwise are; the judge counts it as progress (it ends no window).
        let waiting = Waiting::enter();
        if !waiting.crowded() {
            return false;
        }
        let began = explain::enabled().then(now_ns);
        if !call() {
            return false;
        }
        stats.sleeps += 1;
        if self.judged {
            judge::note_progress(1);
        }
        if let Some(began) = began {
            explain::tally(FLUSH, 1, now_ns() - began);
        }
        true
    }

    fn sleeps_first(&self) -> bool {
        // The judge's sleeping way, or interrupt mode out of a crowd (a crowd and a
        // flush yield, whose first look sends what was left for the wait).
        (self.judged && judge::way() == Way::Sleep)
            || (self.controller.mode() == Mode::Interrupt && crowd::waiting() < crowd::cpus())
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize> {
        let n = self.wait_any(queue, out, stats, limit_ns, expect)?;
        if self.judged {
            judge::note_progress(n);
        }
        Ok(n)
    }
}

impl Adaptive {
    /// One wait: a flush, a crowded wait, or one in the controller's mode.
    fn wait_any(
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
        let waiting = Waiting::enter();
        if self.judged {
            judge::note_waiter(&mut self.noted_window);
            let began = now_ns();
            if self.judged_way(began) == Way::Sleep {
                // The process's trials found its work goes faster when no wait takes
                // a CPU: sleep, as the kernel's blocking calls do.
                let n = Interrupt.wait(queue, out, stats, limit_ns, expect)?;
                self.book_judged_sleep(stats, n, began);
                return Ok(n);
            }
        }
        if expect.flushes || expect.op == Op::Trim {
            // A flush takes what the device's cache needs (ms on a real one), nothing
            // like a read: it is waited for by yielding (sleeping where others want
            // the CPU) and kept out of the epoch, whose costs would otherwise price
            // the mode by the flushes that fell into it (MariaDB's read-write mix
            // through the interposer: auto at 0.72-0.87x the kernel where
            // sync-yield made 0.93-1.0x, with 20% more CPU per transaction). So is
            // a durable write: in hybrid mode, a timed sleep on a journal's ordered
            // commit (a flush linked to a write, on io_uring's workers) held the
            // write back until the sleeper woke, the late sightings grew the sleep,
            // and single fsyncs took up to 0.4 s.
            let began = explain::enabled().then(now_ns);
            let (n, outcome) = self.yielder.wait_counted(&waiting, queue, out, stats, limit_ns, expect)?;
            if let Some(began) = began {
                explain::tally(FLUSH, 1, now_ns() - began);
            }
            self.say_hog(outcome);
            return Ok(n);
        }
        if waiting.crowded() {
            judge::note_contested();
            if !std::mem::replace(&mut self.in_crowd, true) && explain::enabled() && self.crowd_say_due() {
                explain::say(
                    self.name,
                    format_args!(
                        "crowd: {} waiters on {} CPUs, every wait yields between looks unless others want the \
                         CPUs (mode {} set aside)",
                        waiting.count,
                        crowd::cpus(),
                        self.controller.mode().name()
                    ),
                );
            }
            let began = now_ns();
            let (n, outcome) = self.yielder.wait_counted(&waiting, queue, out, stats, limit_ns, expect)?;
            let took = now_ns() - began;
            stats.mode_ns[CROWD] += took;
            explain::tally(CROWD, 1, took);
            self.set_aside = true;
            self.say_hog(outcome);
            return Ok(n);
        }
        if std::mem::take(&mut self.in_crowd) && explain::enabled() && self.crowd_say_due() {
            explain::say(self.name, format_args!("crowd gone: back to {}", self.controller.mode().name()));
        }
        self.wait_in_mode(&waiting, queue, out, stats, limit_ns, expect)
    }
}

impl Adaptive {
    /// Whether the crowd's coming or going may be said now (once a second).
    fn crowd_say_due(&mut self) -> bool {
        let now = now_ns();
        let due = self.crowd_said_ns == 0 || now - self.crowd_said_ns >= 1_000_000_000;
        if due {
            self.crowd_said_ns = now;
        }
        due
    }

    /// The judge's way for a wait starting at `now` (saying how a trial ended,
    /// if this wait ended one).
    fn judged_way(&self, now: u64) -> Way {
        let (way, decision) = judge::way_now(now);
        match decision {
            Some(judge::Decision::Trial(trial)) => self.say_trial(trial),
            Some(judge::Decision::Opening(opening)) => self.say_opening(opening),
            None => {}
        }
        way
    }

    /// Books a wait the judge made sleep, begun at `began`, that saw `n`
    /// completions: the crowd's progress, the time in interrupt mode, the
    /// tally; the epoch starts afresh at the next wait in the controller's mode.
    fn book_judged_sleep(&mut self, stats: &mut WaitStats, n: usize, began: u64) {
        crowd::note_completed(n);
        let took = now_ns() - began;
        stats.mode_ns[Mode::Interrupt as usize] += took;
        explain::tally(JUDGED_SLEEPING, 1, took);
        self.set_aside = true;
    }

    /// Says how a trial of the judge's two ways ended.
    fn say_trial(&self, t: judge::TrialResult) {
        if explain::enabled() {
            explain::say_rare(
                self.name,
                format_args!(
                    "trial: {} made {:.1}K completions/s against {} {:.1}K: {} (next trial in {} ms)",
                    t.tried.name(),
                    t.rates.0 / 1e3,
                    t.tried.other().name(),
                    t.rates.1 / 1e3,
                    if t.switched {
                        format!("waits now go {}", t.way.name())
                    } else if t.confirming {
                        format!("waits keep {}, a second trial to confirm", t.way.name())
                    } else {
                        format!("waits keep {}", t.way.name())
                    },
                    if t.confirming { 0 } else { t.stay as u64 * judge::WINDOW_NS / 1_000_000 }
                ),
            );
        }
    }

    /// Says how the judge's opening ended: the way it chose, and why.
    fn say_opening(&self, o: judge::Opening) {
        if explain::enabled() {
            let (looks, wanted) = o.looks;
            explain::say_rare(
                self.name,
                format_args!(
                    "opening: {} ({wanted} of {looks} looks at the run queue found the CPUs wanted by threads not \
                     waiting): {}",
                    match o.contest {
                        judge::Contest::Free => "the CPUs not contested",
                        judge::Contest::Waiters => "the CPUs contested by this process's waiters alone",
                        judge::Contest::Others => "the CPUs contested, and wanted by threads not waiting",
                    },
                    match o.way {
                        Way::Sleep => "waits sleep, per-waiter modes tried against it at once",
                        Way::PerWaiter => "waits keep per-waiter modes",
                    }
                ),
            );
        }
    }

    /// Says that a long yield went to a thread not waiting for the device.
    fn say_hog(&self, outcome: YieldOutcome) {
        // (Checked first: the line reads the run queue, which nobody listening need not pay.)
        if let YieldOutcome::HogSeen(stretch_ns) = outcome
            && explain::enabled()
        {
            explain::say(
                self.name,
                format_args!(
                    "a yield waited over {} ms behind a thread that is not waiting for the device ({} runnable, {} \
                     waiting, {} CPUs): waits sleep for {} ms",
                    super::yielding::LONG_YIELD_NS / 1_000_000,
                    crowd::runnable().map_or("?".to_string(), |r| r.to_string()),
                    crowd::waiting(),
                    crowd::cpus(),
                    stretch_ns / 1_000_000
                ),
            );
        }
    }

    /// One wait in the controller's mode, and the epoch bookkeeping.
    fn wait_in_mode(
        &mut self,
        waiting: &Waiting,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize> {
        if std::mem::take(&mut self.set_aside) {
            // The epoch so far was the crowd's or the judge's: it starts again now.
            self.restart_counts();
            self.start = Some(self.snapshot(self.controller.mode() != Mode::Poll));
            self.mode_since_ns = now_ns();
        }
        let mode = self.controller.mode();
        let began = now_ns();
        // A poller's CPU is its wait, less its gaps; any other mode's is read on
        // some of its waits (each read is a system call: see `CPU_SAMPLE_EVERY`).
        let every = if self.controller.probing() { CPU_SAMPLE_EVERY / 2 } else { CPU_SAMPLE_EVERY };
        let cpu_before = (mode != Mode::Poll && self.waits.is_multiple_of(every)).then(thread_cpu_ns);
        // A wait gives up at `cap`, its I/O not back: a poll that outlasts many device
        // times is holding the CPU its completion needs, and a probe's wait that has
        // cost more than the probe could win back has lost it. The epoch's end then
        // chooses (the I/O is waited for again, in the mode it chooses).
        let since = if expect.since_ns > 0 { expect.since_ns } else { began };
        let probe_cap = self.controller.probe_give_up_ns().map(|budget| since + budget);
        let poll_cap =
            (mode == Mode::Poll).then(|| since + controller::starved_after_ns(self.hybrid.bucket_latency_any()) as u64);
        let cap = probe_cap.into_iter().chain(poll_cap).min().unwrap_or(u64::MAX);
        let wait_limit = limit_ns.min(cap);
        let (n, done) = match mode {
            Mode::Hybrid => (self.hybrid.wait(queue, out, stats, wait_limit, expect)?, now_ns()),
            Mode::Poll => {
                let (n, seen) = poll::spin(queue, out, stats, wait_limit, Some(&mut self.gaps))?;
                // Polling still teaches the embedded hybrid the device latency.
                if n > 0 && expect.since_ns > 0 {
                    self.hybrid.learn(expect, seen);
                }
                (n, seen)
            }
            Mode::Interrupt => {
                let n = Interrupt.wait(queue, out, stats, wait_limit, expect)?;
                let seen = now_ns();
                // A wake-up bounds the device time from above: it keeps hybrid's
                // estimate from staying where late sightings put it.
                if n > 0 {
                    self.hybrid.learn_bound(expect, seen);
                }
                (n, seen)
            }
            Mode::Yield => {
                let (n, outcome) = self.yielder.wait_counted(waiting, queue, out, stats, wait_limit, expect)?;
                let seen = now_ns();
                // Only a wait that stayed on its CPU saw the completion when it came.
                if n > 0 && expect.since_ns > 0 && outcome == YieldOutcome::Short {
                    self.hybrid.learn(expect, seen);
                }
                self.say_hog(outcome);
                (n, seen)
            }
        };
        let gave_up = n == 0 && queue.in_flight() > 0 && done >= cap && cap < limit_ns;
        self.starved |= gave_up;
        let took = done.saturating_sub(began);
        if let Some(before) = cpu_before {
            self.sampled_cpu_ns += thread_cpu_ns().saturating_sub(before);
            self.sampled_wall_ns += took;
        }
        self.waits += 1;
        self.waiting_ns += took;
        explain::tally(mode as usize, 1, took);
        let l = self.hybrid.bucket_latency_any();
        if n > 0 {
            self.ios += n as u64;
            if expect.since_ns > 0 {
                // Not capped: a preempted wait of milliseconds is what the mode cost.
                self.latency_sum_ns += done.saturating_sub(expect.since_ns) * n as u64;
            }
        } else if gave_up && probe_cap.is_some() {
            // A probe's I/O that would not come back cost at least the wait so far:
            // booked as one, so the mode's figures do not look cheaper without it.
            self.ios += 1;
            self.latency_sum_ns += done.saturating_sub(since);
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
        if (self.ios >= EPOCH_IOS && age >= min_ns) || age >= max_ns || stalled || probed || self.starved {
            self.end_epoch(stats);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::{DeviceSpec, Durability, Op, QueueConfig};

    /// Reads through `policy` one at a time; returns the counters.
    fn read_many(policy: &mut Adaptive, reads: usize) -> WaitStats {
        read_many_working(policy, reads, 0)
    }

    /// Reads through `policy` one at a time, computing for `work_ns` (on the
    /// CPU) after each; returns the counters.
    fn read_many_working(policy: &mut Adaptive, reads: usize, work_ns: u64) -> WaitStats {
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
            let expect = Expect::plain(Op::Read, 4096, since_ns);
            while out.is_empty() {
                policy.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, expect).unwrap();
            }
            assert_eq!(out.pop().unwrap().segments[0].result, 4096);
            let until = now_ns() + work_ns;
            while now_ns() < until {
                std::hint::spin_loop();
            }
        }
        stats
    }

    #[test]
    fn a_mode_is_charged_the_cpu_of_its_waits_not_the_programs_work() {
        // 150 us of the program's own work after every read. A wait's CPU is at most
        // its wall time, which is at most the I/O's latency: charging the program's
        // work made every mode cost latency + 150 us of CPU per I/O.
        let mut policy = Adaptive::new();
        read_many_working(&mut policy, 3000, 150_000);
        let measured: Vec<_> =
            Mode::ADAPTIVE.iter().filter_map(|&m| policy.controller.measured(m).map(|c| (m, c))).collect();
        assert!(!measured.is_empty(), "no mode measured in 3000 reads");
        for (mode, (lat, cpu)) in measured {
            assert!(
                cpu <= 1.05 * lat + 5_000.0,
                "{}: {:.1} us CPU per I/O for {:.1} us latency",
                mode.name(),
                cpu / 1e3,
                lat / 1e3
            );
        }
    }

    #[test]
    fn a_probe_gives_up_a_wait_it_cannot_win_and_the_read_still_comes_back() {
        // NAND answers in ~80 us; the kept mode is set to cost 1 us per I/O, so a
        // probe of interrupts gives its wait up after 16 us and the read is
        // waited for again in the kept mode. Other tests' waiters in this process
        // made a crowd, whose waits yield instead of probing: in CI (2 CPUs, every
        // unit test at once) none of 50 reads probed, once. They do not count here.
        crowd::never_crowded_here();
        let dev = DeviceSpec::parse("emu:nand,size=1m", None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(1)).unwrap();
        let mut policy = Adaptive::new();
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        let mut buf = IoBuf::new(4096);
        let mut gave_up = 0;
        for i in 0..50u64 {
            let fill = i as u8 + 1;
            buf.iter_mut().for_each(|b| *b = fill);
            for op in [Op::Write, Op::Read] {
                if op == Op::Read {
                    buf.iter_mut().for_each(|b| *b = 0);
                    // From yield, whatever mode the last read left: a poll starved on a
                    // loaded machine can leave interrupt mode, and a probe of interrupts
                    // from there never gives up (the kept mode's figures are the probe's,
                    // started afresh). 'No probe gave up in 50 reads: start' in about one
                    // full cargo test in 55; the same every time with the policy held in
                    // interrupt mode.
                    policy.controller.probe_against(Mode::Yield, Mode::Interrupt, 1_000.0);
                    policy.controller.reason = Reason::Start;
                }
                let mut c = Command::with_capacity(1);
                c.reset(op, i);
                c.push(i * 4096 % (1 << 20), buf.as_mut_ptr(), 4096);
                let since_ns = now_ns();
                // SAFETY: the buffer outlives the command, which is waited for below.
                unsafe { q.submit(c) };
                q.commit().unwrap();
                let expect = Expect::plain(op, 4096, since_ns);
                let mut waits = 0;
                while out.is_empty() {
                    policy.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, expect).unwrap();
                    waits += 1;
                    assert!(waits < 1_000_000, "read {i} never came back");
                }
                let done = out.pop().unwrap();
                assert_eq!((done.tag, done.segments[0].result), (i, 4096));
            }
            assert!(buf.iter().all(|&b| b == i as u8 + 1), "read {i} brought back other bytes");
            if matches!(policy.controller.reason, Reason::ProbeGaveUp { .. }) {
                gave_up += 1;
                assert!(!policy.controller.probing());
            }
        }
        assert!(gave_up > 0, "no probe gave up in 50 reads: {}", policy.controller.reason);
    }

    #[test]
    fn a_durable_write_is_waited_for_as_a_flush_in_every_mode() {
        // A journal's commit (a flush linked to a write with forced unit access)
        // waited for in hybrid mode slept on a timer while io_uring held the
        // chain's write back for this thread to enter the kernel: single fsyncs
        // took up to 0.4 s. Durable writes and flushes wait outside the modes.
        // (A fast device: these waits yield, and the other unit tests share the CPUs.)
        crowd::never_crowded_here();
        let dev = DeviceSpec::parse("emu:optane,size=1m", None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(1)).unwrap();
        let mut policy = Adaptive::new();
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        let mut buf = IoBuf::new(4096);
        for mode in [Mode::Hybrid, Mode::Poll, Mode::Interrupt] {
            policy.controller.force(mode);
            for (i, durability) in [Durability::Fua, Durability::Ordered].into_iter().cycle().take(10).enumerate() {
                let mut c = Command::with_capacity(1);
                c.reset(Op::Write, i as u64);
                c.durability = durability;
                c.push(i as u64 * 4096, buf.as_mut_ptr(), 4096);
                let expect = Expect::of(&c, now_ns());
                assert!(expect.flushes);
                // SAFETY: the buffer outlives the write, which is waited for below.
                unsafe { q.submit(c) };
                q.commit().unwrap();
                while out.is_empty() {
                    policy.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, expect).unwrap();
                }
                assert_eq!(out.pop().unwrap().segments[0].result, 4096, "{durability:?} write in {}", mode.name());
            }
            assert_eq!(policy.waits, 0, "a durable write was waited for in {} mode", mode.name());
        }
        assert_eq!(policy.hybrid.bucket(Op::Write, 4096).latency_ns, 0.0, "a flush's time learned as a write's");
    }

    #[test]
    fn a_judged_sleeping_wait_is_the_kernels_blocking_call() {
        let mut stats = WaitStats::default();
        let mut calls = 0;
        // adaptive has no judge: its waits never become blocking calls.
        assert!(!Adaptive::new().wait_blocking(&mut stats, &mut || {
            calls += 1;
            true
        }));
        assert_eq!(calls, 0);
        // auto in the judge's sleeping way makes one and books it as a sleep. (The
        // judge is process-wide: a window another test's wait ends may set the way
        // back, so the way is forced until a call sticks.)
        let mut policy = Adaptive::auto();
        let ran = (0..1000).any(|_| {
            judge::force_way(Way::Sleep);
            policy.wait_blocking(&mut stats, &mut || {
                calls += 1;
                std::thread::sleep(std::time::Duration::from_micros(10));
                true
            })
        });
        assert!(ran && calls >= 1);
        assert_eq!(stats.sleeps, 1);
        assert!(stats.mode_ns[Mode::Interrupt as usize] > 0);
        // A queue that cannot (a flush, an emulated device) leaves the wait to the ring.
        judge::force_way(Way::Sleep);
        assert!(!policy.wait_blocking(&mut stats, &mut || false));
        assert_eq!(stats.sleeps, 1);
        judge::force_way(Way::PerWaiter);
    }

    #[test]
    fn a_flush_in_a_crowd_is_the_kernels_blocking_call_and_looked_for_alone() {
        // Waiters that outnumber the CPUs (this one and one per CPU): the flush is
        // the call, booked as a sleep.
        let mut policy = Adaptive::auto();
        let mut stats = WaitStats::default();
        let mut calls = 0;
        let others: Vec<Waiting> = (0..crowd::cpus()).map(|_| Waiting::enter()).collect();
        assert!(policy.flush_blocking(&mut stats, &mut || {
            calls += 1;
            true
        }));
        assert_eq!((calls, stats.sleeps, stats.polls), (1, 1, 0));
        // A queue that cannot (an emulated device) leaves the flush to the ring.
        assert!(!policy.flush_blocking(&mut stats, &mut || false));
        assert_eq!(stats.sleeps, 1);
        drop(others);
        // Alone with a CPU, and on a fixed policy, it is looked for on the ring.
        std::thread::spawn(|| {
            crowd::never_crowded_here();
            let mut stats = WaitStats::default();
            let mut calls = 0;
            assert!(!Adaptive::auto().flush_blocking(&mut stats, &mut || {
                calls += 1;
                true
            }));
            assert!(!super::super::poll::Poll.flush_blocking(&mut stats, &mut || {
                calls += 1;
                true
            }));
            assert_eq!((calls, stats.sleeps), (0, 0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn waiters_that_outnumber_the_cpus_yield_whatever_the_mode() {
        // Twice as many threads as CPUs, each waiting 80 us per read at the same time.
        let threads = 2 * crowd::cpus();
        let crowded: Vec<u64> = std::thread::scope(|s| {
            let all: Vec<_> = (0..threads).map(|_| s.spawn(|| read_many(&mut Adaptive::new(), 300))).collect();
            all.into_iter().map(|t| t.join().unwrap().mode_ns[CROWD]).collect()
        });
        assert!(crowded.iter().any(|&ns| ns > 0), "no wait yielded in the crowd: {crowded:?}");
    }

    /// A thread's reads and writes of its own blocks, `depth` at a time, while
    /// its policy changes mode every `every` waits and every third wait gives
    /// up at once (a limit already past): every command comes back exactly
    /// once, with its bytes.
    fn churn(device: &dyn crate::device::Device, thread: u64, depth: usize, every: usize) {
        let mut policy = Adaptive::auto();
        let mut q = device.open_queue(&QueueConfig::depth(depth as u32)).unwrap();
        let mut bufs: Vec<IoBuf> = (0..depth).map(|_| IoBuf::new(4096)).collect();
        let (mut out, mut stats, mut waits) = (Vec::new(), WaitStats::default(), 0usize);
        for round in 0..40u64 {
            for op in [Op::Write, Op::Read] {
                for (i, buf) in bufs.iter_mut().enumerate() {
                    let fill = (thread * 41 + round * 7 + i as u64) as u8;
                    buf.iter_mut().for_each(|b| *b = if op == Op::Write { fill } else { !fill });
                    let mut c = Command::with_capacity(1);
                    c.reset(op, i as u64);
                    c.push((thread * depth as u64 + i as u64) * 4096, buf.as_mut_ptr(), 4096);
                    // SAFETY: every buffer outlives its command, which is waited for below.
                    unsafe { q.submit(c) };
                }
                q.commit().unwrap();
                let mut back = vec![0u32; depth];
                let expect = Expect::plain(op, 4096, now_ns());
                while back.iter().sum::<u32>() < depth as u32 {
                    if waits.is_multiple_of(every) {
                        let next = Mode::AUTO[(waits / every) % Mode::AUTO.len()];
                        policy.controller.force(next);
                        // And the process-wide judge's way, every other time.
                        let way = if (waits / every).is_multiple_of(2) { Way::Sleep } else { Way::PerWaiter };
                        judge::force_way(way);
                    }
                    let limit = if waits % 3 == 2 { 0 } else { now_ns() + 1_000_000_000 };
                    waits += 1;
                    policy.wait(q.as_mut(), &mut out, &mut stats, limit, expect).unwrap();
                    for c in out.drain(..) {
                        assert_eq!(c.segments[0].result, 4096, "thread {thread} round {round} command {}", c.tag);
                        back[c.tag as usize] += 1;
                    }
                }
                assert!(back.iter().all(|&n| n == 1), "every command back exactly once: {back:?}");
                assert_eq!(q.in_flight(), 0);
                if op == Op::Read {
                    for (i, buf) in bufs.iter().enumerate() {
                        let fill = (thread * 41 + round * 7 + i as u64) as u8;
                        assert!(buf.iter().all(|&b| b == fill), "thread {thread} round {round} block {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn auto_changing_mode_or_way_between_any_two_waits_loses_no_request_and_no_byte() {
        let threads = 3 * crowd::cpus() + 1;
        for spec in ["emu:nand,size=16m", "emu:optane,size=16m", "emu:null,size=16m"] {
            let dev = DeviceSpec::parse(spec, None).unwrap().open().unwrap();
            std::thread::scope(|s| {
                for t in 0..threads as u64 {
                    let dev = &dev;
                    s.spawn(move || churn(dev.as_ref(), t, 4, 1 + t as usize % 3));
                }
            });
        }
    }
}
