//! Locks on mounted files: fcntl record locks and flock.
//!
//! One process holds a mount at a time, so the locks that belong to a
//! process (`F_SETLK`, `F_SETLKW`: POSIX record locks) never conflict: each
//! is granted and `F_GETLK` finds none, exactly as the kernel answers a
//! process that asks about its own locks; a description that took one
//! keeps its mount from other processes while it is open. `flock` locks
//! belong to the open file description and are the kernel's own, taken on
//! a file that stands for the inode (see [`flock_mounted`]): they conflict
//! between descriptions, in one process or across processes that take
//! turns on the mount. Open-file-description record locks (`F_OFD_*`) are
//! granted without checking ranges between descriptions (said once with
//! `IOPATH_LOG`).

use super::{fail, on_fd};
use crate::mount::Description;
use crate::real;
use libc::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// fcntl's record-lock commands on a mounted description.
pub(crate) fn record_lock(d: &Description, cmd: c_int, lock: *mut libc::flock) -> c_int {
    if lock.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: fcntl's lock argument points to a struct flock (the C contract).
    let lock = unsafe { &mut *lock };
    let kind = lock.l_type as c_int;
    if ![libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK].contains(&kind) {
        return fail(libc::EINVAL);
    }
    if kind == libc::F_RDLCK && !d.readable() && cmd != libc::F_GETLK && cmd != libc::F_OFD_GETLK {
        return fail(libc::EBADF);
    }
    if kind == libc::F_WRLCK && !d.writable() && cmd != libc::F_GETLK && cmd != libc::F_OFD_GETLK {
        return fail(libc::EBADF);
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if matches!(cmd, libc::F_OFD_SETLK | libc::F_OFD_SETLKW) && !SAID.swap(true, Ordering::Relaxed) {
        crate::log("open-file-description locks on mounted files are granted without checking other descriptions");
    }
    if cmd == libc::F_GETLK || cmd == libc::F_OFD_GETLK {
        lock.l_type = libc::F_UNLCK as i16;
    } else if kind != libc::F_UNLCK {
        d.locked.store(true, Ordering::Release);
    }
    0
}

/// `flock` on a mounted description: taken by the kernel on the file that
/// stands for its inode ([`iopath::fs::lock::flock_path`]), through a
/// descriptor of its own per description ([`Description::flock_fd`]). So
/// two descriptions conflict as the kernel's do, in one process or two, a
/// blocked `LOCK_EX` waits in the kernel, and a flock held does not keep
/// the mount from a process that waits for it: lent, the description goes
/// dormant and its descriptor keeps the lock. `flock file cmd` with `cmd`
/// on the mount waited 10 s for a mount its parent could not lend, and
/// failed (kept in this process's memory, the lock would have been lost).
fn flock_mounted(d: &Arc<Description>, operation: c_int) -> c_int {
    if !matches!(operation & !libc::LOCK_NB, libc::LOCK_SH | libc::LOCK_EX | libc::LOCK_UN) {
        return fail(libc::EINVAL);
    }
    let Some(ino) = d.file_ino() else { return 0 }; // a directory's flock: nothing shares it here
    let mut fd = d.flock_fd.load(Ordering::Acquire);
    if fd < 0 {
        if operation & !libc::LOCK_NB == libc::LOCK_UN {
            return 0; // never locked
        }
        fd = match lock_file(d, ino) {
            Ok(opened) => match d.flock_fd.compare_exchange(-1, opened, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => opened,
                Err(theirs) => {
                    // Another thread of the program opened it first.
                    // SAFETY: ours, used by nothing else.
                    unsafe { real::close(opened) };
                    theirs
                }
            },
            Err(errno) => return fail(errno),
        };
    }
    // A blocked LOCK_EX waits as long as another holder likes: the program's handlers run meanwhile.
    let _handlers = crate::program_handlers::RunNow::enter();
    // SAFETY: flock on the description's own descriptor.
    unsafe { real::flock(fd, operation) }
}

/// Opens the kernel file of inode `ino` of `d`'s file system (close-on-exec,
/// at a number out of the program's way), or errno.
fn lock_file(d: &Description, ino: u64) -> Result<c_int, c_int> {
    let device = iopath::fs::lock::backing_path(&d.mount.device).ok_or(libc::ENOLCK)?;
    let path = iopath::fs::lock::flock_path(&device, ino).map_err(|e| {
        crate::log(&format!("flock on {}: {e}", d.mount.device));
        libc::ENOLCK
    })?;
    let path = std::ffi::CString::new(path.into_os_string().into_encoded_bytes()).map_err(|_| libc::ENOLCK)?;
    let _inside = crate::Inside::enter();
    let fd = iopath::sys::own_numbers(|| {
        // SAFETY: a NUL-terminated path; the descriptor is ours.
        let fd = unsafe { real::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o666) };
        if fd >= 0 {
            // Anyone may lock it next (umask may have taken bits away).
            // SAFETY: fchmod of our own descriptor.
            unsafe { libc::fchmod(fd, 0o666) };
        }
        crate::route::created(fd)
    });
    if fd < 0 { Err(crate::posix::last_errno()) } else { Ok(fd) }
}

/// Lets go of the flock a description holds (its last descriptor closed,
/// as the kernel does): closes its descriptor of the kernel file.
pub(crate) fn release(d: &Description) {
    let fd = d.flock_fd.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the description's own descriptor, closed once (swapped out above).
        unsafe { real::close(fd) };
    }
}

/// `flock`: per description on a mounted file, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    // SAFETY: passed on.
    on_fd(fd, fail, |d| flock_mounted(d, operation)).unwrap_or_else(|| unsafe { real::flock(fd, operation) })
}
