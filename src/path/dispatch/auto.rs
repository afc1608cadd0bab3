//! `auto`: the default dispatch. A thread blocking alone sends its own
//! request (`direct`: no hand-off, the fastest way at depth 1). While a
//! crowd of threads block at once on a kernel device, their reads and
//! writes go through one Linux AIO context on the same file that they all
//! share (`gather.rs`, [`Device::shared_aio`]).
//!
//! Why: many blocking threads on few CPUs spend their time waiting for
//! their turn on a CPU, not for the device. Each thread's own io_uring ring
//! posts its completion only when that thread enters the kernel, so every
//! waiter pays a system call per look, and the device sees one request per
//! submission. On one shared AIO context the waiting threads send
//! everyone's pending requests as one `io_submit` (the loop device's worker
//! serves a batch in one pass) and any of them sees any completion with two
//! loads of the ring.
//!
//! The rule, per request ([`joins_crowd`]): a read or plain write joins the
//! crowd's queue when more than two threads per CPU of this dispatch are
//! blocked at once (itself included; [`crowd_min`]) and no thread outside
//! the waiters wants the CPUs ([`crowd::cpus_wanted`]: a CPU-bound program's threads
//! would lose their CPU to the crowd's turns, so its waiters sleep through
//! the `auto` completion policy instead). Nothing is switched: each request
//! goes one way whole and comes back the same way, so a change of route
//! never strands or delays one. Flushes, trims, durable writes and the
//! queued API always go direct. A forked child never uses its parent's
//! context (an AIO context is not inherited): its requests go direct.

use super::direct::Direct;
use super::gather::Gather;
use super::{Dispatch, Request};
use crate::device::Device;
use crate::error::Result;
use crate::path::channel::{Channel, Completed};
use crate::path::completion::crowd;
use crate::path::completion::explain;
use crate::path::{CrowdRule, PathStats};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Fewest threads blocked at once (the deciding one included) whose
/// requests go through the crowd's shared queue with `crowd=always`.
pub const CROWD_MIN: usize = 2;

/// Fewest threads blocked at once (the deciding one included) whose
/// requests go through the crowd's shared queue with `crowd=auto`, on
/// `cpus` CPUs: more than two per CPU. With fewer, a waiter yields to few
/// others and its own ring costs little; measured on a loop device on 2
/// vCPUs (alternated with fio's psync), the shared queue made 0.81-1.38x
/// fio at 4 threads (median 0.95x over 6 rounds) against 0.80-1.49x
/// (1.09x) direct, and through the interposer fio's randread with 4 jobs
/// 0.77-0.87x the kernel against 0.68-1.08x; from 16 threads it wins
/// (1.25-1.35x fio against 0.96-1.12x direct).
pub fn crowd_min(cpus: usize) -> usize {
    2 * cpus.max(1) + 1
}

/// Whether a blocking request goes through the crowd's shared queue under
/// `rule`, with `blocking` threads of the dispatch blocked now (its own
/// included) on `cpus` CPUs; `cpus_wanted` says whether threads that are
/// not waiting want the CPUs (asked only where the rule needs it).
pub fn joins_crowd(rule: CrowdRule, blocking: usize, cpus: usize, cpus_wanted: impl FnOnce() -> bool) -> bool {
    match rule {
        CrowdRule::Off => false,
        CrowdRule::Always => blocking >= CROWD_MIN,
        CrowdRule::Auto => blocking >= crowd_min(cpus) && !cpus_wanted(),
    }
}

/// The crowd's queue, and the fork generation it belongs to.
struct CrowdQueue {
    gather: Gather,
    forks: u64,
}

/// The `auto` dispatch strategy.
pub struct Auto {
    device: Arc<dyn Device>,
    rule: CrowdRule,
    /// Opened at the first crowd; `None` where the device has no shared
    /// AIO context or it could not be opened (then every request goes direct).
    crowd: OnceLock<Option<CrowdQueue>>,
    /// Threads inside [`Dispatch::blocking`] now.
    blocking: AtomicUsize,
    /// The route the last request took, for saying when it changes.
    last_crowded: AtomicBool,
}

impl Auto {
    /// The `auto` strategy on `device`, sending crowds to the shared queue
    /// (opened when first needed) by `rule`.
    pub fn new(device: &Arc<dyn Device>, rule: CrowdRule) -> Auto {
        Auto {
            device: Arc::clone(device),
            rule,
            crowd: OnceLock::new(),
            blocking: AtomicUsize::new(0),
            last_crowded: AtomicBool::new(false),
        }
    }

    /// The crowd's queue, opened on first use; `None` where there is none,
    /// or in a forked child of the process that opened it.
    fn crowd_queue(&self) -> Option<&Gather> {
        let crowd = self.crowd.get_or_init(|| self.open_crowd()).as_ref()?;
        (crowd.forks == crate::sys::fork_generation()).then_some(&crowd.gather)
    }

    fn open_crowd(&self) -> Option<CrowdQueue> {
        match self.device.shared_aio() {
            Ok(Some(aio)) => {
                explain::say_rare(
                    "auto",
                    format_args!("dispatch: threads blocked at once share one AIO context on this device from now on"),
                );
                Some(CrowdQueue { gather: Gather::new(aio), forks: crate::sys::fork_generation() })
            }
            Ok(None) => None,
            Err(e) => {
                explain::say_rare("auto", format_args!("dispatch: no shared queue ({e}); every request goes direct"));
                None
            }
        }
    }

    /// Says when the route changes (rate-limited with the policy's lines).
    fn note_route(&self, crowded: bool, blocking: usize) {
        // Not where there is no shared queue at all (every request goes direct).
        if matches!(self.crowd.get(), Some(None)) {
            return;
        }
        if self.last_crowded.load(Ordering::Relaxed) != crowded
            && self.last_crowded.swap(crowded, Ordering::Relaxed) != crowded
            && explain::enabled()
        {
            if crowded {
                explain::say("auto", format_args!("dispatch: {blocking} threads blocked at once: the shared queue"));
            } else if blocking < crowd_min(crowd::cpus()) {
                explain::say("auto", format_args!("dispatch: {blocking} thread(s) blocked: direct"));
            } else {
                explain::say(
                    "auto",
                    format_args!(
                        "dispatch: {blocking} threads blocked, but other threads want the CPUs (or no shared queue): direct"
                    ),
                );
            }
        }
    }
}

/// Counts a thread out of [`Auto::blocking`] however it leaves.
struct Blocked<'a>(&'a AtomicUsize);

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Dispatch for Auto {
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        let blocking = self.blocking.fetch_add(1, Ordering::Relaxed) + 1;
        let _blocked = Blocked(&self.blocking);
        // Flushes, trims and durable writes go direct and leave the route as it is.
        if Gather::carries(&request) {
            let gather = joins_crowd(self.rule, blocking, crowd::cpus(), crowd::cpus_wanted)
                .then(|| self.crowd_queue())
                .flatten();
            self.note_route(gather.is_some(), blocking);
            if let Some(gather) = gather {
                // Counted among the waiters while in the crowd, as a policy's waiter is:
                // the crowd's turns on the CPUs are its own, not another program's.
                let _waiting = crowd::Waiting::enter();
                let spin_ns = channel.waiter_spin_ns;
                // SAFETY: forwarded from the caller's contract.
                return unsafe { gather.blocking(channel, request, spin_ns, blocking) };
            }
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { Direct.blocking(channel, request) }
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { Direct.submit(channel, request) }
    }

    fn commit(&self, channel: &mut Channel) -> Result<()> {
        Direct.commit(channel)
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        Direct.reap(channel, min, out)
    }

    fn background_stats(&self) -> PathStats {
        match self.crowd.get() {
            // (Not in a forked child: the parent's threads may have held its lock.)
            Some(Some(crowd)) if crowd.forks == crate::sys::fork_generation() => crowd.gather.stats(),
            _ => PathStats::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_joins_the_crowd_only_beside_another_and_with_the_cpus_free() {
        let free = || false;
        let wanted = || true;
        assert!(!joins_crowd(CrowdRule::Auto, 1, 2, free), "alone: direct");
        assert!(!joins_crowd(CrowdRule::Auto, 4, 2, free), "two per CPU: direct");
        assert!(joins_crowd(CrowdRule::Auto, 5, 2, free));
        assert!(joins_crowd(CrowdRule::Auto, 32, 2, free));
        assert!(!joins_crowd(CrowdRule::Auto, 8, 4, free), "the CPUs count");
        assert!(!joins_crowd(CrowdRule::Auto, 32, 2, wanted), "CPU-bound threads beside: the policy sleeps, direct");
        assert!(joins_crowd(CrowdRule::Always, 32, 2, wanted));
        assert!(joins_crowd(CrowdRule::Always, 2, 2, wanted), "always: from two");
        assert!(!joins_crowd(CrowdRule::Always, 1, 2, free));
        assert!(!joins_crowd(CrowdRule::Off, 32, 2, free));
        // Below the crowd, the run queue is not even read.
        assert!(!joins_crowd(CrowdRule::Auto, 4, 2, || panic!("asked")));
    }

    #[test]
    fn a_forked_child_never_uses_its_parents_shared_queue() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("uring:{}", dir.path().join("fork.img").display());
        let device = crate::device::open_device(&spec, Some(1 << 20)).unwrap();
        let auto = Auto::new(&device, CrowdRule::Always);
        assert!(auto.crowd_queue().is_some(), "a uring device on an O_DIRECT file has a crowd queue");
        // SAFETY: the child only loads atomics and exits.
        match unsafe { libc::fork() } {
            0 => {
                let code = if auto.crowd_queue().is_none() { 0 } else { 1 };
                // SAFETY: ends the child without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            pid => {
                assert!(pid > 0, "fork failed");
                let mut status = 0;
                // SAFETY: waits for our own child.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child saw the parent's queue");
            }
        }
        assert!(auto.crowd_queue().is_some(), "the parent keeps it");
        let emu = crate::device::open_device("null,size=1m", None).unwrap();
        assert!(Auto::new(&emu, CrowdRule::Always).crowd_queue().is_none());
    }
}
