//! Files: reads and writes through the page cache, or straight to the device
//! (a file opened direct, like `O_DIRECT`), truncation, fsync and writeback.
//!
//! A write through the cache maps the file's holes at once (as blocks not
//! yet written, which read as zeros until their data is on the device),
//! copies into cache pages and marks them dirty; `fsync`, `fdatasync`, a
//! file system `sync`, or too many dirty pages write them back: contiguous
//! pages become one device command, all of them are in flight together
//! (the engine's queued API), then the blocks are marked written in the
//! same transaction that the fsync commits.

use super::cache::{Page, Speculative};
use super::format::{BLOCK, BLOCK_U64};
use super::mirror::{Mirror, MirrorMemory};
use super::writeback::{self, Writeback};
use super::{
    File, Inner, MAX_FILE_SIZE, MAX_IO_BLOCKS, Meta, NodeState, coarse_now_ns, extents, file_error, fsync_path, now_ns,
    read_path,
};
use crate::IoBuf;
use crate::error::Result;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockWriteGuard, TryLockError};

/// Pages a reader that catches up with its stream's read-ahead loads after
/// the one it missed (Linux's synchronous read-ahead). Measured on
/// `emu:optane` (fsbench seqread): 4 gave 92-93% of the device's peak, 16
/// gave 86-87% (the reader waited for the whole batch), none 89-91%.
const SYNC_AHEAD_PAGES: u64 = 4;

/// A write that needs at least this many new blocks (with what its append
/// preallocates after it) is given one free run for them when the device has
/// one, instead of the next free blocks: 64 KiB, past the small files whose
/// trimmed preallocation leaves holes of a few blocks between them.
const STREAM_RUN_BLOCKS: u64 = 16;

/// Fewest blocks an append that grows a file's allocation maps past its end.
const MIN_PREALLOC_BLOCKS: u64 = 8;

/// Commits a write short of space makes, while blocks freed by changes not
/// yet committed wait, before it says ENOSPC ([`File::map_holes_or_enospc`]).
const SPACE_COMMITS: u32 = 8;

/// An append preallocates only while this many times what it would map is
/// free: on a device that is filling up, space goes to the data written.
const PREALLOC_ROOM: u64 = 16;

/// A file no larger than this is read whole at a miss of a read from its
/// start (Linux reads 128 KiB ahead at a file's first read): `tar c`, `cp`
/// and `diff` read small files from start to end in several calls, each of
/// which missed once, one device round trip per call.
pub(super) const SMALL_FILE_WHOLE: u64 = 128 * 1024;

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state_read();
        f.debug_struct("File")
            .field("name", &state.inode.name)
            .field("size", &state.inode.size)
            .field("direct", &self.direct)
            .finish()
    }
}

impl File {
    fn state_read(&self) -> std::sync::RwLockReadGuard<'_, NodeState> {
        self.node.state.read().expect("file lock poisoned")
    }

    /// The file's lock, exclusively, once its write-behind jobs are settled.
    fn state_write(&self) -> std::sync::RwLockWriteGuard<'_, NodeState> {
        self.node.lock_settled(&self.fs)
    }

    /// The file's lock, exclusively, for a write: write-behind jobs of the
    /// file may be in flight (the write settles those that are done).
    fn state_write_for_write(&self) -> std::sync::RwLockWriteGuard<'_, NodeState> {
        self.node.state.write().expect("file lock poisoned")
    }

    fn live(&self, state: &NodeState, op: &'static str) -> Result<()> {
        if !state.live {
            return Err(file_error(
                op,
                &state.inode.name,
                libc::ESTALE,
                "the file no longer exists (freed after its last name and handle went)",
            ));
        }
        Ok(())
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.state_read().inode.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this handle bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether `other` is a handle of the same file.
    pub fn same_file(&self, other: &File) -> bool {
        Arc::ptr_eq(&self.node, &other.node)
    }

    /// Reads into `buf` from `offset`; returns the bytes read (fewer at the end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if self.direct {
            self.settle_for_direct(false)?;
        }
        let state = self.state_read();
        self.live(&state, "read")?;
        let size = state.inode.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset) as usize;
        let buf = &mut buf[..n];
        if self.direct {
            self.read_direct(&state, buf, offset)?;
        } else {
            self.read_cached(&state, buf, offset)?;
        }
        // A writable mirror's bytes are the file's while it lives (see `mirror.rs`).
        for memory in state.mirrors.iter().filter(|m| m.writable) {
            memory.lay_over(buf, offset);
        }
        Ok(n)
    }

    fn read_cached(&self, state: &NodeState, buf: &mut [u8], offset: u64) -> Result<()> {
        let fs = &self.fs;
        let n = buf.len() as u64;
        let first = offset / BLOCK_U64;
        let end = (offset + n).div_ceil(BLOCK_U64);
        // The common case first: every page is there. Each is copied under its
        // index shard's lock, with no reference taken and nothing allocated; the
        // first page that is not (absent, loading, being written) sends the rest
        // of the read down the general path.
        let t = fs.steps.start();
        let mut copied = 0;
        let mut read_ahead_used = false;
        for block in first..end {
            let block_start = block * BLOCK_U64;
            let from = offset.max(block_start);
            let to = (offset + n).min(block_start + BLOCK_U64);
            let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
            match fs.cache.copy_hit((state.cache_id, block), (from - block_start) as usize, dst) {
                Some(first_use) => read_ahead_used |= first_use,
                None => break,
            }
            copied = to - offset;
        }
        if copied == n {
            fs.steps.lap(t, |s| &s.copy);
            // A hit moves read-ahead on only where it used a page read ahead (as
            // Linux's PG_readahead mark); a miss always does (the general path).
            // Every hit wrote the file's read-ahead state: with two threads reading
            // cached blocks at random, that shared cache line cost 8-9% of their
            // reads (fio psync randread 4k, 2 jobs, 1.43-1.45M against 1.55-1.59M
            // IOPS without it).
            if read_ahead_used {
                fs.readahead(&self.node, state, first, end);
            }
            return Ok(());
        }
        // A look that found a page missing: the general path counts its copy.
        fs.steps.lap(t, |s| &s.lookup);
        self.read_through(state, &mut buf[copied as usize..], offset + copied, first)
    }

    /// The general path of [`File::read_cached`] for `buf` at `offset`: looks
    /// up every page, loads the missing ones (with read-ahead from a read that
    /// began at block `began`), waits for those others are loading, copies.
    fn read_through(&self, state: &NodeState, buf: &mut [u8], offset: u64, began: u64) -> Result<()> {
        let fs = &self.fs;
        let n = buf.len() as u64;
        let first = offset / BLOCK_U64;
        let end = (offset + n).div_ceil(BLOCK_U64);
        let t = fs.steps.start();
        let mut pages: Vec<Option<Arc<Page>>> = Vec::with_capacity((end - first) as usize);
        let mut missing = Vec::new();
        for block in first..end {
            let page = fs.cache.lookup((state.cache_id, block));
            if page.is_none() {
                missing.push(block);
            }
            pages.push(page);
        }
        fs.steps.lap(t, |s| &s.lookup);
        fs.readahead(&self.node, state, began, end);
        if !missing.is_empty() {
            let loaded = if first == 0 && state.inode.size <= SMALL_FILE_WHOLE {
                let last = state.inode.size.div_ceil(BLOCK_U64);
                let rest = (end..last).filter(|&b| fs.cache.peek((state.cache_id, b)).is_none());
                let whole: Vec<u64> = missing.iter().copied().chain(rest).collect();
                match read_path::load(fs, state, &whole) {
                    Ok(pages) => pages,
                    // The rest is for later reads: an error there is theirs to report.
                    Err(_) if whole.len() > missing.len() => read_path::load(fs, state, &missing)?,
                    Err(e) => return Err(e),
                }
            } else if let Some(whole) = self.around(state, first, end, &missing) {
                match read_path::load(fs, state, &whole) {
                    Ok(pages) => {
                        // The blocks around are read ahead: marked so, and counted when used.
                        let mut wanted = Vec::with_capacity(missing.len());
                        for (block, page) in whole.iter().zip(pages) {
                            if missing.binary_search(block).is_ok() {
                                wanted.push(page);
                            } else {
                                page.mark_speculative(Speculative::Around);
                            }
                        }
                        fs.cache.count_read_around((whole.len() - missing.len()) as u64);
                        wanted
                    }
                    // The blocks around are for later reads: an error there is theirs to report.
                    Err(_) => read_path::load(fs, state, &missing)?,
                }
            } else {
                read_path::load(fs, state, &missing)?
            };
            let mut loaded = loaded.into_iter();
            for slot in pages.iter_mut().filter(|p| p.is_none()) {
                *slot = loaded.next();
            }
            // Asked only on a miss: a hit takes no read-ahead lock for it.
            if let Some(until) = self.node.readahead.stream_ahead(end) {
                // A sequential stream missed: its read-ahead thread is behind (or starved of
                // CPU). Load the stream's next pages here, as Linux's synchronous read-ahead
                // does, rather than missing again page after page. A page that fails to load
                // is left to the read that wants it (which then reports the error).
                let last = state.inode.size.div_ceil(BLOCK_U64);
                let stop = until.min(last).min(end + SYNC_AHEAD_PAGES);
                let next: Vec<u64> = (end..stop).filter(|&b| fs.cache.peek((state.cache_id, b)).is_none()).collect();
                if !next.is_empty()
                    && let Ok(n) = read_path::load_ahead(fs, state, &next)
                {
                    fs.cache.count_readahead(n as u64);
                }
            }
        }
        let t = fs.steps.start();
        for (i, page) in pages.into_iter().enumerate() {
            let mut page = page.expect("every block has its page now");
            if !page.ready() && !fs.cache.wait_loaded(&page) {
                // Its loader failed: load it here (and report the error if it fails again).
                page = read_path::load(fs, state, &[first + i as u64])?.remove(0);
            }
            let block_start = (first + i as u64) * BLOCK_U64;
            let from = offset.max(block_start);
            let to = (offset + n).min(block_start + BLOCK_U64);
            let data = page.data.read().expect("page lock poisoned");
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data.buf[(from - block_start) as usize..(to - block_start) as usize]);
        }
        fs.steps.lap(t, |s| &s.copy);
        Ok(())
    }

    /// Read-around: the blocks a miss of blocks `[first, end)` (the `missing`
    /// ones, ascending) reads, with the uncached blocks next to them out to
    /// the aligned cluster of [`MountOptions::read_around_bytes`] that holds
    /// them, as one contiguous run; `None` when it would read nothing more.
    ///
    /// Only while the cache has room for them without evicting anything: a
    /// page read around then costs device time and memory nobody was using,
    /// and the read that would have missed it later takes a hit instead. A
    /// program reading a file at random warms the cache a cluster at a time
    /// (RocksDB's `readrandom` on a 235 MB database, 5 s: 3,612 device
    /// reads where a block per miss took 39,708). Once the cache is full, misses
    /// read only what they miss: read around at random, a page evicted to
    /// make room is more likely to be wanted than one read around (seed
    /// 000's read-ahead moved twice the bytes the program used).
    ///
    /// [`MountOptions::read_around_bytes`]: super::MountOptions::read_around_bytes
    fn around(&self, state: &NodeState, first: u64, end: u64, missing: &[u64]) -> Option<Vec<u64>> {
        let fs = &self.fs;
        let cluster = fs.options.read_around_bytes / BLOCK_U64;
        // A sequential stream's next blocks are read-ahead's to load, ahead of the
        // reader and while it copies; read around, they came a cluster at a time
        // while the reader waited (and beat the read-ahead thread to its window).
        if cluster <= 1 || missing.len() as u64 >= cluster || self.node.readahead.stream_ahead(end).is_some() {
            return None;
        }
        let (lo, hi) = (first / cluster * cluster, end.div_ceil(cluster) * cluster);
        let hi = hi.min(state.inode.size.div_ceil(BLOCK_U64));
        let free = |b: u64| fs.cache.peek((state.cache_id, b)).is_none();
        let mut start = missing[0];
        while start > lo && free(start - 1) {
            start -= 1;
        }
        let last = missing[missing.len() - 1];
        let mut stop = last + 1;
        while stop < hi && free(stop) {
            stop += 1;
        }
        // Cached blocks between the missing ones stay out (read where they are).
        let whole: Vec<u64> = (start..missing[0]).chain(missing.iter().copied()).chain(last + 1..stop).collect();
        let extra = whole.len() - missing.len();
        (extra > 0 && fs.cache.room() >= extra).then_some(whole)
    }

    /// Whether a direct transfer of `[from, to)` can use the caller's memory
    /// itself: whole blocks, at an address the device can take, unless the
    /// mount asks for the copying path.
    fn zero_copy(&self, mem: &[u8], from: u64, to: u64) -> bool {
        let align = self.device_alignment() as usize;
        !self.fs.options.direct_copy
            && from.is_multiple_of(BLOCK_U64)
            && to.is_multiple_of(BLOCK_U64)
            && (mem.as_ptr() as usize).is_multiple_of(align)
    }

    /// The alignment the device asks of direct transfers' addresses, offsets
    /// and lengths (1: none).
    fn device_alignment(&self) -> u64 {
        u64::from(self.fs.disk.engine().device().capabilities().alignment.max(1))
    }

    /// Whether a direct write of file bytes `[from, to)` that leaves part of
    /// a block unwritten can go to the device as it is: both ends on the
    /// device's sectors (smaller than a block), and no bytes past the file's
    /// old end `old_size` before it (those must be zeros on the device, which
    /// the read-modify-write writes; bytes past its new end stay as the
    /// device holds them, zeros past the old end).
    fn in_sectors(&self, from: u64, to: u64, old_size: u64) -> bool {
        let sector = self.device_alignment().max(512);
        sector < BLOCK_U64 && from.is_multiple_of(sector) && to.is_multiple_of(sector) && from <= old_size
    }

    fn read_direct(&self, state: &NodeState, buf: &mut [u8], offset: u64) -> Result<()> {
        let n = buf.len() as u64;
        let first = offset / BLOCK_U64;
        let end = (offset + n).div_ceil(BLOCK_U64);
        for run in extents::pieces(extents::runs(&state.inode.extents, first, end), MAX_IO_BLOCKS) {
            let run_start = (run.logical * BLOCK_U64).max(offset);
            let run_end = ((run.logical + run.len) * BLOCK_U64).min(offset + n);
            let out = &mut buf[(run_start - offset) as usize..(run_end - offset) as usize];
            match run.physical {
                Some(physical) if !run.unwritten && self.zero_copy(out, run_start, run_end) => {
                    // Zero copy: the device fills the caller's memory.
                    self.fs.disk.read(physical + (run_start / BLOCK_U64 - run.logical), out)?;
                }
                Some(physical) if !run.unwritten => {
                    let mut block_buf = IoBuf::new(run.len as usize * BLOCK);
                    self.fs.disk.read(physical, &mut block_buf)?;
                    let skip = (run_start - run.logical * BLOCK_U64) as usize;
                    out.copy_from_slice(&block_buf[skip..skip + out.len()]);
                }
                _ => out.fill(0),
            }
        }
        Ok(())
    }

    /// Before direct access: write back what the cache holds dirty (and, for a
    /// write, forget the cached pages: they would be stale).
    fn settle_for_direct(&self, writing: bool) -> Result<()> {
        let needs = {
            let state = self.state_read();
            state.pending() || writing
        };
        if needs {
            let mut state = self.state_write();
            self.writeback(&mut state)?;
            if writing {
                state.cache_id = self.fs.new_cache_id();
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset`, growing the file as needed (a gap reads as zeros).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        if self.direct
            && let Some(done) = self.overwrite_direct(data, offset)
        {
            return done;
        }
        let mut state = self.state_write_for_write();
        self.write_locked(&mut state, data, offset)
    }

    /// A direct write inside the file over mapped blocks, done under the
    /// file's shared lock, so that direct writes and reads of one file go to
    /// the device together as on the kernel's file systems (InnoDB's threads
    /// write and read its tablespaces so). Before, each held the exclusive
    /// lock through its device time: fio's 16 KiB direct random writes from 4
    /// threads to one file made 0.47x ext4's IOPS. Preallocated (unwritten)
    /// blocks are written so too, in whole blocks, and marked written under
    /// the exclusive lock after: InnoDB writes the pages of the space it
    /// preallocates as its tables grow (a third of MariaDB's direct writes
    /// under sysbench oltp_insert), and each held every other access to the
    /// file back for its device time.
    /// `None`: not such a write, or pages of it are cached or a journal image
    /// of one of its blocks is pending; the caller takes the exclusive path.
    fn overwrite_direct(&self, data: &[u8], offset: u64) -> Option<Result<()>> {
        let fs = &self.fs;
        let end_byte = offset.checked_add(data.len() as u64)?;
        let state = self.state_read();
        if data.is_empty()
            || !state.live
            || end_byte > state.inode.size
            || state.pending()
            || !state.mirrors.is_empty()
            || fs.check_writable("write", &state.inode.name).is_err()
        {
            return None;
        }
        // No page load in flight, then none of the pages cached: what a load
        // finishing or starting from here on may have read, the count tells.
        let loads = state.loads.load(Ordering::SeqCst);
        let (first, end) = (offset / BLOCK_U64, end_byte.div_ceil(BLOCK_U64));
        let runs = extents::runs(&state.inode.extents, first, end);
        // A part of an unwritten block would be written with zeros around it, over
        // what a concurrent write of another part of it wrote: whole blocks only.
        let unwritten = runs.iter().any(|r| r.unwritten);
        let whole_blocks = offset.is_multiple_of(BLOCK_U64) && end_byte.is_multiple_of(BLOCK_U64);
        if loads as u32 != 0
            || runs.iter().any(|r| r.physical.is_none())
            || (unwritten && !whole_blocks)
            || (first..end).any(|b| fs.cache.peek((state.cache_id, b)).is_some())
        {
            return None;
        }
        let blocks = || runs.iter().filter_map(|r| r.physical.map(|p| p..p + r.len)).flatten();
        // (No new journal image of these blocks can appear while the shared lock is
        // held: only this file's dirty pages could become one.)
        if fs.meta().holds_journaled(blocks()) {
            return None;
        }
        let written = self.write_runs(&state, data, offset, end_byte);
        self.node.writes.fetch_add(1, Ordering::Release);
        fs.direct_shared.fetch_add(1, Ordering::Relaxed);
        if written.is_ok() {
            let overwrote_journaled = fs.meta().wrote_in_place(blocks);
            debug_assert!(!overwrote_journaled, "checked under the same shared lock");
        }
        // A page load that started meanwhile may have read what was there before.
        let raced = state.loads.load(Ordering::SeqCst) != loads;
        // The modification time moves once per clock tick, as the kernel's
        // (file_update_time with its coarse clock), noted under the shared lock.
        // (A time set ahead of the clock, by utimes, is replaced as the kernel does.)
        let (now, mtime) = (coarse_now_ns(), state.mtime_ns());
        if written.is_ok() && (now > mtime || mtime > now + 50_000_000) {
            state.note_direct_mtime();
        }
        if !raced && !unwritten {
            return Some(written);
        }
        // The map as it was when the blocks were written: a truncate gives a new cache id.
        let cache_id = state.cache_id;
        drop(state);
        let mut state = self.state_write();
        if unwritten && written.is_ok() && (!state.live || state.cache_id != cache_id) {
            // The map may have changed meanwhile (or the cache was forgotten for
            // another reason): the blocks written may not be the file's any more.
            // Written again under this lock, where the map holds still.
            return Some(self.write_locked(&mut state, data, offset));
        }
        // A zeroed page of an unwritten block read in meanwhile is as stale.
        if raced || (unwritten && (first..end).any(|b| fs.cache.peek((state.cache_id, b)).is_some())) {
            // As the exclusive path forgets them: pages written meanwhile go out first.
            if let Err(e) = self.writeback(&mut state) {
                return Some(Err(e));
            }
            state.cache_id = fs.new_cache_id();
        }
        if let Err(e) = written {
            return Some(Err(e));
        }
        if unwritten {
            // The blocks hold their data now: marked written, as the exclusive path
            // does (marking only shrinks the map: no space needed), for the next
            // commit (whose flush comes before it vouches for them).
            let mut meta = fs.meta();
            if extents::mark_written(&mut state.inode.extents, first, end) {
                if let Err(e) = state.store(fs, &mut meta) {
                    // The map in memory is ahead of the device's: the next sync stores it or fails.
                    state.note_map_unstored(fs);
                    return Some(Err(e));
                }
                state.meta_tid = meta.tid;
                state.layout_tid = meta.tid;
            }
        }
        Some(Ok(()))
    }

    /// Writes `data` at the end of the file; returns the offset it went to.
    pub fn append(&self, data: &[u8]) -> Result<u64> {
        let mut state = self.state_write_for_write();
        let offset = state.inode.size;
        self.write_locked(&mut state, data, offset)?;
        Ok(offset)
    }

    fn write_locked(&self, state: &mut NodeState, data: &[u8], offset: u64) -> Result<()> {
        let fs = &self.fs;
        self.live(state, "write")?;
        fs.check_writable("write", &state.inode.name)?;
        if data.is_empty() {
            return Ok(());
        }
        let end_byte = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
            file_error("write", &state.inode.name, libc::EFBIG, format!("files end at {MAX_FILE_SIZE} bytes"))
        })?;
        let first = offset / BLOCK_U64;
        let end = end_byte.div_ceil(BLOCK_U64);
        if self.direct {
            self.writeback(state)?;
            state.cache_id = fs.new_cache_id();
        }

        // 1. Map the holes in the range, not yet written: until the data is on the
        //    device, a commit records them as reading zeros.
        self.map_holes_or_enospc(state, first, end, true, "write")?;
        let written = if self.direct {
            self.write_direct(state, data, offset, end_byte)
        } else {
            self.write_cached(state, data, offset, end_byte)
        };
        if !state.mirrors.is_empty() {
            self.update_mirrors(state, written.is_ok(), data, offset);
        }
        written
    }

    /// Mirrors of the file ([`File::mirror`]) after a write of `data` at
    /// `offset`: the bytes copied in, or, after a failed write (which may
    /// have landed in part), the range read back from the file.
    fn update_mirrors(&self, state: &NodeState, ok: bool, data: &[u8], offset: u64) {
        let end = offset + data.len() as u64;
        for memory in &state.mirrors {
            if ok {
                memory.written(data, offset);
            } else {
                let size = state.inode.size;
                let _ = memory.refill(offset, end, |buf, at| {
                    buf.fill(0);
                    let upto = size.saturating_sub(at).min(buf.len() as u64) as usize;
                    self.read_into(state, &mut buf[..upto], at)
                });
            }
        }
    }

    /// `buf` from the file at `offset`, all of it before the file's end, with
    /// the file's lock held (read or write) by the caller.
    fn read_into(&self, state: &NodeState, buf: &mut [u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            Ok(())
        } else if self.direct {
            self.read_direct(state, buf, offset)
        } else {
            self.read_cached(state, buf, offset)
        }
    }

    /// A copy of `len` bytes of the file from `offset` (zeros past its end),
    /// kept equal to the file while it lives: every write and truncate of
    /// the file, through any handle, updates it before returning. The mirror
    /// keeps the file open. For a program's shared read-only mapping.
    pub fn mirror(&self, offset: u64, len: usize) -> Result<Mirror> {
        self.mirror_with(offset, len, false)
    }

    /// A [`File::mirror`] the program may store into: while it lives its
    /// bytes are the file's (reads see them), and they are written into the
    /// file by [`Mirror::sync`], by an `fsync` of the file and when the
    /// mirror is dropped. For a program's writable shared mapping.
    pub fn mirror_writable(&self, offset: u64, len: usize) -> Result<Mirror> {
        self.mirror_with(offset, len, true)
    }

    fn mirror_with(&self, offset: u64, len: usize, writable: bool) -> Result<Mirror> {
        if len == 0 {
            return Err(file_error("map", &self.state_read().inode.name, libc::EINVAL, "a mapping of no bytes"));
        }
        let memory = Mirror::new_memory(offset, len, writable)?;
        let mut state = self.state_write();
        self.live(&state, "map")?;
        let size = state.inode.size;
        memory.refill(offset, size, |buf, at| self.read_into(&state, buf, at))?;
        state.mirrors.push(Arc::clone(&memory));
        drop(state);
        Ok(Mirror { memory, file: self.clone() })
    }

    /// Writes what writable mirror `memory` holds into the file, page by page
    /// where it differs from the file's bytes, up to the file's end. The
    /// mirror is out of the file's list meanwhile, so these writes do not
    /// copy back into it what the program may have stored again since.
    /// Only `[from, to)` of the file is looked at.
    pub(super) fn write_back_mirror(&self, memory: &Arc<MirrorMemory>, from: u64, to: u64) -> Result<()> {
        let mut state = self.state_write();
        self.live(&state, "msync")?;
        let Some(at) = state.mirrors.iter().position(|m| Arc::ptr_eq(m, memory)) else { return Ok(()) };
        let me = state.mirrors.swap_remove(at);
        // Only the pages the program stored into, where the kernel can tell.
        let runs = me.written_since_last_look(from, to).unwrap_or_else(|| std::iter::once(from..to).collect());
        let mut result = Ok(());
        let (mut mine, mut theirs) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
        for run in runs {
            let end = (me.offset() + me.len() as u64).min(state.inode.size).min(run.end);
            let mut at = me.offset().max(run.start);
            while at < end && result.is_ok() {
                let n = ((end - at) as usize).min(BLOCK - (at % BLOCK_U64) as usize);
                me.lay_over(&mut mine[..n], at);
                result = self.read_into(&state, &mut theirs[..n], at);
                if result.is_ok() && mine[..n] != theirs[..n] {
                    result = self.write_locked(&mut state, &mine[..n], at);
                }
                at += n as u64;
            }
        }
        if result.is_err() {
            // What was looked at is not in the file: every page is looked at from now on.
            me.distrust_watch();
        }
        state.mirrors.push(me);
        result
    }

    /// Writes every writable mirror of the file into it (before an fsync).
    fn write_back_mirrors(&self) -> Result<()> {
        let writable: Vec<Arc<MirrorMemory>> =
            self.state_read().mirrors.iter().filter(|m| m.writable).cloned().collect();
        writable.iter().try_for_each(|m| self.write_back_mirror(m, 0, u64::MAX))
    }

    /// Stops updating a mirror (it is being dropped).
    pub(super) fn forget_mirror(&self, memory: &Arc<MirrorMemory>) {
        self.state_write().mirrors.retain(|m| !Arc::ptr_eq(m, memory));
    }

    fn write_cached(&self, state: &mut NodeState, data: &[u8], offset: u64, end_byte: u64) -> Result<()> {
        let fs = &self.fs;
        let first = offset / BLOCK_U64;
        let end = end_byte.div_ceil(BLOCK_U64);
        let old_size = state.inode.size;
        if offset > old_size && offset / BLOCK_U64 > old_size / BLOCK_U64 {
            self.zero_tail_cached(state)?;
        }
        for block in first..end {
            let block_start = block * BLOCK_U64;
            let from = offset.max(block_start);
            let to = end_byte.min(block_start + BLOCK_U64);
            let at = (from - block_start) as usize;
            let bytes = &data[(from - offset) as usize..(to - offset) as usize];
            self.dirty_block(state, block, at, bytes, |buf, filled| {
                if !filled {
                    buf[at..at + bytes.len()].copy_from_slice(bytes);
                }
            })?;
        }
        // The size readers see and the time: in memory only. The inode records the
        // size the device backs (`disk_size`), which only writeback moves, and the
        // time is stored by that writeback too (see `mtime_unstored`): no metadata
        // lock here.
        debug_assert!(!state.dirty.is_empty(), "a buffered write leaves dirty pages");
        state.inode.size = state.inode.size.max(end_byte);
        state.set_mtime(now_ns());
        state.mtime_unstored = true;
        // A long stream: its pages go to the device behind the writer.
        state.write_behind(fs, offset, end_byte);
        // Too much dirty data: write this file's back now (no commit: the next fsync does that).
        if state.dirty.len() > fs.cache.capacity() / 4 {
            self.writeback(state)?;
        }
        // Too much dirty data in all files: the oldest files go back, together.
        writeback::keep_to_budget(fs, &self.node, state)
    }

    /// The cached page of `block` for a write of `bytes` at byte `at` of it,
    /// and whether it holds them already: a new page is made with them in
    /// place and zeros around them (nothing zeroed twice: a whole block's
    /// write was 3.4% of `tar c`'s samples zeroing frames it then filled),
    /// before any other thread can see it.
    fn page_for_write(&self, state: &NodeState, block: u64, at: usize, bytes: &[u8]) -> Result<(Arc<Page>, bool)> {
        let fs = &self.fs;
        let key = (state.cache_id, block);
        let whole = at == 0 && bytes.len() == BLOCK;
        loop {
            if let Some(page) = fs.cache.peek(key) {
                if page.ready() || fs.cache.wait_loaded(&page) {
                    return Ok((page, false));
                }
                continue; // its load failed and it left the index: look again
            }
            let on_device = matches!(extents::locate(&state.inode.extents, block), Some((_, false)));
            if on_device && !whole && block * BLOCK_U64 < state.inode.size {
                // Read-modify-write: the rest of the block must come from the device.
                return Ok((read_path::load(fs, state, &[block])?.remove(0), false));
            }
            let mut frame = fs.cache.frame();
            frame[..at].fill(0);
            frame[at..at + bytes.len()].copy_from_slice(bytes);
            frame[at + bytes.len()..].fill(0);
            let page = Page::loading(key, frame);
            page.set_ready();
            let there = fs.cache.insert(&page);
            if Arc::ptr_eq(&there, &page) {
                return Ok((page, true));
            }
        }
    }

    /// Growing the file past its last partial block: the bytes past the old end in
    /// that block must read as zeros (the cached page has them; the device may not).
    fn zero_tail_cached(&self, state: &mut NodeState) -> Result<()> {
        let size = state.inode.size;
        if size.is_multiple_of(BLOCK_U64) {
            return Ok(());
        }
        let block = size / BLOCK_U64;
        if !matches!(extents::locate(&state.inode.extents, block), Some((_, false)))
            && !state.dirty.contains_key(&block)
        {
            return Ok(());
        }
        self.dirty_block(state, block, 0, &[], |buf, _| buf[(size % BLOCK_U64) as usize..].fill(0))
    }

    /// Changes the cached page of `block` and marks it dirty: the page from
    /// [`File::page_for_write`] (given `at` and `bytes`, which it may have
    /// filled in already: `change` is told so), then `change` of its bytes
    /// under its lock. A page evicted between the lookup and the lock is
    /// looked up again: its bytes would go where no reader looks (see
    /// `PageCache::holds`); once dirty, under that lock, it stays.
    fn dirty_block(
        &self,
        state: &mut NodeState,
        block: u64,
        at: usize,
        bytes: &[u8],
        change: impl Fn(&mut [u8], bool),
    ) -> Result<()> {
        loop {
            let (page, filled) = self.page_for_write(state, block, at, bytes)?;
            let mut d = page.data.write().expect("page lock poisoned");
            if !self.fs.cache.holds(&page) {
                continue;
            }
            change(&mut d.buf, filled);
            d.dirty = true;
            drop(d);
            state.dirty_page(&self.fs, &self.node, block, page);
            return Ok(());
        }
    }

    fn write_direct(&self, state: &mut NodeState, data: &[u8], offset: u64, end_byte: u64) -> Result<()> {
        let fs = &self.fs;
        let first = offset / BLOCK_U64;
        let end = end_byte.div_ceil(BLOCK_U64);
        fs.direct_exclusive.fetch_add(1, Ordering::Relaxed);
        self.node.writes.fetch_add(1, Ordering::Release);
        let old_size = state.inode.size;
        if offset > old_size && offset / BLOCK_U64 > old_size / BLOCK_U64 {
            self.zero_tail_direct(state)?;
        }
        // 2. The data.
        self.write_runs(state, data, offset, end_byte)?;

        // 3. Now the blocks hold their data: mark them written, grow the size.
        let mut meta = fs.meta();
        let overwrote_journaled = meta.wrote_in_place(|| {
            extents::runs(&state.inode.extents, first, end)
                .into_iter()
                .filter_map(|r| r.physical.map(|p| p..p + r.len))
                .flatten()
        });
        let written = extents::mark_written(&mut state.inode.extents, first, end);
        let grew = end_byte > state.inode.size;
        if grew {
            state.inode.size = end_byte;
        }
        // Direct writes are preceded by a writeback of the cached pages: all of it is on the device.
        state.disk_size = state.inode.size;
        state.set_mtime(now_ns());
        if let Err(e) = state.store(fs, &mut meta) {
            // The map and size in memory are ahead of the device's (the data is there):
            // the next sync stores them or fails, as after a writeback that could not.
            state.note_map_unstored(fs);
            return Err(e);
        }
        state.meta_tid = meta.tid;
        if written || grew || overwrote_journaled {
            state.layout_tid = meta.tid;
        }
        Ok(())
    }

    /// Writes `data` (file bytes `[offset, end_byte)`, every block of them
    /// mapped) to the device: whole blocks per device run; partial blocks at
    /// the edges as sectors where they can be, else read first where they
    /// hold data (read-modify-write). Neither the map nor the size changes.
    fn write_runs(&self, state: &NodeState, data: &[u8], offset: u64, end_byte: u64) -> Result<()> {
        let (first, end) = (offset / BLOCK_U64, end_byte.div_ceil(BLOCK_U64));
        let old_size = state.inode.size;
        for run in extents::pieces(extents::runs(&state.inode.extents, first, end), MAX_IO_BLOCKS) {
            let physical = run.physical.expect("every block of the range is mapped now");
            let run_first = run.logical * BLOCK_U64;
            let run_end = run_first + run.len * BLOCK_U64;
            let from = offset.max(run_first);
            let to = end_byte.min(run_end);
            let src = &data[(from - offset) as usize..(to - offset) as usize];
            if from == run_first && to == run_end && self.zero_copy(src, from, to) {
                // Zero copy: whole blocks, written from the caller's memory.
                self.fs.disk.write(physical, src)?;
                continue;
            }
            if !run.unwritten && self.in_sectors(from, to, old_size) {
                // Part of a block the device can write alone (its sectors are smaller
                // than a block): no read of the block first. InnoDB's redo log writes
                // 512-byte multiples with O_DIRECT and an fdatasync after each: a
                // device read before each write doubled its commit's device time.
                let len = (to - from) as usize;
                let mut buf = IoBuf::for_overwrite(len.next_multiple_of(BLOCK));
                buf[..len].copy_from_slice(src);
                self.fs.disk.write_sectors(physical, (from - run_first) as usize, &buf[..len])?;
                continue;
            }
            let mut buf = IoBuf::new(run.len as usize * BLOCK);
            let head = from > run_first;
            let tail = to < run_end;
            if !run.unwritten {
                if head {
                    self.fs.disk.read(physical, &mut buf[..BLOCK])?;
                }
                if tail && !(head && run.len == 1) {
                    let last = run.len as usize - 1;
                    self.fs.disk.read(physical + last as u64, &mut buf[last * BLOCK..])?;
                }
            }
            // Bytes past the old end of the file read as zeros, whatever the block held.
            if old_size < run_end {
                buf[(old_size.max(run_first) - run_first) as usize..].fill(0);
            }
            buf[(from - run_first) as usize..(to - run_first) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            self.fs.disk.write(physical, &buf)?;
        }

        self.node.direct_sent.fetch_max(self.fs.disk.writes_sent(), Ordering::AcqRel);
        Ok(())
    }

    /// [`File::map_holes`], and again after a commit while space is short
    /// and blocks freed by changes not yet committed wait (they can be used
    /// once those are), up to [`SPACE_COMMITS`] commits; ENOSPC, having
    /// taken nothing, where nothing waits and a second look finds space as
    /// short, or after the last commit.
    ///
    /// One commit was not enough: writers that truncate and rewrite files
    /// without fsync keep most of a small device freed in the running
    /// transaction, and while one writer committed, the others took what its
    /// commit freed and freed as much again (four such threads on a 16 MiB
    /// device: ENOSPC with 3,691 of 3,707 blocks freed, 1 run in 3).
    fn map_holes_or_enospc(
        &self,
        state: &mut NodeState,
        first: u64,
        end: u64,
        ahead: bool,
        op: &'static str,
    ) -> Result<()> {
        let fs = &self.fs;
        let (mut commits, mut free_before) = (0, None);
        while !self.map_holes(state, first, end, ahead)? {
            let (tid, held, free) = {
                let meta = fs.meta();
                (meta.tid, meta.alloc.held_blocks(), meta.alloc.allocatable())
            };
            // (Nothing waits, but another thread's commit may have freed blocks since
            // the look that failed: one more look before ENOSPC.)
            if commits == SPACE_COMMITS || held == 0 && free_before == Some(free) {
                let reserve = super::extent_map_reserve(&fs.sb);
                let why = if free > 0 && free <= reserve {
                    format!("no space left on the device (the {free} blocks free are kept for files' block maps)")
                } else {
                    format!("no space left on the device ({free} blocks free)")
                };
                return Err(file_error(op, &state.inode.name, libc::ENOSPC, why));
            }
            if held > 0 {
                fs.sync_through(tid)?;
                commits += 1;
            }
            free_before = Some(free);
        }
        Ok(())
    }

    /// Maps every hole in file blocks `[first, end)` to new blocks, not yet
    /// written, and (`ahead`) preallocates past them when they grow the
    /// file's allocation at its end. Returns false, having taken nothing,
    /// when the device has too little space.
    fn map_holes(&self, state: &mut NodeState, first: u64, end: u64, ahead: bool) -> Result<bool> {
        let fs = &self.fs;
        let holes: Vec<_> =
            extents::runs(&state.inode.extents, first, end).into_iter().filter(|r| r.physical.is_none()).collect();
        if holes.is_empty() {
            return Ok(true);
        }
        let mut meta = fs.meta();
        let allocated_end = state.inode.extents.last().map_or(0, |e| e.end());
        let mut added = Vec::new();
        let mut failed = false;
        let mut unreadable = None;
        // Enough of a lazily read bitmap (see `alloc`) that the preallocation below
        // is sized from the device's free space: room for the largest, or all of it.
        let room = PREALLOC_ROOM * (self.fs.options.append_prealloc_bytes / BLOCK_U64).max(MIN_PREALLOC_BLOCKS);
        meta.alloc.read_until_allocatable(room)?;
        // What an append preallocates after this write follows it in the same free run.
        // Only a write that continues the allocation is an append: one that leaves a
        // hole before it writes a sparse file (rsync --sparse, dd seek=), whose
        // preallocation a later truncate up would bring inside the size for good.
        let appends = first <= allocated_end;
        let ahead = if ahead && appends && end > allocated_end { self.prealloc_blocks(&meta, end) } else { 0 };
        'holes: for hole in holes {
            let mut at = hole.logical;
            while at < hole.logical + hole.len {
                let goal = extents::goal_for(&state.inode.extents, at);
                let rest = hole.logical + hole.len - at;
                let run = rest + if hole.logical + hole.len == end { ahead } else { 0 };
                // A write that streams looks for one free piece for all of it (the
                // holes small files leave would cut it into pieces); a small one
                // takes the next free blocks.
                let min_run = if run >= STREAM_RUN_BLOCKS { run.min(MAX_IO_BLOCKS) } else { 1 };
                let (physical, len) = match meta.allocate_data(&fs.sb, rest, min_run, goal) {
                    Ok(Some(run)) => run,
                    Ok(None) => {
                        failed = true;
                        break 'holes;
                    }
                    // The bitmap could not be read: what this write took goes back first.
                    Err(e) => {
                        unreadable = Some(e);
                        failed = true;
                        break 'holes;
                    }
                };
                extents::insert_unwritten(&mut state.inode.extents, at, len, physical);
                added.push((at, len));
                at += len;
            }
        }
        if !failed && ahead > 0 {
            self.preallocate(state, &mut meta, end, &mut added);
        }
        // The extent map may need more overflow blocks than are left (outside the
        // reserve for marking blocks written), too.
        if !failed {
            let fits = meta.map_fits_outside_reserve(&fs.sb, state.inode.extents.len(), state.inode.overflow.len());
            if !matches!(fits, Ok(true)) || state.store(fs, &mut meta).is_err() {
                failed = true;
            }
        }
        if failed {
            // Give back what this write took (free once the running transaction commits).
            for (logical, len) in added {
                for (start, n) in extents::cut(&mut state.inode.extents, logical, logical + len) {
                    meta.free_data(&fs.sb, start, n)?;
                }
            }
            state.store(fs, &mut meta)?;
            return match unreadable {
                Some(e) => Err(e),
                None => Ok(false),
            };
        }
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        Ok(true)
    }

    /// After a write that grew the file's allocation at its end (to `end`):
    /// maps as many blocks again past it, unwritten, in one piece right after
    /// the last block (none if that piece is taken, or space is short); see
    /// [`MountOptions::append_prealloc_bytes`](super::MountOptions).
    fn preallocate(&self, state: &mut NodeState, meta: &mut Meta, end: u64, added: &mut Vec<(u64, u64)>) {
        let want = self.prealloc_blocks(meta, end);
        let Some(goal) = extents::goal_for(&state.inode.extents, end) else { return };
        if want == 0 {
            return;
        }
        // Only the piece that continues the file: anything else would fragment it.
        if meta.alloc.read_covering(goal, want).is_err() || !meta.alloc.is_free(goal) {
            return;
        }
        if let Ok(Some((physical, len))) = meta.allocate_data(&self.fs.sb, want, want, Some(goal)) {
            debug_assert_eq!(physical, goal);
            extents::insert_unwritten(&mut state.inode.extents, end, len, physical);
            added.push((end, len));
        }
    }

    /// How many blocks an append that grows the file's allocation to `end`
    /// maps past it: as many again as the file has (at least 8, at most
    /// [`MountOptions::append_prealloc_bytes`](super::MountOptions)), none
    /// when space is short (less than 16 times that free).
    fn prealloc_blocks(&self, meta: &Meta, end: u64) -> u64 {
        let max = self.fs.options.append_prealloc_bytes / BLOCK_U64;
        let want = end.max(MIN_PREALLOC_BLOCKS).min(max);
        if want == 0 || end + want > u32::MAX as u64 || meta.alloc.allocatable() < want * PREALLOC_ROOM {
            return 0;
        }
        want
    }

    /// Gives back the space appends took past the end of the file (the
    /// unwritten blocks past its last one), as XFS trims its speculative
    /// preallocation on close. They never held data: free at once
    /// ([`super::alloc::Allocator::free_now`]).
    pub(super) fn trim_ahead(&self) {
        let fs = &self.fs;
        let Ok(mut state) = self.node.state.write() else { return };
        state.settle(fs, true);
        if !state.live || fs.check_writable("close", &state.inode.name).is_err() {
            return;
        }
        let keep = state.inode.size.div_ceil(BLOCK_U64).max(state.kept_past_end);
        if state.inode.extents.last().is_none_or(|e| e.end() <= keep) {
            return;
        }
        debug_assert!(
            extents::runs(&state.inode.extents, keep, u32::MAX as u64 + 1).iter().all(|r| !r.has_data()),
            "only unwritten blocks lie past the end of a file"
        );
        let mut meta = fs.meta();
        // The bitmap under what is cut, read first: a read that fails trims nothing.
        for e in state.inode.extents.iter().filter(|e| e.end() > keep) {
            if meta.alloc.read_covering(e.physical, u64::from(e.len)).is_err() {
                return;
            }
        }
        for (start, n) in extents::cut(&mut state.inode.extents, keep, u32::MAX as u64 + 1) {
            let freed = meta.free_unwritten(&fs.sb, start, n);
            debug_assert!(freed.is_ok(), "its bitmap was read");
        }
        // Fewer extents never need more overflow blocks: storing cannot run out of space.
        if state.store(fs, &mut meta).is_ok() {
            state.meta_tid = meta.tid;
            state.layout_tid = meta.tid;
        }
    }

    /// Zeroes, on the device, the bytes of the file's last block past its
    /// size (a shrink left them there) before the file grows over them. An
    /// in-place write like any other: if the block's image is in the journal
    /// (the `journaled` fsync path), the next commit checkpoints first, or
    /// replay would put the older bytes back past the old end. The caller
    /// makes that commit part of the file's layout (`layout_tid`).
    fn zero_tail_direct(&self, state: &NodeState) -> Result<()> {
        let size = state.inode.size;
        if size.is_multiple_of(BLOCK_U64) {
            return Ok(());
        }
        self.zero_in_place(state, size, size.next_multiple_of(BLOCK_U64))
    }

    /// Sets the size: shrinking frees the blocks past it, growing leaves a hole (zeros).
    pub fn truncate(&self, len: u64) -> Result<()> {
        let fs = &self.fs;
        let mut state = self.state_write();
        self.live(&state, "truncate")?;
        fs.check_writable("truncate", &state.inode.name)?;
        if len > MAX_FILE_SIZE {
            return Err(file_error(
                "truncate",
                &state.inode.name,
                libc::EFBIG,
                format!("files end at {MAX_FILE_SIZE} bytes"),
            ));
        }
        self.resize_locked(&mut state, len, true)
    }

    /// Sets the size to `len` with the file's lock held: bytes past the old
    /// end read as zeros; with `give_back`, every block past the new end
    /// is freed (a truncate), else none is (`fallocate` growing the file).
    fn resize_locked(&self, state: &mut NodeState, len: u64, give_back: bool) -> Result<()> {
        let fs = &self.fs;
        // Dirty pages go to the device first; the cached pages are then forgotten (a new
        // cache id), so nothing past the new end can be read back from the cache.
        self.writeback(state)?;
        if len > state.inode.size {
            self.zero_tail_direct(state)?;
        }
        state.cache_id = fs.new_cache_id();
        let mut meta = fs.meta();
        if give_back {
            let keep = len.div_ceil(BLOCK_U64);
            // The bitmap under what is cut, read first: a read that fails changes nothing.
            for e in state.inode.extents.iter().filter(|e| e.end() > keep) {
                meta.alloc.read_covering(e.physical, u64::from(e.len))?;
            }
            for (start, n) in extents::cut(&mut state.inode.extents, keep, u32::MAX as u64 + 1) {
                meta.free_data(&fs.sb, start, n)?;
            }
            state.kept_past_end = 0;
        }
        state.inode.size = len;
        state.disk_size = len;
        for memory in &state.mirrors {
            memory.truncated(len);
        }
        state.set_mtime(now_ns());
        state.store(fs, &mut meta)?;
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        Ok(())
    }

    /// `lseek`'s SEEK_DATA (`data`) or SEEK_HOLE from byte `offset`: the
    /// first byte at or after it that holds data (or lies in a hole), or
    /// `None` from the end of the file on (ENXIO). Data is what was written:
    /// blocks written on the device, pages in the cache not written back yet
    /// and the ranges of writable maps. Holes are blocks never mapped and
    /// blocks allocated but never written (`fallocate`'s, appends'
    /// preallocation), as ext4 reports them; the end of the file is one.
    /// Block by block: a hole inside a block that holds data is data.
    pub fn seek_data_or_hole(&self, offset: u64, data: bool) -> Result<Option<u64>> {
        let fs = &self.fs;
        let mut state = self.state_write();
        // Pages of write-behind jobs in flight are neither dirty nor marked written yet.
        state.settle(fs, true);
        self.live(&state, "lseek")?;
        let size = state.inode.size;
        if offset >= size {
            return Ok(None);
        }
        let state = &*state;
        let maps = || {
            let writable = state.mirrors.iter().filter(|m| m.writable);
            writable.map(|m| (m.offset() / BLOCK_U64, (m.offset() + m.len() as u64).div_ceil(BLOCK_U64)))
        };
        // The first block at or after `b` that holds data (u64::MAX: none).
        let next_data = |b: u64| {
            let written = extents::next_written(&state.inode.extents, b).map(|(s, _)| s);
            let dirty = state.dirty.range(b..).next().map(|(&k, _)| k);
            let mapped = maps().filter(|&(_, t)| t > b).map(|(s, _)| s.max(b)).min();
            [written, dirty, mapped].into_iter().flatten().min().unwrap_or(u64::MAX)
        };
        // The first block after data block `b` whose run of data ends there.
        let data_end = |b: u64| {
            let mut at = b;
            loop {
                let mut next = at;
                if let Some((s, t)) = extents::next_written(&state.inode.extents, at)
                    && s <= at
                {
                    next = t;
                }
                if state.dirty.contains_key(&at) {
                    next = next.max(at + 1);
                }
                if let Some(t) = maps().filter(|&(s, t)| s <= at && at < t).map(|(_, t)| t).max() {
                    next = next.max(t);
                }
                if next == at {
                    return at;
                }
                at = next;
            }
        };
        let block = offset / BLOCK_U64;
        let first_data = next_data(block);
        Ok(Some(match data {
            true if first_data.saturating_mul(BLOCK_U64) >= size => return Ok(None),
            true => (first_data * BLOCK_U64).max(offset),
            false if first_data > block => offset,
            false => (data_end(block) * BLOCK_U64).min(size),
        }))
    }

    /// Allocates file bytes `[offset, offset + len)` (`fallocate` mode 0, or
    /// with `keep_size` its `FALLOC_FL_KEEP_SIZE`): each hole in the range
    /// gets blocks of its own, unwritten (they read as zeros), so writes
    /// there cannot fail for want of space, and direct writes into them
    /// take the shared path as into any preallocated block. Without
    /// `keep_size` the file grows to the range's end; with it, blocks past
    /// the end stay through the file's closes in this mount (a later mount
    /// gives them back at the file's last close, as it does the blocks
    /// appends preallocate). ENOSPC, having taken nothing, when the device
    /// has too little room.
    pub fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        let fs = &self.fs;
        let mut state = self.state_write();
        self.live(&state, "fallocate")?;
        fs.check_writable("fallocate", &state.inode.name)?;
        if len == 0 {
            return Err(file_error("fallocate", &state.inode.name, libc::EINVAL, "a range of no bytes"));
        }
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
            file_error("fallocate", &state.inode.name, libc::EFBIG, format!("files end at {MAX_FILE_SIZE} bytes"))
        })?;
        let last = end.div_ceil(BLOCK_U64);
        self.map_holes_or_enospc(&mut state, offset / BLOCK_U64, last, false, "fallocate")?;
        if keep_size {
            state.kept_past_end = state.kept_past_end.max(last);
            return Ok(());
        }
        if end <= state.inode.size {
            return Ok(());
        }
        // Growing, as a truncate up does, with nothing past the new end given back.
        self.resize_locked(&mut state, end, false)
    }

    /// Deallocates file bytes `[offset, offset + len)` (`fallocate`'s
    /// `FALLOC_FL_PUNCH_HOLE`): they read as zeros from here on and the
    /// size does not change. Whole blocks inside the range are unmapped and
    /// freed; the parts of blocks at its edges are zeroed in place. What
    /// lies past the end of the file is left alone.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        let fs = &self.fs;
        let mut state = self.state_write();
        self.live(&state, "fallocate")?;
        fs.check_writable("fallocate", &state.inode.name)?;
        let end = offset.saturating_add(len).min(state.inode.size);
        if offset >= end {
            return Ok(());
        }
        // Dirty pages go to the device first; the cached pages are then forgotten (a new
        // cache id), so what is read from here on comes from the device's new map.
        self.writeback(&mut state)?;
        let (first_whole, end_whole) = (offset.div_ceil(BLOCK_U64), end / BLOCK_U64);
        // The parts of blocks at the edges: zeroed where the block holds data.
        let mut edges = Vec::new();
        if !offset.is_multiple_of(BLOCK_U64) {
            edges.push((offset, end.min(offset.next_multiple_of(BLOCK_U64))));
        }
        if !end.is_multiple_of(BLOCK_U64) && end / BLOCK_U64 >= first_whole {
            edges.push(((end / BLOCK_U64 * BLOCK_U64).max(offset), end));
        }
        for (from, to) in edges {
            self.zero_in_place(&state, from, to)?;
        }
        state.cache_id = fs.new_cache_id();
        let mut meta = fs.meta();
        if first_whole < end_whole {
            // The bitmap under what is freed, read first: a read that fails changes nothing.
            for e in state.inode.extents.iter().filter(|e| e.end() > first_whole && (e.logical as u64) < end_whole) {
                meta.alloc.read_covering(e.physical, u64::from(e.len))?;
            }
            for (start, n) in extents::cut(&mut state.inode.extents, first_whole, end_whole) {
                meta.free_data(&fs.sb, start, n)?;
            }
        }
        for memory in &state.mirrors {
            memory.zeroed(offset, end);
        }
        state.set_mtime(now_ns());
        state.store(fs, &mut meta)?;
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        Ok(())
    }

    /// Zeroes file bytes `[from, to)`, all within one block, on the device
    /// where that block holds data (an in-place write the journal is told of,
    /// as [`File::zero_tail_direct`]'s).
    fn zero_in_place(&self, state: &NodeState, from: u64, to: u64) -> Result<()> {
        let block = from / BLOCK_U64;
        debug_assert!(to > from && (to - 1) / BLOCK_U64 == block, "one block: {from}..{to}");
        if let Some(run) = extents::runs(&state.inode.extents, block, block + 1).into_iter().find(|r| r.has_data()) {
            let physical = run.physical.expect("has data");
            let mut buf = self.fs.disk.read_block(physical)?;
            let at = (block * BLOCK_U64) as usize;
            buf[from as usize - at..to as usize - at].fill(0);
            self.fs.disk.write(physical, &buf)?;
            self.fs.meta().wrote_in_place(|| [physical]);
        }
        Ok(())
    }

    /// Writes the file's dirty pages to the device (not durable until a commit).
    fn writeback(&self, state: &mut NodeState) -> Result<()> {
        writeback::write_back_file(&self.fs, state)
    }

    /// Makes the file's data and metadata durable.
    pub fn fsync(&self) -> Result<()> {
        self.sync(false)
    }

    /// Makes the file's data durable, and the metadata needed to read it (size,
    /// block map) but not its modification time.
    pub fn fdatasync(&self) -> Result<()> {
        self.sync(true)
    }

    fn sync(&self, data_only: bool) -> Result<()> {
        self.sync_once(data_only)?;
        // A writeback of this sync (or before it) could not store the blocks it marked
        // written: stored now and committed, or this sync fails (their data is on the
        // device, but what the device says of the file reads zeros there). Looked at
        // only when some file has such a map: not a lock of the file per sync.
        let fs = &self.fs;
        if fs.maps_unstored.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut state = self.state_write();
        if !state.map_unstored {
            return Ok(());
        }
        let mut meta = fs.meta();
        if let Err(e) = state.store(fs, &mut meta) {
            let op = if data_only { "fdatasync" } else { "fsync" };
            return Err(file_error(op, &state.inode.name, e.errno().unwrap_or(libc::EIO), format!("{e}")));
        }
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        drop((meta, state));
        self.sync_once(data_only)
    }

    fn sync_once(&self, data_only: bool) -> Result<()> {
        let fs = &self.fs;
        let op = if data_only { "fdatasync" } else { "fsync" };
        // What a program stored into a writable map is the file's data too.
        self.write_back_mirrors()?;
        // Every write this call must make durable is counted by now.
        let mine = self.node.writes.load(Ordering::Acquire);
        {
            let state = self.state_read();
            self.live(&state, op)?;
            // (fdatasync needs no time a direct overwrite noted: no commit for it.)
            let time_pending = if data_only { state.mtime_unstored } else { state.mtime_pending() };
            if !state.pending() && !time_pending {
                let tid = if data_only { state.layout_tid } else { state.meta_tid };
                drop(state);
                return self.sync_clean(tid);
            }
        }
        // Covered: a sync job of another thread, taken after every write this call
        // covers, made them durable; what was written since is its writers' to sync.
        // Threads appending records to one block of a log, each with an fdatasync,
        // rewrote the block one after the other.
        let covered = |state: &NodeState| {
            data_only
                && state.live
                && state.synced >= mine
                && state.synced > 0
                && fs.committed.load(Ordering::Acquire) >= state.layout_tid
                && fs.check_writable(op, &state.inode.name).is_ok()
        };
        let Some(mut state) = self.node.lock_settled_unless(fs, covered) else {
            fs.syncs.fetch_add(1, Ordering::Relaxed);
            fs.shared_commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.live(&state, op)?;
        fs.check_writable(op, &state.inode.name)?;
        if !data_only && !state.pending() && !state.mtime_unstored {
            // Only a direct overwrite's time is in memory: stored, and committed
            // without the file's lock, as above (a commit under it held every
            // direct write of the file back for the commit's device time).
            state.store_pending_mtime(fs)?;
            let tid = state.meta_tid;
            drop(state);
            return self.sync_clean(tid);
        }
        if data_only && overwrites_only(fs, &state) {
            // What the kernel's file systems do for an fdatasync of overwrites: the data
            // with forced unit access, and no journal commit (nothing the data needs is
            // pending). A database's log, rewritten in place and synced per commit,
            // journaled every sync's blocks and wrote them home again at checkpoints.
            // Written without the file's lock, as a job of the file: MariaDB writes the
            // next commits into its log while the last ones are being synced, and each
            // of those writes waited for the sync's device time.
            let job = state.take_for_sync(fs, self.node.writes.load(Ordering::Acquire));
            drop(state);
            fs.syncs.fetch_add(1, Ordering::Relaxed);
            fs.overwrite_syncs.fetch_add(1, Ordering::Relaxed);
            // The file's direct writes went to the device's cache: a flush covers them
            // unless one since did (the pages' own writes need none).
            let direct = self.node.direct_sent.load(Ordering::Acquire);
            let result = job.write_durable(&fs.disk).and_then(|()| fs.disk.flush_through(direct));
            // Settled now (the blocks marked written, the pages let go, or dirty again
            // if the write failed) unless whoever took the lock meanwhile settled it.
            self.state_write_for_write().settle(fs, false);
            return result;
        }
        // Dirty pages: write them back inside the commit, as the fsync path orders it.
        let wb = Writeback::take(fs, &mut state);
        let mut journal = match fs.journal.try_lock() {
            Ok(journal) => journal,
            Err(TryLockError::WouldBlock) => return group_commit(fs, wb, state),
            Err(TryLockError::Poisoned(_)) => panic!("journal lock poisoned"),
        };
        fs.syncs.fetch_add(1, Ordering::Relaxed);
        let result = fsync_path::commit(fs, &mut journal, Some((&wb, &mut state)));
        drop(journal);
        fs.end_commit();
        result.inspect_err(|_| wb.restore(fs, &mut state))
    }

    /// `fsync` or `fdatasync` of a file with nothing in memory only: what it
    /// needs is in transaction `tid` (committed, or committed now) and in the
    /// device's cache (flushed).
    fn sync_clean(&self, tid: u64) -> Result<()> {
        let fs = &self.fs;
        if fs.committed.load(Ordering::Acquire) >= tid {
            // Nothing of this file's metadata is pending: its data needs a flush only.
            fs.syncs.fetch_add(1, Ordering::Relaxed);
            fs.flush_only.fetch_add(1, Ordering::Relaxed);
            return fs.disk.flush();
        }
        fs.sync_through(tid) // counts itself
    }
}

/// Whether every dirty page of the file overwrites a block the device holds
/// as the file's (mapped and written, not preallocated), while the file's
/// size and block map are committed already and no such block has an image
/// in the journal (which replay would put back over it): an `fdatasync`
/// then needs the pages durable and nothing else.
fn overwrites_only(fs: &Inner, state: &NodeState) -> bool {
    if state.dirty.is_empty()
        || state.disk_size != state.inode.size
        || fs.committed.load(Ordering::Acquire) < state.layout_tid
    {
        return false;
    }
    let meta = fs.meta();
    state.dirty.keys().all(|&block| match extents::locate(&state.inode.extents, block) {
        Some((physical, false)) => !meta.journaled.contains(&physical),
        _ => false,
    })
}

/// An fsync that found another thread committing: rather than wait for the
/// journal and then commit alone, it writes its data now, while that commit
/// is under way, puts the block-map changes in the open transaction and
/// waits for that transaction to be committed: by whichever of the threads
/// that arrived meanwhile gets the journal first, for all of them (group
/// commit, as jbd2 does). Ordering holds: the data is on the device before
/// the transaction that vouches for it is taken, and every commit flushes
/// after taking its transaction and before writing its commit block.
fn group_commit(fs: &Inner, wb: Writeback, mut state: RwLockWriteGuard<'_, NodeState>) -> Result<()> {
    let t = fs.steps.start();
    if let Err(e) = wb.write(&fs.disk) {
        wb.restore(fs, &mut state);
        return Err(e);
    }
    wb.finish(fs, &mut state, true);
    drop(state);
    fs.steps.lap(t, |s| &s.fsync_data);
    // The open transaction: whoever commits it takes it after the write above
    // completed, so its flush covers this file's data even when the write
    // changed no metadata.
    let open = fs.meta().tid;
    fs.sync_through(open) // counts the sync
}

impl Clone for File {
    fn clone(&self) -> File {
        // From a live handle: the count is not zero, so no unlink can be deciding on it.
        self.node.handles.fetch_add(1, Ordering::AcqRel);
        File { fs: Arc::clone(&self.fs), node: Arc::clone(&self.node), direct: self.direct }
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.node.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.last_close();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::device::DeviceSpec;
    use crate::fs::{FileSystem, FormatOptions};
    use crate::{Engine, PathConfig};
    use std::sync::Arc;
    use std::time::Duration;

    fn engine(spec: &str) -> Arc<Engine> {
        let device = DeviceSpec::parse(spec, None).unwrap().open().unwrap();
        Arc::new(Engine::with_device(device, PathConfig::preset("sync-path").unwrap()).unwrap())
    }

    /// A direct overwrite whose modification time moves goes on while
    /// another holds the file's shared lock (as every direct write in flight
    /// does): it notes the time, where it waited for the exclusive lock.
    #[test]
    fn a_direct_overwrite_that_moves_the_time_waits_for_no_direct_write_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("emu:null,size=16m,file={}", dir.path().join("emu.img").display());
        FileSystem::format(engine(&spec), FormatOptions::default()).unwrap();
        let fs = FileSystem::mount(engine(&spec)).unwrap().0;
        drop(fs.create("f").unwrap());
        let direct = fs.open_direct("f").unwrap();
        direct.write_at(&[1; 8192], 0).unwrap(); // allocates: not an overwrite
        fs.set_mtime("f", 1_000_000_000).unwrap(); // the next write's time moves
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            // Dropped before the scope waits for the writer, even when an assert fails.
            let in_flight = direct.node.state.read().unwrap();
            s.spawn(|| tx.send(direct.write_at(&[2; 4096], 4096)).unwrap());
            let done = rx.recv_timeout(Duration::from_secs(20));
            assert!(matches!(done, Ok(Ok(()))), "the write waited for the shared lock's holder: {done:?}");
            assert!(in_flight.mtime_ns() > 1_000_000_000, "the time noted");
            drop(in_flight);
        });
        let mut back = vec![0; 8192];
        direct.read_at(&mut back, 0).unwrap();
        assert!(back[..4096] == [1; 4096] && back[4096..] == [2; 4096]);
    }

    /// An fsync of a file whose only change is the time a direct overwrite
    /// noted stores the inode under the file's lock and commits without it:
    /// the file's direct writes (which hold its shared lock) go on while the
    /// commit is at the device, where they waited for the commit's device time.
    #[test]
    fn an_fsync_of_a_direct_overwrites_time_commits_without_the_files_lock() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("emu:null,size=16m,file={}", dir.path().join("emu.img").display());
        FileSystem::format(engine(&spec), FormatOptions::default()).unwrap();
        // Every command of the mount comes back 200 ms late: long enough to look
        // at the file's lock while the fsync's commit is at the device.
        let fs = FileSystem::mount(engine(&format!("{spec},spike_rate=1,spike=200ms"))).unwrap().0;
        drop(fs.create("f").unwrap());
        let direct = fs.open_direct("f").unwrap();
        direct.write_at(&[1; 4096], 0).unwrap(); // allocates: not an overwrite
        fs.set_mtime("f", 1_000_000_000).unwrap(); // the next write's time moves
        fs.sync().unwrap(); // nothing pending: the fsync finds the journal free
        direct.write_at(&[2; 4096], 0).unwrap(); // an overwrite: its time is all that is pending
        assert!(direct.node.state.read().unwrap().mtime_pending(), "the overwrite noted its time");
        let syncs = || direct.fs.syncs.load(std::sync::atomic::Ordering::Relaxed);
        let before = syncs();
        std::thread::scope(|s| {
            let fsync = s.spawn(|| direct.fsync());
            // The fsync counts itself once it has stored the inode, just before it commits.
            let started = std::time::Instant::now();
            while syncs() == before && !fsync.is_finished() && started.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_micros(200));
            }
            // Its commit takes at least one 200 ms command, and the looks end inside it.
            let free = (0..100).any(|_| {
                let free = direct.node.state.try_read().is_ok();
                if !free {
                    std::thread::sleep(Duration::from_millis(1));
                }
                free
            });
            let finished = fsync.is_finished();
            assert!(free && !finished, "a direct write waited for the fsync's commit (lock free: {free})");
            fsync.join().unwrap().unwrap();
        });
        assert!(!direct.node.state.read().unwrap().mtime_pending(), "the time is stored");
    }
}
