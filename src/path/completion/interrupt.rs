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

    fn sleeps_first(&self) -> bool {
        true
    }

    fn wait_blocking(&mut self, stats: &mut WaitStats, call: &mut dyn FnMut() -> bool) -> bool {
        let ran = call();
        if ran {
            stats.sleeps += 1;
        }
        ran
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        _expect: Expect,
    ) -> Result<usize> {
        // One blocking wait per call: a completion that is already there
        // comes back without a sleep (on io_uring the same `io_uring_enter`
        // that would sleep runs the deferred completions first, so a separate
        // look before it would be a second system call per request).
        loop {
            if queue.in_flight() == 0 {
                return Ok(0);
            }
            let now = now_ns();
            if now >= limit_ns {
                // Out of time, but what is already back is picked up: a caller
                // whose limit has passed (a dispatcher past its unplug time)
                // still needs its completions.
                stats.polls += 1;
                return queue.reap(out);
            }
            stats.sleeps += 1;
            let n = queue.wait(out, limit_ns - now)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::{DeviceSpec, Op, QueueConfig};

    #[test]
    fn a_wait_past_its_limit_still_picks_up_what_is_back() {
        // A dispatcher past its unplug time waits with a limit already gone: what
        // the device finished must come back all the same, or it loops forever.
        let dev = DeviceSpec::parse("emu:null,size=1m", None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut buf = IoBuf::new(4096);
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, 7);
        c.push(0, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer outlives the wait below.
        unsafe { q.submit(c) };
        q.commit().unwrap();
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        let give_up = now_ns() + 5_000_000_000;
        while out.is_empty() && now_ns() < give_up {
            Interrupt.wait(q.as_mut(), &mut out, &mut stats, 0, Expect::default()).unwrap();
        }
        assert_eq!(out.len(), 1, "the finished read came back");
        assert_eq!(out[0].segments[0].result, 4096);
        assert_eq!(stats.sleeps, 0, "no sleep with the limit gone");
        assert_eq!(Interrupt.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, Expect::default()).unwrap(), 0);
    }
}
