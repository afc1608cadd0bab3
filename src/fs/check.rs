//! Checking a file system's structures: what `mount` refuses at the first
//! problem and `iopath fsck` reports in full.
//!
//! One scan serves both (`scan` and `namespace::index`): every
//! inode decodes (checksum, flags, name, parent, mode, extents in order and
//! inside the data area, overflow chain, no written data past the end),
//! every block a file owns is marked in use and owned once, every metadata
//! block is marked in use, and the namespace is a tree (each parent a
//! directory, no name taken twice in one directory, every directory reaches
//! the root). A [`Problems`] sink decides what a problem does: mount's
//! ([`FirstProblem`]) turns the first into an error naming `iopath fsck`;
//! fsck's ([`AllProblems`]) writes each down and goes on. [`check`] adds
//! what only fsck looks for: blocks marked in use that nothing owns, and
//! orphans (files unlinked while open before a crash) the next mount frees.
//!
//! A mount the carried cache vouches for (its stamp matches the
//! superblock's and nothing was replayed: the table is as the last process
//! that held the device left it, which checked it at its own mount or wrote
//! it) scans under `Trust::Carried`: every inode is checked as decoding it
//! would check it, but a plain file's is not decoded (its extents are not
//! gathered), and no block is checked against the bitmap; the namespace is
//! still checked whole.
//!
//! fsck repairs nothing. Like mount (and e2fsck), it replays the journal
//! first, so it judges the file system a mount would see.

use super::alloc::Allocator;
use super::disk::Disk;
use super::format::{
    self, BLOCK, Block, Head, INLINE_EXTENTS, INODE_SIZE, INODES_PER_BLOCK, Inode, Superblock, zero_block,
};
use super::journal::Journal;
use super::namespace::Name;
use super::shm_log::ShmLog;
use crate::IoBuf;
use crate::engine::Engine;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Where the problems a scan finds go.
pub trait Problems {
    /// A structure is wrong: `Err` stops the scan with that error, `Ok` goes on.
    fn found(&mut self, why: String) -> Result<()>;
}

/// Mount's sink: the first problem is the error, with a pointer to `iopath fsck`.
#[derive(Debug, Default)]
pub struct FirstProblem;

impl Problems for FirstProblem {
    fn found(&mut self, why: String) -> Result<()> {
        Err(format::corrupt(format!("{why}; run `iopath fsck` for the whole picture")))
    }
}

/// fsck's sink: every problem, in the order found.
#[derive(Debug, Default)]
pub struct AllProblems(pub Vec<String>);

impl Problems for AllProblems {
    fn found(&mut self, why: String) -> Result<()> {
        self.0.push(why);
        Ok(())
    }
}

/// What the namespace (and a mount) needs of an inode the scan decoded: its
/// name and kind, not its extents. A mount of a tree of 8,821 names kept
/// every inode whole (168 bytes each, with its extents on the heap beside):
/// 2 MB of fresh memory faulted in by every process that mounted it, for
/// the few files a command uses; a file's inode is decoded again from the
/// table when its node is first built ([`super::Meta::file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    /// Its inode slot.
    pub slot: u32,
    /// Its directory's slot (or the root).
    pub parent: u32,
    /// File type and permission bits.
    pub mode: u32,
    /// Unlinked while open (it has no name in the tree).
    pub orphan: bool,
    /// A hard link: the slot of the file it names.
    pub alias_of: Option<u32>,
    /// Its name in its directory (the index shares this copy).
    pub name: Name,
    /// A symbolic link's target (empty otherwise).
    pub target: Vec<u8>,
}

/// A regular file (or FIFO) that is no hard link and has no overflow
/// extent blocks: what a [`Trust::Carried`] scan checks but does not decode.
fn plain_file(head: &Head) -> bool {
    matches!(head.mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFIFO) && !head.alias && head.total <= INLINE_EXTENTS
}

impl Named {
    /// The name and kind in `head`, of inode `slot` (a plain file: no alias, no target).
    fn of_head(slot: u32, head: &Head) -> Named {
        Named {
            slot,
            parent: head.parent,
            mode: head.mode,
            orphan: head.orphan,
            alias_of: None,
            name: Name::from(head.name),
            target: Vec::new(),
        }
    }

    /// The name and kind of `inode`, in `slot`, taking its name and target
    /// (the rest stays in `inode`).
    pub fn take(slot: u32, inode: &mut Inode) -> Named {
        Named {
            slot,
            parent: inode.parent,
            mode: inode.mode,
            orphan: inode.orphan,
            alias_of: inode.alias_of,
            name: Name::from(std::mem::take(&mut inode.name)),
            target: std::mem::take(&mut inode.target),
        }
    }

    /// Its file type (`S_IFREG`, `S_IFDIR`, ...).
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// Whether the mount keeps its whole inode: a directory's or a hard link's
    /// (few; a file's is decoded again when its node is built).
    pub fn kept_whole(&self) -> bool {
        self.is_dir() || self.alias_of.is_some()
    }
}

/// The inodes a scan decoded, and what they own.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Every inode that decoded, by slot: its name and kind.
    pub named: Vec<Named>,
    /// The whole inodes of directories and hard links ([`Named::kept_whole`]), by slot.
    pub kept: Vec<(u32, Inode)>,
    /// Overflow extent blocks, by block number.
    pub overflow: HashMap<u64, Block>,
    /// The blocks some inode owns.
    pub owned: Owned,
}

/// A set of blocks, one bit each. A mount checks that no two files own a
/// block, and a map of a hundred thousand blocks to their owners was most of
/// its time (tar's tree of 8,759 files: 35 of a 50 ms mount, in hash inserts).
#[derive(Debug, Default)]
pub(super) struct Owned {
    bits: Vec<u64>,
    count: u64,
}

impl Owned {
    /// An empty set for a device of `blocks` blocks.
    fn new(blocks: u64) -> Owned {
        Owned { bits: vec![0; blocks.div_ceil(64) as usize], count: 0 }
    }

    /// Adds `b` (a block of the device); false if it was in the set already.
    fn insert(&mut self, b: u64) -> bool {
        let (word, bit) = ((b / 64) as usize, 1u64 << (b % 64));
        let fresh = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        self.count += fresh as u64;
        fresh
    }

    /// Adds the run `[start, start + len)` if none of it is in the set yet
    /// (a word of 64 blocks at a time); false, and nothing added, if some is
    /// (or the run leaves the device).
    fn insert_run(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        if end > self.bits.len() as u64 * 64 || word_masks(start, end).any(|(w, mask)| self.bits[w] & mask != 0) {
            return false;
        }
        for (w, mask) in word_masks(start, end) {
            self.bits[w] |= mask;
            self.count += u64::from(mask.count_ones());
        }
        true
    }

    /// Takes out a run [`Owned::insert_run`] added.
    fn remove_run(&mut self, start: u64, len: u64) {
        for (w, mask) in word_masks(start, start + len) {
            self.count -= u64::from((self.bits[w] & mask).count_ones());
            self.bits[w] &= !mask;
        }
    }

    /// Whether `b` is in the set.
    pub fn contains(&self, b: u64) -> bool {
        self.bits.get((b / 64) as usize).is_some_and(|w| w & (1 << (b % 64)) != 0)
    }

    /// How many blocks the set holds.
    pub fn len(&self) -> u64 {
        self.count
    }
}

/// The words of a bitmap that `[start, end)` covers, each with the bits it
/// covers there.
fn word_masks(start: u64, end: u64) -> impl Iterator<Item = (usize, u64)> {
    let (first, last) = (start / 64, end.div_ceil(64));
    (first..last).map(move |w| {
        let from = start.max(w * 64) - w * 64;
        let upto = end.min(w * 64 + 64) - w * 64;
        let mask = if upto - from == 64 { u64::MAX } else { ((1u64 << (upto - from)) - 1) << from };
        (w as usize, mask)
    })
}

/// The blocks `inode` owns: its extents' and its overflow extent blocks.
fn owned_by(inode: &Inode) -> impl Iterator<Item = u64> + '_ {
    let extents = inode.extents.iter().flat_map(|e| e.physical..e.physical + e.len as u64);
    extents.chain(inode.overflow.iter().copied())
}

/// Reads `count` blocks from `start`.
pub(super) fn read_blocks(disk: &Disk, start: u64, count: u64) -> Result<Vec<Block>> {
    let mut out = Vec::with_capacity(count as usize);
    read_each(disk, start, count, |c| {
        let mut b = zero_block();
        b.copy_from_slice(c);
        out.push(b);
    })?;
    Ok(out)
}

/// Reads `count` blocks from `start` and hands each to `each`, in order; in
/// pieces through one pooled buffer (a whole inode table at once, 32 MiB
/// for 65,536 inodes, was a fresh mapping each mount, faulted in and unmapped).
fn read_each(disk: &Disk, start: u64, count: u64, mut each: impl FnMut(&[u8])) -> Result<()> {
    const PIECE: u64 = 256;
    let mut buf = IoBuf::for_overwrite(PIECE.min(count).max(1) as usize * BLOCK);
    let mut at = 0;
    while at < count {
        let n = PIECE.min(count - at) as usize;
        disk.read(start + at, &mut buf[..n * BLOCK])?;
        buf[..n * BLOCK].chunks(BLOCK).for_each(&mut each);
        at += n as u64;
    }
    Ok(())
}

/// Reads the superblock and replays the journal, then reads the superblock
/// again if anything was replayed: a replay may have put a newer one (a
/// higher inode mark) in place.
///
/// Without `log`, a log a killed holder left beside the device's mount lock
/// ([`super::shm_log`]) is applied all the same, if the engine names its
/// device: a mount or check that does not take the lock must not lose what
/// a killed program's calls returned from.
///
/// `quiesced` says, from the superblock, whether the last holder left the
/// device quiesced ([`Journal::recover_after`]).
pub(super) fn recover(
    disk: &Disk,
    log: Option<&ShmLog>,
    quiesced: impl FnOnce(&Superblock) -> bool,
) -> Result<(Superblock, Journal)> {
    let found = match log {
        Some(_) => None,
        None => disk.engine().backing().and_then(super::shm_log::existing_for),
    };
    let log = log.or(found.as_ref());
    let sb = Superblock::decode(&disk.read_block(0)?, disk.blocks())?;
    let journal = Journal::recover_after(disk, &sb, log, quiesced(&sb))?;
    if journal.stats().replayed == 0 && journal.stats().from_log == 0 {
        return Ok((sb, journal));
    }
    Ok((Superblock::decode(&disk.read_block(0)?, disk.blocks())?, journal))
}

/// Reads the inode table, keeping only the blocks that hold something (a
/// block of free slots is `None`: most of a young file system's table). A
/// mount reads it up to the superblock's inode mark (tar's tree of 8,759
/// files on a 3 GiB image: 4.8 of 24.5 MiB); fsck reads it `whole`, to
/// find an inode beyond the mark. Returns the blocks, and one bit per
/// block the carried cache lent (its frame, not a copy).
pub(super) fn read_table(disk: &Disk, sb: &Superblock, whole: bool) -> Result<(Vec<Option<IoBuf>>, Vec<u64>)> {
    let count = if whole { sb.inode_blocks } else { sb.inode_mark.div_ceil(INODES_PER_BLOCK as u64) };
    let mut out: Vec<Option<IoBuf>> = Vec::with_capacity(sb.inode_blocks as usize);
    let mut lent_bits = vec![0u64; (sb.inode_blocks as usize).div_ceil(64)];
    // A block the carried cache holds (the last process left the table there)
    // is lent: its frame, read in place and copied by the kernel only if an
    // inode there changes, where each mount read the table from the device
    // (tar's tree: 4.5 MiB, 3.4 ms of an 11.5 ms mount).
    let mut missing: Vec<u64> = Vec::new();
    for i in 0..count {
        out.push(match disk.lend_carried(sb.inode_start + i) {
            None => {
                missing.push(i);
                None
            }
            Some(block) if format::all_zero(&block) => {
                // Free slots only: nothing is kept, and the frame (only read) may be lent again.
                // SAFETY: read above, never written, not used after.
                drop(unsafe { disk.take_back_lent(block) });
                None
            }
            lent => {
                super::carry::set_bit(&mut lent_bits, i as usize);
                lent
            }
        });
    }
    // The rest is read into blocks of the pool (page frames a process before may
    // have faulted in already): 4 KiB boxes of fresh heap were a page fault and a
    // zeroing each, a fifth of a short program's time on a mount of 26K names.
    for run in missing.chunk_by(|a, b| a + 1 == *b) {
        let mut at = run[0] as usize;
        read_each(disk, sb.inode_start + run[0], run.len() as u64, |c| {
            out[at] = (!format::all_zero(c)).then(|| IoBuf::from_slice(c));
            at += 1;
        })?;
    }
    out.resize_with(sb.inode_blocks as usize, || None);
    Ok((out, lent_bits))
}

/// How far [`scan`] checks the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trust {
    /// Every inode's checksum and extents, and the blocks they own against
    /// the bitmap: `iopath fsck`, and a mount of a device no carried cache
    /// vouches for.
    Check,
    /// The table is as the last process that held the device left it (its
    /// carried cache's stamp matches and nothing was replayed): that process
    /// checked the blocks files own against the bitmap at its mount and
    /// kept them so. Every inode is checked as a mount checks it (checksum,
    /// fields, extents), but a plain file's is not decoded
    /// ([`Inode::head`], [`Inode::check_plain`]: its extents are not
    /// gathered) and no block is checked against the bitmap; directories,
    /// hard links, symbolic links and files with overflow extent blocks are
    /// decoded whole as under `Check`.
    Carried,
}

/// Decodes every inode of `table` (a `None` block: eight free slots) and,
/// under [`Trust::Check`], checks the blocks they own against the bitmap in
/// `alloc`.
pub(super) fn scan(
    disk: &Disk,
    sb: &Superblock,
    table: &[Option<IoBuf>],
    alloc: &mut Allocator,
    problems: &mut dyn Problems,
    trust: Trust,
) -> Result<Scan> {
    let check = trust == Trust::Check;
    if check {
        // Only the part of a lazily read bitmap that covers the metadata and the files.
        alloc.read_covering(0, sb.data_start)?;
        for n in 0..sb.data_start {
            if !alloc.in_use(n) {
                problems.found(format!("the bitmap marks metadata block {n} free"))?;
            }
        }
    }
    let mut out = Scan { owned: Owned::new(if check { sb.blocks } else { 0 }), ..Scan::default() };
    // Sized once: grown as it filled, its entries were copied a dozen times.
    out.named.reserve(sb.inode_mark.min(sb.inodes()) as usize);
    let read_overflow = |b: u64| -> Result<Block> { Ok(read_blocks(disk, b, 1)?.remove(0)) };
    for slot in 0..sb.inodes() {
        let Some(raw) = slot_in(table, slot) else { continue };
        if !check {
            match Inode::head(raw, slot, sb) {
                Ok(None) => continue,
                Ok(Some(head))
                    if plain_file(&head)
                        && slot < sb.inode_mark
                        && Inode::check_plain(raw, slot, &head, sb).is_ok() =>
                {
                    out.named.push(Named::of_head(slot as u32, &head));
                    continue;
                }
                // Decoded whole below (which reports what is wrong).
                _ => {}
            }
        }
        let mut inode = match Inode::decode(raw, slot, read_overflow, sb) {
            Ok(Some(inode)) => inode,
            Ok(None) => continue,
            Err(Error::Format { why }) => {
                problems.found(why)?;
                continue;
            }
            Err(other) => return Err(other),
        };
        if slot >= sb.inode_mark {
            problems.found(format!(
                "inode {slot} ('{}') is in use beyond the superblock's inode mark {}",
                String::from_utf8_lossy(&inode.name),
                sb.inode_mark
            ))?;
        }
        let runs = inode.extents.iter().map(|e| (e.physical, u64::from(e.len)));
        let runs = runs.chain(inode.overflow.iter().map(|&b| (b, 1))).filter(|_| check);
        // Each run at once (a 32 MiB file is 8,192 blocks: checked one by one, a
        // mount's scan grew with the data, not the names); block by block only
        // where something is wrong, to say which block.
        for (start, len) in runs.clone() {
            alloc.read_covering(start, len)?;
        }
        let mut inserted = 0;
        let clean = runs.clone().all(|(start, len)| {
            let fine = alloc.all_in_use(start, len) && out.owned.insert_run(start, len);
            inserted += usize::from(fine);
            fine
        });
        if !clean {
            // The runs inserted before the wrong one go in again, block by block.
            for (start, len) in runs.take(inserted) {
                out.owned.remove_run(start, len);
            }
        }
        for b in owned_by(&inode).filter(|_| !clean) {
            if !alloc.in_use(b) {
                let named = String::from_utf8_lossy(&inode.name);
                problems.found(format!("'{named}' (inode {slot}) owns block {b}, which the bitmap marks free"))?;
            }
            if !out.owned.insert(b) {
                // Rare: which inode had it is looked up only now, decoding them again.
                let other = out.named.iter().map(|n| n.slot).find(|&s| {
                    let earlier = slot_in(table, s as u64).map(|raw| Inode::decode(raw, s as u64, read_overflow, sb));
                    matches!(earlier, Some(Ok(Some(i))) if owned_by(&i).any(|o| o == b))
                });
                problems.found(match other {
                    Some(other) => format!("block {b} is owned by inodes {other} and {slot}"),
                    None => format!("block {b} is owned twice by inode {slot}"),
                })?;
            }
        }
        for &b in &inode.overflow {
            out.overflow.insert(b, read_blocks(disk, b, 1)?.remove(0));
        }
        let named = Named::take(slot as u32, &mut inode);
        if named.kept_whole() {
            inode.name = named.name[..].to_vec();
            out.kept.push((slot as u32, inode));
        }
        out.named.push(named);
    }
    Ok(out)
}

/// The bytes of inode `slot` in `table` (`None`: its block holds free slots only).
pub(super) fn slot_in(table: &[Option<IoBuf>], slot: u64) -> Option<&[u8]> {
    let block = table.get(slot as usize / INODES_PER_BLOCK)?.as_ref()?;
    let at = slot as usize % INODES_PER_BLOCK * INODE_SIZE;
    Some(&block[at..at + INODE_SIZE])
}

/// What `iopath fsck` found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Format version on the device.
    pub version: u32,
    /// Journal transactions replayed before the check (non-zero after a crash).
    pub replayed: u64,
    /// Files (orphans included) and directories (the root not counted).
    pub files: usize,
    /// See `files`.
    pub dirs: usize,
    /// Symbolic links.
    pub links: usize,
    /// Hard links: names beyond a file's first (format 8).
    pub hard_links: usize,
    /// Files unlinked while open when the file system stopped: the next mount frees them.
    pub orphans: usize,
    /// Inode slots in the table.
    pub inodes: u64,
    /// Blocks of the device and of its data area.
    pub blocks: u64,
    /// See `blocks`.
    pub data_blocks: u64,
    /// Blocks files own (data, preallocated space, overflow extent blocks).
    pub owned_blocks: u64,
    /// Blocks the bitmap marks free.
    pub free_blocks: u64,
    /// Data-area blocks marked in use that no file owns (space lost, no data at risk).
    pub leaked_blocks: u64,
    /// Everything wrong, in the order found; empty when the file system is clean.
    pub problems: Vec<String>,
}

impl Report {
    /// Whether nothing is wrong (leaked blocks count as wrong; orphans do not).
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the file system on `engine`'s device: replays its journal (as a
/// mount would), then checks every structure and reports every problem.
/// An error means there is no file system to check (no superblock, a
/// damaged one, a journal header that does not decode) or the device failed.
pub fn check(engine: Arc<Engine>) -> Result<Report> {
    check_with(engine, None)
}

/// Checks as [`check`] does, first applying what a killed process left in
/// the device's shared-memory log ([`super::shm_log`]), as a mount would.
pub fn check_with(engine: Arc<Engine>, log: Option<&ShmLog>) -> Result<Report> {
    let disk = Disk::new(engine);
    if disk.blocks() < 2 {
        return Err(format::corrupt("the device is smaller than two blocks: no file system fits"));
    }
    let (sb, journal) = recover(&disk, log, |_| false)?;
    let (table, _) = read_table(&disk, &sb, true)?;
    let bitmap = read_blocks(&disk, sb.bitmap_start, sb.bitmap_blocks)?;
    let mut alloc = Allocator::from_images(bitmap, sb.blocks, sb.data_start);
    let mut problems = AllProblems::default();
    let scan = scan(&disk, &sb, &table, &mut alloc, &mut problems, Trust::Check)?;
    super::namespace::index(scan.named.iter().filter(|n| !n.orphan), &mut problems)?;
    let leaked = (sb.data_start..sb.blocks).filter(|b| alloc.in_use(*b) && !scan.owned.contains(*b)).count() as u64;
    if leaked > 0 {
        problems.found(format!(
            "{leaked} block(s) are marked in use but no file owns them (space lost; no data at risk)"
        ))?;
    }
    Ok(Report {
        version: sb.version,
        replayed: journal.stats().replayed + journal.stats().from_log,
        files: scan.named.iter().filter(|n| !n.is_dir() && n.kind() != libc::S_IFLNK && n.alias_of.is_none()).count(),
        links: scan.named.iter().filter(|n| n.kind() == libc::S_IFLNK && n.alias_of.is_none()).count(),
        hard_links: scan.named.iter().filter(|n| n.alias_of.is_some()).count(),
        dirs: scan.named.iter().filter(|n| n.is_dir()).count(),
        orphans: scan.named.iter().filter(|n| n.orphan).count(),
        inodes: sb.inodes(),
        blocks: sb.blocks,
        data_blocks: sb.blocks - sb.data_start,
        owned_blocks: scan.owned.len(),
        free_blocks: alloc.free_blocks()?,
        leaked_blocks: leaked,
        problems: problems.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_goes_in_whole_or_not_at_all_as_block_by_block_would_say() {
        let blocks = 1000;
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..200 {
            let (mut runs, mut one_by_one) = (Owned::new(blocks), Owned::new(blocks));
            for _ in 0..20 {
                let start = rng.u64(..blocks);
                let len = rng.u64(..=(blocks - start).min(200));
                let free = (start..start + len).all(|b| !one_by_one.contains(b));
                assert_eq!(runs.insert_run(start, len), free, "[{start}, +{len})");
                if free {
                    (start..start + len).for_each(|b| assert!(one_by_one.insert(b)));
                }
                assert_eq!(runs.bits, one_by_one.bits);
                assert_eq!(runs.len(), one_by_one.len());
            }
            let taken: Vec<u64> = (0..blocks).filter(|&b| runs.contains(b)).collect();
            if let Some(&b) = taken.first() {
                let len = taken.iter().take_while(|&&t| t < b + 64).count() as u64;
                if taken.windows(2).take(len as usize - 1).all(|w| w[1] == w[0] + 1) {
                    runs.remove_run(b, len);
                    assert!((b..b + len).all(|x| !runs.contains(x)));
                    assert_eq!(runs.len(), taken.len() as u64 - len);
                }
            }
        }
        assert!(!Owned::new(128).insert_run(120, 20), "past the end of the set");
    }
}
