//! Directories: opendir, fdopendir, readdir(64), rewinddir, telldir,
//! seekdir, closedir and dirfd on mounted directories.
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
        |inside| {
            let fd = super::paths::open_inside(inside, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0);
            if fd < 0 {
                return std::ptr::null_mut();
            }
            let stream = open_stream(fd);
            if stream.is_null() {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
                // SAFETY: our own descriptor.
                unsafe { super::descriptors::close(fd) };
                crate::set_errno(errno);
            }
            stream
        },
    );
    // SAFETY: passed on.
    mounted.unwrap_or_else(|| unsafe { real::opendir(super::kernel(libc::AT_FDCWD, path).ptr()) })
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
        // SAFETY: passed on.
        return unsafe { real::closedir(dir) };
    }
    // SAFETY: ours, boxed by open_stream and now out of the set: freed once.
    let stream = unsafe { Box::from_raw(dir.cast::<DirStream>()) };
    // SAFETY: the stream's own descriptor.
    let r = unsafe { super::descriptors::close(stream.fd) };
    if r < 0 { fail(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF)) } else { 0 }
}
