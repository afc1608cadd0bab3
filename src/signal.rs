//! Ctrl-C and SIGTERM: ending a run cleanly.
//!
//! [`install`] (the `iopath` tool calls it first thing) catches SIGINT and
//! SIGTERM. The first one only raises a flag, [`interrupted`], that long
//! operations look at: benchmark threads stop issuing, finish what is in
//! flight and report what they measured (marked partial), a lay-out stops
//! and removes the file it was creating, `compare` runs no further cells. A
//! second signal exits at once, as a user pressing Ctrl-C twice expects.
//! A run still going [`GRACE`] after the first signal (a thread that never
//! looks at the flag, a request that never finishes) exits then, with a
//! message: a SIGTERM from a script must end the process either way.
//! A signal the process started with ignored stays ignored (a background
//! command of a script has SIGINT ignored, so Ctrl-C stops the script only).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Write end of the pipe that wakes the grace watchdog (-1 before `install`).
static WATCHDOG_FD: AtomicI32 = AtomicI32::new(-1);

/// How long a run may go on finishing after the first signal.
pub const GRACE: std::time::Duration = std::time::Duration::from_secs(10);

const GRACE_NOTICE: &[u8] = b"\niopath: still running 10 s after the signal (something in flight does not finish); \
exiting now without a report\n";

const FIRST_NOTICE: &[u8] = b"\niopath: interrupted: finishing the requests in flight and printing what was measured \
(marked partial); press Ctrl-C again to exit at once\n";

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe work in here: atomics, write(2) and _exit(2).
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        crate::sys::exit_now(128 + signal);
    }
    SIGNAL.store(signal, Ordering::SeqCst);
    crate::sys::write_stderr_raw(FIRST_NOTICE);
    let fd = WATCHDOG_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) of one byte from a static to our own pipe; async-signal-safe.
        let _ = unsafe { libc::write(fd, b"!".as_ptr().cast(), 1) };
    }
}

/// Catches SIGINT and SIGTERM and starts the grace watchdog (see the
/// module comment): a thread blocked on a pipe until the first signal.
pub fn install() -> std::io::Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors into a valid array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
        let read_end = fds[0];
        let spawned = std::thread::Builder::new().name("iopath-signal".into()).spawn(move || {
            let mut byte = 0u8;
            // SAFETY: read(2) of one byte into a local from our own pipe.
            let n = unsafe { libc::read(read_end, (&raw mut byte).cast(), 1) };
            if n == 1 {
                std::thread::sleep(GRACE);
                crate::sys::write_stderr_raw(GRACE_NOTICE);
                crate::sys::exit_now(128 + signal());
            }
        });
        if spawned.is_ok() {
            WATCHDOG_FD.store(fds[1], Ordering::SeqCst);
        }
    }
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
