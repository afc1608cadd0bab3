//! `hybrid`: hybrid temporal merge (seed 000 §4.6, HTM).
//!
//! Latency-sensitive requests (the blocking API: a caller waits for each
//! one) take the synchronous combining path; queued requests (depth > 1,
//! write-back style) take the plugged queue and its dispatcher. Both share
//! the device.

use super::combine::Combine;
use super::queue::QueueDispatch;
use super::{Dispatch, Request};
use crate::clock::ThreadUsage;
use crate::error::Result;
use crate::path::PathStats;
use crate::path::channel::{Channel, Completed};

/// The hybrid strategy.
pub struct Hybrid {
    combine: Combine,
    queue: QueueDispatch,
}

impl Hybrid {
    /// Combines a combining path for blocking requests with a queue for queued ones.
    pub fn new(combine: Combine, queue: QueueDispatch) -> Hybrid {
        Hybrid { combine, queue }
    }
}

impl Dispatch for Hybrid {
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.combine.blocking(channel, request) }
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.queue.submit(channel, request) }
    }

    fn commit(&self, channel: &mut Channel) -> Result<()> {
        self.queue.commit(channel)
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        self.queue.reap(channel, min, out)
    }

    fn background_stats(&self) -> PathStats {
        let mut stats = self.queue.background_stats();
        stats.add(&self.combine.background_stats());
        stats
    }

    fn background_usage(&self) -> ThreadUsage {
        self.queue.background_usage()
    }
}
