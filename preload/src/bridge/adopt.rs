//! A forked child's standard streams on its parent's mounted files: the
//! parent keeps the bridge.
//!
//! `subprocess.run(cmd, stdout=f)` with `f` open on a mount, or a shell's
//! `cmd >&3` after `exec 3> /mnt/i/log`: the parent holds the file (and so
//! the mount), forks, and the child puts the inherited descriptor on 0, 1
//! or 2 and executes the command. The child cannot use the mount (its
//! engine's threads stayed with the parent, and the parent holds it), so
//! the command wrote into nothing (`echo: write error: Bad file
//! descriptor`). Instead the child asks its parent to bridge: it makes a
//! pipe, sends the parent one end (`SCM_RIGHTS` over a Unix socket the
//! parent listens on, named after the parent's pid in the abstract
//! namespace) with the descriptor's number, and puts its own end where the
//! program asked. The parent's *adopter* thread (one per process, started
//! at the first fork while it has mounted files open, never ending) finds
//! its own open file behind that number and starts a bridge on it
//! (`for_child`): the child's writes land in the file at the shared
//! position, its reads come from it, as with the kernel's file. The
//! parent's `wait` for the child then returns after the bridge has written
//! what the child sent (`after_child_ended`).
//!
//! Only the process's own children are served (the peer's credentials:
//! same user, and its parent is this process; a seek, `seek.rs`, from any
//! descendant), and only a file the parent still has open at that number
//! by the same path. A forked child listens
//! too and passes its own children's requests up to its parent (a
//! subshell's command: `( cmd >&3 )`), the descriptor keeping its number
//! from one generation to the next. A descriptor above 2 the child keeps
//! across its exec is bridged the same way, at the exec (`inherit.rs`);
//! descriptors of one open file that go the same way share one pipe (the
//! child's 0 and its 3 after `cat <&3`), as they share one position. A
//! pipe the parent feeds is fed from a cursor of the bridge's own, and the
//! shared position moves by what the child consumed when it is reaped
//! (`bridge::Cursor`): a sibling that inherits the file and never reads it
//! takes nothing from the one that does.
//! Where it cannot be done (no parent listening), the child's descriptor
//! fails with EBADF as before.

use super::{made_up, moved_up, set_nonblocking};
use crate::mount::{self, Description, Node};
use crate::real;
use libc::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

/// The listening socket of this process (-1: none yet).
static LISTENING: AtomicI32 = AtomicI32::new(-1);

/// Most path bytes a request carries (the rest is not compared).
const PATH_BYTES: usize = 1024;

/// How long a child waits for its parent's answer (seconds).
const ANSWER_WAIT_S: libc::time_t = 10;

/// The `to` of a request to seek a pipe the parent's bridge feeds
/// (`seek.rs`): its payload then holds `whence` and the offset, and it
/// carries one descriptor, the requester's reading end of the pipe.
const SEEK_REQUEST: c_int = -1;

/// The answer to a request: an errno (0: done) and, for a seek, the position.
type Answer = (c_int, u64);

/// The socket's abstract name for process `pid` (with its leading NUL), and its length.
fn address(pid: libc::pid_t) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("iopath-adopt-{pid}");
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (addr, len as libc::socklen_t)
}

/// Before a fork: if this process has mounted files open, makes sure it
/// listens for its children's requests (once per process).
pub fn listen_before_fork() {
    if LISTENING.load(Ordering::Acquire) >= 0 || !(mount::holds_files() || super::feeds_any()) {
        return;
    }
    // One thread makes the socket: two threads forking at once (cargo's job
    // threads starting rustc) both made one, and the second one's bind said
    // "cannot listen ...: Address already in use".
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if LISTENING.load(Ordering::Acquire) >= 0 {
        return;
    }
    // SAFETY: socket, bind and listen on a socket of ours.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return;
        }
        let (addr, len) = address(libc::getpid());
        if libc::bind(fd, (&raw const addr).cast(), len) != 0 || libc::listen(fd, 16) != 0 {
            crate::log(&format!("cannot listen for children's standard streams: {}", std::io::Error::last_os_error()));
            real::close(fd);
            return;
        }
        fd
    };
    let Ok(fd) = moved_up(fd) else { return };
    LISTENING.store(fd, Ordering::Release);
    let named = std::thread::Builder::new().name("iopath-adopt".into());
    if iopath::sys::spawn_without_signals(named, move || serve(fd)).is_err() {
        LISTENING.store(-1, Ordering::Release);
        // SAFETY: our socket; no thread uses it.
        unsafe { real::close(fd) };
    }
}

/// In a child just forked: the parent's socket is the parent's.
pub fn in_child_after_fork() {
    if let Ok(mut given) = GIVEN.try_lock() {
        given.clear(); // (the parent's; this child asks its own parent)
    }
    let fd = LISTENING.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the inherited listening socket; the parent's thread serving it is not here.
        unsafe { real::close(fd) };
    }
}

/// The adopter thread: serves one request per connection, for ever.
fn serve(listening: c_int) {
    let _inside = crate::Inside::enter();
    loop {
        // Waits for a connection first: the descriptor is then made and moved up at once.
        let mut ready = libc::pollfd { fd: listening, events: libc::POLLIN, revents: 0 };
        // SAFETY: polls one pollfd of ours.
        if unsafe { libc::poll(&mut ready, 1, -1) } < 0 {
            if crate::posix::last_errno() != libc::EINTR {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        // SAFETY: accept on our listening socket (non-blocking: another may have taken it).
        let accept = || unsafe {
            libc::accept4(
                listening,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        let conn = match made_up(accept) {
            Ok(conn) => conn,
            Err(libc::EINTR | libc::EAGAIN) => continue,
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        // (The request and the answer wait, with the child's timeout on its side.)
        set_nonblocking(conn, false);
        let (errno, position) = match own_descendant(conn) {
            Some(peer) => answer(conn, peer),
            None => (libc::EPERM, 0),
        };
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&errno.to_ne_bytes());
        bytes[4..].copy_from_slice(&position.to_ne_bytes());
        // SAFETY: writes 12 bytes from a local to our connection, then closes it.
        unsafe {
            libc::send(conn, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL);
            real::close(conn);
        }
    }
}

/// How far down a seek request may come from ([`ask_seek`] walks up as far).
const GENERATIONS: usize = 8;

/// The peer of a connection: this user's process, a descendant of this one.
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: libc::pid_t,
    /// This process's child (else a grandchild or further down).
    child: bool,
}

/// The peer of `conn`, if it is this user's process and descends from
/// this one (at most [`GENERATIONS`] down).
fn own_descendant(conn: c_int) -> Option<Peer> {
    // SAFETY: all-zero is a valid ucred; getsockopt fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a buffer of ours of the size given.
    let got = unsafe { libc::getsockopt(conn, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len) };
    // SAFETY: getuid and getpid cannot fail.
    let (uid, me) = unsafe { (libc::getuid(), libc::getpid()) };
    if got != 0 || cred.uid != uid {
        return None;
    }
    let mut up = cred.pid;
    for generation in 0..GENERATIONS {
        up = parent_of(up).filter(|&p| p > 1)?;
        if up == me {
            return Some(Peer { pid: cred.pid, child: generation == 0 });
        }
    }
    None
}

/// The parent of process `pid` (from `/proc/PID/stat`).
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let text = std::str::from_utf8(after).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Reads one request on `conn` from `child` and bridges it: 0 or an errno.
/// It carries the parent's end of the child's pipe and, for a pipe the
/// parent feeds, a copy of the child's reading end (to count what the
/// child leaves unread: [`super::after_child_ended`]). Or it asks to seek
/// a pipe ([`SEEK_REQUEST`]): the errno and the new position.
fn answer(conn: c_int, peer: Peer) -> Answer {
    let mut payload = [0u8; 8 + PATH_BYTES];
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
    let mut control = [0u64; 4]; // room for two descriptors' cmsg, aligned
    // SAFETY: all-zero is a valid msghdr; its buffers are ours.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let mut n = -1;
    // The descriptors come at the lowest free numbers: moved up at once.
    let received: Vec<c_int> = iopath::sys::own_numbers(|| {
        // SAFETY: receives into the buffers above.
        n = unsafe { libc::recvmsg(conn, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        received_descriptors(&msg).into_iter().filter_map(|fd| moved_up(fd).ok()).collect()
    });
    let close_all = |fds: &[c_int]| {
        for &fd in fds {
            // SAFETY: descriptors just received: ours.
            unsafe { real::close(fd) };
        }
    };
    let (end, reader) = match received[..] {
        [end] => (end, None),
        [end, reader] => (end, Some(reader)),
        _ => {
            close_all(&received);
            return (libc::EINVAL, 0);
        }
    };
    if n < 8 {
        close_all(&received);
        return (libc::EINVAL, 0);
    }
    let from = c_int::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
    let to = c_int::from_ne_bytes(payload[4..8].try_into().unwrap_or_default());
    let rest = &payload[8..n as usize];
    if to == SEEK_REQUEST {
        let answer = answer_seek(from, rest, &received);
        close_all(&received);
        return answer;
    }
    // Only a child asks to be bridged (a grandchild asks its parent, which passes it on).
    if !peer.child {
        close_all(&received);
        return (libc::EPERM, 0);
    }
    let child = peer.pid;
    let found = mount::lookup(from).filter(|d| matches!(d.node, Node::File(_)) && same_path(d, rest));
    let Some(d) = found else {
        close_all(&received);
        return (libc::EBADF, 0);
    };
    if mount::inherited(&d) {
        // This process is a forked child itself (a subshell): its parent holds the file,
        // and the same number stands for it there. The request goes up (its parent
        // counts what is left unread when this subshell is reaped).
        let forwarded = forward(from, to, &d.path, &received).map(|_| ());
        close_all(&received); // (the parent has its own copies now, if it took them)
        return (forwarded.err().unwrap_or(0), 0);
    }
    super::start_for_child(&d, to, end, reader.map(|fd| super::Reader { child, fd }));
    (0, 0)
}

/// A child's request to seek the pipe whose reading end it sent (`fds`,
/// one): served by this process's bridge that feeds it, or passed on up
/// (a subshell's command reading what its parent's parent feeds).
fn answer_seek(from: c_int, args: &[u8], fds: &[c_int]) -> Answer {
    let ([read_end], Some(whence), Some(offset)) = (
        fds,
        args.get(..4).and_then(|b| b.try_into().ok()).map(c_int::from_ne_bytes),
        args.get(4..12).and_then(|b| b.try_into().ok()).map(i64::from_ne_bytes),
    ) else {
        return (libc::EINVAL, 0);
    };
    let result = match super::seek::reposition(*read_end, offset, whence) {
        Some(result) => result,
        None => forward_seek(from, args, fds),
    };
    match result {
        Ok(position) => (0, position),
        Err(errno) => (errno, 0),
    }
}

/// Passes a seek request on to this process's parent: ESPIPE where no one answers.
fn forward_seek(from: c_int, args: &[u8], fds: &[c_int]) -> Result<u64, c_int> {
    forward(from, SEEK_REQUEST, args, fds).map_err(|errno| if errno == libc::EBADF { libc::ESPIPE } else { errno })
}

/// In a process whose pipe `fd` the kernel would not seek: asks the
/// nearest ancestor that listens (the parent, or further up past
/// processes that hold no mounted file: `sh -c 'head -n 1; cat'` run by a
/// program with its open file as standard input) whether a bridge of its
/// (or of an ancestor's) feeds the pipe, and to seek it so. The new
/// position, or errno; `None` where no bridge feeds it.
pub fn ask_seek(fd: c_int, offset: i64, whence: c_int) -> Option<Result<u64, c_int>> {
    let mut args = [0u8; 12];
    args[..4].copy_from_slice(&whence.to_ne_bytes());
    args[4..].copy_from_slice(&offset.to_ne_bytes());
    // SAFETY: getppid cannot fail.
    let mut ancestor = unsafe { libc::getppid() };
    for _ in 0..GENERATIONS {
        // SAFETY: socket makes a descriptor of ours, closed below.
        let conn = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if conn < 0 {
            return None;
        }
        let answer = request_to(ancestor, conn, fd, SEEK_REQUEST, &args, &[fd]);
        // SAFETY: ours.
        unsafe { real::close(conn) };
        match answer {
            Err(Refused::NotListening) => ancestor = parent_of(ancestor).filter(|&p| p > 1)?,
            Err(Refused::Answered(libc::EBADF | libc::ESPIPE | libc::EPERM) | Refused::Unanswered) => return None,
            Err(Refused::Answered(errno)) => return Some(Err(errno)),
            Ok(position) => return Some(Ok(position)),
        }
    }
    None
}

/// Whether `d` was opened by `path` (as far as a request carries it).
fn same_path(d: &Description, path: &[u8]) -> bool {
    d.path.len().min(PATH_BYTES) == path.len() && d.path.starts_with(path)
}

/// The descriptors a request carried (none if it carried none).
fn received_descriptors(msg: &libc::msghdr) -> Vec<c_int> {
    // SAFETY: walks the control messages recvmsg filled in `msg`'s buffer.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(msg);
        if cmsg.is_null() || (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Vec::new();
        }
        let bytes = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
        let data = libc::CMSG_DATA(cmsg).cast::<c_int>();
        (0..bytes / std::mem::size_of::<c_int>()).map(|i| std::ptr::read_unaligned(data.add(i))).collect()
    }
}

/// In a forked child: puts inherited mounted `d` (this process's
/// descriptor `from`, its parent's too) on standard stream `to` by asking
/// the parent to bridge it. `to`, or -1 with errno (EBADF where the parent
/// does not answer: as before).
///
/// Descriptors of one open file that go the same way share one pipe, as
/// they share one position: `exec 3< f; cat <&3` puts the shell's 3 on the
/// child's 0 and keeps it on 3 across the exec, and two pipes fed from one
/// position raced for its bytes (cat got a short file in 1 run of 5).
pub fn ask_parent(d: &Description, from: c_int, to: c_int, cloexec: bool) -> c_int {
    let writes_file = super::writes_into(d, to);
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    if let Some(given) = given_before(d, writes_file) {
        // SAFETY: the pipe this process was given for `d`, duplicated onto the program's `to`.
        let placed = unsafe { real::dup3(given, to, flags) };
        if placed >= 0 {
            remember_given(d, writes_file, placed);
        }
        return placed;
    }
    match ask(d, from, to) {
        Ok(mine) => {
            // SAFETY: our pipe end onto the program's `to` (replacing the placeholder there).
            let placed = unsafe { real::dup3(mine, to, flags) };
            let errno = crate::posix::last_errno();
            // SAFETY: ours, duplicated (or not) above.
            unsafe { real::close(mine) };
            if placed < 0 {
                return crate::posix::fail(errno);
            }
            remember_given(d, writes_file, placed);
            placed
        }
        Err(errno) => crate::posix::fail(errno),
    }
}

/// In a forked child: [`ask_parent`] to bridge inherited mounted `d` at
/// its own number `fd`. The number is a pipe then, and the description,
/// the parent's, leaves this child's table without being dropped (the
/// child neither closes its file nor lets go of its locks). Whether it is
/// one now.
pub fn bridged_in_place(d: &Description, fd: c_int, cloexec: bool) -> bool {
    if ask_parent(d, fd, fd, cloexec) != fd {
        return false;
    }
    std::mem::forget(mount::remove(fd));
    true
}

/// A pipe a forked child was given by its parent for one of the parent's open files.
struct Given {
    /// The description (its address: the child's table keeps it alive).
    description: usize,
    writes_file: bool,
    /// Where the pipe was put, and the pipe (so a number reused since is not taken for it).
    fd: c_int,
    pipe: (u64, u64),
}

/// The pipes this process was given ([`ask_parent`]); cleared in a forked child.
static GIVEN: std::sync::Mutex<Vec<Given>> = std::sync::Mutex::new(Vec::new());

/// A descriptor of this process that is still the pipe it was given for `d`, that way.
fn given_before(d: &Description, writes_file: bool) -> Option<c_int> {
    let given = GIVEN.try_lock().ok()?; // (never waits: a fork may have left it held)
    let address = std::ptr::from_ref(d) as usize;
    given
        .iter()
        .find(|g| g.description == address && g.writes_file == writes_file && super::pipe_id(g.fd) == Some(g.pipe))
        .map(|g| g.fd)
}

fn remember_given(d: &Description, writes_file: bool, fd: c_int) {
    let (Ok(mut given), Some(pipe)) = (GIVEN.try_lock(), super::pipe_id(fd)) else { return };
    given.retain(|g| g.fd != fd);
    given.push(Given { description: std::ptr::from_ref(d) as usize, writes_file, fd, pipe });
}

/// The request: this process's end of a pipe whose other end the parent
/// bridges, or errno.
fn ask(d: &Description, from: c_int, to: c_int) -> Result<c_int, c_int> {
    let writes_file = super::writes_into(d, to);
    let mut pipe = [-1; 2];
    // SAFETY: pipe2 fills two descriptors; socket makes one.
    let conn = unsafe {
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(crate::posix::last_errno());
        }
        libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
    };
    let (mine, theirs) = if writes_file { (pipe[1], pipe[0]) } else { (pipe[0], pipe[1]) };
    // A pipe the parent feeds: it gets a copy of the reading end too, to count what is left.
    let sent: &[c_int] = if writes_file { &[theirs] } else { &[theirs, mine] };
    let answer = if conn < 0 { Err(libc::EBADF) } else { request(conn, from, to, &d.path, sent).map(|_| ()) };
    // SAFETY: our descriptors (the parent has its own copy of `theirs` now, if it took it).
    unsafe {
        real::close(theirs);
        if conn >= 0 {
            real::close(conn);
        }
    }
    match answer {
        Ok(()) => Ok(mine),
        Err(errno) => {
            // SAFETY: as above.
            unsafe { real::close(mine) };
            Err(errno)
        }
    }
}

/// Passes a request this process received on to its own parent.
fn forward(from: c_int, to: c_int, path: &[u8], fds: &[c_int]) -> Result<u64, c_int> {
    // (On the adopter's thread, while the program redirects: made and moved up at once.)
    // SAFETY: socket makes a descriptor of ours, closed below.
    let made = made_up(|| unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) });
    let Ok(conn) = made else { return Err(libc::EBADF) };
    let answer = request(conn, from, to, path, fds);
    // SAFETY: ours.
    unsafe { real::close(conn) };
    answer
}

/// Sends the request on `conn` to the parent, carrying descriptors `fds`
/// (one or two), and reads the answer: the position a seek gives (0 for
/// any other request), or errno (EBADF where the parent does not listen).
fn request(conn: c_int, from: c_int, to: c_int, path: &[u8], fds: &[c_int]) -> Result<u64, c_int> {
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    request_to(parent, conn, from, to, path, fds).map_err(|refused| {
        let why = match refused {
            Refused::NotListening => "no process listens for it",
            Refused::Unanswered => "it took the request and gave no answer",
            Refused::Answered(errno) => return errno,
        };
        // (Which of the two it was, for a failure that comes once in many runs.)
        crate::log(&format!("descriptor {from} to {to}: asked process {parent} to bridge it: {why}; EBADF"));
        libc::EBADF
    })
}

/// Why a request was not done.
enum Refused {
    /// No process listens at that address (or it could not be reached).
    NotListening,
    /// The connection closed, or the wait for the answer ran out, without one.
    Unanswered,
    /// It answered with this errno.
    Answered(c_int),
}

/// [`request`] to process `pid`.
fn request_to(
    pid: libc::pid_t,
    conn: c_int,
    from: c_int,
    to: c_int,
    path: &[u8],
    fds: &[c_int],
) -> Result<u64, Refused> {
    debug_assert!((1..=2).contains(&fds.len()), "a request carries one or two descriptors");
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    let (addr, len) = address(pid);
    let mut payload = Vec::with_capacity(8 + PATH_BYTES);
    payload.extend_from_slice(&from.to_ne_bytes());
    payload.extend_from_slice(&to.to_ne_bytes());
    payload.extend_from_slice(&path[..path.len().min(PATH_BYTES)]);
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
    let mut control = [0u64; 4];
    let wait = libc::timeval { tv_sec: ANSWER_WAIT_S, tv_usec: 0 };
    // SAFETY: all-zero is a valid msghdr; the control buffer holds one descriptor's cmsg.
    let sent = unsafe {
        if libc::connect(conn, (&raw const addr).cast(), len) != 0 {
            return Err(Refused::NotListening); // no parent listening: as before
        }
        libc::setsockopt(
            conn,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const wait).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(fd_bytes) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
        for (i, &fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>().add(i), fd);
        }
        libc::sendmsg(conn, &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(Refused::NotListening);
    }
    let mut answer = [0u8; 12];
    // A signal may come meanwhile (the child's own mount's threads, a timer): the answer still comes.
    let got = loop {
        // SAFETY: reads up to 12 bytes into a local.
        let got = unsafe { libc::recv(conn, answer.as_mut_ptr().cast(), answer.len(), 0) };
        if got >= 0 || crate::posix::last_errno() != libc::EINTR {
            break got;
        }
    };
    let errno = c_int::from_ne_bytes([answer[0], answer[1], answer[2], answer[3]]);
    match (got, errno) {
        (12, 0) => Ok(u64::from_ne_bytes(answer[4..].try_into().unwrap_or_default())),
        (12, errno) => Err(Refused::Answered(errno)),
        _ => Err(Refused::Unanswered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_of_a_process_is_read_from_proc() {
        // SAFETY: getpid and getppid cannot fail.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        assert_eq!(parent_of(me), Some(parent));
        assert_eq!(parent_of(-1), None);
    }

    #[test]
    fn each_process_has_its_own_abstract_name() {
        let (a, la) = address(10);
        let (b, lb) = address(11);
        assert_eq!(a.sun_path[0], 0);
        assert!(la == lb && a.sun_path[..la as usize - 2] != b.sun_path[..lb as usize - 2]);
    }
}
