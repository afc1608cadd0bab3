//! The metadata journal: a ring of transactions, replayed on mount.
//!
//! A transaction is the set of metadata blocks (inode-table, bitmap and
//! overflow-extent blocks) that changed since the previous one, written as
//! whole images:
//!
//! ```text
//!  [descriptor: seq, home block of each image] [image] [image] ... [commit: seq, count, CRC]
//! ```
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

use super::disk::{Batch, Disk};
use super::format::{BLOCK, Block, Commit, DESCRIPTOR_TARGETS, Descriptor, JournalHeader, Superblock, corrupt, crc};
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
    stats: JournalStats,
}

/// A transaction built and ready to write ([`Journal::prepare`]).
pub struct Prepared {
    head: u64,
    need: u64,
    body: IoBuf,
    commit: IoBuf,
    images: Vec<(u64, Block)>,
    released: Vec<(u64, u64)>,
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
}

/// Journal blocks a transaction of `images` images takes, commit included.
pub fn blocks_for(images: usize) -> u64 {
    (images + images.div_ceil(DESCRIPTOR_TARGETS).max(1) + 1) as u64
}

impl Journal {
    /// Replays what the journal holds and leaves it empty, ready for new transactions.
    pub fn recover(disk: &Disk, sb: &Superblock) -> Result<Journal> {
        let header = JournalHeader::decode(&disk.read_block(1)?, sb)?;
        let mut j = Journal {
            sb: *sb,
            head: header.tail_pos,
            tail: header.tail_pos,
            used: 0,
            next_seq: header.tail_seq,
            pending: BTreeMap::new(),
            held: Vec::new(),
            stats: JournalStats::default(),
        };
        let mut images: BTreeMap<u64, Block> = BTreeMap::new();
        let mut scanned = 0;
        while let Some((transaction, len)) =
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
        for (home, image) in &images {
            let mut buf = IoBuf::new(BLOCK);
            buf.copy_from_slice(&image[..]);
            disk.write(*home, &buf)?;
        }
        // Skip a sequence number: whatever a crash left after the last good
        // transaction can then never be mistaken for the next one.
        j.next_seq += 1;
        j.tail = j.head;
        if !images.is_empty() {
            disk.flush()?;
        }
        j.write_header(disk)?;
        Ok(j)
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
            let Some(desc) = Descriptor::decode(&block, vid, seq) else { return Ok(None) };
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
        if commit.blocks as u64 != at || commit.data_crc != crc(&body) {
            return Ok(None);
        }
        let sb = &self.sb;
        for (home, _) in &images {
            let metadata =
                (*home >= sb.inode_start && *home < sb.journal_start) || (*home >= sb.data_start && *home < sb.blocks);
            if !metadata {
                return Err(corrupt(format!(
                    "journal transaction {seq} would write block {home}, which holds no metadata"
                )));
            }
        }
        Ok(Some((images, at + 1)))
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
        let need = blocks_for(images.len());
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
        let mut body = IoBuf::new(body_blocks * BLOCK);
        let mut at = 0;
        let chunks: Vec<_> = images.chunks(DESCRIPTOR_TARGETS).collect();
        let chunks = if chunks.is_empty() { vec![&images[..0]] } else { chunks };
        let last_chunk = chunks.len() - 1;
        for (c, chunk) in chunks.into_iter().enumerate() {
            let desc = Descriptor { seq, targets: chunk.iter().map(|(h, _)| *h).collect(), last: c == last_chunk };
            body[at * BLOCK..(at + 1) * BLOCK].copy_from_slice(&desc.encode(vid)[..]);
            at += 1;
            for (_, image) in chunk {
                body[at * BLOCK..(at + 1) * BLOCK].copy_from_slice(&image[..]);
                at += 1;
            }
        }
        debug_assert_eq!(at, body_blocks);
        let commit = Commit { seq, blocks: body_blocks as u32, data_crc: crc(&body) };
        let mut commit_block = IoBuf::new(BLOCK);
        commit_block.copy_from_slice(&commit.encode(vid)[..]);
        let head = self.head;
        Ok(Prepared { head, need, body, commit: commit_block, images, released })
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

    /// Queues the transaction's descriptors and images (not the commit block) on a batch.
    pub fn submit_body<'a>(&self, batch: &mut Batch<'a>, p: &'a Prepared) -> Result<()> {
        for (block, range) in self.ring_pieces(p.head, p.need - 1) {
            batch.write(block, &p.body[range])?;
        }
        Ok(())
    }

    /// Writes the transaction's descriptors and images and waits.
    pub fn write_body(&self, disk: &Disk, p: &Prepared) -> Result<()> {
        for (block, range) in self.ring_pieces(p.head, p.need - 1) {
            disk.write(block, &p.body[range])?;
        }
        Ok(())
    }

    /// Writes the commit block and makes it durable (a write then a flush: the FUA
    /// write of a device that has one). Call once everything it orders is durable.
    pub fn write_commit(&self, disk: &Disk, p: &Prepared) -> Result<()> {
        disk.write(self.sb.journal_start + (p.head + p.need - 1) % self.sb.journal_blocks, &p.commit)?;
        disk.flush()
    }

    /// The transaction is durable: account for it; returns blocks a checkpoint made for it released.
    pub fn committed(&mut self, p: Prepared) -> Vec<(u64, u64)> {
        debug_assert_eq!(p.head, self.head);
        self.head = (self.head + p.need) % self.sb.journal_blocks;
        self.used += p.need;
        self.next_seq += 1;
        self.stats.commits += 1;
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

    /// Metadata blocks freed by a committed transaction: reusable after the next checkpoint.
    pub fn hold_until_checkpoint(&mut self, runs: Vec<(u64, u64)>) {
        for (start, len) in &runs {
            for b in *start..start + len {
                self.pending.remove(&b);
            }
        }
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
        for (home, image) in &self.pending {
            let mut buf = IoBuf::new(BLOCK);
            buf.copy_from_slice(&image[..]);
            disk.write(*home, &buf)?;
        }
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
