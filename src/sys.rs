//! The system calls iopath makes itself, in one place, each behind a safe
//! function whose `unsafe` block says why the call is sound.
//!
//! Everything else in the crate calls these (io_uring goes through the
//! `io-uring` crate, memory maps through `memmap2`). A reviewer checks the
//! raw calls here; the rest of the code cannot misuse them.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte in it"))
}

// ---- descriptors ----

/// Lowest number iopath moves its own long-lived descriptors to: programs
/// count on the low numbers being theirs (a shell's `exec 3>file` replaces
/// whatever is on 3), and an interposed program must never have one of
/// iopath's replaced under it.
pub const HIGH_FDS_FROM: libc::c_int = 1000;

/// A close-on-exec copy of `fd` on the lowest free number from `floor`
/// (at least [`HIGH_FDS_FROM`]), or `None` (no free number that high).
pub fn copy_high(fd: libc::c_int, floor: libc::c_int) -> Option<libc::c_int> {
    // SAFETY: F_DUPFD_CLOEXEC only makes a new descriptor; `fd` is left as it was.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor.max(HIGH_FDS_FROM)) };
    (high >= 0).then_some(high)
}

/// A descriptor of iopath's own from `make` (a call that returns a new
/// descriptor or -1 with errno set), moved to a high number ([`copy_high`])
/// inside [`own_numbers`]. The error is `make`'s, or EMFILE where no high
/// number is free.
pub fn own_high(make: impl FnOnce() -> libc::c_int) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    own_numbers(|| {
        let fd = make();
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let high = copy_high(fd, 0);
        // SAFETY: `fd` was just made by `make` and is ours; closed once.
        unsafe { libc::close(fd) };
        // SAFETY: `high` is a new descriptor of our own from here on.
        high.map(|h| unsafe { std::os::fd::OwnedFd::from_raw_fd(h) })
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EMFILE))
    })
}

/// Highest descriptor number [`grow_descriptor_table`] makes room for: room
/// for iopath's own numbers (a ring per thread of a program with many).
const TABLE_ROOM: libc::c_int = 2047;

/// Makes the process's descriptor table large enough for iopath's own
/// numbers now, while the caller knows the process is single-threaded (at
/// start, or as a library loads). The kernel grows a table that threads
/// share only after an RCU grace period (`synchronize_rcu` in
/// `expand_fdtable`), 10-15 ms in these VMs: `iopath run` paid 12.5 ms for
/// its first own descriptor on 1000, after its signal thread had started
/// (`strace -T`: `fcntl(6, F_DUPFD_CLOEXEC, 1000) = 1000 <0.012525>`),
/// before every program it starts. A table is never made smaller, so one
/// copy on the highest number the limit allows, closed again, is enough.
pub fn grow_descriptor_table() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let top = libc::rlim_t::try_from(TABLE_ROOM).unwrap_or(0).min(limit.rlim_cur.saturating_sub(1));
    let Ok(top) = libc::c_int::try_from(top) else { return };
    if top < HIGH_FDS_FROM {
        return;
    }
    // The system calls themselves, not the C library's functions: under the
    // interposer those are its own, and this runs as it loads.
    // SAFETY: opens, copies and closes descriptors of its own; nothing else is touched.
    unsafe {
        let fd = libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let high = libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, top);
        if high >= 0 {
            libc::syscall(libc::SYS_close, high);
        }
        libc::syscall(libc::SYS_close, fd);
    }
}

/// 0: no thread makes descriptors of iopath's own, and no program places
/// one; 1: one does; 2: one does and another waits (see [`own_numbers`]).
static NUMBERS: AtomicU32 = AtomicU32::new(0);

/// Odd while an [`own_numbers`] section runs: counted up as one starts and
/// again as it ends, so [`taking_lowest`] can tell whether one overlapped
/// a program's call.
static OWN_SECTIONS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// How deep this thread is in [`own_numbers`] or [`hold_own_numbers`].
    static NUMBERS_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

fn lock_numbers() {
    if NUMBERS.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        return;
    }
    while NUMBERS.swap(2, Ordering::Acquire) != 0 {
        futex_wait(&NUMBERS, 2, None);
    }
}

fn unlock_numbers() {
    if NUMBERS.swap(0, Ordering::Release) == 2 {
        futex_wake_all(&NUMBERS);
    }
}

/// Held by [`own_numbers`] and [`placing_numbers`]; unlocks as it goes.
pub struct NumbersHeld {
    /// This thread took the lock (it was not already in a section).
    took: bool,
    /// An [`own_numbers`] section: counted in [`OWN_SECTIONS`].
    own: bool,
}

impl Drop for NumbersHeld {
    fn drop(&mut self) {
        if self.took {
            let _ = NUMBERS_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
            if self.own {
                OWN_SECTIONS.fetch_add(1, Ordering::SeqCst);
            }
            unlock_numbers();
        }
    }
}

fn enter_numbers(own: bool) -> NumbersHeld {
    let outer = !in_numbers_section();
    if outer {
        lock_numbers();
        let _ = NUMBERS_DEPTH.try_with(|d| d.set(1));
        if own {
            OWN_SECTIONS.fetch_add(1, Ordering::SeqCst);
        }
    }
    NumbersHeld { took: outer, own }
}

/// Whether this thread is inside a section of [`enter_numbers`] already.
fn in_numbers_section() -> bool {
    NUMBERS_DEPTH.try_with(|d| d.get() != 0).unwrap_or(false)
}

/// Runs `f`, which makes a descriptor of iopath's own and moves it to a
/// high number ([`copy_high`]) or closes it before it returns, while no
/// program's call places a descriptor on a number it names
/// ([`placing_numbers`]).
///
/// Inside a program (the interposer), a descriptor the kernel gives an
/// iopath thread takes the lowest free number for a moment; a program that
/// has just closed that number and is about to `dup2` onto it (dash's
/// `cmd >&4` is `close(1)` then `dup2(4, 1)`) had its new descriptor closed by
/// iopath's move, or iopath's replaced under it: `echo: I/O error` now and
/// then when a thread of the interposer mounted while a shell redirected.
/// `f` must only make, move and close descriptors (no lock of iopath's is
/// taken inside, so none can wait on another); nested calls on one thread
/// are fine.
pub fn own_numbers<R>(f: impl FnOnce() -> R) -> R {
    let _held = enter_numbers(true);
    f()
}

/// Runs `f`, a program's call that places a descriptor on a number it
/// names or takes the lowest free one (`dup2`, `dup3`, `dup`, `F_DUPFD`),
/// while no iopath thread holds a descriptor at a low number for a moment
/// ([`own_numbers`]). For the interposer; costs one atomic exchange each
/// way when no iopath thread is making a descriptor.
pub fn placing_numbers<R>(f: impl FnOnce() -> R) -> R {
    let _held = enter_numbers(false);
    f()
}

/// Runs `make`, a program's call that takes the lowest free descriptor
/// number (`open`, `openat`, `creat`, `accept`, and the number behind a mounted
/// file), and gives back the number it would have had if no iopath thread
/// had held a low one for a moment ([`own_numbers`]) meanwhile: a program
/// that closes 0 and opens a file expects it on 0 (a forked child beside
/// the interposer's threads got 11 now and then, and read nothing from its
/// standard input). `make` is never held back: an `open` can wait for
/// ever (a FIFO with no writer yet), so no lock is held across it. Instead
/// a call that overlapped a section waits for that section to end and
/// moves its descriptor down to the lowest free number if that is lower
/// (`cloexec`: the copy's close-on-exec flag, as the call opened it).
/// Costs two atomic loads when no section overlapped.
pub fn taking_lowest(make: impl FnOnce() -> libc::c_int, cloexec: bool) -> libc::c_int {
    if in_numbers_section() {
        return make();
    }
    // Start between sections: a count read while one runs would not change
    // if that one ran on past the call's end.
    let mut before = OWN_SECTIONS.load(Ordering::SeqCst);
    while before % 2 == 1 {
        wait_for_own_sections();
        before = OWN_SECTIONS.load(Ordering::SeqCst);
    }
    let fd = make();
    if fd < 0 || OWN_SECTIONS.load(Ordering::SeqCst) == before {
        return fd;
    }
    // SAFETY: saves the caller's errno around the moves below.
    let errno = unsafe { *libc::__errno_location() };
    wait_for_own_sections();
    let lowered = lowered(fd, cloexec);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    lowered
}

/// Returns once no [`own_numbers`] section runs (one that starts later
/// may). Without taking the lock: a signal handler on this thread that
/// `dup`s while this waits must not find it held by its own thread.
fn wait_for_own_sections() {
    loop {
        let state = NUMBERS.load(Ordering::Acquire);
        if state == 0 {
            return;
        }
        // Marked 2, the holder's unlock wakes this thread (it wakes only where it finds 2).
        if state == 2 || NUMBERS.compare_exchange(1, 2, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            futex_wait(&NUMBERS, 2, None);
        }
    }
}

/// `fd` moved to the lowest free number if that is below it (the old
/// number closed), else `fd` as it was. The system calls themselves: under
/// the interposer the C library's are its own hooks.
fn lowered(fd: libc::c_int, cloexec: bool) -> libc::c_int {
    let command = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    // SAFETY: copies the caller's new descriptor and closes one of the two copies.
    unsafe {
        let low = libc::syscall(libc::SYS_fcntl, fd, command, 0) as libc::c_int;
        if low < 0 {
            return fd;
        }
        if low < fd {
            libc::syscall(libc::SYS_close, fd);
            low
        } else {
            libc::syscall(libc::SYS_close, low);
            fd
        }
    }
}

/// Keeps [`own_numbers`] sections from starting until dropped: for a
/// fork's prepare handler, dropped after the fork in the parent and the
/// child (a child never starts with a descriptor half moved, or the lock
/// held by a thread it does not have).
pub fn hold_own_numbers() -> NumbersHeld {
    enter_numbers(false)
}

/// The names in directory `dir`, read inside [`own_numbers`]: a directory
/// stream holds a descriptor at a low number while it is read (the C
/// library's `opendir` opens it where no hook sees it).
pub fn dir_names(dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
    own_numbers(|| Ok(std::fs::read_dir(dir)?.flatten().map(|e| e.file_name()).collect()))
}

// ---- processes ----

static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn count_fork() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many forks lie between this process and the one that first asked
/// (0 there, 1 in its child, ...): state kept per thread that holds
/// descriptors compares it to know whether those descriptors are its own.
/// In a child they are copies the child may already have closed, even by a
/// raw system call no hook sees (Python's subprocess closes every
/// descriptor above 2 with `close_range` before its exec), and their
/// numbers may have been given to new files since. One atomic load.
pub fn fork_generation() -> u64 {
    static COUNTING: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a child handler that only does an atomic add.
    COUNTING.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(count_fork));
    });
    FORKS.load(std::sync::atomic::Ordering::Relaxed)
}

// ---- time ----

/// Reads a clock (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, ...) in nanoseconds.
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clocks iopath reads always exist
    // on Linux (a failure would leave zeros, never touch other memory).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets the calling thread's timer slack (how late the kernel may end its sleeps).
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long and touches only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// Sleeps until CLOCK_MONOTONIC reads `deadline_ns` (restarting after signals).
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// The calling thread's resource usage (`getrusage(RUSAGE_THREAD)`).
pub fn thread_rusage() -> libc::rusage {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD is supported on Linux.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru
}

/// The size of a page of memory.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

// ---- threads ----

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    pin_to_cpus(&[cpu])
}

/// Lets the calling thread run only on `cpus`.
pub fn pin_to_cpus(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it (every cpu is in
    // range); sched_setaffinity(0) applies to the calling thread only.
    check(unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    })
}

/// CPUs the machine has (online or not): valid CPU numbers are below this.
pub fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Sleeps while `word` holds `expected`, until woken or `timeout_ns` passes
/// (a private futex; spurious returns are the caller's to handle).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; FUTEX_WAIT only
    // compares it with `expected` and sleeps; `ts_ptr` is null or points at `ts`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, ts_ptr);
    }
}

/// Wakes every thread sleeping in [`futex_wait`] on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid address only wakes threads waiting on it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX);
    }
}

// ---- signals ----

/// Calls `handler` on each of `signals` (SA_RESTART, so other threads' calls
/// are not cut short), except those the process started with ignored: a
/// command run in the background of a script (`iopath bench ... &`, no job
/// control) has SIGINT ignored so that Ctrl-C at the terminal stops the
/// script, not it, and `nohup` ignores SIGHUP; a handler would undo that.
/// The handler must do only async-signal-safe work.
pub fn on_signals(signals: &[libc::c_int], handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    for &signal in signals {
        // SAFETY: queries the disposition into a zeroed sigaction of our own.
        let ignored = unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut current) == 0 && current.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            continue;
        }
        // SAFETY: a zeroed sigaction is valid; the handler has the signature sa_sigaction
        // expects without SA_SIGINFO; the mask is initialised before use.
        check(unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        })?;
    }
    Ok(())
}

/// Held while a thread of this library is created, and by a host's fork
/// handler across a fork ([`hold_thread_starts`]), which also waits for the
/// threads still starting ([`STARTING`]): a child never starts with a lock
/// that the C and Rust libraries take while a thread starts held by a thread
/// it does not have (its next thread, an exit's commit among them, waited for
/// ever).
static THREAD_STARTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This library's threads created and not yet running their body (past the
/// libraries' start of a thread).
static STARTING: AtomicU32 = AtomicU32::new(0);

/// Keeps this library's threads from starting until dropped, once those
/// already starting run their bodies: for a fork's prepare handler,
/// dropped after the fork in the parent and the child.
pub fn hold_thread_starts() -> std::sync::MutexGuard<'static, ()> {
    let held = THREAD_STARTS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let starting = STARTING.load(Ordering::Acquire);
        if starting == 0 {
            return held;
        }
        futex_wait(&STARTING, starting, Some(1_000_000));
    }
}

/// The library's process-wide locks a forked child's first mount takes,
/// held by [`hold_globals_for_fork`].
pub struct GlobalsHeld(#[allow(dead_code)] Vec<Box<dyn std::any::Any>>);

/// Takes the library's process-wide locks that a forked child needs to
/// mount a file system of its own (the carried caches' mappings, the
/// kernel's write-watch descriptors, the buffer pool), for a fork's prepare
/// handler: dropped after the fork in the parent and the child, so no child
/// starts with one held by a thread it does not have. A child of cargo
/// forked while another of its threads returned a buffer to the pool
/// waited for the pool's lock for ever as it mounted, and held the mount
/// its parent then waited for. Short holds all, and none taken while
/// another of them is held (the pool's last).
pub fn hold_globals_for_fork() -> GlobalsHeld {
    GlobalsHeld(vec![
        crate::fs::carry::hold_for_fork(),
        crate::fs::written::hold_for_fork(),
        crate::buffer::hold_for_fork(),
    ])
}

thread_local! {
    /// This thread is iopath's: started by [`spawn_without_signals`] (for
    /// good), or dropping iopath's per-thread state ([`own_calls`]).
    static OWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether what the calling thread does now is iopath's own, not the
/// program's, even where no call of iopath's is under way: it is a thread
/// iopath started ([`spawn_without_signals`]), to the end of the teardown
/// of its thread-local storage, or it is inside [`own_calls`]. For the
/// interposer: a thread's per-thread engine handles are dropped after its
/// body has returned, and the close of their rings reached the interposer
/// as the program's: a bridge thread stopped by a mount's lender (which
/// holds the bridges until it has joined it) then waited in that close for
/// the lender to resume them, and the mount was never given back.
pub fn own_thread() -> bool {
    OWN.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// Runs `f` as iopath's own ([`own_thread`] is true inside it): for the
/// drop of iopath's per-thread state on a program's thread.
pub fn own_calls<R>(f: impl FnOnce() -> R) -> R {
    let was = OWN.try_with(|o| o.replace(true)).unwrap_or(false);
    let r = f();
    let _ = OWN.try_with(|o| o.set(was));
    r
}

/// Starts a thread that receives no asynchronous signal: every signal is
/// blocked while it is created, so it starts (and stays) with all of them
/// blocked, and the creator's mask is put back. A library's threads in a
/// host program must not take the program's signals: the kernel hands a
/// process-directed signal to any thread that does not block it, and a
/// program that waits for its own SIGTERM in one thread (`sigwait`, as
/// MariaDB's signal thread does at shutdown) never saw it when an iopath
/// thread took it instead. Returns at once: a fork waits for the thread to
/// reach `f` instead ([`hold_thread_starts`]). (The creator used to wait
/// for it, 0.2-0.4 ms a thread where the new one starts on a halted vCPU:
/// three of them in every short process with a mount.)
pub fn spawn_without_signals<F, T>(builder: std::thread::Builder, f: F) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let _starting = THREAD_STARTS.lock().unwrap_or_else(|e| e.into_inner());
    let body = move || {
        let _ = OWN.try_with(|o| o.set(true)); // (never unset: see `own_thread`)
        if STARTING.fetch_sub(1, Ordering::AcqRel) == 1 {
            futex_wake_all(&STARTING);
        }
        f()
    };
    // SAFETY: sigset_t is plain data, filled before use; pthread_sigmask changes
    // this thread's mask only, and the old one is put back below.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    STARTING.fetch_add(1, Ordering::AcqRel);
    let spawned = builder.spawn(body);
    if spawned.is_err() {
        STARTING.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// Writes `bytes` to stderr with one write(2): async-signal-safe.
pub fn write_stderr_raw(bytes: &[u8]) {
    // SAFETY: write(2) of a valid buffer to fd 2; a short or failed write loses a notice only.
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Ends the process at once (no destructors, no flushing): async-signal-safe.
pub fn exit_now(status: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(status) }
}

// ---- files and block devices ----

/// `pread(2)`: reads at most `buf.len()` bytes at `offset`.
///
/// # Safety
///
/// `buf` must be valid for `len` writable bytes.
pub unsafe fn pread(file: &File, buf: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer; the fd is open for as long as `file`.
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.cast(), len, offset as libc::off_t) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// `pwrite(2)`: writes at most `len` bytes from `buf` at `offset`.
///
/// # Safety
///
/// `buf` must be valid for `len` readable bytes.
pub unsafe fn pwrite(file: &File, buf: *const u8, len: usize, offset: u64) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer; the fd is open for as long as `file`.
    let n = unsafe { libc::pwrite(file.as_raw_fd(), buf.cast(), len, offset as libc::off_t) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// `pwritev2(2)` of one buffer with `RWF_DSYNC`: durable when it returns (on
/// a block device a write with forced unit access, which the kernel makes a
/// write and a flush where the device has none).
///
/// # Safety
///
/// `buf` must be valid for `len` readable bytes.
pub unsafe fn pwrite_dsync(file: &File, buf: *const u8, len: usize, offset: u64) -> io::Result<usize> {
    let iov = libc::iovec { iov_base: buf.cast_mut().cast(), iov_len: len };
    // SAFETY: one iovec over the caller's buffer; the fd is open for as long as `file`.
    let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, libc::RWF_DSYNC) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// `fallocate(2)` with `PUNCH_HOLE | KEEP_SIZE`: the range reads back as zeros
/// (a block device discards or zeroes it).
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an fd that is open for as long as `file`; no memory is passed.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) })
}

/// `fdatasync(2)`.
pub fn fdatasync(file: &File) -> io::Result<()> {
    // SAFETY: fdatasync on an fd that is open for as long as `file`.
    check(unsafe { libc::fdatasync(file.as_raw_fd()) })
}

/// The size of a block device in bytes (`BLKGETSIZE64`).
pub fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`, which is valid and writable.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) })?;
    Ok(size)
}

/// The logical block size of a block device (`BLKSSZGET`).
pub fn block_device_sector(file: &File) -> io::Result<u32> {
    let mut sector: libc::c_int = 0;
    // BLKSSZGET = _IO(0x12, 104): logical block size.
    const BLKSSZGET: libc::c_ulong = 0x1268;
    // SAFETY: the ioctl writes one int into `sector`, which is valid and writable.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sector) })?;
    Ok(sector.max(1) as u32)
}

/// The O_DIRECT alignment of an open regular file (`statx` STATX_DIOALIGN),
/// if the file system reports one.
pub fn dio_alignment(file: &File) -> Option<u32> {
    // SAFETY: an all-zero statx is a valid value for the kernel to overwrite.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd, an empty path with AT_EMPTY_PATH, and a writable statx buffer.
    let rc =
        unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0)
        .then(|| stx.stx_dio_offset_align.max(stx.stx_dio_mem_align))
}

/// The `f_type` magic number of the file system `path` is on.
pub fn file_system_type(path: &Path) -> io::Result<i64> {
    let c_path = c_path(path)?;
    // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable statfs.
    check(unsafe { libc::statfs(c_path.as_ptr(), &mut st) })?;
    Ok(st.f_type as i64)
}

/// The value of extended attribute `name` of `path` (at most 256 bytes), if set.
pub fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let c_path = c_path(path).ok()?;
    let name = CString::new(name).ok()?;
    let mut value = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated; the value buffer is valid for its length.
    let n = unsafe { libc::getxattr(c_path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    (n >= 0).then(|| {
        value.truncate(n as usize);
        value
    })
}

/// Sets extended attribute `name` of an open file.
pub fn set_xattr(file: &File, name: &str, value: &[u8]) -> io::Result<()> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid fd, a NUL-terminated name and a value valid for its length.
    check(unsafe { libc::fsetxattr(file.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) })
}

/// The effective user id.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---- probes for `iopath doctor` ----

/// Creates an io_uring with `flags` (IORING_SETUP_*) and closes it again:
/// whether this kernel (and its seccomp policy and sysctls) accepts them.
pub fn io_uring_setup_works(entries: u32, flags: u32) -> io::Result<()> {
    // struct io_uring_params is 120 bytes: sq_entries, cq_entries, flags, sq_thread_cpu,
    // sq_thread_idle, features, wq_fd, resv[3], then the two offset tables.
    let mut params = [0u32; 30];
    params[2] = flags;
    if flags & (1 << 1) != 0 {
        // IORING_SETUP_SQPOLL: idle time of the kernel thread (ms).
        params[4] = 10;
    }
    // SAFETY: io_uring_setup reads and writes exactly one io_uring_params (120 bytes),
    // which `params` is; the returned fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is closed exactly once.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

/// A system call that does nothing (`getppid`), for measuring the cost of one.
#[inline(never)]
pub fn null_syscall() {
    // SAFETY: getppid has no preconditions and no side effects.
    unsafe { libc::syscall(libc::SYS_getppid) };
}

/// Sleeps for `ns` (relative), restarting after signals.
pub fn sleep_ns(ns: u64) {
    let ts =
        libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: a valid timespec; a null remainder is allowed.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
}

/// The soft and hard limits of locked memory (RLIMIT_MEMLOCK), in bytes
/// (`u64::MAX` for unlimited).
pub fn memlock_limit() -> (u64, u64) {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid, writable rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    (rl.rlim_cur, rl.rlim_max)
}

/// The kernel's release and machine (`uname -r`, `uname -m`).
pub fn kernel_release() -> (String, String) {
    // SAFETY: an all-zero utsname is a valid value for uname to overwrite.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return ("unknown".into(), "unknown".into());
    }
    let text = |field: &[libc::c_char]| {
        let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (text(&u.release), text(&u.machine))
}

/// The device number (major, minor) of a block device node, or of the
/// device holding a file.
pub fn device_numbers(path: &Path) -> io::Result<(u32, u32, bool)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path)?;
    let (dev, is_block) = if meta.file_type().is_block_device() { (meta.rdev(), true) } else { (meta.dev(), false) };
    Ok((libc::major(dev), libc::minor(dev), is_block))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_table_is_grown_for_our_own_numbers_and_nothing_is_left_open() {
        let fd_size = || {
            let status = std::fs::read_to_string("/proc/self/status").expect("/proc is there");
            let line = status.lines().find(|l| l.starts_with("FDSize:")).expect("FDSize line");
            line["FDSize:".len()..].trim().parse::<usize>().expect("a number")
        };
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit into a local.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        grow_descriptor_table();
        // SAFETY: F_GETFD only asks.
        assert_eq!(unsafe { libc::fcntl(TABLE_ROOM, libc::F_GETFD) }, -1, "the copy it made is closed again");
        if limit.rlim_cur > TABLE_ROOM as libc::rlim_t {
            assert!(fd_size() > TABLE_ROOM as usize, "FDSize {} after growing", fd_size());
        } else if limit.rlim_cur > HIGH_FDS_FROM as libc::rlim_t {
            assert!(fd_size() > HIGH_FDS_FROM as usize, "FDSize {} after growing", fd_size());
        }
    }

    /// The calling thread's blocked signals, from /proc (bit n-1 for signal n).
    fn blocked_here() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("/proc is there");
        let line = status.lines().find(|l| l.starts_with("SigBlk:")).expect("SigBlk line");
        u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).expect("hex")
    }

    #[test]
    fn a_program_places_no_descriptor_while_an_iopath_thread_makes_one() {
        use std::sync::atomic::AtomicBool;
        static MAKING: AtomicBool = AtomicBool::new(false);
        let placed = own_numbers(|| {
            MAKING.store(true, Ordering::SeqCst);
            // Nested sections and a placing call on the same thread do not wait on themselves.
            own_numbers(|| placing_numbers(|| ()));
            let program = std::thread::spawn(|| placing_numbers(|| MAKING.load(Ordering::SeqCst)));
            std::thread::sleep(std::time::Duration::from_millis(50));
            MAKING.store(false, Ordering::SeqCst);
            program
        });
        assert!(!placed.join().unwrap(), "the program's call ran inside the section");
        // And everything is free again.
        placing_numbers(|| own_numbers(|| ()));
    }

    #[test]
    fn a_thread_of_ours_is_ours_to_its_storage_teardown_and_a_programs_only_in_own_calls() {
        // What a thread's storage says as it is torn down, after its body returned.
        struct Teardown(std::sync::mpsc::Sender<bool>);
        impl Drop for Teardown {
            fn drop(&mut self) {
                let _ = self.0.send(own_thread());
            }
        }
        thread_local! {
            static KEPT: std::cell::RefCell<Option<Teardown>> = const { std::cell::RefCell::new(None) };
        }
        let (said, seen) = std::sync::mpsc::channel();
        let body = |said| move || KEPT.with(|k| *k.borrow_mut() = Some(Teardown(said)));
        spawn_without_signals(std::thread::Builder::new(), body(said.clone())).unwrap().join().unwrap();
        assert!(seen.recv().unwrap(), "a thread of ours, torn down");
        std::thread::spawn(body(said)).join().unwrap();
        assert!(!seen.recv().unwrap(), "a program's thread, torn down");
        assert!(!own_thread());
        assert!(own_calls(own_thread));
        assert!(!own_thread(), "own_calls puts it back");
    }

    #[test]
    fn holding_thread_starts_waits_for_every_thread_still_starting() {
        // What a fork's prepare handler relies on: once it holds the starts, no
        // thread of this library is between its creation and its body.
        let started = std::sync::Arc::new(AtomicU32::new(0));
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = std::sync::Arc::new(std::sync::Mutex::new(gate));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (started, gate) = (started.clone(), gate.clone());
                spawn_without_signals(std::thread::Builder::new(), move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.lock().unwrap().recv();
                })
                .unwrap()
            })
            .collect();
        // Each of them ran past its start (its body then counts it in `started`;
        // nothing more can be asserted of where it is now).
        let held = hold_thread_starts();
        assert_eq!(STARTING.load(Ordering::SeqCst), 0, "a thread was still starting");
        drop(held);
        while started.load(Ordering::SeqCst) < 8 {
            std::thread::yield_now();
        }
        for _ in 0..8 {
            release.send(()).unwrap();
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
    }

    #[test]
    fn a_thread_spawned_without_signals_blocks_them_and_its_creator_keeps_its_own_mask() {
        let before = blocked_here();
        let spawned = spawn_without_signals(std::thread::Builder::new(), blocked_here).unwrap();
        let theirs = spawned.join().unwrap();
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGHUP, libc::SIGCHLD] {
            assert_ne!(theirs & (1 << (signal - 1)), 0, "signal {signal} not blocked: {theirs:x}");
        }
        assert_eq!(blocked_here(), before);
    }
}
