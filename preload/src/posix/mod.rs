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
//!   and the nodes a mount cannot hold (symlink, link, mknod, mkfifo: EPERM; readlink: EINVAL)
//! - `descriptors.rs`: close, close_range, dup, dup2, dup3, fcntl (duplicates and flags), ioctl, and
//!   `_exit`/`_Exit` (which commit the mounts first, as `exit` does), and `vfork`/`posix_spawn`
//!   (which give idle mounts back first, as `fork` does, so a child can mount them), and the
//!   exec family (which commits the mounts first: exec runs no exit handlers)
//! - `data.rs`: read, write and their positioned and vectored forms, lseek, copy_file_range,
//!   sendfile, fsync, fdatasync, syncfs, sync_file_range, ftruncate, fallocate, posix_fallocate,
//!   fadvise, readahead, mmap
//! - `directories.rs`: opendir, fdopendir, readdir, rewinddir, telldir, seekdir, closedir, dirfd
//! - `metadata.rs`: the stat family (stat, lstat, fstat, fstatat, statx and the `__xstat` forms),
//!   chmod, utimensat/futimens/utimes, chown (see there), statfs
//! - `locks.rs`: fcntl record locks and flock on mounted files
//! - `stdio.rs`: fopen, fdopen and fileno on mounted files (through `fopencookie`)
//!
//! In a child after `fork` of a parent that held a mount, the mount is not
//! there (its engine's threads are not): calls on inherited mounted
//! descriptors fail with `EBADF`, calls on paths inside a mount with
//! `EPERM`, each said once on stderr; the parent keeps working. A child of
//! a parent that held none (it gave them back before the fork, as a shell
//! does) mounts at first use, as a new process does.

pub mod data;
pub mod descriptors;
pub mod directories;
pub mod locks;
pub mod metadata;
pub mod paths;
pub mod stdio;

use crate::mount::{self, Description};
use crate::{FORKED, INSIDE, MOUNTING, set_errno};
use libc::{c_char, c_int};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this call should look at the mounts (none set, or a call iopath makes itself: no).
pub(crate) fn mounting() -> bool {
    MOUNTING.load(Ordering::Relaxed) && !INSIDE.try_with(Cell::get).unwrap_or(true)
}

/// -1 with `errno` set.
pub(crate) fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// The errno of an iopath error.
pub(crate) fn errno_of(e: &iopath::Error) -> c_int {
    iopath::capi::errno_of(e)
}

static SAID_FORKED: AtomicBool = AtomicBool::new(false);

fn forked() -> bool {
    let forked = FORKED.load(Ordering::Relaxed);
    if forked && !SAID_FORKED.swap(true, Ordering::Relaxed) {
        crate::say(
            "a forked child cannot use its parent's iopath mount (its engine's threads are not here); \
             calls on inherited mounted descriptors fail with EBADF, on mounted paths with EPERM",
        );
    }
    forked
}

/// What a call on descriptor `fd` does: `None` if it is not a mount's (the
/// caller goes on as before), else the result of `serve` on its description.
pub(crate) fn on_fd<R>(
    fd: c_int,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(&Arc<Description>) -> R,
) -> Option<R> {
    if !mounting() || !mount::is_mounted(fd) {
        return None;
    }
    if forked() {
        return Some(failed(libc::EBADF));
    }
    let description = mount::lookup(fd)?;
    let _inside = crate::Inside::enter();
    Some(serve(&description))
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
/// outside every mount, else the result of `serve` on where it leads.
pub(crate) fn on_path<R>(
    dirfd: c_int,
    path: *const c_char,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(mount::Inside) -> R,
) -> Option<R> {
    if !mounting() {
        return None;
    }
    let inside = mount::resolve(dirfd, path_bytes(path)?)?;
    if forked() {
        return Some(failed(libc::EPERM));
    }
    let _inside = crate::Inside::enter();
    Some(serve(inside))
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
}

/// What the kernel should get for `path` relative to `dirfd`.
pub(crate) fn kernel(dirfd: c_int, path: *const c_char) -> KernelPath {
    let rewritten = if MOUNTING.load(Ordering::Relaxed) {
        path_bytes(path).and_then(|p| mount::kernel_path(dirfd, p))
    } else {
        None
    };
    KernelPath { original: path, rewritten }
}
