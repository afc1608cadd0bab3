//! The program's own handlers of the signals in `ending::SIGNALS` run
//! between the library's calls, never in the middle of one.
//!
//! A handler that interrupted one of this library's calls ran while the
//! call held its locks: one that ended the process (rsync's, on Ctrl-C,
//! calls `_exit`) left the exit's commit waiting for what the call held,
//! 2 s and then nothing committed (everything written since the last fsync
//! lost); one that made a file call of its own could wait for ever, and one
//! that jumped out (`siglongjmp`) left the locks held. The kernel delivers
//! a signal at a system call's end; so does this library: such a handler
//! is installed behind a wrapper ([`wrapper`]; `sigaction` and `signal`
//! show the program's own, `posix/signals.rs`), which, on a thread in the
//! middle of a call, only marks the signal pending; the call's end (the
//! outermost `Inside` guard's drop, [`deliver_pending`]) sends it again to
//! the thread, and the wrapper runs the handler then. An exit from there is
//! waited for at most 2 s, as an interrupted one is (a caller up the stack
//! may still hold a lock of the library's).
//!
//! Where a call waits for as long as another process likes (its turn for a
//! mount, a `flock`), handlers run at once, as the kernel runs them in an
//! interruptible wait ([`RunNow`]). What a handler sees: the signal number,
//! and with `SA_SIGINFO` a `siginfo_t` of the signal sent again (from this
//! process: `si_code` `SI_TKILL`) and that delivery's context.
//! `SA_RESETHAND` is done here (the default action comes back before the
//! handler runs).

use crate::{ending, real};
use libc::{c_int, c_void};
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// The program's handler of each of `ending::SIGNALS` (its `sa_sigaction`;
/// 0: none behind the wrapper), by index.
static HANDLERS: [AtomicUsize; ending::SIGNALS.len()] = [const { AtomicUsize::new(0) }; ending::SIGNALS.len()];
/// The flags the program gave with each ([`HANDLERS`]).
static FLAGS: [AtomicI32; ending::SIGNALS.len()] = [const { AtomicI32::new(0) }; ending::SIGNALS.len()];

thread_local! {
    /// Signals (bits by index) whose handler waits for this thread's call to end.
    static PENDING: Cell<u32> = const { Cell::new(0) };
    /// Handlers run at once, in the middle of a call ([`RunNow`]).
    static RUN_NOW: Cell<bool> = const { Cell::new(false) };
    /// A pending signal is being sent again: an exit from its handler is
    /// waited for with a bound (see `at_exit`).
    static DELIVERING: Cell<bool> = const { Cell::new(false) };
}

/// While alive, the program's handlers run at once on this thread, also in
/// the middle of a call: around a wait that lasts as long as another
/// process likes, where the call holds none of the library's locks.
pub(crate) struct RunNow(bool);

impl RunNow {
    pub(crate) fn enter() -> RunNow {
        RunNow(RUN_NOW.try_with(|r| r.replace(true)).unwrap_or(true))
    }
}

impl Drop for RunNow {
    fn drop(&mut self) {
        let _ = RUN_NOW.try_with(|r| r.set(self.0));
    }
}

fn index(signal: c_int) -> Option<usize> {
    ending::SIGNALS.iter().position(|&s| s == signal)
}

/// The action to give the kernel for the program's `act` (a handler, not
/// `SIG_DFL` or `SIG_IGN`) of `signal`: the wrapper, with the program's mask
/// and flags (`SA_SIGINFO` always, `SA_RESETHAND` done here). Records the
/// handler first; returns the handler and flags recorded before.
pub(crate) fn wrap(signal: c_int, act: &libc::sigaction) -> (libc::sigaction, (usize, c_int)) {
    let i = index(signal).expect("a signal of ending::SIGNALS");
    let before = (HANDLERS[i].swap(act.sa_sigaction, Ordering::AcqRel), FLAGS[i].swap(act.sa_flags, Ordering::AcqRel));
    let mut wrapped = *act;
    wrapped.sa_sigaction = wrapper as *const () as libc::sighandler_t;
    wrapped.sa_flags = (act.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
    (wrapped, before)
}

/// Forgets the program's handler of `signal` (it set `SIG_DFL` or
/// `SIG_IGN`); returns the handler and flags recorded before.
pub(crate) fn unwrap(signal: c_int) -> (usize, c_int) {
    let i = index(signal).expect("a signal of ending::SIGNALS");
    (HANDLERS[i].swap(0, Ordering::AcqRel), FLAGS[i].swap(0, Ordering::AcqRel))
}

/// Puts back what [`wrap`] or [`unwrap`] replaced (the kernel refused the action).
pub(crate) fn restore(signal: c_int, (handler, flags): (usize, c_int)) {
    let i = index(signal).expect("a signal of ending::SIGNALS");
    HANDLERS[i].store(handler, Ordering::Release);
    FLAGS[i].store(flags, Ordering::Release);
}

/// The program's handler of `signal` and its flags, as recorded.
pub(crate) fn recorded(signal: c_int) -> (usize, c_int) {
    let i = index(signal).expect("a signal of ending::SIGNALS");
    (HANDLERS[i].load(Ordering::Acquire), FLAGS[i].load(Ordering::Acquire))
}

/// Whether `handler` (a `sa_sigaction`) is the wrapper.
pub(crate) fn is_wrapper(handler: libc::sighandler_t) -> bool {
    handler == wrapper as *const () as libc::sighandler_t
}

/// The handler the kernel runs for a signal whose program's handler is
/// wrapped: defers it to the end of the call this thread is in, or runs it.
extern "C" fn wrapper(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(i) = index(signal) else { return };
    let in_call = crate::in_a_call() && !RUN_NOW.try_with(Cell::get).unwrap_or(true);
    if in_call && !iopath::sys::own_thread() {
        let _ = PENDING.try_with(|p| p.set(p.get() | 1 << i));
        return;
    }
    let (handler, flags) = (HANDLERS[i].load(Ordering::Acquire), FLAGS[i].load(Ordering::Acquire));
    if handler == 0 || handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return; // (set to the default or ignored meanwhile)
    }
    if flags & libc::SA_RESETHAND != 0 {
        unwrap(signal);
        // SAFETY: installs the default's stand-in, as the kernel would the default.
        unsafe { real::sigaction(signal, &ending::stand_in(), std::ptr::null_mut()) };
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program gave this handler with SA_SIGINFO: it takes these three.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(handler) };
        f(signal, info, context);
    } else {
        // SAFETY: a plain handler takes the signal number.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
}

/// At the end of a call of this library on a program's thread: sends this
/// thread again each signal whose handler waited for it (the kernel runs the
/// wrapper, and so the handler, before `tgkill` returns, unless the program
/// blocks the signal now).
pub(crate) fn deliver_pending() {
    // (A read only, at the end of every call where nothing waits.)
    if PENDING.try_with(Cell::get).unwrap_or(0) == 0 {
        return;
    }
    let pending = PENDING.try_with(|p| p.replace(0)).unwrap_or(0);
    let was = DELIVERING.try_with(|d| d.replace(true)).unwrap_or(false);
    for (i, &signal) in ending::SIGNALS.iter().enumerate() {
        if pending & 1 << i != 0 {
            // SAFETY: a signal to the calling thread.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), signal) };
        }
    }
    let _ = DELIVERING.try_with(|d| d.set(was));
}

/// Whether the calling thread runs a handler that waited for a call's end
/// (an exit from it is waited for with a bound: see `at_exit`).
pub(crate) fn delivering() -> bool {
    DELIVERING.try_with(Cell::get).unwrap_or(false)
}
