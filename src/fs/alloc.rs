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
}

fn bit(images: &[Block], n: u64) -> bool {
    let block = (n / BITS_PER_BITMAP_BLOCK) as usize;
    let i = (n % BITS_PER_BITMAP_BLOCK) as usize;
    images[block][i / 8] & (1 << (i % 8)) != 0
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
        let free = (data_start..blocks).filter(|&n| !bit(&images, n)).count() as u64;
        Allocator {
            images,
            held: vec![0; blocks.div_ceil(64) as usize],
            blocks,
            data_start,
            cursor: data_start,
            free,
            held_count: 0,
        }
    }

    /// Whether block `n` is marked in use.
    pub fn in_use(&self, n: u64) -> bool {
        bit(&self.images, n)
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

    /// Allocates up to `want` contiguous blocks, starting at `goal` when it is
    /// free (to extend a file in place), else at the next free run. Returns the
    /// run and the bitmap blocks it changed; `None` when the device is full.
    pub fn allocate(&mut self, want: u64, goal: Option<u64>, dirty: &mut impl FnMut(u64)) -> Option<(u64, u64)> {
        if want == 0 || self.free == 0 {
            return None;
        }
        let start = match goal.filter(|&g| g >= self.data_start && g < self.blocks && self.available(g)) {
            Some(g) => g,
            None => self.find_free()?,
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

    fn find_free(&self) -> Option<u64> {
        let span = self.blocks - self.data_start;
        (0..span).map(|i| self.data_start + (self.cursor - self.data_start + i) % span).find(|&n| self.available(n))
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

    /// The transaction that freed these runs is durable: they may be allocated again.
    pub fn release(&mut self, runs: &[(u64, u64)]) {
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
    fn freed_blocks_wait_for_their_commit_before_reuse() {
        let mut a = Allocator::fresh(100, 10);
        let mut dirty = Vec::new();
        let mut d = |b| dirty.push(b);
        assert_eq!(a.allocate(5, None, &mut d), Some((10, 5)));
        assert_eq!(a.allocate(5, Some(15), &mut d), Some((15, 5)));
        assert_eq!(a.free_blocks(), 80);
        assert!(a.free(10, 5, &mut d));
        assert!(!a.free(10, 1, &mut d), "double free refused");
        // Held: the next allocation does not get blocks 10..15 even with that goal.
        let (s, _) = a.allocate(1, Some(10), &mut d).unwrap();
        assert!(s >= 20, "{s}");
        a.release(&[(10, 5)]);
        assert_eq!(a.allocate(3, Some(10), &mut d), Some((10, 3)));
        assert!(dirty.iter().all(|&b| b == 0));
    }

    #[test]
    fn allocation_wraps_and_reports_a_full_device() {
        let mut a = Allocator::fresh(20, 10);
        let mut d = |_| {};
        assert_eq!(a.allocate(100, None, &mut d), Some((10, 10)));
        assert_eq!(a.allocate(1, None, &mut d), None);
        assert!(a.free(12, 2, &mut d));
        a.release(&[(12, 2)]);
        assert_eq!(a.allocate(4, None, &mut d), Some((12, 2)));
    }
}
