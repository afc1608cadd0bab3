//! `iopath mkfs`: make an iopath file system on a device (the tools that
//! look into one are in `files.rs`).

use super::bench::SafetyArgs;
use clap::Args;
use iopath::device::DeviceSpec;
use iopath::device::spec::Backend;
use iopath::fs::lock::MountLock;
use iopath::fs::{FileSystem, FormatOptions};
use iopath::units::{format_size, parse_size};
use iopath::{Engine, Error, PathConfig};
use std::sync::Arc;

const MKFS_HELP: &str = "\
Writes an empty iopath file system (superblock, inode table, free-space bitmap, journal) on a device:
a block device, a file (created with --size if it does not exist), or an emulated device backed by a
file (emu:optane,file=PATH,size=1g). Everything the device held is lost: an existing file iopath did
not create, or a block device, needs --allow-overwrite, and one that holds a file system (an iopath
one included) also --allow-fs-overwrite. The library mounts it with iopath::fs::FileSystem::mount;
`iopath ls`, `cp`, `cat`, `rm`, `mkdir`, `df` and `fsck` look into it.

EXAMPLES:
  iopath mkfs /tmp/iopath-fs.img --size 1g
  iopath mkfs uring:/dev/loop0 --allow-overwrite --allow-fs-overwrite
  iopath mkfs emu:optane,file=/tmp/emu.img,size=256m --inodes 4096 --journal 16m
";

/// Arguments of `iopath mkfs`.
#[derive(Args, Debug)]
#[command(after_long_help = MKFS_HELP)]
pub struct MkfsArgs {
    /// Device spec (uring:/dev/loop0, psync:/tmp/f, emu:optane,file=/tmp/f) or a bare path (uring:PATH).
    device: String,
    /// Size of a file that does not exist yet (fio-style: 256m, 1g).
    #[arg(long, value_parser = size_arg)]
    size: Option<u64>,
    /// Files and directories the file system can hold (default: one per 64 KiB, 64 to 131072; 512 bytes of memory each while mounted).
    #[arg(long)]
    inodes: Option<u64>,
    /// Journal size (default: 1/64 of the device, 1 MiB to 128 MiB).
    #[arg(long, value_parser = size_arg)]
    journal: Option<u64>,
    #[command(flatten)]
    safety: SafetyArgs,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A spec from a spec or a bare path.
fn spec_of(device: &str) -> String {
    if device.contains(':') { device.to_string() } else { format!("uring:{device}") }
}

fn open(device: &str, size: Option<u64>, guard: Option<iopath::device::target::Guard>) -> iopath::Result<Arc<Engine>> {
    let mut spec = DeviceSpec::parse(&spec_of(device), size)?;
    match &spec.backend {
        Backend::Emu(c) if c.file.is_none() => {
            return Err(Error::spec(
                "device",
                device,
                "an emulated device in memory forgets everything when iopath exits; back it with a file \
                 (emu:optane,file=/tmp/emu.img,size=256m)",
            ));
        }
        Backend::Null(_) => return Err(Error::spec("device", device, "the null device keeps no data")),
        _ => {}
    }
    if let Some(guard) = guard {
        spec.protect(guard, false);
    }
    Ok(Arc::new(Engine::with_device(spec.open()?, PathConfig::preset("sync-path")?)?))
}

/// Runs `iopath mkfs`.
pub fn run_mkfs(args: MkfsArgs) -> iopath::Result<()> {
    // A new image file is made sparse here: the file system writes what it needs.
    if let (Some(size), Some(path)) = (args.size, iopath::fs::lock::backing_path(&args.device))
        && !path.exists()
    {
        iopath::device::target::create_sparse(&path, size)?;
    }
    let engine = open(&args.device, args.size, Some(args.safety.guard()))?;
    // Never under a process that has the old file system mounted.
    let _lock = MountLock::acquire(&args.device, std::time::Duration::ZERO)?;
    let journal_blocks = args.journal.map(|j| j / 4096);
    let made = FileSystem::format(Arc::clone(&engine), FormatOptions { inodes: args.inodes, journal_blocks })?;
    let sb = made.superblock;
    println!(
        "made an iopath file system on {}: {} ({} blocks of 4 KiB), {} files at most, a {} journal, {} for data",
        args.device,
        format_size(sb.blocks * 4096),
        sb.blocks,
        sb.inodes(),
        format_size(sb.journal_blocks * 4096),
        format_size((sb.blocks - sb.data_start) * 4096),
    );
    Ok(())
}

/// How long the file tools wait for a process that has the device mounted:
/// long enough for one that has nothing open there (an interposed shell or
/// program between two uses) to give it back when asked (its lender sees a
/// nudge within `NUDGE_EVERY`, 100 ms), short enough to say at once that a
/// program is using it. `mkfs` never waits: formatting must not follow a
/// holder's commit and then pull the file system from under it.
const TOOL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The engine of a device that should hold a file system already (no `--size`: a
/// bare path that does not exist is an error that says how to make one), and
/// the lock that keeps any other process from mounting it meanwhile (waiting
/// up to [`TOOL_WAIT`] for a holder to let go).
pub(super) fn open_existing(device: &str) -> iopath::Result<(Arc<Engine>, Option<MountLock>)> {
    if !device.contains(':') && !std::path::Path::new(device).exists() {
        return Err(Error::spec("device", device, "no such file or device; make a file system with `iopath mkfs`"));
    }
    let engine = open(device, None, None)?;
    let lock = MountLock::acquire(device, TOOL_WAIT)?;
    Ok((engine, lock))
}
