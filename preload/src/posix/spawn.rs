//! `posix_spawn`'s file actions on mounted files: the actions a program
//! adds (`posix_spawn_file_actions_add*`) are recorded as they are added,
//! and a spawn whose actions reach into a mount gets actions the kernel
//! can carry out.
//!
//! The C library's child carries out the actions with system calls of its
//! own, before the new program (and its interposer) is there: an `open` of
//! a mounted path made a file in the empty directory under the mount, and
//! a `dup2` of a mounted descriptor gave the child a descriptor on nothing
//! it could write (`echo: write error: Bad file descriptor`). So, at the
//! spawn, in this process:
//!
//! - a `dup2` of a mounted file descriptor, or an `open` of a mounted path
//!   (opened here, with the action's flags and mode, relative to where the
//!   child's earlier `chdir` actions lead), becomes a `dup2` of a pipe whose
//!   other end a bridge of this process keeps (`bridge::for_child`): what
//!   the child writes lands in the file at the open file's position, what it
//!   reads comes from it. A `dup2` shares this process's open file (and its
//!   position), as the kernel's would; an `open` gets a file of its own.
//!   After the child ends (`wait` and its kind), the bridge has written
//!   what it sent before the call returns. A mounted directory cannot be
//!   given to a child: EOPNOTSUPP, said in the log.
//! - a `chdir` into a mount (or `fchdir` of a mounted directory) becomes a
//!   `chdir` to the mount's own directory, and the child's interposer is told
//!   where it is (`IOPATH_CWD`, as an exec says it); a `chdir` out of every
//!   mount takes the child's working directory out of them too, which the
//!   environment passed on had said otherwise.
//! - the other actions are passed on as they were added.
//!
//! An error the kernel's child would have met in a mounted action (a
//! missing file, `O_EXCL` on an existing one) is what the spawn returns,
//! as the C library returns the child's. Actions that reach no mount leave
//! the program's own actions object to the C library, untouched.

use super::paths::open_on_path;
use crate::{bridge, mount, real};
use libc::{c_char, c_int, mode_t, posix_spawn_file_actions_t as Actions};
use std::ffi::{CStr, CString};
use std::sync::Mutex;

/// One file action, as the program added it.
#[derive(Debug, Clone)]
enum Action {
    Open { fd: c_int, path: CString, flags: c_int, mode: mode_t },
    Close { fd: c_int },
    Dup2 { from: c_int, to: c_int },
    Chdir { path: CString },
    Fchdir { fd: c_int },
    CloseFrom { from: c_int },
    Tcsetpgrp { fd: c_int },
}

/// The actions of every live actions object, by its address.
static RECORDED: Mutex<Vec<(usize, Vec<Action>)>> = Mutex::new(Vec::new());

/// The recorded actions, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&RECORDED)
}

fn recorded() -> std::sync::MutexGuard<'static, Vec<(usize, Vec<Action>)>> {
    RECORDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `action` for `actions` if the C library took it (`added` == 0).
fn record(actions: *mut Actions, added: c_int, action: Action) -> c_int {
    if added == 0 {
        let mut all = recorded();
        // (One made before this library could see it stays the program's own.)
        if let Some((_, list)) = all.iter_mut().find(|(at, _)| *at == actions as usize) {
            list.push(action);
        }
    }
    added
}

/// `posix_spawn_file_actions_init`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_init(actions: *mut Actions) -> c_int {
    // SAFETY: passed on.
    let made = unsafe { real::posix_spawn_file_actions_init(actions) };
    if made == 0 {
        let mut all = recorded();
        all.retain(|(at, _)| *at != actions as usize);
        all.push((actions as usize, Vec::new()));
    }
    made
}

/// `posix_spawn_file_actions_destroy`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_destroy(actions: *mut Actions) -> c_int {
    recorded().retain(|(at, _)| *at != actions as usize);
    // SAFETY: passed on.
    unsafe { real::posix_spawn_file_actions_destroy(actions) }
}

/// `posix_spawn_file_actions_addopen`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addopen(
    actions: *mut Actions,
    fd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addopen(actions, fd, path, flags, mode) };
    // SAFETY: the C library took it: a NUL-terminated path.
    let path = if added == 0 { unsafe { CStr::from_ptr(path) }.to_owned() } else { CString::default() };
    record(actions, added, Action::Open { fd, path, flags, mode })
}

/// `posix_spawn_file_actions_addclose`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addclose(actions: *mut Actions, fd: c_int) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addclose(actions, fd) };
    record(actions, added, Action::Close { fd })
}

/// `posix_spawn_file_actions_adddup2`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(actions: *mut Actions, from: c_int, to: c_int) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_adddup2(actions, from, to) };
    record(actions, added, Action::Dup2 { from, to })
}

/// `posix_spawn_file_actions_addchdir_np`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addchdir_np(actions: *mut Actions, path: *const c_char) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addchdir_np(actions, path) };
    // SAFETY: the C library took it: a NUL-terminated path.
    let path = if added == 0 { unsafe { CStr::from_ptr(path) }.to_owned() } else { CString::default() };
    record(actions, added, Action::Chdir { path })
}

/// `posix_spawn_file_actions_addfchdir_np`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addfchdir_np(actions: *mut Actions, fd: c_int) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addfchdir_np(actions, fd) };
    record(actions, added, Action::Fchdir { fd })
}

/// `posix_spawn_file_actions_addclosefrom_np`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addclosefrom_np(actions: *mut Actions, from: c_int) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addclosefrom_np(actions, from) };
    record(actions, added, Action::CloseFrom { from })
}

/// `posix_spawn_file_actions_addtcsetpgrp_np`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addtcsetpgrp_np(actions: *mut Actions, fd: c_int) -> c_int {
    // SAFETY: passed on.
    let added = unsafe { real::posix_spawn_file_actions_addtcsetpgrp_np(actions, fd) };
    record(actions, added, Action::Tcsetpgrp { fd })
}

/// The actions a spawn gives the C library, when the program's reach into
/// a mount: a new actions object, and what this process closes after the
/// spawn (its ends of the children's pipes, the files opened for them).
pub(super) struct Rewritten {
    actions: Box<std::mem::MaybeUninit<Actions>>,
    close_after: Vec<c_int>,
    /// This spawn's number, for the bridges that feed its child
    /// (`bridge::spawned` once the child's pid is known).
    pub(super) spawn: libc::pid_t,
    /// The child's working directory, if a `chdir` action moved it: its
    /// path in a mount (`IOPATH_CWD`), or `None` out of every mount.
    pub(super) cwd: Option<Option<Vec<u8>>>,
}

impl Rewritten {
    /// The actions object to pass.
    pub(super) fn as_ptr(&self) -> *const Actions {
        self.actions.as_ptr()
    }
}

impl Drop for Rewritten {
    fn drop(&mut self) {
        // A spawn that failed (or never ran: an action's error) named no child: the
        // bridges that waited for one let their copies of the pipes go.
        bridge::spawned(self.spawn, None);
        for &fd in &self.close_after {
            // SAFETY: descriptors this spawn opened; closed through this library's
            // `close`, which lets a mounted one go.
            unsafe { super::descriptors::close(fd) };
        }
        // SAFETY: initialized by `rewrite` before anything was added.
        unsafe { real::posix_spawn_file_actions_destroy(self.actions.as_mut_ptr()) };
    }
}

/// Whether `fd` is a mounted descriptor of this process.
fn mounted(fd: c_int) -> bool {
    super::mounting() && mount::is_mounted(fd)
}

/// `path` as the child would name it after earlier `chdir` actions moved
/// it to `cwd` (`None`: it is where this process is).
fn as_child_names(cwd: &Option<Vec<u8>>, path: &CStr) -> CString {
    match cwd {
        Some(dir) if !path.to_bytes().starts_with(b"/") => {
            CString::new(mount::normalize(dir, path.to_bytes())).unwrap_or_else(|_| path.to_owned())
        }
        _ => path.to_owned(),
    }
}

/// The working directory this process has (in a mount, or the kernel's).
fn own_cwd() -> Vec<u8> {
    if let Some(dir) = mount::virtual_cwd() {
        return dir;
    }
    std::env::current_dir().map(|d| std::os::unix::ffi::OsStrExt::as_bytes(d.as_os_str()).to_vec()).unwrap_or_default()
}

/// Where kernel descriptor `fd` is open (its path in `/proc`).
fn kernel_path_of(fd: c_int) -> Option<Vec<u8>> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    Some(std::os::unix::ffi::OsStrExt::as_bytes(link.as_os_str()).to_vec())
}

/// The spawn's actions, rewritten if they reach into a mount (`Ok(None)`
/// if they do not: the program's own object goes to the C library), or
/// the errno the spawn returns.
pub(super) fn rewrite(actions: *const Actions) -> Result<Option<Rewritten>, c_int> {
    if actions.is_null() || !super::mounting() {
        return Ok(None);
    }
    let list = {
        let all = recorded();
        let Some((_, list)) = all.iter().find(|(at, _)| *at == actions as usize) else { return Ok(None) };
        list.clone()
    };
    if !reaches_a_mount(&list) {
        return Ok(None);
    }
    let mut actions = Box::new(std::mem::MaybeUninit::uninit());
    // SAFETY: initializes the object in place; `Rewritten::drop` destroys it.
    let made = unsafe { real::posix_spawn_file_actions_init(actions.as_mut_ptr()) };
    if made != 0 {
        return Err(made);
    }
    let mut out = Rewritten { actions, close_after: Vec::new(), spawn: bridge::next_spawn(), cwd: None };
    let mut cwd: Option<Vec<u8>> = None;
    // Descriptors of the child an earlier action changed: theirs, not this process's.
    let mut changed: Vec<c_int> = Vec::new();
    let a = out.actions.as_mut_ptr();
    for action in list {
        let passed = match action {
            Action::Dup2 { from, to } if !changed.contains(&from) && mounted(from) => {
                let d = mount::lookup(from).ok_or(libc::EBADF)?;
                let end = child_end(&d, to, out.spawn)?;
                out.close_after.push(end);
                changed.push(to);
                Action::Dup2 { from: end, to }
            }
            Action::Open { fd, path, flags, mode } => {
                changed.push(fd);
                let named = as_child_names(&cwd, &path);
                match open_on_path(libc::AT_FDCWD, named.as_ptr(), flags | libc::O_CLOEXEC, mode) {
                    Some(opened) if opened < 0 => return Err(super::last_errno()),
                    Some(opened) => {
                        out.close_after.push(opened);
                        let d = mount::lookup(opened).ok_or(libc::EBADF)?;
                        let end = child_end(&d, fd, out.spawn)?;
                        out.close_after.push(end);
                        Action::Dup2 { from: end, to: fd }
                    }
                    None => {
                        // (Where a mount's link led out, or the working directory is a mount's: the
                        // path the kernel is to open.)
                        let kernel = super::kernel(libc::AT_FDCWD, named.as_ptr());
                        // SAFETY: a NUL-terminated path, ours or the CString `named`, alive here.
                        let path = unsafe { CStr::from_ptr(kernel.ptr()) }.to_owned();
                        Action::Open { fd, path, flags, mode }
                    }
                }
            }
            Action::Chdir { path } => {
                let base = cwd.take().unwrap_or_else(own_cwd);
                let target = mount::normalize(&base, path.to_bytes());
                let in_a_mount = mount::resolve(libc::AT_FDCWD, &target).is_some();
                let from_a_mount = mount::resolve(libc::AT_FDCWD, &base).is_some();
                let relative = !path.to_bytes().starts_with(b"/");
                cwd = Some(target.clone());
                if in_a_mount || (from_a_mount && relative) {
                    // Into a mount (the kernel's child goes to its directory), or out of one by
                    // a relative path (which the kernel would take from the mount's directory).
                    Action::Chdir { path: CString::new(child_dir(&target)?).map_err(|_| libc::EINVAL)? }
                } else {
                    // Among the kernel's directories: as the program asked (the kernel follows
                    // its links; the path kept here is what they spell).
                    Action::Chdir { path }
                }
            }
            Action::Fchdir { fd } if !changed.contains(&fd) && mounted(fd) => {
                let d = mount::lookup(fd).ok_or(libc::EBADF)?;
                if !matches!(d.node, mount::Node::Dir) {
                    return Err(libc::ENOTDIR);
                }
                cwd = Some(mount::normalize(b"/", &[&d.mount.dir[..], &d.path[..]].concat()));
                Action::Chdir { path: CString::new(d.mount.dir.clone()).map_err(|_| libc::EINVAL)? }
            }
            Action::Fchdir { fd } => {
                cwd = Some(kernel_path_of(fd).unwrap_or_default());
                Action::Fchdir { fd }
            }
            Action::Dup2 { to: fd, .. } | Action::Close { fd } => {
                changed.push(fd);
                action
            }
            Action::CloseFrom { .. } | Action::Tcsetpgrp { .. } => action,
        };
        let added = add(a, &passed);
        if added != 0 {
            return Err(added);
        }
    }
    out.cwd = cwd.map(|dir| mount::resolve(libc::AT_FDCWD, &dir).map(|_| dir));
    Ok(Some(out))
}

/// Adds `action` to the initialized actions object `a` (the C library's own functions).
fn add(a: *mut Actions, action: &Action) -> c_int {
    // SAFETY: `a` was initialized by the C library; the paths are NUL-terminated and
    // outlive the call (the C library copies them).
    unsafe {
        match action {
            Action::Open { fd, path, flags, mode } => {
                real::posix_spawn_file_actions_addopen(a, *fd, path.as_ptr(), *flags, *mode)
            }
            Action::Close { fd } => real::posix_spawn_file_actions_addclose(a, *fd),
            Action::Dup2 { from, to } => real::posix_spawn_file_actions_adddup2(a, *from, *to),
            Action::Chdir { path } => real::posix_spawn_file_actions_addchdir_np(a, path.as_ptr()),
            Action::Fchdir { fd } => real::posix_spawn_file_actions_addfchdir_np(a, *fd),
            Action::CloseFrom { from } => real::posix_spawn_file_actions_addclosefrom_np(a, *from),
            Action::Tcsetpgrp { fd } => real::posix_spawn_file_actions_addtcsetpgrp_np(a, *fd),
        }
    }
}

/// Whether any action names a mounted path or descriptor (or moves the
/// child's working directory, which the environment passed on may say is
/// in a mount).
fn reaches_a_mount(list: &[Action]) -> bool {
    let _inside = crate::Inside::enter();
    list.iter().any(|action| match action {
        Action::Dup2 { from: fd, .. } | Action::Fchdir { fd } => mount::is_mounted(*fd),
        Action::Chdir { path } => {
            mount::virtual_cwd().is_some()
                || mount::resolve(libc::AT_FDCWD, &mount::normalize(&own_cwd(), path.to_bytes())).is_some()
        }
        Action::Open { path, .. } => {
            !path.to_bytes().starts_with(b"/") || mount::resolve(libc::AT_FDCWD, path.to_bytes()).is_some()
        }
        Action::Close { .. } | Action::CloseFrom { .. } | Action::Tcsetpgrp { .. } => false,
    })
}

/// The child's end of a pipe that a bridge keeps for mounted `d` as the
/// child's descriptor `to`; a directory cannot be given (EOPNOTSUPP).
fn child_end(d: &std::sync::Arc<mount::Description>, to: c_int, spawn: libc::pid_t) -> Result<c_int, c_int> {
    if !matches!(d.node, mount::Node::File(_)) {
        crate::log(&format!(
            "posix_spawn: a mounted directory ({}{}) cannot be a child's descriptor {to} (EOPNOTSUPP)",
            String::from_utf8_lossy(&d.mount.dir),
            String::from_utf8_lossy(&d.path)
        ));
        return Err(libc::EOPNOTSUPP);
    }
    bridge::for_child(d, to, spawn)
}

/// The directory the kernel's child moves to for a `chdir` to `target`
/// (absolute): the mount's own directory if `target` is in one (which must
/// be a directory there: else the kernel's errno), else `target` itself.
fn child_dir(target: &[u8]) -> Result<Vec<u8>, c_int> {
    let Some(inside) = mount::resolve(libc::AT_FDCWD, target) else { return Ok(target.to_vec()) };
    let _inside = crate::Inside::enter();
    let fs = inside.mount.fs()?;
    match fs.metadata(&inside.path) {
        Ok(m) if m.kind == iopath::fs::Kind::Dir => Ok(inside.mount.dir.clone()),
        Ok(_) => Err(libc::ENOTDIR),
        Err(e) => Err(super::errno_of(&e)),
    }
}
