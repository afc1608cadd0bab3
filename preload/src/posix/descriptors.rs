//! Descriptors: close, close_range, dup, dup2, dup3, fcntl's duplicate
//! and flag commands, and ioctl. A mounted descriptor's duplicates share its
//! description (one file position, one set of status flags), as POSIX
//! says; the kernel keeps the close-on-exec flag of each number.

use super::{fail, locks, mounting};
use crate::mount::{self, Description};
use crate::route::{after_fcntl, created};
use crate::{FORKED, ROUTING, bridge, fds, real};
use libc::{c_int, c_uint, c_ulong};
use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Forgets mounted descriptor `fd`, which the kernel is closing or replacing.
/// In a forked child the description is the parent's: it is left alone.
fn drop_mounted(fd: c_int) {
    if let Some(description) = mount::remove(fd) {
        if FORKED.load(Ordering::Relaxed) {
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
    if mount::is_mounted(fd) {
        drop_mounted(fd);
    }
    mount::kernel_dir_closed(fd);
    if ROUTING.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed) {
        fds::forget(fd);
    }
    // SAFETY: passed on.
    let r = unsafe { real::close(fd) };
    if r == 0 {
        let _errno = KeepErrno::new();
        bridge::closed(fd);
    }
    r
}

/// Keeps the calling thread's errno as it was when made, until dropped
/// (this library's work after a call must not change what the call left).
struct KeepErrno(c_int);

impl KeepErrno {
    fn new() -> KeepErrno {
        // SAFETY: the calling thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        crate::set_errno(self.0);
    }
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
        let _errno = KeepErrno::new();
        bridge::closed_range(first.min(c_int::MAX as c_uint) as c_int, last.min(c_int::MAX as c_uint) as c_int);
    }
    r
}

/// After the kernel made `new` a duplicate of mounted `old`: `new` shares
/// its description, or, on a standard stream (0, 1, 2: the C library's stdio
/// calls the kernel on those), becomes a pipe a bridge keeps (`bridge.rs`).
fn duplicated(new: c_int, description: Option<Arc<Description>>, cloexec: bool) -> c_int {
    if new >= 0
        && let Some(d) = description
    {
        if bridge::wanted(&d, new) && !FORKED.load(Ordering::Relaxed) {
            let _inside = crate::Inside::enter();
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
    let new = unsafe { real::dup(fd) };
    mount::kernel_dir_duplicated(fd, new);
    if description.is_some() {
        return duplicated(new, description, false);
    }
    bridge::duplicated(fd, new);
    created(new)
}

fn dup_to(fd: c_int, to: c_int, cloexec: bool, call: impl FnOnce() -> c_int) -> c_int {
    let description = mounting().then(|| mount::lookup(fd)).flatten();
    let r = call();
    if r >= 0 && fd != to {
        if mount::is_mounted(to) {
            drop_mounted(to); // the kernel closed what `to` was
        }
        mount::kernel_dir_closed(to);
        mount::kernel_dir_duplicated(fd, r);
        {
            let _errno = KeepErrno::new();
            bridge::closed(to); // (if `to` was on a bridge)
        }
        if description.is_some() {
            return duplicated(r, description, cloexec);
        }
        bridge::duplicated(fd, to);
        created(r);
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

fn fcntl_any(fd: c_int, cmd: c_int, arg: c_ulong, call: impl FnOnce() -> c_int) -> c_int {
    let description = mounting().then(|| mount::lookup(fd)).flatten();
    if let Some(d) = &description {
        if crate::FORKED.load(Ordering::Relaxed) {
            return fail(libc::EBADF);
        }
        let _inside = crate::Inside::enter();
        if let Some(r) = fcntl_mounted(fd, d, cmd, arg) {
            return r;
        }
        let r = call();
        return match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => duplicated(r, description, cmd == libc::F_DUPFD_CLOEXEC),
            _ => r,
        };
    }
    let r = after_fcntl(fd, cmd, call());
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        mount::kernel_dir_duplicated(fd, r);
        bridge::duplicated(fd, r);
    }
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
/// reflinks or special requests answers: FIONREAD (bytes left to read),
/// FIONBIO, FIOCLEX and FIONCLEX as on any file; clones EOPNOTSUPP (cp then
/// copies); a terminal's requests ENOTTY (`isatty` is false); anything else
/// ENOTTY with a log line.
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
        // SAFETY: F_SETFD on the reserved number (the kernel keeps close-on-exec per number).
        libc::FIOCLEX => unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as c_ulong) },
        // SAFETY: as above.
        libc::FIONCLEX => unsafe { real::fcntl(fd, libc::F_SETFD, 0) },
        FICLONE | FICLONERANGE | FIDEDUPERANGE => fail(libc::EOPNOTSUPP),
        // The terminal requests (0x54xx): a file is not a terminal.
        r if r & !0xff == 0x5400 => fail(libc::ENOTTY),
        _ => {
            crate::log(&format!("ioctl request {request:#x} on mounted fd {fd} is not supported (ENOTTY)"));
            fail(libc::ENOTTY)
        }
    }
}

/// `ioctl`: a mounted descriptor's (see [`ioctl_mounted`]), else the C library's.
///
/// # Safety
/// As the C function (the third argument is passed on as given).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if let Some(r) = super::on_fd(fd, fail, |d| ioctl_mounted(fd, d, request, arg)) {
        return r;
    }
    // SAFETY: passed on.
    unsafe { real::ioctl(fd, request, arg) }
}

/// `_exit`: commits the mounts first (a shell or a child ends this way, not
/// through `exit`, and its files must be there as after any normal end),
/// and says what was routed (fio's forked jobs end this way).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::at_exit(false);
    // SAFETY: passed on.
    unsafe { real::_exit(status) }
}

/// `_Exit`: as [`_exit`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    crate::at_exit(false);
    // SAFETY: _Exit is _exit (C99's name for it).
    unsafe { real::_exit(status) }
}

/// `vfork`: a `fork` here. A wrapper cannot call the real `vfork` (the child
/// would return through this function's frame on the parent's stack), and
/// `fork` runs the handler that gives idle mounts back, which a shell's next
/// command needs (dash starts simple commands with vfork).
///
/// # Safety
/// As the C function: the child must only exec or `_exit` (as after vfork).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has the C library's own preconditions only.
    unsafe { libc::fork() }
}

type SpawnFn = unsafe fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> c_int;

/// posix_spawn and posix_spawnp: give idle mounts back first (the child is
/// started without `fork`'s handlers) and pass a working directory inside a
/// mount on, as an exec does.
///
/// # Safety
/// As the C functions.
unsafe fn spawn(
    real_spawn: SpawnFn,
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    crate::release_mounts_before_fork();
    let entries = passed_entries(&bridge::HandOver::default());
    let env = with_entries(envp.cast(), &entries);
    // SAFETY: passed on, with an environment array that outlives the call.
    unsafe { real_spawn(pid, file, actions, attr, argv, env.as_ptr().cast()) }
}

/// `posix_spawn`: see `spawn`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed on.
    unsafe { spawn(real::posix_spawn, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp`: see `spawn`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed on.
    unsafe { spawn(real::posix_spawnp, pid, file, actions, attr, argv, envp) }
}

/// Before an exec: hand the standard streams on mounted files on (they
/// become pipes the next program's interposer keeps: `bridge.rs`), commit
/// every mount (the process image that holds it is about to go, and exec
/// runs no exit handlers), give back those nothing holds open, and tell the
/// new program where in a mount its working directory is (`IOPATH_CWD`:
/// the kernel's is the mount's own directory). If the exec fails,
/// [`after_failed_exec`] puts the streams back, and the next call mounts
/// again.
fn before_exec() -> bridge::HandOver {
    let handed = bridge::hand_over();
    crate::commit_mounts_now();
    crate::release_mounts_before_fork();
    handed
}

/// The exec failed (errno kept): this program goes on as before it.
fn after_failed_exec(handed: bridge::HandOver) {
    let errno = super::last_errno();
    handed.undo();
    crate::set_errno(errno);
}

/// The environment entries this library passes to an executed program.
const PASSED: [&[u8]; 2] = [b"IOPATH_CWD=", b"IOPATH_STDIO="];

/// The entries a new program gets: the working directory if it is in a
/// mount, the standard streams handed on.
fn passed_entries(handed: &bridge::HandOver) -> Vec<CString> {
    let cwd = if super::mounting() { crate::mount::virtual_cwd() } else { None };
    let cwd = cwd.and_then(|dir| CString::new([&b"IOPATH_CWD="[..], &dir].concat()).ok());
    cwd.into_iter().chain(handed.entry()).collect()
}

/// `envp` without this library's entries, plus `entries`.
fn with_entries(envp: *const *const libc::c_char, entries: &[CString]) -> Vec<*const libc::c_char> {
    let mut out = Vec::new();
    let mut at = envp;
    // SAFETY: envp is a NULL-terminated array of NUL-terminated strings (the C contract).
    unsafe {
        while !at.is_null() && !(*at).is_null() {
            let entry = std::ffi::CStr::from_ptr(*at).to_bytes();
            if !PASSED.iter().any(|p| entry.starts_with(p)) {
                out.push(*at);
            }
            at = at.add(1);
        }
    }
    out.extend(entries.iter().map(|e| e.as_ptr()));
    out.push(std::ptr::null());
    out
}

/// Sets this library's entries in this process's environment, as
/// `entries` has them (for the exec forms that pass it on implicitly).
fn export(entries: &[CString]) {
    for name in PASSED {
        let value = entries.iter().find_map(|e| e.as_bytes().strip_prefix(name));
        let name = CString::new(&name[..name.len() - 1]).expect("no NUL");
        match value.map(CString::new) {
            // SAFETY: setenv/unsetenv with NUL-terminated strings; the process is about to exec.
            Some(Ok(value)) => unsafe {
                libc::setenv(name.as_ptr(), value.as_ptr(), 1);
            },
            // SAFETY: as above.
            _ => unsafe {
                libc::unsetenv(name.as_ptr());
            },
        }
    }
}

/// `execve`: hands the mounts and standard streams on first (`before_exec`).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    let handed = before_exec();
    let entries = passed_entries(&handed);
    let env = with_entries(envp, &entries);
    // SAFETY: passed on, with an environment array that outlives the call.
    let failed = unsafe { real::execve(super::kernel(libc::AT_FDCWD, path).ptr(), argv, env.as_ptr()) };
    after_failed_exec(handed);
    failed
}

/// `execv`: hands the mounts and standard streams on first (`before_exec`).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    let handed = before_exec();
    export(&passed_entries(&handed));
    // SAFETY: passed on.
    let failed = unsafe { real::execv(super::kernel(libc::AT_FDCWD, path).ptr(), argv) };
    after_failed_exec(handed);
    export(&passed_entries(&bridge::HandOver::default()));
    failed
}

/// `execvp`: hands the mounts and standard streams on first (`before_exec`).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    let handed = before_exec();
    export(&passed_entries(&handed));
    // SAFETY: passed on.
    let failed = unsafe { real::execvp(file, argv) };
    after_failed_exec(handed);
    export(&passed_entries(&bridge::HandOver::default()));
    failed
}

/// `execvpe`: hands the mounts and standard streams on first (`before_exec`).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    let handed = before_exec();
    let entries = passed_entries(&handed);
    let env = with_entries(envp, &entries);
    // SAFETY: passed on, with an environment array that outlives the call.
    let failed = unsafe { real::execvpe(file, argv, env.as_ptr()) };
    after_failed_exec(handed);
    failed
}
