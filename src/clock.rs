//! Time: one monotonic nanosecond clock, precise sleeps, and thread CPU usage.
//!
//! Everything in iopath that compares times uses [`now_ns`] (CLOCK_MONOTONIC
//! through the vDSO, ~20 ns), so deadlines computed by the emulated device and
//! latencies measured by the benchmark share one time base. Sleeping threads set
//! their timer slack to 1 ns first: the default 50 µs slack would otherwise be
//! added to every emulated interrupt.
//!
//! In the crate's own tests the clock is a seam: `sim` installs a simulated
//! clock on a thread (and the threads a path starts inherit it), so path
//! logic, emulated device times and timeouts run on deterministic time:
//! every read advances it by a fixed step, a sleep jumps to its deadline.

use crate::sys;
use std::cell::Cell;

/// Nanoseconds on the CLOCK_MONOTONIC clock (in the crate's tests, the
/// thread's simulated clock if one is installed).
#[inline]
pub fn now_ns() -> u64 {
    #[cfg(test)]
    if let Some(t) = sim::read() {
        return t;
    }
    sys::clock_ns(libc::CLOCK_MONOTONIC)
}

thread_local! {
    static SLACK_SET: Cell<bool> = const { Cell::new(false) };
}

/// Sets this thread's timer slack to 1 ns (once per thread) so timed sleeps end
/// as close to their deadline as the kernel allows.
pub fn minimize_timer_slack() {
    SLACK_SET.with(|set| {
        if !set.get() {
            sys::set_timer_slack_ns(1);
            set.set(true);
        }
    });
}

/// Sleeps until the monotonic clock reads at least `deadline_ns` (a real timer
/// wake-up: this is what an interrupt costs on this machine).
pub fn sleep_until_ns(deadline_ns: u64) {
    #[cfg(test)]
    if sim::sleep_until(deadline_ns) {
        return;
    }
    minimize_timer_slack();
    sys::sleep_until_ns(deadline_ns);
}

/// Simulated time for the crate's deterministic tests.
#[cfg(test)]
pub(crate) mod sim {
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A clock that moves only when it is read (by `step_ns` per read) or
    /// slept on (to the deadline), shared by the threads of one test.
    #[derive(Debug)]
    pub(crate) struct SimClock {
        now: AtomicU64,
        step_ns: u64,
    }

    thread_local! {
        static CURRENT: RefCell<Option<Arc<SimClock>>> = const { RefCell::new(None) };
    }

    /// Simulated time on this thread until dropped.
    pub(crate) struct Simulated;

    impl Drop for Simulated {
        fn drop(&mut self) {
            CURRENT.with(|c| *c.borrow_mut() = None);
        }
    }

    /// Installs a simulated clock starting at `start_ns` on this thread.
    pub(crate) fn start(start_ns: u64, step_ns: u64) -> Simulated {
        let clock = Arc::new(SimClock { now: AtomicU64::new(start_ns), step_ns });
        CURRENT.with(|c| *c.borrow_mut() = Some(clock));
        Simulated
    }

    /// The clock of this thread, for a thread it starts to inherit.
    pub(crate) fn current() -> Option<Arc<SimClock>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Installs an inherited clock (if any) on this thread.
    pub(crate) fn inherit(clock: Option<Arc<SimClock>>) {
        CURRENT.with(|c| *c.borrow_mut() = clock);
    }

    pub(super) fn read() -> Option<u64> {
        CURRENT.with(|c| c.borrow().as_ref().map(|clock| clock.now.fetch_add(clock.step_ns, Ordering::SeqCst)))
    }

    pub(super) fn sleep_until(deadline_ns: u64) -> bool {
        CURRENT.with(|c| match c.borrow().as_ref() {
            Some(clock) => {
                clock.now.fetch_max(deadline_ns, Ordering::SeqCst);
                true
            }
            None => false,
        })
    }
}

/// CPU time, context switches and page faults of the calling thread, from `getrusage(RUSAGE_THREAD)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadUsage {
    /// User CPU time in nanoseconds.
    pub user_ns: u64,
    /// System CPU time in nanoseconds.
    pub sys_ns: u64,
    /// Voluntary context switches (the thread slept).
    pub voluntary_ctx: u64,
    /// Involuntary context switches (the thread was preempted).
    pub involuntary_ctx: u64,
    /// Page faults, minor and major (fresh memory shows here).
    pub page_faults: u64,
}

impl ThreadUsage {
    /// Reads the calling thread's usage now.
    pub fn now() -> ThreadUsage {
        let ru = sys::thread_rusage();
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        ThreadUsage {
            user_ns: tv(ru.ru_utime),
            sys_ns: tv(ru.ru_stime),
            voluntary_ctx: ru.ru_nvcsw as u64,
            involuntary_ctx: ru.ru_nivcsw as u64,
            page_faults: (ru.ru_minflt + ru.ru_majflt) as u64,
        }
    }

    /// Usage of another thread of this process, from /proc: its on-CPU time
    /// (from `schedstat`, counted as user time: /proc does not split it finely),
    /// its context switches and page faults. Zero if the thread is gone.
    pub fn of_thread(tid: i32) -> ThreadUsage {
        if tid <= 0 {
            return ThreadUsage::default();
        }
        let base = format!("/proc/self/task/{tid}");
        let cpu_ns = std::fs::read_to_string(format!("{base}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        let status = std::fs::read_to_string(format!("{base}/status")).unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
        };
        // `stat` after the command's closing parenthesis: minflt and majflt are the 8th and 10th fields.
        let stat = std::fs::read_to_string(format!("{base}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let count = |i: usize| after.split_whitespace().nth(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        ThreadUsage {
            user_ns: cpu_ns,
            sys_ns: 0,
            voluntary_ctx: field("voluntary_ctxt_switches:"),
            involuntary_ctx: field("nonvoluntary_ctxt_switches:"),
            page_faults: count(7) + count(9),
        }
    }

    /// The usage accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &ThreadUsage) -> ThreadUsage {
        ThreadUsage {
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            sys_ns: self.sys_ns.saturating_sub(earlier.sys_ns),
            voluntary_ctx: self.voluntary_ctx.saturating_sub(earlier.voluntary_ctx),
            involuntary_ctx: self.involuntary_ctx.saturating_sub(earlier.involuntary_ctx),
            page_faults: self.page_faults.saturating_sub(earlier.page_faults),
        }
    }

    /// Adds another thread's usage to this one.
    pub fn add(&mut self, other: &ThreadUsage) {
        self.user_ns += other.user_ns;
        self.sys_ns += other.sys_ns;
        self.voluntary_ctx += other.voluntary_ctx;
        self.involuntary_ctx += other.involuntary_ctx;
        self.page_faults += other.page_faults;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_sleep_reaches_deadline() {
        let a = now_ns();
        let deadline = a + 200_000;
        sleep_until_ns(deadline);
        let b = now_ns();
        assert!(b >= deadline, "woke at {b}, before deadline {deadline}");
    }

    #[test]
    fn usage_counts_sleeps_as_voluntary_switches() {
        let before = ThreadUsage::now();
        for _ in 0..3 {
            sleep_until_ns(now_ns() + 100_000);
        }
        let used = ThreadUsage::now().since(&before);
        assert!(used.voluntary_ctx >= 3, "{used:?}");
    }

    #[test]
    fn usage_counts_the_page_faults_of_fresh_memory_here_and_from_proc() {
        let len = 64 * 4096;
        // SAFETY: a new private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let before = ThreadUsage::now();
        // SAFETY: our own tid.
        let tid = unsafe { libc::gettid() };
        let seen = ThreadUsage::of_thread(tid);
        for page in 0..64 {
            // SAFETY: inside the mapping made above.
            unsafe { p.cast::<u8>().add(page * 4096).write_volatile(1) };
        }
        let used = ThreadUsage::now().since(&before);
        assert!(used.page_faults >= 64, "{used:?}");
        assert!(ThreadUsage::of_thread(tid).since(&seen).page_faults >= 64);
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(p, len) };
    }
}
