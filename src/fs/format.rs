//! The on-device format of an iopath file system (version 4).
//!
//! Everything is in 4 KiB blocks; numbers are little-endian.
//!
//! ```text
//!  block 0            superblock (first 512-byte sector; rewritten only to upgrade the format)
//!  block 1            journal header (first sector): where replay starts
//!  inode_start..      inode table: 8 inodes of 512 bytes per block
//!  bitmap_start..     free-space bitmap: one bit per block of the device, 1 = in use
//!  journal_start..    the journal: a ring of transactions (descriptor, images, commit)
//!  data_start..       file data and overflow extent blocks
//! ```
//!
//! A journal transaction is `[descriptor] [image]... [commit]`, or, from
//! version 2 on, when it has at most [`COMMIT_TARGETS`] images, `[image]...
//! [commit]` with the images' home blocks in the commit block itself (one
//! block fewer for the small transactions an append + fsync makes). Version
//! 1 file systems are read and keep version 1's transactions.
//!
//! Version 3 adds directories without adding a structure: every inode
//! names its parent directory and its own name in it (the file system's
//! namespace is the set of (parent, name) pairs, indexed in memory at
//! mount: see [`super::namespace`]), its kind and permission bits, a change
//! time, and an orphan flag (unlinked while open: reclaimed at the next
//! mount if a crash came before its last close). The root directory has no
//! inode. Version 1 and 2 inodes have zeros there, which read as regular
//! files in the root: mounting an older file system upgrades its superblock
//! to version 3 (one sector, after journal replay), and nothing else moves.
//!
//! Version 4 changes only how a commit block checks its transaction's body
//! ([`body_crc`]). Before, it was the CRC-32 of the body, and every sealed
//! sector (an inode, a commit) ends in the CRC-32 of the rest of it: the
//! CRC-32 of such a sector is the same constant whatever it holds, so two
//! bodies that differ only inside sealed sectors had the same check, and a
//! stale journal block (an older commit) could pass for a lost image. That
//! mattered only to transactions written without a flush before their
//! commit block (the `journaled` fsync path, namespace changes written at
//! once), which rely on the check to tell a torn one. Mounting a version 3
//! file system replays its journal the old way, then upgrades it.
//!
//! Every structure that is rewritten in place and must be read whole (the
//! superblock, the journal header, an inode, a journal commit) fits in one
//! 512-byte sector, the unit a device writes atomically, and carries a
//! CRC-32 so a torn or foreign block is recognised rather than trusted.
//! Inode-table and bitmap blocks are only rewritten in place from the
//! journal (checkpoint), so a torn in-place write is repaired by replay.

use crate::error::{Error, Result};

/// Block size of the file system.
pub const BLOCK: usize = 4096;
/// Block size as a u64.
pub const BLOCK_U64: u64 = BLOCK as u64;
/// Bytes of one inode.
pub const INODE_SIZE: usize = 512;
/// Inodes per inode-table block.
pub const INODES_PER_BLOCK: usize = BLOCK / INODE_SIZE;
/// Longest file name in bytes.
pub const MAX_NAME: usize = 255;
/// Longest path the file system resolves, in bytes (Linux's `PATH_MAX` less its NUL).
pub const MAX_PATH: usize = 4095;
/// The root directory's number where an inode names its parent (it has no inode slot).
pub const ROOT: u32 = u32::MAX;
/// Extents held in the inode itself.
pub const INLINE_EXTENTS: usize = 11;
/// Extents held by one overflow block.
pub const OVERFLOW_EXTENTS: usize = (BLOCK - 16 - 4) / 16;
/// Block numbers one journal descriptor names.
pub const DESCRIPTOR_TARGETS: usize = (BLOCK - 32 - 4) / 8;
/// Bits (blocks) one bitmap block covers.
pub const BITS_PER_BITMAP_BLOCK: u64 = BLOCK_U64 * 8;

const SUPER_MAGIC: &[u8; 8] = b"IOPATHFS";
const HEADER_MAGIC: &[u8; 8] = b"IOPJHEAD";
const DESC_MAGIC: &[u8; 8] = b"IOPJDESC";
const COMMIT_MAGIC: &[u8; 8] = b"IOPJCOMT";
const OVERFLOW_MAGIC: &[u8; 4] = b"IOPX";
/// Format version `mkfs` writes (5: the superblock keeps the inode mark;
/// 6: and the carried cache's stamp; 7: symbolic links; 8: hard links,
/// second names of a file; 9: named pipes, FIFO inodes. An older iopath
/// would take any of those for damage, so it refuses the version).
pub const VERSION: u32 = 9;
/// Longest symbolic link target, in bytes: it is kept in the inode, where a
/// file keeps its extents (Linux allows 4095; every link under /usr and
/// /etc of these machines is under 100).
pub const MAX_LINK_TARGET: usize = LINK_END - LINK_START;
/// Where a symbolic link's target lies in its inode slot (the extents' place
/// up to the sector's seal).
const LINK_START: usize = 320;
const LINK_END: usize = INODE_SIZE - 4;
/// The inode mark (see [`Superblock::inode_mark`]) rises in steps of this
/// many slots (64 table blocks): a superblock goes into a transaction once
/// per 512 new files at most.
pub const INODE_MARK_STEP: u64 = 512;
/// Oldest format version this code mounts (mounting upgrades it to [`VERSION`]).
pub const OLDEST_VERSION: u32 = 1;
/// Home blocks a commit block names itself (version 2): what fits in its
/// first sector after the header, so a torn commit is never trusted.
pub const COMMIT_TARGETS: usize = (508 - 40) / 8;
/// Bit set in an extent's physical block number while its data is not yet written.
const UNWRITTEN: u64 = 1 << 63;

/// A 4 KiB metadata block image.
pub type Block = Box<[u8; BLOCK]>;

/// Whether every byte of `b` is zero, eight at a time: a mount looks at every
/// inode slot, most of them free (byte by byte, that was a quarter of
/// mounting an image of 9,000 files and 65,536 slots).
pub fn all_zero(b: &[u8]) -> bool {
    // Line by line, stopping at the first that holds something: an inode block
    // or slot in use says so in its first bytes (a fold over every word of
    // every block a mount looked at was a tenth of mounting 8,760 names).
    let lines = b.chunks_exact(64);
    let rest = lines.remainder();
    lines.into_iter().all(|line| {
        line.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))).fold(0, |acc, w| acc | w) == 0
    }) && rest.iter().all(|&x| x == 0)
}

/// A zeroed block image.
pub fn zero_block() -> Block {
    Box::new([0u8; BLOCK])
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// CRC-32 (IEEE) of `bytes`.
pub fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The check a commit block keeps of its transaction's body. From format 4
/// on, the CRC-32 of each 512-byte sector's first 508 bytes followed by its
/// last 4, taken over the body: a sealed sector (whose last 4 bytes are the
/// CRC-32 of the rest) then counts by its contents, where the plain CRC-32
/// of the body (format 1 to 3) sees every sealed sector as the same constant.
pub fn body_crc(version: u32, body: &[u8]) -> u32 {
    if version < 4 {
        return crc(body);
    }
    let mut hasher = crc32fast::Hasher::new();
    for sector in body.chunks(512) {
        let split = sector.len().saturating_sub(4);
        hasher.update(&crc(&sector[..split]).to_le_bytes());
        hasher.update(&sector[split..]);
    }
    hasher.finalize()
}

/// [`seal_sector`], for the journal's tests.
#[cfg(test)]
pub(crate) fn seal_sector_for_test(sector: &mut [u8]) {
    seal_sector(sector)
}

/// Seals a 512-byte record: the CRC of its first 508 bytes goes in its last 4.
fn seal_sector(sector: &mut [u8]) {
    let c = crc(&sector[..508]);
    put_u32(sector, 508, c);
}

fn sector_sealed(sector: &[u8]) -> bool {
    crc(&sector[..508]) == get_u32(sector, 508)
}

/// An error for a device whose file system cannot be used as it is.
pub fn corrupt(why: impl Into<String>) -> Error {
    Error::Format { why: why.into() }
}

/// Where everything is on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Blocks on the device the file system uses.
    pub blocks: u64,
    /// First inode-table block.
    pub inode_start: u64,
    /// Inode-table blocks.
    pub inode_blocks: u64,
    /// First bitmap block.
    pub bitmap_start: u64,
    /// Bitmap blocks.
    pub bitmap_blocks: u64,
    /// First journal block.
    pub journal_start: u64,
    /// Journal blocks.
    pub journal_blocks: u64,
    /// First data block.
    pub data_start: u64,
    /// Random identifier of this file system, stamped on every journal block.
    pub volume_id: u64,
    /// Format version it was made with.
    pub version: u32,
    /// Every inode slot in use lies below this one (version 5; before it,
    /// the whole table): a mount reads the table only that far. It rises,
    /// in steps of [`INODE_MARK_STEP`], in the transaction that first uses
    /// a slot at or above it, so a replay can never find an inode beyond
    /// it. This is the value at mount; the mounted file system keeps the
    /// live one.
    pub inode_mark: u64,
    /// The stamp of the carried cache that holds this device's blocks as they
    /// are now (version 6; 0: none does). A mount sets it to 0 before it
    /// writes anything, an unmount that leaves its clean blocks in a carried
    /// cache sets it to that cache's stamp, as its last write: a cache whose
    /// stamp is not the device's is never read. See [`super::carry`].
    pub carry_stamp: u64,
}

impl Superblock {
    /// Lays out a file system of `blocks` blocks with `inodes` inodes and a journal of `journal_blocks`.
    pub fn layout(blocks: u64, inodes: u64, journal_blocks: u64, volume_id: u64) -> Result<Superblock> {
        let inode_blocks = inodes.div_ceil(INODES_PER_BLOCK as u64).max(1);
        let bitmap_blocks = blocks.div_ceil(BITS_PER_BITMAP_BLOCK);
        let inode_start = 2;
        let bitmap_start = inode_start + inode_blocks;
        let journal_start = bitmap_start + bitmap_blocks;
        let data_start = journal_start + journal_blocks;
        if journal_blocks < 16 {
            return Err(Error::spec(
                "journal size",
                journal_blocks.to_string(),
                "the journal needs at least 16 blocks (64 KiB)",
            ));
        }
        if data_start + 16 > blocks {
            return Err(Error::spec(
                "device size",
                format!("{blocks} blocks"),
                format!(
                    "too small for {inodes} inodes and a journal of {journal_blocks} blocks (metadata alone takes \
                     {data_start} blocks); use a larger device or fewer inodes / a smaller journal"
                ),
            ));
        }
        Ok(Superblock {
            blocks,
            inode_start,
            inode_blocks,
            bitmap_start,
            bitmap_blocks,
            journal_start,
            journal_blocks,
            data_start,
            volume_id,
            version: VERSION,
            inode_mark: 0,
            carry_stamp: 0,
        })
    }

    /// The inode mark that covers `slot`: the next step above it, at most
    /// the table's end.
    pub fn inode_mark_over(&self, slot: u64) -> u64 {
        (slot + 1).next_multiple_of(INODE_MARK_STEP).min(self.inodes())
    }

    /// Number of inodes.
    pub fn inodes(&self) -> u64 {
        self.inode_blocks * INODES_PER_BLOCK as u64
    }

    /// The block image.
    pub fn encode(&self) -> Block {
        let mut b = zero_block();
        b[..8].copy_from_slice(SUPER_MAGIC);
        put_u32(&mut b[..], 8, self.version);
        put_u32(&mut b[..], 12, BLOCK as u32);
        for (i, v) in [
            self.blocks,
            self.inode_start,
            self.inode_blocks,
            self.bitmap_start,
            self.bitmap_blocks,
            self.journal_start,
            self.journal_blocks,
            self.data_start,
            self.volume_id,
            self.inode_mark,
            self.carry_stamp,
        ]
        .into_iter()
        .enumerate()
        {
            put_u64(&mut b[..], 16 + 8 * i, v);
        }
        seal_sector(&mut b[..512]);
        b
    }

    /// Reads a superblock image of a device of `device_blocks` blocks, checking it whole.
    pub fn decode(b: &[u8], device_blocks: u64) -> Result<Superblock> {
        if &b[..8] != SUPER_MAGIC {
            return Err(Error::Format {
                why: "no iopath file system here (block 0 has no iopath superblock); create one with \
                      `iopath mkfs DEVICE` (it erases what the device holds)"
                    .into(),
            });
        }
        if !sector_sealed(&b[..512]) {
            return Err(corrupt("the superblock's checksum does not match: it is damaged"));
        }
        let version = get_u32(b, 8);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(corrupt(format!(
                "format version {version}; this iopath reads versions {OLDEST_VERSION} to {VERSION}"
            )));
        }
        if get_u32(b, 12) as usize != BLOCK {
            return Err(corrupt(format!("block size {} (this iopath uses {BLOCK})", get_u32(b, 12))));
        }
        let f = |i: usize| get_u64(b, 16 + 8 * i);
        let sb = Superblock {
            blocks: f(0),
            inode_start: f(1),
            inode_blocks: f(2),
            bitmap_start: f(3),
            bitmap_blocks: f(4),
            journal_start: f(5),
            journal_blocks: f(6),
            data_start: f(7),
            volume_id: f(8),
            version,
            inode_mark: 0,
            carry_stamp: 0,
        };
        let consistent = sb.inode_start == 2
            && sb.bitmap_start == sb.inode_start + sb.inode_blocks
            && sb.journal_start == sb.bitmap_start + sb.bitmap_blocks
            && sb.data_start == sb.journal_start + sb.journal_blocks
            && sb.bitmap_blocks == sb.blocks.div_ceil(BITS_PER_BITMAP_BLOCK)
            && sb.data_start < sb.blocks
            && sb.journal_blocks >= 16;
        if !consistent {
            return Err(corrupt("the superblock's layout does not add up"));
        }
        // Before version 5 the field is not there: the whole table is read.
        let sb = Superblock {
            inode_mark: if version >= 5 { f(9) } else { sb.inodes() },
            carry_stamp: if version >= 6 { f(10) } else { 0 },
            ..sb
        };
        if sb.inode_mark > sb.inodes() {
            return Err(corrupt(format!(
                "the superblock's inode mark {} lies past the table's {} slots",
                sb.inode_mark,
                sb.inodes()
            )));
        }
        if sb.blocks > device_blocks {
            return Err(corrupt(format!(
                "the file system has {} blocks but the device only {device_blocks}: it was made on a larger device",
                sb.blocks
            )));
        }
        Ok(sb)
    }
}

/// Where journal replay starts: the oldest transaction not yet written in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    /// Sequence number of the first transaction to replay.
    pub tail_seq: u64,
    /// Its position (block index inside the journal area).
    pub tail_pos: u64,
}

impl JournalHeader {
    /// The block image.
    pub fn encode(&self, volume_id: u64) -> Block {
        let mut b = zero_block();
        b[..8].copy_from_slice(HEADER_MAGIC);
        put_u64(&mut b[..], 8, volume_id);
        put_u64(&mut b[..], 16, self.tail_seq);
        put_u64(&mut b[..], 24, self.tail_pos);
        seal_sector(&mut b[..512]);
        b
    }

    /// Reads and checks a header image.
    pub fn decode(b: &[u8], sb: &Superblock) -> Result<JournalHeader> {
        if &b[..8] != HEADER_MAGIC || !sector_sealed(&b[..512]) || get_u64(b, 8) != sb.volume_id {
            return Err(corrupt("the journal header is damaged"));
        }
        let h = JournalHeader { tail_seq: get_u64(b, 16), tail_pos: get_u64(b, 24) };
        if h.tail_pos >= sb.journal_blocks {
            return Err(corrupt("the journal header points outside the journal"));
        }
        Ok(h)
    }
}

/// One run of a file's blocks: `len` blocks from file block `logical` at device block `physical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First block of the file it maps.
    pub logical: u32,
    /// Blocks.
    pub len: u32,
    /// First device block.
    pub physical: u64,
    /// Allocated but not yet written: reads as zeros.
    pub unwritten: bool,
}

impl Extent {
    /// One past the last file block it maps.
    pub fn end(&self) -> u64 {
        self.logical as u64 + self.len as u64
    }

    fn encode(&self, b: &mut [u8]) {
        put_u32(b, 0, self.logical);
        put_u32(b, 4, self.len);
        put_u64(b, 8, self.physical | if self.unwritten { UNWRITTEN } else { 0 });
    }

    fn decode(b: &[u8]) -> Extent {
        let p = get_u64(b, 8);
        Extent { logical: get_u32(b, 0), len: get_u32(b, 4), physical: p & !UNWRITTEN, unwritten: p & UNWRITTEN != 0 }
    }
}

/// The head of an inode ([`Inode::head`]): what names it and says its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head<'a> {
    /// Its name in its parent directory.
    pub name: &'a [u8],
    /// The slot of its parent directory, or [`ROOT`].
    pub parent: u32,
    /// File type and permission bits.
    pub mode: u32,
    /// Unlinked while open.
    pub orphan: bool,
    /// A hard link (its file's slot is in the rest of the inode).
    pub alias: bool,
    /// Extents in the inode itself.
    pub inline: usize,
    /// Extents in all (beyond [`INLINE_EXTENTS`]: overflow blocks hold the rest).
    pub total: usize,
}

/// What is wrong with the extents of a file of `size` bytes (`head` says
/// its kind), if anything: a FIFO holds none; each is inside the data area
/// and after the one before; none holds written data past the end (space
/// past it is only ever allocated ahead of appends, unwritten: written data
/// there is damage, and closing the file would free it as if it were not).
fn check_extents(
    head: &Head,
    size: u64,
    extents: impl Iterator<Item = Extent>,
    sb: &Superblock,
) -> Result<(), &'static str> {
    if head.mode & libc::S_IFMT == libc::S_IFIFO && (size != 0 || head.total != 0) {
        return Err("a FIFO with data");
    }
    let past_end = size.div_ceil(BLOCK as u64);
    let mut end = 0u64;
    for e in extents {
        let inside =
            e.physical >= sb.data_start && e.physical.checked_add(e.len as u64).is_some_and(|p| p <= sb.blocks);
        if e.len == 0 || (e.logical as u64) < end || !inside {
            return Err("extent out of order or outside the data area");
        }
        if !e.unwritten && e.end() > past_end {
            return Err("written data past the end of the file");
        }
        end = e.end();
    }
    Ok(())
}

/// A file or directory as stored in its inode (and overflow blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// Its name in its parent directory: 1 to [`MAX_NAME`] bytes, any but `/` and NUL.
    pub name: Vec<u8>,
    /// The slot of its parent directory, or [`ROOT`].
    pub parent: u32,
    /// File type and permission bits, as `st_mode` (`S_IFREG`, `S_IFDIR`,
    /// `S_IFLNK` or, from format 9, `S_IFIFO`).
    pub mode: u32,
    /// Unlinked while open: its blocks are freed at its last close, or at
    /// the next mount if a crash comes first.
    pub orphan: bool,
    /// Size in bytes (0 for a directory).
    pub size: u64,
    /// Last data change, nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
    /// Last inode change (name, mode, times, size), nanoseconds since the Unix epoch.
    pub ctime_ns: u64,
    /// Bumped each time the slot is reused.
    pub generation: u64,
    /// Sorted, non-overlapping extents.
    pub extents: Vec<Extent>,
    /// Overflow blocks holding the extents past the first [`INLINE_EXTENTS`], in order.
    pub overflow: Vec<u64>,
    /// A symbolic link's target (1 to [`MAX_LINK_TARGET`] bytes, no NUL;
    /// `size` is its length); empty for anything else.
    pub target: Vec<u8>,
    /// A hard link (format 8): this inode is only another name (`name` in
    /// `parent`) of the file in this slot, which holds everything else;
    /// `mode` is the file's type and the other fields are zero.
    pub alias_of: Option<u32>,
}

const INODE_IN_USE: u32 = 1;
const INODE_ORPHAN: u32 = 2;
/// The inode is a second name of another ([`Inode::alias_of`]).
const INODE_ALIAS: u32 = 4;
/// Where an alias keeps the slot of the file it names (plus one).
const AT_ALIAS_OF: usize = 52;
/// Permission bits of a regular file an older format made (its inode has no mode).
const OLD_FILE_MODE: u32 = libc::S_IFREG | 0o644;

impl Default for Inode {
    fn default() -> Inode {
        Inode {
            name: Vec::new(),
            parent: ROOT,
            mode: libc::S_IFREG | 0o644,
            orphan: false,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            generation: 0,
            extents: Vec::new(),
            overflow: Vec::new(),
            target: Vec::new(),
            alias_of: None,
        }
    }
}

impl Inode {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// Whether it is a symbolic link.
    pub fn is_link(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// Whether it is a named pipe (a FIFO): a name and an inode only; its
    /// bytes pass through a kernel pipe that stands for it.
    pub fn is_fifo(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFIFO
    }

    /// A hard link: another name, `name` in `parent`, of the file in slot
    /// `file` (whose type `mode` gives).
    pub fn alias(name: Vec<u8>, parent: u32, file: u32, mode: u32) -> Inode {
        Inode { name, parent, mode: mode & libc::S_IFMT, alias_of: Some(file), ..Inode::default() }
    }

    /// Overflow blocks needed for `extents` extents.
    pub fn overflow_needed(extents: usize) -> usize {
        extents.saturating_sub(INLINE_EXTENTS).div_ceil(OVERFLOW_EXTENTS)
    }

    /// Writes the inode into its 512-byte slot and its overflow blocks (as many as
    /// `self.overflow` names, which must be [`Inode::overflow_needed`]).
    pub fn encode(&self, slot: &mut [u8], overflow: &mut [Block]) {
        debug_assert_eq!(overflow.len(), Inode::overflow_needed(self.extents.len()));
        slot.fill(0);
        let alias = if self.alias_of.is_some() { INODE_ALIAS } else { 0 };
        put_u32(slot, 0, INODE_IN_USE | alias | if self.orphan { INODE_ORPHAN } else { 0 });
        put_u16(slot, 4, self.name.len() as u16);
        let inline = self.extents.len().min(INLINE_EXTENTS);
        put_u16(slot, 6, inline as u16);
        put_u64(slot, 8, self.size);
        put_u64(slot, 16, self.mtime_ns);
        put_u64(slot, 24, self.overflow.first().copied().unwrap_or(0));
        put_u64(slot, 32, self.generation);
        put_u32(slot, 40, self.extents.len() as u32);
        put_u32(slot, 44, if self.parent == ROOT { 0 } else { self.parent + 1 });
        put_u32(slot, 48, self.mode);
        put_u32(slot, AT_ALIAS_OF, self.alias_of.map_or(0, |f| f + 1));
        put_u64(slot, 56, self.ctime_ns);
        slot[64..64 + self.name.len()].copy_from_slice(&self.name);
        for (i, e) in self.extents[..inline].iter().enumerate() {
            e.encode(&mut slot[320 + 16 * i..336 + 16 * i]);
        }
        debug_assert!(self.target.is_empty() || (self.extents.is_empty() && self.target.len() <= MAX_LINK_TARGET));
        slot[LINK_START..LINK_START + self.target.len()].copy_from_slice(&self.target);
        seal_sector(&mut slot[..]);
        for (n, block) in overflow.iter_mut().enumerate() {
            block.fill(0);
            block[..4].copy_from_slice(OVERFLOW_MAGIC);
            let first = INLINE_EXTENTS + n * OVERFLOW_EXTENTS;
            let chunk = &self.extents[first..(first + OVERFLOW_EXTENTS).min(self.extents.len())];
            put_u32(&mut block[..], 4, chunk.len() as u32);
            put_u64(&mut block[..], 8, self.overflow.get(n + 1).copied().unwrap_or(0));
            for (i, e) in chunk.iter().enumerate() {
                e.encode(&mut block[16 + 16 * i..32 + 16 * i]);
            }
            let c = crc(&block[..BLOCK - 4]);
            put_u32(&mut block[..], BLOCK - 4, c);
        }
    }

    /// Clears a slot (the file is gone).
    pub fn encode_free(slot: &mut [u8]) {
        slot.fill(0);
    }

    /// Reads the head of slot `index` (flags, name, parent, mode, extent
    /// counts), checked as [`Inode::decode`] checks it, checksum included;
    /// `Ok(None)` for a free slot. A mount whose carried cache vouches for
    /// the table reads most inodes this far, and checks the rest without
    /// decoding it ([`Inode::check_plain`]).
    pub fn head<'a>(slot: &'a [u8], index: u64, sb: &Superblock) -> Result<Option<Head<'a>>> {
        if all_zero(slot) {
            return Ok(None);
        }
        let bad = |why: &str| corrupt(format!("inode {index} is damaged: {why}"));
        if !sector_sealed(slot) {
            return Err(bad("checksum mismatch"));
        }
        let flags = get_u32(slot, 0);
        if flags & INODE_IN_USE == 0 || flags & !(INODE_IN_USE | INODE_ORPHAN | INODE_ALIAS) != 0 {
            return Err(bad(&format!("unknown flags {flags:#x}")));
        }
        let name_len = get_u16(slot, 4) as usize;
        if name_len == 0 || name_len > MAX_NAME {
            return Err(bad("name length"));
        }
        let name = &slot[64..64 + name_len];
        if name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".." {
            return Err(bad("name holds '/' or NUL, or is '.' or '..'"));
        }
        let parent = match get_u32(slot, 44) {
            0 => ROOT,
            p if (p as u64) <= sb.inodes() && p as u64 - 1 != index => p - 1,
            _ => return Err(bad("parent directory out of range")),
        };
        let mode = match get_u32(slot, 48) {
            0 => OLD_FILE_MODE,
            m if matches!(m & libc::S_IFMT, libc::S_IFREG | libc::S_IFDIR | libc::S_IFLNK) => m,
            m if m & libc::S_IFMT == libc::S_IFIFO && sb.version >= 9 => m,
            _ => return Err(bad("neither a regular file, a directory, a symbolic link nor a FIFO")),
        };
        let inline = get_u16(slot, 6) as usize;
        let total = get_u32(slot, 40) as usize;
        if inline > INLINE_EXTENTS || inline > total || (total > INLINE_EXTENTS && inline != INLINE_EXTENTS) {
            return Err(bad("extent count"));
        }
        Ok(Some(Head {
            name,
            parent,
            mode,
            orphan: flags & INODE_ORPHAN != 0,
            alias: flags & INODE_ALIAS != 0,
            inline,
            total,
        }))
    }

    /// Reads slot `index`; `Ok(None)` for a free slot. `read_overflow` fetches an overflow block.
    pub fn decode(
        slot: &[u8],
        index: u64,
        mut read_overflow: impl FnMut(u64) -> Result<Block>,
        sb: &Superblock,
    ) -> Result<Option<Inode>> {
        let Some(head) = Inode::head(slot, index, sb)? else { return Ok(None) };
        let bad = |why: &str| corrupt(format!("inode {index} is damaged: {why}"));
        let (total, inline) = (head.total, head.inline);
        let mut inode = Inode {
            name: head.name.to_vec(),
            parent: head.parent,
            mode: head.mode,
            orphan: head.orphan,
            size: get_u64(slot, 8),
            mtime_ns: get_u64(slot, 16),
            ctime_ns: get_u64(slot, 56),
            generation: get_u64(slot, 32),
            extents: (0..inline).map(|i| Extent::decode(&slot[320 + 16 * i..336 + 16 * i])).collect(),
            overflow: Vec::new(),
            target: Vec::new(),
            alias_of: None,
        };
        if head.alias {
            let file = get_u32(slot, AT_ALIAS_OF);
            let plain = total == 0 && inode.size == 0 && !inode.orphan && !inode.is_dir() && inode.mode & 0o7777 == 0;
            if file == 0 || file as u64 > sb.inodes() || file as u64 - 1 == index || !plain {
                return Err(bad("a hard link that names no other inode, or holds more than a name"));
            }
            inode.alias_of = Some(file - 1);
            return Ok(Some(inode));
        }
        if inode.is_link() {
            let len = inode.size as usize;
            if total != 0 || inode.orphan || !(1..=MAX_LINK_TARGET).contains(&len) {
                return Err(bad("a symbolic link with extents, an orphan flag or a target of a wrong length"));
            }
            inode.target = slot[LINK_START..LINK_START + len].to_vec();
            if inode.target.contains(&0) {
                return Err(bad("a symbolic link's target holds a NUL byte"));
            }
            return Ok(Some(inode));
        }
        let mut next = get_u64(slot, 24);
        while inode.extents.len() < total {
            if next < sb.data_start || next >= sb.blocks || inode.overflow.len() > total {
                return Err(bad("overflow block number out of range"));
            }
            let block = read_overflow(next)?;
            if &block[..4] != OVERFLOW_MAGIC || crc(&block[..BLOCK - 4]) != get_u32(&block[..], BLOCK - 4) {
                return Err(bad("overflow block checksum mismatch"));
            }
            let count = get_u32(&block[..], 4) as usize;
            if count == 0 || count > OVERFLOW_EXTENTS || inode.extents.len() + count > total {
                return Err(bad("overflow extent count"));
            }
            inode.overflow.push(next);
            inode.extents.extend((0..count).map(|i| Extent::decode(&block[16 + 16 * i..32 + 16 * i])));
            next = get_u64(&block[..], 8);
        }
        if inode.overflow.len() != Inode::overflow_needed(total) {
            return Err(bad("overflow chain length"));
        }
        if inode.is_dir() && (inode.size != 0 || total != 0 || inode.orphan) {
            return Err(bad("a directory with data or an orphan flag"));
        }
        check_extents(&head, inode.size, inode.extents.iter().copied(), sb).map_err(bad)?;
        Ok(Some(inode))
    }

    /// Checks what [`Inode::decode`] checks of a plain file's inode (a
    /// regular file or FIFO, no hard link, no overflow blocks) past its
    /// `head`, building nothing: its extents in order, inside the data area,
    /// and none written past its end. A mount the carried cache vouches for
    /// reads such an inode this far only; its node decodes it whole later.
    pub fn check_plain(slot: &[u8], index: u64, head: &Head, sb: &Superblock) -> Result<()> {
        debug_assert!(head.total <= INLINE_EXTENTS && !head.alias);
        let extents = (0..head.inline).map(|i| Extent::decode(&slot[320 + 16 * i..336 + 16 * i]));
        let done = if head.inline != head.total { Err("overflow chain length") } else { Ok(()) };
        done.and_then(|()| check_extents(head, get_u64(slot, 8), extents, sb))
            .map_err(|why| corrupt(format!("inode {index} is damaged: {why}")))
    }
}

/// A journal descriptor: the home blocks of the images that follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Transaction sequence number.
    pub seq: u64,
    /// Home block of each image that follows, in order.
    pub targets: Vec<u64>,
    /// Whether the commit block follows the images (else another descriptor).
    pub last: bool,
}

impl Descriptor {
    /// The block image.
    pub fn encode(&self, volume_id: u64) -> Block {
        debug_assert!(self.targets.len() <= DESCRIPTOR_TARGETS);
        let mut b = zero_block();
        b[..8].copy_from_slice(DESC_MAGIC);
        put_u64(&mut b[..], 8, volume_id);
        put_u64(&mut b[..], 16, self.seq);
        put_u32(&mut b[..], 24, self.targets.len() as u32);
        put_u32(&mut b[..], 28, self.last as u32);
        for (i, t) in self.targets.iter().enumerate() {
            put_u64(&mut b[..], 32 + 8 * i, *t);
        }
        let c = crc(&b[..BLOCK - 4]);
        put_u32(&mut b[..], BLOCK - 4, c);
        b
    }

    /// Reads a descriptor of transaction `seq`; `None` if the block is anything else.
    pub fn decode(b: &[u8], volume_id: u64, seq: u64) -> Option<Descriptor> {
        if &b[..8] != DESC_MAGIC || get_u64(b, 8) != volume_id || get_u64(b, 16) != seq {
            return None;
        }
        if crc(&b[..BLOCK - 4]) != get_u32(b, BLOCK - 4) {
            return None;
        }
        let count = get_u32(b, 24) as usize;
        if count > DESCRIPTOR_TARGETS {
            return None;
        }
        Some(Descriptor {
            seq,
            targets: (0..count).map(|i| get_u64(b, 32 + 8 * i)).collect(),
            last: get_u32(b, 28) == 1,
        })
    }
}

/// The commit block: transaction `seq` of `blocks` journal blocks whose CRC is `data_crc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Transaction sequence number.
    pub seq: u64,
    /// Journal blocks of the transaction before the commit block.
    pub blocks: u32,
    /// CRC over those blocks, in order.
    pub data_crc: u32,
    /// A compact transaction (version 2): no descriptor; the blocks before
    /// the commit are images of these home blocks, in order. `None`: the
    /// transaction starts with a descriptor.
    pub targets: Option<Vec<u64>>,
}

impl Commit {
    /// The block image.
    pub fn encode(&self, volume_id: u64) -> Block {
        let mut b = zero_block();
        b[..8].copy_from_slice(COMMIT_MAGIC);
        put_u64(&mut b[..], 8, volume_id);
        put_u64(&mut b[..], 16, self.seq);
        put_u32(&mut b[..], 24, self.blocks);
        put_u32(&mut b[..], 28, self.data_crc);
        if let Some(targets) = &self.targets {
            debug_assert!(targets.len() <= COMMIT_TARGETS && targets.len() == self.blocks as usize);
            put_u32(&mut b[..], 32, 1);
            put_u32(&mut b[..], 36, targets.len() as u32);
            for (i, t) in targets.iter().enumerate() {
                put_u64(&mut b[..], 40 + 8 * i, *t);
            }
        }
        seal_sector(&mut b[..512]);
        b
    }

    /// Reads the commit of transaction `seq`; `None` if the block is anything else.
    pub fn decode(b: &[u8], volume_id: u64, seq: u64) -> Option<Commit> {
        if &b[..8] != COMMIT_MAGIC || get_u64(b, 8) != volume_id || get_u64(b, 16) != seq || !sector_sealed(&b[..512]) {
            return None;
        }
        let blocks = get_u32(b, 24);
        let targets = match get_u32(b, 32) {
            0 => None,
            1 => {
                let count = get_u32(b, 36) as usize;
                if count > COMMIT_TARGETS || count != blocks as usize {
                    return None;
                }
                Some((0..count).map(|i| get_u64(b, 40 + 8 * i)).collect())
            }
            _ => return None,
        };
        Some(Commit { seq, blocks, data_crc: get_u32(b, 28), targets })
    }
}

/// Checks a name of one directory entry: 1 to 255 bytes, no `/` and no
/// NUL (`EINVAL`; `ENAMETOOLONG` if longer).
pub fn check_name(name: &[u8]) -> Result<()> {
    let errno = if name.len() > MAX_NAME {
        libc::ENAMETOOLONG
    } else if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        libc::EINVAL
    } else {
        return Ok(());
    };
    Err(Error::File {
        op: "name",
        name: String::from_utf8_lossy(&name[..name.len().min(64)]).into_owned(),
        errno,
        why: format!("a name is 1 to {MAX_NAME} bytes, any byte but '/' and NUL"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock::layout(1 << 16, 64, 64, 42).unwrap()
    }

    #[test]
    fn superblock_round_trips_and_damage_is_named() {
        let s = sb();
        let b = s.encode();
        assert_eq!(Superblock::decode(&b[..], 1 << 16).unwrap(), s);
        let mut torn = b.clone();
        torn[20] ^= 1;
        assert!(Superblock::decode(&torn[..], 1 << 16).unwrap_err().to_string().contains("checksum"));
        assert!(Superblock::decode(&zero_block()[..], 1 << 16).unwrap_err().to_string().contains("iopath mkfs"));
        assert!(Superblock::decode(&b[..], 1 << 10).unwrap_err().to_string().contains("larger device"));
    }

    #[test]
    fn inode_round_trips_with_overflow_blocks() {
        let s = sb();
        let extents: Vec<Extent> = (0..300u32)
            .map(|i| Extent {
                logical: i * 2,
                len: 1,
                physical: s.data_start + 10 + i as u64 * 2,
                unwritten: i % 7 == 0,
            })
            .collect();
        let inode = Inode {
            name: "é-file ".as_bytes().iter().copied().chain([0xff, 0xfe]).collect(),
            parent: 7,
            mode: libc::S_IFREG | 0o600,
            orphan: true,
            size: 600 * 4096,
            mtime_ns: 5,
            ctime_ns: 6,
            generation: 3,
            extents,
            overflow: vec![s.data_start, s.data_start + 1],
            target: Vec::new(),
            alias_of: None,
        };
        let mut slot = [0u8; INODE_SIZE];
        let mut blocks = vec![zero_block(), zero_block()];
        assert_eq!(Inode::overflow_needed(300), 2);
        inode.encode(&mut slot, &mut blocks);
        let back = Inode::decode(&slot, 0, |n| Ok(blocks[(n - s.data_start) as usize].clone()), &s).unwrap().unwrap();
        assert_eq!(back, inode);
        slot[100] ^= 1;
        assert!(Inode::decode(&slot, 0, |_| Ok(zero_block()), &s).is_err());
        assert_eq!(Inode::decode(&[0u8; INODE_SIZE], 0, |_| Ok(zero_block()), &s).unwrap(), None);
    }

    #[test]
    fn a_hard_link_is_a_name_and_the_slot_it_names() {
        let s = sb();
        let decode = |inode: &Inode, index: u64| {
            let mut slot = [0u8; INODE_SIZE];
            inode.encode(&mut slot, &mut Vec::new());
            Inode::decode(&slot, index, |_| Ok(zero_block()), &s)
        };
        let alias = Inode::alias(b"second".to_vec(), 3, 9, libc::S_IFREG | 0o640);
        assert_eq!((alias.mode, alias.alias_of), (libc::S_IFREG, Some(9)));
        assert_eq!(decode(&alias, 4).unwrap(), Some(alias.clone()));
        let to_link = Inode::alias(b"l".to_vec(), ROOT, 0, libc::S_IFLNK | 0o777);
        assert_eq!(decode(&to_link, 4).unwrap(), Some(to_link));
        // Naming itself, or a slot past the table, or holding data: damage.
        let e = decode(&alias, 9).unwrap_err().to_string();
        assert!(e.contains("hard link"), "{e}");
        assert!(decode(&Inode { alias_of: Some(s.inodes() as u32), ..alias.clone() }, 4).is_err());
        assert!(decode(&Inode { size: 1, ..alias.clone() }, 4).is_err());
        assert!(decode(&Inode { mode: libc::S_IFDIR, ..alias }, 4).is_err());
    }

    #[test]
    fn a_symbolic_link_keeps_its_target_in_its_inode() {
        let s = sb();
        let target: Vec<u8> = (1..=MAX_LINK_TARGET).map(|i| (i % 255) as u8 + 1).collect();
        let link = |target: &[u8]| Inode {
            name: b"l".to_vec(),
            mode: libc::S_IFLNK | 0o777,
            size: target.len() as u64,
            target: target.to_vec(),
            ..Inode::default()
        };
        let decode = |inode: &Inode| {
            let mut slot = [0u8; INODE_SIZE];
            inode.encode(&mut slot, &mut Vec::new());
            Inode::decode(&slot, 4, |_| Ok(zero_block()), &s)
        };
        for t in [&b"x"[..], b"../a/b", &target] {
            assert_eq!(decode(&link(t)).unwrap(), Some(link(t)));
        }
        let mut slot = [0u8; INODE_SIZE];
        link(b"abc").encode(&mut slot, &mut Vec::new());
        slot[LINK_START + 1] = 0;
        seal_sector(&mut slot[..]);
        let e = Inode::decode(&slot, 4, |_| Ok(zero_block()), &s).unwrap_err().to_string();
        assert!(e.contains("holds a NUL byte"), "{e}");
        let mut empty = link(b"");
        empty.size = 0;
        let e = decode(&empty).unwrap_err().to_string();
        assert!(e.contains("wrong length"), "{e}");
    }

    #[test]
    fn a_fifo_inode_is_one_from_format_9_and_holds_no_data() {
        let fifo = Inode { name: b"p".to_vec(), mode: libc::S_IFIFO | 0o640, ..Inode::default() };
        let decode = |inode: &Inode, version: u32| {
            let mut slot = [0u8; INODE_SIZE];
            inode.encode(&mut slot, &mut Vec::new());
            Inode::decode(&slot, 3, |_| Ok(zero_block()), &Superblock { version, ..sb() })
        };
        let back = decode(&fifo, 9).unwrap().unwrap();
        assert!(back.is_fifo() && !back.is_link() && !back.is_dir() && back == fifo);
        let e = decode(&fifo, 8).unwrap_err().to_string();
        assert!(e.contains("inode 3 is damaged: neither a regular file"), "an older format has none: {e}");
        let e = decode(&Inode { size: 1, ..fifo.clone() }, 9).unwrap_err().to_string();
        assert!(e.contains("a FIFO with data"), "{e}");
    }

    #[test]
    fn all_zero_sees_a_byte_anywhere_in_a_block_or_a_short_tail() {
        for len in [0, 7, 64, 100, 512, BLOCK] {
            let mut b = vec![0u8; len];
            assert!(all_zero(&b), "{len} zero bytes");
            for at in 0..len {
                b[at] = 0x80;
                assert!(!all_zero(&b), "a byte at {at} of {len}");
                b[at] = 0;
            }
        }
    }

    #[test]
    fn written_data_past_the_end_of_a_file_is_damage_unwritten_space_is_not() {
        let s = sb();
        let inode = |unwritten: bool| Inode {
            name: b"f".to_vec(),
            size: 4096 + 1, // two blocks
            extents: vec![
                Extent { logical: 0, len: 2, physical: s.data_start, unwritten: false },
                Extent { logical: 2, len: 3, physical: s.data_start + 2, unwritten },
            ],
            ..Inode::default()
        };
        let decode = |inode: &Inode| {
            let mut slot = [0u8; INODE_SIZE];
            inode.encode(&mut slot, &mut Vec::new());
            Inode::decode(&slot, 4, |_| Ok(zero_block()), &s)
        };
        assert_eq!(decode(&inode(true)).unwrap(), Some(inode(true)), "space allocated ahead of appends");
        let e = decode(&inode(false)).unwrap_err().to_string();
        assert!(e.contains("inode 4 is damaged: written data past the end"), "{e}");
    }

    #[test]
    fn journal_records_are_recognised_only_for_their_volume_and_sequence() {
        let d = Descriptor { seq: 9, targets: vec![3, 4, 5], last: true };
        let b = d.encode(42);
        assert_eq!(Descriptor::decode(&b[..], 42, 9), Some(d));
        assert_eq!(Descriptor::decode(&b[..], 42, 10), None);
        assert_eq!(Descriptor::decode(&b[..], 43, 9), None);
        let c = Commit { seq: 9, blocks: 4, data_crc: 77, targets: None };
        assert_eq!(Commit::decode(&c.encode(42)[..], 42, 9), Some(c));
        let targets: Vec<u64> = (0..COMMIT_TARGETS as u64).map(|i| 1000 + i).collect();
        let compact = Commit { seq: 9, blocks: COMMIT_TARGETS as u32, data_crc: 78, targets: Some(targets) };
        assert_eq!(Commit::decode(&compact.encode(42)[..], 42, 9), Some(compact.clone()));
        let mut torn = compact.encode(42);
        torn[100] ^= 1;
        assert_eq!(Commit::decode(&torn[..], 42, 9), None, "a torn target list is not trusted");
        assert_eq!(Commit::decode(&b[..], 42, 9), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"a").is_ok());
        assert!(check_name(&[0xff, b'\n', b' ']).is_ok(), "any byte but '/' and NUL");
        assert!(check_name(&[b'n'; MAX_NAME]).is_ok());
        for bad in [&b""[..], b"a/b", b"x\0"] {
            assert_eq!(check_name(bad).unwrap_err().errno(), Some(libc::EINVAL), "{bad:?}");
        }
        assert_eq!(check_name(&[b'n'; MAX_NAME + 1]).unwrap_err().errno(), Some(libc::ENAMETOOLONG));
    }

    #[test]
    fn older_inodes_read_as_files_in_the_root_and_directories_hold_no_data() {
        let s = sb();
        let mut slot = [0u8; INODE_SIZE];
        Inode { name: b"old".to_vec(), parent: 3, ..Inode::default() }.encode(&mut slot, &mut []);
        slot[44..64].fill(0); // what versions 1 and 2 wrote there
        seal_sector(&mut slot);
        let old = Inode::decode(&slot, 0, |_| Ok(zero_block()), &s).unwrap().unwrap();
        assert_eq!((old.parent, old.mode, old.is_dir()), (ROOT, libc::S_IFREG | 0o644, false));
        let dir = Inode { name: b"d".to_vec(), mode: libc::S_IFDIR | 0o755, size: 4096, ..Inode::default() };
        dir.encode(&mut slot, &mut []);
        let e = Inode::decode(&slot, 0, |_| Ok(zero_block()), &s).unwrap_err().to_string();
        assert!(e.contains("directory with data"), "{e}");
        let own_parent = Inode { name: b"x".to_vec(), parent: 5, ..Inode::default() };
        own_parent.encode(&mut slot, &mut []);
        assert!(Inode::decode(&slot, 5, |_| Ok(zero_block()), &s).is_err(), "an inode is not its own parent");
    }

    proptest::proptest! {
        /// A plain file's inode, damaged and sealed again (so that only the
        /// fields can tell): the head and `check_plain` refuse exactly what
        /// decoding it whole refuses (a mount the carried cache vouches for
        /// checks it so, and decodes it only when its node is built).
        #[test]
        fn a_plain_inode_checked_without_decoding_is_refused_as_decoding_refuses(
            extents in 0usize..=INLINE_EXTENTS,
            fifo in proptest::bool::ANY,
            // The header's fields and the inline extents.
            damage in proptest::collection::vec((proptest::prop_oneof![0usize..64, 320usize..496], proptest::num::u8::ANY), 0..4),
        ) {
            let s = sb();
            let extents: Vec<Extent> = (0..extents as u32)
                .map(|i| Extent { logical: i * 3, len: 2, physical: s.data_start + 40 * i as u64, unwritten: i % 3 == 2 })
                .collect();
            let inode = Inode {
                name: b"plain".to_vec(),
                mode: if fifo && extents.is_empty() { libc::S_IFIFO | 0o600 } else { libc::S_IFREG | 0o644 },
                size: extents.last().map_or(0, |e| e.end() * 4096 - 100),
                extents,
                ..Inode::default()
            };
            let mut slot = [0u8; INODE_SIZE];
            inode.encode(&mut slot, &mut []);
            for (at, byte) in damage {
                slot[at] = byte;
            }
            seal_sector(&mut slot);
            let whole = Inode::decode(&slot, 3, |_| Err(corrupt("no overflow blocks here")), &s);
            match Inode::head(&slot, 3, &s) {
                Ok(Some(head)) if matches!(head.mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFIFO)
                    && !head.alias && head.total <= INLINE_EXTENTS =>
                {
                    let checked = Inode::check_plain(&slot, 3, &head, &s);
                    proptest::prop_assert_eq!(checked.is_ok(), whole.is_ok(), "{:?} against {:?}", checked, whole);
                }
                Ok(None) => proptest::prop_assert!(matches!(whole, Ok(None))),
                Ok(Some(_)) => {} // not a plain file: decoded whole at every mount
                Err(_) => proptest::prop_assert!(whole.is_err()),
            }
        }
    }
}
