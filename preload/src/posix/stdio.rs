//! stdio on mounted files: fopen, fopen64 and fdopen give a `FILE *` whose
//! reads, writes, seeks and close go through this library's hooks
//! (`fopencookie`), because glibc's stdio calls the kernel directly and
//! would meet only the reserved `O_PATH` descriptor. `fileno` of such a
//! stream gives its mounted descriptor, so `fsync(fileno(f))` works.
//! Everything else about the stream (buffering, `fgets`, `fprintf`,
//! `fflush`, `fclose`) is glibc's own. `freopen` of a standard stream onto
//! a mounted file puts the file on its descriptor through a bridge
//! (`bridge/`); of any other stream it is refused (EOPNOTSUPP, logged):
//! the stream it keeps is glibc's own.

use super::{on_fd, on_path};
use crate::real;
use libc::{c_char, c_int, c_void, size_t, ssize_t};
use std::collections::HashMap;
use std::sync::Mutex;

type ReadFn = unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t;
type SeekFn = unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int;
type CloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieIoFunctions {
    read: Option<ReadFn>,
    write: Option<WriteFn>,
    seek: Option<SeekFn>,
    close: Option<CloseFn>,
}

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, functions: CookieIoFunctions) -> *mut libc::FILE;
}

/// Our streams: `FILE *` address -> mounted descriptor.
static STREAMS: Mutex<Option<HashMap<usize, c_int>>> = Mutex::new(None);

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc passes a buffer of n bytes.
    unsafe { super::data::read(fd_of(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc passes n bytes.
    let written = unsafe { super::data::write(fd_of(cookie), buf.cast(), n) };
    // stdio's cookie contract: 0 for an error (glibc then sets the stream's error flag).
    written.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, offset: *mut i64, whence: c_int) -> c_int {
    // SAFETY: glibc passes a valid pointer to the offset, in and out.
    unsafe {
        let to = super::data::lseek(fd_of(cookie), *offset, whence);
        if to < 0 {
            return -1;
        }
        *offset = to;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    let fd = fd_of(cookie);
    if let Some(streams) = STREAMS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        streams.retain(|_, &mut v| v != fd);
    }
    // SAFETY: the stream's own descriptor.
    unsafe { super::descriptors::close(fd) }
}

/// The list of streams, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&STREAMS)
}

/// A stream over mounted descriptor `fd` (closed with it), or NULL.
fn stream(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let functions = CookieIoFunctions {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: mode is the caller's NUL-terminated mode; the cookie is the descriptor number.
    let file = unsafe { fopencookie(fd as usize as *mut c_void, mode, functions) };
    if !file.is_null() {
        STREAMS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(file as usize, fd);
    }
    file
}

/// open(2) flags of an fopen mode ("r", "w+", "ab", "rx", "re", ...); `None` if it is not one.
fn flags_of(mode: &[u8]) -> Option<c_int> {
    let (&first, rest) = mode.split_first()?;
    let plus = rest.contains(&b'+');
    let mut flags = match (first, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    if rest.contains(&b'x') {
        flags |= libc::O_EXCL;
    }
    if rest.contains(&b'e') {
        flags |= libc::O_CLOEXEC;
    }
    Some(flags)
}

fn null_with(errno: c_int) -> *mut libc::FILE {
    crate::set_errno(errno);
    std::ptr::null_mut()
}

fn fopen_any(path: *const c_char, mode: *const c_char) -> Option<*mut libc::FILE> {
    on_path(libc::AT_FDCWD, path, null_with, |inside| {
        let Some(flags) = super::path_bytes(mode).and_then(flags_of) else { return null_with(libc::EINVAL) };
        let fd = super::paths::open_inside(inside, flags, 0o666);
        if fd < 0 {
            return std::ptr::null_mut();
        }
        let file = stream(fd, mode);
        if file.is_null() {
            let errno = super::last_errno();
            // SAFETY: our own descriptor.
            unsafe { super::descriptors::close(fd) };
            crate::set_errno(errno);
        }
        file
    })
}

/// `fopen`: a stream on a mounted file, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: passed on.
    fopen_any(path, mode).unwrap_or_else(|| unsafe { real::fopen(super::kernel(libc::AT_FDCWD, path).ptr(), mode) })
}

/// `fopen64`: as [`fopen`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: passed on.
    fopen_any(path, mode).unwrap_or_else(|| unsafe { real::fopen64(super::kernel(libc::AT_FDCWD, path).ptr(), mode) })
}

/// `fdopen`: a stream on a mounted descriptor (which the stream then owns), or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let mounted = on_fd(fd, null_with, |d| {
        let Some(flags) = super::path_bytes(mode).and_then(flags_of) else { return null_with(libc::EINVAL) };
        // The mode may not ask for more access than the descriptor has.
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let wants_read = flags & libc::O_ACCMODE != libc::O_WRONLY;
        if (wants_write && !d.writable()) || (wants_read && !d.readable()) {
            return null_with(libc::EINVAL);
        }
        stream(fd, mode)
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::fdopen(fd, mode) })
}

fn ours(file: *mut libc::FILE) -> Option<c_int> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&(file as usize)).copied()
}

/// `fileno`: a mounted stream's descriptor, or the C library's answer.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno(file: *mut libc::FILE) -> c_int {
    // SAFETY: passed on.
    ours(file).unwrap_or_else(|| unsafe { real::fileno(file) })
}

/// `fileno_unlocked`: as [`fileno`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(file: *mut libc::FILE) -> c_int {
    // SAFETY: passed on.
    ours(file).unwrap_or_else(|| unsafe { real::fileno_unlocked(file) })
}

macro_rules! hook_freopen {
    ($($name:ident),*) => {$(
        /// `freopen`: the C library's, unless the new file is in a mount or
        /// the stream is one of ours. A standard stream (on descriptor 0, 1
        /// or 2: `freopen(log, "a", stderr)`, as servers do) gets the mounted
        /// file through a bridge (`bridge/`), the stream kept. Any other
        /// stream keeps its `FILE`, whose I/O the C library does through the
        /// kernel directly, so it cannot be turned into a mounted file's:
        /// refused with EOPNOTSUPP and a log line (`fopen` gives a stream on
        /// a mounted file), the stream closed, as a failed `freopen` leaves it.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char, file: *mut libc::FILE) -> *mut libc::FILE {
            let refused = |what: &str| {
                crate::log(&format!("freopen of {what} is not supported (EOPNOTSUPP): use fopen"));
                // SAFETY: the caller's open stream.
                unsafe { libc::fclose(file) };
                null_with(libc::EOPNOTSUPP)
            };
            if path.is_null() {
                if ours(file).is_some() {
                    return refused("a stream on a mounted file");
                }
            } else if on_path(libc::AT_FDCWD, path, |_| (), |_| ()).is_some() {
                // SAFETY: the caller's open stream.
                let fd = unsafe { real::fileno(file) };
                if ours(file).is_none() && (0..=2).contains(&fd) {
                    // SAFETY: the caller's stream, its path and mode (the C contract).
                    return unsafe { onto_standard_stream(path, mode, file, fd) };
                }
                return refused("a stream onto a mounted file");
            }
            // SAFETY: passed on.
            unsafe { real::$name(if path.is_null() { path } else { super::kernel(libc::AT_FDCWD, path).ptr() }, mode, file) }
        }
    )*};
}

/// `freopen(path, mode, stream)` of standard stream `file` (on `fd`, 0-2)
/// onto mounted `path`: the stream is flushed, the file opened and put on
/// `fd` by `dup2` (a bridge), and the stream's buffer and flags reset.
///
/// # Safety
/// `file` is an open stream on `fd`; `path` and `mode` are C strings.
unsafe fn onto_standard_stream(
    path: *const c_char,
    mode: *const c_char,
    file: *mut libc::FILE,
    fd: c_int,
) -> *mut libc::FILE {
    unsafe extern "C" {
        fn __fpurge(stream: *mut libc::FILE);
    }
    let Some(flags) = super::path_bytes(mode).and_then(flags_of) else { return null_with(libc::EINVAL) };
    // SAFETY: the caller's stream.
    unsafe { libc::fflush(file) };
    let opened = super::paths::open_on_path(libc::AT_FDCWD, path, flags | libc::O_CLOEXEC, 0o666);
    let Some(new) = opened.filter(|&new| new >= 0) else {
        let errno = super::last_errno();
        // SAFETY: a failed freopen closes the stream.
        unsafe { libc::fclose(file) };
        return null_with(errno);
    };
    // SAFETY: this library's own dup2 and close (the bridge goes on `fd`); the stream's buffer is dropped.
    unsafe {
        let placed = if new == fd { new } else { super::descriptors::dup2(new, fd) };
        let errno = super::last_errno();
        if new != fd {
            super::descriptors::close(new);
        }
        if placed != fd {
            libc::fclose(file);
            return null_with(errno);
        }
        __fpurge(file);
        libc::clearerr(file);
    }
    file
}
hook_freopen!(freopen, freopen64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_are_open_flags() {
        assert_eq!(flags_of(b"r"), Some(libc::O_RDONLY));
        assert_eq!(flags_of(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(flags_of(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(flags_of(b"a+e"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC));
        assert_eq!(flags_of(b"wx"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL));
        assert_eq!(flags_of(b"q"), None);
        assert_eq!(flags_of(b""), None);
    }
}
