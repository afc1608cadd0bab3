//! The descriptor table: for each descriptor number, whether its calls are
//! routed, and to which file.
//!
//! A descriptor is looked at lazily, the first time one of the hooked I/O
//! calls meets it: `F_GETFL` (opened with O_DIRECT?), `/proc/self/fd/N`
//! (does its path match `IOPATH_FILES`?), `fstat` (a regular file or a
//! block device?). So descriptors opened before the library was loaded, or
//! through calls it does not hook, are treated like any other. The answer
//! is kept until the number is closed or reused: every hooked call that
//! closes or creates a descriptor forgets it (`open`, `close`, `dup2`, ...).
//!
//! Each number has one word: a generation (bumped when the number is
//! forgotten) and a state. A look that raced with a close stores nothing
//! (the generation moved), so a closed file's route never lands on the
//! number's next owner.

use crate::files::{FileEntry, entry_for};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// Descriptors at or above this number are never routed.
pub const MAX_FD: usize = 1 << 16;

const UNKNOWN: u32 = 0;
const PLAIN: u32 = 1;
const ROUTED: u32 = 2;
const STATE_BITS: u32 = 2;
const STATE_MASK: u32 = (1 << STATE_BITS) - 1;

static WORDS: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];
/// The routed descriptors: taken on a program's thread only in a [`crate::Section`].
static ROUTES: RwLock<BTreeMap<i32, Route>> = RwLock::new(BTreeMap::new());

/// A routed descriptor.
#[derive(Clone)]
pub struct Route {
    /// Its file.
    pub entry: Arc<FileEntry>,
    /// Opened with O_APPEND (writes at the file position go to the C library).
    pub append: bool,
}

fn word(fd: i32) -> Option<&'static AtomicU32> {
    usize::try_from(fd).ok().and_then(|i| WORDS.get(i))
}

/// The route of `fd`, looking at it first if it is new.
pub fn lookup(fd: i32) -> Option<Route> {
    let w = word(fd)?;
    let seen = w.load(Ordering::Acquire);
    match seen & STATE_MASK {
        PLAIN => None,
        ROUTED => {
            let _section = crate::Section::enter();
            ROUTES.read().unwrap_or_else(|e| e.into_inner()).get(&fd).cloned()
        }
        _ => probe(fd, w, seen),
    }
}

/// Marks `fd` as never routed (a descriptor iopath opened for itself).
pub fn mark_plain(fd: i32) {
    if let Some(w) = word(fd) {
        forget(fd);
        let seen = w.load(Ordering::Acquire);
        let _ = w.compare_exchange(seen, (seen & !STATE_MASK) | PLAIN, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Forgets what is known of `fd` (closed, or about to be replaced).
pub fn forget(fd: i32) {
    let Some(w) = word(fd) else { return };
    let old = w
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some((((v >> STATE_BITS) + 1) << STATE_BITS) | UNKNOWN));
    if old.is_ok_and(|v| v & STATE_MASK == ROUTED) {
        let section = crate::Section::enter();
        let removed = ROUTES.write().unwrap_or_else(|e| e.into_inner()).remove(&fd);
        drop(section);
        drop(removed); // outside the lock: the last descriptor of a file closes its engine
    }
}

/// Forgets every routed descriptor in `first..=last`.
pub fn forget_range(first: u32, last: u32) {
    let section = crate::Section::enter();
    let fds: Vec<i32> = ROUTES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .copied()
        .filter(|&fd| (first..=last).contains(&(fd as u32)))
        .collect();
    drop(section);
    for fd in fds {
        forget(fd);
    }
}

/// Every routed descriptor, with its route.
pub fn routed() -> Vec<(i32, Route)> {
    let _section = crate::Section::enter();
    ROUTES.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect()
}

fn probe(fd: i32, w: &AtomicU32, seen: u32) -> Option<Route> {
    let decided = decide(fd);
    let state = if decided.is_some() { ROUTED } else { PLAIN };
    let section = crate::Section::enter();
    let mut routes = ROUTES.write().unwrap_or_else(|e| e.into_inner());
    // Store only if nobody closed or reused the number while we looked.
    if w.compare_exchange(seen, (seen & !STATE_MASK) | state, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        && let Some(route) = &decided
    {
        let displaced = routes.insert(fd, route.clone());
        drop(routes);
        drop(section);
        drop(displaced); // (outside the lock: the last descriptor of a file closes its engine)
    }
    decided
}

/// The routed descriptors' table, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::rwlock(&ROUTES)
}

/// Whether `fd` should be routed, and to which file.
fn decide(fd: i32) -> Option<Route> {
    // SAFETY: F_GETFL reads the descriptor's flags.
    let flags = unsafe { crate::real::fcntl(fd, libc::F_GETFL, 0) };
    if flags < 0 {
        return None;
    }
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let path = path.to_str()?;
    let config = crate::config();
    if !config.wants(path) {
        return None;
    }
    if flags & libc::O_DIRECT == 0 {
        crate::log(&format!("fd {fd} {path}: not routed: opened without O_DIRECT"));
        return None;
    }
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFBLK {
        crate::log(&format!("fd {fd} {path}: not routed: not a regular file or a block device"));
        return None;
    }
    let access = flags & libc::O_ACCMODE;
    let writable = access == libc::O_WRONLY || access == libc::O_RDWR;
    let dev = if kind == libc::S_IFBLK { st.st_rdev } else { st.st_dev };
    let entry = entry_for(dev, st.st_ino, writable, path);
    crate::log(&format!("fd {fd} {path}: routed through {}", config.path));
    Some(Route { entry, append: flags & libc::O_APPEND != 0 })
}
