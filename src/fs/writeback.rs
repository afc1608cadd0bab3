//! Writeback: dirty cached pages to the device, one file's or many files'
//! together, and the dirty budget that bounds how much of the cache written
//! data may hold.
//!
//! A write through the cache only dirties pages. `fsync`, `fdatasync`, a
//! truncate, a direct access to the file, a file system `sync` (and so an
//! unmount or a process's exit), or the budget write them back. Many files
//! go out together: every file's runs are in flight in one batch, so a
//! `sync` after thousands of small files (`tar x`) costs about one device
//! round trip per batch, not one per file.
//!
//! The budget (the kernel's dirty ratios, in small): every file with dirty
//! pages is in a queue, oldest first; when more than half the cache is
//! dirty, the writer that crossed the line writes back the oldest files,
//! together, until a quarter is, then goes on. Without it a program that
//! writes many small files and never syncs them pinned every page it wrote
//! in memory until it exited (dirty pages cannot be evicted), and wrote
//! them all back then, file after file.

use super::cache::Page;
use super::disk::{Batch, Disk};
use super::format::{BLOCK, Block, zero_block};
use super::{Inner, MAX_IO_BLOCKS, Node, NodeState, extents};
use crate::IoBuf;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLockWriteGuard};

/// Files written back together at most (each one's lock is held meanwhile).
const FILES_PER_BATCH: usize = 256;

/// Pages copied out for one batch at most (2 MiB). Two batches' copies are
/// alive at once (one in flight, the next being copied), and small ones stay
/// in the CPU's cache while the carried cache's stage and the device read
/// them: with 16 MiB batches (32 MiB of copies, this machine's whole L3 and
/// fresh memory to fault in) the exit of `tar cf` of /usr/include took
/// 64.7-78.1 ms to commit, with 2 MiB 57.1-67.3 ms.
const PAGES_PER_BATCH: usize = 512;

/// Below this many queued files the queue is never pruned of clean ones.
const PRUNE_FLOOR: usize = 1024;

/// A file's dirty pages copied out for writing: contiguous ones in one buffer.
pub(super) struct Writeback {
    /// (device block, buffer of whole blocks); empty where a batch of many
    /// files holds the copies ([`take_batch`]).
    runs: Vec<(u64, RunBuf)>,
    /// The device block of each page, in the order of `pages`.
    physical: Vec<u64>,
    /// The file blocks and their pages, as they were taken from the dirty set.
    pages: BTreeMap<u64, Arc<Page>>,
}

/// A run's copy: the first `len` bytes of a buffer whose size is a power of
/// two blocks, so that the pool hands the same few sizes back (a buffer of
/// each size a process needs first is cut from its frame file: fresh
/// memory is a fault and zeroing per 4 KiB).
pub(super) struct RunBuf {
    buf: IoBuf,
    len: usize,
}

impl std::ops::Deref for RunBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Pages by device block, copied out into one buffer per run of consecutive
/// blocks (at most [`MAX_IO_BLOCKS`]), each page marked clean as it is
/// copied: (device block, buffer, the `owner` of each run's pages).
fn copy_runs<T: Copy + PartialEq>(located: &[(u64, T, &Arc<Page>)]) -> Vec<(u64, RunBuf, Vec<T>)> {
    let mut out: Vec<(u64, RunBuf, Vec<T>)> = Vec::new();
    let mut i = 0;
    while i < located.len() {
        let mut end = i + 1;
        while end < located.len() && located[end].0 == located[end - 1].0 + 1 && end - i < MAX_IO_BLOCKS as usize {
            end += 1;
        }
        let mut buf = IoBuf::for_overwrite((end - i).next_power_of_two() * BLOCK);
        let mut owners: Vec<T> = Vec::new();
        for (k, (_, owner, page)) in located[i..end].iter().enumerate() {
            let mut data = page.data.write().expect("page lock poisoned");
            buf[k * BLOCK..(k + 1) * BLOCK].copy_from_slice(&data.buf);
            data.dirty = false;
            if owners.last() != Some(owner) {
                owners.push(*owner);
            }
        }
        out.push((located[i].0, RunBuf { buf, len: (end - i) * BLOCK }, owners));
        i = end;
    }
    out
}

impl Writeback {
    /// Copies the file's dirty pages out (clearing their dirty mark; `restore` puts it back).
    pub(super) fn take(fs: &Inner, state: &mut NodeState) -> Writeback {
        Self::take_up_to(fs, state, usize::MAX)
    }

    /// [`Writeback::take`] of the file's first `limit` dirty pages (by block); the rest stay dirty.
    pub(super) fn take_up_to(fs: &Inner, state: &mut NodeState, limit: usize) -> Writeback {
        Self::take_pages_up_to(fs, state, limit).copied()
    }

    /// Its pages copied out into runs (each marked clean as it is copied).
    fn copied(mut self) -> Writeback {
        self.runs = copy_runs(&self.located()).into_iter().map(|(physical, buf, _)| (physical, buf)).collect();
        self
    }

    /// The file's first `limit` dirty pages (by block), taken from its dirty
    /// set but not copied yet (nor marked clean): [`take_batch`] copies them
    /// with other files' into runs that cross from one file to the next.
    /// No write-behind job of the file is in flight (its lock was taken with
    /// [`Node::lock_settled`], or the file's jobs settled): a block is never
    /// in flight twice.
    fn take_pages_up_to(fs: &Inner, state: &mut NodeState, limit: usize) -> Writeback {
        debug_assert!(!state.stream.busy(), "pages taken while a write-behind job of the file is in flight");
        Self::take_pages(fs, state, u64::MAX, limit)
    }

    /// Up to `limit` of the file's dirty pages below block `below`, pinned
    /// and then copied out (and marked clean) for a write-behind job
    /// ([`super::behind`]), which writes them while jobs before it may still
    /// be in flight (the flusher writes them one after the other). Pinned
    /// first: a page marked clean and not yet pinned could be evicted, and
    /// its block, not marked written, would read as a hole.
    pub(super) fn take_behind(fs: &Inner, state: &mut NodeState, below: u64, limit: usize) -> Writeback {
        let wb = Self::take_pages(fs, state, below, limit);
        wb.pin(true);
        wb.copied()
    }

    fn take_pages(fs: &Inner, state: &mut NodeState, below: u64, limit: usize) -> Writeback {
        let mut left = state.dirty.split_off(&below);
        let mut pages = std::mem::take(&mut state.dirty);
        if pages.len() > limit
            && let Some(&first_left) = pages.keys().nth(limit)
        {
            let mut rest = pages.split_off(&first_left);
            rest.append(&mut left);
            left = rest;
        }
        state.dirty = left;
        fs.dirty.forget(pages.len());
        let physical = pages
            .keys()
            .map(|&block| extents::locate(&state.inode.extents, block).expect("a dirty page's block is mapped").0)
            .collect();
        Writeback { runs: Vec::new(), physical, pages }
    }

    /// Pins its pages in the cache (or lets them go): see [`Page::pinned`].
    pub(super) fn pin(&self, on: bool) {
        self.pages.values().for_each(|p| p.pinned.store(on, Ordering::Relaxed));
    }

    /// How many pages it writes.
    pub(super) fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Its pages by file block.
    pub(super) fn taken(&self) -> impl Iterator<Item = (&u64, &Arc<Page>)> {
        self.pages.iter()
    }

    /// Its pages with their device blocks, in file-block order: (device block, (), page).
    fn located(&self) -> Vec<(u64, (), &Arc<Page>)> {
        self.physical.iter().zip(self.pages.values()).map(|(&physical, page)| (physical, (), page)).collect()
    }

    /// Whether there is nothing to write.
    pub(super) fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Queues the writes on a batch; their completions carry `tag`.
    pub(super) fn submit<'a>(&'a self, batch: &mut Batch<'a>, tag: u64) -> Result<()> {
        for (physical, buf) in &self.runs {
            batch.write_tagged(*physical, buf, tag)?;
        }
        Ok(())
    }

    /// Writes everything, all in flight together, and waits.
    pub(super) fn write(&self, disk: &Disk) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let mut batch = disk.batch()?;
        self.submit(&mut batch, 0)?;
        batch.wait()
    }

    /// Writes everything with forced unit access, all in flight together,
    /// and waits: the data is durable when this returns (no flush of the
    /// rest of the device's cache, no commit).
    pub(super) fn write_durable(&self, disk: &Disk) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let mut batch = disk.batch()?;
        for (physical, buf) in &self.runs {
            batch.write_fua(*physical, buf)?;
        }
        batch.wait()
    }

    /// The device blocks written, in file-block order.
    pub(super) fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.physical.iter().copied()
    }

    /// The blocks and their contents, one image per block (what the `journaled`
    /// fsync path puts in its transaction).
    pub(super) fn images(&self) -> Vec<(u64, Block)> {
        let mut out = Vec::new();
        for (physical, buf) in &self.runs {
            for (i, chunk) in buf.chunks(BLOCK).enumerate() {
                let mut image = zero_block();
                image.copy_from_slice(chunk);
                out.push((physical + i as u64, image));
            }
        }
        out
    }

    /// The data is (or, on the aios fsync path, is about to be) on the device:
    /// mark the blocks written in the file's map. `in_place`: the data is
    /// written to its blocks only, not also journaled (every caller but the
    /// `journaled` fsync path's own data), so the transaction that takes
    /// these changes must order its commit behind the data.
    pub(super) fn finish(&self, fs: &Inner, state: &mut NodeState, in_place: bool) {
        self.finish_part(fs, state, in_place, false)
    }

    /// [`Writeback::finish`] of one part of the file's pages while `more` of
    /// them are taken and not written yet (the next batch of
    /// [`write_together`], in flight or about to be): the size the inode
    /// records stays where it is until the last part is written, or a commit
    /// meanwhile could record a size over blocks that hold nothing yet.
    pub(super) fn finish_part(&self, fs: &Inner, state: &mut NodeState, in_place: bool, more: bool) {
        if self.is_empty() && !state.mtime_unstored {
            return;
        }
        let mut meta = fs.meta();
        if in_place && !self.is_empty() && meta.wrote_in_place(|| self.blocks()) {
            // An older image of one of these blocks is in the journal: the next fsync
            // must commit (and that commit checkpoints first), not just flush.
            state.meta_tid = meta.tid;
            state.layout_tid = meta.tid;
        }
        let mut changed = false;
        // One call per run of consecutive blocks (the pages are in block order).
        let mut blocks = self.pages.keys().copied().peekable();
        while let Some(first) = blocks.next() {
            let mut end = first + 1;
            while blocks.next_if_eq(&end).is_some() {
                end += 1;
            }
            changed |= extents::mark_written(&mut state.inode.extents, first, end);
        }
        if !more && state.dirty.is_empty() && state.disk_size != state.inode.size {
            // Everything below the size is on the device now: the inode may say so.
            state.disk_size = state.inode.size;
            changed = true;
        }
        // Marking a part of an unwritten extent splits it: the map can grow past an
        // overflow block, which comes from the reserve data allocations leave
        // ([`super::Meta::allocate_data`]). Should even that be gone, the file's next
        // fsync says so ([`super::NodeState::map_unstored`]).
        if changed || state.mtime_unstored {
            match state.store(fs, &mut meta) {
                Ok(()) => {
                    state.meta_tid = meta.tid;
                    // A new modification time alone is not what fdatasync waits for: a
                    // file rewritten in place and synced so (a database's log) would
                    // commit at every sync for the time of the write before.
                    if changed {
                        state.layout_tid = meta.tid;
                    }
                }
                Err(_) if changed => state.note_map_unstored(fs),
                Err(_) => {}
            }
        }
        fs.cache.count_writeback(self.pages.len() as u64);
    }

    /// The write failed: the pages are dirty again (a page the file wrote
    /// anew meanwhile stays as it is now), and back in the cache if it
    /// evicted them while they were clean ([`super::cache::PageCache::reinstate`]).
    pub(super) fn restore(&self, fs: &Inner, state: &mut NodeState) {
        for (&block, page) in &self.pages {
            if let std::collections::btree_map::Entry::Vacant(slot) = state.dirty.entry(block) {
                page.data.write().expect("page lock poisoned").dirty = true;
                fs.cache.reinstate(page);
                slot.insert(Arc::clone(page));
                fs.dirty.pages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Every dirty page of `state` to the device, waited for (no commit).
pub(super) fn write_back_file(fs: &Inner, state: &mut NodeState) -> Result<()> {
    if !state.pending() {
        return Ok(());
    }
    write_together(fs, &mut [state], false)
}

/// The dirty pages of every file, and the files that hold them.
#[derive(Default)]
pub(super) struct DirtyFiles {
    /// Pages dirty in all files together.
    pages: AtomicUsize,
    /// Files that may hold dirty pages, oldest first, each at most once
    /// ([`Node::queued`]); every file with dirty pages is here (or in the
    /// hands of a thread writing it back, which puts it back if it stays
    /// dirty).
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    files: VecDeque<Arc<Node>>,
    /// Length above which adding a file first drops the clean ones.
    prune_at: usize,
}

impl DirtyFiles {
    /// Pages dirty now.
    pub(super) fn pages(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }

    /// `n` dirty pages left the dirty sets (taken for writing, or dropped with their file).
    pub(super) fn forget(&self, n: usize) {
        let before = self.pages.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "dirty page count below zero: {before} - {n}");
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("dirty queue poisoned")
    }

    /// Puts `node` at the back of the queue if it is not in it; the caller
    /// holds its state lock.
    fn enqueue(&self, node: &Arc<Node>) {
        // Called for every page a write dirties: a plain load first, no
        // read-modify-write of the flag while the file stays queued.
        if node.queued.load(Ordering::Acquire) || node.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut q = self.queue();
        if q.files.len() >= q.prune_at.max(PRUNE_FLOOR) {
            // Files synced or written back by their own fsync stay queued until
            // popped: drop the clean ones (their flag under their lock, so a
            // writer that dirties one meanwhile queues it again), else a program
            // that makes, syncs and deletes a file per transaction grew the queue
            // for ever. A file whose lock is busy stays.
            q.files.retain(|n| match n.state.try_read() {
                Ok(s) if s.dirty.is_empty() => {
                    n.queued.store(false, Ordering::Release);
                    false
                }
                _ => true,
            });
            q.prune_at = 2 * q.files.len();
        }
        q.files.push_back(Arc::clone(node));
    }
}

impl NodeState {
    /// Marks `page` (the file's block `block`) dirty; `node` is this state's file.
    pub(super) fn dirty_page(&mut self, fs: &Inner, node: &Arc<Node>, block: u64, page: Arc<Page>) {
        node.writes.fetch_add(1, Ordering::Release);
        if self.dirty.insert(block, page).is_none() {
            fs.dirty.pages.fetch_add(1, Ordering::Relaxed);
        }
        fs.dirty.enqueue(node);
    }
}

/// The budget: if more than half the cache is dirty, writes back the oldest
/// files together until a quarter is. The caller holds `own`'s lock (as
/// `state`): that file is written with the others if its turn comes; a file
/// another thread holds is left for later.
pub(super) fn keep_to_budget(fs: &Inner, own: &Arc<Node>, state: &mut NodeState) -> Result<()> {
    let capacity = fs.cache.capacity();
    if fs.dirty.pages() <= capacity / 2 {
        return Ok(());
    }
    while fs.dirty.pages() > capacity / 4 {
        // The oldest files, as many as a batch takes.
        let picked: Vec<Arc<Node>> = {
            let mut q = fs.dirty.queue();
            let n = q.files.len().min(FILES_PER_BATCH);
            q.files.drain(..n).collect()
        };
        if picked.is_empty() {
            return Ok(());
        }
        // Their locks without waiting: one another thread holds goes back in the queue.
        let mut back = Vec::new();
        let mut guards: Vec<(&Arc<Node>, RwLockWriteGuard<'_, NodeState>)> = Vec::new();
        let mut own_picked = false;
        let mut pages = 0;
        for node in &picked {
            if pages >= PAGES_PER_BATCH {
                back.push(Arc::clone(node));
            } else if Arc::ptr_eq(node, own) {
                own_picked = true;
                pages += state.dirty.len();
            } else {
                match node.state.try_write() {
                    Ok(g) if g.dirty.is_empty() => node.queued.store(false, Ordering::Release),
                    Ok(g) => {
                        pages += g.dirty.len();
                        guards.push((node, g));
                    }
                    Err(_) => back.push(Arc::clone(node)),
                }
            }
        }
        let mut states: Vec<&mut NodeState> = guards.iter_mut().map(|(_, g)| &mut **g).collect();
        if own_picked {
            states.push(&mut *state);
        }
        let wrote = !states.is_empty();
        let result = write_together(fs, &mut states, false);
        drop(states);
        // Written: out of the queue. Still dirty (its write failed): back in it.
        for (node, g) in &guards {
            if g.dirty.is_empty() {
                node.queued.store(false, Ordering::Release);
            } else {
                back.push(Arc::clone(node));
            }
        }
        if own_picked {
            if state.dirty.is_empty() {
                own.queued.store(false, Ordering::Release);
            } else {
                back.push(Arc::clone(own));
            }
        }
        drop(guards);
        fs.dirty.queue().files.extend(back);
        result?;
        if !wrote {
            return Ok(()); // every file it found was busy or clean: a later write goes on
        }
    }
    Ok(())
}

/// Every file's dirty pages to the device, many files together (a file
/// system `sync`; no commit). The caller holds no file's lock. With
/// `stage`, what each batch writes is also copied into the carried cache
/// while the batch is in flight ([`super::carry::CarriedCache::stage`]):
/// for a save that follows.
pub(super) fn write_back_all(fs: &Inner, nodes: Vec<Arc<Node>>, stage: bool) -> Result<()> {
    let mut pending: VecDeque<Arc<Node>> = nodes.into();
    while !pending.is_empty() {
        let n = pending.len().min(FILES_PER_BATCH);
        let group: Vec<Arc<Node>> = pending.drain(..n).collect();
        // The first file of a batch is waited for (nothing else is held then);
        // the others are taken only if free, else they come again later.
        let mut guards = vec![group[0].state.write().expect("file lock poisoned")];
        let mut pages = guards[0].dirty.len();
        for node in &group[1..] {
            if pages >= PAGES_PER_BATCH {
                pending.push_back(Arc::clone(node));
                continue;
            }
            match node.state.try_write() {
                Ok(g) => {
                    pages += g.dirty.len();
                    guards.push(g);
                }
                Err(_) => pending.push_back(Arc::clone(node)),
            }
        }
        // A time a direct overwrite noted: no writeback of pages stores it (a file
        // with pages or jobs to settle has its time stored by their writeback).
        for state in guards.iter_mut().filter(|g| g.live && !g.pending()) {
            state.store_pending_mtime(fs)?;
        }
        let mut states: Vec<&mut NodeState> =
            guards.iter_mut().filter(|g| g.live && g.pending()).map(|g| &mut **g).collect();
        write_together(fs, &mut states, stage)?;
    }
    Ok(())
}

/// Writes the dirty pages of every file in `states` back, in batches of at
/// most [`PAGES_PER_BATCH`] pages all in flight together, each waited for
/// before the next is sent (their buffers come back to the pool warm: fresh
/// memory for a whole large file's copy cost more than the writes; and a
/// block written again is never in flight twice). The next batch is copied
/// out while the one before is in flight: the copy no longer waits for the
/// device, nor the device for the copy. A file whose write failed keeps its
/// pages dirty; the first error is returned.
fn write_together(fs: &Inner, states: &mut [&mut NodeState], stage: bool) -> Result<()> {
    // The files' write-behind jobs first: a block is never in flight twice.
    states.iter_mut().for_each(|s| s.settle(fs, true));
    let carry = fs.disk.carry().filter(|_| stage);
    let mut current = take_batch(fs, states);
    while !current.runs.is_empty() {
        let mut next = Taken::default();
        let (failed, first_error) = write_batch(fs, &current, states.len(), || {
            if let Some(carry) = carry {
                for (physical, buf, _) in &current.runs {
                    carry.stage(*physical, buf);
                }
            }
            next = take_batch(fs, states)
        });
        for (i, ((wb, state), failed)) in current.writebacks.into_iter().zip(states.iter_mut()).zip(failed).enumerate()
        {
            if failed {
                wb.restore(fs, state);
            } else {
                let more = next.writebacks.get(i).is_some_and(|w| !w.is_empty());
                wb.finish_part(fs, state, true, more);
            }
        }
        if let Some(e) = first_error {
            // The batch taken meanwhile was never sent: dirty again.
            for (wb, state) in next.writebacks.into_iter().zip(states.iter_mut()) {
                wb.restore(fs, state);
            }
            return Err(e);
        }
        current = next;
    }
    Ok(())
}

/// One batch of [`write_together`]: each file's taken pages, and their
/// copies in runs of consecutive device blocks, across files.
#[derive(Default)]
struct Taken {
    /// One per file, in order.
    writebacks: Vec<Writeback>,
    /// (device block, data, the files whose pages it holds).
    runs: Vec<(u64, RunBuf, Vec<usize>)>,
}

/// Up to [`PAGES_PER_BATCH`] dirty pages of `states`, the files' in turn,
/// copied out in runs of consecutive device blocks whichever file they are
/// of: small files written one after another lie one after another, and a
/// run is one device command (`cp -r` of /usr/include: 7,800 files, a
/// command each when each file's pages went alone).
fn take_batch(fs: &Inner, states: &mut [&mut NodeState]) -> Taken {
    let mut budget = PAGES_PER_BATCH;
    let writebacks: Vec<Writeback> = states
        .iter_mut()
        .map(|s| {
            let wb = Writeback::take_pages_up_to(fs, s, budget);
            budget -= wb.pages.len();
            wb
        })
        .collect();
    let mut located: Vec<(u64, usize, &Arc<Page>)> = Vec::new();
    for (i, wb) in writebacks.iter().enumerate() {
        located.extend(wb.located().into_iter().map(|(physical, (), page)| (physical, i, page)));
    }
    located.sort_unstable_by_key(|&(physical, _, _)| physical);
    debug_assert!(located.windows(2).all(|w| w[0].0 < w[1].0), "a device block is written once per batch");
    let runs = copy_runs(&located);
    Taken { writebacks, runs }
}

/// Sends one batch of [`write_together`], runs `meanwhile` while it is in
/// flight, and waits for it: which of the `files` files' writes failed, and
/// the first error.
fn write_batch(fs: &Inner, taken: &Taken, files: usize, meanwhile: impl FnOnce()) -> (Vec<bool>, Option<Error>) {
    let mut failed = vec![false; files];
    let mut first_error = None;
    match fs.disk.batch() {
        Err(e) => {
            failed.iter_mut().for_each(|f| *f = true);
            first_error = Some(e);
            meanwhile();
        }
        Ok(mut batch) => {
            for (i, (physical, buf, _)) in taken.runs.iter().enumerate() {
                if let Err(e) = batch.write_tagged(*physical, buf, i as u64) {
                    // This run and the rest are not (all) sent: their files stay dirty.
                    for (_, _, owners) in &taken.runs[i..] {
                        owners.iter().for_each(|&f| failed[f] = true);
                    }
                    first_error = Some(e);
                    break;
                }
            }
            let sent = batch.send();
            meanwhile();
            let waited = sent.and_then(|()| {
                batch.wait_each(|tag, result| {
                    if let Err(e) = result {
                        taken.runs[tag as usize].2.iter().for_each(|&f| failed[f] = true);
                        first_error.get_or_insert(e);
                    }
                })
            });
            if let Err(e) = waited {
                failed.iter_mut().for_each(|f| *f = true);
                first_error.get_or_insert(e);
            }
        }
    }
    (failed, first_error)
}
