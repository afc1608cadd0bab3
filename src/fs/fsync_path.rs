//! The fsync paths: how a commit orders the data it makes durable, the
//! transaction's journal blocks and its commit block.
//!
//! - `conventional`, ext4's ordered journaling step after step: the data,
//!   wait; the journal blocks, wait; flush; the commit block, wait, flush
//!   (its FUA). Three device round trips, each preceded by its CPU work.
//! - `aios`, seed 002's asynchronous fsync: the journal blocks are sent
//!   while the data writes are in flight, the commit block is built before
//!   waiting, and one ordering point (wait for all) precedes the commit
//!   block, written with flush semantics: one durable command, a flush and
//!   a FUA write (`REQ_PREFLUSH | REQ_FUA`, as jbd2 writes its commit
//!   block; on io_uring a flush linked to an `RWF_DSYNC` write, so the
//!   kernel issues the write when the flush is done). Two round trips.
//! - `journaled`: the data (up to [`JOURNALED_DATA_BLOCKS`] blocks) goes
//!   into the transaction as images as well as home, and data, journal and
//!   commit block are sent together, the journal blocks and commit block as
//!   one write with forced unit access where the ring allows. One round
//!   trip, where the others wait for the data before the commit.
//!
//! All are crash-consistent: the commit block of `conventional` and `aios`
//! reaches the device only after everything it vouches for is durable, and
//! replay checks its CRC over the transaction. A `journaled` transaction
//! needs nothing outside itself (replay writes its data images home), so a
//! torn one fails its CRC and a whole one repairs torn home writes. What
//! that costs elsewhere: a block whose image is in the journal and that is
//! later written in place (by its file or, freed and reused, by another) is
//! retired by a checkpoint before a commit vouches for the new data, or
//! replay would put the older image back (`Meta::journaled`); and a
//! checkpoint never writes a data image home (it was written home with it,
//! and may have been overwritten since).

use super::format::Block;
use super::journal::Journal;
use super::writeback::Writeback;
use super::{Inner, NodeState};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// Which fsync path a mounted file system takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPath {
    /// Data, journal and commit one after another (Linux ext4's ordered mode).
    Conventional,
    /// Journal blocks overlapped with the data, one ordering point (seed 002).
    #[default]
    Aios,
    /// The data goes into the transaction too (up to [`JOURNALED_DATA_BLOCKS`]
    /// blocks; more are written in place as on `aios`): data, journal and
    /// commit block in one round trip, the journal's with forced unit access.
    /// Replay needs nothing outside the journal, so nothing has to be durable
    /// before the commit block is written (ext4's `data=journal` with
    /// `journal_async_commit`).
    Journaled,
}

/// Most data blocks one fsync puts in its transaction on the `journaled` path
/// (and never more than a quarter of the journal).
pub const JOURNALED_DATA_BLOCKS: usize = 16;

impl FsyncPath {
    /// Parses `conventional`, `aios` or `journaled`.
    pub fn parse(text: &str) -> Result<FsyncPath> {
        match text {
            "conventional" => Ok(FsyncPath::Conventional),
            "aios" => Ok(FsyncPath::Aios),
            "journaled" => Ok(FsyncPath::Journaled),
            _ => Err(Error::spec("fsync path", text, "conventional, aios or journaled")),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            FsyncPath::Conventional => "conventional",
            FsyncPath::Aios => "aios",
            FsyncPath::Journaled => "journaled",
        }
    }
}

/// Commits the running transaction, making `data` (a file's dirty pages, with
/// the file) durable in the same sequence. The caller holds the journal lock.
///
/// A failed data write on the conventional path changes nothing (the caller
/// keeps the pages dirty and may try again); any other failure stops changes
/// to the file system (`EROFS`) until a remount: on the aios path the
/// transaction already records the data's blocks as written.
pub(super) fn commit(fs: &Inner, journal: &mut Journal, data: Option<(&Writeback, &mut NodeState)>) -> Result<()> {
    // Transactions sent without waiting come first: a flush covers only writes
    // that are back, and replay stops at the first transaction missing.
    if let Err(e) = journal.wait_sent() {
        fs.aborted.store(true, Ordering::Release);
        return Err(e);
    }
    let checkpoints_before = journal.stats().checkpoints;
    let result = match fs.options.fsync_path {
        FsyncPath::Conventional => {
            let t = fs.steps.start();
            if let Some((wb, state)) = data {
                wb.write(&fs.disk)?;
                wb.finish(fs, state, true);
            }
            fs.steps.lap(t, |s| &s.fsync_data);
            conventional(fs, journal)
        }
        FsyncPath::Aios => overlapped(fs, journal, data),
        FsyncPath::Journaled => journaled(fs, journal, data),
    };
    settle(fs, journal, result, checkpoints_before, true)
}

/// Writes the running transaction to the journal without making it durable:
/// its blocks and commit block in one batch, no flush and no forced unit
/// access (see [`super::NamespaceCommit::Written`]). A process that dies
/// after this keeps the transaction; a power cut may lose it whole (replay
/// checks the commit's CRC over the body, and stops at the first transaction
/// it cannot trust, so what survives is always a prefix). A transaction that
/// vouches for data written in place is committed durably instead: its
/// commit block must not reach the device's media before that data does.
/// The caller holds the journal lock.
pub(super) fn commit_unflushed(fs: &Inner, journal: &mut Journal) -> Result<()> {
    let checkpoints_before = journal.stats().checkpoints;
    let taken = {
        let mut meta = fs.meta();
        (!meta.vouches_for_data()).then(|| meta.take_transaction(&fs.sb))
    };
    let Some((tid, mut images, mut freed, mut freed_meta)) = taken else {
        return commit(fs, journal, None);
    };
    let result = (|| {
        let mut released = Vec::new();
        if !images.is_empty() && !journal.log_transaction(&mut images, &mut freed, &mut freed_meta) {
            // No log, or it is full: to the device, with all it held.
            journal.take_unwritten(&mut images, &mut freed, &mut freed_meta);
            let p = journal.prepare(&fs.disk, images)?;
            if fs.disk.engine().commit_submits() {
                // In the kernel's hands when the call returns, waited for when
                // something needs it on the device: a create costs a submission,
                // not a round trip (tar x: one per file).
                released = journal.send_unflushed(&fs.disk, p)?;
            } else {
                // One command where the ring allows (a namespace change is usually an
                // image or two and the commit block: one round trip either way, but one
                // command less for the device and the completion path).
                if let Some((first, whole)) = journal.whole_run(&p) {
                    fs.disk.write(first, whole)?;
                } else {
                    let mut batch = fs.disk.batch()?;
                    journal.submit_body(&mut batch, &p, false)?;
                    journal.submit_commit(&mut batch, &p, false)?;
                    batch.wait()?;
                }
                released = journal.committed(p);
                journal.written_unflushed();
            }
        }
        Ok(Committed { tid, freed, freed_meta, released, journaled_blocks: Vec::new() })
    })();
    settle(fs, journal, result, checkpoints_before, false)
}

/// Accounts for a commit that `durable` says was flushed or only written:
/// raises the watermarks, holds or releases what it freed, checkpoints if the
/// journal wants it. A failed commit stops changes (`EROFS`) until a remount.
fn settle(
    fs: &Inner,
    journal: &mut Journal,
    result: Result<Committed>,
    checkpoints_before: u64,
    durable: bool,
) -> Result<()> {
    let Committed { tid, freed, freed_meta, mut released, journaled_blocks } = match result {
        Ok(r) => r,
        Err(e) => {
            // The device and the in-memory metadata may now disagree: stop changes
            // until a remount replays what is durable.
            fs.aborted.store(true, Ordering::Release);
            return Err(e);
        }
    };
    if durable {
        journal.flushed();
    }
    fs.written.fetch_max(tid, Ordering::AcqRel);
    journal.hold_until_checkpoint(freed_meta);
    {
        let mut meta = fs.meta();
        if journal.stats().checkpoints != checkpoints_before {
            // A checkpoint before this transaction was written (to make room, or
            // before a commit that vouches for an overwrite of a journaled block):
            // no older image will be replayed.
            meta.journaled.clear();
        }
        meta.journaled.extend(journaled_blocks);
    }
    if durable {
        // A freed data block may be reused at once even if replay could still write
        // its old image: whoever reuses it either journals it too (a later image wins
        // at replay) or writes it in place, which makes the commit that vouches for
        // it checkpoint first (`Meta::wrote_in_place`).
        released.extend(freed);
        fs.meta().alloc.release(&released);
        // Raised once what it freed may be allocated (a writer short of space that
        // finds its transaction committed looks again and finds the blocks), and
        // before any checkpoint (those it covers need not wait for that).
        fs.committed.store(tid, Ordering::Release);
        released.clear();
    } else {
        // The free is not durable: were the block reused and written before a flush,
        // a power cut could bring back the file that held it, holding another's data.
        // A checkpoint flushes first.
        journal.hold_data_until_checkpoint(freed);
    }
    if journal.wants_checkpoint() {
        match journal.checkpoint(&fs.disk) {
            Ok(r) => {
                released.extend(r);
                fs.meta().journaled.clear();
            }
            Err(e) => {
                fs.aborted.store(true, Ordering::Release);
                return Err(e);
            }
        }
    }
    fs.meta().alloc.release(&released);
    Ok(())
}

/// What a path's commit leaves to account for.
struct Committed {
    tid: u64,
    /// Data runs the transaction freed.
    freed: Vec<(u64, u64)>,
    /// Metadata runs the transaction freed.
    freed_meta: Vec<(u64, u64)>,
    /// Runs a checkpoint on the way released.
    released: Vec<(u64, u64)>,
    /// Data blocks whose images the transaction carries (`journaled` path).
    journaled_blocks: Vec<u64>,
}

/// The running transaction, taken.
struct Taken {
    tid: u64,
    /// Its metadata images.
    images: Vec<(u64, Block)>,
    /// Data runs it freed.
    freed: Vec<(u64, u64)>,
    /// Metadata runs it freed.
    freed_meta: Vec<(u64, u64)>,
    /// It vouches for data written in place: its commit orders behind that data.
    in_place: bool,
    /// Runs a checkpoint taken first released.
    released: Vec<(u64, u64)>,
}

/// Takes the running transaction. If data written in place overwrote a
/// journaled block, a checkpoint runs first.
fn take(fs: &Inner, journal: &mut Journal) -> Result<Taken> {
    let ((tid, mut images, mut freed, mut freed_meta), (in_place, overwrote)) = {
        let mut meta = fs.meta();
        let taken = meta.take_transaction(&fs.sb);
        (taken, meta.take_ordering())
    };
    // What the shared-memory log kept goes to the device with it.
    journal.take_unwritten(&mut images, &mut freed, &mut freed_meta);
    // Replay would write an older journaled image over what was written in place
    // since: a checkpoint (whose flush makes that write durable) retires it first.
    let released = if overwrote { journal.checkpoint(&fs.disk)? } else { Vec::new() };
    Ok(Taken { tid, images, freed, freed_meta, in_place, released })
}

fn conventional(fs: &Inner, journal: &mut Journal) -> Result<Committed> {
    let t = fs.steps.start();
    let Taken { tid, images, freed, freed_meta, mut released, .. } = take(fs, journal)?;
    if images.is_empty() {
        fs.disk.flush()?;
        fs.steps.lap(t, |s| &s.fsync_flush);
        return Ok(Committed { tid, freed, freed_meta, released, journaled_blocks: Vec::new() });
    }
    let p = journal.prepare(&fs.disk, images)?;
    journal.write_body(&fs.disk, &p)?;
    let t = fs.steps.lap(t, |s| &s.fsync_journal);
    fs.disk.flush()?;
    let t = fs.steps.lap(t, |s| &s.fsync_flush);
    journal.write_commit(&fs.disk, &p)?;
    fs.steps.lap(t, |s| &s.fsync_commit);
    released.extend(journal.committed(p));
    Ok(Committed { tid, freed, freed_meta, released, journaled_blocks: Vec::new() })
}

fn overlapped(fs: &Inner, journal: &mut Journal, data: Option<(&Writeback, &mut NodeState)>) -> Result<Committed> {
    let t = fs.steps.start();
    // The data's block map changes (written extents) go in this transaction; no
    // other commit can happen before it (the caller holds the journal lock), and
    // this one is not valid until the data is durable.
    let wb = data.map(|(wb, state)| {
        wb.finish(fs, state, true);
        wb
    });
    let Taken { tid, images, freed, freed_meta, mut released, .. } = take(fs, journal)?;
    if images.is_empty() {
        if let Some(wb) = wb {
            wb.write(&fs.disk)?;
        }
        let t = fs.steps.lap(t, |s| &s.fsync_data);
        fs.disk.flush()?;
        fs.steps.lap(t, |s| &s.fsync_flush);
        return Ok(Committed { tid, freed, freed_meta, released, journaled_blocks: Vec::new() });
    }
    // The data goes first; the journal blocks (and the commit block, not sent yet)
    // are built while it is in flight, then sent to join it.
    let mut prepared = None;
    {
        let mut batch = fs.disk.batch()?;
        if let Some(wb) = wb {
            wb.submit(&mut batch, 0)?;
            batch.send()?;
        }
        let p = prepared.insert(journal.prepare(&fs.disk, images)?);
        journal.submit_body(&mut batch, p, false)?;
        batch.wait()?;
    }
    let p = prepared.expect("prepared above");
    let t = fs.steps.lap(t, |s| &s.fsync_data);
    // The one ordering point: the flush that makes the data and journal blocks
    // durable is the front half of the commit block's own command.
    journal.write_commit_ordered(&fs.disk, &p)?;
    fs.steps.lap(t, |s| &s.fsync_commit);
    released.extend(journal.committed(p));
    Ok(Committed { tid, freed, freed_meta, released, journaled_blocks: Vec::new() })
}

/// The `journaled` path: the file's data (when small) is written home and, as
/// images, into the transaction; data, journal and commit block go out
/// together, the journal's with forced unit access (durable on completion).
/// Replay checks the commit's CRC over the whole body, so a torn transaction
/// is never applied, and applies the data images, so a torn home write is
/// repaired. Where the transaction
/// also vouches for data written only in place (another thread's writeback
/// joined it, or this fsync's data was too large to journal) the commit
/// waits for that data as on `aios`: one durable command after the rest.
fn journaled(fs: &Inner, journal: &mut Journal, data: Option<(&Writeback, &mut NodeState)>) -> Result<Committed> {
    let t = fs.steps.start();
    let own = data.map(|(wb, state)| {
        // A quarter of the journal at most: a transaction must fit it with its
        // metadata, descriptors and commit block (the smallest is 16 blocks).
        let blocks = wb.blocks().count();
        let journal_it = blocks <= JOURNALED_DATA_BLOCKS && blocks as u64 * 4 <= fs.sb.journal_blocks;
        wb.finish(fs, state, !journal_it);
        (wb, journal_it)
    });
    let Taken { tid, mut images, freed, freed_meta, in_place, mut released } = take(fs, journal)?;
    // Transactions written before without a flush must be durable before this
    // commit block is: it is ordered behind them as behind data written in place.
    let in_place = in_place || journal.has_unflushed();
    let mut journaled_blocks = Vec::new();
    if let Some((wb, true)) = own {
        let data = wb.images();
        journaled_blocks.extend(data.iter().map(|(b, _)| *b));
        images.extend(data);
    }
    if images.is_empty() {
        // No metadata and no data to journal: data too large to journal (an
        // overwrite that changed no metadata) is written, then a flush.
        if let Some((wb, false)) = own {
            wb.write(&fs.disk)?;
        }
        let t = fs.steps.lap(t, |s| &s.fsync_data);
        fs.disk.flush()?;
        fs.steps.lap(t, |s| &s.fsync_flush);
        return Ok(Committed { tid, freed, freed_meta, released, journaled_blocks });
    }
    let p = journal.prepare(&fs.disk, images)?;
    {
        let mut batch = fs.disk.batch()?;
        if let Some((wb, _)) = own {
            wb.submit(&mut batch, 0)?;
        }
        // Without an ordering point the journal blocks go with forced unit access:
        // durable when they complete, with no flush after (the home writes need
        // none: replay repairs them, and a checkpoint flushes before it lets the
        // journal go). Body and commit block are one command where the ring
        // allows: replay checks the commit's CRC over the body, so a torn one is
        // never applied (SQLite in WAL mode, a frame and an fdatasync per
        // transaction: three device commands where there were four).
        match journal.whole_run(&p).filter(|_| !in_place) {
            Some((first, whole)) => batch.write_fua(first, whole)?,
            None => {
                journal.submit_body(&mut batch, &p, !in_place)?;
                if !in_place {
                    journal.submit_commit(&mut batch, &p, true)?;
                }
            }
        }
        batch.wait()?;
    }
    let t = fs.steps.lap(t, |s| &s.fsync_data);
    if in_place {
        journal.write_commit_ordered(&fs.disk, &p)?;
        fs.steps.lap(t, |s| &s.fsync_commit);
    }
    released.extend(journal.committed(p));
    journal.forget_images(&journaled_blocks);
    Ok(Committed { tid, freed, freed_meta, released, journaled_blocks })
}
