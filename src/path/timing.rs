//! Opt-in timestamps of where a request's time goes: waiting to be sent,
//! the device, the completion being noticed, the waiter being woken.
//!
//! Off by default, so the hot path of an ordinary run reads the clock no
//! more often than its completion policy needs. `iopath reproduce latency`
//! turns it on for its runs; the figures land in [`super::PathStats`]
//! (`noticed_ns`, `woken_ns`) and in the bench JSON's `iopath.steps_ns`.
//! The "noticed" step needs the device's own completion time, which only
//! timed devices (emulated ones) report; elsewhere it stays empty.

use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the timestamps on or off for every engine in the process.
pub fn set(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether the timestamps are on.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}
