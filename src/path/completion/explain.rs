//! What the self-choosing policies decided and why, in words.
//!
//! `auto` (and `adaptive`) say every mode change, every probe and every
//! crowd or hog verdict here. Nothing is said unless someone listens: with
//! `IOPATH_LOG=1` in the environment each line goes to stderr as it is
//! decided (also through the interposer and the C interface); `iopath bench
//! --explain` collects them ([`collect`]) and prints them after the run
//! ([`take`]). When nobody listens, [`enabled`] is one relaxed load.
//!
//! A busy program decides often (an epoch is a few ms, per thread), so lines
//! are limited to [`LINES_PER_SECOND`] per second on stderr and
//! [`MAX_COLLECTED`] in all when collected; what is left out is counted and
//! the count said.

use std::fmt::Arguments;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

/// Most lines printed to stderr in one second.
pub const LINES_PER_SECOND: u64 = 50;
/// Most lines kept when collecting.
pub const MAX_COLLECTED: usize = 400;

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const STDERR: u8 = 2;
const COLLECT: u8 = 3;

static SINK: AtomicU8 = AtomicU8::new(UNKNOWN);
static COLLECTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Lines left out (rate limit or cap).
static LEFT_OUT: AtomicU64 = AtomicU64::new(0);
/// (second, lines said in it) for the stderr rate limit, packed as second << 16 | count.
static THIS_SECOND: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Where the decision lines go when they go to stderr: another descriptor
/// if set ([`write_to`]), else -1 (stderr).
static WRITE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Sends the lines that would go to stderr to descriptor `fd` instead (the
/// interposer's log file, `IOPATH_LOG=/path`), from now on.
pub fn write_to(fd: std::os::fd::RawFd) {
    WRITE_FD.store(fd, Ordering::Relaxed);
}

/// Writes `iopath: line` to stderr, or to the descriptor [`write_to`] set,
/// in one system call and without a lock: the standard library's stderr
/// lock, taken by a thread at the instant another forks, stays held for
/// ever in the child, whose next line then waits on it (a forked child of
/// a program under the interposer with `IOPATH_LOG=1` hung in its first
/// decision line, holding the mount its parent's threads waited for). The
/// system call itself, not the C library's `write`: under the interposer
/// that is its own hook.
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    let text = format!("iopath: {line}\n");
    let fd = match WRITE_FD.load(Ordering::Relaxed) {
        -1 => libc::STDERR_FILENO,
        fd => fd,
    };
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writes a buffer we own to stderr or a descriptor the caller handed over.
        let n = unsafe { libc::syscall(libc::SYS_write, fd, rest.as_ptr(), rest.len()) };
        match usize::try_from(n) {
            Ok(0) => return,
            Ok(n) => rest = &rest[n.min(rest.len())..],
            Err(_) if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Whether anyone listens (reads `IOPATH_LOG` the first time).
pub fn enabled() -> bool {
    match SINK.load(Ordering::Relaxed) {
        OFF => false,
        UNKNOWN => {
            let on = std::env::var_os("IOPATH_LOG").is_some_and(|v| !v.is_empty() && v != "0");
            let _ = SINK.compare_exchange(UNKNOWN, if on { STDERR } else { OFF }, Ordering::Relaxed, Ordering::Relaxed);
            epoch();
            SINK.load(Ordering::Relaxed) != OFF
        }
        _ => true,
    }
}

/// Collects every line from now on (for `iopath bench --explain`), whatever
/// `IOPATH_LOG` says.
pub fn collect() {
    epoch();
    COLLECTED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    LEFT_OUT.store(0, Ordering::Relaxed);
    SINK.store(COLLECT, Ordering::Relaxed);
}

/// The lines collected so far and how many were left out; collecting stops.
pub fn take() -> (Vec<String>, u64) {
    SINK.store(OFF, Ordering::Relaxed);
    let lines = std::mem::take(&mut *COLLECTED.lock().unwrap_or_else(|e| e.into_inner()));
    (lines, LEFT_OUT.swap(0, Ordering::Relaxed))
}

/// Where [`tally`] books waits: the four modes of `auto` by their index
/// (`Mode as usize`), then [`CROWD`], [`FLUSH`] and [`JUDGED_SLEEPING`].
pub const TALLY_SLOTS: [&str; 7] = ["poll", "hybrid", "interrupt", "yield", "crowd", "flush", "judged sleeping"];
/// Slot of a crowd's (yielding) waits; also their index in `WaitStats::mode_ns`.
pub const CROWD: usize = 4;
/// Slot of flushes and trims (waited for outside the epochs).
pub const FLUSH: usize = 5;
/// Slot of the waits the [judge](super::judge) made sleep.
pub const JUDGED_SLEEPING: usize = 6;

/// The process's waits by where they went: (count, ns) per [`TALLY_SLOTS`] entry.
static TALLY: [(AtomicU64, AtomicU64); 7] = [const { (AtomicU64::new(0), AtomicU64::new(0)) }; 7];
/// The process's mode switches and probes.
static TALLY_STEPS: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

/// Books `waits` waits taking `ns` to slot `slot` of [`TALLY_SLOTS`], for the
/// process-wide [`summary`]; only while someone listens (shared counters cost
/// the waits of many threads a contended cache line).
pub fn tally(slot: usize, waits: u64, ns: u64) {
    if enabled() && slot < TALLY.len() {
        TALLY[slot].0.fetch_add(waits, Ordering::Relaxed);
        TALLY[slot].1.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Books mode switches and probes for the process-wide [`summary`].
pub fn tally_steps(switches: u64, probes: u64) {
    if enabled() {
        TALLY_STEPS.0.fetch_add(switches, Ordering::Relaxed);
        TALLY_STEPS.1.fetch_add(probes, Ordering::Relaxed);
    }
}

/// Where the process's waits went so far, in one line (`None` if nothing
/// was booked): per mode the share of waiting time, the count and the mean
/// wait, then the switches and probes. Printed at exit by the interposer
/// with `IOPATH_LOG=1`: the decision log is rate-limited and shows the
/// start of a run; this is its whole.
pub fn summary() -> Option<String> {
    let rows: Vec<(&str, u64, u64)> = TALLY_SLOTS
        .iter()
        .zip(&TALLY)
        .map(|(name, (n, ns))| (*name, n.load(Ordering::Relaxed), ns.load(Ordering::Relaxed)))
        .collect();
    let total_ns: u64 = rows.iter().map(|r| r.2).sum();
    if total_ns == 0 {
        return None;
    }
    let parts: Vec<String> = rows
        .iter()
        .filter(|r| r.1 > 0)
        .map(|(name, n, ns)| {
            format!(
                "{name} {:.0}% ({n} waits, {:.1} us each)",
                100.0 * *ns as f64 / total_ns as f64,
                *ns as f64 / *n as f64 / 1e3
            )
        })
        .collect();
    Some(format!(
        "waiting time by mode: {}; {} switches, {} probes",
        parts.join(", "),
        TALLY_STEPS.0.load(Ordering::Relaxed),
        TALLY_STEPS.1.load(Ordering::Relaxed)
    ))
}

/// Says one decision of `who` (a policy's name), if anyone listens.
pub fn say(who: &str, what: Arguments<'_>) {
    say_limited(who, what, true);
}

/// Says a decision that is rare by construction (the process's judge: at
/// most one in 100 ms), past the per-second limit that keeps the threads'
/// own decisions from flooding stderr.
pub fn say_rare(who: &str, what: Arguments<'_>) {
    say_limited(who, what, false);
}

fn say_limited(who: &str, what: Arguments<'_>, limited: bool) {
    if !enabled() {
        return;
    }
    let at = epoch().elapsed();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let line = format!("{:>9.3}s {who}[{tid}]: {what}", at.as_secs_f64());
    match SINK.load(Ordering::Relaxed) {
        COLLECT => {
            let mut lines = COLLECTED.lock().unwrap_or_else(|e| e.into_inner());
            if lines.len() < MAX_COLLECTED {
                lines.push(line);
            } else {
                LEFT_OUT.fetch_add(1, Ordering::Relaxed);
            }
        }
        STDERR if !limited => write_line(format_args!("{line}")),
        STDERR => {
            let second = at.as_secs();
            let packed = THIS_SECOND.fetch_add(1, Ordering::Relaxed);
            let (was, count) = (packed >> 16, packed & 0xffff);
            if was != second {
                THIS_SECOND.store(second << 16 | 1, Ordering::Relaxed);
                let left = LEFT_OUT.swap(0, Ordering::Relaxed);
                if left > 0 {
                    write_line(format_args!("({left} more decisions not shown)"));
                }
            } else if count >= LINES_PER_SECOND {
                LEFT_OUT.fetch_add(1, Ordering::Relaxed);
                return;
            }
            write_line(format_args!("{line}"));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by each test that starts and takes the process's collection: one
    /// test's `collect` clears, and its `take` stops, what another collects
    /// (seen once in CI: 1 line taken of 400).
    static COLLECTING: Mutex<()> = Mutex::new(());

    #[test]
    fn a_child_forked_while_another_thread_held_stderr_still_writes_its_line() {
        // A thread in the middle of writing to stderr (the standard library's lock held)
        // as another forks: the child's line must not wait for that lock.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _stderr = std::io::stderr().lock();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        let mut pipe = [-1; 2];
        // SAFETY: pipe2 fills two descriptors.
        assert_eq!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the child only writes a line onto its own stderr (the pipe) and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child: its own descriptor table.
            unsafe { libc::dup2(pipe[1], libc::STDERR_FILENO) };
            write_line(format_args!("a line from the child"));
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        // SAFETY: closing the parent's copy of the writing end.
        unsafe { libc::close(pipe[1]) };
        let mut poll = libc::pollfd { fd: pipe[0], events: libc::POLLIN, revents: 0 };
        // SAFETY: waits up to 10 s for the child's line on our pipe.
        let ready = unsafe { libc::poll(&mut poll, 1, 10_000) };
        let mut got = [0u8; 64];
        // SAFETY: reads into a buffer we own, if anything came.
        let n = if ready == 1 { unsafe { libc::read(pipe[0], got.as_mut_ptr().cast(), got.len()) } } else { 0 };
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        // SAFETY: ends and reaps the child (if its line never came, it is stuck).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(pipe[0]);
        }
        let line = String::from_utf8_lossy(&got[..usize::try_from(n).unwrap_or(0)]).into_owned();
        assert_eq!(line, "iopath: a line from the child\n", "the child's line (none: it waited for the lock)");
    }

    #[test]
    fn collected_lines_come_back_once_and_are_capped() {
        let _one = COLLECTING.lock().unwrap_or_else(|e| e.into_inner());
        collect();
        assert!(enabled());
        for i in 0..MAX_COLLECTED + 5 {
            say("auto", format_args!("decision {i}"));
        }
        let (lines, left_out) = take();
        // (Other tests' policies may have said something meanwhile.)
        assert_eq!(lines.len(), MAX_COLLECTED);
        assert!(left_out >= 5, "{left_out}");
        assert!(lines.iter().any(|l| l.contains("auto[") && l.ends_with("decision 0")), "{lines:?}");
        assert!(!enabled(), "taking stops the collection");
        assert_eq!(take().0.len(), 0);
    }

    #[test]
    fn the_summary_gives_each_modes_share_of_the_waiting_time() {
        let _one = COLLECTING.lock().unwrap_or_else(|e| e.into_inner());
        collect();
        tally(3, 3, 3_000_000);
        tally(5, 1, 1_000_000);
        tally_steps(2, 5);
        let _ = take();
        let line = summary().expect("something was booked");
        // (Other tests' policies may book waits meanwhile: only the shape is certain.)
        assert!(line.starts_with("waiting time by mode: "), "{line}");
        assert!(line.contains("yield ") && line.contains("flush "), "{line}");
        assert!(line.contains(" switches, ") && line.ends_with(" probes"), "{line}");
    }
}
