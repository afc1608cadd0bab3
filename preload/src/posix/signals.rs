//! `sigaction` and `signal`, for the signals the library stands in for
//! (`ending.rs`): the program sees `SIG_DFL` where the stand-in is, and
//! setting `SIG_DFL` puts the stand-in back. Every other call goes to the C
//! library as it is.
//!
//! `signal` is here because the C library's goes around `sigaction`: a
//! handler that cleans up, sets `SIG_DFL` with it and raises the signal
//! again (git's, GNU coreutils') would have ended the process with the
//! kernel's default, its writes to the mounts lost.

use crate::{ending, real};
use libc::c_int;

/// `sigaction`: as the C library's, but the stand-in handler of a signal
/// left at its default action reads as `SIG_DFL` and is what `SIG_DFL` sets.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    if !ending::covers(signal) {
        // SAFETY: passed on.
        return unsafe { real::sigaction(signal, act, old) };
    }
    // SAFETY: `act`, when not null, points to a sigaction (the caller's contract).
    let to_default = !act.is_null() && unsafe { (*act).sa_sigaction } == libc::SIG_DFL;
    let stand_in = ending::stand_in();
    let act = if to_default { &stand_in as *const libc::sigaction } else { act };
    // SAFETY: passed on (or our own action).
    let done = unsafe { real::sigaction(signal, act, old) };
    // SAFETY: `old`, when not null, points to a sigaction the call just filled.
    if done == 0 && !old.is_null() && ending::is_stand_in(unsafe { (*old).sa_sigaction }) {
        // SAFETY: as above.
        unsafe { *old = ending::default_action() };
    }
    done
}

/// `signal`: the C library's (BSD semantics: the signal blocked while its
/// handler runs, interrupted calls restarted), through [`sigaction`] above
/// for the signals the library stands in for.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !ending::covers(signal) {
        // SAFETY: passed on.
        return unsafe { real::signal(signal, handler) };
    }
    // SAFETY: a zeroed sigaction is valid; the mask is set before use.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: our own mask.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, signal);
    }
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: our own structs.
    if unsafe { sigaction(signal, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
