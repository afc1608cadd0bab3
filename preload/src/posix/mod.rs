//! The POSIX surface of the interposer: every C library function it
//! replaces, one file per family of calls.
//!
//! Each hook first asks whether the call is on a mount (a path inside an
//! `IOPATH_MOUNT` directory, or a descriptor opened there: `mount.rs`) and
//! serves it from iopath's file system with the errno the kernel would
//! give; otherwise an `IOPATH_FILES` descriptor's I/O is routed through its
//! engine (`route.rs`); everything else goes to the C library untouched.
//!
//! - `paths.rs`: open and its variants, creat, unlink, rename, mkdir, rmdir, access, truncate, umask,
//!   chdir, fchdir, getcwd (a working directory inside a mount is kept here: the kernel's cannot be),
//!   symlink, readlink, link and linkat, mknod and mkfifo (FIFOs and regular files; other nodes EPERM)
//! - `descriptors.rs`: close, close_range, dup, dup2, dup3, fcntl (duplicates and flags), ioctl;
//!   a mounted file put on descriptor 0, 1 or 2 becomes a bridge's pipe (`bridge/`)
//! - `processes.rs`: `_exit`/`_Exit` (which commit the mounts first, as `exit` does),
//!   `vfork`/`posix_spawn` (which give idle mounts back first, as `fork` does, so a child can
//!   mount them), and the exec family (which commits the mounts first, hands the standard
//!   streams on mounted files on, and runs programs stored on a mount)
//! - `spawn.rs`: posix_spawn's file actions (recorded as they are added): a `dup2` of a mounted
//!   descriptor or an `open` of a mounted path becomes a pipe that a bridge of this process keeps,
//!   a `chdir` into a mount is passed on as an exec passes the working directory
//! - `data.rs`: read, write and their positioned and vectored forms, lseek, copy_file_range,
//!   sendfile, fsync, fdatasync, syncfs, sync_file_range, ftruncate, fallocate, posix_fallocate,
//!   fadvise, readahead
//! - `maps.rs`: mmap, munmap, msync and mremap (a private map of a mounted file is a copy; a
//!   shared one follows the file, and what is stored into it reaches the file)
//! - `libraries.rs`: dlopen and dlmopen of a library stored on a mount (loaded from a copy in a
//!   memfd, as an exec of a program stored there is)
//! - `directories.rs`: opendir, fdopendir, readdir, rewinddir, telldir, seekdir, closedir, dirfd
//! - `metadata.rs`: the stat family (stat, lstat, fstat, fstatat, statx and the `__xstat` forms),
//!   chmod, utimensat/futimens/utimes, chown (see there), statfs
//! - `credentials.rs`: the owner every mounted file has (the effective user and group, kept),
//!   and setuid, seteuid, setreuid, setresuid and their group forms, which make it read again
//! - `locks.rs`: fcntl record locks and flock on mounted files
//! - `stdio.rs`: fopen, fdopen and fileno on mounted files (through `fopencookie`), freopen
//!   of a standard stream onto one (a bridge)
//! - `raw.rs`: `syscall`, for the file calls programs make by number (libuv's `statx`)
//! - `signals.rs`: `sigaction` and `signal`, which show `SIG_DFL` where the library's stand-in
//!   handler (`ending.rs`: a killing signal commits the mounts first) is installed, and the
//!   program's own handler where its wrapper (`program_handlers.rs`: run between calls) is
//!
//! Symbolic links are followed here, before a call is served (`on_path`;
//! `on_path_nofollow` for the calls that act on a last link itself): a
//! link's absolute target is a path of the process, a relative one that
//! climbs above a mount's root leaves through the mount's directory, and
//! either may lead into another mount or out of all of them, where the
//! kernel gets the path the links led to (`kernel`).
//!
//! In a child after `fork` of a parent that held a mount, the mount is not
//! there (its engine's threads are not): calls on inherited mounted
//! descriptors fail with `EBADF`, calls on paths inside a mount with
//! `EPERM`, each said once on stderr; the parent keeps working. A child of
//! a parent that held none (it gave them back before the fork, as a shell
//! does) mounts at first use, as a new process does.

pub mod credentials;
pub mod data;
pub mod descriptors;
pub mod directories;
pub mod libraries;
pub mod locks;
pub mod maps;
pub mod metadata;
pub mod paths;
pub mod processes;
pub mod raw;
pub mod signals;
pub mod spawn;
pub mod stdio;

use crate::mount::{self, Description};
use crate::{FORKED, MOUNTING, set_errno};
use libc::{c_char, c_int};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The stream, spawn-action and library-copy lists of the calls here,
/// held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Vec<crate::fork_holds::Held> {
    [stdio::hold_for_fork(), directories::hold_for_fork(), spawn::hold_for_fork(), libraries::hold_for_fork()]
        .into_iter()
        .flatten()
        .collect()
}

/// Whether this call should look at the mounts (none set, or a call iopath makes itself: no).
pub(crate) fn mounting() -> bool {
    MOUNTING.load(Ordering::Relaxed) && !crate::inside()
}

/// -1 with `errno` set.
pub(crate) fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// The errno the last failed call of the C library left.
pub(crate) fn last_errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// The errno of an iopath error.
pub(crate) fn errno_of(e: &iopath::Error) -> c_int {
    iopath::capi::errno_of(e)
}

static SAID_INHERITED: AtomicBool = AtomicBool::new(false);
static SAID_STUCK: AtomicBool = AtomicBool::new(false);

/// In a forked child of a process that held the mount, a call on `fd`,
/// one of the parent's mounted descriptors (its file is the parent's
/// mount's, see [`mount::inherited`]): with `stream` (`read`, `write`,
/// `readv`, `writev`: `Some(true)` for a write) on a description open
/// that way only, the number becomes a pipe the parent bridges, as an exec
/// does with them (`bridge/adopt.rs`), and the call goes to the kernel on
/// it (`Some(None)`): a forked child's `write(4, ...)` lands in the
/// parent's file at the shared position. Any other call, or where the
/// parent does not take it: `Some(Some(EBADF))`, said once. `None` if `d`
/// is not the parent's.
fn inherited(fd: c_int, d: &Description, stream: Option<bool>) -> Option<Option<c_int>> {
    if !mount::inherited(d) {
        return None;
    }
    let one_way = match d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE {
        libc::O_RDONLY => Some(false),
        libc::O_WRONLY => Some(true),
        _ => None,
    };
    if stream.is_some() && stream == one_way {
        // SAFETY: F_GETFD on the caller's descriptor.
        let cloexec = unsafe { crate::real::fcntl(fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
        let _inside = crate::Inside::enter();
        if crate::bridge::bridged_in_place(d, fd, cloexec) {
            return Some(None);
        }
    }
    if !SAID_INHERITED.swap(true, Ordering::Relaxed) {
        crate::say(
            "a forked child cannot use its parent's iopath mount through the descriptors it had open at the \
             fork (their files are the parent's mount's): calls on them fail with EBADF, but for reading or \
             writing one open only for that, which the parent bridges; open the file again in the child",
        );
    }
    Some(Some(libc::EBADF))
}

/// Whether a forked child cannot use `m` at all ([`mount::Mount::stuck`]); said once.
fn stuck(m: &mount::Mount) -> bool {
    let stuck = m.stuck();
    if stuck && !SAID_STUCK.swap(true, Ordering::Relaxed) {
        crate::say(
            "a forked child cannot use its parent's iopath mount (a thread of the parent was using it at \
             the fork); calls on mounted paths fail with EPERM",
        );
    }
    stuck
}

/// What a call on descriptor `fd` does: `None` if it is not a mount's (the
/// caller goes on as before), else the result of `serve` on its description.
pub(crate) fn on_fd<R>(
    fd: c_int,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(&Arc<Description>) -> R,
) -> Option<R> {
    on_fd_as(fd, None, failed, serve)
}

/// [`on_fd`] for `read`, `write`, `readv` and `writev` (`writes`: the
/// latter two) at the file position: in a forked child, a descriptor of
/// its parent's open only that way becomes a pipe the parent bridges.
pub(crate) fn on_stream_fd<R>(
    fd: c_int,
    writes: bool,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(&Arc<Description>) -> R,
) -> Option<R> {
    on_fd_as(fd, Some(writes), failed, serve)
}

fn on_fd_as<R>(
    fd: c_int,
    stream: Option<bool>,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(&Arc<Description>) -> R,
) -> Option<R> {
    if !mounting() || !mount::is_mounted(fd) {
        return None;
    }
    let description = mount::lookup(fd)?;
    match inherited(fd, &description, stream) {
        None => {}
        Some(None) => return None,
        Some(Some(errno)) => return Some(failed(errno)),
    }
    let _inside = crate::Inside::enter();
    Some(serve(&description))
}

/// [`on_fd`] for the calls on a file itself rather than on its bytes
/// (`fsync`, `futimens`, `fchmod`, `ftruncate`, ...): a descriptor on a
/// bridge (a mounted file on a standard stream, `bridge/`) stands for the
/// bridge's file, once the bridge has written what its pipe holds. `touch`
/// opens its file onto descriptor 0 and sets the time there; a program
/// that syncs its standard output expects the file to be durable.
pub(crate) fn on_file_fd<R>(
    fd: c_int,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(&Arc<Description>) -> R,
) -> Option<R> {
    if !mounting() || mount::is_mounted(fd) || FORKED.load(Ordering::Relaxed) {
        return on_fd(fd, failed, serve);
    }
    let description = crate::bridge::file_of(fd)?;
    let _inside = crate::Inside::enter();
    Some(match description {
        Ok(d) => serve(&d),
        Err(errno) => failed(errno),
    })
}

/// The bytes of a C path (`None` for NULL).
pub(crate) fn path_bytes<'a>(path: *const c_char) -> Option<&'a [u8]> {
    if path.is_null() {
        return None;
    }
    // SAFETY: a non-NULL path is NUL-terminated (the C contract).
    Some(unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes())
}

/// What a call on `path` (relative to `dirfd`) does: `None` if it is
/// outside every mount, else the result of `serve` on where it leads. The
/// symbolic links on the way are followed, the last component's too (as
/// `stat` and `open` do); [`on_path_nofollow`] leaves a last link as it is.
pub(crate) fn on_path<R>(
    dirfd: c_int,
    path: *const c_char,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(mount::Inside) -> R,
) -> Option<R> {
    on_path_as(dirfd, path, true, failed, serve)
}

/// [`on_path`] for calls that act on a link itself (`lstat`, `unlink`,
/// `rename`, `readlink`, `mkdir`, `symlink`, `O_NOFOLLOW`).
pub(crate) fn on_path_nofollow<R>(
    dirfd: c_int,
    path: *const c_char,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(mount::Inside) -> R,
) -> Option<R> {
    on_path_as(dirfd, path, false, failed, serve)
}

fn on_path_as<R>(
    dirfd: c_int,
    path: *const c_char,
    follow: bool,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(mount::Inside) -> R,
) -> Option<R> {
    if !mounting() {
        return None;
    }
    let bytes = path_bytes(path)?;
    forget_redirect(path);
    let inside = mount::resolve(dirfd, bytes)?;
    if stuck(inside.mount) {
        return Some(failed(libc::EPERM));
    }
    let _inside = crate::Inside::enter();
    match follow_links(inside, follow) {
        Ok(Some(inside)) => Some(serve(inside)),
        Ok(None) => None,
        Err(Redirect::Outside(to)) => {
            // A link led out of every mount: the kernel gets the path it leads to.
            redirect(path, to);
            None
        }
        Err(Redirect::Failed(errno)) => Some(failed(errno)),
    }
}

/// Why a path's links did not end inside a mount.
enum Redirect {
    /// They lead to this path, outside every mount.
    Outside(Vec<u8>),
    /// Resolving them failed (ELOOP, ENOENT on the way, ...).
    Failed(c_int),
}

/// Follows the symbolic links of a path inside a mount, across mounts and
/// out of them (a link's absolute target is the process's path, not the
/// mount's; a relative one that climbs above the mount's root leaves it
/// through its directory). `Ok(None)`: the mount could not be mounted
/// (the caller's serve reports that).
fn follow_links(mut inside: mount::Inside, follow: bool) -> Result<Option<mount::Inside>, Redirect> {
    use iopath::fs::Resolved;
    for _ in 0..=40 {
        let Ok(fs) = inside.mount.fs() else { return Ok(Some(inside)) };
        let next = match fs.resolve(&inside.path, follow) {
            Ok(None) => return Ok(Some(inside)),
            Ok(Some(Resolved::Inside(path))) => return Ok(Some(mount::Inside { mount: inside.mount, path })),
            Ok(Some(Resolved::Absolute(path))) => path,
            Ok(Some(Resolved::Above(rel))) => mount::normalize(&inside.mount.dir, &rel),
            Err(e) => return Err(Redirect::Failed(errno_of(&e))),
        };
        match mount::resolve(libc::AT_FDCWD, &next) {
            Some(further) => inside = further,
            None => return Err(Redirect::Outside(next)),
        }
    }
    Err(Redirect::Failed(libc::ELOOP))
}

thread_local! {
    /// Paths a mount's links sent out of every mount, by the caller's pointer:
    /// the kernel call that follows ([`kernel`]) takes the path from here.
    static REDIRECTS: std::cell::RefCell<Vec<(usize, std::ffi::CString)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn forget_redirect(path: *const c_char) {
    let _ = REDIRECTS.try_with(|r| r.borrow_mut().retain(|(p, _)| *p != path as usize));
}

fn redirect(path: *const c_char, to: Vec<u8>) {
    let Ok(to) = std::ffi::CString::new(to) else { return };
    let _ = REDIRECTS.try_with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= 4 {
            r.clear(); // (a hook that never made its kernel call: never more than a few)
        }
        r.push((path as usize, to));
    });
}

fn take_redirect(path: *const c_char) -> Option<std::ffi::CString> {
    REDIRECTS
        .try_with(|r| {
            let mut r = r.borrow_mut();
            let at = r.iter().position(|(p, _)| *p == path as usize)?;
            Some(r.swap_remove(at).1)
        })
        .ok()
        .flatten()
}

/// -1 as an `ssize_t` with `errno` set.
pub(crate) fn fail_size(errno: c_int) -> libc::ssize_t {
    set_errno(errno);
    -1
}

/// A path for the kernel: the caller's, or the absolute one a relative
/// path means while the working directory is a mount's ([`mount::kernel_path`]).
pub(crate) struct KernelPath {
    original: *const c_char,
    rewritten: Option<std::ffi::CString>,
}

impl KernelPath {
    /// The pointer to pass on.
    pub(crate) fn ptr(&self) -> *const c_char {
        self.rewritten.as_ref().map_or(self.original, |c| c.as_ptr())
    }

    /// The rewritten path, if the kernel should get another than the caller's.
    pub(crate) fn into_rewritten(self) -> Option<std::ffi::CString> {
        self.rewritten
    }
}

/// What the kernel should get for `path` relative to `dirfd` (where a
/// mount's symbolic link led it out, the path it leads to).
pub(crate) fn kernel(dirfd: c_int, path: *const c_char) -> KernelPath {
    let rewritten = if MOUNTING.load(Ordering::Relaxed) {
        take_redirect(path).or_else(|| path_bytes(path).and_then(|p| mount::kernel_path(dirfd, p)))
    } else {
        None
    };
    KernelPath { original: path, rewritten }
}
