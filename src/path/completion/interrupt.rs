//! `interrupt`: sleep until the device's completion wakes the waiter.
//!
//! The CPU is free while the device works, at the price of one wake-up per
//! wait: on the emulated device a timer sleep to the completion deadline, on
//! io_uring a blocking `io_uring_enter`. On these VMs a wake-up costs more
//! than a 4 KiB command on a DRAM-SSD.

use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::now_ns;
use crate::device::{Command, Queue};
use crate::error::Result;

/// The interrupt-driven policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Interrupt;

impl CompletionPolicy for Interrupt {
    fn name(&self) -> &'static str {
        "interrupt"
    }

    fn spins(&self) -> bool {
        false
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        _expect: Expect,
    ) -> Result<usize> {
        loop {
            // A completion that is already there needs no sleep.
            let n = queue.reap(out)?;
            stats.polls += 1;
            if n > 0 || queue.in_flight() == 0 {
                return Ok(n);
            }
            let now = now_ns();
            if now >= limit_ns {
                return Ok(0);
            }
            stats.sleeps += 1;
            let n = queue.wait(out, limit_ns - now)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }
}
