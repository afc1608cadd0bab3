//! The serving core shared by the merging dispatch strategies.
//!
//! A [`Server`] belongs to whichever thread currently holds a strategy's
//! serving role (the STM combiner, the ATM dispatcher). It takes every
//! pending [`Waiter`] in one swap, builds device commands from them, sends
//! them on the serving thread's own channel, and when a command completes
//! hands each segment's result to the waiter it came from. A device error in
//! one segment therefore reaches exactly the request it belongs to.
//!
//! Merging is *temporal* (any requests of one direction, whatever their
//! offsets, up to the device's segment limit: seed 000's device-level
//! scatter/gather) or *spatial* (only requests that continue one another on
//! the device: the disk-era block layer).

use crate::clock::now_ns;
use crate::device::{Cancel, Command, Durability, Op};
use crate::path::channel::Channel;
use crate::path::waiter::{Doorbell, Outcome, PendingList, Taken};

/// How requests may be combined into one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMode {
    /// Any requests of one direction (device-level scatter/gather).
    Temporal,
    /// Only requests that are contiguous on the device.
    Spatial,
}

/// Most commands one batch becomes: one per direction (reads, writes, flushes).
pub const COMMANDS_PER_BATCH: usize = 3;

/// Device queue depth a serving thread needs for `pipeline` batches in the device.
pub fn queue_depth_for(pipeline: usize) -> usize {
    COMMANDS_PER_BATCH * pipeline.max(1) + 1
}

/// How long before the device's current command completes the next batch is
/// sent: enough to take the pending list, build the command and submit it.
pub const SEND_LEAD_NS: u64 = 2_000;
/// Longest a request waits to be gathered into a batch while the device is
/// busy ([`gather_until`]): about one device time of a 4 KiB read on the
/// loop device, so a batch held for it costs its requests at most one
/// command's wait more.
pub const GATHER_NS: u64 = 40_000;

struct Batch {
    tag: u64,
    submitted_ns: u64,
    waiters: Vec<Taken>,
    /// The device was asked to give up on it (it took longer than the timeout).
    cancelled: bool,
    /// Its submission panicked (a bug in a backend): the device may never
    /// hand it back, so it is failed once the timeout has passed.
    orphan: bool,
}

/// Marks the batch being submitted an orphan if the submission unwinds.
struct OrphanOnUnwind<'a>(&'a mut Batch);

impl Drop for OrphanOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.orphan = true;
    }
}

/// Fewest segments per command when a batch is spread over several: below
/// this the per-command overhead costs more than the overlap gains.
pub const SPREAD_MIN_SEGMENTS: usize = 8;

/// When a batch of `pending` requests (the oldest arrived at
/// `first_arrival_ns`) should go to a device that holds `in_device` of them
/// and cannot say when they will be done: at once (0) when the device is
/// idle, requests taken earlier wait (`backlog`), or the batch is already as
/// large as what the device holds (about half of the threads that take
/// turns, the other half in the device); else when the oldest has waited
/// [`GATHER_NS`]. With 16 blocking threads on the loop device over AIO this
/// took `stm` from 93-112K to 121-127K IOPS (3 alternated rounds; fio's
/// psync 77-98K), with 3.8-4.2 requests per command instead of 2.3-3.4.
pub fn gather_until(in_device: usize, backlog: bool, pending: usize, first_arrival_ns: u64) -> u64 {
    if in_device == 0 || backlog || pending >= in_device {
        return 0;
    }
    first_arrival_ns.saturating_add(GATHER_NS)
}

/// The state of the serving role.
pub struct Server {
    mode: MergeMode,
    max_segments: usize,
    max_commands: usize,
    /// Requests taken from the pending list and not sent yet (the device
    /// queue was full, or the dispatch under way has not reached them); sent
    /// first, before anything newer. A request leaves it only to join a
    /// batch or to be failed, so a send cut short by a panic loses none.
    taken: Vec<Taken>,
    batches: Vec<Batch>,
    spare: Vec<Vec<Taken>>,
    next_tag: u64,
}

impl Server {
    /// A server merging in `mode`, at most `max_segments` per command and at
    /// most `max_commands` commands in flight (its device queue's depth).
    pub fn new(mode: MergeMode, max_segments: usize, max_commands: usize) -> Server {
        Server {
            mode,
            max_segments: max_segments.max(1),
            max_commands: max_commands.max(1),
            taken: Vec::new(),
            batches: Vec::new(),
            spare: Vec::new(),
            next_tag: 1,
        }
    }

    /// Commands sent and not yet completed (including ones the device has
    /// handed back that are still waiting in `channel`).
    pub fn in_flight(&self) -> usize {
        self.batches.len()
    }

    /// Whether a dispatch now could send a command: fewer than `pipeline`
    /// commands in the device, and a free slot in the device queue. The
    /// second matters when the queue is full of commands the device handed
    /// back and nobody has finished yet: sending must wait for finishing, or
    /// a loop that sends before it finishes spins for good (found by `iopath
    /// soak`: max-segments=1 and 12 threads filled the queue that way).
    pub fn can_send(&self, channel: &Channel, pipeline: usize) -> bool {
        self.device_in_flight(channel) < pipeline && self.batches.len() < self.max_commands
    }

    /// Commands still in the device.
    pub fn device_in_flight(&self, channel: &Channel) -> usize {
        self.batches.len().saturating_sub(channel.done_len())
    }

    /// When the next batch should be sent: at once if the device is idle or
    /// cannot say when it will be, else [`SEND_LEAD_NS`] before the command in
    /// service completes, so the new batch is as large as it can be without
    /// leaving the device idle.
    pub fn send_time(&self, channel: &Channel) -> u64 {
        if self.device_in_flight(channel) == 0 {
            return 0;
        }
        channel.next_deadline_ns().map_or(0, |d| d.saturating_sub(SEND_LEAD_NS))
    }

    /// [`Server::send_time`] for the combining role, whose batches come from
    /// threads that wait while the device works: on a device that cannot say
    /// when its command will complete (a kernel one), a batch is held while
    /// the device is busy until it is as large as what the device holds or
    /// its oldest request has waited [`GATHER_NS`] ([`gather_until`]). Sent
    /// the moment anything was pending, a batch held one or two requests:
    /// one submission each, and the kernel's per-request work (the loop
    /// device's worker wake-ups) paid for each.
    pub fn gather_time(&self, channel: &Channel, pending: &PendingList) -> u64 {
        if self.device_in_flight(channel) == 0 {
            return 0;
        }
        match channel.next_deadline_ns() {
            Some(deadline) => deadline.saturating_sub(SEND_LEAD_NS),
            None => {
                let in_device = self.batches.iter().map(|b| b.waiters.len()).sum();
                gather_until(in_device, self.has_backlog(), pending.len(), pending.first_arrival_ns())
            }
        }
    }

    /// When the oldest command in flight that has not been cancelled was sent.
    pub fn oldest_submitted_ns(&self) -> Option<u64> {
        self.batches.iter().filter(|b| !b.cancelled).map(|b| b.submitted_ns).min()
    }

    /// Every request taken and not yet completed (in the backlog or in the
    /// device). Safe: the waiters it lists are completed only through
    /// `&mut self`, so they are alive while the borrow lasts.
    pub fn outstanding_waiters(&self) -> impl Iterator<Item = &Taken> {
        self.taken.iter().chain(self.batches.iter().flat_map(|b| b.waiters.iter()))
    }

    /// Whether requests taken earlier still wait for room in the device queue.
    pub fn has_backlog(&self) -> bool {
        !self.taken.is_empty()
    }

    /// Whether there is anything to send: a backlog or pending requests.
    pub fn has_work(&self, pending: &PendingList) -> bool {
        self.has_backlog() || !pending.is_empty()
    }

    /// Takes every pending waiter and sends them, with any backlog, as merged
    /// commands while the device queue has room; returns how many requests
    /// were newly taken. A failed commit needs nothing more: the device hands
    /// back failed what it did not take ([`crate::device::Queue::commit`]). With `spread` > 1 a large batch is cut into up to
    /// `spread` commands of at least [`SPREAD_MIN_SEGMENTS`] each, so that the
    /// first comes back (and its submitters can issue again) while the next is
    /// in service: a lone submitter at depth 32 otherwise leaves the device
    /// idle between its batches while it reaps and resubmits.
    pub fn dispatch(&mut self, channel: &mut Channel, pending: &PendingList, spread: usize) -> usize {
        let backlog = self.taken.len();
        let n = pending.take_all(&mut self.taken);
        if self.taken.is_empty() {
            return 0;
        }
        let now = now_ns();
        for w in &self.taken[backlog..] {
            channel.stats.merge_wait_ns += now.saturating_sub(w.arrived_ns());
        }
        channel.stats.merged_requests += n as u64;
        match self.mode {
            // Reads, then writes, then flushes, each in arrival order. An unstable sort
            // with the arrival time as the last key gives that order without the
            // buffer a stable sort allocates for every batch.
            MergeMode::Temporal => self.taken.sort_unstable_by_key(|w| (op_rank(w.request().op), w.arrived_ns())),
            MergeMode::Spatial => self.taken.sort_unstable_by_key(|w| {
                let r = w.request();
                (op_rank(r.op), r.offset, w.arrived_ns())
            }),
        }
        let per_command = if spread > 1 {
            self.taken.len().div_ceil(spread).max(SPREAD_MIN_SEGMENTS).min(self.max_segments)
        } else {
            self.max_segments
        };
        while !self.taken.is_empty() && self.batches.len() < self.max_commands {
            let len = self.group_len(per_command);
            self.send(channel, len, now);
        }
        channel.commit();
        n
    }

    /// How many of the requests at the front of `taken` go into one command
    /// (at most `max_segments`).
    fn group_len(&self, max_segments: usize) -> usize {
        let taken = &self.taken;
        let first = taken[0].request();
        if first.op == Op::Flush {
            // One flush covers every write before it: all pending flushes share one command.
            return taken.iter().take_while(|w| w.request().op == Op::Flush).count();
        }
        if first.durability != Durability::Cached {
            // Its leading flush and forced unit access are its own: a plain write merged
            // in would be made durable too, but one ordered behind a flush it did not ask for.
            return 1;
        }
        let mut len = 1;
        let mut next_offset = first.offset + first.len as u64;
        while len < taken.len() && len < max_segments {
            let r = taken[len].request();
            let fits = r.op == first.op
                && r.durability == Durability::Cached
                && match self.mode {
                    MergeMode::Temporal => true,
                    MergeMode::Spatial => r.offset == next_offset,
                };
            if !fits {
                break;
            }
            next_offset = r.offset + r.len as u64;
            len += 1;
        }
        len
    }

    /// Sends the first `len` requests of `taken` as one command.
    fn send(&mut self, channel: &mut Channel, len: usize, now: u64) {
        let op = self.taken[0].request().op;
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut command: Command = channel.take_command(op, tag);
        command.durability = self.taken[0].request().durability;
        if op != Op::Flush {
            for w in &self.taken[..len] {
                let r = w.request();
                command.push(r.offset, r.buf, r.len);
            }
        }
        let mut waiters = self.spare.pop().unwrap_or_default();
        waiters.extend(self.taken.drain(..len));
        // From here on these requests belong to the batch (even if the submission panics).
        self.batches.push(Batch { tag, submitted_ns: now, waiters, cancelled: false, orphan: false });
        let batch = self.batches.last_mut().expect("just pushed");
        let guard = OrphanOnUnwind(batch);
        // SAFETY: each owner keeps its buffer valid until its waiter is completed,
        // which happens only after this command is handed back.
        unsafe { channel.submit_command(command) };
        std::mem::forget(guard);
    }

    /// Completes the waiters of every command the device has handed back to
    /// `channel`; returns how many commands were finished.
    pub fn finish_done(&mut self, channel: &mut Channel) -> usize {
        // The channel (and so its doorbell) outlives this call; a raw pointer avoids
        // touching the doorbell's reference count on the hot path.
        let me: *const Doorbell = std::sync::Arc::as_ptr(channel.doorbell());
        self.finish_done_by(channel, me)
    }

    /// Like [`Server::finish_done`], for a serving thread whose own channel
    /// (doorbell `me`) is not `channel`: its own requests are completed
    /// without ringing anybody (the address is only compared).
    pub fn finish_done_by(&mut self, channel: &mut Channel, me: *const Doorbell) -> usize {
        let mut finished = 0;
        // With timestamps on: when these completions were noticed.
        let now = if crate::path::timing::on() { crate::clock::now_ns() } else { 0 };
        while let Some(command) = channel.pop_done() {
            let Some(pos) = self.batches.iter().position(|b| b.tag == command.tag) else {
                // Every command comes back exactly once; an orphan that came back after
                // it was failed is the one way to get here.
                channel.recycle(command);
                continue;
            };
            let batch = self.batches.swap_remove(pos);
            let mut command = command;
            if batch.cancelled {
                crate::path::channel::timed_out(&mut command);
            }
            let mut waiters = batch.waiters;
            channel.note_noticed(&command, now, waiters.len() as u64);
            let outcome = |result| Outcome {
                result,
                device_ns: command.device_ns,
                submitted_ns: batch.submitted_ns,
                completed_ns: now,
            };
            if command.op == Op::Flush {
                for w in waiters.drain(..) {
                    w.complete_by(outcome(command.result), me);
                }
            } else {
                debug_assert_eq!(waiters.len(), command.segments.len());
                for (w, seg) in waiters.drain(..).zip(&command.segments) {
                    w.complete_by(outcome(seg.result), me);
                }
            }
            channel.recycle(command);
            self.spare.push(waiters);
            finished += 1;
        }
        finished
    }

    /// Fails every request taken but not yet sent; returns how many.
    pub fn fail_backlog(&mut self, errno: i32) -> usize {
        let unsent = self.taken.len();
        for w in self.taken.drain(..) {
            w.complete(Outcome { result: -errno, device_ns: 0, submitted_ns: 0, completed_ns: 0 });
        }
        unsent
    }

    /// Fails the requests of orphan commands (their submission panicked)
    /// sent before `cutoff_ns`; returns how many requests were failed.
    pub fn fail_orphans(&mut self, cutoff_ns: u64, errno: i32) -> usize {
        let mut failed = 0;
        self.batches.retain_mut(|b| {
            if !b.orphan || b.submitted_ns > cutoff_ns {
                return true;
            }
            for w in b.waiters.drain(..) {
                w.complete(Outcome { result: -errno, device_ns: 0, submitted_ns: b.submitted_ns, completed_ns: 0 });
                failed += 1;
            }
            false
        });
        failed
    }

    /// Waits for completions (through the channel's completion policy) until
    /// one arrives or the oldest command has been in flight for the timeout,
    /// then cancels what took too long ([`Server::expire`]). Returns whether
    /// a command came back.
    pub fn wait(&mut self, channel: &mut Channel, limit_ns: u64) -> bool {
        let limit = self.wait_limit(channel.timeout_ns(), limit_ns);
        let got = channel.wait_any(limit);
        if !got {
            self.expire(channel);
        }
        got
    }

    /// Like [`Server::wait`] for commands sent on `device`, a queue shared by
    /// the threads that take turns serving, waited for by `waiter` through its
    /// own completion policy ([`Channel::wait_any_on`]).
    pub fn wait_by(&mut self, device: &mut Channel, waiter: &mut Channel, limit_ns: u64) -> bool {
        let limit = self.wait_limit(device.timeout_ns(), limit_ns);
        let got = waiter.wait_any_on(device, limit);
        if !got {
            self.expire(device);
        }
        got
    }

    /// `limit_ns`, or earlier when the oldest command's time runs out.
    fn wait_limit(&self, timeout_ns: u64, limit_ns: u64) -> u64 {
        match self.oldest_submitted_ns() {
            Some(oldest) => limit_ns.min(oldest.saturating_add(timeout_ns)),
            None => limit_ns,
        }
    }

    /// Asks the device to cancel every command in flight for longer than the
    /// channel's timeout (their requests fail with ETIMEDOUT once the device
    /// hands them back) and fails orphans that old; returns how many
    /// commands were cancelled or failed. Commands cancelled earlier and
    /// still not back are abandoned if the device stopped answering
    /// ([`Channel::abandon_if_unanswered`]); they come back failed through
    /// [`Server::finish_done`].
    pub fn expire(&mut self, channel: &mut Channel) -> usize {
        for b in self.batches.iter().filter(|b| b.cancelled) {
            channel.abandon_if_unanswered(Cancel::Tag(b.tag));
        }
        let Some(oldest) = self.batches.iter().filter(|b| !b.cancelled).map(|b| b.submitted_ns).min() else {
            return 0;
        };
        let timeout = channel.timeout_ns();
        let now = now_ns();
        if now < oldest.saturating_add(timeout) {
            return 0;
        }
        let cutoff = now - timeout;
        let mut expired = 0;
        for b in self.batches.iter_mut().filter(|b| !b.cancelled && !b.orphan && b.submitted_ns <= cutoff) {
            b.cancelled = true;
            channel.cancel(Cancel::Tag(b.tag));
            expired += 1;
        }
        expired + self.fail_orphans(cutoff, libc::ETIMEDOUT)
    }
}

fn op_rank(op: Op) -> u8 {
    match op {
        Op::Read => 0,
        Op::Write => 1,
        Op::Flush => 2,
        Op::Trim => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_held_while_the_device_is_busy_until_it_matches_what_the_device_holds() {
        let arrived = 1_000_000;
        // An idle device takes a lone request at once: no wait for company.
        assert_eq!(gather_until(0, false, 1, arrived), 0);
        // Two threads taking turns: one in the device, one pending: sent at once.
        assert_eq!(gather_until(1, false, 1, arrived), 0);
        // 16 threads: 8 in the device, 3 pending: held until the 40 us are up...
        assert_eq!(gather_until(8, false, 3, arrived), arrived + GATHER_NS);
        // ... or until 8 are pending.
        assert_eq!(gather_until(8, false, 8, arrived), 0);
        // Requests taken earlier are never held.
        assert_eq!(gather_until(8, true, 1, arrived), 0);
    }
}
