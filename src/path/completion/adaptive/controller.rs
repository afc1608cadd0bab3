//! The adaptive policy's decision logic: which mode (poll, hybrid,
//! interrupt, and for `auto` yield) to wait in next, from what each epoch
//! measured. A pure function of its inputs (no clock, no system call), so it
//! is tested with synthetic machines. Every decision that changes the mode
//! or starts a probe leaves its [`Reason`], which the policy can explain.

use super::super::hybrid::sleep_feasible;

/// An epoch ends after this many completions, once it is at least
/// [`MIN_EPOCH_NS`] long, or after [`EPOCH_NS`]: sampling the signals costs a
/// few µs, which a fast device should not pay more than every millisecond.
pub const EPOCH_IOS: u64 = 64;
/// Completions that end a probe epoch (or [`EPOCH_NS`], whichever is first).
pub const PROBE_IOS: u64 = 16;
/// Relative epoch-to-epoch change of the device latency above which probes
/// take four times as many completions.
pub const JITTERY: f64 = 0.15;
/// Shortest epoch that ends on [`EPOCH_IOS`].
pub const MIN_EPOCH_NS: u64 = 2_000_000;
/// Longest epoch.
pub const EPOCH_NS: u64 = 5_000_000;
/// Shortest and longest epoch while polling. Sampling the signals takes
/// system calls, and under contention every system call of a polling thread
/// is one more point where the scheduler can hand its CPU to a competitor:
/// measured with 2 hogs on the DRAM-SSD, sampling every 2 ms raised the p99.9
/// latency from ~60 µs to ~2 ms; every 20 ms left it at polling's. A preempted
/// poller is caught sooner, without system calls, by its stalls.
pub const POLL_EPOCH_NS: (u64, u64) = (20_000_000, 50_000_000);
/// A polled I/O slower than this (and than [`STARVED_FACTOR`] device times)
/// means the poller is starving the completion of its CPU.
pub const STARVED_LATENCY_NS: f64 = 1_000_000.0;
/// See [`STARVED_LATENCY_NS`].
pub const STARVED_FACTOR: f64 = 16.0;
/// A polled I/O slower than this is starving whatever the device time
/// learned: a learned time can itself be inflated by late sightings, and no
/// device worth polling takes milliseconds.
pub const STARVED_MAX_NS: f64 = 10_000_000.0;

/// How long a polled I/O may take on a device whose learned latency is
/// `device_ns` before the poller counts as starving its own completion.
pub fn starved_after_ns(device_ns: f64) -> f64 {
    (STARVED_FACTOR * device_ns).clamp(STARVED_LATENCY_NS, STARVED_MAX_NS)
}
/// Share of an I/O's latency its waiter may spend on a CPU before the CPU
/// counts against the mode. A waiter that leaves at least half of its wait
/// to others is judged on its latency alone: the seeds' finding is that
/// polling, which keeps the whole wait, loses under contention, and a mode
/// that keeps a share of it (hybrid's closing spin) is not polling. Charging
/// every CPU microsecond instead made `auto` pick interrupts beside two CPU
/// hogs on the NAND device, where hybrid answered 12% sooner with under half
/// of polling's CPU (`iopath bench --device emu:nand --cpu-hogs 2`: hybrid
/// 83.7 us and 28.5 us of CPU per I/O, interrupt 93.6 us and 14.8 us, poll
/// 80.1 us and 84.1 us; with lambda 4 hybrid cost 198, interrupt 153).
pub const FREE_CPU_SHARE: f64 = 0.5;
/// Half-life of the cost measured for the mode in use (controller time).
pub const COST_MEMORY_NS: f64 = 50e6;
/// Half-life of the smoothed contention signals.
pub const CONTENTION_MEMORY_NS: f64 = 50e6;
/// How long a measurement of a mode not in use stays trusted before it is
/// probed again; doubled each time a probe confirms the mode is worse.
pub const PROBE_INTERVAL_NS: u64 = 250_000_000;
/// Longest interval between two probes of one mode.
pub const MAX_PROBE_INTERVAL_NS: u64 = 4_000_000_000;
/// A mode measured at another contention level is probed again after this long.
pub const REPROBE_AFTER_LEVEL_CHANGE_NS: u64 = 250_000_000;
/// A probe epoch in which the thread waited for a CPU this share of the
/// time measured the scheduler more than the mode: a lost one is run again
/// (with two CPU hogs on emu:nand, one 16-I/O hybrid probe with 71% run delay
/// measured 290 us per I/O against its usual 81, and `auto` kept interrupts
/// at 94 us for the rest of the run).
pub const CPU_HICCUP: f64 = 0.5;
/// An epoch whose device latency is this many times the usual one was a
/// hiccup of the device, not a property of the mode.
pub const HICCUP: f64 = 2.0;
/// Run delay per wake-up that a sleeping mode is not charged as contention.
pub const WAKE_RUN_DELAY_NS: u64 = 10_000;
/// A mode must cost less than this share of the current mode's cost to replace it.
/// 10% was too wide: with 2 hogs on NAND, hybrid (83 us, 17 us CPU) and
/// interrupts (98 us, 16.5 us CPU) differ by 8% in `J`, and a policy parked in
/// interrupts never came back for hybrid's 17% more IOPS. Probes confirm
/// every switch, so a narrow margin does not make it oscillate.
pub const SWITCH_MARGIN: f64 = 0.95;
/// A probe gives up on a wait that has taken this many I/Os' worth of the
/// mode it is compared with (its `J` per I/O): with [`PROBE_IOS`] completions
/// to a probe, such a wait alone puts the probed mode's mean above the kept
/// one's, so it cannot win, and what is left of the probe would only cost.
/// Spinning modes are the ones that need it: on the loop device here a poll
/// or a hybrid's closing spin beside the program's own runnable threads can
/// hold the CPU its completion needs (db_bench fillsync, 4 threads on a
/// mount: probes of hybrid and poll measured 1.7-3.7 ms per I/O against
/// yield's 40-50 us, each stalling a group commit every writer waited on).
pub const PROBE_GIVE_UP_IOS: f64 = PROBE_IOS as f64;
/// A probed mode that costs more than this multiple of the current one lost
/// clearly: its next probe waits twice as long.
pub const CLEAR_LOSS: f64 = 1.2;
/// Polling is not chosen for I/Os slower than this (EHP's cut-off, scaled up).
pub const MAX_POLL_LATENCY_NS: f64 = 200_000.0;
/// An epoch with fewer I/Os than a probe needs, in which the thread waited
/// under this share of its time, is sparse: its waits come few and far
/// apart (a group commit's leader among 16 db_bench threads: 1-8 I/Os per
/// 5-30 ms epoch), too few to tell one mode's cost from another's, and the
/// CPU a yielding wait takes is a small share of the thread's.
pub const SPARSE_WAITING_SHARE: f64 = 0.25;

/// A completion mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Spin.
    Poll = 0,
    /// Sleep, then spin.
    Hybrid = 1,
    /// Sleep until woken.
    Interrupt = 2,
    /// Spin, handing the CPU to any other runnable thread between looks
    /// (and sleeping while a CPU-bound thread would keep it).
    Yield = 3,
}

impl Mode {
    /// All modes.
    pub const ALL: [Mode; 4] = [Mode::Poll, Mode::Hybrid, Mode::Interrupt, Mode::Yield];
    /// The modes of `adaptive`.
    pub const ADAPTIVE: &'static [Mode] = &[Mode::Poll, Mode::Hybrid, Mode::Interrupt];
    /// The modes of `auto`.
    pub const AUTO: &'static [Mode] = &[Mode::Yield, Mode::Poll, Mode::Hybrid, Mode::Interrupt];

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Hybrid => "hybrid",
            Mode::Interrupt => "interrupt",
            Mode::Yield => "yield",
        }
    }

    /// Whether the mode spins (never sleeps for the device).
    pub fn spins(self) -> bool {
        matches!(self, Mode::Poll | Mode::Yield)
    }
}

/// Why the controller changed mode or started a probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// Nothing changed yet.
    Start,
    /// A mode not in use was tried: never measured, measured too long ago,
    /// or measured at another contention level.
    Probe {
        /// Never measured (else: stale or measured at another level).
        never: bool,
    },
    /// A probed mode cost less twice in a row (J per I/O, before and after).
    ProbeWon {
        /// The probed mode's cost.
        tried: f64,
        /// The mode it replaces.
        was: f64,
    },
    /// A probed mode cost more: back to the one before.
    ProbeLost {
        /// The probed mode's cost.
        tried: f64,
        /// The mode returned to.
        kept: f64,
    },
    /// A wait of the probed mode outlasted [`PROBE_GIVE_UP_IOS`] I/Os of the
    /// kept mode: it gave up, and the probe lost.
    ProbeGaveUp {
        /// The kept mode's cost per I/O.
        kept: f64,
    },
    /// The poller was preempted (stalls, involuntary switches or run delay).
    Preempted,
    /// Polling held the CPU that the completion itself needed (a device or
    /// io_uring worker thread that runs there): I/O took many times the device time.
    Starved {
        /// Mean latency per I/O of the epoch (or its length, if none completed).
        latency: f64,
        /// The device latency learned from exact samples.
        device: f64,
        /// A polled wait gave up after this long without its completion (0: none did).
        gave_up_ns: f64,
    },
    /// The mode cannot work for this device (latency, timer reach).
    Infeasible,
    /// Another mode looked cheaper for two epochs: it is re-measured.
    Cheaper,
    /// Too few waits, far apart, to measure a mode: they yield.
    Sparse {
        /// I/Os of the epoch.
        ios: u64,
        /// Share of the epoch the thread spent waiting.
        waiting: f64,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Reason::Start => write!(f, "start"),
            Reason::Probe { never: true } => write!(f, "probe: never measured"),
            Reason::Probe { never: false } => write!(f, "probe: measured too long ago or at another contention level"),
            Reason::ProbeWon { tried, was } => {
                write!(f, "kept: J {:.1} us per I/O against {:.1} us, twice", tried / 1e3, was / 1e3)
            }
            Reason::ProbeLost { tried, kept } => {
                write!(f, "probe lost: J {:.1} us per I/O against {:.1} us", tried / 1e3, kept / 1e3)
            }
            Reason::ProbeGaveUp { kept } => write!(
                f,
                "probe lost: a wait gave up after {:.1} us, {PROBE_GIVE_UP_IOS} I/Os at the kept mode's J of {:.1} us",
                PROBE_GIVE_UP_IOS * kept / 1e3,
                kept / 1e3
            ),
            Reason::Preempted => write!(f, "the poller was preempted (CPU contended)"),
            Reason::Starved { gave_up_ns, device, .. } if gave_up_ns > 0.0 => write!(
                f,
                "polling starved the completion of its CPU: a poll saw nothing for {:.1} ms against a device time \
                 of {:.1} us",
                gave_up_ns / 1e6,
                device / 1e3
            ),
            Reason::Starved { latency, device, .. } => write!(
                f,
                "polling starved the completion of its CPU: {:.1} us per I/O against a device time of {:.1} us",
                latency / 1e3,
                device / 1e3
            ),
            Reason::Infeasible => write!(f, "mode cannot work for this device's latency or the timer's reach"),
            Reason::Cheaper => write!(f, "looked cheaper for two epochs: re-measuring it"),
            Reason::Sparse { ios, waiting } => write!(
                f,
                "sparse waits ({ios} I/Os, waiting {:.0}% of the epoch): too few to measure a mode, they yield",
                waiting * 100.0
            ),
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

impl Level {
    /// Microseconds of latency one microsecond of CPU is worth at this level:
    /// on an idle machine CPU is cheap, under contention every CPU microsecond
    /// an I/O thread takes is taken from someone else.
    pub fn lambda(self) -> f64 {
        match self {
            Level::Low => 1.0,
            Level::Mid => 2.0,
            Level::High => 4.0,
        }
    }
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
    /// Stalls of a poller: gaps between two of its looks at the queue long
    /// enough that it must have been off its CPU (see [`Gaps`](crate::path::completion::poll::Gaps)). A slow
    /// device does not cause them; a preemption does.
    pub stalls: u64,
    /// System CPU pressure ("some" time), if readable.
    pub pressure_ns: u64,
    /// CPU time the epoch's waits took (not the program's work between them).
    pub cpu_ns: u64,
    /// Sum of the latencies of the epoch's I/Os (submission to completion seen).
    pub latency_sum_ns: u64,
    /// Wall time of the epoch's waits (in the mode: not the crowd's, nor flushes).
    pub waiting_ns: u64,
    /// Mean device latency from exact samples (0 = unknown).
    pub device_latency_ns: f64,
    /// The timer's measured overshoot.
    pub overshoot_ns: f64,
    /// Threads that are not waiting for the device wanted the CPUs at the
    /// epoch's end (more runnable than a crowd allows: see
    /// [`crowd::cpus_wanted`](crate::path::completion::crowd::cpus_wanted)).
    pub cpus_wanted: bool,
    /// A wait gave up without seeing its completion: a polled one after
    /// [`starved_after_ns`], a probe's after [`Controller::probe_give_up_ns`].
    pub starved: bool,
}

/// What a mode was seen to cost: exponentially decayed sums.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Seen {
    ios: f64,
    latency_ns: f64,
    cpu_ns: f64,
    /// Controller time of the last epoch booked.
    at_ns: u64,
    /// The contention level it was measured at.
    level: Option<Level>,
}

impl Seen {
    fn book(&mut self, s: &EpochSignals, decay: f64, at_ns: u64, level: Level) {
        self.ios = self.ios * decay + s.ios as f64;
        self.latency_ns = self.latency_ns * decay + s.latency_sum_ns as f64;
        self.cpu_ns = self.cpu_ns * decay + s.cpu_ns as f64;
        self.at_ns = at_ns;
        self.level = Some(level);
    }

    /// (latency, CPU) per I/O, if measured.
    fn per_io(&self) -> Option<(f64, f64)> {
        (self.ios >= 1.0).then(|| (self.latency_ns / self.ios, self.cpu_ns / self.ios))
    }
}

/// The decision logic: a pure function of epoch signals (no clock of its
/// own: time is the sum of the epochs' wall times).
#[derive(Debug, Clone)]
pub struct Controller {
    mode: Mode,
    level: Level,
    raise_votes: u32,
    lower_votes: u32,
    /// The mode to return to if the current one is only being probed.
    probing_from: Option<Mode>,
    /// The probe won its first epoch and runs a second to confirm.
    confirming: bool,
    /// The probe lost an epoch spent mostly waiting for a CPU and runs a second.
    retried: bool,
    /// A cheaper-looking mode and for how many epochs in a row it has looked so.
    candidate: Option<(Mode, u32)>,
    /// The modes it may choose.
    modes: &'static [Mode],
    seen: [Seen; 4],
    probe_interval_ns: [u64; 4],
    /// Why the mode last changed (or a probe began).
    pub reason: Reason,
    /// Smoothed (run delay, pressure, wall) for the contention level.
    contention: (f64, f64, f64),
    clock_ns: u64,
    /// Slow average of the device latency, to recognise a hiccup.
    usual_device_ns: f64,
    /// Epochs set aside because the device was suddenly much slower.
    pub hiccups: u64,
    /// How much the device latency moves from one epoch to the next (relative, smoothed).
    pub(super) device_jitter: f64,
    /// Mode changes so far (probes that were not kept are not counted).
    pub switches: u64,
    /// Epochs spent trying a mode not in use, to measure it.
    pub probes: u64,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::new()
    }
}

impl Controller {
    /// `adaptive`'s controller: poll, hybrid and interrupt; starts polling (the
    /// cheapest way to learn the device's latency).
    pub fn new() -> Controller {
        Controller::with_modes(Mode::ADAPTIVE)
    }

    /// `auto`'s controller: yield, poll, hybrid and interrupt; starts yielding
    /// (it learns the latency as polling does, and gives the CPU to the
    /// program's own threads if they need it).
    pub fn auto() -> Controller {
        Controller::with_modes(Mode::AUTO)
    }

    /// A controller choosing among `modes`, starting in the first.
    pub fn with_modes(modes: &'static [Mode]) -> Controller {
        assert!(!modes.is_empty(), "a controller needs a mode");
        Controller {
            mode: modes[0],
            modes,
            reason: Reason::Start,
            level: Level::Low,
            raise_votes: 0,
            lower_votes: 0,
            probing_from: None,
            confirming: false,
            retried: false,
            candidate: None,
            seen: [Seen::default(); 4],
            probe_interval_ns: [PROBE_INTERVAL_NS; 4],
            contention: (0.0, 0.0, 0.0),
            clock_ns: 0,
            usual_device_ns: 0.0,
            hiccups: 0,
            device_jitter: 0.0,
            switches: 0,
            probes: 0,
        }
    }

    /// The modes it chooses among.
    pub fn modes(&self) -> &'static [Mode] {
        self.modes
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The current contention level.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Completions a probe measures: a few on a steady device (a probe may well
    /// try a bad mode), more on one whose latency jumps around from epoch to
    /// epoch (a loop device here), where a short sample misleads.
    pub fn probe_ios(&self) -> u64 {
        if self.device_jitter > JITTERY { 4 * PROBE_IOS } else { PROBE_IOS }
    }

    /// Whether the current mode is only being tried.
    pub fn probing(&self) -> bool {
        self.probing_from.is_some()
    }

    /// While a mode is probed, how long one of its waits may take (from the
    /// I/O's submission) before it gives up: [`PROBE_GIVE_UP_IOS`] I/Os of the
    /// mode it is compared with. None when not probing, or that mode has no cost.
    pub fn probe_give_up_ns(&self) -> Option<u64> {
        let from = self.probing_from?;
        self.cost(from).map(|c| (PROBE_GIVE_UP_IOS * c) as u64)
    }

    /// (latency, CPU) per I/O measured for `mode`, if it has been measured at
    /// the current contention level.
    pub fn measured(&self, mode: Mode) -> Option<(f64, f64)> {
        self.seen[mode as usize].per_io()
    }

    /// `J = latency + lambda x excess CPU` per I/O of `mode`, if measured,
    /// where the excess is the CPU beyond [`FREE_CPU_SHARE`] of the latency.
    pub fn cost(&self, mode: Mode) -> Option<f64> {
        self.measured(mode).map(|(lat, cpu)| lat + self.level.lambda() * (cpu - FREE_CPU_SHARE * lat).max(0.0))
    }

    /// The contention level of the smoothed run delay and CPU pressure: both say
    /// directly that a thread waited for a CPU. Involuntary switches are too
    /// noisy for this in sleeping modes (measured here: thousands per second
    /// with no competing load); they serve only to catch a preempted poller.
    /// The thresholds to enter a level are higher than those to stay in it, so
    /// a signal near one threshold does not make the level flap.
    fn level_now(&self) -> Level {
        let (rd, psi, wall) = self.contention;
        let wall = wall.max(1.0);
        let (rd, psi) = (rd / wall, psi / wall);
        let stay = |at: Level| self.level >= at;
        let high = if stay(Level::High) { rd >= 0.08 || psi >= 0.30 } else { rd >= 0.15 || psi >= 0.50 };
        let mid = if stay(Level::Mid) { rd >= 0.02 || psi >= 0.10 } else { rd >= 0.05 || psi >= 0.25 };
        if high {
            Level::High
        } else if mid {
            Level::Mid
        } else {
            Level::Low
        }
    }

    /// Raises the level after 2 epochs that agree, lowers it after 4; returns
    /// whether it changed.
    fn update_level(&mut self, s: &EpochSignals) -> bool {
        let decay = 0.5f64.powf(s.wall_ns as f64 / CONTENTION_MEMORY_NS);
        let (rd, psi, wall) = self.contention;
        // A sleeping waiter waits a little for its CPU on every wake-up even on an
        // idle machine (more when the device's own worker thread holds it, as a
        // loop device's does): that is the mode's cost, already in its measured
        // latency, not contention, and counting it would raise lambda and favour
        // sleeping further. Only the excess counts.
        let own = if self.mode.spins() { 0 } else { s.ios * WAKE_RUN_DELAY_NS };
        // Both counters can run ahead of the wall clock by a few ms (they are read
        // after it, and a delay is booked when it ends): no epoch counts more than its length.
        let run_delay = s.run_delay_ns.saturating_sub(own).min(s.wall_ns) as f64;
        let pressure = s.pressure_ns.min(s.wall_ns) as f64;
        self.contention = (rd * decay + run_delay, psi * decay + pressure, wall * decay + s.wall_ns as f64);
        let seen = self.level_now();
        let (votes, needed) = if seen > self.level {
            self.lower_votes = 0;
            (&mut self.raise_votes, 2)
        } else if seen < self.level {
            self.raise_votes = 0;
            (&mut self.lower_votes, 4)
        } else {
            self.raise_votes = 0;
            self.lower_votes = 0;
            return false;
        };
        *votes += 1;
        if *votes < needed {
            return false;
        }
        *votes = 0;
        self.level = seen;
        true
    }

    /// Feeds one epoch; returns the mode for the next one.
    pub fn on_epoch(&mut self, s: &EpochSignals) -> Mode {
        self.clock_ns += s.wall_ns;
        // An epoch in which the device itself was suddenly much slower (a real
        // device's hiccup: a loop device here went from 25 us to 0.3-0.5 ms per I/O
        // for a few ms) says nothing about the mode: every mode would have paid it.
        // It is not booked and decides nothing; a lasting change passes after a few
        // epochs, once the slow average has caught up.
        let usual = self.usual_device_ns;
        self.usual_device_ns =
            if usual == 0.0 { s.device_latency_ns } else { usual + (s.device_latency_ns - usual) / 8.0 };
        if usual > 0.0 {
            let change = (s.device_latency_ns - usual).abs() / usual;
            self.device_jitter += (change.min(1.0) - self.device_jitter) / 8.0;
        }
        if usual > 0.0 && s.device_latency_ns > HICCUP * usual {
            self.hiccups += 1;
            return self.mode;
        }
        let decay = 0.5f64.powf(s.wall_ns as f64 / COST_MEMORY_NS);
        let now = self.clock_ns;
        let level = self.level;
        self.seen[self.mode as usize].book(s, decay, now, level);
        if self.update_level(s) {
            // Costs measured under another contention level say little about this one:
            // the other modes are probed again soon (see `due`).
            self.candidate = None;
        }
        let l = s.device_latency_ns;
        if l <= 0.0 {
            // Nothing learned yet. Only a wait that stays on its CPU learns the device's
            // latency: a yielding waiter beside CPU hogs sleeps every wait and never
            // would (auto stayed in yield for a whole second with 2 hogs on NAND, at
            // half the IOPS of hybrid). A short probe of polling teaches it.
            if self.mode != Mode::Poll && self.modes.contains(&Mode::Poll) && self.probes == 0 {
                self.reason = Reason::Probe { never: true };
                return self.probe(Mode::Poll);
            }
            return self.mode;
        }
        // Hybrid is entered only where a sleep can end before the device does, but
        // once in use it is left on cost alone: where it cannot sleep it spins, and
        // its measured cost says so. A device whose latency hovers around the
        // timer's reach would otherwise flap in and out of it (seen on a loop
        // device: L 20-35 us, W 20-30 us, and the device is faster while the
        // waiter sleeps, because its worker thread gets the CPU).
        let hybrid_feasible = self.mode == Mode::Hybrid || sleep_feasible(l, s.overshoot_ns);
        // Polling is not chosen while threads that are not waiting want the CPUs:
        // the poller's own figures look best exactly then (it never waits to get its
        // CPU back, a sleeper waits milliseconds), while the CPU it holds is taken
        // from the program's work (MariaDB read-write through the interposer: auto
        // polled at 'J 81 us against 2.5 ms' and made 0.75-0.87x the kernel).
        // Nor while this thread waits for a CPU a good share of its time (HIGH): the
        // CPUs are oversubscribed, and a poller's every microsecond is taken from a
        // thread that wanted it, the program's own or the device's worker, which no
        // figure of the poller's own shows (db_bench fillsync, 4 threads on a mount:
        // polls kept at 'J 35 us against yield's 55' while the program made 0.85x
        // of sync-yield's throughput). Yielding spins as polling does when no other
        // thread wants the CPU, and hands it over when one does.
        let cpus_oversubscribed = (s.cpus_wanted || self.level == Level::High) && self.modes.contains(&Mode::Yield);
        let poll_ok = !cpus_oversubscribed;
        // For the same reason hybrid is left to devices it can sleep through most of:
        // one it can sleep through only a sliver of, it mostly spins on (the loop
        // device here: 20-35 us against a 20 us timer overshoot), without handing
        // the CPU over as a yielding wait does, and it adds a timer wake-up per I/O.
        // db_bench fillsync, 4 threads on a mount, 6 alternated rounds: auto with
        // hybrid there 16.2-19.6K ops/s (p99 0.9-1.6 ms), without 18.9-22.6K (p99
        // 0.38-0.53 ms), sync-yield 19.3-21.8K (0.38-0.51 ms). On NAND (80 us)
        // beside CPU hogs hybrid stays the best mode (seed 001's matrix).
        let hybrid_sleeps_most = sleep_feasible(l / 2.0, s.overshoot_ns);
        let feasible = |m: Mode| match m {
            Mode::Poll => l <= MAX_POLL_LATENCY_NS && poll_ok,
            Mode::Yield => l <= MAX_POLL_LATENCY_NS,
            Mode::Hybrid => hybrid_feasible && (hybrid_sleeps_most || !cpus_oversubscribed),
            Mode::Interrupt => true,
        };

        // Waits few and far apart: no cost measured on so few tells one mode from
        // another (db_bench fillsync, 16 threads on a mount: auto chose interrupts
        // and hybrid on such noise, and made 0.8x the throughput of yielding).
        // Yielding hands the CPU to the program's threads when they want it, and
        // costs no wake-up; behind a thread that is not the program's, the yielder
        // sleeps on its own. A probe under way ends without a verdict.
        let waiting = s.waiting_ns as f64 / s.wall_ns.max(1) as f64;
        let gave_up = s.starved && self.probing_from.is_some();
        if s.ios < PROBE_IOS
            && !gave_up
            && waiting < SPARSE_WAITING_SHARE
            && self.modes.contains(&Mode::Yield)
            && feasible(Mode::Yield)
        {
            (self.probing_from, self.confirming, self.retried) = (None, false, false);
            if self.mode != Mode::Yield {
                self.reason = Reason::Sparse { ios: s.ios, waiting };
                return self.switch_to(Mode::Yield);
            }
            return self.mode;
        }

        // A probe ends after one epoch, or two when it wins: one short epoch can
        // fall on a hiccup of the device (seen on a loop device: 0.5 ms per I/O
        // for a few ms), so a mode is kept only if it is still cheaper after a
        // second. The first epoch that looks worse ends it.
        if let Some(from) = self.probing_from.take() {
            let tried = self.mode;
            let (t, f) = (self.cost(tried).unwrap_or(f64::INFINITY), self.cost(from).unwrap_or(f64::INFINITY));
            // A wait that gave up left its I/O out of `t`: what did complete says
            // nothing of the one that would not.
            let wins = t < SWITCH_MARGIN * f && feasible(tried) && !gave_up;
            if wins && !self.confirming && feasible(from) {
                self.confirming = true;
                self.probing_from = Some(from);
                return self.mode;
            }
            self.confirming = false;
            let starved_of_cpu = s.run_delay_ns as f64 >= CPU_HICCUP * s.wall_ns.max(1) as f64;
            if !wins && feasible(from) && starved_of_cpu && !std::mem::replace(&mut self.retried, true) {
                // Lost in an epoch the thread spent mostly waiting for a CPU (the
                // hogs had it): that says little of the mode, and a lost probe is not
                // tried again for 0.5-4 s. One more epoch, measured afresh, decides.
                self.seen[tried as usize] = Seen::default();
                self.probing_from = Some(from);
                return self.mode;
            }
            self.retried = false;
            if wins || !feasible(from) {
                self.probe_interval_ns[tried as usize] = PROBE_INTERVAL_NS;
                self.switches += 1;
                self.reason = if wins { Reason::ProbeWon { tried: t, was: f } } else { Reason::Infeasible };
            } else {
                self.reason =
                    if gave_up { Reason::ProbeGaveUp { kept: f } } else { Reason::ProbeLost { tried: t, kept: f } };
                // One epoch is a small sample: only a clear loss (a wait that gave up is
                // one) makes the next probe wait longer, and a mode worse on both latency
                // and CPU (it cannot win at any lambda) waits four times longer.
                let factor = if self.dominated(tried, from) { 4 } else { 2 };
                let i = &mut self.probe_interval_ns[tried as usize];
                *i = if gave_up || t > CLEAR_LOSS * f {
                    (*i * factor).min(MAX_PROBE_INTERVAL_NS)
                } else {
                    PROBE_INTERVAL_NS
                };
                self.mode = from;
            }
            return self.mode;
        }

        // Overrides, in priority order.
        // A preempted poller leaves at once for hybrid; where hybrid cannot work (the
        // device is faster than a wake-up) the preemption is already in polling's
        // measured latency, and an interrupt would cost a wake-up on every I/O.
        let wall = s.wall_ns.max(1) as f64;
        let preempted = s.stalls >= 2 || s.involuntary_ctx >= 2 || s.run_delay_ns as f64 / wall >= 0.05;
        if self.mode == Mode::Poll && preempted && feasible(Mode::Hybrid) {
            let i = &mut self.probe_interval_ns[Mode::Poll as usize];
            *i = (*i * 2).min(MAX_PROBE_INTERVAL_NS);
            self.reason = Reason::Preempted;
            return self.switch_to(Mode::Hybrid);
        }
        // A poller whose I/Os take many times the device time (or that saw none
        // complete in a whole epoch) holds the CPU the completion needs: an io_uring
        // worker doing a flush, a loop device's worker, woken onto the poller's CPU.
        // Neither preemption signal fires (the worker gets the CPU only when the
        // poller's slice ends), and each I/O waits a slice: seen with db_bench fillsync
        // on a mount, 12-60 ms per fsync where yielding took 74 us. Yielding hands the
        // CPU over; interrupts where yielding is not allowed.
        let mean = if s.ios > 0 { s.latency_sum_ns as f64 / s.ios as f64 } else { s.wall_ns as f64 };
        if self.mode == Mode::Poll && (s.starved || mean > starved_after_ns(l)) {
            let gave_up_ns = if s.starved { starved_after_ns(l) } else { 0.0 };
            self.reason = Reason::Starved { latency: mean, device: l, gave_up_ns };
            let i = &mut self.probe_interval_ns[Mode::Poll as usize];
            *i = (*i * 4).min(MAX_PROBE_INTERVAL_NS);
            let to = if self.modes.contains(&Mode::Yield) { Mode::Yield } else { Mode::Interrupt };
            return self.switch_to(to);
        }
        if !feasible(self.mode) {
            // The cheapest measured mode that can work, else spinning (yielding where
            // allowed) if the CPU is free.
            let modes = self.modes;
            let measured = modes
                .iter()
                .copied()
                .filter(|&m| feasible(m))
                .filter_map(|m| self.cost(m).map(|c| (m, c)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(m, _)| m);
            let spinner = if modes.contains(&Mode::Yield) { Mode::Yield } else { Mode::Poll };
            let fallback = measured.unwrap_or(if feasible(spinner) && self.level == Level::Low {
                spinner
            } else {
                Mode::Interrupt
            });
            self.reason = Reason::Infeasible;
            return self.switch_to(fallback);
        }
        if self.seen[self.mode as usize].per_io().is_none() {
            return self.mode; // measure the current mode first
        }

        // Measure any feasible mode that was never measured, not for a while, or
        // (not too often) not at this contention level, unless it was worse on
        // both latency and CPU than the current mode is now: a probe costs its
        // epoch (with hogs on a fast device, 64 sleeping I/Os are a p99.9 risk).
        // A mode whose probes lost clearly is not tried sooner than half its
        // backed-off interval for a change of level either: with hogs the level
        // moves between LOW and HIGH every few hundred ms, and polling was
        // probed every 250 ms at 2.5x hybrid's cost (`auto`, 2 hogs, emu:nand).
        let due = self.modes.iter().copied().find(|&m| {
            m != self.mode && feasible(m) && {
                let seen = &self.seen[m as usize];
                let age = now - seen.at_ns;
                seen.per_io().is_none()
                    || age >= self.probe_interval_ns[m as usize]
                    || (seen.level != Some(self.level)
                        && age >= REPROBE_AFTER_LEVEL_CHANGE_NS.max(self.probe_interval_ns[m as usize] / 2)
                        && !self.dominated(m, self.mode))
            }
        });
        if let Some(m) = due {
            self.reason = Reason::Probe { never: self.seen[m as usize].per_io().is_none() };
            return self.probe(m);
        }

        // Otherwise the cheapest measured mode, if it has looked clearly cheaper for
        // two epochs in a row; it is re-measured (probed) before it is kept.
        let current = self.cost(self.mode).unwrap_or(f64::INFINITY);
        let best = self
            .modes
            .iter()
            .copied()
            .filter(|&m| feasible(m))
            .filter_map(|m| self.cost(m).map(|c| (m, c)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((m, c)) if m != self.mode && c < SWITCH_MARGIN * current => match self.candidate {
                Some((cm, n)) if cm == m && n + 1 >= 2 => {
                    self.reason = Reason::Cheaper;
                    self.probe(m)
                }
                Some((cm, n)) if cm == m => {
                    self.candidate = Some((m, n + 1));
                    self.mode
                }
                _ => {
                    self.candidate = Some((m, 1));
                    self.mode
                }
            },
            _ => {
                self.candidate = None;
                self.mode
            }
        }
    }

    /// Whether `a` was measured worse than `b` on both latency and CPU per I/O.
    fn dominated(&self, a: Mode, b: Mode) -> bool {
        match (self.measured(a), self.measured(b)) {
            (Some((la, ca)), Some((lb, cb))) => la >= lb && ca >= cb,
            _ => false,
        }
    }

    /// Tries `mode` for one epoch, measured afresh.
    fn probe(&mut self, mode: Mode) -> Mode {
        self.candidate = None;
        self.probing_from = Some(self.mode);
        self.confirming = false;
        self.retried = false;
        self.seen[mode as usize] = Seen::default();
        self.mode = mode;
        self.probes += 1;
        mode
    }

    /// Starts a probe of `mode` from `kept`, whose cost per I/O is set to
    /// `kept_ns` (tests of a probe's give-up). Whatever mode the controller
    /// was in: a probe of the mode in use starts its figures afresh, leaves
    /// nothing to give up against, and never gives up.
    #[cfg(test)]
    pub(crate) fn probe_against(&mut self, kept: Mode, mode: Mode, kept_ns: f64) {
        debug_assert_ne!(kept, mode, "a probe is of another mode");
        self.force(kept);
        let level = self.level;
        self.seen[self.mode as usize] =
            Seen { ios: 64.0, latency_ns: 64.0 * kept_ns, cpu_ns: 0.0, at_ns: self.clock_ns, level: Some(level) };
        self.probe(mode);
    }

    /// Puts the controller in `mode` at once, as a switch (tests that make the
    /// policy change mode between any two waits).
    #[cfg(test)]
    pub(crate) fn force(&mut self, mode: Mode) {
        self.probing_from = None;
        self.confirming = false;
        self.switch_to(mode);
    }

    fn switch_to(&mut self, mode: Mode) -> Mode {
        self.candidate = None;
        if mode != self.mode {
            self.seen[mode as usize] = Seen::default();
            self.mode = mode;
            self.switches += 1;
        }
        mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic machine: what one epoch in each mode measures, as (latency, CPU)
    /// per I/O in µs, with the device latency, the timer overshoot and the share
    /// of time the I/O thread waits for a CPU. No clock, no sleep: deterministic.
    #[derive(Clone, Copy)]
    struct Machine {
        device_us: f64,
        overshoot_us: f64,
        poll: (f64, f64),
        hybrid: (f64, f64),
        interrupt: (f64, f64),
        /// Yielding between looks (sleeping while a CPU-bound thread holds the CPU).
        yielding: (f64, f64),
        run_delay: f64,
        noise: f64,
    }

    const DRAM: Machine = Machine {
        device_us: 7.1,
        overshoot_us: 20.0,
        poll: (7.2, 7.4),
        hybrid: (7.3, 7.5),
        interrupt: (27.0, 28.0),
        yielding: (7.4, 7.6),
        run_delay: 0.0,
        noise: 0.0,
    };
    /// The DRAM-SSD with two hogs: polling is preempted but still far ahead.
    const DRAM_HOGS: Machine =
        Machine { poll: (10.4, 7.3), interrupt: (44.0, 26.0), yielding: (46.0, 26.0), run_delay: 0.3, ..DRAM };
    const NAND: Machine = Machine {
        device_us: 80.1,
        overshoot_us: 30.0,
        poll: (80.5, 81.0),
        hybrid: (81.5, 33.0),
        interrupt: (113.0, 30.0),
        yielding: (81.0, 79.0),
        run_delay: 0.0,
        noise: 0.0,
    };
    /// NAND with two hogs: a preempted poller, a hybrid that oversleeps.
    const NAND_HOGS: Machine = Machine {
        poll: (117.0, 80.0),
        hybrid: (130.0, 40.0),
        interrupt: (100.0, 19.0),
        yielding: (104.0, 20.0),
        run_delay: 0.3,
        ..NAND
    };
    /// A loop device whose worker runs on the waiters' CPUs: a spinning waiter
    /// delays the worker, a sleeping one pays a wake-up; a yielding one hands
    /// the worker its CPU and needs no wake-up.
    const LOOP: Machine = Machine {
        device_us: 25.0,
        overshoot_us: 25.0,
        poll: (38.0, 38.0),
        hybrid: (40.0, 22.0),
        interrupt: (45.0, 20.0),
        yielding: (26.0, 12.0),
        run_delay: 0.0,
        noise: 0.05,
    };

    impl Machine {
        fn epoch(&self, mode: Mode, i: u64) -> EpochSignals {
            let (lat, cpu) = match mode {
                Mode::Poll => self.poll,
                Mode::Hybrid => self.hybrid,
                Mode::Interrupt => self.interrupt,
                Mode::Yield => self.yielding,
            };
            // Deterministic noise: +-noise on latency, alternating.
            let lat = lat * (1.0 + if i.is_multiple_of(2) { self.noise } else { -self.noise });
            let ios = 64;
            let wall_ns = (ios as f64 * lat * 1000.0) as u64;
            let run_delay_ns = (wall_ns as f64 * self.run_delay) as u64;
            EpochSignals {
                wall_ns,
                ios,
                run_delay_ns,
                involuntary_ctx: 0,
                stalls: if mode == Mode::Poll && self.run_delay > 0.05 { 3 } else { 0 },
                pressure_ns: 0,
                cpu_ns: (ios as f64 * cpu * 1000.0) as u64,
                latency_sum_ns: (ios as f64 * lat * 1000.0) as u64,
                waiting_ns: wall_ns,
                device_latency_ns: self.device_us * 1000.0,
                overshoot_ns: self.overshoot_us * 1000.0,
                cpus_wanted: false,
                starved: false,
            }
        }
    }

    /// Runs `epochs` epochs; returns the modes chosen, one per epoch.
    fn run(c: &mut Controller, m: &Machine, epochs: u64) -> Vec<Mode> {
        (0..epochs).map(|i| c.on_epoch(&m.epoch(c.mode(), i))).collect()
    }

    fn share(modes: &[Mode], mode: Mode) -> f64 {
        modes.iter().filter(|&&m| m == mode).count() as f64 / modes.len() as f64
    }

    #[test]
    fn a_device_faster_than_a_wake_up_is_polled() {
        let mut c = Controller::new();
        let modes = run(&mut c, &DRAM, 20_000);
        assert_eq!(c.mode(), Mode::Poll);
        assert_eq!(c.switches, 0, "interrupts are only ever probed");
        assert!(!modes.contains(&Mode::Hybrid), "hybrid cannot sleep on a 7 us device");
        // 20,000 epochs of 0.46 ms = 9.2 s: interrupts lose on both latency and CPU,
        // so their probes back off fast (x4) to one every 4 s: at 0, 0.25, 1.25, 5.25 s.
        assert!(c.probes <= 4, "{} probes", c.probes);
    }

    #[test]
    fn a_slow_device_on_an_idle_machine_settles_on_hybrid() {
        let mut c = Controller::new();
        let modes = run(&mut c, &NAND, 2_000);
        assert_eq!(c.mode(), Mode::Hybrid);
        assert_eq!(c.switches, 1, "one switch, kept after a probe");
        assert!(share(&modes[10..], Mode::Hybrid) > 0.98, "{}", share(&modes[10..], Mode::Hybrid));
    }

    #[test]
    fn a_preempted_poller_leaves_polling_at_once() {
        let mut c = Controller::new();
        let mut stalled = NAND.epoch(Mode::Poll, 1);
        stalled.stalls = 2;
        assert_eq!(c.on_epoch(&stalled), Mode::Hybrid);
        assert!(!c.probing(), "a switch, not a probe");
        assert_eq!(c.switches, 1);
        // On a device faster than a wake-up there is nothing better to do.
        let mut c = Controller::new();
        let mut stalled = DRAM.epoch(Mode::Poll, 0);
        stalled.stalls = 2;
        assert_ne!(c.on_epoch(&stalled), Mode::Hybrid);
        assert_eq!(c.switches, 0, "at most a probe of interrupts");
    }

    #[test]
    fn a_poller_that_starves_its_completion_yields_at_once() {
        // Loop-device figures, but each polled I/O waits for the poller's time slice
        // to end (the worker that completes it was woken onto the poller's CPU).
        let starving = Machine { poll: (6_000.0, 6_000.0), ..LOOP };
        let mut c = Controller::auto();
        c.mode = Mode::Poll;
        assert_eq!(c.on_epoch(&starving.epoch(Mode::Poll, 0)), Mode::Yield);
        assert!(matches!(c.reason, Reason::Starved { .. }), "{}", c.reason);
        assert!(!c.probing(), "a switch, not a probe");
        // An epoch in which nothing completed at all counts the same; without yielding
        // (the `adaptive` policy) the way out is interrupts.
        let mut c = Controller::auto();
        c.mode = Mode::Poll;
        let mut none = LOOP.epoch(Mode::Poll, 0);
        (none.ios, none.latency_sum_ns, none.wall_ns) = (0, 0, 50_000_000);
        assert_eq!(c.on_epoch(&none), Mode::Yield);
        // A poll that gave up says so, not a mean its fast I/Os kept low.
        let mut c = Controller::auto();
        c.mode = Mode::Poll;
        let gave_up = EpochSignals { starved: true, ..LOOP.epoch(Mode::Poll, 0) };
        assert_eq!(c.on_epoch(&gave_up), Mode::Yield);
        assert!(c.reason.to_string().contains("a poll saw nothing for 1.0 ms"), "{}", c.reason);
        let mut c = Controller::new();
        c.mode = Mode::Poll;
        assert_eq!(c.on_epoch(&starving.epoch(Mode::Poll, 0)), Mode::Interrupt);
        // A fast device under contention is slower when polled, but not starved: kept.
        let mut c = Controller::new();
        run(&mut c, &DRAM_HOGS, 200);
        assert_eq!(c.mode(), Mode::Poll);
    }

    #[test]
    fn a_poller_starves_after_at_most_ten_milliseconds_whatever_it_learned() {
        assert_eq!(starved_after_ns(5_000.0), STARVED_LATENCY_NS, "a fast device: 1 ms");
        assert_eq!(starved_after_ns(100_000.0), 1_600_000.0, "16 device times");
        // A device time inflated to seconds by late sightings cannot hide starving.
        assert_eq!(starved_after_ns(2e9), STARVED_MAX_NS);
        let mut c = Controller::auto();
        c.mode = Mode::Poll;
        let mut inflated = LOOP.epoch(Mode::Poll, 0);
        inflated.device_latency_ns = 2e9;
        inflated.latency_sum_ns = 60_000_000 * inflated.ios;
        assert_eq!(c.on_epoch(&inflated), Mode::Yield);
        assert!(matches!(c.reason, Reason::Starved { .. }), "{}", c.reason);
    }

    #[test]
    fn contention_on_a_fast_device_keeps_polling() {
        let mut c = Controller::new();
        let modes = run(&mut c, &DRAM_HOGS, 5_000);
        assert_eq!(c.level(), Level::High);
        assert_eq!(c.mode(), Mode::Poll, "a preempted poller still beats a wake-up per I/O");
        assert_eq!(c.switches, 0);
        // The level rose, but interrupts were measured worse on both axes: no re-probe storm.
        assert!(c.probes <= 4, "{} probes", c.probes);
        assert!(share(&modes, Mode::Poll) > 0.99);
    }

    #[test]
    fn the_policy_follows_contention_and_comes_back() {
        let mut c = Controller::new();
        run(&mut c, &NAND, 500);
        assert_eq!(c.mode(), Mode::Hybrid);
        let calm = c.switches;
        // Hogs arrive: hybrid oversleeps, interrupts are cheaper now.
        let modes = run(&mut c, &NAND_HOGS, 2_000);
        assert_eq!(c.level(), Level::High);
        assert_eq!(c.mode(), Mode::Interrupt);
        assert!(share(&modes[100..], Mode::Interrupt) > 0.95);
        // They leave: back to hybrid, after the level comes down.
        let modes = run(&mut c, &NAND, 2_000);
        assert_eq!(c.level(), Level::Low);
        assert_eq!(c.mode(), Mode::Hybrid);
        assert!(share(&modes[200..], Mode::Hybrid) > 0.95);
        assert!(c.switches <= calm + 2, "one switch each way: {} after {calm}", c.switches);
    }

    #[test]
    fn noise_does_not_make_it_oscillate() {
        // Latencies alternating +-8% every epoch, costs of hybrid and interrupt close.
        let m = Machine { noise: 0.08, interrupt: (90.0, 33.0), ..NAND };
        let mut c = Controller::new();
        run(&mut c, &m, 5_000);
        assert!(c.switches <= 2, "{} switches", c.switches);
    }

    #[test]
    fn a_device_at_the_edge_of_the_timer_reach_does_not_flap() {
        // A loop device: 20-30 us, the timer overshooting by ~24 us; hybrid, when it
        // can sleep, is the cheapest (the sleep leaves the CPU to the device's worker).
        let m = Machine {
            device_us: 0.0,
            overshoot_us: 24.0,
            poll: (28.0, 26.0),
            hybrid: (22.0, 21.0),
            interrupt: (75.0, 30.0),
            yielding: (28.0, 26.0),
            run_delay: 0.0,
            noise: 0.0,
        };
        let mut c = Controller::new();
        let mut modes = Vec::new();
        for i in 0..3_000u64 {
            let device_us = if i % 3 == 0 { 27.0 } else { 31.0 };
            modes.push(c.on_epoch(&Machine { device_us, ..m }.epoch(c.mode(), i)));
        }
        assert!(c.switches <= 3, "{} switches", c.switches);
        assert!(c.probes <= 30, "{} probes", c.probes);
        assert!(share(&modes[100..], Mode::Hybrid) > 0.95, "{:?}", &modes[..40]);
    }

    #[test]
    fn one_lucky_probe_epoch_does_not_switch() {
        let mut c = Controller::new();
        run(&mut c, &NAND, 500);
        assert_eq!((c.mode(), c.switches), (Mode::Hybrid, 1));
        // Run on until polling is probed again.
        let mut i = 0;
        while !(c.probing() && c.mode() == Mode::Poll) {
            c.on_epoch(&NAND.epoch(c.mode(), i));
            i += 1;
            assert!(i < 10_000, "polling is probed again");
        }
        // Its first epoch looks far better than it is, the second is the truth.
        let lucky = Machine { poll: (60.0, 10.0), ..NAND };
        assert_eq!(c.on_epoch(&lucky.epoch(Mode::Poll, 0)), Mode::Poll, "a winning probe runs a second epoch");
        assert_eq!(c.on_epoch(&NAND.epoch(Mode::Poll, 1)), Mode::Hybrid, "and is not kept if that one loses");
        assert_eq!(c.switches, 1);
    }

    #[test]
    fn a_probe_that_lost_while_starved_of_cpu_gets_a_second_epoch() {
        // Two hogs on the NAND device: interrupts at 94 us, hybrid at 81 us with
        // under half its wait on a CPU (the better mode).
        let hogs = Machine { hybrid: (81.0, 25.0), interrupt: (94.0, 15.0), run_delay: 0.0, ..NAND };
        let mut c = Controller::new();
        c.force(Mode::Interrupt);
        let mut i = 0;
        while !(c.probing() && c.mode() == Mode::Hybrid) {
            c.on_epoch(&hogs.epoch(c.mode(), i));
            i += 1;
            assert!(i < 10_000, "hybrid is probed");
        }
        // Its first epoch falls where the hogs held the CPU: 290 us per I/O, run delay 71%.
        let starved = Machine { hybrid: (290.0, 25.0), run_delay: 0.71, ..hogs };
        assert_eq!(c.on_epoch(&starved.epoch(Mode::Hybrid, 0)), Mode::Hybrid, "a second epoch");
        assert!(c.probing());
        // The second measures the mode: it wins, is confirmed, and is kept.
        assert_eq!(c.on_epoch(&hogs.epoch(Mode::Hybrid, 1)), Mode::Hybrid);
        assert_eq!(c.on_epoch(&hogs.epoch(Mode::Hybrid, 2)), Mode::Hybrid);
        assert!(!c.probing(), "{}", c.reason);
        assert!(matches!(c.reason, Reason::ProbeWon { .. }), "{}", c.reason);
        // A loss in an epoch with the CPU free is final.
        let mut c = Controller::new();
        c.force(Mode::Interrupt);
        while !(c.probing() && c.mode() == Mode::Hybrid) {
            c.on_epoch(&hogs.epoch(c.mode(), i));
            i += 1;
        }
        let slow = Machine { hybrid: (290.0, 25.0), ..hogs };
        assert_eq!(c.on_epoch(&slow.epoch(Mode::Hybrid, 0)), Mode::Interrupt);
        assert!(matches!(c.reason, Reason::ProbeLost { .. }), "{}", c.reason);
    }

    #[test]
    fn a_device_hiccup_does_not_make_another_mode_look_better() {
        let mut c = Controller::new();
        run(&mut c, &NAND, 500);
        let mut i = 0;
        while c.probing() || c.mode() != Mode::Hybrid {
            c.on_epoch(&NAND.epoch(c.mode(), i));
            i += 1;
        }
        // The device takes 400 us per I/O for three epochs of hybrid; then it is
        // itself again. Interrupts, measured before, now look far cheaper than
        // hybrid did during the hiccup, but the hiccup was the device's.
        let hiccup = Machine { device_us: 400.0, hybrid: (420.0, 300.0), ..NAND };
        for j in 0..3 {
            assert_eq!(c.on_epoch(&hiccup.epoch(Mode::Hybrid, j)), Mode::Hybrid);
        }
        let modes = run(&mut c, &NAND, 300);
        assert!(share(&modes, Mode::Hybrid) > 0.95, "{:?}", &modes[..20]);
        assert_eq!(c.switches, 1);
        assert_eq!(c.hiccups, 3);
    }

    #[test]
    fn probes_are_longer_on_a_device_whose_latency_jumps() {
        let mut c = Controller::new();
        run(&mut c, &NAND, 200);
        assert_eq!(c.probe_ios(), PROBE_IOS, "a steady device: short probes");
        for i in 0..200u64 {
            let device_us = if i % 2 == 0 { 20.0 } else { 30.0 };
            let m = Machine { device_us, overshoot_us: 15.0, ..NAND };
            c.on_epoch(&m.epoch(c.mode(), i));
        }
        assert_eq!(c.probe_ios(), 4 * PROBE_IOS, "20/30 us from epoch to epoch: longer probes");
    }

    #[test]
    fn a_short_lived_stall_does_not_poison_the_level() {
        // One epoch where the thread waited most of the time, then calm.
        let mut c = Controller::new();
        run(&mut c, &DRAM, 100);
        let mut spike = DRAM.epoch(Mode::Poll, 0);
        spike.run_delay_ns = 10 * spike.wall_ns; // counters can run ahead of the clock
        c.on_epoch(&spike);
        run(&mut c, &DRAM, 200);
        assert_eq!(c.level(), Level::Low);
        assert_eq!(c.mode(), Mode::Poll);
    }

    #[test]
    fn auto_starts_yielding_and_keeps_it_where_it_is_cheapest() {
        let mut c = Controller::auto();
        assert_eq!((c.mode(), c.reason), (Mode::Yield, Reason::Start));
        let modes = run(&mut c, &LOOP, 5_000);
        assert_eq!(c.mode(), Mode::Yield);
        assert_eq!(c.switches, 0, "every other mode is only probed");
        assert!(share(&modes, Mode::Yield) > 0.97, "{}", share(&modes, Mode::Yield));
        // The adaptive controller never yields.
        let mut c = Controller::new();
        assert!(!run(&mut c, &LOOP, 2_000).contains(&Mode::Yield));
    }

    #[test]
    fn auto_finds_hybrid_on_a_slow_device_and_the_sleeping_mode_under_hogs() {
        let mut c = Controller::auto();
        let modes = run(&mut c, &NAND, 2_000);
        assert_eq!(c.mode(), Mode::Hybrid);
        assert!(matches!(c.reason, Reason::ProbeWon { .. } | Reason::ProbeLost { .. } | Reason::Probe { .. }));
        assert!(share(&modes[20..], Mode::Hybrid) > 0.97, "{}", share(&modes[20..], Mode::Hybrid));
        let mut c = Controller::auto();
        let modes = run(&mut c, &NAND_HOGS, 2_000);
        // J: interrupt 100+4x19 = 176, yield (which sleeps while the hogs hold the
        // CPU) 184, within the switching margin of each other; hybrid 290, poll 437.
        assert!(matches!(c.mode(), Mode::Interrupt | Mode::Yield), "{:?}", c.mode());
        let sleeping = share(&modes[50..], Mode::Interrupt) + share(&modes[50..], Mode::Yield);
        assert!(sleeping > 0.95, "{sleeping}");
    }

    #[test]
    fn auto_on_a_device_faster_than_a_wake_up_spins() {
        let mut c = Controller::auto();
        let modes = run(&mut c, &DRAM, 5_000);
        assert!(c.mode().spins(), "{:?}", c.mode());
        assert!(!modes.contains(&Mode::Hybrid), "hybrid cannot sleep on a 7 us device");
        let spinning = modes.iter().filter(|m| m.spins()).count() as f64 / modes.len() as f64;
        assert!(spinning > 0.99, "{spinning}");
    }

    #[test]
    fn auto_that_has_not_learned_the_device_latency_probes_polling_to_learn_it() {
        let mut c = Controller::auto();
        let unknown = EpochSignals { device_latency_ns: 0.0, ..NAND_HOGS.epoch(Mode::Yield, 0) };
        assert_eq!(c.on_epoch(&unknown), Mode::Poll);
        assert!(c.probing());
        assert_eq!(c.reason, Reason::Probe { never: true });
        // Once is enough: the probe teaches it (or the device cannot be timed).
        c.force(Mode::Yield);
        assert_eq!(c.on_epoch(&unknown), Mode::Yield);
    }

    #[test]
    fn sparse_waits_yield_and_end_a_probe_without_a_verdict() {
        // A thread waiting 3 times in 10 ms (0.3 ms of waiting): however its few
        // samples fall, it yields and probes nothing.
        let sparse = |c: &Controller, i| EpochSignals {
            ios: 3,
            wall_ns: 10_000_000,
            waiting_ns: 300_000,
            latency_sum_ns: 300_000,
            ..LOOP.epoch(c.mode(), i)
        };
        for from in [Mode::Interrupt, Mode::Hybrid, Mode::Poll] {
            let mut c = Controller::auto();
            c.force(from);
            assert_eq!(c.on_epoch(&sparse(&c, 0)), Mode::Yield, "from {}", from.name());
            assert!(matches!(c.reason, Reason::Sparse { ios: 3, .. }), "{}", c.reason);
            let probes = c.probes;
            for i in 1..500 {
                assert_eq!(c.on_epoch(&sparse(&c, i)), Mode::Yield);
            }
            assert_eq!(c.probes, probes, "no probe while the waits are sparse");
        }
        // A probe under way ends, without a verdict.
        let mut c = Controller::auto();
        run(&mut c, &LOOP, 10);
        c.probe(Mode::Interrupt);
        assert_eq!(c.on_epoch(&sparse(&c, 0)), Mode::Yield);
        assert!(!c.probing());
        // Few I/Os in an epoch spent waiting (a sleeper beside hogs that hold the
        // CPU) are not sparse: the usual rules decide.
        let mut c = Controller::auto();
        run(&mut c, &LOOP, 200);
        c.force(Mode::Hybrid);
        let slow = EpochSignals { ios: 3, waiting_ns: 9_000_000, ..sparse(&c, 0) };
        c.on_epoch(&slow);
        assert!(!matches!(c.reason, Reason::Sparse { .. }), "{}", c.reason);
        // adaptive has no yield: its rule is unchanged.
        let mut c = Controller::new();
        c.force(Mode::Interrupt);
        assert_ne!(c.on_epoch(&sparse(&c, 0)), Mode::Yield);
    }

    #[test]
    fn auto_does_not_poll_while_other_threads_want_the_cpus() {
        // The poller's own figures are the best (it never waits for its CPU), but
        // the program's computing threads want the CPUs it holds. (Hybrid is slow
        // here, so that polling is adaptive's clear choice on cost alone.)
        let busy = Machine {
            poll: (60.0, 60.0),
            hybrid: (120.0, 40.0),
            yielding: (900.0, 20.0),
            interrupt: (1200.0, 25.0),
            ..NAND
        };
        let mut c = Controller::auto();
        let mut modes = Vec::new();
        for i in 0..2_000 {
            let s = EpochSignals { cpus_wanted: true, ..busy.epoch(c.mode(), i) };
            modes.push(c.on_epoch(&s));
        }
        assert!(!modes.contains(&Mode::Poll), "{:?}", &modes[..20]);
        // adaptive has no yield to fall back on and keeps its old rule.
        let mut c = Controller::new();
        let mut modes = Vec::new();
        for i in 0..2_000 {
            let s = EpochSignals { cpus_wanted: true, ..busy.epoch(c.mode(), i) };
            modes.push(c.on_epoch(&s));
        }
        assert!(share(&modes, Mode::Poll) > 0.9, "{}", share(&modes, Mode::Poll));
    }

    #[test]
    fn a_probe_whose_wait_gave_up_has_lost_however_few_its_waits() {
        let mut c = Controller::auto();
        run(&mut c, &LOOP, 200);
        assert_eq!(c.mode(), Mode::Yield);
        assert_eq!(c.probe_give_up_ns(), None, "only a probe gives up");
        let kept = c.cost(Mode::Yield).unwrap();
        c.probe(Mode::Hybrid);
        assert_eq!(c.probe_give_up_ns(), Some((PROBE_GIVE_UP_IOS * kept) as u64));
        let interval = c.probe_interval_ns[Mode::Hybrid as usize];
        // Two quick I/Os, then a wait that gave up: few waits in a long epoch,
        // which would read as sparse (no verdict) and, on the two quick ones, as
        // cheaper than yield.
        let gave_up = EpochSignals {
            ios: 3,
            wall_ns: 10_000_000,
            waiting_ns: 2_000_000,
            latency_sum_ns: 2 * 15_000 + 1_000_000,
            starved: true,
            ..LOOP.epoch(Mode::Hybrid, 0)
        };
        assert_eq!(c.on_epoch(&gave_up), Mode::Yield);
        assert!(!c.probing());
        assert_eq!(c.reason, Reason::ProbeGaveUp { kept });
        assert!(c.reason.to_string().contains("gave up"), "{}", c.reason);
        assert!(c.probe_interval_ns[Mode::Hybrid as usize] >= 2 * interval, "a clear loss backs off");
        // Even where its completed I/Os alone would have won.
        let mut c = Controller::auto();
        run(&mut c, &LOOP, 200);
        c.probe(Mode::Hybrid);
        let cheap_but_gave_up =
            EpochSignals { latency_sum_ns: 64 * 5_000, starved: true, ..LOOP.epoch(Mode::Hybrid, 0) };
        assert_eq!(c.on_epoch(&cheap_but_gave_up), Mode::Yield);
        assert!(matches!(c.reason, Reason::ProbeGaveUp { .. }), "{}", c.reason);
    }

    #[test]
    fn auto_neither_polls_nor_sleeps_a_sliver_on_a_fast_device_while_the_cpus_are_oversubscribed() {
        // The loop device among the program's own runnable threads: per waiter,
        // polling and hybrid answer soonest, but the CPU they spin on is one the
        // others (and the device's worker) wanted; this thread waits for a CPU
        // 30% of its time (HIGH). A 25 us device behind a 20 us timer overshoot
        // leaves hybrid only a sliver to sleep.
        let crowded = Machine {
            poll: (20.0, 20.0),
            hybrid: (22.0, 12.0),
            yielding: (35.0, 10.0),
            interrupt: (60.0, 20.0),
            run_delay: 0.3,
            overshoot_us: 20.0,
            ..LOOP
        };
        let mut c = Controller::auto();
        let modes = run(&mut c, &crowded, 3_000);
        assert_eq!(c.level(), Level::High);
        let settled = &modes[20..];
        assert!(!settled.contains(&Mode::Poll), "polled at HIGH: {:?}", &settled[..40]);
        assert!(!settled.contains(&Mode::Hybrid), "hybrid at HIGH: {:?}", &settled[..40]);
        assert!(share(settled, Mode::Yield) > 0.95, "{}", share(settled, Mode::Yield));
        // With CPUs to spare, the same figures decide as before (hybrid's J is lowest).
        let spare = Machine { run_delay: 0.0, ..crowded };
        let mut c = Controller::auto();
        let modes = run(&mut c, &spare, 3_000);
        assert!(share(&modes[1_000..], Mode::Hybrid) > 0.9, "{}", share(&modes[1_000..], Mode::Hybrid));
        // adaptive has no yield to hand the CPU over with: its rules are unchanged.
        let mut c = Controller::new();
        let modes = run(&mut c, &crowded, 3_000);
        assert!(modes.contains(&Mode::Hybrid));
    }

    #[test]
    fn every_switch_and_probe_leaves_a_reason() {
        let mut c = Controller::auto();
        let mut last = (c.mode(), c.probes);
        for i in 0..3_000 {
            let m = if i < 1_000 {
                &NAND
            } else if i < 2_000 {
                &NAND_HOGS
            } else {
                &LOOP
            };
            c.on_epoch(&m.epoch(c.mode(), i));
            if (c.mode(), c.probes) != last {
                assert_ne!(c.reason, Reason::Start, "epoch {i}: {:?} without a reason", c.mode());
                assert!(!c.reason.to_string().is_empty());
            }
            last = (c.mode(), c.probes);
        }
    }
}
