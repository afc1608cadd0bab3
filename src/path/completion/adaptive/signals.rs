//! What the adaptive policy samples each epoch: this thread's run delay
//! (`/proc/thread-self/schedstat`), the system's CPU pressure
//! (`/proc/pressure/cpu`), this thread's context switches, and (on some of its
//! waits) its CPU time.

use crate::clock::ThreadUsage;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Reads this thread's run delay (ns waiting for a CPU) from schedstat.
pub(super) fn read_run_delay(file: &Option<File>, buf: &mut [u8; 128]) -> u64 {
    let Some(f) = file else { return 0 };
    let n = f.read_at(buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n]).ok().and_then(|s| s.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Reads the system's CPU "some" pressure total (ns).
pub(super) fn read_pressure(file: &Option<File>, buf: &mut [u8; 128]) -> u64 {
    let Some(f) = file else { return 0 };
    let n = f.read_at(buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| {
            s.lines().next()?.split_whitespace().find_map(|kv| kv.strip_prefix("total="))?.parse::<u64>().ok()
        })
        .map_or(0, |us| us * 1000)
}

/// This thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID: exact, unlike
/// getrusage, which may count in scheduler ticks).
pub(super) fn thread_cpu_ns() -> u64 {
    crate::sys::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Snapshot {
    pub(super) at_ns: u64,
    /// Whether the thread's own counters (run delay, switches) were read.
    pub(super) full: bool,
    pub(super) usage: ThreadUsage,
    pub(super) run_delay_ns: u64,
    pub(super) pressure_ns: u64,
}
