//! `aio`: Linux native AIO (`io_submit`) on a file or block device, O_DIRECT,
//! its completions read from the ring the kernel maps into the process.
//!
//! Why a second kernel interface beside io_uring: who may see a completion.
//! io_uring posts a read's or write's completion by task work on the thread
//! that submitted it, run at that thread's next entry into the kernel. On a
//! queue that threads take turns on (the combining strategy's serving role,
//! one submission for everyone's requests) a waiter whose request another
//! thread sent sees it complete only once that thread runs again: with 16
//! blocking threads on 2 CPUs, a shared ring made 88-127K IOPS on a loop
//! device, most of its CPU in the yields that waited for submitters. Native
//! AIO writes the completion into its ring from the context that ends the
//! I/O (the block layer's completion), so whichever thread looks next sees
//! it, with no system call: a look is two loads of the ring's head and tail.
//! The same prototype on AIO made 128-156K (fio's psync: ~100K), and the
//! CPU per I/O fell from ~16 to 7-9 us. One `io_submit` carries a whole
//! batch to the block layer under one plug, which the loop device's worker
//! then serves in one pass.
//!
//! Each queue is its own AIO context (`io_setup`, no file descriptor). A
//! command's segments become one `iocb` each, sent at [`Queue::commit`] with
//! one `io_submit`; a command completes when its last event arrives. A
//! durable write (`Fua`) is sent with `RWF_DSYNC`, a flush as `FDSYNC`, an
//! `Ordered` write as an `FDSYNC` whose completion sends the writes. AIO has
//! no discard: a trim punches its hole inside `submit`, as the psync backend
//! does, and is handed back by the next look. Requests the context has no
//! room for (`EAGAIN`) stay queued and go with the next look or commit.
//! Block I/O under way cannot be cancelled through AIO; [`Queue::cancel`]
//! asks nothing, and every command still comes back.

use super::spec::Options;
use super::target::{Target, TargetConfig};
use super::{Capabilities, Command, Counters, Device, DeviceStats, Durability, Finished, Op, Queue, QueueConfig};
use crate::error::{Error, Result};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

/// Most segments one AIO command carries (each is one `iocb`).
pub const MAX_SEGMENTS: usize = 256;
/// Events one context is set up for per command of the queue's depth: room
/// for a few segments each before `io_submit` answers `EAGAIN`.
const EVENTS_PER_COMMAND: u32 = 4;
/// Fewest and most events a context is set up for (the system-wide budget,
/// `fs.aio-max-nr`, is 65536 by default).
const MIN_EVENTS: u32 = 64;
const MAX_EVENTS: u32 = 4096;
const SEG_BITS: u32 = 16;
/// Segment index of an `Ordered` write's leading flush (no real segment has it).
const FLUSH_SEG: u64 = (1 << SEG_BITS) - 1;

/// `IOCB_CMD_*` of the kernel's `linux/aio_abi.h`.
const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
const IOCB_CMD_FDSYNC: u16 = 3;
/// The magic number the kernel writes at the head of a context's ring.
const AIO_RING_MAGIC: u32 = 0xa10a_10a1;

/// `struct iocb` (x86-64 and other little-endian 64-bit layouts): one
/// request to the kernel ([`SharedAio::request`] makes one).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    lio_opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

impl Iocb {
    /// The word its event will carry.
    pub fn data(&self) -> u64 {
        self.data
    }
}

/// `struct io_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

/// `struct aio_ring`: the header of the ring the kernel maps at the
/// context's address, followed by its events.
#[repr(C)]
struct AioRing {
    id: u32,
    nr: u32,
    head: u32,
    tail: u32,
    magic: u32,
    compat_features: u32,
    incompat_features: u32,
    header_length: u32,
}

/// Options of the aio backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AioConfig {
    /// The file or block device.
    pub target: TargetConfig,
}

impl AioConfig {
    /// Parses `aio:PATH[,direct=0|1][,size=N][,readonly=1]`.
    pub fn parse(path: &str, mut opts: Options, default_size: Option<u64>) -> Result<AioConfig> {
        let target = TargetConfig::parse(path, &mut opts, default_size)?;
        opts.finish(&["direct", "size", "readonly"])?;
        Ok(AioConfig { target })
    }
}

/// Shared between the device and its queues.
struct Shared {
    target: Target,
    counters: Counters,
}

/// Linux native AIO on a file or block device.
pub struct AioDevice {
    shared: Arc<Shared>,
}

impl AioDevice {
    /// Opens the target.
    pub fn open(config: &AioConfig) -> Result<AioDevice> {
        let target = Target::open(&config.target)?;
        Ok(AioDevice { shared: Arc::new(Shared { target, counters: Counters::default() }) })
    }
}

impl Device for AioDevice {
    fn describe(&self) -> String {
        format!("aio:{}", self.shared.target.describe())
    }

    fn size(&self) -> u64 {
        self.shared.target.size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_segments: MAX_SEGMENTS,
            max_segment_bytes: self.shared.target.max_segment_bytes(),
            alignment: self.shared.target.alignment,
            queue_depth: MAX_EVENTS,
            kernel_poll: false,
            timed: false,
            stores_data: true,
            submits_at_commit: true,
        }
    }

    fn completion_source(&self, _polled: bool) -> String {
        "the AIO context's ring, written by the kernel as each I/O ends and read in user space by any thread; \
         sleeping waits block in io_getevents"
            .into()
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(AioQueue::new(Arc::clone(&self.shared), config)?))
    }

    fn stats(&self) -> DeviceStats {
        self.shared.counters.snapshot()
    }
}

/// Events a [`SharedAio`] context is set up for: room for a crowd of
/// blocked threads' requests (each has one at a time); more wait for room.
const SHARED_EVENTS: u32 = 256;

/// One AIO context: its ring, mapped into the process, and the calls on it.
struct Context {
    /// The context (the address of its ring in this process).
    ctx: u64,
    /// Whether the ring can be read in user space (its magic and features
    /// are the ones this code knows); otherwise looks use `io_getevents`.
    user_ring: bool,
}

impl Context {
    /// A context for about `events` events (kept within 64-4096, fewer where
    /// the system's budget is nearly spent); `path` names the target in errors.
    fn setup(events: u32, path: &std::path::Path) -> Result<Context> {
        let mut events = events.clamp(MIN_EVENTS, MAX_EVENTS);
        let ctx = loop {
            let mut ctx: u64 = 0;
            // SAFETY: io_setup writes the new context's address into `ctx`.
            let r = unsafe { libc::syscall(libc::SYS_io_setup, events as libc::c_long, &mut ctx as *mut u64) };
            if r == 0 {
                break ctx;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EAGAIN) && events > MIN_EVENTS {
                // The system's AIO budget (fs.aio-max-nr) is nearly spent: a smaller ring.
                events /= 2;
                continue;
            }
            return Err(Error::Os {
                context: format!(
                    "io_setup({events}) for {} (the system's AIO budget is /proc/sys/fs/aio-max-nr; \
                     use uring: or psync: instead)",
                    path.display()
                ),
                source: err,
            });
        };
        // SAFETY: the kernel maps the ring at the context's address for the context's life.
        let ring = unsafe { &*(ctx as *const AioRing) };
        let user_ring = ring.magic == AIO_RING_MAGIC
            && ring.incompat_features == 0
            && ring.header_length as usize == std::mem::size_of::<AioRing>();
        Ok(Context { ctx, user_ring })
    }

    /// One `io_submit` of up to [`SUBMIT_CHUNK`] of `iocbs`: how many the
    /// kernel took (at least one), or the errno of the first it refused
    /// (`EAGAIN`: no room in the context).
    ///
    /// # Safety
    ///
    /// Each request's buffer stays valid until its event has been taken.
    unsafe fn submit(&self, iocbs: &[Iocb]) -> std::result::Result<usize, i32> {
        let mut ptrs = [std::ptr::null::<Iocb>(); SUBMIT_CHUNK];
        let n = iocbs.len().min(SUBMIT_CHUNK);
        for (p, c) in ptrs.iter_mut().zip(&iocbs[..n]) {
            *p = c;
        }
        loop {
            // SAFETY: the kernel copies each iocb during the call; the buffers are the
            // caller's promise.
            let r = unsafe { libc::syscall(libc::SYS_io_submit, self.ctx, n as libc::c_long, ptrs.as_ptr()) };
            if r > 0 {
                return Ok(r as usize);
            }
            let errno =
                if r == 0 { libc::EAGAIN } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) };
            if errno != libc::EINTR {
                return Err(errno);
            }
        }
    }

    /// Whether the ring holds events: two loads (always true where it
    /// cannot be read in user space).
    fn has_events(&self) -> bool {
        if !self.user_ring {
            return true;
        }
        let ring = self.ctx as *const AioRing;
        // SAFETY: the ring is mapped for the context's life.
        unsafe { std::ptr::read_volatile(&raw const (*ring).head) != std::ptr::read_volatile(&raw const (*ring).tail) }
    }

    /// Moves up to `out.len()` completed events into `out`; returns how
    /// many. Without a wait (`timeout_ns` None) they are read from the ring
    /// in user space where it can be, with no system call; a wait (for at
    /// least `min` events, up to `timeout_ns`) is an `io_getevents`.
    ///
    /// # Safety
    ///
    /// No other thread takes events from this context while this runs (the
    /// head is moved in user space, outside the kernel's lock).
    unsafe fn take_events(&self, out: &mut [IoEvent], min: usize, timeout_ns: Option<u64>) -> Result<usize> {
        if self.user_ring && timeout_ns.is_none() {
            // SAFETY: forwarded from the caller's contract.
            return Ok(unsafe { self.read_ring(out) });
        }
        let ns = timeout_ns.unwrap_or(0);
        let ts = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: the kernel writes at most `out.len()` events into `out`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                self.ctx,
                min as libc::c_long,
                out.len() as libc::c_long,
                out.as_mut_ptr(),
                &ts as *const libc::timespec,
            )
        };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EINTR) => Ok(0),
                _ => Err(os_err("io_getevents", err)),
            };
        }
        Ok(r as usize)
    }

    /// The user-space half of [`Context::take_events`].
    ///
    /// # Safety
    ///
    /// As for `take_events`.
    unsafe fn read_ring(&self, out: &mut [IoEvent]) -> usize {
        let ring = self.ctx as *mut AioRing;
        // SAFETY: the ring is mapped for the context's life; the kernel writes an
        // event before it publishes the tail past it (smp_wmb), and reads the head
        // under its lock when it needs room, so the head is ours to move.
        unsafe {
            let nr = std::ptr::read_volatile(&raw const (*ring).nr);
            let mut head = std::ptr::read_volatile(&raw const (*ring).head);
            let tail = std::ptr::read_volatile(&raw const (*ring).tail);
            if head == tail {
                return 0;
            }
            fence(Ordering::Acquire);
            let events = (ring as *const u8).add(std::mem::size_of::<AioRing>()).cast::<IoEvent>();
            let mut seen = 0;
            while head != tail && head < nr && seen < out.len() {
                out[seen] = std::ptr::read_volatile(events.add(head as usize));
                head = (head + 1) % nr;
                seen += 1;
            }
            fence(Ordering::Release);
            std::ptr::write_volatile(&raw mut (*ring).head, head);
            seen
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // io_destroy waits for what the kernel still has (their buffers must not be
        // freed under it) and unmaps the ring. In a forked child, which has no such
        // context, it fails and does nothing.
        // SAFETY: the context is ours and used by nothing else from here on.
        unsafe { libc::syscall(libc::SYS_io_destroy, self.ctx) };
    }
}

/// Linux AIO on a file that many threads use at once through one context:
/// any of them sends a batch of requests (everyone's, gathered by the
/// caller), and any of them takes the completions from the ring and hands
/// each to its owner by the word it was sent with. The `auto` dispatch's
/// queue for a crowd of blocked threads ([`Device::shared_aio`]); only
/// reads and plain writes.
pub struct SharedAio {
    target: Target,
    context: Context,
    /// Held by the thread taking events (reading the ring, or asleep in
    /// `io_getevents`): one at a time moves the ring's head.
    reaping: std::sync::Mutex<()>,
    /// Requests the kernel has and has not answered.
    in_kernel: std::sync::atomic::AtomicUsize,
    counters: Counters,
}

impl SharedAio {
    /// A context on `target` (already open, O_DIRECT; another backend's,
    /// duplicated).
    pub fn on(target: Target) -> Result<SharedAio> {
        let context = Context::setup(SHARED_EVENTS, &target.path)?;
        Ok(SharedAio {
            target,
            context,
            reaping: std::sync::Mutex::new(()),
            in_kernel: std::sync::atomic::AtomicUsize::new(0),
            counters: Counters::default(),
        })
    }

    /// A read (`write` false) or plain write of `len` bytes at `offset` from
    /// or into `buf`, whose event will carry `word`.
    pub fn request(&self, write: bool, offset: u64, buf: *mut u8, len: u32, word: u64) -> Iocb {
        let segment = super::Segment { offset, buf, len, result: 0 };
        let opcode = if write { IOCB_CMD_PWRITE } else { IOCB_CMD_PREAD };
        iocb(self.target.file.as_raw_fd(), word, opcode, 0, Some(&segment))
    }

    /// One `io_submit` of the first requests of `requests` (at most 128):
    /// how many the kernel took, or the errno of the first it refused
    /// (`EAGAIN`: no room until events are taken). Counted as one command.
    ///
    /// # Safety
    ///
    /// Each request's buffer stays valid, and untouched by anyone else,
    /// until its event has been handed to its owner.
    pub unsafe fn submit(&self, requests: &[Iocb]) -> std::result::Result<usize, i32> {
        // SAFETY: forwarded from the caller's contract.
        let n = unsafe { self.context.submit(requests) }?;
        self.in_kernel.fetch_add(n, Ordering::Relaxed);
        self.counters.record_batch(n as u64, requests[..n].iter().map(|r| r.nbytes).sum());
        Ok(n)
    }

    /// Requests sent and not yet taken back.
    pub fn in_kernel(&self) -> usize {
        self.in_kernel.load(Ordering::Relaxed)
    }

    /// Takes the events the ring holds, without waiting, and calls
    /// `done(word, result)` for each (result: bytes or -errno); returns how
    /// many. Returns 0 at once when another thread is taking them.
    pub fn reap(&self, done: impl FnMut(u64, i64)) -> usize {
        if self.in_kernel() == 0 || !self.context.has_events() {
            return 0;
        }
        let Ok(_reaping) = self.reaping.try_lock() else { return 0 };
        self.take(None, done).unwrap_or(0)
    }

    /// Sleeps in the kernel until an event arrives or `timeout_ns` passes,
    /// then hands over the events as [`SharedAio::reap`] does. None, at
    /// once, when another thread is taking events (it hands over those that
    /// arrive meanwhile).
    pub fn sleep(&self, timeout_ns: u64, done: impl FnMut(u64, i64)) -> Option<usize> {
        let _reaping = self.reaping.try_lock().ok()?;
        Some(self.take(Some(timeout_ns), done).unwrap_or(0))
    }

    fn take(&self, timeout_ns: Option<u64>, mut done: impl FnMut(u64, i64)) -> Result<usize> {
        let mut events = [IoEvent::default(); 64];
        let mut seen = 0;
        loop {
            let min = usize::from(timeout_ns.is_some() && seen == 0);
            // SAFETY: `reaping` is held by the caller.
            let n = unsafe { self.context.take_events(&mut events, min, timeout_ns.filter(|_| seen == 0)) }?;
            self.in_kernel.fetch_sub(n, Ordering::Relaxed);
            for event in &events[..n] {
                done(event.data, event.res);
            }
            seen += n;
            if n < events.len() {
                return Ok(seen);
            }
        }
    }

    /// Counters of what was sent.
    pub fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

/// One command in flight.
struct Slot {
    command: Option<Command>,
    /// Events still to come.
    remaining: usize,
}

struct AioQueue {
    shared: Arc<Shared>,
    context: Context,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
    /// Trims done inside `submit`, and commands whose last event arrived.
    finished: Finished,
    /// Requests not yet taken by the kernel, oldest first.
    unsent: Vec<Iocb>,
    /// Requests the kernel has and has not answered.
    in_kernel: usize,
    /// Commands submitted and not yet handed back.
    in_flight: usize,
}

/// An event's `data`: the command's slot and the request's segment.
fn request_data(slot: usize, seg: u64) -> u64 {
    ((slot as u64) << SEG_BITS) | seg
}

/// The `iocb` of one request on `fd`, moving `segment`'s bytes (none for a flush).
fn iocb(fd: libc::c_int, data: u64, opcode: u16, rw_flags: i32, segment: Option<&super::Segment>) -> Iocb {
    Iocb {
        data,
        lio_opcode: opcode,
        rw_flags,
        fildes: fd as u32,
        buf: segment.map_or(0, |g| g.buf as u64),
        nbytes: segment.map_or(0, |g| u64::from(g.len)),
        offset: segment.map_or(0, |g| g.offset as i64),
        ..Iocb::default()
    }
}

/// Requests one `io_submit` carries at most (its pointer array is on the stack).
const SUBMIT_CHUNK: usize = 128;

fn os_err(context: &str, source: std::io::Error) -> Error {
    Error::Os { context: context.to_string(), source }
}

impl AioQueue {
    fn new(shared: Arc<Shared>, config: &QueueConfig) -> Result<AioQueue> {
        let depth = config.depth.max(1) as usize;
        let events = config.depth.max(1).saturating_mul(EVENTS_PER_COMMAND);
        let context = Context::setup(events, &shared.target.path)?;
        Ok(AioQueue {
            shared,
            context,
            slots: (0..depth).map(|_| Slot { command: None, remaining: 0 }).collect(),
            free_slots: (0..depth).rev().collect(),
            finished: Finished::with_capacity(depth),
            unsent: Vec::with_capacity(depth),
            in_kernel: 0,
            in_flight: 0,
        })
    }

    /// Queues the data requests of the command in `slot` (an `Ordered`
    /// write's after its flush).
    fn queue_data(&mut self, slot: usize) {
        let AioQueue { shared, slots, unsent, .. } = self;
        let command = slots[slot].command.as_ref().expect("a command to send");
        let (opcode, rw_flags) = match (command.op, command.durability) {
            (Op::Read, _) => (IOCB_CMD_PREAD, 0),
            (_, Durability::Cached) => (IOCB_CMD_PWRITE, 0),
            _ => (IOCB_CMD_PWRITE, libc::RWF_DSYNC),
        };
        let fd = shared.target.file.as_raw_fd();
        for (i, g) in command.segments.iter().enumerate() {
            unsent.push(iocb(fd, request_data(slot, i as u64), opcode, rw_flags, Some(g)));
        }
    }

    /// Hands the queued requests to the kernel, as many as its context has
    /// room for; one the kernel refuses fails its segment.
    fn send(&mut self) {
        let mut from = 0;
        while from < self.unsent.len() {
            // SAFETY: their buffers belong to commands held in `slots` until their
            // events arrive.
            match unsafe { self.context.submit(&self.unsent[from..]) } {
                Ok(n) => {
                    from += n;
                    self.in_kernel += n;
                }
                // The context is full: the rest waits for room (what is in the kernel
                // makes it). With nothing there, the context is too small for one
                // request: fail it rather than wait for ever.
                Err(libc::EAGAIN) if self.in_kernel > 0 => break,
                Err(errno) => {
                    let data = self.unsent[from].data;
                    from += 1;
                    self.complete(data, -errno);
                }
            }
        }
        self.unsent.drain(..from);
    }

    /// Records the result of one request; a command is finished when its
    /// last is (an `Ordered` write's flush sends its writes).
    fn complete(&mut self, data: u64, result: i32) {
        let slot = (data >> SEG_BITS) as usize;
        let seg = data & FLUSH_SEG;
        let s = &mut self.slots[slot];
        let command = s.command.as_mut().expect("an event for a free slot");
        if command.op == Op::Flush || seg == FLUSH_SEG {
            command.result = result.min(0);
        } else {
            command.segments[seg as usize].result = result;
        }
        debug_assert!(s.remaining > 0, "an event for a finished command");
        s.remaining -= 1;
        if seg == FLUSH_SEG && command.op == Op::Write {
            if result < 0 {
                // Its data is never written: the flush's error is each segment's.
                command.fail_all(-result);
                s.remaining = 0;
            } else {
                self.queue_data(slot);
                return;
            }
        }
        if s.remaining == 0 {
            let command = s.command.take().expect("checked above");
            self.free_slots.push(slot);
            self.finished.push(command);
        }
    }

    /// Moves the ring's events into their commands without a system call
    /// (`io_getevents` with no wait where the ring cannot be read here);
    /// returns how many there were.
    fn drain(&mut self) -> usize {
        if self.in_kernel == 0 {
            return 0;
        }
        let mut events = [IoEvent::default(); 64];
        let mut seen = 0;
        loop {
            // SAFETY: this queue is the context's only user.
            let n = match unsafe { self.context.take_events(&mut events, 0, None) } {
                Ok(n) => n,
                Err(_) => return seen,
            };
            for event in &events[..n] {
                self.in_kernel -= 1;
                self.complete(event.data, event.res as i32);
            }
            seen += n;
            if n < events.len() {
                return seen;
            }
        }
    }

    /// `io_getevents` for at least `min` events, sleeping up to `timeout_ns`;
    /// returns how many came.
    fn get_events(&mut self, min: usize, timeout_ns: u64) -> Result<usize> {
        let mut events = [IoEvent::default(); 64];
        // SAFETY: this queue is the context's only user.
        let n = unsafe { self.context.take_events(&mut events, min, Some(timeout_ns)) }?;
        for event in &events[..n] {
            self.in_kernel -= 1;
            self.complete(event.data, event.res as i32);
        }
        Ok(n)
    }

    /// Hands back what finished, sending what waited for room first.
    fn collect(&mut self, out: &mut Vec<Command>) -> usize {
        if !self.unsent.is_empty() {
            self.send();
        }
        let n = self.finished.reap(out);
        self.in_flight -= n;
        n
    }
}

impl Queue for AioQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        let Some(slot) = self.free_slots.pop() else {
            // More in flight than the queue was opened for: a caller bug, handed back failed.
            command.fail_all(libc::EBUSY);
            self.in_flight += 1;
            self.finished.push(command);
            return;
        };
        self.shared.counters.record(&command);
        self.in_flight += 1;
        if command.op == Op::Trim {
            // AIO has no discard: punched here, handed back by the next look.
            // SAFETY: a trim has no buffers.
            unsafe { super::psync::run_command(&self.shared.target.file, &mut command) };
            self.free_slots.push(slot);
            self.finished.push(command);
            return;
        }
        let flush = command.op == Op::Flush;
        let ordered = command.op == Op::Write && command.durability == Durability::Ordered;
        let requests = if flush { 1 } else { command.segments.len() + usize::from(ordered) };
        self.slots[slot] = Slot { command: Some(command), remaining: requests };
        if flush || ordered {
            // A flush, or an ordered write's leading one (its data follows on completion).
            let seg = if ordered { FLUSH_SEG } else { 0 };
            let fd = self.shared.target.file.as_raw_fd();
            self.unsent.push(iocb(fd, request_data(slot, seg), IOCB_CMD_FDSYNC, 0, None));
        } else {
            self.queue_data(slot);
        }
    }

    fn commit(&mut self) -> Result<()> {
        self.send();
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        self.drain();
        Ok(self.collect(out))
    }

    fn wait(&mut self, out: &mut Vec<Command>, timeout_ns: u64) -> Result<usize> {
        self.drain();
        if self.finished.is_empty() && self.in_kernel > 0 {
            self.get_events(1, timeout_ns)?;
        }
        Ok(self.collect(out))
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    unsafe fn run_blocking(&mut self, command: &mut Command) -> bool {
        self.shared.counters.record(command);
        // SAFETY: forwarded from the caller's contract.
        unsafe { super::psync::run_command(&self.shared.target.file, command) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::IoBuf;
    use crate::device::DeviceSpec;

    fn device(dir: &tempfile::TempDir) -> Arc<dyn Device> {
        let path = dir.path().join("aio.img");
        DeviceSpec::parse(&format!("aio:{}", path.display()), Some(1 << 20)).unwrap().open().unwrap()
    }

    fn command(op: Op, tag: u64, segments: &mut [(u64, &mut IoBuf)]) -> Command {
        let mut c = Command::with_capacity(segments.len());
        c.reset(op, tag);
        for (offset, buf) in segments.iter_mut() {
            c.segments.push(crate::device::Segment {
                offset: *offset,
                buf: buf.as_mut_ptr(),
                len: buf.len() as u32,
                result: 0,
            });
        }
        c
    }

    fn run(q: &mut dyn Queue, cmd: Command) -> Command {
        // SAFETY: the buffers outlive the command, which comes back below.
        unsafe { q.submit(cmd) };
        q.commit().unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            q.wait(&mut out, 1_000_000_000).unwrap();
        }
        assert_eq!(q.in_flight(), 0);
        out.pop().unwrap()
    }

    #[test]
    fn writes_and_reads_come_back_through_the_user_space_ring() {
        let dir = tempfile::tempdir().unwrap();
        let dev = device(&dir);
        let mut q = dev.open_queue(&QueueConfig::depth(8)).unwrap();
        let (mut a, mut b) = (IoBuf::new(4096), IoBuf::new(8192));
        a.fill(0xa5);
        b.fill(0x5a);
        let done = run(&mut *q, command(Op::Write, 7, &mut [(0, &mut a), (65536, &mut b)]));
        assert_eq!(done.tag, 7);
        assert_eq!(done.segments.iter().map(|g| g.result).collect::<Vec<_>>(), [4096, 8192]);
        let (mut ra, mut rb) = (IoBuf::new(4096), IoBuf::new(8192));
        // SAFETY: the buffers outlive the command.
        unsafe { q.submit(command(Op::Read, 8, &mut [(0, &mut ra), (65536, &mut rb)])) };
        q.commit().unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            q.reap(&mut out).unwrap();
        }
        assert_eq!(out[0].segments.iter().map(|g| g.result).collect::<Vec<_>>(), [4096, 8192]);
        assert!(ra.iter().all(|&x| x == 0xa5) && rb.iter().all(|&x| x == 0x5a));
    }

    #[test]
    fn flushes_durable_and_ordered_writes_and_trims_complete() {
        let dir = tempfile::tempdir().unwrap();
        let dev = device(&dir);
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut flush = Command::with_capacity(0);
        flush.reset(Op::Flush, 1);
        assert_eq!(run(&mut *q, flush).result, 0);
        for durability in [Durability::Fua, Durability::Ordered] {
            let mut a = IoBuf::new(4096);
            a.fill(3);
            let mut w = command(Op::Write, 2, &mut [(4096, &mut a)]);
            w.durability = durability;
            let done = run(&mut *q, w);
            assert_eq!((done.result, done.segments[0].result), (0, 4096), "{durability:?}");
        }
        let mut trim = Command::with_capacity(1);
        trim.reset(Op::Trim, 3);
        trim.segments.push(crate::device::Segment { offset: 4096, buf: std::ptr::null_mut(), len: 4096, result: 0 });
        assert_eq!(run(&mut *q, trim).segments[0].result, 0);
        let mut r = IoBuf::new(4096);
        run(&mut *q, command(Op::Read, 4, &mut [(4096, &mut r)]));
        assert!(r.iter().all(|&x| x == 0), "the trimmed range reads back as zeros");
    }

    #[test]
    fn a_request_the_kernel_refuses_fails_its_command_and_the_rest_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let dev = device(&dir);
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let (mut good, mut bad) = (IoBuf::new(4096), IoBuf::new(4096));
        // A misaligned length for O_DIRECT: the kernel answers EINVAL.
        let mut c = command(Op::Read, 5, &mut [(0, &mut good), (8192, &mut bad)]);
        c.segments[1].len = 100;
        let done = run(&mut *q, c);
        assert_eq!(done.segments[0].result, 4096);
        assert_eq!(done.segments[1].result, -libc::EINVAL);
        // Past the end: nothing read.
        let mut past = IoBuf::new(4096);
        let done = run(&mut *q, command(Op::Read, 6, &mut [(1 << 30, &mut past)]));
        assert_eq!(done.segments[0].result, 0);
    }

    #[test]
    fn many_commands_more_requests_than_the_context_holds_all_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let dev = device(&dir);
        let depth = 64;
        let mut q = dev.open_queue(&QueueConfig::depth(depth)).unwrap();
        // 64 commands of 16 segments: 1024 requests for a context of 256 events.
        let mut bufs: Vec<IoBuf> = (0..depth * 16).map(|_| IoBuf::new(512)).collect();
        let mut chunks = bufs.chunks_mut(16);
        for tag in 0..u64::from(depth) {
            let chunk = chunks.next().unwrap();
            let mut segs: Vec<(u64, &mut IoBuf)> =
                chunk.iter_mut().enumerate().map(|(i, b)| ((tag * 16 + i as u64) * 512, b)).collect();
            // SAFETY: the buffers outlive the commands, which all come back below.
            unsafe { q.submit(command(Op::Read, tag, &mut segs)) };
        }
        q.commit().unwrap();
        let mut out = Vec::new();
        let deadline = crate::clock::now_ns() + 10_000_000_000;
        while out.len() < depth as usize && crate::clock::now_ns() < deadline {
            q.wait(&mut out, 100_000_000).unwrap();
        }
        assert_eq!(out.len(), depth as usize);
        assert!(out.iter().all(|c| c.segments.iter().all(|g| g.result == 512)));
        assert_eq!(q.in_flight(), 0);
    }
}
