//! The exit of a program whose signal handler ends it in the middle of one
//! of this library's calls (rsync on Ctrl-C calls `_exit` from its handler).
//!
//! The interrupted call may hold anything: a lock the mounts' commit needs,
//! a standard stream's lock, or the C library's allocator's (the handler
//! ran in the middle of a `malloc`; 1 exit in 10 of a program printing into
//! a mounted stdout then waited for ever on its first allocation in the
//! exit handler). So the exiting thread allocates nothing and takes no
//! lock: it asks a thread started when the process first mounted or
//! bridged a standard stream (a helper that sleeps until then) to end the
//! bridges and commit the mounts, and waits for it at most a bound; past
//! it, the process ends as a kill would leave it (what was fsynced is
//! kept).
//!
//! The same helper ends a process killed by a signal the program left at
//! its default action (`ending.rs`): it commits, then lets the signal
//! kill the process.

use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The helper is running (in this process: a forked child has none).
static STARTED: AtomicBool = AtomicBool::new(false);
/// What the helper is asked: [`IDLE`], [`ASKED`], then [`DONE`].
static REQUEST: AtomicU32 = AtomicU32::new(IDLE);
const IDLE: u32 = 0;
const ASKED: u32 = 1;
const DONE: u32 = 2;
/// The exit flushes the program's stdio buffers first (`exit`, not `_exit`).
static FLUSH_STDIO: AtomicBool = AtomicBool::new(false);
/// The signal that kills the process once the helper is done (0: none, an exit).
static KILL_WITH: AtomicI32 = AtomicI32::new(0);
/// The helper was asked (by the first of [`ask`]'s callers, whose settings count).
static CLAIMED: AtomicBool = AtomicBool::new(false);

/// Starts the helper if it is not running: when the process mounts or
/// starts a bridge (a normal call, where starting a thread is safe).
pub(crate) fn prepare() {
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let named = std::thread::Builder::new().name("iopath-exit".into());
    if iopath::sys::spawn_without_signals(named, serve).is_err() {
        STARTED.store(false, Ordering::Release);
    }
}

/// The helper: sleeps until asked, then does the exit's work.
fn serve() {
    while REQUEST.load(Ordering::Acquire) != ASKED {
        iopath::sys::futex_wait(&REQUEST, IDLE, None);
    }
    let _inside = crate::Inside::enter();
    let signal = KILL_WITH.load(Ordering::Acquire);
    if signal != 0 {
        crate::log(&format!("signal {signal}: committing the mounts before it ends the process"));
    }
    crate::bridge::finish(FLUSH_STDIO.load(Ordering::Acquire));
    crate::commit_mounts_here();
    REQUEST.store(DONE, Ordering::Release);
    iopath::sys::futex_wake_all(&REQUEST);
    if signal != 0 {
        crate::ending::die_by(signal);
    }
}

/// Whether the helper runs: this process mounted or bridged something (in a
/// forked child: the child itself).
pub(crate) fn started() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// Has the helper end the bridges and commit the mounts, waiting at most
/// `limit` for it; without allocating. False if it did not finish in time
/// (true at once where no helper runs: nothing was mounted or bridged, so
/// nothing is left to write).
pub(crate) fn finish_within(flush_stdio: bool, limit: Duration) -> bool {
    if !STARTED.load(Ordering::Acquire) {
        return true;
    }
    ask(flush_stdio, 0);
    wait_done(limit)
}

/// Asks the helper to end the bridges and commit the mounts (the first
/// ask counts), and then, with `kill_with` a signal, to let that signal
/// kill the process. Atomics and a futex wake only: callable from a
/// signal handler.
pub(crate) fn ask(flush_stdio: bool, kill_with: c_int) {
    if CLAIMED.swap(true, Ordering::AcqRel) {
        return;
    }
    FLUSH_STDIO.store(flush_stdio, Ordering::Release);
    KILL_WITH.store(kill_with, Ordering::Release);
    REQUEST.store(ASKED, Ordering::Release);
    iopath::sys::futex_wake_all(&REQUEST);
}

/// Waits at most `limit` for the helper asked by [`ask`]: whether it finished.
pub(crate) fn wait_done(limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        if REQUEST.load(Ordering::Acquire) == DONE {
            return true;
        }
        let Some(left) = limit.checked_sub(start.elapsed()) else { return false };
        iopath::sys::futex_wait(&REQUEST, ASKED, Some(left.as_nanos() as u64));
    }
}

/// In a child just forked: the parent's helper is not here.
pub(crate) fn in_child_after_fork() {
    STARTED.store(false, Ordering::Release);
    REQUEST.store(IDLE, Ordering::Release);
    KILL_WITH.store(0, Ordering::Release);
    CLAIMED.store(false, Ordering::Release);
}
