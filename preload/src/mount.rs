//! Mounts: directories whose paths iopath's file system serves
//! (`IOPATH_MOUNT=DIR=DEVICE[;DIR=DEVICE]`), and the descriptors opened
//! in them.
//!
//! A path is inside a mount when, made absolute (against the working
//! directory, or the directory a `*at` call's descriptor names) and with
//! `.`, `..` and repeated slashes resolved by name, it is the mount's
//! directory or lies below it. The file system is mounted the first time a
//! call reaches it, so a program that never touches the mount pays nothing
//! but that check, and committed at exit. One process mounts a device at a
//! time (`iopath::fs::lock`): a second one waits up to `IOPATH_MOUNT_WAIT`
//! seconds (default 10) and then fails its calls into the mount with EBUSY,
//! saying which process holds it; the lock goes when its holder exits.
//!
//! A descriptor opened in a mount is a real descriptor number: an `O_PATH`
//! descriptor of the mount's directory (or `/`) reserves it, so no other
//! open in the process can get that number, and a call the interposer does
//! not implement reaches the kernel with an `O_PATH` descriptor, which
//! fails with `EBADF` rather than touching another file. What it stands for
//! (a [`Description`]: the file or directory, the open flags and one file
//! position, shared by its duplicates as POSIX says) is in a table.

use crate::real;
use iopath::fs::lock::MountLock;
use iopath::fs::{File, FileSystem, MountOptions};
use libc::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// One mount: a directory and the device whose file system serves it.
pub struct Mount {
    /// The directory, absolute, without a trailing slash.
    pub dir: Vec<u8>,
    /// The device spec (a bare path means `uring:PATH`).
    pub device: String,
    /// `st_dev` reported for its files.
    pub dev: u64,
    /// The file system while this process has it mounted, and its lock.
    state: Mutex<MountState>,
    /// Its lender (gives it back to a process that waits for it).
    lending: Lending,
    /// In a forked child: a thread of the parent had this mount's state
    /// locked at the fork, so the child can neither drop the parent's file
    /// system nor mount its own (calls on it fail with EPERM, said once).
    stuck: AtomicBool,
    /// How long this process waited for the mount (said at exit with `IOPATH_LOG`).
    waits: Waits,
}

/// What sharing a mount with other processes cost one process: its waits
/// for another to give the mount back, and its waits giving way after it
/// lent the mount ([`iopath::fs::lock::after_giving_way`]).
#[derive(Default)]
struct Waits {
    times: AtomicU64,
    ns: AtomicU64,
    longest_ns: AtomicU64,
    gave_way_times: AtomicU64,
    gave_way_ns: AtomicU64,
    /// Tries of the lender that found the mount busy, by what kept it ([`Busy`]).
    busy: [AtomicU64; 4],
    /// Lends done, and the time their commits took.
    lends: AtomicU64,
    lend_commit_ns: AtomicU64,
}

/// What kept a lender from giving the mount back at one try.
#[derive(Clone, Copy)]
enum Busy {
    /// A call on a mounted file was under way.
    Call = 0,
    /// A file open here has no name (unlinked): it cannot be opened again.
    Unnamed = 1,
    /// A file open here had a record lock taken on it.
    Locked = 2,
    /// Something else held the file system: a call on a path, a directory
    /// stream, a shared map, a bridge.
    Held = 3,
}

/// A take of the mount lock shorter than this did not wait for anyone.
const WAITED: std::time::Duration = std::time::Duration::from_micros(200);

impl Waits {
    fn waited(&self, took: std::time::Duration) {
        if took >= WAITED {
            let ns = took.as_nanos() as u64;
            self.times.fetch_add(1, Ordering::Relaxed);
            self.ns.fetch_add(ns, Ordering::Relaxed);
            self.longest_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }

    fn gave_way(&self, took: std::time::Duration) {
        self.gave_way_times.fetch_add(1, Ordering::Relaxed);
        self.gave_way_ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    fn busy(&self, why: Busy) {
        self.busy[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn lent(&self, commit: std::time::Duration) {
        self.lends.fetch_add(1, Ordering::Relaxed);
        self.lend_commit_ns.fetch_add(commit.as_nanos() as u64, Ordering::Relaxed);
    }

    /// One line for the exit's log, if this process waited or lent at all.
    fn summary(&self) -> Option<String> {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (times, gave_way, lends) = (count(&self.times), count(&self.gave_way_times), count(&self.lends));
        if times == 0 && gave_way == 0 && lends == 0 {
            return None;
        }
        let [call, unnamed, locked, held] = self.busy.each_ref().map(count);
        Some(format!(
            "waited for other processes to give it back {times} times, {:.1} ms in all (longest {:.1} ms); \
             lent it {lends} times ({:.1} ms committing), found it busy when asked {} times (a call under way \
             {call}, an unlinked file open {unnamed}, a locked file {locked}, held otherwise {held}); \
             gave way to a process it lent it to {gave_way} times, {:.1} ms in all",
            ms(&self.ns),
            ms(&self.longest_ns),
            ms(&self.lend_commit_ns),
            call + unnamed + locked + held,
            ms(&self.gave_way_ns)
        ))
    }
}

/// What sharing each mount with other processes cost this process (at
/// exit, with `IOPATH_LOG`): how often and how long it waited for them.
pub fn waits_summary() -> Vec<String> {
    MOUNTS
        .get()
        .map_or(&[][..], |v| &v[..])
        .iter()
        .filter_map(|m| m.waits.summary().map(|s| format!("{}: {s}", m.device)))
        .collect()
}

#[derive(Default)]
struct MountState {
    fs: Option<FileSystem>,
    lock: Option<MountLock>,
    /// The io_uring engine of the last mount here, kept after the mount was
    /// given back and used by the next: its queues (the program's threads'
    /// rings) stay, as when the process keeps the mount. Closing them sent
    /// task work (`TWA_SIGNAL`) to every program thread that used one, and a
    /// blocking read or write such a thread was in came back cut short
    /// (`os.read` of /dev/urandom in a Python program that had run `cat` on
    /// a mounted file). The device stays open without its lock, as any
    /// process may open it; no data is held here.
    kept_engine: Option<Arc<iopath::Engine>>,
    /// A failure was said on stderr already.
    said: bool,
    /// When a call last waited the whole `IOPATH_MOUNT_WAIT` for another
    /// process in vain: calls within another such wait of it only look,
    /// without waiting again. bash stats "." twice in a command search: a
    /// forked bash whose working directory is on a mount another process
    /// kept waited 10 s for each (`{ head; cat; } < big | md5sum`: 20 s).
    gave_up: Option<std::time::Instant>,
    /// When this process last gave the mount to a process that waited for
    /// it: the next mount here lets that one take it first
    /// (`iopath::fs::lock::after_giving_way`).
    lent: Option<std::time::Instant>,
}

/// How long a call waits for another process to let go of a mount: `wait`,
/// or nothing within `wait` of a call that waited it all in vain (`gave_up`).
fn wait_now(gave_up: Option<std::time::Instant>, wait: std::time::Duration) -> std::time::Duration {
    if gave_up.is_some_and(|at| at.elapsed() < wait) { std::time::Duration::ZERO } else { wait }
}

/// Each mount's lender: one thread per process (never ending: a thread
/// that ends while another forks can leave the child waiting for ever on a
/// lock the Rust library takes as threads start and end), which serves
/// each time this process has the mount (see [`lend`]).
#[derive(Default)]
struct Lending {
    /// Moves on at each mount and release here; the thread waits on it (a futex) between mounts.
    epoch: AtomicU32,
    /// The watch of this mount's lock while this process has it.
    current: Mutex<Option<Arc<iopath::fs::lock::Wanted>>>,
    /// The fork generation (plus one) of the process whose thread serves it: 0 for none.
    thread_of: AtomicU64,
}

impl Lending {
    /// A new mount (`Some`) or a release (`None`): the thread looks again.
    fn set(&self, wanted: Option<Arc<iopath::fs::lock::Wanted>>) {
        let old = std::mem::replace(&mut *self.current.lock().unwrap_or_else(|e| e.into_inner()), wanted);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        iopath::sys::futex_wake_all(&self.epoch);
        if let Some(old) = old {
            old.wake();
        }
    }
}

/// How long a lender keeps trying to give the mount back after the last
/// sign that a process waits (a waiter signs every `NUDGE_EVERY`).
const LEND_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// How a lend is said in the log.
const LENT: &str = "to a process that waits for it";

/// A lender's thread: while this process has mount `m`, each time another
/// process waits for it (`iopath::fs::lock::Wanted`), gives it back as soon
/// as nothing here holds it open ([`Mount::release_if_idle`]), trying every
/// 2 ms while the waiter keeps waiting. A parent that waits for its
/// children (make running its jobs, `make -j2` most of all) held them off
/// the mount until they gave up: now they take turns, as they do after a
/// fork. The next call here mounts again (waiting its turn).
fn lend(m: &'static Mount) {
    let _inside = crate::Inside::enter();
    loop {
        let epoch = m.lending.epoch.load(Ordering::Acquire);
        let current = crate::background(|| m.lending.current.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let Some(wanted) = current else {
            iopath::sys::futex_wait(&m.lending.epoch, epoch, None);
            continue;
        };
        let mut until: Option<std::time::Instant> = None;
        // Bridges were let go in this stretch of nudges already.
        let mut bridges_let_go = false;
        while m.lending.epoch.load(Ordering::Acquire) == epoch {
            let nudged = wanted.wait(Some(std::time::Duration::from_millis(if until.is_some() { 2 } else { 1000 })));
            if m.lending.epoch.load(Ordering::Acquire) != epoch {
                break;
            }
            let now = std::time::Instant::now();
            if nudged {
                // Bridges are let go once per nudge (a waiter nudges every 100 ms): a
                // let-go that did not free the mount (a call under way here) is tried
                // again at the next. Once per stretch of nudges, a program that went
                // on writing kept the mount until the waiter gave up: rsync's receiver,
                // whose temp files land on its descriptor 1 (it closes its standard
                // output), against its sender, every run of `rsync -a` in a mount.
                bridges_let_go = false;
                until = Some(now + LEND_FOR);
            }
            match until {
                Some(end) if now < end => {
                    if crate::background(|| m.release(LENT, true)) {
                        break;
                    }
                    // A standard stream on a file here (a bridge) keeps the mount too:
                    // `cat in | sort | head > out` in a mounted directory, where head's
                    // bridge had `out` open first, waited 10 s for cat, which could not
                    // mount, one run in five. Let go as before a fork, once a stretch
                    // (what arrives is held in memory), it no longer does. The let-go
                    // runs outside the fork gate, as before a fork: it waits for its
                    // bridges' threads, which take the gate to write what they hold
                    // (under the gate, a receiver's lender and its held bridge waited
                    // for each other for ever). A fork meanwhile waits for its resume.
                    if !std::mem::replace(&mut bridges_let_go, true) && {
                        let let_go = crate::bridge::let_go();
                        let released = crate::background(|| m.release(LENT, true));
                        let_go.resume();
                        released
                    } {
                        break;
                    }
                }
                _ => until = None,
            }
        }
    }
}

/// Lends mount `m`, just mounted with `lock`, to waiting processes: its
/// thread started if this process has none yet (nothing if the device has
/// no lock: no other process can see it).
fn start_lending(m: &Mount, lock: &Option<MountLock>) {
    let Some(m) = mounts().iter().find(|n| std::ptr::eq(*n, m)) else { return };
    let Some(lock) = lock else { return };
    let wanted = match lock.watch() {
        Ok(w) => Arc::new(w),
        Err(e) => {
            crate::log(&format!("{}: not given back to waiting processes: {e}", m.device));
            return;
        }
    };
    m.lending.set(Some(wanted));
    let generation = iopath::sys::fork_generation() + 1;
    if m.lending.thread_of.swap(generation, Ordering::AcqRel) == generation {
        return;
    }
    let named = std::thread::Builder::new().name("iopath-lend".into());
    // Returns once the thread runs: before a fork can come (see `Lending`).
    if iopath::sys::spawn_without_signals(named, move || lend(m)).is_err() {
        m.lending.thread_of.store(0, Ordering::Release);
    }
}

impl Mount {
    /// The engine spec of the device: a bare path is `uring:PATH`, and an
    /// io_uring device gets cooperative task work unless the spec chooses:
    /// with deferred task work the file layer's ordered writes (a linked
    /// flush and write) were seen to complete unsignalled, and waiters slept
    /// for seconds (db_bench fillsync: 60 ms per op, 55 us with `taskrun=coop`).
    fn engine_spec(&self) -> String {
        let spec = if self.device.contains(':') { self.device.clone() } else { format!("uring:{}", self.device) };
        if spec.starts_with("uring:") && !spec.contains("taskrun=") { format!("{spec},taskrun=coop") } else { spec }
    }

    /// The file system, mounted now if this process does not have it
    /// (again, after [`release_idle`] gave it back); `Err(errno)` if it
    /// cannot be: EBUSY while another process holds it (after waiting
    /// `IOPATH_MOUNT_WAIT`), EIO otherwise, said once on stderr whether or
    /// not `IOPATH_LOG` is set.
    pub fn fs(&self) -> std::result::Result<FileSystem, c_int> {
        self.fs_within(std::time::Duration::from_millis(crate::config().mount_wait_ms), true)
    }

    /// [`Mount::fs`] without waiting for another process to let go, and
    /// without a word if it has not: `None` then. For this library's own
    /// work that can wait (a bridge's bytes held in memory).
    pub fn try_fs(&self) -> Option<FileSystem> {
        self.fs_within(std::time::Duration::ZERO, false).ok()
    }

    fn fs_within(&self, wait: std::time::Duration, say_busy: bool) -> std::result::Result<FileSystem, c_int> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fs) = &state.fs {
            return Ok(fs.clone());
        }
        let _inside = crate::Inside::enter();
        let spec = self.engine_spec();
        if let Some(lent) = state.lent.take() {
            let giving_way = std::time::Instant::now();
            iopath::fs::lock::after_giving_way(&spec, lent);
            self.waits.gave_way(giving_way.elapsed());
        }
        let waiting = wait_now(state.gave_up, wait);
        let waited_in_vain = waiting < wait;
        let asked = std::time::Instant::now();
        let acquired = {
            // (Another process decides how long this lasts: the program's handlers run meanwhile.)
            let _handlers = crate::program_handlers::RunNow::enter();
            MountLock::acquire(&spec, waiting)
        };
        self.waits.waited(asked.elapsed());
        let lock = match acquired {
            Ok(lock) => lock,
            Err(_) if !say_busy => return Err(libc::EBUSY),
            // The process is ending (`ending`): nothing to say.
            Err(e) if e.errno() == Some(libc::EINTR) => return Err(libc::EINTR),
            Err(e) => {
                if !waited_in_vain {
                    state.gave_up = Some(std::time::Instant::now());
                }
                return Err(self.failed(&mut state, &e, libc::EBUSY));
            }
        };
        state.gave_up = None;
        let started = std::time::Instant::now();
        let options = mount_options();
        let engine = match state.kept_engine.take() {
            Some(engine) => Ok(engine),
            None => iopath::PathConfig::preset(&crate::config().path)
                .and_then(|path| iopath::Engine::open(&spec, path))
                .map(Arc::new),
        };
        let mounted = engine.and_then(|engine| {
            // No larger than the device: more could never be filled.
            let bytes = carry_bytes(&options).min(engine.device().size());
            let carry = beside(&lock, bytes, "carried cache", &self.device, |l| l.carried_cache(bytes));
            let log_bytes = crate::config().shm_log_bytes.unwrap_or(iopath::fs::shm_log::DEFAULT_BYTES);
            let log = beside(&lock, log_bytes, "shared-memory log", &self.device, |l| l.shm_log(log_bytes));
            FileSystem::mount_beside(engine, options, carry, log)
        });
        match mounted {
            Ok((fs, found)) => {
                let carried = match (found.carried, &found.carry_error) {
                    (_, Some(e)) => format!(" (carried cache set aside: {e})"),
                    (Some(blocks), None) => format!(" ({blocks} blocks in its carried cache)"),
                    (None, None) => String::new(),
                };
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let (dir, names) = (String::from_utf8_lossy(&self.dir), fs.names());
                crate::log(&format!("mounted {} on {dir} in {ms:.1} ms ({names} names){carried}", self.device));
                state.fs = Some(fs.clone());
                start_lending(self, &lock);
                crate::interrupted_exit::prepare();
                state.lock = lock;
                Ok(fs)
            }
            Err(e) => Err(self.failed(&mut state, &e, libc::EIO)),
        }
    }

    fn failed(&self, state: &mut MountState, e: &iopath::Error, errno: c_int) -> c_int {
        if !std::mem::replace(&mut state.said, true) {
            crate::say(&format!("cannot mount {} on {}: {e}", self.device, String::from_utf8_lossy(&self.dir)));
        }
        errno
    }

    /// Whether a forked child cannot use this mount at all (see [`leave_to_parent`]).
    pub fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire)
    }

    /// [`Mount::mounted`], never waiting: `None` for a stuck mount.
    fn mounted_here(&self) -> Option<FileSystem> {
        if self.stuck() { None } else { self.mounted() }
    }

    /// The file system if this process has it mounted now.
    pub fn mounted(&self) -> Option<FileSystem> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).fs.clone()
    }

    /// Whether this mount was held at the moment of a `fork`, asked in the
    /// child: its state as the parent left it, or held if a thread of the
    /// parent had its lock then (that thread is not in the child: never wait).
    fn held_across_fork(&self) -> bool {
        match self.state.try_lock() {
            Ok(state) => state.fs.is_some() || state.lock.is_some(),
            Err(std::sync::TryLockError::Poisoned(state)) => {
                let state = state.into_inner();
                state.fs.is_some() || state.lock.is_some()
            }
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }
}

/// Every mount's state, locked by a thread that forks from before the fork
/// to after it ([`hold_states_for_fork`]).
pub struct StatesHeld(#[allow(dead_code)] Vec<std::sync::MutexGuard<'static, MountState>>);

/// Locks every mount's state before a fork, so that the child never starts
/// with one locked by a thread it does not have: a multi-threaded program
/// that forked while another of its threads mounted, or gave a mount back,
/// left a child in which the mount was stuck (EPERM): cargo running a build
/// script stored on a mount failed so, 1 build in 2. The fork waits for
/// such work to end (a mount takes milliseconds, unless it waits for
/// another process: `IOPATH_MOUNT_WAIT` at most). A fork from inside one
/// of this library's calls (a signal handler's) takes only the free ones.
pub fn hold_states_for_fork() -> StatesHeld {
    let inside = crate::inside();
    let mounts = MOUNTS.get().map_or(&[][..], |v| &v[..]);
    StatesHeld(
        mounts
            .iter()
            .filter_map(|m| {
                if inside { m.state.try_lock().ok() } else { Some(m.state.lock().unwrap_or_else(|e| e.into_inner())) }
            })
            .collect(),
    )
}

/// In a child just forked: leaves the mounts the parent held to the parent.
/// The child's copy of each file system is forgotten (never dropped: that
/// would unmount the parent's device with engine threads that are not
/// here), so the child's first call into the mount mounts it anew, waiting
/// its turn as another process does (the parent's lender lends it when
/// nothing there is in use), and the descriptors it inherited stay the
/// parent's ([`inherited`]: EBADF). Its copies of the mount locks are
/// closed ([`MountLock::leave_to_parent`]), so that they go with the
/// parent's (given back to a process that waits, or the parent's exit),
/// whatever the child does. A mount whose state a thread of the parent had
/// locked at the fork stays stuck: that thread is not here to let it go.
pub fn leave_to_parent() {
    for m in MOUNTS.get().map_or(&[][..], |v| &v[..]) {
        let mut state = match m.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::Poisoned(state)) => state.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                m.stuck.store(true, Ordering::Release);
                continue;
            }
        };
        if let Some(fs) = state.fs.take() {
            std::mem::forget(fs);
        }
        if let Some(engine) = state.kept_engine.take() {
            std::mem::forget(engine); // (the parent's rings: never closed here)
        }
        if let Some(lock) = state.lock.take() {
            lock.leave_to_parent();
        }
        // The lender's watch maps the lock file: a mapping holds the lock as a descriptor does.
        if let Ok(mut current) = m.lending.current.try_lock()
            && let Some(wanted) = current.take()
        {
            wanted.leave_to_parent();
            std::mem::forget(wanted); // (unmapped: its drop would unmap again)
        }
    }
}

/// In a forked child of a process that held a mount: whether `d` is one
/// of the parent's descriptions (opened before the fork), which the child
/// cannot use (its file belongs to the parent's mount).
pub fn inherited(d: &Description) -> bool {
    crate::FORKED.load(Ordering::Relaxed) && d.born != iopath::sys::fork_generation()
}

/// In a child just forked: whether the parent held any mount (then the child
/// cannot use it: its engine's threads are not here). A parent that held
/// none (it gave them back before the fork, or never mounted) has a child
/// that mounts at first use, as a new process does: a shell's subshell
/// `( cd DIR && ... )` works on a mount.
pub fn any_held_across_fork() -> bool {
    MOUNTS.get().is_some_and(|mounts| mounts.iter().any(Mount::held_across_fork))
}

fn mount_options() -> MountOptions {
    let mut options =
        MountOptions { cache_bytes: default_cache_bytes(), fsync_path: MOUNT_FSYNC_PATH, ..MountOptions::default() };
    if let Some(bytes) = crate::config().cache_bytes {
        options.cache_bytes = bytes;
    }
    if let Some(commit) = crate::config().namespace_commit {
        options.namespace_commit = commit;
    }
    if let Some(path) = crate::config().fsync_path {
        options.fsync_path = path;
    }
    if let Some(on) = crate::config().write_behind {
        options.write_behind = on;
    }
    if let Some(bytes) = crate::config().read_around_bytes {
        options.read_around_bytes = bytes;
    }
    options
}

/// The fsync path of a mount when `IOPATH_FSYNC_PATH` does not say:
/// `journaled` (a small fsync's data goes into its transaction, one round
/// trip; more than 16 blocks are written in place as on `aios`). Measured
/// with `scripts/real-apps` against `aios` (the file layer's default),
/// medians of 3 alternating rounds, idle CPUs halting: db_bench fillsync at
/// 1 and 4 threads 2.15x and 1.72x ext4 (aios: 1.22x, 1.01x), overwrite
/// --sync=1 2.04x (1.44x), SQLite WAL 1.23x (aios 0.87x), sysbench rndwr
/// 1.11x (1.11x); every other cell within the rounds' spread of `aios`'s.
const MOUNT_FSYNC_PATH: iopath::fs::FsyncPath = iopath::fs::FsyncPath::Journaled;

/// The page cache bound of a mount when `IOPATH_CACHE` does not say: an
/// eighth of the machine's memory, at least the file layer's 64 MiB. The
/// kernel's page cache takes whatever memory is free, and buffered programs
/// (RocksDB without direct reads, SQLite) count on it; pages are taken only
/// as files are read, so the bound costs nothing until it is used.
/// The carried cache's bound: `IOPATH_CARRY`, else the page cache's, at most 1 GiB.
/// What the mount lock's holder keeps beside the lock (`bytes` of it; none
/// for 0 or without a lock), if `open` can open it; says why not.
fn beside<T>(
    lock: &Option<MountLock>,
    bytes: u64,
    what: &str,
    device: &impl std::fmt::Display,
    open: impl FnOnce(&MountLock) -> iopath::Result<T>,
) -> Option<T> {
    let lock = lock.as_ref().filter(|_| bytes > 0)?;
    open(lock).inspect_err(|e| crate::log(&format!("no {what} for {device}: {e}"))).ok()
}

fn carry_bytes(options: &MountOptions) -> u64 {
    crate::config().carry_bytes.unwrap_or(options.cache_bytes.min(1 << 30))
}

/// The bound of the page frames taken from /dev/shm ([`iopath::frames`]):
/// `IOPATH_FRAMES`, else 512 MiB, at most a sixteenth of the memory.
pub fn frames_bytes() -> u64 {
    crate::config().frames_bytes.unwrap_or_else(|| (memory_bytes() / 16).min(512 << 20))
}

fn memory_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    u64::try_from(pages).unwrap_or(0).saturating_mul(u64::try_from(page).unwrap_or(0))
}

fn default_cache_bytes() -> u64 {
    (memory_bytes() / 8).max(MountOptions::default().cache_bytes)
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();

/// Every mount of `IOPATH_MOUNT`.
pub fn mounts() -> &'static [Mount] {
    MOUNTS.get_or_init(|| {
        let cwd = real_cwd().unwrap_or_else(|| b"/".to_vec());
        crate::config()
            .mounts
            .iter()
            .enumerate()
            .map(|(i, (dir, device))| Mount {
                dir: normalize(&cwd, dir.as_bytes()),
                device: device.clone(),
                dev: 0x1_0000_0000 + i as u64,
                state: Mutex::new(MountState::default()),
                lending: Lending::default(),
                stuck: AtomicBool::new(false),
                waits: Waits::default(),
            })
            .collect()
    })
}

/// The kernel's working directory as last read: the hooks of chdir and
/// fchdir forget it, so resolving a relative path costs no system call.
/// (Shared, so a path's resolution takes it without a copy.)
static KERNEL_CWD: RwLock<Option<Arc<[u8]>>> = RwLock::new(None);

/// The kernel's working directory (cached; see [`forget_kernel_cwd`]).
pub fn kernel_cwd() -> Option<Arc<[u8]>> {
    let section = crate::Section::enter();
    if let Some(dir) = KERNEL_CWD.read().unwrap_or_else(|e| e.into_inner()).clone() {
        return Some(dir);
    }
    drop(section);
    let dir: Arc<[u8]> = real_cwd()?.into();
    let _section = crate::Section::enter();
    *KERNEL_CWD.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&dir));
    Some(dir)
}

/// The kernel's working directory changed (a chdir or fchdir went through).
pub fn forget_kernel_cwd() {
    let _section = crate::Section::enter();
    *KERNEL_CWD.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The kernel's working directory, read now.
pub fn real_cwd() -> Option<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: getcwd writes at most buf.len() bytes into buf.
    let got = unsafe { crate::real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    if got.is_null() {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0)?;
    buf.truncate(len);
    Some(buf)
}

/// The working directory when it is inside a mount (the kernel's cannot
/// be: the mount's directories are not the kernel's), as an absolute path.
static VIRTUAL_CWD: RwLock<Option<Arc<[u8]>>> = RwLock::new(None);
static VIRTUAL_SET: AtomicBool = AtomicBool::new(false);

/// The working directory: a mount's if `chdir` went into one, else the kernel's.
pub fn cwd() -> Option<Arc<[u8]>> {
    let section = crate::Section::enter();
    if VIRTUAL_SET.load(Ordering::Acquire)
        && let Some(dir) = VIRTUAL_CWD.read().unwrap_or_else(|e| e.into_inner()).clone()
    {
        return Some(dir);
    }
    drop(section);
    kernel_cwd()
}

/// Takes the working directory a parent passed on (`IOPATH_CWD`), if this
/// process starts where that parent left the kernel's: the mount's own
/// directory.
pub fn adopt_inherited_cwd() {
    let Some(dir) = std::env::var_os("IOPATH_CWD") else { return };
    let dir = std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()).to_vec();
    let Some(here) = real_cwd() else { return };
    let inside = mounts().iter().find(|m| dir.starts_with(&m.dir) && matches!(dir.get(m.dir.len()), None | Some(b'/')));
    if inside.is_some_and(|m| m.dir == here) {
        set_virtual_cwd(Some(dir));
    }
}

/// The working directory if it is inside a mount.
pub fn virtual_cwd() -> Option<Vec<u8>> {
    if !VIRTUAL_SET.load(Ordering::Acquire) {
        return None;
    }
    let _section = crate::Section::enter();
    VIRTUAL_CWD.read().unwrap_or_else(|e| e.into_inner()).as_deref().map(<[u8]>::to_vec)
}

/// Sets (or with `None`, clears) the working directory inside a mount.
pub fn set_virtual_cwd(dir: Option<Vec<u8>>) {
    let _section = crate::Section::enter();
    let mut cwd = VIRTUAL_CWD.write().unwrap_or_else(|e| e.into_inner());
    VIRTUAL_SET.store(dir.is_some(), Ordering::Release);
    *cwd = dir.map(Arc::from);
}

/// The path the kernel should get for `path` relative to `dirfd`, when it
/// is not the caller's own: a relative path while the working directory is
/// a mount's, or relative to a mounted directory descriptor, made absolute.
pub fn kernel_path(dirfd: c_int, path: &[u8]) -> Option<std::ffi::CString> {
    if path.is_empty() || path.starts_with(b"/") {
        return None;
    }
    let base = if dirfd == libc::AT_FDCWD {
        if !VIRTUAL_SET.load(Ordering::Acquire) {
            return None;
        }
        let _section = crate::Section::enter();
        VIRTUAL_CWD.read().unwrap_or_else(|e| e.into_inner()).as_deref()?.to_vec()
    } else {
        let d = lookup(dirfd)?;
        let mut b = d.mount.dir.clone();
        b.extend_from_slice(&d.path);
        b
    };
    std::ffi::CString::new(normalize(&base, path)).ok()
}

/// `path` made absolute against `base` (absolute), with `.`, `..` and
/// repeated slashes resolved by name; no trailing slash (but `/`).
pub fn normalize(base: &[u8], path: &[u8]) -> Vec<u8> {
    normalize_with(base, path, |_| None)
}

/// As [`normalize`], but a `..` right after a symbolic link inside a mount
/// climbs from where the link leads, as the kernel resolves it (`link/..`
/// is the parent of the link's target, not the directory holding the
/// link). Links outside every mount are taken by name, as [`normalize`]
/// takes them (the kernel follows them when it serves the path; a link
/// outside that leads into a mount and is followed by `..` is not seen).
pub fn normalize_through_links(base: &[u8], path: &[u8]) -> Vec<u8> {
    normalize_with(base, path, link_target_in_mount)
}

/// [`normalize`], where `before_climbing` may replace the path so far
/// before a `..` takes its last name off.
fn normalize_with(base: &[u8], path: &[u8], before_climbing: impl Fn(&[u8]) -> Option<Vec<u8>>) -> Vec<u8> {
    let start = if path.starts_with(b"/") { &b""[..] } else { base };
    // Built in place (one allocation: this runs for every path a program names).
    let mut out = Vec::with_capacity(path.len() + start.len() + 1);
    for part in start.split(|&b| b == b'/').chain(path.split(|&b| b == b'/')) {
        match part {
            b"" | b"." => {}
            b".." => {
                if let Some(replaced) = before_climbing(&out) {
                    out = replaced;
                }
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
            }
            p => {
                out.push(b'/');
                out.extend_from_slice(p);
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// Where `path` (absolute, normalized) leads once the symbolic links on it
/// inside a mount are followed, the last one too; `None` where there is no
/// link on it in a mount (or the mount cannot be asked).
fn link_target_in_mount(path: &[u8]) -> Option<Vec<u8>> {
    use iopath::fs::Resolved;
    let mount = mounts().iter().find(|m| path.starts_with(&m.dir) && path.get(m.dir.len()) == Some(&b'/'))?;
    let fs = mount.fs().ok()?;
    Some(match fs.resolve(&path[mount.dir.len()..], true).ok()?? {
        Resolved::Inside(inner) => {
            let mut out = mount.dir.clone();
            out.extend_from_slice(inner.strip_suffix(b"/").unwrap_or(&inner));
            out
        }
        // Out of the mount: by name from there on (the kernel's business).
        Resolved::Absolute(target) => normalize(b"/", &target),
        Resolved::Above(rel) => normalize(&mount.dir, &rel),
    })
}

/// A path inside a mount: the mount and the path from its root (`/...`,
/// with a trailing `/` kept when the caller's had one: it demands a directory).
pub struct Inside {
    /// The mount.
    pub mount: &'static Mount,
    /// The path inside it.
    pub path: Vec<u8>,
}

/// Where `path` leads, relative to `dirfd` (`AT_FDCWD` or a descriptor).
/// `None`: outside every mount (the kernel's business).
pub fn resolve(dirfd: c_int, path: &[u8]) -> Option<Inside> {
    let mounts = mounts();
    if mounts.is_empty() || path.is_empty() {
        return None;
    }
    let (shared, joined);
    let base: &[u8] = if path.starts_with(b"/") {
        b""
    } else if dirfd == libc::AT_FDCWD {
        shared = cwd()?;
        &shared
    } else if let Some(d) = lookup(dirfd) {
        let mut b = d.mount.dir.clone();
        b.extend_from_slice(&d.path);
        joined = b;
        &joined
    } else if let Some(above) = kernel_dir_above(dirfd) {
        joined = above;
        &joined
    } else {
        return None; // a real directory descriptor: the kernel resolves it
    };
    // A `..` may follow a link: only such paths pay for looking (a lookup per `..`).
    let climbs = path.split(|&b| b == b'/').any(|p| p == b"..");
    let mut full = if climbs { normalize_through_links(base, path) } else { normalize(base, path) };
    let mount =
        mounts.iter().find(|m| full.starts_with(&m.dir) && matches!(full.get(m.dir.len()), None | Some(b'/')))?;
    full.drain(..mount.dir.len());
    let mut inner = full;
    if inner.is_empty() {
        inner.push(b'/');
    }
    if path.ends_with(b"/") && !inner.ends_with(b"/") {
        inner.push(b'/');
    }
    Some(Inside { mount, path: inner })
}

/// The kernel's descriptors of directories above a mount (`/mnt` of a
/// mount on `/mnt/i`), with their paths. A path relative to one may lead
/// into the mount (`openat(fd, "i/x")`: MariaDB opens each of its files a
/// component at a time from `/`), where the kernel would find only the
/// empty directory under it. A process holds few; none costs a load.
static KERNEL_DIRS: Mutex<Vec<(c_int, Vec<u8>)>> = Mutex::new(Vec::new());
static KERNEL_DIR_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The path of kernel descriptor `fd` if it is a directory above a mount.
fn kernel_dir_above(fd: c_int) -> Option<Vec<u8>> {
    if KERNEL_DIR_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let _section = crate::Section::enter();
    let dirs = KERNEL_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.iter().find(|(f, _)| *f == fd).map(|(_, p)| p.clone())
}

fn set_kernel_dir(fd: c_int, path: Option<Vec<u8>>) {
    let _section = crate::Section::enter();
    let mut dirs = KERNEL_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.retain(|(f, _)| *f != fd);
    if let Some(path) = path {
        dirs.push((fd, path));
    }
    KERNEL_DIR_COUNT.store(dirs.len(), Ordering::Release);
}

/// The kernel opened `path` (relative to `dirfd`) as `fd`, a directory (or
/// an `O_PATH` descriptor): noted if it lies above a mount ([`resolve`]
/// then takes paths relative to it into the mount).
pub fn kernel_dir_opened(dirfd: c_int, path: &[u8], fd: c_int) {
    let mounts = mounts();
    if fd < 0 || mounts.is_empty() || path.is_empty() {
        return;
    }
    let base: Vec<u8> = if path.starts_with(b"/") {
        Vec::new()
    } else if dirfd == libc::AT_FDCWD {
        match cwd() {
            Some(c) => c.to_vec(),
            None => return,
        }
    } else {
        match kernel_dir_above(dirfd) {
            Some(p) => p,
            None => return,
        }
    };
    let full = normalize(&base, path);
    let above =
        |m: &Mount| m.dir.len() > full.len() && m.dir.starts_with(&full) && (full == b"/" || m.dir[full.len()] == b'/');
    if mounts.iter().any(above) {
        set_kernel_dir(fd, Some(full));
    } else if KERNEL_DIR_COUNT.load(Ordering::Acquire) != 0 {
        set_kernel_dir(fd, None); // a number used again
    }
}

/// Kernel descriptor `fd` was closed (or replaced).
pub fn kernel_dir_closed(fd: c_int) {
    if KERNEL_DIR_COUNT.load(Ordering::Acquire) != 0 {
        set_kernel_dir(fd, None);
    }
}

/// The kernel made `to` a duplicate of `from`.
pub fn kernel_dir_duplicated(from: c_int, to: c_int) {
    if to >= 0 && KERNEL_DIR_COUNT.load(Ordering::Acquire) != 0 {
        set_kernel_dir(to, kernel_dir_above(from));
    }
}

/// The kernel's (device, inode) of each mount's directory, read once
/// (`None` where it is not there).
fn mount_dir_ids() -> &'static [Option<(u64, u64)>] {
    static IDS: OnceLock<Vec<Option<(u64, u64)>>> = OnceLock::new();
    IDS.get_or_init(|| {
        mounts()
            .iter()
            .map(|m| {
                let dir = std::ffi::CString::new(m.dir.clone()).ok()?;
                // SAFETY: all-zero is a valid struct stat.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: a NUL-terminated path and a buffer of ours.
                (unsafe { crate::real::stat(dir.as_ptr(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
            })
            .collect()
    })
}

/// The mount whose directory the kernel's (device, inode) `id` is: a path
/// the kernel resolved there went through a symbolic link of the kernel's
/// into the mount, and finds only the empty directory under it.
pub fn mount_of_kernel_dir(id: (u64, u64)) -> Option<&'static Mount> {
    let at = mount_dir_ids().iter().position(|m| *m == Some(id))?;
    mounts().get(at)
}

/// Where a name (`path`, relative to `dirfd`, outside every mount by its
/// path) is if the directory it is in is a mount's own, reached through a
/// symbolic link of the kernel's (`/tmp/to-mount/new` with `/tmp/to-mount
/// -> /mnt/i`): in the mount, where the kernel would make it in the empty
/// directory under it. One `stat` of the parent; `None` otherwise.
pub fn named_through_kernel_link(dirfd: c_int, path: &[u8]) -> Option<Inside> {
    if mounts().is_empty() {
        return None;
    }
    let trimmed = &path[..path.iter().rposition(|&b| b != b'/')? + 1];
    let (parent, name) = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(0) => (&b"/"[..], &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&b"."[..], trimmed),
    };
    if name == b"." || name == b".." {
        return None;
    }
    let parent = std::ffi::CString::new(parent).ok()?;
    // SAFETY: all-zero is a valid struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of ours; the links on the way are followed.
    if unsafe { crate::real::fstatat(dirfd, parent.as_ptr(), &mut st, 0) } != 0 {
        return None;
    }
    let mount = mount_of_kernel_dir((st.st_dev, st.st_ino))?;
    let mut inner = vec![b'/'];
    inner.extend_from_slice(name);
    Some(Inside { mount, path: inner })
}

/// What an open descriptor of a mount stands for.
pub enum Node {
    /// A file.
    File(Slot),
    /// A directory (its path from the mount's root, as opened).
    Dir,
}

impl Node {
    /// A file just opened.
    pub fn file(file: File) -> Node {
        Node::File(Slot { state: RwLock::new(SlotState::Open(file)) })
    }
}

/// The file of an open description: open while this process has the mount,
/// or, after the mount was given to another process with the description
/// still open (`Mount::release` with `dormant`, by its lender), where to find it
/// again: the next call on it mounts again and opens the file anew by its
/// inode number and generation, wherever it is named now (the path is kept
/// for what is said about it).
pub struct Slot {
    state: RwLock<SlotState>,
}

enum SlotState {
    Open(File),
    Dormant { ino: u64, generation: u64, path: Vec<u8> },
}

/// The file of a description, borrowed for one call (the mount cannot be
/// given away meanwhile).
pub struct FileRef<'a>(std::sync::RwLockReadGuard<'a, SlotState>);

impl std::ops::Deref for FileRef<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match &*self.0 {
            SlotState::Open(f) => f,
            // A FileRef is made only of an open slot, and holds it so.
            SlotState::Dormant { .. } => unreachable!("a borrowed file is open"),
        }
    }
}

impl Slot {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, SlotState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// (inode number, generation, path from the mount's root) of a dormant slot.
    fn dormant(&self) -> Option<(u64, u64, Vec<u8>)> {
        match &*self.read() {
            SlotState::Open(_) => None,
            SlotState::Dormant { ino, generation, path } => Some((*ino, *generation, path.clone())),
        }
    }
}

/// An open file description: shared by a descriptor and its duplicates.
pub struct Description {
    /// The mount.
    pub mount: &'static Mount,
    /// The path it was opened by, from the mount's root.
    pub path: Vec<u8>,
    /// File or directory.
    pub node: Node,
    /// The status flags (`O_ACCMODE`, `O_APPEND`, `O_NONBLOCK`, ...), as `F_GETFL` gives them.
    pub flags: AtomicI32,
    /// The file position.
    pub position: Mutex<u64>,
    /// The fork generation of the process that opened it
    /// (`iopath::sys::fork_generation`): in a forked child, another one's
    /// means the parent's ([`inherited`]).
    pub born: u64,
    /// A record lock was taken on it: its mount is never given away while
    /// it is open (`Mount::release` with `dormant`, by its lender), as
    /// another process could then write what the lock keeps it from.
    pub locked: AtomicBool,
    /// The descriptor of the kernel file its flocks are taken on (-1: none
    /// yet; `posix/locks.rs`): kept while the description lives, dormant
    /// or not, and closed with it, which lets go of the flock.
    pub flock_fd: AtomicI32,
}

impl Description {
    /// The inode number of its file, known without the mount (a dormant
    /// file's is remembered); `None` for a directory.
    pub fn file_ino(&self) -> Option<u64> {
        let Node::File(slot) = &self.node else { return None };
        match &*slot.state.read().unwrap_or_else(|e| e.into_inner()) {
            SlotState::Open(file) => Some(file.metadata().ino),
            SlotState::Dormant { ino, .. } => Some(*ino),
        }
    }

    /// Whether it was opened for reading.
    pub fn readable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_WRONLY
    }

    /// Whether it was opened for writing.
    pub fn writable(&self) -> bool {
        matches!(self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
    }

    /// Whether writes go to the end.
    pub fn append(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_APPEND != 0
    }

    /// The file, or `EISDIR`. A file whose mount this process gave to
    /// another one meanwhile is opened again first (mounting, waiting as
    /// any call does): `EBUSY` if the mount cannot be had, `ESTALE` if the
    /// file was deleted meanwhile (said on stderr); a file renamed meanwhile
    /// is found by its inode.
    pub fn file(&self) -> std::result::Result<FileRef<'_>, c_int> {
        let Node::File(slot) = &self.node else { return Err(libc::EISDIR) };
        loop {
            let state = slot.read();
            if let SlotState::Open(_) = &*state {
                return Ok(FileRef(state));
            }
            drop(state);
            let fs = self.mount.fs()?;
            // Never waits as a writer: a thread may hold this slot twice (copy_file_range
            // within one description), and a waiting writer can stop a second reader.
            let mut state = match slot.state.try_write() {
                Ok(state) => state,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::yield_now();
                    continue;
                }
            };
            if let SlotState::Dormant { ino, generation, path } = &*state {
                let _inside = crate::Inside::enter();
                let direct = self.flags.load(Ordering::Relaxed) & libc::O_DIRECT != 0;
                match open_checked(&fs, (*ino, *generation), direct) {
                    Ok(file) => {
                        crate::log(&format!(
                            "opened {}{} again",
                            String::from_utf8_lossy(&self.mount.dir),
                            String::from_utf8_lossy(path)
                        ));
                        *state = SlotState::Open(file);
                    }
                    Err(why) => {
                        crate::say(&format!(
                            "{}{}: open again after this process gave its mount to another: {why}",
                            String::from_utf8_lossy(&self.mount.dir),
                            String::from_utf8_lossy(path)
                        ));
                        return Err(libc::ESTALE);
                    }
                }
            }
        }
    }
}

impl Drop for Description {
    fn drop(&mut self) {
        crate::posix::locks::release(self);
    }
}

/// An open mounted file as one program hands it to the program it
/// executes (a bridge's, `bridge/`; a descriptor above 2, `inherit.rs`):
/// enough to open it again where it stood, by inode number and generation
/// (its path is where it was opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reopen {
    /// Index of the mount in `IOPATH_MOUNT`.
    pub mount: usize,
    /// The file's inode number.
    pub ino: u64,
    /// Its generation (with `ino`, the file whatever its name:
    /// [`iopath::fs::FileSystem::open_ino`]).
    pub generation: u64,
    /// The open file's status flags.
    pub flags: c_int,
    /// The open file's position.
    pub position: u64,
    /// The file's path from the mount's root.
    pub path: Vec<u8>,
}

impl Reopen {
    /// Where open file `d` stands, its position less `unsent` bytes (read
    /// from the file, not yet given to the reader); `None` if it is a
    /// directory or has no name any more (the next program could not open it).
    pub fn of(d: &Description, unsent: u64) -> Option<Reopen> {
        let Node::File(slot) = &d.node else { return None };
        // A dormant file is where it was when this process gave the mount away.
        let (ino, generation, path) = match slot.dormant() {
            Some(found) => found,
            None => {
                let file = d.file().ok()?;
                let stat = file.metadata();
                (stat.ino, stat.generation, file.path()?)
            }
        };
        Some(Reopen {
            mount: mounts().iter().position(|m| std::ptr::eq(m, d.mount))?,
            ino,
            generation,
            flags: d.flags.load(Ordering::Relaxed) & !libc::O_DIRECT,
            position: d.position.lock().unwrap_or_else(|e| e.into_inner()).saturating_sub(unsent),
            path,
        })
    }

    /// `mount|ino|generation|flags|position|hexpath` (no `;`, `|` nor `=`
    /// whatever the path holds).
    pub fn encode(&self) -> String {
        let path: String = self.path.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}|{}|{}|{}|{}|{path}", self.mount, self.ino, self.generation, self.flags, self.position)
    }

    /// [`Reopen::encode`]'s fields, read back.
    pub fn decode(parts: &[&str]) -> Option<Reopen> {
        let [mount, ino, generation, flags, position, path] = parts[..] else { return None };
        let hex = path.as_bytes();
        if hex.len() % 2 != 0 {
            return None;
        }
        let path = hex
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Reopen {
            mount: mount.parse().ok()?,
            ino: ino.parse().ok()?,
            generation: generation.parse().ok()?,
            flags: flags.parse().ok()?,
            position: position.parse().ok()?,
            path,
        })
    }

    /// The directory of its mount (empty if this process has no such mount).
    pub fn mount_dir(&self) -> &'static [u8] {
        mounts().get(self.mount).map_or(&b""[..], |m| &m.dir[..])
    }

    /// The file opened again (its mount mounted first, waiting as any call does).
    pub fn open(&self) -> std::result::Result<Description, String> {
        let m = mounts().get(self.mount).ok_or("no such mount here")?;
        let fs = m.fs().map_err(|errno| std::io::Error::from_raw_os_error(errno).to_string())?;
        self.open_in(&fs, m)
    }

    /// [`Reopen::open`] in `fs`, mount `m`'s file system.
    pub fn open_in(&self, fs: &FileSystem, m: &'static Mount) -> std::result::Result<Description, String> {
        let file = open_checked(fs, (self.ino, self.generation), false)?;
        Ok(Description {
            mount: m,
            path: self.path.clone(),
            node: Node::file(file),
            flags: AtomicI32::new(self.flags),
            position: Mutex::new(self.position),
            locked: AtomicBool::new(false),
            flock_fd: AtomicI32::new(-1),
            born: iopath::sys::fork_generation(),
        })
    }
}

/// The file `(ino, generation)` in `fs`, wherever it is named now: an
/// open file found again by another program, or by this one after it gave
/// the mount away for a while, following its renames as a descriptor does
/// (by its path, a shell's `exec 4>> log` then `mv log log.1` lost its
/// next `echo >&4`: the path led nowhere). `Err` if the file is gone.
fn open_checked(fs: &FileSystem, (ino, generation): (u64, u64), direct: bool) -> std::result::Result<File, String> {
    fs.open_ino(ino, generation, direct).map_err(|_| "the file was deleted meanwhile".to_string())
}

/// Descriptor numbers with a description: one bit each, so a call on any
/// other descriptor costs one load.
static BITS: [AtomicU64; crate::fds::MAX_FD / 64] = [const { AtomicU64::new(0) }; crate::fds::MAX_FD / 64];
/// The mounted descriptors: taken on a program's thread only in a [`crate::Section`].
static TABLE: RwLock<Option<HashMap<c_int, Arc<Description>>>> = RwLock::new(None);

fn bit(fd: c_int) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok()?;
    Some((BITS.get(i / 64)?, 1 << (i % 64)))
}

/// The description of `fd` if it is a mount's.
pub fn lookup(fd: c_int) -> Option<Arc<Description>> {
    let (word, mask) = bit(fd)?;
    if word.load(Ordering::Acquire) & mask == 0 {
        return None;
    }
    let _section = crate::Section::enter();
    TABLE.read().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&fd).cloned()
}

/// Whether `fd` is a mount's (one load).
pub fn is_mounted(fd: c_int) -> bool {
    bit(fd).is_some_and(|(word, mask)| word.load(Ordering::Acquire) & mask != 0)
}

/// Puts `description` at descriptor number `fd` (reserved by the caller).
pub fn install(fd: c_int, description: Arc<Description>) {
    let Some((word, mask)) = bit(fd) else { return };
    let section = crate::Section::enter();
    let displaced =
        TABLE.write().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(fd, description);
    word.fetch_or(mask, Ordering::AcqRel);
    drop(section);
    drop(displaced); // (outside the lock: a description's last drop closes its file)
}

/// The descriptor table, the working directories and the kernel
/// directories above mounts, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_tables_for_fork() -> Vec<crate::fork_holds::Held> {
    use crate::fork_holds::{mutex, rwlock};
    [rwlock(&TABLE), rwlock(&KERNEL_CWD), rwlock(&VIRTUAL_CWD), mutex(&KERNEL_DIRS)].into_iter().flatten().collect()
}

/// Takes `fd` out of the table (closed, or replaced by `dup2`); the
/// description goes when its last descriptor does.
pub fn remove(fd: c_int) -> Option<Arc<Description>> {
    let (word, mask) = bit(fd)?;
    if word.load(Ordering::Acquire) & mask == 0 {
        return None;
    }
    let _section = crate::Section::enter();
    let removed = TABLE.write().unwrap_or_else(|e| e.into_inner()).as_mut()?.remove(&fd);
    word.fetch_and(!mask, Ordering::AcqRel);
    removed
}

/// Reserves a descriptor number for a description of `mount`: an `O_PATH`
/// descriptor of its directory (or of `/` if that does not exist here).
pub fn reserve(mount: &Mount, cloexec: bool) -> std::result::Result<c_int, c_int> {
    let flags = libc::O_PATH | if cloexec { libc::O_CLOEXEC } else { 0 };
    let mut dir = mount.dir.clone();
    dir.push(0);
    // The program's number: the lowest free one, as the kernel's open gives.
    let open = |path: *const libc::c_char| {
        // SAFETY: `path` is one of the NUL-terminated paths below, ours.
        iopath::sys::taking_lowest(|| unsafe { real::open(path, flags, 0) }, cloexec)
    };
    let mut fd = open(dir.as_ptr().cast());
    if fd < 0 {
        fd = open(c"/".as_ptr());
    }
    if fd < 0 { Err(crate::posix::last_errno()) } else { Ok(fd) }
}

/// Whether a mount may hold anything to commit at exit: one this process
/// has mounted now, or one whose state another thread holds at this moment
/// (taken as mounted: the exit commits as before). A process that never
/// touched its mounts skips the exit's commit thread.
pub fn any_mounted_here() -> bool {
    MOUNTS.get().map_or(&[][..], |v| &v[..]).iter().filter(|m| !m.stuck()).any(|m| match m.state.try_lock() {
        Ok(state) => state.fs.is_some(),
        Err(std::sync::TryLockError::Poisoned(state)) => state.into_inner().fs.is_some(),
        Err(std::sync::TryLockError::WouldBlock) => true,
    })
}

/// Commits every mounted file system (at exit).
pub fn sync_all() {
    for m in MOUNTS.get().map_or(&[][..], |v| &v[..]) {
        if let Some(fs) = m.mounted_here() {
            let started = std::time::Instant::now();
            let before = iopath::clock::ThreadUsage::now();
            match fs.carry_over_timed() {
                Ok((0, _)) => {}
                Ok((blocks, quiesced)) => crate::log(&format!(
                    "{}: committed, {blocks} blocks in its carried cache, in {:.1} ms ({:.1} ms writing back and \
                     committing, the rest saving the carried cache; {})",
                    m.device,
                    started.elapsed().as_secs_f64() * 1e3,
                    quiesced.as_secs_f64() * 1e3,
                    usage_since(&before)
                )),
                Err(e) => crate::say(&format!("at exit, {}: {e}", m.device)),
            }
            crate::log(&format!("{} on {}: {}", m.device, String::from_utf8_lossy(&m.dir), fs.stats().summary()));
        }
    }
    if let Some(file) = iopath::frames::claimed() {
        let mib = iopath::frames::held() as f64 / (1 << 20) as f64;
        crate::log(&format!("page frames: {mib:.0} MiB of {} (kept for the next process)", file.display()));
    }
}

/// What the calling thread spent since `before` (its CPU time, how often it
/// slept or was preempted, the page faults it took): where a slow exit's
/// time went when neither its device waits nor its CPU explain it.
fn usage_since(before: &iopath::clock::ThreadUsage) -> String {
    let spent = iopath::clock::ThreadUsage::now().since(before);
    format!(
        "this thread: {:.1} ms on a CPU, {} sleeps, {} preemptions, {} page faults",
        (spent.user_ns + spent.sys_ns) as f64 / 1e6,
        spent.voluntary_ctx,
        spent.involuntary_ctx,
        spent.page_faults
    )
}

/// Gives back every mount nothing in this process holds open (no file or
/// directory descriptor, no call under way): commits it, checkpoints it and
/// lets go of its lock, so a child about to be forked (a shell's next
/// command) can mount it. The next call into it mounts it again. Run before
/// `fork`.
pub fn release_idle() {
    for m in MOUNTS.get().map_or(&[][..], |v| &v[..]).iter().filter(|m| !m.stuck()) {
        m.release_if_idle("before fork");
    }
}

impl Mount {
    /// [`release_idle`] of this mount (`when`: for the log). Whether this
    /// process no longer has it mounted.
    pub fn release_if_idle(&self, when: &str) -> bool {
        self.release(when, false)
    }

    /// Gives the mount back as [`Mount::release_if_idle`] does, and with
    /// `dormant` even while descriptors of this process stand for files in
    /// it, if no call on them is under way and each can be found again
    /// (it has a name; no lock was ever taken on it here): each is then
    /// closed and remembered by path and inode number ([`Slot`]), and the
    /// next call on it mounts again. For a process that waits for the
    /// mount while this one keeps a file open and does nothing with it (a
    /// shell's `exec 3< file` while it runs `ls`).
    fn release(&self, when: &str, dormant: bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(fs) = &state.fs else { return true };
        let _inside = crate::Inside::enter();
        let mut asleep: Vec<(Arc<Description>, File)> = Vec::new();
        if dormant
            && fs.in_use_elsewhere()
            && let Err(why) = self.put_to_sleep(&mut asleep)
        {
            self.waits.busy(why);
            wake(asleep);
            return false;
        }
        if fs.in_use_beyond(asleep.len()) {
            if dormant {
                self.waits.busy(Busy::Held);
            }
            wake(asleep);
            return false;
        }
        let files = asleep.len();
        drop(asleep); // (their handles: only the file system's own is left)
        let committing = std::time::Instant::now();
        if let Err(e) = fs.quiesce() {
            crate::say(&format!("cannot commit {} {when}: {e}; keeping it mounted", self.device));
            return false;
        }
        let committed = committing.elapsed();
        let stats = fs.stats().summary();
        let engine = self.engine_spec().starts_with("uring:").then(|| Arc::clone(fs.engine()));
        self.lending.set(None); // (its thread waits for the next mount)
        state.fs = None; // the last handle: unmounted
        state.kept_engine = engine;
        state.lock = None; // and the next process may mount it
        if dormant {
            self.waits.lent(committed);
            state.lent = Some(std::time::Instant::now());
        }
        let held = if files == 0 {
            "nothing here holds it open".to_string()
        } else {
            format!("{files} open file(s) here to be opened again at their next use")
        };
        crate::log(&format!("gave back {} {when} ({held}): {stats}", self.device));
        true
    }

    /// Takes the file of every description of this mount out of its slot
    /// into `asleep`, leaving where to find it again; what kept one (some
    /// taken already) if one cannot be: a call on it under way, no name, a lock.
    fn put_to_sleep(&self, asleep: &mut Vec<(Arc<Description>, File)>) -> Result<(), Busy> {
        for (_, d) in descriptors() {
            // (A forked child's inherited ones are its parent's: their files, and the
            // locks a parent's thread may have held at the fork, are not to be touched.)
            if !std::ptr::eq(d.mount, self) || inherited(&d) || asleep.iter().any(|(a, _)| Arc::ptr_eq(a, &d)) {
                continue;
            }
            let Node::File(slot) = &d.node else { continue };
            if d.locked.load(Ordering::Acquire) {
                return Err(Busy::Locked);
            }
            let Ok(mut state) = slot.state.try_write() else { return Err(Busy::Call) };
            let SlotState::Open(file) = &*state else { continue };
            let Some(path) = file.path() else { return Err(Busy::Unnamed) }; // unlinked: only this process has it
            let (ino, generation) = (file.metadata().ino, file.metadata().generation);
            let SlotState::Open(file) = std::mem::replace(&mut *state, SlotState::Dormant { ino, generation, path })
            else {
                unreachable!("matched open above")
            };
            drop(state);
            asleep.push((d, file));
        }
        Ok(())
    }
}

/// Puts files [`Mount::put_to_sleep`] took back in their slots: the mount stays.
fn wake(asleep: Vec<(Arc<Description>, File)>) {
    for (d, file) in asleep {
        if let Node::File(slot) = &d.node {
            *slot.state.write().unwrap_or_else(|e| e.into_inner()) = SlotState::Open(file);
        }
    }
}

/// Every mounted descriptor and its description.
pub fn descriptors() -> Vec<(c_int, Arc<Description>)> {
    let _section = crate::Section::enter();
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table.as_ref().map_or_else(Vec::new, |t| t.iter().map(|(&fd, d)| (fd, Arc::clone(d))).collect())
}

/// Whether this process has a mounted file (not a directory) open.
pub fn holds_files() -> bool {
    let _section = crate::Section::enter();
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table.as_ref().is_some_and(|t| t.values().any(|d| matches!(d.node, Node::File(_))))
}

/// Whether a descriptor of the program stands for `description`.
pub fn in_table(description: &Arc<Description>) -> bool {
    let _section = crate::Section::enter();
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table.as_ref().is_some_and(|t| t.values().any(|d| Arc::ptr_eq(d, description)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_after_one_that_waited_in_vain_only_looks_for_a_while() {
        use std::time::{Duration, Instant};
        let wait = Duration::from_secs(10);
        assert_eq!(wait_now(None, wait), wait);
        assert_eq!(wait_now(Some(Instant::now()), wait), Duration::ZERO);
        let long_ago = Instant::now().checked_sub(Duration::from_secs(11));
        if let Some(at) = long_ago {
            assert_eq!(wait_now(Some(at), wait), wait, "a later call waits again");
        }
    }

    #[test]
    fn paths_normalize_by_name() {
        assert_eq!(normalize(b"/home/u", b"a/../b//c/."), b"/home/u/b/c");
        assert_eq!(normalize(b"/home/u", b"/x/./y/"), b"/x/y");
        assert_eq!(normalize(b"/", b"../../.."), b"/");
        assert_eq!(normalize(b"/a", b""), b"/a");
    }
}
