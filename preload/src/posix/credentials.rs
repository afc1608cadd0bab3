//! Credentials: the owner every mounted file has, and the calls that change it.
//!
//! A mount keeps no owners: every file belongs to the calling process's
//! effective user and group (`metadata.rs`), read with `geteuid` and
//! `getegid`: two system calls per `stat`, 52,440 of them in a `tar cf` of
//! 8,700 files (`strace -c`). They are read once and kept; `setuid` and the
//! rest of the family below change them through the C library and forget
//! what was kept, so a daemon that drops root after it started (MariaDB's
//! `--user`) sees its files as its new user's. A raw `setuid` system call
//! that bypasses the C library is not seen.

use crate::real;
use libc::{c_int, gid_t, uid_t};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

/// The kept owner, `euid << 32 | egid`; `UNKNOWN` until read (and after a change).
static OWNER: AtomicU64 = AtomicU64::new(UNKNOWN);
const UNKNOWN: u64 = u64::MAX;
/// Changes of credentials so far: an owner read across one is not kept.
static CHANGES: AtomicU32 = AtomicU32::new(0);

/// The effective user and group of the process: every mounted file's owner.
pub(crate) fn owner() -> (uid_t, gid_t) {
    let kept = OWNER.load(SeqCst);
    if kept != UNKNOWN {
        return ((kept >> 32) as uid_t, kept as gid_t);
    }
    let changes = CHANGES.load(SeqCst);
    // SAFETY: no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Kept only if no change began meanwhile; a change that begins after this
    // forgets it again (it counts first, then forgets).
    if CHANGES.load(SeqCst) == changes {
        let _ = OWNER.compare_exchange(UNKNOWN, (uid as u64) << 32 | gid as u64, SeqCst, SeqCst);
    }
    (uid, gid)
}

/// After a call that may have changed the credentials: read them again next time.
fn changed<T>(result: T) -> T {
    CHANGES.fetch_add(1, SeqCst);
    OWNER.store(UNKNOWN, SeqCst);
    result
}

/// Declares pass-through hooks that forget the kept owner once the C
/// library's function returns.
macro_rules! credential_hooks {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// The C library's function; the owner of mounted files is read again after it.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            // SAFETY: passed on.
            changed(unsafe { real::$name($($arg),*) })
        }
    )*};
}

credential_hooks! {
    setuid(uid: uid_t);
    seteuid(uid: uid_t);
    setreuid(ruid: uid_t, euid: uid_t);
    setresuid(ruid: uid_t, euid: uid_t, suid: uid_t);
    setgid(gid: gid_t);
    setegid(gid: gid_t);
    setregid(rgid: gid_t, egid: gid_t);
    setresgid(rgid: gid_t, egid: gid_t, sgid: gid_t);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_the_effective_user_and_is_read_again_after_a_change() {
        // SAFETY: no preconditions.
        let now = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!(owner(), now);
        assert_ne!(OWNER.load(SeqCst), UNKNOWN, "kept");
        assert_eq!(owner(), now);
        // A change to the same user: allowed for anyone, and it forgets what was kept.
        // SAFETY: seteuid to the effective user changes nothing.
        assert_eq!(unsafe { seteuid(now.0) }, 0);
        assert_eq!(OWNER.load(SeqCst), UNKNOWN, "forgotten");
        assert_eq!(owner(), now);
    }
}
