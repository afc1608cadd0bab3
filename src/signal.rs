//! Ctrl-C and SIGTERM: ending a run cleanly.
//!
//! [`install`] (the `iopath` tool calls it first thing) catches SIGINT and
//! SIGTERM. The first one only raises a flag, [`interrupted`], that long
//! operations look at: benchmark threads stop issuing, finish what is in
//! flight and report what they measured (marked partial), a lay-out stops
//! and removes the file it was creating, `compare` runs no further cells. A
//! second signal exits at once, as a user pressing Ctrl-C twice expects.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

const FIRST_NOTICE: &[u8] = b"\niopath: interrupted: finishing the requests in flight and printing what was measured \
(marked partial); press Ctrl-C again to exit at once\n";

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe work in here: atomics, write(2) and _exit(2).
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        crate::sys::exit_now(128 + signal);
    }
    SIGNAL.store(signal, Ordering::SeqCst);
    crate::sys::write_stderr_raw(FIRST_NOTICE);
}

/// Catches SIGINT and SIGTERM (see the module comment).
pub fn install() -> std::io::Result<()> {
    crate::sys::on_signals(&[libc::SIGINT, libc::SIGTERM], on_signal)
}

/// Whether SIGINT or SIGTERM arrived (after [`install`]), or [`interrupt`] was called.
#[inline]
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// The signal that interrupted the run (0 if none, or if [`interrupt`] raised the flag).
pub fn signal() -> i32 {
    SIGNAL.load(Ordering::SeqCst)
}

/// Raises the flag as a signal would (for a caller that stops a run on its
/// own terms, and for tests).
pub fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}
