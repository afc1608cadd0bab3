//! Routing of `IOPATH_FILES`: an O_DIRECT file or block device a program
//! names, whose reads, writes and flushes go through one iopath engine per
//! file (see the crate documentation). The hooks in `posix/` call these
//! after the mounts have had their look.

use crate::{COUNTING, FORKED, Inside, PASSED_CALLS, ROUTED_CALLS, ROUTING, config, fds, real, set_errno};
use libc::{c_int, c_void, iovec, off_t, size_t, ssize_t};
use std::sync::atomic::Ordering;

/// Whether any file is routed (`IOPATH_FILES` is set): engines may run here.
pub(crate) fn routing() -> bool {
    ROUTING.load(Ordering::Relaxed)
}

/// The route of `fd`, unless this call must go to the C library as it is.
pub(crate) fn route_of(fd: c_int) -> Option<fds::Route> {
    if !ROUTING.load(Ordering::Relaxed) || FORKED.load(Ordering::Relaxed) || crate::inside() {
        return None;
    }
    fds::lookup(fd)
}

/// One piece of a routed request.
pub(crate) struct Piece {
    ptr: *mut u8,
    len: u64,
}

/// Reads or writes `pieces` back to back from `offset` through the file's
/// engine. None: the call is not routable as it is (the caller passes it
/// to the C library); Some(n): bytes done, or -1 with errno set.
fn routed(route: &fds::Route, fd: c_int, write: bool, pieces: &[Piece], offset: off_t) -> Option<ssize_t> {
    let entry = &route.entry;
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    if total == 0 || offset < 0 || (write && !entry.writable()) {
        return None;
    }
    let path_spec = &config().path;
    let mut slot = entry.slot(fd, path_spec)?;
    let align = slot.align;
    let aligned = |v: u64| v.is_multiple_of(align);
    if !aligned(offset as u64) || pieces.iter().any(|p| !aligned(p.ptr as u64) || !aligned(p.len)) {
        return None;
    }
    let end = (offset as u64).checked_add(total)?;
    if end > slot.size {
        slot = entry.grown(fd, path_spec, end)?;
        if end > slot.size {
            return None;
        }
    }
    let _inside = Inside::enter();
    let mut done: u64 = 0;
    for piece in pieces {
        let mut at = 0;
        while at < piece.len {
            let len = (piece.len - at).min(slot.max_io);
            // SAFETY: the caller's buffer holds `piece.len` bytes for the call (the C contract).
            let result = unsafe {
                let ptr = piece.ptr.add(at as usize);
                if write {
                    slot.engine.write_at(std::slice::from_raw_parts(ptr, len as usize), offset as u64 + done)
                } else {
                    slot.engine.read_at(std::slice::from_raw_parts_mut(ptr, len as usize), offset as u64 + done)
                }
            };
            if let Err(e) = result {
                if done > 0 {
                    return Some(done as ssize_t);
                }
                set_errno(iopath::capi::errno_of(&e));
                return Some(-1);
            }
            at += len;
            done += len;
        }
    }
    Some(done as ssize_t)
}

pub(crate) fn counted(r: Option<ssize_t>) -> Option<ssize_t> {
    if COUNTING.load(Ordering::Relaxed) {
        match r {
            Some(_) => ROUTED_CALLS.fetch_add(1, Ordering::Relaxed),
            None => PASSED_CALLS.fetch_add(1, Ordering::Relaxed),
        };
    }
    r
}

pub(crate) fn pieces_of(iov: *const iovec, count: c_int) -> Pieces {
    if iov.is_null() || !(1..=libc::UIO_MAXIOV).contains(&count) {
        return Pieces::Bad;
    }
    // SAFETY: the caller passes `count` iovecs (the C contract).
    let iov = unsafe { std::slice::from_raw_parts(iov, count as usize) };
    Pieces::Many(iov.iter().map(|v| Piece { ptr: v.iov_base.cast(), len: v.iov_len as u64 }).collect())
}

/// The pieces of a call: one buffer on the stack, or a vector's.
pub(crate) enum Pieces {
    One([Piece; 1]),
    Many(Vec<Piece>),
    /// A NULL buffer or a bad vector: the C library gives the kernel's answer.
    Bad,
}

impl Pieces {
    fn get(&self) -> Option<&[Piece]> {
        match self {
            Pieces::One(p) => Some(p),
            Pieces::Many(v) => Some(v),
            Pieces::Bad => None,
        }
    }
}

/// pread/pwrite and their vectored forms at an explicit offset. The pieces
/// are gathered only for a routed descriptor (a vector's are a Vec).
pub(crate) fn at_offset(fd: c_int, write: bool, pieces: impl FnOnce() -> Pieces, offset: off_t) -> Option<ssize_t> {
    let route = route_of(fd)?;
    counted(pieces().get().and_then(|p| routed(&route, fd, write, p, offset)))
}

/// read/write (and the vectored forms with offset -1) at the file position.
pub(crate) fn at_position(
    fd: c_int,
    write: bool,
    pieces: impl FnOnce() -> Pieces,
    fallback: impl FnOnce() -> ssize_t,
) -> ssize_t {
    let Some(route) = route_of(fd) else { return fallback() };
    if write && route.append {
        counted(None);
        return fallback();
    }
    let _held = route.entry.position.lock().unwrap_or_else(|e| e.into_inner());
    let pos = real::position(fd);
    let done = if pos < 0 { None } else { pieces().get().and_then(|p| routed(&route, fd, write, p, pos)) };
    match counted(done) {
        Some(n) => {
            if n > 0 {
                real::set_position(fd, pos + n as off_t);
            }
            n
        }
        None => fallback(),
    }
}

pub(crate) fn one(buf: *const c_void, n: size_t) -> Pieces {
    if buf.is_null() { Pieces::Bad } else { Pieces::One([Piece { ptr: buf.cast_mut().cast(), len: n as u64 }]) }
}

/// `fsync`/`fdatasync` of a routed file: always the kernel's, in the calling
/// thread (counted as passed to the C library).
///
/// Every routed write of the file completed before its call returned, so
/// the kernel's sync of the descriptor covers them as it covers its own
/// writes. The engine's flush would be an io_uring fsync, which the kernel
/// cannot start without blocking and hands to an io-wq worker: a cross-CPU
/// wake-up there and another back, 170-240 us per flush in MariaDB's
/// read-write mix where the caller's own fdatasync takes a fraction of that
/// (sysbench oltp_read_write, 4 threads, `sync-intr`: 0.85x the kernel with
/// the engine's flush, 0.99-1.21x with the kernel's).
pub(crate) fn flush_passed(fd: c_int) {
    if route_of(fd).is_some() {
        counted(None);
    }
}

/// A descriptor number a call just created: forget what was known of it
/// (and never route iopath's own).
pub(crate) fn created(fd: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let inside = crate::inside();
    // iopath's own descriptors (a mount's device and lock file, a routed file's engine)
    // move above the numbers programs pick for themselves: a shell's `exec 3< f` does
    // dup2(n, 3) onto what it takes to be free, and closed the mount's lock that way.
    let fd = if inside && crate::MOUNTING.load(Ordering::Relaxed) { move_high(fd) } else { fd };
    noted(fd, inside)
}

/// A descriptor number a call put where its caller named (`dup2`, `dup3`):
/// forget what was known of it (and never route iopath's own); never moved.
pub(crate) fn placed(fd: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    noted(fd, crate::inside())
}

/// What routing knows of new descriptor `fd` (iopath's own if made `inside`).
fn noted(fd: c_int, inside: bool) -> c_int {
    if ROUTING.load(Ordering::Relaxed) {
        if inside {
            fds::mark_plain(fd);
        } else {
            fds::forget(fd);
        }
    }
    fd
}

/// [`created`] for a descriptor a kernel call (`make`) opens: one of
/// iopath's own (made inside this library while it mounts) is made and
/// moved above the program's numbers inside
/// [`iopath::sys::own_numbers`], so a program that redirects meanwhile
/// (closes a number and `dup2`s onto it) never meets it there.
pub(crate) fn made(make: impl FnOnce() -> c_int) -> c_int {
    if crate::inside() && crate::MOUNTING.load(Ordering::Relaxed) {
        let fd = iopath::sys::own_numbers(|| {
            let fd = make();
            if fd >= 0 { move_high(fd) } else { fd }
        });
        return if fd < 0 { fd } else { noted(fd, true) };
    }
    created(make())
}

/// [`made`] for an open, which takes the lowest free number: a program's
/// gets the one it would have had if no thread of iopath's held a low
/// number for a moment meanwhile ([`iopath::sys::taking_lowest`];
/// `cloexec`: as it was opened). Not for `F_DUPFD`, whose floor is the
/// caller's.
pub(crate) fn opened(make: impl FnOnce() -> c_int, cloexec: bool) -> c_int {
    made(|| iopath::sys::taking_lowest(make, cloexec))
}

/// Lowest number iopath moves its own descriptors to (the library's own floor).
const OWN_FDS_FROM: c_int = iopath::sys::HIGH_FDS_FROM;

/// `fd` moved to the lowest free number from [`OWN_FDS_FROM`] (close-on-exec), or
/// left where it is if that fails (a low descriptor limit).
fn move_high(fd: c_int) -> c_int {
    if fd >= OWN_FDS_FROM {
        return fd;
    }
    // SAFETY: duplicating and closing a descriptor this library just opened.
    unsafe {
        let high = real::fcntl(fd, libc::F_DUPFD_CLOEXEC, OWN_FDS_FROM as libc::c_ulong);
        if high < 0 {
            return fd;
        }
        real::close(fd);
        high
    }
}

/// After a program's fcntl command other than a duplicate (those are
/// [`made`] or [`created`]): a flag change is noted.
pub(crate) fn after_fcntl(fd: c_int, cmd: c_int, result: c_int) -> c_int {
    // O_DIRECT or O_APPEND may have changed on the open file, which every duplicate
    // shares: look at all routed descriptors again.
    if result >= 0 && cmd == libc::F_SETFL && ROUTING.load(Ordering::Relaxed) {
        for (other, _) in fds::routed() {
            fds::forget(other);
        }
        fds::forget(fd);
    }
    result
}
