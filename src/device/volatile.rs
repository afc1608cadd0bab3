//! The emulated device's volatile write cache and power cut.
//!
//! Real SSDs acknowledge a write once it is in their (volatile) cache; it
//! survives a power loss only after a flush. With `wcache=1` the emulated
//! device behaves the same way: a write reaches the store at once (so later
//! reads see it, as they would from the device's cache), and the previous
//! contents of every 512-byte sector it touched are kept until the next
//! flush, with a copy of every write since. A power cut (`cut_after=N`
//! commands, `cut_random=N` for a random point in the first N commands, or
//! [`EmuDevice::power_cut`](super::emu::EmuDevice::power_cut)) decides what
//! of that made it to the media. With `cut=tear` (the default) each write
//! since the last flush, independently, reached the media whole, not at all,
//! or torn (each of its 512-byte sectors kept or not), as a device that
//! reorders and tears its cache would leave them: a later write can survive
//! while an earlier one is lost. With `cut=drop` nothing written since the
//! last flush survives. A sector is never torn inside (a device's atomic
//! write unit). After the cut every command fails with `EIO` until
//! [`EmuDevice::power_on`](super::emu::EmuDevice::power_on).

use super::store::Store;
use std::collections::HashMap;

/// Atomic unit of the emulated media.
pub const SECTOR: u64 = 512;

/// What a power cut does to what was written since the last flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Each unflushed sector independently keeps its new or its old contents.
    Tear,
    /// Every unflushed sector goes back to its old contents.
    Drop,
}

/// When and how the power is cut (the `wcache`, `cut_*` options of `emu:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutPlan {
    /// Cut power just before the command after this many (counted from power-on).
    pub after: Option<u64>,
    /// What the cut does to unflushed sectors.
    pub mode: CutMode,
    /// Seed of the random choices (which sectors survive, `cut_random`'s point).
    pub seed: u64,
}

/// The volatile cache: pre-flush contents of the sectors written since the
/// last flush, and each write since (offset, data) in order.
pub struct VolatileCache {
    old: HashMap<u64, Box<[u8; SECTOR as usize]>>,
    /// Every write since the last flush: offset, data, and whether it was written
    /// with forced unit access (a cut keeps it whole).
    writes: Vec<(u64, Vec<u8>, bool)>,
    plan: CutPlan,
    commands: u64,
    powered: bool,
    rng: fastrand::Rng,
    cuts: u64,
}

impl VolatileCache {
    /// An empty cache, powered on.
    pub fn new(plan: CutPlan) -> VolatileCache {
        VolatileCache {
            old: HashMap::new(),
            writes: Vec::new(),
            plan,
            commands: 0,
            powered: true,
            rng: fastrand::Rng::with_seed(plan.seed),
            cuts: 0,
        }
    }

    /// Counts a command about to start; cuts the power if the plan says so.
    /// Returns whether the device is powered (the command may run).
    pub fn admit(&mut self, store: &Store) -> bool {
        if !self.powered {
            return false;
        }
        if self.plan.after == Some(self.commands) {
            self.cut(store);
            return false;
        }
        self.commands += 1;
        true
    }

    /// Records a write of `data` at `offset` before it reaches the store: the
    /// pre-flush contents of every sector it touches, and the data. The range must
    /// lie inside the store.
    pub fn before_write(&mut self, store: &Store, offset: u64, data: &[u8]) {
        let first = offset / SECTOR;
        let end = (offset + data.len() as u64).div_ceil(SECTOR);
        self.writes.push((offset, data.to_vec(), false));
        for sector in first..end {
            self.old.entry(sector).or_insert_with(|| {
                let mut old = Box::new([0u8; SECTOR as usize]);
                let at = sector * SECTOR;
                let n = SECTOR.min(store.len() - at) as usize;
                // SAFETY: `at + n` lies inside the store and `old` holds SECTOR bytes.
                unsafe { store.read(at, old.as_mut_ptr(), n) };
                old
            });
        }
    }

    /// How many writes since the last flush ([`VolatileCache::forced_since`]).
    pub fn writes_since_flush(&self) -> usize {
        self.writes.len()
    }

    /// The writes since the `mark`-th were written with forced unit access:
    /// durable now, whatever a cut does to the others.
    pub fn forced_since(&mut self, mark: usize) {
        let from = mark.min(self.writes.len());
        for w in &mut self.writes[from..] {
            w.2 = true;
        }
    }

    /// A flush completed: everything written so far is durable.
    pub fn flushed(&mut self) {
        // Fresh maps, not clear(): clearing costs the capacity the largest burst
        // of writes left behind (26 us per flush after a 256 MiB lay-out).
        self.old = HashMap::new();
        self.writes = Vec::new();
    }

    /// Sectors written since the last flush.
    pub fn dirty_sectors(&self) -> usize {
        self.old.len()
    }

    /// Cuts the power now: what was written since the last flush survives as the plan's mode says.
    pub fn cut(&mut self, store: &Store) {
        if !self.powered {
            return;
        }
        // Every dirty sector starts from its pre-flush contents; the writes that
        // reached the media are then laid over it in order.
        let mut sectors: std::collections::BTreeMap<u64, Box<[u8; SECTOR as usize]>> = self.old.drain().collect();
        for (offset, data, forced) in std::mem::take(&mut self.writes) {
            // 0: reached the media whole, 1: lost, 2: torn. A forced write was durable
            // when it completed.
            let fate = if forced {
                0
            } else if self.plan.mode == CutMode::Drop {
                1
            } else {
                self.rng.u8(..3)
            };
            let end = offset + data.len() as u64;
            for sector in offset / SECTOR..end.div_ceil(SECTOR) {
                let kept = match fate {
                    0 => true,
                    1 => false,
                    _ => self.rng.bool(),
                };
                if !kept {
                    continue;
                }
                let at = sector * SECTOR;
                let from = offset.max(at);
                let to = end.min(at + SECTOR);
                let image = sectors.get_mut(&sector).expect("every written sector has a pre-flush image");
                image[(from - at) as usize..(to - at) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            }
        }
        for (sector, image) in sectors {
            let at = sector * SECTOR;
            let n = SECTOR.min(store.len() - at) as usize;
            // SAFETY: the sector was inside the store when it was saved.
            unsafe { store.write(at, image.as_ptr(), n) };
        }
        self.powered = false;
        self.cuts += 1;
    }

    /// Whether the power is on.
    pub fn powered(&self) -> bool {
        self.powered
    }

    /// Power cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Powers the device back on with an empty cache; no further cut is planned.
    pub fn power_on(&mut self) {
        self.old = HashMap::new();
        self.writes = Vec::new();
        self.powered = true;
        self.plan.after = None;
        self.commands = 0;
    }

    /// Plans a cut just before the command after `commands` more commands.
    pub fn cut_after(&mut self, commands: u64) {
        self.plan.after = Some(self.commands + commands);
    }

    /// Commands admitted since power-on.
    pub fn commands(&self) -> u64 {
        self.commands
    }
}
