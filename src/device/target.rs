//! Opening a real target (file or block device) for the `psync` and `uring`
//! backends: O_DIRECT by default, a missing file created and laid out at the
//! requested size (as fio does, but with iopath's self-describing pattern,
//! so a later read-only `--verify` can check it), the alignment O_DIRECT
//! needs found out, and a [`Guard`] that keeps `bench` and `compare` from
//! destroying data iopath did not put there.
//!
//! What the guard refuses, unless the caller allows it: writing to an
//! existing file iopath did not create (iopath marks the files it creates
//! with the extended attribute `user.iopath`), writing to any block device,
//! and, even then, writing to a target that holds a file system, partition
//! table, volume or swap signature. A block device opened for writing is
//! opened `O_EXCL`, so the kernel itself refuses one that is mounted or in
//! use. A read-only open never writes: no lay-out, no extension.

use super::spec::Options;
use crate::error::{Error, Result};
use crate::sys;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What a caller lets iopath write to a target it did not create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Guard {
    /// No checks: the caller names its own file and means to write to it
    /// (the library's default: a program that opens its own data file).
    #[default]
    Off,
    /// Write only to files iopath created, unless allowed (`bench` and
    /// `compare` use this).
    Protect {
        /// Existing files and block devices may be overwritten (`--allow-overwrite`).
        allow_overwrite: bool,
        /// Even one that holds a file system, partition table, volume or swap
        /// signature (`--allow-fs-overwrite`, on top of `allow_overwrite`).
        allow_fs: bool,
    },
}

/// How to open a file or block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// The file or device node.
    pub path: PathBuf,
    /// Open with O_DIRECT (bypass the page cache). Default on.
    pub direct: bool,
    /// Size to create or extend a regular file to; `None` uses the existing size.
    pub size: Option<u64>,
    /// Open read-only (`readonly=1`): nothing is ever written, not even a lay-out.
    pub read_only: bool,
    /// What may be written to a target iopath did not create.
    pub guard: Guard,
}

impl TargetConfig {
    /// Parses the common options `direct=`, `size=` and `readonly=` after a path.
    pub fn parse(path: &str, opts: &mut Options, default_size: Option<u64>) -> Result<TargetConfig> {
        if path.is_empty() {
            return Err(opts.error("a path is required, e.g. uring:/dev/loop0 or psync:/tmp/iopath.img"));
        }
        let direct = opts.take_bool("direct")?.unwrap_or(true);
        let size = opts.take_size("size")?.or(default_size);
        let read_only = opts.take_bool("readonly")?.unwrap_or(false);
        Ok(TargetConfig { path: PathBuf::from(path), direct, size, read_only, guard: Guard::Off })
    }
}

/// An open target.
#[derive(Debug)]
pub struct Target {
    /// The open file.
    pub file: File,
    /// Where it is.
    pub path: PathBuf,
    /// Usable size in bytes.
    pub size: u64,
    /// Alignment O_DIRECT needs (1 without O_DIRECT).
    pub alignment: u32,
    /// Whether it is a block device.
    pub is_block_device: bool,
    /// Whether it was opened with O_DIRECT.
    pub direct: bool,
    /// Whether it was opened read-only.
    pub read_only: bool,
    /// Whether this open created it.
    pub created: bool,
    /// The largest request the block device takes whole (`queue/max_sectors_kb`,
    /// `queue/max_segments` pages); a larger one is split by the kernel, which
    /// polled (IOPOLL) requests do not survive on every kernel (Debian's 6.1
    /// with NVMe poll queues never completes them).
    pub max_io_bytes: Option<u32>,
}

/// Largest segment iopath sends to a file or block device.
pub const MAX_SEGMENT_BYTES: u32 = 1 << 20;

impl Target {
    /// The largest segment to send: [`MAX_SEGMENT_BYTES`], or less where the
    /// block device takes less in one request.
    pub fn max_segment_bytes(&self) -> u32 {
        self.max_io_bytes.map_or(MAX_SEGMENT_BYTES, |m| m.clamp(4096, MAX_SEGMENT_BYTES))
    }
}

/// The sysfs directory of the whole block device `major:minor` (or of the
/// device a partition belongs to) and its kernel name.
pub fn block_queue_dir(major: u32, minor: u32) -> Option<(String, PathBuf)> {
    let dev = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let whole = if dev.join("partition").exists() { dev.parent()?.to_path_buf() } else { dev };
    let name = whole.file_name()?.to_string_lossy().into_owned();
    Some((name, whole))
}

/// The largest request a block device node takes without the kernel
/// splitting it: `queue/max_sectors_kb`, and `queue/max_segments` pages (a
/// buffer's pages need not be contiguous, so each may be a segment of its
/// own; an NVMe device with 127 segments splits a 512 KiB request).
fn max_io_bytes(path: &Path) -> Option<u32> {
    let (major, minor, _) = sys::device_numbers(path).ok()?;
    let (_, dir) = block_queue_dir(major, minor)?;
    let read = |name: &str| -> Option<u32> { std::fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok() };
    let sectors = read("queue/max_sectors_kb").and_then(|kb| kb.checked_mul(1024));
    let segments = read("queue/max_segments").and_then(|n| n.checked_mul(4096));
    match (sectors, segments) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

const LAYOUT_CHUNK: usize = 1 << 20;
/// The extended attribute iopath puts on files it creates.
pub const OWNER_XATTR: &str = "user.iopath";
const OWNER_VALUE: &[u8] = b"created by iopath: its benchmarks may overwrite it";
/// How much of a target is read to look for signatures (btrfs's is at 64 KiB + 64).
const PROBE_BYTES: usize = 68 * 1024;

impl Target {
    /// Opens (creating and laying out if needed) the target.
    pub fn open(config: &TargetConfig) -> Result<Target> {
        let path = &config.path;
        let err = |action, source| Error::Target { action, path: path.clone(), source };
        let mut created = false;
        if !path.exists() {
            let Some(size) = config.size else {
                return Err(err(
                    "open",
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "it does not exist; give --size (or size=) to create it",
                    ),
                ));
            };
            create(path, size).map_err(|e| err("create", e))?;
            created = true;
        }
        let meta = std::fs::metadata(path).map_err(|e| err("stat", e))?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(err(
                "open",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a regular file or a block device (a /proc or /sys file cannot be benchmarked)",
                ),
            ));
        }
        if !is_block_device && let Some(fs) = pseudo_file_system(path) {
            return Err(err(
                "open",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "it is on {fs}, where the kernel makes files up as they are read: there is no data to \
                         benchmark. Use a file on a real file system (e.g. /tmp/iopath.img, created at --size) \
                         or a block device"
                    ),
                ),
            ));
        }
        if !config.read_only && !created && config.guard != Guard::Off {
            check_guard(path, is_block_device, config.guard)?;
        }
        let short = !is_block_device && config.size.is_some_and(|s| meta.len() < s);
        if short {
            let size = config.size.expect("short implies a size");
            if config.read_only {
                return Err(Error::Refused {
                    path: path.clone(),
                    why: format!("it holds {} bytes, fewer than the {size} asked for", meta.len()),
                    fix: "give a --size no larger than the file (or none: the whole file is used); a read-only \
                          run does not extend it"
                        .into(),
                });
            }
            lay_out(path, meta.len(), size).map_err(|e| err("lay out", e))?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(!config.read_only);
        let mut flags = 0;
        if config.direct {
            flags |= libc::O_DIRECT;
        }
        if is_block_device && !config.read_only && config.guard != Guard::Off {
            // The kernel refuses an exclusive open of a device that is mounted or in use.
            flags |= libc::O_EXCL;
        }
        options.custom_flags(flags);
        let file = open_exclusive(&options, path, flags & libc::O_EXCL != 0).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) && flags & libc::O_EXCL != 0 {
                Error::Refused {
                    path: path.clone(),
                    why: "the kernel says it is in use: mounted, active swap, or part of an LVM, RAID or \
                          device-mapper device"
                        .into(),
                    fix: "unmount it (or stop what holds it) first; a read-only workload (--rw read or \
                          randread) can run on it as it is"
                        .into(),
                }
            } else {
                err("open", e)
            }
        })?;
        let (full_size, alignment) = if is_block_device {
            (
                sys::block_device_size(&file).map_err(|e| err("size", e))?,
                sys::block_device_sector(&file).map_err(|e| err("query", e))?,
            )
        } else {
            (meta.len().max(config.size.unwrap_or(0)), file_dio_alignment(&file))
        };
        let size = match config.size {
            Some(s) if s > full_size => {
                return Err(Error::OutOfRange { offset: 0, len: s, size: full_size });
            }
            Some(s) => s,
            None => full_size,
        };
        Ok(Target {
            file,
            path: path.clone(),
            size,
            alignment: if config.direct { alignment } else { 1 },
            is_block_device,
            direct: config.direct,
            read_only: config.read_only,
            created,
            max_io_bytes: if is_block_device { max_io_bytes(path) } else { None },
        })
    }

    /// The same open file under a second descriptor (`dup`: one open file
    /// description, so O_DIRECT and the open's exclusivity are shared), for a
    /// second backend on the same target; `created` is false in the copy.
    pub fn duplicate(&self) -> Result<Target> {
        let file = self.file.try_clone().map_err(|source| Error::Os {
            context: format!("duplicating the descriptor of {}", self.path.display()),
            source,
        })?;
        Ok(Target {
            file,
            path: self.path.clone(),
            size: self.size,
            alignment: self.alignment,
            is_block_device: self.is_block_device,
            direct: self.direct,
            read_only: self.read_only,
            created: false,
            max_io_bytes: self.max_io_bytes,
        })
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}, {}{}, {} bytes)",
            self.path.display(),
            if self.is_block_device { "block device" } else { "file" },
            if self.direct { format!("O_DIRECT, {}-byte alignment", self.alignment) } else { "buffered".into() },
            if self.read_only { ", read-only" } else { "" },
            self.size
        )
    }
}

/// Opens `path`; an exclusive open that finds the device busy is retried for
/// a second before the answer counts. The previous user of the device may
/// still be letting go: an io_uring instance of a process that just exited
/// holds its files until the kernel's asynchronous ring teardown has run.
/// A mounted device stays busy.
fn open_exclusive(options: &OpenOptions, path: &Path, exclusive: bool) -> std::io::Result<File> {
    let give_up = crate::clock::now_ns() + 1_000_000_000;
    loop {
        match options.open(path) {
            Err(e) if exclusive && e.raw_os_error() == Some(libc::EBUSY) && crate::clock::now_ns() < give_up => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return result,
        }
    }
}

/// Refuses (with what to do instead) a target iopath may not write to.
pub(crate) fn check_guard(path: &Path, is_block_device: bool, guard: Guard) -> Result<()> {
    let Guard::Protect { allow_overwrite, allow_fs } = guard else { return Ok(()) };
    let mut probe = Vec::new();
    File::open(path)
        .and_then(|f| f.take(PROBE_BYTES as u64).read_to_end(&mut probe))
        .map_err(|source| Error::Target { action: "read", path: path.to_path_buf(), source })?;
    if let Some((what, at)) = signature(&probe)
        && !(allow_overwrite && allow_fs)
    {
        return Err(Error::Refused {
            path: path.to_path_buf(),
            why: format!("it holds {what} (signature at byte {at})"),
            fix: "writing to it would destroy it. For a benchmark use a read-only workload (--rw read or \
                  randread); if it really may be destroyed, add both --allow-overwrite and \
                  --allow-fs-overwrite (wipefs shows and removes such signatures)"
                .into(),
        });
    }
    if allow_overwrite || (!is_block_device && is_owned(path)) {
        return Ok(());
    }
    let why = if is_block_device {
        "it is a block device, and a write workload overwrites whatever it holds".to_string()
    } else {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        format!("it is an existing file ({len} bytes) that iopath did not create, and a write workload overwrites it")
    };
    Err(Error::Refused {
        path: path.to_path_buf(),
        why,
        fix: "use a read-only workload (--rw read or randread), or a path that does not exist yet (iopath \
              creates and lays it out), or add --allow-overwrite if its contents may be destroyed"
            .into(),
    })
}

/// The name of the pseudo file system `path` is on (procfs, sysfs, ...), if it is on one.
fn pseudo_file_system(path: &Path) -> Option<&'static str> {
    match sys::file_system_type(path).ok()? {
        0x9fa0 => Some("procfs (/proc)"),
        0x6265_6572 => Some("sysfs (/sys)"),
        0x6462_6720 => Some("debugfs"),
        0x7472_6163 => Some("tracefs"),
        0x2762_0000 | 0x6367_7270 => Some("cgroupfs"),
        0x1cd1 => Some("devpts"),
        _ => None,
    }
}

/// Whether iopath created the file (its `user.iopath` attribute is set).
pub fn is_owned(path: &Path) -> bool {
    sys::get_xattr(path, OWNER_XATTR).is_some_and(|v| v == OWNER_VALUE)
}

/// Marks a file as created by iopath; false where the file system keeps no user attributes.
pub(crate) fn mark_owned(file: &File) -> bool {
    sys::set_xattr(file, OWNER_XATTR, OWNER_VALUE).is_ok()
}

/// Known signatures of file systems, partition tables, volumes and swap:
/// (what, byte offset, magic bytes). The offsets are those libblkid probes.
const SIGNATURES: &[(&str, usize, &[u8])] = &[
    ("an ext2/ext3/ext4 file system", 1080, &[0x53, 0xef]),
    ("an XFS file system", 0, b"XFSB"),
    ("an iopath file system", 0, b"IOPATHFS"),
    ("a btrfs file system", 65600, b"_BHRfS_M"),
    ("an F2FS file system", 1024, &[0x10, 0x20, 0xf5, 0xf2]),
    ("a squashfs image", 0, b"hsqs"),
    ("an NTFS file system", 3, b"NTFS    "),
    ("an exFAT file system", 3, b"EXFAT   "),
    ("a FAT file system", 82, b"FAT32   "),
    ("a FAT file system", 54, b"FAT1"),
    ("an ISO 9660 image", 32769, b"CD001"),
    ("a GPT partition table", 512, b"EFI PART"),
    ("a GPT partition table", 4096, b"EFI PART"),
    ("a LUKS encrypted volume", 0, b"LUKS\xba\xbe"),
    ("an LVM physical volume", 512, b"LABELONE"),
    ("an LVM physical volume", 0, b"LABELONE"),
    ("Linux swap space", 4086, b"SWAPSPACE2"),
    ("Linux swap space", 4086, b"SWAP-SPACE"),
    ("an MD RAID member", 4096, &[0xfc, 0x4e, 0x2b, 0xa9]),
    ("an MD RAID member", 0, &[0xfc, 0x4e, 0x2b, 0xa9]),
    ("a DOS partition table or boot sector", 510, &[0x55, 0xaa]),
];

/// The first known signature in the leading bytes of a target, and where it is.
pub fn signature(bytes: &[u8]) -> Option<(&'static str, usize)> {
    SIGNATURES
        .iter()
        .find(|(_, at, magic)| bytes.get(*at..*at + magic.len()) == Some(magic))
        .map(|(what, at, _)| (*what, *at))
}

/// Creates a missing file (never an existing one) of `size` bytes, sparse,
/// marked as iopath's: for a file system image, whose blocks `mkfs` writes
/// itself (laying out a benchmark's pattern over 8 GiB took 23 s).
pub fn create_sparse(path: &Path, size: u64) -> Result<()> {
    let err = |action, source| Error::Target { action, path: path.to_path_buf(), source };
    let file = OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| err("create", e))?;
    mark_owned(&file);
    file.set_len(size).map_err(|e| err("size", e))
}

/// Creates a missing file (never an existing one), lays it out and marks it
/// as iopath's. A lay-out that fails or is interrupted removes the file again.
fn create(path: &Path, size: u64) -> std::io::Result<()> {
    let file = OpenOptions::new().write(true).create_new(true).open(path)?;
    // Where the file system keeps no user attributes, later runs need --allow-overwrite.
    mark_owned(&file);
    drop(file);
    let laid = lay_out(path, 0, size);
    if laid.is_err() {
        let _ = std::fs::remove_file(path);
    }
    laid
}

/// Writes iopath's self-describing pattern (version 1) from `from` to `to`, then syncs.
fn lay_out(path: &Path, from: u64, to: u64) -> std::io::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(from))?;
    let mut chunk = vec![0u8; LAYOUT_CHUNK];
    let mut pos = from;
    while pos < to {
        if crate::signal::interrupted() {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "interrupted (Ctrl-C or SIGTERM)"));
        }
        let n = ((to - pos) as usize).min(LAYOUT_CHUNK);
        crate::pattern::fill(&mut chunk[..n], pos, 1);
        file.write_all(&chunk[..n])?;
        pos += n as u64;
    }
    file.sync_all()
}

/// The O_DIRECT alignment of a regular file from statx(STATX_DIOALIGN), or 512.
fn file_dio_alignment(file: &File) -> u32 {
    sys::dio_alignment(file).unwrap_or(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_created_and_laid_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.img");
        let t = Target::open(&TargetConfig {
            path: path.clone(),
            direct: true,
            size: Some(3 << 20),
            read_only: false,
            guard: Guard::Off,
        })
        .unwrap();
        assert_eq!(t.size, 3 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        assert!(t.alignment >= 512 && t.alignment.is_power_of_two());
    }

    #[test]
    fn missing_file_without_size_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = Target::open(&TargetConfig {
            path: dir.path().join("nope"),
            direct: true,
            size: None,
            read_only: false,
            guard: Guard::Off,
        })
        .unwrap_err();
        assert!(e.to_string().contains("--size"), "{e}");
    }

    #[test]
    fn missing_directory_is_a_clear_error() {
        let e = Target::open(&TargetConfig {
            path: "/nonexistent-dir/x.img".into(),
            direct: true,
            size: Some(4096),
            read_only: false,
            guard: Guard::Off,
        })
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent-dir/x.img"), "{msg}");
        assert!(msg.contains("directory must exist"), "{msg}");
    }

    #[test]
    fn not_a_file_is_rejected() {
        let e = Target::open(&TargetConfig {
            path: "/dev/null".into(),
            direct: false,
            size: None,
            read_only: false,
            guard: Guard::Off,
        })
        .unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
