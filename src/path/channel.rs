//! A thread's channel to the device: its queue, its preallocated commands,
//! its completed-but-unclaimed commands, its hand-off waiters and its counters.
//!
//! Channels are per thread (SPDK's `io_channel`): nothing in here is shared
//! except the [`Waiter`]s a merging dispatch hands to a serving thread, so the
//! hot path takes no lock and allocates nothing once the pools are warm.
//! Dispatch strategies build on the primitives here.

use super::completion::{CompletionKind, CompletionPolicy, Expect, WaitStats};
use super::dispatch::Request;
use super::waiter::{Doorbell, Outcome, Waiter};
use crate::clock::now_ns;
use crate::device::{Cancel, Command, Durability, Op, Queue};
use crate::error::{Error, Result};
use std::sync::Arc;

/// How long a thread backs off after a failed wait before it looks again.
const QUEUE_ERROR_BACKOFF_US: u64 = 100;

/// Buckets of the segments-per-command histogram: 1, 2, 3-4, 5-8, ..., 513-1024.
pub const SEGMENT_BUCKETS: usize = 11;

/// The histogram bucket of a command with `segments` segments.
pub fn segment_bucket(segments: usize) -> usize {
    (usize::BITS - segments.max(1).saturating_sub(1).leading_zeros()).min(SEGMENT_BUCKETS as u32 - 1) as usize
}

/// Label of histogram bucket `i` ("1", "2", "3-4", ...).
pub fn segment_bucket_label(i: usize) -> String {
    match i {
        0 => "1".into(),
        1 => "2".into(),
        _ => format!("{}-{}", (1 << (i - 1)) + 1, 1 << i),
    }
}

/// Counters of one channel; summed over threads for a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Requests completed for this channel's owner.
    pub requests: u64,
    /// Device commands this channel sent (for itself or, when serving, for others).
    pub commands: u64,
    /// Segments in those commands.
    pub segments: u64,
    /// Commands by segment count (see [`segment_bucket`]).
    pub segments_hist: [u64; SEGMENT_BUCKETS],
    /// Requests this channel sent on behalf of a merge (its own or others').
    pub merged_requests: u64,
    /// Total time those requests waited between arrival and submission.
    pub merge_wait_ns: u64,
    /// Sum of per-request device time (timed devices).
    pub device_ns: u64,
    /// Device-queue calls (commit, reap, wait, cancel) that failed and were
    /// handled: a failed commit's commands come back failed, a failed wait is
    /// retried. None of them releases a buffer the device still owns.
    pub queue_errors: u64,
    /// Commands the path asked the device to cancel because they took longer
    /// than the path's timeout.
    pub cancels: u64,
    /// Commands given up on after the device stopped answering (every wait
    /// failed for a whole timeout after their cancel): their requests fail
    /// with ETIMEDOUT ([`crate::device::Queue::abandon`]).
    pub abandoned: u64,
    /// The completion policy's counters, plus sleeps while waiting on another thread.
    pub wait: WaitStats,
    /// With [`crate::path::timing`] on, on timed devices: total time from the
    /// device finishing a request's command until the path noticed it, and
    /// how many requests that covers.
    pub noticed_ns: u64,
    /// Requests in `noticed_ns`.
    pub noticed: u64,
    /// With timing on: total time from another thread completing a request
    /// until its owner was running again (the wake-up), and how many.
    pub woken_ns: u64,
    /// Requests in `woken_ns`.
    pub woken: u64,
}

impl PathStats {
    /// Adds another channel's counters.
    pub fn add(&mut self, other: &PathStats) {
        self.requests += other.requests;
        self.commands += other.commands;
        self.segments += other.segments;
        for (a, b) in self.segments_hist.iter_mut().zip(&other.segments_hist) {
            *a += b;
        }
        self.merged_requests += other.merged_requests;
        self.merge_wait_ns += other.merge_wait_ns;
        self.device_ns += other.device_ns;
        self.queue_errors += other.queue_errors;
        self.cancels += other.cancels;
        self.abandoned += other.abandoned;
        self.wait.add(&other.wait);
        self.noticed_ns += other.noticed_ns;
        self.noticed += other.noticed;
        self.woken_ns += other.woken_ns;
        self.woken += other.woken;
    }

    /// The counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &PathStats) -> PathStats {
        let mut hist = self.segments_hist;
        for (a, b) in hist.iter_mut().zip(&earlier.segments_hist) {
            *a -= b;
        }
        PathStats {
            requests: self.requests - earlier.requests,
            commands: self.commands - earlier.commands,
            segments: self.segments - earlier.segments,
            segments_hist: hist,
            merged_requests: self.merged_requests - earlier.merged_requests,
            merge_wait_ns: self.merge_wait_ns - earlier.merge_wait_ns,
            device_ns: self.device_ns - earlier.device_ns,
            queue_errors: self.queue_errors - earlier.queue_errors,
            cancels: self.cancels - earlier.cancels,
            abandoned: self.abandoned - earlier.abandoned,
            wait: self.wait.since(&earlier.wait),
            noticed_ns: self.noticed_ns - earlier.noticed_ns,
            noticed: self.noticed - earlier.noticed,
            woken_ns: self.woken_ns - earlier.woken_ns,
            woken: self.woken - earlier.woken,
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completed {
    /// The caller's tag.
    pub tag: u64,
    /// Direction.
    pub op: Op,
    /// Offset of the request.
    pub offset: u64,
    /// Length of the request.
    pub len: u32,
    /// Device time the request saw (0 if unknown).
    pub device_ns: u64,
    /// Success, or what went wrong.
    pub result: Result<()>,
}

/// Turns a raw result (bytes or -errno) for a request into a `Result`.
pub fn request_result(op: Op, offset: u64, len: u32, result: i32) -> Result<()> {
    if result == -libc::ETIMEDOUT {
        Err(Error::Timeout { op: op.name(), offset, timeout_ms: 0 })
    } else if result < 0 {
        Err(Error::Device { op: op.name(), offset, len: len as u64, errno: -result })
    } else if matches!(op, Op::Read | Op::Write) && (result as u32) < len {
        Err(Error::Short { op: op.name(), offset, len: len as u64, done: result as u64 })
    } else {
        Ok(())
    }
}

/// Marks what the device gave up on in a command cancelled for taking too
/// long as timed out (`-ECANCELED` becomes `-ETIMEDOUT`).
pub fn timed_out(command: &mut Command) {
    if command.result == -libc::ECANCELED {
        command.result = -libc::ETIMEDOUT;
    }
    for seg in &mut command.segments {
        if seg.result == -libc::ECANCELED {
            seg.result = -libc::ETIMEDOUT;
        }
    }
}

/// One thread's channel.
pub struct Channel {
    queue: Box<dyn Queue>,
    completion: Box<dyn CompletionPolicy>,
    /// What the device is working on for the oldest command in flight.
    expect: Expect,
    /// Whether the policy needs `expect` (saves a clock read per submission otherwise).
    stamp_submissions: bool,
    pool: Vec<Command>,
    done: Vec<Command>,
    queue_depth: usize,
    timeout_ns: u64,
    doorbell: Arc<Doorbell>,
    /// Since when every wait and reap has failed (0: the last one succeeded).
    failing_since_ns: u64,
    /// Hand-off waiters: one per queued-API slot, and the last for blocking calls.
    /// Never resized, so their addresses stay valid while other threads hold them.
    waiters: Vec<Waiter>,
    /// Indices of waiters in flight for the queued API.
    waiting: Vec<usize>,
    /// How long to spin before sleeping when waiting on another thread.
    pub waiter_spin_ns: u64,
    /// Counters.
    pub stats: PathStats,
}

impl Channel {
    /// A channel over `queue` (opened with `queue_depth`) for `queued_slots`
    /// requests of the queued API; a command in flight for longer than
    /// `timeout_ns` is cancelled (and still waited for: see [`Queue::cancel`]).
    pub fn new(
        queue: Box<dyn Queue>,
        completion: CompletionKind,
        queued_slots: usize,
        queue_depth: usize,
        timeout_ns: u64,
    ) -> Channel {
        let doorbell = Arc::new(Doorbell::default());
        let policy = completion.build();
        let stamp_submissions = policy.uses_expect();
        Channel {
            queue,
            completion: policy,
            expect: Expect::default(),
            stamp_submissions,
            pool: (0..queue_depth).map(|_| Command::with_capacity(1)).collect(),
            done: Vec::with_capacity(queue_depth),
            queue_depth,
            timeout_ns,
            waiters: (0..=queued_slots).map(|_| Waiter::new(Arc::clone(&doorbell))).collect(),
            waiting: Vec::with_capacity(queued_slots),
            doorbell,
            failing_since_ns: 0,
            waiter_spin_ns: 0,
            stats: PathStats::default(),
        }
    }

    /// Most commands this channel's queue may have in flight.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    /// The completion policy.
    pub fn completion(&self) -> &dyn CompletionPolicy {
        self.completion.as_ref()
    }

    /// A cleared command from the pool (allocates only when the pool is empty).
    pub fn take_command(&mut self, op: Op, tag: u64) -> Command {
        let mut command = self.pool.pop().unwrap_or_else(|| Command::with_capacity(1));
        command.reset(op, tag);
        command
    }

    /// Returns a command to the pool.
    pub fn recycle(&mut self, command: Command) {
        self.pool.push(command);
    }

    /// Submits a prepared command without committing.
    ///
    /// # Safety
    ///
    /// As [`Queue::submit`].
    pub unsafe fn submit_command(&mut self, mut command: Command) {
        self.count_command(command.segments.len());
        let idle = self.queue.in_flight() == 0;
        if (self.stamp_submissions && idle) || crate::path::timing::on() {
            let now = now_ns();
            command.submitted_ns = now;
            if self.stamp_submissions && idle {
                // The device starts on this one now: what a hybrid wait will expect.
                self.expect = Expect::of(&command, now);
            }
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.queue.submit(command) };
    }

    /// Counts a command of `segments` segments sent to the device.
    fn count_command(&mut self, segments: usize) {
        self.stats.commands += 1;
        self.stats.segments += segments as u64;
        self.stats.segments_hist[segment_bucket(segments)] += 1;
    }

    /// Queues one single-segment request without committing.
    ///
    /// # Safety
    ///
    /// `request.buf` must stay valid and untouched until the request is reaped.
    pub unsafe fn queue_one(&mut self, request: Request) {
        let mut command = self.take_command(request.op, request.tag);
        command.durability = request.durability;
        if request.op != Op::Flush {
            command.push(request.offset, request.buf, request.len);
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.submit_command(command) };
    }

    /// Carries one request out with the kernel's blocking call where the
    /// policy's next wait would sleep anyway and the queue can
    /// ([`CompletionPolicy::wait_blocking`], [`Queue::run_blocking`]);
    /// `None` where not (nothing was done: send it as usual).
    ///
    /// # Safety
    ///
    /// `request.buf` must be valid for `request.len` bytes (writable for
    /// reads) for the duration of the call.
    pub unsafe fn run_blocking(&mut self, request: Request) -> Option<Completed> {
        // A flush (or an ordered write, its flush first) may be the kernel's datasync
        // even where the policy would not sleep: io_uring runs it on one of its
        // workers, which waiters that look for it while others hold the CPUs keep
        // from a CPU. The policy says whether it would rather look
        // ([`CompletionPolicy::flush_blocking`]).
        let flushes = request.op == Op::Flush || request.durability == Durability::Ordered;
        let sleeps = self.completion.sleeps_first();
        if !flushes && !sleeps {
            return None;
        }
        let mut command = self.take_command(request.op, request.tag);
        command.durability = request.durability;
        if request.op != Op::Flush {
            command.push(request.offset, request.buf, request.len);
        }
        let queue = &mut self.queue;
        // SAFETY: forwarded from the caller's contract.
        let mut call = || unsafe { queue.run_blocking(&mut command) };
        let stats = &mut self.stats.wait;
        let ran = (sleeps && self.completion.wait_blocking(stats, &mut call))
            || (flushes && self.completion.flush_blocking(stats, &mut call));
        if !ran {
            self.recycle(command);
            return None;
        }
        self.count_command(1);
        Some(self.finish(command))
    }

    /// Queues one request and sends it, or leaves the sending to the wait
    /// that follows where that wait sleeps at once on a queue whose waits
    /// send ([`CompletionPolicy::sleeps_first`], [`Queue::sends_when_waiting`]):
    /// on io_uring one `io_uring_enter` then submits and sleeps. For a caller
    /// that waits for the request next, on this thread.
    ///
    /// # Safety
    ///
    /// As [`Channel::queue_one`].
    pub unsafe fn send_one_to_wait(&mut self, request: Request) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.queue_one(request) };
        if !(self.completion.sleeps_first() && self.queue.sends_when_waiting()) {
            self.commit();
        }
    }

    /// Sends queued commands to the device. A failure is counted and
    /// otherwise needs nothing: the queue hands back failed whatever it did
    /// not send ([`Queue::commit`]), and the rest completes as usual.
    pub fn commit(&mut self) {
        if self.queue.commit().is_err() {
            self.stats.queue_errors += 1;
        }
    }

    /// Asks the device to give up on commands that took too long; they still
    /// come back (failed or with their results) through the usual waits.
    pub fn cancel(&mut self, which: Cancel) {
        self.stats.cancels += 1;
        if self.queue.cancel(which).is_err() {
            self.stats.queue_errors += 1;
        }
    }

    /// After a failed wait or reap: counts it and lets the device make
    /// progress before the next try (the commands are still in flight).
    pub fn wait_failed(&mut self) {
        self.look_failed();
        std::thread::sleep(std::time::Duration::from_micros(QUEUE_ERROR_BACKOFF_US));
    }

    /// Counts a failed wait or reap and notes since when they fail.
    fn look_failed(&mut self) {
        self.stats.queue_errors += 1;
        if self.failing_since_ns == 0 {
            self.failing_since_ns = now_ns();
        }
    }

    /// For commands in `which`, cancelled already: once every wait and reap
    /// has failed for a whole timeout (the device stopped answering), hands
    /// back failed, for the usual completion, those the device can promise
    /// never to touch again ([`Queue::abandon`]); returns how many. A device
    /// that cannot promise it keeps its commands, and they are waited for.
    pub fn abandon_if_unanswered(&mut self, which: Cancel) -> usize {
        if self.failing_since_ns == 0 || now_ns() < self.failing_since_ns.saturating_add(self.timeout_ns) {
            return 0;
        }
        let n = self.queue.abandon(which, &mut self.done);
        self.stats.abandoned += n as u64;
        n
    }

    /// Commands submitted and not yet handed back by the device.
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight()
    }

    /// The time limit for a wait starting now.
    pub fn limit_ns(&self) -> u64 {
        now_ns().saturating_add(self.timeout_ns)
    }

    /// How long a command may be in flight before it is cancelled.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The configured timeout, for messages.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ns / 1_000_000
    }

    /// Waits through the completion policy until at least one more command is
    /// back or `limit_ns` passes; returns whether one came back. A failed
    /// wait is counted, backed off from and reported as nothing back yet.
    pub fn wait_any(&mut self, limit_ns: u64) -> bool {
        match self.completion.wait(self.queue.as_mut(), &mut self.done, &mut self.stats.wait, limit_ns, self.expect) {
            Ok(n) => {
                self.failing_since_ns = 0;
                self.restamp(n);
                n > 0
            }
            Err(_) => {
                self.wait_failed();
                false
            }
        }
    }

    /// Like [`Channel::wait_any`], for commands in flight on `device` (another
    /// thread's queue this thread serves for the moment), waiting through this
    /// channel's completion policy: a policy measures the thread that waits,
    /// so it must not pass from thread to thread with a shared queue.
    pub fn wait_any_on(&mut self, device: &mut Channel, limit_ns: u64) -> bool {
        match self.completion.wait(
            device.queue.as_mut(),
            &mut device.done,
            &mut self.stats.wait,
            limit_ns,
            device.expect,
        ) {
            Ok(n) => {
                device.failing_since_ns = 0;
                device.restamp(n);
                n > 0
            }
            Err(_) => {
                device.wait_failed();
                false
            }
        }
    }

    /// Picks up completed commands without waiting; returns how many (a
    /// failed look is counted and returns 0).
    pub fn poll_any(&mut self) -> usize {
        self.stats.wait.polls += 1;
        match self.queue.reap(&mut self.done) {
            Ok(n) => {
                self.failing_since_ns = 0;
                self.restamp(n);
                n
            }
            Err(_) => {
                self.look_failed();
                0
            }
        }
    }

    /// After `n` completions came back with more commands still in flight:
    /// the next completion is expected from now. `expect` is stamped when a
    /// command starts an idle queue; a queue kept full never idles again, and
    /// its first stamp aged until the learned "device time" was the run's
    /// length (`iopath bench --iodepth 32 --explain` on a loop device: 1.8 ms
    /// growing to 456 ms within a second), which ruled out spinning (over
    /// 200 us) and left `auto` sleeping at 0.90x fio's depth-32 IOPS.
    fn restamp(&mut self, n: usize) {
        if n > 0 && self.stamp_submissions && self.queue.in_flight() > 0 {
            self.expect.since_ns = now_ns();
        }
    }

    /// When the device expects to complete its next command, if it can tell.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        self.queue.next_deadline_ns()
    }

    /// Commands handed back by the device and not yet taken.
    pub fn done_len(&self) -> usize {
        self.done.len()
    }

    /// Takes one command the device has handed back, if any.
    pub fn pop_done(&mut self) -> Option<Command> {
        self.done.pop()
    }

    /// Waits for the command with `tag` and hands it back whole (all
    /// segments' results). Never returns while the device owns the command:
    /// past the timeout it is cancelled and waited for (or abandoned, if the
    /// device stopped answering and can let it go), and the segments the
    /// device gave up on report `-ETIMEDOUT`.
    pub fn wait_command(&mut self, tag: u64) -> Command {
        let mut limit = self.limit_ns();
        let mut cancelled = false;
        loop {
            if let Some(pos) = self.done.iter().position(|c| c.tag == tag) {
                let mut command = self.done.swap_remove(pos);
                if cancelled {
                    timed_out(&mut command);
                }
                return command;
            }
            if !self.wait_any(limit) {
                if cancelled {
                    self.abandon_if_unanswered(Cancel::Tag(tag));
                } else if now_ns() >= limit {
                    self.cancel(Cancel::Tag(tag));
                    cancelled = true;
                    limit = u64::MAX;
                }
            }
        }
    }

    /// Waits for the single-segment request with `tag` and returns its result.
    pub fn wait_for(&mut self, tag: u64) -> Completed {
        let command = self.wait_command(tag);
        self.finish(command)
    }

    /// With timing on: counts how long after the device finished `command`
    /// (stamped at submission, on a timed device) the path noticed it at
    /// `now`, for `requests` requests.
    pub fn note_noticed(&mut self, command: &Command, now: u64, requests: u64) {
        if now > 0 && command.submitted_ns > 0 && command.device_ns > 0 {
            let done = command.submitted_ns + command.device_ns;
            self.stats.noticed_ns += now.saturating_sub(done) * requests;
            self.stats.noticed += requests;
        }
    }

    /// Turns a finished single-segment (or flush) command into a [`Completed`]
    /// and recycles the command.
    pub fn finish(&mut self, command: Command) -> Completed {
        if crate::path::timing::on() {
            self.note_noticed(&command, now_ns(), 1);
        }
        let (offset, len, raw) = match command.segments.first() {
            Some(seg) => (seg.offset, seg.len, seg.result),
            None => (0, 0, command.result),
        };
        let result = self.result_of(command.op, offset, len, raw);
        self.stats.requests += 1;
        self.stats.device_ns += command.device_ns;
        let completed =
            Completed { tag: command.tag, op: command.op, offset, len, device_ns: command.device_ns, result };
        self.recycle(command);
        completed
    }

    /// The [`Completed`] of a blocking request that another queue carried
    /// (the `auto` dispatch's shared one): `raw` is bytes or -errno, `looks`
    /// and `sleeps` are its owner's wait's.
    pub fn finish_carried(&mut self, request: &Request, raw: i32, looks: u64, sleeps: u64) -> Completed {
        self.stats.requests += 1;
        self.stats.wait.polls += looks;
        self.stats.wait.sleeps += sleeps;
        Completed {
            tag: request.tag,
            op: request.op,
            offset: request.offset,
            len: request.len,
            device_ns: 0,
            result: self.result_of(request.op, request.offset, request.len, raw),
        }
    }

    /// [`request_result`], with this channel's timeout in a timeout error.
    fn result_of(&self, op: Op, offset: u64, len: u32, raw: i32) -> Result<()> {
        let mut result = request_result(op, offset, len, raw);
        if let Err(Error::Timeout { timeout_ms, .. }) = &mut result {
            *timeout_ms = self.timeout_ms();
        }
        result
    }

    /// Waits until at least `min` commands have completed and moves every
    /// completed one to `out` as [`Completed`]; returns how many were moved.
    /// Past the timeout every command in flight is cancelled and still
    /// waited for, as in [`Channel::wait_command`].
    pub fn reap_at_least(&mut self, min: usize, out: &mut Vec<Completed>) -> usize {
        let min = min.min(self.done.len() + self.queue.in_flight());
        let mut limit = self.limit_ns();
        let mut cancelled = false;
        if self.done.len() < min.max(1) {
            // Pick up whatever is already there without waiting.
            self.poll_any();
        }
        while self.done.len() < min {
            if !self.wait_any(limit) {
                if cancelled {
                    self.abandon_if_unanswered(Cancel::All);
                } else if now_ns() >= limit {
                    self.cancel(Cancel::All);
                    cancelled = true;
                    limit = u64::MAX;
                }
            }
        }
        let n = self.done.len();
        while let Some(mut command) = self.done.pop() {
            if cancelled {
                timed_out(&mut command);
            }
            let completed = self.finish(command);
            out.push(completed);
        }
        n
    }

    // ---- hand-off waiters (merging dispatch strategies) ----

    /// This channel's doorbell.
    pub fn doorbell(&self) -> &Arc<Doorbell> {
        &self.doorbell
    }

    /// The waiter for blocking calls.
    pub fn blocking_waiter(&self) -> &Waiter {
        self.waiters.last().expect("a channel always has a blocking waiter")
    }

    /// Arms the waiter for queued slot `tag` with `request` and records it as in flight.
    pub fn arm_queued(&mut self, request: Request) -> Result<&Waiter> {
        let index = request.tag as usize;
        if index + 1 >= self.waiters.len() || !self.waiters[index].is_done() {
            return Err(Error::spec("tag", request.tag.to_string(), "queued tag out of range or already in flight"));
        }
        self.waiters[index].arm(request);
        self.waiting.push(index);
        Ok(&self.waiters[index])
    }

    /// Queued waiters that have completed.
    pub fn queued_done(&self) -> usize {
        self.waiting.iter().filter(|&&i| self.waiters[i].is_done()).count()
    }

    /// Queued waiters still in flight or done but not collected.
    pub fn queued_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Moves completed queued waiters to `out`; returns how many.
    pub fn collect_queued(&mut self, out: &mut Vec<Completed>) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.waiting.len() {
            let index = self.waiting[i];
            if self.waiters[index].is_done() {
                self.waiting.swap_remove(i);
                let completed = self.complete_from_waiter(index);
                out.push(completed);
                n += 1;
            } else {
                i += 1;
            }
        }
        n
    }

    /// The completed blocking request.
    pub fn collect_blocking(&mut self) -> Completed {
        self.complete_from_waiter(self.waiters.len() - 1)
    }

    fn complete_from_waiter(&mut self, index: usize) -> Completed {
        let waiter = &self.waiters[index];
        let request = waiter.request_as_owner();
        let outcome: Outcome = waiter.outcome();
        if outcome.completed_ns > 0 {
            self.stats.woken_ns += now_ns().saturating_sub(outcome.completed_ns);
            self.stats.woken += 1;
        }
        self.stats.requests += 1;
        self.stats.device_ns += outcome.device_ns;
        let result = self.result_of(request.op, request.offset, request.len, outcome.result);
        Completed {
            tag: request.tag,
            op: request.op,
            offset: request.offset,
            len: request.len,
            device_ns: outcome.device_ns,
            result,
        }
    }

    /// Whether any of this channel's waiters is still held by another thread.
    pub fn waiters_in_flight(&self) -> bool {
        self.waiters.iter().any(|w| !w.is_done())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // A serving thread may still hold our waiters: never free them under it.
        while self.waiters_in_flight() {
            self.doorbell.wait_until(0, now_ns() + 10_000_000, || !self.waiters.iter().any(|w| !w.is_done()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::{DeviceSpec, QueueConfig};

    #[test]
    fn a_queue_kept_full_expects_its_next_completion_from_the_last_one_not_from_its_first_command() {
        // One channel: commands served one after another, so completions come one at a time.
        let dev = DeviceSpec::parse("emu:nand,size=16m,channels=1", None).unwrap().open().unwrap();
        let queue = dev.open_queue(&QueueConfig::depth(8)).unwrap();
        // Adaptive starts polling: it sees each completion as it comes, so the queue never drains.
        let mut ch = Channel::new(queue, CompletionKind::Adaptive, 0, 8, 10_000_000_000);
        assert!(ch.stamp_submissions, "adaptive uses what the device is expected to be working on");
        let mut bufs: Vec<IoBuf> = (0..8).map(|_| IoBuf::new(4096)).collect();
        let submit = |ch: &mut Channel, bufs: &mut [IoBuf], i: usize| {
            let mut c = ch.take_command(Op::Read, i as u64);
            c.push(i as u64 * 4096, bufs[i].as_mut_ptr(), 4096);
            // SAFETY: each buffer is in at most one command, and every command is waited for below.
            unsafe { ch.submit_command(c) };
        };
        // Staggered, so that completions come one at a time and the queue never idles.
        for i in 0..8 {
            submit(&mut ch, &mut bufs, i);
            ch.commit();
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        assert!(ch.expect.since_ns > 0);
        // Kept full: every completed command's buffer goes straight back in. Each wait
        // that brings completions back while others stay in flight must move the
        // expectation to now (a queue that idles is stamped anew by its next submission:
        // those waits are not counted).
        let (mut busy_waits, mut moved) = (0, 0);
        for _ in 0..2000 {
            let before = ch.expect.since_ns;
            ch.wait_any(ch.limit_ns());
            let done: Vec<Command> = ch.done.drain(..).collect();
            if !done.is_empty() && ch.in_flight() > 0 {
                busy_waits += 1;
                moved += usize::from(ch.expect.since_ns > before);
            }
            for c in done {
                assert_eq!(c.segments[0].result, 4096);
                submit(&mut ch, &mut bufs, c.tag as usize);
                ch.recycle(c);
            }
            ch.commit();
        }
        assert!(busy_waits > 100, "only {busy_waits} waits with commands left in flight: the test tested nothing");
        assert_eq!(moved, busy_waits, "the expectation stayed at an old submission");
        while ch.in_flight() > 0 {
            ch.wait_any(ch.limit_ns());
            ch.done.clear();
        }
    }
}
