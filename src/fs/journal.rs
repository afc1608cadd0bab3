//! The metadata journal: a ring of transactions, replayed on mount.
//!
//! A transaction is the set of metadata blocks (inode-table, bitmap and
//! overflow-extent blocks) that changed since the previous one, written as
//! whole images:
//!
//! ```text
//!  [descriptor: seq, home block of each image] [image] [image] ... [commit: seq, count, CRC]
//!  [image] ... [commit: seq, count, CRC, home block of each image]      (compact, format 2)
//! ```
//!
//! A transaction of up to [`COMMIT_TARGETS`] images (every append + fsync's)
//! is compact on a version 2 file system: the commit block names the home
//! blocks and there is no descriptor, one journal block fewer per fsync. On
//! a device that stripes blocks over channels, that is also one block fewer
//! to collide with the data written beside it. Replay finds a compact
//! transaction's commit by looking at the blocks after the position for the
//! commit of the expected sequence number whose count is its offset.
//!
//! Ordered mode, as ext4's: a file's data is written before the metadata
//! that makes it visible (the file layer writes data first, and every commit
//! starts with a flush), so a committed size never exposes blocks that were
//! not written. The commit block goes out only once the data and the
//! transaction's other blocks are durable, and is made durable itself before
//! `fsync` returns. Replay applies, in order, every transaction whose commit
//! names its sequence number and whose CRC matches; it stops at the first
//! that does not (a transaction cut short by a crash).
//!
//! Committed images wait in memory (`pending`) until a checkpoint writes them
//! to their home blocks, flushes, and moves the journal's tail past them.
//! Metadata blocks that were freed are not reused until the checkpoint after
//! their free, because replaying an older transaction would otherwise write a
//! stale image over whatever the block holds now (jbd2's revoke problem).

use super::disk::{Batch, Disk, Sent};
use super::format::{
    BLOCK, Block, COMMIT_TARGETS, Commit, DESCRIPTOR_TARGETS, Descriptor, JournalHeader, Superblock, body_crc, corrupt,
};
use super::shm_log::ShmLog;
use crate::IoBuf;
use crate::error::Result;
use std::collections::BTreeMap;

/// The journal of a mounted file system.
pub struct Journal {
    sb: Superblock,
    /// Where the next transaction goes (block inside the journal area).
    head: u64,
    /// Oldest transaction not yet checkpointed.
    tail: u64,
    /// Blocks from tail to head.
    used: u64,
    /// Sequence number of the next transaction.
    next_seq: u64,
    /// Committed images not yet written home, newest per block.
    pending: BTreeMap<u64, Block>,
    /// Freed metadata blocks to release after the next checkpoint.
    held: Vec<(u64, u64)>,
    /// A transaction was written without a flush since the last one.
    unflushed: bool,
    /// Transactions sent without waiting ([`Journal::send_unflushed`]), once one was.
    sent: Option<Sent>,
    /// Where transactions go instead of the device until the next one the
    /// device gets ([`super::shm_log`]), when the mount keeps one.
    log: Option<ShmLog>,
    /// The newest image of each block the log holds and the device does not.
    unwritten: BTreeMap<u64, Block>,
    /// Data runs the logged transactions freed.
    unwritten_freed: Vec<(u64, u64)>,
    /// Metadata runs the logged transactions freed.
    unwritten_freed_meta: Vec<(u64, u64)>,
    /// The unwritten images were taken into the transaction being written:
    /// once it is on its way, the log starts anew.
    log_taken: bool,
    stats: JournalStats,
}

/// A transaction built and ready to write ([`Journal::prepare`]).
pub struct Prepared {
    head: u64,
    need: u64,
    /// The transaction as it lies in the ring: its body (descriptors and
    /// images), then its commit block.
    blocks: IoBuf,
    images: Vec<(u64, Block)>,
    released: Vec<(u64, u64)>,
}

impl Prepared {
    /// Its commit block.
    fn commit(&self) -> &[u8] {
        &self.blocks[(self.need as usize - 1) * BLOCK..]
    }
}

/// What the journal has done since mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Transactions replayed at mount.
    pub replayed: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Journal blocks written (descriptors, images, commits).
    pub journal_blocks: u64,
    /// Checkpoints.
    pub checkpoints: u64,
    /// Of the commits, those sent without waiting ([`Journal::send_unflushed`]).
    pub sent: u64,
    /// Transactions kept in the shared-memory log instead ([`Journal::log_transaction`]).
    pub logged: u64,
    /// Transactions a killed process left in the shared-memory log, applied at mount.
    pub from_log: u64,
}

/// Journal blocks a transaction of `images` images takes with descriptors, commit included.
pub fn blocks_for(images: usize) -> u64 {
    (images + images.div_ceil(DESCRIPTOR_TARGETS).max(1) + 1) as u64
}

/// Whether a transaction of `images` images is written compact on `sb`.
fn compact(sb: &Superblock, images: usize) -> bool {
    sb.version >= 2 && (1..=COMMIT_TARGETS).contains(&images)
}

impl Journal {
    /// Replays what the journal holds, then what `log` holds that continues
    /// it (transactions a killed process kept in shared memory), and leaves
    /// the journal empty, ready for new transactions.
    pub fn recover(disk: &Disk, sb: &Superblock, log: Option<&ShmLog>) -> Result<Journal> {
        Journal::recover_after(disk, sb, log, false)
    }

    /// [`Journal::recover`] on a device whose last holder left it quiesced
    /// (`quiesced`: everything committed was checkpointed and nothing
    /// written since, as a carried cache whose stamp the superblock matches
    /// vouches): no transaction lies past the header's tail, so the ring is
    /// not searched for one. That search reads up to 59 blocks past the tail
    /// (about a tenth of mounting 8,760 names) and finds nothing there. With
    /// nothing in `log` either, the header is not written: the journal goes
    /// on from its tail and sequence number.
    pub fn recover_after(disk: &Disk, sb: &Superblock, log: Option<&ShmLog>, quiesced: bool) -> Result<Journal> {
        let header = JournalHeader::decode(&disk.read_block(1)?, sb)?;
        let mut j = Journal {
            sb: *sb,
            head: header.tail_pos,
            tail: header.tail_pos,
            used: 0,
            next_seq: header.tail_seq,
            pending: BTreeMap::new(),
            held: Vec::new(),
            unflushed: false,
            sent: None,
            log: None,
            unwritten: BTreeMap::new(),
            unwritten_freed: Vec::new(),
            unwritten_freed_meta: Vec::new(),
            log_taken: false,
            stats: JournalStats::default(),
        };
        let mut images: BTreeMap<u64, Block> = BTreeMap::new();
        let mut scanned = 0;
        while !quiesced
            && let Some((transaction, len)) =
                j.read_transaction(disk, j.head, j.next_seq, sb.journal_blocks - scanned)?
        {
            for (home, image) in transaction {
                images.insert(home, image);
            }
            scanned += len;
            j.head = (j.head + len) % sb.journal_blocks;
            j.next_seq += 1;
            j.stats.replayed += 1;
        }
        // What the device holds ends at `next_seq`; a log that continues from there
        // holds the transactions that came after, newer than all of the above.
        for (seq, record) in (j.next_seq..).zip(log.map(|l| l.records(sb.volume_id, j.next_seq)).unwrap_or_default()) {
            j.check_homes(seq, &record)?;
            images.extend(record);
            j.stats.from_log += 1;
        }
        for (home, image) in &images {
            let mut buf = IoBuf::new(BLOCK);
            buf.copy_from_slice(&image[..]);
            disk.write(*home, &buf)?;
        }
        if quiesced && images.is_empty() {
            // The header's tail is where the last holder's checkpoint (or a mount's
            // skip before it) left it, above every transaction the ring holds: new
            // ones can start there with nothing to skip, and a mount that writes
            // nothing (a `stat`, a `cat`) writes no header either.
            return Ok(j);
        }
        // Skip sequence numbers: whatever a crash left after the last good
        // transaction can then never be mistaken for one written from now on.
        // Transactions written without a flush (`NamespaceCommit::Written`) can
        // survive a cut that lost one before them, and a new, shorter
        // transaction in the lost one's place could line a survivor up with the
        // sequence number expected next. Every transaction written since the
        // last durable header lies within one pass over the ring (two if a
        // checkpoint's header was itself lost, as it is not flushed alone), and
        // each takes at least one block: skipping two rings' worth of numbers
        // puts the next one above all of them.
        j.next_seq += 2 * sb.journal_blocks + 2;
        j.tail = j.head;
        if !images.is_empty() {
            disk.flush()?;
        }
        j.write_header(disk)?;
        Ok(j)
    }

    /// Keeps `log` for this mount's transactions written without a flush,
    /// started anew (call after [`Journal::recover`], which applied what it held).
    pub fn keep_log(&mut self, mut log: ShmLog) {
        log.start(self.sb.volume_id, self.next_seq);
        self.log = Some(log);
    }

    /// Keeps a transaction (its images, the runs it freed, taken from the
    /// vectors) in the shared-memory log instead of writing it: false (and
    /// nothing taken) if the mount keeps no log or the log is full, and the
    /// caller writes it to the device with what the log holds
    /// ([`Journal::take_unwritten`]).
    pub fn log_transaction(
        &mut self,
        images: &mut Vec<(u64, Block)>,
        freed: &mut Vec<(u64, u64)>,
        freed_meta: &mut Vec<(u64, u64)>,
    ) -> bool {
        let Some(log) = self.log.as_mut() else { return false };
        // The journal must take all the log holds in one transaction, with what the
        // transaction that takes it brings (a `journaled` fsync's data: up to a
        // quarter of the ring): the log's distinct blocks, a quarter at most.
        if (self.unwritten.len() + images.len()) as u64 * 4 > self.sb.journal_blocks || !log.append(images) {
            return false;
        }
        self.unwritten.extend(images.drain(..));
        self.unwritten_freed.append(freed);
        self.unwritten_freed_meta.append(freed_meta);
        self.stats.logged += 1;
        true
    }

    /// Adds what the shared-memory log holds (older) to a transaction about
    /// to be written (`images`, newer, win), with the runs it freed; once
    /// that transaction is on its way ([`Journal::committed`]) the log
    /// starts anew.
    pub fn take_unwritten(
        &mut self,
        images: &mut Vec<(u64, Block)>,
        freed: &mut Vec<(u64, u64)>,
        freed_meta: &mut Vec<(u64, u64)>,
    ) {
        if self.unwritten.is_empty() {
            return;
        }
        let mut merged = std::mem::take(&mut self.unwritten);
        merged.extend(images.drain(..));
        images.extend(merged);
        freed.append(&mut self.unwritten_freed);
        freed_meta.append(&mut self.unwritten_freed_meta);
        self.log_taken = true;
    }

    /// Whether every committed image is home: nothing in the journal or in
    /// the shared-memory log that the device's own blocks do not hold.
    pub fn all_home(&self) -> bool {
        self.used == 0 && self.pending.is_empty() && self.unwritten.is_empty()
    }

    /// Whether the shared-memory log holds transactions the device does not have.
    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Reads the transaction `seq` at `pos`, if a whole, committed one is there.
    #[allow(clippy::type_complexity)]
    fn read_transaction(&self, disk: &Disk, pos: u64, seq: u64, room: u64) -> Result<Option<(Vec<(u64, Block)>, u64)>> {
        let vid = self.sb.volume_id;
        let mut at = 0u64;
        let mut body = Vec::new();
        let mut images = Vec::new();
        loop {
            if at + 2 > room {
                return Ok(None);
            }
            let block = self.read_ring(disk, pos + at, 1)?;
            let Some(desc) = Descriptor::decode(&block, vid, seq) else {
                return if at == 0 { self.read_compact(disk, pos, seq, room) } else { Ok(None) };
            };
            if at + 2 + desc.targets.len() as u64 > room {
                return Ok(None);
            }
            body.extend_from_slice(&block);
            let data = self.read_ring(disk, pos + at + 1, desc.targets.len() as u64)?;
            body.extend_from_slice(&data);
            for (i, home) in desc.targets.iter().enumerate() {
                let mut image = super::format::zero_block();
                image.copy_from_slice(&data[i * BLOCK..(i + 1) * BLOCK]);
                images.push((*home, image));
            }
            at += 1 + desc.targets.len() as u64;
            if desc.last {
                break;
            }
        }
        let block = self.read_ring(disk, pos + at, 1)?;
        let Some(commit) = Commit::decode(&block, vid, seq) else { return Ok(None) };
        if commit.blocks as u64 != at || commit.data_crc != body_crc(self.sb.version, &body) || commit.targets.is_some()
        {
            return Ok(None);
        }
        self.check_homes(seq, &images)?;
        Ok(Some((images, at + 1)))
    }

    /// Reads the compact transaction `seq` at `pos` (no descriptor; its commit
    /// names the images' home blocks), if a whole, committed one is there.
    #[allow(clippy::type_complexity)]
    fn read_compact(&self, disk: &Disk, pos: u64, seq: u64, room: u64) -> Result<Option<(Vec<(u64, Block)>, u64)>> {
        if self.sb.version < 2 {
            return Ok(None);
        }
        let span = room.min(COMMIT_TARGETS as u64 + 1);
        if span < 2 {
            return Ok(None);
        }
        // The commit is the block at offset k that names k images; an image is a
        // metadata block, never a commit of this volume and sequence number. Read
        // a few blocks first (most transactions hold one or two images), then
        // twice as many at a time: replay of a full journal reads each block about once.
        let mut blocks: Vec<u8> = Vec::new();
        let mut have = 0u64;
        while have < span {
            let more = (have * 2).max(4).min(span) - have;
            blocks.extend_from_slice(&self.read_ring(disk, pos + have, more)?);
            for k in (have.max(1) as usize)..(have + more) as usize {
                let Some(commit) = Commit::decode(&blocks[k * BLOCK..(k + 1) * BLOCK], self.sb.volume_id, seq) else {
                    continue;
                };
                let Some(targets) = commit.targets.filter(|t| t.len() == k) else { return Ok(None) };
                let body = &blocks[..k * BLOCK];
                if commit.data_crc != body_crc(self.sb.version, body) {
                    return Ok(None);
                }
                let images: Vec<(u64, Block)> = targets
                    .iter()
                    .enumerate()
                    .map(|(i, home)| {
                        let mut image = super::format::zero_block();
                        image.copy_from_slice(&body[i * BLOCK..(i + 1) * BLOCK]);
                        (*home, image)
                    })
                    .collect();
                self.check_homes(seq, &images)?;
                return Ok(Some((images, k as u64 + 1)));
            }
            have += more;
        }
        Ok(None)
    }

    /// Fails replay of a transaction that would write over anything but metadata.
    fn check_homes(&self, seq: u64, images: &[(u64, Block)]) -> Result<()> {
        let sb = &self.sb;
        for (home, _) in images {
            // The superblock (its inode mark), the table, the bitmap, overflow blocks.
            let metadata = *home == 0
                || (*home >= sb.inode_start && *home < sb.journal_start)
                || (*home >= sb.data_start && *home < sb.blocks);
            if !metadata {
                return Err(corrupt(format!(
                    "journal transaction {seq} would write block {home}, which holds no metadata"
                )));
            }
        }
        Ok(())
    }

    fn read_ring(&self, disk: &Disk, pos: u64, count: u64) -> Result<IoBuf> {
        let n = self.sb.journal_blocks;
        let mut buf = IoBuf::new(count as usize * BLOCK);
        let mut done = 0u64;
        while done < count {
            let p = (pos + done) % n;
            let chunk = (count - done).min(n - p);
            let range = done as usize * BLOCK..(done + chunk) as usize * BLOCK;
            disk.read(self.sb.journal_start + p, &mut buf[range])?;
            done += chunk;
        }
        Ok(buf)
    }

    fn write_header(&self, disk: &Disk) -> Result<()> {
        let header = JournalHeader { tail_seq: self.next_seq, tail_pos: self.tail };
        let image = header.encode(self.sb.volume_id);
        let mut buf = IoBuf::new(BLOCK);
        buf.copy_from_slice(&image[..]);
        disk.write(1, &buf)?;
        disk.flush()
    }

    /// Builds transaction `images` (home block, image): its descriptors and images
    /// in one buffer and its commit block, ready to write; makes room in the
    /// journal first (a checkpoint) if it does not fit.
    pub fn prepare(&mut self, disk: &Disk, images: Vec<(u64, Block)>) -> Result<Prepared> {
        let compact = compact(&self.sb, images.len());
        let need = if compact { images.len() as u64 + 1 } else { blocks_for(images.len()) };
        if need > self.sb.journal_blocks {
            return Err(corrupt(format!(
                "a transaction of {} blocks does not fit the journal ({} blocks); make the file system again \
                 with a larger --journal",
                need, self.sb.journal_blocks
            )));
        }
        let mut released = Vec::new();
        if need > self.sb.journal_blocks - self.used {
            released = self.checkpoint(disk)?;
        }
        let seq = self.next_seq;
        let vid = self.sb.volume_id;
        let body_blocks = need as usize - 1;
        let mut blocks = IoBuf::for_overwrite(need as usize * BLOCK);
        let mut at = 0;
        let mut put = |block: &[u8]| {
            blocks[at * BLOCK..(at + 1) * BLOCK].copy_from_slice(block);
            at += 1;
        };
        if compact {
            images.iter().for_each(|(_, image)| put(&image[..]));
        } else {
            let chunks: Vec<_> = images.chunks(DESCRIPTOR_TARGETS).collect();
            let chunks = if chunks.is_empty() { vec![&images[..0]] } else { chunks };
            let last_chunk = chunks.len() - 1;
            for (c, chunk) in chunks.into_iter().enumerate() {
                let desc = Descriptor { seq, targets: chunk.iter().map(|(h, _)| *h).collect(), last: c == last_chunk };
                put(&desc.encode(vid)[..]);
                chunk.iter().for_each(|(_, image)| put(&image[..]));
            }
        }
        debug_assert_eq!(at, body_blocks);
        let targets = compact.then(|| images.iter().map(|(h, _)| *h).collect());
        let body = &blocks[..body_blocks * BLOCK];
        let commit = Commit { seq, blocks: body_blocks as u32, data_crc: body_crc(self.sb.version, body), targets };
        blocks[body_blocks * BLOCK..].copy_from_slice(&commit.encode(vid)[..]);
        let head = self.head;
        Ok(Prepared { head, need, blocks, images, released })
    }

    /// Pieces `(device block, buffer range)` of `len` journal blocks from ring position `pos`.
    fn ring_pieces(&self, pos: u64, len: u64) -> Vec<(u64, std::ops::Range<usize>)> {
        let n = self.sb.journal_blocks;
        let mut out = Vec::new();
        let mut done = 0u64;
        while done < len {
            let p = (pos + done) % n;
            let chunk = (len - done).min(n - p);
            out.push((self.sb.journal_start + p, done as usize * BLOCK..(done + chunk) as usize * BLOCK));
            done += chunk;
        }
        out
    }

    /// The whole transaction, its commit block included, as one run of the ring
    /// to write with one command; `None` where it wraps around the ring's end.
    pub fn whole_run<'a>(&self, p: &'a Prepared) -> Option<(u64, &'a [u8])> {
        (p.head + p.need <= self.sb.journal_blocks).then(|| (self.sb.journal_start + p.head, &p.blocks[..]))
    }

    /// Queues the transaction's descriptors and images (not the commit block) on
    /// a batch; with `fua`, each write is durable when it completes.
    pub fn submit_body<'a>(&self, batch: &mut Batch<'a>, p: &'a Prepared, fua: bool) -> Result<()> {
        for (block, range) in self.ring_pieces(p.head, p.need - 1) {
            if fua {
                batch.write_fua(block, &p.blocks[range])?;
            } else {
                batch.write(block, &p.blocks[range])?;
            }
        }
        Ok(())
    }

    /// Queues the commit block on a batch, with the body, for a transaction
    /// that needs no ordering behind data written in place (its CRC over the
    /// body tells a torn one at replay): with forced unit access (`fua`) it is
    /// durable on completion, without it only written.
    pub fn submit_commit<'a>(&self, batch: &mut Batch<'a>, p: &'a Prepared, fua: bool) -> Result<()> {
        if fua {
            batch.write_fua(self.commit_block(p), p.commit())
        } else {
            batch.write(self.commit_block(p), p.commit())
        }
    }

    /// Writes the transaction's descriptors and images and waits.
    pub fn write_body(&self, disk: &Disk, p: &Prepared) -> Result<()> {
        for (block, range) in self.ring_pieces(p.head, p.need - 1) {
            disk.write(block, &p.blocks[range])?;
        }
        Ok(())
    }

    /// Writes the commit block and makes it durable (a write then a flush: the FUA
    /// write of a device that has one). Call once everything it orders is durable.
    pub fn write_commit(&self, disk: &Disk, p: &Prepared) -> Result<()> {
        disk.write(self.commit_block(p), p.commit())?;
        disk.flush()
    }

    /// Makes everything written so far durable and then writes the commit block
    /// durably, as one device command (flush, then a FUA write). Call once
    /// everything it orders has been written (completed, not yet durable).
    pub fn write_commit_ordered(&self, disk: &Disk, p: &Prepared) -> Result<()> {
        disk.write_durable(self.commit_block(p), p.commit())
    }

    fn commit_block(&self, p: &Prepared) -> u64 {
        self.sb.journal_start + (p.head + p.need - 1) % self.sb.journal_blocks
    }

    /// Sends the whole transaction, its commit block included, to the journal
    /// and returns without waiting for it: it is in the device's hands (with
    /// [`crate::Engine::commit_submits`], in the kernel's block layer, where
    /// a process that dies the next moment does not take it back), and the
    /// next step that needs it on the device waits for it ([`Journal::wait_sent`]:
    /// every durable commit and checkpoint). Not durable (no flush). Errors
    /// of transactions sent before come back here or there. Returns blocks a
    /// checkpoint made for it released.
    pub fn send_unflushed(&mut self, disk: &Disk, mut p: Prepared) -> Result<Vec<(u64, u64)>> {
        let pieces = self.ring_pieces(p.head, p.need);
        let sent = match &mut self.sent {
            Some(s) => s,
            none => none.insert(Sent::new(disk)?),
        };
        sent.look()?;
        let blocks = std::mem::replace(&mut p.blocks, IoBuf::new(0));
        sent.send(disk, &pieces, blocks)?;
        self.stats.sent += 1;
        self.unflushed = true;
        Ok(self.committed(p))
    }

    /// Waits until every transaction sent without waiting is on the device
    /// (written, not flushed); the first error among them.
    pub fn wait_sent(&mut self) -> Result<()> {
        self.sent.as_mut().map_or(Ok(()), Sent::wait_all)
    }

    /// The transaction is durable: account for it; returns blocks a checkpoint made for it released.
    pub fn committed(&mut self, p: Prepared) -> Vec<(u64, u64)> {
        debug_assert_eq!(p.head, self.head);
        self.head = (self.head + p.need) % self.sb.journal_blocks;
        self.used += p.need;
        self.next_seq += 1;
        self.stats.commits += 1;
        let taken = std::mem::take(&mut self.log_taken);
        debug_assert!(taken || self.unwritten.is_empty(), "a transaction went to the device without the log's");
        if let Some(log) = self.log.as_mut() {
            // The device has (or is about to have, sent) everything the log held, and
            // the log's records must continue from the device's next transaction.
            log.start(self.sb.volume_id, self.next_seq);
        }
        self.stats.journal_blocks += p.need;
        for (home, image) in p.images {
            self.pending.insert(home, image);
        }
        p.released
    }

    /// Commits `images` the conventional way, step after step: the transaction's
    /// blocks, wait; flush (they, and data written before, are durable); the
    /// commit block, wait; flush. Returns blocks a checkpoint released.
    pub fn commit(&mut self, disk: &Disk, images: Vec<(u64, Block)>) -> Result<Vec<(u64, u64)>> {
        let p = self.prepare(disk, images)?;
        self.write_body(disk, &p)?;
        disk.flush()?;
        self.write_commit(disk, &p)?;
        Ok(self.committed(p))
    }

    /// Data images a committed transaction carried (the `journaled` fsync path)
    /// are for replay only: their blocks were written home with them, and may
    /// be written in place again later, which a checkpoint writing the image
    /// home would undo.
    pub fn forget_images(&mut self, blocks: &[u64]) {
        for b in blocks {
            self.pending.remove(b);
        }
    }

    /// Metadata blocks freed by a committed transaction: reusable after the next checkpoint.
    pub fn hold_until_checkpoint(&mut self, runs: Vec<(u64, u64)>) {
        for (start, len) in &runs {
            for b in *start..start + len {
                self.pending.remove(&b);
            }
        }
        self.held.extend(runs);
    }

    /// The last transaction was written without a flush: the next checkpoint
    /// flushes before it writes any block home.
    pub fn written_unflushed(&mut self) {
        self.unflushed = true;
    }

    /// Whether a transaction was written without a flush since the last one.
    pub fn has_unflushed(&self) -> bool {
        self.unflushed
    }

    /// A flush made every transaction written so far durable.
    pub fn flushed(&mut self) {
        self.unflushed = false;
    }

    /// Data runs freed by a transaction that is written but not durable:
    /// reusable after the next checkpoint (which flushes first).
    pub fn hold_data_until_checkpoint(&mut self, runs: Vec<(u64, u64)>) {
        self.held.extend(runs);
    }

    /// Whether the journal is over half full (time to checkpoint, off the fsync path if possible).
    pub fn wants_checkpoint(&self) -> bool {
        self.used * 2 > self.sb.journal_blocks || !self.held.is_empty() && self.used * 8 > self.sb.journal_blocks
    }

    /// Writes every committed image home, flushes, and empties the journal.
    /// Returns the held metadata blocks that may now be allocated again.
    pub fn checkpoint(&mut self, disk: &Disk) -> Result<Vec<(u64, u64)>> {
        if self.used == 0 && self.held.is_empty() {
            return Ok(Vec::new());
        }
        // The flush below covers only writes that are back.
        self.wait_sent()?;
        if self.unflushed {
            // A home block written while its only other copy is a journal block
            // not yet durable: a cut that tears the home write would leave
            // nothing to repair it from.
            disk.flush()?;
            self.unflushed = false;
        }
        // Home blocks in runs (an inode table's blocks lie together), all in flight at once.
        let mut runs: Vec<(u64, Vec<&Block>)> = Vec::new();
        for (&home, image) in &self.pending {
            match runs.last_mut() {
                Some((first, images)) if *first + images.len() as u64 == home => images.push(image),
                _ => runs.push((home, vec![image])),
            }
        }
        let bufs: Vec<(u64, IoBuf)> = runs
            .into_iter()
            .map(|(first, images)| {
                let mut buf = IoBuf::for_overwrite(images.len() * BLOCK);
                for (i, image) in images.iter().enumerate() {
                    buf[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&image[..]);
                }
                (first, buf)
            })
            .collect();
        let mut batch = disk.batch()?;
        for (first, buf) in &bufs {
            batch.write(*first, buf)?;
        }
        batch.wait()?;
        disk.flush()?;
        self.tail = self.head;
        self.used = 0;
        self.write_header(disk)?;
        self.pending.clear();
        self.stats.checkpoints += 1;
        Ok(std::mem::take(&mut self.held))
    }

    /// Counters since mount.
    pub fn stats(&self) -> JournalStats {
        self.stats
    }

    /// Writes an empty journal's header for a new file system.
    pub fn format(disk: &Disk, sb: &Superblock) -> Result<()> {
        let header = JournalHeader { tail_seq: 1, tail_pos: 0 };
        let mut buf = IoBuf::new(BLOCK);
        buf.copy_from_slice(&header.encode(sb.volume_id)[..]);
        disk.write(1, &buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, PathConfig};
    use std::sync::Arc;

    fn disk() -> Disk {
        let engine = Engine::open("emu:null,size=4m", PathConfig::preset("sync-path").unwrap()).unwrap();
        Disk::new(Arc::new(engine))
    }

    /// Writes one transaction of `n` inode-table images after what the journal
    /// holds (all but its commit block when `commit` is false) and returns the
    /// journal blocks it took.
    fn write_one(disk: &Disk, sb: &Superblock, n: u64, commit: bool) -> u64 {
        let mut j = Journal::recover(disk, sb, None).unwrap();
        let images = (0..n)
            .map(|i| {
                let mut image = crate::fs::format::zero_block();
                image.fill(0xa0 + i as u8);
                (sb.inode_start + i, image)
            })
            .collect();
        let p = j.prepare(disk, images).unwrap();
        let need = p.need;
        j.write_body(disk, &p).unwrap();
        disk.flush().unwrap();
        if commit {
            j.write_commit(disk, &p).unwrap();
        }
        need
    }

    #[test]
    fn compact_and_descriptor_transactions_replay_and_uncommitted_ones_do_not() {
        let disk = disk();
        // 64 inode-table blocks: enough homes for the largest compact transaction.
        let mut sb = Superblock::layout(disk.blocks(), 512, 128, 7).unwrap();
        let largest = COMMIT_TARGETS as u64;
        let cases = [
            (4, 2, 3),
            (4, largest + 1, largest + 3),
            (3, 2, 3),
            (2, 2, 3),
            (2, largest, largest + 1),
            (2, largest + 1, largest + 3),
            (1, 2, 4),
        ];
        for (version, n, blocks) in cases {
            sb.version = version;
            Journal::format(&disk, &sb).unwrap();
            assert_eq!(write_one(&disk, &sb, n, true), blocks, "format {version}, {n} images");
            let j = Journal::recover(&disk, &sb, None).unwrap();
            assert_eq!(j.stats().replayed, 1, "format {version}, {n} images");
            for i in 0..n {
                assert!(disk.read_block(sb.inode_start + i).unwrap().iter().all(|&b| b == 0xa0 + i as u8));
            }
            // The same transaction without its commit block is not replayed.
            disk.write(sb.inode_start, &IoBuf::new(BLOCK)).unwrap();
            write_one(&disk, &sb, n, false);
            assert_eq!(Journal::recover(&disk, &sb, None).unwrap().stats().replayed, 0, "format {version}");
            assert!(disk.read_block(sb.inode_start).unwrap().iter().all(|&b| b == 0), "format {version}");
        }
    }

    #[test]
    fn a_lost_image_under_a_written_commit_is_not_replayed_even_where_sectors_are_sealed() {
        // Two transactions written without a flush, as namespace changes are; the
        // second one's image never reaches the device (a power cut lost it) and its
        // ring slot still holds the first one's commit block. Both that commit and
        // the lost image (an inode block holding one inode) are blocks of one sealed
        // sector and zeros, which the format 3 check could not tell apart.
        let disk = disk();
        let sb = Superblock::layout(disk.blocks(), 64, 16, 9).unwrap();
        Journal::format(&disk, &sb).unwrap();
        let mut j = Journal::recover(&disk, &sb, None).unwrap();
        let mut inode_block = crate::fs::format::zero_block();
        inode_block[..4].copy_from_slice(&1u32.to_le_bytes());
        inode_block[100] = 7;
        super::super::format::seal_sector_for_test(&mut inode_block[..512]);
        let first = j.prepare(&disk, vec![(sb.inode_start, inode_block.clone())]).unwrap();
        j.write_body(&disk, &first).unwrap();
        disk.write(j.commit_block(&first), first.commit()).unwrap();
        let first_commit = j.commit_block(&first);
        j.committed(first);
        // The second transaction's commit block is written; in its image's slot
        // lies a copy of the first one's commit block, as a stale leftover.
        inode_block[100] = 8;
        super::super::format::seal_sector_for_test(&mut inode_block[..512]);
        let second = j.prepare(&disk, vec![(sb.inode_start + 1, inode_block)]).unwrap();
        let stale = disk.read_block(first_commit).unwrap();
        let image_slot = j.commit_block(&second) - 1;
        disk.write(image_slot, &stale).unwrap();
        disk.write(j.commit_block(&second), second.commit()).unwrap();
        assert_eq!(
            crate::fs::format::body_crc(3, &stale),
            crate::fs::format::body_crc(3, &second.blocks[..BLOCK]),
            "format 3's check sees the stale commit block as the image"
        );
        let j = Journal::recover(&disk, &sb, None).unwrap();
        assert_eq!(j.stats().replayed, 1, "only the first transaction is whole");
        assert!(disk.read_block(sb.inode_start + 1).unwrap().iter().all(|&b| b == 0), "no stale block went home");
    }

    #[test]
    fn a_full_journal_of_compact_transactions_replays_to_its_last_block() {
        let disk = disk();
        let sb = Superblock::layout(disk.blocks(), 64, 16, 9).unwrap();
        Journal::format(&disk, &sb).unwrap();
        let mut j = Journal::recover(&disk, &sb, None).unwrap();
        // Eight transactions of one image and a commit fill the 16-block ring: the last
        // one is found with only two blocks of room left.
        for i in 0..8u8 {
            let mut image = crate::fs::format::zero_block();
            image.fill(i + 1);
            let p = j.prepare(&disk, vec![(sb.inode_start + u64::from(i % 8), image)]).unwrap();
            assert_eq!(p.need, 2);
            j.write_body(&disk, &p).unwrap();
            disk.flush().unwrap();
            j.write_commit(&disk, &p).unwrap();
            j.committed(p);
        }
        assert_eq!(Journal::recover(&disk, &sb, None).unwrap().stats().replayed, 8);
        assert!(disk.read_block(sb.inode_start + 7).unwrap().iter().all(|&b| b == 8));
    }

    fn filled(v: u8) -> Block {
        let mut image = crate::fs::format::zero_block();
        image.fill(v);
        image
    }

    #[test]
    fn the_log_continues_the_device_once_and_a_transaction_that_takes_it_starts_it_anew() {
        let disk = disk();
        let sb = Superblock::layout(disk.blocks(), 64, 32, 9).unwrap();
        Journal::format(&disk, &sb).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let open = || ShmLog::open(&dir.path().join("log"), std::path::Path::new("/dev/null"), 1 << 20).unwrap();
        let mut j = Journal::recover(&disk, &sb, None).unwrap();
        j.keep_log(open());
        // One transaction to the device, then two kept in the log.
        let p = j.prepare(&disk, vec![(sb.inode_start, filled(1))]).unwrap();
        j.write_body(&disk, &p).unwrap();
        j.write_commit(&disk, &p).unwrap();
        j.committed(p);
        let none = || (Vec::new(), Vec::new());
        let (mut f, mut m) = none();
        assert!(j.log_transaction(
            &mut vec![(sb.inode_start, filled(2)), (sb.inode_start + 1, filled(3))],
            &mut f,
            &mut m
        ));
        assert!(j.log_transaction(&mut vec![(sb.inode_start + 1, filled(4))], &mut f, &mut m));
        assert!(j.has_unwritten());
        drop(j); // killed: the device has the first, the log the other two
        let j = Journal::recover(&disk, &sb, Some(&open())).unwrap();
        assert_eq!((j.stats().replayed, j.stats().from_log), (1, 2));
        assert!(disk.read_block(sb.inode_start).unwrap().iter().all(|&b| b == 2));
        assert!(disk.read_block(sb.inode_start + 1).unwrap().iter().all(|&b| b == 4), "the newest image wins");
        // Replay moved the device past the log: never applied twice.
        let j = Journal::recover(&disk, &sb, Some(&open())).unwrap();
        assert_eq!((j.stats().replayed, j.stats().from_log), (0, 0));
        let mut j = j;
        j.keep_log(open());
        assert!(j.log_transaction(&mut vec![(sb.inode_start + 2, filled(5))], &mut f, &mut m));
        let mut images = vec![(sb.inode_start + 3, filled(6))];
        j.take_unwritten(&mut images, &mut f, &mut m);
        assert_eq!(images.iter().map(|(h, b)| (*h - sb.inode_start, b[0])).collect::<Vec<_>>(), vec![(2, 5), (3, 6)]);
        let p = j.prepare(&disk, images).unwrap();
        j.write_body(&disk, &p).unwrap();
        j.write_commit(&disk, &p).unwrap();
        j.committed(p);
        assert!(!j.has_unwritten());
        drop(j);
        let j = Journal::recover(&disk, &sb, Some(&open())).unwrap();
        assert_eq!((j.stats().replayed, j.stats().from_log), (1, 0), "the log was started anew after it");
    }

    #[test]
    fn runs_a_logged_transaction_freed_wait_for_the_transaction_that_takes_the_log() {
        let disk = disk();
        let sb = Superblock::layout(disk.blocks(), 64, 32, 9).unwrap();
        Journal::format(&disk, &sb).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::recover(&disk, &sb, None).unwrap();
        j.keep_log(ShmLog::open(&dir.path().join("log"), std::path::Path::new("/dev/null"), 1 << 20).unwrap());
        let (mut freed, mut freed_meta) = (vec![(900, 4)], vec![(sb.data_start + 1, 1)]);
        assert!(j.log_transaction(&mut vec![(sb.inode_start, filled(1))], &mut freed, &mut freed_meta));
        assert!(freed.is_empty() && freed_meta.is_empty(), "the log keeps them with its transaction");
        // A checkpoint before the journal wrote that transaction must not let them be reused:
        // a power cut would bring back the file that held them.
        assert!(j.checkpoint(&disk).unwrap().is_empty());
        let mut images = Vec::new();
        j.take_unwritten(&mut images, &mut freed, &mut freed_meta);
        assert_eq!((freed, freed_meta), (vec![(900, 4)], vec![(sb.data_start + 1, 1)]));
        assert_eq!(images.len(), 1);
        // What the log holds and what comes in: a quarter of the 32-block ring at most.
        let images = |from: u64, n: u64| (from..from + n).map(|b| (sb.inode_start + b, filled(3))).collect::<Vec<_>>();
        assert!(j.log_transaction(&mut images(0, 7), &mut Vec::new(), &mut Vec::new()), "7 blocks");
        assert!(j.log_transaction(&mut images(7, 1), &mut Vec::new(), &mut Vec::new()), "8");
        assert!(!j.log_transaction(&mut images(8, 1), &mut Vec::new(), &mut Vec::new()), "a ninth is refused");
    }
}
