//! `yield`: poll the completion queue, handing the CPU to any other runnable
//! thread between two looks.
//!
//! A middle way between [`poll`](super::poll) and
//! [`interrupt`](super::interrupt). Like `poll` it never sleeps, so no
//! wake-up is paid: a completion is seen on the waiter's next look. Unlike
//! `poll` it does not hold the CPU while others need it: after every empty
//! look it calls `sched_yield`, which returns at once when nothing else is
//! runnable on that CPU (an idle machine pays one system call per look) and
//! otherwise runs whoever is waiting first. A yield that kept the caller away
//! for longer than [`LONG_YIELD_NS`] may mean a CPU-bound program got the CPU
//! (and would again at every yield: with two CPU hogs on `emu:nand` pure
//! yielding fell to 3.9K IOPS with a 4 ms p99, a scheduler slice per look),
//! or only that the waiters outnumber the CPUs and one yield in a few hundred
//! waited out a long queue of them. The [crowd's verdict](super::crowd::Verdict)
//! tells the two apart from the run queue and from the completions the
//! process saw while the waiter was away. A hog's long yield sends that wait and the
//! following ones to sleep as [`interrupt`](super::interrupt) does, for
//! 10 ms, then yielding is tried again; each try that finds the hog still
//! there doubles the stretch, up to a second. And a wait does not start
//! yielding at all while more threads that are not waiting are runnable than
//! a crowd allows ([`cpus_wanted`](super::crowd::cpus_wanted)): it sleeps. Where the device's own work runs
//! on the host's CPUs (a loop device's worker, a busy machine) and there are
//! more waiting threads than CPUs, this is what wins: on these 2-vCPU
//! machines 16 threads on a loop device reached 1.4-1.7x the IOPS of fio's
//! psync with 16 jobs, where pure polling starved the loop worker and
//! sleeping paid a cross-CPU wake-up per request.

use super::crowd::{Verdict, Waiting, completed, note_completed};
use super::interrupt::Interrupt;
use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::now_ns;
use crate::device::{Command, Queue};
use crate::error::Result;
use crate::sync::yield_now;

/// A yield that kept the caller off its CPU longer than this means the CPU
/// went to a thread that used it (a CPU-bound program): waits sleep for a
/// while. Device workers and other waiters give it back within a few hundred
/// microseconds even with 32 threads on 2 CPUs; a CPU hog keeps it for a
/// scheduler slice (1.5-4 ms here). At 200 us, 32 threads on the loop device
/// took their own turns for hogs and fell from 408K to 187K IOPS.
pub const LONG_YIELD_NS: u64 = 1_000_000;
/// How long waits sleep after the first long yield; each further long yield
/// (a probe that found the hog still there) doubles it, up to [`MAX_SLEEP_NS`].
pub const FIRST_SLEEP_NS: u64 = 10_000_000;
/// The longest stretch of sleeping waits before yielding is tried again.
pub const MAX_SLEEP_NS: u64 = 1_000_000_000;

/// The yielding poll policy.
#[derive(Debug, Clone, Copy)]
pub struct Yield {
    /// Until then waits sleep (a CPU-bound thread shares the CPU).
    sleep_until_ns: u64,
    /// The length of the last stretch of sleeping (0: none yet, or a probe
    /// found the CPU free again).
    sleep_ns: u64,
    /// Who had the CPU during a long yield, given the completions the process
    /// saw meanwhile ([`Verdict::now`]; a test's own rule in tests).
    pub judge: fn(u64) -> Verdict,
    /// Whether threads that are not waiting want the CPUs, asked before a wait
    /// yields ([`crowd::cpus_wanted`](super::crowd::cpus_wanted); a test's own rule in tests).
    pub wanted: fn() -> bool,
}

impl Default for Yield {
    fn default() -> Self {
        Yield { sleep_until_ns: 0, sleep_ns: 0, judge: Verdict::now, wanted: super::crowd::cpus_wanted }
    }
}

/// What a wait's yields said about the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YieldOutcome {
    /// Every yield came back at once (or none was needed).
    Short,
    /// A long yield was the crowd's turn: the wait kept yielding.
    CrowdTurn,
    /// A long yield was a hog's: this wait slept, and the following ones
    /// will for the stretch returned (ns).
    HogSeen(u64),
    /// A hog was seen lately: the wait slept without yielding.
    Sleeping,
    /// Threads that are not waiting wanted the CPUs: the wait slept.
    Wanted,
}

impl Yield {
    /// One wait by a thread already counted among the waiters (`waiting`);
    /// returns how many came back and what its yields said.
    pub fn wait_counted(
        &mut self,
        waiting: &Waiting,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<(usize, YieldOutcome)> {
        // Every completion counts toward the process's progress (what a long yield's verdict asks about).
        let sleep = |queue: &mut dyn Queue, out: &mut Vec<Command>, stats: &mut WaitStats| {
            let n = Interrupt.wait(queue, out, stats, limit_ns, expect)?;
            note_completed(n);
            Ok::<usize, crate::error::Error>(n)
        };
        // (No clock read per wait while no hog was ever seen.)
        if self.sleep_until_ns != 0 && now_ns() < self.sleep_until_ns {
            return Ok((sleep(queue, out, stats)?, YieldOutcome::Sleeping));
        }
        // (The guard proves the caller is counted among the waiters the verdict compares.)
        let _ = waiting;
        if (self.wanted)() {
            return Ok((sleep(queue, out, stats)?, YieldOutcome::Wanted));
        }
        let mut yielded = false;
        // A long yield of this wait was the crowd's turn.
        let mut excused = false;
        // One clock read per look: the time a yield came back stands for the next
        // look's too (the reap between them takes ~0.1 us). A yield costs ~0.4 us
        // even when nothing else runs and a clock read 21 ns: two reads per look
        // were a tenth of its cost.
        let mut before = now_ns();
        loop {
            let n = queue.reap(out)?;
            note_completed(n);
            stats.polls += 1;
            if n > 0 || queue.in_flight() == 0 || before >= limit_ns {
                if yielded && !excused {
                    // Every yield of this wait came back at once: the CPU is shared
                    // with short-lived work only (again).
                    self.sleep_ns = 0;
                }
                return Ok((n, if excused { YieldOutcome::CrowdTurn } else { YieldOutcome::Short }));
            }
            let done = completed();
            yield_now();
            yielded = true;
            let after = now_ns();
            let away = after - before;
            before = after;
            if away > LONG_YIELD_NS {
                if (self.judge)(completed() - done) == Verdict::CrowdTurn {
                    excused = true;
                    continue;
                }
                // The next yield would cost as much again: sleep, this wait and the
                // following ones for a while, then try yielding again.
                self.sleep_ns = (self.sleep_ns * 2).clamp(FIRST_SLEEP_NS, MAX_SLEEP_NS);
                self.sleep_until_ns = after + self.sleep_ns;
                return Ok((sleep(queue, out, stats)?, YieldOutcome::HogSeen(self.sleep_ns)));
            }
        }
    }
}

impl CompletionPolicy for Yield {
    fn name(&self) -> &'static str {
        "yield"
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
        expect: Expect,
    ) -> Result<usize> {
        let waiting = Waiting::enter();
        Ok(self.wait_counted(&waiting, queue, out, stats, limit_ns, expect)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::{DeviceSpec, Op, QueueConfig};

    /// The policy on a machine where no other thread wants the CPUs.
    fn quiet() -> Yield {
        Yield { wanted: || false, ..Yield::default() }
    }

    #[test]
    fn a_wait_sleeps_instead_of_yielding_while_others_want_the_cpus() {
        let mut policy = Yield { wanted: || true, ..quiet() };
        let stats = one_read(&mut policy);
        assert!(stats.sleeps >= 1, "{stats:?}");
        assert_eq!(policy.sleep_ns, 0, "no stretch of sleeping: the next wait asks again");
    }

    fn read_on(spec: &str) -> (Box<dyn Queue>, IoBuf) {
        let dev = DeviceSpec::parse(spec, None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut buf = IoBuf::new(4096);
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, 7);
        c.push(0, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer is returned with the queue and outlives every wait on it.
        unsafe { q.submit(c) };
        q.commit().unwrap();
        (q, buf)
    }

    #[test]
    fn waits_without_sleeping_until_the_command_is_back() {
        let (mut q, _buf) = read_on("emu:optane,size=1m");
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        let n = quiet().wait(q.as_mut(), &mut out, &mut stats, u64::MAX, Expect::default()).unwrap();
        assert_eq!((n, out.len()), (1, 1));
        assert_eq!(out[0].segments[0].result, 4096);
        assert!(stats.polls >= 1);
        // Nothing in flight: back at once, whatever the limit.
        assert_eq!(quiet().wait(q.as_mut(), &mut out, &mut stats, u64::MAX, Expect::default()).unwrap(), 0);
    }

    /// Waits for one 5 ms read on `policy`, returning the wait's counters.
    fn one_read(policy: &mut Yield) -> WaitStats {
        let (mut q, _buf) = read_on("emu:null,size=1m,rcmd=5000");
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        while out.is_empty() {
            policy.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, Expect::default()).unwrap();
        }
        assert_eq!(out[0].segments[0].result, 4096);
        stats
    }

    #[test]
    fn short_yields_keep_it_polling() {
        // Simulated time moving 10 ns per clock read: every yield comes back at once.
        let _sim = crate::clock::sim::start(1_000_000_000, 10);
        let mut policy = quiet();
        let stats = one_read(&mut policy);
        assert!(stats.polls > 1, "{stats:?}");
        assert_eq!(stats.sleeps, 0, "{stats:?}");
        assert_eq!(policy.sleep_ns, 0);
    }

    #[test]
    fn a_long_yield_sends_this_wait_and_the_following_ones_to_sleep_and_backs_off() {
        let mut policy = Yield { judge: |_| Verdict::CpuTaken, ..quiet() };
        {
            // 1.5 ms per clock read: every yield looks like a CPU hog's time slice.
            let _sim = crate::clock::sim::start(1_000_000_000, 1_500_000);
            let first = one_read(&mut policy);
            assert_eq!((first.polls, first.sleeps), (1, 1), "one look, one long yield, then sleep: {first:?}");
            assert_eq!(policy.sleep_ns, FIRST_SLEEP_NS);
            assert!(policy.sleep_until_ns > 1_000_000_000);
            // Inside the stretch a wait sleeps without looking first.
            policy.sleep_until_ns = u64::MAX;
            let inside = one_read(&mut policy);
            assert_eq!(inside.polls, 0, "{inside:?}");
            assert!(inside.sleeps >= 1, "{inside:?}");
            // After it, one probe; the hog is still there: twice as long.
            policy.sleep_until_ns = 0;
            let probe = one_read(&mut policy);
            assert_eq!((probe.polls, probe.sleeps), (1, 1), "{probe:?}");
            assert_eq!(policy.sleep_ns, 2 * FIRST_SLEEP_NS);
            for _ in 0..10 {
                policy.sleep_until_ns = 0;
                one_read(&mut policy);
            }
            assert_eq!(policy.sleep_ns, MAX_SLEEP_NS, "the stretch stops doubling at its cap");
        }
        // The hog gone: the next probe's yields come back at once and polling resumes.
        let _sim = crate::clock::sim::start(1_000_000_000, 10);
        policy.sleep_until_ns = 0;
        let back = one_read(&mut policy);
        assert_eq!(back.sleeps, 0, "{back:?}");
        assert_eq!(policy.sleep_ns, 0);
    }

    #[test]
    fn long_yields_in_the_crowds_turn_never_sleep() {
        let mut policy = Yield { judge: |_| Verdict::CrowdTurn, ..quiet() };
        // Every yield is long, as behind a crowd of 32 on 2 CPUs.
        let _sim = crate::clock::sim::start(1_000_000_000, 1_500_000);
        for _ in 0..20 {
            let stats = one_read(&mut policy);
            assert_eq!(stats.sleeps, 0, "{stats:?}");
        }
    }

    #[test]
    fn a_wait_past_its_limit_looks_once_and_returns() {
        // 200 ms of device time: one look with the limit gone cannot find it done
        // (80 us, `emu:nand`'s, passed once before the look, with three test
        // binaries looping beside this one).
        let (mut q, _buf) = read_on("emu:nand,size=1m,rcmd=200000");
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        assert_eq!(quiet().wait(q.as_mut(), &mut out, &mut stats, 0, Expect::default()).unwrap(), 0);
        assert_eq!(stats.polls, 1);
        assert_eq!(q.in_flight(), 1, "the command is still the caller's to wait for");
        while out.is_empty() {
            quiet().wait(q.as_mut(), &mut out, &mut stats, u64::MAX, Expect::default()).unwrap();
        }
        assert_eq!(out[0].segments[0].result, 4096);
    }
}
