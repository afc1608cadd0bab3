//! The C interface (`include/iopath.h`, built into `libiopath.so`).
//!
//! Every function here is `extern "C"`, never unwinds into C (a panic is
//! caught and reported as `-ENOTRECOVERABLE`), and reports failure as a
//! negative errno with a readable message kept per thread
//! ([`iopath_last_error`]). The header documents each function; this file
//! only translates: C pointers and lengths in, [`Engine`] and [`Handle`]
//! calls, errno values out.

use crate::device::Op;
use crate::engine::{Engine, Handle, HandleOptions};
use crate::error::Error;
use crate::path::PathSpec;
use crate::path::channel::Completed;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The errno a C caller gets for `error`: the OS's where there is one,
/// otherwise the closest meaning (a bad argument is `EINVAL`).
pub fn errno_of(error: &Error) -> i32 {
    if let Some(errno) = error.errno() {
        return errno;
    }
    match error {
        Error::Unsupported { .. } => libc::EOPNOTSUPP,
        Error::Interrupted { .. } => libc::EINTR,
        Error::Refused { .. } => libc::EPERM,
        Error::Short { .. } | Error::Verify { .. } => libc::EIO,
        _ => libc::EINVAL,
    }
}

fn set_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Records `error` as this thread's last error; returns `-errno`.
fn fail(error: &Error) -> i64 {
    set_error(&error.to_string());
    -(errno_of(error) as i64)
}

/// Runs `f`, turning a panic into `-ENOTRECOVERABLE` (never unwinding into C).
fn guarded(what: &str, f: impl FnOnce() -> i64) -> i64 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error(&format!("iopath: internal error (panic) in {what}; the engine may be unusable"));
        -(libc::ENOTRECOVERABLE as i64)
    })
}

fn text_arg<'a>(name: &str, ptr: *const c_char) -> Result<Option<&'a str>, i64> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string (header contract).
    let bytes = unsafe { CStr::from_ptr(ptr) };
    match bytes.to_str() {
        Ok(s) => Ok(Some(s)),
        Err(_) => {
            set_error(&format!("{name} is not valid UTF-8"));
            Err(-(libc::EINVAL as i64))
        }
    }
}

/// Counters the C interface keeps per engine (the library's own counters
/// live in each thread's handle).
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
}

/// An engine as C sees it (`iopath_engine`).
pub struct CEngine {
    engine: Engine,
    device_spec: String,
    path_name: String,
    counters: Counters,
}

/// A queue as C sees it (`iopath_queue`): one thread's handle at depth > 1.
pub struct CQueue {
    handle: Handle,
    counters: *const CEngine,
    reaped: Vec<Completed>,
    ready: VecDeque<Completed>,
}

/// The path an engine takes when `iopath_open` gets no path spec: the caller
/// polls its own completions and yields the CPU between looks, which is as
/// fast as pure polling for one thread and does not collapse when a program
/// has more threads than CPUs (pure polling does).
pub const DEFAULT_PATH: &str = "auto";

/// Opens an engine; see `iopath.h`.
///
/// # Safety
/// `device_spec` must be a NUL-terminated string; `path_spec` NULL or one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_open(device_spec: *const c_char, path_spec: *const c_char) -> *mut CEngine {
    let mut out = std::ptr::null_mut();
    guarded("iopath_open", || {
        let device = match text_arg("device_spec", device_spec) {
            Ok(Some(d)) => d,
            Ok(None) => {
                set_error("device_spec is NULL: name a device, e.g. \"uring:/dev/nvme0n1\" or \"emu:dram-ssd\"");
                return -(libc::EINVAL as i64);
            }
            Err(e) => return e,
        };
        let path_name = match text_arg("path_spec", path_spec) {
            Ok(p) => p.unwrap_or(DEFAULT_PATH),
            Err(e) => return e,
        };
        let opened = PathSpec::parse(path_name).and_then(|spec| Engine::open(device, spec.config()?));
        match opened {
            Ok(engine) => {
                out = Box::into_raw(Box::new(CEngine {
                    engine,
                    device_spec: device.to_string(),
                    path_name: path_name.to_string(),
                    counters: Counters::default(),
                }));
                0
            }
            Err(e) => fail(&e),
        }
    });
    out
}

/// Closes an engine; see `iopath.h`.
///
/// # Safety
/// `engine` must come from [`iopath_open`] and not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_close(engine: *mut CEngine) {
    // SAFETY: the caller hands back what iopath_open returned, once (header contract).
    unsafe { release("iopath_close", engine) }
}

/// Drops what a C caller hands back (NULL is ignored), under `guarded`.
///
/// # Safety
/// `ptr` must be NULL or come from `Box::into_raw` of a `Box<T>` made in this
/// library, and not be used afterwards.
unsafe fn release<T>(what: &str, ptr: *mut T) {
    if ptr.is_null() {
        return;
    }
    guarded(what, || {
        // SAFETY: as the function's contract says.
        drop(unsafe { Box::from_raw(ptr) });
        0
    });
}

/// This thread's last error message; see `iopath.h`.
#[unsafe(no_mangle)]
pub extern "C" fn iopath_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

fn engine_ref<'a>(engine: *const CEngine) -> Result<&'a CEngine, i64> {
    if engine.is_null() {
        set_error("the engine is NULL (did iopath_open fail?)");
        return Err(-(libc::EINVAL as i64));
    }
    // SAFETY: non-null engines come from iopath_open and live until iopath_close (header contract).
    Ok(unsafe { &*engine })
}

/// Usable size of the device in bytes; see `iopath.h`.
///
/// # Safety
/// `engine` must be a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_size(engine: *const CEngine) -> u64 {
    engine_ref(engine).map_or(0, |e| e.engine.device().size())
}

/// Alignment of buffers, offsets and lengths the device needs; see `iopath.h`.
///
/// # Safety
/// `engine` must be a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_alignment(engine: *const CEngine) -> u32 {
    engine_ref(engine).map_or(0, |e| e.engine.device().capabilities().alignment)
}

/// Largest single request in bytes; see `iopath.h`.
///
/// # Safety
/// `engine` must be a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_max_io(engine: *const CEngine) -> u32 {
    engine_ref(engine).map_or(0, |e| e.engine.device().capabilities().max_segment_bytes)
}

fn blocking(engine: *const CEngine, op: Op, buf: *mut c_void, len: usize, offset: u64) -> i64 {
    let e = match engine_ref(engine) {
        Ok(e) => e,
        Err(code) => return code,
    };
    if buf.is_null() && len > 0 {
        set_error("the buffer is NULL");
        return -(libc::EFAULT as i64);
    }
    let result = match op {
        Op::Read => {
            // SAFETY: the caller gives `len` writable bytes at `buf` for the call (header contract).
            let slice = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
            e.engine.read_at(slice, offset)
        }
        _ => {
            // SAFETY: the caller gives `len` readable bytes at `buf` for the call.
            let slice = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
            e.engine.write_at(slice, offset)
        }
    };
    let c = &e.counters;
    match result {
        Ok(()) => {
            let (n, bytes) = if op == Op::Read { (&c.reads, &c.bytes_read) } else { (&c.writes, &c.bytes_written) };
            n.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(len as u64, Ordering::Relaxed);
            len as i64
        }
        Err(err) => {
            c.errors.fetch_add(1, Ordering::Relaxed);
            fail(&err)
        }
    }
}

/// Blocking read; see `iopath.h`.
///
/// # Safety
/// `engine` must be live and `buf` valid for `len` bytes for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_read(engine: *mut CEngine, buf: *mut c_void, len: usize, offset: u64) -> i64 {
    guarded("iopath_read", || blocking(engine, Op::Read, buf, len, offset))
}

/// Blocking write; see `iopath.h`.
///
/// # Safety
/// `engine` must be live and `buf` valid for `len` bytes for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_write(engine: *mut CEngine, buf: *const c_void, len: usize, offset: u64) -> i64 {
    guarded("iopath_write", || blocking(engine, Op::Write, buf.cast_mut(), len, offset))
}

/// Makes earlier writes durable; see `iopath.h`.
///
/// # Safety
/// `engine` must be live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_flush(engine: *mut CEngine) -> c_int {
    guarded("iopath_flush", || {
        let e = match engine_ref(engine) {
            Ok(e) => e,
            Err(code) => return code,
        };
        match e.engine.flush() {
            Ok(()) => {
                e.counters.flushes.fetch_add(1, Ordering::Relaxed);
                0
            }
            Err(err) => {
                e.counters.errors.fetch_add(1, Ordering::Relaxed);
                fail(&err)
            }
        }
    }) as c_int
}

/// Statistics as a JSON object (free with [`iopath_string_free`]); see `iopath.h`.
///
/// # Safety
/// `engine` must be live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_stats_json(engine: *const CEngine) -> *mut c_char {
    let mut out = std::ptr::null_mut();
    guarded("iopath_stats_json", || {
        let e = match engine_ref(engine) {
            Ok(e) => e,
            Err(code) => return code,
        };
        let c = &e.counters;
        let background = e.engine.background_stats();
        let json = serde_json::json!({
            "device": e.device_spec,
            "device_description": e.engine.device().describe(),
            "path": e.path_name,
            "reads": c.reads.load(Ordering::Relaxed),
            "writes": c.writes.load(Ordering::Relaxed),
            "flushes": c.flushes.load(Ordering::Relaxed),
            "bytes_read": c.bytes_read.load(Ordering::Relaxed),
            "bytes_written": c.bytes_written.load(Ordering::Relaxed),
            "errors": c.errors.load(Ordering::Relaxed),
            "dispatcher": {
                "commands": background.commands,
                "segments": background.segments,
                "requests_per_command": if background.commands > 0 {
                    background.segments as f64 / background.commands as f64
                } else { 0.0 },
            },
        });
        out = CString::new(json.to_string()).map(CString::into_raw).unwrap_or(std::ptr::null_mut());
        0
    });
    out
}

/// Frees a string iopath returned; see `iopath.h`.
///
/// # Safety
/// `s` must come from iopath (or be NULL) and be freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw in this library.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// A held request that idle CPUs poll ([`crate::idle::IdlePolling`]).
pub struct CIdlePolling {
    _request: crate::idle::IdlePolling,
}

/// Asks that idle CPUs poll instead of halting until released; see `iopath.h`.
#[unsafe(no_mangle)]
pub extern "C" fn iopath_idle_poll_request() -> *mut CIdlePolling {
    let mut out = std::ptr::null_mut();
    guarded("iopath_idle_poll_request", || match crate::idle::IdlePolling::request() {
        Ok(request) => {
            out = Box::into_raw(Box::new(CIdlePolling { _request: request }));
            0
        }
        Err(e) => fail(&e),
    });
    out
}

/// Ends a request from [`iopath_idle_poll_request`]; see `iopath.h`.
///
/// # Safety
/// `request` must come from [`iopath_idle_poll_request`] (or be NULL) and be released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_idle_poll_release(request: *mut CIdlePolling) {
    // SAFETY: the caller hands back what iopath_idle_poll_request returned, once (header contract).
    unsafe { release("iopath_idle_poll_release", request) }
}

/// Opens a queue (this thread's handle at `depth`); see `iopath.h`.
///
/// # Safety
/// `engine` must be live and outlive the queue.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_open(engine: *mut CEngine, depth: u32) -> *mut CQueue {
    let mut out = std::ptr::null_mut();
    guarded("iopath_queue_open", || {
        let e = match engine_ref(engine) {
            Ok(e) => e,
            Err(code) => return code,
        };
        if depth == 0 {
            set_error("depth 0: a queue needs room for at least one request");
            return -(libc::EINVAL as i64);
        }
        match e.engine.handle(HandleOptions { depth, ..HandleOptions::default() }) {
            Ok(handle) => {
                out = Box::into_raw(Box::new(CQueue {
                    handle,
                    counters: engine,
                    reaped: Vec::with_capacity(depth as usize),
                    ready: VecDeque::with_capacity(depth as usize),
                }));
                0
            }
            Err(err) => fail(&err),
        }
    });
    out
}

/// Closes a queue, waiting for its requests in flight; see `iopath.h`.
///
/// # Safety
/// `queue` must come from [`iopath_queue_open`] and not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_close(queue: *mut CQueue) {
    if queue.is_null() {
        return;
    }
    guarded("iopath_queue_close", || {
        // SAFETY: handed back once; the handle's Drop waits for requests in flight.
        drop(unsafe { Box::from_raw(queue) });
        0
    });
}

fn queue_mut<'a>(queue: *mut CQueue) -> Result<&'a mut CQueue, i64> {
    if queue.is_null() {
        set_error("the queue is NULL (did iopath_queue_open fail?)");
        return Err(-(libc::EINVAL as i64));
    }
    // SAFETY: live queues come from iopath_queue_open and are used by one thread at a time.
    Ok(unsafe { &mut *queue })
}

fn queue_submit(queue: *mut CQueue, op: Op, buf: *mut c_void, len: usize, offset: u64, tag: u64) -> i64 {
    let q = match queue_mut(queue) {
        Ok(q) => q,
        Err(code) => return code,
    };
    if buf.is_null() {
        set_error("the buffer is NULL");
        return -(libc::EFAULT as i64);
    }
    // SAFETY: the caller leaves the buffer alone until the request is reaped (header contract).
    match unsafe { q.handle.submit_raw(op, buf.cast(), len, offset, tag) } {
        Ok(()) => 0,
        Err(err) => fail(&err),
    }
}

/// Queues a read; see `iopath.h`.
///
/// # Safety
/// `buf` must stay valid and untouched until the request is reaped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_read(
    queue: *mut CQueue,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    tag: u64,
) -> c_int {
    guarded("iopath_queue_read", || queue_submit(queue, Op::Read, buf, len, offset, tag)) as c_int
}

/// Queues a write; see `iopath.h`.
///
/// # Safety
/// `buf` must stay valid and unchanged until the request is reaped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_write(
    queue: *mut CQueue,
    buf: *const c_void,
    len: usize,
    offset: u64,
    tag: u64,
) -> c_int {
    guarded("iopath_queue_write", || queue_submit(queue, Op::Write, buf.cast_mut(), len, offset, tag)) as c_int
}

/// Sends what was queued; see `iopath.h`.
///
/// # Safety
/// `queue` must be live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_commit(queue: *mut CQueue) -> c_int {
    guarded("iopath_queue_commit", || {
        let q = match queue_mut(queue) {
            Ok(q) => q,
            Err(code) => return code,
        };
        match q.handle.commit() {
            Ok(()) => 0,
            Err(err) => fail(&err),
        }
    }) as c_int
}

/// One finished queued request (`struct iopath_completion`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IopathCompletion {
    /// The caller's tag.
    pub tag: u64,
    /// Bytes moved, or `-errno`.
    pub result: i64,
}

/// Waits for at least `min` completions and copies up to `max`; see `iopath.h`.
///
/// # Safety
/// `out` must have room for `max` completions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_reap(
    queue: *mut CQueue,
    min: u32,
    out: *mut IopathCompletion,
    max: u32,
) -> c_int {
    guarded("iopath_queue_reap", || {
        let q = match queue_mut(queue) {
            Ok(q) => q,
            Err(code) => return code,
        };
        if out.is_null() && max > 0 {
            set_error("the completion array is NULL");
            return -(libc::EFAULT as i64);
        }
        let min = (min.min(max) as usize).min(q.ready.len() + q.handle.queued() as usize);
        if q.ready.len() < min || (q.ready.is_empty() && q.handle.queued() > 0) {
            let need = min.saturating_sub(q.ready.len());
            q.reaped.clear();
            if let Err(err) = q.handle.reap(need, &mut q.reaped) {
                return fail(&err);
            }
            q.ready.extend(q.reaped.drain(..));
        }
        // SAFETY: the queue's engine outlives the queue (header contract).
        let counters = unsafe { &(*q.counters).counters };
        let n = q.ready.len().min(max as usize);
        for i in 0..n {
            let done = q.ready.pop_front().expect("counted above");
            let result = match &done.result {
                Ok(()) => {
                    let (count, bytes) = if done.op == Op::Read {
                        (&counters.reads, &counters.bytes_read)
                    } else {
                        (&counters.writes, &counters.bytes_written)
                    };
                    count.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(done.len as u64, Ordering::Relaxed);
                    done.len as i64
                }
                Err(err) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    set_error(&err.to_string());
                    -(errno_of(err) as i64)
                }
            };
            // SAFETY: `out` has room for `max` entries and i < max.
            unsafe { out.add(i).write(IopathCompletion { tag: done.tag, result }) };
        }
        n as i64
    }) as c_int
}

/// Requests queued and not yet handed back by [`iopath_queue_reap`]; see `iopath.h`.
///
/// # Safety
/// `queue` must be live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iopath_queue_pending(queue: *const CQueue) -> u32 {
    queue_mut(queue.cast_mut()).map_or(0, |q| q.handle.queued() + q.ready.len() as u32)
}
