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
use std::io::Write;
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

/// Says one decision of `who` (a policy's name), if anyone listens.
pub fn say(who: &str, what: Arguments<'_>) {
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
        STDERR => {
            let second = at.as_secs();
            let packed = THIS_SECOND.fetch_add(1, Ordering::Relaxed);
            let (was, count) = (packed >> 16, packed & 0xffff);
            if was != second {
                THIS_SECOND.store(second << 16 | 1, Ordering::Relaxed);
                let left = LEFT_OUT.swap(0, Ordering::Relaxed);
                if left > 0 {
                    let _ = writeln!(std::io::stderr(), "iopath: ({left} more decisions not shown)");
                }
            } else if count >= LINES_PER_SECOND {
                LEFT_OUT.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let _ = writeln!(std::io::stderr(), "iopath: {line}");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collected_lines_come_back_once_and_are_capped() {
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
}
