//! Directories: opendir, fdopendir, readdir(64), rewinddir, telldir,
//! seekdir, closedir and dirfd on mounted directories; and the C library's
//! walkers of directories (scandir, nftw and ftw, glob), whose own code
//! calls the kernel directly and would find nothing in a mount.
//!
//! A mounted directory's stream is iopath's own (`DirStream`), handed to
//! the program as its `DIR *`; the hooks know theirs from a set of the
//! pointers they made. Its entries are those of the directory when it was
//! opened or rewound, `.` and `..` first, as a snapshot (POSIX leaves
//! entries added or removed meanwhile unspecified).

use super::{fail, on_fd, on_path};
use crate::mount::{self, Node};
use crate::real;
use iopath::fs::Kind;
use libc::{c_char, c_int, c_long, c_void};
use std::collections::HashSet;
use std::sync::Mutex;

/// A mounted directory's stream.
struct DirStream {
    /// Its descriptor (a mounted one: closed with the stream).
    fd: c_int,
    entries: Vec<(Vec<u8>, u64, u8)>,
    next: usize,
    entry: libc::dirent64,
}

/// The streams this library made (addresses).
static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// The list of streams, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&STREAMS)
}

fn ours(dir: *mut c_void) -> Option<&'static mut DirStream> {
    let streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    if streams.as_ref()?.contains(&(dir as usize)) {
        // SAFETY: the address is a live DirStream this library boxed (taken out on closedir);
        // a stream is used by one thread at a time (POSIX).
        Some(unsafe { &mut *dir.cast::<DirStream>() })
    } else {
        None
    }
}

/// Snapshots the entries of the mounted directory `fd` stands for.
fn snapshot(fd: c_int) -> Result<Vec<(Vec<u8>, u64, u8)>, c_int> {
    let d = mount::lookup(fd).ok_or(libc::EBADF)?;
    if !matches!(d.node, Node::Dir) {
        return Err(libc::ENOTDIR);
    }
    let fs = d.mount.fs()?;
    let own = fs.metadata(&d.path).map_err(|e| super::errno_of(&e))?;
    let parent_path = {
        let mut p = d.path.clone();
        p.extend_from_slice(b"/..");
        p
    };
    let parent = fs.metadata(&parent_path).map(|m| m.ino).unwrap_or(own.ino);
    let mut entries = vec![(b".".to_vec(), own.ino, libc::DT_DIR), (b"..".to_vec(), parent, libc::DT_DIR)];
    for e in fs.read_dir(&d.path).map_err(|e| super::errno_of(&e))? {
        let kind = match e.kind {
            Kind::Dir => libc::DT_DIR,
            Kind::Symlink => libc::DT_LNK,
            Kind::Fifo => libc::DT_FIFO,
            Kind::File => libc::DT_REG,
        };
        entries.push((e.name, e.ino, kind));
    }
    Ok(entries)
}

/// A stream over mounted directory descriptor `fd`, or NULL with errno.
fn open_stream(fd: c_int) -> *mut c_void {
    let entries = match snapshot(fd) {
        Ok(e) => e,
        Err(e) => {
            crate::set_errno(e);
            return std::ptr::null_mut();
        }
    };
    // SAFETY: all-zero is a valid dirent64.
    let entry: libc::dirent64 = unsafe { std::mem::zeroed() };
    let stream = Box::into_raw(Box::new(DirStream { fd, entries, next: 0, entry })).cast::<c_void>();
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(stream as usize);
    stream
}

/// `opendir`: a mounted directory's stream, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut c_void {
    let mounted = on_path(
        libc::AT_FDCWD,
        path,
        |e| {
            crate::set_errno(e);
            std::ptr::null_mut()
        },
        open_inside,
    );
    mounted.unwrap_or_else(|| {
        // SAFETY: passed on.
        let dir = unsafe { real::opendir(super::kernel(libc::AT_FDCWD, path).ptr()) };
        if !dir.is_null()
            && super::mounting()
            && !crate::FORKED.load(std::sync::atomic::Ordering::Relaxed) // (no warning: a kernel opendir)
            && let Some(bytes) = super::path_bytes(path)
        {
            let _inside = crate::Inside::enter();
            // SAFETY: the stream just opened.
            let fd = unsafe { real::dirfd(dir) };
            if let Some(mount) = super::paths::mount_dir_behind(fd) {
                // The mount's own directory through a kernel link: the mount's root, not
                // the empty directory under it.
                // SAFETY: the stream just opened, closed once.
                unsafe { real::closedir(dir) };
                return open_inside(mount::Inside { mount, path: b"/".to_vec() });
            }
            mount::kernel_dir_opened(libc::AT_FDCWD, bytes, fd);
        }
        dir
    })
}

/// A stream over the mounted directory `inside`, or NULL with errno.
fn open_inside(inside: mount::Inside) -> *mut c_void {
    let fd = super::paths::open_inside(inside, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0);
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let stream = open_stream(fd);
    if stream.is_null() {
        let errno = super::last_errno();
        // SAFETY: our own descriptor.
        unsafe { super::descriptors::close(fd) };
        crate::set_errno(errno);
    }
    stream
}

/// `fdopendir`: a stream over a mounted directory descriptor (which the
/// stream then owns), or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut c_void {
    let mounted = on_fd(
        fd,
        |e| {
            crate::set_errno(e);
            std::ptr::null_mut()
        },
        |d| {
            if !super::metadata::is_dir(d) {
                crate::set_errno(libc::ENOTDIR);
                return std::ptr::null_mut();
            }
            open_stream(fd)
        },
    );
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::fdopendir(fd) })
}

/// The next entry of one of our streams, or NULL at the end.
fn next_entry(stream: &mut DirStream) -> *mut libc::dirent64 {
    let Some((name, ino, kind)) = stream.entries.get(stream.next) else { return std::ptr::null_mut() };
    stream.next += 1;
    let e = &mut stream.entry;
    e.d_ino = *ino;
    e.d_off = stream.next as i64;
    e.d_type = *kind;
    let len = name.len().min(e.d_name.len() - 1);
    for (dst, &src) in e.d_name.iter_mut().zip(&name[..len]) {
        *dst = src as c_char;
    }
    e.d_name[len] = 0;
    e.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    e
}

/// `readdir`: the next entry of a mounted directory's stream, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir(dir: *mut c_void) -> *mut libc::dirent64 {
    match ours(dir) {
        Some(stream) => next_entry(stream),
        // SAFETY: passed on.
        None => unsafe { real::readdir(dir) },
    }
}

/// `readdir64`: as [`readdir`] (the same layout on 64-bit Linux).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir64(dir: *mut c_void) -> *mut libc::dirent64 {
    match ours(dir) {
        Some(stream) => next_entry(stream),
        // SAFETY: passed on.
        None => unsafe { real::readdir64(dir) },
    }
}

/// `rewinddir`: a fresh snapshot of a mounted directory.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rewinddir(dir: *mut c_void) {
    match ours(dir) {
        Some(stream) => {
            let _inside = crate::Inside::enter();
            if let Ok(entries) = snapshot(stream.fd) {
                stream.entries = entries;
            }
            stream.next = 0;
        }
        // SAFETY: passed on.
        None => unsafe { real::rewinddir(dir) },
    }
}

/// `telldir`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn telldir(dir: *mut c_void) -> c_long {
    match ours(dir) {
        Some(stream) => stream.next as c_long,
        // SAFETY: passed on.
        None => unsafe { real::telldir(dir) },
    }
}

/// `seekdir`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn seekdir(dir: *mut c_void, at: c_long) {
    match ours(dir) {
        Some(stream) => stream.next = at.max(0) as usize,
        // SAFETY: passed on.
        None => unsafe { real::seekdir(dir, at) },
    }
}

/// `dirfd`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dirfd(dir: *mut c_void) -> c_int {
    match ours(dir) {
        Some(stream) => stream.fd,
        // SAFETY: passed on.
        None => unsafe { real::dirfd(dir) },
    }
}

/// `closedir`: a mounted stream and its descriptor, or the C library's.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closedir(dir: *mut c_void) -> c_int {
    let taken = STREAMS.lock().unwrap_or_else(|e| e.into_inner()).as_mut().is_some_and(|s| s.remove(&(dir as usize)));
    if !taken {
        // SAFETY: the caller's open stream.
        mount::kernel_dir_closed(unsafe { real::dirfd(dir) });
        // SAFETY: passed on.
        return unsafe { real::closedir(dir) };
    }
    // SAFETY: ours, boxed by open_stream and now out of the set: freed once.
    let stream = unsafe { Box::from_raw(dir.cast::<DirStream>()) };
    // SAFETY: the stream's own descriptor.
    let r = unsafe { super::descriptors::close(stream.fd) };
    if r < 0 { fail(super::last_errno()) } else { 0 }
}

fn null_with(errno: c_int) -> *mut c_void {
    crate::set_errno(errno);
    std::ptr::null_mut()
}

/// scandir's filter and comparison (`const struct dirent *`, `const struct dirent **`).
pub(crate) type ScanFilter = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
pub(crate) type ScanCompare =
    Option<unsafe extern "C" fn(*const *const libc::dirent64, *const *const libc::dirent64) -> c_int>;

/// scandir over one of our streams: the entries `filter` keeps, each copied
/// into memory of its own, in an array of their own, sorted with `compare`
/// (all from `malloc`, for the caller to `free`). Closes the stream.
fn scan(stream: *mut c_void, list: *mut *mut *mut libc::dirent64, filter: ScanFilter, compare: ScanCompare) -> c_int {
    let mut kept: Vec<*mut libc::dirent64> = Vec::new();
    let free_all = |kept: &[*mut libc::dirent64]| {
        // SAFETY: each came from malloc below and is freed once.
        kept.iter().for_each(|&e| unsafe { libc::free(e.cast()) });
    };
    let Some(dir) = ours(stream) else { return fail(libc::EBADF) };
    loop {
        let entry = next_entry(dir);
        if entry.is_null() {
            break;
        }
        // The filter may call back into this library (a stat of the entry): no lock is held.
        let keep = match filter {
            // SAFETY: the caller's function, on an entry of ours.
            Some(keep) => (unsafe { keep(entry) }) != 0,
            None => true,
        };
        if !keep {
            continue;
        }
        // SAFETY: malloc of a size.
        let copy = unsafe { libc::malloc(std::mem::size_of::<libc::dirent64>()) }.cast::<libc::dirent64>();
        if copy.is_null() {
            free_all(&kept);
            // SAFETY: our stream, closed once.
            unsafe { closedir(stream) };
            return fail(libc::ENOMEM);
        }
        // SAFETY: both hold one dirent64.
        unsafe { copy.write(entry.read()) };
        kept.push(copy);
    }
    // SAFETY: our stream, closed once.
    unsafe { closedir(stream) };
    let bytes = std::mem::size_of::<*mut libc::dirent64>() * kept.len().max(1);
    // SAFETY: malloc of a size.
    let array = unsafe { libc::malloc(bytes) }.cast::<*mut libc::dirent64>();
    if array.is_null() {
        free_all(&kept);
        return fail(libc::ENOMEM);
    }
    // SAFETY: the array holds kept.len() pointers; the caller's list is writable (the C contract).
    unsafe {
        std::ptr::copy_nonoverlapping(kept.as_ptr(), array, kept.len());
        if let Some(compare) = compare {
            // qsort hands the comparison pointers to two of the array's elements, as scandir does.
            let compare: unsafe extern "C" fn(*const c_void, *const c_void) -> c_int = std::mem::transmute(compare);
            libc::qsort(array.cast(), kept.len(), std::mem::size_of::<*mut libc::dirent64>(), Some(compare));
        }
        *list = array;
    }
    kept.len() as c_int
}

macro_rules! hook_scandirat {
    ($($name:ident),*) => {$(
        /// `scandirat`: a mounted directory's entries (the C library's own
        /// opens the directory through the kernel directly).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            list: *mut *mut *mut libc::dirent64,
            filter: ScanFilter,
            compare: ScanCompare,
        ) -> c_int {
            // The stream is opened here; the caller's functions run after, outside this library.
            match on_path(dirfd, path, null_with, open_inside) {
                None => {
                    // SAFETY: passed on.
                    unsafe { real::$name(dirfd, super::kernel(dirfd, path).ptr(), list, filter, compare) }
                }
                Some(stream) if stream.is_null() => -1,
                Some(stream) => scan(stream, list, filter, compare),
            }
        }
    )*};
}
hook_scandirat!(scandirat, scandirat64);

macro_rules! hook_scandir {
    ($($name:ident => $at:ident),*) => {$(
        /// `scandir`: `scandirat(AT_FDCWD, ...)`.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            list: *mut *mut *mut libc::dirent64,
            filter: ScanFilter,
            compare: ScanCompare,
        ) -> c_int {
            // SAFETY: as the caller's.
            unsafe { $at(libc::AT_FDCWD, path, list, filter, compare) }
        }
    )*};
}
hook_scandir!(scandir => scandirat, scandir64 => scandirat64);

/// `struct FTW`: where the last name starts in the path, and its depth.
#[repr(C)]
pub struct Ftw {
    base: c_int,
    level: c_int,
}

/// nftw's type flags and flags (<ftw.h>).
const FTW_F: c_int = 0;
const FTW_D: c_int = 1;
const FTW_DNR: c_int = 2;
const FTW_NS: c_int = 3;
const FTW_SL: c_int = 4;
const FTW_DP: c_int = 5;
const FTW_SLN: c_int = 6;
const FTW_PHYS: c_int = 1;
const FTW_MOUNT: c_int = 2;
const FTW_CHDIR: c_int = 4;
const FTW_DEPTH: c_int = 8;
const FTW_ACTIONRETVAL: c_int = 16;
const FTW_STOP: c_int = 1;
const FTW_SKIP_SUBTREE: c_int = 2;
const FTW_SKIP_SIBLINGS: c_int = 3;

pub(crate) type NftwFn = unsafe extern "C" fn(*const c_char, *const libc::stat, c_int, *mut Ftw) -> c_int;
pub(crate) type FtwFn = unsafe extern "C" fn(*const c_char, *const libc::stat, c_int) -> c_int;

/// What the walk does after a call of the caller's function.
enum Flow {
    Go,
    SkipSubtree,
    SkipSiblings,
    /// Stop, and return this.
    Stop(c_int),
}

/// An nftw of a tree in a mount, through this library's own hooks (so a
/// link that leads out of the mount is followed where it leads).
struct Walk<'a> {
    call: &'a dyn Fn(&std::ffi::CStr, &libc::stat, c_int, &mut Ftw) -> c_int,
    flags: c_int,
    /// The working directory when the walk began (absolute): the paths the
    /// caller gave are relative to it, and FTW_CHDIR moves away from it.
    start: Vec<u8>,
    root_dev: u64,
    /// Directories entered (device, inode), when links are followed.
    seen: HashSet<(u64, u64)>,
}

fn cstring(bytes: &[u8]) -> std::ffi::CString {
    std::ffi::CString::new(bytes).unwrap_or_default()
}

impl Walk<'_> {
    fn absolute(&self, path: &[u8]) -> Vec<u8> {
        if path.starts_with(b"/") {
            return path.to_vec();
        }
        let mut out = self.start.clone();
        out.push(b'/');
        out.extend_from_slice(path);
        out
    }

    /// Calls the caller's function on `path` (its last name at `base`) with
    /// the working directory its parent, if FTW_CHDIR asks for that.
    fn report(&self, path: &[u8], base: usize, level: c_int, st: &libc::stat, kind: c_int) -> Flow {
        if self.flags & FTW_CHDIR != 0 {
            let parent = self.absolute(&path[..base]);
            // SAFETY: a NUL-terminated path of ours; this library's own chdir.
            unsafe { super::paths::chdir(cstring(&parent).as_ptr()) };
        }
        let mut ftw = Ftw { base: base as c_int, level };
        let r = (self.call)(&cstring(path), st, kind, &mut ftw);
        match r {
            0 => Flow::Go,
            FTW_SKIP_SUBTREE if self.flags & FTW_ACTIONRETVAL != 0 => Flow::SkipSubtree,
            FTW_SKIP_SIBLINGS if self.flags & FTW_ACTIONRETVAL != 0 => Flow::SkipSiblings,
            FTW_STOP if self.flags & FTW_ACTIONRETVAL != 0 => Flow::Stop(FTW_STOP),
            _ if self.flags & FTW_ACTIONRETVAL != 0 => Flow::Go,
            r => Flow::Stop(r),
        }
    }

    /// Visits `path` (its last name at `base`) and, if it is a directory, what is under it.
    fn visit(&mut self, path: &mut Vec<u8>, base: usize, level: c_int) -> Flow {
        let abs = cstring(&self.absolute(path));
        // SAFETY: all-zero is a valid struct stat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let phys = self.flags & FTW_PHYS != 0;
        // SAFETY: a NUL-terminated path and a buffer of ours; this library's own hooks.
        let found = unsafe {
            if phys {
                super::metadata::lstat(abs.as_ptr(), &mut st)
            } else {
                super::metadata::stat(abs.as_ptr(), &mut st)
            }
        } == 0;
        if !found {
            // A link whose target is missing, or nothing that can be looked at.
            // SAFETY: as above.
            let dangling = !phys && unsafe { super::metadata::lstat(abs.as_ptr(), &mut st) } == 0;
            let kind = if dangling && st.st_mode & libc::S_IFMT == libc::S_IFLNK { FTW_SLN } else { FTW_NS };
            return self.report(path, base, level, &st, kind);
        }
        if self.flags & FTW_MOUNT != 0 && st.st_dev != self.root_dev {
            return Flow::Go;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => self.directory(path, base, level, &st, &abs),
            libc::S_IFLNK => self.report(path, base, level, &st, FTW_SL),
            _ => self.report(path, base, level, &st, FTW_F),
        }
    }

    fn directory(
        &mut self,
        path: &mut Vec<u8>,
        base: usize,
        level: c_int,
        st: &libc::stat,
        abs: &std::ffi::CStr,
    ) -> Flow {
        if self.flags & FTW_PHYS == 0 && !self.seen.insert((st.st_dev, st.st_ino)) {
            return Flow::Go; // reached again through a link: once is enough
        }
        // SAFETY: a NUL-terminated path; this library's own opendir.
        let stream = unsafe { opendir(abs.as_ptr()) };
        if stream.is_null() {
            return self.report(path, base, level, st, FTW_DNR);
        }
        let mut names = Vec::new();
        loop {
            // SAFETY: the stream opened above; this library's own readdir.
            let entry = unsafe { readdir(stream) };
            if entry.is_null() {
                break;
            }
            // SAFETY: readdir's entry holds a NUL-terminated name.
            let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        // SAFETY: the stream opened above, closed once.
        unsafe { closedir(stream) };
        if self.flags & FTW_DEPTH == 0 {
            match self.report(path, base, level, st, FTW_D) {
                Flow::Go => {}
                Flow::SkipSubtree => return Flow::Go,
                other => return other,
            }
        }
        let len = path.len();
        for name in names {
            if !path.ends_with(b"/") {
                path.push(b'/');
            }
            let child_base = path.len();
            path.extend_from_slice(&name);
            let flow = self.visit(path, child_base, level + 1);
            path.truncate(len);
            match flow {
                Flow::Go | Flow::SkipSubtree => {}
                Flow::SkipSiblings => break,
                stop @ Flow::Stop(_) => return stop,
            }
        }
        if self.flags & FTW_DEPTH != 0 {
            return match self.report(path, base, level, st, FTW_DP) {
                Flow::Stop(r) => Flow::Stop(r),
                _ => Flow::Go,
            };
        }
        Flow::Go
    }
}

/// nftw of `root` if it lies in a mount (`None`: it does not, and the C
/// library's own walks it).
fn walk_mounted(
    root: *const c_char,
    flags: c_int,
    call: &dyn Fn(&std::ffi::CStr, &libc::stat, c_int, &mut Ftw) -> c_int,
) -> Option<c_int> {
    let bytes = super::path_bytes(root).filter(|_| super::mounting())?;
    mount::resolve(libc::AT_FDCWD, bytes)?;
    let start = mount::cwd().map(|c| c.to_vec()).unwrap_or_else(|| b"/".to_vec());
    let mut walk = Walk { call, flags, start, root_dev: 0, seen: HashSet::new() };
    let abs = cstring(&walk.absolute(bytes));
    // SAFETY: all-zero is a valid struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // The root must be there (the C library's nftw fails then, calling nothing).
    // SAFETY: a NUL-terminated path and a buffer of ours; this library's own hook.
    if unsafe { super::metadata::lstat(abs.as_ptr(), &mut st) } != 0 {
        return Some(-1);
    }
    walk.root_dev = st.st_dev;
    // The root as the C library reports it: without trailing slashes ("/" stays).
    let mut path = bytes[..bytes.iter().rposition(|&b| b != b'/').map_or(1, |i| i + 1)].to_vec();
    let base = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let result = match walk.visit(&mut path, base, 0) {
        Flow::Stop(r) => r,
        _ => 0,
    };
    if flags & FTW_CHDIR != 0 {
        // SAFETY: a NUL-terminated path of ours; this library's own chdir.
        unsafe { super::paths::chdir(cstring(&walk.start).as_ptr()) };
    }
    Some(result)
}

macro_rules! hook_nftw {
    ($($name:ident),*) => {$(
        /// `nftw`: a walk of a tree in a mount (the C library's own looks at
        /// each name through the kernel directly).
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(root: *const c_char, call: Option<NftwFn>, open_max: c_int, flags: c_int) -> c_int {
            let Some(f) = call else {
                // SAFETY: passed on.
                return unsafe { real::$name(root, call, open_max, flags) };
            };
            // SAFETY: the caller's function, with a path, a stat and an FTW of ours.
            let call = |path: &std::ffi::CStr, st: &libc::stat, kind, ftw: &mut Ftw| unsafe { f(path.as_ptr(), st, kind, ftw) };
            // SAFETY: passed on.
            walk_mounted(root, flags, &call).unwrap_or_else(|| unsafe { real::$name(root, Some(f), open_max, flags) })
        }
    )*};
}
hook_nftw!(nftw, nftw64);

macro_rules! hook_ftw {
    ($($name:ident),*) => {$(
        /// `ftw`: as [`nftw`] with no flags, of a three-argument function.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(root: *const c_char, call: Option<FtwFn>, open_max: c_int) -> c_int {
            let Some(f) = call else {
                // SAFETY: passed on.
                return unsafe { real::$name(root, call, open_max) };
            };
            // SAFETY: the caller's function, with a path and a stat of ours.
            let call = |path: &std::ffi::CStr, st: &libc::stat, kind, _: &mut Ftw| unsafe { f(path.as_ptr(), st, kind) };
            // SAFETY: passed on.
            walk_mounted(root, 0, &call).unwrap_or_else(|| unsafe { real::$name(root, Some(f), open_max) })
        }
    )*};
}
hook_ftw!(ftw, ftw64);

/// glibc's `glob_t` (and `glob64_t`: the same layout on 64-bit Linux), with
/// the directory functions `GLOB_ALTDIRFUNC` makes it call.
#[repr(C)]
pub struct GlobT {
    pathc: libc::size_t,
    pathv: *mut *mut c_char,
    offs: libc::size_t,
    flags: c_int,
    closedir: Option<unsafe extern "C" fn(*mut c_void)>,
    readdir: Option<unsafe extern "C" fn(*mut c_void) -> *mut libc::dirent64>,
    opendir: Option<unsafe extern "C" fn(*const c_char) -> *mut c_void>,
    lstat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int>,
    stat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int>,
}

const GLOB_ALTDIRFUNC: c_int = 1 << 9;

pub(crate) type GlobErr = Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>;

unsafe extern "C" fn glob_closedir(dir: *mut c_void) {
    // SAFETY: a stream glob opened with `opendir` below.
    unsafe { closedir(dir) };
}

macro_rules! hook_glob {
    ($($name:ident),*) => {$(
        /// `glob`: the C library's, made to read directories and look at
        /// names through this library's hooks (`GLOB_ALTDIRFUNC`), which
        /// serve a mount's and pass the others on: its own calls go to the
        /// kernel directly.
        ///
        /// # Safety
        /// As the C function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(pattern: *const c_char, flags: c_int, errors: GlobErr, out: *mut GlobT) -> c_int {
            if !super::mounting() || out.is_null() || flags & GLOB_ALTDIRFUNC != 0 {
                // SAFETY: passed on.
                return unsafe { real::$name(pattern, flags, errors, out) };
            }
            // SAFETY: the caller's glob_t (the C contract).
            unsafe {
                (*out).closedir = Some(glob_closedir);
                (*out).readdir = Some(readdir);
                (*out).opendir = Some(opendir);
                (*out).lstat = Some(super::metadata::lstat);
                (*out).stat = Some(super::metadata::stat);
                let r = real::$name(pattern, flags | GLOB_ALTDIRFUNC, errors, out);
                (*out).flags &= !GLOB_ALTDIRFUNC;
                r
            }
        }
    )*};
}
hook_glob!(glob, glob64);
