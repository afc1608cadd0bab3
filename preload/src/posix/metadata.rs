//! Metadata: the stat family (stat, lstat, fstat, fstatat and their `64`
//! names, statx, and the `__xstat` forms older binaries call), chmod,
//! utimes, chown, statfs and statvfs, and pathconf. The calls that do not follow a last symbolic
//! link (lstat, `AT_SYMLINK_NOFOLLOW`, lchown) see the link itself. Files
//! belong to the calling process's user (`credentials.rs`); the access time reads as the
//! modification time.

use super::{errno_of, fail, on_fd, on_file_fd, on_path, on_path_nofollow};
use crate::mount::{Description, Inside, Mount};
use crate::real;
use iopath::fs::{Kind, Metadata};
use libc::{c_char, c_int, c_uint};

/// What `stat` says of `path` inside a mount: its links are resolved (by
/// [`on_path`]; a last one is there only where the call does not follow it,
/// and then it is the link that is described).
fn metadata_inside(inside: &Inside) -> Result<Metadata, c_int> {
    let fs = inside.mount.fs()?;
    fs.symlink_metadata(&inside.path).map_err(|e| errno_of(&e))
}

/// [`on_path_nofollow`] for the calls on a path's metadata (`lstat`,
/// `lchown`, `lgetxattr`, ...): a last link is the link itself, except in a
/// path that ends in `/`, which the kernel follows (`lstat("link/")`
/// describes the directory the link leads to, and a link that leads out of
/// the mount leads to the kernel's answer there: it was EXDEV).
fn on_path_lstat<R>(
    dirfd: c_int,
    path: *const c_char,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(Inside) -> R,
) -> Option<R> {
    if super::path_bytes(path).is_some_and(|p| p.ends_with(b"/")) {
        on_path(dirfd, path, failed, serve)
    } else {
        on_path_nofollow(dirfd, path, failed, serve)
    }
}

/// [`on_path`], or [`on_path_lstat`] where `flags` hold `AT_SYMLINK_NOFOLLOW`.
fn on_path_flags<R>(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    failed: impl FnOnce(c_int) -> R,
    serve: impl FnOnce(Inside) -> R,
) -> Option<R> {
    if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        on_path_lstat(dirfd, path, failed, serve)
    } else {
        on_path(dirfd, path, failed, serve)
    }
}

/// What `fstat` says of a mounted description.
fn metadata_of(d: &Description) -> Result<Metadata, c_int> {
    match d.file() {
        Ok(f) => Ok(f.metadata()),
        Err(libc::EISDIR) => d.mount.fs()?.metadata(&d.path).map_err(|e| errno_of(&e)),
        Err(e) => Err(e),
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
    (st.st_uid, st.st_gid) = super::credentials::owner();
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
    on_path_flags(dirfd, path, flags, fail, |inside| stat_inside(inside, out))
}

macro_rules! hook_stat {
    ($($name:ident: $ty:ty, $on_path:ident);*) => {$(
        /// `stat`/`lstat`: a mounted path's, or the C library's.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = $on_path(libc::AT_FDCWD, path, fail, |inside| stat_inside(inside, out.cast()));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), out) })
        }
    )*};
}
hook_stat!(stat: libc::stat, on_path; lstat: libc::stat, on_path_lstat;
    stat64: libc::stat64, on_path; lstat64: libc::stat64, on_path_lstat);

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
            fstatat_any(dirfd, path, out.cast(), flags).unwrap_or_else(|| unsafe { real::$name(dirfd, super::kernel(dirfd, path).ptr(), out, flags) })
        }
    )*};
}
hook_fstatat!(fstatat: libc::stat, fstatat64: libc::stat64);

macro_rules! hook_xstat {
    ($($name:ident: $ty:ty, $on_path:ident);*) => {$(
        /// The `__xstat` form of stat/lstat that binaries built against glibc before 2.33 call.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(version: c_int, path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = $on_path(libc::AT_FDCWD, path, fail, |inside| stat_inside(inside, out.cast()));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(version, super::kernel(libc::AT_FDCWD, path).ptr(), out) })
        }
    )*};
}
hook_xstat!(__xstat: libc::stat, on_path; __lxstat: libc::stat, on_path_lstat;
    __xstat64: libc::stat64, on_path; __lxstat64: libc::stat64, on_path_lstat);

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
                .unwrap_or_else(|| unsafe { real::$name(version, dirfd, super::kernel(dirfd, path).ptr(), out, flags) })
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
    (sx.stx_uid, sx.stx_gid) = super::credentials::owner();
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
        on_path_flags(dirfd, path, flags, fail, |inside| match metadata_inside(&inside) {
            Ok(m) => fill_statx(&m, inside.mount, out),
            Err(e) => fail(e),
        })
    };
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::statx(dirfd, super::kernel(dirfd, path).ptr(), flags, mask, out) })
}

/// Whether a mounted description is a directory (for `fdopendir`).
pub(crate) fn is_dir(d: &Description) -> bool {
    matches!(metadata_of(d), Ok(m) if m.kind == Kind::Dir)
}

fn result(r: iopath::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

/// A change to a mounted description's inode: a file's through its handle
/// (it may have been renamed since it was opened), a directory's by its path.
fn change_inode(
    d: &Description,
    file: impl FnOnce(&iopath::fs::File) -> iopath::Result<()>,
    dir: impl FnOnce(&iopath::fs::FileSystem) -> iopath::Result<()>,
) -> c_int {
    match d.file() {
        Ok(f) => result(file(&f)),
        Err(libc::EISDIR) => match d.mount.fs() {
            Ok(fs) => result(dir(&fs)),
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    }
}

/// chmod of a mounted description.
fn fchmod_mounted(d: &Description, mode: libc::mode_t) -> c_int {
    change_inode(d, |f| f.set_mode(mode), |fs| fs.set_mode(&d.path, mode))
}

fn chmod_inside(inside: Inside, mode: libc::mode_t) -> c_int {
    match inside.mount.fs() {
        Ok(fs) => result(fs.set_mode(&inside.path, mode)),
        Err(e) => fail(e),
    }
}

/// `chmod` (a mount keeps the permission bits; set-id bits too).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: passed on.
    on_path(libc::AT_FDCWD, path, fail, |inside| chmod_inside(inside, mode))
        .unwrap_or_else(|| unsafe { real::chmod(super::kernel(libc::AT_FDCWD, path).ptr(), mode) })
}

/// `fchmodat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: *const c_char, mode: libc::mode_t, flags: c_int) -> c_int {
    let mounted = on_path_flags(dirfd, path, flags, fail, |inside| match metadata_inside(&inside) {
        // As Linux: the mode of a link cannot be changed.
        Ok(m) if m.kind == Kind::Symlink => fail(libc::EOPNOTSUPP),
        _ => chmod_inside(inside, mode),
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::fchmodat(dirfd, super::kernel(dirfd, path).ptr(), mode, flags) })
}

/// `lchmod`: as `fchmodat` with `AT_SYMLINK_NOFOLLOW` (a link's mode cannot be changed).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lchmod(path: *const c_char, mode: libc::mode_t) -> c_int {
    let mounted = on_path_lstat(libc::AT_FDCWD, path, fail, |inside| match metadata_inside(&inside) {
        Ok(m) if m.kind == Kind::Symlink => fail(libc::EOPNOTSUPP),
        _ => chmod_inside(inside, mode),
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::lchmod(super::kernel(libc::AT_FDCWD, path).ptr(), mode) })
}

/// `fchmod`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: passed on.
    on_file_fd(fd, fail, |d| fchmod_mounted(d, mode)).unwrap_or_else(|| unsafe { real::fchmod(fd, mode) })
}

/// The modification time `times` asks for (utimensat's rules: NULL is now,
/// UTIME_NOW, UTIME_OMIT); `Ok(None)` leaves it; the access time is not kept.
fn mtime_of(times: *const libc::timespec) -> Result<Option<u64>, c_int> {
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    if times.is_null() {
        return Ok(Some(now()));
    }
    // SAFETY: utimensat's times is an array of two timespecs.
    let m = unsafe { *times.add(1) };
    match m.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now())),
        ns if !(0..1_000_000_000).contains(&ns) || m.tv_sec < 0 => Err(libc::EINVAL),
        ns => Ok(Some(m.tv_sec as u64 * 1_000_000_000 + ns as u64)),
    }
}

/// utimensat in a mount (a last link in the path is one the call does not
/// follow: its own time is set).
fn utimes_inside(inside: Inside, times: *const libc::timespec) -> c_int {
    let fs = match inside.mount.fs() {
        Ok(fs) => fs,
        Err(e) => return fail(e),
    };
    match mtime_of(times) {
        Err(e) => fail(e),
        Ok(None) => result(fs.symlink_metadata(&inside.path).map(drop)),
        Ok(Some(ns)) => result(fs.set_symlink_mtime(&inside.path, ns)),
    }
}

/// `utimensat`: a mounted path's modification time.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    let mounted = if path.is_null() {
        // Linux's utimensat(fd, NULL, ...) is futimens.
        on_file_fd(dirfd, fail, |d| futimens_mounted(d, times))
    } else {
        on_path_flags(dirfd, path, flags, fail, |inside| utimes_inside(inside, times))
    };
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::utimensat(dirfd, super::kernel(dirfd, path).ptr(), times, flags) })
}

fn futimens_mounted(d: &Description, times: *const libc::timespec) -> c_int {
    let ns = match mtime_of(times) {
        Err(e) => return fail(e),
        Ok(None) => return 0,
        Ok(Some(ns)) => ns,
    };
    change_inode(d, |f| f.set_mtime(ns), |fs| fs.set_mtime(&d.path, ns))
}

/// `futimens`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    // SAFETY: passed on.
    on_file_fd(fd, fail, |d| futimens_mounted(d, times)).unwrap_or_else(|| unsafe { real::futimens(fd, times) })
}

/// Two `timeval`s as `utimensat`'s two `timespec`s (NULL stays NULL: now).
fn timespecs_of(times: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    (!times.is_null()).then(|| {
        // SAFETY: the utimes family's times is an array of two timevals.
        let t = unsafe { [*times, *times.add(1)] };
        t.map(|v| libc::timespec { tv_sec: v.tv_sec, tv_nsec: v.tv_usec * 1000 })
    })
}

fn ptr_of(spec: &Option<[libc::timespec; 2]>) -> *const libc::timespec {
    spec.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

macro_rules! hook_utimes {
    ($($name:ident, $on_path:ident);*) => {$(
        /// `utimes`/`lutimes` (microseconds): a mounted path's modification time.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, times: *const libc::timeval) -> c_int {
            let spec = timespecs_of(times);
            let mounted = $on_path(libc::AT_FDCWD, path, fail, |inside| utimes_inside(inside, ptr_of(&spec)));
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), times) })
        }
    )*};
}
hook_utimes!(utimes, on_path; lutimes, on_path_lstat);

/// `futimesat` (microseconds; `path` NULL: the descriptor's file).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimesat(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int {
    let spec = timespecs_of(times);
    let mounted = if path.is_null() {
        on_file_fd(dirfd, fail, |d| futimens_mounted(d, ptr_of(&spec)))
    } else {
        on_path(dirfd, path, fail, |inside| utimes_inside(inside, ptr_of(&spec)))
    };
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::futimesat(dirfd, super::kernel(dirfd, path).ptr(), times) })
}

/// `futimes` (microseconds).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, times: *const libc::timeval) -> c_int {
    let spec = timespecs_of(times);
    // SAFETY: passed on.
    on_file_fd(fd, fail, |d| futimens_mounted(d, ptr_of(&spec))).unwrap_or_else(|| unsafe { real::futimes(fd, times) })
}

/// `utime` (seconds; what unzip and older programs call).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    let spec = (!times.is_null()).then(|| {
        // SAFETY: a non-NULL utimbuf.
        let t = unsafe { *times };
        [libc::timespec { tv_sec: t.actime, tv_nsec: 0 }, libc::timespec { tv_sec: t.modtime, tv_nsec: 0 }]
    });
    let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| utimes_inside(inside, ptr_of(&spec)));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::utime(super::kernel(libc::AT_FDCWD, path).ptr(), times) })
}

/// chown in a mount: every file is the calling user's, so a change to that
/// user (or -1) succeeds and any other is EPERM, as for an unprivileged
/// process; root's changes succeed and are not kept (said once with `IOPATH_LOG`).
fn chown_mounted(uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let (euid, egid) = super::credentials::owner();
    let same = (uid == u32::MAX || uid == euid) && (gid == u32::MAX || gid == egid);
    if same {
        return 0;
    }
    if euid != 0 {
        return fail(libc::EPERM);
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::log("chown in a mount: accepted for root, not kept (files belong to the process's user)");
    }
    0
}

fn exists(inside: &Inside) -> c_int {
    match metadata_inside(inside) {
        Ok(_) => 0,
        Err(e) => fail(e),
    }
}

macro_rules! hook_chown {
    ($($name:ident, $on_path:ident);*) => {$(
        /// `chown`/`lchown`: see `chown_mounted`.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
            let mounted = $on_path(libc::AT_FDCWD, path, fail, |inside| match exists(&inside) {
                0 => chown_mounted(uid, gid),
                e => e,
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), uid, gid) })
        }
    )*};
}
hook_chown!(chown, on_path; lchown, on_path_lstat);

/// `fchown`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: passed on.
    on_file_fd(fd, fail, |_| chown_mounted(uid, gid)).unwrap_or_else(|| unsafe { real::fchown(fd, uid, gid) })
}

/// `fchownat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    let mounted = on_path_flags(dirfd, path, flags, fail, |inside| match exists(&inside) {
        0 => chown_mounted(uid, gid),
        e => e,
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::fchownat(dirfd, super::kernel(dirfd, path).ptr(), uid, gid, flags) })
}

/// `f_type` iopath's mounts report ("IOPF").
pub const IOPATH_MAGIC: i64 = 0x494f_5046;

/// Fills a `struct statfs` (the same layout as `statfs64` on 64-bit Linux).
fn fill_statfs(mount: &Mount, out: *mut libc::statfs) -> c_int {
    if out.is_null() {
        return fail(libc::EFAULT);
    }
    let fs = match mount.fs() {
        Ok(fs) => fs,
        Err(e) => return fail(e),
    };
    let sb = fs.superblock();
    // SAFETY: all-zero is a valid struct statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    st.f_type = IOPATH_MAGIC;
    st.f_bsize = 4096;
    st.f_frsize = 4096;
    st.f_blocks = sb.blocks - sb.data_start;
    st.f_bfree = match fs.free_blocks() {
        Ok(free) => free,
        Err(e) => return fail(super::errno_of(&e)),
    };
    // What is kept for files' block maps is free but not for data (ext4's reserved blocks).
    st.f_bavail = st.f_bfree.saturating_sub(fs.reserved_blocks());
    st.f_files = sb.inodes();
    st.f_ffree = sb.inodes().saturating_sub(fs.names() as u64);
    st.f_namelen = 255;
    // SAFETY: the caller's buffer holds a struct statfs.
    unsafe { out.write(st) };
    0
}

macro_rules! hook_statfs {
    ($($name:ident: $ty:ty),*) => {$(
        /// `statfs`: a mount's space and inodes.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| match exists(&inside) {
                0 => fill_statfs(inside.mount, out.cast()),
                e => e,
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), out) })
        }
    )*};
}
hook_statfs!(statfs: libc::statfs, statfs64: libc::statfs64);

macro_rules! hook_fstatfs {
    ($($name:ident: $ty:ty),*) => {$(
        /// `fstatfs`: a mount's space and inodes.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, out: *mut $ty) -> c_int {
            // SAFETY: passed on.
            on_fd(fd, fail, |d| fill_statfs(d.mount, out.cast())).unwrap_or_else(|| unsafe { real::$name(fd, out) })
        }
    )*};
}
hook_fstatfs!(fstatfs: libc::statfs, fstatfs64: libc::statfs64);

/// Fills a `struct statvfs` (the same layout as `statvfs64` on 64-bit Linux)
/// from what `statfs` says of the mount.
fn fill_statvfs(mount: &Mount, out: *mut libc::statvfs) -> c_int {
    if out.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: all-zero is a valid struct statfs.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if fill_statfs(mount, &mut fs) != 0 {
        return -1;
    }
    // SAFETY: all-zero is a valid struct statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    st.f_bsize = fs.f_bsize as libc::c_ulong;
    st.f_frsize = fs.f_frsize as libc::c_ulong;
    st.f_blocks = fs.f_blocks;
    st.f_bfree = fs.f_bfree;
    st.f_bavail = fs.f_bavail;
    st.f_files = fs.f_files;
    st.f_ffree = fs.f_ffree;
    st.f_favail = fs.f_ffree;
    st.f_namemax = fs.f_namelen as libc::c_ulong;
    // SAFETY: the caller's buffer holds a struct statvfs.
    unsafe { out.write(st) };
    0
}

macro_rules! hook_statvfs {
    ($($name:ident: $ty:ty),*) => {$(
        /// `statvfs`: a mount's space and inodes (the C library's own asks
        /// the kernel directly, which knows nothing of the mount).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, out: *mut $ty) -> c_int {
            let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| match exists(&inside) {
                0 => fill_statvfs(inside.mount, out.cast()),
                e => e,
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), out) })
        }
    )*};
}
hook_statvfs!(statvfs: libc::statvfs, statvfs64: libc::statvfs64);

macro_rules! hook_fstatvfs {
    ($($name:ident: $ty:ty),*) => {$(
        /// `fstatvfs`: a mount's space and inodes.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, out: *mut $ty) -> c_int {
            // SAFETY: passed on.
            on_fd(fd, fail, |d| fill_statvfs(d.mount, out.cast())).unwrap_or_else(|| unsafe { real::$name(fd, out) })
        }
    )*};
}
hook_fstatvfs!(fstatvfs: libc::statvfs, fstatvfs64: libc::statvfs64);

/// What `pathconf` says of any file in a mount: Linux's answers for a
/// local file system, with a mount's own limits (hard links, link targets).
fn mount_conf(name: c_int) -> libc::c_long {
    match name {
        libc::_PC_LINK_MAX => libc::c_long::from(iopath::fs::namespace::MAX_HARD_LINKS),
        libc::_PC_MAX_CANON | libc::_PC_MAX_INPUT | libc::_PC_NAME_MAX => 255,
        libc::_PC_PATH_MAX => libc::PATH_MAX.into(),
        libc::_PC_PIPE_BUF => libc::PIPE_BUF as libc::c_long,
        libc::_PC_CHOWN_RESTRICTED | libc::_PC_NO_TRUNC | libc::_PC_SYNC_IO | libc::_PC_ASYNC_IO => 1,
        libc::_PC_2_SYMLINKS => 1,
        libc::_PC_VDISABLE => 0,
        libc::_PC_FILESIZEBITS => 64,
        libc::_PC_SYMLINK_MAX => iopath::fs::format::MAX_LINK_TARGET as libc::c_long,
        libc::_PC_REC_MIN_XFER_SIZE | libc::_PC_REC_XFER_ALIGN | libc::_PC_ALLOC_SIZE_MIN => 4096,
        // No limit, and errno left as it was (as the C library answers).
        libc::_PC_PRIO_IO | libc::_PC_REC_INCR_XFER_SIZE | libc::_PC_REC_MAX_XFER_SIZE => -1,
        _ => fail(libc::EINVAL).into(),
    }
}

/// `pathconf`: a mount's limits (the C library's own asks the kernel's
/// `statfs` directly).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pathconf(path: *const c_char, name: c_int) -> libc::c_long {
    let mounted = on_path(
        libc::AT_FDCWD,
        path,
        |e| fail(e).into(),
        |inside| match exists(&inside) {
            0 => mount_conf(name),
            e => e.into(),
        },
    );
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::pathconf(super::kernel(libc::AT_FDCWD, path).ptr(), name) })
}

/// `fpathconf`: as [`pathconf`], of a mounted descriptor.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fpathconf(fd: c_int, name: c_int) -> libc::c_long {
    // SAFETY: passed on.
    on_fd(fd, |e| fail(e).into(), |_| mount_conf(name)).unwrap_or_else(|| unsafe { real::fpathconf(fd, name) })
}

/// Extended attributes: a mount keeps none. Reading one is ENODATA (so a
/// program asking for an ACL or an SELinux label learns there is none),
/// listing gives an empty list, setting one is ENOTSUP.
fn xattr_result(exists: c_int, op: XattrOp) -> isize {
    if exists != 0 {
        return -1;
    }
    match op {
        XattrOp::Get | XattrOp::Remove => fail(libc::ENODATA) as isize,
        XattrOp::List => 0,
        XattrOp::Set => fail(libc::ENOTSUP) as isize,
    }
}

#[derive(Clone, Copy)]
enum XattrOp {
    Get,
    List,
    Set,
    Remove,
}

macro_rules! hook_xattr_path {
    ($op:expr, $ret:ty, $($name:ident, $on_path:ident ( $($arg:ident: $ty:ty),* )),*) => {$(
        /// An extended-attribute call on a path (the `l` forms on a
        /// symbolic link itself): see `xattr_result`.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, $($arg: $ty),*) -> $ret {
            let mounted = $on_path(libc::AT_FDCWD, path, |e| fail(e) as $ret, |inside| xattr_result(exists(&inside), $op) as $ret);
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), $($arg),*) })
        }
    )*};
}
macro_rules! hook_xattr_fd {
    ($op:expr, $ret:ty, $($name:ident ( $($arg:ident: $ty:ty),* )),*) => {$(
        /// An extended-attribute call on a descriptor: see `xattr_result`.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, $($arg: $ty),*) -> $ret {
            // SAFETY: passed on.
            on_fd(fd, |e| fail(e) as $ret, |_| xattr_result(0, $op) as $ret).unwrap_or_else(|| unsafe { real::$name(fd, $($arg),*) })
        }
    )*};
}
hook_xattr_path!(XattrOp::Get, libc::ssize_t,
    getxattr, on_path(name: *const c_char, value: *mut libc::c_void, size: libc::size_t),
    lgetxattr, on_path_lstat(name: *const c_char, value: *mut libc::c_void, size: libc::size_t));
hook_xattr_path!(XattrOp::List, libc::ssize_t,
    listxattr, on_path(list: *mut c_char, size: libc::size_t),
    llistxattr, on_path_lstat(list: *mut c_char, size: libc::size_t));
hook_xattr_path!(XattrOp::Set, c_int,
    setxattr, on_path(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int),
    lsetxattr, on_path_lstat(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int));
hook_xattr_path!(XattrOp::Remove, c_int,
    removexattr, on_path(name: *const c_char),
    lremovexattr, on_path_lstat(name: *const c_char));
hook_xattr_fd!(XattrOp::Get, libc::ssize_t, fgetxattr(name: *const c_char, value: *mut libc::c_void, size: libc::size_t));
hook_xattr_fd!(XattrOp::List, libc::ssize_t, flistxattr(list: *mut c_char, size: libc::size_t));
hook_xattr_fd!(XattrOp::Set, c_int, fsetxattr(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int));
hook_xattr_fd!(XattrOp::Remove, c_int, fremovexattr(name: *const c_char));
