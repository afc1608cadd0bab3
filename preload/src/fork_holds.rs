//! The interposer's own process-wide locks, held by a thread that forks
//! from the fork's prepare handler to after it, so that no child starts
//! with one of them held by a thread it does not have (and then waits for
//! it for ever at its first call that takes it: a child's dlopen of a
//! mounted library waited so for the list of loaded copies, which a thread
//! of the parent was filling at the fork).
//!
//! Each lock here is a *leaf*: its holder takes no other lock and waits for
//! nothing before letting it go (what it displaces is dropped after), so a
//! fork that holds everything else first always gets it at once. The
//! prepare handler takes them last, in this order: the fork gate, the
//! mounts' states, the maps' registry ([`crate::posix::maps`], which takes
//! the kernel's write-watch lock inside it), the core library's locks, then
//! these. The bridges' table of running bridges and their let-go gate are
//! not among them: each is held across a bridge's work, which may wait
//! for the fork gate. A child forked while a parent's thread held one
//! takes a new one instead ([`FreshInChild`]).
//!
//! A fork from a signal handler on a thread that holds one of them would
//! wait for itself: every hold here waits at most [`HOLD_WAIT`], then goes
//! on without that lock (the child may then wait for it, as before).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, RwLock, TryLockError};
use std::time::{Duration, Instant};

/// A lock held across a fork.
pub(crate) type Held = Box<dyn std::any::Any>;

/// How long a fork waits for one of these locks (a leaf's holder lets it
/// go within microseconds, unless it is the forking thread itself).
const HOLD_WAIT: Duration = Duration::from_millis(200);

/// Tries `take` until it gives the lock or [`HOLD_WAIT`] has passed.
fn within_wait(mut take: impl FnMut() -> Option<Held>) -> Option<Held> {
    let start = Instant::now();
    loop {
        if let Some(held) = take() {
            return Some(held);
        }
        if start.elapsed() > HOLD_WAIT {
            return None;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// `lock`, held for a fork (see the module).
pub(crate) fn mutex<T: 'static>(lock: &'static Mutex<T>) -> Option<Held> {
    within_wait(|| match lock.try_lock() {
        Ok(guard) => Some(Box::new(guard)),
        Err(TryLockError::Poisoned(guard)) => Some(Box::new(guard.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    })
}

/// `lock`, held (for writing) for a fork (see the module).
pub(crate) fn rwlock<T: 'static>(lock: &'static RwLock<T>) -> Option<Held> {
    within_wait(|| match lock.try_write() {
        Ok(guard) => Some(Box::new(guard)),
        Err(TryLockError::Poisoned(guard)) => Some(Box::new(guard.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    })
}

/// A process-wide lock held across work that may wait (not a leaf, so not
/// held across a fork). A child forked while one of its parent's threads
/// held it would wait for ever at its first take of it (a thread it does
/// not have holds it): [`FreshInChild::renew_in_child`] gives the child a
/// new one, holding `T::default()`, and leaves the parent's copy (and what
/// it held, the parent's) alone.
pub(crate) struct FreshInChild<T: Default + 'static> {
    /// The lock until a child renews it.
    first: Mutex<T>,
    /// The renewed one (leaked: one per such fork), or null for `first`.
    renewed: AtomicPtr<Mutex<T>>,
}

impl<T: Default + 'static> FreshInChild<T> {
    /// A lock holding `first` (`Mutex::new` of the default, for a static).
    pub(crate) const fn new(first: Mutex<T>) -> Self {
        FreshInChild { first, renewed: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// The lock this process uses.
    pub(crate) fn get(&'static self) -> &'static Mutex<T> {
        let renewed = self.renewed.load(Ordering::Acquire);
        if renewed.is_null() {
            &self.first
        } else {
            // SAFETY: set only from a leaked box, never freed.
            unsafe { &*renewed }
        }
    }

    /// In a child just forked (its only thread is the one that forked): a
    /// new lock if a thread of the parent held this one. Whether it did.
    pub(crate) fn renew_in_child(&'static self) -> bool {
        if !matches!(self.get().try_lock(), Err(TryLockError::WouldBlock)) {
            return false;
        }
        let fresh = Box::into_raw(Box::new(Mutex::new(T::default())));
        self.renewed.store(fresh, Ordering::Release);
        true
    }
}

/// Every leaf lock of the interposer, held (see the module).
pub(crate) fn leaves() -> Vec<Held> {
    let mut held = crate::mount::hold_tables_for_fork();
    held.extend(crate::fds::hold_for_fork());
    held.extend(crate::files::hold_for_fork());
    held.extend(crate::posix::hold_for_fork());
    held.extend(crate::bridge::hold_for_fork());
    held
}
