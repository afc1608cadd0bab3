//! `libiopath_preload.so`: runs an unmodified program's file I/O through iopath.
//!
//! ```sh
//! LD_PRELOAD=target/release/libiopath_preload.so IOPATH_FILES='/data/*.db' IOPATH_PATH=stm prog
//! ```
//!
//! For descriptors of files that match `IOPATH_FILES` and were opened with
//! `O_DIRECT` (see [`mod@config`]), `pread`, `pwrite`, `preadv`, `pwritev`,
//! `preadv2`, `pwritev2` (and their `64` names), `read` and `write` at the
//! file position, `fsync` and `fdatasync` go through one iopath engine per
//! file (io_uring on that same file; `files.rs`), so all the program's
//! threads share its merging path. Everything else goes to the C library
//! untouched, and so does any routed call iopath cannot take as it is:
//!
//! - a buffer, offset or length not aligned as the file needs (the C library
//!   gives the program the kernel's own answer, usually EINVAL);
//! - a range that reaches past the file's size as the engine knows it (the
//!   kernel then gives the exact short read, or extends the file);
//! - `preadv2`/`pwritev2` with flags, a write on an `O_APPEND` descriptor,
//!   a write through a read-only descriptor;
//! - any call in a child after `fork` (the engine's threads are not there).
//!
//! The file position stays the kernel's: a routed `read` reads it with
//! `lseek`, does the I/O and moves it, under a per-file lock, so `dup`ed
//! descriptors, `lseek` and unrouted calls all see one position. A routed
//! call fails as the kernel's would: -1 with the device's errno. It never
//! fails with EINTR (the kernel does not interrupt disk reads either).

pub mod config;
mod fds;
mod files;
mod real;

use config::Config;
use libc::{c_char, c_int, c_uint, c_ulong, c_void, iovec, mode_t, off_t, size_t, ssize_t};
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static CONFIG: OnceLock<Config> = OnceLock::new();
/// The request that idle CPUs poll (`IOPATH_IDLE_POLL=1`), held until the process ends.
static IDLE_POLLING: OnceLock<iopath::idle::IdlePolling> = OnceLock::new();
/// Set in a child after `fork`: nothing is routed there.
static FORKED: AtomicBool = AtomicBool::new(false);
/// Whether any pattern is set (otherwise every hook passes straight through).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// `IOPATH_LOG` is set: calls are counted for the summary (a shared counter
/// per call is a cache line every thread writes, so only then).
static COUNTING: AtomicBool = AtomicBool::new(false);
static ROUTED_CALLS: AtomicU64 = AtomicU64::new(0);
static PASSED_CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread is inside iopath (opening an engine): its calls are iopath's own.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside iopath while alive.
pub(crate) struct Inside(bool);

impl Inside {
    pub(crate) fn enter() -> Inside {
        Inside(INSIDE.try_with(|i| i.replace(true)).unwrap_or(true))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|i| i.set(self.0));
    }
}

/// The settings (read from the environment when the library is loaded).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Writes one line to stderr when `IOPATH_LOG` is set.
pub(crate) fn log(message: &str) {
    if config().log {
        let line = format!("iopath: {message}\n");
        // SAFETY: writing a buffer we own to stderr, bypassing our own hook.
        unsafe { real::write(2, line.as_ptr().cast(), line.len()) };
    }
}

extern "C" fn in_child_after_fork() {
    FORKED.store(true, Ordering::SeqCst);
}

extern "C" fn on_load() {
    let c = config();
    if !c.files.is_empty() {
        // SAFETY: registers a handler that only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(in_child_after_fork)) };
        COUNTING.store(c.log, Ordering::SeqCst);
        ACTIVE.store(true, Ordering::SeqCst);
        log(&format!("routing O_DIRECT files matching {} through {}", c.files.join(":"), c.path));
        if c.idle_poll {
            let _inside = Inside::enter();
            match iopath::idle::IdlePolling::request() {
                Ok(held) => {
                    let _ = IDLE_POLLING.set(held);
                    log("idle CPUs poll while this program runs (IOPATH_IDLE_POLL)");
                }
                Err(e) => log(&format!("IOPATH_IDLE_POLL: {e}")),
            }
        }
    }
}

extern "C" fn on_unload() {
    if ACTIVE.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed) {
        log(&format!(
            "{} calls routed through iopath, {} calls on routed files passed to the C library",
            ROUTED_CALLS.load(Ordering::Relaxed),
            PASSED_CALLS.load(Ordering::Relaxed)
        ));
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
#[used]
#[unsafe(link_section = ".fini_array")]
static ON_UNLOAD: extern "C" fn() = on_unload;

/// The route of `fd`, unless this call must go to the C library as it is.
fn route_of(fd: c_int) -> Option<fds::Route> {
    if !ACTIVE.load(Ordering::Relaxed) || FORKED.load(Ordering::Relaxed) || INSIDE.try_with(Cell::get).unwrap_or(true) {
        return None;
    }
    fds::lookup(fd)
}

fn set_errno(errno: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// One piece of a routed request.
struct Piece {
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

fn counted(r: Option<ssize_t>) -> Option<ssize_t> {
    if COUNTING.load(Ordering::Relaxed) {
        match r {
            Some(_) => ROUTED_CALLS.fetch_add(1, Ordering::Relaxed),
            None => PASSED_CALLS.fetch_add(1, Ordering::Relaxed),
        };
    }
    r
}

fn pieces_of(iov: *const iovec, count: c_int) -> Pieces {
    if iov.is_null() || !(1..=libc::UIO_MAXIOV).contains(&count) {
        return Pieces::Bad;
    }
    // SAFETY: the caller passes `count` iovecs (the C contract).
    let iov = unsafe { std::slice::from_raw_parts(iov, count as usize) };
    Pieces::Many(iov.iter().map(|v| Piece { ptr: v.iov_base.cast(), len: v.iov_len as u64 }).collect())
}

/// The pieces of a call: one buffer on the stack, or a vector's.
enum Pieces {
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
fn at_offset(fd: c_int, write: bool, pieces: impl FnOnce() -> Pieces, offset: off_t) -> Option<ssize_t> {
    let route = route_of(fd)?;
    counted(pieces().get().and_then(|p| routed(&route, fd, write, p, offset)))
}

/// read/write (and the vectored forms with offset -1) at the file position.
fn at_position(fd: c_int, write: bool, pieces: impl FnOnce() -> Pieces, fallback: impl FnOnce() -> ssize_t) -> ssize_t {
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

fn one(buf: *const c_void, n: size_t) -> Pieces {
    if buf.is_null() { Pieces::Bad } else { Pieces::One([Piece { ptr: buf.cast_mut().cast(), len: n as u64 }]) }
}

macro_rules! hook_pread {
    ($($name:ident),*) => {$(
        /// Routed `pread` (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, false, || one(buf, n), off).unwrap_or_else(|| unsafe { real::$name(fd, buf, n, off) })
        }
    )*};
}
macro_rules! hook_pwrite {
    ($($name:ident),*) => {$(
        /// Routed `pwrite` (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, true, || one(buf, n), off).unwrap_or_else(|| unsafe { real::$name(fd, buf, n, off) })
        }
    )*};
}
macro_rules! hook_vectored {
    ($write:expr, $($name:ident),*) => {$(
        /// Routed vectored I/O at an offset (see the crate docs).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
            // SAFETY: passed on as the caller gave it.
            at_offset(fd, $write, || pieces_of(iov, cnt), off).unwrap_or_else(|| unsafe { real::$name(fd, iov, cnt, off) })
        }
    )*};
}
macro_rules! hook_vectored2 {
    ($write:expr, $($name:ident),*) => {$(
        /// Routed `preadv2`/`pwritev2`: without flags only; offset -1 is the file position.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t {
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

/// Routed `read` at the file position (see the crate docs).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: passed on as the caller gave it.
    at_position(fd, false, || one(buf, n), || unsafe { real::read(fd, buf, n) })
}

/// Routed `write` at the file position (see the crate docs).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: passed on as the caller gave it.
    at_position(fd, true, || one(buf, n), || unsafe { real::write(fd, buf, n) })
}

fn routed_flush(fd: c_int) -> Option<c_int> {
    let route = route_of(fd)?;
    let slot = route.entry.slot(fd, &config().path)?;
    let _inside = Inside::enter();
    counted(Some(0));
    Some(match slot.engine.flush() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(iopath::capi::errno_of(&e));
            -1
        }
    })
}

/// Routed `fsync`: a flush through the file's engine.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    // SAFETY: passed on.
    routed_flush(fd).unwrap_or_else(|| unsafe { real::fsync(fd) })
}

/// Routed `fdatasync`: a flush through the file's engine.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    // SAFETY: passed on.
    routed_flush(fd).unwrap_or_else(|| unsafe { real::fdatasync(fd) })
}

/// A descriptor number a call just created: forget what was known of it
/// (and never route iopath's own).
fn created(fd: c_int) -> c_int {
    if fd >= 0 && ACTIVE.load(Ordering::Relaxed) {
        if INSIDE.try_with(Cell::get).unwrap_or(true) {
            fds::mark_plain(fd);
        } else {
            fds::forget(fd);
        }
    }
    fd
}

macro_rules! hook_open {
    ($($name:ident),*) => {$(
        /// `open`: passed through; the new descriptor is looked at on its first I/O.
        ///
        /// # Safety
        /// As the C function (`mode` is read only with O_CREAT or O_TMPFILE, as there).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            // SAFETY: passed on.
            created(unsafe { real::$name(path, flags, mode) })
        }
    )*};
}
macro_rules! hook_openat {
    ($($name:ident),*) => {$(
        /// `openat`: passed through; the new descriptor is looked at on its first I/O.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            // SAFETY: passed on.
            created(unsafe { real::$name(dirfd, path, flags, mode) })
        }
    )*};
}
macro_rules! hook_creat {
    ($($name:ident),*) => {$(
        /// `creat`: passed through.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: mode_t) -> c_int {
            // SAFETY: passed on.
            created(unsafe { real::$name(path, mode) })
        }
    )*};
}
hook_open!(open, open64);
hook_openat!(openat, openat64);
hook_creat!(creat, creat64);

/// `close`: forgets the descriptor (its file's engine closes with its last one).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if ACTIVE.load(Ordering::Relaxed) && !FORKED.load(Ordering::Relaxed) {
        fds::forget(fd);
    }
    // SAFETY: passed on.
    unsafe { real::close(fd) }
}

/// `close_range`: forgets the descriptors it closes.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if ACTIVE.load(Ordering::Relaxed)
        && !FORKED.load(Ordering::Relaxed)
        && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0
    {
        fds::forget_range(first, last);
    }
    // SAFETY: passed on.
    unsafe { real::close_range(first, last, flags) }
}

/// `dup`: the copy is looked at on its first I/O (and shares the file's engine).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: passed on.
    created(unsafe { real::dup(fd) })
}

/// `dup2`: the descriptor replaced is forgotten.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: passed on.
    let r = unsafe { real::dup2(fd, to) };
    if r >= 0 && fd != to {
        created(r);
    }
    r
}

/// `dup3`: the descriptor replaced is forgotten.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: passed on.
    created(unsafe { real::dup3(fd, to, flags) })
}

fn after_fcntl(fd: c_int, cmd: c_int, result: c_int) -> c_int {
    if result >= 0 {
        match cmd {
            // O_DIRECT or O_APPEND may have changed on the open file, which every
            // duplicate shares: look at all routed descriptors again.
            libc::F_SETFL if ACTIVE.load(Ordering::Relaxed) => {
                for (other, _) in fds::routed() {
                    fds::forget(other);
                }
                fds::forget(fd);
            }
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                created(result);
            }
            _ => {}
        }
    }
    result
}

/// `fcntl`: passed through; a flag change or a duplicate is noted.
///
/// # Safety
/// As the C function (the third argument is passed on as given).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: passed on.
    after_fcntl(fd, cmd, unsafe { real::fcntl(fd, cmd, arg) })
}

/// `fcntl64`: as [`fcntl`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: passed on.
    after_fcntl(fd, cmd, unsafe { real::fcntl64(fd, cmd, arg) })
}

macro_rules! hook_ftruncate {
    ($($name:ident),*) => {$(
        /// `ftruncate`: the file's engine is reopened at its next I/O (at the new size).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, len: off_t) -> c_int {
            // SAFETY: passed on.
            let r = unsafe { real::$name(fd, len) };
            if r == 0 && let Some(route) = route_of(fd) {
                route.entry.invalidate();
            }
            r
        }
    )*};
}
hook_ftruncate!(ftruncate, ftruncate64);
