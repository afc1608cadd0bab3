//! What a benchmark thread does: which direction and which offset next.
//!
//! Each thread owns a contiguous slice of the region (`size / threads`,
//! rounded down to the block size), like one file per thread in Iozone or
//! fio's `offset_increment`. Sequential workloads walk their slice and wrap;
//! random ones pick blocks inside it, uniformly or skewed
//! ([`Distribution`]). Owning a slice is what lets
//! `--verify` know exactly what every block must hold.

use super::distribution::{Distribution, Sampler};
use crate::device::Op;
use crate::error::{Error, Result};

/// The access pattern, named as fio names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mixed reads and writes.
    ReadWrite,
    /// Random mixed reads and writes.
    RandRw,
    /// Sequential trims (discards).
    Trim,
    /// Random trims.
    RandTrim,
}

impl Rw {
    /// All patterns that move data (what `compare` can run).
    pub const ALL: [Rw; 6] = [Rw::Read, Rw::Write, Rw::RandRead, Rw::RandWrite, Rw::ReadWrite, Rw::RandRw];
    /// The trim patterns.
    pub const TRIMS: [Rw; 2] = [Rw::Trim, Rw::RandTrim];

    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
            Rw::ReadWrite => "rw",
            Rw::RandRw => "randrw",
            Rw::Trim => "trim",
            Rw::RandTrim => "randtrim",
        }
    }

    /// Parses fio's name (`readwrite` is accepted for `rw`).
    pub fn parse(text: &str) -> Result<Rw> {
        if text == "readwrite" {
            return Ok(Rw::ReadWrite);
        }
        Self::ALL.into_iter().chain(Self::TRIMS).find(|r| r.name() == text).ok_or_else(|| {
            Error::spec(
                "workload",
                text,
                "expected read, write, randread, randwrite, rw (readwrite), randrw, trim or randtrim",
            )
        })
    }

    /// Whether the pattern writes at all (`read` and `randread` do not).
    pub fn writes(self) -> bool {
        !matches!(self, Rw::Read | Rw::RandRead)
    }

    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite | Rw::RandRw | Rw::RandTrim)
    }

    /// Whether the pattern trims.
    pub fn trims(self) -> bool {
        matches!(self, Rw::Trim | Rw::RandTrim)
    }

    /// Share of reads, given fio's `rwmixread` percentage for mixed patterns.
    pub fn read_fraction(self, rwmixread: u32) -> f64 {
        match self {
            Rw::Read | Rw::RandRead => 1.0,
            Rw::Write | Rw::RandWrite | Rw::Trim | Rw::RandTrim => 0.0,
            Rw::ReadWrite | Rw::RandRw => rwmixread as f64 / 100.0,
        }
    }
}

/// One thread's generator of (direction, block).
#[derive(Debug, Clone)]
pub struct Generator {
    rw: Rw,
    rwmixread: u32,
    /// First byte of this thread's slice.
    pub base: u64,
    /// Blocks in the slice.
    pub blocks: u64,
    /// Block size in bytes.
    pub block_size: u64,
    next_block: u64,
    sampler: Sampler,
    /// Request sizes in blocks with cumulative weights, reads and writes
    /// (`bssplit`, `bsrange`); empty: every request is one block.
    sizes: [Vec<(u64, u32)>; 2],
    rng: fastrand::Rng,
}

impl Generator {
    /// The generator of thread `thread` of `threads` over `[0, size)`.
    pub fn new(
        rw: Rw,
        rwmixread: u32,
        size: u64,
        block_size: u64,
        threads: usize,
        thread: usize,
        seed: u64,
    ) -> Result<Generator> {
        let slice = size / threads as u64 / block_size * block_size;
        if slice == 0 {
            return Err(Error::spec(
                "size",
                size.to_string(),
                format!(
                    "{size} bytes cannot give each of {threads} thread(s) one block of {block_size} bytes; raise --size"
                ),
            ));
        }
        Ok(Generator {
            rw,
            rwmixread,
            base: slice * thread as u64,
            blocks: slice / block_size,
            block_size,
            next_block: 0,
            sampler: Sampler::new(&Distribution::Uniform, slice / block_size, block_size),
            sizes: [Vec::new(), Vec::new()],
            rng: fastrand::Rng::with_seed(seed ^ (thread as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        })
    }

    /// Draws random blocks from `distribution` instead of uniformly.
    pub fn with_distribution(mut self, distribution: &Distribution) -> Generator {
        self.sampler = Sampler::new(distribution, self.blocks, self.block_size);
        self
    }

    /// Moves the whole region `offset` bytes into the device.
    pub fn with_offset(mut self, offset: u64) -> Generator {
        self.base += offset;
        self
    }

    /// Draws each request's size from `split` (reads, writes): sizes in
    /// bytes, each a multiple of the block size, with weights.
    pub fn with_sizes(mut self, split: &[Vec<(u64, u32)>; 2]) -> Generator {
        for (d, list) in split.iter().enumerate() {
            let mut total = 0;
            self.sizes[d] = list
                .iter()
                .filter(|(_, w)| *w > 0)
                .map(|&(bytes, w)| {
                    total += w;
                    ((bytes / self.block_size).clamp(1, self.blocks), total)
                })
                .collect();
        }
        self
    }

    /// The next request's size in blocks.
    fn next_units(&mut self, op: Op) -> u64 {
        let sizes = &self.sizes[usize::from(op != Op::Read)];
        match sizes.last() {
            None => 1,
            Some(&(_, total)) => {
                let pick = self.rng.u32(0..total);
                sizes.iter().find(|(_, upto)| pick < *upto).map_or(1, |(units, _)| *units)
            }
        }
    }

    /// The next direction, block index (within the slice) and length in bytes.
    pub fn next_request(&mut self) -> (Op, u64, u64) {
        let op = match self.rw.read_fraction(self.rwmixread) {
            _ if self.rw.trims() => Op::Trim,
            f if f >= 1.0 => Op::Read,
            f if f <= 0.0 => Op::Write,
            _ => {
                if self.rng.u32(0..100) < self.rwmixread {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        };
        let units = self.next_units(op);
        let block = if self.rw.is_random() {
            // A request that would run past the slice's end ends at it.
            self.sampler.next(&mut self.rng).min(self.blocks - units)
        } else {
            if self.next_block + units > self.blocks {
                self.next_block = 0;
            }
            let b = self.next_block;
            self.next_block = (b + units) % self.blocks;
            b
        };
        (op, block, units * self.block_size)
    }

    /// A random block index, for re-picking around a conflict.
    pub fn random_block(&mut self) -> u64 {
        self.rng.u64(0..self.blocks)
    }

    /// Device offset of a block.
    pub fn offset(&self, block: u64) -> u64 {
        self.base + block * self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_disjoint_and_cover_the_region() {
        let g0 = Generator::new(Rw::Read, 50, 1 << 20, 4096, 4, 0, 1).unwrap();
        let g3 = Generator::new(Rw::Read, 50, 1 << 20, 4096, 4, 3, 1).unwrap();
        assert_eq!(g0.blocks, 64);
        assert_eq!(g3.base, 3 * 64 * 4096);
        assert_eq!(g3.offset(63) + 4096, 1 << 20);
    }

    #[test]
    fn sequential_wraps_and_random_stays_inside() {
        let mut g = Generator::new(Rw::Write, 50, 4 * 4096, 4096, 1, 0, 1).unwrap();
        let blocks: Vec<u64> = (0..6).map(|_| g.next_request().1).collect();
        assert_eq!(blocks, vec![0, 1, 2, 3, 0, 1]);
        let mut r = Generator::new(Rw::RandRw, 70, 1 << 20, 4096, 2, 1, 9).unwrap();
        let mut reads = 0;
        for _ in 0..10_000 {
            let (op, b, _) = r.next_request();
            assert!(b < r.blocks);
            reads += (op == Op::Read) as u32;
        }
        assert!((6500..7500).contains(&reads), "{reads}");
    }

    #[test]
    fn split_sizes_come_in_their_shares_and_stay_inside_the_slice() {
        let split = [vec![(4096, 10), (65536, 90)], vec![(16384, 100)]];
        let mut g = Generator::new(Rw::RandRw, 50, 1 << 20, 4096, 1, 0, 3).unwrap().with_sizes(&split);
        let (mut small, mut reads) = (0, 0);
        for _ in 0..20_000 {
            let (op, block, len) = g.next_request();
            assert!(g.offset(block) + len <= 1 << 20);
            if op == Op::Read {
                reads += 1;
                small += (len == 4096) as u32;
                assert!(len == 4096 || len == 65536);
            } else {
                assert_eq!(len, 16384);
            }
        }
        let share = small as f64 / reads as f64;
        assert!((share - 0.1).abs() < 0.02, "{share}");
        // Sequential: each request starts where the last ended, wrapping before the end.
        let mut s = Generator::new(Rw::Read, 50, 40960, 4096, 1, 0, 1).unwrap().with_sizes(&[vec![(12288, 1)], vec![]]);
        let starts: Vec<u64> = (0..5).map(|_| s.next_request().1).collect();
        assert_eq!(starts, [0, 3, 6, 0, 3]);
    }

    #[test]
    fn too_small_a_region_is_explained() {
        let e = Generator::new(Rw::Read, 50, 4096, 4096, 2, 0, 1).unwrap_err();
        assert!(e.to_string().contains("raise --size"), "{e}");
    }
}
