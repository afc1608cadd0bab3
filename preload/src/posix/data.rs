//! Data: read, write and their positioned and vectored forms, lseek,
//! copy_file_range and sendfile, fsync, fdatasync, syncfs, sync_file_range,
//! ftruncate, fallocate, posix_fallocate, posix_fadvise and readahead (maps
//! are in `maps.rs`).

use super::{errno_of, fail, fail_size, on_fd, on_file_fd, on_stream_fd};
use crate::mount::Description;
use crate::real;
use crate::route::{self, at_offset, at_position, one, pieces_of};
use libc::{c_int, c_void, iovec, off_t, size_t, ssize_t};
use std::sync::Arc;

/// Reads into `buf` at `offset` (the description's position if `None`, moved after).
pub(crate) fn read_mounted(d: &Description, buf: &mut [u8], offset: Option<off_t>) -> ssize_t {
    if !d.readable() {
        return fail_size(libc::EBADF);
    }
    let file = match d.file() {
        Ok(f) => f,
        Err(e) => return fail_size(e),
    };
    let read = match offset {
        Some(o) if o < 0 => return fail_size(libc::EINVAL),
        // A positioned read leaves the position alone and takes no lock: threads
        // sharing a descriptor (RocksDB's table files) read it in parallel, as on Linux.
        Some(o) => file.read_at(buf, o as u64),
        None => {
            let mut position = d.position.lock().unwrap_or_else(|e| e.into_inner());
            let read = file.read_at(buf, *position);
            if let Ok(n) = read {
                *position += n as u64;
            }
            read
        }
    };
    match read {
        Ok(n) => n as ssize_t,
        Err(e) => fail_size(errno_of(&e)),
    }
}

/// Writes `data` at `offset` (the position if `None`, moved after; the end with O_APPEND).
pub(crate) fn write_mounted(d: &Description, data: &[u8], offset: Option<off_t>) -> ssize_t {
    if !d.writable() {
        return fail_size(libc::EBADF);
    }
    let file = match d.file() {
        Ok(f) => f,
        Err(_) => return fail_size(libc::EBADF),
    };
    if matches!(offset, Some(o) if o < 0) {
        return fail_size(libc::EINVAL);
    }
    if data.is_empty() {
        return 0;
    }
    // O_APPEND: every write goes to the end, atomically (pwrite too, as on Linux).
    let write = |at: u64| if d.append() { file.append(data) } else { file.write_at(data, at).map(|()| at) };
    let written = match offset {
        // A positioned write leaves the position alone and takes no lock.
        Some(o) => write(o as u64),
        None => {
            let mut position = d.position.lock().unwrap_or_else(|e| e.into_inner());
            let written = write(*position);
            if let Ok(at) = written {
                *position = at + data.len() as u64;
            }
            written
        }
    };
    if let Err(e) = written {
        return fail_size(errno_of(&e));
    }
    let flags = d.flags.load(std::sync::atomic::Ordering::Relaxed);
    let synced = if flags & libc::O_SYNC == libc::O_SYNC {
        file.fsync()
    } else if flags & libc::O_DSYNC != 0 {
        file.fdatasync()
    } else {
        Ok(())
    };
    match synced {
        Ok(()) => data.len() as ssize_t,
        Err(e) => fail_size(errno_of(&e)),
    }
}

/// The iovecs of a vectored call, checked as the kernel checks them.
fn vectors<'a>(iov: *const iovec, count: c_int) -> Result<&'a [iovec], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&count) {
        return Err(libc::EINVAL);
    }
    if count == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes `count` iovecs (the C contract).
    let v = unsafe { std::slice::from_raw_parts(iov, count as usize) };
    let total = v.iter().try_fold(0usize, |t, x| t.checked_add(x.iov_len));
    if total.is_none_or(|t| t > isize::MAX as usize) {
        return Err(libc::EINVAL);
    }
    Ok(v)
}

fn readv_mounted(d: &Description, iov: *const iovec, count: c_int, offset: Option<off_t>) -> ssize_t {
    let v = match vectors(iov, count) {
        Ok(v) => v,
        Err(e) => return fail_size(e),
    };
    let total: usize = v.iter().map(|x| x.iov_len).sum();
    let mut buf = vec![0u8; total];
    let n = read_mounted(d, &mut buf, offset);
    if n > 0 {
        let mut at = 0;
        for x in v {
            let take = x.iov_len.min(n as usize - at);
            // SAFETY: each iovec holds iov_len writable bytes (the C contract).
            unsafe { std::ptr::copy_nonoverlapping(buf[at..].as_ptr(), x.iov_base.cast::<u8>(), take) };
            at += take;
            if at == n as usize {
                break;
            }
        }
    }
    n
}

fn writev_mounted(d: &Description, iov: *const iovec, count: c_int, offset: Option<off_t>) -> ssize_t {
    let v = match vectors(iov, count) {
        Ok(v) => v,
        Err(e) => return fail_size(e),
    };
    let mut buf = Vec::with_capacity(v.iter().map(|x| x.iov_len).sum());
    for x in v {
        if x.iov_len > 0 {
            // SAFETY: each iovec holds iov_len readable bytes (the C contract).
            buf.extend_from_slice(unsafe { std::slice::from_raw_parts(x.iov_base.cast::<u8>(), x.iov_len) });
        }
    }
    write_mounted(d, &buf, offset)
}

fn buffer<'a>(buf: *mut c_void, n: size_t) -> Option<&'a mut [u8]> {
    if n == 0 {
        return Some(&mut []);
    }
    // SAFETY: a non-NULL buffer holds n bytes (the C contract).
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) })
}

fn mounted_read(fd: c_int, buf: *mut c_void, n: size_t, offset: Option<off_t>) -> Option<ssize_t> {
    let serve = |d: &Arc<Description>| match buffer(buf, n) {
        Some(b) => read_mounted(d, b, offset),
        None => fail_size(libc::EFAULT),
    };
    if offset.is_none() { on_stream_fd(fd, false, fail_size, serve) } else { on_fd(fd, fail_size, serve) }
}

fn mounted_write(fd: c_int, buf: *const c_void, n: size_t, offset: Option<off_t>) -> Option<ssize_t> {
    let serve = |d: &Arc<Description>| match buffer(buf.cast_mut(), n) {
        Some(b) => write_mounted(d, b, offset),
        None => fail_size(libc::EFAULT),
    };
    if offset.is_none() { on_stream_fd(fd, true, fail_size, serve) } else { on_fd(fd, fail_size, serve) }
}

macro_rules! hook_pread {
    ($($name:ident),*) => {$(
        /// `pread`: a mounted file's, or routed (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
            if let Some(r) = mounted_read(fd, buf, n, Some(off)) {
                return r;
            }
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, false, || one(buf, n), off).unwrap_or_else(|| unsafe { real::$name(fd, buf, n, off) })
        }
    )*};
}
macro_rules! hook_pwrite {
    ($($name:ident),*) => {$(
        /// `pwrite`: a mounted file's, or routed (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
            if let Some(r) = mounted_write(fd, buf, n, Some(off)) {
                return r;
            }
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, true, || one(buf, n), off).unwrap_or_else(|| unsafe { real::$name(fd, buf, n, off) })
        }
    )*};
}
macro_rules! hook_vectored {
    ($write:expr, $($name:ident),*) => {$(
        /// Vectored I/O at an offset: a mounted file's, or routed (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
            let mounted = on_fd(fd, fail_size, |d| {
                if $write { writev_mounted(d, iov, cnt, Some(off)) } else { readv_mounted(d, iov, cnt, Some(off)) }
            });
            if let Some(r) = mounted {
                return r;
            }
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, $write, || pieces_of(iov, cnt), off).unwrap_or_else(|| unsafe { real::$name(fd, iov, cnt, off) })
        }
    )*};
}
macro_rules! hook_vectored2 {
    ($write:expr, $($name:ident),*) => {$(
        /// `preadv2`/`pwritev2`: offset -1 is the file position; flags are
        /// taken on mounted files (RWF_HIPRI and RWF_NOWAIT change nothing
        /// there; RWF_DSYNC/RWF_SYNC sync as O_DSYNC/O_SYNC would) and
        /// routed only without flags.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t {
            let at = (off != -1).then_some(off);
            let mounted = on_fd(fd, fail_size, |d| {
                if $write {
                    let n = writev_mounted(d, iov, cnt, at);
                    if n > 0 && flags & (libc::RWF_DSYNC | libc::RWF_SYNC) != 0 {
                        if let Err(e) = d.file().map_err(|_| libc::EBADF).and_then(|f| f.fdatasync().map_err(|e| errno_of(&e))) {
                            return fail_size(e);
                        }
                    }
                    n
                } else {
                    readv_mounted(d, iov, cnt, at)
                }
            });
            if let Some(r) = mounted {
                return r;
            }
            // SAFETY: passed on as the caller gave it.
            let fallback = || unsafe { real::$name(fd, iov, cnt, off, flags) };
            if flags != 0 {
                return fallback();
            }
            if off == -1 {
                return at_position(fd, $write, || pieces_of(iov, cnt), fallback);
            }
            at_offset(fd, $write, || pieces_of(iov, cnt), off).unwrap_or_else(fallback)
        }
    )*};
}

hook_pread!(pread, pread64);
hook_pwrite!(pwrite, pwrite64);
hook_vectored!(false, preadv, preadv64);
hook_vectored!(true, pwritev, pwritev64);
hook_vectored2!(false, preadv2, preadv64v2);
hook_vectored2!(true, pwritev2, pwritev64v2);

/// `read` at the file position: a mounted file's, or routed.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(r) = mounted_read(fd, buf, n, None) {
        return r;
    }
    // SAFETY: passed on as the caller gave it.
    at_position(fd, false, || one(buf, n), || unsafe { real::read(fd, buf, n) })
}

/// `write` at the file position: a mounted file's, or routed.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(r) = mounted_write(fd, buf, n, None) {
        return r;
    }
    // SAFETY: passed on as the caller gave it.
    at_position(fd, true, || one(buf, n), || unsafe { whole(fd, n, real::write(fd, buf, n), buf.cast()) })
}

/// A kernel write that wrote only part of `wanted` bytes (`done`) on a
/// blocking pipe, socket or terminal, carried on to the end (or to an
/// error, when the count written so far is returned, as the kernel would).
///
/// Such a write stops short only when its thread is interrupted, and a
/// thread that has used an io_uring ring of this library is: a completion
/// of a request it sent, or the teardown of a ring it used (an engine
/// closed as a mount is given back to another process), queues task work
/// to it with `TWA_SIGNAL`, which ends a blocked pipe write early with what
/// it had written, though no signal is delivered. A program that catches
/// no signal never sees that from the kernel, and some lose the rest:
/// `python3 -c 'os.write(1, ...)' | cmp - f` on a mount (the reader lends
/// the mount to cmp and takes it back) lost 4 KiB of 8 at every lend, and
/// `unzip -p a.zip f | cmp - f` lost the end of `f` and exited 0. A
/// program whose own signal handler interrupted the write sees it go on
/// here until done or interrupted again.
///
/// # Safety
/// `buf` holds `wanted` bytes (the caller's write).
unsafe fn whole(fd: c_int, wanted: size_t, done: ssize_t, buf: *const u8) -> ssize_t {
    if done <= 0 || done as size_t >= wanted || !carried_on(fd) {
        return done;
    }
    // SAFETY: the caller's buffer.
    unsafe { write_rest(fd, buf, wanted, done as size_t) as ssize_t }
}

/// Writes `buf[done..wanted]` with as many kernel writes as it takes; the
/// count written in all (`done` and more), short only at an error.
///
/// # Safety
/// `buf` holds `wanted` bytes.
unsafe fn write_rest(fd: c_int, buf: *const u8, wanted: size_t, done: size_t) -> size_t {
    let _errno = crate::KeepErrno::new();
    let mut total = done;
    while total < wanted {
        // SAFETY: the rest of the caller's buffer.
        let more = unsafe { real::write(fd, buf.add(total).cast(), wanted - total) };
        if more <= 0 {
            break;
        }
        total += more as size_t;
    }
    total
}

/// Whether a short kernel write on `fd` is carried on ([`whole`]): engines
/// may run in this process, and `fd` is a blocking pipe, socket or terminal,
/// where a write stops short only when interrupted.
fn carried_on(fd: c_int) -> bool {
    (super::mounting() || route::routing()) && interruptible(fd)
}

/// Whether `fd` is a blocking pipe, socket or terminal.
fn interruptible(fd: c_int) -> bool {
    // SAFETY: fstat into a local; fcntl F_GETFL has no other effect.
    let (mode, flags) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if real::fstat(fd, &mut st) != 0 {
            return false;
        }
        (st.st_mode & libc::S_IFMT, real::fcntl(fd, libc::F_GETFL, 0))
    };
    flags >= 0 && flags & libc::O_NONBLOCK == 0 && matches!(mode, libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR)
}

/// `readv` at the file position: a mounted file's, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: passed on as the caller gave it.
    on_stream_fd(fd, false, fail_size, |d| readv_mounted(d, iov, cnt, None))
        .unwrap_or_else(|| unsafe { real::readv(fd, iov, cnt) })
}

/// `writev` at the file position: a mounted file's, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: passed on as the caller gave it.
    on_stream_fd(fd, true, fail_size, |d| writev_mounted(d, iov, cnt, None))
        .unwrap_or_else(|| unsafe { whole_vectored(fd, iov, cnt, real::writev(fd, iov, cnt)) })
}

/// [`whole`] for a vectored write: the rest of its pieces after the `done`
/// bytes written, one `write` each.
///
/// # Safety
/// `iov` holds `cnt` pieces of the caller's (as `writev`'s).
unsafe fn whole_vectored(fd: c_int, iov: *const iovec, cnt: c_int, done: ssize_t) -> ssize_t {
    if done <= 0 || iov.is_null() || cnt <= 0 {
        return done;
    }
    // SAFETY: the caller's pieces.
    let pieces = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let wanted = pieces.iter().fold(0usize, |sum, p| sum.saturating_add(p.iov_len));
    if done as size_t >= wanted || !carried_on(fd) {
        return done;
    }
    // Each piece from where the vectored write stopped in it.
    let mut skip = done as size_t;
    let mut total = done as size_t;
    for p in pieces {
        if skip >= p.iov_len {
            skip -= p.iov_len;
            continue;
        }
        // SAFETY: the caller's piece.
        let wrote = unsafe { write_rest(fd, p.iov_base.cast::<u8>(), p.iov_len, skip) } - skip;
        total += wrote;
        if skip + wrote < p.iov_len {
            break; // an error: the count so far
        }
        skip = 0;
    }
    total as ssize_t
}

/// `lseek` on a mounted open file: its new position, or -1 with errno.
pub(crate) fn seek(d: &Description, offset: off_t, whence: c_int) -> off_t {
    let size = match d.file() {
        Ok(f) => f.len() as i64,
        Err(libc::EISDIR) => 0,
        Err(e) => return fail(e) as off_t,
    };
    let mut position = d.position.lock().unwrap_or_else(|e| e.into_inner());
    let to = match whence {
        libc::SEEK_SET => Some(offset),
        libc::SEEK_CUR => (*position as i64).checked_add(offset),
        libc::SEEK_END => size.checked_add(offset),
        libc::SEEK_DATA | libc::SEEK_HOLE if offset < 0 || offset >= size => return fail(libc::ENXIO) as off_t,
        // Holes as the file layer keeps them (never written blocks; see File::seek_data_or_hole).
        libc::SEEK_DATA | libc::SEEK_HOLE => {
            let Ok(file) = d.file() else { return fail(libc::ENXIO) as off_t };
            match file.seek_data_or_hole(offset as u64, whence == libc::SEEK_DATA) {
                Ok(Some(to)) => Some(to as i64),
                Ok(None) => return fail(libc::ENXIO) as off_t,
                Err(e) => return fail(errno_of(&e)) as off_t,
            }
        }
        _ => return fail(libc::EINVAL) as off_t,
    };
    match to {
        Some(to) if to >= 0 => {
            *position = to as u64;
            to
        }
        _ => fail(libc::EINVAL) as off_t,
    }
}

macro_rules! hook_lseek {
    ($($name:ident),*) => {$(
        /// `lseek`: a mounted description's position (SEEK_DATA/SEEK_HOLE
        /// see no holes), a bridged standard input's (`bridge/seek.rs`), or
        /// the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, offset: off_t, whence: c_int) -> off_t {
            on_fd(fd, |e| fail(e) as off_t, |d| seek(d, offset, whence)).unwrap_or_else(|| {
                // SAFETY: passed on.
                let to = unsafe { real::$name(fd, offset, whence) };
                if to < 0 && super::mounting() && super::last_errno() == libc::ESPIPE {
                    // A pipe a bridge feeds from a mounted file seeks as the file would.
                    return crate::bridge::seek(fd, offset, whence).unwrap_or_else(|| fail(libc::ESPIPE) as off_t);
                }
                to
            })
        }
    )*};
}
hook_lseek!(lseek, lseek64);

/// fsync (`data_only`: fdatasync) of a mounted description: the file's, or
/// for a directory the namespace's (its entries are in the journal; no
/// file's data is written back, as on Linux).
fn sync_mounted(d: &Arc<Description>, data_only: bool) -> c_int {
    let done = match d.file() {
        Ok(f) if data_only => f.fdatasync(),
        Ok(f) => f.fsync(),
        Err(libc::EISDIR) => match d.mount.fs() {
            Ok(fs) => fs.sync_namespace(),
            Err(e) => return fail(e),
        },
        Err(e) => return fail(e),
    };
    match done {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

/// `fsync`: a mounted file's (or directory's), routed, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(r) = on_file_fd(fd, fail, |d| sync_mounted(d, false)) {
        return r;
    }
    route::flush_passed(fd);
    // SAFETY: passed on.
    unsafe { real::fsync(fd) }
}

/// `fdatasync`: a mounted file's, routed, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(r) = on_file_fd(fd, fail, |d| sync_mounted(d, true)) {
        return r;
    }
    route::flush_passed(fd);
    // SAFETY: passed on.
    unsafe { real::fdatasync(fd) }
}

/// `syncfs`: commits the mounted file system, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    let mounted = on_file_fd(fd, fail, |d| match d.mount.fs().map(|fs| fs.sync()) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fail(errno_of(&e)),
        Err(e) => fail(e),
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::syncfs(fd) })
}

/// `sync_file_range`: on a mounted file, an fdatasync (it asks for less,
/// never more), or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync_file_range(fd: c_int, offset: off_t, n: off_t, flags: libc::c_uint) -> c_int {
    if offset < 0 || n < 0 {
        // SAFETY: passed on: the kernel says what is wrong.
        return unsafe { real::sync_file_range(fd, offset, n, flags) };
    }
    let mounted = on_file_fd(fd, fail, |d| if d.file().is_err() { fail(libc::ESPIPE) } else { sync_mounted(d, true) });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::sync_file_range(fd, offset, n, flags) })
}

fn truncate_mounted(d: &Description, len: off_t) -> c_int {
    let Ok(file) = d.file() else { return fail(libc::EINVAL) };
    if len < 0 || !d.writable() {
        return fail(libc::EINVAL);
    }
    match file.truncate(len as u64) {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

macro_rules! hook_ftruncate {
    ($($name:ident),*) => {$(
        /// `ftruncate`: a mounted file's; otherwise the C library's, and a
        /// routed file's engine is reopened at its next I/O (at the new size).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, len: off_t) -> c_int {
            if let Some(r) = on_file_fd(fd, fail, |d| truncate_mounted(d, len)) {
                return r;
            }
            // SAFETY: passed on.
            let r = unsafe { real::$name(fd, len) };
            if r == 0 && let Some(route) = route::route_of(fd) {
                route.entry.invalidate();
            }
            r
        }
    )*};
}
hook_ftruncate!(ftruncate, ftruncate64);

/// fallocate on a mounted file; returns an errno. Mode 0 gives every hole
/// in the range blocks of its own (reading as zeros; later writes there
/// cannot fail for want of space) and grows the size to the range's end;
/// `FALLOC_FL_KEEP_SIZE` allocates without growing ([`iopath::fs::File::allocate`]
/// says how long blocks past the end are kept); `FALLOC_FL_PUNCH_HOLE` (with
/// KEEP_SIZE, as Linux requires) frees the range's whole blocks and zeroes
/// the rest of it; `FALLOC_FL_ZERO_RANGE` does the same, then allocates the
/// range again (unwritten: it reads zeros and keeps its space) and, without
/// KEEP_SIZE, grows the file to the range's end. Other modes (collapse and
/// insert range, unshare) are EOPNOTSUPP, logged.
fn allocate_mounted(d: &Description, mode: c_int, offset: off_t, len: off_t) -> c_int {
    if offset < 0 || len <= 0 {
        return libc::EINVAL;
    }
    if !d.writable() {
        return libc::EBADF;
    }
    let Ok(file) = d.file() else { return libc::ENODEV };
    if offset.checked_add(len).is_none() {
        return libc::EFBIG;
    }
    let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    let done = |r: iopath::Result<()>| r.map_or_else(|e| errno_of(&e), |()| 0);
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 => done(file.allocate(offset as u64, len as u64, keep_size)),
        libc::FALLOC_FL_PUNCH_HOLE if keep_size => done(file.punch_hole(offset as u64, len as u64)),
        // The range's blocks freed, then allocated again, unwritten: zeros that keep their space.
        libc::FALLOC_FL_ZERO_RANGE => done(
            file.punch_hole(offset as u64, len as u64)
                .and_then(|()| file.allocate(offset as u64, len as u64, keep_size)),
        ),
        _ => {
            crate::log(&format!("fallocate mode {mode:#x} on a mounted file: not supported (EOPNOTSUPP)"));
            libc::EOPNOTSUPP
        }
    }
}

macro_rules! hook_fallocate {
    ($($name:ident),*) => {$(
        /// `fallocate`: a mounted file's (modes 0, KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE), or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
            let mounted = on_file_fd(fd, fail, |d| match allocate_mounted(d, mode, offset, len) {
                0 => 0,
                e => fail(e),
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(fd, mode, offset, len) })
        }
    )*};
}
hook_fallocate!(fallocate, fallocate64);

macro_rules! hook_posix_fallocate {
    ($($name:ident),*) => {$(
        /// `posix_fallocate`: a mounted file's (returns the errno), or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, offset: off_t, len: off_t) -> c_int {
            let mounted = on_file_fd(fd, |e| e, |d| allocate_mounted(d, 0, offset, len));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(fd, offset, len) })
        }
    )*};
}
hook_posix_fallocate!(posix_fallocate, posix_fallocate64);

macro_rules! hook_fadvise {
    ($($name:ident),*) => {$(
        /// `posix_fadvise`: accepted on a mounted file (the file layer reads
        /// ahead on its own), or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, offset: off_t, len: off_t, advice: c_int) -> c_int {
            let mounted = on_fd(fd, |e| e, |d| {
                if d.file().is_err() { libc::ESPIPE } else if !(0..=5).contains(&advice) || len < 0 { libc::EINVAL } else { 0 }
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(fd, offset, len, advice) })
        }
    )*};
}
hook_fadvise!(posix_fadvise, posix_fadvise64);

/// `readahead`: accepted on a mounted file, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readahead(fd: c_int, offset: off_t, count: size_t) -> ssize_t {
    let mounted = on_fd(fd, fail_size, |d| if d.file().is_err() { fail_size(libc::EINVAL) } else { 0 });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::readahead(fd, offset, count) })
}

/// A descriptor's description if it is a mount's: `None` if not, `Some(Err)` in a forked child.
fn mounted(fd: c_int) -> Option<Result<Arc<Description>, c_int>> {
    on_fd(fd, Err, |d| Ok(Arc::clone(d)))
}

/// Bytes one step of a copy moves at most.
const COPY_CHUNK: usize = 1 << 20;

thread_local! {
    /// Each thread's copy buffer, kept between calls: `cp` copies each file
    /// with two calls (the second finds the end), and a fresh megabyte each
    /// time made `cp -r` of 8,000 small files slower than reading and writing.
    static COPY_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of `len` bytes (contents undefined).
fn with_copy_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    COPY_BUFFER.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            f(&mut buf[..len])
        }
        // Re-entered (a signal handler copying): a buffer of its own.
        Err(_) => f(&mut vec![0u8; len]),
    })
}

/// How much of a copy of `len` bytes from `from` (at `at`, or its position)
/// one buffer need hold: no more than the file has left, nor a chunk.
fn copy_buffer_len(from: &Description, at: Option<off_t>, len: usize) -> usize {
    let start = at.map_or_else(|| *from.position.lock().unwrap_or_else(|e| e.into_inner()), |a| a as u64);
    let left = from.file().map_or(0, |f| f.len().saturating_sub(start)) as usize;
    left.clamp(1, len.clamp(1, COPY_CHUNK))
}

/// Copies up to `len` bytes from `from` (at `*at`, or its position) to
/// `to`'s position (its end with O_APPEND), through a buffer; the bytes
/// copied, short at the end of `from`. `at` moves by what was copied.
fn copy_mounted(
    from: &Description,
    at: Option<&mut off_t>,
    to: &Description,
    to_at: Option<&mut off_t>,
    len: usize,
) -> ssize_t {
    let size = copy_buffer_len(from, at.as_deref().copied(), len);
    with_copy_buffer(size, |buf| send_through(-1, Some(from), -1, Some(to), at, to_at, len, buf))
}

/// The offset a copy call was given: `None` for NULL (the file position), `Err` if negative.
fn given_offset<'a>(p: *mut off_t) -> Result<Option<&'a mut off_t>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-NULL offset points at an off_t (the C contract).
    let o = unsafe { &mut *p };
    if *o < 0 { Err(libc::EINVAL) } else { Ok(Some(o)) }
}

/// `copy_file_range`: between two files of one mount, copied here through
/// its page cache; between a mounted file and any other (another mount, the
/// kernel's), EXDEV, as the kernel answers between file systems that cannot
/// copy to each other (programs then read and write); else the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off_t,
    fd_out: c_int,
    off_out: *mut off_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let (from, to) = match (mounted(fd_in), mounted(fd_out)) {
        // SAFETY: passed on as the caller gave it.
        (None, None) => return unsafe { real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags) },
        (Some(Err(e)), _) | (_, Some(Err(e))) => return fail_size(e),
        (Some(Ok(from)), Some(Ok(to))) if std::ptr::eq(from.mount, to.mount) => (from, to),
        _ => return fail_size(libc::EXDEV),
    };
    let _inside = crate::Inside::enter();
    if flags != 0 {
        return fail_size(libc::EINVAL);
    }
    if !from.readable() || !to.writable() || to.append() {
        return fail_size(libc::EBADF);
    }
    let (Ok(source), Ok(target)) = (from.file(), to.file()) else { return fail_size(libc::EISDIR) };
    let (at, to_at) = match (given_offset(off_in), given_offset(off_out)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail_size(e),
    };
    if source.same_file(&target) {
        // Overlapping ranges of one file: EINVAL, as the kernel says.
        let start = |o: &Option<&mut off_t>, d: &Description| {
            o.as_deref().map_or(*d.position.lock().unwrap_or_else(|e| e.into_inner()) as off_t, |v| *v)
        };
        let (a, b) = (start(&at, &from), start(&to_at, &to));
        let n = len.min(i64::MAX as usize) as off_t;
        if a < b.saturating_add(n) && b < a.saturating_add(n) {
            return fail_size(libc::EINVAL);
        }
    }
    copy_mounted(&from, at, &to, to_at, len)
}

macro_rules! hook_sendfile {
    ($($name:ident),*) => {$(
        /// `sendfile` from or to a mounted file: copied here (from a mounted
        /// file into any descriptor, or from any into a mounted file); else
        /// the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t {
            match (mounted(in_fd), mounted(out_fd)) {
                // SAFETY: passed on as the caller gave it.
                (None, None) => unsafe { real::$name(out_fd, in_fd, offset, count) },
                (Some(Err(e)), _) | (_, Some(Err(e))) => fail_size(e),
                (input, output) => {
                    let _inside = crate::Inside::enter();
                    send(in_fd, input.map(|d| d.expect("checked")), out_fd, output.map(|d| d.expect("checked")), offset, count)
                }
            }
        }
    )*};
}
hook_sendfile!(sendfile, sendfile64);

/// `sendfile` with at least one side mounted.
fn send(
    in_fd: c_int,
    input: Option<Arc<Description>>,
    out_fd: c_int,
    output: Option<Arc<Description>>,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    let at = match given_offset(offset) {
        Ok(a) => a,
        Err(e) => return fail_size(e),
    };
    if let Some(o) = &output {
        if !o.writable() {
            return fail_size(libc::EBADF);
        }
        if o.append() {
            return fail_size(libc::EINVAL); // as Linux: sendfile does not append
        }
        if o.file().is_err() {
            return fail_size(libc::EISDIR);
        }
    }
    if let Some(i) = &input {
        if !i.readable() {
            return fail_size(libc::EBADF);
        }
        if i.file().is_err() {
            return fail_size(libc::EINVAL);
        }
    }
    if let (Some(i), Some(o)) = (&input, &output) {
        return copy_mounted(i, at, o, None, count);
    }
    let size = match &input {
        Some(i) => copy_buffer_len(i, at.as_deref().copied(), count),
        None => count.clamp(1, COPY_CHUNK),
    };
    with_copy_buffer(size, |buf| send_through(in_fd, input.as_deref(), out_fd, output.as_deref(), at, None, count, buf))
}

/// Copies up to `count` bytes through `buf` from the input (a mounted file's
/// description, else descriptor `in_fd`; at `*at`, or its position) to the
/// output (a mounted file's description, at `*to_at` or its position, else
/// descriptor `out_fd` as it writes); the bytes copied, short at the end of
/// the input. Bytes read and not written go back: the offset, or the input's
/// position, moves by what was written. copy_file_range and sendfile both.
#[allow(clippy::too_many_arguments)]
fn send_through(
    in_fd: c_int,
    input: Option<&Description>,
    out_fd: c_int,
    output: Option<&Description>,
    mut at: Option<&mut off_t>,
    mut to_at: Option<&mut off_t>,
    count: usize,
    buf: &mut [u8],
) -> ssize_t {
    let mut total = 0usize;
    while total < count {
        let want = (count - total).min(buf.len());
        // Read one chunk from the input.
        let n = match input {
            Some(i) => read_mounted(i, &mut buf[..want], at.as_deref().copied()),
            None => match at.as_deref() {
                // SAFETY: a buffer of `want` bytes we own.
                Some(&o) => unsafe { real::pread64(in_fd, buf.as_mut_ptr().cast(), want, o) },
                // SAFETY: as above.
                None => unsafe { real::read(in_fd, buf.as_mut_ptr().cast(), want) },
            },
        };
        if n <= 0 {
            return if total > 0 || n == 0 { total as ssize_t } else { n };
        }
        // Write all of it to the output (a pipe or socket may take less at a time).
        let mut sent = 0usize;
        while sent < n as usize {
            let w = match output {
                Some(o) => {
                    let w = write_mounted(o, &buf[sent..n as usize], to_at.as_deref().copied());
                    if let (true, Some(a)) = (w > 0, to_at.as_deref_mut()) {
                        *a += w as off_t;
                    }
                    w
                }
                // SAFETY: the bytes read above.
                None => unsafe { real::write(out_fd, buf[sent..].as_ptr().cast(), n as usize - sent) },
            };
            if w <= 0 {
                break;
            }
            sent += w as usize;
        }
        // What was read and not sent goes back: the input's position, or the offset, moves by what was sent.
        match (input, at.as_deref_mut()) {
            (_, Some(a)) => *a += sent as off_t,
            (Some(i), None) => {
                let mut p = i.position.lock().unwrap_or_else(|e| e.into_inner());
                *p -= (n as usize - sent) as u64;
            }
            // SAFETY: moving a descriptor's position back over bytes it read.
            (None, None) if sent < n as usize => unsafe {
                real::lseek(in_fd, -((n as usize - sent) as off_t), libc::SEEK_CUR);
            },
            (None, None) => {}
        }
        total += sent;
        if sent < n as usize {
            return if total > 0 { total as ssize_t } else { fail_size(super::last_errno()) };
        }
        if (n as usize) < want {
            break;
        }
    }
    total as ssize_t
}
