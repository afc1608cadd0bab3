//! The file layer: files and directories on any iopath device, in the
//! spirit of SPDK's BlobFS (extents, a journal), with the semantics an
//! application expects from POSIX files ([`namespace`]: paths, directories,
//! rename, unlink while open).
//!
//! - [`FileSystem::format`] (`iopath mkfs`) writes the on-device format
//!   ([`mod@format`]); [`FileSystem::mount`] replays the journal ([`journal`]),
//!   loads all metadata into memory and checks it.
//! - [`File`]s are shared by threads: `read_at`, `write_at`, `append`,
//!   `truncate`, `fsync`, `fdatasync`. Each file has its own lock (readers
//!   share it); the metadata of the whole file system has one lock, held
//!   for in-memory updates only, never across device I/O.
//! - Data goes to the device in 4 KiB blocks through the [`Engine`]
//!   (from the page cache, or straight from the caller for a direct file),
//!   so it takes the engine's path (merged across threads by `stm`, polled
//!   or not).
//!
//! # What is durable when
//!
//! - A buffered write is in the page cache when `write_at` returns (a
//!   direct file's is on the device, in its volatile cache); its pages go
//!   to the device at the file's `fsync`/`fdatasync`, a
//!   [`FileSystem::sync`], an unmount, when too much of the cache is dirty,
//!   or, for a file written in one long stream, behind the writer
//!   (write-behind: [`MountOptions::write_behind`]). It survives a power
//!   cut once `fsync`/`fdatasync` on that file (or `sync`) returns.
//! - `create`, `mkdir`, `rmdir`, `rename`, `unlink` and `truncate` are atomic (all of their
//!   metadata is in one transaction) and durable after the next `fsync` of
//!   any file or `sync` (transactions are shared, as ext4's).
//! - After a crash the file system is as it was at some point between the
//!   last completed `fsync`/`sync` and the crash: never a torn rename, never
//!   a file size that exposes blocks that were not written (those read as
//!   zeros or are not there).
//!
//! A file that is unlinked (or replaced by a rename) while open keeps its
//! data for its handles until the last one closes (POSIX), and a crash
//! before that is cleaned up at the next mount.
//!
//! ```
//! use iopath::fs::{FileSystem, FormatOptions};
//! use iopath::{Engine, PathConfig};
//! use std::sync::Arc;
//! let engine = Arc::new(Engine::open("emu:optane,size=64m,wcache=1", PathConfig::preset("auto")?)?);
//! FileSystem::format(Arc::clone(&engine), FormatOptions::default())?;
//! let (fs, _) = FileSystem::mount(engine)?;
//! let f = fs.create("log")?;
//! f.append(b"record")?;
//! f.fsync()?;
//! fs.mkdir("old", 0o755)?;
//! fs.rename("log", "old/log.1")?;
//! let mut buf = [0u8; 6];
//! assert_eq!(fs.open("old/log.1")?.read_at(&mut buf, 0)?, 6);
//! assert_eq!(&buf, b"record");
//! # Ok::<(), iopath::Error>(())
//! ```

pub mod alloc;
mod behind;
pub mod cache;
pub mod carry;
pub mod check;
pub mod disk;
pub mod extents;
mod file;
pub mod format;
pub mod fsync_path;
pub mod journal;
pub mod lock;
pub mod mirror;
pub mod namespace;
pub mod read_path;
pub mod readahead;
pub mod shm_log;
pub mod steps;
mod writeback;
pub mod written;

use crate::IoBuf;
use crate::engine::Engine;
use crate::error::{Error, Result};
use alloc::Allocator;
use cache::{CacheStats, Key, Page, PageCache};
use disk::Disk;
use format::{BLOCK, BLOCK_U64, Block, INODE_SIZE, INODES_PER_BLOCK, Inode, Superblock, zero_block};
pub use fsync_path::FsyncPath;
use journal::{Journal, JournalStats};
pub use namespace::{DirEntry, Kind, Metadata, Rename, Resolved};
pub use read_path::ReadPath;
use readahead::ReadAhead;
use std::collections::BTreeMap;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use steps::Steps;

/// Blocks the file layer moves per device request at most (1 MiB).
const MAX_IO_BLOCKS: u64 = 256;

/// Largest file: file block numbers are 32-bit.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * BLOCK_U64;

/// How `iopath mkfs` lays out a device.
#[derive(Debug, Clone, Copy, Default)]
pub struct FormatOptions {
    /// Files and directories the file system can hold (default: one per 64 KiB of device, 64 to 131,072;
    /// the inode table is kept in memory while mounted: 512 bytes per inode).
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

/// How a file system is mounted: the page cache and the paths it takes.
#[derive(Debug, Clone, Copy)]
pub struct MountOptions {
    /// Page cache bound in bytes (default 64 MiB; at least 16 pages are
    /// kept whatever the bound).
    pub cache_bytes: u64,
    /// What a cache miss does (default `aios`).
    pub read_path: ReadPath,
    /// How fsync orders data, journal and commit (default `aios`).
    pub fsync_path: FsyncPath,
    /// Largest read-ahead window in bytes (default 1 MiB; 0 turns read-ahead off).
    pub readahead_bytes: u64,
    /// Record the time of each step of the read and fsync paths ([`FileSystem::steps`]).
    pub step_times: bool,
    /// Direct files copy through a bounce buffer even when the caller's memory
    /// could take the transfer itself (the copy seed 004 removed; kept to
    /// measure it: fsbench's `direct-copy`). Default off: whole aligned
    /// blocks move straight between the device and the caller's buffer.
    pub direct_copy: bool,
    /// Most space an append may allocate past the end of its file, not yet
    /// written (default 1 MiB; 0 turns it off). A file that grows at its end
    /// gets as much again as it holds, from 32 KiB up to this bound, in one
    /// piece after its last block: the appends that follow take no blocks
    /// from the free-space map, so their fsync journals one block image
    /// fewer, and the file stays contiguous. Closing the file's last handle
    /// gives the space back (so do `truncate` and `unlink`); it is only taken
    /// while the device has at least 16 times as much free.
    pub append_prealloc_bytes: u64,
    /// When a create, unlink, rename, mkdir or rmdir reaches the device
    /// (default [`NamespaceCommit::Written`]).
    pub namespace_commit: NamespaceCommit,
    /// Write-behind (default on): once a file has been written 4 MiB in a
    /// row, its pages go to the device in the background as the writer goes
    /// on, and past 16 MiB they leave the cache once written. Off, they
    /// stay dirty until an fsync, a sync, the dirty budget or unmount.
    pub write_behind: bool,
    /// Read-around cluster in bytes (default 64 KiB; 0 turns it off): while
    /// the cache has room, a read that misses also reads the uncached blocks
    /// around it, out to the aligned cluster that holds it.
    pub read_around_bytes: u64,
}

/// When a change to the namespace (create, unlink, rename, mkdir, rmdir)
/// reaches the device.
///
/// The file system lives in the process that mounted it: what it holds in
/// memory dies with that process. With the kernel's file systems a process
/// that is killed loses nothing a system call finished, and programs count
/// on it: SQLite's default (`journal_mode=DELETE`, `synchronous=FULL`)
/// commits a transaction by deleting its journal and never syncs that
/// delete, so a namespace kept only in memory loses the last commit of a
/// killed SQLite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceCommit {
    /// Each change is written to the journal without a flush (one journal
    /// write, no device cache flush): a process that dies keeps it, a power
    /// cut may not (as the kernel's page cache). Where the engine hands
    /// requests to the kernel as it commits them ([`crate::Engine::commit_submits`])
    /// the write is sent and not waited for (the next durable commit or
    /// checkpoint waits for it); elsewhere it is waited for. Where the
    /// transaction also records data written in place, it is committed with
    /// a flush instead, so a commit block never vouches for data that is not
    /// durable.
    #[default]
    Written,
    /// Changes stay in memory until the next `fsync`, `sync` or unmount.
    Deferred,
}

impl NamespaceCommit {
    /// Parses `written` or `deferred`.
    pub fn parse(text: &str) -> Result<NamespaceCommit> {
        match text {
            "written" => Ok(NamespaceCommit::Written),
            "deferred" => Ok(NamespaceCommit::Deferred),
            _ => Err(Error::spec("namespace commit", text, "written or deferred")),
        }
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            cache_bytes: 64 << 20,
            read_path: ReadPath::default(),
            fsync_path: FsyncPath::default(),
            readahead_bytes: 1 << 20,
            step_times: false,
            direct_copy: false,
            append_prealloc_bytes: 1 << 20,
            namespace_commit: NamespaceCommit::default(),
            write_behind: true,
            read_around_bytes: 64 << 10,
        }
    }
}

/// What `mount` found.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// Journal transactions replayed (non-zero after a crash).
    pub replayed: u64,
    /// Transactions a killed process left in the shared-memory log, applied
    /// after the journal's ([`shm_log`]).
    pub from_log: u64,
    /// Files found.
    pub files: usize,
    /// Directories found (not counting the root).
    pub dirs: usize,
    /// Files unlinked while open and not closed before a crash: freed now.
    pub orphans_reclaimed: usize,
    /// The format version the device had, if mounting upgraded it to [`format::VERSION`].
    pub upgraded_from: Option<u32>,
    /// Blocks the carried cache held for the device as it is ([`carry`]);
    /// `None` without one.
    pub carried: Option<u64>,
    /// The carried cache could not be used (said why); the mount went on without it.
    pub carry_error: Option<String>,
    /// Every block a file owns was checked against the bitmap; false where
    /// the carried cache vouched for the table (its inodes were checked,
    /// but plain files' were not decoded: see `check::Trust`).
    pub table_checked: bool,
}

/// One file as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path from the root (lossy UTF-8).
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
    /// `fdatasync`s of pages that only overwrote written blocks: the pages
    /// written with forced unit access, no commit.
    pub overwrite_syncs: u64,
    /// Direct writes inside the file over mapped blocks (written, or whole
    /// preallocated ones), under the file's shared lock: many at once per file.
    pub direct_shared: u64,
    /// Direct writes under the file's exclusive lock (growth, holes, a part
    /// of a preallocated block, cached pages of the range): one at a time per
    /// file, every other access to it waiting through the device time.
    pub direct_exclusive: u64,
    /// Device reads, writes and flushes the file layer issued.
    pub device_reads: u64,
    /// See `device_reads`.
    pub device_writes: u64,
    /// See `device_reads`.
    pub device_flushes: u64,
    /// Flushes not sent: no write since one that covered every write (see [`disk::Disk`]).
    pub device_flushes_skipped: u64,
    /// Bytes the file layer read from the device.
    pub device_read_bytes: u64,
    /// Bytes the file layer wrote to the device.
    pub device_written_bytes: u64,
    /// Pages written through the cache and not yet written back.
    pub dirty_pages: u64,
    /// The page cache's counters.
    pub cache: CacheStats,
    /// Blocks read from the carried cache instead of the device ([`carry`]).
    pub carried_reads: u64,
    /// Of those, blocks lent in place (no copy): the inode table's at a
    /// mount, and pages of files read.
    pub carried_lent: u64,
    /// Loads handed to the read-ahead thread (a window of a stream, or a
    /// small file a walk through its directory comes to next).
    pub readahead_posts: u64,
    /// Read-ahead threads running: none until the first load is handed to
    /// them.
    pub readahead_threads: usize,
    /// Pages written in the background behind a writer that streamed at
    /// least 4 MiB into a file (write-behind; among `cache.writebacks`).
    pub written_behind: u64,
}

impl FsStats {
    /// One line for people: what the journal, the cache and the device did.
    pub fn summary(&self) -> String {
        let (j, c) = (&self.journal, &self.cache);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        format!(
            "{} commits ({} sent without waiting), {} kept in the shared-memory log, {} checkpoints; {} syncs \
             ({} shared, {} a flush only, {} overwrites written durable); direct writes {} under the file's \
             shared lock, {} under its exclusive lock; cache {} hits, {} misses, {} pages read around ({} used), {} pages written back ({} behind the writer, {} then dropped), {} evicted, {} dirty now; device {} reads \
             ({:.1} MiB), {} writes ({:.1} MiB), {} flushes ({} more with nothing new to flush); {} blocks read from \
             the carried cache",
            j.commits,
            j.sent,
            j.logged,
            j.checkpoints,
            self.syncs,
            self.shared_commits,
            self.flush_only,
            self.overwrite_syncs,
            self.direct_shared,
            self.direct_exclusive,
            c.hits,
            c.misses,
            c.read_around_pages,
            c.read_around_used,
            c.writebacks,
            self.written_behind,
            c.dropped_behind,
            c.evictions,
            self.dirty_pages,
            self.device_reads,
            mib(self.device_read_bytes),
            self.device_writes,
            mib(self.device_written_bytes),
            self.device_flushes,
            self.device_flushes_skipped,
            self.carried_reads
        )
    }
}

/// A mounted file system. Cheap to clone; shared by threads.
#[derive(Clone)]
pub struct FileSystem {
    mount: Arc<Mount>,
}

/// An open file. Cheap to clone; shared by threads. A file unlinked while
/// open lives on until its last handle is dropped.
pub struct File {
    /// The file system, kept mounted while the file is open.
    fs: Arc<Mount>,
    node: Arc<Node>,
    /// Bypass the page cache (like `O_DIRECT`).
    direct: bool,
}

/// Held by every [`FileSystem`] and [`File`] (not by the read-ahead thread):
/// when the last is dropped, the file system is unmounted there and then
/// (everything committed and checkpointed), never later from another thread.
struct Mount {
    inner: Arc<Inner>,
}

impl std::ops::Deref for Mount {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let fs = &self.inner;
        fs.readahead.lock().map(|mut r| r.jobs.take()).ok();
        if !fs.unmounted.swap(true, Ordering::AcqRel) && !fs.aborted.load(Ordering::Acquire) {
            // Leave a clean journal if the device lets us; errors have no one to go to.
            if fs.quiesce().is_ok() {
                let _ = fs.carry_out();
            }
        }
        fs.stop_readahead();
        fs.flusher.lock().map(|mut f| f.stop()).ok();
        if !fs.aborted.load(Ordering::Acquire) {
            fs.give_back_table();
        }
    }
}

struct Inner {
    disk: Disk,
    sb: Superblock,
    options: MountOptions,
    cache: PageCache,
    steps: Steps,
    next_cache_id: AtomicU64,
    /// This mount, for the read-ahead threads it starts.
    me: std::sync::Weak<Inner>,
    /// The read-ahead threads and their queue.
    readahead: Mutex<ReadAheadThreads>,
    /// Read-ahead jobs posted and not yet finished.
    readahead_pending: AtomicU64,
    /// Loads handed to the read-ahead thread since mount.
    readahead_posts: AtomicU64,
    /// The write-behind thread and its queue ([`behind`]).
    flusher: Mutex<behind::Flusher>,
    /// Pages handed to it since mount.
    written_behind: AtomicU64,
    /// The last file opened in each directory ([`Inner::walk_ahead`]).
    walks: Mutex<crate::hash::IntMap<u32, (Vec<u8>, u32)>>,
    meta: Mutex<Meta>,
    journal: Mutex<Journal>,
    /// Highest transaction id known durable.
    committed: AtomicU64,
    /// Highest transaction id written to the journal (durable or not: see
    /// [`NamespaceCommit::Written`]); never below `committed`.
    written: AtomicU64,
    /// Commits ended so far (each after its journal lock was released).
    commits_ended: AtomicU64,
    /// Rung when a commit ends: syncs waiting for another thread's commit
    /// sleep on it instead of queueing on the journal lock one after another
    /// (a ring with no sleeper costs no system call).
    commit_ended: crate::path::waiter::Doorbell,
    /// Set when a commit failed: the in-memory and on-device metadata may disagree.
    aborted: AtomicBool,
    /// Dirty pages, and the files that hold them.
    dirty: writeback::DirtyFiles,
    unmounted: AtomicBool,
    syncs: AtomicU64,
    shared_commits: AtomicU64,
    flush_only: AtomicU64,
    overwrite_syncs: AtomicU64,
    direct_shared: AtomicU64,
    direct_exclusive: AtomicU64,
    /// Files whose `NodeState::map_unstored` is set (one freed with it set
    /// stays counted): an fsync looks at its file's flag, under the file's
    /// exclusive lock, only when this is not 0.
    maps_unstored: AtomicUsize,
}

/// How far a commit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Durable: flushed, the commit block written with forced unit access.
    Durable,
    /// Written to the journal, not flushed: survives the process, not a power cut.
    Written,
}

/// Longest a sync waiting for another thread's commit sleeps before it looks again.
const COMMIT_WAIT_NS: u64 = 200_000;

/// Files a directory walk loads ahead of the one it opens ([`Inner::walk_ahead`]).
const WALK_AHEAD: usize = 8;

/// Threads that load read-ahead windows. One: two (one finishing a window
/// while the other starts the next) cost more than they gave on two CPUs,
/// where they poll alongside the reader.
const READAHEAD_THREADS: usize = 1;

/// A window to read ahead: the file, and its blocks `[from, to)`.
type ReadAheadJob = (Arc<Node>, u64, u64);

/// The read-ahead threads and their queue. The threads start with the first
/// job posted: most short programs (`ls`, `stat`, a `cat` of a small file)
/// read nothing ahead, and a thread started at every mount cost each of them
/// a spawn.
#[derive(Default)]
struct ReadAheadThreads {
    /// Where jobs go; `None` when read-ahead is off, or once it is stopped
    /// (unmount) or its threads could not start.
    jobs: Option<std::sync::mpsc::Sender<ReadAheadJob>>,
    /// The queue's other end until the threads start.
    queue: Option<std::sync::mpsc::Receiver<ReadAheadJob>>,
    /// The threads, joined when the file system is unmounted: a thread
    /// that ended on its own later could end across a `fork` of the
    /// program, and the child could then wait for ever on a lock of std's
    /// that the ending thread held.
    threads: Vec<std::thread::JoinHandle<()>>,
}

struct Node {
    slot: u32,
    state: RwLock<NodeState>,
    readahead: ReadAhead,
    /// Open [`File`] handles (an unlink while some are open makes an orphan).
    /// Counted up under the metadata lock, which an unlink holds to read it.
    handles: AtomicUsize,
    /// In the dirty-file queue ([`writeback::DirtyFiles`]); changed under `state`'s lock.
    queued: AtomicBool,
    /// Writes of the file so far, each counted once its data is in the cache
    /// or on the device, before its lock is let go: an fdatasync reads it
    /// first, and needs nothing of its own once a sync job that covered that
    /// count is durable ([`NodeState::synced`]).
    writes: AtomicU64,
    /// The device's count of writes sent ([`Disk::writes_sent`]) after the
    /// file's latest direct write: a sync that writes the file's pages with
    /// forced unit access and no flush leaves those in the device's cache
    /// unless a flush since covered this many ([`Disk::flush_through`]).
    direct_sent: AtomicU64,
}

/// What an inode slot holds while mounted.
enum Slot {
    Free,
    /// A file (linked, or an orphan kept for its open handles).
    File(LazyNode),
    /// A directory: only its inode (its entries are in the namespace index).
    Dir(Box<Inode>),
    /// A hard link: another name of the file in the slot its inode names.
    Alias(Box<Inode>),
}

/// A file's node, built the first time [`Meta::file`] asks for it: from its
/// inode in the table (decoded again: the mount keeps only its name and
/// kind) for a file that was there, at once for one made since. A mount of
/// 8,760 files built a node for each (a fifth of mounting them, most of it
/// fresh heap faulted in) where a command uses a few.
struct LazyNode(std::sync::OnceLock<Arc<Node>>);

impl LazyNode {
    /// A file the mount found: its node is built from its inode in the table when first used.
    fn stored() -> LazyNode {
        LazyNode(std::sync::OnceLock::new())
    }

    /// A file whose node exists.
    fn built(node: Arc<Node>) -> LazyNode {
        LazyNode(std::sync::OnceLock::from(node))
    }

    /// The node if it is built.
    fn get(&self) -> Option<&Arc<Node>> {
        self.0.get()
    }
}

/// What [`NodeState::loads`] gains when a load starts (it loses 1 when done).
const LOAD_STARTED: u64 = 1 + (1 << 32);

struct NodeState {
    slot: u32,
    /// The file as the next commit records it, except `inode.size`, which is the
    /// size readers see: the inode records `disk_size`.
    inode: Inode,
    /// The size the device can back: everything below it is written (or a hole).
    /// A write through the cache grows `inode.size` only; writeback brings this up
    /// to it (ext4's i_disksize), so a commit never records a size whose data is
    /// only in the cache, whichever file's fsync commits it.
    disk_size: u64,
    /// Key of its pages in the cache (new on truncate and direct writes, which forget them).
    cache_id: u64,
    /// Pages written and not yet written back, by file block.
    dirty: BTreeMap<u64, Arc<Page>>,
    /// False once unlinked or replaced.
    live: bool,
    /// Its names while it has any (`st_nlink`): its own and its hard links'.
    nlink: u32,
    /// Last transaction that changed this file's inode.
    meta_tid: u64,
    /// Last transaction that changed its size or block map (what `fdatasync` needs).
    layout_tid: u64,
    /// A buffered write changed the modification time and the inode was not
    /// stored since: the writeback of its dirty pages, which comes before any
    /// commit of the file (fsync, sync, unmount), stores it. A write stored
    /// the inode every time (an encode, a CRC and the metadata lock per
    /// `write`: 7% of `tar c`'s samples).
    mtime_unstored: bool,
    /// The time of the last direct overwrite that moved the modification
    /// time (0: none since the inode's time was last set or stored). Such a
    /// write runs under the file's shared lock and notes its time here: it
    /// took the exclusive lock to put it in the inode, once per clock tick,
    /// and that waited for every direct write in flight while new ones
    /// queued behind it (fio's 16 KiB direct random writes from 8 threads to
    /// one file: p99 301-317 us against ext4's 177-200). Every store of the
    /// inode folds it in ([`NodeState::store`]); whoever sets the time under
    /// the exclusive lock clears it ([`NodeState::set_mtime`]).
    direct_mtime: AtomicU64,
    /// Copies of ranges of the file kept equal to it ([`File::mirror`]).
    mirrors: Vec<Arc<mirror::MirrorMemory>>,
    /// Page loads of the file: in flight (the low 32 bits) and started
    /// (the high ones), counted from before each reads the device or a
    /// carried frame until its pages are in the cache. A direct overwrite
    /// under the shared lock goes only while none is in flight, and one that
    /// sees the count change while it wrote forgets the cached pages (a new
    /// `cache_id`) before it returns: they may hold what was there before.
    loads: AtomicU64,
    /// The stream it is being written in, and its write-behind jobs ([`behind`]).
    stream: behind::Stream,
    /// Every write up to this count of [`Node::writes`] is durable: the count
    /// a durable sync job covered when it was taken (all writes counted then
    /// were in its pages, or written before its flush), once it succeeded.
    /// Threads that write one block of a log and fdatasync each rewrote the
    /// block one after another (16 threads appending 512-byte records: 0.5x
    /// ext4's syncs), each for pages the others had written again since.
    synced: u64,
    /// File blocks below this one that lie past the end were asked for
    /// (`fallocate` with `FALLOC_FL_KEEP_SIZE`): the last close keeps them
    /// ([`File::allocate`](file::File::allocate)). Not stored: a later mount
    /// gives them back as it does appends' preallocation.
    kept_past_end: u64,
    /// Blocks were marked written in `inode.extents` by a writeback whose
    /// store of the inode failed (no room for the map's overflow blocks even
    /// in [`Meta::allocate_data`]'s reserve): what the device holds says
    /// they read as zeros. The file's next fsync stores the map or fails.
    map_unstored: bool,
}

/// Blocks that data allocations leave free for files' extent maps
/// ([`Meta::allocate_data`]): a 512th of the device, at least 16 (4,000
/// extents) and at most 2,048 (8 MiB).
pub(super) fn extent_map_reserve(sb: &Superblock) -> u64 {
    (sb.blocks / 512).clamp(16, 2048)
}

/// All metadata, in memory, as the next commit will write it.
struct Meta {
    /// Inode-table block images; `None` for a block of free slots (all zeros).
    table: Vec<Option<IoBuf>>,
    /// One bit per table block: written since the mount ([`Meta::table_block`]).
    touched: Vec<u64>,
    /// One bit per table block: its image is a frame the carried cache lent
    /// at the mount. One not touched goes back to it at unmount (any other
    /// block, even one at an address the carried cache once lent, may have
    /// been written: a block of the pool is).
    lent_table: Vec<u64>,
    /// What each inode slot below the inode mark holds (none above it is in use).
    slots: Vec<Slot>,
    /// The superblock as mounted: the layout a file's inode is decoded with
    /// when its node is first built ([`LazyNode`]; none of the fields that
    /// decoding reads changes after the mount).
    layout: Superblock,
    /// Every name, indexed.
    ns: namespace::Index,
    /// The root directory's times (it has no inode: the mount time, then its last change).
    root_times: u64,
    alloc: Allocator,
    /// Overflow extent block images by block number.
    overflow: HashMap<u64, Block>,
    /// Blocks changed in the running transaction.
    dirty: BTreeSet<u64>,
    /// Data runs freed in the running transaction (allocatable after it commits).
    freed: Vec<(u64, u64)>,
    /// Data blocks were freed since mount: the carried cache may hold some no
    /// file holds any more ([`carry::CarriedCache::forget_dead`] looks for them).
    freed_since_mount: bool,
    /// Metadata blocks freed in the running transaction (allocatable after a checkpoint).
    freed_meta: Vec<(u64, u64)>,
    /// Id of the running transaction.
    tid: u64,
    /// Where the search for a free inode slot starts.
    slot_hint: usize,
    /// The live inode mark (see [`Superblock::inode_mark`]): no slot at or
    /// above it is in use.
    inode_mark: u64,
    /// Data blocks whose images are in the live journal (the `journaled` fsync
    /// path put them there; empty on the other paths). Replay would write those
    /// images home again, so a block in here written in place later (by its
    /// file, or by another after it was freed and reused) must be made safe by
    /// a checkpoint before a commit vouches for it. May hold more than the
    /// journal does (cleared only when a checkpoint is known to have
    /// happened): never less.
    journaled: HashSet<u64>,
    /// The running transaction vouches for data written in place (a file's
    /// writeback, a direct write): its commit block must not become durable
    /// before that data does.
    in_place_data: bool,
    /// Some of that data overwrote a block in `journaled`: the commit must
    /// checkpoint first, or replay would put the older image back over it.
    overwrote_journaled: bool,
}

fn file_error(op: &'static str, name: impl AsRef<[u8]>, errno: i32, why: impl Into<String>) -> Error {
    Error::File { op, name: String::from_utf8_lossy(name.as_ref()).into_owned(), errno, why: why.into() }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The wall clock at its coarse resolution (the kernel's tick, a few ms):
/// a file's modification time newer than this was set in the current tick.
fn coarse_now_ns() -> u64 {
    crate::sys::clock_ns(libc::CLOCK_REALTIME_COARSE)
}

impl Meta {
    /// Allocates up to `want` blocks at `goal`, else in the next free run of
    /// at least `min_run` blocks, else at the next free block ([`Allocator::allocate`]).
    fn allocate(&mut self, sb: &Superblock, want: u64, min_run: u64, goal: Option<u64>) -> Result<Option<(u64, u64)>> {
        let dirty = &mut self.dirty;
        self.alloc.allocate(want, min_run, goal, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        })
    }

    /// [`Meta::allocate`] for a file's data: leaves [`extent_map_reserve`]
    /// blocks free. Marking preallocated blocks written can split an
    /// unwritten extent in two and grow the file's map past an overflow block,
    /// after the write has been accepted (`fallocate` promised the space):
    /// those stores take their blocks from what is left here.
    fn allocate_data(
        &mut self,
        sb: &Superblock,
        want: u64,
        min_run: u64,
        goal: Option<u64>,
    ) -> Result<Option<(u64, u64)>> {
        let reserve = extent_map_reserve(sb);
        let room = self.alloc.read_until_allocatable(want.saturating_add(reserve))?.saturating_sub(reserve);
        if room == 0 {
            return Ok(None);
        }
        self.allocate(sb, want.min(room), min_run.min(room), goal)
    }

    /// Whether storing a map of `extents` extents for a file that has
    /// `overflow` overflow blocks leaves [`extent_map_reserve`] untouched (a
    /// write that maps new blocks must not take what conversions need).
    fn map_fits_outside_reserve(&mut self, sb: &Superblock, extents: usize, overflow: usize) -> Result<bool> {
        let more = Inode::overflow_needed(extents).saturating_sub(overflow) as u64;
        if more == 0 {
            return Ok(true);
        }
        let want = more + extent_map_reserve(sb);
        Ok(self.alloc.read_until_allocatable(want)? >= want)
    }

    /// Frees a data run: allocatable again once the running transaction
    /// commits. An error only if its part of the bitmap could not be read.
    fn free_data(&mut self, sb: &Superblock, start: u64, len: u64) -> Result<()> {
        let dirty = &mut self.dirty;
        let ok = self.alloc.free(start, len, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        })?;
        debug_assert!(ok, "freeing blocks {start}+{len} that are not in use");
        self.freed.push((start, len));
        self.freed_since_mount = true;
        Ok(())
    }

    /// Frees data blocks that never held data, allocatable again at once ([`Allocator::free_now`]).
    fn free_unwritten(&mut self, sb: &Superblock, start: u64, len: u64) -> Result<()> {
        let dirty = &mut self.dirty;
        let ok = self.alloc.free_now(start, len, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        })?;
        debug_assert!(ok, "freeing blocks {start}+{len} that are not in use");
        Ok(())
    }

    /// Frees an overflow (metadata) block: allocatable again after the next checkpoint.
    fn free_meta(&mut self, sb: &Superblock, block: u64) -> Result<()> {
        let dirty = &mut self.dirty;
        let ok = self.alloc.free(block, 1, &mut |i| {
            dirty.insert(sb.bitmap_start + i);
        })?;
        debug_assert!(ok, "freeing overflow block {block} that is not in use");
        self.overflow.remove(&block);
        self.freed_meta.push((block, 1));
        Ok(())
    }

    fn inode_block(&self, sb: &Superblock, slot: u32) -> u64 {
        sb.inode_start + slot as u64 / INODES_PER_BLOCK as u64
    }

    /// Writes `inode` into slot `slot` (growing or shrinking its overflow chain) and marks what changed.
    fn store_inode(&mut self, sb: &Superblock, slot: u32, inode: &mut Inode) -> Result<()> {
        let need = Inode::overflow_needed(inode.extents.len());
        while inode.overflow.len() > need {
            self.alloc.read_covering(*inode.overflow.last().expect("longer than need"), 1)?;
            let b = inode.overflow.pop().expect("longer than need");
            self.free_meta(sb, b)?;
        }
        while inode.overflow.len() < need {
            let goal = inode.overflow.last().map(|b| b + 1);
            let Some((b, _)) = self.allocate(sb, 1, 1, goal)? else {
                return Err(file_error("extend", &inode.name, libc::ENOSPC, "no space left for its extent map"));
            };
            inode.overflow.push(b);
        }
        let mut blocks: Vec<Block> = inode.overflow.iter().map(|_| zero_block()).collect();
        let index = slot as usize % INODES_PER_BLOCK;
        let table = self.table_block(slot);
        inode.encode(&mut table[index * INODE_SIZE..(index + 1) * INODE_SIZE], &mut blocks);
        self.dirty.insert(self.inode_block(sb, slot));
        for (b, image) in inode.overflow.iter().zip(blocks) {
            self.overflow.insert(*b, image);
            self.dirty.insert(*b);
        }
        Ok(())
    }

    /// Frees a file's blocks and slot (unlink, or the target of a rename);
    /// returns how many dirty pages it dropped (for [`writeback::DirtyFiles::forget`]).
    /// An error (and the file left as it was) if the part of the bitmap its
    /// blocks are in could not be read.
    fn drop_inode(&mut self, sb: &Superblock, slot: u32, state: &mut NodeState) -> Result<usize> {
        // Everything the frees look at, read before anything changes.
        self.read_bitmap_of(&state.inode)?;
        for e in std::mem::take(&mut state.inode.extents) {
            self.free_data(sb, e.physical, e.len as u64)?;
        }
        for b in std::mem::take(&mut state.inode.overflow) {
            self.free_meta(sb, b)?;
        }
        debug_assert!(self.ns.aliases(slot).is_empty(), "a file with hard links keeps its slot");
        self.ns.remove_slot(slot);
        self.ns.forget_kind(slot);
        self.clear_slot(sb, slot);
        let dirty = std::mem::take(&mut state.dirty);
        for page in dirty.values() {
            page.data.write().expect("page lock poisoned").dirty = false;
        }
        state.live = false;
        state.meta_tid = self.tid;
        state.layout_tid = self.tid;
        Ok(dirty.len())
    }

    /// Reads the part of the bitmap that covers `inode`'s blocks (see
    /// [`alloc`]): before a change that frees them begins, so that a read
    /// that fails leaves nothing half done.
    fn read_bitmap_of(&mut self, inode: &Inode) -> Result<()> {
        for e in &inode.extents {
            self.alloc.read_covering(e.physical, u64::from(e.len))?;
        }
        for &b in &inode.overflow {
            self.alloc.read_covering(b, 1)?;
        }
        Ok(())
    }

    /// Frees inode `slot` (already out of the index): zeros in the running transaction.
    fn clear_slot(&mut self, sb: &Superblock, slot: u32) {
        let index = slot as usize % INODES_PER_BLOCK;
        Inode::encode_free(&mut self.table_block(slot)[index * INODE_SIZE..(index + 1) * INODE_SIZE]);
        self.dirty.insert(self.inode_block(sb, slot));
        self.slots[slot as usize] = Slot::Free;
    }

    /// The inode-table block that holds `slot`, made (zeros) if it held nothing.
    fn table_block(&mut self, slot: u32) -> &mut [u8] {
        let i = slot as usize / INODES_PER_BLOCK;
        carry::set_bit(&mut self.touched, i);
        self.table[i].get_or_insert_with(|| IoBuf::new(BLOCK))
    }

    /// Takes the running transaction: its images, and the runs it freed.
    #[allow(clippy::type_complexity)]
    fn take_transaction(&mut self, sb: &Superblock) -> (u64, Vec<(u64, Block)>, Vec<(u64, u64)>, Vec<(u64, u64)>) {
        let mut images = Vec::with_capacity(self.dirty.len());
        for b in std::mem::take(&mut self.dirty) {
            let image = if b == 0 {
                // The inode mark rose in this transaction.
                Superblock { inode_mark: self.inode_mark, ..*sb }.encode()
            } else if b >= sb.inode_start && b < sb.bitmap_start {
                let mut image = zero_block();
                if let Some(table) = &self.table[(b - sb.inode_start) as usize] {
                    image.copy_from_slice(table);
                }
                image
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

    /// Whether the running transaction vouches for data written in place (its
    /// commit must be durable, ordered behind that data).
    fn vouches_for_data(&self) -> bool {
        self.in_place_data || self.overwrote_journaled
    }

    /// Takes the running transaction's ordering flags (with the transaction):
    /// whether it vouches for data written in place, and whether that data
    /// overwrote a journaled block.
    fn take_ordering(&mut self) -> (bool, bool) {
        (std::mem::take(&mut self.in_place_data), std::mem::take(&mut self.overwrote_journaled))
    }

    /// Data blocks (listed by `blocks`, called only if some block is journaled)
    /// were written in place and the running transaction will vouch for them;
    /// true if one of them has an image in the journal.
    /// Whether an image of one of `blocks` is in the journal (an in-place
    /// write of it would need [`Meta::wrote_in_place`]'s commit).
    fn holds_journaled(&self, mut blocks: impl Iterator<Item = u64>) -> bool {
        !self.journaled.is_empty() && blocks.any(|b| self.journaled.contains(&b))
    }

    fn wrote_in_place<I: IntoIterator<Item = u64>>(&mut self, blocks: impl FnOnce() -> I) -> bool {
        self.in_place_data = true;
        let hit = !self.journaled.is_empty() && self.holds_journaled(blocks().into_iter());
        self.overwrote_journaled |= hit;
        hit
    }
}

impl FileSystem {
    /// Writes a new, empty file system on the engine's device (erasing what it holds).
    pub fn format(engine: Arc<Engine>, options: FormatOptions) -> Result<Formatted> {
        let disk = Disk::new(engine);
        let blocks = disk.blocks();
        let inodes = options.inodes.unwrap_or((blocks / 16).clamp(64, 1 << 17));
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
        for (i, image) in alloc.images().enumerate() {
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
        FileSystem::mount_with(engine, MountOptions::default())
    }

    /// Mounts with a page cache, read and fsync paths of the caller's choosing.
    pub fn mount_with(engine: Arc<Engine>, options: MountOptions) -> Result<(FileSystem, Mounted)> {
        FileSystem::mount_carrying(engine, options, None)
    }

    /// Mounts as [`FileSystem::mount_with`] does, reading what `carry` holds
    /// for the device as it is instead of the device, and leaving this
    /// mount's clean blocks in it at unmount ([`carry`]). The caller holds
    /// the device's mount lock ([`lock::MountLock`]). A carried cache that
    /// cannot be used is set aside (said in [`Mounted::carry_error`]), never
    /// a reason not to mount.
    pub fn mount_carrying(
        engine: Arc<Engine>,
        options: MountOptions,
        carry: Option<carry::CarriedCache>,
    ) -> Result<(FileSystem, Mounted)> {
        FileSystem::mount_beside(engine, options, carry, None)
    }

    /// Mounts as [`FileSystem::mount_carrying`] does, and with a
    /// shared-memory log ([`shm_log`]) where the mount's options write
    /// namespace changes without a flush ([`NamespaceCommit::Written`]):
    /// first applying what a killed holder left in it, then keeping this
    /// mount's changes there until the journal writes them in a group. The
    /// caller holds the device's mount lock.
    pub fn mount_beside(
        engine: Arc<Engine>,
        options: MountOptions,
        carry: Option<carry::CarriedCache>,
        log: Option<shm_log::ShmLog>,
    ) -> Result<(FileSystem, Mounted)> {
        let disk = Disk::new(engine);
        if disk.blocks() < 2 {
            return Err(format::corrupt("the device is smaller than two blocks: no file system fits"));
        }
        // A carried cache whose stamp the superblock matches vouches that its
        // process quiesced the device and wrote nothing after (any write unstamps it).
        let stamped = |sb: &Superblock| carry.as_ref().is_some_and(|c| c.stamped_for(sb.volume_id, sb.carry_stamp));
        let (mut sb, mut journal) = check::recover(&disk, log.as_ref(), stamped)?;
        let replayed = journal.stats().replayed;
        let from_log = journal.stats().from_log;
        let (mut carried, mut carry_error) = (None, None);
        // What recovery wrote changed the device behind the carried cache: a killed
        // holder's transactions kept only in the shared-memory log leave the stamps
        // matching (no device write unsealed them), so it is trusted only when
        // nothing was replayed.
        let trusted_stamp = if replayed == 0 && from_log == 0 { sb.carry_stamp } else { 0 };
        // A cache that matches keeps its stamp, sealed, until the first device write
        // (`CarriedCache::attach`): then the superblock's can stay too, and a process
        // that writes nothing writes nothing at all.
        let mut sealed = false;
        if let Some(carry) = carry {
            let matches = carry.stamped_for(sb.volume_id, trusted_stamp);
            match carry.attach(sb.volume_id, trusted_stamp) {
                Ok(blocks) => {
                    (carried, sealed) = (Some(blocks), matches);
                    disk.attach_carry(Arc::new(carry));
                }
                Err(e) => carry_error = Some(e.to_string()),
            }
        }
        let upgraded_from = (sb.version < format::VERSION).then_some(sb.version);
        if upgraded_from.is_some() || (sb.carry_stamp != 0 && !sealed) {
            // Before anything else is written: no carried cache vouches for the device now.
            // An upgrade's journal is empty now; older inodes read as files in the root.
            sb.version = format::VERSION;
            sb.carry_stamp = 0;
            disk.write(0, &IoBuf::from_slice(&sb.encode()[..]))?;
            if upgraded_from.is_some() {
                disk.flush()?;
                journal = Journal::recover(&disk, &sb, None)?;
            }
        }
        if let Some(log) = log.filter(|_| options.namespace_commit == NamespaceCommit::Written) {
            journal.keep_log(log);
        }
        let (table, lent_table) = check::read_table(&disk, &sb, false)?;
        // Read as needed (see `alloc`): at first the part the scan checks.
        let mut alloc = Allocator::lazy(disk.reader(), sb.bitmap_start, sb.bitmap_blocks, sb.blocks, sb.data_start);
        let mut first = check::FirstProblem;
        // A table the last holder left as it is needs no second check (`check::Trust`).
        let trust = if sealed && upgraded_from.is_none() { check::Trust::Carried } else { check::Trust::Check };
        let scan = check::scan(&disk, &sb, &table, &mut alloc, &mut first, trust)?;
        let ns = namespace::index(scan.named.iter().filter(|n| !n.orphan), &mut first)?;
        if upgraded_from.is_some_and(|v| v < 5) {
            // The mark was not kept: it is where the scan found the last inode.
            sb.inode_mark = scan.named.last().map_or(0, |n| sb.inode_mark_over(n.slot as u64));
            disk.write(0, &IoBuf::from_slice(&sb.encode()[..]))?;
            disk.flush()?;
        }
        let mut meta = Meta {
            touched: vec![0; table.len().div_ceil(64)],
            lent_table,
            table,
            // Up to the inode mark (no slot above it is in use), grown as it rises: a
            // slot for every inode of the table was 1.2 MiB faulted in at each mount
            // of a 3 GiB device, however few files it held.
            slots: (0..sb.inode_mark).map(|_| Slot::Free).collect(),
            layout: sb,
            ns,
            root_times: now_ns(),
            alloc,
            overflow: scan.overflow,
            dirty: BTreeSet::new(),
            freed: Vec::new(),
            freed_since_mount: false,
            freed_meta: Vec::new(),
            tid: 1,
            slot_hint: 0,
            inode_mark: sb.inode_mark,
            journaled: HashSet::new(),
            in_place_data: false,
            overwrote_journaled: false,
        };
        let mut orphans = Vec::new();
        let mut kept = scan.kept.into_iter();
        for named in &scan.named {
            let slot = named.slot;
            meta.slots[slot as usize] = if named.kept_whole() {
                let (at, inode) = kept.next().expect("the scan kept the inode of every directory and hard link");
                debug_assert_eq!(at, slot, "kept inodes are in slot order");
                if named.is_dir() { Slot::Dir(Box::new(inode)) } else { Slot::Alias(Box::new(inode)) }
            } else {
                if named.orphan {
                    orphans.push(slot);
                }
                Slot::File(LazyNode::stored())
            };
        }
        drop(scan.named);
        for &slot in &orphans {
            // Unlinked while open, and the crash came before the last close.
            let node = Arc::clone(meta.file(slot).expect("an orphan is a file"));
            let mut state = node.state.write().expect("file lock poisoned");
            let dropped = meta.drop_inode(&sb, slot, &mut state)?;
            debug_assert_eq!(dropped, 0, "nothing is dirty at mount");
        }
        let files = meta.slots.iter().filter(|s| matches!(s, Slot::File(_))).count();
        let dirs = meta.slots.iter().filter(|s| matches!(s, Slot::Dir(_))).count();
        let slots = sb.inodes();
        let readahead = if options.readahead_bytes >= BLOCK_U64 {
            let (tx, rx) = std::sync::mpsc::channel();
            ReadAheadThreads { jobs: Some(tx), queue: Some(rx), threads: Vec::new() }
        } else {
            ReadAheadThreads::default()
        };
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            disk,
            sb,
            options,
            cache: PageCache::new((options.cache_bytes / BLOCK_U64) as usize),
            steps: Steps::new(options.step_times),
            next_cache_id: AtomicU64::new(slots + 1),
            readahead: Mutex::new(readahead),
            readahead_pending: AtomicU64::new(0),
            readahead_posts: AtomicU64::new(0),
            flusher: Mutex::new(behind::Flusher::default()),
            written_behind: AtomicU64::new(0),
            walks: Mutex::new(crate::hash::IntMap::default()),
            meta: Mutex::new(meta),
            journal: Mutex::new(journal),
            committed: AtomicU64::new(0),
            written: AtomicU64::new(0),
            commits_ended: AtomicU64::new(0),
            commit_ended: crate::path::waiter::Doorbell::default(),
            aborted: AtomicBool::new(false),
            dirty: writeback::DirtyFiles::default(),
            unmounted: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            shared_commits: AtomicU64::new(0),
            flush_only: AtomicU64::new(0),
            overwrite_syncs: AtomicU64::new(0),
            direct_shared: AtomicU64::new(0),
            direct_exclusive: AtomicU64::new(0),
            maps_unstored: AtomicUsize::new(0),
        });
        let mounted = Mounted {
            replayed,
            from_log,
            files,
            dirs,
            orphans_reclaimed: orphans.len(),
            upgraded_from,
            carried,
            carry_error,
            table_checked: trust == check::Trust::Check,
        };
        Ok((FileSystem { mount: Arc::new(Mount { inner }) }, mounted))
    }

    /// The layout.
    pub fn superblock(&self) -> &Superblock {
        &self.mount.sb
    }

    /// Makes everything done so far durable (all files' data and metadata).
    pub fn sync(&self) -> Result<()> {
        self.mount.sync_all()
    }

    /// Returns once every read-ahead posted so far has been loaded (at once
    /// when read-ahead is off or the file system is unmounted): for tests
    /// and measurements whose result must not depend on how fast the
    /// read-ahead thread keeps up with a reader.
    pub fn wait_for_readahead(&self) {
        let fs = &self.mount;
        while fs.readahead_pending.load(Ordering::Acquire) > 0 && !fs.unmounted.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Makes every namespace change so far durable (creates, unlinks,
    /// renames, mkdirs, rmdirs) without writing back any file's data: what
    /// `fsync` of a directory promises. [`FileSystem::sync`] writes back every
    /// file first, which costs a visit to every file of the file system:
    /// SQLite fsyncs its directory twice per transaction.
    ///
    /// When the running transaction holds no change, every change so far is
    /// in one before it, and that one is often durable already (SQLite
    /// fsyncs the directory right after the journal file it just created,
    /// whose fsync committed the create): then nothing is written, as ext4
    /// returns at once when its running transaction has nothing of the
    /// directory's.
    pub fn sync_namespace(&self) -> Result<()> {
        let fs = &self.mount;
        let tid = {
            let meta = fs.meta();
            if meta.dirty.is_empty() { meta.tid.checked_sub(1) } else { Some(meta.tid) }
        };
        match tid {
            Some(tid) => fs.sync_through(tid),
            None => Ok(()), // nothing was ever committed: nothing to make durable
        }
    }

    /// Time spent in each step of the read and fsync paths, as (step, total ns,
    /// times), if the file system was mounted with `step_times`.
    pub fn steps(&self) -> Option<Vec<(&'static str, u64, u64)>> {
        self.mount.steps.enabled().then(|| self.mount.steps.all())
    }

    /// The options it was mounted with.
    pub fn options(&self) -> MountOptions {
        self.mount.options
    }

    /// Blocks not in use now (statfs, `iopath df`): reads whatever part of
    /// the bitmap this mount has not read yet (see [`alloc`]).
    pub fn free_blocks(&self) -> Result<u64> {
        self.mount.meta().alloc.free_blocks()
    }

    /// Free blocks kept for files' block maps, which data does not take
    /// (a 512th of the device, 16 to 2,048): statfs's `f_bavail` is the
    /// free blocks less these, as ext4's reserved blocks.
    pub fn reserved_blocks(&self) -> u64 {
        extent_map_reserve(&self.mount.sb)
    }

    /// Counters so far.
    pub fn stats(&self) -> FsStats {
        let fs = &self.mount;
        let c = fs.disk.counters();
        FsStats {
            journal: fs.journal.lock().expect("journal lock poisoned").stats(),
            syncs: fs.syncs.load(Ordering::Relaxed),
            shared_commits: fs.shared_commits.load(Ordering::Relaxed),
            flush_only: fs.flush_only.load(Ordering::Relaxed),
            overwrite_syncs: fs.overwrite_syncs.load(Ordering::Relaxed),
            direct_shared: fs.direct_shared.load(Ordering::Relaxed),
            direct_exclusive: fs.direct_exclusive.load(Ordering::Relaxed),
            device_reads: c.reads.load(Ordering::Relaxed),
            device_writes: c.writes.load(Ordering::Relaxed),
            device_flushes: c.flushes.load(Ordering::Relaxed),
            device_flushes_skipped: c.flushes_skipped.load(Ordering::Relaxed),
            device_read_bytes: c.read_bytes.load(Ordering::Relaxed),
            device_written_bytes: c.written_bytes.load(Ordering::Relaxed),
            dirty_pages: fs.dirty.pages() as u64,
            cache: fs.cache.stats(),
            carried_reads: fs.disk.carry().map_or(0, |c| c.hits()),
            carried_lent: fs.disk.carry().map_or(0, |c| c.lent()),
            readahead_posts: fs.readahead_posts.load(Ordering::Relaxed),
            readahead_threads: fs.readahead.lock().map_or(0, |r| r.threads.len()),
            written_behind: fs.written_behind.load(Ordering::Relaxed),
        }
    }

    /// Commits everything, writes the metadata home and empties the journal,
    /// so the next mount replays nothing. Files still open stay usable.
    pub fn unmount(self) -> Result<()> {
        self.quiesce()?;
        self.mount.carry_out()?;
        self.mount.unmounted.store(true, Ordering::Release);
        self.mount.stop_readahead();
        self.mount.flusher.lock().map(|mut f| f.stop()).ok();
        Ok(())
    }

    /// The engine the file system is mounted on (it outlives the file
    /// system: a caller may keep it for the next mount of the same device).
    pub fn engine(&self) -> &Arc<Engine> {
        self.mount.disk.engine()
    }

    /// Whether anything but this handle holds the file system: open files, or
    /// other clones of it. When nothing does, dropping it unmounts.
    pub fn in_use_elsewhere(&self) -> bool {
        self.in_use_beyond(0)
    }

    /// Whether anything holds the file system open but this handle and
    /// `files` open files the caller holds.
    pub fn in_use_beyond(&self, files: usize) -> bool {
        Arc::strong_count(&self.mount) > 1 + files
    }

    /// Commits everything and checkpoints the journal, leaving the device as
    /// an unmount does (the next mount replays nothing), while the file
    /// system stays mounted: for a process that cannot give up its handle
    /// (the interposer, at exit).
    pub fn quiesce(&self) -> Result<()> {
        self.mount.quiesce()
    }

    /// [`FileSystem::quiesce`], then leaves the clean blocks of the page
    /// cache in the carried cache, if the file system was mounted with one,
    /// for the next process that mounts the device ([`carry`]): what a
    /// process that cannot give up its handle does at exit. Returns the
    /// blocks the carried cache holds (0 without one). A write after this
    /// sets the carried cache aside again.
    pub fn carry_over(&self) -> Result<u64> {
        self.carry_over_timed().map(|(blocks, _)| blocks)
    }

    /// [`FileSystem::carry_over`], with how long its first part took (the
    /// writeback, commit and checkpoint of [`FileSystem::quiesce`]; the
    /// rest is the save into the carried cache): what a slow exit spent
    /// its time on.
    pub fn carry_over_timed(&self) -> Result<(u64, std::time::Duration)> {
        let started = std::time::Instant::now();
        self.mount.quiesce()?;
        let quiesced = started.elapsed();
        Ok((self.mount.carry_out()?, quiesced))
    }
}

impl Inner {
    fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().expect("metadata lock poisoned")
    }

    fn check_writable(&self, op: &'static str, name: impl AsRef<[u8]>) -> Result<()> {
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

    fn new_cache_id(&self) -> u64 {
        self.next_cache_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes transaction `tid` (and all before it) durable; a flush when it holds nothing.
    fn sync_through(&self, tid: u64) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.commit_through(tid, Reach::Durable)
    }

    /// After a namespace change, made under `meta` (released here, before any
    /// journal work): writes its transaction to the journal if the mount says
    /// so ([`NamespaceCommit`]).
    pub(super) fn namespace_changed(&self, meta: MutexGuard<'_, Meta>) -> Result<()> {
        let tid = meta.tid;
        drop(meta);
        match self.options.namespace_commit {
            NamespaceCommit::Written => self.commit_through(tid, Reach::Written),
            NamespaceCommit::Deferred => Ok(()),
        }
    }

    /// Commits transaction `tid` (and all before it) as far as `reach`.
    ///
    /// While another thread commits, the caller sleeps until that commit ends
    /// (every waiter wakes at once, and those it covered leave at once) rather
    /// than queue on the journal lock, where each would take the lock in turn
    /// only to find it had nothing to do: one wake-up after another.
    fn commit_through(&self, tid: u64, reach: Reach) -> Result<()> {
        let watermark = match reach {
            Reach::Durable => &self.committed,
            Reach::Written => &self.written,
        };
        loop {
            let seen = self.commits_ended.load(Ordering::Acquire);
            if watermark.load(Ordering::Acquire) >= tid {
                // Another thread's commit covered it (for a durable one, that commit
                // started with a flush issued after this caller's writes had completed).
                self.shared_commits.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(Error::Device { op: "flush", offset: 0, len: 0, errno: libc::EIO });
            }
            match self.journal.try_lock() {
                Ok(mut journal) => {
                    if watermark.load(Ordering::Acquire) >= tid {
                        self.shared_commits.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    let result = match reach {
                        Reach::Durable => fsync_path::commit(self, &mut journal, None),
                        Reach::Written => fsync_path::commit_unflushed(self, &mut journal),
                    };
                    drop(journal);
                    self.end_commit();
                    return result;
                }
                // Until a commit ends; the time limit covers a journal holder that is
                // not committing (a checkpoint) and so rings no one.
                Err(std::sync::TryLockError::WouldBlock) => {
                    let limit = crate::clock::now_ns() + COMMIT_WAIT_NS;
                    self.commit_ended.wait_until(0, limit, || self.commits_ended.load(Ordering::Acquire) != seen);
                }
                Err(std::sync::TryLockError::Poisoned(_)) => panic!("journal lock poisoned"),
            }
        }
    }

    /// A commit ended and its journal lock was released: wakes the syncs waiting for one.
    pub(super) fn end_commit(&self) {
        self.commits_ended.fetch_add(1, Ordering::Release);
        self.commit_ended.ring();
    }

    /// Writes back every file's dirty pages, then commits.
    fn sync_all(&self) -> Result<()> {
        self.write_back_and_commit(false)
    }

    /// [`Inner::sync_all`]; with `stage`, for a save into the carried cache
    /// that follows ([`Inner::carry_out`]): what is written back is staged
    /// there while it is in flight, first in the frames of carried blocks no
    /// file holds any more (deleted or cut short since), whose memory is
    /// there already (after the sysbench cells of scripts/real-apps, the
    /// exit of a `cp -r` took 458-517 ms saving into frames never used
    /// before). Those are found under the metadata lock (the carried
    /// cache's own lock is taken under it, never the other way round): no
    /// copy of the bitmap.
    fn write_back_and_commit(&self, stage: bool) -> Result<()> {
        let nodes: Vec<Arc<Node>> = {
            let meta = self.meta();
            // Blocks freed before this mount were looked for at the last exit.
            if let Some(carry) = self.disk.carry().filter(|_| stage && meta.freed_since_mount) {
                carry.forget_dead(|block| meta.alloc.maybe_in_use(block));
            }
            // Only files with pages to write back, and those locked now (a writeback
            // under way there is waited for, as before): walking every file took
            // 5% of a `stat`'s time on a mount of 26K names.
            let needs = |node: &Node| {
                node.state.try_read().map_or(true, |s| s.live && (s.pending() || s.mtime_pending() || s.map_unstored))
            };
            meta.files().filter(|n| needs(n)).cloned().collect()
        };
        writeback::write_back_all(self, nodes.clone(), stage)?;
        // A map a writeback could not store (see `NodeState::map_unstored`): stored
        // now, or this sync fails once the rest is committed.
        let mut unstored = Ok(());
        for node in &nodes {
            let mut state = node.state.write().expect("file lock poisoned");
            if state.live && state.map_unstored {
                let mut meta = self.meta();
                match state.store(self, &mut meta) {
                    Ok(()) => {
                        state.meta_tid = meta.tid;
                        state.layout_tid = meta.tid;
                    }
                    Err(e) => unstored = Err(e),
                }
            }
        }
        self.sync_metadata()?;
        unstored
    }

    /// Makes every metadata change so far durable (the running transaction
    /// and all before it), writing back no file's data.
    fn sync_metadata(&self) -> Result<()> {
        let tid = self.meta().tid;
        self.sync_through(tid)
    }

    /// An open of file `slot`, named `name` in directory `parent` (the caller
    /// holds the metadata lock): if this process has been opening that
    /// directory's files in order, the files that come next, for
    /// [`Inner::load_whole_files`]. In order means by name, as `readdir`
    /// lists them (`tar c`, `diff -r`: the last file opened there is among
    /// the few entries just before this one), or by inode number (GNU `cp -r`
    /// sorts a directory's entries so, to read fast: the last one's slot is
    /// just below this one's). Each file such a walk opens was a device round
    /// trip in a process whose cache starts cold; read ahead by the read-ahead
    /// thread, on the other CPU, it is in the cache when the walk comes to it.
    fn walk_ahead(&self, meta: &Meta, parent: u32, name: &[u8], slot: u32) -> Vec<Arc<Node>> {
        let mut walks = self.walks.lock().expect("walks lock poisoned");
        let last = walks.get(&parent);
        let by_name = last.is_some_and(|(n, _)| meta.ns.before(parent, name, WALK_AHEAD + 1).any(|b| b == &n[..]));
        let by_slot = last.is_some_and(|&(_, s)| s < slot && slot - s <= WALK_AHEAD as u32 + 1);
        if walks.len() >= 1024 && !walks.contains_key(&parent) {
            walks.clear(); // directories long left behind
        }
        walks.insert(parent, (name.to_vec(), slot));
        drop(walks);
        let file = |c: namespace::Child| (!c.dir).then(|| meta.file(c.slot).cloned()).flatten();
        if by_name {
            meta.ns.after(parent, name, WALK_AHEAD).filter_map(file).collect()
        } else if by_slot {
            let next = slot as usize + 1..(slot as usize + 1 + WALK_AHEAD).min(meta.slots.len());
            next.filter(|&s| meta.ns.link_of(s as u32).is_some_and(|(p, _)| *p == parent))
                .filter_map(|s| meta.file(s as u32).cloned())
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Posts to the read-ahead thread each of `nodes` that is small (at most
    /// [`file::SMALL_FILE_WHOLE`]), not empty, and not in the cache yet, whole.
    fn load_whole_files(&self, nodes: &[Arc<Node>]) {
        for node in nodes {
            let Ok(state) = node.state.try_read() else { continue };
            // (A symbolic link's size is its target's length: it has no blocks to load.)
            let size = if state.inode.is_link() { 0 } else { state.inode.size };
            let cache_id = state.cache_id;
            // A file the carried cache holds is lent in place when it is read: handed
            // to the read-ahead thread, it cost a wake-up of that thread, on the other
            // CPU, per file (`tar c` of a carried tree: 4% of its samples waking it).
            let carried = self.carries(&state, 0);
            drop(state);
            if size == 0 || size > file::SMALL_FILE_WHOLE || carried || self.cache.peek((cache_id, 0)).is_some() {
                continue;
            }
            self.post_readahead(node, 0, size.div_ceil(BLOCK_U64));
        }
    }

    /// Whether the carried cache holds file block `block` of `state` (written
    /// on the device, so the block there is the file's).
    fn carries(&self, state: &NodeState, block: u64) -> bool {
        extents::locate(&state.inode.extents, block).is_some_and(|(b, unwritten)| !unwritten && self.disk.carries(b))
    }

    /// Posts a read-ahead of blocks `[from, to)` of `node` to the read-ahead thread.
    /// Ends read-ahead: no job is taken after this, and the threads are gone
    /// when it returns (a job in flight is finished or dropped first).
    fn stop_readahead(&self) {
        let threads = self
            .readahead
            .lock()
            .map(|mut r| {
                (r.jobs, r.queue) = (None, None);
                std::mem::take(&mut r.threads)
            })
            .unwrap_or_default();
        for thread in threads {
            debug_assert_ne!(thread.thread().id(), std::thread::current().id(), "a read-ahead thread unmounting");
            let _ = thread.join();
        }
    }

    fn post_readahead(&self, node: &Arc<Node>, from: u64, to: u64) {
        let mut readahead = self.readahead.lock().expect("read-ahead lock poisoned");
        if readahead.jobs.is_some()
            && let Some(queue) = readahead.queue.take()
        {
            // The first job: the threads start now, under the lock, so that an
            // unmount's stop finds them to join.
            let queue = Arc::new(Mutex::new(queue));
            for i in 0..READAHEAD_THREADS {
                let (weak, queue) = (self.me.clone(), Arc::clone(&queue));
                let named = std::thread::Builder::new().name(format!("iopath-readahead-{i}"));
                match crate::sys::spawn_without_signals(named, move || readahead_thread(weak, queue)) {
                    Ok(thread) => readahead.threads.push(thread),
                    // Read-ahead only saves time: without a thread, none is posted.
                    Err(_) if readahead.threads.is_empty() => readahead.jobs = None,
                    Err(_) => {}
                }
            }
        }
        if let Some(tx) = readahead.jobs.as_ref() {
            self.readahead_pending.fetch_add(1, Ordering::AcqRel);
            self.readahead_posts.fetch_add(1, Ordering::Relaxed);
            if tx.send((Arc::clone(node), from, to)).is_err() {
                self.readahead_pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Leaves the clean pages of live files in the carried cache, stamps it
    /// and the superblock alike; call after [`Inner::quiesce`] (so the
    /// device holds what every clean page holds, and the carried blocks of
    /// deleted files were set aside, their frames first to fill). Returns
    /// the blocks the carried cache holds (0 without one).
    fn carry_out(&self) -> Result<u64> {
        let Some(carry) = self.disk.carry() else { return Ok(0) };
        if self.aborted.load(Ordering::Acquire) {
            return Ok(0);
        }
        carry.watch_writes();
        // The cached pages first (a process that read and wrote nothing has none, and
        // needs no map of every file: 3% of a `stat` on a mount of 26K names). Taken
        // before any file's lock: a reader holds its file's lock while it takes a shard's.
        // Their keys only: a page's own memory is touched only where the carried
        // cache wants its bytes (61,731 pages at the exit of `tar cf`, nearly all
        // held or staged already, each a cache miss: 10 ms of the exit).
        let mut keys: Vec<Key> = Vec::new();
        self.cache.for_each_key(|key| keys.push(*key));
        let (mark, table) = self.table_to_carry(carry);
        let table = table.iter().map(|(block, image)| (*block, image.as_ref().map(|i| &i[..])));
        if keys.is_empty() {
            return self.save_carried(carry, mark, table);
        }
        // Each live file's pages by cache id, with the device block of each. The files
        // are taken under the metadata lock and their own locks after it is let go: a
        // writer holds its file's lock while it takes the metadata lock.
        let nodes: Vec<Arc<Node>> = self.meta().files().cloned().collect();
        let files: crate::hash::IntMap<u64, Arc<Node>> = nodes
            .into_iter()
            .filter_map(|node| {
                let state = node.state.read().ok()?;
                let cache_id = state.live.then_some(state.cache_id)?;
                drop(state);
                Some((cache_id, node))
            })
            .collect();
        // File by file (one lock and one extent map each): (device block, key).
        keys.sort_unstable();
        let mut located: Vec<(u64, Key)> = Vec::with_capacity(keys.len());
        for file in keys.chunk_by(|a, b| a.0 == b.0) {
            let Some(node) = files.get(&file[0].0) else { continue };
            let Ok(state) = node.state.read() else { continue };
            // The cache id checked again under the file's lock: a truncate gives a new one.
            if state.cache_id != file[0].0 {
                continue;
            }
            for &key in file.iter().take_while(|k| k.1 * BLOCK_U64 < state.disk_size) {
                if let Some((physical, false)) = extents::locate(&state.inode.extents, key.1) {
                    located.push((physical, key));
                }
            }
        }
        located.sort_unstable_by_key(|&(physical, _)| physical);
        located.dedup_by_key(|(physical, _)| *physical);
        let blocks: Vec<u64> = located.iter().map(|&(physical, _)| physical).collect();
        let wanted = carry.wanted(&blocks);
        // The pages whose bytes it wants, held through the save: a page written
        // meanwhile waits, and is written back (which sets the carried cache
        // aside) only after it is stamped. What it holds or staged needs no page:
        // a write of one of those blocks after this forgets it (or unseals the file).
        let pages: Vec<Option<Arc<Page>>> = located
            .iter()
            .zip(&wanted)
            .map(|(&(_, key), &want)| want.then(|| self.cache.peek(key)).flatten().filter(|p| p.ready()))
            .collect();
        let guards: Vec<_> =
            pages.iter().map(|p| p.as_ref().map(|p| p.data.read().expect("page lock poisoned"))).collect();
        let clean = blocks.iter().zip(&wanted).zip(&guards).filter_map(|((&block, &want), guard)| {
            if !want {
                return Some((block, None));
            }
            let guard = guard.as_ref()?;
            (!guard.dirty).then(|| (block, Some(&guard.buf[..])))
        });
        let held = self.save_carried(carry, mark, clean.chain(table));
        drop(guards);
        held
    }

    /// The inode mark, and the inode table's blocks below it and the overflow
    /// extent blocks for the carried cache, if the device holds what they do (everything committed
    /// is home and nothing changed since: as after [`Inner::quiesce`]): a
    /// copy of each block it does not hold yet, `None` for those it does.
    /// The next mount lends them instead of reading the table.
    fn table_to_carry(&self, carry: &carry::CarriedCache) -> (u64, Vec<(u64, Option<Block>)>) {
        // The journal's lock first, as a commit takes them: no commit between the
        // look at the journal and the copies.
        let journal = self.journal.lock().expect("journal lock poisoned");
        let meta = self.meta();
        if !journal.all_home() || !meta.dirty.is_empty() {
            return (meta.inode_mark, Vec::new());
        }
        // The table's blocks up to the mark, then the overflow extent blocks
        // (a mount reads them one at a time as it decodes the inodes they extend).
        let count = meta.inode_mark.div_ceil(INODES_PER_BLOCK as u64) as usize;
        let mut images: Vec<(u64, Option<&[u8]>)> =
            (0..count).map(|i| (self.sb.inode_start + i as u64, meta.table[i].as_ref().map(|b| &b[..BLOCK]))).collect();
        images.extend(meta.overflow.iter().map(|(&b, image)| (b, Some(&image[..]))));
        images.sort_unstable_by_key(|&(b, _)| b);
        let blocks: Vec<u64> = images.iter().map(|&(b, _)| b).collect();
        let wanted = carry.wanted(&blocks);
        let table = images
            .iter()
            .zip(wanted)
            .map(|(&(block, image), want)| {
                let copy = want.then(|| {
                    let mut copy = zero_block();
                    if let Some(image) = image {
                        copy.copy_from_slice(image);
                    }
                    copy
                });
                (block, copy)
            })
            .collect();
        (meta.inode_mark, table)
    }

    /// Saves `clean` (device block, its bytes, or `None` for one the carried
    /// cache holds or staged) with what the carried cache holds, then stamps it and the superblock alike (inode mark `mark`);
    /// returns the blocks it holds.
    fn save_carried<'a>(
        &self,
        carry: &carry::CarriedCache,
        mark: u64,
        clean: impl Iterator<Item = (u64, Option<&'a [u8]>)>,
    ) -> Result<u64> {
        let stamp = fastrand::u64(1..);
        let held = carry.save(self.sb.volume_id, stamp, clean)?;
        if carry.stamp_held() != stamp {
            // Nothing written since the mount (or the last save) and nothing to add: the
            // file and the superblock still vouch for each other under their stamp.
            return Ok(held);
        }
        let sb = Superblock { inode_mark: mark, carry_stamp: stamp, ..self.sb };
        self.disk.write_stamp(&IoBuf::from_slice(&sb.encode()[..]))?;
        Ok(held)
    }

    /// Gives the carried cache back the inode-table blocks it lent this
    /// mount that no inode change wrote ([`carry::CarriedCache::take_back`]),
    /// for the next mount in this process (or a child forked after) to be
    /// lent again instead of copying them: at unmount, the table no longer used.
    fn give_back_table(&self) {
        if self.disk.carry().is_none() {
            return;
        }
        let mut meta = self.meta();
        let meta = &mut *meta;
        for (i, block) in meta.table.iter_mut().enumerate() {
            if !carry::bit(&meta.lent_table, i) || carry::bit(&meta.touched, i) {
                continue;
            }
            if let Some(buf) = block.take() {
                // SAFETY: lent at the mount, and never written since: `Meta::table_block`
                // is the only way to write a table block, and it marks the block touched;
                // the table is not used after unmount.
                *block = unsafe { self.disk.take_back_lent(buf) };
            }
        }
    }

    /// Commits everything and checkpoints.
    fn quiesce(&self) -> Result<()> {
        // A save into the carried cache (carry_out) follows, or may.
        self.write_back_and_commit(true)?;
        let mut journal = self.journal.lock().expect("journal lock poisoned");
        let released = journal.checkpoint(&self.disk)?;
        // Under the journal lock: no commit can journal a block between the two.
        let mut meta = self.meta();
        meta.journaled.clear();
        meta.alloc.release(&released);
        Ok(())
    }
}

impl NodeState {
    /// Puts the file's inode (with its disk size) in the running transaction.
    /// Blocks written back past the disk size (the first batches of a file
    /// whose writeback is not over, or failed part way) are recorded as not
    /// written: a crash then leaves the file at its recorded size with no data
    /// past it, which a mount checks.
    fn store(&mut self, fs: &Inner, meta: &mut Meta) -> Result<()> {
        let direct = std::mem::take(self.direct_mtime.get_mut());
        if direct != 0 {
            // A direct overwrite's time: newer than the inode's (which the exclusive
            // lock, held here, excluded while that write ran).
            self.inode.mtime_ns = direct;
            self.mtime_unstored = true;
        }
        let size = self.inode.size;
        let recorded = self.disk_size.min(size);
        let past = recorded.div_ceil(BLOCK_U64);
        let written_past = |e: &format::Extent| e.end() > past && !e.unwritten;
        let stored = if self.inode.extents.iter().rev().take_while(|e| e.end() > past).any(written_past) {
            let mut copy = self.inode.clone();
            copy.size = recorded;
            extents::mark_unwritten_from(&mut copy.extents, past);
            let stored = meta.store_inode(&fs.sb, self.slot, &mut copy);
            // The overflow blocks the copy's map took are the file's now.
            self.inode.overflow = copy.overflow;
            stored
        } else {
            self.inode.size = recorded;
            let stored = meta.store_inode(&fs.sb, self.slot, &mut self.inode);
            self.inode.size = size;
            stored
        };
        if stored.is_ok() {
            self.mtime_unstored = false;
            if std::mem::replace(&mut self.map_unstored, false) {
                fs.maps_unstored.fetch_sub(1, Ordering::AcqRel);
            }
        }
        stored
    }

    /// Blocks were marked written in the file's map and the store that
    /// records it failed: see [`NodeState::map_unstored`].
    fn note_map_unstored(&mut self, fs: &Inner) {
        if !std::mem::replace(&mut self.map_unstored, true) {
            fs.maps_unstored.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The modification time `stat` shows: a direct overwrite's not stored
    /// yet, else the inode's.
    fn mtime_ns(&self) -> u64 {
        match self.direct_mtime.load(Ordering::Acquire) {
            0 => self.inode.mtime_ns,
            direct => direct,
        }
    }

    /// Sets the modification time (the caller holds the exclusive lock, so
    /// this is later than any direct overwrite's time noted before).
    fn set_mtime(&mut self, mtime_ns: u64) {
        *self.direct_mtime.get_mut() = 0;
        self.inode.mtime_ns = mtime_ns;
    }

    /// A direct overwrite under the shared lock moved the modification time
    /// to now ([`NodeState::direct_mtime`]).
    fn note_direct_mtime(&self) {
        self.direct_mtime.store(now_ns(), Ordering::Release);
    }

    /// Whether a modification time is in memory only: with the file's dirty
    /// pages (stored by their writeback) or a direct overwrite's.
    fn mtime_pending(&self) -> bool {
        self.mtime_unstored || self.direct_mtime.load(Ordering::Acquire) != 0
    }

    /// Stores the inode if its modification time is in memory only and no
    /// writeback of dirty pages will (a file written only directly has none):
    /// for an `fsync`, a `sync` and an unmount.
    fn store_pending_mtime(&mut self, fs: &Inner) -> Result<()> {
        if !self.mtime_pending() || !self.dirty.is_empty() {
            return Ok(());
        }
        let mut meta = fs.meta();
        self.store(fs, &mut meta)?;
        self.meta_tid = meta.tid;
        Ok(())
    }
}

impl NodeState {
    /// A file's state with nothing cached, dirty or pending: `inode` in
    /// `slot`, its pages cached under `cache_id`, `nlink` names, its inode
    /// last changed in transaction `tid` (0: before this mount).
    fn fresh(slot: u32, inode: Inode, cache_id: u64, nlink: u32, tid: u64) -> NodeState {
        NodeState {
            slot,
            disk_size: inode.size,
            inode,
            cache_id,
            dirty: BTreeMap::new(),
            live: true,
            nlink,
            meta_tid: tid,
            layout_tid: tid,
            mtime_unstored: false,
            direct_mtime: AtomicU64::new(0),
            mirrors: Vec::new(),
            loads: AtomicU64::new(0),
            stream: behind::Stream::default(),
            synced: 0,
            kept_past_end: 0,
            map_unstored: false,
        }
    }
}

impl Node {
    fn new(state: NodeState) -> Arc<Node> {
        Arc::new(Node {
            slot: state.slot,
            state: RwLock::new(state),
            readahead: ReadAhead::default(),
            handles: AtomicUsize::new(0),
            queued: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            direct_sent: AtomicU64::new(0),
        })
    }
}

impl Inner {
    /// Read-ahead after a read of blocks `[first, end)`: hands the next window
    /// to the read-ahead thread when the stream needs it.
    fn readahead(&self, node: &Arc<Node>, state: &NodeState, first: u64, end: u64) {
        // New pages enter the cache's small queue (a tenth of it): a window larger
        // than that is evicted before it is read.
        let max = (self.options.readahead_bytes / BLOCK_U64).min(self.cache.capacity() as u64 / 10);
        if let Some((from, to)) = node.readahead.on_read(first, end, max) {
            let last = state.inode.size.div_ceil(BLOCK_U64);
            // A window the carried cache holds is lent in place as it is read (a
            // lookup a block): handed to the read-ahead thread, it only made the
            // reader wait for that thread (13% of `tar c`'s samples spinning in
            // `wait_loaded` on pages the thread was lending).
            if from < last && !self.carries(state, from) {
                self.post_readahead(node, from, to.min(last));
            }
        }
    }
}

/// The read-ahead thread: loads the windows readers hand it, while they copy.
fn readahead_thread(fs: std::sync::Weak<Inner>, jobs: Arc<Mutex<std::sync::mpsc::Receiver<ReadAheadJob>>>) {
    loop {
        let job = jobs.lock().expect("read-ahead queue poisoned").recv();
        let Ok((node, from, to)) = job else { return };
        let Some(fs) = fs.upgrade() else { return };
        if fs.unmounted.load(Ordering::Acquire) {
            return;
        }
        read_ahead(&fs, &node, from, to);
        fs.readahead_pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Loads the blocks of `[from, to)` of `node` that the cache does not hold.
fn read_ahead(fs: &Inner, node: &Node, from: u64, to: u64) {
    let state = node.state.read().expect("file lock poisoned");
    if !state.live {
        return;
    }
    let last = state.inode.size.div_ceil(BLOCK_U64);
    let blocks: Vec<u64> = (from..to.min(last)).filter(|&b| fs.cache.peek((state.cache_id, b)).is_none()).collect();
    if blocks.is_empty() {
        return;
    }
    // Each page indexed before its read is sent (not lazily, even on the aios path): a
    // reader that gets there first must find the page and wait, not read it again.
    if let Ok(loaded) = read_path::load_ahead(fs, &state, &blocks) {
        fs.cache.count_readahead(loaded as u64);
    }
}
