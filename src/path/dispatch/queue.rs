//! `queue`, `twoq` and `elevator`: requests pile up in a plugged queue and a
//! dispatcher thread sends them.
//!
//! - `queue` is seed 000's asynchronous temporal merge (ATM, §4.5): the
//!   dispatcher drains everything queued into merged commands when the queue
//!   reaches the unplug threshold (default 32) or the oldest request has
//!   waited the unplug time (default 20 µs). A drain that finds the device
//!   idle is cut into `pipeline` commands (of at least 8 requests each), so
//!   the first half's submitters can issue again while the second half is in
//!   service: one thread at depth 32 otherwise leaves the device idle while
//!   it reaps and resubmits (measured: 0.94 of peak as one command of 32,
//!   0.96-0.97 as two of 16; at 16 threads ATM went from 71-74% to 82-85%).
//! - `twoq` is seed 000's double buffering (2Q, §4.8): the same, and when the
//!   device is idle the queue is dispatched at once. The queue is swapped for
//!   an empty one in one atomic exchange, so submitters never wait for the
//!   dispatcher's merging (the seed's shadow queue, without a lock at all).
//! - `elevator` is the disk-era block layer the seeds start from (Linux
//!   2.6.32's request queue, used by the `scsi-intr` baseline): only requests
//!   that are contiguous on the device are merged (spatial merge), the queue
//!   is plugged (threshold 4, timer 3 ms, the kernel's defaults), and a read
//!   or a synchronous request unplugs it at once, as Linux does.
//!
//! Submitters publish a [`Waiter`](crate::path::waiter::Waiter) and wait on
//! their doorbell (spin for `waiter_spin`, then sleep); the dispatcher waits
//! for the device through the completion policy and wakes them.

use super::serve::{MergeMode, Server};
use super::{Dispatch, Request};
use crate::clock::{ThreadUsage, now_ns};
use crate::device::{Cancel, Device, Op, QueueConfig as DeviceQueueConfig};
use crate::error::{Error, Result};
use crate::path::PathStats;
use crate::path::channel::{Channel, Completed};
use crate::path::completion::CompletionKind;
use crate::path::waiter::Outcome;
use crate::path::waiter::{Doorbell, PendingList};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How long an idle dispatcher spins before it sleeps, when completion is polled.
const IDLE_SPIN_NS: u64 = 50_000;

/// Knobs of a queue-based strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Dispatch when this many requests are queued.
    pub unplug_thresh: usize,
    /// Dispatch when the oldest queued request has waited this long.
    pub unplug_ns: u64,
    /// Dispatch at once when the device is idle (2Q).
    pub idle_dispatch: bool,
    /// Reads and synchronous requests unplug at once (the Linux block layer).
    pub urgent_unplug: bool,
    /// Temporal or spatial merging.
    pub merge: MergeMode,
    /// Commands the dispatcher keeps in the device at once.
    pub pipeline: usize,
    /// Most segments per command.
    pub max_segments: usize,
}

struct Shared {
    pending: PendingList,
    urgent: AtomicUsize,
    kick: Doorbell,
    stop: AtomicBool,
    config: QueueConfig,
    background: Mutex<PathStats>,
    tid: AtomicI32,
    /// The dispatcher thread panicked: requests fail instead of waiting for it.
    dead: AtomicBool,
}

impl Shared {
    /// Fails every request still pending (after the dispatcher died).
    fn fail_pending(&self) {
        let mut taken = Vec::new();
        self.pending.take_all(&mut taken);
        for w in taken {
            w.complete(Outcome { result: -libc::ENOTRECOVERABLE, device_ns: 0, submitted_ns: 0, completed_ns: 0 });
        }
    }
}

/// A queue with a dispatcher thread.
pub struct QueueDispatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl QueueDispatch {
    /// Starts the dispatcher thread; it opens its own device queue.
    pub fn start(
        name: &'static str,
        device: Arc<dyn Device>,
        completion: CompletionKind,
        config: QueueConfig,
        timeout_ns: u64,
    ) -> Result<QueueDispatch> {
        let shared = Arc::new(Shared {
            pending: PendingList::default(),
            urgent: AtomicUsize::new(0),
            kick: Doorbell::default(),
            stop: AtomicBool::new(false),
            config,
            background: Mutex::new(PathStats::default()),
            tid: AtomicI32::new(0),
            dead: AtomicBool::new(false),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        #[cfg(test)]
        let clock = crate::clock::sim::current();
        let named = std::thread::Builder::new().name(format!("iopath-{name}"));
        let thread = crate::sys::spawn_without_signals(named, move || {
            #[cfg(test)]
            crate::clock::sim::inherit(clock);
            thread_shared.tid.store(crate::sys::gettid(), Ordering::Relaxed);
            // The queue is opened on this thread: io_uring's SINGLE_ISSUER needs that.
            let caps = device.capabilities();
            let depth = (super::serve::queue_depth_for(config.pipeline) as u32).min(caps.queue_depth);
            let channel = device
                .open_queue(&DeviceQueueConfig {
                    polled: completion != CompletionKind::Interrupt,
                    ..DeviceQueueConfig::depth(depth)
                })
                .map(|queue| Channel::new(queue, completion, 0, depth as usize, timeout_ns));
            match channel {
                Ok(mut channel) => {
                    let _ = ready_tx.send(Ok(()));
                    let mut server =
                        Server::new(config.merge, config.max_segments, channel.queue_depth().saturating_sub(1));
                    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        dispatcher(&thread_shared, &mut channel, &mut server)
                    }));
                    if run.is_err() {
                        after_panic(&thread_shared, &mut channel, &mut server);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|source| Error::Os { context: "cannot start the dispatcher thread".into(), source })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(QueueDispatch { shared, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Unsupported { what: "dispatcher thread".into(), why: "it exited during start-up".into() })
            }
        }
    }

    fn publish(&self, waiter: &crate::path::waiter::Waiter, urgent: bool) {
        // SAFETY: the waiter lives in its owner's channel, which waits for it before drop.
        unsafe { self.shared.pending.push(waiter) };
        if urgent {
            self.shared.urgent.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.kick.ring();
        // Pushed, then looked (SeqCst both sides, as the dispatcher's `dead` store and
        // its final drain): a request published as the dispatcher died is failed by
        // one of the two, never left waiting.
        fence(Ordering::SeqCst);
        if self.shared.dead.load(Ordering::SeqCst) {
            self.shared.fail_pending();
        }
    }
}

impl Drop for QueueDispatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kick.ring();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The dispatcher thread's loop: send what is due, complete what is done,
/// sleep when there is nothing to do. Exits once stopped and drained.
fn dispatcher(shared: &Shared, channel: &mut Channel, server: &mut Server) {
    let config = shared.config;
    let polls = channel.completion().spins();
    let mut since_publish = 0u32;
    loop {
        let queued = shared.pending.len();
        let now = now_ns();
        let in_device = server.device_in_flight(channel);
        let first = shared.pending.first_arrival_ns();
        let due = server.has_backlog()
            || queued > 0
                && (queued >= config.unplug_thresh
                    || now >= first.saturating_add(config.unplug_ns)
                    || (config.idle_dispatch && now >= server.send_time(channel))
                    || shared.urgent.load(Ordering::SeqCst) > 0
                    || shared.stop.load(Ordering::Relaxed));
        if due && server.can_send(channel, config.pipeline) {
            shared.urgent.store(0, Ordering::SeqCst);
            // An idle device gets a large batch in pieces, so the first piece's submitters
            // can issue again while the rest is in service (double buffering).
            let spread = if in_device == 0 && config.merge == MergeMode::Temporal { config.pipeline } else { 1 };
            // A failed commit needs nothing here: the device hands the commands it did
            // not take back failed, and their requests fail when they are finished. The
            // commands it did take are the device's until it hands them back.
            server.dispatch(channel, &shared.pending, spread);
            continue;
        }
        if server.in_flight() > 0 || server.has_backlog() {
            if channel.done_len() == 0 {
                // A failed look or wait is counted and retried (the commands are still the
                // device's); a command that takes too long is cancelled and still waited for.
                if polls {
                    channel.poll_any();
                } else {
                    let limit = if queued > 0 { first.saturating_add(config.unplug_ns) } else { u64::MAX };
                    server.wait(channel, limit);
                }
                if polls && channel.done_len() == 0 {
                    server.expire(channel);
                    continue;
                }
            }
            server.finish_done(channel);
            since_publish += 1;
            if since_publish >= 16 || server.in_flight() == 0 {
                *shared.background.lock().expect("background stats poisoned") = channel.stats;
                since_publish = 0;
            }
            continue;
        }
        if shared.stop.load(Ordering::SeqCst) && shared.pending.is_empty() {
            *shared.background.lock().expect("background stats poisoned") = channel.stats;
            return;
        }
        let spin = if polls { IDLE_SPIN_NS } else { 0 };
        if queued > 0 {
            // Plugged: wait for the threshold, an urgent request or the unplug timer.
            let deadline = first.saturating_add(config.unplug_ns);
            shared.kick.wait_until(spin.min(config.unplug_ns), deadline, || {
                shared.pending.len() >= config.unplug_thresh
                    || shared.urgent.load(Ordering::SeqCst) > 0
                    || shared.stop.load(Ordering::Relaxed)
            });
        } else {
            let (_, sleeps) = shared
                .kick
                .wait_until(spin, u64::MAX, || !shared.pending.is_empty() || shared.stop.load(Ordering::Relaxed));
            channel.stats.wait.sleeps += sleeps;
        }
    }
}

/// After the dispatcher panicked: requests fail (ENOTRECOVERABLE, "state not
/// recoverable": this engine's path is gone) instead of waiting forever.
/// Commands still in the device are cancelled and waited for first, however
/// long that takes (unless the device stopped answering and lets them go:
/// [`Channel::abandon_if_unanswered`]), because their buffers belong to the
/// waiters, which may free them once told. The command whose submission panicked (an orphan:
/// the device may never have seen it) fails at once.
fn after_panic(shared: &Shared, channel: &mut Channel, server: &mut Server) {
    shared.dead.store(true, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    let steps = std::panic::catch_unwind(AssertUnwindSafe(|| {
        channel.cancel(Cancel::All);
        while channel.in_flight() > 0 {
            if !channel.wait_any(now_ns() + 1_000_000) {
                // A device that stopped answering lets go of what it can.
                channel.abandon_if_unanswered(Cancel::All);
            }
            server.finish_done(channel);
        }
        server.finish_done(channel);
    }));
    if steps.is_err() {
        // The device panics again: what it holds stays its own (never handed back).
        crate::path::completion::explain::write_line(format_args!(
            "the device panicked again while the dispatcher drained it; its requests stay waiting"
        ));
    }
    server.fail_orphans(u64::MAX, libc::ENOTRECOVERABLE);
    server.fail_backlog(libc::ENOTRECOVERABLE);
    shared.fail_pending();
    *shared.background.lock().unwrap_or_else(|e| e.into_inner()) = channel.stats;
}

impl QueueDispatch {
    /// The dispatcher thread's counters (commands, merges, polls).
    pub fn dispatcher_stats(&self) -> PathStats {
        *self.shared.background.lock().expect("background stats poisoned")
    }

    /// The dispatcher thread's CPU time and context switches so far.
    pub fn dispatcher_usage(&self) -> ThreadUsage {
        ThreadUsage::of_thread(self.shared.tid.load(Ordering::Relaxed))
    }

    fn wait_for(&self, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool) {
        let doorbell = Arc::clone(channel.doorbell());
        let (_, sleeps) = doorbell.wait_until(channel.waiter_spin_ns, u64::MAX, || ready(channel));
        channel.stats.wait.sleeps += sleeps;
    }
}

impl Dispatch for QueueDispatch {
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        let waiter = channel.blocking_waiter();
        waiter.arm(request);
        self.publish(waiter, self.shared.config.urgent_unplug);
        self.wait_for(channel, &|c: &Channel| c.blocking_waiter().is_done());
        Ok(channel.collect_blocking())
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        let urgent = self.shared.config.urgent_unplug && request.op == Op::Read;
        let waiter = channel.arm_queued(request)?;
        // Re-borrow immutably for publication (the waiter lives in the channel).
        let waiter: *const crate::path::waiter::Waiter = waiter;
        // SAFETY: the pointer was just obtained from the channel, which outlives it.
        self.publish(unsafe { &*waiter }, urgent);
        Ok(())
    }

    fn commit(&self, _channel: &mut Channel) -> Result<()> {
        Ok(())
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        let target = min.min(channel.queued_waiting());
        self.wait_for(channel, &|c: &Channel| c.queued_done() >= target);
        Ok(channel.collect_queued(out))
    }

    fn background_stats(&self) -> PathStats {
        self.dispatcher_stats()
    }

    fn background_usage(&self) -> ThreadUsage {
        self.dispatcher_usage()
    }
}
