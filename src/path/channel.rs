//! A thread's channel to the device: its queue, its preallocated commands,
//! its completed-but-unclaimed commands and its counters.
//!
//! Channels are per thread (SPDK's `io_channel`): nothing in here is shared,
//! so the hot path takes no lock and allocates nothing once the command pool
//! is warm. Dispatch strategies build on the primitives here.

use super::completion::{CompletionPolicy, WaitStats};
use super::dispatch::Request;
use crate::clock::now_ns;
use crate::device::{Command, Op, Queue, Segment};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Counters of one channel; summed over threads for a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Requests completed.
    pub requests: u64,
    /// Device commands sent.
    pub commands: u64,
    /// Segments in those commands.
    pub segments: u64,
    /// Sum of per-request device time (timed devices).
    pub device_ns: u64,
    /// The completion policy's counters.
    pub wait: WaitStats,
}

impl PathStats {
    /// Adds another channel's counters.
    pub fn add(&mut self, other: &PathStats) {
        self.requests += other.requests;
        self.commands += other.commands;
        self.segments += other.segments;
        self.device_ns += other.device_ns;
        self.wait.add(&other.wait);
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

/// Checks one segment's result against what was asked.
pub fn segment_result(op: Op, seg: &Segment) -> Result<()> {
    if seg.result < 0 {
        Err(Error::Device { op: op.name(), offset: seg.offset, len: seg.len as u64, errno: -seg.result })
    } else if (seg.result as u32) < seg.len {
        Err(Error::Short { op: op.name(), offset: seg.offset, len: seg.len as u64, done: seg.result as u64 })
    } else {
        Ok(())
    }
}

/// One thread's channel.
pub struct Channel {
    queue: Box<dyn Queue>,
    completion: Arc<dyn CompletionPolicy>,
    pool: Vec<Command>,
    done: Vec<Command>,
    max_segments: usize,
    timeout_ns: Option<u64>,
    /// Counters.
    pub stats: PathStats,
}

impl Channel {
    /// A channel over `queue`; `timeout_ns` is `None` for devices that must be
    /// waited for without limit.
    pub fn new(
        queue: Box<dyn Queue>,
        completion: Arc<dyn CompletionPolicy>,
        depth: usize,
        max_segments: usize,
        timeout_ns: Option<u64>,
    ) -> Channel {
        Channel {
            queue,
            completion,
            pool: (0..depth).map(|_| Command::with_capacity(1)).collect(),
            done: Vec::with_capacity(depth),
            max_segments,
            timeout_ns,
            stats: PathStats::default(),
        }
    }

    /// Most segments one command to this channel's device may carry.
    pub fn max_segments(&self) -> usize {
        self.max_segments
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
    pub unsafe fn submit_command(&mut self, command: Command) {
        self.stats.commands += 1;
        self.stats.segments += command.segments.len() as u64;
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.queue.submit(command) };
    }

    /// Queues one single-segment request without committing.
    ///
    /// # Safety
    ///
    /// `request.buf` must stay valid and untouched until the request is reaped.
    pub unsafe fn queue_one(&mut self, request: Request) {
        let mut command = self.take_command(request.op, request.tag);
        if request.op != Op::Flush {
            command.push(request.offset, request.buf, request.len);
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.submit_command(command) };
    }

    /// Queues and commits one request.
    ///
    /// # Safety
    ///
    /// As [`Channel::queue_one`].
    pub unsafe fn send_one(&mut self, request: Request) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.queue_one(request) };
        self.commit()
    }

    /// Sends queued commands to the device.
    pub fn commit(&mut self) -> Result<()> {
        self.queue.commit()
    }

    /// Commands submitted and not yet handed back by the device.
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight()
    }

    fn limit_ns(&self) -> u64 {
        self.timeout_ns.map_or(u64::MAX, |t| now_ns().saturating_add(t))
    }

    /// Waits through the completion policy until at least one more command is
    /// back; fails with a timeout when the limit passes.
    fn wait_more(&mut self, limit_ns: u64, tag_for_error: Option<&Request>) -> Result<()> {
        let n = self.completion.wait(self.queue.as_mut(), &mut self.done, &mut self.stats.wait, limit_ns)?;
        if n == 0 && now_ns() >= limit_ns {
            let (op, offset) = tag_for_error.map_or(("request", 0), |r| (r.op.name(), r.offset));
            return Err(Error::Timeout { op, offset, timeout_ms: self.timeout_ns.unwrap_or(0) / 1_000_000 });
        }
        Ok(())
    }

    /// Waits for the command with `tag` and hands it back whole (all segments' results).
    pub fn wait_command(&mut self, tag: u64) -> Result<Command> {
        let limit = self.limit_ns();
        loop {
            if let Some(pos) = self.done.iter().position(|c| c.tag == tag) {
                return Ok(self.done.swap_remove(pos));
            }
            self.wait_more(limit, None)?;
        }
    }

    /// Waits for the single-segment request with `tag` and returns its result.
    pub fn wait_for(&mut self, tag: u64) -> Result<Completed> {
        let command = self.wait_command(tag)?;
        Ok(self.finish(command))
    }

    /// Turns a finished single-segment (or flush) command into a [`Completed`]
    /// and recycles the command.
    pub fn finish(&mut self, command: Command) -> Completed {
        let (offset, len, result) = match command.segments.first() {
            Some(seg) => (seg.offset, seg.len, segment_result(command.op, seg)),
            None if command.result < 0 => {
                (0, 0, Err(Error::Device { op: command.op.name(), offset: 0, len: 0, errno: -command.result }))
            }
            None => (0, 0, Ok(())),
        };
        self.stats.requests += 1;
        self.stats.device_ns += command.device_ns;
        let completed =
            Completed { tag: command.tag, op: command.op, offset, len, device_ns: command.device_ns, result };
        self.recycle(command);
        completed
    }

    /// Waits until at least `min` commands have completed and moves every
    /// completed one to `out` as [`Completed`]; returns how many were moved.
    pub fn reap_at_least(&mut self, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        let min = min.min(self.done.len() + self.queue.in_flight());
        let limit = self.limit_ns();
        if self.done.len() < min.max(1) {
            // Pick up whatever is already there without waiting.
            self.queue.reap(&mut self.done)?;
        }
        while self.done.len() < min {
            self.wait_more(limit, None)?;
        }
        let n = self.done.len();
        while let Some(command) = self.done.pop() {
            let completed = self.finish(command);
            out.push(completed);
        }
        Ok(n)
    }
}
