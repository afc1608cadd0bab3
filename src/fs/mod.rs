//! The file layer: named files on any iopath device, in the spirit of SPDK's
//! BlobFS (a flat namespace, extents, a journal), with the semantics an
//! application expects from POSIX files.
//!
//! - [`FileSystem::format`] (`iopath mkfs`) writes the on-device format
//!   ([`format`]); [`FileSystem::mount`] replays the journal ([`journal`]),
//!   loads all metadata into memory and checks it.
//! - [`File`]s are shared by threads: `read_at`, `write_at`, `append`,
//!   `truncate`, `fsync`, `fdatasync`. Each file has its own lock (readers
//!   share it); the metadata of the whole file system has one lock, held
//!   for in-memory updates only, never across device I/O.
//! - Data goes straight to the device in 4 KiB blocks through the
//!   [`Engine`], so it takes the engine's path (merged across threads by
//!   `stm`, polled or not).
//!
//! # What is durable when
//!
//! - A write is on the device (in its volatile cache) when `write_at`
//!   returns; it survives a power cut once `fsync`/`fdatasync` on that file
//!   (or [`FileSystem::sync`]) returns.
//! - `create`, `rename`, `unlink` and `truncate` are atomic (all of their
//!   metadata is in one transaction) and durable after the next `fsync` of
//!   any file or `sync` (transactions are shared, as ext4's).
//! - After a crash the file system is as it was at some point between the
//!   last completed `fsync`/`sync` and the crash: never a torn rename, never
//!   a file size that exposes blocks that were not written (those read as
//!   zeros or are not there).
//!
//! A file that is unlinked (or replaced by a rename) while open is gone at
//! once: its handles then fail with `ESTALE`.

pub mod alloc;
pub mod disk;
pub mod extents;
pub mod format;
pub mod journal;

use crate::IoBuf;
use crate::engine::Engine;
use crate::error::{Error, Result};
use alloc::Allocator;
use disk::Disk;
use format::{BLOCK, BLOCK_U64, Block, INODE_SIZE, INODES_PER_BLOCK, Inode, Superblock, check_name, zero_block};
use journal::{Journal, JournalStats};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Blocks the file layer moves per device request at most (1 MiB).
const MAX_IO_BLOCKS: u64 = 256;

/// Largest file: file block numbers are 32-bit.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * BLOCK_U64;

/// How `iopath mkfs` lays out a device.
#[derive(Debug, Clone, Copy, Default)]
pub struct FormatOptions {
    /// Files the file system can hold (default: one per MiB of device, 64 to 1M).
    pub inodes: Option<u64>,
    /// Journal size in blocks (default: 1/64 of the device, 256 to 32768 blocks).
    pub journal_blocks: Option<u64>,
}

/// What `format` made.
#[derive(Debug, Clone, Copy)]
pub struct Formatted {
    /// The layout written.
    pub superblock: Superblock,
}

/// What `mount` found.
#[derive(Debug, Clone, Copy)]
pub struct Mounted {
    /// Journal transactions replayed (non-zero after a crash).
    pub replayed: u64,
    /// Files found.
    pub files: usize,
}

/// One file as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// Counters of a mounted file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStats {
    /// The journal's counters.
    pub journal: JournalStats,
    /// `fsync`/`fdatasync`/`sync` calls.
    pub syncs: u64,
    /// Syncs that found their transaction already committed by another thread.
    pub shared_commits: u64,
    /// Syncs that needed no commit, only a flush.
    pub flush_only: u64,
    /// Device reads, writes and flushes the file layer issued.
    pub device_reads: u64,
    /// See `device_reads`.
    pub device_writes: u64,
    /// See `device_reads`.
    pub device_flushes: u64,
    /// Free blocks now.
    pub free_blocks: u64,
}

/// A mounted file system. Cheap to clone; shared by threads.
#[derive(Clone)]
pub struct FileSystem {
    inner: Arc<Inner>,
}

/// An open file. Cheap to clone; shared by threads.
#[derive(Clone)]
pub struct File {
    fs: Arc<Inner>,
    node: Arc<Node>,
}

struct Inner {
    disk: Disk,
    sb: Superblock,
    meta: Mutex<Meta>,
    journal: Mutex<Journal>,
    /// Highest transaction id known durable.
    committed: AtomicU64,
    /// Set when a commit failed: the in-memory and on-device metadata may disagree.
    aborted: AtomicBool,
    unmounted: AtomicBool,
    syncs: AtomicU64,
    shared_commits: AtomicU64,
    flush_only: AtomicU64,
}

struct Node {
    slot: u32,
    state: RwLock<NodeState>,
}

struct NodeState {
    inode: Inode,
    /// False once unlinked or replaced.
    live: bool,
    /// Last transaction that changed this file's inode.
    meta_tid: u64,
    /// Last transaction that changed its size or block map (what `fdatasync` needs).
    layout_tid: u64,
}

/// All metadata, in memory, as the next commit will write it.
struct Meta {
    /// Inode-table block images.
    table: Vec<Block>,
    /// Open file nodes by inode slot (every file has one while mounted).
    slots: Vec<Option<Arc<Node>>>,
    names: HashMap<String, u32>,
    alloc: Allocator,
    /// Overflow extent block images by block number.
    overflow: HashMap<u64, Block>,
    /// Blocks changed in the running transaction.
    dirty: BTreeSet<u64>,
    /// Data runs freed in the running transaction (allocatable after it commits).
    freed: Vec<(u64, u64)>,
    /// Metadata blocks freed in the running transaction (allocatable after a checkpoint).
    freed_meta: Vec<(u64, u64)>,
    /// Id of the running transaction.
    tid: u64,
    /// Where the search for a free inode slot starts.
    slot_hint: usize,
}

fn file_error(op: &'static str, name: &str, errno: i32, why: impl Into<String>) -> Error {
    Error::File { op, name: name.to_string(), errno, why: why.into() }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl Meta {
    /// Allocates up to `want` blocks at `goal` or the next free run.
    fn allocate(&mut self, sb: &Superblock, want: u64, goal: Option<u64>) -> Option<(u64, u64)> {
        let dirty = &mut self.dirty;
        self.alloc.allocate(want, goal, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        })
    }

    /// Frees a data run: allocatable again once the running transaction commits.
    fn free_data(&mut self, sb: &Superblock, start: u64, len: u64) {
        let dirty = &mut self.dirty;
        let ok = self.alloc.free(start, len, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        });
        debug_assert!(ok, "freeing blocks {start}+{len} that are not in use");
        self.freed.push((start, len));
    }

    /// Frees an overflow (metadata) block: allocatable again after the next checkpoint.
    fn free_meta(&mut self, sb: &Superblock, block: u64) {
        self.overflow.remove(&block);
        let dirty = &mut self.dirty;
        let ok = self.alloc.free(block, 1, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        });
        debug_assert!(ok, "freeing overflow block {block} that is not in use");
        self.freed_meta.push((block, 1));
    }

    fn inode_block(&self, sb: &Superblock, slot: u32) -> u64 {
        sb.inode_start + slot as u64 / INODES_PER_BLOCK as u64
    }

    /// Writes `inode` into slot `slot` (growing or shrinking its overflow chain) and marks what changed.
    fn store_inode(&mut self, sb: &Superblock, slot: u32, inode: &mut Inode) -> Result<()> {
        let need = Inode::overflow_needed(inode.extents.len());
        while inode.overflow.len() > need {
            let b = inode.overflow.pop().expect("longer than need");
            self.free_meta(sb, b);
        }
        while inode.overflow.len() < need {
            let goal = inode.overflow.last().map(|b| b + 1);
            let Some((b, _)) = self.allocate(sb, 1, goal) else {
                return Err(file_error("extend", &inode.name, libc::ENOSPC, "no space left for its extent map"));
            };
            inode.overflow.push(b);
        }
        let mut blocks: Vec<Block> = inode.overflow.iter().map(|_| zero_block()).collect();
        let index = slot as usize % INODES_PER_BLOCK;
        let table = &mut self.table[slot as usize / INODES_PER_BLOCK];
        inode.encode(&mut table[index * INODE_SIZE..(index + 1) * INODE_SIZE], &mut blocks);
        self.dirty.insert(self.inode_block(sb, slot));
        for (b, image) in inode.overflow.iter().zip(blocks) {
            self.overflow.insert(*b, image);
            self.dirty.insert(*b);
        }
        Ok(())
    }

    /// Frees a file's blocks and slot (unlink, or the target of a rename).
    fn drop_inode(&mut self, sb: &Superblock, slot: u32, state: &mut NodeState) {
        for e in std::mem::take(&mut state.inode.extents) {
            self.free_data(sb, e.physical, e.len as u64);
        }
        for b in std::mem::take(&mut state.inode.overflow) {
            self.free_meta(sb, b);
        }
        let index = slot as usize % INODES_PER_BLOCK;
        Inode::encode_free(
            &mut self.table[slot as usize / INODES_PER_BLOCK][index * INODE_SIZE..(index + 1) * INODE_SIZE],
        );
        self.dirty.insert(self.inode_block(sb, slot));
        self.names.remove(&state.inode.name);
        self.slots[slot as usize] = None;
        state.live = false;
        state.meta_tid = self.tid;
        state.layout_tid = self.tid;
    }

    /// Takes the running transaction: its images, and the runs it freed.
    #[allow(clippy::type_complexity)]
    fn take_transaction(&mut self, sb: &Superblock) -> (u64, Vec<(u64, Block)>, Vec<(u64, u64)>, Vec<(u64, u64)>) {
        let mut images = Vec::with_capacity(self.dirty.len());
        for b in std::mem::take(&mut self.dirty) {
            let image = if b >= sb.inode_start && b < sb.bitmap_start {
                self.table[(b - sb.inode_start) as usize].clone()
            } else if b >= sb.bitmap_start && b < sb.journal_start {
                let mut image = zero_block();
                image.copy_from_slice(self.alloc.image(b - sb.bitmap_start));
                image
            } else if let Some(image) = self.overflow.get(&b) {
                image.clone()
            } else {
                continue; // an overflow block freed again in the same transaction
            };
            images.push((b, image));
        }
        let tid = self.tid;
        self.tid += 1;
        (tid, images, std::mem::take(&mut self.freed), std::mem::take(&mut self.freed_meta))
    }
}

impl FileSystem {
    /// Writes a new, empty file system on the engine's device (erasing what it holds).
    pub fn format(engine: Arc<Engine>, options: FormatOptions) -> Result<Formatted> {
        let disk = Disk::new(engine);
        let blocks = disk.blocks();
        let inodes = options.inodes.unwrap_or((blocks / 256).clamp(64, 1 << 20));
        if inodes == 0 {
            return Err(Error::spec("inode count", "0", "a file system needs at least one inode"));
        }
        let journal_blocks = options.journal_blocks.unwrap_or((blocks / 64).clamp(256, 32768));
        let sb = Superblock::layout(blocks, inodes, journal_blocks, fastrand::u64(1..))?;
        // Superblock last: a mkfs cut short leaves no file system rather than a half-made one.
        disk.write(0, &IoBuf::new(BLOCK))?;
        disk.flush()?;
        let zeros = IoBuf::new(BLOCK * 256);
        let mut b = sb.inode_start;
        while b < sb.bitmap_start {
            let n = (sb.bitmap_start - b).min(256);
            disk.write(b, &zeros[..n as usize * BLOCK])?;
            b += n;
        }
        let alloc = Allocator::fresh(blocks, sb.data_start);
        for (i, image) in alloc.images().iter().enumerate() {
            disk.write(sb.bitmap_start + i as u64, &IoBuf::from_slice(&image[..]))?;
        }
        Journal::format(&disk, &sb)?;
        disk.flush()?;
        disk.write(0, &IoBuf::from_slice(&sb.encode()[..]))?;
        disk.flush()?;
        Ok(Formatted { superblock: sb })
    }

    /// Mounts the file system on the engine's device: replays the journal,
    /// loads and checks the metadata.
    pub fn mount(engine: Arc<Engine>) -> Result<(FileSystem, Mounted)> {
        let disk = Disk::new(engine);
        if disk.blocks() < 2 {
            return Err(format::corrupt("the device is smaller than two blocks: no file system fits"));
        }
        let sb = Superblock::decode(&disk.read_block(0)?, disk.blocks())?;
        let journal = Journal::recover(&disk, &sb)?;
        let replayed = journal.stats().replayed;
        let read_range = |start: u64, count: u64| -> Result<Vec<Block>> {
            let mut buf = IoBuf::new(count as usize * BLOCK);
            disk.read(start, &mut buf)?;
            Ok(buf
                .chunks(BLOCK)
                .map(|c| {
                    let mut b = zero_block();
                    b.copy_from_slice(c);
                    b
                })
                .collect())
        };
        let table = read_range(sb.inode_start, sb.inode_blocks)?;
        let bitmap = read_range(sb.bitmap_start, sb.bitmap_blocks)?;
        let alloc = Allocator::from_images(bitmap, sb.blocks, sb.data_start);
        for n in 0..sb.data_start {
            if !alloc.in_use(n) {
                return Err(format::corrupt(format!("the bitmap marks metadata block {n} free")));
            }
        }
        let mut meta = Meta {
            table,
            slots: vec![None; sb.inodes() as usize],
            names: HashMap::new(),
            alloc,
            overflow: HashMap::new(),
            dirty: BTreeSet::new(),
            freed: Vec::new(),
            freed_meta: Vec::new(),
            tid: 1,
            slot_hint: 0,
        };
        let mut owner: HashMap<u64, u64> = HashMap::new();
        for slot in 0..sb.inodes() {
            let index = slot as usize % INODES_PER_BLOCK;
            let raw = &meta.table[slot as usize / INODES_PER_BLOCK][index * INODE_SIZE..(index + 1) * INODE_SIZE];
            let Some(inode) = Inode::decode(raw, slot, |b| Ok(read_range(b, 1)?.remove(0)), &sb)? else { continue };
            let mut claim = |start: u64, len: u64| -> Result<()> {
                for b in start..start + len {
                    if !meta.alloc.in_use(b) {
                        return Err(format::corrupt(format!(
                            "file '{}' owns block {b}, which the bitmap marks free",
                            inode.name
                        )));
                    }
                    if let Some(other) = owner.insert(b, slot) {
                        return Err(format::corrupt(format!("block {b} is owned by inodes {other} and {slot}")));
                    }
                }
                Ok(())
            };
            for e in &inode.extents {
                claim(e.physical, e.len as u64)?;
            }
            for b in &inode.overflow {
                claim(*b, 1)?;
            }
            if meta.names.insert(inode.name.clone(), slot as u32).is_some() {
                return Err(format::corrupt(format!("two files are named '{}'", inode.name)));
            }
            for b in &inode.overflow {
                meta.overflow.insert(*b, read_range(*b, 1)?.remove(0));
            }
            let state = NodeState { inode, live: true, meta_tid: 0, layout_tid: 0 };
            meta.slots[slot as usize] = Some(Arc::new(Node { slot: slot as u32, state: RwLock::new(state) }));
        }
        let files = meta.names.len();
        let inner = Inner {
            disk,
            sb,
            meta: Mutex::new(meta),
            journal: Mutex::new(journal),
            committed: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            unmounted: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            shared_commits: AtomicU64::new(0),
            flush_only: AtomicU64::new(0),
        };
        Ok((FileSystem { inner: Arc::new(inner) }, Mounted { replayed, files }))
    }

    /// The layout.
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Creates an empty file; fails with `EEXIST` if the name is taken.
    pub fn create(&self, name: &str) -> Result<File> {
        check_name(name)?;
        let fs = &self.inner;
        fs.check_writable("create", name)?;
        let mut meta = fs.meta();
        if meta.names.contains_key(name) {
            return Err(file_error(
                "create",
                name,
                libc::EEXIST,
                "a file of that name exists; open it or unlink it first",
            ));
        }
        let count = meta.slots.len();
        let Some(slot) = (0..count).map(|i| (meta.slot_hint + i) % count).find(|&s| meta.slots[s].is_none()) else {
            return Err(file_error(
                "create",
                name,
                libc::ENOSPC,
                format!("all {count} inodes are in use; unlink files or make the file system with more --inodes"),
            ));
        };
        meta.slot_hint = slot + 1;
        let mut inode = Inode { name: name.to_string(), mtime_ns: now_ns(), ..Inode::default() };
        meta.store_inode(&fs.sb, slot as u32, &mut inode)?;
        let tid = meta.tid;
        let state = NodeState { inode, live: true, meta_tid: tid, layout_tid: tid };
        let node = Arc::new(Node { slot: slot as u32, state: RwLock::new(state) });
        meta.slots[slot] = Some(Arc::clone(&node));
        meta.names.insert(name.to_string(), slot as u32);
        Ok(File { fs: Arc::clone(fs), node })
    }

    /// Opens an existing file; fails with `ENOENT` if there is none of that name.
    pub fn open(&self, name: &str) -> Result<File> {
        check_name(name)?;
        let node = self.inner.lookup(name).ok_or_else(|| file_error("open", name, libc::ENOENT, "no such file"))?;
        Ok(File { fs: Arc::clone(&self.inner), node })
    }

    /// Opens a file, creating it empty if there is none.
    pub fn open_or_create(&self, name: &str) -> Result<File> {
        match self.open(name) {
            Err(Error::File { errno: libc::ENOENT, .. }) => match self.create(name) {
                Err(Error::File { errno: libc::EEXIST, .. }) => self.open(name),
                other => other,
            },
            other => other,
        }
    }

    /// Whether a file of this name exists.
    pub fn exists(&self, name: &str) -> bool {
        self.inner.lookup(name).is_some()
    }

    /// Removes a file; its blocks are free once the removal is committed.
    pub fn unlink(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let fs = &self.inner;
        fs.check_writable("unlink", name)?;
        loop {
            let node = fs.lookup(name).ok_or_else(|| file_error("unlink", name, libc::ENOENT, "no such file"))?;
            let mut state = node.state.write().expect("file lock poisoned");
            let mut meta = fs.meta();
            if meta.names.get(name) != Some(&node.slot) {
                continue; // renamed or replaced meanwhile: look again
            }
            meta.drop_inode(&fs.sb, node.slot, &mut state);
            return Ok(());
        }
    }

    /// Renames `from` to `to`, replacing `to` if it exists, atomically.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        check_name(from)?;
        check_name(to)?;
        let fs = &self.inner;
        fs.check_writable("rename", from)?;
        loop {
            let src = fs.lookup(from).ok_or_else(|| file_error("rename", from, libc::ENOENT, "no such file"))?;
            if from == to {
                return Ok(());
            }
            let dst = fs.lookup(to);
            // Lock both files in slot order (no deadlock with a rename the other way).
            let (mut src_state, mut dst_state) = match &dst {
                Some(d) if d.slot < src.slot => {
                    let ds = d.state.write().expect("file lock poisoned");
                    (src.state.write().expect("file lock poisoned"), Some(ds))
                }
                Some(d) => {
                    let ss = src.state.write().expect("file lock poisoned");
                    (ss, Some(d.state.write().expect("file lock poisoned")))
                }
                None => (src.state.write().expect("file lock poisoned"), None),
            };
            let mut meta = fs.meta();
            if meta.names.get(from) != Some(&src.slot) || meta.names.get(to) != dst.as_ref().map(|d| &d.slot) {
                continue;
            }
            if let (Some(d), Some(ds)) = (&dst, dst_state.as_mut()) {
                meta.drop_inode(&fs.sb, d.slot, ds);
            }
            meta.names.remove(from);
            src_state.inode.name = to.to_string();
            meta.store_inode(&fs.sb, src.slot, &mut src_state.inode)?;
            meta.names.insert(to.to_string(), src.slot);
            src_state.meta_tid = meta.tid;
            return Ok(());
        }
    }

    /// Every file, sorted by name.
    pub fn list(&self) -> Vec<Entry> {
        let nodes: Vec<Arc<Node>> = self.inner.meta().slots.iter().flatten().cloned().collect();
        let mut out: Vec<Entry> = nodes
            .iter()
            .filter_map(|n| {
                let s = n.state.read().expect("file lock poisoned");
                s.live.then(|| Entry { name: s.inode.name.clone(), size: s.inode.size })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Makes everything done so far durable (all files' data and metadata).
    pub fn sync(&self) -> Result<()> {
        let tid = self.inner.meta().tid;
        self.inner.sync_through(tid)
    }

    /// Counters so far.
    pub fn stats(&self) -> FsStats {
        let fs = &self.inner;
        let c = fs.disk.counters();
        FsStats {
            journal: fs.journal.lock().expect("journal lock poisoned").stats(),
            syncs: fs.syncs.load(Ordering::Relaxed),
            shared_commits: fs.shared_commits.load(Ordering::Relaxed),
            flush_only: fs.flush_only.load(Ordering::Relaxed),
            device_reads: c.reads.load(Ordering::Relaxed),
            device_writes: c.writes.load(Ordering::Relaxed),
            device_flushes: c.flushes.load(Ordering::Relaxed),
            free_blocks: fs.meta().alloc.free_blocks(),
        }
    }

    /// Commits everything, writes the metadata home and empties the journal,
    /// so the next mount replays nothing. Files still open stay usable.
    pub fn unmount(self) -> Result<()> {
        self.inner.quiesce()?;
        self.inner.unmounted.store(true, Ordering::Release);
        Ok(())
    }
}

impl Inner {
    fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().expect("metadata lock poisoned")
    }

    fn lookup(&self, name: &str) -> Option<Arc<Node>> {
        let meta = self.meta();
        meta.names.get(name).and_then(|&slot| meta.slots[slot as usize].clone())
    }

    fn check_writable(&self, op: &'static str, name: &str) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(file_error(
                op,
                name,
                libc::EROFS,
                "the file system stopped after a device error during a journal commit; mount it again to recover",
            ));
        }
        Ok(())
    }

    /// Makes transaction `tid` (and all before it) durable; a flush when it holds nothing.
    fn sync_through(&self, tid: u64) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::Device { op: "flush", offset: 0, len: 0, errno: libc::EIO });
        }
        let mut journal = self.journal.lock().expect("journal lock poisoned");
        if self.committed.load(Ordering::Acquire) >= tid {
            // Another thread's commit covered it, and that commit started with a flush
            // issued after this caller's writes had completed.
            self.shared_commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let (taken, images, freed, freed_meta) = self.meta().take_transaction(&self.sb);
        if images.is_empty() {
            self.flush_only.fetch_add(1, Ordering::Relaxed);
            self.disk.flush()?;
        } else if let Err(e) = journal.commit(&self.disk, images) {
            self.aborted.store(true, Ordering::Release);
            return Err(e);
        }
        self.committed.store(taken, Ordering::Release);
        journal.hold_until_checkpoint(freed_meta);
        let mut released = freed;
        if journal.wants_checkpoint() {
            match journal.checkpoint(&self.disk) {
                Ok(r) => released.extend(r),
                Err(e) => {
                    self.aborted.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        drop(journal);
        self.meta().alloc.release(&released);
        Ok(())
    }

    /// Commits everything and checkpoints.
    fn quiesce(&self) -> Result<()> {
        let tid = self.meta().tid;
        self.sync_through(tid)?;
        let mut journal = self.journal.lock().expect("journal lock poisoned");
        let released = journal.checkpoint(&self.disk)?;
        drop(journal);
        self.meta().alloc.release(&released);
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle is gone: leave a clean journal if the device lets us.
        if !self.unmounted.load(Ordering::Acquire) && !self.aborted.load(Ordering::Acquire) {
            let _ = self.quiesce();
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state_read();
        f.debug_struct("File").field("name", &state.inode.name).field("size", &state.inode.size).finish()
    }
}

impl std::fmt::Debug for FileSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSystem").field("superblock", &self.inner.sb).finish()
    }
}

impl File {
    fn state_read(&self) -> std::sync::RwLockReadGuard<'_, NodeState> {
        self.node.state.read().expect("file lock poisoned")
    }

    fn live(&self, state: &NodeState, op: &'static str) -> Result<()> {
        if !state.live {
            return Err(file_error(
                op,
                &state.inode.name,
                libc::ESTALE,
                "the file was unlinked or replaced while open",
            ));
        }
        Ok(())
    }

    /// The file's name now.
    pub fn name(&self) -> String {
        self.state_read().inode.name.clone()
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.state_read().inode.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads into `buf` from `offset`; returns the bytes read (fewer at the end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let state = self.state_read();
        self.live(&state, "read")?;
        let size = state.inode.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset) as usize;
        let first = offset / BLOCK_U64;
        let end = (offset + n as u64).div_ceil(BLOCK_U64);
        for run in extents::pieces(extents::runs(&state.inode.extents, first, end), MAX_IO_BLOCKS) {
            // The part of `buf` this run covers.
            let run_start = (run.logical * BLOCK_U64).max(offset);
            let run_end = ((run.logical + run.len) * BLOCK_U64).min(offset + n as u64);
            let out = &mut buf[(run_start - offset) as usize..(run_end - offset) as usize];
            match run.physical {
                Some(physical) if !run.unwritten => {
                    let mut block_buf = IoBuf::new(run.len as usize * BLOCK);
                    self.fs.disk.read(physical, &mut block_buf)?;
                    let skip = (run_start - run.logical * BLOCK_U64) as usize;
                    out.copy_from_slice(&block_buf[skip..skip + out.len()]);
                }
                _ => out.fill(0),
            }
        }
        Ok(n)
    }

    /// Writes `data` at `offset`, growing the file as needed (a gap reads as zeros).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let mut state = self.node.state.write().expect("file lock poisoned");
        self.write_locked(&mut state, data, offset)
    }

    /// Writes `data` at the end of the file; returns the offset it went to.
    pub fn append(&self, data: &[u8]) -> Result<u64> {
        let mut state = self.node.state.write().expect("file lock poisoned");
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

        // 1. Map the holes in the range, not yet written: until the data is on the
        //    device, a commit by another thread records them as reading zeros.
        if !self.map_holes(state, first, end)? {
            // Blocks freed by changes not yet committed can be used once they are: commit, retry.
            let tid = fs.meta().tid;
            fs.sync_through(tid)?;
            if !self.map_holes(state, first, end)? {
                let free = fs.meta().alloc.allocatable();
                return Err(file_error(
                    "write",
                    &state.inode.name,
                    libc::ENOSPC,
                    format!("no space left on the device ({free} blocks free)"),
                ));
            }
        }

        let old_size = state.inode.size;
        if offset > old_size && offset / BLOCK_U64 > old_size / BLOCK_U64 {
            self.zero_tail(state)?;
        }
        // 2. The data, whole blocks per device run; partial blocks at the edges are
        //    read first where they hold data (read-modify-write).
        for run in extents::pieces(extents::runs(&state.inode.extents, first, end), MAX_IO_BLOCKS) {
            let physical = run.physical.expect("every block of the range is mapped now");
            let mut buf = IoBuf::new(run.len as usize * BLOCK);
            let run_first = run.logical * BLOCK_U64;
            let run_end = run_first + run.len * BLOCK_U64;
            let from = offset.max(run_first);
            let to = end_byte.min(run_end);
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

        // 3. Now the blocks hold their data: mark them written, grow the size.
        let mut meta = fs.meta();
        let written = extents::mark_written(&mut state.inode.extents, first, end);
        let grew = end_byte > state.inode.size;
        if grew {
            state.inode.size = end_byte;
        }
        state.inode.mtime_ns = now_ns();
        meta.store_inode(&fs.sb, self.node.slot, &mut state.inode)?;
        state.meta_tid = meta.tid;
        if written || grew {
            state.layout_tid = meta.tid;
        }
        Ok(())
    }

    /// Maps every hole in file blocks `[first, end)` to new blocks, not yet written.
    /// Returns false, having taken nothing, when the device has too little space.
    fn map_holes(&self, state: &mut NodeState, first: u64, end: u64) -> Result<bool> {
        let fs = &self.fs;
        let holes: Vec<_> =
            extents::runs(&state.inode.extents, first, end).into_iter().filter(|r| r.physical.is_none()).collect();
        if holes.is_empty() {
            return Ok(true);
        }
        let mut meta = fs.meta();
        let mut added = Vec::new();
        let mut failed = false;
        'holes: for hole in holes {
            let mut at = hole.logical;
            while at < hole.logical + hole.len {
                let goal = extents::goal_for(&state.inode.extents, at);
                let Some((physical, len)) = meta.allocate(&fs.sb, hole.logical + hole.len - at, goal) else {
                    failed = true;
                    break 'holes;
                };
                extents::insert_unwritten(&mut state.inode.extents, at, len, physical);
                added.push((at, len));
                at += len;
            }
        }
        // The extent map may need more overflow blocks than are left, too.
        if !failed && meta.store_inode(&fs.sb, self.node.slot, &mut state.inode).is_err() {
            failed = true;
        }
        if failed {
            // Give back what this write took (free once the running transaction commits).
            for (logical, len) in added {
                for (start, n) in extents::cut(&mut state.inode.extents, logical, logical + len) {
                    meta.free_data(&fs.sb, start, n);
                }
            }
            meta.store_inode(&fs.sb, self.node.slot, &mut state.inode)?;
            return Ok(false);
        }
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        Ok(true)
    }

    /// Growing the file past its last partial block: bytes past the old end in that
    /// block may be stale (a write cut short by a crash, a shrink) and must read as zeros.
    fn zero_tail(&self, state: &NodeState) -> Result<()> {
        let size = state.inode.size;
        if size.is_multiple_of(BLOCK_U64) {
            return Ok(());
        }
        let block = size / BLOCK_U64;
        if let Some(run) = extents::runs(&state.inode.extents, block, block + 1).into_iter().find(|r| r.has_data()) {
            let physical = run.physical.expect("has data");
            let mut buf = self.fs.disk.read_block(physical)?;
            buf[(size % BLOCK_U64) as usize..].fill(0);
            self.fs.disk.write(physical, &buf)?;
        }
        Ok(())
    }

    /// Sets the size: shrinking frees the blocks past it, growing leaves a hole (zeros).
    pub fn truncate(&self, len: u64) -> Result<()> {
        let fs = &self.fs;
        let mut state = self.node.state.write().expect("file lock poisoned");
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
        if len > state.inode.size {
            self.zero_tail(&state)?;
        }
        let mut meta = fs.meta();
        let keep = len.div_ceil(BLOCK_U64);
        for (start, n) in extents::cut(&mut state.inode.extents, keep, u32::MAX as u64 + 1) {
            meta.free_data(&fs.sb, start, n);
        }
        state.inode.size = len;
        state.inode.mtime_ns = now_ns();
        meta.store_inode(&fs.sb, self.node.slot, &mut state.inode)?;
        state.meta_tid = meta.tid;
        state.layout_tid = meta.tid;
        Ok(())
    }

    /// Makes the file's data and metadata durable.
    pub fn fsync(&self) -> Result<()> {
        let state = self.state_read();
        self.live(&state, "fsync")?;
        let tid = state.meta_tid;
        drop(state);
        self.sync_tid(tid)
    }

    /// Makes the file's data durable, and the metadata needed to read it (size,
    /// block map) but not its modification time.
    pub fn fdatasync(&self) -> Result<()> {
        let state = self.state_read();
        self.live(&state, "fdatasync")?;
        let tid = state.layout_tid;
        drop(state);
        self.sync_tid(tid)
    }

    fn sync_tid(&self, tid: u64) -> Result<()> {
        let fs = &self.fs;
        if fs.committed.load(Ordering::Acquire) >= tid {
            // Nothing of this file's metadata is pending: its data needs a flush only.
            fs.syncs.fetch_add(1, Ordering::Relaxed);
            fs.flush_only.fetch_add(1, Ordering::Relaxed);
            return fs.disk.flush();
        }
        fs.sync_through(tid)
    }
}
