//! Opening a real target (file or block device) for the `psync` and `uring`
//! backends: O_DIRECT by default, a missing file created and laid out at the
//! requested size (as fio does), and the alignment O_DIRECT needs found out.

use super::spec::Options;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// How to open a file or block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// The file or device node.
    pub path: PathBuf,
    /// Open with O_DIRECT (bypass the page cache). Default on.
    pub direct: bool,
    /// Size to create or extend a regular file to; `None` uses the existing size.
    pub size: Option<u64>,
}

impl TargetConfig {
    /// Parses the common options `direct=` and `size=` after a path.
    pub fn parse(path: &str, opts: &mut Options, default_size: Option<u64>) -> Result<TargetConfig> {
        if path.is_empty() {
            return Err(opts.error("a path is required, e.g. uring:/dev/loop0 or psync:/tmp/iopath.img"));
        }
        let direct = opts.take_bool("direct")?.unwrap_or(true);
        let size = opts.take_size("size")?.or(default_size);
        Ok(TargetConfig { path: PathBuf::from(path), direct, size })
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
}

const LAYOUT_CHUNK: usize = 1 << 20;

impl Target {
    /// Opens (creating and laying out if needed) the target.
    pub fn open(config: &TargetConfig) -> Result<Target> {
        let path = &config.path;
        let err = |action, source| Error::Target { action, path: path.clone(), source };
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
            lay_out(path, 0, size).map_err(|e| err("create", e))?;
        }
        let meta = std::fs::metadata(path).map_err(|e| err("stat", e))?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(err(
                "open",
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file or a block device"),
            ));
        }
        if !is_block_device
            && let Some(size) = config.size
            && meta.len() < size
        {
            lay_out(path, meta.len(), size).map_err(|e| err("lay out", e))?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if config.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(path).map_err(|e| err("open", e))?;
        let (full_size, alignment) = if is_block_device {
            (
                block_device_size(&file).map_err(|e| err("size", e))?,
                block_device_sector(&file).map_err(|e| err("query", e))?,
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
        })
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}, {}, {} bytes)",
            self.path.display(),
            if self.is_block_device { "block device" } else { "file" },
            if self.direct { format!("O_DIRECT, {}-byte alignment", self.alignment) } else { "buffered".into() },
            self.size
        )
    }
}

/// Writes zeros from `from` to `to` (fio's lay-out), then syncs.
fn lay_out(path: &Path, from: u64, to: u64) -> std::io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(from))?;
    let zeros = vec![0u8; LAYOUT_CHUNK];
    let mut pos = from;
    while pos < to {
        let n = ((to - pos) as usize).min(LAYOUT_CHUNK);
        file.write_all(&zeros[..n])?;
        pos += n as u64;
    }
    file.sync_all()
}

fn block_device_size(file: &File) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`, which is valid and writable.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(size) }
}

fn block_device_sector(file: &File) -> std::io::Result<u32> {
    let mut sector: libc::c_int = 0;
    // BLKSSZGET = _IO(0x12, 104): logical block size.
    const BLKSSZGET: libc::c_ulong = 0x1268;
    // SAFETY: the ioctl writes one int into `sector`, which is valid and writable.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sector) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(sector.max(1) as u32) }
}

/// The O_DIRECT alignment of a regular file from statx(STATX_DIOALIGN), or 512.
fn file_dio_alignment(file: &File) -> u32 {
    // SAFETY: an all-zero statx is a valid value for the kernel to overwrite.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd, an empty path with AT_EMPTY_PATH, and a writable statx buffer.
    let rc =
        unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
        stx.stx_dio_offset_align.max(stx.stx_dio_mem_align)
    } else {
        512
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_created_and_laid_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.img");
        let t = Target::open(&TargetConfig { path: path.clone(), direct: true, size: Some(3 << 20) }).unwrap();
        assert_eq!(t.size, 3 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        assert!(t.alignment >= 512 && t.alignment.is_power_of_two());
    }

    #[test]
    fn missing_file_without_size_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = Target::open(&TargetConfig { path: dir.path().join("nope"), direct: true, size: None }).unwrap_err();
        assert!(e.to_string().contains("--size"), "{e}");
    }

    #[test]
    fn missing_directory_is_a_clear_error() {
        let e = Target::open(&TargetConfig { path: "/nonexistent-dir/x.img".into(), direct: true, size: Some(4096) })
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent-dir/x.img"), "{msg}");
        assert!(msg.contains("directory must exist"), "{msg}");
    }

    #[test]
    fn not_a_file_is_rejected() {
        let e = Target::open(&TargetConfig { path: "/dev/null".into(), direct: false, size: None }).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
