//! `iopath run`: runs an unmodified program with the interposer preloaded,
//! its files on iopath (`--mount`) or its direct I/O routed (`--files`).

use clap::Args;
use iopath::fs::format::Superblock;
use iopath::{Error, Result};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

const RUN_HELP: &str = "\
Runs PROG with libiopath_preload.so loaded and set up from these flags (the same as setting the
IOPATH_* variables by hand: docs/programs.md).

--mount DIR=DEVICE serves every path under DIR (absolute, relative to the working directory, or
through '..') from the iopath file system on DEVICE (make one with `iopath mkfs`; any device spec or a
bare path). Nothing outside DIR changes, and a program that never touches DIR pays nothing. DIR is
made if it does not exist (it stays empty: the files are on DEVICE). One process mounts a device at a
time: a program started while another holds it waits up to --wait seconds, then its calls into DIR
fail with EBUSY and a message naming the holder. The mount is committed when the program exits,
also when a signal it leaves at its default action ends it (Ctrl-C, kill, a pipe's reader gone:
the process then dies by that signal); what it fsync'd is durable at once. A forked child cannot use a mount its parent holds (a
subshell of a shell that holds nothing open there mounts in turn); a private mmap of a mounted
file is a copy, a shared one follows the file and keeps the mount while it lasts (what is stored
into it reaches the file at msync, fsync, munmap and exit). --cache sets the mounts' page cache (default an eighth of the memory). At exit
a process leaves its clean pages in the mount's carried cache, a file in /dev/shm, and the next
process that mounts the device reads them from there instead of the device, as programs find the
kernel's page cache warm; --carry bounds it (default the page cache, at most 1 GiB; 0 turns it
off; rm /dev/shm/iopath-carry-* gives its memory back). The page cache's frames come from a
file in /dev/shm the process claims and the next one claims after it (fresh memory costs a
fault and zeroing per page, and in a VM that gives freed memory to its host a host fault too);
--frames bounds it (default 512 MiB, at most a sixteenth of the memory; 0 turns it off;
rm /dev/shm/iopath-frames-* gives its memory back). A create, unlink, rename or mkdir is kept,
when the call returns, in a log in /dev/shm that outlives the process (a killed program loses
none, as with the kernel), and reaches the device's journal with the ones after it, in one
write; --shm-log sets its size (default 8 MiB; 0 writes each change to the journal at once).

--files PATTERN routes the program's O_DIRECT I/O on matching files through iopath's engine
instead (they stay on the kernel's file system).

EXAMPLES:
  iopath mkfs /dev/shm/db.img --size 4g
  iopath run --mount /tmp/db=/dev/shm/db.img -- sqlite3 /tmp/db/test.db 'create table t(x)'
  iopath run --mount data=uring:/dev/loop0 --fsync-path journaled -- db_bench --db=data/rocks --benchmarks=fillsync
  iopath run --files '/dev/loop0' --path stm -- fio --filename=/dev/loop0 --direct=1 --rw=randread --name=x
";

/// Arguments of `iopath run`.
#[derive(Args, Debug)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    /// DIR=DEVICE: serve DIR from the iopath file system on DEVICE (repeatable).
    #[arg(long = "mount", value_name = "DIR=DEVICE")]
    mounts: Vec<String>,
    /// Route O_DIRECT I/O on files matching this glob through iopath (repeatable).
    #[arg(long = "files", value_name = "PATTERN")]
    files: Vec<String>,
    /// I/O path of the engines (default auto: it chooses and keeps choosing).
    #[arg(long)]
    path: Option<String>,
    /// fsync path of the mounts: conventional, aios or journaled (default journaled).
    #[arg(long)]
    fsync_path: Option<String>,
    /// Page cache of the mounts (e.g. 256m, 2g; default an eighth of the memory).
    #[arg(long, value_name = "SIZE")]
    cache: Option<String>,
    /// Carried cache of the mounts: clean blocks left in /dev/shm for the next process (0: none).
    #[arg(long, value_name = "SIZE")]
    carry: Option<String>,
    /// Page frames kept in /dev/shm from one process to the next (0: fresh memory each time).
    #[arg(long, value_name = "SIZE")]
    frames: Option<String>,
    /// Shared-memory log of the mounts' namespace changes (0: each to the journal at once).
    #[arg(long, value_name = "SIZE")]
    shm_log: Option<String>,
    /// Idle CPUs poll instead of halting while the program runs (root only).
    #[arg(long)]
    idle_poll: bool,
    /// Say on stderr what the interposer does (IOPATH_LOG=1).
    #[arg(long)]
    log: bool,
    /// Say what the interposer does in FILE instead, appended (IOPATH_LOG=FILE;
    /// outside every mount): for a program that keeps its children's stderr
    /// in a mounted file (cargo does, with its target directory on the mount),
    /// where each line on stderr costs a hand-over of the mount.
    #[arg(long, value_name = "FILE")]
    log_file: Option<std::path::PathBuf>,
    /// Seconds to wait for another process that has a mount's device mounted
    /// (default: IOPATH_MOUNT_WAIT if set, else 10); a call within that long
    /// after one that waited in vain does not wait again.
    #[arg(long, value_name = "SECONDS", value_parser = non_negative_seconds)]
    wait: Option<f64>,
    /// The program and its arguments (after --).
    #[arg(required = true, last = true, value_name = "PROG ARGS")]
    command: Vec<String>,
}

/// Where libiopath_preload.so is: $IOPATH_PRELOAD, else the newest of the
/// copies beside this executable, in its `deps/` and in `../lib/`. Newest,
/// not first: in a build tree `cargo test` refreshes only `deps/`, and an
/// older copy beside the binary (from an earlier `cargo build`) once made
/// `iopath run` load an interposer that refused the current on-disk format.
fn preload_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("IOPATH_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()
        .map_err(|source| Error::Os { context: "cannot find this executable".into(), source })?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    newest(&[
        dir.join("libiopath_preload.so"),
        dir.join("deps/libiopath_preload.so"),
        dir.join("../lib/libiopath_preload.so"),
    ])
    .ok_or_else(|| {
        Error::spec(
            "interposer",
            dir.join("libiopath_preload.so").display().to_string(),
            "not found; build it with `cargo build --release` (it is built with iopath), or set IOPATH_PRELOAD",
        )
    })
}

/// The most recently modified of the files that exist.
fn newest(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p.clone())
}

/// The log file of `--log-file`, made absolute (every process of the
/// program appends to the same one, whatever its working directory); one
/// inside a mount is refused (the interposer opens it with the kernel).
fn check_log_file(file: &Path, mount_dirs: &[PathBuf]) -> Result<PathBuf> {
    let text = file.display().to_string();
    let file =
        std::path::absolute(file).map_err(|source| Error::Os { context: format!("cannot resolve {text}"), source })?;
    if let Some(dir) = mount_dirs.iter().find(|d| file.starts_with(d)) {
        return Err(Error::spec(
            "--log-file",
            &text,
            format!("it is inside the mount {}: give a file outside every mount", dir.display()),
        ));
    }
    Ok(file)
}

/// Checks a `DIR=DEVICE` before the program starts: DIR is (made) a directory, DEVICE holds a file system.
fn check_mount(text: &str) -> Result<(PathBuf, String)> {
    let Some((dir, device)) = text.split_once('=').filter(|(d, v)| !d.is_empty() && !v.is_empty()) else {
        return Err(Error::spec("--mount", text, "write DIR=DEVICE, e.g. --mount /tmp/db=/dev/shm/db.img"));
    };
    let dir =
        std::path::absolute(dir).map_err(|source| Error::Os { context: format!("cannot resolve {dir}"), source })?;
    if dir.exists() && !dir.is_dir() {
        return Err(Error::spec("--mount", text, "DIR exists and is not a directory"));
    }
    if !dir.exists() {
        std::fs::create_dir_all(&dir).map_err(|source| Error::Os {
            context: format!("cannot make the mount directory {}", dir.display()),
            source,
        })?;
        eprintln!("iopath: made {} (it stays empty: the files are on {device})", dir.display());
    }
    let spec = if device.contains(':') { device.to_string() } else { format!("uring:{device}") };
    if !device.contains(':') && !Path::new(device).exists() {
        return Err(Error::spec(
            "--mount",
            text,
            "DEVICE does not exist; make a file system with `iopath mkfs DEVICE --size 1g`",
        ));
    }
    let engine = iopath::Engine::open(&spec, iopath::PathConfig::preset("sync-path")?)?;
    let mut block = iopath::IoBuf::new(4096);
    engine.read_at(&mut block, 0)?;
    Superblock::decode(&block, engine.device().size() / 4096)?;
    Ok((dir, device.to_string()))
}

/// Runs `iopath run`: replaces this process with the program.
pub fn run(args: RunArgs) -> Result<()> {
    if args.mounts.is_empty() && args.files.is_empty() {
        return Err(Error::spec(
            "flags",
            "",
            "give --mount DIR=DEVICE (files on iopath) or --files PATTERN (I/O routed)",
        ));
    }
    if let Some(p) = &args.path {
        iopath::PathConfig::preset(p)?;
    }
    if let Some(f) = &args.fsync_path {
        iopath::fs::FsyncPath::parse(f)?;
    }
    for size in [&args.cache, &args.carry, &args.frames, &args.shm_log].into_iter().flatten() {
        iopath::units::parse_size(size)?;
    }
    let mut mounts = Vec::new();
    let mut dirs = Vec::new();
    for m in &args.mounts {
        let (dir, device) = check_mount(m)?;
        mounts.push(format!("{}={device}", dir.display()));
        dirs.push(dir);
    }
    let log_file = match &args.log_file {
        Some(file) => Some(check_log_file(file, &dirs)?),
        None => None,
    };
    let library = preload_library()?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", library.display()),
        _ => library.display().to_string(),
    };
    let (program, rest) = args.command.split_first().expect("clap requires the program");
    let mut command = std::process::Command::new(program);
    command.args(rest).env("LD_PRELOAD", preload);
    if !mounts.is_empty() {
        command.env("IOPATH_MOUNT", mounts.join(";"));
    }
    if !args.files.is_empty() {
        command.env("IOPATH_FILES", args.files.join(":"));
    }
    for (key, value) in [
        ("IOPATH_PATH", &args.path),
        ("IOPATH_FSYNC_PATH", &args.fsync_path),
        ("IOPATH_CACHE", &args.cache),
        ("IOPATH_CARRY", &args.carry),
        ("IOPATH_FRAMES", &args.frames),
        ("IOPATH_SHM_LOG", &args.shm_log),
    ] {
        if let Some(v) = value {
            command.env(key, v);
        }
    }
    if args.idle_poll {
        command.env("IOPATH_IDLE_POLL", "1");
    }
    if let Some(file) = &log_file {
        command.env("IOPATH_LOG", file);
    } else if args.log {
        command.env("IOPATH_LOG", "1");
    }
    // Set only when given: an IOPATH_MOUNT_WAIT of the caller's was overridden by
    // the flag's default and silently ignored.
    if let Some(wait) = args.wait {
        command.env("IOPATH_MOUNT_WAIT", wait.to_string());
    }
    let e = command.exec();
    Err(Error::Os { context: format!("cannot run {program}"), source: e })
}

/// `--wait`: seconds, at least 0.
fn non_negative_seconds(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s >= 0.0 && s.is_finite() => Ok(s),
        _ => Err(format!("'{text}' is not a number of seconds (0 or more, e.g. 2 or 0.5)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_interposer_is_taken_not_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let [old, new, missing] = ["beside.so", "deps.so", "none.so"].map(|n| dir.path().join(n));
        for (path, age) in [(&old, 3600), (&new, 10)] {
            let file = std::fs::File::create(path).unwrap();
            file.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age)).unwrap();
        }
        assert_eq!(newest(&[old.clone(), new.clone(), missing.clone()]), Some(new));
        assert_eq!(newest(&[missing.clone(), old.clone()]), Some(old));
        assert_eq!(newest(&[missing]), None);
    }
}
