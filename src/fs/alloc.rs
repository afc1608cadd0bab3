//! Free space: the on-device bitmap (as block images the journal writes) and
//! the blocks freed in transactions that are not yet committed.
//!
//! A block freed by a running transaction must not be handed out again
//! before that transaction is durable: if the machine stopped in between,
//! recovery would bring back the file that owned it, now holding someone
//! else's data. So a free clears the bit in the bitmap image (what the next
//! commit writes) and sets it in `held`, and only [`Allocator::release`],
//! called once the freeing transaction is committed, lets it be allocated.
//!
//! A mounted file system reads its bitmap lazily ([`Allocator::lazy`]): a
//! block of the bitmap is read from the device the first time a check, a
//! free, a count or an allocation's search needs it (a search reads on from
//! where it stands, more blocks at a time the further it goes). A program
//! that only reads (`ls`, `stat`, `cat`) reads the part that covers the
//! files it has, and one that writes on a device with room a block or two
//! more, not 4 MiB per 128 GiB of device: a mount of an empty 512 GiB
//! device read and faulted in all 16 MiB of it, 32 ms per process. A block
//! of the bitmap not read yet is as the mount found it on the device: only
//! this process changes it, and only after reading it.

use super::disk::BlockReader;
use super::format::{BITS_PER_BITMAP_BLOCK, BLOCK, Block, zero_block};
use crate::buffer::IoBuf;
use crate::error::Result;

/// How many bitmap blocks a search reads at once where it comes to some not
/// read yet: one, then twice as many each time, up to [`READ_RUN_BLOCKS`]
/// (a device with room is found so after a block or two; a full one is
/// read in runs, not a request per block).
#[derive(Debug, Default)]
struct Ahead(usize);

impl Ahead {
    fn next(&mut self) -> usize {
        self.0 = (self.0 * 2).clamp(1, READ_RUN_BLOCKS);
        self.0
    }
}

/// Bitmap block images, `None` where not read from the device yet.
type Images = [Option<Block>];

/// Where a lazily read bitmap comes from: the device, at block `start`.
struct Source {
    reader: BlockReader,
    start: u64,
}

/// Most bitmap blocks read at once (1 MiB: 32 GiB of device).
const READ_RUN_BLOCKS: usize = 256;

/// The free-space bitmap of a mounted file system.
pub struct Allocator {
    /// Bitmap block images (1 = in use), as on the device; `None` until read.
    images: Vec<Option<Block>>,
    /// Images still `None`.
    unread: usize,
    /// Where they are read from (none: every image was given).
    source: Option<Source>,
    /// 1 = freed by a transaction not yet committed: not to be allocated.
    held: Vec<u64>,
    blocks: u64,
    data_start: u64,
    /// Where the next search starts when the caller has no goal.
    cursor: u64,
    /// Blocks that may be allocated now, among those whose bitmap block has
    /// been read (all of them once `unread` is 0).
    free: u64,
    held_count: u64,
    /// The shortest run a search found no free run of since blocks last
    /// became allocatable: longer ones are not looked for again until then
    /// (on a full, fragmented device each search would read the whole bitmap).
    run_miss: Option<u64>,
}

/// Bitmap block `block`'s image, which must have been read.
fn image(images: &Images, block: usize) -> &Block {
    images[block].as_ref().expect("a bitmap block is read before its bits are used")
}

fn bit(images: &Images, n: u64) -> bool {
    let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
    let i = (n % BITS_PER_BITMAP_BLOCK) as usize;
    image(images, block)[i / 8] & (1 << (i % 8)) != 0
}

/// Blocks in `[from, to)` marked in use: whole bytes counted at once (a
/// mount of a 3 GiB device counted its 786,432 bits one by one: a tenth of
/// a short program's time on a mount).
fn marked_in(images: &Images, from: u64, to: u64) -> u64 {
    let mut n = from;
    let mut marked = 0;
    while n < to {
        let (block, i) = ((n / BITS_PER_BITMAP_BLOCK) as usize, (n % BITS_PER_BITMAP_BLOCK) as usize);
        if i % 8 == 0 && to - n >= 8 {
            // Whole bytes to the end of this bitmap block or of the range.
            let count = ((BITS_PER_BITMAP_BLOCK as usize - i) / 8).min(((to - n) / 8) as usize);
            let bytes = &image(images, block)[i / 8..i / 8 + count];
            marked += bytes.iter().map(|b| b.count_ones() as u64).sum::<u64>();
            n += count as u64 * 8;
        } else {
            marked += u64::from(bit(images, n));
            n += 1;
        }
    }
    marked
}

fn set_bit(images: &mut Images, n: u64, on: bool) {
    let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
    let i = (n % BITS_PER_BITMAP_BLOCK) as usize;
    let image = images[block].as_mut().expect("a bitmap block is read before its bits change");
    if on {
        image[i / 8] |= 1 << (i % 8);
    } else {
        image[i / 8] &= !(1 << (i % 8));
    }
}

impl Allocator {
    /// A bitmap for a fresh file system: the metadata blocks `[0, data_start)` in use.
    pub fn fresh(blocks: u64, data_start: u64) -> Allocator {
        let images = (0..blocks.div_ceil(BITS_PER_BITMAP_BLOCK)).map(|_| zero_block()).collect();
        let mut a = Allocator::from_images(images, blocks, data_start);
        for n in 0..data_start {
            set_bit(&mut a.images, n, true);
        }
        a.free = blocks - data_start;
        a
    }

    /// The allocator over bitmap images read from the device (all of them).
    pub fn from_images(images: Vec<Block>, blocks: u64, data_start: u64) -> Allocator {
        let images: Vec<Option<Block>> = images.into_iter().map(Some).collect();
        let free = (blocks - data_start) - marked_in(&images, data_start, blocks);
        Allocator { free, ..Allocator::over(images, 0, None, blocks, data_start) }
    }

    /// The allocator over the `bitmap_blocks` blocks of bitmap at block
    /// `bitmap_start` of `reader`'s device, read when first needed (see the
    /// module's doc): [`Allocator::read_covering`] before a look at some
    /// blocks' bits, [`Allocator::read_all`] (which allocating and counting
    /// do themselves) for all of them.
    pub fn lazy(reader: BlockReader, bitmap_start: u64, bitmap_blocks: u64, blocks: u64, data_start: u64) -> Allocator {
        let source = Source { reader, start: bitmap_start };
        let images = (0..bitmap_blocks).map(|_| None).collect();
        Allocator::over(images, bitmap_blocks as usize, Some(source), blocks, data_start)
    }

    fn over(
        images: Vec<Option<Block>>,
        unread: usize,
        source: Option<Source>,
        blocks: u64,
        data_start: u64,
    ) -> Allocator {
        Allocator {
            images,
            unread,
            source,
            // (Zeroed: on a large device, pages the kernel maps only where a block is held.)
            held: vec![0; blocks.div_ceil(64) as usize],
            blocks,
            data_start,
            cursor: data_start,
            free: 0,
            held_count: 0,
            run_miss: None,
        }
    }

    /// Reads the bitmap blocks that cover blocks `[start, start + len)` (those
    /// inside the device) and have not been read yet.
    pub fn read_covering(&mut self, start: u64, len: u64) -> Result<()> {
        let end = start.saturating_add(len).min(self.blocks);
        if self.unread == 0 || start >= end {
            return Ok(());
        }
        let (first, last) = ((start / BITS_PER_BITMAP_BLOCK) as usize, ((end - 1) / BITS_PER_BITMAP_BLOCK) as usize);
        let mut i = first;
        while i <= last {
            if self.images[i].is_some() {
                i += 1;
                continue;
            }
            let run = (i..=last).take(READ_RUN_BLOCKS).take_while(|&j| self.images[j].is_none()).count();
            self.read_run(i, run)?;
            i += run;
        }
        Ok(())
    }

    /// Reads every bitmap block not read yet.
    pub fn read_all(&mut self) -> Result<()> {
        self.read_covering(0, self.blocks)
    }

    /// Reads bitmap blocks `[first, first + count)`, none of them read yet, in one request.
    fn read_run(&mut self, first: usize, count: usize) -> Result<()> {
        let Some(source) = &self.source else {
            return Err(super::format::corrupt("a bitmap block was neither given nor readable"));
        };
        let mut buf = IoBuf::for_overwrite(count * BLOCK);
        source.reader.read(source.start + first as u64, &mut buf)?;
        for (k, chunk) in buf.chunks(BLOCK).enumerate() {
            let i = first + k;
            let mut image = zero_block();
            image.copy_from_slice(chunk);
            debug_assert!(self.images[i].is_none(), "bitmap block {i} read twice");
            self.images[i] = Some(image);
            self.unread -= 1;
            // Its blocks in the data area count as free from now on, if not in use
            // (none of them can be held: nothing was freed there before it was read).
            let from = (i as u64 * BITS_PER_BITMAP_BLOCK).max(self.data_start);
            let to = ((i as u64 + 1) * BITS_PER_BITMAP_BLOCK).min(self.blocks);
            if from < to {
                self.free += (to - from) - marked_in(&self.images, from, to);
            }
        }
        Ok(())
    }

    /// Whether block `n` is marked in use (its bitmap block read: see
    /// [`Allocator::read_covering`]).
    pub fn in_use(&self, n: u64) -> bool {
        bit(&self.images, n)
    }

    /// Whether block `n` may be in use: false only for a block known free. A
    /// block whose bitmap block was not read is as the mount found it, and
    /// nothing freed it since (a free reads the bitmap first).
    pub fn maybe_in_use(&self, n: u64) -> bool {
        let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
        n >= self.blocks || self.images[block].is_none() || bit(&self.images, n)
    }

    /// Whether every block of `[start, start + len)` is marked in use
    /// (counted a byte of the bitmap at a time; false past the device's end;
    /// the bitmap blocks that cover it read: see [`Allocator::read_covering`]).
    pub fn all_in_use(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        end <= self.blocks && marked_in(&self.images, start, end) == len
    }

    /// Blocks that may be allocated now (counted over the bitmap blocks read:
    /// all of them once anything was allocated).
    pub fn allocatable(&self) -> u64 {
        self.free
    }

    /// Blocks not in use: allocatable now, or once the transaction (or
    /// checkpoint) that freed them is done. Reads the whole bitmap.
    pub fn free_blocks(&mut self) -> Result<u64> {
        self.read_all()?;
        Ok(self.free + self.held_count)
    }

    /// Blocks freed that may not be allocated yet: until the transaction (or
    /// checkpoint) that freed them is done.
    pub fn held_blocks(&self) -> u64 {
        self.held_count
    }

    fn held(&self, n: u64) -> bool {
        self.held[(n / 64) as usize] & (1 << (n % 64)) != 0
    }

    fn available(&self, n: u64) -> bool {
        !bit(&self.images, n) && !self.held(n)
    }

    /// Whether data block `n` could be allocated now (false where its
    /// bitmap block was not read).
    pub fn is_free(&self, n: u64) -> bool {
        n >= self.data_start
            && n < self.blocks
            && self.images[(n / BITS_PER_BITMAP_BLOCK) as usize].is_some()
            && self.available(n)
    }

    /// Allocates up to `want` contiguous blocks: at `goal` when it is free (to
    /// extend a file in place), else at the first free run of at least
    /// `min_run` blocks after the cursor (a file that streams wants one piece,
    /// not the holes small files left), else, when no run that long is left,
    /// at the next free block. Returns the run; `dirty` is told each bitmap
    /// block it changed. `None` when the device is full. Reads the part of a
    /// lazily read bitmap it looks at first (an error if that read fails):
    /// the search reads on from where it stands, so on a device with room a
    /// writer reads a few blocks of the bitmap, not all of it (16 MiB on a
    /// 512 GiB device, 33 ms of every process that wrote).
    pub fn allocate(
        &mut self,
        want: u64,
        min_run: u64,
        goal: Option<u64>,
        dirty: &mut impl FnMut(u64),
    ) -> Result<Option<(u64, u64)>> {
        if want == 0 || (self.unread == 0 && self.free == 0) {
            return Ok(None);
        }
        let goal = goal.filter(|&g| g >= self.data_start && g < self.blocks);
        if let Some(g) = goal {
            self.read_covering(g, want)?;
        }
        let start = match goal.filter(|&g| self.available(g)) {
            Some(g) => g,
            None => match self.find_long_run(min_run)? {
                Some(s) => s,
                None => match self.find_run(1)? {
                    Some(s) => s,
                    None => return Ok(None),
                },
            },
        };
        self.read_covering(start, want)?;
        let mut len = 0;
        while len < want && start + len < self.blocks && self.available(start + len) {
            set_bit(&mut self.images, start + len, true);
            dirty((start + len) / BITS_PER_BITMAP_BLOCK);
            len += 1;
        }
        debug_assert!(len > 0);
        self.free -= len;
        self.cursor = start + len;
        Ok(Some((start, len)))
    }

    /// Reads bitmap blocks not read yet, from the cursor's on (then from the
    /// start), until at least `n` blocks are known allocatable or every block
    /// is read; returns [`Allocator::allocatable`]. For a decision that wants
    /// to know there is room (how much an append preallocates).
    pub fn read_until_allocatable(&mut self, n: u64) -> Result<u64> {
        let first = (self.cursor.min(self.blocks.saturating_sub(1)) / BITS_PER_BITMAP_BLOCK) as usize;
        let order = (first..self.images.len()).chain(0..first);
        let mut ahead = Ahead::default();
        for i in order {
            if self.free >= n || self.unread == 0 {
                break;
            }
            self.read_ahead(i, self.images.len(), &mut ahead)?;
        }
        Ok(self.free)
    }

    /// If bitmap block `i` is not read yet, reads it and the unread blocks
    /// after it (below `end`), as many as `ahead` says: 1 the first time in
    /// a search, twice as many each time after, up to [`READ_RUN_BLOCKS`].
    fn read_ahead(&mut self, i: usize, end: usize, ahead: &mut Ahead) -> Result<()> {
        if self.images[i].is_some() {
            return Ok(());
        }
        let count = (i..end).take(ahead.next()).take_while(|&j| self.images[j].is_none()).count();
        self.read_run(i, count)
    }

    /// [`Allocator::find_run`] of `min_run` blocks (more than one), unless a
    /// search for no more than that found none and nothing was freed since.
    fn find_long_run(&mut self, min_run: u64) -> Result<Option<u64>> {
        if min_run <= 1 || self.run_miss.is_some_and(|m| min_run >= m) {
            return Ok(None);
        }
        let found = self.find_run(min_run)?;
        if found.is_none() {
            self.run_miss = Some(min_run);
        }
        Ok(found)
    }

    /// The first block of a free run of `len` blocks, from the cursor on
    /// (then from the start of the data area up to it). A miss has read the
    /// whole bitmap.
    fn find_run(&mut self, len: u64) -> Result<Option<u64>> {
        let cursor = self.cursor.clamp(self.data_start, self.blocks);
        let mut ahead = Ahead::default();
        if let Some(found) = self.find_run_in(cursor, self.blocks, len, &mut ahead)? {
            return Ok(Some(found));
        }
        self.find_run_in(self.data_start, cursor, len, &mut ahead)
    }

    /// The first free run of `len` blocks inside `[from, to)`, a word of the
    /// bitmap at a time, reading the bitmap blocks it comes to ([`Allocator::read_ahead`]).
    fn find_run_in(&mut self, from: u64, to: u64, len: u64, ahead: &mut Ahead) -> Result<Option<u64>> {
        let (mut run_start, mut run_len) = (from, 0u64);
        let mut n = from;
        let last_block = (to.saturating_sub(1) / BITS_PER_BITMAP_BLOCK) as usize + 1;
        while n < to {
            if n == from || n.is_multiple_of(BITS_PER_BITMAP_BLOCK) {
                self.read_ahead((n / BITS_PER_BITMAP_BLOCK) as usize, last_block, ahead)?;
            }
            let word = n / 64;
            let used = self.used_word(word);
            let first = n % 64;
            let last = (to - word * 64).min(64);
            if used == 0 && first == 0 && last == 64 {
                run_len += 64; // a whole free word
                if run_len >= len {
                    return Ok(Some(run_start));
                }
            } else {
                for i in first..last {
                    if used & (1 << i) != 0 {
                        run_len = 0;
                        run_start = word * 64 + i + 1;
                    } else {
                        run_len += 1;
                    }
                    if run_len >= len {
                        return Ok(Some(run_start));
                    }
                }
            }
            n = (word + 1) * 64;
        }
        Ok(None)
    }

    /// Blocks `64 * word ..` as bits, 1 where a block is in use or held.
    fn used_word(&self, word: u64) -> u64 {
        let first = word * 64;
        let block = (first / BITS_PER_BITMAP_BLOCK) as usize;
        let byte = ((first % BITS_PER_BITMAP_BLOCK) / 8) as usize;
        let image = u64::from_le_bytes(image(&self.images, block)[byte..byte + 8].try_into().expect("8 bytes"));
        image | self.held[word as usize]
    }

    /// Whether `[start, start + len)` lies in the data area and is all in use
    /// (its part of the bitmap read first): what a free needs.
    fn freeable(&mut self, start: u64, len: u64) -> Result<bool> {
        if start < self.data_start || start.saturating_add(len) > self.blocks {
            return Ok(false);
        }
        self.read_covering(start, len)?;
        Ok(self.all_in_use(start, len))
    }

    /// Frees `[start, start+len)`: clear in the next commit's bitmap, not allocatable until
    /// [`Allocator::release`]. False (and nothing changed) if any block was
    /// not in use; an error if its bitmap could not be read.
    pub fn free(&mut self, start: u64, len: u64, dirty: &mut impl FnMut(u64)) -> Result<bool> {
        if !self.freeable(start, len)? {
            return Ok(false);
        }
        for n in start..start + len {
            set_bit(&mut self.images, n, false);
            self.held[(n / 64) as usize] |= 1 << (n % 64);
            self.held_count += 1;
            dirty(n / BITS_PER_BITMAP_BLOCK);
        }
        Ok(true)
    }

    /// Frees blocks that never held data (an append's preallocation past a
    /// file's end, unwritten): allocatable again at once, where blocks that
    /// held data wait for the free to be durable ([`Allocator::free`]); a
    /// power cut that brings back the file that had them brings them back
    /// unwritten, and an unwritten block reads as zeros whatever another file
    /// wrote there since. If they were the last blocks allocated, the next
    /// allocation starts where they did: a small file closed after its
    /// append gives back the rest of its preallocation, and the next file
    /// goes right after it (writeback then writes both with one command;
    /// with a hole between every two files, `cp -r` of /usr/include wrote
    /// its 7,800 files with 8,150 commands). False (and nothing freed) if
    /// some block is not in use; an error if its bitmap could not be read.
    pub fn free_now(&mut self, start: u64, len: u64, dirty: &mut impl FnMut(u64)) -> Result<bool> {
        if !self.freeable(start, len)? {
            return Ok(false);
        }
        for n in start..start + len {
            set_bit(&mut self.images, n, false);
            dirty(n / BITS_PER_BITMAP_BLOCK);
        }
        self.free += len;
        self.run_miss = None;
        if self.cursor == start + len {
            self.cursor = start;
        }
        Ok(true)
    }

    /// The transaction that freed these runs is durable: they may be allocated again.
    pub fn release(&mut self, runs: &[(u64, u64)]) {
        if !runs.is_empty() {
            self.run_miss = None; // longer runs may exist again
        }
        for &(start, len) in runs {
            for n in start..start + len {
                debug_assert!(self.held(n), "released block {n} was not held");
                self.held[(n / 64) as usize] &= !(1 << (n % 64));
                self.held_count -= 1;
                if !bit(&self.images, n) {
                    self.free += 1;
                }
            }
        }
    }

    /// Image of bitmap block `index` (relative to the bitmap's start), which
    /// must have been read (one a transaction changed was).
    pub fn image(&self, index: u64) -> &[u8; BLOCK] {
        image(&self.images, index as usize)
    }

    /// All bitmap images in order (mkfs writes them), every one read.
    pub fn images(&self) -> impl Iterator<Item = &Block> {
        (0..self.images.len()).map(|i| image(&self.images, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_marked_in_use_are_counted_whatever_the_range() {
        let mut images = vec![Some(zero_block()), Some(zero_block())];
        let total = 2 * BITS_PER_BITMAP_BLOCK;
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5000 {
            set_bit(&mut images, rng.u64(..total), true);
        }
        for _ in 0..300 {
            let from = rng.u64(..total);
            let to = rng.u64(from..=total);
            let want = (from..to).filter(|&n| bit(&images, n)).count() as u64;
            assert_eq!(marked_in(&images, from, to), want, "[{from}, {to})");
        }
        assert_eq!(marked_in(&images, 0, total), (0..total).filter(|&n| bit(&images, n)).count() as u64);
    }

    #[test]
    fn a_run_is_all_in_use_exactly_when_each_of_its_blocks_is() {
        let blocks = 2 * BITS_PER_BITMAP_BLOCK;
        let mut a = Allocator::fresh(blocks, 10);
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..2000 {
            let start = rng.u64(..blocks);
            let len = rng.u64(..=(blocks - start).min(300));
            (start..start + len).for_each(|n| set_bit(&mut a.images, n, true));
        }
        for _ in 0..2000 {
            let start = rng.u64(..blocks);
            let len = rng.u64(..=(blocks - start).min(3000));
            let want = (start..start + len).all(|n| a.in_use(n));
            assert_eq!(a.all_in_use(start, len), want, "[{start}, +{len})");
        }
        assert!(!a.all_in_use(blocks - 1, 2), "past the device's end");
    }

    #[test]
    fn freed_blocks_wait_for_their_commit_before_reuse() {
        let mut a = Allocator::fresh(100, 10);
        let mut dirty = Vec::new();
        let mut d = |b| dirty.push(b);
        assert_eq!(a.allocate(5, 1, None, &mut d).unwrap(), Some((10, 5)));
        assert_eq!(a.allocate(5, 1, Some(15), &mut d).unwrap(), Some((15, 5)));
        assert_eq!(a.free_blocks().unwrap(), 80);
        assert!(a.free(10, 5, &mut d).unwrap());
        assert!(!a.free(10, 1, &mut d).unwrap(), "double free refused");
        // Held: the next allocation does not get blocks 10..15 even with that goal.
        let (s, _) = a.allocate(1, 1, Some(10), &mut d).unwrap().unwrap();
        assert!(s >= 20, "{s}");
        a.release(&[(10, 5)]);
        assert_eq!(a.allocate(3, 1, Some(10), &mut d).unwrap(), Some((10, 3)));
        assert!(dirty.iter().all(|&b| b == 0));
    }

    #[test]
    fn unwritten_blocks_come_back_at_once_and_the_next_allocation_starts_there() {
        let mut a = Allocator::fresh(100, 10);
        let mut dirty = Vec::new();
        let mut d = |b| dirty.push(b);
        // A small file's append: 3 blocks and 5 preallocated; its close gives back 5.
        assert_eq!(a.allocate(8, 1, None, &mut d).unwrap(), Some((10, 8)));
        assert!(a.free_now(13, 5, &mut d).unwrap());
        assert!(!a.free_now(13, 1, &mut d).unwrap(), "double free refused");
        assert_eq!(a.free_blocks().unwrap(), 87);
        // The next file goes right after the first, not after the space it gave back.
        assert_eq!(a.allocate(8, 1, None, &mut d).unwrap(), Some((13, 8)));
        // Not the last allocation: the cursor stays.
        assert_eq!(a.allocate(2, 1, None, &mut d).unwrap(), Some((21, 2)));
        assert!(a.free_now(16, 5, &mut d).unwrap());
        assert_eq!(a.allocate(1, 1, None, &mut d).unwrap(), Some((23, 1)));
        assert!(dirty.iter().all(|&b| b == 0));
    }

    #[test]
    fn allocation_wraps_and_reports_a_full_device() {
        let mut a = Allocator::fresh(20, 10);
        let mut d = |_| {};
        assert_eq!(a.allocate(100, 1, None, &mut d).unwrap(), Some((10, 10)));
        assert_eq!(a.allocate(1, 1, None, &mut d).unwrap(), None);
        assert!(a.free(12, 2, &mut d).unwrap());
        a.release(&[(12, 2)]);
        assert_eq!(a.allocate(4, 1, None, &mut d).unwrap(), Some((12, 2)));
    }

    #[test]
    fn a_long_run_is_looked_for_past_the_holes_and_any_block_taken_when_there_is_none() {
        let mut a = Allocator::fresh(300, 10);
        let mut d = |_| {};
        // Used: 10..200, with holes of 7 blocks at 20, 40, ... (freed and released).
        assert_eq!(a.allocate(190, 1, None, &mut d).unwrap(), Some((10, 190)));
        let holes: Vec<(u64, u64)> = (1..9).map(|i| (20 * i, 7)).collect();
        for &(start, len) in &holes {
            assert!(a.free(start, len, &mut d).unwrap());
        }
        a.release(&holes);
        a.cursor = 10; // a new mount's search starts at the front
        // A run of 20 is past the holes, where the free space begins (words skipped whole).
        assert_eq!(a.allocate(3, 20, None, &mut d).unwrap(), Some((200, 3)));
        // A run of 7 is the first hole after the cursor; with a goal that is free, the goal.
        a.cursor = 10;
        assert_eq!(a.allocate(7, 7, None, &mut d).unwrap(), Some((20, 7)));
        assert_eq!(a.allocate(2, 50, Some(43), &mut d).unwrap(), Some((43, 2)));
        // No run of 200 anywhere: the next free block, and as much as follows it.
        assert_eq!(a.allocate(5, 200, None, &mut d).unwrap(), Some((45, 2)));
        // The search wraps: from the end (all taken now) back to the front.
        assert_eq!(a.allocate(97, 1, Some(203), &mut d).unwrap(), Some((203, 97)));
        a.cursor = 290;
        assert_eq!(a.allocate(4, 4, None, &mut d).unwrap(), Some((60, 4)));
    }

    #[test]
    fn a_long_run_found_missing_is_not_looked_for_again_until_blocks_come_back() {
        let mut a = Allocator::fresh(200, 10);
        let mut d = |_| {};
        // Every other block in use: no run longer than one anywhere.
        for n in (10..200).step_by(2) {
            assert_eq!(a.allocate(1, 1, Some(n), &mut d).unwrap(), Some((n, 1)));
        }
        assert_eq!(a.allocate(1, 8, None, &mut d).unwrap().map(|(_, len)| len), Some(1), "no run of 8: a single block");
        assert_eq!(a.run_miss, Some(8));
        assert_eq!(a.find_long_run(16).unwrap(), None, "not looked for again");
        // Blocks 100..=108 come back (with the free ones between, a run of 11 from
        // 99): runs are looked for again.
        assert!(a.free(100, 1, &mut d).unwrap());
        a.release(&[(100, 1)]);
        assert_eq!(a.run_miss, None);
        for n in (102..=108).step_by(2) {
            assert!(a.free(n, 1, &mut d).unwrap());
            a.release(&[(n, 1)]);
        }
        a.cursor = 10;
        assert_eq!(a.allocate(8, 8, None, &mut d).unwrap(), Some((99, 8)));
    }

    /// A disk with `images` written at block 1 of a memory device, and the
    /// same images given whole.
    fn on_a_device(images: &[Block], spec_extra: &str) -> (super::super::disk::Disk, Vec<Block>) {
        let spec = format!("emu:null,size={}k{spec_extra}", (images.len() + 2) * 4);
        let engine = crate::Engine::open(&spec, crate::PathConfig::preset("sync-path").unwrap()).unwrap();
        let disk = super::super::disk::Disk::new(std::sync::Arc::new(engine));
        for (i, image) in images.iter().enumerate() {
            disk.write(1 + i as u64, &IoBuf::from_slice(&image[..])).unwrap();
        }
        (disk, images.to_vec())
    }

    fn random_images(count: usize, seed: u64) -> Vec<Block> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..count)
            .map(|_| {
                let mut b = zero_block();
                // Runs of used and free blocks, as a device holding files has.
                let mut i = 0;
                while i < BLOCK {
                    let (len, byte) = (rng.usize(1..64), if rng.bool() { 0xff } else { rng.u8(..) });
                    b[i..(i + len).min(BLOCK)].fill(byte);
                    i += len;
                }
                b
            })
            .collect()
    }

    #[test]
    fn a_lazy_bitmap_reads_only_what_is_looked_at_and_agrees_with_one_read_whole() {
        let images = random_images(5, 3);
        let (disk, given) = on_a_device(&images, "");
        // The last bitmap block only partly covers the device.
        let (blocks, data_start) = (5 * BITS_PER_BITMAP_BLOCK - 1000, 70);
        let whole = Allocator::from_images(given, blocks, data_start);
        let reads = || disk.counters().reads.load(std::sync::atomic::Ordering::Relaxed);
        let before = reads();
        let mut lazy = Allocator::lazy(disk.reader(), 1, 5, blocks, data_start);
        assert_eq!((lazy.unread, lazy.allocatable(), reads()), (5, 0, before), "nothing read at first");
        // A run inside the third bitmap block, then one across the first two.
        let third = 2 * BITS_PER_BITMAP_BLOCK + 100;
        lazy.read_covering(third, 50).unwrap();
        assert_eq!((lazy.unread, reads()), (4, before + 1), "one block read, and counted");
        assert!(lazy.images[2].is_some());
        assert_eq!(lazy.all_in_use(third, 50), whole.all_in_use(third, 50));
        lazy.read_covering(BITS_PER_BITMAP_BLOCK - 10, 20).unwrap();
        assert_eq!(lazy.unread, 2);
        assert_ne!(lazy.unread, 0);
        // What was not read may be in use; what was read says what it is.
        for n in [BITS_PER_BITMAP_BLOCK * 3 + 5, BITS_PER_BITMAP_BLOCK * 4 + 9] {
            assert!(lazy.maybe_in_use(n), "block {n} not read yet");
            assert!(!lazy.is_free(n), "nothing allocatable where the bitmap was not read");
        }
        for n in [third, third + 49, 5, BITS_PER_BITMAP_BLOCK] {
            assert_eq!(lazy.maybe_in_use(n), whole.in_use(n), "block {n}");
        }
        // The counts and an allocation, once all of it is read, are the whole bitmap's.
        let mut whole = whole;
        assert_eq!(lazy.free_blocks().unwrap(), whole.free_blocks().unwrap());
        assert_eq!(lazy.unread, 0);
        assert_eq!(lazy.allocatable(), whole.allocatable());
        let mut d = |_| {};
        for (want, min_run) in [(1, 1), (40, 40), (3, 1), (500, 8)] {
            assert_eq!(
                lazy.allocate(want, min_run, None, &mut d).unwrap(),
                whole.allocate(want, min_run, None, &mut d).unwrap()
            );
        }
        assert_eq!(lazy.allocatable(), whole.allocatable());
        for i in 0..5u64 {
            assert_eq!(lazy.image(i), whole.image(i), "bitmap block {i}");
        }
    }

    #[test]
    fn a_bitmap_block_that_cannot_be_read_fails_the_free_or_allocation_and_changes_nothing() {
        let images = random_images(3, 9);
        // The second bitmap block (device block 2) cannot be read.
        let (disk, _) = on_a_device(&images, ",fail_range=8k-12k,fail_op=read");
        let blocks = 3 * BITS_PER_BITMAP_BLOCK;
        let mut lazy = Allocator::lazy(disk.reader(), 1, 3, blocks, 10);
        let mut changed = Vec::new();
        let mut d = |i| changed.push(i);
        let inside = BITS_PER_BITMAP_BLOCK + 7;
        assert!(lazy.free(inside, 1, &mut d).is_err(), "a free there needs that block");
        assert!(lazy.free_now(inside, 1, &mut d).is_err());
        assert!(lazy.allocate(1, 1, Some(inside), &mut d).is_err(), "allocating there reads that block");
        // A run longer than the first block holds: the search must read on into the second.
        let long = BITS_PER_BITMAP_BLOCK + 1;
        assert!(lazy.allocate(long, long, None, &mut d).is_err(), "the search reads on into it");
        assert!(lazy.free_blocks().is_err());
        assert!(changed.is_empty(), "no bitmap block was changed");
        assert_eq!((lazy.held_count, lazy.cursor), (0, 10));
        // The other blocks still read and answer, and a search that finds room
        // before the unreadable block allocates there.
        lazy.read_covering(5, 10).unwrap();
        lazy.read_covering(2 * BITS_PER_BITMAP_BLOCK, 10).unwrap();
        assert_eq!(lazy.unread, 1);
        let (start, _) = lazy.allocate(1, 1, None, &mut |_| {}).unwrap().expect("room in the first block");
        assert!(start < BITS_PER_BITMAP_BLOCK);
    }

    #[test]
    fn a_writer_on_a_device_with_room_reads_a_few_bitmap_blocks_not_all() {
        // 64 bitmap blocks (8 GiB of device), the first two full.
        let mut images: Vec<Block> = (0..64).map(|_| zero_block()).collect();
        images[0].fill(0xff);
        images[1].fill(0xff);
        let (disk, given) = on_a_device(&images, "");
        let (blocks, data_start) = (64 * BITS_PER_BITMAP_BLOCK, 10);
        let mut lazy = Allocator::lazy(disk.reader(), 1, 64, blocks, data_start);
        let mut whole = Allocator::from_images(given, blocks, data_start);
        let mut d = |_| {};
        for (want, min_run) in [(1, 1), (16, 16), (300, 300), (5, 1)] {
            assert_eq!(
                lazy.allocate(want, min_run, None, &mut d).unwrap(),
                whole.allocate(want, min_run, None, &mut d).unwrap()
            );
        }
        assert!(lazy.unread >= 60, "{} of 64 bitmap blocks read", 64 - lazy.unread);
        // Room for a preallocation is found the same way; a count reads the rest.
        assert!(lazy.read_until_allocatable(50_000).unwrap() >= 50_000);
        assert!(lazy.unread >= 60, "{} of 64 bitmap blocks read", 64 - lazy.unread);
        assert_eq!(lazy.free_blocks().unwrap(), whole.free_blocks().unwrap());
    }

    proptest::proptest! {
        /// Allocations and frees on a bitmap read lazily, as it is looked at,
        /// give what they give on the same bitmap read whole.
        #[test]
        fn a_lazily_read_bitmap_allocates_as_one_read_whole(
            seed in 0u64..1000,
            // (want, min_run, goal, free the last run taken after it)
            ops in proptest::collection::vec(
                (
                    1u64..40_000,
                    1u64..40_000,
                    proptest::option::of(0u64..4 * BITS_PER_BITMAP_BLOCK),
                    proptest::bool::ANY,
                ),
                1..12,
            ),
        ) {
            let images = random_images(4, seed);
            let (disk, given) = on_a_device(&images, "");
            let (blocks, data_start) = (4 * BITS_PER_BITMAP_BLOCK - 77, 30);
            let mut lazy = Allocator::lazy(disk.reader(), 1, 4, blocks, data_start);
            let mut whole = Allocator::from_images(given, blocks, data_start);
            let mut d = |_| {};
            let mut taken = Vec::new();
            for (want, min_run, goal, free_one) in ops {
                let min_run = min_run.min(want);
                let got = lazy.allocate(want, min_run, goal, &mut d).unwrap();
                proptest::prop_assert_eq!(got, whole.allocate(want, min_run, goal, &mut d).unwrap());
                taken.extend(got);
                if free_one && let Some((start, len)) = taken.pop() {
                    proptest::prop_assert!(lazy.free_now(start, len, &mut d).unwrap());
                    proptest::prop_assert!(whole.free_now(start, len, &mut d).unwrap());
                }
            }
            proptest::prop_assert_eq!(lazy.free_blocks().unwrap(), whole.free_blocks().unwrap());
            for i in 0..4u64 {
                proptest::prop_assert_eq!(lazy.image(i), whole.image(i));
            }
        }

        /// The word-at-a-time search finds what a block-by-block one finds.
        #[test]
        fn the_run_search_agrees_with_a_scan_block_by_block(
            used in proptest::collection::vec(proptest::bool::weighted(0.7), 0..700),
            held in proptest::collection::vec(0u64..700, 0..20),
            len in 1u64..80,
            cursor in 0u64..720,
        ) {
            let (blocks, data_start) = (used.len() as u64 + 20, 20);
            let mut a = Allocator::fresh(blocks, data_start);
            let mut d = |_| {};
            for (i, &u) in used.iter().enumerate() {
                if u {
                    a.allocate(1, 1, Some(data_start + i as u64), &mut d).unwrap();
                }
            }
            for &h in held.iter().filter(|&&h| h < used.len() as u64 && used[h as usize]) {
                a.free(data_start + h, 1, &mut d).unwrap();
            }
            a.cursor = cursor.clamp(data_start, blocks);
            let free_from = |from: u64, to: u64| {
                (from..to).find(|&s| s + len <= to && (s..s + len).all(|n| a.available(n)))
            };
            let naive = free_from(a.cursor, blocks).or_else(|| free_from(data_start, a.cursor));
            proptest::prop_assert_eq!(a.find_run(len).unwrap(), naive);
        }
    }
}
