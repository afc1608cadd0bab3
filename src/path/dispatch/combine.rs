//! `combine`: synchronous temporal merge (seed 000 §4.4, STM).
//!
//! A thread with a request publishes it and tries to win the serving role
//! with one atomic operation (a `try_lock`). The role owns the merging state
//! and a device queue of its own, so whoever holds it can send batches and
//! pick up what others sent. The holder takes every pending request, its own
//! and the other threads', sends them as one merged command (per direction,
//! up to the device's segment limit), completes each request when the
//! command is back and wakes its owner. There are no timers and no plugging:
//! the batching window is simply whatever arrives while the previous command
//! is in service.
//!
//! Who polls. A lone thread (nobody else spinning) serves as the seed's
//! winner does: it sends and waits through the completion policy until its
//! own request is done. Otherwise threads spin for `waiter_spin`, yielding
//! the CPU between looks at their own request, and then sleep. With
//! [`CombinePolling::Shared`](crate::path::CombinePolling) (the default)
//! every spinning thread that finds the role free takes one non-blocking
//! step (`Combine::step`): picks up finished commands, sends the next batch
//! if it is due, completes what finished, and lets go. The device is polled
//! by whichever waiting thread the scheduler runs, and no thread spins on it
//! alone while the others wait for a CPU: on 2 vCPUs with 16 threads this
//! took STM from 0.90 to 0.96 of the DRAM-SSD's peak. When other programs
//! hold the CPUs, yields give the CPU away for whole time slices and
//! spinners serve as winners for a while (`YieldWindow`).
//!
//! Nothing is stranded. Every holder that does not keep polling lets the
//! role go through `Combine::hand_off`: if requests are pending, in the
//! backlog or in the device, the owner of one of them is asked to take over
//! and woken. So a thread that finds the role taken may sleep. Spinners
//! taking steps do not hand off (they are the polling); the last one to
//! leave does, if the steps left work behind. A serving thread keeps serving
//! up to `combine_budget` batches after its own request is done (so its
//! caller is not held hostage under sustained load), then hands off. With
//! `pipeline` > 1 the next batch is sent while the previous one is still in
//! service, and always before the owners of a finished batch are woken, so
//! the device does not idle while wake-ups are paid. Where the device tells
//! when its current command will complete (the emulator does), the next
//! batch is sent just before that moment ([`Server::send_time`]), so it holds
//! everything that arrived meanwhile. Where it cannot (a kernel device), a
//! batch is held while the device is busy until it is as large as what the
//! device holds, or for at most 40 us ([`Server::gather_time`]).

use super::serve::{MergeMode, Server, queue_depth_for};
use super::{Dispatch, Request};
use crate::clock::now_ns;
use crate::device::{Device, QueueConfig as DeviceQueueConfig};
use crate::error::Result;
use crate::path::PathStats;
use crate::path::channel::{Channel, Completed};
use crate::path::completion::CompletionKind;
use crate::path::waiter::{Doorbell, PendingList};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, fence, yield_now};
use std::cell::Cell;
use std::sync::{Arc, TryLockError};

/// Knobs of the combining strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineConfig {
    /// Batches a winner may still send after its own request is done.
    pub budget: u32,
    /// Commands a winner keeps in the device at once.
    pub pipeline: usize,
    /// Most segments per command.
    pub max_segments: usize,
    /// Whether spinning waiters share the polling (see the module comment).
    pub rove: bool,
}

/// What the serving role owns: the merging state and the device queue the
/// merged commands go to. Whoever holds the role uses them.
struct Role {
    server: Server,
    channel: Channel,
}

/// Why a serving thread gave the role up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// Nothing of its own is left to wait for, or its budget is spent.
    Finished,
    /// Other spinning threads are there to poll the device.
    Roving,
}

/// The combining strategy.
pub struct Combine {
    pending: PendingList,
    role: Mutex<Role>,
    config: CombineConfig,
    /// Threads in the roving spin phase.
    spinners: AtomicUsize,
    /// Set (under the role) by a roving step that left work behind without
    /// handing it on; cleared by a hand-off. The last spinner out hands on
    /// only then, so a lone thread pays nothing for roving.
    roved: AtomicBool,
    /// Until when spinners serve as winners (see [`YieldWindow`]).
    contended_until: AtomicU64,
}

/// A yield longer than this gave the CPU to another program for a time
/// slice: a round of our own spinners takes tens of microseconds.
const LONG_YIELD_NS: u64 = 1_000_000;
/// Yields a spinner judges at a time.
const YIELD_WINDOW: u32 = 64;
/// Long yields in one window that mean the CPUs are contended.
const LONG_YIELDS_CONTENDED: u32 = 4;
/// How long spinners serve as winners once contention is seen; then shared
/// polling is tried again.
const CONTENDED_HOLD_NS: u64 = 100_000_000;

/// One thread's recent yields in shared polling. When other programs keep
/// every CPU busy, each yield may hand the CPU to one of them for a whole
/// time slice, and polling that waits for a spinner to be scheduled leaves
/// the device idle (measured, 16 threads on the DRAM-SSD with 2 CPU hogs:
/// 37% of yields took 1-8 ms and shared polling fell to 6K IOPS against a
/// winner's 70K). Without other programs 0.006% of yields take over 1 ms;
/// with one hog 0.4% do, and shared polling still beats a winner
/// (167K against 130K IOPS), so only a run of long yields counts.
#[derive(Default)]
struct YieldWindow {
    yields: Cell<u32>,
    long: Cell<u32>,
}

impl YieldWindow {
    /// Records one yield; returns whether its window shows contention.
    fn contended_after(&self, took_ns: u64) -> bool {
        let long = self.long.get() + u32::from(took_ns > LONG_YIELD_NS);
        let yields = self.yields.get() + 1;
        let contended = long >= LONG_YIELDS_CONTENDED;
        if contended || yields >= YIELD_WINDOW {
            self.yields.set(0);
            self.long.set(0);
        } else {
            self.yields.set(yields);
            self.long.set(long);
        }
        contended
    }
}

thread_local! {
    static YIELDS: YieldWindow = YieldWindow::default();
}

impl Combine {
    /// A combining strategy on `device`, waiting for merged commands with
    /// `completion`; `timeout_ns` as for a channel.
    pub fn new(
        config: CombineConfig,
        device: &Arc<dyn Device>,
        completion: CompletionKind,
        timeout_ns: u64,
    ) -> Result<Combine> {
        let depth = (queue_depth_for(config.pipeline) as u32).min(device.capabilities().queue_depth);
        let queue = device.open_queue(&DeviceQueueConfig {
            polled: completion != CompletionKind::Interrupt,
            shared: true,
            ..DeviceQueueConfig::depth(depth)
        })?;
        let channel = Channel::new(queue, completion, 0, depth as usize, timeout_ns);
        let server = Server::new(MergeMode::Temporal, config.max_segments, channel.queue_depth().saturating_sub(1));
        Ok(Combine {
            pending: PendingList::default(),
            role: Mutex::new(Role { server, channel }),
            config,
            spinners: AtomicUsize::new(0),
            roved: AtomicBool::new(false),
            contended_until: AtomicU64::new(0),
        })
    }

    /// The serving role, if nobody holds it.
    fn try_role(&self) -> Option<MutexGuard<'_, Role>> {
        match self.role.try_lock() {
            Ok(role) => Some(role),
            // A panic while serving is a bug, but the waiting threads must still be
            // served: take the role over rather than leave them stranded. The server
            // keeps what it had sent and what it had not apart even then.
            Err(TryLockError::Poisoned(poisoned)) => {
                #[cfg(not(loom))]
                self.role.clear_poison();
                Some(poisoned.into_inner())
            }
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Waits until `ready` holds for `channel`, serving whenever the role is
    /// free. Returns only then: a request's buffer is its owner's again only
    /// once the device handed its command back (device errors reach the
    /// request as its outcome, never as an early return).
    fn wait_serving(&self, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool) {
        let _rescue = RescueOnUnwind { combine: self, me: Arc::as_ptr(channel.doorbell()) };
        // Alone (nobody spinning) and the role is free: serve as the seed's STM does.
        if self.spinners.load(Ordering::Relaxed) == 0
            && let Some(mut role) = self.try_role()
        {
            channel.doorbell().clear_takeover();
            let served = self.serve(&mut role, channel, ready, false);
            self.release(role, served);
        }
        let mut spin = channel.waiter_spin_ns;
        if self.config.rove && spin > 0 {
            if self.rove(channel, ready) {
                return;
            }
            spin = 0;
        }
        loop {
            if ready(channel) {
                return;
            }
            if let Some(mut role) = self.try_role() {
                channel.doorbell().clear_takeover();
                let served = self.serve(&mut role, channel, ready, false);
                self.release(role, served);
                continue;
            }
            let doorbell = Arc::clone(channel.doorbell());
            let (_, sleeps) = doorbell.wait_until(spin, u64::MAX, || ready(channel) || doorbell.takeover_pending());
            channel.stats.wait.sleeps += sleeps;
            doorbell.clear_takeover();
        }
    }

    /// The roving spin phase: for up to the waiter spin, look at the own
    /// request, yield the CPU, and whenever the role is free take one
    /// non-blocking serving step (or, alone, serve as usual). Returns whether
    /// the request is done.
    fn rove(&self, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool) -> bool {
        if ready(channel) {
            return true;
        }
        self.spinners.fetch_add(1, Ordering::SeqCst);
        let spinning = Spinning(&self.spinners);
        let end = now_ns().saturating_add(channel.waiter_spin_ns);
        let outcome = (|| {
            loop {
                // Under contention, serve as the winner does (see `contended_until`).
                let contended = now_ns() < self.contended_until.load(Ordering::Relaxed);
                if let Some(mut role) = self.try_role() {
                    channel.doorbell().clear_takeover();
                    if !contended && self.spinners.load(Ordering::SeqCst) >= 2 {
                        self.step(&mut role, channel);
                    } else {
                        let served = self.serve(&mut role, channel, ready, !contended);
                        self.release(role, served);
                    }
                }
                if ready(channel) {
                    return true;
                }
                let before = now_ns();
                if before >= end {
                    return false;
                }
                yield_now();
                let after = now_ns();
                if !contended && YIELDS.with(|w| w.contended_after(after - before)) {
                    self.contended_until.store(after + CONTENDED_HOLD_NS, Ordering::Relaxed);
                }
            }
        })();
        // `leave_rove` counts this spinner out.
        std::mem::forget(spinning);
        self.leave_rove(channel, ready);
        outcome
    }

    /// Leaves the roving phase. The last spinner out hands on whatever it
    /// leaves behind (commands in the device, pending requests): nobody else
    /// may be polling. A thread still waiting for its own request goes on to
    /// the sleeping loop, which takes the role first if it is free.
    fn leave_rove(&self, channel: &Channel, ready: &dyn Fn(&Channel) -> bool) {
        if self.spinners.fetch_sub(1, Ordering::SeqCst) != 1 || !ready(channel) {
            return;
        }
        // Pairs with an arriving thread's push, fence and look at the role: either it
        // sees the role free, or this sees its request.
        fence(Ordering::SeqCst);
        if !self.roved.load(Ordering::SeqCst) && self.pending.is_empty() {
            // Every step's work was handed on, and nothing arrived.
            return;
        }
        if let Some(role) = self.try_role() {
            self.hand_off(role);
        }
        // Else the holder is a spinner (which leaves the same way), a serving thread,
        // or another holder that hands off when it lets go.
    }

    /// Gives the role up after serving: unless other spinning threads poll the
    /// device, hands it on (see [`Combine::hand_off`]).
    fn release(&self, role: MutexGuard<'_, Role>, served: Left) {
        match served {
            Left::Roving => {
                self.roved.store(true, Ordering::Relaxed);
                drop(role);
            }
            Left::Finished => self.hand_off(role),
        }
    }

    /// Lets the role go such that whatever is left is served: if requests are
    /// pending, in the backlog or in the device, the owner of one of them is
    /// asked to take the role over (and woken). Every holder that does not
    /// keep polling lets go this way, so a thread that found the role taken
    /// may sleep: whoever held it either serves its request or wakes somebody
    /// who will.
    fn hand_off(&self, role: MutexGuard<'_, Role>) {
        // SAFETY: this thread holds the role (`role`), and the reference is gone (turned
        // into a doorbell) before the role is let go below.
        let pending = unsafe { self.pending.peek() }.map(|w| w.owner_doorbell());
        let successor = pending.or_else(|| role.server.outstanding_waiters().next().map(|w| w.owner_doorbell()));
        self.roved.store(false, Ordering::Relaxed);
        drop(role);
        fence(Ordering::SeqCst);
        match successor {
            Some(doorbell) => doorbell.request_takeover(),
            None => self.rescue_late_arrivals(),
        }
    }

    /// After releasing the role with nothing pending: if a request was
    /// published in between and nobody serves, wake its owner to serve.
    fn rescue_late_arrivals(&self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(role) = self.try_role() {
            // SAFETY: this thread holds the role, and drops the reference before letting it go.
            let successor = unsafe { self.pending.peek() }.map(|w| w.owner_doorbell());
            drop(role);
            if let Some(doorbell) = successor {
                doorbell.request_takeover();
            }
        }
    }

    /// One serving step that never waits: picks up finished commands, sends
    /// the next batch if it is due, and completes the finished requests.
    fn step(&self, role: &mut Role, channel: &Channel) {
        let Role { server, channel: device } = role;
        if server.in_flight() > 0 {
            device.poll_any();
            server.expire(device);
        }
        if server.can_send(device, self.config.pipeline) && server.has_work(&self.pending) {
            let send_time = server.gather_time(device, &self.pending);
            if send_time == 0 || now_ns() >= send_time {
                server.dispatch(device, &self.pending, 1);
            }
        }
        if device.done_len() > 0 {
            server.finish_done_by(device, Arc::as_ptr(channel.doorbell()));
        }
        // Written only when it changes: every spinner's step would otherwise write this
        // shared line.
        let left_work = server.in_flight() > 0 || server.has_work(&self.pending);
        if self.roved.load(Ordering::Relaxed) != left_work {
            self.roved.store(left_work, Ordering::Relaxed);
        }
    }

    /// Serves until the own request is done and the budget allows no more
    /// (or, with `rove`, until other spinning threads can take over polling).
    fn serve(&self, role: &mut Role, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool, rove: bool) -> Left {
        let Role { server, channel: device } = role;
        let me: *const Doorbell = Arc::as_ptr(channel.doorbell());
        let mut budget = self.config.budget;
        loop {
            let mine_done = ready(channel);
            let may_send = !mine_done || budget > 0;
            // Requests already taken (a backlog) are always sent; the budget only
            // limits taking new ones.
            let want_send = server.can_send(device, self.config.pipeline)
                && (server.has_backlog() || (may_send && !self.pending.is_empty()));
            // Sending before paying for wake-ups keeps the device busy; sending as late as
            // the device allows lets the batch grow.
            let send_time = if want_send { server.gather_time(device, &self.pending) } else { u64::MAX };
            if send_time == 0 || (want_send && now_ns() >= send_time) {
                server.dispatch(device, &self.pending, 1);
                if mine_done {
                    // A backlog is sent even with the budget spent (see `want_send`).
                    budget = budget.saturating_sub(1);
                }
                continue;
            }
            if device.done_len() > 0 {
                server.finish_done_by(device, me);
                continue;
            }
            if server.in_flight() == 0 && !server.has_backlog() {
                if mine_done || self.pending.is_empty() {
                    debug_assert!(mine_done, "own request neither pending, in flight nor done");
                    return Left::Finished;
                }
                continue;
            }
            if rove && self.spinners.load(Ordering::Relaxed) >= 2 {
                return Left::Roving;
            }
            server.wait_by(device, channel, send_time);
        }
    }
}

/// Counts a spinner out if its thread unwinds (a panic while serving).
struct Spinning<'a>(&'a AtomicUsize);

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// If a thread panics while waiting or serving (a bug, or a device backend
/// that panics), its role guard unlocks the role poisoned on the way out and
/// this wakes the owner of another outstanding request to take it over:
/// everybody else may be asleep, trusting the holder to serve or hand off.
struct RescueOnUnwind<'a> {
    combine: &'a Combine,
    /// The panicking thread's doorbell: it will not serve again.
    me: *const Doorbell,
}

impl Drop for RescueOnUnwind<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // WouldBlock: another thread holds the role and serves or hands off as usual.
        let Some(role) = self.combine.try_role() else { return };
        let not_mine = |d: &Arc<Doorbell>| !std::ptr::eq(Arc::as_ptr(d), self.me);
        // SAFETY: this thread holds the role, and the references are gone (turned into
        // doorbells) before it lets the role go.
        let pending = unsafe { self.combine.pending.iter_held() }.map(|w| w.owner_doorbell()).find(not_mine);
        let successor =
            pending.or_else(|| role.server.outstanding_waiters().map(|w| w.owner_doorbell()).find(not_mine));
        drop(role);
        if let Some(doorbell) = successor {
            doorbell.request_takeover();
        }
    }
}

impl Dispatch for Combine {
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        let waiter = channel.blocking_waiter();
        waiter.arm(request);
        // SAFETY: the waiter lives in the channel, which waits for it before it is dropped.
        unsafe { self.pending.push(waiter) };
        fence(Ordering::SeqCst);
        self.wait_serving(channel, &|c: &Channel| c.blocking_waiter().is_done());
        Ok(channel.collect_blocking())
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        let waiter = channel.arm_queued(request)?;
        // SAFETY: as in `blocking`.
        unsafe { self.pending.push(waiter) };
        Ok(())
    }

    fn commit(&self, _channel: &mut Channel) -> Result<()> {
        // Submitted requests are already visible to any serving thread.
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        let target = min.min(channel.queued_waiting());
        self.wait_serving(channel, &|c: &Channel| c.queued_done() >= target);
        Ok(channel.collect_queued(out))
    }

    fn background_stats(&self) -> PathStats {
        let role = match self.role.lock() {
            Ok(role) => role,
            Err(poisoned) => poisoned.into_inner(),
        };
        let stats = role.channel.stats;
        // A waiter that found the role taken by this reader may have gone to sleep.
        self.hand_off(role);
        stats
    }
}

/// Model checks of the serving-role hand-off (`RUSTFLAGS="--cfg loom" cargo
/// test --release --lib loom`): in every interleaving (up to a preemption
/// bound) every blocking request is served, whoever holds the role and
/// however the threads that find it taken go to sleep. A request left
/// without a server would leave its owner asleep for good, which loom
/// reports as a deadlock.
#[cfg(all(test, loom))]
mod loom_tests {
    use crate::engine::{Engine, HandleOptions};
    use crate::path::{CombinePolling, CompletionKind, DispatchKind, PathConfig};

    fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(bound);
        builder.check(f);
    }

    /// Threads that sleep as soon as they find the role taken (no spinning),
    /// the case the hand-off rule exists for.
    fn engine(polling: CombinePolling) -> Engine {
        let path = PathConfig {
            waiter_spin: Some(std::time::Duration::ZERO),
            combine_polling: polling,
            ..PathConfig::new(DispatchKind::Combine, CompletionKind::Poll)
        };
        Engine::open("null,size=1m", path).expect("null device")
    }

    fn one_read(engine: &Engine, offset: u64) {
        let mut handle = engine.handle(HandleOptions::default()).expect("handle");
        let mut buf = [0u8; 512];
        handle.read_at(&mut buf, offset).expect("read");
    }

    #[test]
    fn loom_two_blocking_requests_are_both_served() {
        for polling in [CombinePolling::Shared, CombinePolling::Winner] {
            model(3, move || {
                let engine = engine(polling);
                let other = {
                    let engine = engine.clone();
                    loom::thread::spawn(move || one_read(&engine, 512))
                };
                one_read(&engine, 0);
                other.join().unwrap();
            });
        }
    }

    #[test]
    fn loom_three_blocking_requests_are_all_served() {
        model(2, || {
            let engine = engine(CombinePolling::Shared);
            let others: Vec<_> = [512, 1024]
                .into_iter()
                .map(|offset| {
                    let engine = engine.clone();
                    loom::thread::spawn(move || one_read(&engine, offset))
                })
                .collect();
            one_read(&engine, 0);
            for t in others {
                t.join().unwrap();
            }
        });
    }

    #[test]
    fn loom_a_reader_of_the_counters_never_strands_a_request() {
        model(3, || {
            let engine = engine(CombinePolling::Shared);
            let reader = {
                let engine = engine.clone();
                loom::thread::spawn(move || {
                    engine.background_stats();
                })
            };
            one_read(&engine, 0);
            reader.join().unwrap();
        });
    }
}
