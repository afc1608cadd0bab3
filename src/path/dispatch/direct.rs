//! `direct`: the caller sends its own request and waits for it itself.
//!
//! This is the synchronous path of seed 000 (SyncPath) when combined with the
//! `poll` completion policy: no hand-off to another thread, no queue shared
//! with other threads, no context switch. Each thread uses its own device
//! queue, so threads only meet inside the device.

use super::{Dispatch, Request};
use crate::error::Result;
use crate::path::channel::{Channel, Completed};

/// The direct dispatch strategy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Direct;

impl Dispatch for Direct {
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        // A thread that would sleep until woken makes the kernel's own blocking call
        // where it can; else a sleeping wait sends the request.
        // SAFETY: forwarded from the caller's contract.
        if let Some(done) = unsafe { channel.run_blocking(request) } {
            return Ok(done);
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { channel.send_one_to_wait(request) };
        // Even when the commit failed: the command comes back (failed) and only then
        // is the caller's buffer its own again.
        Ok(channel.wait_for(request.tag))
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { channel.queue_one(request) };
        Ok(())
    }

    fn commit(&self, channel: &mut Channel) -> Result<()> {
        channel.commit();
        Ok(())
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        Ok(channel.reap_at_least(min, out))
    }
}
