//! The public API: an [`Engine`] (a device plus an I/O path) and per-thread
//! [`Handle`]s.
//!
//! An engine is shared by any number of threads. Each thread either calls the
//! engine's blocking `read_at`/`write_at`/`flush` (which use a handle kept in
//! thread-local storage) or opens its own [`Handle`] for zero-overhead access,
//! for pre-registered buffers and for the queued API (submit many, reap many)
//! at depth > 1.

use crate::device::{Capabilities, Device, DeviceSpec, Durability, Op, QueueConfig};
use crate::error::{Error, Result};
use crate::path::PathConfig;
use crate::path::channel::{Channel, Completed, PathStats};
use crate::path::dispatch::Dispatch;
use crate::path::dispatch::{BLOCKING_TAG, Request};
use memmap2::MmapMut;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// What a queued slot carries: a registered buffer, or caller-owned memory with the caller's tag.
#[derive(Debug, Clone, Copy)]
enum SlotUse {
    Buffer(usize),
    Raw(u64),
}

struct Shared {
    id: u64,
    device: Arc<dyn Device>,
    capabilities: Capabilities,
    path: PathConfig,
    dispatch: Box<dyn Dispatch>,
    /// The file or block device the spec named, if it named one.
    backing: Option<std::path::PathBuf>,
}

/// A device and an I/O path, shared by all threads.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    /// Held by the engine's clones only (not by handles): when the last clone is
    /// gone, the handles threads keep for it (thread-local) are dropped at their
    /// next use of any engine, so a dropped engine does not keep its device open.
    alive: Arc<()>,
    /// Handles for any thread given back ([`Engine::give_back`]), to be opened
    /// again instead of a new queue.
    spare: Arc<Mutex<Vec<Handle>>>,
}

/// Options for a [`Handle`].
#[derive(Debug, Clone, Copy)]
pub struct HandleOptions {
    /// Most queued requests in flight at once (1 for blocking use only).
    pub depth: u32,
    /// Number of buffers to pre-allocate and register.
    pub buffers: usize,
    /// Size of each buffer in bytes.
    pub buffer_size: usize,
}

impl Default for HandleOptions {
    fn default() -> Self {
        HandleOptions { depth: 1, buffers: 0, buffer_size: 0 }
    }
}

impl Engine {
    /// Opens the device named by `device_spec` (see [`DeviceSpec`]) with `path`.
    pub fn open(device_spec: &str, path: PathConfig) -> Result<Engine> {
        let spec = DeviceSpec::parse(device_spec, None)?;
        let backing = spec.backing_file();
        let mut engine = Engine::with_device(spec.open()?, path)?;
        Arc::get_mut(&mut engine.shared).expect("a new engine is not shared").backing = backing;
        Ok(engine)
    }

    /// The file or block device the engine was opened on, if its spec named
    /// one ([`Engine::open`]; `None` for one built over a device object).
    pub fn backing(&self) -> Option<&std::path::Path> {
        self.shared.backing.as_deref()
    }

    /// Builds an engine over an already opened device.
    pub fn with_device(device: Arc<dyn Device>, path: PathConfig) -> Result<Engine> {
        let capabilities = device.capabilities();
        if path.pipeline == 0 {
            return Err(Error::spec("pipeline", "0", "at least one command must be allowed in the device"));
        }
        let timeout_ns = path.timeout.as_nanos().min(u64::MAX as u128) as u64;
        let dispatch = path.dispatch.build(&device, path.completion, &path, timeout_ns)?;
        Ok(Engine {
            alive: Arc::new(()),
            spare: Arc::default(),
            shared: Arc::new(Shared {
                id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
                dispatch,
                device,
                capabilities,
                path,
                backing: None,
            }),
        })
    }

    /// A number no other engine in this process has (keys per-engine state such as thread-local handles).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.shared.device
    }

    /// The path configuration.
    pub fn path(&self) -> &PathConfig {
        &self.shared.path
    }

    /// Counters of the path's own threads (an ATM dispatcher), not of any handle.
    pub fn background_stats(&self) -> PathStats {
        self.shared.dispatch.background_stats()
    }

    /// CPU time and context switches of the path's own threads so far.
    pub fn background_usage(&self) -> crate::clock::ThreadUsage {
        self.shared.dispatch.background_usage()
    }

    /// Opens a handle for the calling thread.
    pub fn handle(&self, options: HandleOptions) -> Result<Handle> {
        Handle::new(Arc::clone(&self.shared), options, false)
    }

    /// Opens a handle that threads take turns on (one at a time, under the
    /// caller's lock): any of them may submit, and any may reap what another
    /// submitted (its queue is not tied to the thread that opened it).
    /// One given back with the same depth and no buffers is opened again.
    pub fn handle_for_any_thread(&self, options: HandleOptions) -> Result<Handle> {
        if options.buffers == 0 {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = spare.iter().position(|h| h.depth == options.depth) {
                return Ok(spare.swap_remove(i));
            }
        }
        Handle::new(Arc::clone(&self.shared), options, true)
    }

    /// Keeps a handle [`Engine::handle_for_any_thread`] opened, with nothing
    /// queued and no buffers, to be opened again while the engine lives
    /// (any other handle is dropped). Its queue stays: a queue torn down
    /// sends task work to every thread that used it (io_uring's
    /// `TWA_SIGNAL`), which cuts short a blocking read or write such a
    /// thread is in (a pipe's, a socket's, /dev/urandom's), and the threads
    /// that used it are a program's in the interposer.
    pub fn give_back(&self, handle: Handle) {
        if handle.any_thread && handle.buffers.is_none() && handle.queued == 0 {
            self.spare.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
        }
    }

    /// Whether [`Handle::commit`] puts every request queued before it in the
    /// device's hands (the kernel's, for a kernel device) before it returns:
    /// a direct dispatch on a device that submits at commit. What a process
    /// sent that way is done even if the process dies the next moment.
    pub fn commit_submits(&self) -> bool {
        // `auto` sends queued requests direct too.
        matches!(self.shared.path.dispatch, crate::path::DispatchKind::Direct | crate::path::DispatchKind::Auto)
            && self.shared.capabilities.submits_at_commit
    }

    /// A token that dies with the engine's last clone (see [`ThreadHandles`]).
    pub(crate) fn liveness(&self) -> Weak<()> {
        Arc::downgrade(&self.alive)
    }

    fn with_thread_handle<T>(&self, f: impl FnOnce(&mut Handle) -> Result<T>) -> Result<T> {
        thread_local! {
            static HANDLES: RefCell<ThreadHandles> = const { RefCell::new(ThreadHandles::new()) };
        }
        let mut f = Some(f);
        let cached = HANDLES.try_with(|handles| {
            let mut handles = handles.borrow_mut();
            let index = match handles.position(self) {
                Some(i) => i,
                None => {
                    handles.purge();
                    let handle = self.handle(HandleOptions::default())?;
                    handles.put(self, handle)
                }
            };
            f.take().expect("called once")(handles.get(index))
        });
        match cached {
            Ok(result) => result,
            // The thread's storage is gone (a call from an exit handler, as the interposer
            // commits its mounts at exit): a handle for this call alone.
            Err(_) => f.take().expect("not called")(&mut self.handle(HandleOptions::default())?),
        }
    }

    /// Reads `buf.len()` bytes at `offset`, blocking until done. Callable from any thread.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.with_thread_handle(|h| h.read_at(buf, offset).map(drop))
    }

    /// Writes `buf` at `offset`, blocking until done. Callable from any thread.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.with_thread_handle(|h| h.write_at(buf, offset).map(drop))
    }

    /// Writes `buf` at `offset` durably, after making every earlier completed
    /// write durable ([`Handle::write_durable_at`]). Callable from any thread.
    pub fn write_durable_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.with_thread_handle(|h| h.write_durable_at(buf, offset).map(drop))
    }

    /// Writes `buf` at `offset` with forced unit access ([`Handle::write_fua_at`]).
    /// Callable from any thread.
    pub fn write_fua_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.with_thread_handle(|h| h.write_fua_at(buf, offset).map(drop))
    }

    /// Makes earlier writes durable. Callable from any thread.
    pub fn flush(&self) -> Result<()> {
        self.with_thread_handle(|h| h.flush())
    }
}

/// Handles a thread keeps for the engines it uses (in thread-local storage),
/// dropped once their engine is gone. Handles made before a fork are
/// forgotten in the child, never dropped: their descriptors (a ring, the
/// completion policy's /proc files) may have been closed there and their
/// numbers given to other files, which a drop would then close (seen: a
/// child of Python's subprocess closed its new mount's device this way).
pub(crate) struct ThreadHandles {
    handles: Vec<(u64, Weak<()>, Handle)>,
    /// [`crate::sys::fork_generation`] when the handles were made.
    forks: u64,
}

impl Drop for ThreadHandles {
    /// As the thread ends: its own handles are dropped as iopath's calls
    /// ([`crate::sys::own_calls`]: their rings' closes are not the
    /// program's), a parent's forgotten.
    fn drop(&mut self) {
        self.forget_if_forked();
        crate::sys::own_calls(|| self.handles.clear());
    }
}

impl ThreadHandles {
    /// None kept yet.
    pub(crate) const fn new() -> ThreadHandles {
        ThreadHandles { handles: Vec::new(), forks: 0 }
    }

    /// Forgets the handles made in a parent process (see the type's doc).
    fn forget_if_forked(&mut self) {
        let forks = crate::sys::fork_generation();
        if forks != self.forks {
            for handle in self.handles.drain(..) {
                std::mem::forget(handle);
            }
            self.forks = forks;
        }
    }

    /// Drops the handles of engines that are gone.
    fn purge(&mut self) {
        self.forget_if_forked();
        self.handles.retain(|(_, alive, _)| alive.strong_count() > 0);
    }

    /// Where this engine's handle is, if the thread has one (no purge: this runs per I/O).
    fn position(&mut self, engine: &Engine) -> Option<usize> {
        self.forget_if_forked();
        self.handles.iter().position(|(id, _, _)| *id == engine.shared.id)
    }

    /// Takes this engine's handle out, if the thread has one. When it has none (it
    /// is about to open one), the handles of engines gone since are dropped.
    pub(crate) fn take(&mut self, engine: &Engine) -> Option<Handle> {
        match self.position(engine) {
            Some(i) => Some(self.handles.swap_remove(i).2),
            None => {
                self.purge();
                None
            }
        }
    }

    /// Keeps `handle` for `engine`; returns where it is.
    pub(crate) fn put(&mut self, engine: &Engine, handle: Handle) -> usize {
        self.forget_if_forked();
        self.handles.push((engine.shared.id, engine.liveness(), handle));
        self.handles.len() - 1
    }

    fn get(&mut self, index: usize) -> &mut Handle {
        &mut self.handles[index].2
    }
}

/// One thread's access to an engine: its channel, its registered buffers and
/// the queued API. Not shared between threads.
pub struct Handle {
    shared: Arc<Shared>,
    channel: Channel,
    buffers: Option<MmapMut>,
    buffer_size: usize,
    buffer_busy: Vec<bool>,
    depth: u32,
    queued: u32,
    /// Opened by [`Engine::handle_for_any_thread`].
    any_thread: bool,
    /// Queued requests by slot (the tag the path sees: 0..depth, like an NVMe command id).
    slots: Vec<Option<SlotUse>>,
    free_slots: Vec<u64>,
}

impl Handle {
    fn new(shared: Arc<Shared>, options: HandleOptions, any_thread: bool) -> Result<Handle> {
        let caps = shared.capabilities;
        let depth = options.depth.max(1);
        if depth > caps.queue_depth {
            return Err(Error::spec(
                "queue depth",
                depth.to_string(),
                format!("the device takes at most {} commands per queue", caps.queue_depth),
            ));
        }
        let region_len = options.buffers * options.buffer_size;
        let mut buffers = if region_len > 0 {
            Some(MmapMut::map_anon(region_len).map_err(|source| Error::Os {
                context: format!("cannot allocate {region_len} bytes of I/O buffers"),
                source,
            })?)
        } else {
            None
        };
        let registered = buffers.as_mut().map(|m| (m.as_mut_ptr(), m.len()));
        // Room for this thread's own requests, and for merged batches when it serves others.
        let queue_depth = (depth as usize + 1).max(crate::path::dispatch::serve::queue_depth_for(shared.path.pipeline));
        let queue_depth = (queue_depth as u32).min(caps.queue_depth);
        let polled = shared.path.completion != crate::path::CompletionKind::Interrupt;
        let queue =
            shared.device.open_queue(&QueueConfig { depth: queue_depth, registered, polled, shared: any_thread })?;
        let timeout_ns = shared.path.timeout.as_nanos().min(u64::MAX as u128) as u64;
        let mut channel = Channel::new(queue, shared.path.completion, depth as usize, queue_depth as usize, timeout_ns);
        channel.waiter_spin_ns = shared.path.waiter_spin_ns();
        Ok(Handle {
            shared,
            channel,
            buffers,
            buffer_size: options.buffer_size,
            buffer_busy: vec![false; options.buffers],
            depth,
            queued: 0,
            any_thread,
            slots: vec![None; depth as usize],
            free_slots: (0..depth as u64).rev().collect(),
        })
    }

    /// The device's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.shared.capabilities
    }

    /// This handle's counters.
    pub fn stats(&self) -> PathStats {
        self.channel.stats
    }

    fn check(&self, op: Op, addr: usize, len: usize, offset: u64) -> Result<()> {
        let caps = &self.shared.capabilities;
        if len == 0 {
            return Err(Error::ZeroLength { offset });
        }
        let size = self.shared.device.size();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { offset, len: len as u64, size });
        }
        if len > caps.max_segment_bytes as usize {
            return Err(Error::TooLarge { len: len as u64, max: caps.max_segment_bytes as u64 });
        }
        let align = caps.alignment as u64;
        if align > 1 {
            if !(addr as u64).is_multiple_of(align) {
                return Err(Error::Misaligned { what: "buffer address", value: addr as u64, align });
            }
            if !offset.is_multiple_of(align) {
                return Err(Error::Misaligned { what: "offset", value: offset, align });
            }
            if !(len as u64).is_multiple_of(align) {
                return Err(Error::Misaligned { what: "length", value: len as u64, align });
            }
        }
        debug_assert!(op != Op::Flush);
        Ok(())
    }

    fn blocking(&mut self, op: Op, buf: *mut u8, len: usize, offset: u64) -> Result<u64> {
        self.blocking_request(op, buf, len, offset, Durability::Cached)
    }

    fn blocking_request(
        &mut self,
        op: Op,
        buf: *mut u8,
        len: usize,
        offset: u64,
        durability: Durability,
    ) -> Result<u64> {
        self.check(op, buf as usize, len, offset)?;
        let request = Request { op, offset, buf, len: len as u32, tag: BLOCKING_TAG, durability };
        // SAFETY: `buf` is borrowed by the caller of read_at/write_at for the whole call,
        // and the dispatch returns only once the request is complete.
        let done = unsafe { self.shared.dispatch.blocking(&mut self.channel, request)? };
        done.result?;
        Ok(done.device_ns)
    }

    /// Reads `buf.len()` bytes at `offset`; returns the device time it saw (0 if unknown).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<u64> {
        self.blocking(Op::Read, buf.as_mut_ptr(), buf.len(), offset)
    }

    /// Writes `buf` at `offset`; returns the device time it saw (0 if unknown).
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<u64> {
        // The device only reads from a write's buffer.
        self.blocking(Op::Write, buf.as_ptr().cast_mut(), buf.len(), offset)
    }

    /// Writes `buf` at `offset` as one durable command: every write that
    /// completed before this call is made durable first, and this one is
    /// durable when the call returns ([`Durability::Ordered`]:
    /// a flush and a FUA write, one round trip where the device allows).
    pub fn write_durable_at(&mut self, buf: &[u8], offset: u64) -> Result<u64> {
        self.blocking_request(Op::Write, buf.as_ptr().cast_mut(), buf.len(), offset, Durability::Ordered)
    }

    /// Writes `buf` at `offset` with forced unit access ([`Durability::Fua`]):
    /// durable when the call returns; says nothing of other writes.
    pub fn write_fua_at(&mut self, buf: &[u8], offset: u64) -> Result<u64> {
        self.blocking_request(Op::Write, buf.as_ptr().cast_mut(), buf.len(), offset, Durability::Fua)
    }

    /// Discards `len` bytes at `offset` ([`Op::Trim`]): they read back as zeros.
    pub fn trim(&mut self, offset: u64, len: usize) -> Result<u64> {
        self.blocking(Op::Trim, std::ptr::null_mut(), len, offset)
    }

    /// Makes earlier writes durable.
    pub fn flush(&mut self) -> Result<()> {
        let request = Request {
            op: Op::Flush,
            offset: 0,
            buf: std::ptr::null_mut(),
            len: 0,
            tag: BLOCKING_TAG,
            durability: Durability::Cached,
        };
        // SAFETY: a flush has no buffer.
        let done = unsafe { self.shared.dispatch.blocking(&mut self.channel, request)? };
        done.result
    }

    /// Number of pre-allocated buffers.
    pub fn buffer_count(&self) -> usize {
        self.buffer_busy.len()
    }

    /// Pre-allocated buffer `index`, unless it is in flight.
    pub fn buffer(&mut self, index: usize) -> Option<&mut [u8]> {
        if *self.buffer_busy.get(index)? {
            return None;
        }
        let size = self.buffer_size;
        self.buffers.as_mut().map(|m| &mut m[index * size..(index + 1) * size])
    }

    fn buffer_ptr(&mut self, index: usize, len: usize) -> Result<*mut u8> {
        let size = self.buffer_size;
        match (self.buffer_busy.get(index), self.buffers.as_mut()) {
            (Some(false), Some(m)) if len <= size => Ok(m[index * size..].as_mut_ptr()),
            (Some(true), _) => Err(Error::spec("buffer", index.to_string(), "buffer is in flight; reap it first")),
            _ => Err(Error::spec(
                "buffer",
                index.to_string(),
                format!("no such buffer of {len} bytes; the handle has {} of {size} bytes", self.buffer_busy.len()),
            )),
        }
    }

    /// Reads `len` bytes at `offset` into pre-allocated buffer `index`, blocking.
    pub fn read_into(&mut self, index: usize, offset: u64, len: usize) -> Result<u64> {
        let ptr = self.buffer_ptr(index, len)?;
        self.blocking(Op::Read, ptr, len, offset)
    }

    /// Writes `len` bytes of pre-allocated buffer `index` at `offset`, blocking.
    pub fn write_from(&mut self, index: usize, offset: u64, len: usize) -> Result<u64> {
        let ptr = self.buffer_ptr(index, len)?;
        self.blocking(Op::Write, ptr, len, offset)
    }

    /// Queues a read or write of pre-allocated buffer `index`; the completion
    /// carries `tag = index`. Call [`Handle::commit`] to send a batch.
    pub fn submit(&mut self, op: Op, index: usize, offset: u64, len: usize) -> Result<()> {
        if self.queued >= self.depth {
            return Err(Error::spec(
                "submission",
                format!("{} queued", self.queued),
                format!("the handle was opened with depth {}; reap before submitting more", self.depth),
            ));
        }
        let ptr = self.buffer_ptr(index, len)?;
        self.check(op, ptr as usize, len, offset)?;
        // SAFETY: the buffer is marked busy until reaped, and the handle (which owns the
        // memory) waits out in-flight commands before it is dropped.
        unsafe { self.queue(op, ptr, len, offset, SlotUse::Buffer(index), Durability::Cached)? };
        self.buffer_busy[index] = true;
        Ok(())
    }

    /// Sends a request in a free slot.
    ///
    /// # Safety
    /// As [`Handle::submit_raw`].
    unsafe fn queue(
        &mut self,
        op: Op,
        buf: *mut u8,
        len: usize,
        offset: u64,
        what: SlotUse,
        durability: Durability,
    ) -> Result<()> {
        let slot = self.free_slots.pop().expect("a slot is free while fewer than depth are queued");
        let request = Request { op, offset, buf, len: len as u32, tag: slot, durability };
        // SAFETY: passed on from the caller.
        if let Err(e) = unsafe { self.shared.dispatch.submit(&mut self.channel, request) } {
            self.free_slots.push(slot);
            return Err(e);
        }
        self.slots[slot as usize] = Some(what);
        self.queued += 1;
        Ok(())
    }

    /// Queues a read or write of memory the caller owns; the completion carries
    /// `tag`. Call [`Handle::commit`] to send a batch.
    ///
    /// # Safety
    ///
    /// `buf` must be valid for `len` bytes, aligned as the device requires, and
    /// left alone (not read, for a read; not written, for a write) until this
    /// request is reaped; the handle must not be dropped before then unless it
    /// is allowed to wait for the request (it does, in `Drop`).
    pub unsafe fn submit_raw(&mut self, op: Op, buf: *mut u8, len: usize, offset: u64, tag: u64) -> Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.submit_raw_with(op, buf, len, offset, tag, Durability::Cached) }
    }

    /// [`Handle::submit_raw`] with a [`Durability`] for a write (`Fua`: durable
    /// when it completes; `Ordered`: earlier completed writes made durable first).
    ///
    /// # Safety
    ///
    /// As [`Handle::submit_raw`].
    pub unsafe fn submit_raw_with(
        &mut self,
        op: Op,
        buf: *mut u8,
        len: usize,
        offset: u64,
        tag: u64,
        durability: Durability,
    ) -> Result<()> {
        if self.queued >= self.depth {
            return Err(Error::spec(
                "submission",
                format!("{} queued", self.queued),
                format!("the handle was opened with depth {}; reap before submitting more", self.depth),
            ));
        }
        self.check(op, buf as usize, len, offset)?;
        // SAFETY: the caller keeps the memory valid and untouched until the request is reaped.
        unsafe { self.queue(op, buf, len, offset, SlotUse::Raw(tag), durability) }
    }

    /// Sends every queued request to the device (one system call where the backend batches).
    pub fn commit(&mut self) -> Result<()> {
        self.shared.dispatch.commit(&mut self.channel)
    }

    /// Waits until at least `min` queued requests have completed; moves all
    /// completed ones to `out` (their `tag` is the buffer index).
    pub fn reap(&mut self, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        let start = out.len();
        let n = self.shared.dispatch.reap(&mut self.channel, min, out)?;
        for done in &mut out[start..] {
            let slot = done.tag;
            match self.slots.get_mut(slot as usize).and_then(Option::take) {
                Some(SlotUse::Buffer(index)) => {
                    self.buffer_busy[index] = false;
                    done.tag = index as u64;
                }
                Some(SlotUse::Raw(tag)) => done.tag = tag,
                None => debug_assert!(false, "completion for slot {slot}, which holds no request"),
            }
            self.free_slots.push(slot);
        }
        self.queued -= n as u32;
        Ok(n)
    }

    /// Requests queued and not yet reaped.
    pub fn queued(&self) -> u32 {
        self.queued
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The device may still write into our buffers: wait for everything queued.
        let mut sink = Vec::new();
        while self.queued > 0 {
            match self.reap(1, &mut sink) {
                Ok(_) => sink.clear(),
                Err(_) => break,
            }
        }
    }
}
