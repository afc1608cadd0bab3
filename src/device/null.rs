//! `null`: a device that completes every command at once and moves no data.
//!
//! What is left when it is used is the pure software cost of a path (fio's
//! null ioengine, SPDK's null bdev). Reads leave the buffer untouched.

use super::spec::Options;
use super::{Capabilities, Command, Device, DeviceStats, Queue, QueueConfig};
use crate::error::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Options of the null device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NullConfig {
    /// Pretended size in bytes (default 1 TiB).
    pub size: u64,
}

impl NullConfig {
    /// Parses `null[:size=N]`.
    pub fn parse(mut opts: Options, default_size: Option<u64>) -> Result<NullConfig> {
        let size = opts.take_size("size")?.or(default_size).unwrap_or(1 << 40);
        opts.finish(&["size"])?;
        Ok(NullConfig { size })
    }
}

#[derive(Default)]
struct Counters {
    commands: AtomicU64,
    segments: AtomicU64,
    bytes: AtomicU64,
}

/// The null device.
pub struct NullDevice {
    size: u64,
    counters: Arc<Counters>,
}

impl NullDevice {
    /// A null device of the configured size.
    pub fn new(config: &NullConfig) -> NullDevice {
        NullDevice { size: config.size, counters: Arc::default() }
    }
}

impl Device for NullDevice {
    fn describe(&self) -> String {
        format!("null ({} bytes, no device time, no data)", self.size)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_segments: 1024,
            max_segment_bytes: 1 << 20,
            alignment: 1,
            queue_depth: 4096,
            kernel_poll: false,
            timed: false,
            stores_data: false,
        }
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(NullQueue {
            done: Vec::with_capacity(config.depth as usize),
            counters: Arc::clone(&self.counters),
        }))
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            commands: self.counters.commands.load(Ordering::Relaxed),
            segments: self.counters.segments.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            busy_ns: 0,
        }
    }
}

struct NullQueue {
    done: Vec<Command>,
    counters: Arc<Counters>,
}

impl Queue for NullQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        self.counters.commands.fetch_add(1, Ordering::Relaxed);
        self.counters.segments.fetch_add(command.segments.len() as u64, Ordering::Relaxed);
        self.counters.bytes.fetch_add(command.bytes(), Ordering::Relaxed);
        for seg in &mut command.segments {
            seg.result = seg.len as i32;
        }
        self.done.push(command);
    }

    fn commit(&mut self) -> Result<()> {
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        let n = self.done.len();
        out.append(&mut self.done);
        Ok(n)
    }

    fn wait(&mut self, out: &mut Vec<Command>, _timeout_ns: u64) -> Result<usize> {
        self.reap(out)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
