//! `libiopath_preload.so`: runs an unmodified program's file I/O through iopath.
//!
//! ```sh
//! LD_PRELOAD=target/release/libiopath_preload.so IOPATH_MOUNT=/mnt/db=/dev/loop0 prog   # files on iopath
//! LD_PRELOAD=target/release/libiopath_preload.so IOPATH_FILES='/data/*.db' IOPATH_PATH=stm prog
//! ```
//!
//! Two things it does, set from the environment ([`mod@config`]):
//!
//! - **Mounts** (`IOPATH_MOUNT=DIR=DEVICE`): every path under DIR is served
//!   by iopath's file system on DEVICE ([`mount`]): open, read, write,
//!   fsync, rename, directories, stat, locks and the rest of the POSIX
//!   surface a program uses, one file per family of calls in `posix/`, with
//!   the errno the kernel would give; a mounted file on a standard stream
//!   (`prog > /mnt/i/out`) through a pipe and a thread (`bridge/`).
//!   Nothing outside the mounts changes.
//! - **Routing** (`IOPATH_FILES`): an O_DIRECT file or block device the
//!   program names keeps the kernel's file system, but its reads, writes
//!   and flushes go through one iopath engine per file (`route.rs`).
//!
//! The rest of this page is about routing.
//!
//! For descriptors of files that match `IOPATH_FILES` and were opened with
//! `O_DIRECT` (see [`mod@config`]), `pread`, `pwrite`, `preadv`, `pwritev`,
//! `preadv2`, `pwritev2` (and their `64` names), `read` and `write` at the
//! file position, `fsync` and `fdatasync` go through one iopath engine per
//! file (io_uring on that same file; `files.rs`), so all the program's
//! threads share its merging path. Everything else goes to the C library
//! untouched, and so does any routed call iopath cannot take as it is:
//!
//! - a buffer, offset or length not aligned as the file needs (the C library
//!   gives the program the kernel's own answer, usually EINVAL);
//! - a range that reaches past the file's size as the engine knows it (the
//!   kernel then gives the exact short read, or extends the file);
//! - `preadv2`/`pwritev2` with flags, a write on an `O_APPEND` descriptor,
//!   a write through a read-only descriptor;
//! - any call in a child after `fork` of a parent that had an engine open
//!   (its threads are not there; a child of one that had none routes its own).
//!
//! The file position stays the kernel's: a routed `read` reads it with
//! `lseek`, does the I/O and moves it, under a per-file lock, so `dup`ed
//! descriptors, `lseek` and unrouted calls all see one position. A routed
//! call fails as the kernel's would: -1 with the device's errno. It never
//! fails with EINTR (the kernel does not interrupt disk reads either).

mod bridge;
pub mod config;
mod ending;
mod fds;
mod files;
mod fork_holds;
mod inherit;
mod interrupted_exit;
pub mod mount;
mod posix;
mod program_handlers;
mod real;
mod route;

use config::Config;
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static CONFIG: OnceLock<Config> = OnceLock::new();
/// The request that idle CPUs poll (`IOPATH_IDLE_POLL=1`), held until the process ends.
static IDLE_POLLING: OnceLock<iopath::idle::IdlePolling> = OnceLock::new();
/// Set in a child after `fork` of a parent that held an engine (a mount, or
/// an engine open for a routed file): nothing is routed there.
static FORKED: AtomicBool = AtomicBool::new(false);
/// Whether any `IOPATH_FILES` pattern is set.
static ROUTING: AtomicBool = AtomicBool::new(false);
/// Whether any `IOPATH_MOUNT` is set.
static MOUNTING: AtomicBool = AtomicBool::new(false);
/// `IOPATH_LOG` is set: calls are counted for the summary (a shared counter
/// per call is a cache line every thread writes, so only then).
static COUNTING: AtomicBool = AtomicBool::new(false);
static ROUTED_CALLS: AtomicU64 = AtomicU64::new(0);
static PASSED_CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread is inside iopath (opening an engine): its calls are iopath's own.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// [`Section`]s this thread is in (it holds one of the library's tables).
    static SECTIONS: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is inside iopath (its calls are iopath's own).
/// A thread iopath started is, to the end of its thread-local storage's
/// teardown ([`iopath::sys::own_thread`]).
pub(crate) fn inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true) || iopath::sys::own_thread()
}

/// Marks the calling thread as inside iopath while alive.
pub(crate) struct Inside(bool);

impl Inside {
    pub(crate) fn enter() -> Inside {
        Inside(INSIDE.try_with(|i| i.replace(true)).unwrap_or(true))
    }

    /// Marks the calling thread as the program's again while alive, inside
    /// a call this library serves: for a kernel call made on the program's
    /// behalf whose descriptor is the program's (at the number the kernel
    /// gives, never moved) and that may block for as long as the program
    /// likes (an open of a FIFO), holding none of iopath's locks.
    pub(crate) fn leave() -> Inside {
        debug_assert!(!iopath::sys::own_thread(), "a thread of iopath's makes no call for the program");
        Inside(INSIDE.try_with(|i| i.replace(false)).unwrap_or(true))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|i| i.set(self.0));
        if !self.0 {
            call_ended();
        }
    }
}

/// Marks the program's thread, while alive, as in the middle of one of
/// this library's calls without being inside iopath (its own calls still
/// reach the hooks): around a lock of the library's that a hook takes for
/// the program (the bridges' table, the mount table). A signal handler
/// there that took the same lock (a `dup` or `close` of a bridged
/// descriptor, an exit that ends the bridges) waited for ever on its own
/// thread: 1 run in about 450 of `tests/c/exit_in_handler.c` printing to a
/// mounted stdout hung, its handler's `_exit` waiting for the bridges'
/// table that the interrupted `close` held. The program's handlers and the
/// stand-in of a default action wait for the section's end, as for a
/// call's ([`in_a_call`]).
pub(crate) struct Section(());

impl Section {
    pub(crate) fn enter() -> Section {
        let _ = SECTIONS.try_with(|s| s.set(s.get() + 1));
        Section(())
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        let left = SECTIONS.try_with(|s| {
            let left = s.get().saturating_sub(1);
            s.set(left);
            left
        });
        if left == Ok(0) && !INSIDE.try_with(Cell::get).unwrap_or(true) {
            call_ended();
        }
    }
}

/// The end of the outermost of a program's thread's calls ([`Inside`]) or
/// sections ([`Section`]), unless the other still runs: the process ends
/// if a signal asked it to, and the handlers that waited run.
fn call_ended() {
    if SECTIONS.try_with(Cell::get).unwrap_or(0) != 0 {
        return;
    }
    ending::at_call_end();
    program_handlers::deliver_pending();
}

/// Whether the calling thread is in the middle of one of this library's
/// calls or sections (a signal handler may have interrupted it there).
pub(crate) fn in_a_call() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(false) || SECTIONS.try_with(Cell::get).unwrap_or(0) != 0
}

/// The settings (read from the environment when the library is loaded).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Writes one line to the log when `IOPATH_LOG` is set: its file, or stderr.
pub(crate) fn log(message: &str) {
    if config().log {
        match LOG_FILE_FD.load(Ordering::Relaxed) {
            -1 => say(message),
            fd => write_line(fd, message),
        }
    }
}

/// Where [`say`] writes: a copy of stderr taken at load when `IOPATH_LOG`
/// is set (GNU programs close stderr as they exit, before the exit summary
/// is written), else -1 (stderr itself).
static LOG_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The log's file (`IOPATH_LOG=/path`), opened at load; -1 for none.
static LOG_FILE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Lowest descriptor number the log's copy of stderr takes (out of the way of
/// the small numbers programs expect to be theirs).
const LOG_FD_FLOOR: libc::c_int = 500;

/// Writes one line to stderr, always (what a user must see: a mount that fails).
pub(crate) fn say(message: &str) {
    write_line(said_to(), message);
}

/// Where [`say`] writes: stderr, or its copy ([`LOG_FD`]).
fn said_to() -> libc::c_int {
    match LOG_FD.load(Ordering::Relaxed) {
        -1 => 2,
        fd => fd,
    }
}

/// Writes `line` (a whole line, `iopath: ` and all) where [`say`] writes,
/// without allocating: for an exit that interrupted the allocator.
fn say_static(line: &[u8]) {
    // SAFETY: writes a static buffer to stderr (or its copy), bypassing our own hook.
    unsafe { real::write(said_to(), line.as_ptr().cast(), line.len()) };
}

/// Writes `iopath: message` and a newline to `fd`, in one write.
fn write_line(fd: libc::c_int, message: &str) {
    let line = format!("iopath: {message}\n");
    // SAFETY: writing a buffer we own to one of our descriptors (or stderr), bypassing our own hook.
    unsafe { real::write(fd, line.as_ptr().cast(), line.len()) };
}

/// Opens the log's file (`IOPATH_LOG=/path`) for appending, at a number out
/// of the program's way, and hands it to the completion policy's decision
/// lines too. A file inside a mount (the kernel would get the directory
/// under it), or one that cannot be opened, leaves the log on stderr, said.
fn open_log_file(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if let Some(m) = mount::mounts().iter().find(|m| bytes.starts_with(&m.dir) && bytes.get(m.dir.len()) == Some(&b'/'))
    {
        let dir = String::from_utf8_lossy(&m.dir);
        say(&format!("IOPATH_LOG: {} is inside the mount {dir}: the log goes to stderr", path.display()));
        return;
    }
    let Ok(c_path) = std::ffi::CString::new(bytes) else { return };
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; the C library's open, not our hook.
    let opened = unsafe { real::open(c_path.as_ptr(), flags, 0o644) };
    if opened < 0 {
        let e = std::io::Error::last_os_error();
        say(&format!("IOPATH_LOG: cannot open {}: {e}; the log goes to stderr", path.display()));
        return;
    }
    // SAFETY: duplicates our descriptor at LOG_FD_FLOOR or above (close-on-exec), then closes the first.
    let fd = unsafe {
        let moved = libc::fcntl(opened, libc::F_DUPFD_CLOEXEC, LOG_FD_FLOOR);
        if moved >= 0 {
            real::close(opened);
            moved
        } else {
            opened
        }
    };
    LOG_FILE_FD.store(fd, Ordering::Relaxed);
    iopath::path::completion::explain::write_to(fd);
}

/// Sets the calling thread's errno.
pub(crate) fn set_errno(errno: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Keeps the calling thread's errno as it was when made, until dropped:
/// this library's work after a call (a bridge ending, an exec undone)
/// must not change what the call left.
pub(crate) struct KeepErrno(i32);

impl KeepErrno {
    pub(crate) fn new() -> KeepErrno {
        KeepErrno(posix::last_errno())
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        set_errno(self.0);
    }
}

/// Held by this library's threads while they mount, write into or give
/// back a mount in the background (a mount's lender, a held bridge:
/// [`background`]), and by a thread that forks, from before the fork to
/// after it: a child never starts with a lock such work takes (the buffer
/// pool's, the page frames') held by a thread the child does not have.
/// (A lender giving the mount back while a shell forked left the child,
/// which mounts in turn, waiting for ever.)
static FORK_GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The forking thread's holds from the fork's prepare handler to after it.
type ForkHolds = (
    std::sync::MutexGuard<'static, ()>,
    mount::StatesHeld,
    Option<fork_holds::Held>,
    iopath::sys::GlobalsHeld,
    std::sync::MutexGuard<'static, ()>,
    iopath::sys::NumbersHeld,
    Vec<fork_holds::Held>,
    program_handlers::Blocked,
);

thread_local! {
    /// The forking thread's hold on [`FORK_GATE`], on the mounts' states
    /// ([`mount::hold_states_for_fork`]), on the maps' registry, on the
    /// library's process-wide locks ([`iopath::sys::hold_globals_for_fork`]),
    /// on its thread starts ([`iopath::sys::hold_thread_starts`]), on the
    /// descriptors its threads make ([`iopath::sys::hold_own_numbers`]: a
    /// child never starts with one half moved) and on this library's own
    /// tables ([`fork_holds`]), from the fork's prepare handler to after it;
    /// with every signal blocked (a handler there that took one of those
    /// waited for ever; the kernel keeps what comes meanwhile pending, and
    /// gives the child none of the parent's).
    static GATE_HELD: std::cell::RefCell<Option<ForkHolds>> = const { std::cell::RefCell::new(None) };
}

/// Runs `work` (a mount, write or release a program's thread did not ask
/// for) with [`FORK_GATE`] held.
pub(crate) fn background<T>(work: impl FnOnce() -> T) -> T {
    let _gate = FORK_GATE.lock().unwrap_or_else(|e| e.into_inner());
    work()
}

extern "C" fn before_fork() {
    release_mounts_before_fork();
    if MOUNTING.load(Ordering::Relaxed) {
        // (A forked child listens too: it passes its children's requests up.)
        bridge::listen_before_fork();
    }
    // Unblocked after every hold is let go (the tuple's last).
    let blocked = program_handlers::Blocked::all();
    // In this order: a background thread takes the gate, then a state; a
    // thread that mounts holds its state while it starts the lender.
    let gate = FORK_GATE.lock().unwrap_or_else(|e| e.into_inner());
    let states = mount::hold_states_for_fork();
    let maps = posix::maps::hold_for_fork();
    let globals = iopath::sys::hold_globals_for_fork();
    let starts = iopath::sys::hold_thread_starts();
    let numbers = iopath::sys::hold_own_numbers();
    let leaves = fork_holds::leaves();
    let _ = GATE_HELD
        .try_with(|held| *held.borrow_mut() = Some((gate, states, maps, globals, starts, numbers, leaves, blocked)));
}

/// After a fork, in the parent and in the child: the gate goes.
fn open_the_gate() {
    let _ = GATE_HELD.try_with(|held| held.borrow_mut().take());
}

extern "C" fn in_parent_after_fork() {
    open_the_gate();
}

/// Gives back the mounts nothing holds open, so that a child (a shell's next
/// command) can mount them: before `fork`, `vfork` and `posix_spawn`.
/// Standard streams on mounted files do not count as holding them: their
/// bridges hold what arrives in memory meanwhile (`bridge::let_go`).
pub(crate) fn release_mounts_before_fork() {
    if MOUNTING.load(Ordering::Relaxed) {
        let let_go = bridge::let_go();
        mount::release_idle();
        let_go.resume();
    }
}

extern "C" fn in_child_after_fork() {
    // Before the gate opens (and signals are unblocked): what the parent's thread kept for
    // its handlers is not the child's (the kernel gives a child none of its parent's).
    program_handlers::in_child_after_fork();
    open_the_gate();
    // A child of a parent that had an engine open for a routed file, or that
    // still held a mount at the fork, has none of those engines' threads: it
    // routes nothing. Otherwise it routes and mounts at first use, as a new
    // process does (fio forks its jobs; a shell its subshells).
    if files::any_engine_across_fork() || mount::any_held_across_fork() {
        FORKED.store(true, Ordering::SeqCst);
    }
    mount::leave_to_parent();
    interrupted_exit::in_child_after_fork();
    ending::in_child_after_fork();
    posix::maps::in_child_after_fork();
    bridge::in_child_after_fork();
}

extern "C" fn on_load() {
    let c = config();
    if c.files.is_empty() && c.mounts.is_empty() {
        return;
    }
    // Forks are counted from now on (a forked child's exit prints no figures).
    iopath::sys::fork_generation();
    // A program is single-threaded as it loads us, most often: room for our own
    // descriptors now is cheap; later, with threads, it costs a grace period.
    iopath::sys::grow_descriptor_table();
    // SAFETY: registers handlers: one gives idle mounts back (before fork), one stores to an atomic.
    unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent_after_fork), Some(in_child_after_fork)) };
    COUNTING.store(c.log, Ordering::SeqCst);
    if c.log {
        // SAFETY: duplicates stderr (close-on-exec); -1 if it is closed or the table is full.
        let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, LOG_FD_FLOOR) };
        LOG_FD.store(fd, Ordering::Relaxed);
        if let Some(path) = &c.log_file {
            open_log_file(path);
        }
    }
    if !c.files.is_empty() {
        ROUTING.store(true, Ordering::SeqCst);
        log(&format!("routing O_DIRECT files matching {} through {}", c.files.join(":"), c.path));
    }
    if !c.mounts.is_empty() {
        let bound = mount::frames_bytes();
        iopath::frames::enable(iopath::frames::default_dir(), usize::try_from(bound).unwrap_or(usize::MAX));
        let mounts = mount::mounts();
        MOUNTING.store(!mounts.is_empty(), Ordering::SeqCst);
        mount::adopt_inherited_cwd();
        bridge::adopt();
        inherit::adopt();
        for m in mounts {
            log(&format!("{} serves {} (mounted at first use)", m.device, String::from_utf8_lossy(&m.dir)));
        }
        ending::install();
    }
    if c.idle_poll {
        let _inside = Inside::enter();
        match iopath::idle::IdlePolling::request() {
            Ok(held) => {
                let _ = IDLE_POLLING.set(held);
                log("idle CPUs poll while this program runs (IOPATH_IDLE_POLL)");
            }
            Err(e) => log(&format!("IOPATH_IDLE_POLL: {e}")),
        }
    }
}

extern "C" fn on_unload() {
    at_exit(true);
}

/// What the process does as it ends, however it ends (`exit`'s handlers or
/// `_exit`), once: writes what its standard streams on mounted files hold
/// into them (after flushing stdio, for `exit`: `flush_stdio`), commits the
/// mounts, and with `IOPATH_LOG` says where the waiting time went and how
/// many calls were routed. In a forked child of a process that held a
/// mount or routed files, only what the child itself mounted and bridged:
/// the parent's engines and mounts are not here.
pub(crate) fn at_exit(flush_stdio: bool) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    // An exit from a signal handler that interrupted one of this library's calls
    // on this thread (rsync's receiver ends so when the other side goes away): that
    // call may hold a lock the commit needs, or the allocator's, and it will never
    // return. The work goes to a helper, waited for at most INTERRUPTED_EXIT_WAIT,
    // and this thread allocates nothing (`interrupted_exit`).
    // So is an exit from a program's handler run at a call's end (`program_handlers`): a
    // caller up the stack may still hold a lock of this library's.
    let interrupted = (in_a_call() && !iopath::sys::own_thread()) || program_handlers::delivering();
    if interrupted {
        if !interrupted_exit::finish_within(flush_stdio, INTERRUPTED_EXIT_WAIT) {
            say_static(
                b"iopath: exit from a signal handler in the middle of a file call: the mounts' commit did not \
                  finish in 2 s (the interrupted call holds what it needs); what was fsynced is kept\n",
            );
        }
        return;
    }
    bridge::finish(flush_stdio);
    commit_mounts_now();
    if iopath::sys::fork_generation() > 0 {
        // A forked child that did not exec: the figures below are mostly its parent's
        // (bash's subshells each printed the shell's waiting times again).
        return;
    }
    if let Some(waits) = iopath::path::completion::explain::summary() {
        log(&waits);
    }
    for line in mount::waits_summary() {
        log(&line);
    }
    if ROUTING.load(Ordering::Relaxed) {
        log(&format!(
            "{} calls routed through iopath, {} calls on routed files passed to the C library",
            ROUTED_CALLS.load(Ordering::Relaxed),
            PASSED_CALLS.load(Ordering::Relaxed)
        ));
    }
}

/// How long an exit that interrupted one of this library's calls waits for
/// the mounts' commit (see [`at_exit`]; its message says 2 s).
pub(crate) const INTERRUPTED_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Commits every mount now (at exit, and before an exec, which may still fail and let
/// the process go on): in a forked child, those it mounted itself.
pub(crate) fn commit_mounts_now() {
    if !MOUNTING.load(Ordering::Relaxed) || !(mount::any_mounted_here() || posix::maps::any()) {
        return;
    }
    // On a thread of its own: this one's thread-local storage (the engine's per-thread
    // handles among it) may be torn down by now.
    let named = std::thread::Builder::new().name("iopath-exit".into());
    let committed = iopath::sys::spawn_without_signals(named, || {
        let _inside = Inside::enter();
        commit_mounts_here();
    });
    match committed {
        Ok(thread) => {
            if let Err(panic) = thread.join() {
                // Said here (its own message went to a stderr the program may have closed).
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                say(&format!("committing the mounts at exit failed: {why}"));
            }
        }
        Err(e) => say(&format!("cannot commit the mounts at exit: {e}")),
    }
}

/// The commit of [`commit_mounts_now`], on the calling thread: shared maps
/// written back, then every mount this process holds synced.
pub(crate) fn commit_mounts_here() {
    if MOUNTING.load(Ordering::Relaxed) && (mount::any_mounted_here() || posix::maps::any()) {
        posix::maps::write_back_all();
        mount::sync_all();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
#[used]
#[unsafe(link_section = ".fini_array")]
static ON_UNLOAD: extern "C" fn() = on_unload;
