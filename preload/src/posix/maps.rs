//! Memory maps of mounted files: `mmap`, `mmap64` and `munmap`.
//!
//! The kernel cannot map a file it does not hold, so a mounted file's map
//! is anonymous or shared memory the interposer fills:
//!
//! - a private map is a copy of the file's bytes ([`map_private`]), which
//!   is what the kernel's `MAP_PRIVATE` shows until the program writes a
//!   page (a later change of the file is not seen; POSIX leaves that
//!   unspecified). git reads its config, index and packs so; the dynamic
//!   loader maps programs and libraries stored on a mount so.
//! - a shared map the program cannot write (no `PROT_WRITE`) is the
//!   memory of a mirror of the file's range (`iopath::fs::mirror`): every
//!   write and truncate of the file in this process shows in it before the
//!   call returns, as in a kernel mapping's pages. The mirror holds the
//!   file open, so the mount is not lent to another process while the map
//!   lasts (as while a record lock is held): no other process can change
//!   the file meanwhile. Python's `mmap(..., access=ACCESS_READ)`, Rust's
//!   `memmap2::Mmap`, LMDB's readers. `munmap` of its last page lets the
//!   mirror go (a map moved by `mremap` keeps it until the process ends).
//! - a writable shared map is refused with ENODEV, said on stderr: the
//!   program's stores would not reach the file.

use super::{errno_of, on_fd};
use crate::mount::Description;
use crate::real;
use libc::{c_int, c_void, off_t, size_t};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Says why an mmap of a mounted file fails: the first time always (a
/// program usually reports only its own error, SQLite's "disk I/O error"),
/// later ones with `IOPATH_LOG`. SQLite's WAL index (`-shm`) gets the way out.
fn refuse_mmap(path: &[u8], fd: c_int) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut line = format!(
        "writable shared mmap of {} (fd {fd}) refused with ENODEV: files on an iopath mount can be mapped shared \
         only read only (a private map is a copy)",
        String::from_utf8_lossy(path)
    );
    if path.ends_with(b"-shm") {
        line.push_str(" (SQLite in WAL mode: run PRAGMA locking_mode=EXCLUSIVE before journal_mode=WAL)");
    }
    if SAID.swap(true, Ordering::Relaxed) {
        crate::log(&line);
    } else {
        crate::say(&line);
    }
}

/// Map flags a map of the interposer's memory keeps (the rest describe a file mapping).
const KEPT_MAP_FLAGS: c_int =
    libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE | libc::MAP_POPULATE | libc::MAP_LOCKED;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

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

/// A shared read-only mapping of a mounted file: the memory of a mirror of
/// `len` bytes from `offset`, mapped where the program asked, kept until
/// the program unmaps it ([`MAPPED`]).
fn map_shared_read_only(d: &Description, call: MapCall) -> Result<*mut c_void, c_int> {
    let MapCall { addr, len, prot, flags, offset } = call;
    check_map(d, len, offset)?;
    let mirror = d.file().map_err(|_| libc::ENODEV)?.mirror(offset as u64, len).map_err(|e| errno_of(&e))?;
    let shared = libc::MAP_SHARED | (flags & KEPT_MAP_FLAGS);
    // SAFETY: a shared mapping of the mirror's memory (sealed: never writable) where the caller asked.
    let p = unsafe { real::mmap(addr, len, prot, shared, mirror.fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(super::last_errno());
    }
    crate::log(&format!(
        "shared read-only map of {} ({len} bytes at {offset}): follows the file; keeps the mount here until unmapped",
        String::from_utf8_lossy(&d.path)
    ));
    let start = p as usize;
    let end = start + len.div_ceil(page_size()) * page_size();
    let mut mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
    #[allow(clippy::single_range_in_vec_init)] // (a list of ranges that starts with one)
    mapped.push(Mapped { left: vec![start..end], _mirror: mirror });
    MAPS.store(mapped.len(), Ordering::Release);
    Ok(p)
}

/// A program's shared read-only map of a mounted file, while any of it is mapped.
struct Mapped {
    /// The address ranges still mapped.
    left: Vec<Range<usize>>,
    /// Keeps the memory following the file (and the file open).
    _mirror: iopath::fs::mirror::Mirror,
}

/// The program's shared read-only maps of mounted files.
static MAPPED: Mutex<Vec<Mapped>> = Mutex::new(Vec::new());
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
    let mut released = Vec::new();
    {
        let mut mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
        for m in mapped.iter_mut() {
            m.left = m.left.drain(..).flat_map(|r| subtract(r, &gone)).collect();
        }
        let (empty, kept): (Vec<Mapped>, Vec<Mapped>) = mapped.drain(..).partition(|m| m.left.is_empty());
        *mapped = kept;
        MAPS.store(mapped.len(), Ordering::Release);
        released.extend(empty);
    }
    // Dropped outside the lock: a mirror's drop unmaps its own memory (through this hook).
    let _inside = crate::Inside::enter();
    drop(released);
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

macro_rules! hook_mmap {
    ($($name:ident),*) => {$(
        /// `mmap`: a private mapping of a mounted file is a copy of its bytes
        /// ([`map_private`]), a shared one the program cannot write follows the
        /// file ([`map_shared_read_only`]), a writable shared one is refused
        /// (ENODEV, said on stderr); anything else is the C library's.
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
                    if flags & libc::MAP_SHARED_VALIDATE == libc::MAP_PRIVATE {
                        return map_private(d, call);
                    }
                    if prot & libc::PROT_WRITE == 0 {
                        return map_shared_read_only(d, call);
                    }
                    if !d.readable() || !d.writable() {
                        return Err(libc::EACCES); // (the kernel's answer: opened for both or not at all)
                    }
                    refuse_mmap(&d.path, fd);
                    Err(libc::ENODEV)
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
