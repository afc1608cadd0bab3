//! The synchronization primitives of the hand-off between threads: the
//! standard library's, or [loom]'s when the crate is built with
//! `RUSTFLAGS="--cfg loom"`, so the same code is model-checked.
//!
//! loom runs a test under every interleaving its atomics, locks and yields
//! allow (up to a preemption bound) and reports a deadlock when every thread
//! waits. The futex a [`Parking`] word sleeps on is modelled by a lock and a
//! condition variable with the same contract (compare-and-sleep is atomic
//! with respect to a wake-up) and no timeout, so a lost wake-up shows up as a
//! deadlock instead of a late return.
//!
//! [loom]: https://docs.rs/loom

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
pub(crate) use std::sync::atomic::Ordering;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Gives the CPU to another runnable thread (a scheduling point under loom).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// A word threads sleep on until it changes: a private futex.
#[derive(Debug, Default)]
pub(crate) struct Parking {
    word: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    changed: loom::sync::Condvar,
}

impl Parking {
    /// The word.
    pub(crate) fn load(&self, order: Ordering) -> u32 {
        self.word.load(order)
    }

    /// Adds to the word.
    pub(crate) fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        self.word.fetch_add(value, order)
    }

    /// Sleeps while the word holds `expected`, until [`Parking::wake_all`]
    /// or `timeout_ns` (returns spuriously too: callers look again).
    pub(crate) fn wait(&self, expected: u32, timeout_ns: Option<u64>) {
        #[cfg(not(loom))]
        crate::sys::futex_wait(&self.word, expected, timeout_ns);
        #[cfg(loom)]
        {
            let _ = timeout_ns;
            let guard = self.lock.lock().expect("parking lock");
            if self.word.load(Ordering::SeqCst) == expected {
                drop(self.changed.wait(guard).expect("parking lock"));
            }
        }
    }

    /// Wakes every thread sleeping in [`Parking::wait`].
    pub(crate) fn wake_all(&self) {
        #[cfg(not(loom))]
        crate::sys::futex_wake_all(&self.word);
        #[cfg(loom)]
        {
            let _guard = self.lock.lock().expect("parking lock");
            self.changed.notify_all();
        }
    }
}
