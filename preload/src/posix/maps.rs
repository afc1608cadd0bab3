//! Memory maps of mounted files: `mmap`, `mmap64`, `munmap`, `msync` and `mremap`.
//!
//! The kernel cannot map a file it does not hold, so a mounted file's map
//! is anonymous or shared memory the interposer fills:
//!
//! - a private map is a copy of the file's bytes ([`map_private`]), which
//!   is what the kernel's `MAP_PRIVATE` shows until the program writes a
//!   page (a later change of the file is not seen; POSIX leaves that
//!   unspecified). git reads its config, index and packs so. (The
//!   dynamic loader maps with its own system calls: a program or library
//!   stored on a mount is run or loaded from a memfd copy instead,
//!   `processes.rs` and `libraries.rs`.)
//! - a shared map is the memory of a mirror of the file's range
//!   (`iopath::fs::mirror`): every write and truncate of the file in this
//!   process shows in it before the call returns, as in a kernel mapping's
//!   pages. One the program may write is the file's truth for its range:
//!   reads of the file see what was stored, and `msync`, an `fsync` of the
//!   file, `munmap` of its last page and the process's exit write it into
//!   the file. SQLite's WAL index (`-shm`), LMDB's lock file, Python's
//!   `mmap`. The mirror holds the file open, so the mount is not lent to
//!   another process while the map lasts (as while a record lock is held):
//!   no other process can change the file meanwhile. `mremap` of a whole
//!   such map makes it anew from a mirror of the new length (a mirror's
//!   memory cannot grow); of part of one it is EINVAL.

use super::{errno_of, on_fd};
use crate::mount::Description;
use crate::real;
use iopath::sys::page_size;
use libc::{c_int, c_void, off_t, size_t};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Map flags a map of the interposer's memory keeps (the rest describe a file mapping).
const KEPT_MAP_FLAGS: c_int =
    libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE | libc::MAP_POPULATE | libc::MAP_LOCKED;

/// The arguments of an `mmap` call but its descriptor.
#[derive(Clone, Copy)]
struct MapCall {
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    offset: off_t,
}

/// What every map of a mounted file checks first, as the kernel does.
fn check_map(d: &Description, len: size_t, offset: off_t) -> Result<(), c_int> {
    if len == 0 || offset < 0 || !(offset as usize).is_multiple_of(page_size()) {
        return Err(libc::EINVAL);
    }
    if !d.readable() {
        return Err(libc::EACCES);
    }
    Ok(())
}

/// A private mapping of a mounted file: anonymous memory holding a copy of
/// the file's bytes from `offset` (zeros past its end).
fn map_private(d: &Description, call: MapCall) -> Result<*mut c_void, c_int> {
    let MapCall { addr, len, prot, flags, offset } = call;
    check_map(d, len, offset)?;
    let file = d.file().map_err(|_| libc::ENODEV)?;
    let anonymous = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (flags & KEPT_MAP_FLAGS);
    // SAFETY: an anonymous mapping where the caller asked for one.
    let p = unsafe { real::mmap(addr, len, libc::PROT_READ | libc::PROT_WRITE, anonymous, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(super::last_errno());
    }
    // SAFETY: the mapping just made: `len` writable bytes of ours.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset as u64 + done as u64) {
            Ok(0) => break, // past the end: the anonymous memory's zeros
            Ok(n) => done += n,
            Err(e) => {
                // SAFETY: the mapping made above, unmapped once.
                unsafe { libc::munmap(p, len) };
                return Err(errno_of(&e));
            }
        }
    }
    // SAFETY: the mapping made above.
    if prot != libc::PROT_READ | libc::PROT_WRITE && unsafe { libc::mprotect(p, len, prot) } != 0 {
        let errno = super::last_errno();
        // SAFETY: as above.
        unsafe { libc::munmap(p, len) };
        return Err(errno);
    }
    Ok(p)
}

/// A shared mapping of a mounted file: the memory of a mirror of `len`
/// bytes from `offset` (writable if the program may store into the map),
/// mapped where the program asked, kept until the program unmaps it
/// ([`MAPPED`]).
fn map_shared(d: &Description, call: MapCall, writable: bool) -> Result<*mut c_void, c_int> {
    let MapCall { addr, len, prot, flags, offset } = call;
    check_map(d, len, offset)?;
    let file = d.file().map_err(|_| libc::ENODEV)?;
    let mirror = if writable { file.mirror_writable(offset as u64, len) } else { file.mirror(offset as u64, len) }
        .map_err(|e| errno_of(&e))?;
    let shared = libc::MAP_SHARED | (flags & KEPT_MAP_FLAGS);
    // SAFETY: a shared mapping of the mirror's memory where the caller asked.
    let p = unsafe { real::mmap(addr, len, prot, shared, mirror.fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(super::last_errno());
    }
    crate::log(&format!(
        "shared {} map of {} ({len} bytes at {offset}): follows the file; keeps the mount here until unmapped",
        if writable { "writable" } else { "read-only" },
        String::from_utf8_lossy(&d.path)
    ));
    let stale = register(&mut MAPPED.lock().unwrap_or_else(|e| e.into_inner()), p, len, prot, mirror);
    // Dropped outside the lock (a mirror's drop unmaps its memory through our hook).
    let _inside = crate::Inside::enter();
    drop(stale);
    Ok(p)
}

/// Adds the map of `mirror` the program has at `p` to the registry, with
/// a watch on the pages it stores into (a writable one). Maps the registry
/// still holds where the new one lies were unmapped past the hooks (a raw
/// `munmap`): they are let go. Returns what the caller drops outside the
/// registry's lock.
#[must_use]
fn register(
    mapped: &mut Vec<Mapped>,
    p: *mut c_void,
    len: usize,
    prot: c_int,
    mirror: iopath::fs::mirror::Mirror,
) -> Vec<Mapped> {
    let start = p as usize;
    let end = start + len.div_ceil(page_size()) * page_size();
    let stale = forget(mapped, &(start..end));
    if mirror.writable() {
        let watched = mirror.watch_writes(p.cast());
        crate::log(if watched {
            "its stores are watched: a write-back looks at the pages stored into since the last"
        } else {
            "its stores cannot be watched here (Linux 6.7's userfaultfd WP_ASYNC and PAGEMAP_SCAN): every write-back looks at every page"
        });
    }
    #[allow(clippy::single_range_in_vec_init)] // (a list of ranges that starts with one)
    mapped.push(Mapped { base: start, prot, left: vec![start..end], mirror: Arc::new(mirror) });
    MAPS.store(mapped.len(), Ordering::Release);
    stale
}

/// Takes `gone` out of every map in the registry and returns the maps
/// wholly gone. Any map it touches stops watching its stores: a page
/// unmapped is no longer marked, so its write-backs look at every page.
fn forget(mapped: &mut Vec<Mapped>, gone: &Range<usize>) -> Vec<Mapped> {
    for m in mapped.iter_mut() {
        if m.left.iter().any(|r| r.start < gone.end && gone.start < r.end) {
            m.mirror.unwatch();
            m.left = m.left.drain(..).flat_map(|r| subtract(r, gone)).collect();
        }
    }
    let (empty, kept): (Vec<Mapped>, Vec<Mapped>) = mapped.drain(..).partition(|m| m.left.is_empty());
    *mapped = kept;
    MAPS.store(mapped.len(), Ordering::Release);
    empty
}

/// A program's shared map of a mounted file, while any of it is mapped.
struct Mapped {
    /// Where the map began (the mirror's first byte).
    base: usize,
    /// The protection it was made with (a map `mremap` moves is made anew with it).
    prot: c_int,
    /// The address ranges still mapped.
    left: Vec<Range<usize>>,
    /// Keeps the memory following the file (and the file open); shared with
    /// a write-back under way, which runs without the registry's lock.
    mirror: Arc<iopath::fs::mirror::Mirror>,
}

/// The program's shared maps of mounted files.
static MAPPED: Mutex<Vec<Mapped>> = Mutex::new(Vec::new());
/// The registry, held across a fork ([`crate::fork_holds`] says in which
/// order: not a leaf, its holder takes the kernel's write-watch lock).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&MAPPED)
}

/// How many: `munmap` looks no further when there are none.
static MAPS: AtomicUsize = AtomicUsize::new(0);

/// `[start, start + len)` no longer maps what it did (unmapped, or mapped
/// over with `MAP_FIXED`): maps of mounted files wholly gone let their
/// mirrors go.
fn unmapped(start: usize, len: usize) {
    if MAPS.load(Ordering::Acquire) == 0 || crate::inside() {
        return;
    }
    let gone = start..start.saturating_add(len.div_ceil(page_size()) * page_size());
    let released = forget(&mut MAPPED.lock().unwrap_or_else(|e| e.into_inner()), &gone);
    // Dropped outside the lock: a mirror's drop unmaps its own memory (through this hook).
    let _inside = crate::Inside::enter();
    drop(released);
}

/// The writable mirrors of the maps that overlap `[start, start + len)`
/// (all of them for `None`), each with the part of it in the range (bytes
/// from its start), taken out of the registry's lock: a write-back takes
/// the file's lock, and a thread holding that may unmap memory.
fn writable_mirrors(within: Option<Range<usize>>) -> Vec<(Arc<iopath::fs::mirror::Mirror>, Range<usize>)> {
    if MAPS.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
    let part = |m: &Mapped| {
        let whole = m.base..m.base + m.mirror.len();
        let part = match &within {
            None => whole,
            Some(w) => w.start.max(whole.start)..w.end.min(whole.end),
        };
        (part.start < part.end).then(|| part.start - m.base..part.end - m.base)
    };
    mapped.iter().filter(|m| m.mirror.writable()).filter_map(|m| part(m).map(|p| (Arc::clone(&m.mirror), p))).collect()
}

/// Whether any map of a mounted file stands in this process.
pub fn any() -> bool {
    MAPS.load(Ordering::Acquire) > 0
}

/// Writes every writable map of a mounted file into its file: at exit and
/// before an exec (the maps go with the process image), before the mounts
/// are committed. Errors are said; nothing else can be done with them.
pub fn write_back_all() {
    for (mirror, _) in writable_mirrors(None) {
        if let Err(e) = mirror.sync() {
            crate::say(&format!("a shared map's bytes could not be written into its file: {e}"));
        }
    }
}

/// What is left of `r` without `gone`: none, one or two ranges.
fn subtract(r: Range<usize>, gone: &Range<usize>) -> Vec<Range<usize>> {
    if gone.end <= r.start || r.end <= gone.start {
        return vec![r];
    }
    [r.start..gone.start, gone.end..r.end].into_iter().filter(|x| x.start < x.end).collect()
}

/// In a child just forked: the maps are the parent's (the child cannot use
/// its mount): forgotten, never dropped. The child's copies of the maps
/// stay as they are and no longer follow the file.
pub fn in_child_after_fork() {
    if MAPS.load(Ordering::Acquire) == 0 {
        return;
    }
    if let Ok(mut mapped) = MAPPED.try_lock() {
        std::mem::forget(std::mem::take(&mut *mapped));
    }
    MAPS.store(0, Ordering::Release);
}

/// The bits of `mmap`'s flags that say which kind of map it is.
const MAP_TYPE: c_int = 0x0f;

/// The flags `MAP_SHARED_VALIDATE` accepts on a file that is not persistent
/// memory (the kernel's `LEGACY_MAP_MASK`); any other is EOPNOTSUPP
/// (`MAP_FIXED_NOREPLACE` too: the kernel's mask predates it).
const VALIDATED_FLAGS: c_int = libc::MAP_SHARED
    | libc::MAP_PRIVATE
    | libc::MAP_FIXED
    | libc::MAP_ANONYMOUS
    | libc::MAP_DENYWRITE
    | libc::MAP_EXECUTABLE
    | 0x0400_0000 // MAP_UNINITIALIZED
    | libc::MAP_GROWSDOWN
    | libc::MAP_LOCKED
    | libc::MAP_NORESERVE
    | libc::MAP_POPULATE
    | libc::MAP_NONBLOCK
    | libc::MAP_STACK
    | libc::MAP_HUGETLB
    | 0x40 // MAP_32BIT (x86-64)
    | 0x80 // MAP_ABOVE4G
    | libc::MAP_HUGE_2MB
    | libc::MAP_HUGE_1GB;

/// `MAP_SYNC` (with `MAP_SHARED_VALIDATE`) asks for a map whose stores are
/// durable once out of the CPU's caches, which only persistent memory
/// (DAX) gives; for any other file the kernel says EOPNOTSUPP, and so does
/// this. A program that gets such a map takes the file for persistent
/// memory and stops calling fsync: MariaDB 10.11 then writes its redo log
/// by stores into the map and a cache flush, and a mirror's stores reach
/// the file only at msync, fsync, munmap or exit, so every commit it
/// acknowledged since would be lost with the process. Refused, it writes
/// the log with pwrite and fsync, as on ext4.
fn refuse_map_sync(d: &Description) -> c_int {
    crate::log(&format!(
        "mmap of {} with MAP_SYNC: EOPNOTSUPP (not persistent memory; the program falls back to writes and fsync)",
        String::from_utf8_lossy(&d.path)
    ));
    libc::EOPNOTSUPP
}

macro_rules! hook_mmap {
    ($($name:ident),*) => {$(
        /// `mmap`: a private mapping of a mounted file is a copy of its bytes
        /// ([`map_private`]), a shared one follows the file ([`map_shared`]);
        /// anything else is the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void {
            if flags & libc::MAP_FIXED != 0 {
                // Whatever it maps replaces what was there.
                unmapped(addr as usize, len);
            }
            if flags & libc::MAP_ANONYMOUS == 0 {
                let call = MapCall { addr, len, prot, flags, offset };
                let mapped = on_fd(fd, Err, |d| {
                    match flags & MAP_TYPE {
                        libc::MAP_SHARED | libc::MAP_PRIVATE => {}
                        libc::MAP_SHARED_VALIDATE if flags & libc::MAP_SYNC != 0 => return Err(refuse_map_sync(d)),
                        // The kernel's check: a flag it does not know is refused, not ignored.
                        libc::MAP_SHARED_VALIDATE if flags & !VALIDATED_FLAGS != 0 => return Err(libc::EOPNOTSUPP),
                        libc::MAP_SHARED_VALIDATE => {}
                        _ => return Err(libc::EINVAL), // (MAP_DROPPABLE is for anonymous maps only)
                    }
                    if flags & MAP_TYPE == libc::MAP_PRIVATE {
                        return map_private(d, call);
                    }
                    if prot & libc::PROT_WRITE == 0 {
                        return map_shared(d, call, false);
                    }
                    if !d.readable() || !d.writable() {
                        return Err(libc::EACCES); // (the kernel's answer: opened for both or not at all)
                    }
                    map_shared(d, call, true)
                });
                match mapped {
                    Some(Ok(p)) => return p,
                    Some(Err(e)) => {
                        crate::set_errno(e);
                        return libc::MAP_FAILED;
                    }
                    None => {}
                }
            }
            // SAFETY: passed on.
            unsafe { real::$name(addr, len, prot, flags, fd, offset) }
        }
    )*};
}
hook_mmap!(mmap, mmap64);

/// `munmap`: the system call (the C library's is nothing more), then the
/// maps of mounted files it ends let their mirrors go ([`unmapped`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: passed on as the C library's munmap passes it.
    let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) } as c_int;
    if r == 0 {
        unmapped(addr as usize, len);
    }
    r
}

/// `msync`: the system call, then the writable maps of mounted files in
/// the range are written into their files (EIO if one cannot be).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    // SAFETY: passed on as the C library's msync passes it.
    let r = unsafe { libc::syscall(libc::SYS_msync, addr, len, flags) } as c_int;
    if r != 0 || crate::inside() {
        return r;
    }
    let start = addr as usize;
    let mirrors = writable_mirrors(Some(start..start.saturating_add(len)));
    if mirrors.is_empty() {
        return r;
    }
    let _inside = crate::Inside::enter();
    let failed = {
        let _errno = crate::KeepErrno::new();
        mirrors.iter().filter(|(m, part)| m.sync_range(part.start, part.len()).is_err()).count()
    };
    if failed == 0 {
        0
    } else {
        crate::set_errno(libc::EIO);
        -1
    }
}

/// `mremap`: of a whole shared map of a mounted file, a map of a new mirror
/// of the new length ([`remap_mirror`]); anything else is the system
/// call's. Declared with the optional fifth argument (stable Rust cannot
/// define a variadic function): it is read only with `MREMAP_FIXED`, when
/// the caller passed it, and integer arguments sit where a fixed call puts
/// them on x86-64 and aarch64.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_size: size_t,
    new_size: size_t,
    flags: c_int,
    new_address: *mut c_void,
) -> *mut c_void {
    let target = if flags & libc::MREMAP_FIXED != 0 { new_address } else { std::ptr::null_mut() };
    if MAPS.load(Ordering::Acquire) > 0 && !crate::inside() {
        match remap_mirror(old as usize, old_size, new_size, flags, target) {
            Some(Ok(p)) => return p,
            Some(Err(e)) => {
                crate::set_errno(e);
                return libc::MAP_FAILED;
            }
            None => {}
        }
    }
    // SAFETY: passed on as the C library's mremap passes it.
    unsafe { libc::syscall(libc::SYS_mremap, old, old_size, new_size, flags, target) as *mut c_void }
}

/// A remap of `[old, old + old_size)` if it touches a shared map of a
/// mounted file: the memory of a mirror cannot grow (its size is sealed),
/// so a whole map is made anew from a new mirror of the new length (the
/// old one written back first), where the kernel's mremap would have put
/// it (in place if it shrinks), and the old map goes. Part of such a map is EINVAL (said); growing
/// without `MREMAP_MAYMOVE` is ENOMEM, as where the kernel has no room.
fn remap_mirror(
    old: usize,
    old_size: usize,
    new_size: usize,
    flags: c_int,
    target: *mut c_void,
) -> Option<Result<*mut c_void, c_int>> {
    let page = page_size();
    let old_range = old..old.saturating_add(old_size.div_ceil(page) * page);
    let (mirror, prot) = {
        let mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
        let m = mapped.iter().find(|m| m.left.iter().any(|r| r.start < old_range.end && old_range.start < r.end))?;
        let whole = m.base..m.base + m.mirror.len().div_ceil(page) * page;
        if m.base != old || old_range != whole || m.left != [whole.clone()] {
            crate::log("mremap of part of a shared map of a mounted file: EINVAL (remap it whole)");
            return Some(Err(libc::EINVAL));
        }
        (Arc::clone(&m.mirror), m.prot)
    };
    let target_range = target as usize..(target as usize).saturating_add(new_size);
    if new_size == 0 || (!target.is_null() && target_range.start < old_range.end && old_range.start < target_range.end)
    {
        return Some(Err(libc::EINVAL)); // (the kernel's answer to a target over the old map too)
    }
    let new_pages_end = old + new_size.div_ceil(page) * page;
    if flags & libc::MREMAP_MAYMOVE == 0 && new_pages_end > old_range.end {
        return Some(Err(libc::ENOMEM));
    }
    // A map that shrinks stays where it is, as the kernel's does (without
    // MREMAP_MAYMOVE a program counts on it): the new one replaces its start.
    let (target, tail) = if target.is_null() && new_pages_end <= old_range.end {
        (old as *mut c_void, new_pages_end..old_range.end)
    } else {
        (target, old_range.clone())
    };
    let _inside = crate::Inside::enter();
    let made = mirror.sync().and_then(|()| mirror.resized(new_size));
    // Its map is about to go (or be mapped over): what it stores from here on is
    // found by looking at every page (its drop writes it back once more).
    mirror.unwatch();
    let fresh = match made {
        Ok(fresh) => fresh,
        Err(e) => return Some(Err(errno_of(&e))),
    };
    let fixed = if target.is_null() { 0 } else { libc::MAP_FIXED };
    // SAFETY: a shared mapping of the new mirror's memory, where the caller asked if it did.
    let p = unsafe { real::mmap(target, new_size, prot, libc::MAP_SHARED | fixed, fresh.fd(), 0) };
    if p == libc::MAP_FAILED {
        return Some(Err(super::last_errno()));
    }
    // The old map goes (its mirror with it, written back again: nothing new by now).
    let (released, stale) = {
        let mut mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
        let gone = mapped.iter().position(|m| Arc::ptr_eq(&m.mirror, &mirror));
        let released = gone.map(|i| mapped.swap_remove(i));
        (released, register(&mut mapped, p, new_size, prot, fresh))
    };
    drop(stale);
    if !tail.is_empty() {
        // SAFETY: what is left of the old map beside the new one, ours to unmap now.
        unsafe { libc::syscall(libc::SYS_munmap, tail.start as *mut c_void, tail.len()) };
    }
    drop(released);
    drop(mirror);
    Some(Ok(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_of_a_range_without_another() {
        assert_eq!(subtract(0..10, &(10..20)), vec![0..10]);
        assert_eq!(subtract(10..20, &(0..10)), vec![10..20]);
        assert_eq!(subtract(0..30, &(10..20)), vec![0..10, 20..30]);
        assert_eq!(subtract(0..30, &(0..20)), vec![20..30]);
        assert_eq!(subtract(10..20, &(0..30)), Vec::<Range<usize>>::new());
    }
}
