//! `psync`: pread/pwrite, the plain synchronous baseline.
//!
//! A command is carried out inside `submit`, one system call per segment, so
//! it is complete before `submit` returns; `reap` and `wait` only hand it back.

use super::spec::Options;
use super::target::{Target, TargetConfig};
use super::{Capabilities, Command, Counters, Device, DeviceStats, Durability, Finished, Op, Queue, QueueConfig};
use crate::error::Result;
use crate::sys;
use std::sync::Arc;

/// Options of the psync backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsyncConfig {
    /// The file or block device.
    pub target: TargetConfig,
}

impl PsyncConfig {
    /// Parses `psync:PATH[,direct=0|1][,size=N][,readonly=1]`.
    pub fn parse(path: &str, mut opts: Options, default_size: Option<u64>) -> Result<PsyncConfig> {
        let target = TargetConfig::parse(path, &mut opts, default_size)?;
        opts.finish(&["direct", "size", "readonly"])?;
        Ok(PsyncConfig { target })
    }
}

/// Shared between the device and its queues.
struct Shared {
    target: Target,
    counters: Counters,
}

/// pread/pwrite on a file or block device.
pub struct PsyncDevice {
    shared: Arc<Shared>,
}

impl PsyncDevice {
    /// Opens the target.
    pub fn open(config: &PsyncConfig) -> Result<PsyncDevice> {
        let target = Target::open(&config.target)?;
        Ok(PsyncDevice { shared: Arc::new(Shared { target, counters: Counters::default() }) })
    }
}

impl Device for PsyncDevice {
    fn describe(&self) -> String {
        format!("psync:{}", self.shared.target.describe())
    }

    fn size(&self) -> u64 {
        self.shared.target.size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_segments: 1024,
            max_segment_bytes: self.shared.target.max_segment_bytes(),
            alignment: self.shared.target.alignment,
            queue_depth: 4096,
            kernel_poll: false,
            timed: false,
            stores_data: true,
            submits_at_commit: true,
        }
    }

    fn completion_source(&self, _polled: bool) -> String {
        "none: pread/pwrite complete inside the call (the kernel sleeps for the waiter)".into()
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(PsyncQueue {
            shared: Arc::clone(&self.shared),
            done: Finished::with_capacity(config.depth as usize),
        }))
    }

    fn stats(&self) -> DeviceStats {
        self.shared.counters.snapshot()
    }
}

struct PsyncQueue {
    shared: Arc<Shared>,
    done: Finished,
}

/// Moves all `len` bytes with pread/pwrite, retrying short transfers and
/// EINTR; a `durable` write with `RWF_DSYNC` (forced unit access).
///
/// # Safety
///
/// `buf` must be valid for `len` bytes (writable for reads).
unsafe fn transfer(file: &std::fs::File, op: Op, durable: bool, offset: u64, buf: *mut u8, len: usize) -> i32 {
    let mut done = 0usize;
    while done < len {
        // SAFETY: `buf + done .. buf + len` lies inside the caller's valid buffer.
        let moved = unsafe {
            let p = buf.add(done);
            let at = offset + done as u64;
            match op {
                Op::Read => sys::pread(file, p, len - done, at),
                _ if durable => sys::pwrite_dsync(file, p, len - done, at),
                _ => sys::pwrite(file, p, len - done, at),
            }
        };
        match moved {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return -e.raw_os_error().unwrap_or(libc::EIO),
            // End of file: report what was moved; the engine treats a short read as an error.
            Ok(0) => break,
            Ok(n) => done += n,
        }
    }
    done as i32
}

/// Carries `command` out with pread/pwrite/fdatasync (and hole punching for
/// trims) on `file`, setting every segment's result: a flush, and an ordered
/// write's flush first, then the data, a durable write's with `RWF_DSYNC`
/// (forced unit access where the device has it; where it has none the
/// kernel writes and flushes, as a datasync after the write did). Shared by this backend and io_uring's blocking
/// calls ([`Queue::run_blocking`]).
///
/// # Safety
///
/// Every segment's buffer must be valid for its length (writable for reads)
/// for the duration of the call.
pub(super) unsafe fn run_command(file: &std::fs::File, command: &mut Command) {
    let datasync = || match sys::fdatasync(file) {
        Ok(()) => 0,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    };
    let durability = if command.op == Op::Write { command.durability } else { Durability::Cached };
    if command.op == Op::Flush || durability == Durability::Ordered {
        // An ordered write's flush comes first: what completed before it is durable
        // before its data is written.
        command.result = datasync();
        if command.result < 0 {
            let errno = -command.result;
            command.fail_all(errno);
            return;
        }
    }
    let op = command.op;
    for seg in &mut command.segments {
        seg.result = if op == Op::Trim {
            match sys::punch_hole(file, seg.offset, seg.len as u64) {
                Ok(()) => 0,
                Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
            }
        } else {
            // SAFETY: the caller guarantees each buffer for the call.
            unsafe { transfer(file, op, durability != Durability::Cached, seg.offset, seg.buf, seg.len as usize) }
        };
    }
}

impl Queue for PsyncQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        self.shared.counters.record(&command);
        // SAFETY: the submitter guarantees each buffer for the command's lifetime.
        unsafe { run_command(&self.shared.target.file, &mut command) };
        self.done.push(command);
    }

    unsafe fn run_blocking(&mut self, command: &mut Command) -> bool {
        self.shared.counters.record(command);
        // SAFETY: forwarded from the caller's contract.
        unsafe { run_command(&self.shared.target.file, command) };
        true
    }

    fn commit(&mut self) -> Result<()> {
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        Ok(self.done.reap(out))
    }

    fn wait(&mut self, out: &mut Vec<Command>, _timeout_ns: u64) -> Result<usize> {
        self.reap(out)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
