//! Processes: `_exit`/`_Exit` (which commit the mounts first, as `exit`
//! does), `vfork` and `posix_spawn` (which give idle mounts back first, as
//! `fork` does, so a child can mount them), and the exec family, which
//! commits the mounts first (exec runs no exit handlers), hands the
//! standard streams on mounted files to the next program (`bridge/`),
//! and runs a program stored on a mount: the kernel cannot load a file it
//! cannot see, so an ELF program is copied into a memfd and executed from
//! there, and a script's interpreter is executed with the script's path,
//! as the kernel does (the interpreter reads the script through the
//! interposer).

use super::fail;
use crate::{bridge, inherit, real};
use libc::{c_char, c_int};
use std::ffi::CString;

/// `_exit`: commits the mounts first (a shell or a child ends this way, not
/// through `exit`, and its files must be there as after any normal end),
/// and says what was routed (fio's forked jobs end this way).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::at_exit(false);
    // SAFETY: passed on.
    unsafe { real::_exit(status) }
}

/// `_Exit`: as [`_exit`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    crate::at_exit(false);
    // SAFETY: _Exit is _exit (C99's name for it).
    unsafe { real::_exit(status) }
}

/// `vfork`: a `fork` here. A wrapper cannot call the real `vfork` (the child
/// would return through this function's frame on the parent's stack), and
/// `fork` runs the handler that gives idle mounts back, which a shell's next
/// command needs (dash starts simple commands with vfork).
///
/// # Safety
/// As the C function: the child must only exec or `_exit` (as after vfork).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has the C library's own preconditions only.
    unsafe { libc::fork() }
}

type SpawnFn = unsafe fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> c_int;

/// posix_spawn and posix_spawnp: give idle mounts back first (the child is
/// started without `fork`'s handlers) and pass a working directory inside a
/// mount on, as an exec does. A program stored on a mount (named with a
/// slash) is spawned from a memfd (`/proc/self/fd/N`, which the kernel opens
/// before the exec closes it), a script through its interpreter.
///
/// # Safety
/// As the C functions.
unsafe fn spawn(
    real_spawn: SpawnFn,
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    let mut named_by_path = super::path_bytes(file).is_some_and(|f| f.contains(&b'/'));
    // A bare name whose `PATH` has a mount's directory: the first candidate there
    // (the C library's search goes to the kernel, which does not see the mount).
    let found = match (named_by_path, search_path_with_a_mount(), super::path_bytes(file)) {
        (false, Some(dirs), Some(name)) if !name.is_empty() => candidates(&dirs, name).into_iter().next(),
        _ => None,
    };
    let file = match &found {
        Some(path) => {
            named_by_path = true;
            path.as_ptr()
        }
        None => file,
    };
    // (Before the program is read: a memfd made for it would leak on an action's error.)
    let rewritten = match super::spawn::rewrite(actions) {
        Ok(rewritten) => rewritten,
        Err(errno) => return errno,
    };
    let actions = rewritten.as_ref().map_or(actions, |r| r.as_ptr());
    let stored = if named_by_path { stored_on_mount(file) } else { None };
    crate::release_mounts_before_fork();
    // A `chdir` action decides where the child's working directory is; else it is this process's.
    let cwd = match rewritten.as_ref().and_then(|r| r.cwd.clone()) {
        Some(moved) => moved,
        None => own_virtual_cwd(),
    };
    let env = Environment::with_cwd(envp.cast(), &Handed::default(), cwd);
    let spawned = match stored {
        // SAFETY: passed on, with an environment array that outlives the call.
        None => unsafe { real_spawn(pid, file, actions, attr, argv, env.as_ptr().cast()) },
        Some(Err(errno)) => errno,
        Some(Ok(Stored::Binary(fd))) => {
            let Ok(path) = CString::new(format!("/proc/self/fd/{fd}")) else { return libc::EINVAL };
            // SAFETY: as above; the memfd is ours, closed once the child has it.
            unsafe {
                let spawned = real::posix_spawn(pid, path.as_ptr(), actions, attr, argv, env.as_ptr().cast());
                real::close(fd);
                spawned
            }
        }
        Some(Ok(Stored::Script { interpreter, arg })) => {
            let mut args: Vec<*const c_char> = vec![interpreter.as_ptr()];
            args.extend(arg.as_ref().map(|a| a.as_ptr()));
            args.push(file);
            // SAFETY: argv is the caller's NULL-terminated array; the interpreter is spawned
            // the same way (it may be on a mount too).
            unsafe {
                push_arguments_after_the_first(&mut args, argv.cast());
                spawn(real::posix_spawn, pid, interpreter.as_ptr(), actions, attr, args.as_ptr().cast(), envp)
            }
        }
    };
    if let Some(rewritten) = &rewritten {
        // SAFETY: a successful spawn filled `*pid` (when the caller gave one).
        let child = (spawned == 0 && !pid.is_null()).then(|| unsafe { *pid });
        bridge::spawned(rewritten.spawn, child);
    }
    spawned
}

/// `posix_spawn`: see `spawn`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed on.
    unsafe { spawn(real::posix_spawn, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp`: see `spawn`.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed on.
    unsafe { spawn(real::posix_spawnp, pid, file, actions, attr, argv, envp) }
}

/// Before an exec: hand the standard streams on mounted files on (they
/// become pipes the next program's interposer keeps: `bridge/`) and the
/// mounted descriptors above 2 the exec keeps (`inherit.rs`), commit
/// every mount (the process image that holds it is about to go, and exec
/// runs no exit handlers), give back those nothing holds open, and tell the
/// new program where in a mount its working directory is (`IOPATH_CWD`:
/// the kernel's is the mount's own directory). If the exec fails,
/// [`after_failed_exec`] puts the streams back, and the next call mounts
/// again.
fn before_exec() -> Handed {
    let streams = bridge::hand_over();
    let fds = inherit::hand_over();
    crate::commit_mounts_now();
    crate::release_mounts_before_fork();
    Handed { streams, fds }
}

/// What an exec hands to the next program: the standard streams on mounted
/// files (`bridge/`) and the mounted descriptors above 2 (`inherit.rs`).
#[derive(Default)]
struct Handed {
    streams: bridge::HandOver,
    fds: inherit::HandOver,
}

/// The exec failed (errno kept): this program goes on as before it (its
/// descriptors above 2 are still its own; a forked child's stay pipes its
/// parent bridges).
fn after_failed_exec(handed: Handed) {
    let _errno = crate::KeepErrno::new();
    handed.streams.undo();
}

/// The environment entries this library passes to an executed program.
const PASSED: [&[u8]; 3] = [b"IOPATH_CWD=", b"IOPATH_STDIO=", b"IOPATH_FDS="];

/// This process's working directory if it is in a mount.
fn own_virtual_cwd() -> Option<Vec<u8>> {
    if super::mounting() { crate::mount::virtual_cwd() } else { None }
}

/// The entries a new program gets: its working directory `cwd` if it is in
/// a mount, the standard streams and the descriptors above 2 handed on.
fn passed_entries(handed: &Handed, cwd: Option<Vec<u8>>) -> Vec<CString> {
    let cwd = cwd.and_then(|dir| CString::new([&b"IOPATH_CWD="[..], &dir].concat()).ok());
    cwd.into_iter().chain(handed.streams.entry()).chain(handed.fds.entry()).collect()
}

/// The environment an executed program gets: `envp` without this
/// library's entries, plus this process's ([`passed_entries`]). It owns
/// what it adds, so its pointers live as long as it does.
struct Environment {
    _added: Vec<CString>,
    pointers: Vec<*const c_char>,
}

impl Environment {
    fn new(envp: *const *const c_char, handed: &Handed) -> Environment {
        Environment::with_cwd(envp, handed, own_virtual_cwd())
    }

    /// [`Environment::new`] for a program whose working directory is `cwd`
    /// in a mount (`None`: out of every mount).
    fn with_cwd(envp: *const *const c_char, handed: &Handed, cwd: Option<Vec<u8>>) -> Environment {
        let added = passed_entries(handed, cwd);
        let mut pointers = Vec::new();
        let mut at = envp;
        // SAFETY: envp is a NULL-terminated array of NUL-terminated strings (the C contract).
        unsafe {
            while !at.is_null() && !(*at).is_null() {
                let entry = std::ffi::CStr::from_ptr(*at).to_bytes();
                if !PASSED.iter().any(|p| entry.starts_with(p)) {
                    pointers.push(*at);
                }
                at = at.add(1);
            }
        }
        // (A CString's bytes stay where they are when the Vec holding it moves.)
        pointers.extend(added.iter().map(|e| e.as_ptr()));
        pointers.push(std::ptr::null());
        Environment { _added: added, pointers }
    }

    /// The NULL-terminated array.
    fn as_ptr(&self) -> *const *const c_char {
        self.pointers.as_ptr()
    }
}

/// A program stored on a mount, read before its exec.
enum Stored {
    /// A program the kernel loads: a memfd (close-on-exec) holding its bytes.
    Binary(c_int),
    /// A script: the interpreter and the optional argument of its `#!` line.
    Script { interpreter: CString, arg: Option<CString> },
}

/// Reads the program at `path` if it is stored on a mount (`None` if not):
/// a regular file with an execute bit (else EACCES, as the kernel says).
fn stored_on_mount(path: *const c_char) -> Option<Result<Stored, c_int>> {
    super::on_path(libc::AT_FDCWD, path, Err, |inside| {
        let fs = inside.mount.fs()?;
        let meta = fs.metadata(&inside.path).map_err(|e| super::errno_of(&e))?;
        if meta.kind != iopath::fs::Kind::File || meta.mode & 0o111 == 0 {
            return Err(libc::EACCES);
        }
        let file = fs.open(&inside.path).map_err(|e| super::errno_of(&e))?;
        let mut head = [0u8; 256];
        let n = file.read_at(&mut head, 0).map_err(|e| super::errno_of(&e))?;
        if let Some(line) = head[..n].strip_prefix(b"#!") {
            return shebang(line);
        }
        copy_into_memfd(&file, c"iopath-exec").map(Stored::Binary)
    })
}

/// The interpreter and argument of a `#!` line (what follows `#!`, up to
/// the end of the line or of the kernel's 256 bytes), split as Linux
/// splits it: the interpreter up to the first blank, the rest one argument.
fn shebang(line: &[u8]) -> Result<Stored, c_int> {
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).ok_or(libc::ENOEXEC)?;
    let line = &line[start..];
    let end = line.iter().rposition(|b| !blank(b)).map_or(0, |e| e + 1);
    let line = &line[..end];
    let (interpreter, rest) = match line.iter().position(blank) {
        Some(at) => (&line[..at], &line[at..]),
        None => (line, &b""[..]),
    };
    let rest = &rest[rest.iter().position(|b| !blank(b)).unwrap_or(rest.len())..];
    Ok(Stored::Script {
        interpreter: CString::new(interpreter).map_err(|_| libc::ENOEXEC)?,
        arg: if rest.is_empty() { None } else { Some(CString::new(rest).map_err(|_| libc::ENOEXEC)?) },
    })
}

/// A close-on-exec memfd named `name` holding `file`'s bytes.
pub(super) fn copy_into_memfd(file: &iopath::fs::File, name: &std::ffi::CStr) -> Result<c_int, c_int> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(super::last_errno());
    }
    let close = |errno| {
        // SAFETY: our memfd.
        unsafe { real::close(fd) };
        Err(errno)
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = match file.read_at(&mut buf, at) {
            Ok(0) => return Ok(fd),
            Ok(n) => n,
            Err(e) => return close(super::errno_of(&e)),
        };
        let mut done = 0;
        while done < n {
            // SAFETY: writes from our buffer into our memfd.
            let w = unsafe { real::write(fd, buf[done..n].as_ptr().cast(), n - done) };
            if w <= 0 {
                return close(super::last_errno());
            }
            done += w as usize;
        }
        at += n as u64;
    }
}

/// How many scripts deep an exec may go (a script whose interpreter is a
/// script ...), as Linux allows.
const SCRIPT_DEPTH: usize = 4;

/// The exec family's one body: a program stored on a mount is run from a
/// memfd, or its interpreter is run with the script's path (the kernel
/// would find only the empty directory under the mount); any other goes to
/// the kernel. The mounts and standard streams are handed on first.
///
/// # Safety
/// `path` is a C string, `argv` and `envp` NULL-terminated arrays of them.
unsafe fn execute(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, depth: usize) -> c_int {
    match stored_on_mount(path) {
        None => {
            let handed = before_exec();
            let env = Environment::new(envp, &handed);
            // SAFETY: passed on, with an environment array that outlives the call.
            let failed = unsafe { real::execve(super::kernel(libc::AT_FDCWD, path).ptr(), argv, env.as_ptr()) };
            after_failed_exec(handed);
            failed
        }
        Some(Err(errno)) => fail(errno),
        Some(Ok(Stored::Binary(fd))) => {
            let handed = before_exec();
            let env = Environment::new(envp, &handed);
            // SAFETY: our memfd, the caller's argv, an environment array that outlives the call.
            let failed = unsafe { libc::fexecve(fd, argv.cast(), env.as_ptr().cast()) };
            after_failed_exec(handed);
            let _errno = crate::KeepErrno::new();
            // SAFETY: our memfd.
            unsafe { real::close(fd) };
            failed
        }
        Some(Ok(Stored::Script { interpreter, arg })) => {
            if depth >= SCRIPT_DEPTH {
                return fail(libc::ELOOP);
            }
            // The kernel's argv for a script: interpreter [arg] path argv[1..].
            let mut args: Vec<*const c_char> = vec![interpreter.as_ptr()];
            args.extend(arg.as_ref().map(|a| a.as_ptr()));
            args.push(path);
            // SAFETY: argv is the caller's NULL-terminated array.
            unsafe { push_arguments_after_the_first(&mut args, argv) };
            // SAFETY: as the caller's; the interpreter may itself be on a mount.
            unsafe { execute(interpreter.as_ptr(), args.as_ptr(), envp, depth + 1) }
        }
    }
}

/// Appends `argv[1..]` and the closing NULL to `args` (an interpreter's
/// argv: its own name, its argument, the script, then the caller's).
///
/// # Safety
/// `argv` is NULL or a NULL-terminated array of C strings.
unsafe fn push_arguments_after_the_first(args: &mut Vec<*const c_char>, argv: *const *const c_char) {
    // SAFETY: the caller's contract; argv[0] is skipped if there is one.
    unsafe {
        let mut at = if argv.is_null() || (*argv).is_null() { argv } else { argv.add(1) };
        while !at.is_null() && !(*at).is_null() {
            args.push(*at);
            at = at.add(1);
        }
    }
    args.push(std::ptr::null());
}

unsafe extern "C" {
    /// The process's environment (what `execv` and `execvp` pass on).
    static environ: *const *const c_char;
}

/// `execve`: hands the mounts and standard streams on first, and runs a
/// program stored on a mount ([`execute`]).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: passed on.
    unsafe { execute(path, argv, envp, 0) }
}

/// `execv`: `execve` with this process's environment.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: passed on, with the process's environment (read now, as execv does).
    unsafe { execute(path, argv, environ, 0) }
}

/// `execvp`: a file named with a slash is `execv`'s (it may be stored on a
/// mount); a bare name is looked up in `PATH`, by this library when a
/// directory of `PATH` is in a mount (the C library's search goes to the
/// kernel, which does not see them), else by the C library.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: passed on, with the process's environment.
    unsafe { execvpe(file, argv, environ) }
}

/// `execvpe`: as [`execvp`], with `envp`. A program named by path that the
/// kernel cannot run (ENOEXEC: a script without `#!`) is run by `/bin/sh`,
/// as the C library does.
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    if super::path_bytes(file).is_some_and(|f| f.contains(&b'/')) {
        // SAFETY: passed on.
        let failed = unsafe { execute(file, argv, envp, 0) };
        if super::last_errno() != libc::ENOEXEC {
            return failed;
        }
        let mut args: Vec<*const c_char> = vec![c"/bin/sh".as_ptr(), file];
        // SAFETY: argv is the caller's NULL-terminated array.
        unsafe { push_arguments_after_the_first(&mut args, argv) };
        // SAFETY: as above.
        return unsafe { execute(c"/bin/sh".as_ptr(), args.as_ptr(), envp, 0) };
    }
    if let Some(dirs) = search_path_with_a_mount() {
        let Some(name) = super::path_bytes(file) else { return fail(libc::EFAULT) };
        if name.is_empty() {
            return fail(libc::ENOENT);
        }
        let mut denied = false;
        for candidate in candidates(&dirs, name) {
            // SAFETY: passed on, with the candidate's full path (which has a slash).
            let failed = unsafe { execvpe(candidate.as_ptr(), argv, envp) };
            match super::last_errno() {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return failed,
            }
        }
        // As the C library: EACCES if a candidate was there but could not be run.
        return fail(if denied { libc::EACCES } else { libc::ENOENT });
    }
    let handed = before_exec();
    let env = Environment::new(envp, &handed);
    // SAFETY: passed on, with an environment array that outlives the call.
    let failed = unsafe { real::execvpe(file, argv, env.as_ptr()) };
    after_failed_exec(handed);
    failed
}

/// The directories of `PATH` (the C library's default if it is unset; an
/// empty entry is the working directory), if one of them is in a mount.
fn search_path_with_a_mount() -> Option<Vec<Vec<u8>>> {
    if !super::mounting() {
        return None;
    }
    let path = std::env::var_os("PATH").map_or_else(|| b"/bin:/usr/bin".to_vec(), |p| p.into_encoded_bytes());
    let dirs: Vec<Vec<u8>> =
        path.split(|&b| b == b':').map(|d| if d.is_empty() { b".".to_vec() } else { d.to_vec() }).collect();
    dirs.iter().any(|d| crate::mount::resolve(libc::AT_FDCWD, d).is_some()).then_some(dirs)
}

/// `dir/name` for each directory of `dirs` where something by that name
/// is there (a mount's, or the kernel's: one `access` each), in order: what
/// an exec or spawn is to try.
fn candidates(dirs: &[Vec<u8>], name: &[u8]) -> Vec<CString> {
    dirs.iter()
        .filter_map(|dir| CString::new([&dir[..], b"/", name].concat()).ok())
        .filter(|path| {
            // SAFETY: a NUL-terminated path; `access` is this library's hook (a mount's path
            // is looked up there).
            let there = unsafe { super::paths::access(path.as_ptr(), libc::F_OK) } == 0;
            there || super::last_errno() == libc::EACCES
        })
        .collect()
}

/// A child was reaped: the bridges of spawned children write what their
/// pipes hold before the caller looks at the files (errno kept).
fn child_reaped(pid: libc::pid_t) {
    if pid > 0 {
        let _errno = crate::KeepErrno::new();
        bridge::after_child_ended(pid);
    }
}

/// `waitpid`: see [`child_reaped`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn waitpid(pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t {
    // SAFETY: passed on.
    let reaped = unsafe { real::waitpid(pid, status, options) };
    child_reaped(reaped);
    reaped
}

/// `wait`: see [`child_reaped`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait(status: *mut c_int) -> libc::pid_t {
    // SAFETY: passed on.
    let reaped = unsafe { real::wait(status) };
    child_reaped(reaped);
    reaped
}

/// `wait3`: see [`child_reaped`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait3(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t {
    // SAFETY: passed on.
    let reaped = unsafe { real::wait3(status, options, usage) };
    child_reaped(reaped);
    reaped
}

/// `wait4`: see [`child_reaped`].
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait4(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    usage: *mut libc::rusage,
) -> libc::pid_t {
    // SAFETY: passed on.
    let reaped = unsafe { real::wait4(pid, status, options, usage) };
    child_reaped(reaped);
    reaped
}

/// `waitid`: see [`child_reaped`] (a child that changed state and was
/// left waitable, `WNOWAIT`, counts too: its output is as final).
///
/// # Safety
/// As the C function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    // SAFETY: passed on.
    let done = unsafe { real::waitid(idtype, id, info, options) };
    // SAFETY: filled by a successful waitid (si_pid 0: no child changed state).
    if done == 0 && !info.is_null() && unsafe { (*info).si_pid() } > 0 {
        // SAFETY: as above.
        child_reaped(unsafe { (*info).si_pid() });
    }
    done
}

/// The list forms of exec (`execl`, `execlp`, `execle`): C variadic
/// functions, which stable Rust cannot define. Each is a naked function
/// that stores the six argument registers next to each other and calls
/// [`exec_list`] with them and the address of the arguments the caller
/// put on the stack (x86-64 System V: a variadic call passes its first six
/// integer arguments in registers, the rest on the stack, in order). The
/// C library's own `execlp` calls its `execvpe` inside itself, out of this
/// library's reach: a program stored on a mount, or found in a `PATH`
/// directory in one, was not found.
#[cfg(target_arch = "x86_64")]
mod list_forms {
    use super::{c_char, c_int};

    macro_rules! list_form {
        ($name:ident, $kind:expr) => {
            /// See the module.
            ///
            /// # Safety
            /// As the C function.
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() -> c_int {
                core::arch::naked_asm!(
                    "push rbp",
                    "mov rbp, rsp",
                    "sub rsp, 48",
                    "mov [rsp], rdi",
                    "mov [rsp + 8], rsi",
                    "mov [rsp + 16], rdx",
                    "mov [rsp + 24], rcx",
                    "mov [rsp + 32], r8",
                    "mov [rsp + 40], r9",
                    "mov rdi, rsp",
                    "lea rsi, [rbp + 16]",
                    "mov edx, {kind}",
                    "call {collect}",
                    "leave",
                    "ret",
                    kind = const $kind,
                    collect = sym exec_list,
                )
            }
        };
    }

    const EXECL: c_int = 0;
    const EXECLP: c_int = 1;
    const EXECLE: c_int = 2;
    list_form!(execl, EXECL);
    list_form!(execlp, EXECLP);
    list_form!(execle, EXECLE);

    /// Most arguments a list form passes on (the kernel's limit is far below).
    const MOST_ARGUMENTS: usize = 1 << 16;

    /// The arguments of a list form: the path, then `arg0...` up to a NULL
    /// from the six `registers` and then `stack`, and for `execle` the
    /// environment after the NULL; executes as `execv`, `execvp` or
    /// `execve` would.
    ///
    /// # Safety
    /// `registers` holds the six argument registers of a variadic call and
    /// `stack` the caller's further arguments.
    unsafe extern "C" fn exec_list(registers: *const usize, stack: *const usize, kind: c_int) -> c_int {
        // SAFETY: the caller's contract: argument i lies in a register or on the stack.
        let arg = |i: usize| unsafe { if i < 6 { *registers.add(i) } else { *stack.add(i - 6) } };
        let path = arg(0) as *const c_char;
        let mut argv: Vec<*const c_char> = Vec::new();
        let mut i = 1;
        loop {
            let a = arg(i) as *const c_char;
            argv.push(a);
            i += 1;
            if a.is_null() || argv.len() > MOST_ARGUMENTS {
                break;
            }
        }
        if argv.last().is_some_and(|a| !a.is_null()) {
            return super::fail(libc::E2BIG);
        }
        let argv = argv.as_ptr();
        // SAFETY: the arguments as the C caller gave them, NULL-terminated.
        unsafe {
            match kind {
                EXECLP => super::execvpe(path, argv, super::environ),
                EXECLE => super::execute(path, argv, arg(i) as *const *const c_char, 0),
                _ => super::execute(path, argv, super::environ, 0),
            }
        }
    }
}
