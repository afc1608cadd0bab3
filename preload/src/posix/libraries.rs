//! Shared libraries: `dlopen` and `dlmopen` of a library stored on a mount.
//!
//! The C library's loader opens and maps a library with its own system
//! calls, out of this library's reach, and the kernel cannot open a file it
//! does not hold: rustc's proc macros built into a target directory on a
//! mount, Python's extension modules in a virtual environment there, a
//! plugin a program built itself, all failed with "cannot open shared
//! object file". So a path naming a mounted file is replaced by a memfd
//! holding a copy of the file's bytes (`/proc/self/fd/N`), as the exec of a
//! program stored on a mount is (`processes.rs`). The copy is kept and used
//! again for the same file (inode) as the loader treats the same file: a
//! second `dlopen` of a library gives the same handle, also after it was
//! rebuilt in place while loaded, and one closed and rebuilt since loads
//! the new bytes. A copy that a newer one of the same file replaced is
//! closed once the loader does not have it and [`GRACE`] has passed (a
//! program that rebuilds and loads a plugin over and over kept one copy
//! of every version in memory). A library found by a bare name (no
//! `/`) is the loader's to search for, as before.
//!
//! Both are entered through a few instructions that ask [`loadable`] for
//! the path and then jump to the C library's function, so that it sees its
//! caller's return address: the loader searches the *calling* object's
//! `DT_RUNPATH` for a bare name and puts the library in its namespace, and a
//! call from this library instead would search the wrong object's.
//!
//! What this gives up: the library's name in the loader's list (`dladdr`,
//! `dl_iterate_phdr`, `/proc/self/maps`) is the memfd's; a library's own
//! dependencies are searched for as the loader would, and `$ORIGIN` in its
//! `DT_RUNPATH` names `/proc/self/fd`, so a dependency stored next to it on
//! the mount is not found; `RTLD_NOLOAD` finds only a library loaded from
//! such a copy. Only on x86-64 (elsewhere a mounted library is not found).

use crate::mount::Inside;
use crate::real;
use libc::{c_char, c_int, c_void};
use std::cell::RefCell;
use std::ffi::CString;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

/// A library stored on a mount, copied into a memfd.
struct Copy {
    /// The file it was copied from: the mount's device number and the file's inode number.
    file: (u64, u64),
    /// The file's size and modification time when it was copied.
    stamp: (u64, u64),
    /// `/proc/self/fd/N` of the memfd.
    path: CString,
    /// The memfd (open until the copy is swept: [`sweep`]), and its device
    /// and inode numbers (a program may have closed it and reused the number).
    fd: c_int,
    memfd: Option<(u64, u64)>,
    /// When a newer copy of the same file was made (`None` while this is the newest).
    superseded: Option<Instant>,
}

/// How long a replaced copy is kept at least: a thread handed its path
/// just before the newer copy was made passes it to the loader within
/// microseconds, and a copy is swept only while the loader does not have it.
const GRACE: Duration = Duration::from_secs(5);

/// Whether the loader has the copy at `path` (a [`Copy`]'s) loaded now.
/// Asked without the list's lock: the loader's own lock may be held by a
/// thread whose library's constructor calls dlopen, which takes the list's.
fn loaded(path: *const c_char) -> bool {
    let real: unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void =
        // SAFETY: the C library's dlopen, found by `resolve_real`.
        unsafe { std::mem::transmute(REAL_DLOPEN.load(Ordering::Acquire)) };
    // SAFETY: a NUL-terminated path that lives as long as the process; RTLD_NOLOAD
    // loads nothing, and the reference it takes on a loaded library is given back.
    unsafe {
        let handle = real(path, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        !handle.is_null() && libc::dlclose(handle) == 0
    }
}

/// Every copy made in this process (a few: rustc loads a handful of proc macros).
static COPIES: Mutex<Vec<Copy>> = Mutex::new(Vec::new());

thread_local! {
    /// A path rewritten for the kernel (relative to a working directory
    /// inside a mount), kept until the C library has read it.
    static REWRITTEN: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// The C library's `dlopen` and `dlmopen`, which the entry points jump to.
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Finds the C library's two functions the first time.
fn resolve_real() {
    if REAL_DLOPEN.load(Ordering::Acquire).is_null() {
        REAL_DLMOPEN.store(real::next_function(c"dlmopen"), Ordering::Release);
        REAL_DLOPEN.store(real::next_function(c"dlopen"), Ordering::Release);
    }
}

/// The path the C library's `dlopen` gets for `file`: a memfd's copy of a
/// library stored on a mount, `file` itself where the loader can find it,
/// or `file` made absolute for the kernel where a working directory inside
/// a mount would mislead it. A mounted file that cannot be read (missing, a
/// directory, unreadable) gets `file`, which the kernel does not find
/// either, so `dlerror` names what the program asked for.
extern "C" fn loadable(file: *const c_char, mode: c_int) -> *const c_char {
    resolve_real();
    let _errno = crate::KeepErrno::new();
    let Some(name) = super::path_bytes(file).filter(|p| p.contains(&b'/')) else { return file };
    let served = super::on_path(libc::AT_FDCWD, file, |_| None, |inside| copy_of(&inside, mode, name));
    match served {
        Some(Some(copy)) => copy,
        Some(None) => file,
        None => match super::kernel(libc::AT_FDCWD, file).into_rewritten() {
            None => file,
            // (A thread whose storage is gone, at its exit: the caller's path.)
            Some(kept) => REWRITTEN
                .try_with(|slot| {
                    let at = kept.as_ptr();
                    *slot.borrow_mut() = Some(kept);
                    at
                })
                .unwrap_or(file),
        },
    }
}

/// The memfd path of a copy of the mounted library at `inside` (made now
/// if this process has none of the file as it is), or `None` where it
/// cannot be read (or with `RTLD_NOLOAD`, where no copy of it was loaded).
fn copy_of(inside: &Inside, mode: c_int, name: &[u8]) -> Option<*const c_char> {
    let name = String::from_utf8_lossy(name);
    let failed = |errno: c_int| {
        let e = std::io::Error::from_raw_os_error(errno);
        crate::log(&format!("dlopen of {name}: {e}"));
    };
    let fs = inside.mount.fs().inspect_err(|&e| failed(e)).ok()?;
    let file = fs.open(&inside.path).map_err(|e| super::errno_of(&e)).inspect_err(|&e| failed(e)).ok()?;
    let meta = file.metadata();
    let (key, stamp) = ((inside.mount.dev, meta.ino), (meta.size, meta.mtime_ns));
    if let Some(kept) = kept_copy(key, stamp) {
        return Some(kept);
    }
    if mode & libc::RTLD_NOLOAD != 0 {
        return None;
    }
    // Copied without the list's lock (a fork meanwhile holds it: see `crate::fork_holds`).
    let fd = super::processes::copy_into_memfd(&file, c"iopath-library").inspect_err(|&e| failed(e)).ok()?;
    let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number");
    let mut copies = COPIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(kept) = newest(&copies, key, stamp).filter(|&(_, same)| same).map(|(kept, _)| kept) {
        // Another thread copied the same file meanwhile: its copy serves (the
        // loader must find one library, not two).
        drop(copies);
        // SAFETY: our memfd, never handed out.
        unsafe { real::close(fd) };
        return Some(kept);
    }
    crate::log(&format!("dlopen of {name}: loading a copy in memory ({} bytes)", meta.size));
    let at = path.as_ptr();
    let now = Instant::now();
    for older in copies.iter_mut().filter(|c| c.file == key && c.superseded.is_none()) {
        older.superseded = Some(now);
    }
    copies.push(Copy { file: key, stamp, path, fd, memfd: identity(fd), superseded: None });
    drop(copies);
    sweep(now);
    Some(at)
}

/// Closes the copies replaced more than [`GRACE`] before `now` that the
/// loader does not have (asked without the list's lock, as in [`loaded`]).
fn sweep(now: Instant) {
    let stale: Vec<(c_int, CString)> = COPIES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|c| c.superseded.is_some_and(|at| now.duration_since(at) >= GRACE))
        .map(|c| (c.fd, c.path.clone()))
        .collect();
    for (fd, path) in stale.into_iter().filter(|(_, path)| !loaded(path.as_ptr())) {
        let mut copies = COPIES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = copies.iter().position(|c| c.fd == fd) else { continue };
        let gone = copies.remove(at); // (in order: the newest of a file is its last)
        drop(copies);
        if gone.memfd.is_some() && identity(gone.fd) == gone.memfd {
            crate::log(&format!("dlopen: closed a replaced copy ({})", path.to_string_lossy()));
            // SAFETY: our memfd (the same file), in no list: its path is no longer handed out.
            unsafe { real::close(gone.fd) };
        }
    }
}

/// The device and inode numbers of the file open on `fd`.
fn identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat into a local.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a closed descriptor fails.
    (unsafe { real::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The path of the newest copy of the file `key`, unless the file changed
/// since (`stamp`) and that copy is no longer loaded: then none, and a new
/// one is made (the old stays: another thread may be about to pass its
/// path to the loader).
fn kept_copy(key: (u64, u64), stamp: (u64, u64)) -> Option<*const c_char> {
    let (path, same) = newest(&COPIES.lock().unwrap_or_else(|e| e.into_inner()), key, stamp)?;
    (same || loaded(path)).then_some(path)
}

/// The path of the newest copy of the file `key` in `copies`, and whether
/// it was copied as the file is now (`stamp`). The path stays where it is
/// for at least [`GRACE`] (a copy is taken out of the list only that long
/// after a newer one replaced it).
fn newest(copies: &[Copy], key: (u64, u64), stamp: (u64, u64)) -> Option<(*const c_char, bool)> {
    copies.iter().rev().find(|c| c.file == key).map(|c| (c.path.as_ptr(), c.stamp == stamp))
}

/// The list of copies, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&COPIES)
}

/// The entry points: each must end in a jump to the C library's function
/// with its caller's return address on the stack, which a Rust function
/// cannot do.
#[cfg(target_arch = "x86_64")]
mod entries {
    use super::{REAL_DLMOPEN, REAL_DLOPEN, loadable};
    use libc::c_void;

    /// `dlopen`: the C library's, with a mounted library's path replaced
    /// by its copy's (see the module).
    ///
    /// # Safety
    /// As the C function.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlopen() -> *mut c_void {
        core::arch::naked_asm!(
            // Keep the arguments (and the stack 16-byte aligned for the call).
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {loadable}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "mov rdi, rax",
            "jmp qword ptr [rip + {real}]",
            loadable = sym loadable,
            real = sym REAL_DLOPEN,
        )
    }

    /// `dlmopen`: as [`dlopen`], in the namespace the caller names.
    ///
    /// # Safety
    /// As the C function.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlmopen() -> *mut c_void {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "mov rdi, rsi",
            "mov rsi, rdx",
            "call {loadable}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "mov rsi, rax",
            "jmp qword ptr [rip + {real}]",
            loadable = sym loadable,
            real = sym REAL_DLMOPEN,
        )
    }
}
