//! Hand-off of requests between threads: [`Waiter`] nodes and [`Doorbell`]s.
//!
//! When a request is carried out by another thread (the STM combiner, the
//! ATM dispatcher), its owner publishes it in a [`Waiter`] that lives in the
//! owner's channel, and waits on the channel's [`Doorbell`]. The thread that
//! completes the request writes the outcome into the waiter, marks it done
//! and rings the owner's doorbell. Waiting spins for a short, configurable
//! time and then sleeps on a futex, so a waiter burns no CPU for long.
//!
//! Memory ordering: the owner writes the request and then publishes the
//! waiter with a release operation (a push onto a [`PendingList`]); the
//! server takes waiters with an acquire operation. The server writes the
//! outcome and then sets `done` with release; the owner reads `done` with
//! acquire before it reads the outcome. The doorbell is a Dekker pair: the
//! ringer stores its condition, fences, then reads `sleepers` (and only then
//! bumps `seq` and wakes); the sleeper reads `seq`, raises `sleepers`, re-reads
//! its condition, then lets the kernel compare `seq`. All sequentially
//! consistent, so at least one of them sees the other: no wake-up is lost.

use super::dispatch::Request;
use crate::clock::now_ns;
use crate::sync::{AtomicBool, AtomicIsize, AtomicPtr, AtomicU32, AtomicU64, Ordering, Parking, fence, yield_now};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::Arc;

/// A channel's wake-up word: rung whenever one of its waiters completes or
/// is asked to take over serving.
#[derive(Debug, Default)]
pub struct Doorbell {
    seq: Parking,
    sleepers: AtomicU32,
    takeover: AtomicBool,
}

impl Doorbell {
    /// Asks the owner to take over the serving role, and wakes it.
    pub fn request_takeover(&self) {
        self.takeover.store(true, Ordering::SeqCst);
        self.ring();
    }

    /// Whether a takeover was asked for (does not clear it).
    pub fn takeover_pending(&self) -> bool {
        self.takeover.load(Ordering::Acquire)
    }

    /// Clears a takeover request; returns whether there was one.
    pub fn clear_takeover(&self) -> bool {
        // Almost never set: look before writing to the shared line.
        self.takeover.load(Ordering::Acquire) && self.takeover.swap(false, Ordering::AcqRel)
    }

    /// Wakes the owner if it sleeps. Whatever the caller stored before this
    /// call (the condition the owner waits for) is visible to the owner when
    /// it wakes or before it decides to sleep.
    pub fn ring(&self) {
        // Orders the caller's stores before the read of `sleepers`; the sleeper
        // publishes `sleepers` before it re-reads its condition. One of the two
        // sees the other, so a ring is never lost, and a ring with no sleeper
        // costs no write to this (shared) cache line.
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            self.seq.fetch_add(1, Ordering::SeqCst);
            self.seq.wake_all();
        }
    }

    /// Waits until `ready()` holds: spins for `spin_ns` (yielding the CPU
    /// between looks), then sleeps until rung
    /// (or until `limit_ns`). Returns whether `ready()` held and how many
    /// times it slept.
    pub fn wait_until(&self, spin_ns: u64, limit_ns: u64, mut ready: impl FnMut() -> bool) -> (bool, u64) {
        if ready() {
            return (true, 0);
        }
        let spin_end = now_ns().saturating_add(spin_ns).min(limit_ns);
        if spin_ns > 0 {
            loop {
                // Give the CPU to a runnable thread (the server, on an overcommitted
                // machine) between looks; costs one cheap system call when there is none.
                yield_now();
                if ready() {
                    return (true, 0);
                }
                if now_ns() >= spin_end {
                    break;
                }
            }
        }
        let mut sleeps = 0;
        loop {
            let seen = self.seq.load(Ordering::SeqCst);
            if ready() {
                return (true, sleeps);
            }
            let now = now_ns();
            if now >= limit_ns {
                return (false, sleeps);
            }
            // Publish that we are about to sleep, then look once more: a ringer that
            // made `ready` true either is seen here or sees us and bumps `seq`, which
            // makes the futex wait return at once.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            // The other half of the ringer's fence: `ready` may read its condition with a
            // weaker ordering (an Acquire load), which without this fence may be satisfied
            // by a value older than the ringer's store while the ringer reads `sleepers`
            // as 0 (found by the loom model `loom_a_takeover_request_always_wakes_its_target`).
            fence(Ordering::SeqCst);
            if !ready() {
                let left = (limit_ns - now).min(1_000_000_000);
                self.seq.wait(seen, Some(left));
                sleeps += 1;
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What the server reports back about a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Bytes moved (>= 0) or a negative errno.
    pub result: i32,
    /// Device time of the command that carried it.
    pub device_ns: u64,
    /// When the request was handed to the device (for merge-wait statistics).
    pub submitted_ns: u64,
    /// When the server completed it (0 unless [`crate::path::timing`] is on):
    /// the owner's wake-up is measured from here.
    pub completed_ns: u64,
}

/// One request handed to another thread. Lives in its owner's channel.
pub struct Waiter {
    next: AtomicPtr<Waiter>,
    done: AtomicBool,
    request: UnsafeCell<Request>,
    outcome: UnsafeCell<Outcome>,
    arrived_ns: AtomicU64,
    doorbell: Arc<Doorbell>,
}

// SAFETY: `request` is written only by the owner before publication and read by
// the server after an acquire; `outcome` is written only by the server before the
// release store of `done` and read by the owner after an acquire load of it.
unsafe impl Sync for Waiter {}
// SAFETY: as above.
unsafe impl Send for Waiter {}

impl Waiter {
    /// A waiter that rings `doorbell` when done.
    pub fn new(doorbell: Arc<Doorbell>) -> Waiter {
        Waiter {
            next: AtomicPtr::new(ptr::null_mut()),
            done: AtomicBool::new(true),
            request: UnsafeCell::new(Request {
                op: crate::device::Op::Read,
                offset: 0,
                buf: ptr::null_mut(),
                len: 0,
                tag: 0,
                durability: crate::device::Durability::Cached,
            }),
            outcome: UnsafeCell::new(Outcome::default()),
            arrived_ns: AtomicU64::new(0),
            doorbell,
        }
    }

    /// Owner: loads a request; the waiter must not be in flight.
    pub fn arm(&self, request: Request) {
        assert!(self.is_done(), "waiter re-armed while in flight");
        // SAFETY: the waiter is done, so no server holds it; only the owner touches it now.
        unsafe { *self.request.get() = request };
        self.arrived_ns.store(now_ns(), Ordering::Relaxed);
        self.done.store(false, Ordering::Relaxed);
    }

    /// Server: the request.
    ///
    /// # Safety
    ///
    /// The caller took this waiter from a [`PendingList`] (or holds the
    /// serving role while it is listed there) and has not completed it: the
    /// owner wrote the request before publishing the waiter and writes it
    /// again only after it is completed.
    pub unsafe fn request(&self) -> Request {
        debug_assert!(!self.is_done(), "request of a waiter that is not in flight");
        // SAFETY: the caller's contract: published before the acquire that handed the
        // waiter over, and not rewritten until it is completed.
        unsafe { *self.request.get() }
    }

    /// Owner: the request it armed (valid at any time on the owner's thread).
    pub fn request_as_owner(&self) -> Request {
        // SAFETY: only the owner writes the request, and the owner is the caller.
        unsafe { *self.request.get() }
    }

    /// When the owner armed it.
    pub fn arrived_ns(&self) -> u64 {
        self.arrived_ns.load(Ordering::Relaxed)
    }

    /// Whether the server has completed it.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Owner: the outcome, once done.
    pub fn outcome(&self) -> Outcome {
        assert!(self.is_done(), "outcome read before completion");
        // SAFETY: written before the release store of `done` that we acquired.
        unsafe { *self.outcome.get() }
    }

    /// Server: records the outcome, marks the waiter done and rings its owner.
    ///
    /// # Safety
    ///
    /// The caller took this waiter from a [`PendingList`] and completes it
    /// once; it must not touch the waiter afterwards (its owner may re-arm
    /// or free it the moment it sees `done`).
    pub unsafe fn complete(&self, outcome: Outcome) {
        debug_assert!(!self.is_done(), "waiter completed twice");
        // SAFETY: the caller's contract: only the thread that took this waiter writes the
        // outcome, once, before the release store of `done`.
        unsafe { *self.outcome.get() = outcome };
        let doorbell = Arc::clone(&self.doorbell);
        self.done.store(true, Ordering::Release);
        // The owner may return and re-arm (or drop) the waiter from here on; the doorbell
        // is kept alive by our own reference.
        doorbell.ring();
    }

    /// Server: like [`Waiter::complete`], but when the waiter belongs to the
    /// completing thread itself (`completer` is the address of its owner's
    /// doorbell; only compared, never dereferenced) there is nobody to wake,
    /// so the doorbell is left alone.
    ///
    /// # Safety
    ///
    /// As [`Waiter::complete`].
    pub unsafe fn complete_by(&self, outcome: Outcome, completer: *const Doorbell) {
        if std::ptr::eq(Arc::as_ptr(&self.doorbell), completer) {
            debug_assert!(!self.is_done(), "waiter completed twice");
            // SAFETY: as in `complete`; the owner is the caller, so nobody else reads it now.
            unsafe { *self.outcome.get() = outcome };
            self.done.store(true, Ordering::Release);
        } else {
            // SAFETY: forwarded from the caller's contract.
            unsafe { self.complete(outcome) };
        }
    }

    /// Server, holding the serving role: the owner's doorbell, to ask it to
    /// take over once the role is released.
    pub fn owner_doorbell(&self) -> Arc<Doorbell> {
        Arc::clone(&self.doorbell)
    }
}

/// A waiter taken from a [`PendingList`] and not yet completed: the right
/// to read its request and to complete it, once. Only
/// [`PendingList::take_all`] makes one (a taken waiter is the taker's
/// alone), and completing consumes it, so the type system holds the rules
/// the server relies on: a request read after it was published, and
/// completed exactly once. The waiter itself is alive until then: its owner
/// promised that when it pushed it ([`PendingList::push`]).
pub struct Taken(std::ptr::NonNull<Waiter>);

// SAFETY: a waiter is Sync (its fields are atomics and cells handed over with
// acquire/release), so the right to touch it may move to another thread.
unsafe impl Send for Taken {}

impl Taken {
    fn waiter(&self) -> &Waiter {
        // SAFETY: alive until completed (the pusher's promise), and completing consumes `self`.
        unsafe { self.0.as_ref() }
    }

    /// The request.
    pub fn request(&self) -> Request {
        // SAFETY: taken from the list (published with release, taken with acquire) and
        // not completed, so the owner does not write the request now.
        unsafe { self.waiter().request() }
    }

    /// When the owner armed it.
    pub fn arrived_ns(&self) -> u64 {
        self.waiter().arrived_ns()
    }

    /// The owner's doorbell, to ask it to take the serving role over.
    pub fn owner_doorbell(&self) -> Arc<Doorbell> {
        self.waiter().owner_doorbell()
    }

    /// Records the outcome and wakes the owner ([`Waiter::complete`]).
    pub fn complete(self, outcome: Outcome) {
        // SAFETY: taken and not completed; `self` is consumed, so this happens once.
        unsafe { self.waiter().complete(outcome) }
    }

    /// [`Waiter::complete_by`]: no wake-up when `completer` is the owner's doorbell.
    pub fn complete_by(self, outcome: Outcome, completer: *const Doorbell) {
        // SAFETY: as in `complete`.
        unsafe { self.waiter().complete_by(outcome, completer) }
    }
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Taken({:p})", self.0)
    }
}

/// A lock-free list of pending waiters: many threads push, one server takes
/// them all at once with a single swap (the seed's queue swap without a lock).
#[derive(Debug, Default)]
pub struct PendingList {
    head: AtomicPtr<Waiter>,
    /// Counted before a waiter is linked: it may run ahead of the list by the
    /// pushes under way, never behind. (Signed, defensively.)
    count: AtomicIsize,
    first_arrival_ns: AtomicU64,
}

// SAFETY: the list only stores pointers to waiters whose owners keep them alive
// until they are completed (see `Channel`'s drop).
unsafe impl Send for PendingList {}
// SAFETY: as above.
unsafe impl Sync for PendingList {}

impl PendingList {
    /// Publishes an armed waiter.
    ///
    /// # Safety
    ///
    /// The waiter must stay alive and unmoved until it is completed.
    pub unsafe fn push(&self, waiter: &Waiter) {
        // Counted (and, first in, its arrival time stored) before it is linked: a
        // dispatcher that sees it in the list also sees when the oldest pending request
        // arrived. (Stored after, a dispatcher in between read the previous batch's
        // time, found the unplug timer long expired and sent the lone request at once.)
        if self.count.fetch_add(1, Ordering::AcqRel) <= 0 {
            self.first_arrival_ns.store(waiter.arrived_ns(), Ordering::Release);
        }
        let node = waiter as *const Waiter as *mut Waiter;
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            waiter.next.store(head, Ordering::Relaxed);
            match self.head.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire).is_null()
    }

    /// Waiters pending (may count a push a moment before its waiter is in the list).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire).max(0) as usize
    }

    /// When the oldest pending waiter arrived (0 if none).
    pub fn first_arrival_ns(&self) -> u64 {
        if self.is_empty() { 0 } else { self.first_arrival_ns.load(Ordering::Acquire) }
    }

    /// The most recently pushed waiter, if any.
    ///
    /// # Safety
    ///
    /// The caller holds the serving role of this list (the only right to
    /// take, and so complete, its waiters) and drops the reference before it
    /// lets the role go: a waiter is alive until it is completed.
    pub unsafe fn peek(&self) -> Option<&Waiter> {
        let head = self.head.load(Ordering::Acquire);
        // SAFETY: the caller's contract: pending waiters are alive until completed, and
        // only the holder of the role (the caller) takes and completes them.
        unsafe { head.as_ref() }
    }

    /// Every pending waiter, newest first.
    ///
    /// # Safety
    ///
    /// As [`PendingList::peek`], for every waiter the iterator yields.
    pub unsafe fn iter_held(&self) -> impl Iterator<Item = &Waiter> {
        // SAFETY: as in `peek`: only the holder of the role takes (and so unlinks) nodes,
        // and a pending waiter is alive until completed; pushes only add a new head.
        let head = unsafe { self.head.load(Ordering::Acquire).as_ref() };
        std::iter::successors(head, |w| {
            // SAFETY: `w` is pending (see above), so its `next` is a pending waiter or null.
            unsafe { w.next.load(Ordering::Relaxed).as_ref() }
        })
    }

    /// Takes every pending waiter, oldest first, appending them to `out`.
    pub fn take_all(&self, out: &mut Vec<Taken>) -> usize {
        let mut node = self.head.swap(ptr::null_mut(), Ordering::Acquire);
        let start = out.len();
        while let Some(taken) = std::ptr::NonNull::new(node) {
            // SAFETY: the node was published by `push` and stays alive until completed;
            // the swap above made this thread the only one that holds it.
            node = unsafe { taken.as_ref() }.next.load(Ordering::Relaxed);
            out.push(Taken(taken));
        }
        let taken = out.len() - start;
        self.count.fetch_sub(taken as isize, Ordering::AcqRel);
        out[start..].reverse();
        taken
    }
}

/// A 512-byte read at `offset`, tagged with it (the tests' request).
#[cfg(test)]
fn req(offset: u64) -> Request {
    Request {
        op: crate::device::Op::Read,
        offset,
        buf: ptr::null_mut(),
        len: 512,
        tag: offset,
        durability: crate::device::Durability::Cached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_list_hands_every_waiter_to_exactly_one_taker() {
        let doorbell = Arc::new(Doorbell::default());
        let waiters: Vec<Waiter> = (0..4000).map(|_| Waiter::new(Arc::clone(&doorbell))).collect();
        let list = PendingList::default();
        let taken = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4 {
                let (waiters, list) = (&waiters, &list);
                s.spawn(move || {
                    for (i, w) in waiters.iter().enumerate().skip(t).step_by(4) {
                        w.arm(req(i as u64));
                        // SAFETY: the waiters outlive the scope.
                        unsafe { list.push(w) };
                    }
                });
            }
            s.spawn(|| {
                let mut mine = Vec::new();
                for _ in 0..10_000 {
                    list.take_all(&mut mine);
                }
                taken.lock().unwrap().extend(mine.into_iter().map(|t| t.0.as_ptr() as usize));
            });
        });
        let mut all = taken.into_inner().unwrap();
        let mut rest = Vec::new();
        list.take_all(&mut rest);
        all.extend(rest.into_iter().map(|t| t.0.as_ptr() as usize));
        all.sort();
        let before = all.len();
        all.dedup();
        assert_eq!(before, all.len(), "a waiter was taken twice");
        assert_eq!(all.len(), 4000, "a waiter was lost");
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn a_completed_waiter_wakes_its_sleeping_owner() {
        let doorbell = Arc::new(Doorbell::default());
        let waiter = Arc::new(Waiter::new(Arc::clone(&doorbell)));
        for round in 0..200u64 {
            waiter.arm(req(round));
            let w = Arc::clone(&waiter);
            let server = std::thread::spawn(move || {
                if round % 2 == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                // SAFETY: this thread stands in for the server that took the waiter.
                unsafe { w.complete(Outcome { result: 512, device_ns: round, submitted_ns: 0, completed_ns: 0 }) };
            });
            let (ok, _) = doorbell.wait_until(0, u64::MAX, || waiter.is_done());
            assert!(ok);
            assert_eq!(waiter.outcome().device_ns, round);
            server.join().unwrap();
        }
    }
}

/// Model checks (`RUSTFLAGS="--cfg loom" cargo test --release --lib loom`):
/// every interleaving of the list and the doorbell, up to a preemption bound.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    #[test]
    fn loom_pending_list_hands_every_waiter_to_exactly_one_taker() {
        model(|| {
            let doorbell = Arc::new(Doorbell::default());
            let waiters: Arc<Vec<Waiter>> = Arc::new((0..3).map(|_| Waiter::new(Arc::clone(&doorbell))).collect());
            let list = Arc::new(PendingList::default());
            let pushers: Vec<_> = [vec![0usize, 1], vec![2]]
                .into_iter()
                .map(|mine| {
                    let (waiters, list) = (Arc::clone(&waiters), Arc::clone(&list));
                    loom::thread::spawn(move || {
                        for i in mine {
                            waiters[i].arm(req(i as u64));
                            // SAFETY: the waiters outlive the model run (held by the Arc).
                            unsafe { list.push(&waiters[i]) };
                        }
                    })
                })
                .collect();
            let mut taken = Vec::new();
            list.take_all(&mut taken);
            for p in pushers {
                p.join().unwrap();
            }
            list.take_all(&mut taken);
            let mut offsets: Vec<u64> = taken.iter().map(|t| t.request().offset).collect();
            offsets.sort();
            assert_eq!(offsets, vec![0, 1, 2], "every waiter taken exactly once");
            assert_eq!(list.len(), 0);
            assert!(list.is_empty());
        });
    }

    #[test]
    fn loom_a_completion_always_wakes_a_sleeping_owner() {
        model(|| {
            let doorbell = Arc::new(Doorbell::default());
            let waiter = Arc::new(Waiter::new(Arc::clone(&doorbell)));
            let list = Arc::new(PendingList::default());
            waiter.arm(req(7));
            // SAFETY: the waiter outlives the model run (held by the Arc).
            unsafe { list.push(&waiter) };
            let server = {
                let list = Arc::clone(&list);
                loom::thread::spawn(move || {
                    let mut taken = Vec::new();
                    list.take_all(&mut taken);
                    for t in taken {
                        t.complete(Outcome { result: 512, device_ns: 1, submitted_ns: 0, completed_ns: 0 });
                    }
                })
            };
            // The owner waits without spinning: a lost wake-up would sleep forever,
            // which loom reports as a deadlock.
            let (done, _) = doorbell.wait_until(0, u64::MAX, || waiter.is_done());
            assert!(done);
            assert_eq!(waiter.outcome().result, 512);
            server.join().unwrap();
        });
    }

    #[test]
    fn loom_a_takeover_request_always_wakes_its_target() {
        model(|| {
            let doorbell = Arc::new(Doorbell::default());
            let asker = {
                let doorbell = Arc::clone(&doorbell);
                loom::thread::spawn(move || doorbell.request_takeover())
            };
            let (asked, _) = doorbell.wait_until(0, u64::MAX, || doorbell.takeover_pending());
            assert!(asked && doorbell.clear_takeover());
            asker.join().unwrap();
        });
    }
}
