//! Free space: the on-device bitmap (as block images the journal writes) and
//! the blocks freed in transactions that are not yet committed.
//!
//! A block freed by a running transaction must not be handed out again
//! before that transaction is durable: if the machine stopped in between,
//! recovery would bring back the file that owned it, now holding someone
//! else's data. So a free clears the bit in the bitmap image (what the next
//! commit writes) and sets it in `held`, and only [`Allocator::release`],
//! called once the freeing transaction is committed, lets it be allocated.

use super::format::{BITS_PER_BITMAP_BLOCK, BLOCK, Block, zero_block};

/// The free-space bitmap of a mounted file system.
pub struct Allocator {
    /// Bitmap block images (1 = in use), as on the device.
    images: Vec<Block>,
    /// 1 = freed by a transaction not yet committed: not to be allocated.
    held: Vec<u64>,
    blocks: u64,
    data_start: u64,
    /// Where the next search starts when the caller has no goal.
    cursor: u64,
    free: u64,
    held_count: u64,
    /// The shortest run a search found no free run of since blocks last
    /// became allocatable: longer ones are not looked for again until then
    /// (on a full, fragmented device each search would read the whole bitmap).
    run_miss: Option<u64>,
}

fn bit(images: &[Block], n: u64) -> bool {
    let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
    let i = (n % BITS_PER_BITMAP_BLOCK) as usize;
    images[block][i / 8] & (1 << (i % 8)) != 0
}

/// Blocks in `[from, to)` marked in use: whole bytes counted at once (a
/// mount of a 3 GiB device counted its 786,432 bits one by one: a tenth of
/// a short program's time on a mount).
fn marked_in(images: &[Block], from: u64, to: u64) -> u64 {
    let mut n = from;
    let mut marked = 0;
    while n < to {
        let (block, i) = ((n / BITS_PER_BITMAP_BLOCK) as usize, (n % BITS_PER_BITMAP_BLOCK) as usize);
        if i % 8 == 0 && to - n >= 8 {
            // Whole bytes to the end of this bitmap block or of the range.
            let bytes = ((BITS_PER_BITMAP_BLOCK as usize - i) / 8).min(((to - n) / 8) as usize);
            marked += images[block][i / 8..i / 8 + bytes].iter().map(|b| b.count_ones() as u64).sum::<u64>();
            n += bytes as u64 * 8;
        } else {
            marked += u64::from(bit(images, n));
            n += 1;
        }
    }
    marked
}

fn set_bit(images: &mut [Block], n: u64, on: bool) {
    let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
    let i = (n % BITS_PER_BITMAP_BLOCK) as usize;
    if on {
        images[block][i / 8] |= 1 << (i % 8);
    } else {
        images[block][i / 8] &= !(1 << (i % 8));
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

    /// The allocator over bitmap images read from the device.
    pub fn from_images(images: Vec<Block>, blocks: u64, data_start: u64) -> Allocator {
        let free = (blocks - data_start) - marked_in(&images, data_start, blocks);
        Allocator {
            images,
            held: vec![0; blocks.div_ceil(64) as usize],
            blocks,
            data_start,
            cursor: data_start,
            free,
            held_count: 0,
            run_miss: None,
        }
    }

    /// Whether block `n` is marked in use.
    pub fn in_use(&self, n: u64) -> bool {
        bit(&self.images, n)
    }

    /// Whether every block of `[start, start + len)` is marked in use
    /// (counted a byte of the bitmap at a time; false past the device's end).
    pub fn all_in_use(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        end <= self.blocks && marked_in(&self.images, start, end) == len
    }

    /// Blocks that may be allocated now.
    pub fn allocatable(&self) -> u64 {
        self.free
    }

    /// Blocks not in use: allocatable now, or once the transaction (or checkpoint) that freed them is done.
    pub fn free_blocks(&self) -> u64 {
        self.free + self.held_count
    }

    fn held(&self, n: u64) -> bool {
        self.held[(n / 64) as usize] & (1 << (n % 64)) != 0
    }

    fn available(&self, n: u64) -> bool {
        !bit(&self.images, n) && !self.held(n)
    }

    /// Whether data block `n` could be allocated now.
    pub fn is_free(&self, n: u64) -> bool {
        n >= self.data_start && n < self.blocks && self.available(n)
    }

    /// Allocates up to `want` contiguous blocks: at `goal` when it is free (to
    /// extend a file in place), else at the first free run of at least
    /// `min_run` blocks after the cursor (a file that streams wants one piece,
    /// not the holes small files left), else, when no run that long is left,
    /// at the next free block. Returns the run; `dirty` is told each bitmap
    /// block it changed. `None` when the device is full.
    pub fn allocate(
        &mut self,
        want: u64,
        min_run: u64,
        goal: Option<u64>,
        dirty: &mut impl FnMut(u64),
    ) -> Option<(u64, u64)> {
        if want == 0 || self.free == 0 {
            return None;
        }
        let start = match goal.filter(|&g| g >= self.data_start && g < self.blocks && self.available(g)) {
            Some(g) => g,
            None => self.find_long_run(min_run).or_else(|| self.find_run(1))?,
        };
        let mut len = 0;
        while len < want && start + len < self.blocks && self.available(start + len) {
            set_bit(&mut self.images, start + len, true);
            dirty((start + len) / BITS_PER_BITMAP_BLOCK);
            len += 1;
        }
        debug_assert!(len > 0);
        self.free -= len;
        self.cursor = start + len;
        Some((start, len))
    }

    /// [`Allocator::find_run`] of `min_run` blocks (more than one), unless a
    /// search for no more than that found none and nothing was freed since.
    fn find_long_run(&mut self, min_run: u64) -> Option<u64> {
        if min_run <= 1 || self.run_miss.is_some_and(|m| min_run >= m) {
            return None;
        }
        let found = self.find_run(min_run);
        if found.is_none() {
            self.run_miss = Some(min_run);
        }
        found
    }

    /// The first block of a free run of `len` blocks, from the cursor on
    /// (then from the start of the data area up to it).
    fn find_run(&self, len: u64) -> Option<u64> {
        let cursor = self.cursor.clamp(self.data_start, self.blocks);
        self.find_run_in(cursor, self.blocks, len).or_else(|| self.find_run_in(self.data_start, cursor, len))
    }

    /// The first free run of `len` blocks inside `[from, to)`, a word of the bitmap at a time.
    fn find_run_in(&self, from: u64, to: u64, len: u64) -> Option<u64> {
        let (mut run_start, mut run_len) = (from, 0u64);
        let mut n = from;
        while n < to {
            let word = n / 64;
            let used = self.used_word(word);
            let first = n % 64;
            let last = (to - word * 64).min(64);
            if used == 0 && first == 0 && last == 64 {
                run_len += 64; // a whole free word
                if run_len >= len {
                    return Some(run_start);
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
                        return Some(run_start);
                    }
                }
            }
            n = (word + 1) * 64;
        }
        None
    }

    /// Blocks `64 * word ..` as bits, 1 where a block is in use or held.
    fn used_word(&self, word: u64) -> u64 {
        let first = word * 64;
        let block = (first / BITS_PER_BITMAP_BLOCK) as usize;
        let byte = ((first % BITS_PER_BITMAP_BLOCK) / 8) as usize;
        let image = u64::from_le_bytes(self.images[block][byte..byte + 8].try_into().expect("8 bytes"));
        image | self.held[word as usize]
    }

    /// Frees `[start, start+len)`: clear in the next commit's bitmap, not allocatable until
    /// [`Allocator::release`]. Returns false (and changes nothing) if any block was not in use.
    pub fn free(&mut self, start: u64, len: u64, dirty: &mut impl FnMut(u64)) -> bool {
        if start < self.data_start || start + len > self.blocks || !(start..start + len).all(|n| self.in_use(n)) {
            return false;
        }
        for n in start..start + len {
            set_bit(&mut self.images, n, false);
            self.held[(n / 64) as usize] |= 1 << (n % 64);
            self.held_count += 1;
            dirty(n / BITS_PER_BITMAP_BLOCK);
        }
        true
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
    /// some block is not in use.
    pub fn free_now(&mut self, start: u64, len: u64, dirty: &mut impl FnMut(u64)) -> bool {
        if start < self.data_start || start + len > self.blocks || !(start..start + len).all(|n| self.in_use(n)) {
            return false;
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
        true
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

    /// Image of bitmap block `index` (relative to the bitmap's start).
    pub fn image(&self, index: u64) -> &[u8; BLOCK] {
        &self.images[index as usize]
    }

    /// All bitmap images in order (mkfs writes them).
    pub fn images(&self) -> &[Block] {
        &self.images
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_marked_in_use_are_counted_whatever_the_range() {
        let mut images = vec![crate::fs::format::zero_block(), crate::fs::format::zero_block()];
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
        assert_eq!(a.allocate(5, 1, None, &mut d), Some((10, 5)));
        assert_eq!(a.allocate(5, 1, Some(15), &mut d), Some((15, 5)));
        assert_eq!(a.free_blocks(), 80);
        assert!(a.free(10, 5, &mut d));
        assert!(!a.free(10, 1, &mut d), "double free refused");
        // Held: the next allocation does not get blocks 10..15 even with that goal.
        let (s, _) = a.allocate(1, 1, Some(10), &mut d).unwrap();
        assert!(s >= 20, "{s}");
        a.release(&[(10, 5)]);
        assert_eq!(a.allocate(3, 1, Some(10), &mut d), Some((10, 3)));
        assert!(dirty.iter().all(|&b| b == 0));
    }

    #[test]
    fn unwritten_blocks_come_back_at_once_and_the_next_allocation_starts_there() {
        let mut a = Allocator::fresh(100, 10);
        let mut dirty = Vec::new();
        let mut d = |b| dirty.push(b);
        // A small file's append: 3 blocks and 5 preallocated; its close gives back 5.
        assert_eq!(a.allocate(8, 1, None, &mut d), Some((10, 8)));
        assert!(a.free_now(13, 5, &mut d));
        assert!(!a.free_now(13, 1, &mut d), "double free refused");
        assert_eq!(a.free_blocks(), 87);
        // The next file goes right after the first, not after the space it gave back.
        assert_eq!(a.allocate(8, 1, None, &mut d), Some((13, 8)));
        // Not the last allocation: the cursor stays.
        assert_eq!(a.allocate(2, 1, None, &mut d), Some((21, 2)));
        assert!(a.free_now(16, 5, &mut d));
        assert_eq!(a.allocate(1, 1, None, &mut d), Some((23, 1)));
        assert!(dirty.iter().all(|&b| b == 0));
    }

    #[test]
    fn allocation_wraps_and_reports_a_full_device() {
        let mut a = Allocator::fresh(20, 10);
        let mut d = |_| {};
        assert_eq!(a.allocate(100, 1, None, &mut d), Some((10, 10)));
        assert_eq!(a.allocate(1, 1, None, &mut d), None);
        assert!(a.free(12, 2, &mut d));
        a.release(&[(12, 2)]);
        assert_eq!(a.allocate(4, 1, None, &mut d), Some((12, 2)));
    }

    #[test]
    fn a_long_run_is_looked_for_past_the_holes_and_any_block_taken_when_there_is_none() {
        let mut a = Allocator::fresh(300, 10);
        let mut d = |_| {};
        // Used: 10..200, with holes of 7 blocks at 20, 40, ... (freed and released).
        assert_eq!(a.allocate(190, 1, None, &mut d), Some((10, 190)));
        let holes: Vec<(u64, u64)> = (1..9).map(|i| (20 * i, 7)).collect();
        for &(start, len) in &holes {
            assert!(a.free(start, len, &mut d));
        }
        a.release(&holes);
        a.cursor = 10; // a new mount's search starts at the front
        // A run of 20 is past the holes, where the free space begins (words skipped whole).
        assert_eq!(a.allocate(3, 20, None, &mut d), Some((200, 3)));
        // A run of 7 is the first hole after the cursor; with a goal that is free, the goal.
        a.cursor = 10;
        assert_eq!(a.allocate(7, 7, None, &mut d), Some((20, 7)));
        assert_eq!(a.allocate(2, 50, Some(43), &mut d), Some((43, 2)));
        // No run of 200 anywhere: the next free block, and as much as follows it.
        assert_eq!(a.allocate(5, 200, None, &mut d), Some((45, 2)));
        // The search wraps: from the end (all taken now) back to the front.
        assert_eq!(a.allocate(97, 1, Some(203), &mut d), Some((203, 97)));
        a.cursor = 290;
        assert_eq!(a.allocate(4, 4, None, &mut d), Some((60, 4)));
    }

    #[test]
    fn a_long_run_found_missing_is_not_looked_for_again_until_blocks_come_back() {
        let mut a = Allocator::fresh(200, 10);
        let mut d = |_| {};
        // Every other block in use: no run longer than one anywhere.
        for n in (10..200).step_by(2) {
            assert_eq!(a.allocate(1, 1, Some(n), &mut d), Some((n, 1)));
        }
        assert_eq!(a.allocate(1, 8, None, &mut d).map(|(_, len)| len), Some(1), "no run of 8: a single block");
        assert_eq!(a.run_miss, Some(8));
        assert_eq!(a.find_long_run(16), None, "not looked for again");
        // Blocks 100..=108 come back (with the free ones between, a run of 11 from
        // 99): runs are looked for again.
        assert!(a.free(100, 1, &mut d));
        a.release(&[(100, 1)]);
        assert_eq!(a.run_miss, None);
        for n in (102..=108).step_by(2) {
            assert!(a.free(n, 1, &mut d));
            a.release(&[(n, 1)]);
        }
        a.cursor = 10;
        assert_eq!(a.allocate(8, 8, None, &mut d), Some((99, 8)));
    }

    proptest::proptest! {
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
                    a.allocate(1, 1, Some(data_start + i as u64), &mut d);
                }
            }
            for &h in held.iter().filter(|&&h| h < used.len() as u64 && used[h as usize]) {
                a.free(data_start + h, 1, &mut d);
            }
            a.cursor = cursor.clamp(data_start, blocks);
            let free_from = |from: u64, to: u64| {
                (from..to).find(|&s| s + len <= to && (s..s + len).all(|n| a.available(n)))
            };
            let naive = free_from(a.cursor, blocks).or_else(|| free_from(data_start, a.cursor));
            proptest::prop_assert_eq!(a.find_run(len), naive);
        }
    }
}
