//! Locks on mounted files: fcntl record locks and flock.
//!
//! One process holds a mount at a time, so the locks that belong to a
//! process (`F_SETLK`, `F_SETLKW`: POSIX record locks) never conflict: each
//! is granted and `F_GETLK` finds none, exactly as the kernel answers a
//! process that asks about its own locks. `flock` locks belong to the open
//! file description, so two descriptions of one file in one process do
//! conflict: they are kept here, per file, with waiting for `LOCK_EX`/`LOCK_SH`
//! without `LOCK_NB`. Open-file-description record locks (`F_OFD_*`) are
//! granted without checking ranges between descriptions (said once with
//! `IOPATH_LOG`).

use super::{fail, on_fd};
use crate::mount::Description;
use crate::real;
use libc::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

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

/// Who holds the flock of one file.
#[derive(Default)]
struct Holders {
    shared: Vec<usize>,
    exclusive: Option<usize>,
}

#[derive(Default)]
struct Table {
    files: Mutex<HashMap<u64, Holders>>,
    changed: Condvar,
}

static TABLE: std::sync::OnceLock<Table> = std::sync::OnceLock::new();

fn flock_mounted(d: &Arc<Description>, operation: c_int) -> c_int {
    let Ok(file) = d.file() else { return 0 }; // a directory's flock: nothing shares it here
    let ino = file.metadata().ino;
    let me = Arc::as_ptr(d) as usize;
    let table = TABLE.get_or_init(Table::default);
    let mut files = table.files.lock().unwrap_or_else(|e| e.into_inner());
    let wait = operation & libc::LOCK_NB == 0;
    loop {
        let holders = files.entry(ino).or_default();
        holders.shared.retain(|&h| h != me);
        if holders.exclusive == Some(me) {
            holders.exclusive = None;
        }
        let free = match operation & !libc::LOCK_NB {
            libc::LOCK_UN => {
                table.changed.notify_all();
                return 0;
            }
            libc::LOCK_SH => holders.exclusive.is_none(),
            libc::LOCK_EX => holders.exclusive.is_none() && holders.shared.is_empty(),
            _ => return fail(libc::EINVAL),
        };
        if free {
            d.locked.store(true, Ordering::Release);
            if operation & !libc::LOCK_NB == libc::LOCK_SH {
                holders.shared.push(me);
            } else {
                holders.exclusive = Some(me);
            }
            return 0;
        }
        // Converting gave up the lock held (as flock does); others may go now.
        table.changed.notify_all();
        if !wait {
            return fail(libc::EWOULDBLOCK);
        }
        files = table.changed.wait(files).unwrap_or_else(|e| e.into_inner());
    }
}

/// Lets go of every flock a description holds (its last descriptor closed).
pub(crate) fn release(d: &Description) {
    let Some(table) = TABLE.get() else { return };
    let me = d as *const Description as usize;
    let mut files = table.files.lock().unwrap_or_else(|e| e.into_inner());
    for holders in files.values_mut() {
        holders.shared.retain(|&h| h != me);
        if holders.exclusive == Some(me) {
            holders.exclusive = None;
        }
    }
    table.changed.notify_all();
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
