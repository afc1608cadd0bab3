//! Completion policies: how a waiter learns that the device has finished.
//!
//! A policy is one file: [`poll`] spins on the queue, [`interrupt`] sleeps
//! until the device's completion wakes it. Every dispatch strategy waits
//! through a policy, so any dispatch combines with any completion.

pub mod interrupt;
pub mod poll;

use crate::device::{Command, Queue};
use crate::error::{Error, Result};

/// Counters a policy keeps while waiting; summed per thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Looks at the completion queue.
    pub polls: u64,
    /// Times the waiter went to sleep.
    pub sleeps: u64,
}

impl WaitStats {
    /// Adds another set of counters.
    pub fn add(&mut self, other: &WaitStats) {
        self.polls += other.polls;
        self.sleeps += other.sleeps;
    }
}

/// How a waiter learns of completions.
pub trait CompletionPolicy: Send + Sync {
    /// Name used on the command line and in reports.
    fn name(&self) -> &'static str;

    /// Whether the policy spins (burns the CPU) rather than sleeps.
    fn spins(&self) -> bool;

    /// Waits until `queue` hands back at least one command (moved into `out`)
    /// or the monotonic clock passes `limit_ns`; returns how many were handed back.
    fn wait(
        &self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
    ) -> Result<usize>;
}

/// The completion policies iopath knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// Spin on the completion queue.
    Poll,
    /// Sleep until woken by the completion.
    Interrupt,
}

impl CompletionKind {
    /// All kinds, in the order reports list them.
    pub const ALL: [CompletionKind; 2] = [CompletionKind::Interrupt, CompletionKind::Poll];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            CompletionKind::Poll => "poll",
            CompletionKind::Interrupt => "interrupt",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<CompletionKind> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| Error::spec("completion policy", text, "expected one of: interrupt, poll"))
    }

    /// Builds the policy.
    pub fn build(self) -> Box<dyn CompletionPolicy> {
        match self {
            CompletionKind::Poll => Box::new(poll::Poll),
            CompletionKind::Interrupt => Box::new(interrupt::Interrupt),
        }
    }
}
