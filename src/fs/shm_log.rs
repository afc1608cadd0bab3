//! The shared-memory log: metadata transactions a process committed without
//! a flush, kept where they outlive the process, and written to the device's
//! journal in groups.
//!
//! A mount lives in the process that made it. A namespace change (create,
//! unlink, rename, mkdir) must survive that process being killed the moment
//! the call returns, as it does on a kernel file system
//! ([`super::NamespaceCommit`]). Written to the journal one by one, that is a
//! device command per change: `cp -r` of 7,800 files sent 8,965 transactions
//! of four or five blocks each (147 MiB of journal for 131 MiB of data), and
//! their submissions were a quarter of its time. ext4 keeps such changes in
//! the kernel's memory and commits them together every few seconds.
//!
//! Here they go into a file in `/dev/shm` beside the device's mount lock,
//! mapped shared: a store there is in the kernel's page cache at once, where
//! a process that dies does not take it back, and a power cut loses it as it
//! loses the kernel's. The journal writes what the log holds, merged (the
//! newest image of each block once), in the next transaction it writes to
//! the device (a durable commit, or when the log is full), then starts the
//! log anew.
//!
//! - **Layout**: a header (magic, layout, the volume id, the *epoch*: the
//!   sequence number the device's next transaction gets, and the backing
//!   device's path for [`super::carry::sweep`]), then records: CRC, image
//!   count, record number, the images' home blocks, the images. A record's
//!   CRC covers the volume id, the epoch, its number and its contents, and
//!   is stored last: a record cut short by a kill, or left from an older
//!   epoch, does not check.
//! - **Why replay can trust it**: the records continue the device's journal
//!   only if the epoch is exactly the sequence number replay expects next
//!   (the last transaction it found plus one). Every transaction the journal
//!   writes from the log moves the device past the epoch before the log is
//!   started anew, and every mount's replay skips sequence numbers
//!   ([`super::journal::Journal::recover`]) before it writes anything: a log
//!   the device has moved past, whose device was formatted again, or that a
//!   mount without it left behind, never matches.
//! - **Order**: replay applies the device's transactions, then the log's
//!   records in order, flushes, writes the journal header, and only then is
//!   the log started anew (its epoch is the new sequence number).
//! - **Freed blocks**: blocks a logged transaction freed are not reused
//!   until a checkpoint after the journal wrote that transaction to the
//!   device (a power cut would bring back their old owner).
//! - **What it costs**: a record is a copy of the images into memory and a
//!   CRC (a create: four or five blocks, a few microseconds) where it was a
//!   device command; the device writes each block once per group.

use super::format::{BLOCK, Block};
use crate::error::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What the log's file starts with.
pub(super) const MAGIC: &[u8; 8] = b"IOPSHLOG";
/// The file's own layout version.
const LAYOUT: u32 = 1;
/// The header: magic, layout, volume id, epoch, then the backing path (as
/// the carried cache's header has it, where [`super::carry::sweep`] reads it).
const HEADER: usize = BLOCK;
const AT_VOLUME: usize = 24;
const AT_EPOCH: usize = 32;
use super::carry::{AT_PATH, AT_PATH_LEN};
/// A record's own header: CRC, image count, record number, zero.
const RECORD_HEADER: usize = 16;
/// The default size of a log: 8 MiB, about 400 creates between device writes.
pub const DEFAULT_BYTES: u64 = 8 << 20;

/// A shared-memory log, open and mapped, for one device.
pub struct ShmLog {
    path: PathBuf,
    map: memmap2::MmapMut,
    /// Where the next record goes.
    end: usize,
    /// Records since the log was started anew.
    records: u32,
}

impl std::fmt::Debug for ShmLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLog").field("path", &self.path).field("records", &self.records).finish()
    }
}

fn os(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os { context, source }
}

/// Where the log of the device at `lock` (a mount lock file) lives.
pub fn path_beside(lock: &Path) -> PathBuf {
    let name = lock.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let id = name.trim_start_matches("iopath-mount-").trim_end_matches(".lock");
    lock.with_file_name(format!("iopath-shmlog-{id}"))
}

/// The log a killed holder left for the device at `device`, if there is one.
pub fn existing_for(device: &Path) -> Option<ShmLog> {
    let path = path_beside(&super::lock::lock_path(device).ok()?);
    let len = std::fs::metadata(&path).ok()?.len();
    ShmLog::open(&path, device, len).ok()
}

impl ShmLog {
    /// Opens (creating if needed) the log at `path` for the device at
    /// `backing`, `bytes` long (at least a header and a record of one
    /// image). Its space is allocated now, so a full `/dev/shm` fails here,
    /// never as a fault on a store. The caller holds the device's mount
    /// lock. Nothing in it is trusted until [`ShmLog::records`] checks it
    /// against the device.
    pub fn open(path: &Path, backing: &Path, bytes: u64) -> Result<ShmLog> {
        let least = (bytes as usize).max(HEADER + RECORD_HEADER + 8 + BLOCK);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(os(format!("cannot open the shared-memory log {}", path.display())))?;
        let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
        // Never smaller than it is: the records a killed holder left must all be
        // there for replay, whatever size this mount asks for.
        let meta = file.metadata().ok();
        let have = meta.as_ref().map_or(0, |m| m.len() as usize);
        let len = least.max(have.min(1 << 30));
        if have != len {
            file.set_len(len as u64).map_err(os(format!("cannot size the shared-memory log {}", path.display())))?;
        }
        // Memory for all of it now, so that a record never meets a full /dev/shm
        // (SIGBUS); a log a process before this one allocated whole needs nothing
        // (allocating it again walks its pages: a third of a millisecond per mount).
        let allocated =
            have == len && meta.is_some_and(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512 >= len as u64);
        // SAFETY: fallocate on our own file; no memory is touched.
        if !allocated && unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
            return Err(Error::Os {
                context: format!("cannot allocate the shared-memory log {} ({len} bytes)", path.display()),
                source: std::io::Error::last_os_error(),
            });
        }
        let backing = backing.as_os_str().as_encoded_bytes();
        let n = backing.len().min(HEADER - AT_PATH);
        let mut tail = vec![0u8; HEADER - AT_PATH_LEN];
        tail[..8].copy_from_slice(&(n as u64).to_le_bytes());
        tail[8..8 + n].copy_from_slice(&backing[..n]);
        file.write_all_at(&tail, AT_PATH_LEN as u64)
            .map_err(os(format!("cannot write the shared-memory log {}", path.display())))?;
        // SAFETY: the file is sized and allocated above; only the mount lock's
        // holder (this process) maps or changes it.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&file) }
            .map_err(os(format!("cannot map the shared-memory log {}", path.display())))?;
        Ok(ShmLog { path: path.to_path_buf(), map, end: HEADER, records: 0 })
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records it holds for volume `volume` if they continue a device
    /// whose next transaction is `next_seq`, in order, each as (home block,
    /// image) pairs; none otherwise. Stops at the first record that does not
    /// check (cut short by a kill).
    pub fn records(&self, volume: u64, next_seq: u64) -> Vec<Vec<(u64, Block)>> {
        let m = &self.map[..];
        if &m[..8] != MAGIC
            || u32::from_le_bytes(m[8..12].try_into().expect("4 bytes")) != LAYOUT
            || get(m, AT_VOLUME) != volume
            || get(m, AT_EPOCH) != next_seq
        {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut at = HEADER;
        while at + RECORD_HEADER <= m.len() {
            let crc = u32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"));
            let count = u32::from_le_bytes(m[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
            let number = u32::from_le_bytes(m[at + 8..at + 12].try_into().expect("4 bytes"));
            let len = RECORD_HEADER + count * (8 + BLOCK);
            if count == 0 || number as usize != out.len() || at + len > m.len() {
                break;
            }
            let body = &m[at + RECORD_HEADER..at + len];
            if record_crc(volume, next_seq, number, count, body) != crc {
                break;
            }
            let (homes, images) = body.split_at(count * 8);
            out.push(
                homes
                    .chunks(8)
                    .zip(images.chunks(BLOCK))
                    .map(|(h, image)| {
                        let mut block = super::format::zero_block();
                        block.copy_from_slice(image);
                        (u64::from_le_bytes(h.try_into().expect("8 bytes")), block)
                    })
                    .collect(),
            );
            at += len;
        }
        out
    }

    /// Starts the log anew for volume `volume`, its records to continue a
    /// device whose next transaction is `next_seq`: the records it held no
    /// longer check. Call once the device holds everything they held.
    pub fn start(&mut self, volume: u64, next_seq: u64) {
        let m = &mut self.map[..];
        m[..8].copy_from_slice(MAGIC);
        m[8..12].copy_from_slice(&LAYOUT.to_le_bytes());
        // The epoch goes first: with it changed, every old record fails its check,
        // whatever the volume field says should a kill come between the two.
        put(m, AT_EPOCH, next_seq);
        put(m, AT_VOLUME, volume);
        self.end = HEADER;
        self.records = 0;
    }

    /// Whether a record of `images` images fits after those it holds.
    pub fn fits(&self, images: usize) -> bool {
        self.end + RECORD_HEADER + images * (8 + BLOCK) <= self.map.len()
    }

    /// Records `images` after those it holds, if it [`fits`](ShmLog::fits)
    /// (false, and nothing written, if not). The caller holds the journal
    /// lock; the log was [`start`](ShmLog::start)ed for this mount.
    pub fn append(&mut self, images: &[(u64, Block)]) -> bool {
        if images.is_empty() || !self.fits(images.len()) {
            return false;
        }
        let (volume, epoch) = (get(&self.map, AT_VOLUME), get(&self.map, AT_EPOCH));
        let at = self.end;
        let len = RECORD_HEADER + images.len() * (8 + BLOCK);
        let number = self.records;
        let m = &mut self.map[at..at + len];
        m[4..8].copy_from_slice(&(images.len() as u32).to_le_bytes());
        m[8..12].copy_from_slice(&number.to_le_bytes());
        m[12..16].fill(0);
        let (homes, blocks) = m[RECORD_HEADER..].split_at_mut(images.len() * 8);
        for (i, (home, image)) in images.iter().enumerate() {
            homes[i * 8..(i + 1) * 8].copy_from_slice(&home.to_le_bytes());
            blocks[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&image[..]);
        }
        let crc = record_crc(volume, epoch, number, images.len(), &m[RECORD_HEADER..]);
        // Last: until this store the record does not check.
        m[..4].copy_from_slice(&crc.to_le_bytes());
        self.end += len;
        self.records += 1;
        true
    }

    /// Records appended since the log was started anew.
    pub fn len(&self) -> u32 {
        self.records
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
}

fn record_crc(volume: u64, epoch: u64, number: u32, count: usize, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&volume.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(&number.to_le_bytes());
    h.update(&(count as u32).to_le_bytes());
    h.update(body);
    h.finalize()
}

fn get(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The backing device's path a log's `header` (its first block) names, if it is a log's.
pub(super) fn backing_named(header: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if header.len() < HEADER || &header[..8] != MAGIC {
        return None;
    }
    let n = (get(header, AT_PATH_LEN) as usize).min(HEADER - AT_PATH);
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&header[AT_PATH..AT_PATH + n])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(v: u8) -> Block {
        let mut b = super::super::format::zero_block();
        b.fill(v);
        b
    }

    fn log(bytes: u64) -> (tempfile::TempDir, ShmLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = ShmLog::open(&dir.path().join("log"), Path::new("/dev/null"), bytes).unwrap();
        (dir, log)
    }

    #[test]
    fn a_log_with_a_hole_is_allocated_whole_again_when_opened() {
        use std::os::unix::fs::MetadataExt;
        let (dir, mut l) = log(1 << 20);
        let path = dir.path().join("log");
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated() >= 1 << 20, "allocated whole at its first open");
        l.start(7, 100);
        assert!(l.append(&[(10, image(1))]));
        // Its upper half given back to the system (a hole, as anyone short of /dev/shm may punch).
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on the test's own file.
        assert_eq!(unsafe { libc::fallocate(file.as_raw_fd(), punch, 1 << 19, 1 << 19) }, 0);
        assert!(allocated() < 1 << 20);
        let reopened = ShmLog::open(&path, Path::new("/dev/null"), 1 << 20).unwrap();
        assert!(allocated() >= 1 << 20, "a log missing memory is allocated again, not trusted");
        assert_eq!(reopened.records(7, 100).len(), 1, "what it held is still there");
    }

    #[test]
    fn records_come_back_in_order_for_their_epoch_only() {
        let (dir, mut l) = log(1 << 20);
        l.start(7, 100);
        assert!(l.append(&[(10, image(1)), (11, image(2))]));
        assert!(l.append(&[(10, image(3))]));
        let reopened = ShmLog::open(&dir.path().join("log"), Path::new("/dev/null"), 1 << 20).unwrap();
        let got = reopened.records(7, 100);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].iter().map(|(h, b)| (*h, b[0])).collect::<Vec<_>>(), vec![(10, 1), (11, 2)]);
        assert_eq!(got[1].iter().map(|(h, b)| (*h, b[0])).collect::<Vec<_>>(), vec![(10, 3)]);
        assert!(reopened.records(7, 101).is_empty(), "another epoch");
        assert!(reopened.records(8, 100).is_empty(), "another volume");
        l.start(7, 101);
        assert!(l.records(7, 101).is_empty(), "started anew: the old records do not check");
        assert!(l.records(7, 100).is_empty());
    }

    #[test]
    fn a_record_cut_short_ends_what_is_replayed() {
        let (_dir, mut l) = log(1 << 20);
        l.start(1, 5);
        assert!(l.append(&[(3, image(1))]));
        assert!(l.append(&[(4, image(2))]));
        assert!(l.append(&[(5, image(3))]));
        // The second record's image torn (a kill in the middle of the copy).
        let at = HEADER + (RECORD_HEADER + 8 + BLOCK) + RECORD_HEADER + 8 + 100;
        l.map[at] ^= 0xff;
        let got = l.records(1, 5);
        assert_eq!(got.len(), 1, "the torn record and every one after it are dropped");
    }

    #[test]
    fn a_new_epochs_records_do_not_revive_an_older_ones() {
        let (_dir, mut l) = log(1 << 20);
        l.start(1, 5);
        for v in 0..3 {
            assert!(l.append(&[(v as u64 + 3, image(v))]));
        }
        l.start(1, 9);
        assert!(l.append(&[(20, image(9))]));
        let got = l.records(1, 9);
        assert_eq!(got.len(), 1, "the old epoch's second and third records lie beyond, and do not check");
        assert_eq!(got[0][0].0, 20);
    }

    #[test]
    fn a_full_log_refuses_a_record_and_keeps_what_it_has() {
        let (_dir, mut l) = log((HEADER + 2 * (RECORD_HEADER + 8 + BLOCK)) as u64);
        l.start(1, 1);
        assert!(l.append(&[(3, image(1))]));
        assert!(!l.append(&[(4, image(2)), (5, image(3))]));
        assert!(l.append(&[(6, image(4))]));
        assert!(!l.append(&[(7, image(5))]));
        assert_eq!(l.len(), 2);
        assert_eq!(l.records(1, 1).len(), 2);
    }
}
