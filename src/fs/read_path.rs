//! The two read paths: what happens between a page-cache miss and the data.
//!
//! - `conventional` does what Linux does (seed 002, Fig. 2), step after step
//!   before the device gets the command: allocate a page, insert it into the
//!   cache index (making room by eviction), map the block, build and send the
//!   command; then wait; then copy.
//! - `aios` does what seed 002's AIOS does: the page frame comes from a
//!   per-thread pool filled in advance, the block map is always in memory,
//!   the command goes straight to the thread's queue (a tag-indexed slot, no
//!   other layer), and only then, while the device works, is the page put in
//!   the index (lazy indexing) and the pool refilled. Two threads that miss
//!   the same block at once both read it; the first to index its page wins,
//!   the other's page is used for its own copy and then dropped (counted as
//!   a duplicate), so each ends with correct data and the cache with one page.

use super::cache::{Page, Speculative};
use super::disk::Batch;
use super::extents;
use super::format::{self, BLOCK, BLOCK_U64};
use super::{Inner, NodeState};
use crate::IoBuf;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

/// A load of pages under way, counted in its file's [`NodeState::loads`]
/// from before it reads anything until its pages are in the cache.
struct Loading<'a>(&'a NodeState);

impl<'a> Loading<'a> {
    /// Starts counting: one more in flight, and a new generation.
    fn start(state: &'a NodeState) -> Loading<'a> {
        state.loads.fetch_add(super::LOAD_STARTED, SeqCst);
        Loading(state)
    }
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        self.0.loads.fetch_sub(1, SeqCst);
    }
}

/// Which read path a mounted file system takes on a cache miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPath {
    /// Allocate, index, map, submit, wait, copy: one step after another.
    Conventional,
    /// Pooled pages, submit first, index and refill while the device works (seed 002).
    #[default]
    Aios,
}

impl ReadPath {
    /// Parses `conventional` or `aios`.
    pub fn parse(text: &str) -> Result<ReadPath> {
        match text {
            "conventional" => Ok(ReadPath::Conventional),
            "aios" => Ok(ReadPath::Aios),
            _ => Err(Error::spec("read path", text, "conventional or aios")),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Conventional => "conventional",
            ReadPath::Aios => "aios",
        }
    }
}

/// Page frames a thread keeps ready for the aios path.
const POOL_TARGET: usize = 64;

thread_local! {
    static POOL: RefCell<Vec<IoBuf>> = const { RefCell::new(Vec::new()) };
}

fn pool_take(fs: &Inner) -> IoBuf {
    // Fallback when the pool is empty: get a frame on the critical path, as AIOS does.
    POOL.with(|p| p.borrow_mut().pop()).unwrap_or_else(|| fs.cache.frame())
}

fn pool_refill(fs: &Inner) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        while p.len() < POOL_TARGET {
            p.push(fs.cache.frame());
        }
    });
}

/// Loads blocks missing from the cache and returns their pages, ready, in
/// order. The caller holds the file's lock (read or write).
pub(super) fn load(fs: &Inner, state: &NodeState, blocks: &[u64]) -> Result<Vec<Arc<Page>>> {
    match fs.options.read_path {
        ReadPath::Conventional => conventional(fs, state, blocks),
        ReadPath::Aios => aios(fs, state, blocks),
    }
}

/// Pages read-ahead sends at a time (looking at what has come back each
/// time) on a device that models each command's time (emulated). Measured
/// with sequential fsbench on `emu:optane`: every 4 and every 8 were alike
/// (88-91% of its peak), every 16, 32 and 64 pages 2-10% slower (the reader
/// waits for each larger batch).
const AHEAD_SEND_EVERY_MODELED: usize = 8;
/// ... and on a device whose every command takes the kernel's path: 128 KiB
/// commands, as ext4's read-ahead sends. On a loop device over /dev/shm
/// (`iopath fsbench --device uring:LOOP --workloads seqread --paths
/// conventional,aios --file-size 1g --cache 16m`, 2026-11-30), every 8 pages
/// read 1.7-2.0 GB/s and every 32 2.9-3.2 GB/s; 64 and 128 were alike
/// (2.9-3.5 GB/s). (On an older loop device every 8 and every 16 were
/// alike, 1.0-1.1 GB/s.)
const AHEAD_SEND_EVERY_KERNEL: usize = 32;

/// Read-ahead's loader. Each page is indexed and then its read queued, one
/// after another (readers that catch up find the page and wait for it,
/// never read it again); every few pages what is queued is sent, and each
/// page is marked ready as soon as its own read is back. The device starts
/// at once: indexing a whole 128-page window before sending anything left
/// it idle ~45 us of every ~210 us window on `emu:optane` (sequential reads
/// at 74-76% of its peak; indexing the window in one pass after sending its
/// first pages still gave 80%). Returns how many pages it loaded; pages
/// already cached or being loaded by someone else are skipped.
pub(super) fn load_ahead(fs: &Inner, state: &NodeState, blocks: &[u64]) -> Result<usize> {
    let _loading = Loading::start(state);
    let mut runs = Runs::default();
    let mut batch = fs.disk.batch()?;
    let mut mine: Vec<Arc<Page>> = Vec::with_capacity(blocks.len());
    let mut failed = None;
    let mut finish = |runs: &Runs, mine: &[Arc<Page>], tag: u64, r: Result<()>| {
        runs.done(fs, state, mine, tag, r.is_ok());
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
    };
    let mut sent = Ok(());
    let mut queued = 0;
    let send_every = if fs.disk.modeled() { AHEAD_SEND_EVERY_MODELED } else { AHEAD_SEND_EVERY_KERNEL };
    for &block in blocks {
        let t = fs.steps.start();
        let page = Page::loading((state.cache_id, block), fs.cache.frame());
        page.mark_speculative(Speculative::Ahead);
        let t = fs.steps.lap(t, |s| &s.alloc);
        let there = fs.cache.insert(&page);
        let t = fs.steps.lap(t, |s| &s.insert);
        if !Arc::ptr_eq(&there, &page) {
            continue;
        }
        mine.push(page);
        if mine.len() - queued == send_every {
            // The pages indexed since the last send, in runs.
            sent = runs.start(state, &mut batch, &mine, queued);
            queued = mine.len();
            if sent.is_ok() {
                sent = batch.take_done(|tag, r| finish(&runs, &mine, tag, r));
            }
        }
        fs.steps.lap(t, |s| &s.submit);
        if sent.is_err() {
            break;
        }
    }
    if sent.is_ok() && queued < mine.len() {
        sent = runs.start(state, &mut batch, &mine, queued);
    }
    let result = sent.and_then(|()| batch.wait_each(|tag, r| finish(&runs, &mine, tag, r)));
    // The rest: pages with nothing to read (zeroed), or left over by an error.
    let unfinished: Vec<Arc<Page>> = mine.iter().filter(|p| !p.ready() && !p.failed()).cloned().collect();
    complete(fs, state, &unfinished, result.and(failed.map_or(Ok(()), Err)))?;
    Ok(mine.len())
}

fn conventional(fs: &Inner, state: &NodeState, blocks: &[u64]) -> Result<Vec<Arc<Page>>> {
    let _loading = Loading::start(state);
    let mut out = Vec::with_capacity(blocks.len());
    let mut mine = Vec::new();
    for &block in blocks {
        let t = fs.steps.start();
        let page = Page::loading((state.cache_id, block), fs.cache.frame());
        let t = fs.steps.lap(t, |s| &s.alloc);
        let indexed = fs.cache.insert(&page);
        fs.steps.lap(t, |s| &s.insert);
        if Arc::ptr_eq(&indexed, &page) {
            mine.push(page);
        }
        out.push(indexed);
    }
    let t = fs.steps.start();
    if let [page] = &mine[..]
        && let Some((physical, false)) = extents::locate(&state.inode.extents, page.key.1)
    {
        // One page: the blocking call, sent and waited for in one step (one system
        // call on io_uring), as a synchronous readpage does; or the carried cache's frame.
        let result = match fs.disk.lend_carried(physical) {
            Some(frame) => {
                page.data.write().expect("page lock poisoned").buf = frame;
                Ok(())
            }
            None => fs.disk.read(physical, &mut page.data.write().expect("page lock poisoned").buf),
        };
        fs.steps.lap(t, |s| &s.device);
        complete(fs, state, &mine, result)?;
        return wait_for_others(fs, out);
    }
    // Declared before the batch: its buffers outlive the batch's reads (dropping waits).
    let mut runs = Runs::default();
    let mut batch = fs.disk.batch()?;
    let sent = runs.start(state, &mut batch, &mine, 0).and_then(|()| batch.send());
    let t = fs.steps.lap(t, |s| &s.submit);
    // Each page is ready as soon as its own read is back: a reader (of a read-ahead
    // window, say) spinning on it goes on while the rest are in flight. Readers that
    // went to sleep are woken once, at the end: a wake-up per page cost a cross-CPU
    // wake-up each and halved sequential reads on io_uring (1,400 to 540-950 MB/s).
    let result = sent.and_then(|()| {
        let mut first = None;
        let waited = batch.wait_each(|tag, r| {
            runs.done(fs, state, &mine, tag, r.is_ok());
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        });
        waited.and(first.map_or(Ok(()), Err))
    });
    fs.steps.lap(t, |s| &s.device);
    // The rest: pages with nothing to read (zeroed), or left over by an error.
    let unfinished: Vec<Arc<Page>> = mine.iter().filter(|p| !p.ready() && !p.failed()).cloned().collect();
    complete(fs, state, &unfinished, result)?;
    wait_for_others(fs, out)
}

fn aios(fs: &Inner, state: &NodeState, blocks: &[u64]) -> Result<Vec<Arc<Page>>> {
    let _loading = Loading::start(state);
    let t = fs.steps.start();
    let mine: Vec<Arc<Page>> = blocks.iter().map(|&b| Page::loading((state.cache_id, b), pool_take(fs))).collect();
    let t = fs.steps.lap(t, |s| &s.alloc);
    let mut runs = Runs::default();
    let mut batch = fs.disk.batch()?;
    let sent = runs.start(state, &mut batch, &mine, 0).and_then(|()| batch.send());
    let t = fs.steps.lap(t, |s| &s.submit);
    // While the device works: index the pages, refill the pool.
    let mut indexed = Vec::with_capacity(mine.len());
    if sent.is_ok() {
        for page in &mine {
            let there = fs.cache.insert(page);
            if !Arc::ptr_eq(&there, page) {
                fs.cache.count_duplicate();
            }
            indexed.push(there);
        }
        pool_refill(fs);
    }
    let t = fs.steps.lap(t, |s| &s.insert);
    let result = sent.and_then(|()| {
        let mut first = None;
        let waited = batch.wait_each(|tag, r| {
            runs.copy_in(&mine, tag, r.is_ok());
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        });
        waited.and(first.map_or(Ok(()), Err))
    });
    fs.steps.lap(t, |s| &s.device);
    complete(fs, state, &mine, result)?;
    // Each caller reads its own page: correct either way, and a duplicate is then dropped.
    Ok(mine)
}

/// Longest run of pages read with one command (128 KiB).
const RUN_BLOCKS: usize = 32;

/// The reads of a batch of pages. Pages whose blocks lie next to each other
/// on the device are read with one command into one buffer, copied into
/// their frames when it is back: a command costs far more than a copy of
/// 4 KiB on a kernel device (a loop device's worker takes each in turn; a
/// random 16 KiB read was four of them). A page alone is read into its
/// frame. Read `i` completes with tag `i`.
#[derive(Default)]
struct Runs {
    /// Each read: its pages (indices into the batch's pages) and, for a run,
    /// the buffer it lands in.
    reads: Vec<(std::ops::Range<usize>, Option<IoBuf>)>,
}

impl Runs {
    /// Queues the reads of `pages[from..]` (zero-filling the ones in holes or
    /// not yet written); earlier pages were queued by earlier calls.
    fn start<'a>(&mut self, state: &NodeState, batch: &mut Batch<'a>, pages: &[Arc<Page>], from: usize) -> Result<()> {
        // One command per run: a run the batch would split would complete in pieces.
        let longest = RUN_BLOCKS.min(batch.max_io_blocks());
        // Pages the carried cache holds take its frames and need no read (without
        // one, nothing is allocated here: this runs on every miss).
        let lent: Vec<bool> = if batch.carrying() {
            pages[from..]
                .iter()
                .map(|page| match extents::locate(&state.inode.extents, page.key.1) {
                    Some((physical, false)) => batch.lend_carried(physical).is_some_and(|frame| {
                        page.data.write().expect("page lock poisoned").buf = frame;
                        true
                    }),
                    _ => false,
                })
                .collect()
        } else {
            Vec::new()
        };
        let lent = |i: usize| lent.get(i - from).copied().unwrap_or(false);
        let mut i = from;
        while i < pages.len() {
            if lent(i) {
                i += 1;
                continue;
            }
            let Some((physical, false)) = extents::locate(&state.inode.extents, pages[i].key.1) else {
                pages[i].data.write().expect("page lock poisoned").buf.fill(0);
                i += 1;
                continue;
            };
            let mut end = i + 1;
            while end < pages.len()
                && end - i < longest
                && !lent(end)
                && pages[end].key.1 == pages[end - 1].key.1 + 1
                && extents::locate(&state.inode.extents, pages[end].key.1) == Some((physical + (end - i) as u64, false))
            {
                end += 1;
            }
            let tag = self.reads.len() as u64;
            if end - i == 1 {
                let ptr = pages[i].data.write().expect("page lock poisoned").buf.as_mut_ptr();
                self.reads.push((i..end, None));
                // SAFETY: the page is loading: nobody reads or writes its bytes until it is
                // marked ready or failed, which happens after this batch is waited for (or
                // dropped, which waits too); the frame lives as long as `pages` does.
                unsafe { batch.read_raw(physical, ptr, BLOCK, tag)? };
            } else {
                let mut buf = IoBuf::for_overwrite((end - i) * BLOCK);
                let ptr = buf.as_mut_ptr();
                let len = buf.len();
                self.reads.push((i..end, Some(buf)));
                // SAFETY: the buffer is kept in `self.reads`, which outlives the batch (the
                // caller declares it first), and nothing touches it until its read is back.
                unsafe { batch.read_raw(physical, ptr, len, tag)? };
            }
            i = end;
        }
        Ok(())
    }

    /// Read `tag` is back: a run's buffer is copied into its pages' frames.
    fn copy_in(&self, pages: &[Arc<Page>], tag: u64, ok: bool) {
        let (range, buf) = &self.reads[tag as usize];
        if let (true, Some(buf)) = (ok, buf) {
            for (k, i) in range.clone().enumerate() {
                pages[i]
                    .data
                    .write()
                    .expect("page lock poisoned")
                    .buf
                    .copy_from_slice(&buf[k * BLOCK..(k + 1) * BLOCK]);
            }
        }
    }

    /// Read `tag` is back: its pages get their bytes and are marked ready (or failed).
    fn done(&self, fs: &Inner, state: &NodeState, pages: &[Arc<Page>], tag: u64, ok: bool) {
        self.copy_in(pages, tag, ok);
        for i in self.reads[tag as usize].0.clone() {
            finish_page(fs, state, &pages[i], ok);
        }
    }
}

/// Marks a loaded page ready (zeroing what lies past the end of the file) or failed.
fn finish_page(fs: &Inner, state: &NodeState, page: &Arc<Page>, ok: bool) {
    if ok {
        let size = state.inode.size;
        let start = page.key.1 * BLOCK_U64;
        if size < start + BLOCK_U64 {
            let from = size.saturating_sub(start) as usize;
            let tail = &mut page.data.write().expect("page lock poisoned").buf[from..];
            // Looked at first: a frame lent by the carried cache is zero there already,
            // and writing it would make the kernel copy it.
            if !format::all_zero(tail) {
                tail.fill(0);
            }
        }
        page.set_ready();
    } else {
        fs.cache.remove(page);
        page.set_failed();
    }
}

/// Marks loaded pages ready or, if `result` is an error, failed; wakes their waiters.
fn complete(fs: &Inner, state: &NodeState, pages: &[Arc<Page>], result: Result<()>) -> Result<()> {
    for page in pages {
        finish_page(fs, state, page, result.is_ok());
    }
    fs.cache.loaded();
    result
}

/// Waits for pages other threads are loading; a failed one is loaded again here.
fn wait_for_others(fs: &Inner, pages: Vec<Arc<Page>>) -> Result<Vec<Arc<Page>>> {
    let mut out = Vec::with_capacity(pages.len());
    for page in pages {
        if fs.cache.wait_loaded(&page) {
            out.push(page);
        } else {
            return Err(Error::Device { op: "read", offset: page.key.1 * BLOCK_U64, len: BLOCK_U64, errno: libc::EIO });
        }
    }
    Ok(out)
}
