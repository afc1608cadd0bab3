//! The crowd's queue: threads blocked at once send each other's requests
//! through one Linux AIO context and complete each other's ([`SharedAio`]).
//! Used by the `auto` dispatch (see `auto.rs` for when).
//!
//! One request's way, on its owner's thread: it is written as an `iocb`
//! whose word is the address of a [`Slot`] on the owner's stack, and pushed
//! onto the pending batch (sent at once if the kernel has nothing of this
//! context's). Then, until the slot says done, the owner loops: take any
//! completions from the ring (two loads when there are none; the first
//! thread to find some moves the head and hands each to its owner's slot),
//! send the pending batch if it is due ([`due_at`]: it holds half the
//! crowd, or its oldest has waited 40 us, or the kernel holds nothing), and
//! yield the CPU. There is no serving role to win or hand
//! on, no lock held while waiting, and a look costs no system call: with 16
//! or 32 blocked threads on 2 CPUs, every thread the scheduler runs moves
//! everyone's requests along.
//!
//! After the waiter spin (1 ms by default) without its completion a thread
//! stops yielding and sleeps. First it sends whatever is pending (nobody may
//! be left to send it). Then, if no other thread is taking events, it sleeps
//! in `io_getevents` for the next one and hands over what comes; else it
//! sleeps on its slot, woken by whoever completes it, and looks again after
//! at most a millisecond (so a crowd that all fell asleep still has one
//! thread in the kernel's wait within that time). Nothing is lost: a request
//! leaves the pending batch only into the kernel or completed with the error
//! the kernel gave for it, and its owner returns only once its slot is done.

use super::Request;
use super::serve::GATHER_NS;
use crate::clock::now_ns;
use crate::device::Op;
use crate::device::aio::{Iocb, SharedAio};
use crate::error::Result;
use crate::path::PathStats;
use crate::path::channel::{Channel, Completed, segment_bucket};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// A slot's request is still out.
const WAITING: u32 = 0;
/// Its result is written.
const DONE: u32 = 1;
/// Its owner sleeps on it (futex) and must be woken.
const SLEEPING: u32 = 2;
/// Longest a sleeping owner waits before it looks again itself.
const SLEEP_NS: u64 = 1_000_000;
/// Looks between two readings of the clock for the waiter spin.
const LOOKS_PER_CLOCK: u32 = 8;

/// When a pending batch of `pending` requests (the oldest arrived at
/// `first_ns`) is due, with `in_kernel` requests of the context in the
/// kernel and a crowd of `crowd` blocked threads: at once (0) when the
/// kernel holds none, or the batch holds half the crowd (most of the other
/// half is in the kernel); else once the oldest has waited [`GATHER_NS`].
/// Larger batches cost fewer submissions and let the loop device's worker
/// serve more in one pass: with 32 threads on 2 vCPUs, half the crowd made
/// 124-155K IOPS (7-11 requests per submission) where "as many as the
/// kernel holds" made 105-125K (3.6-4.8), fio's psync 95-102K (4 alternated
/// rounds); at 16 threads the two were within the rounds' noise.
pub fn due_at(pending: usize, in_kernel: usize, crowd: usize, first_ns: u64) -> u64 {
    if in_kernel == 0 || pending >= (crowd / 2).max(1) {
        return 0;
    }
    first_ns.saturating_add(GATHER_NS)
}

/// Where one request's result is handed to its owner: on the owner's stack
/// for the request's life (the owner returns only once it is done).
struct Slot {
    state: AtomicU32,
    result: AtomicI64,
}

/// The batch not yet sent, and what the sends so far amount to.
struct Pending {
    requests: Vec<Iocb>,
    /// When each of `requests` arrived (monotonic ns).
    arrived: Vec<u64>,
    /// The sends, as a merging path's counters: one command per `io_submit`.
    stats: PathStats,
}

/// The crowd's queue on one file.
pub(crate) struct Gather {
    aio: Arc<SharedAio>,
    pending: Mutex<Pending>,
}

/// Hands `result` (bytes or -errno) to the owner of the slot at `word`.
///
/// # Safety
///
/// `word` is the address of a live [`Slot`] whose request this is, handed
/// over exactly once.
unsafe fn complete(word: u64, result: i64) {
    let slot = word as *const Slot;
    // SAFETY: the owner waits for its slot until `state` says done; nothing of it is
    // touched after that store but the futex word's address, which the kernel only
    // uses as a key (a wake-up at an address reused since is one the waiters there
    // tolerate as spurious).
    unsafe {
        let futex = (*slot).state.as_ptr();
        (*slot).result.store(result, Ordering::Relaxed);
        if (*slot).state.swap(DONE, Ordering::Release) == SLEEPING {
            libc::syscall(libc::SYS_futex, futex, libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
        }
    }
}

impl Gather {
    /// The crowd's queue on `aio`.
    pub(crate) fn new(aio: Arc<SharedAio>) -> Gather {
        Gather {
            aio,
            pending: Mutex::new(Pending { requests: Vec::new(), arrived: Vec::new(), stats: PathStats::default() }),
        }
    }

    /// Whether this queue carries `request` (reads and plain writes; the
    /// rest goes direct).
    pub(crate) fn carries(request: &Request) -> bool {
        match request.op {
            Op::Read => true,
            Op::Write => request.durability == crate::device::Durability::Cached,
            Op::Flush | Op::Trim => false,
        }
    }

    /// The pending batch, yielding the CPU while another thread holds it:
    /// a holder that lost its CPU gets it back sooner than a sleeper would
    /// be woken.
    fn lock_pending(&self) -> MutexGuard<'_, Pending> {
        loop {
            match self.pending.try_lock() {
                Ok(pending) => return pending,
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
    }

    /// Carries out one blocking request through the shared context and
    /// returns once it is complete; `spin_ns` is how long the owner yields
    /// before it sleeps, `crowd` how many threads were blocked when it came.
    ///
    /// # Safety
    ///
    /// `request.buf` is valid for `request.len` bytes (writable for a read)
    /// until this returns.
    pub(crate) unsafe fn blocking(
        &self,
        channel: &mut Channel,
        request: Request,
        spin_ns: u64,
        crowd: usize,
    ) -> Result<Completed> {
        // SAFETY: forwarded from the caller's contract.
        let (raw, looks, sleeps) = unsafe { self.carry(&request, spin_ns, crowd) };
        Ok(channel.finish_carried(&request, i32::try_from(raw).unwrap_or(-libc::EIO), looks, sleeps))
    }

    /// [`Gather::blocking`] without a channel: the request's result (bytes
    /// or -errno), and the looks and sleeps its wait took.
    ///
    /// # Safety
    ///
    /// As for `blocking`.
    unsafe fn carry(&self, request: &Request, spin_ns: u64, crowd: usize) -> (i64, u64, u64) {
        debug_assert!(Self::carries(request), "{:?} is not the crowd's", request.op);
        let slot = Slot { state: AtomicU32::new(WAITING), result: AtomicI64::new(0) };
        let word = &slot as *const Slot as u64;
        let iocb = self.aio.request(request.op == Op::Write, request.offset, request.buf, request.len, word);
        let arrived = now_ns();
        {
            let mut pending = self.lock_pending();
            pending.requests.push(iocb);
            pending.arrived.push(arrived);
            if self.aio.in_kernel() == 0 {
                self.send(&mut pending, arrived);
            }
        }
        let _wait = WaitOnUnwind { gather: self, slot: &slot };
        let (mut looks, mut sleeps) = (0u64, 0u64);
        let give_up = arrived.saturating_add(spin_ns);
        let mut since_clock = 0;
        while slot.state.load(Ordering::Acquire) != DONE {
            looks += 1;
            // SAFETY: every word in this context's events is a live slot's.
            self.aio.reap(|w, r| unsafe { complete(w, r) });
            if slot.state.load(Ordering::Acquire) == DONE {
                break;
            }
            self.send_if_due(crowd);
            since_clock += 1;
            if since_clock >= LOOKS_PER_CLOCK || spin_ns == 0 {
                since_clock = 0;
                if now_ns() >= give_up {
                    sleeps += 1;
                    self.sleep(&slot);
                    continue;
                }
            }
            std::thread::yield_now();
        }
        (slot.result.load(Ordering::Relaxed), looks, sleeps)
    }

    /// Sends the pending batch if it is due ([`due_at`]) and nobody else is
    /// at it; `crowd` is how many threads were blocked when the caller's
    /// request came.
    fn send_if_due(&self, crowd: usize) {
        let Ok(mut pending) = self.pending.try_lock() else { return };
        let Some(&first) = pending.arrived.first() else { return };
        let at = due_at(pending.requests.len(), self.aio.in_kernel(), crowd, first);
        let now = if at == 0 { 0 } else { now_ns() };
        if now >= at {
            self.send(&mut pending, now);
        }
    }

    /// Sends the pending batch, as much as the context has room for; a
    /// request the kernel refuses is completed with its error.
    fn send(&self, pending: &mut Pending, now: u64) {
        let now = if now == 0 { now_ns() } else { now };
        let mut from = 0;
        let mut retried = false;
        while from < pending.requests.len() {
            // SAFETY: each request's owner waits for its slot, keeping its buffer.
            match unsafe { self.aio.submit(&pending.requests[from..]) } {
                Ok(n) => {
                    let stats = &mut pending.stats;
                    stats.commands += 1;
                    stats.segments += n as u64;
                    stats.segments_hist[segment_bucket(n)] += 1;
                    stats.merged_requests += n as u64;
                    stats.merge_wait_ns +=
                        pending.arrived[from..from + n].iter().map(|a| now.saturating_sub(*a)).sum::<u64>();
                    from += n;
                }
                // No room: what the kernel holds makes it, and the rest goes with a later look.
                Err(libc::EAGAIN) if self.aio.in_kernel() > 0 => break,
                // Another thread took the last events between the refusal and the look at
                // `in_kernel`: there is room now. Only a second refusal with nothing in the
                // kernel (a context too small for one request) fails the request.
                Err(libc::EAGAIN) if !retried => retried = true,
                Err(errno) => {
                    pending.stats.queue_errors += 1;
                    // SAFETY: the request's slot is live (its owner waits for it).
                    unsafe { complete(pending.requests[from].data(), -i64::from(errno)) };
                    from += 1;
                }
            }
        }
        pending.requests.drain(..from);
        pending.arrived.drain(..from);
    }

    /// Sleeps until `slot` may be done (see the module comment).
    fn sleep(&self, slot: &Slot) {
        {
            let mut pending = self.lock_pending();
            if !pending.requests.is_empty() {
                self.send(&mut pending, 0);
            }
        }
        if slot.state.load(Ordering::Acquire) == DONE {
            return;
        }
        // SAFETY: as in `carry`.
        if self.aio.sleep(SLEEP_NS, |w, r| unsafe { complete(w, r) }).is_some() {
            return;
        }
        if slot.state.compare_exchange(WAITING, SLEEPING, Ordering::Acquire, Ordering::Acquire).is_ok() {
            crate::sys::futex_wait(&slot.state, SLEEPING, Some(SLEEP_NS));
            // Back to looking: whoever completes it sees WAITING or DONE.
            let _ = slot.state.compare_exchange(SLEEPING, WAITING, Ordering::Acquire, Ordering::Acquire);
        }
    }

    /// The sends so far, as a merging path's counters.
    pub(crate) fn stats(&self) -> PathStats {
        self.lock_pending().stats
    }
}

/// If the owner's thread unwinds while its request is out (a bug), waits for
/// the request first: the slot and the buffer must outlive it.
struct WaitOnUnwind<'a> {
    gather: &'a Gather,
    slot: &'a Slot,
}

impl Drop for WaitOnUnwind<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        while self.slot.state.load(Ordering::Acquire) != DONE {
            self.gather.sleep(self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::Durability;
    use crate::device::target::{Target, TargetConfig};
    use crate::path::dispatch::BLOCKING_TAG;

    fn request(op: Op, offset: u64, buf: *mut u8, len: u32) -> Request {
        Request { op, offset, buf, len, tag: BLOCKING_TAG, durability: Durability::Cached }
    }

    /// 16 threads at once through one context, every byte checked; among
    /// them requests the kernel fails (a buffer at an unmapped address) and
    /// reads past the end of the file: each gets its own result, and every
    /// other request in the same batches completes.
    /// A crowd's queue on a new file in `dir`.
    fn gather_on(dir: &tempfile::TempDir) -> Gather {
        let config = TargetConfig {
            path: dir.path().join("g.img"),
            direct: true,
            size: Some(1 << 20),
            read_only: false,
            guard: Default::default(),
        };
        Gather::new(Arc::new(SharedAio::on(Target::open(&config).unwrap()).unwrap()))
    }

    #[test]
    fn a_crowd_loses_no_request_and_a_failed_one_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let gather = gather_on(&dir);
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let gather = &gather;
                s.spawn(move || {
                    let mut buf = IoBuf::new(8192);
                    for round in 0..200u64 {
                        let offset = (t * 16 + round % 16) * 4096;
                        let fill = (t * 31 + round) as u8;
                        buf[..4096].fill(fill);
                        // SAFETY: the buffer outlives each call.
                        let (raw, _, _) =
                            unsafe { gather.carry(&request(Op::Write, offset, buf.as_mut_ptr(), 4096), 1_000_000, 16) };
                        assert_eq!(raw, 4096, "thread {t} round {round}: write");
                        buf[..4096].fill(0);
                        // SAFETY: the buffer outlives the call.
                        let (raw, _, _) =
                            unsafe { gather.carry(&request(Op::Read, offset, buf.as_mut_ptr(), 4096), 1_000_000, 16) };
                        assert_eq!(raw, 4096, "thread {t} round {round}: read");
                        assert!(buf[..4096].iter().all(|&b| b == fill), "thread {t} round {round}: bytes");
                        if round % 10 == t % 10 {
                            // A buffer in the page no process maps (below mmap_min_addr):
                            // the kernel fails the read, writing nothing.
                            let unmapped = 0x1000 as *mut u8;
                            // SAFETY: the kernel only finds the address unmapped.
                            let (raw, _, _) =
                                unsafe { gather.carry(&request(Op::Read, offset, unmapped, 4096), 1_000_000, 16) };
                            assert_eq!(raw, -i64::from(libc::EFAULT), "thread {t} round {round}: bad buffer");
                            // Past the end: nothing to read.
                            // SAFETY: the buffer outlives the call.
                            let (raw, _, _) = unsafe {
                                gather.carry(&request(Op::Read, 1 << 20, buf.as_mut_ptr(), 4096), 1_000_000, 16)
                            };
                            assert_eq!(raw, 0, "thread {t} round {round}: past the end");
                        }
                    }
                });
            }
        });
        let stats = gather.stats();
        assert_eq!(stats.merged_requests, 16 * (400 + 40), "every request sent once");
        assert!(stats.commands < stats.merged_requests, "batches of more than one: {stats:?}");
    }

    #[test]
    fn a_batch_goes_at_once_to_an_idle_kernel_or_at_half_the_crowd_else_after_40_us() {
        assert_eq!(due_at(1, 0, 32, 1_000), 0, "nothing in the kernel: at once");
        assert_eq!(due_at(16, 10, 32, 1_000), 0, "half the crowd");
        assert_eq!(due_at(15, 10, 32, 1_000), 1_000 + GATHER_NS);
        assert_eq!(due_at(1, 1, 2, 1_000), 0, "two threads take turns: never held");
        assert_eq!(due_at(1, 1, 3, 1_000), 0);
        assert_eq!(due_at(1, 3, 4, 1_000), 1_000 + GATHER_NS, "four: held for a second request");
        assert_eq!(due_at(1, 5, 1, 1_000), 0, "a crowd of one never waits");
    }

    /// Threads that give up yielding at once: every wait goes to sleep, in
    /// the kernel's wait for the context's next event or on its own slot,
    /// and every request still comes back with its bytes.
    #[test]
    fn sleeping_waiters_are_woken_by_whoever_takes_their_event() {
        let dir = tempfile::tempdir().unwrap();
        let gather = gather_on(&dir);
        let sleeps = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (gather, sleeps) = (&gather, &sleeps);
                s.spawn(move || {
                    let mut buf = IoBuf::new(4096);
                    for round in 0..100u64 {
                        let offset = (t * 8 + round % 8) * 4096;
                        let fill = (t * 7 + round) as u8;
                        buf.fill(fill);
                        // SAFETY: the buffer outlives each call.
                        let (raw, _, slept) =
                            unsafe { gather.carry(&request(Op::Write, offset, buf.as_mut_ptr(), 4096), 0, 8) };
                        assert_eq!(raw, 4096);
                        buf.fill(0);
                        // SAFETY: the buffer outlives the call.
                        let (raw, _, more) =
                            unsafe { gather.carry(&request(Op::Read, offset, buf.as_mut_ptr(), 4096), 0, 8) };
                        assert_eq!(raw, 4096);
                        assert!(buf.iter().all(|&b| b == fill), "thread {t} round {round}");
                        sleeps.fetch_add(slept + more, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(gather.stats().merged_requests, 1600);
        // (Every wait that did not find its request done at the first look slept; on a
        // file whose AIO completes inside io_submit, as tmpfs's does, none had to.)
        eprintln!("{} of 1600 waits slept", sleeps.load(Ordering::Relaxed));
    }
}
