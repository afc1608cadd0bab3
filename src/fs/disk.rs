//! The file layer's view of the device: whole 4 KiB blocks through an
//! [`Engine`], so every read, write and flush takes the path (dispatch x
//! completion) the engine was opened with: sixteen threads' file writes are
//! merged by `stm` exactly like raw block requests.

use super::carry::CarriedCache;
use super::format::{BLOCK, BLOCK_U64};
use crate::IoBuf;
use crate::device::{Durability, Op};
use crate::engine::{Engine, Handle, HandleOptions, ThreadHandles};
use crate::error::Result;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, OnceLock};

/// Requests one thread keeps in flight at most in a [`Batch`].
pub const BATCH_DEPTH: u32 = 64;

thread_local! {
    /// Each thread's queued handle per engine, lent to one [`Batch`] at a time.
    static QUEUES: RefCell<ThreadHandles> = const { RefCell::new(ThreadHandles::new()) };
}

/// Block I/O for the file layer.
///
/// **Flushes that would find nothing new are not sent.** A flush makes
/// durable every write that completed before it was sent. The disk counts
/// write requests as they are sent and as they come back; a flush sent
/// while every write sent so far was back vouches for all of them once it
/// completes, and a flush asked for when no write was sent since such a
/// flush is skipped. `fsync` of a file with nothing pending asks for a
/// flush only (its data may sit in the device's cache): `sysbench fileio`
/// fsyncs all 16 of its files after each write, and each of those flushes
/// went to an io_uring worker thread (a cross-CPU wake-up, ~20 us here)
/// while 15 of them had nothing to make durable. A write whose completion
/// is not seen (a batch that could not be waited out) keeps every later
/// flush real: the count errs toward flushing.
pub struct Disk {
    engine: Arc<Engine>,
    /// Largest request, a whole number of blocks.
    max_io: usize,
    /// The device models each command's service time (an emulated device);
    /// otherwise every command takes the kernel's path.
    modeled: bool,
    /// Blocks on the device.
    blocks: u64,
    counters: Arc<DiskCounters>,
    /// Writes sent, back and made durable (shared with the journal's [`Sent`] queue).
    tally: Arc<WriteTally>,
    /// The carried cache, once the mount has checked it ([`super::carry`]):
    /// reads it holds come from it, and every write drops what it covers.
    carry: OnceLock<Arc<CarriedCache>>,
}

/// Write requests counted for [`Disk::flush`]: whether a flush has anything to do.
#[derive(Debug, Default)]
struct WriteTally {
    /// Write requests sent, counted before each is sent.
    sent: AtomicU64,
    /// Write requests back (done or failed), counted after each.
    back: AtomicU64,
    /// Every write among the first this many sent is durable: a flush sent
    /// when that many were sent and all were back has completed.
    durable: AtomicU64,
}

impl WriteTally {
    /// A write request is about to be sent: how many were sent before it.
    fn sending(&self) -> u64 {
        self.sent.fetch_add(1, SeqCst)
    }

    /// `n` write requests came back.
    fn came_back(&self, n: u64) {
        self.back.fetch_add(n, SeqCst);
    }

    /// How many writes a flush sent now would vouch for: all sent so far,
    /// if all are back (`None` while some are in flight).
    fn flush_covers(&self) -> Option<u64> {
        // Back first: a write sent between the two loads makes them differ.
        let back = self.back.load(SeqCst);
        (self.sent.load(SeqCst) == back).then_some(back)
    }

    /// A flush (or a durable write) that started when [`WriteTally::flush_covers`]
    /// said `covers` completed.
    fn flushed(&self, covers: Option<u64>) {
        if let Some(n) = covers {
            self.durable.fetch_max(n, SeqCst);
        }
    }

    /// Every write sent so far is durable.
    fn all_durable(&self) -> bool {
        self.durable.load(SeqCst) == self.sent.load(SeqCst)
    }
}

/// What the file layer asked of the device.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Read requests.
    pub reads: AtomicU64,
    /// Write requests.
    pub writes: AtomicU64,
    /// Flushes.
    pub flushes: AtomicU64,
    /// Flushes asked for and not sent: no write was sent since a flush that
    /// covered every write before it (see [`Disk`]).
    pub flushes_skipped: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub written_bytes: AtomicU64,
}

impl DiskCounters {
    fn count(&self, op: Op, bytes: usize) {
        let (n, b) = if op == Op::Read { (&self.reads, &self.read_bytes) } else { (&self.writes, &self.written_bytes) };
        n.fetch_add(1, Relaxed);
        b.fetch_add(bytes as u64, Relaxed);
    }
}

impl Disk {
    /// The device behind `engine`, used in 4 KiB blocks.
    pub fn new(engine: Arc<Engine>) -> Disk {
        let caps = engine.device().capabilities();
        let max_io = (caps.max_segment_bytes as usize / BLOCK).max(1) * BLOCK;
        let blocks = engine.device().size() / BLOCK_U64;
        Disk {
            engine,
            max_io,
            modeled: caps.timed,
            blocks,
            counters: Arc::default(),
            tally: Arc::default(),
            carry: OnceLock::new(),
        }
    }

    /// Whether the device models each command's service time (an emulated
    /// device) rather than taking the kernel's path for each (a loop device,
    /// an NVMe drive through io_uring).
    pub fn modeled(&self) -> bool {
        self.modeled
    }

    /// Most blocks one request carries (a larger one is sent as several).
    pub fn max_io_blocks(&self) -> usize {
        self.max_io / BLOCK
    }

    /// Blocks on the device.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The engine the blocks go through.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Counters so far.
    pub fn counters(&self) -> &DiskCounters {
        &self.counters
    }

    /// Reads from `carry` what it holds from now on, and drops from it what
    /// is written (the mount checked it vouches for the device as it is).
    pub fn attach_carry(&self, carry: Arc<CarriedCache>) {
        let _ = self.carry.set(carry);
    }

    /// The carried cache, if one is attached.
    pub fn carry(&self) -> Option<&Arc<CarriedCache>> {
        self.carry.get()
    }

    /// Copies `[block, block + len / 4096)` from the carried cache if it holds all of it.
    fn carried(&self, block: u64, buf: &mut [u8]) -> bool {
        self.carry.get().is_some_and(|c| c.read(block, buf))
    }

    /// Whether the carried cache holds `block` (a read of it needs no device).
    pub fn carries(&self, block: u64) -> bool {
        self.carry.get().is_some_and(|c| c.holds(block))
    }

    /// Block `block` from the carried cache as a page frame of its own, without a copy.
    pub fn lend_carried(&self, block: u64) -> Option<IoBuf> {
        self.carry.get().and_then(|c| c.lend(block))
    }

    /// Gives back a block [`Disk::lend_carried`] lent, to be lent again
    /// ([`CarriedCache::take_back`]); returns it if it was not one.
    ///
    /// # Safety
    /// As [`CarriedCache::take_back`]: never written since it was lent, not used after.
    pub unsafe fn take_back_lent(&self, buf: IoBuf) -> Option<IoBuf> {
        match self.carry.get() {
            // SAFETY: passed on from the caller.
            Some(c) => unsafe { c.take_back(buf) },
            None => Some(buf),
        }
    }

    /// A reader of this device's blocks for a part of the file system that
    /// reads on its own, later (the lazily read bitmap: [`super::alloc`]):
    /// from the carried cache attached now where it holds them, else from
    /// the device, counted with this disk's reads. For blocks this mount
    /// never writes before it reads them.
    pub fn reader(&self) -> BlockReader {
        BlockReader {
            engine: Arc::clone(&self.engine),
            carry: self.carry.get().cloned(),
            counters: Arc::clone(&self.counters),
            max_io: self.max_io,
        }
    }

    /// Blocks `[block, ..)` covering `len` bytes are about to be written.
    fn writing(&self, block: u64, len: usize) {
        if let Some(c) = self.carry.get() {
            c.forget(block, len.div_ceil(BLOCK) as u64);
        }
    }

    /// Reads `buf.len() / 4096` blocks from `block` (buf aligned, as an [`IoBuf`] is).
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        read_blocks(&self.engine, self.carry.get().map(|c| &**c), &self.counters, self.max_io, block, buf)
    }

    /// Writes `buf` (whole blocks, aligned) at `block`.
    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        self.write_sectors(block, 0, buf)
    }

    /// Writes `buf` at byte `offset` of `block`, on into the blocks after it:
    /// part of a block in the device's own sectors, its other bytes left as
    /// they are (`buf`'s address, `offset` and its length aligned as the
    /// device asks).
    pub fn write_sectors(&self, block: u64, offset: usize, buf: &[u8]) -> Result<()> {
        self.writing(block, offset + buf.len());
        for (i, chunk) in buf.chunks(self.max_io).enumerate() {
            let at = (block * BLOCK_U64) + (offset + i * self.max_io) as u64;
            self.tally.sending();
            let written = self.engine.write_at(chunk, at);
            self.tally.came_back(1);
            written?;
            self.counters.count(Op::Write, chunk.len());
        }
        Ok(())
    }

    /// Writes `buf` (at most one request) at `block` as one durable command:
    /// everything written before is made durable first, and `buf` is durable
    /// when this returns (a flush and a FUA write; see
    /// [`Durability::Ordered`]).
    pub fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        debug_assert!(buf.len() <= self.max_io, "a durable write is one request");
        self.writing(block, buf.len());
        let covers = self.tally.flush_covers();
        let before = self.tally.sending();
        let written = self.engine.write_durable_at(buf, block * BLOCK_U64);
        self.tally.came_back(1);
        written?;
        // Durable itself: with every write before it, if none was sent in between.
        self.tally.flushed(if covers == Some(before) { Some(before + 1) } else { covers });
        self.counters.flushes.fetch_add(1, Relaxed);
        self.counters.count(Op::Write, buf.len());
        Ok(())
    }

    /// Writes the superblock image `buf` that stamps the carried cache (see
    /// [`super::carry`]): the one write that does not set it aside.
    pub fn write_stamp(&self, buf: &[u8]) -> Result<()> {
        debug_assert_eq!(buf.len(), BLOCK);
        self.tally.sending();
        let written = self.engine.write_at(buf, 0);
        self.tally.came_back(1);
        written?;
        self.counters.count(Op::Write, buf.len());
        Ok(())
    }

    /// Reads one block into a new buffer.
    pub fn read_block(&self, block: u64) -> Result<IoBuf> {
        let mut buf = IoBuf::new(BLOCK);
        self.read(block, &mut buf)?;
        Ok(buf)
    }

    /// Write requests sent so far (counted as each is sent).
    pub fn writes_sent(&self) -> u64 {
        self.tally.sent.load(SeqCst)
    }

    /// Makes the first `sent` writes durable (all completed): nothing if a
    /// flush since covered them, else [`Disk::flush`].
    pub fn flush_through(&self, sent: u64) -> Result<()> {
        if self.tally.durable.load(SeqCst) >= sent {
            self.counters.flushes_skipped.fetch_add(1, Relaxed);
            return Ok(());
        }
        self.flush()
    }

    /// Makes every completed write durable: a flush, unless no write was
    /// sent since one that covered them all (see [`Disk`]).
    pub fn flush(&self) -> Result<()> {
        if self.tally.all_durable() {
            self.counters.flushes_skipped.fetch_add(1, Relaxed);
            return Ok(());
        }
        let covers = self.tally.flush_covers();
        self.counters.flushes.fetch_add(1, Relaxed);
        self.engine.flush()?;
        self.tally.flushed(covers);
        Ok(())
    }
}

/// Reads a device's blocks, counted with its [`Disk`]'s reads ([`Disk::reader`]).
pub struct BlockReader {
    engine: Arc<Engine>,
    carry: Option<Arc<CarriedCache>>,
    counters: Arc<DiskCounters>,
    max_io: usize,
}

impl BlockReader {
    /// Reads `buf.len() / 4096` blocks from `block` (buf aligned, as an [`IoBuf`] is).
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        read_blocks(&self.engine, self.carry.as_deref(), &self.counters, self.max_io, block, buf)
    }
}

/// [`Disk::read`] and [`BlockReader::read`]: from `carry` if it holds all of
/// `[block, ..)`, else from the device in requests of at most `max_io` bytes,
/// each counted in `counters`.
fn read_blocks(
    engine: &Engine,
    carry: Option<&CarriedCache>,
    counters: &DiskCounters,
    max_io: usize,
    block: u64,
    buf: &mut [u8],
) -> Result<()> {
    debug_assert_eq!(buf.len() % BLOCK, 0);
    if carry.is_some_and(|c| c.read(block, buf)) {
        return Ok(());
    }
    for (i, chunk) in buf.chunks_mut(max_io).enumerate() {
        engine.read_at(chunk, block * BLOCK_U64 + (i * max_io) as u64)?;
        counters.count(Op::Read, chunk.len());
    }
    Ok(())
}

impl Disk {
    /// Starts a batch: requests sent together and waited for together, from this thread.
    pub fn batch(&self) -> Result<Batch<'_>> {
        let lent = QUEUES.with(|q| q.borrow_mut().take(&self.engine));
        let handle = match lent {
            Some(h) => h,
            None => self.engine.handle(HandleOptions { depth: BATCH_DEPTH, buffers: 0, buffer_size: 0 })?,
        };
        Ok(Batch {
            disk: self,
            handle: Some(handle),
            in_flight: 0,
            writes: 0,
            completed: Vec::new(),
            buffers: PhantomData,
        })
    }
}

/// Reads and writes in flight together (the engine's queued API): a thread
/// sends many, does other work while the device works, then waits for all.
/// Buffers are borrowed until the batch is waited for or dropped (dropping
/// waits too).
pub struct Batch<'a> {
    disk: &'a Disk,
    handle: Option<Handle>,
    in_flight: usize,
    /// Write requests among those in flight (counted back when all are).
    writes: u64,
    /// Reaped and not yet handed to the waiter: (tag, result).
    completed: Vec<(u64, Result<()>)>,
    buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Batch<'a> {
    fn handle(&mut self) -> &mut Handle {
        self.handle.as_mut().expect("a batch holds its handle until dropped")
    }

    /// Makes room for one more request by reaping at least one if the queue is
    /// full (sending what is queued first: a request not sent never completes).
    fn room(&mut self) -> Result<()> {
        if self.handle().queued() >= BATCH_DEPTH {
            self.send()?;
            self.reap(1)?;
        }
        Ok(())
    }

    fn reap(&mut self, min: usize) -> Result<()> {
        let mut done = Vec::new();
        let n = self.handle().reap(min, &mut done)?;
        self.in_flight -= n;
        if self.in_flight == 0 && self.writes > 0 {
            // Completions carry no kind: the writes count as back when all requests are.
            self.disk.tally.came_back(std::mem::take(&mut self.writes));
        }
        self.completed.extend(done.into_iter().map(|d| (d.tag, d.result)));
        Ok(())
    }

    /// # Safety
    /// As [`Handle::submit_raw`]: `buf` valid and untouched for `len` bytes until waited for.
    unsafe fn submit(&mut self, op: Op, block: u64, buf: *mut u8, len: usize, tag: u64) -> Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.submit_with(op, block, buf, len, tag, Durability::Cached) }
    }

    /// # Safety
    /// As [`Batch::submit`].
    unsafe fn submit_with(
        &mut self,
        op: Op,
        block: u64,
        buf: *mut u8,
        len: usize,
        tag: u64,
        durability: Durability,
    ) -> Result<()> {
        if op == Op::Write {
            self.disk.writing(block, len);
        } else if self.carrying() {
            // SAFETY: the caller's promise: `buf` is valid for `len` bytes and nothing else uses it.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
            if self.disk.carried(block, dst) {
                // Done without the device: handed back with the batch's next completions.
                self.completed.push((tag, Ok(())));
                return Ok(());
            }
        }
        let max_io = self.disk.max_io;
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(max_io);
            self.room()?;
            let at = block * BLOCK_U64 + done as u64;
            if op == Op::Write {
                self.disk.tally.sending();
            }
            // SAFETY: the caller's promise covers every chunk of `buf`.
            let sent = unsafe { self.handle().submit_raw_with(op, buf.add(done), chunk, at, tag, durability) };
            match (op, &sent) {
                (Op::Write, Ok(())) => self.writes += 1,
                (Op::Write, Err(_)) => self.disk.tally.came_back(1), // never sent
                _ => {}
            }
            sent?;
            self.in_flight += 1;
            self.disk.counters.count(op, chunk);
            done += chunk;
        }
        Ok(())
    }

    /// Queues a write of `buf` (whole blocks, aligned) at `block`.
    pub fn write(&mut self, block: u64, buf: &'a [u8]) -> Result<()> {
        self.write_tagged(block, buf, 0)
    }

    /// Queues a write of `buf` (whole blocks, aligned) at `block` whose
    /// completion carries `tag` ([`Batch::wait_each`]).
    pub fn write_tagged(&mut self, block: u64, buf: &'a [u8], tag: u64) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        // SAFETY: `buf` is borrowed for 'a, which outlives the batch's waiting for it.
        unsafe { self.submit(Op::Write, block, buf.as_ptr().cast_mut(), buf.len(), tag) }
    }

    /// Queues a write of `buf` at `block` that is durable when it completes
    /// (forced unit access: [`Durability::Fua`]); says nothing of other writes.
    pub fn write_fua(&mut self, block: u64, buf: &'a [u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        // SAFETY: `buf` is borrowed for 'a, which outlives the batch's waiting for it.
        unsafe { self.submit_with(Op::Write, block, buf.as_ptr().cast_mut(), buf.len(), 0, Durability::Fua) }
    }

    /// Queues a read into `buf` (whole blocks, aligned) from `block`.
    pub fn read(&mut self, block: u64, buf: &'a mut [u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        // SAFETY: `buf` is borrowed mutably for 'a, which outlives the batch's waiting for it.
        unsafe { self.submit(Op::Read, block, buf.as_mut_ptr(), buf.len(), 0) }
    }

    /// Queues a read into memory the caller owns; its completion carries `tag`
    /// ([`Batch::wait_each`]).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes (whole blocks, aligned), and nothing may read or
    /// write it until its completion is handed back or the batch is dropped.
    pub unsafe fn read_raw(&mut self, block: u64, buf: *mut u8, len: usize, tag: u64) -> Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.submit(Op::Read, block, buf, len, tag) }
    }

    /// Most blocks one request of the batch carries (a larger one is sent as several).
    pub fn max_io_blocks(&self) -> usize {
        self.disk.max_io_blocks()
    }

    /// Whether a carried cache is attached (that holds anything).
    pub fn carrying(&self) -> bool {
        self.disk.carry.get().is_some_and(|c| c.holds_any())
    }

    /// [`Disk::lend_carried`], for a reader holding a batch.
    pub fn lend_carried(&self, block: u64) -> Option<IoBuf> {
        self.disk.lend_carried(block)
    }

    /// Sends what is queued to the device.
    pub fn send(&mut self) -> Result<()> {
        self.handle().commit()
    }

    /// Sends what is queued and hands each completion that is already back
    /// (tag, result) to `each`, without waiting.
    pub fn take_done(&mut self, mut each: impl FnMut(u64, Result<()>)) -> Result<()> {
        self.send()?;
        if self.in_flight > 0 {
            self.reap(0)?;
        }
        for (tag, result) in self.completed.drain(..) {
            each(tag, result);
        }
        Ok(())
    }

    /// Sends what is queued, waits for all of it; the first error, if any request failed.
    pub fn wait(mut self) -> Result<()> {
        let mut first = None;
        self.drain(|_, r| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        })?;
        first.map_or(Ok(()), Err)
    }

    /// Sends what is queued and hands each completion (tag, result) to `each` as it
    /// arrives, until all are back: a caller can use the first while the rest are
    /// still in flight. Errs only if waiting itself failed.
    pub fn wait_each(mut self, each: impl FnMut(u64, Result<()>)) -> Result<()> {
        self.drain(each)
    }

    fn drain(&mut self, mut each: impl FnMut(u64, Result<()>)) -> Result<()> {
        self.send()?;
        loop {
            for (tag, result) in self.completed.drain(..) {
                each(tag, result);
            }
            if self.in_flight == 0 {
                return Ok(());
            }
            self.reap(1)?;
        }
    }

    fn finish(&mut self) -> Result<()> {
        self.drain(|_, _| {})
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
        let Some(handle) = self.handle.take() else { return };
        if handle.queued() > 0 {
            return; // reaping failed: dropping the handle waits out what is left
        }
        QUEUES.with(|q| q.borrow_mut().put(&self.disk.engine, handle));
    }
}

/// Writes handed to the device and not waited for: the journal's written
/// (not flushed) transactions. They go out on a queue of their own that any
/// thread may use under its owner's lock, so whichever thread needs them
/// done next can wait for them; each keeps its buffer until it is back.
///
/// A write the kernel gives back cancelled, interrupted or "try again" (the
/// thread that sent it exited before io_uring could issue or reissue it) is
/// sent again from the buffer it still holds, a few times, before it counts
/// as failed: the same blocks at the same place, so nothing after it minds.
pub struct Sent {
    /// Given back to the engine when the writes are all back ([`Engine::give_back`]).
    handle: Option<Handle>,
    engine: Arc<Engine>,
    /// The disk's count of writes ([`Disk::flush`] skips a flush with nothing new).
    tally: Arc<WriteTally>,
    /// Buffers with writes in flight: (id, buffer, writes not yet back).
    buffers: Vec<(u64, IoBuf, usize)>,
    /// Writes in flight by tag.
    writes: std::collections::HashMap<u64, SentWrite>,
    next_id: u64,
    /// Writes in flight at most (the device's queue may be shorter than [`SENT_DEPTH`]).
    depth: u32,
    completed: Vec<crate::path::channel::Completed>,
}

/// One write of a [`Sent`]: which buffer, which bytes of it, where.
#[derive(Debug, Clone, Copy)]
struct SentWrite {
    buffer: u64,
    start: usize,
    len: usize,
    offset: u64,
    tries: u32,
}

/// Writes one [`Sent`] keeps in flight at most (a journal transaction is one
/// or two, and more are waited for before the next is sent).
pub const SENT_DEPTH: u32 = 64;

/// Times a cancelled or interrupted write is sent before it counts as failed.
const SENT_TRIES: u32 = 4;

impl Sent {
    /// A queue for writes sent and waited for later, on `disk`'s engine.
    pub fn new(disk: &Disk) -> Result<Sent> {
        let depth = SENT_DEPTH.min(disk.engine.device().capabilities().queue_depth);
        let handle = disk.engine.handle_for_any_thread(HandleOptions { depth, buffers: 0, buffer_size: 0 })?;
        Ok(Sent {
            handle: Some(handle),
            engine: Arc::clone(&disk.engine),
            tally: Arc::clone(&disk.tally),
            buffers: Vec::new(),
            writes: std::collections::HashMap::new(),
            next_id: 0,
            depth,
            completed: Vec::new(),
        })
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        self.writes.len()
    }

    fn handle(&mut self) -> &mut Handle {
        self.handle.as_mut().expect("a queue of sent writes holds its handle until dropped")
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Queues `write` (room made by waiting for earlier ones, whose errors come back here).
    fn queue(&mut self, write: SentWrite) -> Result<()> {
        if self.handle().queued() >= self.depth {
            self.handle().commit()?;
            self.reap(1)?;
        }
        let tag = self.id();
        let Some((_, buf, _)) = self.buffers.iter().find(|b| b.0 == write.buffer) else {
            unreachable!("a write's buffer is kept until the write is back");
        };
        let at = buf[write.start..write.start + write.len].as_ptr().cast_mut();
        self.tally.sending();
        // SAFETY: the buffer stays in `self.buffers` until every write from it is
        // back (or the queue is gone: `Drop` waits).
        let sent =
            unsafe { self.handle().submit_raw_with(Op::Write, at, write.len, write.offset, tag, Durability::Cached) };
        if sent.is_err() {
            self.tally.came_back(1); // never sent
        }
        sent?;
        self.writes.insert(tag, write);
        if let Some(b) = self.buffers.iter_mut().find(|b| b.0 == write.buffer) {
            b.2 += 1;
        }
        Ok(())
    }

    /// Sends `pieces` of `buf` (device block, byte range), and keeps `buf`
    /// until every piece is back; returns once the device has them
    /// ([`Engine::commit_submits`] says whether that means the kernel's
    /// block layer). A piece that could not be sent is an error; the pieces
    /// before it stay in flight.
    pub fn send(&mut self, disk: &Disk, pieces: &[(u64, std::ops::Range<usize>)], buf: IoBuf) -> Result<()> {
        let buffer = self.id();
        // Counted once more while it is being sent, so room made meanwhile keeps it.
        self.buffers.push((buffer, buf, 1));
        let mut result = Ok(());
        'pieces: for (block, range) in pieces {
            disk.writing(*block, range.len());
            let mut done = 0;
            while done < range.len() {
                let len = (range.len() - done).min(disk.max_io);
                let offset = block * BLOCK_U64 + done as u64;
                let write = SentWrite { buffer, start: range.start + done, len, offset, tries: 1 };
                if let Err(e) = self.queue(write) {
                    result = Err(e);
                    break 'pieces;
                }
                disk.counters.count(Op::Write, len);
                done += len;
            }
        }
        if let Some(b) = self.buffers.iter_mut().find(|b| b.0 == buffer) {
            b.2 -= 1;
        }
        self.drop_finished_buffers();
        let committed = self.handle().commit();
        result.and(committed)
    }

    fn drop_finished_buffers(&mut self) {
        self.buffers.retain(|b| b.2 > 0);
    }

    /// Takes back the writes that are done (at least `min`, waiting for them),
    /// sending again those given back cancelled; the first error among them.
    fn reap(&mut self, min: usize) -> Result<()> {
        let handle = self.handle.as_mut().expect("a queue of sent writes holds its handle until dropped");
        handle.reap(min, &mut self.completed)?;
        let mut first = None;
        let mut again = Vec::new();
        for done in std::mem::take(&mut self.completed) {
            let Some(write) = self.writes.remove(&done.tag) else { continue };
            self.tally.came_back(1);
            if let Some(b) = self.buffers.iter_mut().find(|b| b.0 == write.buffer) {
                b.2 -= 1;
            }
            match done.result {
                Ok(()) => {}
                Err(e) if write.tries < SENT_TRIES && e.errno().is_some_and(retryable) => {
                    again.push(SentWrite { tries: write.tries + 1, ..write });
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        for write in again {
            if let Err(e) = self.queue(write) {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = self.handle().commit() {
            first.get_or_insert(e);
        }
        self.drop_finished_buffers();
        first.map_or(Ok(()), Err)
    }

    /// Takes back whatever is done without waiting; the first error among it.
    pub fn look(&mut self) -> Result<()> {
        if self.in_flight() == 0 { Ok(()) } else { self.reap(0) }
    }

    /// Waits until every write sent is back; the first error among them.
    pub fn wait_all(&mut self) -> Result<()> {
        let mut first = None;
        while self.in_flight() > 0 {
            let before = self.in_flight();
            if let Err(e) = self.reap(1) {
                first.get_or_insert(e);
                if self.in_flight() >= before {
                    // Waiting itself failed and nothing came back: do not spin on it.
                    break;
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Errors a write meets when the kernel did not get to do it (the thread
/// that sent it is gone, a signal, a full queue), not when the device failed it.
fn retryable(errno: i32) -> bool {
    matches!(errno, libc::ECANCELED | libc::EINTR | libc::EAGAIN | libc::EFAULT)
}

impl Drop for Sent {
    fn drop(&mut self) {
        // The buffers must outlive the writes from them; dropping the handle after
        // a failed wait waits out what is left (the engine's contract).
        let _ = self.wait_all();
        if let Some(handle) = self.handle.take() {
            self.engine.give_back(handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, PathConfig};

    fn disk() -> Disk {
        let engine = Engine::open("emu:null,size=4m", PathConfig::preset("sync-path").unwrap()).unwrap();
        Disk::new(Arc::new(engine))
    }

    fn flushes(disk: &Disk) -> (u64, u64) {
        let c = disk.counters();
        (c.flushes.load(Relaxed), c.flushes_skipped.load(Relaxed))
    }

    #[test]
    fn a_flush_is_sent_only_when_a_write_was_sent_since_one_that_covered_all() {
        let disk = disk();
        let block = IoBuf::new(BLOCK);
        disk.flush().unwrap();
        assert_eq!(flushes(&disk), (0, 1), "nothing was ever written");
        disk.write(3, &block).unwrap();
        disk.flush().unwrap();
        disk.flush().unwrap();
        assert_eq!(flushes(&disk), (1, 2));
        // A write in flight when a flush is sent: that flush vouches for nothing.
        let mut batch = disk.batch().unwrap();
        batch.write(4, &block).unwrap();
        batch.send().unwrap();
        assert_eq!(disk.tally.flush_covers(), None);
        disk.flush().unwrap();
        batch.wait().unwrap();
        disk.flush().unwrap();
        disk.flush().unwrap();
        assert_eq!(flushes(&disk), (3, 3), "the write in flight needed a flush sent after it was back");
        // A durable write covers what came before and itself.
        disk.write(5, &block).unwrap();
        disk.write_durable(6, &block).unwrap();
        disk.flush().unwrap();
        assert_eq!(flushes(&disk), (4, 4));
        // The journal's queue counts too.
        let mut sent = Sent::new(&disk).unwrap();
        sent.send(&disk, &[(7, 0..BLOCK)], IoBuf::new(BLOCK)).unwrap();
        assert!(!disk.tally.all_durable());
        sent.wait_all().unwrap();
        disk.flush().unwrap();
        disk.flush().unwrap();
        assert_eq!(flushes(&disk), (5, 5));
    }
}
