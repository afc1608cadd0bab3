//! `sigaction` and `signal`, in a process with mounts: for the signals the
//! library stands in for (`ending.rs`), the program sees `SIG_DFL` where
//! the stand-in is, and setting `SIG_DFL` puts the stand-in back; a
//! handler of the program's for any asynchronous signal is run between the
//! library's calls (`program_handlers.rs`) and reads as itself. Every other
//! call goes to the C library as it is.
//!
//! `signal` is here because the C library's goes around `sigaction`: a
//! handler that cleans up, sets `SIG_DFL` with it and raises the signal
//! again (git's, GNU coreutils') would have ended the process with the
//! kernel's default, its writes to the mounts lost. So are its other
//! names: `bsd_signal`, and `sysv_signal` with `__sysv_signal`, which is
//! what `signal` compiles to under strict ISO C or POSIX (`cc -std=c11`
//! without `_DEFAULT_SOURCE`), and System V's `sigset`: their handlers were
//! installed bare, and ran inside the library's calls.

use crate::{ending, program_handlers, real};
use libc::c_int;

/// The flag the C library sets on every action it gives the kernel (its
/// return trampoline; x86-64 Linux's value, not in the `libc` crate).
const SA_RESTORER: c_int = 0x0400_0000;

/// `sigaction`: as the C library's, but for the signals the library stands
/// in for, the stand-in reads as `SIG_DFL` and is what `SIG_DFL` sets, and
/// a handler of the program's (of any signal `program_handlers` covers) is
/// installed behind its wrapper (which runs it between the library's calls)
/// and reads as itself, with the flags the program gave.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let stand_in = ending::covers(signal);
    if !stand_in && !program_handlers::covers(signal) {
        // SAFETY: passed on.
        return unsafe { real::sigaction(signal, act, old) };
    }
    // SAFETY: `act`, when not null, points to a sigaction (the caller's contract).
    let asked = (!act.is_null()).then(|| unsafe { *act });
    let (installed, before) = match asked {
        None => (None, None),
        Some(a) if a.sa_sigaction == libc::SIG_DFL => {
            (Some(if stand_in { ending::stand_in() } else { a }), Some(program_handlers::unwrap(signal)))
        }
        Some(a) if a.sa_sigaction == libc::SIG_IGN => (Some(a), Some(program_handlers::unwrap(signal))),
        Some(a) => {
            let (wrapped, before) = program_handlers::wrap(signal, &a);
            (Some(wrapped), Some(before))
        }
    };
    let act = installed.as_ref().map_or(std::ptr::null(), |a| a as *const libc::sigaction);
    // SAFETY: our own action (or none), and the caller's `old`.
    let done = unsafe { real::sigaction(signal, act, old) };
    if done != 0 {
        if let Some(before) = before {
            program_handlers::restore(signal, before);
        }
        return done;
    }
    if !old.is_null() {
        // SAFETY: `old` points to a sigaction the call just filled.
        let old = unsafe { &mut *old };
        if ending::is_stand_in(old.sa_sigaction) {
            *old = ending::default_action();
        } else if program_handlers::is_wrapper(old.sa_sigaction) {
            let (handler, flags) = before.unwrap_or_else(|| program_handlers::recorded(signal));
            old.sa_sigaction = handler;
            // (The C library's own SA_RESTORER, as it reports it for any handler.)
            old.sa_flags = flags | (old.sa_flags & SA_RESTORER);
        }
    }
    done
}

/// `signal`: the C library's (BSD semantics: the signal blocked while its
/// handler runs, interrupted calls restarted), through [`sigaction`] above
/// for the signals it does more for.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !ending::covers(signal) && !program_handlers::covers(signal) {
        // SAFETY: passed on.
        return unsafe { real::signal(signal, handler) };
    }
    installed(signal, handler, Semantics::Bsd)
}

/// `bsd_signal`: `signal` under its POSIX name.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bsd_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: as the caller's.
    unsafe { self::signal(signal, handler) }
}

macro_rules! hook_sysv_signal {
    ($($name:ident),*) => {$(
        /// `sysv_signal` (`__sysv_signal`: what `signal` compiles to under
        /// strict ISO C or POSIX): System V semantics, the default action
        /// back as the handler starts, the signal not blocked while it
        /// runs, interrupted calls not restarted; through [`sigaction`].
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
            installed(signal, handler, Semantics::SysV)
        }
    )*};
}
hook_sysv_signal!(sysv_signal, __sysv_signal);

/// `SIG_HOLD` (glibc's value; not in the `libc` crate).
const SIG_HOLD: libc::sighandler_t = 2;

/// `sigset` (System V): `SIG_HOLD` blocks the signal; any other
/// disposition is installed through [`sigaction`] (no flags, nothing else
/// blocked while its handler runs) and the signal unblocked. Returns
/// `SIG_HOLD` if the signal was blocked before, else the previous
/// disposition; `SIG_ERR` with EINVAL for `SIG_ERR` or a signal out of
/// range. The C library's goes to its own `sigaction`, not this one.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigset(signal: c_int, disposition: libc::sighandler_t) -> libc::sighandler_t {
    if disposition == libc::SIG_ERR || !(1..libc::SIGRTMAX() + 1).contains(&signal) {
        crate::set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: masks and actions of our own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let mut old = ending::default_action();
        if disposition == SIG_HOLD {
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before) != 0 {
                return libc::SIG_ERR;
            }
            if libc::sigismember(&before, signal) == 1 {
                return SIG_HOLD;
            }
            if sigaction(signal, std::ptr::null(), &mut old) != 0 {
                return libc::SIG_ERR;
            }
            return old.sa_sigaction;
        }
        let act = ending::action(disposition, 0, &[]);
        if sigaction(signal, &act, &mut old) != 0 || libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut before) != 0 {
            return libc::SIG_ERR;
        }
        if libc::sigismember(&before, signal) == 1 { SIG_HOLD } else { old.sa_sigaction }
    }
}

/// Which of the C library's one-call forms a handler was installed with.
#[derive(Clone, Copy)]
enum Semantics {
    /// `signal`, `bsd_signal`: the signal blocked while its handler runs,
    /// interrupted calls restarted.
    Bsd,
    /// `sysv_signal`: reset to the default as the handler starts, not
    /// blocked while it runs, interrupted calls not restarted.
    SysV,
}

/// Installs `handler` for `signal` as a one-call form with `semantics`
/// does, through [`sigaction`]; the previous handler, or `SIG_ERR` (errno
/// set: EINVAL for `SIG_ERR` itself or a signal that cannot be caught).
fn installed(signal: c_int, handler: libc::sighandler_t, semantics: Semantics) -> libc::sighandler_t {
    if handler == libc::SIG_ERR {
        crate::set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    let act = match semantics {
        Semantics::Bsd => ending::action(handler, libc::SA_RESTART, &[signal]),
        Semantics::SysV => ending::action(handler, libc::SA_RESETHAND | libc::SA_NODEFER, &[]),
    };
    let mut old = ending::default_action();
    // SAFETY: our own structs.
    if unsafe { sigaction(signal, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
