//! Page frames that outlive the process: memory for single blocks taken
//! from a file in `/dev/shm` that each process claims while it runs and the
//! next one claims after it.
//!
//! A mount's page cache lives in the process that mounted it, so every
//! process fills it with fresh memory, and fresh memory is not cheap: the
//! kernel zeroes it, and in a virtual machine that gives freed memory back
//! to its host (virtio-balloon free page reporting, on here: a freed 2 MiB
//! block goes back after about two seconds) each page is also faulted in
//! again on the host. `tar c` of /usr/include into a mount, two seconds
//! after the last run, spent 44% of its samples in `clear_page` under the
//! page faults of its page frames: 0.52-0.61 s a run, against 0.36-0.37 s
//! with its frames taken from a tmpfs file a run before had filled.
//! The kernel's page cache keeps its pages from one program to the next;
//! this keeps iopath's frames.
//!
//! - **Whose**: a process claims `iopath-frames-<uid>-<n>` (the first `n`
//!   whose `flock` it gets) the first time it needs a new block, and holds
//!   it until it exits; the next process claims the same file and maps the
//!   same pages, already there. Processes running at once claim different
//!   files; a claim removes the unheld files more than two (`SPARE_FILES`)
//!   past its own, so a burst of them leaves that many spares behind.
//!   Nothing in the file is read: a frame's bytes are the caller's to
//!   fill, as with any recycled block.
//! - **How**: the file grows 2 MiB at a time, each piece allocated with
//!   `fallocate` first (a full `/dev/shm` says ENOSPC there, where a store
//!   into a hole would kill the process with SIGBUS) and then mapped shared
//!   at its place in an address range reserved up front; the blocks join
//!   the pool of blocks ([`crate::IoBuf`]) like any others. Past the bound,
//!   or when the file cannot grow, blocks come from anonymous memory again.
//! - **Across `fork`**: a child's memory must be its own. A child handler
//!   (`pthread_atfork`) maps the child's view of the file private, over the
//!   same addresses: what the child writes is copied, never seen by the
//!   parent, and the child takes its new blocks elsewhere.
//! - **What it costs**: up to the bound of memory in `/dev/shm` for as long
//!   as the file is there (`rm /dev/shm/iopath-frames-*` gives it back when
//!   no process holds it), like a carried cache (`crate::fs::carry`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Bytes one piece of the file adds (a huge page's worth, as anonymous chunks are).
pub const PIECE: usize = 2 << 20;

/// Files a process tries before it gives up (processes running at once).
const CLAIMS: usize = 16;

/// Where the frames come from, once set ([`enable`]).
static CONFIG: Mutex<Option<(PathBuf, usize)>> = Mutex::new(None);

/// The claimed file and its mapping: set under `GROW`, read without a lock
/// by the fork handler (which must not take locks).
static FD: AtomicI32 = AtomicI32::new(-1);
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Bytes mapped shared so far from `BASE`; their blocks may be in use.
static MAPPED: AtomicUsize = AtomicUsize::new(0);
/// Bytes of address space reserved at `BASE` (the bound).
static RESERVED: AtomicUsize = AtomicUsize::new(0);
/// Bytes at the file's start whose memory was there when it was claimed
/// (the last holder allocated them): mapped without a `fallocate` first.
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
/// The process whose frames these are (0: none claimed, or given up).
static OWNER: AtomicI32 = AtomicI32::new(0);
/// The process that last tried to claim a file (a failed claim is not tried
/// again by the same process; a forked child tries its own).
static TRIED: AtomicI32 = AtomicI32::new(0);

/// Serializes claiming and growing.
static GROW: Mutex<()> = Mutex::new(());

/// Takes page frames from a file in `dir` (`/dev/shm` by default: see
/// [`default_dir`]) from now on, up to `bound` bytes of it; 0 turns it off.
/// Blocks already handed out stay where they came from.
pub fn enable(dir: &Path, bound: usize) {
    *CONFIG.lock().unwrap_or_else(|e| e.into_inner()) = (bound >= PIECE).then(|| (dir.to_path_buf(), bound));
}

/// Where the frame files live: `/dev/shm`, where the carried caches and
/// mount locks are.
pub fn default_dir() -> &'static Path {
    Path::new("/dev/shm")
}

/// Removes this user's frame files in `dir` that no process holds (their
/// lock is free): `drop_caches` for kept frames, for a tool that ran
/// programs under the interposer and leaves the machine as it found it.
/// Returns the bytes given back. A file a process holds stays.
pub fn remove_unheld(dir: &Path) -> u64 {
    remove_unheld_from(dir, 0)
}

/// Unheld frame files a claim leaves beyond its own: the next processes to
/// run alone or beside it find warm ones, and a burst of processes running
/// at once leaves no more than this behind it, where each file it claimed
/// stayed (seven of 2-33 MiB after a day of tests, up to the bound each).
const SPARE_FILES: usize = 2;

/// [`remove_unheld`] of the files numbered `first` and up.
fn remove_unheld_from(dir: &Path, first: usize) -> u64 {
    // SAFETY: getuid has no preconditions.
    let prefix = format!("iopath-frames-{}-", unsafe { libc::getuid() });
    let Ok(names) = crate::sys::dir_names(dir) else { return 0 };
    let mut freed = 0;
    for name in names {
        let number = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|n| n.parse::<usize>().ok());
        if number.is_none_or(|n| n < first) {
            continue;
        }
        let path = dir.join(&name);
        let Some((fd, _)) = open_locked(&path) else { continue };
        use std::os::unix::fs::MetadataExt;
        let bytes = std::fs::symlink_metadata(&path).map_or(0, |m| m.blocks() * 512);
        // Removed while locked: no process can claim it between the two.
        if std::fs::remove_file(&path).is_ok() {
            freed += bytes;
        }
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
    }
    freed
}

/// Whether `ptr` lies in this process's frame file's mapping: memory that
/// is never given back (a buffer cut from it goes back to the pool).
pub(crate) fn within(ptr: *const u8) -> bool {
    let (base, mapped) = (BASE.load(Ordering::Acquire), MAPPED.load(Ordering::Acquire));
    let at = ptr as usize;
    base != 0 && at >= base && at < base + mapped
}

/// Bytes of this process's frame file mapped so far (0 without one).
pub fn held() -> usize {
    own_fd().map_or(0, |_| MAPPED.load(Ordering::Acquire))
}

/// The file this process claimed, if any.
pub fn claimed() -> Option<PathBuf> {
    own_fd().and_then(|fd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok())
}

/// This process's frame file's descriptor, if it holds one (a forked child
/// does not hold its parent's).
pub fn own_fd() -> Option<libc::c_int> {
    let fd = FD.load(Ordering::Acquire);
    (fd >= 0 && OWNER.load(Ordering::Acquire) == std::process::id() as i32).then_some(fd)
}

/// The frame file's descriptor is about to be closed under this process
/// and cannot be moved out of the way: removes the file's name, so that a
/// process claiming that name later makes a new file and never maps this
/// one's pages (this process keeps its own until it exits), and takes no
/// more pieces.
pub fn give_up() {
    if let Some(path) = claimed() {
        let _ = std::fs::remove_file(path);
    }
    RESERVED.store(MAPPED.load(Ordering::Acquire), Ordering::Release);
    // Its number is the program's from now on; the mapping stays (unlinked, ours).
    FD.store(-1, Ordering::Release);
    OWNER.store(0, Ordering::Release);
}

/// Before the program closes or replaces descriptor `fd` (`close`, `dup2`
/// onto it, `close_range` up to `last`): if it is this process's frame file,
/// moves the file to another number first, above `last`, so its lock (and so
/// the file) stays this process's. The program's call then goes on as if the
/// number had been its own. False if the file could not be moved (no free
/// number that high): the caller should then not let the call close it.
pub fn step_aside(fd: libc::c_int, last: libc::c_uint) -> bool {
    // The number first: this runs on every close the program makes, and
    // own_fd asks for the process id.
    if fd < 0 || FD.load(Ordering::Acquire) != fd || own_fd() != Some(fd) {
        return true;
    }
    let Ok(floor) = libc::c_int::try_from(last as i64 + 1) else { return false };
    // (The program's call closes the old number.)
    let Some(moved) = crate::sys::copy_high(fd, floor) else { return false };
    FD.store(moved, Ordering::Release);
    true
}

/// A new piece of [`PIECE`] bytes of frame memory (contents left by whoever
/// had it before), or `None` when frames are off, the bound is reached or
/// the file cannot grow: the caller maps anonymous memory then. With
/// `populate`, its pages are mapped in one call (for a piece that will be
/// used whole: page frames); without, each is faulted in when first touched.
pub(crate) fn piece(populate: bool) -> Option<NonNull<u8>> {
    // Never wait for these locks: in a child after fork, a thread of the parent
    // that held one is not there to let it go. Busy: anonymous memory this time.
    let (dir, bound) = try_lock(&CONFIG)?.clone()?;
    let grow = try_lock(&GROW)?;
    let pid = std::process::id() as i32;
    if OWNER.load(Ordering::Acquire) != pid {
        // First use here (or in a child after fork, whose view of its parent's
        // file is private now); a claim that failed is not tried on every piece.
        if TRIED.swap(pid, Ordering::AcqRel) == pid {
            return None;
        }
        claim(&dir, bound)?;
    }
    let (fd, base, mapped) = (FD.load(Ordering::Acquire), BASE.load(Ordering::Acquire), MAPPED.load(Ordering::Acquire));
    if mapped + PIECE > RESERVED.load(Ordering::Acquire) {
        return None;
    }
    // Pieces the last holder allocated are there already (a fallocate over them
    // still walked each page: 2% of `tar c`'s samples).
    let allocated = mapped + PIECE <= ALLOCATED.load(Ordering::Acquire)
        // SAFETY: fallocate on our own file; no memory is touched.
        || unsafe { libc::fallocate(fd, 0, mapped as libc::off_t, PIECE as libc::off_t) } == 0;
    if !allocated {
        // Full /dev/shm (or no fallocate): no more pieces for this process.
        RESERVED.store(mapped, Ordering::Release);
        return None;
    }
    // SAFETY: maps the file's piece shared over our own reserved (PROT_NONE) range.
    let at = unsafe {
        libc::mmap(
            (base + mapped) as *mut libc::c_void,
            PIECE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            mapped as libc::off_t,
        )
    };
    if at == libc::MAP_FAILED {
        RESERVED.store(mapped, Ordering::Release);
        return None;
    }
    // Mapped in one call rather than faulted in a page at a time as the blocks
    // are first written (the pages are there: fallocate made them), where the
    // caller will use it whole.
    if populate {
        // SAFETY: advice on the piece just mapped; a failure leaves it to the faults.
        unsafe { libc::madvise(at, PIECE, libc::MADV_POPULATE_WRITE) };
    }
    // Published before any block of the piece is handed out: a fork from now on
    // makes the child's view of it private.
    MAPPED.store(mapped + PIECE, Ordering::Release);
    drop(grow);
    NonNull::new(at.cast())
}

fn try_lock<T>(m: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Claims the first frame file free to lock and reserves `bound` bytes of
/// address space for it. `None` if none can be claimed.
fn claim(dir: &Path, bound: usize) -> Option<()> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for n in 0..CLAIMS {
        let path = dir.join(format!("iopath-frames-{uid}-{n}"));
        let Some((fd, allocated)) = open_locked(&path) else { continue };
        // SAFETY: reserves address space only (no memory, no file).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bound,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            return None;
        }
        BASE.store(base as usize, Ordering::Release);
        RESERVED.store(bound / PIECE * PIECE, Ordering::Release);
        MAPPED.store(0, Ordering::Release);
        ALLOCATED.store(allocated, Ordering::Release);
        FD.store(fd, Ordering::Release);
        OWNER.store(std::process::id() as i32, Ordering::Release);
        register_fork_handler();
        remove_unheld_from(dir, n + 1 + SPARE_FILES);
        return Some(());
    }
    None
}

/// A new open file of the file `fd` is open on (`/proc/self/fd/N`, read
/// only), without its lock; -1 if there is none. For the fork handler: no
/// allocation, system calls only.
fn reopen_fd(fd: i32) -> i32 {
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.max(0) as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        path[14 + i] = *d;
    }
    // SAFETY: a NUL-terminated path in a buffer of ours (14 + at most 10 digits, then zeros).
    unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) }
}

/// Opens `path` (created if missing, ours only) and locks it, with the
/// bytes at its start whose memory is allocated (all of it or none: a file
/// with holes is allocated again piece by piece); `None` if another process
/// holds it or it cannot be ours.
fn open_locked(path: &Path) -> Option<(i32, usize)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the flags make a private, close-on-exec file.
    let fd =
        unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a zeroed stat is a valid value; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor.
    let ours = unsafe {
        libc::fstat(fd, &mut st) == 0
            && st.st_uid == libc::getuid()
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
            && libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0
    };
    let size = st.st_size.max(0) as usize;
    let allocated = if st.st_blocks as usize * 512 >= size { size / PIECE * PIECE } else { 0 };
    if !ours {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return None;
    }
    // Out of the program's way: programs count on the lowest free numbers
    // (the lock belongs to the open file, which the copy shares).
    if let Some(high) = crate::sys::copy_high(fd, 0) {
        // SAFETY: closing our own descriptor, copied above.
        unsafe { libc::close(fd) };
        return Some((high, allocated));
    }
    Some((fd, allocated))
}

fn register_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a child handler that only makes system calls and atomic stores.
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_child_after_fork));
    });
}

/// In a child just forked: the frames mapped so far become private to it
/// (copied when written, as all its other memory is), and it takes no more
/// from the parent's file. System calls and atomics only: no locks, no
/// allocation (another thread of the parent may have held either).
extern "C" fn in_child_after_fork() {
    let (fd, base, mapped) = (FD.load(Ordering::Acquire), BASE.load(Ordering::Acquire), MAPPED.load(Ordering::Acquire));
    if fd < 0 || OWNER.load(Ordering::Acquire) == 0 {
        return;
    }
    if mapped > 0 {
        // Mapped from an open file of the child's own: a mapping keeps its open
        // file, and with it the parent's lock on it, alive (a child outliving the
        // parent, a background job, kept the file from every process after).
        let own = reopen_fd(fd);
        // SAFETY: replaces our own shared mapping of the file with a private one of the same bytes.
        let at = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                if own >= 0 { own } else { fd },
                0,
            )
        };
        if own >= 0 {
            // SAFETY: the descriptor opened above, ours; the mapping keeps what it needs.
            unsafe { libc::close(own) };
        }
        if at == libc::MAP_FAILED {
            // Never share with the parent: no access at all rather than its memory.
            // SAFETY: our own range.
            unsafe { libc::mprotect(base as *mut libc::c_void, mapped, libc::PROT_NONE) };
        }
    }
    // The parent's file and its lock are the parent's: the child's copy of the
    // descriptor goes now (the lock stays with the parent's, which shares it),
    // not later, when the program may have put something else at that number.
    // SAFETY: our descriptor, the child's copy of it.
    unsafe { libc::close(fd) };
    FD.store(-1, Ordering::Release);
    // The address range stays taken (the child's blocks there are private now);
    // a later piece reserves a new one under a new claim.
    OWNER.store(0, Ordering::Release);
}
