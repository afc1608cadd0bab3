//! A signal that ends the process: what the program wrote to its mounts is
//! committed first, as the kernel's page cache outlives a killed process.
//!
//! A mount's page cache lives in the process, so a process that a signal
//! kills outright (Ctrl-C, `kill`, `timeout`, a pipe's reader gone) lost
//! every byte it wrote there since its last fsync: `prog > /mnt/i/log` and
//! Ctrl-C left an empty log where ext4 keeps what `prog` wrote. So for each
//! signal in [`SIGNALS`] the program leaves at its default action, a stand-in
//! handler is installed as the library loads; the program never sees it
//! (`sigaction` answers `SIG_DFL` for it, `posix/signals.rs`), and a handler
//! or `SIG_IGN` of the program's own replaces it.
//!
//! When such a signal arrives, the stand-in asks the exit helper
//! (`interrupted_exit.rs`) to end the bridges and commit the mounts and
//! then to let the signal kill the process, with the signal's own status
//! (and core dump, for SIGQUIT). The thread the signal interrupted must
//! hold none of the locks the commit takes: if it was in the middle of one
//! of this library's calls, the handler returns at once and the thread
//! finishes that call, then waits (at its end, [`at_call_end`]); otherwise
//! it waits in the handler. Either way it waits at most
//! `INTERRUPTED_EXIT_WAIT` and then ends the process itself. A thread waiting
//! its turn for a mount stops waiting (the process no longer needs one). A
//! process that never mounted or bridged anything dies at once, as before.
//!
//! A handler of the program's that cleans up, sets `SIG_DFL` back and raises
//! the signal again (git's) gets the stand-in as that default (`signal` is
//! hooked too: the C library's goes around `sigaction`); the raised signal
//! then ends the process as above. `sigset` and `sysv_signal` go around
//! both: `sigset(SIGINT, SIG_DFL)` puts the kernel's default back.

use crate::real;
use libc::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The signals whose default action ends the process and that programs
/// commonly get: hang-up, Ctrl-C, Ctrl-\, `kill`, a pipe's reader gone,
/// an alarm, the two user signals.
pub(crate) const SIGNALS: [c_int; 8] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The stand-ins were installed (this process has mounts).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The signal ending the process (0 while none is).
static ENDING: AtomicI32 = AtomicI32::new(0);

/// Installs the stand-in for each of [`SIGNALS`] the program left at its
/// default action (inherited `SIG_IGN`, a background job's SIGINT, stays).
/// As the library loads, in a process with mounts.
pub(crate) fn install() {
    for signal in SIGNALS {
        // SAFETY: a zeroed sigaction is a valid out-parameter.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the disposition into our own struct (this also resolves
        // `real::sigaction` now, outside any handler).
        let queried = unsafe { real::sigaction(signal, std::ptr::null(), &mut current) };
        if queried == 0 && current.sa_sigaction == libc::SIG_DFL {
            // SAFETY: installs a handler of the right signature (SA_SIGINFO).
            unsafe { real::sigaction(signal, &stand_in(), std::ptr::null_mut()) };
        }
    }
    INSTALLED.store(true, Ordering::Release);
}

/// Whether `signal` is one this library may stand in for.
pub(crate) fn covers(signal: c_int) -> bool {
    installed() && SIGNALS.contains(&signal)
}

/// Whether the stand-ins were installed (the process has mounts).
pub(crate) fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// Whether `handler` (a `sa_sigaction`) is the stand-in.
pub(crate) fn is_stand_in(handler: libc::sighandler_t) -> bool {
    handler == on_signal as *const () as libc::sighandler_t
}

/// A `sigaction` of `handler` with `flags`, `blocked` blocked while it runs.
pub(crate) fn action(handler: libc::sighandler_t, flags: c_int, blocked: &[c_int]) -> libc::sigaction {
    // SAFETY: a zeroed sigaction is valid; its mask is set before use.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = flags;
    // SAFETY: a mask of our own.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        for &signal in blocked {
            libc::sigaddset(&mut action.sa_mask, signal);
        }
    }
    action
}

/// The stand-in's action: every signal of [`SIGNALS`] blocked while it runs.
pub(crate) fn stand_in() -> libc::sigaction {
    action(on_signal as *const () as libc::sighandler_t, libc::SA_SIGINFO | libc::SA_RESTART, &SIGNALS)
}

/// The action `sigaction` reports where the stand-in is installed.
pub(crate) fn default_action() -> libc::sigaction {
    action(libc::SIG_DFL, 0, &[])
}

/// The stand-in handler. Atomics, futexes and a few system calls only.
extern "C" fn on_signal(signal: c_int, _info: *mut libc::siginfo_t, _context: *mut c_void) {
    // SAFETY: the calling thread's errno (a call this handler interrupted reads it after).
    let errno = unsafe { *libc::__errno_location() };
    if !crate::interrupted_exit::started() {
        die_by(signal); // nothing of this library's to write
        return;
    }
    let _ = ENDING.compare_exchange(0, signal, Ordering::AcqRel, Ordering::Acquire);
    iopath::fs::lock::stop_waiting();
    crate::interrupted_exit::ask(false, ENDING.load(Ordering::Acquire));
    if crate::in_a_call() {
        // It may hold what the commit needs: it finishes its call first (`at_call_end`).
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    wait_then_die();
}

/// At the end of a call of this library on a program's thread: if the
/// process is ending, waits for the commit and ends it.
pub(crate) fn at_call_end() {
    if ENDING.load(Ordering::Relaxed) != 0 && !iopath::sys::own_thread() {
        wait_then_die();
    }
}

/// Waits at most `INTERRUPTED_EXIT_WAIT` for the helper, then lets the
/// signal end the process (the helper does when it is done, too).
fn wait_then_die() -> ! {
    crate::interrupted_exit::wait_done(crate::INTERRUPTED_EXIT_WAIT);
    let signal = ENDING.load(Ordering::Acquire);
    die_by(signal);
    // Only if the signal could not end it (never seen): the status a shell gives it.
    // SAFETY: ends the process (the system call: the C library's `_exit` is hooked).
    unsafe { libc::syscall(libc::SYS_exit_group, 128 + signal) };
    unreachable!("exit_group returned");
}

/// Puts the default action of `signal` back and sends it: to the calling
/// thread (which then dies at once), or from one of this library's threads
/// (which block every signal) to the process. System calls only.
pub(crate) fn die_by(signal: c_int) {
    // SAFETY: system calls on values of our own; the default action ends the process.
    unsafe {
        real::sigaction(signal, &default_action(), std::ptr::null_mut());
        if iopath::sys::own_thread() {
            libc::kill(libc::getpid(), signal);
            return;
        }
        libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &action(libc::SIG_DFL, 0, &[signal]).sa_mask, std::ptr::null_mut());
    }
}

/// In a child just forked: no signal is ending it.
pub(crate) fn in_child_after_fork() {
    ENDING.store(0, Ordering::Release);
}
