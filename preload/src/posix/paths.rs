//! Paths: open (and open64, openat, creat, the `__open_2` checked forms),
//! unlink, rename, mkdir, rmdir, access, truncate, umask, chdir and getcwd,
//! symlink and readlink, and the nodes a mount cannot hold.

use super::{errno_of, fail, on_path, on_path_nofollow};
use crate::mount::{self, Description, Inside, Node};
use crate::real;
use crate::route::opened;
use iopath::fs::Kind;
use libc::{c_char, c_int, c_uint, mode_t, off_t};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// The process's umask as last set (read from /proc at first use).
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

fn umask_now() -> u32 {
    let known = UMASK.load(Ordering::Relaxed);
    if known != u32::MAX {
        return known;
    }
    let read = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("Umask:"))?;
        u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
    });
    let mask = read.unwrap_or(0o022);
    UMASK.store(mask, Ordering::Relaxed);
    mask
}

/// `umask`: noted, so files made in a mount get the permission bits the kernel would give.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: passed on.
    let old = unsafe { real::umask(mask) };
    UMASK.store(mask & 0o777, Ordering::Relaxed);
    old
}

/// Status flags a description keeps (as `F_GETFL` gives them back).
const KEPT: c_int = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DIRECT
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NOATIME
    | libc::O_PATH;

/// Opens `inside` as open(2) would; the reserved descriptor or -1 with errno.
pub(crate) fn open_inside(inside: Inside, flags: c_int, mode: mode_t) -> c_int {
    let fs = match inside.mount.fs() {
        Ok(fs) => fs,
        Err(e) => return fail(e),
    };
    let path = &inside.path[..];
    let access = flags & libc::O_ACCMODE;
    let writes = access == libc::O_WRONLY || access == libc::O_RDWR;
    let (create, exclusive) = (flags & libc::O_CREAT != 0, flags & libc::O_EXCL != 0);
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        crate::log("O_TMPFILE in a mount is not supported (EOPNOTSUPP)");
        return fail(libc::EOPNOTSUPP);
    }
    if access == libc::O_ACCMODE {
        return fail(libc::EINVAL);
    }
    // (The last component is a link only where the caller did not follow it.)
    let node = match fs.symlink_metadata(path) {
        Ok(m) if m.kind == Kind::Symlink => {
            return fail(if create && exclusive { libc::EEXIST } else { libc::ELOOP });
        }
        Ok(m) if m.kind == Kind::Dir => {
            if create && exclusive {
                return fail(libc::EEXIST);
            }
            if writes || create {
                return fail(libc::EISDIR);
            }
            Node::Dir
        }
        Ok(m) if m.kind == Kind::Fifo => {
            if create && exclusive {
                return fail(libc::EEXIST);
            }
            if flags & libc::O_DIRECTORY != 0 {
                return fail(libc::ENOTDIR);
            }
            drop(fs);
            return open_fifo(&inside, m.ino, flags);
        }
        Ok(_) => {
            if create && exclusive {
                return fail(libc::EEXIST);
            }
            if flags & libc::O_DIRECTORY != 0 {
                return fail(libc::ENOTDIR);
            }
            let opened = if flags & libc::O_DIRECT != 0 { fs.open_direct(path) } else { fs.open(path) };
            let file = match opened {
                Ok(f) => f,
                Err(e) => return fail(errno_of(&e)),
            };
            // What the program wrote into this file through a standard stream comes first.
            crate::bridge::written_before(inside.mount, file.metadata().ino);
            if flags & libc::O_TRUNC != 0
                && writes
                && !file.is_empty()
                && let Err(e) = file.truncate(0)
            {
                return fail(errno_of(&e));
            }
            Node::file(file)
        }
        Err(e) if create && e.errno() == Some(libc::ENOENT) => {
            if flags & libc::O_DIRECTORY != 0 {
                return fail(libc::EINVAL);
            }
            let made = fs.create_with_mode(path, mode & !umask_now() & 0o7777);
            let made = match made {
                // Made by another thread meanwhile: open it, as the kernel would have.
                Err(e) if e.errno() == Some(libc::EEXIST) && !exclusive => fs.open(path),
                other => other,
            };
            let made = match made {
                Ok(f) if flags & libc::O_DIRECT != 0 => fs.open_direct(path).or(Ok(f)),
                other => other,
            };
            match made {
                Ok(f) => Node::file(f),
                Err(e) => return fail(errno_of(&e)),
            }
        }
        Err(e) => return fail(errno_of(&e)),
    };
    let fd = match mount::reserve(inside.mount, flags & libc::O_CLOEXEC != 0) {
        Ok(fd) => fd,
        Err(e) => return fail(e),
    };
    let description = Arc::new(Description {
        mount: inside.mount,
        path: inside.path,
        node,
        flags: AtomicI32::new(flags & KEPT),
        position: Mutex::new(0),
        locked: AtomicBool::new(false),
        flock_fd: AtomicI32::new(-1),
        born: iopath::sys::fork_generation(),
    });
    if crate::bridge::wanted(&description, fd) {
        // A standard stream (the program had closed it): a pipe a bridge keeps.
        return crate::bridge::onto(&description, fd, flags & libc::O_CLOEXEC != 0);
    }
    mount::install(fd, description);
    fd
}

/// open(2) on a path: `None` if it is outside every mount. `O_NOFOLLOW`
/// and `O_CREAT | O_EXCL` act on a last symbolic link itself (ELOOP and
/// EEXIST); otherwise the link is followed (and `O_CREAT` makes a missing
/// target, as the kernel does).
pub(crate) fn open_on_path(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> Option<c_int> {
    let serve = |inside| open_inside(inside, flags, mode);
    let exclusive = flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL;
    let served = if flags & libc::O_NOFOLLOW != 0 || exclusive {
        on_path_nofollow(dirfd, path, fail, serve)
    } else {
        on_path(dirfd, path, fail, serve)
    };
    if served.is_some() || flags & libc::O_CREAT == 0 {
        return served;
    }
    named_through_kernel_link(dirfd, path).map(|inside| open_inside(inside, flags, mode))
}

/// A name outside every mount by its path (`path`, relative to `dirfd`)
/// whose directory is a mount's own, reached through a kernel symbolic
/// link: the mount's ([`mount::named_through_kernel_link`]). Asked by the
/// calls that make or move a name, before the kernel would make it in the
/// empty directory under the mount, unseen.
fn named_through_kernel_link(dirfd: c_int, path: *const c_char) -> Option<Inside> {
    // (FORKED read, not `forked()`: a forked child making a file of the kernel's is no
    // use of the mount to warn about.)
    if !super::mounting() || crate::FORKED.load(Ordering::Relaxed) {
        return None;
    }
    let bytes = super::path_bytes(path)?;
    let _inside = crate::Inside::enter();
    mount::named_through_kernel_link(dirfd, bytes)
}

/// After the kernel opened `path` (relative to `dirfd`) as `fd`, a
/// directory or `O_PATH` descriptor: one above a mount is noted
/// ([`mount::kernel_dir_opened`]); the mount's own directory, reached
/// through a symbolic link of the kernel's, is given back for the mount's
/// root (the kernel's is the empty directory under it).
fn kernel_opened(dirfd: c_int, path: *const c_char, flags: c_int, fd: c_int) -> c_int {
    let forked = crate::FORKED.load(Ordering::Relaxed); // (as above: no warning for a kernel open)
    if fd < 0 || flags & (libc::O_DIRECTORY | libc::O_PATH) == 0 || !super::mounting() || forked {
        return fd;
    }
    let Some(bytes) = super::path_bytes(path) else { return fd };
    let _inside = crate::Inside::enter();
    if let Some(mount) = mount_dir_behind(fd) {
        // SAFETY: the descriptor the kernel just gave us (closed through this library's
        // own close, which forgets what it knew of the number).
        unsafe { super::descriptors::close(fd) };
        return open_inside(Inside { mount, path: b"/".to_vec() }, flags, 0);
    }
    mount::kernel_dir_opened(dirfd, bytes, fd);
    fd
}

/// The mount whose own directory kernel descriptor `fd` is open on (one `fstat`).
pub(crate) fn mount_dir_behind(fd: c_int) -> Option<&'static mount::Mount> {
    // SAFETY: all-zero is a valid struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a buffer of ours.
    if unsafe { real::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return None;
    }
    mount::mount_of_kernel_dir((st.st_dev, st.st_ino))
}

macro_rules! hook_open {
    ($($name:ident),*) => {$(
        /// `open`: in a mount, iopath's file; otherwise passed through (a
        /// routed file's descriptor is looked at on its first I/O).
        ///
        /// # Safety
        /// As the C function (`mode` is read only with O_CREAT or O_TMPFILE, as there).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            if let Some(fd) = open_on_path(libc::AT_FDCWD, path, flags, mode) {
                return fd;
            }
            // SAFETY: passed on.
            let fd = opened(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), flags, mode) }, flags & libc::O_CLOEXEC != 0);
            kernel_opened(libc::AT_FDCWD, path, flags, fd)
        }
    )*};
}
macro_rules! hook_openat {
    ($($name:ident),*) => {$(
        /// `openat`: in a mount, iopath's file; otherwise passed through.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            if let Some(fd) = open_on_path(dirfd, path, flags, mode) {
                return fd;
            }
            // SAFETY: passed on.
            let fd = opened(|| unsafe { real::$name(dirfd, super::kernel(dirfd, path).ptr(), flags, mode) }, flags & libc::O_CLOEXEC != 0);
            kernel_opened(dirfd, path, flags, fd)
        }
    )*};
}
macro_rules! hook_creat {
    ($($name:ident),*) => {$(
        /// `creat`: open with O_CREAT|O_WRONLY|O_TRUNC.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: mode_t) -> c_int {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            if let Some(fd) = open_on_path(libc::AT_FDCWD, path, flags, mode) {
                return fd;
            }
            // SAFETY: passed on.
            opened(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), mode) }, false)
        }
    )*};
}
macro_rules! hook_open_2 {
    ($($name:ident),*) => {$(
        /// `__open_2`: what `open` compiles to with `_FORTIFY_SOURCE` (no mode).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            if let Some(fd) = open_on_path(libc::AT_FDCWD, path, flags, 0) {
                return fd;
            }
            // SAFETY: passed on.
            let fd = opened(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), flags) }, flags & libc::O_CLOEXEC != 0);
            kernel_opened(libc::AT_FDCWD, path, flags, fd)
        }
    )*};
}
macro_rules! hook_openat_2 {
    ($($name:ident),*) => {$(
        /// `__openat_2`: what `openat` compiles to with `_FORTIFY_SOURCE`.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
            if let Some(fd) = open_on_path(dirfd, path, flags, 0) {
                return fd;
            }
            // SAFETY: passed on.
            let fd = opened(|| unsafe { real::$name(dirfd, super::kernel(dirfd, path).ptr(), flags) }, flags & libc::O_CLOEXEC != 0);
            kernel_opened(dirfd, path, flags, fd)
        }
    )*};
}
hook_open!(open, open64);
hook_openat!(openat, openat64);
hook_creat!(creat, creat64);
hook_open_2!(__open_2, __open64_2);
hook_openat_2!(__openat_2, __openat64_2);

/// 0, or -1 with the errno of an iopath error.
fn done(r: iopath::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

fn with_fs(inside: &Inside, f: impl FnOnce(&iopath::fs::FileSystem) -> iopath::Result<()>) -> c_int {
    match inside.mount.fs() {
        Ok(fs) => done(f(&fs)),
        Err(e) => fail(e),
    }
}

/// `unlink`: a mounted file's name (its data lives while it is open).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    let mounted = on_path_nofollow(libc::AT_FDCWD, path, fail, |inside| with_fs(&inside, |fs| fs.unlink(&inside.path)));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::unlink(super::kernel(libc::AT_FDCWD, path).ptr()) })
}

/// `unlinkat`: unlink, or rmdir with AT_REMOVEDIR.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let mounted = on_path_nofollow(dirfd, path, fail, |inside| {
        if flags & !libc::AT_REMOVEDIR != 0 {
            return fail(libc::EINVAL);
        }
        if flags & libc::AT_REMOVEDIR != 0 {
            with_fs(&inside, |fs| fs.rmdir(&inside.path))
        } else {
            with_fs(&inside, |fs| fs.unlink(&inside.path))
        }
    });
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::unlinkat(dirfd, super::kernel(dirfd, path).ptr(), flags) })
}

/// `rmdir`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    let mounted = on_path_nofollow(libc::AT_FDCWD, path, fail, |inside| with_fs(&inside, |fs| fs.rmdir(&inside.path)));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::rmdir(super::kernel(libc::AT_FDCWD, path).ptr()) })
}

/// `mkdirat` in a mount (the umask applies, as in the kernel).
fn mkdir_inside(inside: Inside, mode: mode_t) -> c_int {
    with_fs(&inside, |fs| fs.mkdir(&inside.path, mode & !umask_now() & 0o7777))
}

/// `mkdir`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    on_path_nofollow(libc::AT_FDCWD, path, fail, |inside| mkdir_inside(inside, mode))
        .or_else(|| named_through_kernel_link(libc::AT_FDCWD, path).map(|inside| mkdir_inside(inside, mode)))
        // SAFETY: passed on.
        .unwrap_or_else(|| unsafe { real::mkdir(super::kernel(libc::AT_FDCWD, path).ptr(), mode) })
}

/// `mkdirat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    on_path_nofollow(dirfd, path, fail, |inside| mkdir_inside(inside, mode))
        .or_else(|| named_through_kernel_link(dirfd, path).map(|inside| mkdir_inside(inside, mode)))
        // SAFETY: passed on.
        .unwrap_or_else(|| unsafe { real::mkdirat(dirfd, super::kernel(dirfd, path).ptr(), mode) })
}

/// A rename with one or both names in a mount: within one mount it is the
/// file system's (atomic); across a mount's edge it is EXDEV, as between
/// two file systems. `None`: both names are outside.
fn rename_any(
    olddirfd: c_int,
    old: *const c_char,
    newdirfd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> Option<c_int> {
    let from = on_path_nofollow(olddirfd, old, Err, Ok).or_else(|| named_through_kernel_link(olddirfd, old).map(Ok));
    let to = on_path_nofollow(newdirfd, new, Err, Ok).or_else(|| named_through_kernel_link(newdirfd, new).map(Ok));
    let (from, to) = match (from, to) {
        (None, None) => return None,
        (Some(Err(e)), _) | (_, Some(Err(e))) => return Some(fail(e)),
        (Some(Ok(from)), Some(Ok(to))) if std::ptr::eq(from.mount, to.mount) => (from, to),
        _ => return Some(fail(libc::EXDEV)),
    };
    let how = match flags {
        0 => iopath::fs::Rename::Replace,
        f if f == libc::RENAME_NOREPLACE => iopath::fs::Rename::NoReplace,
        f if f == libc::RENAME_EXCHANGE => iopath::fs::Rename::Exchange,
        _ => return Some(fail(libc::EINVAL)),
    };
    let _inside = crate::Inside::enter();
    Some(with_fs(&from, |fs| fs.rename_with(&from.path, &to.path, how)))
}

/// `rename`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: passed on.
    rename_any(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0).unwrap_or_else(|| unsafe {
        real::rename(super::kernel(libc::AT_FDCWD, old).ptr(), super::kernel(libc::AT_FDCWD, new).ptr())
    })
}

/// `renameat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char) -> c_int {
    rename_any(olddirfd, old, newdirfd, new, 0)
        // SAFETY: passed on.
        .unwrap_or_else(|| unsafe {
            real::renameat(olddirfd, super::kernel(olddirfd, old).ptr(), newdirfd, super::kernel(newdirfd, new).ptr())
        })
}

/// `renameat2` (RENAME_NOREPLACE and RENAME_EXCHANGE in a mount).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(
    olddirfd: c_int,
    old: *const c_char,
    newdirfd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    rename_any(olddirfd, old, newdirfd, new, flags)
        // SAFETY: passed on.
        .unwrap_or_else(|| unsafe {
            real::renameat2(
                olddirfd,
                super::kernel(olddirfd, old).ptr(),
                newdirfd,
                super::kernel(newdirfd, new).ptr(),
                flags,
            )
        })
}

/// access(2) in a mount: existence, and the owner's permission bits (every
/// file is the caller's; root passes read and write, and execute where any
/// execute bit is set).
fn access_inside(inside: Inside, how: c_int) -> c_int {
    let fs = match inside.mount.fs() {
        Ok(fs) => fs,
        Err(e) => return fail(e),
    };
    // (A last link is there only with AT_SYMLINK_NOFOLLOW: the link is asked about.)
    let m = match fs.symlink_metadata(&inside.path) {
        Ok(m) => m,
        Err(e) => return fail(errno_of(&e)),
    };
    if how & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        return fail(libc::EINVAL);
    }
    let root = super::credentials::owner().0 == 0;
    let allowed = |bit: c_int, owner: u32| how & bit == 0 || (root && bit != libc::X_OK) || m.mode & owner != 0;
    let exec_ok = how & libc::X_OK == 0 || m.mode & if root { 0o111 } else { 0o100 } != 0;
    if allowed(libc::R_OK, 0o400) && allowed(libc::W_OK, 0o200) && exec_ok { 0 } else { fail(libc::EACCES) }
}

/// `access`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, how: c_int) -> c_int {
    // SAFETY: passed on.
    on_path(libc::AT_FDCWD, path, fail, |inside| access_inside(inside, how))
        .unwrap_or_else(|| unsafe { real::access(super::kernel(libc::AT_FDCWD, path).ptr(), how) })
}

/// `faccessat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, how: c_int, flags: c_int) -> c_int {
    let serve = |inside| access_inside(inside, how);
    let mounted = if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        on_path_nofollow(dirfd, path, fail, serve)
    } else {
        on_path(dirfd, path, fail, serve)
    };
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::faccessat(dirfd, super::kernel(dirfd, path).ptr(), how, flags) })
}

macro_rules! hook_truncate {
    ($($name:ident),*) => {$(
        /// `truncate`: a mounted file's size.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, len: off_t) -> c_int {
            let mounted = on_path(libc::AT_FDCWD, path, fail, |inside| {
                let fifo = || inside.mount.fs().ok().and_then(|fs| fs.metadata(&inside.path).ok());
                if len < 0 || fifo().is_some_and(|m| m.kind == Kind::Fifo) {
                    return fail(libc::EINVAL); // as Linux, for a FIFO too
                }
                with_fs(&inside, |fs| fs.open(&inside.path)?.truncate(len as u64))
            });
            // SAFETY: passed on.
            mounted.unwrap_or_else(|| unsafe { real::$name(super::kernel(libc::AT_FDCWD, path).ptr(), len) })
        }
    )*};
}
hook_truncate!(truncate, truncate64);

/// chdir into a mounted directory: the working directory becomes a mount's
/// (the kernel's moves to the mount's own directory, or stays if that is
/// not a directory here).
fn chdir_inside(inside: Inside) -> c_int {
    let fs = match inside.mount.fs() {
        Ok(fs) => fs,
        Err(e) => return fail(e),
    };
    match fs.metadata(&inside.path) {
        Ok(m) if m.kind == Kind::Dir => {}
        Ok(_) => return fail(libc::ENOTDIR),
        Err(e) => return fail(errno_of(&e)),
    }
    let mut dir = inside.mount.dir.clone();
    if inside.path != b"/" {
        dir.extend_from_slice(inside.path.strip_suffix(b"/").unwrap_or(&inside.path));
    }
    let mut host = inside.mount.dir.clone();
    host.push(0);
    // SAFETY: a NUL-terminated path we own.
    let _ = unsafe { real::chdir(host.as_ptr().cast()) };
    mount::forget_kernel_cwd();
    mount::set_virtual_cwd(Some(dir));
    0
}

/// `chdir`: into a mount, or the kernel's (which leaves any mount's).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    if let Some(r) = on_path(libc::AT_FDCWD, path, fail, chdir_inside) {
        return r;
    }
    // SAFETY: passed on.
    let r = unsafe { real::chdir(super::kernel(libc::AT_FDCWD, path).ptr()) };
    if r == 0 {
        mount::forget_kernel_cwd();
        mount::set_virtual_cwd(None);
    }
    r
}

/// `fchdir`: to a mounted directory descriptor, or the kernel's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let mounted = super::on_fd(fd, fail, |d| {
        chdir_inside(Inside { mount: d.mount, path: if d.path.is_empty() { b"/".to_vec() } else { d.path.clone() } })
    });
    if let Some(r) = mounted {
        return r;
    }
    // SAFETY: passed on.
    let r = unsafe { real::fchdir(fd) };
    if r == 0 {
        mount::forget_kernel_cwd();
        mount::set_virtual_cwd(None);
    }
    r
}

/// `getcwd`: a mount's working directory, or the kernel's (glibc's
/// extensions included: a NULL buffer is allocated with malloc).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: libc::size_t) -> *mut c_char {
    let virtual_cwd = if super::mounting() { mount::virtual_cwd() } else { None };
    let Some(dir) = virtual_cwd else {
        // SAFETY: passed on.
        return unsafe { real::getcwd(buf, size) };
    };
    if buf.is_null() {
        return c_string_out(&dir, None, size);
    }
    if size == 0 {
        crate::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if size < dir.len() + 1 {
        crate::set_errno(libc::ERANGE);
        return std::ptr::null_mut();
    }
    c_string_out(&dir, Some(buf), size)
}

/// `bytes` as a C string: into the caller's `buf` (which holds more than
/// `bytes.len()`), or with `None` into memory from `malloc` (at least
/// `size` bytes), for the caller to `free`, as glibc's `getcwd(NULL)` and
/// `realpath(path, NULL)` give it. NULL with ENOMEM if that fails.
fn c_string_out(bytes: &[u8], buf: Option<*mut c_char>, size: usize) -> *mut c_char {
    let out = match buf {
        Some(buf) => buf,
        None => {
            // SAFETY: malloc of a size.
            let p = unsafe { libc::malloc((bytes.len() + 1).max(size)) }.cast::<c_char>();
            if p.is_null() {
                crate::set_errno(libc::ENOMEM);
                return p;
            }
            p
        }
    };
    // SAFETY: `out` holds more than bytes.len() bytes (the caller's word, or our allocation).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len());
        *out.add(bytes.len()) = 0;
    }
    out
}

/// `get_current_dir_name`: as [`getcwd`] with a NULL buffer.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    if super::mounting() && mount::virtual_cwd().is_some() {
        // SAFETY: a NULL buffer: allocated.
        return unsafe { getcwd(std::ptr::null_mut(), 0) };
    }
    // SAFETY: passed on.
    unsafe { real::get_current_dir_name() }
}

/// A kind of node a mount cannot hold: EPERM, as Linux answers for a file
/// system that does not support it, said once per kind with `IOPATH_LOG`.
fn unsupported_node(what: &str, inside: &Inside) -> c_int {
    crate::log(&format!("{what} in a mount is not supported ({}): EPERM", String::from_utf8_lossy(&inside.path)));
    fail(libc::EPERM)
}

/// `symlinkat` in a mount: a link to `target`, kept as the bytes given.
fn symlink_inside(target: *const c_char, inside: Inside) -> c_int {
    let Some(target) = super::path_bytes(target) else { return fail(libc::EFAULT) };
    with_fs(&inside, |fs| fs.symlink(target, &inside.path))
}

/// `symlink`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    let mounted = on_path_nofollow(libc::AT_FDCWD, path, fail, |inside| symlink_inside(target, inside))
        .or_else(|| named_through_kernel_link(libc::AT_FDCWD, path).map(|inside| symlink_inside(target, inside)));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::symlink(target, super::kernel(libc::AT_FDCWD, path).ptr()) })
}

/// `symlinkat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int {
    let mounted = on_path_nofollow(dirfd, path, fail, |inside| symlink_inside(target, inside))
        .or_else(|| named_through_kernel_link(dirfd, path).map(|inside| symlink_inside(target, inside)));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::symlinkat(target, dirfd, super::kernel(dirfd, path).ptr()) })
}

/// A hard link with either name in a mount: the file system's within one
/// mount, EXDEV across its edge (as between two file systems). The old
/// name's last link is followed only with AT_SYMLINK_FOLLOW, as Linux's
/// `linkat`; AT_EMPTY_PATH (a descriptor's own file) is not served in a
/// mount (ENOENT, said with `IOPATH_LOG`). `None`: both names are outside.
fn link_any(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_int) -> Option<c_int> {
    let empty = super::path_bytes(old).is_some_and(<[u8]>::is_empty);
    if flags & libc::AT_EMPTY_PATH != 0 && empty && mount::lookup(olddirfd).is_some() {
        crate::log("linkat(AT_EMPTY_PATH) of a mounted descriptor is not supported: ENOENT");
        return Some(fail(libc::ENOENT));
    }
    let from = if flags & libc::AT_SYMLINK_FOLLOW != 0 {
        on_path(olddirfd, old, Err, Ok)
    } else {
        on_path_nofollow(olddirfd, old, Err, Ok)
    };
    let from = from.or_else(|| named_through_kernel_link(olddirfd, old).map(Ok));
    let to = on_path_nofollow(newdirfd, new, Err, Ok).or_else(|| named_through_kernel_link(newdirfd, new).map(Ok));
    let (from, to) = match (from, to) {
        (None, None) => return None,
        (Some(Err(e)), _) | (_, Some(Err(e))) => return Some(fail(e)),
        (Some(Ok(from)), Some(Ok(to))) if std::ptr::eq(from.mount, to.mount) => (from, to),
        _ => return Some(fail(libc::EXDEV)),
    };
    if flags & !(libc::AT_SYMLINK_FOLLOW | libc::AT_EMPTY_PATH) != 0 {
        return Some(fail(libc::EINVAL));
    }
    let _inside = crate::Inside::enter();
    Some(with_fs(&from, |fs| fs.hard_link(&from.path, &to.path)))
}

/// `link`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    link_any(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0).unwrap_or_else(|| {
        // SAFETY: passed on.
        unsafe { real::link(super::kernel(libc::AT_FDCWD, old).ptr(), super::kernel(libc::AT_FDCWD, new).ptr()) }
    })
}

/// `linkat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn linkat(
    olddirfd: c_int,
    old: *const c_char,
    newdirfd: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    link_any(olddirfd, old, newdirfd, new, flags).unwrap_or_else(|| {
        // SAFETY: passed on.
        unsafe {
            real::linkat(
                olddirfd,
                super::kernel(olddirfd, old).ptr(),
                newdirfd,
                super::kernel(newdirfd, new).ptr(),
                flags,
            )
        }
    })
}

/// readlink in a mount: the link's target, cut to `size` bytes (no NUL added, as the kernel's).
fn readlink_inside(inside: Inside, buf: *mut c_char, size: libc::size_t) -> libc::ssize_t {
    if size == 0 {
        return fail(libc::EINVAL) as libc::ssize_t;
    }
    match inside.mount.fs().map(|fs| fs.read_link(&inside.path)) {
        Err(e) => fail(e) as libc::ssize_t,
        Ok(Err(e)) => fail(errno_of(&e)) as libc::ssize_t,
        Ok(Ok(target)) => {
            let n = target.len().min(size);
            // SAFETY: the caller's buffer holds `size` bytes (the C contract).
            unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast::<u8>(), n) };
            n as libc::ssize_t
        }
    }
}

/// `readlink`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: libc::size_t) -> libc::ssize_t {
    let mounted =
        on_path_nofollow(libc::AT_FDCWD, path, |e| fail(e) as libc::ssize_t, |i| readlink_inside(i, buf, size));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::readlink(super::kernel(libc::AT_FDCWD, path).ptr(), buf, size) })
}

/// `readlinkat`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: libc::size_t,
) -> libc::ssize_t {
    let mounted = on_path_nofollow(dirfd, path, |e| fail(e) as libc::ssize_t, |i| readlink_inside(i, buf, size));
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::readlinkat(dirfd, super::kernel(dirfd, path).ptr(), buf, size) })
}

/// `mknodat` in a mount: a named pipe (`S_IFIFO`, see [`open_fifo`]) or a
/// regular file (`S_IFREG`, or no type); a device node or a socket cannot
/// be made there (EPERM, as on a file system mounted `nodev`).
fn mknod_inside(inside: Inside, mode: mode_t) -> c_int {
    let bits = mode & !umask_now() & 0o7777;
    match mode & libc::S_IFMT {
        libc::S_IFIFO => with_fs(&inside, |fs| fs.mkfifo(&inside.path, bits)),
        0 | libc::S_IFREG => with_fs(&inside, |fs| fs.create_with_mode(&inside.path, bits).map(drop)),
        _ => unsupported_node("a device node or socket", &inside),
    }
}

/// `mknod`: [`mknodat`] from the working directory.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: passed on.
    unsafe { mknodat(libc::AT_FDCWD, path, mode, dev) }
}

/// `mknodat`: in a mount, a FIFO or a regular file ([`mknod_inside`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    on_path_nofollow(dirfd, path, fail, |inside| mknod_inside(inside, mode))
        .or_else(|| named_through_kernel_link(dirfd, path).map(|inside| mknod_inside(inside, mode)))
        // SAFETY: passed on.
        .unwrap_or_else(|| unsafe { real::mknodat(dirfd, super::kernel(dirfd, path).ptr(), mode, dev) })
}

/// `mkfifo`: `mknodat` of a FIFO, as the C library's (which calls the
/// kernel itself, where no hook sees it).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: passed on.
    unsafe { mknodat(libc::AT_FDCWD, path, mode | libc::S_IFIFO, 0) }
}

/// `mkfifoat`: as [`mkfifo`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: passed on.
    unsafe { mknodat(dirfd, path, mode | libc::S_IFIFO, 0) }
}

/// Opens FIFO inode `ino` of `inside`'s mount: the kernel pipe that stands
/// for it ([`iopath::fs::lock::fifo_path`]), made if missing, with the
/// program's flags, at the number the kernel gives (a descriptor of the
/// kernel's from here on: reads, writes, poll and close are the pipe's).
/// The mount is not held meanwhile: an open for reading waits for a
/// writer, who may be another process that must mount it to find the FIFO.
fn open_fifo(inside: &Inside, ino: u64, flags: c_int) -> c_int {
    let Some(device) = iopath::fs::lock::backing_path(&inside.mount.device) else {
        crate::log(&format!("a FIFO on {} has no kernel pipe (not a device file): ENXIO", inside.mount.device));
        return fail(libc::ENXIO);
    };
    let pipe = {
        let _inside = crate::Inside::enter();
        iopath::fs::lock::fifo_path(&device, ino).and_then(|pipe| iopath::fs::lock::make_fifo(&pipe).map(|()| pipe))
    };
    let pipe = match pipe {
        Ok(pipe) => pipe,
        Err(e) => {
            crate::log(&format!("FIFO {}: {e}", String::from_utf8_lossy(&inside.path)));
            return fail(libc::ENXIO);
        }
    };
    let Ok(pipe) = std::ffi::CString::new(pipe.into_os_string().into_encoded_bytes()) else {
        return fail(libc::ENXIO);
    };
    let kept = libc::O_ACCMODE | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_ASYNC;
    // The program's own open from here: an open for reading waits for a writer (and one
    // for writing for a reader) for as long as it takes, so nothing of iopath's is held
    // meanwhile (a descriptor made inside waits for the lender's, which waits for it).
    let _program = crate::Inside::leave();
    // SAFETY: a NUL-terminated path; the descriptor is the program's.
    opened(|| unsafe { real::open(pipe.as_ptr(), flags & kept, 0) }, flags & libc::O_CLOEXEC != 0)
}

/// What a path's component is, for [`canonical`]'s walk.
enum Component {
    Dir,
    Link(Vec<u8>),
    Other,
}

/// What absolute, normalized `path` names: looked up in a mount's file
/// system if it lies in one, else by the kernel (its link not followed).
fn component(path: &[u8]) -> Result<Component, c_int> {
    if let Some(inside) = mount::resolve(libc::AT_FDCWD, path) {
        if super::stuck(inside.mount) {
            return Err(libc::EPERM);
        }
        let _inside = crate::Inside::enter();
        let fs = inside.mount.fs()?;
        let m = fs.symlink_metadata(&inside.path).map_err(|e| errno_of(&e))?;
        return Ok(match m.kind {
            Kind::Symlink => Component::Link(fs.read_link(&inside.path).map_err(|e| errno_of(&e))?),
            Kind::Dir => Component::Dir,
            _ => Component::Other,
        });
    }
    let c = std::ffi::CString::new(path).map_err(|_| libc::EINVAL)?;
    // SAFETY: all-zero is a valid struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of ours.
    if unsafe { real::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(super::last_errno());
    }
    Ok(match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => {
            let mut buf = vec![0u8; libc::PATH_MAX as usize];
            // SAFETY: the buffer holds PATH_MAX bytes.
            let n = unsafe { real::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return Err(super::last_errno());
            }
            buf.truncate(n as usize);
            Component::Link(buf)
        }
        libc::S_IFDIR => Component::Dir,
        _ => Component::Other,
    })
}

/// realpath's answer for `path`: absolute, with every symbolic link on the
/// way followed and no `.`, `..` or repeated `/`; each component must exist
/// (a mount's in its file system, the others in the kernel's), and every
/// one followed by more (or by a trailing `/`) must be a directory.
fn canonical(path: &[u8]) -> Result<Vec<u8>, c_int> {
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    let mut out: Vec<u8> = if path.starts_with(b"/") { Vec::new() } else { mount::cwd().ok_or(libc::ENOENT)?.to_vec() };
    // The components still to walk, the next one last (empty ones stand for
    // repeated or trailing slashes: a name before one must be a directory).
    let mut todo: Vec<Vec<u8>> = path.split(|&b| b == b'/').rev().map(<[u8]>::to_vec).collect();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        match &name[..] {
            b"" | b"." => continue,
            b".." => {
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
                continue;
            }
            _ => {}
        }
        let parent = out.len();
        out.push(b'/');
        out.extend_from_slice(&name);
        match component(&out)? {
            Component::Dir => {}
            Component::Other if todo.is_empty() => {}
            Component::Other => return Err(libc::ENOTDIR),
            Component::Link(target) => {
                links += 1;
                if links > 40 {
                    return Err(libc::ELOOP);
                }
                out.truncate(if target.starts_with(b"/") { 0 } else { parent });
                todo.extend(target.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// `realpath`: a path in a mount is resolved there (glibc's own walk calls
/// the kernel directly, which knows nothing of the mount); so is one the
/// kernel could not resolve, as a link of the kernel's may lead into a mount.
///
/// # Safety
/// As the C function (`resolved`, if not NULL, holds PATH_MAX bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    let Some(bytes) = super::path_bytes(path).filter(|_| super::mounting()) else {
        // SAFETY: passed on.
        return unsafe { real::realpath(path, resolved) };
    };
    if mount::resolve(libc::AT_FDCWD, bytes).is_none() {
        // SAFETY: passed on.
        let found = unsafe { real::realpath(path, resolved) };
        if !found.is_null() || !matches!(super::last_errno(), libc::ENOENT | libc::ENOTDIR) {
            return found;
        }
    }
    match canonical(bytes) {
        Err(e) => {
            crate::set_errno(e);
            std::ptr::null_mut()
        }
        Ok(out) if out.len() >= libc::PATH_MAX as usize => {
            crate::set_errno(libc::ENAMETOOLONG);
            std::ptr::null_mut()
        }
        // A caller's buffer holds PATH_MAX bytes (the C contract).
        Ok(out) => c_string_out(&out, (!resolved.is_null()).then_some(resolved), 0),
    }
}

/// `canonicalize_file_name`: `realpath(path, NULL)`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: as the caller's.
    unsafe { realpath(path, std::ptr::null_mut()) }
}

/// `__realpath_chk`: what `realpath` compiles to with `_FORTIFY_SOURCE`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __realpath_chk(path: *const c_char, resolved: *mut c_char, size: libc::size_t) -> *mut c_char {
    if size < libc::PATH_MAX as usize {
        // SAFETY: passed on (the C library reports the overflow and stops the program).
        return unsafe { real::__realpath_chk(path, resolved, size) };
    }
    // SAFETY: as the caller's.
    unsafe { realpath(path, resolved) }
}

/// `euidaccess`: `faccessat(AT_FDCWD, path, how, AT_EACCESS)`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn euidaccess(path: *const c_char, how: c_int) -> c_int {
    // SAFETY: as the caller's.
    unsafe { faccessat(libc::AT_FDCWD, path, how, libc::AT_EACCESS) }
}

/// `eaccess`: as [`euidaccess`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eaccess(path: *const c_char, how: c_int) -> c_int {
    // SAFETY: as the caller's.
    unsafe { faccessat(libc::AT_FDCWD, path, how, libc::AT_EACCESS) }
}

/// Names a temporary file or directory may take: what glibc's tries.
const TEMP_TRIES: usize = 62 * 62 * 62;

/// Makes a temporary file or directory in a mount from `template` (its six
/// `X` before the last `suffix` bytes replaced in place, as glibc does),
/// with `make` (the new path) giving a descriptor, 0, or -1 with errno.
/// `None`: the template is not in a mount (the C library's own, which
/// calls the kernel directly, makes it).
fn make_temp(template: *mut c_char, suffix: c_int, make: impl Fn(*const c_char) -> c_int) -> Option<c_int> {
    let bytes = super::path_bytes(template).filter(|_| super::mounting())?;
    mount::resolve(libc::AT_FDCWD, bytes)?;
    let len = bytes.len();
    let suffix = usize::try_from(suffix).ok().filter(|&s| s <= len.saturating_sub(6));
    let Some(at) = suffix.map(|s| len - s - 6).filter(|&at| bytes[at..at + 6] == *b"XXXXXX") else {
        return Some(fail(libc::EINVAL));
    };
    const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = iopath::clock::now_ns() ^ (u64::from(std::process::id()) << 32) ^ (template as u64);
    for _ in 0..TEMP_TRIES {
        // splitmix64: a new six letters each try.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut v = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        v = (v ^ (v >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        for i in 0..6 {
            // SAFETY: `at + i` lies inside the caller's NUL-terminated template.
            unsafe { *template.add(at + i) = LETTERS[(v % 62) as usize] as c_char };
            v /= 62;
        }
        let made = make(template);
        if made >= 0 || super::last_errno() != libc::EEXIST {
            return Some(made);
        }
    }
    Some(fail(libc::EEXIST))
}

macro_rules! hook_mkstemp {
    ($($name:ident($($arg:ident: $ty:ty),*) => ($suffix:expr, $flags:expr);)*) => {$(
        /// `mkstemp` and its variants: in a mount, the file is made there
        /// (the C library's own opens it through the kernel directly).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(template: *mut c_char $(, $arg: $ty)*) -> c_int {
            let open_flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | ($flags & !libc::O_ACCMODE);
            let made = make_temp(template, $suffix, |path| {
                open_on_path(libc::AT_FDCWD, path, open_flags, 0o600).unwrap_or_else(|| fail(libc::ENOENT))
            });
            // SAFETY: passed on.
            made.unwrap_or_else(|| unsafe { real::$name(template $(, $arg)*) })
        }
    )*};
}
hook_mkstemp! {
    mkstemp() => (0, 0);
    mkstemp64() => (0, 0);
    mkostemp(flags: c_int) => (0, flags);
    mkostemp64(flags: c_int) => (0, flags);
    mkstemps(suffix: c_int) => (suffix, 0);
    mkstemps64(suffix: c_int) => (suffix, 0);
    mkostemps(suffix: c_int, flags: c_int) => (suffix, flags);
    mkostemps64(suffix: c_int, flags: c_int) => (suffix, flags);
}

/// `mkdtemp`: in a mount, the directory is made there (mode 0700).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    let made = make_temp(template, 0, |path| {
        on_path_nofollow(libc::AT_FDCWD, path, fail, |inside| mkdir_inside(inside, 0o700))
            .unwrap_or_else(|| fail(libc::ENOENT))
    });
    match made {
        // SAFETY: passed on.
        None => unsafe { real::mkdtemp(template) },
        Some(0) => template,
        Some(_) => std::ptr::null_mut(),
    }
}
