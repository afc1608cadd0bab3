//! The device layer: something that accepts commands and reports completions.
//!
//! A [`Command`] is one direction (read, write, flush) and a list of
//! [`Segment`]s, each a device offset, a length and a host buffer. A command
//! may carry up to [`Capabilities::max_segments`] discontiguous segments (the
//! emulated device's scatter/gather "Block Control Table"); this is what makes
//! temporal merging possible.
//!
//! A [`Device`] is shared by all threads. Each thread that talks to it opens
//! its own [`Queue`] (a submission/completion channel, like an NVMe queue pair
//! or an io_uring instance), so submission takes no shared lock in the
//! backends that do not need one. Commands are moved into the queue on
//! submission and handed back, with per-segment results filled in, when they
//! are reaped: the queue owns a command (and may touch its buffers) exactly
//! while it is in flight.
//!
//! One file per backend: [`emu`] (emulated ultra-low-latency SSD), [`null`]
//! (no device time, no data), [`psync`] (pread/pwrite), [`uring`] (io_uring),
//! [`aio`] (Linux native AIO, completions read from its ring by any thread).

pub mod aio;
pub mod emu;
pub mod fault;
pub mod model;
pub mod null;
pub mod psync;
pub mod spec;
pub mod store;
pub mod target;
pub mod uring;
pub mod volatile;

use crate::error::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use spec::{DeviceSpec, open_device};

/// Direction of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Device to host.
    Read,
    /// Host to device.
    Write,
    /// Make earlier writes durable.
    Flush,
    /// Discard a range (no buffer): it reads back as zeros afterwards. On a
    /// file or block device a punched hole (`fallocate(PUNCH_HOLE)`, which a
    /// block device turns into a discard or write-zeroes), on the emulated
    /// device a command with no transfer.
    Trim,
}

impl Op {
    /// Lower-case name used in messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
        }
    }
}

/// One contiguous piece of a command: device range plus host buffer.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    /// Byte offset on the device.
    pub offset: u64,
    /// Host buffer: written for reads, read for writes.
    pub buf: *mut u8,
    /// Length in bytes.
    pub len: u32,
    /// Set by the device on completion: bytes moved (>= 0) or a negative errno.
    pub result: i32,
}

// SAFETY: a Segment is a plain description of memory; the submitter of the
// command guarantees (see `Queue::submit`) that the buffer stays valid while the
// command is in flight, whichever thread completes it.
unsafe impl Send for Segment {}

/// When a write is durable on a device with a volatile write cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// After the next flush; a power cut before it may lose or tear it.
    #[default]
    Cached,
    /// When it completes: forced unit access (Linux's `REQ_FUA`; io_uring and
    /// psync write it with `RWF_DSYNC`, which a block device without FUA turns
    /// into a write and a flush in the kernel). Says nothing of earlier writes.
    Fua,
    /// Everything that completed before it is made durable first, then it is
    /// written with FUA, as one command (Linux's `REQ_PREFLUSH | REQ_FUA`, which
    /// jbd2 gives its commit block): a journal's commit in one round trip
    /// instead of a flush and a write-then-flush.
    Ordered,
}

/// One device command: a direction and up to `max_segments` segments.
#[derive(Debug)]
pub struct Command {
    /// Direction.
    pub op: Op,
    /// Caller's identifier, returned untouched on completion.
    pub tag: u64,
    /// The segments; empty for a flush.
    pub segments: Vec<Segment>,
    /// Set on completion for timed devices: nanoseconds from submission until
    /// the device finished the command (queueing inside the device included).
    /// Zero when the backend cannot know it.
    pub device_ns: u64,
    /// Set on completion for a command with no segments (flush), and for a
    /// `Ordered` write whose leading flush failed: 0 or -errno.
    pub result: i32,
    /// When a write is durable ([`Durability`]); plain writes are `Cached`.
    pub durability: Durability,
    /// When the path handed it to the device (monotonic ns; 0 when not
    /// stamped, see [`crate::path::timing`]).
    pub submitted_ns: u64,
}

impl Command {
    /// An empty read command with room for `segments` segments (allocates once).
    pub fn with_capacity(segments: usize) -> Command {
        Command {
            op: Op::Read,
            tag: 0,
            segments: Vec::with_capacity(segments),
            device_ns: 0,
            result: 0,
            durability: Durability::Cached,
            submitted_ns: 0,
        }
    }

    /// Clears the command for reuse, keeping its allocation.
    pub fn reset(&mut self, op: Op, tag: u64) {
        self.op = op;
        self.tag = tag;
        self.segments.clear();
        self.device_ns = 0;
        self.result = 0;
        self.durability = Durability::Cached;
        self.submitted_ns = 0;
    }

    /// Appends a segment.
    pub fn push(&mut self, offset: u64, buf: *mut u8, len: u32) {
        self.segments.push(Segment { offset, buf, len, result: 0 });
    }

    /// Total bytes over all segments.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len as u64).sum()
    }

    /// Marks every segment (and the command) as failed with `errno`.
    pub fn fail_all(&mut self, errno: i32) {
        self.result = -errno;
        for seg in &mut self.segments {
            seg.result = -errno;
        }
    }
}

/// What a device can do; upper layers read this instead of asking which backend it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Most segments one command may carry.
    pub max_segments: usize,
    /// Largest single segment in bytes.
    pub max_segment_bytes: u32,
    /// Required alignment of buffer addresses, offsets and lengths (1 = none).
    pub alignment: u32,
    /// Most commands one queue can have in flight.
    pub queue_depth: u32,
    /// Whether the kernel can poll this device for completions (io_uring IOPOLL).
    pub kernel_poll: bool,
    /// Whether the device reports a model service time per command (`Command::device_ns`).
    pub timed: bool,
    /// Whether data written can be read back (false for `null`).
    pub stores_data: bool,
    /// Whether [`Queue::commit`] hands every command submitted before it to
    /// the device (for a kernel device: to the kernel's block layer) before
    /// it returns. False where a thread of the device's takes them later
    /// (io_uring with SQPOLL): a process that dies just after such a commit
    /// may lose what it sent.
    pub submits_at_commit: bool,
}

/// Counters a device keeps about itself; compare two snapshots to measure an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceStats {
    /// Commands accepted.
    pub commands: u64,
    /// Segments accepted.
    pub segments: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Nanoseconds with at least one command in service (timed devices only).
    pub busy_ns: u64,
    /// Faults injected by the [`fault`] wrapper.
    pub faults_injected: u64,
    /// Times the [`fault`] wrapper's audit found a buffer changed while the
    /// device owned it (a path that handed memory back too early): always 0
    /// unless there is a bug.
    pub ownership_violations: u64,
}

impl DeviceStats {
    /// The counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceStats) -> DeviceStats {
        DeviceStats {
            commands: self.commands - earlier.commands,
            segments: self.segments - earlier.segments,
            bytes: self.bytes - earlier.bytes,
            busy_ns: self.busy_ns - earlier.busy_ns,
            faults_injected: self.faults_injected - earlier.faults_injected,
            ownership_violations: self.ownership_violations - earlier.ownership_violations,
        }
    }

    /// Adds another device's counters (jobs reported as one group).
    pub fn add(&mut self, other: &DeviceStats) {
        self.commands += other.commands;
        self.segments += other.segments;
        self.bytes += other.bytes;
        self.busy_ns = self.busy_ns.max(other.busy_ns);
        self.faults_injected += other.faults_injected;
        self.ownership_violations += other.ownership_violations;
    }
}

/// Command, segment and byte counters for backends without a timing model,
/// shared by all of a device's queues.
#[derive(Debug, Default)]
pub struct Counters {
    commands: AtomicU64,
    segments: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    /// Counts one accepted command.
    pub fn record(&self, command: &Command) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        self.segments.fetch_add(command.segments.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(command.bytes(), Ordering::Relaxed);
    }

    /// Counts one command of `segments` requests moving `bytes`.
    pub fn record_batch(&self, segments: u64, bytes: u64) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        self.segments.fetch_add(segments, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters now (no busy time: these backends do not know it).
    pub fn snapshot(&self) -> DeviceStats {
        DeviceStats {
            commands: self.commands.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            ..DeviceStats::default()
        }
    }
}

/// Commands a synchronous backend finished inside `submit`, waiting to be
/// handed back by `reap` or `wait` (which never need to block).
#[derive(Debug, Default)]
pub struct Finished(Vec<Command>);

impl Finished {
    /// Room for `depth` commands.
    pub fn with_capacity(depth: usize) -> Finished {
        Finished(Vec::with_capacity(depth))
    }

    /// Adds a finished command.
    pub fn push(&mut self, command: Command) {
        self.0.push(command);
    }

    /// Moves every finished command to `out`; returns how many.
    pub fn reap(&mut self, out: &mut Vec<Command>) -> usize {
        let n = self.0.len();
        out.append(&mut self.0);
        n
    }

    /// Commands not yet handed back.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether every command has been handed back.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Options for a new queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Most commands the caller will have in flight at once.
    pub depth: u32,
    /// A memory region to pre-register with the kernel (io_uring fixed buffers);
    /// buffers inside it are then used without per-I/O page pinning.
    pub registered: Option<(*mut u8, usize)>,
    /// Whether the waiter will spin for completions (poll, hybrid, adaptive).
    /// A device that can poll in the kernel uses a polled queue only then:
    /// an interrupt-driven waiter on a polled queue would spin in the kernel.
    pub polled: bool,
    /// Whether several threads take turns using the queue (one at a time,
    /// under the caller's lock), as the combining strategy's serving role
    /// does. A backend whose queues are otherwise tied to the thread that
    /// opened them (io_uring's `SINGLE_ISSUER | DEFER_TASKRUN`) sets such a
    /// queue up without that tie.
    pub shared: bool,
}

// SAFETY: the registered region is only an address range handed to the kernel;
// the engine that owns the memory outlives every queue it opens.
unsafe impl Send for QueueConfig {}

impl QueueConfig {
    /// A queue of the given depth with no registered memory, for a spinning waiter.
    pub fn depth(depth: u32) -> QueueConfig {
        QueueConfig { depth, registered: None, polled: true, shared: false }
    }
}

/// A storage device shared by all threads of an engine.
pub trait Device: Send + Sync {
    /// Human-readable description, e.g. `emu:dram-ssd (1 slot, 1 channel, ...)`.
    fn describe(&self) -> String;
    /// Usable size in bytes.
    fn size(&self) -> u64;
    /// What the device can do.
    fn capabilities(&self) -> Capabilities;
    /// Where a waiter learns of completions, for reports: what a spinning
    /// (`polled`) or a sleeping waiter actually waits on with this device.
    fn completion_source(&self, polled: bool) -> String;
    /// Opens a submission/completion queue for one thread.
    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>>;
    /// Linux AIO on the same file, one context that many threads share, for
    /// the `auto` dispatch to send the requests of a crowd of blocked
    /// threads through: any thread sees any completion with a load from
    /// memory, whoever sent it (an io_uring ring posts a completion only
    /// when its submitter enters the kernel). The same one each time it is
    /// asked, its requests counted in this device's [`Device::stats`].
    /// `Ok(None)` where there is none (the default).
    fn shared_aio(&self) -> Result<Option<Arc<aio::SharedAio>>> {
        Ok(None)
    }
    /// Snapshot of the device's counters.
    fn stats(&self) -> DeviceStats {
        DeviceStats::default()
    }
    /// Sustained bandwidth in bytes/s for a mix with this share of reads when
    /// commands are as large as the device allows; `None` when unknown.
    fn peak_bandwidth(&self, _read_fraction: f64) -> Option<f64> {
        None
    }
}

/// Which commands [`Queue::cancel`] asks the device to give up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The command with this tag.
    Tag(u64),
    /// Every command in flight.
    All,
}

impl Cancel {
    /// Whether the command with `tag` is among those meant.
    pub fn covers(self, tag: u64) -> bool {
        self == Cancel::All || self == Cancel::Tag(tag)
    }
}

/// One thread's channel to a device.
///
/// Ownership rule, the one every path relies on: from [`Queue::submit`]
/// until the command is handed back by [`Queue::reap`] or [`Queue::wait`],
/// the device owns the command's buffers and may read or write them at any
/// moment. No error changes that. A failed `commit` hands the commands the
/// device did not take back failed; a failed `reap` or `wait` leaves every
/// command in flight (try again); a timeout is a [`Queue::cancel`] followed
/// by more waiting, or, once the device has stopped answering, a
/// [`Queue::abandon`] of what it can promise never to touch. So a caller
/// frees or reuses a buffer only after its command came back.
pub trait Queue: Send {
    /// Hands a command to the device. It is returned by [`Queue::reap`] or
    /// [`Queue::wait`] with every segment's `result` set; a command the device
    /// cannot start is returned the same way, failed, never dropped.
    ///
    /// The caller keeps at most `QueueConfig::depth` commands in flight.
    ///
    /// # Safety
    ///
    /// Every segment's buffer must be valid for `len` bytes (writable for
    /// reads) and must not be touched by anyone else until the command has
    /// been returned by `reap` or `wait`.
    unsafe fn submit(&mut self, command: Command);
    /// Makes submitted commands visible to the device (one `io_uring_enter`
    /// for a whole batch); a no-op for backends that start commands at once.
    /// On an error, every submitted command the device did not accept is
    /// handed back failed by the next `reap`/`wait`, and the ones it did
    /// accept complete as usual: the caller goes on reaping either way.
    fn commit(&mut self) -> Result<()>;
    /// Moves completed commands into `out` without blocking; returns how many.
    /// An error hands nothing back and leaves every command in flight.
    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize>;
    /// Blocks until at least one command completes or `timeout_ns` passes
    /// (an interrupt-driven wait), then moves completed commands into `out`.
    /// It may come back empty earlier (a signal, io_uring's watchdog): callers
    /// wait again until their own limit.
    /// An error leaves every command in flight, as for `reap`.
    fn wait(&mut self, out: &mut Vec<Command>, timeout_ns: u64) -> Result<usize>;
    /// Commands submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// Carries `command` out in the calling thread with the kernel's own
    /// blocking calls (pread, pwrite), setting every segment's result, where
    /// this queue can; the thread sleeps in the kernel as a program's own call
    /// would, with no ring in between. Returns false, `command` untouched,
    /// where it cannot (the default): the caller submits it then. Never
    /// counted in flight, and beyond the path's timeout: like the program's
    /// own call, it returns when the kernel's does (O_DIRECT block I/O under
    /// way cannot be cancelled through a ring either).
    ///
    /// # Safety
    ///
    /// Every segment's buffer must be valid for its length (writable for
    /// reads) for the duration of the call.
    unsafe fn run_blocking(&mut self, command: &mut Command) -> bool {
        let _ = command;
        false
    }
    /// Whether [`Queue::reap`] and [`Queue::wait`] send submitted commands
    /// that were not committed yet (io_uring: one `io_uring_enter` submits
    /// and sleeps). A caller about to sleep may then leave the commit to its
    /// wait: one system call per request instead of two. Where this is false
    /// (the default), only [`Queue::commit`] sends.
    fn sends_when_waiting(&self) -> bool {
        false
    }
    /// When the earliest in-flight command is expected to complete, if known.
    fn next_deadline_ns(&self) -> Option<u64> {
        None
    }
    /// Asks the device to give up on commands (a request timed out). It is a
    /// request, not a release: each command still comes back through `reap`
    /// or `wait`, with `-ECANCELED` in what the device gave up on, or with
    /// its real results if it had finished or cannot be stopped (O_DIRECT
    /// block I/O under way usually cannot). Only then are its buffers free.
    fn cancel(&mut self, which: Cancel) -> Result<()> {
        let _ = which;
        Ok(())
    }
    /// For a device that stopped answering (every wait and reap failed for
    /// a whole timeout after a cancel): moves into `out` at once, failed with
    /// `-ECANCELED`, the commands in `which` whose buffers the device can
    /// promise never to touch again, and returns how many. The caller may
    /// free those buffers. The default promises nothing (a kernel queue may
    /// still write into a buffer it was given), so such a queue's commands
    /// are waited for as before.
    fn abandon(&mut self, which: Cancel, out: &mut Vec<Command>) -> usize {
        let _ = (which, out);
        0
    }
}
