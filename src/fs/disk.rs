//! The file layer's view of the device: whole 4 KiB blocks through an
//! [`Engine`], so every read, write and flush takes the path (dispatch x
//! completion) the engine was opened with: sixteen threads' file writes are
//! merged by `stm` exactly like raw block requests.

use super::format::{BLOCK, BLOCK_U64};
use crate::IoBuf;
use crate::device::{Durability, Op};
use crate::engine::{Engine, Handle, HandleOptions, ThreadHandles};
use crate::error::Result;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Requests one thread keeps in flight at most in a [`Batch`].
pub const BATCH_DEPTH: u32 = 64;

thread_local! {
    /// Each thread's queued handle per engine, lent to one [`Batch`] at a time.
    static QUEUES: RefCell<ThreadHandles> = const { RefCell::new(ThreadHandles::new()) };
}

/// Block I/O for the file layer.
pub struct Disk {
    engine: Arc<Engine>,
    /// Largest request, a whole number of blocks.
    max_io: usize,
    /// Blocks on the device.
    blocks: u64,
    counters: DiskCounters,
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
        Disk { engine, max_io, blocks, counters: DiskCounters::default() }
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

    /// Reads `buf.len() / 4096` blocks from `block` (buf aligned, as an [`IoBuf`] is).
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        for (i, chunk) in buf.chunks_mut(self.max_io).enumerate() {
            let at = (block * BLOCK_U64) + (i * self.max_io) as u64;
            self.engine.read_at(chunk, at)?;
            self.counters.count(Op::Read, chunk.len());
        }
        Ok(())
    }

    /// Writes `buf` (whole blocks, aligned) at `block`.
    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        for (i, chunk) in buf.chunks(self.max_io).enumerate() {
            let at = (block * BLOCK_U64) + (i * self.max_io) as u64;
            self.engine.write_at(chunk, at)?;
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
        self.engine.write_durable_at(buf, block * BLOCK_U64)?;
        self.counters.flushes.fetch_add(1, Relaxed);
        self.counters.count(Op::Write, buf.len());
        Ok(())
    }

    /// Reads one block into a new buffer.
    pub fn read_block(&self, block: u64) -> Result<IoBuf> {
        let mut buf = IoBuf::new(BLOCK);
        self.read(block, &mut buf)?;
        Ok(buf)
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> Result<()> {
        self.counters.flushes.fetch_add(1, Relaxed);
        self.engine.flush()
    }
}

impl Disk {
    /// Starts a batch: requests sent together and waited for together, from this thread.
    pub fn batch(&self) -> Result<Batch<'_>> {
        let lent = QUEUES.with(|q| q.borrow_mut().take(&self.engine));
        let handle = match lent {
            Some(h) => h,
            None => self.engine.handle(HandleOptions { depth: BATCH_DEPTH, buffers: 0, buffer_size: 0 })?,
        };
        Ok(Batch { disk: self, handle: Some(handle), in_flight: 0, completed: Vec::new(), buffers: PhantomData })
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
        let max_io = self.disk.max_io;
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(max_io);
            self.room()?;
            let at = block * BLOCK_U64 + done as u64;
            // SAFETY: the caller's promise covers every chunk of `buf`.
            unsafe { self.handle().submit_raw_with(op, buf.add(done), chunk, at, tag, durability)? };
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
