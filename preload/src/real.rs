//! The C library's own functions, found behind this library with
//! `dlsym(RTLD_NEXT)`: what every call goes to when iopath does not route it,
//! and what the routed paths use for the file position and sizes.

use libc::{c_char, c_int, c_long, c_uint, c_ulong, c_void, iovec, mode_t, off_t, size_t, ssize_t};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Declares a lazily resolved libc function: `real::NAME(args)` calls the
/// next definition of the symbol after this library.
macro_rules! next_symbol {
    ($($name:ident : fn($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        /// The C library's own function of this name.
        ///
        /// # Safety
        /// As the C function.
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let mut f = SLOT.load(Ordering::Relaxed);
            if f.is_null() {
                f = resolve(concat!(stringify!($name), "\0"));
                SLOT.store(f, Ordering::Relaxed);
            }
            // SAFETY: `f` is the C library's function with exactly this signature.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
            // SAFETY: passed on from the caller.
            unsafe { f($($arg),*) }
        }
    )*};
}

/// The next definition of the C function `name` after this library (the
/// process ends, saying so, if there is none).
pub fn next_function(name: &std::ffi::CStr) -> *mut c_void {
    resolve(&format!("{}\0", name.to_string_lossy()))
}

fn resolve(name: &str) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT looks past this library.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) };
    if f.is_null() {
        let msg = format!("iopath preload: the C library has no {}; cannot continue\n", name.trim_end_matches('\0'));
        // SAFETY: writing a buffer we own to stderr; abort is always sound.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    f
}

next_symbol! {
    open: fn(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    open64: fn(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    openat: fn(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    openat64: fn(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    creat: fn(path: *const c_char, mode: mode_t) -> c_int;
    creat64: fn(path: *const c_char, mode: mode_t) -> c_int;
    close: fn(fd: c_int) -> c_int;
    sigaction: fn(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    signal: fn(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    close_range: fn(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    dup: fn(fd: c_int) -> c_int;
    dup2: fn(fd: c_int, to: c_int) -> c_int;
    dup3: fn(fd: c_int, to: c_int, flags: c_int) -> c_int;
    pipe: fn(fds: *mut c_int) -> c_int;
    pipe2: fn(fds: *mut c_int, flags: c_int) -> c_int;
    socket: fn(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    socketpair: fn(domain: c_int, kind: c_int, protocol: c_int, fds: *mut c_int) -> c_int;
    accept: fn(fd: c_int, address: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    accept4: fn(fd: c_int, address: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: c_int) -> c_int;
    eventfd: fn(initial: c_uint, flags: c_int) -> c_int;
    epoll_create: fn(size: c_int) -> c_int;
    epoll_create1: fn(flags: c_int) -> c_int;
    memfd_create: fn(name: *const c_char, flags: c_uint) -> c_int;
    signalfd: fn(fd: c_int, mask: *const libc::sigset_t, flags: c_int) -> c_int;
    timerfd_create: fn(clock: c_int, flags: c_int) -> c_int;
    inotify_init: fn() -> c_int;
    inotify_init1: fn(flags: c_int) -> c_int;
    fcntl: fn(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    ioctl: fn(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int;
    fcntl64: fn(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    ftruncate: fn(fd: c_int, len: off_t) -> c_int;
    ftruncate64: fn(fd: c_int, len: off_t) -> c_int;
    pread: fn(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    pread64: fn(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    pwrite: fn(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    pwrite64: fn(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    preadv: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    preadv64: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    pwritev: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    pwritev64: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    preadv2: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    preadv64v2: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    pwritev2: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    pwritev64v2: fn(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    read: fn(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write: fn(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fsync: fn(fd: c_int) -> c_int;
    fdatasync: fn(fd: c_int) -> c_int;
    __open_2: fn(path: *const c_char, flags: c_int) -> c_int;
    __open64_2: fn(path: *const c_char, flags: c_int) -> c_int;
    __openat_2: fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    __openat64_2: fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    readv: fn(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    writev: fn(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    lseek: fn(fd: c_int, offset: off_t, whence: c_int) -> off_t;
    copy_file_range: fn(fd_in: c_int, off_in: *mut off_t, fd_out: c_int, off_out: *mut off_t, len: size_t, flags: c_uint) -> ssize_t;
    sendfile: fn(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t;
    sendfile64: fn(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t;
    lseek64: fn(fd: c_int, offset: off_t, whence: c_int) -> off_t;
    syncfs: fn(fd: c_int) -> c_int;
    sync_file_range: fn(fd: c_int, offset: off_t, n: off_t, flags: c_uint) -> c_int;
    fallocate: fn(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int;
    fallocate64: fn(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int;
    posix_fallocate: fn(fd: c_int, offset: off_t, len: off_t) -> c_int;
    posix_fallocate64: fn(fd: c_int, offset: off_t, len: off_t) -> c_int;
    posix_fadvise: fn(fd: c_int, offset: off_t, len: off_t, advice: c_int) -> c_int;
    posix_fadvise64: fn(fd: c_int, offset: off_t, len: off_t, advice: c_int) -> c_int;
    readahead: fn(fd: c_int, offset: off_t, count: size_t) -> ssize_t;
    mmap: fn(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void;
    mmap64: fn(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void;
    umask: fn(mask: mode_t) -> mode_t;
    unlink: fn(path: *const c_char) -> c_int;
    unlinkat: fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    rmdir: fn(path: *const c_char) -> c_int;
    mkdir: fn(path: *const c_char, mode: mode_t) -> c_int;
    mkdirat: fn(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    rename: fn(old: *const c_char, new: *const c_char) -> c_int;
    renameat: fn(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char) -> c_int;
    renameat2: fn(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_uint) -> c_int;
    access: fn(path: *const c_char, how: c_int) -> c_int;
    faccessat: fn(dirfd: c_int, path: *const c_char, how: c_int, flags: c_int) -> c_int;
    truncate: fn(path: *const c_char, len: off_t) -> c_int;
    truncate64: fn(path: *const c_char, len: off_t) -> c_int;
    stat: fn(path: *const c_char, out: *mut libc::stat) -> c_int;
    lstat: fn(path: *const c_char, out: *mut libc::stat) -> c_int;
    stat64: fn(path: *const c_char, out: *mut libc::stat64) -> c_int;
    lstat64: fn(path: *const c_char, out: *mut libc::stat64) -> c_int;
    fstat: fn(fd: c_int, out: *mut libc::stat) -> c_int;
    fstat64: fn(fd: c_int, out: *mut libc::stat64) -> c_int;
    fstatat: fn(dirfd: c_int, path: *const c_char, out: *mut libc::stat, flags: c_int) -> c_int;
    fstatat64: fn(dirfd: c_int, path: *const c_char, out: *mut libc::stat64, flags: c_int) -> c_int;
    __xstat: fn(version: c_int, path: *const c_char, out: *mut libc::stat) -> c_int;
    __lxstat: fn(version: c_int, path: *const c_char, out: *mut libc::stat) -> c_int;
    __xstat64: fn(version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int;
    __lxstat64: fn(version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int;
    __fxstat: fn(version: c_int, fd: c_int, out: *mut libc::stat) -> c_int;
    __fxstat64: fn(version: c_int, fd: c_int, out: *mut libc::stat64) -> c_int;
    __fxstatat: fn(version: c_int, dirfd: c_int, path: *const c_char, out: *mut libc::stat, flags: c_int) -> c_int;
    __fxstatat64: fn(version: c_int, dirfd: c_int, path: *const c_char, out: *mut libc::stat64, flags: c_int) -> c_int;
    statx: fn(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, out: *mut libc::statx) -> c_int;
    syscall: fn(number: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long;
    opendir: fn(path: *const c_char) -> *mut c_void;
    fdopendir: fn(fd: c_int) -> *mut c_void;
    readdir: fn(dir: *mut c_void) -> *mut libc::dirent64;
    readdir64: fn(dir: *mut c_void) -> *mut libc::dirent64;
    rewinddir: fn(dir: *mut c_void) -> ();
    telldir: fn(dir: *mut c_void) -> c_long;
    seekdir: fn(dir: *mut c_void, at: c_long) -> ();
    dirfd: fn(dir: *mut c_void) -> c_int;
    closedir: fn(dir: *mut c_void) -> c_int;
    scandirat: fn(dirfd: c_int, path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: crate::posix::directories::ScanFilter, compare: crate::posix::directories::ScanCompare) -> c_int;
    scandirat64: fn(dirfd: c_int, path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: crate::posix::directories::ScanFilter, compare: crate::posix::directories::ScanCompare) -> c_int;
    nftw: fn(root: *const c_char, call: Option<crate::posix::directories::NftwFn>, open_max: c_int, flags: c_int) -> c_int;
    nftw64: fn(root: *const c_char, call: Option<crate::posix::directories::NftwFn>, open_max: c_int, flags: c_int) -> c_int;
    ftw: fn(root: *const c_char, call: Option<crate::posix::directories::FtwFn>, open_max: c_int) -> c_int;
    ftw64: fn(root: *const c_char, call: Option<crate::posix::directories::FtwFn>, open_max: c_int) -> c_int;
    glob: fn(pattern: *const c_char, flags: c_int, errors: crate::posix::directories::GlobErr, out: *mut crate::posix::directories::GlobT) -> c_int;
    glob64: fn(pattern: *const c_char, flags: c_int, errors: crate::posix::directories::GlobErr, out: *mut crate::posix::directories::GlobT) -> c_int;
    flock: fn(fd: c_int, operation: c_int) -> c_int;
    fopen: fn(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fopen64: fn(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fdopen: fn(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    freopen: fn(path: *const c_char, mode: *const c_char, file: *mut libc::FILE) -> *mut libc::FILE;
    freopen64: fn(path: *const c_char, mode: *const c_char, file: *mut libc::FILE) -> *mut libc::FILE;
    fileno: fn(file: *mut libc::FILE) -> c_int;
    fileno_unlocked: fn(file: *mut libc::FILE) -> c_int;
    chmod: fn(path: *const c_char, mode: mode_t) -> c_int;
    fchmod: fn(fd: c_int, mode: mode_t) -> c_int;
    fchmodat: fn(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
    utimensat: fn(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int;
    futimens: fn(fd: c_int, times: *const libc::timespec) -> c_int;
    utimes: fn(path: *const c_char, times: *const libc::timeval) -> c_int;
    setuid: fn(uid: libc::uid_t) -> c_int;
    seteuid: fn(uid: libc::uid_t) -> c_int;
    setreuid: fn(ruid: libc::uid_t, euid: libc::uid_t) -> c_int;
    setresuid: fn(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int;
    setgid: fn(gid: libc::gid_t) -> c_int;
    setegid: fn(gid: libc::gid_t) -> c_int;
    setregid: fn(rgid: libc::gid_t, egid: libc::gid_t) -> c_int;
    setresgid: fn(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t) -> c_int;
    lutimes: fn(path: *const c_char, times: *const libc::timeval) -> c_int;
    futimes: fn(fd: c_int, times: *const libc::timeval) -> c_int;
    futimesat: fn(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int;
    utime: fn(path: *const c_char, times: *const libc::utimbuf) -> c_int;
    lchmod: fn(path: *const c_char, mode: mode_t) -> c_int;
    chown: fn(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    lchown: fn(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fchown: fn(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fchownat: fn(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int;
    statfs: fn(path: *const c_char, out: *mut libc::statfs) -> c_int;
    statfs64: fn(path: *const c_char, out: *mut libc::statfs64) -> c_int;
    fstatfs: fn(fd: c_int, out: *mut libc::statfs) -> c_int;
    fstatfs64: fn(fd: c_int, out: *mut libc::statfs64) -> c_int;
    statvfs: fn(path: *const c_char, out: *mut libc::statvfs) -> c_int;
    statvfs64: fn(path: *const c_char, out: *mut libc::statvfs64) -> c_int;
    fstatvfs: fn(fd: c_int, out: *mut libc::statvfs) -> c_int;
    fstatvfs64: fn(fd: c_int, out: *mut libc::statvfs64) -> c_int;
    pathconf: fn(path: *const c_char, name: c_int) -> libc::c_long;
    fpathconf: fn(fd: c_int, name: c_int) -> libc::c_long;
    chdir: fn(path: *const c_char) -> c_int;
    fchdir: fn(fd: c_int) -> c_int;
    getcwd: fn(buf: *mut c_char, size: size_t) -> *mut c_char;
    get_current_dir_name: fn() -> *mut c_char;
    getxattr: fn(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    lgetxattr: fn(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fgetxattr: fn(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    listxattr: fn(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    llistxattr: fn(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    flistxattr: fn(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t;
    setxattr: fn(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    lsetxattr: fn(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fsetxattr: fn(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    removexattr: fn(path: *const c_char, name: *const c_char) -> c_int;
    lremovexattr: fn(path: *const c_char, name: *const c_char) -> c_int;
    fremovexattr: fn(fd: c_int, name: *const c_char) -> c_int;
    _exit: fn(status: c_int) -> !;
    symlink: fn(target: *const c_char, path: *const c_char) -> c_int;
    symlinkat: fn(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int;
    link: fn(old: *const c_char, new: *const c_char) -> c_int;
    linkat: fn(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: c_int) -> c_int;
    readlink: fn(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
    realpath: fn(path: *const c_char, resolved: *mut c_char) -> *mut c_char;
    __realpath_chk: fn(path: *const c_char, resolved: *mut c_char, size: size_t) -> *mut c_char;
    mkstemp: fn(template: *mut c_char) -> c_int;
    mkstemp64: fn(template: *mut c_char) -> c_int;
    mkostemp: fn(template: *mut c_char, flags: c_int) -> c_int;
    mkostemp64: fn(template: *mut c_char, flags: c_int) -> c_int;
    mkstemps: fn(template: *mut c_char, suffix: c_int) -> c_int;
    mkstemps64: fn(template: *mut c_char, suffix: c_int) -> c_int;
    mkostemps: fn(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int;
    mkostemps64: fn(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int;
    mkdtemp: fn(template: *mut c_char) -> *mut c_char;
    readlinkat: fn(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
    mknodat: fn(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int;
    posix_spawn: fn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    execve: fn(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execvpe: fn(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    posix_spawnp: fn(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    posix_spawn_file_actions_init: fn(actions: *mut libc::posix_spawn_file_actions_t) -> c_int;
    posix_spawn_file_actions_destroy: fn(actions: *mut libc::posix_spawn_file_actions_t) -> c_int;
    posix_spawn_file_actions_addopen: fn(actions: *mut libc::posix_spawn_file_actions_t, fd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    posix_spawn_file_actions_addclose: fn(actions: *mut libc::posix_spawn_file_actions_t, fd: c_int) -> c_int;
    posix_spawn_file_actions_adddup2: fn(actions: *mut libc::posix_spawn_file_actions_t, fd: c_int, to: c_int) -> c_int;
    posix_spawn_file_actions_addchdir_np: fn(actions: *mut libc::posix_spawn_file_actions_t, path: *const c_char) -> c_int;
    posix_spawn_file_actions_addfchdir_np: fn(actions: *mut libc::posix_spawn_file_actions_t, fd: c_int) -> c_int;
    posix_spawn_file_actions_addclosefrom_np: fn(actions: *mut libc::posix_spawn_file_actions_t, from: c_int) -> c_int;
    posix_spawn_file_actions_addtcsetpgrp_np: fn(actions: *mut libc::posix_spawn_file_actions_t, fd: c_int) -> c_int;
    waitpid: fn(pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t;
    wait: fn(status: *mut c_int) -> libc::pid_t;
    wait3: fn(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t;
    wait4: fn(pid: libc::pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t;
    waitid: fn(idtype: libc::idtype_t, id: libc::id_t, info: *mut libc::siginfo_t, options: c_int) -> c_int;
}

/// The file position of `fd` (the kernel's, shared by its duplicates), or -1.
pub fn position(fd: c_int) -> off_t {
    // SAFETY: lseek only reads and sets the descriptor's offset.
    unsafe { lseek(fd, 0, libc::SEEK_CUR) }
}

/// Sets the file position of `fd`.
pub fn set_position(fd: c_int, pos: off_t) {
    // SAFETY: as above.
    unsafe { lseek(fd, pos, libc::SEEK_SET) };
}
