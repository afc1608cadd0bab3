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
//!
//! A taker that waits says so: every [`NUDGE_EVERY`], and at once when
//! a new holder's lock file is what it finds taken, it adds one to a
//! word of the lock file (at [`WANT_AT`], through a shared mapping) and
//! wakes whoever waits on that word (a futex on a file mapping works
//! across processes), and a holder that [`MountLock::watch`]es its lock
//! sees it ([`Wanted`]) and may let go while it has nothing open there:
//! the interposer's mount does, so a parent that waits for its children
//! (`make -j2`) does not hold them off the mount. (An inotify watch on the
//! file did the same, but closing one waits for a kernel grace period:
//! 9 ms more at every process's exit.)

use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use std::io::{Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The pid of the process that is ending ([`stop_waiting`]; 0: none): its
/// takers waiting for a holder give up at their next try. A pid, not a flag:
/// a child forked meanwhile, which inherits the value, is not ending.
static STOPPED: AtomicU32 = AtomicU32::new(0);

/// Makes every wait of this process for another holder end at its next try
/// (within a millisecond), failing with EINTR, and every later take fail at
/// once if the lock is held: for a process that is ending (a signal that
/// kills it arrived while one of its threads waited its turn for a mount).
/// A `getpid` and an atomic store: callable from a signal handler.
pub fn stop_waiting() {
    STOPPED.store(std::process::id(), Ordering::Release);
}

/// Whether this process is ending ([`stop_waiting`]).
fn stopped() -> bool {
    let pid = STOPPED.load(Ordering::Acquire);
    pid != 0 && pid == std::process::id()
}

/// How often a waiting taker nudges the holder (its [`Wanted`] sees each nudge).
pub const NUDGE_EVERY: Duration = Duration::from_millis(100);

/// How often a waiting taker tries the lock again.
const TRY_EVERY: Duration = Duration::from_millis(1);

/// How long a holder that let go for a waiting taker keeps off the lock
/// ([`after_giving_way`]): a few of the taker's tries.
const GIVE_WAY_FOR: Duration = Duration::from_millis(20);

/// Where in the lock file the word takers add to lies (the holder's pid,
/// as text, comes first).
pub const WANT_AT: usize = 64;

/// The lock file's length: a holder makes it this long and never shorter,
/// so a taker's mapping of it never reaches past its end.
const LOCK_FILE_LEN: u64 = 128;

/// The want word of a lock file mapped shared (`None` if the file is too
/// short: a holder of an older build, which watches nothing).
fn map_want(file: &std::fs::File) -> Option<memmap2::MmapRaw> {
    if file.metadata().ok()?.len() < LOCK_FILE_LEN {
        return None;
    }
    memmap2::MmapOptions::new().len(LOCK_FILE_LEN as usize).map_raw(file).ok()
}

/// The word at [`WANT_AT`] of a mapping made by [`map_want`].
fn want_word(map: &memmap2::MmapRaw) -> &AtomicU32 {
    // SAFETY: the mapping is LOCK_FILE_LEN bytes, page-aligned, and lives as
    // long as the borrow; an AtomicU32 has the layout of a u32.
    unsafe { &*map.as_mut_ptr().add(WANT_AT).cast::<AtomicU32>() }
}

/// A futex on a word of a shared file mapping (no private flag: other
/// processes wait on and wake the same word).
fn futex(word: &AtomicU32, op: libc::c_int, value: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex call on a word of a live mapping.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, value, ts_ptr) };
}

/// Tells the holder of `file`'s lock that a taker waits for it.
fn nudge(file: &std::fs::File) {
    if let Some(map) = map_want(file) {
        let word = want_word(&map);
        word.fetch_add(1, Ordering::AcqRel);
        futex(word, libc::FUTEX_WAKE, i32::MAX as u32, None);
    }
}

/// The holder's pid as its lock file says it (digits first; `None` if not).
fn holder_of(text: &str) -> Option<u32> {
    let digits: String = text.trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

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
    beside_lock(path, "mount", ".lock")
}

/// `iopath-WHAT-ID` + `suffix` in the directory of the mount locks, ID the
/// identity of the device at `path` ([`device_id`]).
fn beside_lock(path: &Path, what: &str, suffix: &str) -> Result<PathBuf> {
    let meta = std::fs::metadata(path)
        .map_err(|source| Error::Os { context: format!("cannot look at {}", path.display()), source })?;
    let id = device_id(&meta);
    let dir = if Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    Ok(PathBuf::from(format!("{dir}/iopath-{what}-{id}{suffix}")))
}

/// The file whose kernel `flock` stands for the flocks of inode `ino` of
/// the file system on the device at `path` (an interposer's, on every
/// process that mounts it): beside the device's lock, made if missing
/// (anyone may make them, as anyone may take the lock). The kernel then
/// keeps a flock across a lend of the mount to another process, and
/// between processes, as it does on its own files.
pub fn flock_path(path: &Path, ino: u64) -> Result<PathBuf> {
    let dir = beside_lock(path, "flock", "")?;
    shared_dir(&dir)?;
    Ok(dir.join(format!("{ino:x}")))
}

/// The kernel named pipe that stands for FIFO inode `ino` of the file
/// system on the device at `path`: every process that opens the FIFO
/// through the interposer opens this pipe, so readers and writers meet
/// there as they do on a FIFO of the kernel's, across processes and lends
/// of the mount. Beside the device's lock, in a directory made if missing
/// (the pipe itself is made by [`make_fifo`]); a new FIFO in a slot that
/// held one before removes its pipe ([`forget_fifo`], called by
/// [`super::FileSystem::mkfifo`]).
pub fn fifo_path(path: &Path, ino: u64) -> Result<PathBuf> {
    let dir = beside_lock(path, "fifo", "")?;
    shared_dir(&dir)?;
    Ok(dir.join(format!("{ino:x}")))
}

/// `dir`, made if missing, where anyone may make files (as anyone may take the lock).
fn shared_dir(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        match std::fs::create_dir(dir) {
            Ok(()) => {
                let _ = std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(Error::Os { context: format!("cannot make {}", dir.display()), source }),
        }
    }
    Ok(())
}

/// Removes the kernel pipe of FIFO inode `ino` (see [`fifo_path`]), if
/// there is one: the inode's slot holds a new FIFO, and whoever still has
/// the old pipe open keeps it, as with a FIFO unlinked while open.
pub fn forget_fifo(path: &Path, ino: u64) -> Result<()> {
    // (Where `fifo_path` puts it, without making the directory for nothing.)
    let pipe = beside_lock(path, "fifo", "")?.join(format!("{ino:x}"));
    match std::fs::remove_file(&pipe) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::Os { context: format!("cannot remove {}", pipe.display()), source: e })
        }
        _ => Ok(()),
    }
}

/// Makes the kernel pipe `pipe` ([`fifo_path`]) if it is not there,
/// readable and writable by anyone who may take the device's lock (a
/// mount's files are open to every process that mounts it).
pub fn make_fifo(pipe: &Path) -> Result<()> {
    let c = std::ffi::CString::new(pipe.as_os_str().as_encoded_bytes()).map_err(|_| Error::Os {
        context: format!("{} holds a NUL", pipe.display()),
        source: std::io::ErrorKind::InvalidInput.into(),
    })?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o666) } == 0 {
        let _ = std::fs::set_permissions(pipe, std::os::unix::fs::PermissionsExt::from_mode(0o666));
        return Ok(());
    }
    match std::io::Error::last_os_error() {
        e if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        source => Err(Error::Os { context: format!("cannot make the pipe {}", pipe.display()), source }),
    }
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
        let mut nudged: Option<Instant> = None;
        loop {
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
                // A new file, a new holder: nudged at the first try that finds it taken
                // (not up to NUDGE_EVERY after the last holder was).
                nudged = None;
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(os("take", e));
            }
            if stopped() {
                return Err(Error::File {
                    op: "mount",
                    name: device.display().to_string(),
                    errno: libc::EINTR,
                    why: "this process is ending (a signal): it no longer waits for another one to let go".into(),
                });
            }
            if Instant::now() >= deadline {
                let mut text = String::new();
                let mut bytes = Vec::new();
                let _ = file.rewind().and_then(|()| file.read_to_end(&mut bytes));
                text.push_str(&String::from_utf8_lossy(&bytes));
                let holder = holder_of(&text);
                let who = holder.map_or_else(
                    || "another process".to_string(),
                    |pid| format!("process {pid} ({})", command_of(pid)),
                );
                return Err(Error::File {
                    op: "mount",
                    name: device.display().to_string(),
                    errno: libc::EBUSY,
                    why: format!(
                        "its file system is mounted by {who}, and one process mounts a device at a time \
                         (a process gives it back once it has no file open there: two programs that keep \
                         files open there at once, as the stages of a pipeline may, cannot share it); \
                         wait for that process to exit (or stop it), then try again{}",
                        if wait.is_zero() { "" } else { " (IOPATH_MOUNT_WAIT sets how long the interposer waits)" }
                    ),
                });
            }
            if nudged.is_none_or(|at| at.elapsed() >= NUDGE_EVERY) {
                nudge(&file);
                nudged = Some(Instant::now());
            }
            std::thread::sleep(TRY_EVERY);
        }
        // The pid, then zeros up to the want word; the file never shorter than
        // LOCK_FILE_LEN (a taker may have it mapped).
        let mut head = format!("{}\n", std::process::id()).into_bytes();
        head.resize(WANT_AT, 0);
        let _ = file.write_all_at(&head, 0);
        if file.metadata().is_ok_and(|m| m.len() < LOCK_FILE_LEN) {
            let _ = file.set_len(LOCK_FILE_LEN);
        }
        sweep(&path);
        if let Some(dir) = path.parent() {
            super::carry::sweep(dir);
        }
        Ok(Some(MountLock { _file: file, path, device }))
    }

    /// In a child just forked from the holder: closes the child's copy of
    /// the lock file's descriptor, leaving the lock (and the file) to the
    /// parent. A copy kept open holds the lock as long as the child lives:
    /// after the parent gave the mount back (or was killed), no other
    /// process could take it until the child was gone. System calls only,
    /// as a fork handler may make.
    pub fn leave_to_parent(self) {
        // SAFETY: closes our own descriptor; `self` is forgotten, so nothing closes it again
        // (and its Drop, which would remove the parent's lock file, never runs).
        unsafe { libc::syscall(libc::SYS_close, self._file.as_raw_fd()) };
        std::mem::forget(self);
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A watch that sees other processes wait for this lock ([`Wanted`]).
    /// Nudges made before it began count: a taker that found the lock file
    /// taken nudged it at once, most often while this holder was still
    /// mounting, and then not for [`NUDGE_EVERY`]. (Each holder has a file
    /// of its own, made after its last holder removed the one before, so
    /// they are nudges for this holder; a killed holder's file, taken over
    /// as it was left, may hold old ones: one lend tried too many.)
    pub fn watch(&self) -> Result<Wanted> {
        let map = map_want(&self._file).ok_or_else(|| Error::Os {
            context: format!("cannot map the mount lock {}", self.path.display()),
            source: std::io::Error::last_os_error(),
        })?;
        Ok(Wanted { map, seen: AtomicU32::new(0) })
    }

    /// The carried cache of the locked device ([`super::carry`]), beside
    /// the lock file, holding up to `bytes`: opened (or made) for
    /// [`super::FileSystem::mount_carrying`].
    pub fn carried_cache(&self, bytes: u64) -> Result<super::carry::CarriedCache> {
        super::carry::CarriedCache::open(&super::carry::path_beside(&self.path), &self.device, bytes)
    }

    /// Removes the locked device's carried cache, if it has one: for a
    /// holder that found the device is not what the cache vouches for
    /// (`iopath fsck` that found a problem), so that the next mount checks
    /// the whole table instead of trusting it ([`super::Mounted::table_checked`]).
    pub fn set_carry_aside(&self) -> Result<()> {
        match std::fs::remove_file(super::carry::path_beside(&self.path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Os {
                context: format!("cannot remove the carried cache beside {}", self.path.display()),
                source: e,
            }),
            _ => Ok(()),
        }
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

/// What a holder sees of the takers waiting for its lock ([`MountLock::watch`]).
#[derive(Debug)]
pub struct Wanted {
    map: memmap2::MmapRaw,
    /// The want word as last seen.
    seen: AtomicU32,
}

impl Wanted {
    /// In a child just forked from the holder: unmaps the child's copy of
    /// the lock file's mapping, which holds the file (and so its lock) as a
    /// descriptor does ([`MountLock::leave_to_parent`]). The watch must not
    /// be used or dropped after (the caller forgets it). System calls only.
    pub fn leave_to_parent(&self) {
        // SAFETY: our own mapping, never touched again (the caller forgets `self`).
        unsafe { libc::munmap(self.map.as_mut_ptr().cast(), self.map.len()) };
    }

    /// Waits up to `timeout` (for ever if `None`) for a taker's nudge, or
    /// for [`Wanted::wake`]; whether a taker has nudged since the last call.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let word = want_word(&self.map);
        let seen = self.seen.load(Ordering::Acquire);
        if word.load(Ordering::Acquire) == seen {
            futex(word, libc::FUTEX_WAIT, seen, timeout);
        }
        let now = word.load(Ordering::Acquire);
        self.seen.store(now, Ordering::Release);
        now != seen
    }

    /// Wakes a thread in [`Wanted::wait`] without a nudge (its owner tells it to stop).
    pub fn wake(&self) {
        futex(want_word(&self.map), libc::FUTEX_WAKE, i32::MAX as u32, None);
    }
}

/// Removes the lock files beside `ours` that no process holds (left by
/// killed holders), each while holding its lock, as a holder removes its own:
/// a taker that locked one meanwhile finds it gone from the path and opens
/// a new one.
fn sweep(ours: &Path) {
    let Some(dir) = ours.parent() else { return };
    let Ok(names) = crate::sys::dir_names(dir) else { return };
    for name in names {
        let path = dir.join(&name);
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

/// Called by a process that let go of the lock of `spec` at `given` because
/// another process waited for it, before it takes the lock again: waits
/// until a taker has made the lock file anew (it has the lock, or is about
/// to) or 20 ms have passed since `given`. A waiting taker tries every
/// millisecond, and a holder that uses the device again at once took the lock
/// back first every time: a program forking children that each needed the
/// mount while one of its threads wrote there every millisecond had each
/// child wait `IOPATH_MOUNT_WAIT` in vain.
pub fn after_giving_way(spec: &str, given: Instant) {
    let Some(path) = backing_path(spec).and_then(|device| lock_path(&device).ok()) else { return };
    while given.elapsed() < GIVE_WAY_FOR && !path.exists() {
        std::thread::sleep(Duration::from_millis(1));
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

    /// A scratch directory with a one-block image file in it: (dir, image, its path as a spec).
    fn scratch_image() -> (tempfile::TempDir, PathBuf, String) {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("x.img");
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let spec = img.to_str().unwrap().to_string();
        (dir, img, spec)
    }

    #[test]
    fn a_second_taker_is_refused_with_the_holders_pid_and_every_spelling_is_one_lock() {
        let (_dir, _img, bare) = scratch_image();
        let held = MountLock::acquire(&bare, Duration::ZERO).unwrap().unwrap();
        let text = String::from_utf8_lossy(&std::fs::read(held.path()).unwrap()).into_owned();
        assert_eq!(holder_of(&text), Some(std::process::id()));
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
        let (_dir, img, spec) = scratch_image();
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
    fn a_waiting_taker_is_seen_by_a_holder_that_watches() {
        let (_dir, _img, spec) = scratch_image();
        let held = MountLock::acquire(&spec, Duration::ZERO).unwrap().unwrap();
        let wanted = held.watch().unwrap();
        assert!(!wanted.wait(Some(Duration::ZERO)), "nobody waits yet");
        // flock conflicts between open file descriptions: this process stands in for another.
        assert!(MountLock::acquire(&spec, Duration::from_millis(30)).is_err());
        assert!(wanted.wait(Some(Duration::ZERO)), "the taker's wait was seen");
        assert!(!wanted.wait(Some(Duration::ZERO)), "and only once");
        // A watcher waiting for ever is woken by its owner, with nothing seen.
        std::thread::scope(|s| {
            let waiting = s.spawn(|| wanted.wait(None));
            while !waiting.is_finished() {
                wanted.wake();
                std::thread::yield_now();
            }
            assert!(!waiting.join().unwrap());
        });
        let text = String::from_utf8_lossy(&std::fs::read(held.path()).unwrap()).into_owned();
        assert_eq!(holder_of(&text), Some(std::process::id()), "nudging leaves the holder's pid as it was");
        drop(held);
    }

    /// A taker that found the lock taken while its holder was still mounting
    /// (before it watched) nudged once and then not for [`NUDGE_EVERY`]: the
    /// holder's watch counts that nudge. It did not, and each such taker
    /// waited 100 ms (`make -j2` on a mount: 38 waits of 101-107 ms in 142).
    #[test]
    fn a_holder_sees_the_takers_that_waited_before_it_began_to_watch() {
        let (_dir, _img, spec) = scratch_image();
        let held = MountLock::acquire(&spec, Duration::ZERO).unwrap().unwrap();
        // flock conflicts between open file descriptions: this process stands in for another.
        assert!(MountLock::acquire(&spec, Duration::from_millis(30)).is_err());
        let wanted = held.watch().unwrap();
        assert!(wanted.wait(Some(Duration::ZERO)), "the nudge before the watch is seen");
        assert!(!wanted.wait(Some(Duration::ZERO)), "and only once");
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
