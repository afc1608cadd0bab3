//! `poll`: spin on the completion queue until the command is done.
//!
//! No sleep, no wake-up, no context switch: the waiting thread burns its CPU
//! for the whole device time. Fastest on an idle machine with a fast device
//! (seed 000's SyncPath, seed 003's Sync+Poll); loses when other work needs
//! the CPU (seed 001).

use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::now_ns;
use crate::device::{Command, Queue};
use crate::error::Result;

/// How many empty looks between two clock reads for the time limit.
const LOOKS_PER_CLOCK_READ: u64 = 8;

/// The polling policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Poll;

/// Gaps a spinning waiter saw between two consecutive looks: time it was
/// not on its CPU (preempted), which a slow device does not cause.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gaps {
    /// How many gaps longer than [`Gaps::MIN_NS`].
    pub count: u64,
    /// Their total length.
    pub total_ns: u64,
}

impl Gaps {
    /// A look takes at most a few µs (an `io_uring_enter`); longer means the
    /// thread was off its CPU.
    pub const MIN_NS: u64 = 20_000;
}

/// Spins until a command comes back, nothing is in flight or the clock
/// passes `limit_ns`, reading the clock on every look; returns how many came
/// back and the time of the last look (when the completion was seen). With
/// `gaps`, every stretch between two looks longer than [`Gaps::MIN_NS`] is
/// added to it. Used by policies that learn from what they see; plain
/// [`Poll`] reads the clock less often.
pub fn spin(
    queue: &mut dyn Queue,
    out: &mut Vec<Command>,
    stats: &mut WaitStats,
    limit_ns: u64,
    mut gaps: Option<&mut Gaps>,
) -> Result<(usize, u64)> {
    let mut last = if gaps.is_some() { now_ns() } else { 0 };
    loop {
        let n = queue.reap(out)?;
        stats.polls += 1;
        let now = now_ns();
        if let Some(gaps) = gaps.as_deref_mut() {
            if now - last > Gaps::MIN_NS {
                gaps.count += 1;
                gaps.total_ns += now - last;
            }
            last = now;
        }
        if n > 0 || queue.in_flight() == 0 || now >= limit_ns {
            return Ok((n, now));
        }
        std::hint::spin_loop();
    }
}

impl CompletionPolicy for Poll {
    fn name(&self) -> &'static str {
        "poll"
    }

    fn spins(&self) -> bool {
        true
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        _expect: Expect,
    ) -> Result<usize> {
        let mut looks = 0u64;
        loop {
            let n = queue.reap(out)?;
            looks += 1;
            if n > 0 || queue.in_flight() == 0 {
                stats.polls += looks;
                return Ok(n);
            }
            if looks.is_multiple_of(LOOKS_PER_CLOCK_READ) && now_ns() >= limit_ns {
                stats.polls += looks;
                return Ok(0);
            }
            std::hint::spin_loop();
        }
    }
}
