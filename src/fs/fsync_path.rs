//! The two fsync paths: how a commit orders the data it makes durable, the
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
//!
//! Both are crash-consistent for the same reason: the commit block reaches
//! the device only after everything it vouches for is durable, and replay
//! checks its CRC over the transaction.

use super::file::Writeback;
use super::journal::Journal;
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
}

impl FsyncPath {
    /// Parses `conventional` or `aios`.
    pub fn parse(text: &str) -> Result<FsyncPath> {
        match text {
            "conventional" => Ok(FsyncPath::Conventional),
            "aios" => Ok(FsyncPath::Aios),
            _ => Err(Error::spec("fsync path", text, "conventional or aios")),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            FsyncPath::Conventional => "conventional",
            FsyncPath::Aios => "aios",
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
    let result = match fs.options.fsync_path {
        FsyncPath::Conventional => {
            let t = fs.steps.start();
            if let Some((wb, state)) = data {
                wb.write(&fs.disk)?;
                wb.finish(fs, state);
            }
            fs.steps.lap(t, |s| &s.fsync_data);
            conventional(fs, journal)
        }
        FsyncPath::Aios => overlapped(fs, journal, data),
    };
    let (tid, freed, freed_meta, mut released) = match result {
        Ok(r) => r,
        Err(e) => {
            // The device and the in-memory metadata may now disagree: stop changes
            // until a remount replays what is durable.
            fs.aborted.store(true, Ordering::Release);
            return Err(e);
        }
    };
    fs.committed.store(tid, Ordering::Release);
    journal.hold_until_checkpoint(freed_meta);
    released.extend(freed);
    if journal.wants_checkpoint() {
        match journal.checkpoint(&fs.disk) {
            Ok(r) => released.extend(r),
            Err(e) => {
                fs.aborted.store(true, Ordering::Release);
                return Err(e);
            }
        }
    }
    fs.meta().alloc.release(&released);
    Ok(())
}

type Committed = (u64, Vec<(u64, u64)>, Vec<(u64, u64)>, Vec<(u64, u64)>);

fn conventional(fs: &Inner, journal: &mut Journal) -> Result<Committed> {
    let t = fs.steps.start();
    let (tid, images, freed, freed_meta) = fs.meta().take_transaction(&fs.sb);
    if images.is_empty() {
        fs.disk.flush()?;
        fs.steps.lap(t, |s| &s.fsync_flush);
        return Ok((tid, freed, freed_meta, Vec::new()));
    }
    let p = journal.prepare(&fs.disk, images)?;
    journal.write_body(&fs.disk, &p)?;
    let t = fs.steps.lap(t, |s| &s.fsync_journal);
    fs.disk.flush()?;
    let t = fs.steps.lap(t, |s| &s.fsync_flush);
    journal.write_commit(&fs.disk, &p)?;
    fs.steps.lap(t, |s| &s.fsync_commit);
    let released = journal.committed(p);
    Ok((tid, freed, freed_meta, released))
}

fn overlapped(fs: &Inner, journal: &mut Journal, data: Option<(&Writeback, &mut NodeState)>) -> Result<Committed> {
    let t = fs.steps.start();
    // The data's block map changes (written extents) go in this transaction; no
    // other commit can happen before it (the caller holds the journal lock), and
    // this one is not valid until the data is durable.
    let wb = data.map(|(wb, state)| {
        wb.finish(fs, state);
        wb
    });
    let (tid, images, freed, freed_meta) = fs.meta().take_transaction(&fs.sb);
    if images.is_empty() {
        if let Some(wb) = wb {
            wb.write(&fs.disk)?;
        }
        let t = fs.steps.lap(t, |s| &s.fsync_data);
        fs.disk.flush()?;
        fs.steps.lap(t, |s| &s.fsync_flush);
        return Ok((tid, freed, freed_meta, Vec::new()));
    }
    // The data goes first; the journal blocks (and the commit block, not sent yet)
    // are built while it is in flight, then sent to join it.
    let mut prepared = None;
    {
        let mut batch = fs.disk.batch()?;
        if let Some(wb) = wb {
            wb.submit(&mut batch)?;
            batch.send()?;
        }
        let p = prepared.insert(journal.prepare(&fs.disk, images)?);
        journal.submit_body(&mut batch, p)?;
        batch.wait()?;
    }
    let p = prepared.expect("prepared above");
    let t = fs.steps.lap(t, |s| &s.fsync_data);
    // The one ordering point: the flush that makes the data and journal blocks
    // durable is the front half of the commit block's own command.
    journal.write_commit_ordered(&fs.disk, &p)?;
    fs.steps.lap(t, |s| &s.fsync_commit);
    let released = journal.committed(p);
    Ok((tid, freed, freed_meta, released))
}
