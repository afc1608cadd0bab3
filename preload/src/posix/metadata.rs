//! Metadata: the stat family (stat, lstat, fstat, fstatat and their `64`
//! names, statx, and the `__xstat` forms older binaries call). A mount
//! has no symbolic links, so lstat is stat there. Files belong to the
//! calling process's user; the access time reads as the modification time.

use super::{errno_of, fail, on_fd, on_path};
use crate::mount::{Description, Inside, Mount, Node};
use crate::real;
use iopath::fs::{Kind, Metadata};
use libc::{c_char, c_int, c_uint};

/// What `stat` says of `path` inside a mount.
fn metadata_inside(inside: &Inside) -> Result<Metadata, c_int> {
    let fs = inside.mount.fs()?;
    fs.metadata(&inside.path).map_err(|e| errno_of(&e))
}

/// What `fstat` says of a mounted description.
fn metadata_of(d: &Description) -> Result<Metadata, c_int> {
    match &d.node {
        Node::File(f) => Ok(f.metadata()),
        Node::Dir => d.mount.fs()?.metadata(&d.path).map_err(|e| errno_of(&e)),
    }
}

fn split_ns(ns: u64) -> (i64, i64) {
    ((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as i64)
}

/// Fills a `struct stat` (the same layout as `stat64` on 64-bit Linux).
fn fill(m: &Metadata, mount: &Mount, out: *mut libc::stat) -> c_int {
    if out.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: all-zero is a valid struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = mount.dev;
    st.st_ino = m.ino;
    st.st_mode = m.mode;
    st.st_nlink = m.nlink as _;
    // SAFETY: no preconditions.
    (st.st_uid, st.st_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    st.st_size = m.size as i64;
    st.st_blksize = 4096;
    st.st_blocks = m.blocks as i64;
    (st.st_mtime, st.st_mtime_nsec) = split_ns(m.mtime_ns);
    (st.st_atime, st.st_atime_nsec) = split_ns(m.mtime_ns);
    (st.st_ctime, st.st_ctime_nsec) = split_ns(m.ctime_ns);
    // SAFETY: the caller's buffer holds a struct stat (the C contract).
    unsafe { out.write(st) };
    0
}

fn stat_inside(inside: Inside, out: *mut libc::stat) -> c_int {
    match metadata_inside(&inside) {
        Ok(m) => fill(&m, inside.mount, out),
        Err(e) => fail(e),
    }
}

fn fstat_mounted(d: &Description, out: *mut libc::stat) -> c_int {
    match metadata_of(d) {
        Ok(m) => fill(&m, d.mount, out),
        Err(e) => fail(e),
    }
}

/// fstatat: the descriptor itself with AT_EMPTY_PATH and "", else the path.
fn fstatat_any(dirfd: c_int, path: *const c_char, out: *mut libc::stat, flags: c_int) -> Option<c_int> {
    let empty = !path.is_null() && {
        // SAFETY: a non-NULL path is NUL-terminated.
        unsafe { *path == 0 }
    };
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        return on_fd(dirfd, fail, |d| fstat_mounted(d, out));
    }
    on_path(dirfd, path, fail, |inside| stat_inside(inside, out))
}

macro_rules! hook_stat {
    ($($name:ident: $ty:ty),*) => {$(
        /// `stat`/`lstat`: a mounted path's, or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| stat_inside(inside, out.cast()));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(path, out) })
        }
    )*};
}
hook_stat!(stat: libc::stat, lstat: libc::stat, stat64: libc::stat64, lstat64: libc::stat64);

macro_rules! hook_fstat {
    ($($name:ident: $ty:ty),*) => {$(
        /// `fstat`: a mounted descriptor's, or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, out: *mut $ty) -> c_int {
            // SAFETY: passed on.
            on_fd(fd, fail, |d| fstat_mounted(d, out.cast())).unwrap_or_else(|| unsafe { real::$name(fd, out) })
        }
    )*};
}
hook_fstat!(fstat: libc::stat, fstat64: libc::stat64);

macro_rules! hook_fstatat {
    ($($name:ident: $ty:ty),*) => {$(
        /// `fstatat`: a mounted path's (or descriptor's, with AT_EMPTY_PATH), or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, out: *mut $ty, flags: c_int) -> c_int {
            // SAFETY: passed on.
            fstatat_any(dirfd, path, out.cast(), flags).unwrap_or_else(|| unsafe { real::$name(dirfd, path, out, flags) })
        }
    )*};
}
hook_fstatat!(fstatat: libc::stat, fstatat64: libc::stat64);

macro_rules! hook_xstat {
    ($($name:ident: $ty:ty),*) => {$(
        /// The `__xstat` form of stat/lstat that binaries built against glibc before 2.33 call.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(version: c_int, path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| stat_inside(inside, out.cast()));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(version, path, out) })
        }
    )*};
}
hook_xstat!(__xstat: libc::stat, __lxstat: libc::stat, __xstat64: libc::stat64, __lxstat64: libc::stat64);

macro_rules! hook_fxstat {
    ($($name:ident: $ty:ty),*) => {$(
        /// The `__fxstat` form of fstat.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(version: c_int, fd: c_int, out: *mut $ty) -> c_int {
            // SAFETY: passed on.
            on_fd(fd, fail, |d| fstat_mounted(d, out.cast())).unwrap_or_else(|| unsafe { real::$name(version, fd, out) })
        }
    )*};
}
hook_fxstat!(__fxstat: libc::stat, __fxstat64: libc::stat64);

macro_rules! hook_fxstatat {
    ($($name:ident: $ty:ty),*) => {$(
        /// The `__fxstatat` form of fstatat.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(version: c_int, dirfd: c_int, path: *const c_char, out: *mut $ty, flags: c_int) -> c_int {
            fstatat_any(dirfd, path, out.cast(), flags)
                // SAFETY: passed on.
                .unwrap_or_else(|| unsafe { real::$name(version, dirfd, path, out, flags) })
        }
    )*};
}
hook_fxstatat!(__fxstatat: libc::stat, __fxstatat64: libc::stat64);

/// Fills a `struct statx` with the basic fields.
fn fill_statx(m: &Metadata, mount: &Mount, out: *mut libc::statx) -> c_int {
    if out.is_null() {
        return fail(libc::EFAULT);
    }
    let stamp = |ns: u64| {
        let (s, n) = split_ns(ns);
        // SAFETY: all-zero is a valid timestamp.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = s;
        t.tv_nsec = n as u32;
        t
    };
    // SAFETY: all-zero is a valid struct statx.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    sx.stx_mask = libc::STATX_BASIC_STATS;
    sx.stx_blksize = 4096;
    sx.stx_nlink = m.nlink;
    // SAFETY: no preconditions.
    (sx.stx_uid, sx.stx_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    sx.stx_mode = m.mode as u16;
    sx.stx_ino = m.ino;
    sx.stx_size = m.size;
    sx.stx_blocks = m.blocks;
    sx.stx_atime = stamp(m.mtime_ns);
    sx.stx_mtime = stamp(m.mtime_ns);
    sx.stx_ctime = stamp(m.ctime_ns);
    sx.stx_dev_major = (mount.dev >> 32) as u32;
    sx.stx_dev_minor = mount.dev as u32;
    // SAFETY: the caller's buffer holds a struct statx.
    unsafe { out.write(sx) };
    0
}

/// `statx`: a mounted path's or descriptor's basic fields, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    let empty = !path.is_null() && {
        // SAFETY: a non-NULL path is NUL-terminated.
        unsafe { *path == 0 }
    };
    let mounted = if empty && flags & libc::AT_EMPTY_PATH != 0 {
        on_fd(dirfd, fail, |d| match metadata_of(d) {
            Ok(m) => fill_statx(&m, d.mount, out),
            Err(e) => fail(e),
        })
    } else {
        on_path(dirfd, path, fail, |inside| match metadata_inside(&inside) {
            Ok(m) => fill_statx(&m, inside.mount, out),
            Err(e) => fail(e),
        })
    };
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::statx(dirfd, path, flags, mask, out) })
}

/// Whether a mounted description is a directory (for `fdopendir`).
pub(crate) fn is_dir(d: &Description) -> bool {
    matches!(metadata_of(d), Ok(m) if m.kind == Kind::Dir)
}
