//! One process mounts a device's file system at a time.
//!
//! All of a mounted file system's metadata lives in the memory of the
//! process that mounted it, so a second process mounting the same device
//! would see stale metadata and overwrite the first one's. [`MountLock`]
//! keeps that from happening: an exclusive `flock` on a lock file named
//! after the device's identity (its device and inode numbers, so every
//! spelling of one file or block device gets the same lock), holding the
//! holder's pid. The kernel drops a `flock` when its holder exits, however
//! it exits (SIGKILL included), so a lock never outlives its process. The
//! holder removes the file as it lets go (a taker checks that the file it
//! locked is still the one at the path); a killed holder's stays, and the
//! next taker of any device sweeps it away the same way (lock it, remove it,
//! let go), so killed processes and deleted images leave nothing behind.
//!
//! The interposer, `iopath mkfs` and the file tools (`ls`, `cp`, `fsck`,
//! ...) take it; a second taker waits up to its limit and then fails with
//! a message that names the holder's pid and command.

use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An exclusive hold on a device's file system for this process, until dropped.
#[derive(Debug)]
pub struct MountLock {
    _file: std::fs::File,
    path: PathBuf,
    /// The file or block device it locks.
    device: PathBuf,
}

/// The file or block device a spec names, if it names one (`None` for an
/// emulated device in memory and the null device, which no other process sees).
pub fn backing_path(spec: &str) -> Option<PathBuf> {
    let spec = if spec.contains(':') || spec.starts_with("emu") || spec.starts_with("null") {
        spec.to_string()
    } else {
        format!("uring:{spec}")
    };
    DeviceSpec::parse(&spec, None).ok()?.backing_file()
}

/// A file's or block device's identity in the names of its lock and carried
/// cache: its device and inode numbers, or a block device's own number.
pub(super) fn device_id(meta: &std::fs::Metadata) -> String {
    if meta.file_type().is_file() {
        format!("{:x}-{:x}", meta.dev(), meta.ino())
    } else {
        format!("rdev-{:x}", meta.rdev())
    }
}

/// Where the lock of the device at `path` lives.
pub(super) fn lock_path(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path)
        .map_err(|source| Error::Os { context: format!("cannot look at {}", path.display()), source })?;
    let id = device_id(&meta);
    let dir = if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    Ok(PathBuf::from(format!("{dir}/iopath-mount-{id}.lock")))
}

/// The command line of process `pid`, for a message.
fn command_of(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            let words: Vec<String> = b
                .split(|&c| c == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            words.join(" ")
        })
        .unwrap_or_default()
}

impl MountLock {
    /// Takes the lock of the device `spec` names, waiting up to `wait` for
    /// a holder to let go. `Ok(None)` for a device no other process can
    /// reach (in memory).
    pub fn acquire(spec: &str, wait: Duration) -> Result<Option<MountLock>> {
        let Some(device) = backing_path(spec) else { return Ok(None) };
        let path = lock_path(&device)?;
        let os = |what: &str, source| Error::Os {
            context: format!("cannot {what} the mount lock {}", path.display()),
            source,
        };
        let open = || {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| os("open", e))?;
            // Anyone may take it next (a holder that is killed leaves the file behind).
            let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666));
            Ok::<_, Error>(file)
        };
        let mut file = open()?;
        let deadline = Instant::now() + wait;
        loop {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                // A holder removes the lock file as it lets go: the lock taken may be on a
                // file no longer at the path (another taker may already hold the one there
                // now). Only a lock on the file at the path counts.
                let here = file.metadata().map(|m| m.ino()).ok();
                if here.is_some() && std::fs::metadata(&path).map(|m| m.ino()).ok() == here {
                    break;
                }
                file = open()?;
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(os("take", e));
            }
            if Instant::now() >= deadline {
                let mut text = String::new();
                let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
                let holder = text.trim().parse::<u32>().ok();
                let who = holder.map_or_else(
                    || "another process".to_string(),
                    |pid| format!("process {pid} ({})", command_of(pid)),
                );
                return Err(Error::File {
                    op: "mount",
                    name: device.display().to_string(),
                    errno: libc::EBUSY,
                    why: format!(
                        "its file system is mounted by {who}, and one process mounts a device at a time; \
                         wait for that process to exit (or stop it), then try again{}",
                        if wait.is_zero() { "" } else { " (IOPATH_MOUNT_WAIT sets how long the interposer waits)" }
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
        sweep(&path);
        if let Some(dir) = path.parent() {
            super::carry::sweep(dir);
        }
        Ok(Some(MountLock { _file: file, path, device }))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The carried cache of the locked device ([`super::carry`]), beside
    /// the lock file, holding up to `bytes`: opened (or made) for
    /// [`super::FileSystem::mount_carrying`].
    pub fn carried_cache(&self, bytes: u64) -> Result<super::carry::CarriedCache> {
        super::carry::CarriedCache::open(&super::carry::path_beside(&self.path), &self.device, bytes)
    }

    /// The shared-memory log of the locked device ([`super::shm_log`]),
    /// beside the lock file, `bytes` long (or longer, if a killed holder
    /// left a longer one): opened (or made) for [`super::FileSystem::mount_beside`].
    pub fn shm_log(&self, bytes: u64) -> Result<super::shm_log::ShmLog> {
        super::shm_log::ShmLog::open(&super::shm_log::path_beside(&self.path), &self.device, bytes)
    }

    /// The locked device's shared-memory log if there is one (what a killed
    /// holder left there, for `fsck`), never made.
    pub fn existing_shm_log(&self) -> Option<super::shm_log::ShmLog> {
        super::shm_log::existing_for(&self.device)
    }
}

/// Removes the lock files beside `ours` that no process holds (left by
/// killed holders), each while holding its lock, as a holder removes its own:
/// a taker that locked one meanwhile finds it gone from the path and opens
/// a new one.
fn sweep(ours: &Path) {
    use std::os::fd::AsRawFd;
    let Some(dir) = ours.parent() else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path == ours || !name.starts_with("iopath-mount-") || !name.ends_with(".lock") {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new().read(true).open(&path) else { continue };
        // SAFETY: flock on a descriptor we own; it is dropped (closed) below, which lets go.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let here = file.metadata().map(|m| m.ino()).ok();
            if here.is_some() && std::fs::metadata(&path).map(|m| m.ino()).ok() == here {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

impl Drop for MountLock {
    /// Removes the lock file while still holding its lock (a taker waiting on
    /// it then finds it gone from the path and opens a new one), then lets go.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_is_refused_with_the_holders_pid_and_every_spelling_is_one_lock() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("x.img");
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let bare = img.to_str().unwrap().to_string();
        let held = MountLock::acquire(&bare, Duration::ZERO).unwrap().unwrap();
        let text = std::fs::read_to_string(held.path()).unwrap();
        assert_eq!(text, std::process::id().to_string());
        // flock conflicts between open file descriptions, so this process stands in for another.
        let e = MountLock::acquire(&format!("psync:{bare}"), Duration::from_millis(20)).unwrap_err().to_string();
        assert!(e.contains(&format!("process {}", std::process::id())), "{e}");
        let lock_file = held.path().to_path_buf();
        drop(held);
        assert!(!lock_file.exists(), "the holder removes its lock file");
        let again = MountLock::acquire(&format!("uring:{bare}"), Duration::ZERO).unwrap().unwrap();
        assert_eq!(again.path(), lock_file);
        drop(again);
        assert!(MountLock::acquire("emu:optane,size=1m", Duration::ZERO).unwrap().is_none());
    }

    #[test]
    fn takers_racing_a_holder_that_removes_its_lock_file_never_hold_it_together() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("x.img");
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let spec = img.to_str().unwrap().to_string();
        let inside = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let held = MountLock::acquire(&spec, Duration::from_secs(30)).unwrap().unwrap();
                        // flock conflicts between open file descriptions: each thread's own open
                        // stands in for another process.
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0, "two holders");
                        std::thread::yield_now();
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        drop(held);
                    }
                });
            }
        });
        assert!(!lock_path(&img).unwrap().exists());
    }

    #[test]
    fn a_taker_sweeps_away_lock_files_nobody_holds_and_keeps_held_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::write(&a, [0u8; 4096]).unwrap();
        std::fs::write(&b, [0u8; 4096]).unwrap();
        // A holder killed with its lock file left behind: a file nobody locks.
        let stale = lock_path(&a).unwrap().with_file_name(format!("iopath-mount-swept-{}.lock", std::process::id()));
        std::fs::write(&stale, "12345").unwrap();
        let held = MountLock::acquire(b.to_str().unwrap(), Duration::ZERO).unwrap().unwrap();
        let held_path = held.path().to_path_buf();
        let other = MountLock::acquire(a.to_str().unwrap(), Duration::ZERO).unwrap().unwrap();
        assert!(!stale.exists(), "the stale lock file is swept away");
        assert!(held_path.exists(), "a held lock file stays");
        drop((held, other));
        assert!(!held_path.exists());
    }
}
