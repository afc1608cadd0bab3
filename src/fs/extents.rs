//! A file's extent map: sorted, non-overlapping runs of file blocks mapped to
//! device blocks, each written or not yet written (reads as zeros).
//!
//! Pure functions over `Vec<Extent>`, tested on their own; the file layer
//! calls them with the file's lock held.

use super::format::Extent;

/// A piece of a block range as the map has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First file block.
    pub logical: u64,
    /// Blocks.
    pub len: u64,
    /// First device block; `None` for a hole.
    pub physical: Option<u64>,
    /// Allocated but not written yet (reads as zeros).
    pub unwritten: bool,
}

impl Run {
    /// Whether reading it needs the device (it is mapped and written).
    pub fn has_data(&self) -> bool {
        self.physical.is_some() && !self.unwritten
    }
}

/// Index of the first extent ending after `block`.
fn first_after(extents: &[Extent], block: u64) -> usize {
    extents.partition_point(|e| e.end() <= block)
}

/// Where file block `block` is: `Some((device block, unwritten))`, or `None` in a hole.
pub fn locate(extents: &[Extent], block: u64) -> Option<(u64, bool)> {
    let e = extents.get(first_after(extents, block))?;
    (e.logical as u64 <= block).then(|| (e.physical + (block - e.logical as u64), e.unwritten))
}

/// The first written stretch of one extent that ends after file block
/// `block`, as `[start, end)` with `start` at least `block`.
pub fn next_written(extents: &[Extent], block: u64) -> Option<(u64, u64)> {
    let at = first_after(extents, block);
    extents[at..].iter().find(|e| !e.unwritten).map(|e| ((e.logical as u64).max(block), e.end()))
}

/// The runs (mapped pieces and holes) covering file blocks `[first, end)`.
pub fn runs(extents: &[Extent], first: u64, end: u64) -> Vec<Run> {
    let mut out = Vec::new();
    let mut at = first;
    for e in &extents[first_after(extents, first)..] {
        if at >= end {
            break;
        }
        let start = e.logical as u64;
        if start >= end {
            break;
        }
        if start > at {
            out.push(Run { logical: at, len: start - at, physical: None, unwritten: false });
            at = start;
        }
        let stop = e.end().min(end);
        out.push(Run {
            logical: at,
            len: stop - at,
            physical: Some(e.physical + (at - start)),
            unwritten: e.unwritten,
        });
        at = stop;
    }
    if at < end {
        out.push(Run { logical: at, len: end - at, physical: None, unwritten: false });
    }
    out
}

/// Splits runs into pieces of at most `max` blocks (bounded buffers and requests).
pub fn pieces(runs: Vec<Run>, max: u64) -> impl Iterator<Item = Run> {
    runs.into_iter().flat_map(move |r| {
        (0..r.len.div_ceil(max)).map(move |i| {
            let skip = i * max;
            Run { logical: r.logical + skip, len: (r.len - skip).min(max), physical: r.physical.map(|p| p + skip), ..r }
        })
    })
}

/// Merges neighbours that continue each other on the device with the same state.
fn coalesce(extents: &mut Vec<Extent>) {
    let mut out: Vec<Extent> = Vec::with_capacity(extents.len());
    for e in extents.drain(..) {
        match out.last_mut() {
            Some(p)
                if p.end() == e.logical as u64
                    && p.physical + p.len as u64 == e.physical
                    && p.unwritten == e.unwritten
                    && p.len as u64 + e.len as u64 <= u32::MAX as u64 =>
            {
                p.len += e.len
            }
            _ => out.push(e),
        }
    }
    *extents = out;
}

/// Replaces `extents[from..to]` with `with`, merged with each other and with
/// the neighbours on either side where they continue each other. The rest of
/// the map is coalesced already (every change goes through here), so only
/// this stretch needs looking at: a change costs a binary search and a move,
/// not a pass over a map of thousands of extents (a 130 MB tar archive written
/// block by block spent 60% of its time re-merging its whole map).
fn replace_coalesced(extents: &mut Vec<Extent>, from: usize, to: usize, with: Vec<Extent>) {
    let lo = from.saturating_sub(1);
    let hi = (to + 1).min(extents.len());
    let mut stretch: Vec<Extent> = extents[lo..from].to_vec();
    stretch.extend(with);
    stretch.extend_from_slice(&extents[to..hi]);
    coalesce(&mut stretch);
    extents.splice(lo..hi, stretch);
    debug_assert!(extents.windows(2).all(|w| w[0].end() <= w[1].logical as u64), "extents overlap or are unsorted");
}

/// Maps a hole `[logical, logical+len)` to device blocks from `physical`, not yet written.
pub fn insert_unwritten(extents: &mut Vec<Extent>, logical: u64, len: u64, physical: u64) {
    let at = first_after(extents, logical);
    debug_assert!(extents.get(at).is_none_or(|e| e.logical as u64 >= logical + len), "inserting over a mapping");
    let new = Extent { logical: logical as u32, len: len as u32, physical, unwritten: true };
    replace_coalesced(extents, at, at, vec![new]);
}

/// Marks file blocks `[first, end)` as written.
pub fn mark_written(extents: &mut Vec<Extent>, first: u64, end: u64) -> bool {
    let lo = first_after(extents, first);
    let hi = lo + extents[lo..].partition_point(|e| (e.logical as u64) < end);
    if !extents[lo..hi].iter().any(|e| e.unwritten) {
        return false;
    }
    let mut out = Vec::with_capacity(hi - lo + 2);
    for &e in &extents[lo..hi] {
        let (s, t) = (e.logical as u64, e.end());
        if !e.unwritten {
            out.push(e);
            continue;
        }
        let a = s.max(first);
        let b = t.min(end);
        let piece = |from: u64, to: u64, unwritten| Extent {
            logical: from as u32,
            len: (to - from) as u32,
            physical: e.physical + (from - s),
            unwritten,
        };
        if s < a {
            out.push(piece(s, a, true));
        }
        out.push(piece(a, b, false));
        if b < t {
            out.push(piece(b, t, true));
        }
    }
    replace_coalesced(extents, lo, hi, out);
    true
}

/// Marks every written block from file block `first` on as not written (it
/// reads as zeros again); returns whether anything changed. What a file's map
/// holds past its size is never data: a grown file must read zeros there.
pub fn mark_unwritten_from(extents: &mut Vec<Extent>, first: u64) -> bool {
    let lo = first_after(extents, first);
    if !extents[lo..].iter().any(|e| !e.unwritten) {
        return false;
    }
    let mut out = Vec::with_capacity(extents.len() - lo + 1);
    for &e in &extents[lo..] {
        let s = e.logical as u64;
        if s < first {
            let kept = (first - s) as u32;
            out.push(Extent { len: kept, ..e });
            out.push(Extent {
                logical: first as u32,
                len: e.len - kept,
                physical: e.physical + kept as u64,
                unwritten: true,
            });
        } else {
            out.push(Extent { unwritten: true, ..e });
        }
    }
    let hi = extents.len();
    replace_coalesced(extents, lo, hi, out);
    true
}

/// Unmaps file blocks `[first, end)`; returns the device runs `(start, len)` that were mapped there.
pub fn cut(extents: &mut Vec<Extent>, first: u64, end: u64) -> Vec<(u64, u64)> {
    let mut freed = Vec::new();
    let mut out = Vec::with_capacity(extents.len() + 1);
    for e in extents.drain(..) {
        let (s, t) = (e.logical as u64, e.end());
        if t <= first || s >= end {
            out.push(e);
            continue;
        }
        let a = s.max(first);
        let b = t.min(end);
        freed.push((e.physical + (a - s), b - a));
        if s < a {
            out.push(Extent { len: (a - s) as u32, ..e });
        }
        if b < t {
            out.push(Extent { logical: b as u32, len: (t - b) as u32, physical: e.physical + (b - s), ..e });
        }
    }
    *extents = out;
    freed
}

/// Device block that would continue the mapping just before file block `logical`.
pub fn goal_for(extents: &[Extent], logical: u64) -> Option<u64> {
    let at = first_after(extents, logical);
    let prev = extents[..at].last()?;
    Some(prev.physical + prev.len as u64 + (logical - prev.end()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ext(logical: u32, len: u32, physical: u64, unwritten: bool) -> Extent {
        Extent { logical, len, physical, unwritten }
    }

    #[test]
    fn marking_unwritten_from_a_block_splits_the_extent_it_falls_in() {
        let mut map = vec![ext(0, 4, 100, false), ext(4, 2, 200, true), ext(8, 3, 300, false)];
        assert!(mark_unwritten_from(&mut map, 2));
        assert_eq!(map, vec![ext(0, 2, 100, false), ext(2, 2, 102, true), ext(4, 2, 200, true), ext(8, 3, 300, true)]);
        assert!(!mark_unwritten_from(&mut map, 2), "nothing written is left past block 2");
        let mut map = vec![ext(0, 4, 100, false), ext(4, 4, 104, true)];
        assert!(mark_unwritten_from(&mut map, 2));
        assert_eq!(map, vec![ext(0, 2, 100, false), ext(2, 6, 102, true)], "neighbours merge");
        let mut map = vec![ext(0, 4, 100, false)];
        assert!(!mark_unwritten_from(&mut map, 4));
        assert!(!mark_unwritten_from(&mut Vec::new(), 0));
    }

    #[test]
    fn runs_cover_holes_and_mappings() {
        let m = vec![ext(2, 3, 100, false), ext(8, 2, 50, true)];
        assert_eq!(
            runs(&m, 0, 11),
            vec![
                Run { logical: 0, len: 2, physical: None, unwritten: false },
                Run { logical: 2, len: 3, physical: Some(100), unwritten: false },
                Run { logical: 5, len: 3, physical: None, unwritten: false },
                Run { logical: 8, len: 2, physical: Some(50), unwritten: true },
                Run { logical: 10, len: 1, physical: None, unwritten: false },
            ]
        );
        assert_eq!(runs(&m, 3, 4), vec![Run { logical: 3, len: 1, physical: Some(101), unwritten: false }]);
        assert_eq!(locate(&m, 3), Some((101, false)));
        assert_eq!(locate(&m, 9), Some((51, true)));
        assert_eq!(locate(&m, 5), None);
        assert_eq!(locate(&m, 10), None);
    }

    #[test]
    fn written_pieces_split_and_merge_back() {
        let mut m = vec![];
        insert_unwritten(&mut m, 0, 4, 10);
        insert_unwritten(&mut m, 4, 4, 14);
        assert_eq!(m, vec![ext(0, 8, 10, true)]);
        assert!(mark_written(&mut m, 2, 3));
        assert_eq!(m, vec![ext(0, 2, 10, true), ext(2, 1, 12, false), ext(3, 5, 13, true)]);
        assert!(mark_written(&mut m, 0, 8));
        assert_eq!(m, vec![ext(0, 8, 10, false)]);
        assert!(!mark_written(&mut m, 0, 8));
        assert_eq!(goal_for(&m, 8), Some(18));
        assert_eq!(goal_for(&m, 10), Some(20));
        assert_eq!(goal_for(&[], 3), None);
    }

    #[test]
    fn pieces_are_bounded_and_continue_each_other() {
        let r = Run { logical: 10, len: 600, physical: Some(1000), unwritten: false };
        let p: Vec<_> = pieces(vec![r], 256).collect();
        assert_eq!(p.iter().map(|x| x.len).collect::<Vec<_>>(), vec![256, 256, 88]);
        assert_eq!(p[2].logical, 522);
        assert_eq!(p[2].physical, Some(1512));
    }

    #[test]
    fn cut_frees_exactly_the_range() {
        let mut m = vec![ext(0, 10, 100, false)];
        assert_eq!(cut(&mut m, 3, 5), vec![(103, 2)]);
        assert_eq!(m, vec![ext(0, 3, 100, false), ext(5, 5, 105, false)]);
        assert_eq!(cut(&mut m, 4, u32::MAX as u64), vec![(105, 5)]);
        assert_eq!(m, vec![ext(0, 3, 100, false)]);
    }

    proptest! {
        /// Against a model: one entry per file block.
        #[test]
        fn operations_match_a_block_by_block_model(ops in proptest::collection::vec((0u8..3, 0u64..40, 1u64..8), 1..40)) {
            let mut m: Vec<Extent> = Vec::new();
            let mut model: Vec<Option<(u64, bool)>> = vec![None; 64];
            let mut next_phys = 1000u64;
            for (kind, start, len) in ops {
                let end = (start + len).min(48);
                match kind {
                    0 => {
                        for r in runs(&m, start, end) {
                            if r.physical.is_none() {
                                insert_unwritten(&mut m, r.logical, r.len, next_phys);
                                for i in 0..r.len {
                                    model[(r.logical + i) as usize] = Some((next_phys + i, true));
                                }
                                // Sometimes right after the last mapping, so neighbours can merge.
                                next_phys += r.len + 3 * (start % 2);
                            }
                        }
                    }
                    1 => {
                        mark_written(&mut m, start, end);
                        for (_, u) in model[start as usize..end as usize].iter_mut().flatten() {
                            *u = false;
                        }
                    }
                    _ => {
                        let freed: u64 = cut(&mut m, start, end).iter().map(|r| r.1).sum();
                        let mapped = model[start as usize..end as usize].iter().filter(|s| s.is_some()).count() as u64;
                        prop_assert_eq!(freed, mapped);
                        for slot in &mut model[start as usize..end as usize] { *slot = None; }
                    }
                }
                for w in m.windows(2) {
                    prop_assert!(w[0].end() <= w[1].logical as u64);
                    let continues = w[0].end() == w[1].logical as u64
                        && w[0].physical + w[0].len as u64 == w[1].physical
                        && w[0].unwritten == w[1].unwritten;
                    prop_assert!(!continues, "neighbours left apart: {:?}", w);
                }
                for r in runs(&m, 0, 64) {
                    for i in 0..r.len {
                        let want = model[(r.logical + i) as usize];
                        let got = r.physical.map(|p| (p + i, r.unwritten));
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}
