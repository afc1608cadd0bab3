//! The carried cache: the clean blocks one process's mount leaves in shared
//! memory for the next process that mounts the same device.
//!
//! A mounted file system lives in the process that mounted it, and so does
//! its page cache: every process starts cold. A shell that extracts a tree
//! with `tar x` and then archives it with `tar c` reads every block back
//! from the device in the second process, where the kernel's page cache
//! hands ext4 the same blocks from memory (seen in `scripts/real-apps`: tar c
//! 0.43x and cp -r 0.49x of ext4's time, while iopath's cold read of the
//! tree was faster than ext4's cold one). The carried cache closes that gap.
//!
//! - **What it holds**: copies of device blocks, by block number, each equal
//!   to what the device holds (a file's last block is zero past the file's
//!   end, as the page cache has it): the clean pages of live files, and the
//!   inode table and overflow extent blocks, which a mount then takes from
//!   here instead of the device (the table's blocks lent, not copied). It lives in a file in `/dev/shm` named
//!   after the device's identity, next to its mount lock; only the lock's
//!   holder opens it, so one process uses it at a time.
//! - **Why it can be trusted**: the file's header and the superblock carry
//!   the same random *stamp* only while the device holds exactly what the
//!   file vouches for. A mount reads the stamps and takes the file's blocks
//!   if they match; the file then stays stamped, sealed, until the mount's
//!   first device write, which unstamps it before it goes out (a process
//!   that writes nothing leaves both as they were, still true; a mount that
//!   replayed anything, even only a killed holder's shared-memory log, does
//!   not trust it). One that
//!   does not match is unstamped at once, and so is the superblock before
//!   anything else is written: a process that dies after writing, a mount
//!   without the file, an older image copied over the device, a new
//!   `mkfs`, all leave stamps that do not match. While mounted, every device
//!   write drops the blocks it covers from the index first. A clean unmount
//!   adds its clean pages, writes the index and the header's new stamp, then
//!   the superblock's, last; a write after that (a thread still running at
//!   exit) zeroes the header's stamp before it goes out.
//! - **Lent, not copied**: a page-cache miss on a block it holds takes the
//!   block's frame of a private mapping of the file as the page's frame: no
//!   copy and no fresh memory (fresh memory is zeroed first, and zeroing the
//!   copies' frames was 37% of `tar c`'s samples); the kernel copies a frame
//!   only when the page is written. Each frame is lent once per process (the
//!   borrower may have written it since); a block asked for again is copied.
//!   The private mapping is made once per process and never unmapped: lent
//!   frames may outlive the mount in the pool of blocks ([`crate::IoBuf`]).
//!   Nor is the file ever cut short (truncating a file drops even the
//!   private copies of its pages): a file of another size is replaced.
//! - **What it costs**: a hit is a lookup under a lock where a miss was a
//!   device read; a device write takes one more lock while the
//!   index is not empty; an unmount writes the new clean pages into the file
//!   (tmpfs, about 2 GB/s into memory the file holds; fresh memory can cost
//!   five times that here, so it is taken last: `Picker`) and two small
//!   writes. Memory: at most the bound given (`IOPATH_CARRY`), in /dev/shm
//!   until the file is removed; blocks this mount did not use make room
//!   before the file grows.

use super::format::{BLOCK, BLOCK_U64};
use crate::error::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};

const MAGIC: &[u8; 8] = b"IOPCARRY";
/// The file's own layout version (2: the index is sorted by block; 3: the
/// header says how many frames have memory).
const LAYOUT: u32 = 3;
/// The header: magic, layout, frames, volume id, stamp, entries, then the backing path.
const HEADER: usize = BLOCK;
const AT_FRAMES: usize = 16;
const AT_VOLUME: usize = 24;
const AT_STAMP: usize = 32;
const AT_COUNT: usize = 40;
/// Where the backing device's path (its length, then its bytes) lies in a
/// header; the shared-memory log's header keeps it there too ([`sweep`]).
pub(super) const AT_PATH_LEN: usize = 48;
pub(super) const AT_PATH: usize = 56;
/// Where the header keeps how many frames, from the first, have memory
/// ([`Picker`]), after the path (cut short to make room).
const AT_HIGH: usize = HEADER - 8;
/// Bytes of one index entry: the device block and the frame holding it.
const ENTRY: usize = 16;
/// Pages one `pwritev` carries at most.
const WRITE_RUN: usize = 256;

/// A carried cache file, open and mapped, for one device.
pub struct CarriedCache {
    file: std::fs::File,
    path: PathBuf,
    /// The file, mapped shared and read-only: the index is searched and
    /// blocks are copied from here. Writes go through the file, which fails
    /// with ENOSPC where a store into a full /dev/shm would SIGBUS.
    map: memmap2::Mmap,
    /// The file again, mapped private and writable, never unmapped: its
    /// frames are lent out as page frames ([`CarriedCache::lend`]), read in
    /// place and copied by the kernel only when written. One per file (and
    /// size) per process, whatever the mounts: see [`Lender`].
    lender: &'static Lender,
    frames: usize,
    state: Mutex<State>,
    /// Blocks it vouches for now (lets writes skip the lock while it is empty).
    entries: AtomicUsize,
    /// Saved and stamped: the next device write must unstamp the file first.
    sealed: AtomicBool,
    /// Blocks read from here instead of the device.
    hits: AtomicU64,
    /// Of those, blocks lent in place ([`CarriedCache::lend`]).
    lent: AtomicU64,
    /// Blocks staged ahead of the save (lets writes skip the lock while none are).
    staged: AtomicUsize,
    /// A save is being prepared ([`CarriedCache::watch_writes`]): every
    /// write is noted, whatever the cache holds.
    watching: AtomicBool,
}

/// A carried cache file's private mapping and which of its frames were
/// lent, for the life of the process. A lent frame may outlive its mount
/// (in the pool of blocks), so the mapping is never unmapped; and it may
/// have been written (the kernel's private copy then differs from the
/// file), so it is never lent again, by this mount or a later one in the
/// same process: a later mount of the device (a shell's next command in
/// the same process, after it gave the mount back) finds this mapping and
/// these bits again instead of mapping the file anew. One mapping per file
/// and size, however often the process mounts: address space, not memory
/// (a new mapping per mount would run into the limit on mappings).
struct Lender {
    /// The file's device and inode numbers and the mapping's length.
    key: (u64, u64, usize),
    base: std::ptr::NonNull<u8>,
    /// One bit per frame: lent once already.
    lent: Mutex<Vec<u64>>,
}

// SAFETY: `base` is only used to lend out blocks, each once, under `lent`'s lock.
unsafe impl Send for Lender {}
// SAFETY: as above.
unsafe impl Sync for Lender {}

/// Every private mapping this process made of a carried cache.
/// Each is leaked: a mapping is never unmapped, so its lender lives as
/// long as the process.
static LENDERS: Mutex<Vec<&'static Lender>> = Mutex::new(Vec::new());

/// The lenders' list and every lender's bits, held across a fork.
struct HeldForFork {
    /// Each lender's bits (dropped first: fields drop in order).
    _lent: Vec<std::sync::MutexGuard<'static, Vec<u64>>>,
    _lenders: std::sync::MutexGuard<'static, Vec<&'static Lender>>,
}

/// The lenders' lock and each lender's bits, held across a fork
/// ([`crate::sys::hold_globals_for_fork`]): a child's mount lends from the
/// same mapping, and one forked while a thread of its parent lent a frame or
/// took one back waited for those bits for ever as it mounted (holding the
/// mount its parent's threads then waited for). A thread holding a
/// lender's bits never waits for the list, so taking them in this order
/// waits for nothing but short holds.
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    let lenders = LENDERS.lock().unwrap_or_else(|e| e.into_inner());
    let lent = lenders.iter().map(|l| l.lent.lock().unwrap_or_else(|e| e.into_inner())).collect();
    Box::new(HeldForFork { _lent: lent, _lenders: lenders })
}

impl Lender {
    /// The private mapping of `file` (`len` bytes, `frames` frames), made once per process.
    fn of(file: &std::fs::File, len: usize, frames: usize, path: &Path) -> Result<&'static Lender> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata().map_err(os(format!("cannot look at the carried cache {}", path.display())))?;
        let key = (meta.dev(), meta.ino(), len);
        let mut lenders = LENDERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = lenders.iter().find(|l| l.key == key) {
            return Ok(*l);
        }
        // SAFETY: a private mapping of a file we hold open; no fixed address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(
                os(format!("cannot map the carried cache {}", path.display()))(std::io::Error::last_os_error()),
            );
        }
        let base = std::ptr::NonNull::new(base.cast::<u8>()).expect("a mapping is not at 0");
        let lender: &'static Lender =
            Box::leak(Box::new(Lender { key, base, lent: Mutex::new(vec![0; frames.div_ceil(64)]) }));
        lenders.push(lender);
        Ok(lender)
    }
}

/// What this mount knows beyond the file's index. Attaching reads nothing
/// but the header: the index (entries sorted by block) is searched in place,
/// so a mount pays nothing for the blocks it does not touch (building a hash
/// map of 230,000 entries took 10-20 ms of every process's mount).
struct State {
    /// Entries of the file's index this mount trusts (those it attached or saved).
    count: usize,
    /// Blocks written on the device since: no longer what the index says.
    removed: std::collections::HashSet<u64, std::hash::BuildHasherDefault<crate::hash::IntHasher>>,
    /// Frames this mount read or saved, one bit each (kept before the others when room runs out).
    used: Vec<u64>,
    /// Blocks copied ahead of the save ([`CarriedCache::stage`]), each in a
    /// frame no entry of the index uses: what the device holds, until a
    /// write covers the block again.
    staged: Staged,
    /// Which frame a new block goes to, from the first stage of a save to
    /// the save ([`Picker`]).
    picker: Option<Picker>,
    /// Frames `0..high` have memory; those past it were never written. Holes
    /// are filled from the lowest up, never punched: the frames with memory
    /// stay one run from the first.
    high: usize,
    /// Runs of blocks written (first, count) since [`CarriedCache::watch_writes`],
    /// until the save it prepares.
    written: Option<Vec<(u64, u64)>>,
}

/// Staged blocks: device block -> frame.
type Staged = std::collections::HashMap<u64, usize, std::hash::BuildHasherDefault<crate::hash::IntHasher>>;

/// Where new blocks go, fresh memory last. A frame the file never held is a
/// hole: writing it allocates and zeroes a page and, in a virtual machine
/// that gave that memory back to its host (virtio-balloon free page
/// reporting, on here), faults it in on the host as well: 2.7-12 us per
/// 4 KiB page here (first touch of a new 512 MiB tmpfs file, a minute after
/// a run), the price of reading the block back from the device. A process
/// that wrote 126 MiB (`tar x` of /usr/include) spent 400-520 ms of its
/// exit copying into holes, against 80-120 ms into frames the file held.
/// So a new block takes, in this order: a free frame whose memory is there
/// (a block written or deleted since, or one a save left unused), the frame
/// of a block this mount did not use (it is set aside: the carried cache
/// keeps what the last process used over what older ones did), and only
/// then a hole, the lowest. The carried cache still grows to its bound when
/// a process uses more than it holds.
struct Picker {
    /// Frames the index (less what was set aside) or a staged block uses.
    busy: Vec<u64>,
    /// Where the search for a free frame with memory (below `State::high`) goes on.
    free: usize,
    /// Index entries whose frames may be taken, last one first (made when
    /// the free frames run out).
    victims: Option<Vec<usize>>,
}

impl Picker {
    /// Frame `f` is free again (its staged block was written since).
    fn release(&mut self, f: usize) {
        clear_bit(&mut self.busy, f);
        self.free = self.free.min(f);
    }
}

/// Bit `i` of a bitmap kept in `u64` words.
pub(super) fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

/// Sets bit `i` of a bitmap kept in `u64` words.
pub(super) fn set_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

fn clear_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] &= !(1 << (i % 64));
}

/// Removes the carried cache and the shared-memory log of the file or block
/// device at `device`, if it has them: for whoever detaches a loop device,
/// whose files are named after a device number that outlives it (no sweep
/// would take them).
pub fn remove_for(device: &Path) {
    if let Ok(lock) = super::lock::lock_path(device) {
        let _ = std::fs::remove_file(path_beside(&lock));
        let _ = std::fs::remove_file(super::shm_log::path_beside(&lock));
    }
}

/// Where the carried cache of the device at `lock` (a mount lock file) lives.
pub fn path_beside(lock: &Path) -> PathBuf {
    let name = lock.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let id = name.trim_start_matches("iopath-mount-").trim_end_matches(".lock");
    lock.with_file_name(format!("iopath-carry-{id}"))
}

fn os(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os { context, source }
}

impl CarriedCache {
    /// Opens (creating if needed) the carried cache at `path` for the device
    /// at `backing` (named in the header, so a sweep can tell when the device
    /// is gone), holding up to `bytes`. The caller holds the device's mount
    /// lock. Nothing in it is trusted until [`CarriedCache::attach`].
    pub fn open(path: &Path, backing: &Path, bytes: u64) -> Result<CarriedCache> {
        let frames = (bytes / BLOCK_U64).clamp(1, u32::MAX as u64 - 1) as usize;
        let len = (HEADER + Self::index_bytes_for(frames) + frames * BLOCK) as u64;
        let opened = |create: bool| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(create)
                .open(path)
                .map_err(os(format!("cannot open the carried cache {}", path.display())))
        };
        let mut header = vec![0u8; HEADER];
        let same_shape = |file: &std::fs::File, header: &mut [u8]| {
            let have = file.metadata().map(|m| m.len()).unwrap_or(0);
            have == len
                && file.read_exact_at(header, 0).is_ok()
                && &header[..8] == MAGIC
                && u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) == LAYOUT
                && get(header, AT_FRAMES) == frames as u64
        };
        let file = match opened(false) {
            Ok(file) if same_shape(&file, &mut header) => file,
            existing => {
                // Another size or layout (or none): a new file, never this one cut
                // short. A process may have this one's frames lent (mapped private),
                // and truncating a file drops even the private copies of its pages.
                if existing.is_ok() {
                    std::fs::remove_file(path)
                        .map_err(os(format!("cannot replace the carried cache {}", path.display())))?;
                }
                let file = opened(true)?;
                let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
                file.set_len(len).map_err(os(format!("cannot size the carried cache {}", path.display())))?;
                header.fill(0);
                header[..8].copy_from_slice(MAGIC);
                header[8..12].copy_from_slice(&LAYOUT.to_le_bytes());
                put(&mut header, AT_FRAMES, frames as u64);
                file
            }
        };
        let backing = backing.as_os_str().as_encoded_bytes();
        let n = backing.len().min(AT_HIGH - AT_PATH);
        put(&mut header, AT_PATH_LEN, n as u64);
        header[AT_PATH..AT_PATH + n].copy_from_slice(&backing[..n]);
        header[AT_PATH + n..AT_HIGH].fill(0);
        let high = (get(&header, AT_HIGH) as usize).min(frames);
        file.write_all_at(&header, 0).map_err(os(format!("cannot write the carried cache {}", path.display())))?;
        // SAFETY: the file is sized above and only the mount lock's holder (this
        // process) changes it; no one cuts it short (a new file replaces it).
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(&file) }
            .map_err(os(format!("cannot map the carried cache {}", path.display())))?;
        let lender = Lender::of(&file, len as usize, frames, path)?;
        let words = frames.div_ceil(64);
        Ok(CarriedCache {
            file,
            path: path.to_path_buf(),
            map,
            lender,
            frames,
            state: Mutex::new(State {
                count: 0,
                removed: Default::default(),
                used: vec![0; words],
                staged: Default::default(),
                picker: None,
                high,
                written: None,
            }),
            entries: AtomicUsize::new(0),
            sealed: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            lent: AtomicU64::new(0),
            staged: AtomicUsize::new(0),
            watching: AtomicBool::new(false),
        })
    }

    fn index_bytes_for(frames: usize) -> usize {
        (frames * ENTRY).next_multiple_of(BLOCK)
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the file's blocks if its stamp and volume are the device's
    /// (`stamp` 0 matches nothing). A file that matches keeps its stamp,
    /// sealed: the first device write unstamps it ([`Self::forget`]), so a
    /// process that writes nothing leaves the device and the file vouching
    /// for each other as they were, and the next mount trusts them. One that
    /// does not match is unstamped now. Reads the header only. Returns the
    /// blocks it holds for the device as it is (0 if it held another state).
    pub fn attach(&self, volume_id: u64, stamp: u64) -> Result<u64> {
        let matches = self.stamped_for(volume_id, stamp);
        let count = if matches { get(&self.map[..HEADER], AT_COUNT) as usize } else { 0 };
        let mut state = self.lock();
        state.count = count;
        state.removed.clear();
        self.entries.store(count, Relaxed);
        drop(state);
        if matches {
            self.sealed.store(true, Relaxed);
            return Ok(count as u64);
        }
        self.file
            .write_all_at(&volume_id.to_le_bytes(), AT_VOLUME as u64)
            .and_then(|()| self.file.write_all_at(&[0; 8], AT_STAMP as u64))
            .map_err(os(format!("cannot write the carried cache {}", self.path.display())))?;
        Ok(count as u64)
    }

    /// The stamp its header holds now (0: it vouches for nothing).
    pub fn stamp_held(&self) -> u64 {
        get(&self.map[..HEADER], AT_STAMP)
    }

    /// Whether this file was saved for the device of `volume_id` with the
    /// stamp its superblock holds, `stamp`, and not written since: its
    /// process quiesced the device ([`super::FileSystem::carry_over`]) and
    /// wrote nothing more to it (any write unstamps the file first).
    pub fn stamped_for(&self, volume_id: u64, stamp: u64) -> bool {
        let header = &self.map[..HEADER];
        let count = get(header, AT_COUNT) as usize;
        stamp != 0 && get(header, AT_STAMP) == stamp && get(header, AT_VOLUME) == volume_id && count <= self.frames
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entry `i` of the file's index: (device block, frame).
    fn entry(&self, i: usize) -> (u64, usize) {
        let at = HEADER + i * ENTRY;
        (get(&self.map, at), get(&self.map, at + 8) as usize)
    }

    /// The frame holding `block`, if this mount may trust it.
    fn find(&self, state: &State, block: u64) -> Option<usize> {
        let (mut lo, mut hi) = (0, state.count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (b, f) = self.entry(mid);
            match b.cmp(&block) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return self.trusted(state, block, f),
            }
        }
        None
    }

    /// Frame `f`, which the index gives for `block`, if this mount may trust
    /// it: not written since, and inside the file (a frame number past the
    /// end is a damaged file).
    fn trusted(&self, state: &State, block: u64, f: usize) -> Option<usize> {
        (f < self.frames && !state.removed.contains(&block)).then_some(f)
    }

    /// [`Self::find`] for blocks asked for in ascending order: `at` is where
    /// the walk of the index stands (0 for the first), moved on to `block`.
    fn find_next(&self, state: &State, at: &mut usize, block: u64) -> Option<usize> {
        while *at < state.count && self.entry(*at).0 < block {
            *at += 1;
        }
        let (b, f) = (*at < state.count).then(|| self.entry(*at))?;
        if b == block { self.trusted(state, block, f) } else { None }
    }

    fn frame_offset(&self, f: usize) -> usize {
        HEADER + Self::index_bytes_for(self.frames) + f * BLOCK
    }

    fn frame(&self, f: usize) -> &[u8] {
        let at = self.frame_offset(f);
        &self.map[at..at + BLOCK]
    }

    /// Copies blocks `[block, block + n)` into `dst` (n whole blocks) if it
    /// holds every one of them; false (and `dst` untouched) otherwise.
    pub fn read(&self, block: u64, dst: &mut [u8]) -> bool {
        debug_assert_eq!(dst.len() % BLOCK, 0);
        if self.entries.load(Relaxed) == 0 {
            return false;
        }
        let mut state = self.lock();
        let n = (dst.len() / BLOCK) as u64;
        // Looked up twice rather than remembered: no allocation per read.
        if (0..n).any(|i| self.find(&state, block + i).is_none()) {
            return false;
        }
        for (i, out) in dst.chunks_exact_mut(BLOCK).enumerate() {
            let f = self.find(&state, block + i as u64).expect("all there, under the lock");
            out.copy_from_slice(self.frame(f));
            set_bit(&mut state.used, f);
        }
        self.hits.fetch_add((dst.len() / BLOCK) as u64, Relaxed);
        true
    }

    /// Block `block` as a page frame of its own, without a copy: the frame's
    /// block of the private mapping, lent once per frame (`None` if it does
    /// not hold the block, or lent it already: then [`Self::read`] copies).
    pub fn lend(&self, block: u64) -> Option<crate::IoBuf> {
        if self.entries.load(Relaxed) == 0 {
            return None;
        }
        let mut state = self.lock();
        let f = self.find(&state, block)?;
        let mut lent = self.lender.lent.lock().unwrap_or_else(|e| e.into_inner());
        if bit(&lent, f) {
            return None;
        }
        set_bit(&mut lent, f);
        set_bit(&mut state.used, f);
        self.hits.fetch_add(1, Relaxed);
        self.lent.fetch_add(1, Relaxed);
        // SAFETY: the frame lies inside the private mapping, which is never unmapped,
        // aligned to 4096; it is lent once only in this process, so nothing else here
        // uses that memory.
        Some(unsafe { crate::IoBuf::from_mapped_block(self.lender.base.add(self.frame_offset(f))) })
    }

    /// Takes back a block [`Self::lend`] lent, so that it may be lent again:
    /// by a later mount in this process or in a child forked after this one
    /// (a shell mounts again after each command it runs, and its children
    /// mount too). Its frame of the private mapping was never written, so it
    /// still shows the file: whatever the index says that frame holds when it
    /// is lent again is what the lender reads. Returns `buf` if it is not a
    /// frame this process's mapping of the file lent.
    ///
    /// # Safety
    /// Nothing may have written `buf`'s bytes since it was lent (the kernel
    /// would have copied the page: the copy, not the file, would be lent
    /// again), and nothing may use it after this.
    pub unsafe fn take_back(&self, buf: crate::IoBuf) -> Option<crate::IoBuf> {
        let base = self.lender.base.as_ptr() as usize + self.frame_offset(0);
        let Some(offset) = (buf.as_ptr() as usize).checked_sub(base) else { return Some(buf) };
        let f = offset / BLOCK;
        if !offset.is_multiple_of(BLOCK) || f >= self.frames || buf.len() != BLOCK {
            return Some(buf);
        }
        let mut lent = self.lender.lent.lock().unwrap_or_else(|e| e.into_inner());
        if !bit(&lent, f) {
            return Some(buf); // (never: a frame not lent is not in anyone's hands)
        }
        clear_bit(&mut lent, f);
        // The mapping is never unmapped: the frame is the lender's again, not the pool's.
        std::mem::forget(buf);
        None
    }

    /// Blocks lent in place so far ([`Self::lend`]; each is also a hit).
    pub fn lent(&self) -> u64 {
        self.lent.load(Relaxed)
    }

    /// Blocks `[block, block + n)` are about to be written on the device:
    /// whatever it holds of them is no longer the device's.
    pub fn forget(&self, block: u64, n: u64) {
        if self.sealed.load(Relaxed) {
            self.unseal();
        }
        if self.entries.load(Relaxed) == 0 && self.staged.load(Relaxed) == 0 && !self.watching.load(SeqCst) {
            return;
        }
        let mut state = self.lock();
        if let Some(written) = state.written.as_mut() {
            written.push((block, n));
        }
        for b in block..block + n {
            if self.find(&state, b).is_some() {
                state.removed.insert(b);
                self.entries.fetch_sub(1, Relaxed);
            }
            if let Some(f) = state.staged.remove(&b) {
                self.staged.fetch_sub(1, Relaxed);
                if let Some(picker) = state.picker.as_mut() {
                    picker.release(f);
                }
            }
        }
    }

    /// Copies `bytes` (whole blocks from `block` on: what a write in flight
    /// puts on the device) into frames no entry of the index uses, ahead of
    /// the [`Self::save`] that will take them without a copy: a process's
    /// exit copies its new pages here while its writeback is in flight,
    /// instead of after it (`tar c` of /usr/include: a 32 ms copy after a
    /// 55 ms writeback). Call after the write was sent (which forgot the
    /// blocks); a later write of a block forgets it again. Stops where no
    /// frame is free or /dev/shm is full: the save copies the rest.
    pub fn stage(&self, block: u64, bytes: &[u8]) {
        debug_assert_eq!(bytes.len() % BLOCK, 0);
        let mut state = self.lock();
        let state = &mut *state;
        let mut picker = state.picker.take().unwrap_or_else(|| self.picker(state));
        let mut run: Vec<(usize, u64, &[u8])> = Vec::new();
        for (i, page) in bytes.chunks_exact(BLOCK).enumerate() {
            let b = block + i as u64;
            let frame = match state.staged.get(&b) {
                Some(&f) => f,
                None => match self.pick(state, &mut picker) {
                    Some(f) => f,
                    None => break,
                },
            };
            if run.last().is_some_and(|&(f, _, _)| f + 1 != frame || run.len() == WRITE_RUN) {
                if !self.stage_run(&mut state.staged, &mut picker, &run) {
                    run.clear();
                    break;
                }
                run.clear();
            }
            set_bit(&mut picker.busy, frame);
            run.push((frame, b, page));
        }
        self.stage_run(&mut state.staged, &mut picker, &run);
        state.picker = Some(picker);
    }

    /// A new [`Picker`]: what the index (less what was written or set aside
    /// since) and the staged blocks use, and which frames have memory.
    fn picker(&self, state: &State) -> Picker {
        let words = self.frames.div_ceil(64);
        let mut busy = vec![0u64; words];
        for i in 0..state.count {
            let (b, f) = self.entry(i);
            if f < self.frames && !state.removed.contains(&b) {
                set_bit(&mut busy, f);
            }
        }
        for &f in state.staged.values() {
            set_bit(&mut busy, f);
        }
        Picker { busy, free: 0, victims: None }
    }

    /// The frame for a new block ([`Picker`]'s order), marked busy; `None`
    /// when every frame holds a block this mount used.
    fn pick(&self, state: &mut State, picker: &mut Picker) -> Option<usize> {
        let high = state.high;
        while picker.free < high && bit(&picker.busy, picker.free) {
            picker.free += 1;
        }
        if picker.free < high {
            set_bit(&mut picker.busy, picker.free);
            return Some(picker.free);
        }
        let lent = self.lender.lent.lock().unwrap_or_else(|e| e.into_inner());
        // Entry `i` holds a block this mount neither used nor wrote, in a frame not lent.
        let evictable = |state: &State, i: usize| {
            let (b, f) = self.entry(i);
            f < self.frames && !bit(&state.used, f) && !bit(&lent, f) && !state.removed.contains(&b)
        };
        let victims =
            picker.victims.get_or_insert_with(|| (0..state.count).filter(|&i| evictable(state, i)).rev().collect());
        while let Some(i) = victims.pop() {
            // Checked again: used, lent or written since the list was made.
            if evictable(state, i) {
                let (b, f) = self.entry(i);
                state.removed.insert(b);
                self.entries.fetch_sub(1, Relaxed);
                return Some(f);
            }
        }
        drop(lent);
        // A hole, the lowest: every frame below `high` is busy (a frame past it
        // that an index holds is one a file of an earlier state left: passed over).
        let mut hole = high;
        while hole < self.frames && bit(&picker.busy, hole) {
            hole += 1;
        }
        (hole < self.frames).then(|| {
            set_bit(&mut picker.busy, hole);
            state.high = hole + 1;
            hole
        })
    }

    /// Writes a run of [`Self::stage`] and records it; false if it could not.
    fn stage_run(&self, staged: &mut Staged, picker: &mut Picker, run: &[(usize, u64, &[u8])]) -> bool {
        if self.write_frames(run).is_err() {
            // Those frames now hold who knows what: staged no more, free again.
            for &(f, b, _) in run {
                if staged.get(&b) == Some(&f) {
                    staged.remove(&b);
                    self.staged.fetch_sub(1, Relaxed);
                }
                picker.release(f);
            }
            return false;
        }
        for &(f, b, _) in run {
            if staged.insert(b, f).is_none() {
                self.staged.fetch_add(1, Relaxed);
            }
        }
        true
    }

    /// Sets aside the blocks `live` says no file holds any more (their files
    /// were deleted or cut short since they were carried): their frames are
    /// the first the next [`Self::save`] fills, frames whose memory is there
    /// already, where a frame never used is fresh memory to fault in and zero.
    pub fn forget_dead(&self, live: impl Fn(u64) -> bool) {
        if self.entries.load(Relaxed) == 0 {
            return;
        }
        let mut state = self.lock();
        for i in 0..state.count {
            let (block, f) = self.entry(i);
            if f < self.frames && !live(block) && state.removed.insert(block) {
                self.entries.fetch_sub(1, Relaxed);
            }
        }
    }

    /// A write after [`Self::save`]: the file no longer vouches for the device.
    fn unseal(&self) {
        if self.sealed.swap(false, Relaxed) {
            // If this fails the stamp stays: the mount then cannot be trusted to
            // have left the device as saved, so the file goes instead (removed, not
            // cut short: see `open`).
            if self.file.write_all_at(&[0; 8], AT_STAMP as u64).is_err() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }

    /// Whether it vouches for `block` now.
    pub fn holds(&self, block: u64) -> bool {
        self.entries.load(Relaxed) > 0 && self.find(&self.lock(), block).is_some()
    }

    /// Whether it vouches for any block now.
    pub fn holds_any(&self) -> bool {
        self.entries.load(Relaxed) > 0
    }

    /// Blocks read from it so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    /// Notes every block written from now until the next [`Self::save`],
    /// which leaves those out: a caller about to gather pages for a save
    /// calls it before it looks at which block each page is.
    pub fn watch_writes(&self) {
        let mut state = self.lock();
        state.written = Some(Vec::new());
        self.watching.store(true, SeqCst);
    }

    /// Which of `blocks` (sorted, each once) a [`Self::save`] would need the
    /// bytes of: those it neither holds nor has staged. One walk of the index
    /// beside them: a caller then reads only those pages (the exit of `tar cf`
    /// spent 10 ms touching 61,731 cached pages, nearly all of them held).
    pub fn wanted(&self, blocks: &[u64]) -> Vec<bool> {
        debug_assert!(blocks.windows(2).all(|w| w[0] < w[1]));
        let state = self.lock();
        let mut at = 0;
        blocks
            .iter()
            .map(|&block| self.find_next(&state, &mut at, block).is_none() && !state.staged.contains_key(&block))
            .collect()
    }

    /// Adds `pages` (device block, bytes equal to the device's) that it does
    /// not hold yet (in frames `Picker` chooses: blocks this mount did not
    /// use make room before the file takes fresh memory), writes
    /// its index and stamps the header with `stamp` (not 0). The caller then
    /// writes the same stamp into the superblock, as its last device write,
    /// and any later write unstamps the file. A file still sealed with
    /// nothing to add keeps the stamp it has and writes nothing (then
    /// [`Self::stamp_held`] is not `stamp`, and the superblock's stands). A page whose bytes are `None`
    /// (one [`Self::wanted`] did not ask for) counts as used if held or staged
    /// and is left out otherwise. Returns the blocks it holds now.
    pub fn save<'a>(
        &self,
        volume_id: u64,
        stamp: u64,
        pages: impl Iterator<Item = (u64, Option<&'a [u8]>)>,
    ) -> Result<u64> {
        debug_assert_ne!(stamp, 0);
        let fail = |what: &str| os(format!("cannot {what} the carried cache {}", self.path.display()));
        let mut state = self.lock();
        let state = &mut *state;
        let picker = state.picker.take();
        let staged = std::mem::take(&mut state.staged);
        self.staged.store(0, Relaxed);
        let mut pages: Vec<(u64, Option<&'a [u8]>)> = pages.collect();
        pages.sort_unstable_by_key(|&(b, _)| b);
        pages.dedup_by_key(|(b, _)| *b);
        // A block written since the caller looked at what it now hands over may
        // hold something else on the device (a page of a file truncated meanwhile,
        // its block taken and written by another): left out.
        self.watching.store(false, SeqCst);
        // (Under the concurrent-writers test about one run in a hundred handed over
        // such a page, and the next mount read it where the device held other bytes.)
        if let Some(written) = state.written.take().filter(|w| !w.is_empty()) {
            let written: crate::hash::IntSet<u64> = written.iter().flat_map(|&(first, n)| first..first + n).collect();
            pages.retain(|&(block, bytes)| bytes.is_none() || !written.contains(&block));
        }
        // Those it holds already are marked used, not copied again: a walk of
        // the sorted index beside the sorted pages (a search of the index per
        // page took 13-14 ms of a 64,000-page save).
        let mut at = 0;
        pages.retain(|&(block, _)| match self.find_next(state, &mut at, block) {
            Some(f) => {
                set_bit(&mut state.used, f);
                false
            }
            None => true,
        });
        if pages.is_empty() && state.removed.is_empty() {
            if self.sealed.load(Relaxed) {
                // Still stamped, and nothing changed since (a process that only read
                // what it held): the stamp the superblock holds stands; nothing written.
                return Ok(state.count as u64);
            }
            return self.stamp(volume_id, stamp, state.count);
        }
        // Unstamped before its frames or index change: a save cut short must not
        // leave a header that vouches for them.
        self.unseal();
        // Frames for the new ones, fresh memory last ([`Picker`]); staged blocks
        // are in theirs already. A block whose frame a new one takes is set aside
        // (into `removed`) before the index is rebuilt below.
        let mut picker = picker.unwrap_or_else(|| {
            let mut picker = self.picker(state);
            for &f in staged.values() {
                set_bit(&mut picker.busy, f);
            }
            picker
        });
        let mut from_stage = Vec::new();
        let mut new: Vec<(usize, u64, &'a [u8])> = Vec::new();
        for (block, bytes) in pages {
            debug_assert!(bytes.is_none_or(|b| b.len() == BLOCK));
            if let Some(&f) = staged.get(&block) {
                // A clean page of a block staged and not written since: the same bytes.
                set_bit(&mut state.used, f);
                from_stage.push((block, f));
                continue;
            }
            let Some(bytes) = bytes else { continue };
            let Some(frame) = self.pick(state, &mut picker) else { break };
            set_bit(&mut state.used, frame);
            new.push((frame, block, bytes));
        }
        // What stays: the index less what was written or set aside since. The index
        // is sorted by block: one walk beside the sorted removed blocks (a hash lookup
        // per entry took 4.4 ms of a save beside an index of 164,000 entries).
        let mut removed: Vec<u64> = state.removed.iter().copied().collect();
        removed.sort_unstable();
        let mut gone = removed.iter().peekable();
        let mut kept: Vec<(u64, usize)> = Vec::with_capacity(state.count + new.len());
        for i in 0..state.count {
            let (b, f) = self.entry(i);
            while gone.next_if(|&&r| r < b).is_some() {}
            if f < self.frames && gone.peek() != Some(&&b) {
                kept.push((b, f));
            }
        }
        // The frames, in runs of consecutive ones; a run that does not fit (a full
        // /dev/shm) is left out, and so is everything after it.
        new.sort_unstable_by_key(|&(f, _, _)| f);
        let mut written = 0;
        let mut i = 0;
        while i < new.len() {
            let mut end = i + 1;
            while end < new.len() && end - i < WRITE_RUN && new[end].0 == new[end - 1].0 + 1 {
                end += 1;
            }
            match self.write_frames(&new[i..end]) {
                Ok(()) => written = end,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(fail("write")(e)),
            }
            i = end;
        }
        // The new entries, sorted, merged into the kept ones (sorted already).
        let mut added: Vec<(u64, usize)> = new[..written].iter().map(|&(f, b, _)| (b, f)).chain(from_stage).collect();
        added.sort_unstable_by_key(|&(b, _)| b);
        let count = kept.len() + added.len();
        let mut index = Vec::with_capacity(Self::index_bytes_for(count.max(1)));
        let (mut k, mut a) = (kept.iter().peekable(), added.iter().peekable());
        let mut last = None;
        while let Some(&(b, f)) = match (k.peek(), a.peek()) {
            (Some(x), Some(y)) if x.0 < y.0 => k.next(),
            (Some(_), Some(_)) | (None, Some(_)) => a.next(),
            (Some(_), None) => k.next(),
            (None, None) => None,
        } {
            debug_assert!(last < Some(b), "each block once, in order");
            last = Some(b);
            index.extend_from_slice(&b.to_le_bytes());
            index.extend_from_slice(&(f as u64).to_le_bytes());
        }
        index.resize(Self::index_bytes_for(count.max(1)).min(Self::index_bytes_for(self.frames)), 0);
        // How far memory reaches, before an index that may name frames up to there.
        self.file.write_all_at(&(state.high as u64).to_le_bytes(), AT_HIGH as u64).map_err(fail("write"))?;
        self.file.write_all_at(&index, HEADER as u64).map_err(fail("write"))?;
        state.count = count;
        state.removed.clear();
        self.entries.store(count, Relaxed);
        self.stamp(volume_id, stamp, count)
    }

    /// Writes the header's volume, stamp and entry count: the file vouches for the device again.
    fn stamp(&self, volume_id: u64, stamp: u64, count: usize) -> Result<u64> {
        let mut h = [0u8; 24];
        put(&mut h, 0, volume_id);
        put(&mut h, 8, stamp);
        put(&mut h, 16, count as u64);
        self.file
            .write_all_at(&h, AT_VOLUME as u64)
            .map_err(os(format!("cannot stamp the carried cache {}", self.path.display())))?;
        self.sealed.store(true, Relaxed);
        Ok(count as u64)
    }

    /// Writes a run of consecutive frames: (frame, block, bytes).
    fn write_frames(&self, run: &[(usize, u64, &[u8])]) -> std::io::Result<()> {
        let Some(&(first, _, _)) = run.first() else { return Ok(()) };
        let mut at = self.frame_offset(first) as i64;
        let mut iov: Vec<libc::iovec> = run
            .iter()
            .map(|(_, _, b)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: BLOCK })
            .collect();
        let mut rest = &mut iov[..];
        while !rest.is_empty() {
            // SAFETY: every iovec points at a live BLOCK-byte slice borrowed for 'a.
            let n = unsafe { libc::pwritev(self.file.as_raw_fd(), rest.as_ptr(), rest.len() as i32, at) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            // Whole pages written drop out; a torn one is written again whole (same bytes).
            let whole = n as usize / BLOCK;
            rest = &mut rest[whole..];
            at += (whole * BLOCK) as i64;
        }
        Ok(())
    }
}

/// Removes carried caches and shared-memory logs ([`super::shm_log`]) in
/// `dir` whose device is gone (the path in their header names nothing, or a
/// file with another identity than their name says) and that no process
/// holds (their mount lock is free), and with them the files that stood
/// for that device's flocks and FIFOs.
pub fn sweep(dir: &Path) {
    let Ok(names) = crate::sys::dir_names(dir) else { return };
    for name in names {
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix("iopath-carry-").or(n.strip_prefix("iopath-shmlog-")))
        else {
            continue;
        };
        let path = dir.join(&name);
        let Ok(file) = std::fs::File::open(&path) else { continue };
        let mut header = vec![0u8; HEADER];
        let backing = if file.read_exact_at(&mut header, 0).is_ok() && &header[..8] == MAGIC {
            let n = (get(&header, AT_PATH_LEN) as usize).min(HEADER - AT_PATH);
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(&header[AT_PATH..AT_PATH + n])))
        } else {
            super::shm_log::backing_named(&header)
        };
        let alive = backing.and_then(|p| std::fs::metadata(p).ok()).is_some_and(|m| super::lock::device_id(&m) == id);
        if !alive {
            let lock = dir.join(format!("iopath-mount-{id}.lock"));
            // Held means in use (the holder's device is there after all): leave it.
            let held = std::fs::File::open(&lock).is_ok_and(|l| {
                // SAFETY: flock on a descriptor we own.
                let free = unsafe { libc::flock(l.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
                !free
            });
            if !held {
                let _ = std::fs::remove_file(&path);
                // And what stood for its flocks and FIFOs (`super::lock::flock_path`, `fifo_path`).
                for what in ["flock", "fifo"] {
                    let _ = std::fs::remove_dir_all(dir.join(format!("iopath-{what}-{id}")));
                }
            }
        }
    }
}

fn get(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: u8) -> Vec<u8> {
        vec![v; BLOCK]
    }

    /// The carried cache file in `dir`, `frames` frames.
    fn open_in(dir: &Path, frames: u64) -> CarriedCache {
        CarriedCache::open(&dir.join("carry"), &dir.join("device"), frames * BLOCK_U64).unwrap()
    }

    /// A carried cache in `dir` that saved blocks 1 and 2 (bytes 1 and 2) for
    /// volume `volume` under `stamp`, opened and attached again.
    fn holding_one_and_two(dir: &Path, frames: u64, volume: u64, stamp: u64) -> CarriedCache {
        let c = open_in(dir, frames);
        c.attach(volume, 0).unwrap();
        c.save(volume, stamp, [(1, Some(&block(1)[..])), (2, Some(&block(2)[..]))].into_iter()).unwrap();
        drop(c);
        let c = open_in(dir, frames);
        assert_eq!(c.attach(volume, stamp).unwrap(), 2);
        c
    }

    /// Checks that `c` reads each block whole as the byte `want` says, or does not hold it.
    fn assert_reads(c: &CarriedCache, wants: &[(u64, Option<u8>)]) {
        let mut one = vec![0u8; BLOCK];
        for &(b, want) in wants {
            assert_eq!(c.read(b, &mut one).then(|| one[0]), want, "block {b}");
            if want.is_some() {
                assert!(one.iter().all(|&x| Some(x) == want), "block {b} whole");
            }
        }
    }

    #[test]
    fn it_keeps_the_blocks_a_mount_used_when_room_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let (path, backing) = (dir.path().join("carry"), dir.path().join("device"));
        let open = || CarriedCache::open(&path, &backing, 4 * BLOCK_U64).unwrap();
        let c = open();
        assert_eq!(c.attach(9, 0).unwrap(), 0);
        let pages = [(10, block(1)), (11, block(2)), (12, block(3)), (13, block(4))];
        assert_eq!(c.save(9, 77, pages.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap(), 4);
        drop(c);

        // Another volume, or another stamp: nothing.
        assert_eq!(open().attach(8, 77).unwrap(), 0, "another volume");
        let c = open();
        assert_eq!(c.attach(9, 77).unwrap(), 0, "the last attach unstamped it");
        let pages: Vec<(u64, Vec<u8>)> = (0..4).map(|i| (10 + i, block(i as u8 + 1))).collect();
        c.save(9, 78, pages.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap();
        drop(c);

        let c = open();
        assert_eq!(c.attach(9, 78).unwrap(), 4);
        let mut out = vec![0u8; 2 * BLOCK];
        assert!(c.read(11, &mut out) && out[..BLOCK] == block(2)[..] && out[BLOCK..] == block(3)[..]);
        assert!(!c.read(13, &mut out), "13 and 14: not all there");
        c.forget(10, 1);
        assert!(!c.read(10, &mut out[..BLOCK]));
        // Room for three new blocks: one frame is free, then the unused 13 goes, then nothing.
        let new = [(20, block(9)), (21, block(8)), (22, block(7))];
        assert_eq!(c.save(9, 79, new.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap(), 4);
        drop(c);

        let c = open();
        assert_eq!(c.attach(9, 79).unwrap(), 4);
        assert_reads(&c, &[(11, Some(2)), (12, Some(3)), (20, Some(9)), (21, Some(8)), (13, None), (22, None)]);
    }

    #[test]
    fn new_blocks_take_free_memory_then_unused_blocks_frames_then_holes() {
        let dir = tempfile::tempdir().unwrap();
        let c = open_in(dir.path(), 8);
        c.attach(3, 0).unwrap();
        let old = [(1, block(1)), (2, block(2)), (3, block(3)), (4, block(4))];
        assert_eq!(c.save(3, 50, old.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap(), 4);
        drop(c);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(3, 50).unwrap(), 4);
        // Frames 0-3 have memory, 4-7 are holes. This mount writes block 2 (its
        // frame is free, with memory) and reads block 1; 3 and 4 it leaves alone.
        c.forget(2, 1);
        assert_reads(&c, &[(1, Some(1))]);
        // Staged (an exit's writeback): into 2's frame, then 3's, whose block goes.
        c.forget(10, 2);
        let mut run = block(10);
        run.extend(block(11));
        c.stage(10, &run);
        assert!(!c.holds(3) && c.holds(4), "3 set aside, 4 still there (and still unused)");
        // Saved: 4's frame next, and only then a hole.
        let new = [(10, block(10)), (11, block(11)), (12, block(12)), (13, block(13))];
        assert_eq!(c.save(3, 51, new.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap(), 5);
        let wanted: Vec<u64> = (4..8).map(|f| c.frame_offset(f) as u64).collect();
        drop(c);
        // Only one hole was filled: the file holds memory for five frames.
        let file = std::fs::File::open(dir.path().join("carry")).unwrap();
        let resident: Vec<bool> = wanted.iter().map(|&at| data_at(&file, at)).collect();
        assert_eq!(resident, [true, false, false, false]);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(3, 51).unwrap(), 5);
        assert_reads(&c, &[(1, Some(1)), (2, None), (3, None), (4, None)]);
        assert_reads(&c, &[(10, Some(10)), (11, Some(11)), (12, Some(12)), (13, Some(13))]);
    }

    /// Whether the file holds data (not a hole) at byte `at`.
    fn data_at(file: &std::fs::File, at: u64) -> bool {
        // SAFETY: lseek on a descriptor we hold.
        let found = unsafe { libc::lseek(file.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
        found == at as libc::off_t
    }

    #[test]
    fn a_block_written_while_a_save_was_gathered_is_left_out_of_it() {
        // The exit (or carry_over) looks at which device block each cached page is,
        // then hands the pages over. Meanwhile a file was truncated and its block
        // taken and written by another: the page's bytes are no longer the device's.
        let dir = tempfile::tempdir().unwrap();
        let c = holding_one_and_two(dir.path(), 8, 5, 31);
        c.watch_writes();
        c.forget(7, 2); // blocks 7 and 8 written: the cache never held them
        c.forget(1, 1); // and block 1, which it held
        let (seven, eight, nine) = (block(7), block(8), block(9));
        let pages = [(7, Some(&seven[..])), (8, Some(&eight[..])), (9, Some(&nine[..])), (2, None)];
        assert_eq!(c.save(5, 32, pages.into_iter()).unwrap(), 2, "2 and 9");
        // The next save looks at writes only if asked again.
        c.forget(9, 1);
        let nine = block(19);
        assert_eq!(c.save(5, 33, [(9, Some(&nine[..]))].into_iter()).unwrap(), 2);
        drop(c);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(5, 33).unwrap(), 2);
        assert_reads(&c, &[(1, None), (2, Some(2)), (7, None), (8, None), (9, Some(19))]);
    }

    #[test]
    fn a_save_needs_the_bytes_only_of_what_it_neither_holds_nor_staged() {
        let dir = tempfile::tempdir().unwrap();
        let c = holding_one_and_two(dir.path(), 8, 5, 31);
        assert_reads(&c, &[(1, Some(1)), (2, Some(2))]); // used: kept over fresh memory
        c.forget(3, 1);
        c.stage(3, &block(3));
        c.forget(2, 1);
        // 1 held, 2 written since (forgotten), 3 staged, 4 never seen.
        assert_eq!(c.wanted(&[1, 2, 3, 4]), [false, true, false, true]);
        // Without bytes: 1 and 3 stay, 4 cannot be saved; 2 and 6 come with theirs.
        let (two, six) = (block(22), block(6));
        let pages = [(1, None), (2, Some(&two[..])), (3, None), (4, None), (6, Some(&six[..]))];
        assert_eq!(c.save(5, 32, pages.into_iter()).unwrap(), 4);
        drop(c);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(5, 32).unwrap(), 4);
        assert_reads(&c, &[(1, Some(1)), (2, Some(22)), (3, Some(3)), (4, None), (6, Some(6))]);
    }

    #[test]
    fn staged_blocks_are_saved_without_a_copy_unless_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let c = holding_one_and_two(dir.path(), 6, 4, 21);
        assert_reads(&c, &[(1, Some(1))]);
        // A writeback of blocks 2, 7, 8 and 9 in flight: each forgotten as it is
        // sent, then staged. Block 2's new bytes go to a free frame, not its own.
        c.forget(2, 1);
        let mut run = block(22);
        run.extend(block(7));
        c.stage(2, &run);
        c.forget(8, 2);
        let mut run = block(8);
        run.extend(block(9));
        c.stage(8, &run);
        // Block 8 written again before the save (its new bytes are what the page has).
        c.forget(8, 1);
        let pages = [(2, block(22)), (8, block(88)), (9, block(9))];
        let held = c.save(4, 22, pages.iter().map(|(b, p)| (*b, Some(&p[..])))).unwrap();
        assert_eq!(held, 4, "1, 2, 8, 9 (7 was staged but no page saved it)");
        drop(c);
        let c = open_in(dir.path(), 6);
        assert_eq!(c.attach(4, 22).unwrap(), 4);
        assert_reads(&c, &[(1, Some(1)), (2, Some(22)), (8, Some(88)), (9, Some(9)), (7, None)]);
    }

    #[test]
    fn a_matching_attach_keeps_the_stamp_until_the_first_write_or_change() {
        let dir = tempfile::tempdir().unwrap();
        let c = holding_one_and_two(dir.path(), 8, 6, 41);
        assert_eq!(c.stamp_held(), 41, "attached, nothing written: still vouching");
        c.forget(30, 1);
        assert_eq!(c.stamp_held(), 0, "a device write (of any block) unstamps it first");
        drop(c);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(6, 41).unwrap(), 0, "not trusted after that write");
        // A save with new pages unstamps before it changes anything, then stamps anew.
        let c = holding_one_and_two(dir.path(), 8, 6, 42);
        assert_reads(&c, &[(1, Some(1)), (2, Some(2))]);
        assert_eq!(c.save(6, 43, [(3, Some(&block(3)[..]))].into_iter()).unwrap(), 3);
        assert_eq!(c.stamp_held(), 43);
        // Another attach that does not match unstamps at once.
        drop(c);
        let c = open_in(dir.path(), 8);
        assert_eq!(c.attach(6, 42).unwrap(), 0);
        assert_eq!(c.stamp_held(), 0);
    }

    #[test]
    fn a_lent_frame_holds_the_block_and_writing_it_changes_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (path, backing) = (dir.path().join("carry"), dir.path().join("device"));
        let c = CarriedCache::open(&path, &backing, 8 * BLOCK_U64).unwrap();
        c.attach(3, 0).unwrap();
        c.save(3, 11, [(5, Some(&block(5)[..])), (6, Some(&block(6)[..]))].into_iter()).unwrap();
        drop(c);
        let c = CarriedCache::open(&path, &backing, 8 * BLOCK_U64).unwrap();
        c.attach(3, 11).unwrap();
        let mut frame = c.lend(5).unwrap();
        assert_eq!(&frame[..], &block(5)[..]);
        assert!(c.lend(5).is_none(), "lent once only");
        assert!(c.lend(7).is_none(), "not held");
        frame.fill(0xAB);
        let mut out = vec![0u8; BLOCK];
        assert!(c.read(5, &mut out) && out == block(5), "the kernel copied the frame on write");
        c.save(3, 12, std::iter::empty()).unwrap();
        assert_eq!(c.stamp_held(), 11, "nothing written or added since the attach: the stamp stands");
        drop(c);
        let c = CarriedCache::open(&path, &backing, 8 * BLOCK_U64).unwrap();
        assert_eq!(c.attach(3, 11).unwrap(), 2);
        // A later mount in the same process: the same mapping, and what it lent stays lent.
        assert!(c.lend(5).is_none(), "lent (and written) by an earlier mount of this process: copied instead");
        assert!(c.read(5, &mut out) && out == block(5));
        assert_eq!(&c.lend(6).unwrap()[..], &block(6)[..]);
        assert_eq!(c.hits(), 2);
        let mappings = LENDERS.lock().unwrap().iter().filter(|l| std::ptr::eq(**l, c.lender)).count();
        assert_eq!(mappings, 1);
        drop(c);
        // Another size replaces the file (never cut short while a frame may be lent).
        let c = CarriedCache::open(&path, &backing, 16 * BLOCK_U64).unwrap();
        assert_eq!(c.attach(3, 12).unwrap(), 0);
        assert_eq!(&frame[..], &[0xAB; BLOCK][..], "a written lent frame keeps its bytes");
    }

    #[test]
    fn a_fork_waits_for_a_lenders_bits_and_holds_them_until_it_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("device");
        std::fs::write(&backing, b"x").unwrap();
        let c = CarriedCache::open(&dir.path().join("iopath-carry-fork"), &backing, 4 * BLOCK_U64).unwrap();
        let lender = c.lender;
        // A thread in the middle of lending a frame (its bits held): the fork's hold waits.
        let (holding_tx, holding_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let lending = std::thread::spawn(move || {
            let _bits = lender.lent.lock().unwrap();
            holding_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
        holding_rx.recv().unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let forking = std::thread::spawn(move || {
            let held = hold_for_fork();
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(held);
        });
        assert!(
            held_rx.recv_timeout(std::time::Duration::from_millis(100)).is_err(),
            "the fork's hold went ahead while a thread held a lender's bits"
        );
        release_tx.send(()).unwrap();
        lending.join().unwrap();
        held_rx.recv().unwrap();
        // Held now: no thread takes the bits until the fork is done.
        assert!(lender.lent.try_lock().is_err(), "the bits are free during the fork");
        done_tx.send(()).unwrap();
        forking.join().unwrap();
        assert!(lender.lent.try_lock().is_ok());
    }

    #[test]
    fn a_cache_of_another_size_starts_empty_and_a_sweep_removes_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("device");
        std::fs::write(&backing, b"x").unwrap();
        let path = dir.path().join("iopath-carry-gone");
        let c = CarriedCache::open(&path, &backing, 2 * BLOCK_U64).unwrap();
        c.attach(1, 0).unwrap();
        c.save(1, 5, [(3, Some(&block(3)[..]))].into_iter()).unwrap();
        drop(c);
        let c = CarriedCache::open(&path, &backing, 3 * BLOCK_U64).unwrap();
        assert_eq!(c.attach(1, 5).unwrap(), 0);
        drop(c);
        // Its name says a device identity that `backing` does not have: swept, and
        // what stood for the flocks and FIFOs of that device with it.
        for what in ["flock", "fifo"] {
            std::fs::create_dir(dir.path().join(format!("iopath-{what}-gone"))).unwrap();
            std::fs::write(dir.path().join(format!("iopath-{what}-gone/1f")), b"").unwrap();
        }
        sweep(dir.path());
        assert!(!path.exists());
        assert!(!dir.path().join("iopath-flock-gone").exists() && !dir.path().join("iopath-fifo-gone").exists());
    }
}
