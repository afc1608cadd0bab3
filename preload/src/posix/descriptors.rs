//! Descriptors: close, close_range, dup, dup2, dup3, fcntl's duplicate
//! and flag commands, and ioctl. A mounted descriptor's duplicates share its
//! description (one file position, one set of status flags), as POSIX
//! says; the kernel keeps the close-on-exec flag of each number. And the
//! calls that make descriptors of other kinds (pipes, sockets, event,
//! epoll, memfd, signalfd, timerfd and inotify descriptors, accepted
//! connections): they take the lowest free numbers, as they would without
//! the interposer's threads beside them.

use super::{fail, locks, mounting};
use crate::mount::{self, Description};
use crate::route::{after_fcntl, created, made, placed};
use crate::{FORKED, ROUTING, bridge, fds, real};
use libc::{c_int, c_uint, c_ulong};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// [`iopath::sys::placing_numbers`] in a [`crate::Section`]: the program's
/// call places its descriptor holding the lock on descriptor numbers, and a
/// signal handler that duplicated a descriptor there waited for that lock
/// for ever (`tests/c/handler_beside_bridges.c`).
fn placing_numbers<R>(call: impl FnOnce() -> R) -> R {
    let _section = crate::Section::enter();
    iopath::sys::placing_numbers(call)
}

/// Forgets mounted descriptor `fd`, which the kernel is closing or replacing.
/// In a forked child the description is the parent's: it is left alone.
fn drop_mounted(fd: c_int) {
    if let Some(description) = mount::remove(fd) {
        if mount::inherited(&description) {
            std::mem::forget(description); // its file belongs to the parent's mount
        } else {
            let _inside = crate::Inside::enter();
            drop(description); // the last descriptor of an unlinked file frees it
        }
    }
}

/// `close`: a mounted descriptor's description goes with its last number.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !iopath::frames::step_aside(fd, fd as c_uint) {
        crate::set_errno(libc::EBADF); // iopath's own: never the program's to close
        return -1;
    }
    if crate::inside() {
        // iopath closing a descriptor of its own (a ring, a file it opened): none of the
        // program's. A bridge's thread mounting as the program exited had its probe ring
        // on the number of the program's standard output, just closed by the C library;
        // closing it ended the bridge from its own thread (a join of itself: abort).
        // SAFETY: passed on.
        return unsafe { real::close(fd) };
    }
    if mount::is_mounted(fd) {
        drop_mounted(fd);
    }
    mount::kernel_dir_closed(fd);
    if ROUTING.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed) {
        fds::forget(fd);
    }
    let unread = bridge::unread(fd);
    // SAFETY: passed on.
    let r = unsafe { real::close(fd) };
    if r == 0 {
        bridge::closed(fd, unread);
    }
    r
}

/// `close_range`: forgets the mounted and routed descriptors it closes.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        // iopath's frame file, if in the range, goes above it first (its lock must stay).
        if let Some(own) = iopath::frames::own_fd().filter(|&f| f as c_uint >= first && f as c_uint <= last)
            && !iopath::frames::step_aside(own, last)
        {
            crate::log("close_range would close iopath's frame file: it stops taking frames from it");
            iopath::frames::give_up();
        }
        let top = last.min(fds::MAX_FD as c_uint - 1);
        for fd in first..=top {
            if mount::is_mounted(fd as c_int) {
                drop_mounted(fd as c_int);
            }
            mount::kernel_dir_closed(fd as c_int);
        }
        if ROUTING.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed) {
            fds::forget_range(first, last);
        }
    }
    // SAFETY: passed on.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        bridge::closed_range(first.min(c_int::MAX as c_uint) as c_int, last.min(c_int::MAX as c_uint) as c_int);
    }
    r
}

/// After the kernel made `new` a duplicate of mounted `old`: `new` shares
/// its description, or, on a standard stream (0, 1, 2: the C library's stdio
/// calls the kernel on those), becomes a pipe a bridge keeps (`bridge/`).
fn duplicated(from: c_int, new: c_int, description: Option<Arc<Description>>, cloexec: bool) -> c_int {
    if new >= 0
        && let Some(d) = description
    {
        if bridge::wanted(&d, new) {
            let _inside = crate::Inside::enter();
            if mount::inherited(&d) {
                // A forked child's: its parent holds the file, and bridges it (`bridge/adopt.rs`).
                return bridge::ask_parent(&d, from, new, cloexec);
            }
            return bridge::onto(&d, new, cloexec);
        }
        mount::install(new, d);
    }
    new
}

/// `dup`: a mounted descriptor's copy shares its description.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let description = mounting().then(|| mount::lookup(fd)).flatten();
    // SAFETY: passed on.
    let new = placing_numbers(|| unsafe { real::dup(fd) });
    mount::kernel_dir_duplicated(fd, new);
    if description.is_some() {
        return duplicated(fd, new, description, false);
    }
    bridge::duplicated(fd, new);
    created(new)
}

fn dup_to(fd: c_int, to: c_int, cloexec: bool, call: impl FnOnce() -> c_int) -> c_int {
    let description = mounting().then(|| mount::lookup(fd)).flatten();
    let unread = if fd != to { bridge::unread(to) } else { 0 };
    let r = placing_numbers(call);
    if r >= 0 && fd != to {
        if mount::is_mounted(to) {
            drop_mounted(to); // the kernel closed what `to` was
        }
        mount::kernel_dir_closed(to);
        mount::kernel_dir_duplicated(fd, r);
        bridge::closed(to, unread); // (if `to` was on a bridge)
        if description.is_some() {
            return duplicated(fd, r, description, cloexec);
        }
        bridge::duplicated(fd, to);
        placed(r); // (where the caller named: never moved)
    }
    r
}

/// `dup2`: the descriptor replaced is forgotten; a mounted one's copy shares its description.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    if fd != to && !iopath::frames::step_aside(to, to as c_uint) {
        crate::set_errno(libc::EBADF);
        return -1;
    }
    // SAFETY: passed on.
    dup_to(fd, to, false, || unsafe { real::dup2(fd, to) })
}

/// `dup3`: as `dup2`, with O_CLOEXEC.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    if fd != to && !iopath::frames::step_aside(to, to as c_uint) {
        crate::set_errno(libc::EBADF);
        return -1;
    }
    // SAFETY: passed on.
    dup_to(fd, to, flags & libc::O_CLOEXEC != 0, || unsafe { real::dup3(fd, to, flags) })
}

/// fcntl's write-lifetime hint commands (linux/fcntl.h; not in the libc crate).
const F_GET_RW_HINT: c_int = 1024 + 11;
const F_SET_RW_HINT: c_int = 1024 + 12;
const F_GET_FILE_RW_HINT: c_int = 1024 + 13;
const F_SET_FILE_RW_HINT: c_int = 1024 + 14;

/// Status flags `F_SETFL` may change on a mounted description.
const SETTABLE: c_int = libc::O_APPEND | libc::O_NONBLOCK | libc::O_NOATIME | libc::O_ASYNC;

/// fcntl on a mounted descriptor; `None` for a command the kernel answers
/// on the reserved number (`F_GETFD`, `F_SETFD`, the duplicates).
fn fcntl_mounted(fd: c_int, d: &Arc<Description>, cmd: c_int, arg: c_ulong) -> Option<c_int> {
    Some(match cmd {
        libc::F_GETFD | libc::F_SETFD | libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => return None,
        libc::F_GETFL => d.flags.load(Ordering::Relaxed) | libc::O_LARGEFILE,
        libc::F_SETFL => {
            let arg = arg as c_int;
            let _ =
                d.flags.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| Some((f & !SETTABLE) | (arg & SETTABLE)));
            0
        }
        // Write-lifetime hints (RocksDB sets them): accepted, as by a file system that ignores them.
        F_GET_RW_HINT | F_GET_FILE_RW_HINT => {
            if arg != 0 {
                // SAFETY: the hint commands take a pointer to a u64 (the C contract).
                unsafe { (arg as *mut u64).write(0) };
            }
            0
        }
        F_SET_RW_HINT | F_SET_FILE_RW_HINT => 0,
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => {
            locks::record_lock(d, cmd, arg as *mut libc::flock)
        }
        _ => {
            crate::log(&format!("fcntl command {cmd} on mounted fd {fd} is not supported (EINVAL)"));
            fail(libc::EINVAL)
        }
    })
}

/// Whether fcntl command `cmd` makes a descriptor (`F_DUPFD`, `F_DUPFD_CLOEXEC`).
fn duplicates(cmd: c_int) -> bool {
    matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC)
}

fn fcntl_any(fd: c_int, cmd: c_int, arg: c_ulong, call: impl FnOnce() -> c_int) -> c_int {
    let description = mounting().then(|| mount::lookup(fd)).flatten();
    if let Some(d) = &description {
        if mount::inherited(d) {
            // Close-on-exec is the kernel's, per number: a forked child may set it on
            // its parent's descriptor before an exec (Python's `pass_fds` does).
            return if matches!(cmd, libc::F_GETFD | libc::F_SETFD) { call() } else { fail(libc::EBADF) };
        }
        let _inside = crate::Inside::enter();
        if let Some(r) = fcntl_mounted(fd, d, cmd, arg) {
            return r;
        }
        if !duplicates(cmd) {
            return call();
        }
        let r = placing_numbers(call);
        return duplicated(fd, r, description, cmd == libc::F_DUPFD_CLOEXEC);
    }
    if !duplicates(cmd) {
        return after_fcntl(fd, cmd, call());
    }
    // iopath's own (its loadavg reader keeps its file at 300 and up) is made and moved
    // above the program's numbers; a program's waits for iopath's to be made.
    let r = if crate::inside() { made(call) } else { created(placing_numbers(call)) };
    mount::kernel_dir_duplicated(fd, r);
    bridge::duplicated(fd, r);
    r
}

/// `fcntl`: a mounted descriptor's flags, duplicates and locks; otherwise
/// passed through, a flag change or a duplicate noted.
///
/// # Safety
/// As the C function (the third argument is passed on as given).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: passed on.
    fcntl_any(fd, cmd, arg, || unsafe { real::fcntl(fd, cmd, arg) })
}

/// `fcntl64`: as [`fcntl`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: passed on.
    fcntl_any(fd, cmd, arg, || unsafe { real::fcntl64(fd, cmd, arg) })
}

/// Reflink requests (linux/fs.h; not in the libc crate): `cp` asks for a clone first.
const FICLONE: c_ulong = 0x4004_9409;
const FICLONERANGE: c_ulong = 0x4020_940d;
const FIDEDUPERANGE: c_ulong = 0xc018_9436;

/// ioctl on a mounted descriptor, answered as a file system without
/// reflinks or special requests answers: FIONREAD (bytes left to read) and
/// FIONBIO as on any file (FIOCLEX and FIONCLEX: see [`ioctl`]); clones
/// EOPNOTSUPP (cp then copies); a terminal's requests ENOTTY (`isatty` is
/// false); anything else ENOTTY with a log line.
fn ioctl_mounted(fd: c_int, d: &Description, request: c_ulong, arg: c_ulong) -> c_int {
    match request {
        libc::FIONREAD => {
            let Ok(file) = d.file() else { return fail(libc::ENOTTY) };
            let position = *d.position.lock().unwrap_or_else(|e| e.into_inner());
            let left = file.len().saturating_sub(position).min(c_int::MAX as u64) as c_int;
            if arg == 0 {
                return fail(libc::EFAULT);
            }
            // SAFETY: FIONREAD takes a pointer to an int (the C contract).
            unsafe { (arg as *mut c_int).write(left) };
            0
        }
        libc::FIONBIO => {
            if arg == 0 {
                return fail(libc::EFAULT);
            }
            // SAFETY: FIONBIO takes a pointer to an int (the C contract).
            let on = unsafe { (arg as *const c_int).read() } != 0;
            let flag = libc::O_NONBLOCK;
            d.flags
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| Some(if on { f | flag } else { f & !flag }))
                .ok();
            0
        }
        FICLONE | FICLONERANGE | FIDEDUPERANGE => fail(libc::EOPNOTSUPP),
        // The terminal requests (0x54xx): a file is not a terminal.
        r if r & !0xff == 0x5400 => fail(libc::ENOTTY),
        _ => {
            crate::log(&format!("ioctl request {request:#x} on mounted fd {fd} is not supported (ENOTTY)"));
            fail(libc::ENOTTY)
        }
    }
}

/// `ioctl`: a mounted descriptor's (see [`ioctl_mounted`]), else the C
/// library's. FIOCLEX and FIONCLEX set the close-on-exec flag of a mounted
/// descriptor's reserved number (an `O_PATH` descriptor, which takes no
/// ioctl), in a forked child too (Python's `pass_fds` sets it there).
///
/// # Safety
/// As the C function (the third argument is passed on as given).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if matches!(request, libc::FIOCLEX | libc::FIONCLEX) && mounting() && mount::is_mounted(fd) {
        let flag = if request == libc::FIOCLEX { libc::FD_CLOEXEC as c_ulong } else { 0 };
        // SAFETY: F_SETFD on the reserved number (the kernel keeps close-on-exec per number).
        return unsafe { real::fcntl(fd, libc::F_SETFD, flag) };
    }
    if let Some(r) = super::on_fd(fd, fail, |d| ioctl_mounted(fd, d, request, arg)) {
        return r;
    }
    // SAFETY: passed on.
    unsafe { real::ioctl(fd, request, arg) }
}

/// Runs `make`, a program's call that makes descriptors at the lowest free
/// numbers and never blocks, while no thread of iopath's holds a low
/// number for a moment ([`placing_numbers`]), and forgets what routing
/// knew of the numbers it gave (`fds`: their count at `made`). A thread of
/// iopath's that starts a bridge holds the lowest free number with its
/// pipe's end until it moves it up: a program's `pipe` or `socket` at that
/// moment got the number above, hundreds of times in 2 s of
/// `tests/c/lowest_numbers.c`. iopath's own calls pass straight through.
fn making(make: impl FnOnce() -> c_int, made: *const c_int, fds: usize) -> c_int {
    if crate::inside() {
        return make();
    }
    let r = placing_numbers(make);
    if fds == 1 {
        return created(r);
    }
    if r == 0 {
        for i in 0..fds {
            // SAFETY: the call filled `fds` descriptors at `made`.
            created(unsafe { *made.add(i) });
        }
    }
    r
}

/// `pipe`: at the lowest free numbers ([`making`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: passed on.
    making(|| unsafe { real::pipe(fds) }, fds, 2)
}

/// `pipe2`: at the lowest free numbers ([`making`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: passed on.
    making(|| unsafe { real::pipe2(fds, flags) }, fds, 2)
}

/// `socketpair`: at the lowest free numbers ([`making`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socketpair(domain: c_int, kind: c_int, protocol: c_int, fds: *mut c_int) -> c_int {
    // SAFETY: passed on.
    making(|| unsafe { real::socketpair(domain, kind, protocol, fds) }, fds, 2)
}

/// Declares hooks of calls that make one descriptor and never block: each
/// takes the lowest free number ([`making`]).
macro_rules! one_descriptor {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: at the lowest free number ([`making`]).")]
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            // SAFETY: passed on.
            making(|| unsafe { real::$name($($arg),*) }, std::ptr::null(), 1)
        }
    )*};
}

one_descriptor! {
    socket(domain: c_int, kind: c_int, protocol: c_int);
    eventfd(initial: c_uint, flags: c_int);
    epoll_create(size: c_int);
    epoll_create1(flags: c_int);
    memfd_create(name: *const libc::c_char, flags: c_uint);
    signalfd(fd: c_int, mask: *const libc::sigset_t, flags: c_int);
    timerfd_create(clock: c_int, flags: c_int);
    inotify_init();
    inotify_init1(flags: c_int);
}

/// `accept`: at the lowest free number, as an `open` takes it (it may wait
/// for ever for a connection, so nothing is held across it:
/// [`iopath::sys::taking_lowest`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, address: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: passed on.
    accepting(|| unsafe { real::accept(fd, address, len) }, false)
}

/// `accept4`: as [`accept`], close-on-exec as `flags` asks.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    address: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: passed on.
    accepting(|| unsafe { real::accept4(fd, address, len, flags) }, flags & libc::SOCK_CLOEXEC != 0)
}

/// An accepted connection's descriptor at the lowest free number
/// (`cloexec`: as asked); iopath's own calls pass straight through.
fn accepting(accept: impl FnOnce() -> c_int, cloexec: bool) -> c_int {
    if crate::inside() {
        return accept();
    }
    created(iopath::sys::taking_lowest(accept, cloexec))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_dup2_made_inside_iopath_stays_on_the_number_it_names() {
        // (Only this thread is inside: other tests' descriptors are not moved.)
        crate::MOUNTING.store(true, Ordering::SeqCst);
        let _inside = crate::Inside::enter();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let target = 777;
        // SAFETY: duplicates a descriptor we own onto a number no one uses here, then closes it.
        unsafe {
            assert_eq!(super::dup2(file.as_raw_fd(), target), target);
            assert!(libc::fcntl(target, libc::F_GETFD) >= 0, "the copy is on {target}");
            libc::close(target);
        }
    }
}
