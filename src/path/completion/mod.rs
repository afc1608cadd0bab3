//! Completion policies: how a waiter learns that the device has finished.
//!
//! A policy is one file: [`poll`] spins on the queue, [`interrupt`] sleeps
//! until the device's completion wakes it, [`hybrid`] sleeps for a learned
//! share of the expected service time and then spins, [`yielding`] spins but
//! gives the CPU to any other runnable thread between looks; [`adaptive`]
//! switches among them at run time (`adaptive` and `auto`, the default), with
//! [`crowd`] (how many of the process's threads wait) and [`explain`] (what
//! it decided, in words) beside it. Every dispatch
//! strategy waits through a policy, so any dispatch combines with any
//! completion. Each channel has its own policy instance, so what a policy
//! learns is per queue.

pub mod adaptive;
pub mod crowd;
pub mod explain;
pub mod hybrid;
pub mod interrupt;
pub mod judge;
pub mod poll;
pub mod yielding;

use crate::device::{Command, Durability, Op, Queue};
use crate::error::{Error, Result};

/// Counters a policy keeps while waiting; summed per thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Looks at the completion queue.
    pub polls: u64,
    /// Times the waiter went to sleep.
    pub sleeps: u64,
    /// Sleeps that ended after the command had completed (hybrid).
    pub oversleeps: u64,
    /// Mode changes of the adaptive policy.
    pub mode_switches: u64,
    /// Epochs the adaptive policy spent trying a mode to measure it.
    pub mode_probes: u64,
    /// Time the adaptive and auto policies spent in poll, hybrid, interrupt
    /// and yield mode (ns, booked every epoch), and waiting in a crowd (more
    /// waiters than CPUs, when every wait yields between looks), in that order.
    pub mode_ns: [u64; 5],
}

impl WaitStats {
    /// Adds another set of counters.
    pub fn add(&mut self, other: &WaitStats) {
        self.polls += other.polls;
        self.sleeps += other.sleeps;
        self.oversleeps += other.oversleeps;
        self.mode_switches += other.mode_switches;
        self.mode_probes += other.mode_probes;
        for (a, b) in self.mode_ns.iter_mut().zip(&other.mode_ns) {
            *a += b;
        }
    }

    /// The counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &WaitStats) -> WaitStats {
        WaitStats {
            polls: self.polls - earlier.polls,
            sleeps: self.sleeps - earlier.sleeps,
            oversleeps: self.oversleeps - earlier.oversleeps,
            mode_switches: self.mode_switches - earlier.mode_switches,
            mode_probes: self.mode_probes - earlier.mode_probes,
            mode_ns: std::array::from_fn(|i| self.mode_ns[i] - earlier.mode_ns[i]),
        }
    }
}

/// What the device is working on: the oldest command in flight, or on a
/// queue that stays busy the next one due since the last completion (see
/// `Channel::restamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// When it was submitted (or when the last completion came back).
    pub since_ns: u64,
    /// Its direction.
    pub op: Op,
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether it flushes the device's cache: a flush, or a write with forced
    /// unit access or ordered after a flush. Its time is a flush's, not a
    /// read's, and on io_uring it runs on the kernel's workers, whose
    /// completion (and the next step of a linked chain) waits for the
    /// submitting thread to enter the kernel: a timed sleep holds it up.
    pub flushes: bool,
}

impl Default for Expect {
    fn default() -> Self {
        Expect { since_ns: 0, op: Op::Read, bytes: 0, flushes: false }
    }
}

impl Expect {
    /// What a wait expects of `command`, submitted at `since_ns`.
    pub fn of(command: &Command, since_ns: u64) -> Expect {
        let flushes = command.op == Op::Flush || (command.op == Op::Write && command.durability != Durability::Cached);
        Expect { since_ns, op: command.op, bytes: command.bytes(), flushes }
    }

    /// A plain (non-durable) command of `op` and `bytes`, submitted at `since_ns`.
    pub fn plain(op: Op, bytes: u64, since_ns: u64) -> Expect {
        Expect { since_ns, op, bytes, flushes: op == Op::Flush }
    }
}

/// How a waiter learns of completions.
pub trait CompletionPolicy: Send {
    /// Name used on the command line and in reports.
    fn name(&self) -> &'static str;

    /// Whether the policy spins (burns the CPU) rather than sleeps.
    fn spins(&self) -> bool;

    /// Whether the policy reads [`Expect`]; the channel stamps submissions
    /// with the clock only for policies that do.
    fn uses_expect(&self) -> bool {
        false
    }

    /// Whether the next wait goes straight to a sleep in [`Queue::wait`],
    /// with no look at the queue first. On a queue whose waits send
    /// ([`Queue::sends_when_waiting`]) a caller may then leave its commit to
    /// that wait: one system call per request instead of two. A policy that
    /// says so and looks first after all costs nothing but the saving (a look
    /// sends too).
    fn sleeps_first(&self) -> bool {
        false
    }

    /// Where the next wait would sleep until woken anyway, has `call` carry
    /// the request out with the kernel's own blocking call instead
    /// ([`Queue::run_blocking`]): a thread that sleeps per request gains
    /// nothing from a ring, and a blocking `pread` costs what the program's
    /// own call would. `call` returns whether the queue could; the policy
    /// books a call that ran as a sleeping wait and returns true. The default
    /// never calls it.
    fn wait_blocking(&mut self, stats: &mut WaitStats, call: &mut dyn FnMut() -> bool) -> bool {
        let _ = (stats, call);
        false
    }

    /// Where the policy's waits do not sleep ([`CompletionPolicy::sleeps_first`]),
    /// whether to have `call` carry a flush (or an ordered write, its flush
    /// first) out with the kernel's blocking datasync all the same: on
    /// io_uring a flush runs on one of the kernel's workers, which a waiter
    /// that looks for it while other threads hold the CPUs keeps waiting for
    /// a CPU (on the loop device, 8 threads of direct writes and fdatasyncs
    /// through a mount: 65-102 us per flush looked for, 52-72 us as the
    /// call). Alone with a free CPU a look is faster (no wake-up: 30 us
    /// against 41-45 us). `call` returns whether the queue could; a policy
    /// books a call that ran as a sleep and returns true. The default looks.
    fn flush_blocking(&mut self, stats: &mut WaitStats, call: &mut dyn FnMut() -> bool) -> bool {
        let _ = (stats, call);
        false
    }

    /// Waits until `queue` hands back at least one command (moved into `out`)
    /// or the monotonic clock passes `limit_ns`; returns how many were handed
    /// back. `expect` describes the oldest command in flight.
    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize>;
}

/// The completion policies iopath knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// Spin on the completion queue.
    Poll,
    /// Sleep until woken by the completion.
    Interrupt,
    /// Sleep a learned share of the expected time, then spin.
    Hybrid,
    /// Switch among the three from measured latency and CPU contention.
    Adaptive,
    /// Spin, yielding the CPU to other runnable threads between looks.
    Yield,
    /// Switch among yield, poll, hybrid and interrupt from measured latency,
    /// CPU cost, contention and the crowd of waiters (the default).
    Auto,
}

impl CompletionKind {
    /// All kinds, in the order reports list them.
    pub const ALL: [CompletionKind; 6] = [
        CompletionKind::Interrupt,
        CompletionKind::Poll,
        CompletionKind::Yield,
        CompletionKind::Hybrid,
        CompletionKind::Adaptive,
        CompletionKind::Auto,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            CompletionKind::Poll => "poll",
            CompletionKind::Interrupt => "interrupt",
            CompletionKind::Hybrid => "hybrid",
            CompletionKind::Adaptive => "adaptive",
            CompletionKind::Yield => "yield",
            CompletionKind::Auto => "auto",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<CompletionKind> {
        Self::ALL.into_iter().find(|k| k.name() == text).ok_or_else(|| {
            Error::spec("completion policy", text, "expected one of: interrupt, poll, yield, hybrid, adaptive, auto")
        })
    }

    /// Builds a policy instance (one per channel).
    pub fn build(self) -> Box<dyn CompletionPolicy> {
        match self {
            CompletionKind::Poll => Box::new(poll::Poll),
            CompletionKind::Interrupt => Box::new(interrupt::Interrupt),
            CompletionKind::Hybrid => Box::new(hybrid::Hybrid::new()),
            CompletionKind::Adaptive => Box::new(adaptive::Adaptive::new()),
            CompletionKind::Yield => Box::new(yielding::Yield::default()),
            CompletionKind::Auto => Box::new(adaptive::Adaptive::auto()),
        }
    }
}
