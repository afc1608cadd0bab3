//! Written-page watches: which pages of a range of this process's memory
//! were stored into since the last look, from the kernel's page tables.
//!
//! A writable mirror ([`super::mirror`]) is written back into its file at
//! every `msync`, `fsync`, unmap and exit. Without knowing which pages the
//! program stored into, a write-back compares every page of the range with
//! the file's: LMDB with `writemap`, which msyncs its whole map at every
//! commit, took 0.44 s where ext4 took 0.05 s. A watch makes it the pages
//! written since the last write-back.
//!
//! - **How** (Linux 6.7 and later): the range is registered with a
//!   userfaultfd for write protection in the mode the kernel resolves
//!   itself (`UFFD_FEATURE_WP_ASYNC`: a store into a protected page is never
//!   stopped, the page is only marked written), and `PAGEMAP_SCAN` on
//!   `/proc/self/pagemap` lists the written pages and protects them again in
//!   the same call. A store by the kernel on the program's behalf (a `read`
//!   into the map) counts as any other. One userfaultfd and one pagemap
//!   descriptor per process, made at the first watch; the registration goes
//!   with the mapping when it is unmapped.
//!   A page whose mapping the kernel dropped after a store (MADV_DONTNEED,
//!   reclaim) reads as written; one never stored into keeps a marker.
//! - **When it cannot be trusted**, [`WriteWatch::take_written`] says so and
//!   the caller compares everything, as without a watch: the kernel lacks the
//!   features (no watch is made), part of the range is no longer mapped or
//!   was mapped over (the scan fails or `msync` says ENOMEM), the owner said
//!   so ([`WriteWatch::distrust`]: the program's map went), or the process
//!   forked since the watch began. A child's stores into memory it shares
//!   with its parent are marked in the child's page tables, which no watch
//!   here reads.

use crate::sys::page_size;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

// The kernel's interface (linux/userfaultfd.h and linux/fs.h of 6.7; the C
// headers and the libc crate here are older).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// _IOWR(0xAA, 0x3F, struct uffdio_api)
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
/// _IOWR(0xAA, 0x00, struct uffdio_register)
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
/// _IOWR(0xAA, 0x06, struct uffdio_writeprotect)
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xC018_AA06;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// _IOWR('f', 16, struct pm_scan_arg)
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    start: u64,
    len: u64,
    mode: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// This process's userfaultfd and pagemap descriptors, with the process
/// they belong to: a forked child's copies speak for its parent's memory.
struct Kernel {
    pid: u32,
    uffd: OwnedFd,
    pagemap: OwnedFd,
}

/// `None` inside: tried in this process and the kernel said no.
static KERNEL: Mutex<Option<Option<Kernel>>> = Mutex::new(None);

/// Forks this process made since its first watch (counted in the parent).
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_in_parent() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The descriptors' lock, held across a fork ([`crate::sys::hold_globals_for_fork`]).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(KERNEL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs `f` with this process's descriptors, made at first use.
fn with_kernel<R>(f: impl FnOnce(&Kernel) -> Option<R>) -> Option<R> {
    let mut kernel = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    // (`Some(None)`: the kernel said no, to this process or to its parent.)
    let ours = match &*kernel {
        Some(Some(k)) => k.pid == pid,
        Some(None) => true,
        None => false,
    };
    if !ours {
        // First use here, or in a child whose copies are its parent's: a child's
        // are left to close at exec or exit (closing one is harmless, but the
        // number is its parent's choice, and nothing here needs it back).
        if let Some(Some(inherited)) = kernel.take() {
            std::mem::forget(inherited);
        }
        static COUNTING: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a parent handler that only does an atomic add.
        COUNTING.call_once(|| unsafe {
            libc::pthread_atfork(None, Some(forked_in_parent), None);
        });
        *kernel = Some(open(pid));
    }
    f(kernel.as_ref()?.as_ref()?)
}

/// This process's userfaultfd in the asynchronous write-protect mode, and
/// its pagemap; `None` where the kernel offers neither.
fn open(pid: u32) -> Option<Kernel> {
    // SAFETY: the system call makes a descriptor; no memory is passed.
    let uffd = crate::sys::own_high(|| unsafe {
        libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY) as libc::c_int
    })
    .ok()?;
    let mut api = UffdioApi { api: UFFD_API, features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED, ioctls: 0 };
    // SAFETY: our descriptor and a struct of the size the request names.
    if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
        return None;
    }
    // SAFETY: a NUL-terminated path.
    let pagemap = crate::sys::own_high(|| unsafe {
        libc::open(c"/proc/self/pagemap".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC)
    })
    .ok()?;
    Some(Kernel { pid, uffd, pagemap })
}

/// A watch on `[start, start + len)` of this process's memory: the pages
/// stored into since it began or since the last [`WriteWatch::take_written`].
#[derive(Debug)]
pub struct WriteWatch {
    start: usize,
    len: usize,
    /// [`FORKS`] when it began.
    forks: u64,
    /// A look failed: trusted no more.
    broken: std::sync::atomic::AtomicBool,
}

impl WriteWatch {
    /// Starts watching `len` bytes at `start` (page aligned, mapped shared or
    /// anonymous). `None` where the kernel cannot (before 6.7, or a kind of
    /// memory it cannot protect).
    pub fn new(start: usize, len: usize) -> Option<WriteWatch> {
        let len = len.div_ceil(page_size()) * page_size();
        if !start.is_multiple_of(page_size()) || len == 0 {
            return None;
        }
        with_kernel(|k| {
            let mut register =
                UffdioRegister { start: start as u64, len: len as u64, mode: UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
            // SAFETY: our descriptor and a struct of the size the request names.
            if unsafe { libc::ioctl(k.uffd.as_raw_fd(), UFFDIO_REGISTER, &mut register) } != 0 {
                return None;
            }
            let mut protect =
                UffdioWriteprotect { start: start as u64, len: len as u64, mode: UFFDIO_WRITEPROTECT_MODE_WP };
            // SAFETY: as above; the range was just registered.
            if unsafe { libc::ioctl(k.uffd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut protect) } != 0 {
                return None;
            }
            Some(WriteWatch { start, len, forks: FORKS.load(Ordering::Relaxed), broken: false.into() })
        })
    }

    /// The pages of `within` (bytes from the watch's start) stored into since
    /// the last look, as byte ranges from the watch's start, each protected
    /// again as it is reported. `None`: the watch cannot say (see the module's
    /// doc), and the caller must look at every page; it says `None` from
    /// then on. A caller that cannot use what it was told (a write-back
    /// that failed) calls [`WriteWatch::distrust`].
    pub fn take_written(&self, within: Range<usize>) -> Option<Vec<Range<usize>>> {
        if self.broken.load(Ordering::Relaxed) || FORKS.load(Ordering::Relaxed) != self.forks {
            return None;
        }
        let page = page_size();
        let from = within.start / page * page;
        let to = within.end.min(self.len).div_ceil(page) * page;
        if from >= to {
            return Some(Vec::new());
        }
        // Still mapped, all of it? The scan passes over holes in silence, and the
        // stores into a page unmapped meanwhile are in the memory all the same
        // (msync's ENOMEM; MS_ASYNC asks nothing more of a shared memory map). The
        // system call itself: inside the interposer, the C library's name is its
        // msync hook, which writes maps of mounted files back.
        let (at, len) = (self.start + from, to - from);
        // SAFETY: only asks about the range; no memory is touched.
        if unsafe { libc::syscall(libc::SYS_msync, at, len, libc::MS_ASYNC) } != 0 {
            self.distrust();
            return None;
        }
        let mut written: Vec<Range<usize>> = Vec::new();
        let mut at = from;
        let looked = with_kernel(|k| {
            let mut regions = [PageRegion::default(); 64];
            while at < to {
                let mut arg = PmScanArg {
                    size: std::mem::size_of::<PmScanArg>() as u64,
                    flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                    start: (self.start + at) as u64,
                    end: (self.start + to) as u64,
                    walk_end: 0,
                    vec: regions.as_mut_ptr() as u64,
                    vec_len: regions.len() as u64,
                    max_pages: 0,
                    category_inverted: 0,
                    category_mask: PAGE_IS_WRITTEN,
                    category_anyof_mask: 0,
                    return_mask: PAGE_IS_WRITTEN,
                };
                // SAFETY: our descriptor, a struct of the size it names, and room for
                // `vec_len` regions.
                let n = unsafe { libc::ioctl(k.pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
                if n < 0 {
                    return None;
                }
                for r in &regions[..n as usize] {
                    let (s, e) = (r.start as usize - self.start, r.end as usize - self.start);
                    match written.last_mut() {
                        Some(last) if last.end == s => *last = last.start..e,
                        _ => written.push(s..e),
                    }
                }
                let walked = arg.walk_end as usize;
                if walked <= self.start + at {
                    return None; // (no progress: never expected)
                }
                at = walked - self.start;
            }
            Some(())
        });
        if looked.is_none() {
            self.distrust();
            return None;
        }
        // Whole pages reported; the caller's range may end inside one.
        for r in &mut written {
            r.start = r.start.max(within.start);
            r.end = r.end.min(within.end);
        }
        written.retain(|r| r.start < r.end);
        Some(written)
    }

    /// From now on [`WriteWatch::take_written`] says `None`.
    pub fn distrust(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared memory map of `pages` pages, its start, and whether this
    /// kernel can watch it (6.7 and later must).
    fn shared_map(pages: usize) -> (*mut u8, usize) {
        let len = pages * page_size();
        // SAFETY: a NUL-terminated name; a new descriptor, sized, mapped, and closed
        // (the map keeps the memory).
        unsafe {
            let fd = libc::memfd_create(c"watch-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            assert_ne!(p, libc::MAP_FAILED);
            libc::close(fd);
            (p.cast(), len)
        }
    }

    /// The kernel is at least 6.7, where a watch must be made.
    fn kernel_can_watch() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.trim().split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (6, 7)
    }

    /// The tests run one at a time: a fork in one makes the others' watches untrusted.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    fn watch(p: *mut u8, len: usize) -> Option<WriteWatch> {
        let watch = WriteWatch::new(p as usize, len);
        assert_eq!(watch.is_some(), kernel_can_watch(), "a watch where the kernel can, none where it cannot");
        watch
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // (lists of ranges, some of one)
    fn a_watch_tells_the_pages_stored_into_once_each() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (p, len) = shared_map(64);
        let page = page_size();
        // SAFETY: reads of our own map, before the watch (they map pages, store nothing).
        for i in 0..64 {
            // SAFETY: as above.
            unsafe { p.add(i * page).read_volatile() };
        }
        let Some(w) = watch(p, len) else { return };
        assert_eq!(w.take_written(0..len), Some(vec![]));
        // SAFETY: stores into our own map.
        unsafe {
            p.add(page + 7).write_volatile(1);
            p.add(10 * page).write_volatile(1);
            p.add(11 * page + page - 1).write_volatile(1);
            p.add(63 * page).write_volatile(1);
        }
        // The kernel's store on our behalf counts too.
        // SAFETY: a read of /dev/zero into 16 bytes of page 40 of our map.
        unsafe {
            let fd = libc::open(c"/dev/zero".as_ptr(), libc::O_RDONLY);
            assert_eq!(libc::read(fd, p.add(40 * page).cast(), 16), 16);
            libc::close(fd);
        }
        // Only part of the range asked: the rest stays marked.
        assert_eq!(w.take_written(0..12 * page), Some(vec![page..2 * page, 10 * page..12 * page]));
        assert_eq!(w.take_written(0..len), Some(vec![40 * page..41 * page, 63 * page..64 * page]));
        assert_eq!(w.take_written(0..len), Some(vec![]));
        // A range ending inside a page: that page, cut there.
        // SAFETY: a store into our own map.
        unsafe { p.add(5 * page).write_volatile(2) };
        assert_eq!(w.take_written(page..5 * page + 100), Some(vec![5 * page..5 * page + 100]));
        // A page stored into and then dropped from the page tables (its bytes are
        // still in the memory) is told as written.
        // SAFETY: a store into our own map, then advice on that page of it.
        unsafe {
            p.add(20 * page).write_volatile(3);
            assert_eq!(libc::madvise(p.add(20 * page).cast(), page, libc::MADV_DONTNEED), 0);
            assert_eq!(p.add(20 * page).read_volatile(), 3);
        }
        assert_eq!(w.take_written(0..len), Some(vec![20 * page..21 * page]));
        // SAFETY: our own map, unmapped once.
        unsafe { libc::munmap(p.cast(), len) };
    }

    #[test]
    fn a_watch_cannot_tell_once_part_of_its_range_is_unmapped_or_it_is_distrusted() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (p, len) = shared_map(16);
        let page = page_size();
        let Some(w) = watch(p, len) else { return };
        // SAFETY: a store into our own map, then the unmapping of that page only.
        unsafe {
            p.add(3 * page).write_volatile(1);
            assert_eq!(libc::munmap(p.add(3 * page).cast(), page), 0);
        }
        assert_eq!(w.take_written(0..len), None, "a page unmapped past the watch");
        assert_eq!(w.take_written(0..page), None, "once not trusted, never again");
        let (q, len2) = shared_map(4);
        let w2 = WriteWatch::new(q as usize, len2).expect("the kernel watched a map before");
        w2.distrust();
        assert_eq!(w2.take_written(0..len2), None);
        // SAFETY: our own maps, unmapped once (the first one's hole is unmapped already).
        unsafe {
            libc::munmap(p.cast(), len);
            libc::munmap(q.cast(), len2);
        }
    }

    #[test]
    fn a_watch_cannot_tell_once_the_process_has_forked() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (p, len) = shared_map(8);
        let page = page_size();
        let Some(w) = watch(p, len) else { return };
        // SAFETY: the child only stores into the shared map and leaves with _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: a store into the map the child shares with its parent.
            unsafe {
                p.add(2 * page).write_volatile(9);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        // SAFETY: a read of our own map.
        assert_eq!(unsafe { p.add(2 * page).read_volatile() }, 9, "the child's store is in the memory");
        assert_eq!(w.take_written(0..len), None, "but in the child's page tables, not these");
        // SAFETY: our own map, unmapped once.
        unsafe { libc::munmap(p.cast(), len) };
    }
}
