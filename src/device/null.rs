//! `null`: a device that completes every command at once and moves no data.
//!
//! What is left when it is used is the pure software cost of a path (fio's
//! null ioengine, SPDK's null bdev). Reads leave the buffer untouched.

use super::spec::Options;
use super::{Capabilities, Command, Counters, Device, DeviceStats, Finished, Queue, QueueConfig};
use crate::error::Result;
use std::sync::Arc;

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
            submits_at_commit: true,
        }
    }

    fn completion_source(&self, _polled: bool) -> String {
        "none: a null command completes when it is submitted".into()
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(NullQueue {
            done: Finished::with_capacity(config.depth as usize),
            counters: Arc::clone(&self.counters),
        }))
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

struct NullQueue {
    done: Finished,
    counters: Arc<Counters>,
}

impl Queue for NullQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        self.counters.record(&command);
        for seg in &mut command.segments {
            seg.result = seg.len as i32;
        }
        self.done.push(command);
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
