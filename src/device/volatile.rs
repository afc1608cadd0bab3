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
use crate::hash::IntMap;

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
/// last flush, and each write since (offset, data) in order. Both live in
/// arenas that a flush empties and keeps: a write costs two copies and a
/// hash insert per sector, with no allocation once the arenas have grown
/// (the bookkeeping must not charge the paths it emulates for a device).
pub struct VolatileCache {
    /// Sector number → its slot in `old_images`.
    old: IntMap<u64, u32>,
    /// Contents at the last flush of each sector written since, one
    /// `SECTOR`-byte slot each.
    old_images: Vec<u8>,
    /// Every write since the last flush, in order; its bytes are in `data`.
    writes: Vec<CachedWrite>,
    data: Vec<u8>,
    plan: CutPlan,
    commands: u64,
    powered: bool,
    rng: fastrand::Rng,
    cuts: u64,
}

/// One write since the last flush.
struct CachedWrite {
    offset: u64,
    /// Where its bytes start in `VolatileCache::data`.
    at: usize,
    len: usize,
    /// Written with forced unit access: a cut keeps it whole.
    forced: bool,
}

/// Arena bytes a flush keeps for the next writes; beyond it (a large
/// lay-out before the first flush) the memory goes back.
const KEEP_BYTES: usize = 64 << 20;

impl VolatileCache {
    /// An empty cache, powered on.
    pub fn new(plan: CutPlan) -> VolatileCache {
        VolatileCache {
            old: IntMap::default(),
            old_images: Vec::new(),
            writes: Vec::new(),
            data: Vec::new(),
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
        self.writes.push(CachedWrite { offset, at: self.data.len(), len: data.len(), forced: false });
        self.data.extend_from_slice(data);
        let end = (offset + data.len() as u64).div_ceil(SECTOR);
        let mut sector = offset / SECTOR;
        while sector < end {
            if self.old.contains_key(&sector) {
                sector += 1;
                continue;
            }
            // A run of sectors not yet saved: one read from the store.
            let first = sector;
            while sector < end && !self.old.contains_key(&sector) {
                sector += 1;
            }
            let base = self.old_images.len();
            let bytes = ((sector - first) * SECTOR) as usize;
            self.old_images.resize(base + bytes, 0);
            let at = first * SECTOR;
            let n = (bytes as u64).min(store.len() - at) as usize;
            // SAFETY: `at + n` lies inside the store and the arena holds `bytes >= n` bytes from `base`.
            unsafe { store.read(at, self.old_images[base..].as_mut_ptr(), n) };
            let slot = base / SECTOR as usize;
            for (i, s) in (first..sector).enumerate() {
                self.old.insert(s, (slot + i) as u32);
            }
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
            w.forced = true;
        }
    }

    /// A flush completed: everything written so far is durable.
    pub fn flushed(&mut self) {
        self.forget();
    }

    /// Empties the cache. The arenas keep their memory for the next writes
    /// unless a burst (a lay-out of a whole file) made them large; so does the
    /// sector map unless it is mostly empty room (clearing a map costs its
    /// capacity: 26 us per flush after a 256 MiB lay-out).
    fn forget(&mut self) {
        if self.old.capacity() > 4 * self.old.len().max(1024) {
            self.old = IntMap::default();
        } else {
            self.old.clear();
        }
        for arena in [&mut self.old_images, &mut self.data] {
            arena.clear();
            arena.shrink_to(KEEP_BYTES);
        }
        self.writes.clear();
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
        let mut sectors: std::collections::BTreeMap<u64, Vec<u8>> = self
            .old
            .drain()
            .map(|(sector, slot)| {
                let at = slot as usize * SECTOR as usize;
                (sector, self.old_images[at..at + SECTOR as usize].to_vec())
            })
            .collect();
        for w in std::mem::take(&mut self.writes) {
            // 0: reached the media whole, 1: lost, 2: torn. A forced write was durable
            // when it completed.
            let fate = if w.forced {
                0
            } else if self.plan.mode == CutMode::Drop {
                1
            } else {
                self.rng.u8(..3)
            };
            let (offset, data) = (w.offset, &self.data[w.at..w.at + w.len]);
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
        self.forget();
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
        self.forget();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(store: &Store) -> Vec<u8> {
        let mut image = vec![0u8; store.len() as usize];
        // SAFETY: the whole store into a buffer of its size.
        unsafe { store.read(0, image.as_mut_ptr(), image.len()) };
        image
    }

    /// Random unaligned, overlapping writes with flushes between some of them;
    /// a dropping cut must bring back exactly what the last flush saw, and
    /// the arenas a flush keeps must not leak one flush's records into the next.
    #[test]
    fn a_dropping_cut_restores_exactly_the_last_flushed_contents() {
        let mut rng = fastrand::Rng::with_seed(11);
        for round in 0..40 {
            let store = Store::memory(64 * 1024, false).unwrap();
            let plan = CutPlan { after: None, mode: CutMode::Drop, seed: round };
            let mut cache = VolatileCache::new(plan);
            let mut flushed = snapshot(&store);
            for _ in 0..rng.usize(1..60) {
                if rng.u8(..8) == 0 {
                    cache.flushed();
                    flushed = snapshot(&store);
                    assert_eq!(cache.dirty_sectors(), 0);
                    continue;
                }
                let len = rng.usize(1..9000);
                let offset = rng.u64(..store.len() - len as u64);
                let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                cache.before_write(&store, offset, &data);
                // SAFETY: the range lies inside the store.
                unsafe { store.write(offset, data.as_ptr(), len) };
            }
            cache.cut(&store);
            assert!(snapshot(&store) == flushed, "round {round}: the store is not what the last flush saw");
        }
    }

    /// With every write forced, a cut of any mode keeps the store as it is.
    #[test]
    fn a_cut_keeps_every_forced_write() {
        let mut rng = fastrand::Rng::with_seed(5);
        for mode in [CutMode::Drop, CutMode::Tear] {
            let store = Store::memory(32 * 1024, false).unwrap();
            let mut cache = VolatileCache::new(CutPlan { after: None, mode, seed: 1 });
            for _ in 0..30 {
                let len = rng.usize(1..5000);
                let offset = rng.u64(..store.len() - len as u64);
                let data = vec![rng.u8(1..); len];
                cache.before_write(&store, offset, &data);
                // SAFETY: the range lies inside the store.
                unsafe { store.write(offset, data.as_ptr(), len) };
            }
            cache.forced_since(0);
            let written = snapshot(&store);
            cache.cut(&store);
            assert!(snapshot(&store) == written, "{mode:?}: a forced write was lost");
        }
    }
}
