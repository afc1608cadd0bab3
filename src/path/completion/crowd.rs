//! The crowd: how many of this process's threads are waiting for the device
//! right now, and whether the other runnable threads on the machine are
//! theirs or somebody else's.
//!
//! A waiter that yields between looks at its queue hands its CPU to whoever
//! is runnable. When that is another waiter of this process (or a device's
//! worker thread), the CPU comes back within microseconds to a few hundred
//! of them and yielding is what lets many blocking threads share 2 CPUs
//! without a wake-up each. When it is a CPU-bound thread (a hog, or the
//! program's own computing threads), the yield costs a scheduler slice and
//! the waiter should sleep instead. A single long yield cannot tell the two
//! apart: with 32 waiters on 2 CPUs one yield in a few hundred takes over a
//! millisecond although every thread in the way was a waiter (measured on a
//! loop device: `sync-yield` with a plain 1 ms rule slept 85-90% of its waits
//! and made 112-182K IOPS; never sleeping made 211K). The run queue can:
//! [`Verdict::of`] compares the machine's runnable threads (`/proc/loadavg`,
//! read after a long yield) with this process's waiters, and asks whether the
//! process made progress (completions) while the waiter was away. The same comparison
//! on a figure at most half a millisecond old ([`runnable_lately`], read by
//! one thread for all) tells a waiter before it yields whether the CPUs are
//! wanted by threads that are not waiting ([`cpus_wanted`]): a program's own
//! computing threads (MariaDB's, under sysbench read-write) give the CPU back
//! within a slice, so their yields are never long, yet every yield a waiter
//! makes among them costs a context switch and a look that the program's work
//! needed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

/// Threads of this process inside a wait of a policy that registers (the
/// yielding, adaptive and auto policies).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A thread counted among the waiters while this lives.
#[must_use = "the thread counts as waiting only while the guard lives"]
pub struct Waiting {
    /// How many were waiting when this one joined, itself included.
    pub count: usize,
}

impl Waiting {
    /// Counts the calling thread as waiting.
    pub fn enter() -> Waiting {
        Waiting { count: WAITING.fetch_add(1, Ordering::Relaxed) + 1 }
    }

    /// Whether the waiters (this one included) outnumber the CPUs.
    pub fn crowded(&self) -> bool {
        #[cfg(test)]
        if ALONE.with(std::cell::Cell::get) {
            return false;
        }
        self.count > cpus()
    }
}

#[cfg(test)]
thread_local! {
    static ALONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's waits never crowded: for a unit test whose waits must
/// be in the policy's own mode although other tests of the process (threads
/// of one test binary) wait at the same time.
#[cfg(test)]
pub(crate) fn never_crowded_here() {
    ALONE.with(|a| a.set(true));
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Threads of this process waiting right now.
pub fn waiting() -> usize {
    WAITING.load(Ordering::Relaxed)
}

/// CPUs this process may run on (read once).
pub fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runnable threads on the machine right now (the fourth field of
/// `/proc/loadavg`, before the slash: the scheduler's `nr_running`, the
/// reader included), if readable.
pub fn runnable() -> Option<usize> {
    // Kept open (a read is one pread), at a number out of the way of the ones a host
    // program expects to be its own (>= LOADAVG_FLOOR). A program may still close it
    // (a daemon closing every descriptor): then the number is the program's, and a
    // read that fails or does not look like the file opens it again elsewhere, never
    // closing what the old number is now.
    let mut buf = [0u8; 128];
    for _ in 0..2 {
        let mut fd = LOADAVG.load(Ordering::Acquire);
        if fd < 0 {
            let opened = open_loadavg()?;
            fd = match LOADAVG.compare_exchange(-1, opened, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => opened,
                Err(theirs) => {
                    // Another thread opened it first.
                    // SAFETY: ours, used by nothing else.
                    unsafe { libc::close(opened) };
                    theirs
                }
            };
        }
        // SAFETY: pread into a buffer of ours; a descriptor that is not ours any more is
        // only read, and what it gives is checked.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if let Ok(n) = usize::try_from(n)
            && let Some(r) = std::str::from_utf8(&buf[..n]).ok().and_then(parse_runnable)
        {
            return Some(r);
        }
        let _ = LOADAVG.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
    None
}

/// The descriptor [`runnable`] reads (-1: not open).
static LOADAVG: AtomicI32 = AtomicI32::new(-1);

/// Lowest descriptor number [`runnable`] keeps `/proc/loadavg` at.
const LOADAVG_FLOOR: libc::c_int = 300;

/// Opens `/proc/loadavg` at [`LOADAVG_FLOOR`] or above, close-on-exec.
fn open_loadavg() -> Option<libc::c_int> {
    let file = std::fs::File::open("/proc/loadavg").ok()?;
    // SAFETY: duplicates a descriptor we own (closed when `file` drops).
    let fd = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_DUPFD_CLOEXEC, LOADAVG_FLOOR) };
    (fd >= 0).then_some(fd)
}

/// [`runnable`], read at most once per ~0.5 ms by any thread of the process
/// and shared: the figure a wait consults before it yields.
pub fn runnable_lately() -> Option<usize> {
    /// (tick << 20 | runnable) of the last read; a tick is 2^19 ns.
    static SAMPLE: AtomicU64 = AtomicU64::new(0);
    let tick = crate::clock::now_ns() >> 19;
    let last = SAMPLE.load(Ordering::Relaxed);
    if last != 0 && last >> 20 == tick {
        return Some((last & 0xf_ffff) as usize);
    }
    let r = runnable()?;
    SAMPLE.store(tick << 20 | r.min(0xf_ffff) as u64, Ordering::Relaxed);
    Some(r)
}

/// Whether threads that are not waiting for the device want the CPUs now:
/// more of them runnable than [`Verdict::of`] allows a crowd (one per CPU
/// plus a quarter of the waiters). A wait then sleeps instead of yielding.
pub fn cpus_wanted() -> bool {
    runnable_lately().is_some_and(|r| wanted(r, waiting(), cpus()))
}

/// [`cpus_wanted`] from `runnable` threads, `waiting` waiters and `cpus`.
pub fn wanted(runnable: usize, waiting: usize, cpus: usize) -> bool {
    runnable.saturating_sub(waiting) > cpus + waiting / 4
}

/// `nr_running` from the text of `/proc/loadavg` ("0.52 0.31 0.20 3/412 9876").
pub fn parse_runnable(text: &str) -> Option<usize> {
    text.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

/// What a yield that kept a waiter away for long says about who had the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The crowd's own turn: this process's waiters outnumber the CPUs, few
    /// other threads are runnable, and the others made progress while this
    /// one was away. Keep yielding.
    CrowdTurn,
    /// A thread that is not waiting for the device used the CPU (a hog, the
    /// program's own computing threads): sleep rather than yield to it again.
    CpuTaken,
}

impl Verdict {
    /// The verdict from `runnable` threads on the machine (None: unknown),
    /// `waiting` threads of this process, `cpus`, and the `progress` the
    /// process made while the waiter was away (completions its waiters saw).
    ///
    /// Runnable threads that are not waiters are allowed for up to one per CPU
    /// (device workers, a loop device's; short-lived kernel threads) plus a
    /// quarter of the waiters: the crowd's own threads between two waits
    /// (submitting, or on their way back to the caller) are runnable but not
    /// counted as waiting (measured with 32 threads on the loop device: with
    /// no such allowance 0.18 waits in 1 slept and IOPS fell from 181K to
    /// 129K). That allowance cannot tell two CPU hogs from two device workers,
    /// so the time away must also have been the crowd's: at least two
    /// completions per waiter. Behind a crowd of 32 on the loop device a 1 ms
    /// yield sees over 100; 16 waiters yielding behind 2 hogs on `emu:nand`
    /// collapse to one look per waiter per scheduler slice (5.6K IOPS), about
    /// one completion per waiter in a long yield.
    pub fn of(runnable: Option<usize>, waiting: usize, cpus: usize, progress: u64) -> Verdict {
        match runnable {
            Some(r) if waiting > cpus && !wanted(r, waiting, cpus) && progress >= 2 * waiting as u64 => {
                Verdict::CrowdTurn
            }
            _ => Verdict::CpuTaken,
        }
    }

    /// The verdict now, for a waiter that was away while the process saw
    /// `progress` completions.
    pub fn now(progress: u64) -> Verdict {
        Verdict::of(runnable(), waiting(), cpus(), progress)
    }
}

/// Completions seen by this process's yielding waiters so far.
static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// Counts `n` completions a yielding waiter saw.
pub fn note_completed(n: usize) {
    if n > 0 {
        COMPLETED.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Completions seen by this process's yielding waiters so far.
pub fn completed() -> u64 {
    COMPLETED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_queue_is_read_again_after_a_program_closed_its_descriptor() {
        assert!(runnable().is_some_and(|r| r >= 1), "the reader itself runs");
        let fd = LOADAVG.load(Ordering::Acquire);
        assert!(fd >= LOADAVG_FLOOR, "kept out of the way of the program's numbers: {fd}");
        // A program that closes every descriptor, then opens a file of its own there.
        let mut theirs = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut theirs, b"not the run queue").unwrap();
        // SAFETY: dup2 over the number, as a program that owns it may.
        assert_eq!(unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&theirs), fd) }, fd);
        assert!(runnable().is_some_and(|r| r >= 1), "opened again elsewhere");
        assert_ne!(LOADAVG.load(Ordering::Acquire), fd);
        let mut still = [0u8; 17];
        // SAFETY: reads the program's file at the old number.
        assert_eq!(unsafe { libc::pread(fd, still.as_mut_ptr().cast(), 17, 0) }, 17, "left open, the program's");
        assert_eq!(&still, b"not the run queue");
        // SAFETY: the test's own duplicate.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn loadavg_gives_the_running_count() {
        assert_eq!(parse_runnable("0.52 0.31 0.20 3/412 9876\n"), Some(3));
        assert_eq!(parse_runnable("0.52 0.31"), None);
        assert_eq!(parse_runnable("a b c x/y z"), None);
        if std::path::Path::new("/proc/loadavg").exists() {
            assert!(runnable().is_some_and(|r| r >= 1), "the reader itself is runnable");
        }
    }

    #[test]
    fn a_long_yield_is_the_crowds_turn_only_in_a_crowd_with_few_others_runnable_that_made_progress() {
        // 32 waiters on 2 CPUs, the loop worker and a few of the crowd between waits,
        // 120 completions meanwhile: their turn.
        assert_eq!(Verdict::of(Some(38), 32, 2, 120), Verdict::CrowdTurn);
        // The same with little progress: something else had the CPUs.
        assert_eq!(Verdict::of(Some(38), 32, 2, 20), Verdict::CpuTaken);
        // 8 waiters, the worker and 4 computing threads: somebody else's.
        assert_eq!(Verdict::of(Some(13), 8, 2, 100), Verdict::CpuTaken);
        assert_eq!(Verdict::of(Some(12), 8, 2, 100), Verdict::CrowdTurn);
        // 16 waiters behind 2 hogs: the run queue allows it, the progress does not.
        assert_eq!(Verdict::of(Some(18), 16, 2, 17), Verdict::CpuTaken);
        // One waiter and one hog: no crowd, so whoever took the CPU was not ours.
        assert_eq!(Verdict::of(Some(2), 1, 2, 100), Verdict::CpuTaken);
        // Unknown run queue: the safe answer is to stop yielding to it.
        assert_eq!(Verdict::of(None, 32, 2, 1000), Verdict::CpuTaken);
        // Fewer runnable than waiting (sleepers counted as waiting): their turn.
        assert_eq!(Verdict::of(Some(3), 16, 2, 40), Verdict::CrowdTurn);
    }

    #[test]
    fn the_cpus_are_wanted_when_more_than_a_crowds_allowance_of_others_are_runnable() {
        // One waiter beside a loop worker: yield. Beside 3 computing threads: sleep.
        assert!(!wanted(2, 1, 2));
        assert!(wanted(4, 1, 2));
        // 32 fio-like waiters, loop workers and some between waits: yield.
        assert!(!wanted(40, 32, 2));
        // 4 waiters among MariaDB's 6 computing threads (and the reader): sleep.
        assert!(wanted(11, 4, 2));
        // A recent figure is one figure for every thread within its tick.
        if runnable().is_some() {
            assert!(runnable_lately().is_some());
        }
    }
}
