//! The program's own handlers of asynchronous signals run between the
//! library's calls, never in the middle of one.
//!
//! A handler that interrupted one of this library's calls ran while the
//! call held its locks: one that ended the process (rsync's, on Ctrl-C,
//! calls `_exit`) left the exit's commit waiting for what the call held,
//! 2 s and then nothing committed (everything written since the last fsync
//! lost); one that wrote to a mounted file failed (a shell's SIGCHLD
//! handler logging to the mount, any handler writing a record: 299 of 300
//! such writes failed in `tests/c/handlers_on_mount.c`), and one that
//! jumped out (`siglongjmp`) left the locks held. The kernel delivers
//! a signal at a system call's end; so does this library: such a handler
//! is installed behind a wrapper ([`wrapper`]; `sigaction` and `signal`
//! show the program's own, `posix/signals.rs`), which, on a thread in the
//! middle of a call, only keeps the signal and its `siginfo_t`; the call's
//! end (the outermost `Inside` guard's drop, [`deliver_pending`]) sends it
//! again to the thread with that same `siginfo_t` (`rt_tgsigqueueinfo`:
//! the sender's pid, `si_code` and value, a child's status), and the
//! wrapper runs the handler then. A standard signal that arrives again
//! before the call ends is kept once, as the kernel keeps it; real-time
//! ones are kept each, up to [`KEPT`] per thread (past that, a handler runs
//! in the middle of the call, as before). An exit from a handler run at a
//! call's end is waited for at most 2 s, as an interrupted one is (a caller
//! up the stack may still hold a lock of the library's).
//!
//! Which signals: every one a program can catch ([`deferrable`]) but the
//! faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS: the faulting
//! instruction's handler must run before it runs again) and SIGABRT (the
//! thread's own `abort`). Where a call waits for as long as another
//! process likes (its turn for a mount, a `flock`), handlers run at once,
//! as the kernel runs them in an interruptible wait ([`RunNow`]).
//! `SA_RESETHAND` is done here (the default action comes back before the
//! handler runs).

use crate::{ending, real};
use libc::{c_int, c_void};
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Highest signal number (`SIGRTMAX` on Linux).
const MAX_SIGNAL: usize = 64;

/// Deliveries a thread keeps for the end of its call ([`deliver_pending`]).
pub(crate) const KEPT: usize = 16;

/// The program's handler of each signal (its `sa_sigaction`; 0: none behind
/// the wrapper), by number.
static HANDLERS: [AtomicUsize; MAX_SIGNAL + 1] = [const { AtomicUsize::new(0) }; MAX_SIGNAL + 1];
/// The flags the program gave with each ([`HANDLERS`]).
static FLAGS: [AtomicI32; MAX_SIGNAL + 1] = [const { AtomicI32::new(0) }; MAX_SIGNAL + 1];

/// Deliveries kept for the end of a thread's call: the signal and the
/// `siginfo_t` the kernel gave the wrapper.
#[derive(Clone, Copy)]
struct Kept {
    len: usize,
    deliveries: [(c_int, libc::siginfo_t); KEPT],
}

/// An empty slot of [`Kept`].
// SAFETY: a siginfo_t of zeros is valid (integers and a union of them).
const NO_DELIVERY: (c_int, libc::siginfo_t) = (0, unsafe { std::mem::zeroed() });

thread_local! {
    /// Signals (bit `signal - 1`) with a delivery kept in [`KEPT_HERE`].
    static PENDING: Cell<u64> = const { Cell::new(0) };
    /// This thread's kept deliveries. Written by the wrapper only while the
    /// thread is in a call, taken by [`deliver_pending`] with every signal
    /// blocked.
    static KEPT_HERE: UnsafeCell<Kept> = const { UnsafeCell::new(Kept { len: 0, deliveries: [NO_DELIVERY; KEPT] }) };
    /// Handlers run at once, in the middle of a call ([`RunNow`]).
    static RUN_NOW: Cell<bool> = const { Cell::new(false) };
    /// A pending signal is being sent again: an exit from its handler is
    /// waited for with a bound (see `at_exit`).
    static DELIVERING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the program's handler of `signal` is run by the wrapper: a
/// signal a program can catch, not a fault of the thread's own
/// instructions, not `abort`'s, not one the C library keeps (32 and 33).
pub(crate) fn deferrable(signal: c_int) -> bool {
    let unwrapped = [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
        libc::SIGABRT,
    ];
    (1..=MAX_SIGNAL as c_int).contains(&signal)
        && !unwrapped.contains(&signal)
        && !(32..libc::SIGRTMIN()).contains(&signal)
}

/// Whether `sigaction` puts the program's handler of `signal` behind the
/// wrapper: in a process with mounts ([`ending::covers`] for the signals
/// whose default also has a stand-in).
pub(crate) fn covers(signal: c_int) -> bool {
    ending::installed() && deferrable(signal)
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

/// `signal`'s slot in [`HANDLERS`] and [`FLAGS`].
fn index(signal: c_int) -> Option<usize> {
    usize::try_from(signal).ok().filter(|&i| (1..=MAX_SIGNAL).contains(&i))
}

/// The action to give the kernel for the program's `act` (a handler, not
/// `SIG_DFL` or `SIG_IGN`) of `signal`: the wrapper, with the program's mask
/// and flags (`SA_SIGINFO` always, `SA_RESETHAND` done here). Records the
/// handler first; returns the handler and flags recorded before.
pub(crate) fn wrap(signal: c_int, act: &libc::sigaction) -> (libc::sigaction, (usize, c_int)) {
    let i = index(signal).expect("a signal number");
    let before = (HANDLERS[i].swap(act.sa_sigaction, Ordering::AcqRel), FLAGS[i].swap(act.sa_flags, Ordering::AcqRel));
    let mut wrapped = *act;
    wrapped.sa_sigaction = wrapper as *const () as libc::sighandler_t;
    wrapped.sa_flags = (act.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
    (wrapped, before)
}

/// Forgets the program's handler of `signal` (it set `SIG_DFL` or
/// `SIG_IGN`); returns the handler and flags recorded before.
pub(crate) fn unwrap(signal: c_int) -> (usize, c_int) {
    let i = index(signal).expect("a signal number");
    (HANDLERS[i].swap(0, Ordering::AcqRel), FLAGS[i].swap(0, Ordering::AcqRel))
}

/// Puts back what [`wrap`] or [`unwrap`] replaced (the kernel refused the action).
pub(crate) fn restore(signal: c_int, (handler, flags): (usize, c_int)) {
    let i = index(signal).expect("a signal number");
    HANDLERS[i].store(handler, Ordering::Release);
    FLAGS[i].store(flags, Ordering::Release);
}

/// The program's handler of `signal` and its flags, as recorded.
pub(crate) fn recorded(signal: c_int) -> (usize, c_int) {
    let i = index(signal).expect("a signal number");
    (HANDLERS[i].load(Ordering::Acquire), FLAGS[i].load(Ordering::Acquire))
}

/// Whether `handler` (a `sa_sigaction`) is the wrapper.
pub(crate) fn is_wrapper(handler: libc::sighandler_t) -> bool {
    handler == wrapper as *const () as libc::sighandler_t
}

/// The handler the kernel runs for a signal whose program's handler is
/// wrapped: keeps it for the end of the call this thread is in, or runs it.
extern "C" fn wrapper(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(i) = index(signal) else { return };
    let in_call = crate::in_a_call() && !RUN_NOW.try_with(Cell::get).unwrap_or(true);
    if in_call && !iopath::sys::own_thread() && keep(signal, info) {
        return;
    }
    let (handler, flags) = (HANDLERS[i].load(Ordering::Acquire), FLAGS[i].load(Ordering::Acquire));
    if handler == 0 || handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return; // (set to the default or ignored meanwhile)
    }
    if flags & libc::SA_RESETHAND != 0 {
        unwrap(signal);
        // The default's stand-in where there is one, else the kernel's default.
        let default = if ending::covers(signal) { ending::stand_in() } else { ending::default_action() };
        // SAFETY: installs an action of our own, as the kernel would the default.
        unsafe { real::sigaction(signal, &default, std::ptr::null_mut()) };
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

/// Keeps the delivery of `signal` with `info` for the end of this thread's
/// call ([`deliver_pending`]); false where it cannot (no room, or the
/// thread's storage is gone): the handler runs now.
fn keep(signal: c_int, info: *const libc::siginfo_t) -> bool {
    let bit = 1u64 << (signal - 1);
    let Ok(pending) = PENDING.try_with(Cell::get) else { return false };
    if pending & bit != 0 && signal < libc::SIGRTMIN() {
        return true; // a standard signal already kept: the kernel keeps one too
    }
    let kept = KEPT_HERE.try_with(|k| {
        // SAFETY: only this thread touches its storage; deliver_pending takes it with
        // every signal blocked, so no other use is under way.
        let k = unsafe { &mut *k.get() };
        if k.len == KEPT || info.is_null() {
            return false;
        }
        // SAFETY: the kernel's siginfo_t for this delivery (SA_SIGINFO is always set).
        k.deliveries[k.len] = (signal, unsafe { *info });
        k.len += 1;
        true
    });
    if kept == Ok(true) {
        PENDING.with(|p| p.set(pending | bit));
        return true;
    }
    false
}

/// At the end of a call of this library on a program's thread: sends this
/// thread again each signal whose handler waited for it, in the order they
/// came, each with the `siginfo_t` it came with (the kernel runs the
/// wrapper, and so the handler, before the system call returns, unless the
/// program blocks the signal now).
pub(crate) fn deliver_pending() {
    // (A read only, at the end of every call where nothing waits.)
    if PENDING.try_with(Cell::get).unwrap_or(0) == 0 {
        return;
    }
    // Taken with every signal blocked: a handler running a call of its own (whose end
    // delivers what it kept) cannot come between the copy and the emptying.
    let blocked = Blocked::all();
    let kept = KEPT_HERE.try_with(|k| {
        // SAFETY: signals are blocked: nothing else uses this thread's storage now.
        let k = unsafe { &mut *k.get() };
        let taken = *k;
        k.len = 0;
        taken
    });
    let _ = PENDING.try_with(|p| p.set(0));
    drop(blocked);
    let Ok(kept) = kept else { return };
    let was = DELIVERING.try_with(|d| d.replace(true)).unwrap_or(false);
    for (signal, info) in &kept.deliveries[..kept.len] {
        let mut info = *info;
        // SAFETY: a signal to the calling thread, with the siginfo_t it came with (the
        // kernel takes any from a process signalling itself).
        let sent =
            unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, libc::getpid(), libc::gettid(), *signal, &mut info) };
        if sent != 0 {
            // SAFETY: as above, without the siginfo_t.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), *signal) };
        }
    }
    let _ = DELIVERING.try_with(|d| d.set(was));
}

/// In a child just forked: the deliveries its thread's copy kept were the
/// parent's (which delivers them); the child has none pending.
pub(crate) fn in_child_after_fork() {
    let _ = PENDING.try_with(|p| p.set(0));
    // SAFETY: the child's only thread, in its fork handler: nothing else uses this storage.
    let _ = KEPT_HERE.try_with(|k| unsafe { (*k.get()).len = 0 });
}

/// Every signal blocked on the calling thread while alive; the mask it had
/// comes back as it goes.
pub(crate) struct Blocked(libc::sigset_t);

impl Blocked {
    pub(crate) fn all() -> Blocked {
        // SAFETY: sigset_t is plain data; zeros are a valid value to fill.
        let (mut all, mut had): (libc::sigset_t, libc::sigset_t) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: masks of our own.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut had);
        }
        Blocked(had)
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: the mask the thread had.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Whether the calling thread runs a handler that waited for a call's end
/// (an exit from it is waited for with a bound: see `at_exit`).
pub(crate) fn delivering() -> bool {
    DELIVERING.try_with(Cell::get).unwrap_or(false)
}
