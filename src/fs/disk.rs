//! The file layer's view of the device: whole 4 KiB blocks through an
//! [`Engine`], so every read, write and flush takes the path (dispatch x
//! completion) the engine was opened with: sixteen threads' file writes are
//! merged by `stm` exactly like raw block requests.

use super::format::{BLOCK, BLOCK_U64};
use crate::IoBuf;
use crate::engine::Engine;
use crate::error::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
            self.counters.reads.fetch_add(1, Relaxed);
            self.counters.read_bytes.fetch_add(chunk.len() as u64, Relaxed);
        }
        Ok(())
    }

    /// Writes `buf` (whole blocks, aligned) at `block`.
    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert_eq!(buf.len() % BLOCK, 0);
        for (i, chunk) in buf.chunks(self.max_io).enumerate() {
            let at = (block * BLOCK_U64) + (i * self.max_io) as u64;
            self.engine.write_at(chunk, at)?;
            self.counters.writes.fetch_add(1, Relaxed);
            self.counters.written_bytes.fetch_add(chunk.len() as u64, Relaxed);
        }
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
