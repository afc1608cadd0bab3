//! Standard streams on mounted files: `prog > /mnt/i/out`, `echo x >>
//! /mnt/i/log 2>&1`, `prog < /mnt/i/in`, `sort -o /mnt/i/sorted`.
//!
//! Programs read and write descriptors 0, 1 and 2 through the C library's
//! stdio, which calls the kernel directly, and a mounted file is not the
//! kernel's; a shell opens a redirection's file and then executes a program
//! that knows nothing of it. So a mounted file never sits on 0, 1 or 2
//! itself: when a program puts one there (`dup2`, as a shell does for a
//! redirection), the descriptor becomes one end of a pipe, and a thread of
//! this library (a *bridge*) keeps the other: for a file opened for writing
//! it writes what arrives at the open file's position (at its end with
//! `O_APPEND`), for one opened for reading it feeds the file's bytes from
//! the position on and closes its end at the end of the file. Duplicates
//! (`2>&1`) share the pipe. When the program closes or replaces the last of
//! its descriptors on a bridge, the bridge writes what the pipe still holds
//! and ends, before the call returns (a shell's next command finds the
//! file complete); at exit the same, after stdio is flushed.
//!
//! Across `exec` a bridge is handed on: the executing program stops it and
//! passes the pipe's end, the file and the position in `IOPATH_STDIO`, and
//! the new program's interposer starts it again (mounting the file system
//! first). Processes the program forks write into the same pipe while it
//! runs. An `open` in a mount that gets number 0, 1 or 2 (the program had
//! closed it) makes a bridge too.
//!
//! A bridge does not keep the mount from the program's children: before a
//! fork, a bridge that alone keeps its file open *lets go* ([`let_go`]),
//! the mount is given back, and the bridge runs on *held*
//! ([`Source::Held`]): a writing program's bytes are kept in memory until
//! the mount can be had, a reading program's file is read into memory (a
//! window of 4 MiB at a time, the mount taken again for the next one).
//! The program's `open` of a file a bridge writes into first makes the
//! bridge write what its pipe holds ([`written_before`]): what the
//! program wrote before lands first, as with the kernel's file.
//!
//! A reader that read ahead and gives the rest back with a seek (`{ head
//! -n 1; cat; } < f`) has the bridge stopped and started again where the
//! seek says (`seek.rs`), in this process or, asked through the adopter
//! socket, in the parent that feeds it; a writer that opened its output
//! itself and seeks there (`dd of=f seek=N`) has the bridge write what the
//! pipe holds, then move.
//!
//! What this gives up, against the kernel's file: the program sees a pipe
//! (`fstat` says FIFO, and `lseek(fd, 0, SEEK_CUR)` fails with ESPIPE, so
//! that programs testing whether they can seek read it as a pipe); a
//! reader's position runs ahead of what it consumed by what the pipe
//! holds, until the program replaces or closes the descriptor ([`unread`]); a process that outlives
//! the program and still writes to the pipe writes to nothing (EPIPE); a
//! file read while held is the file as it was at the fork.

mod adopt;
mod control;
mod held;
mod seek;

pub use adopt::{ask_parent, bridged_in_place, listen_before_fork};
pub use held::let_go;
pub use seek::seek;

use crate::fork_holds::FreshInChild;
use crate::mount::{self, Description, Node, Reopen};
use crate::posix::data::{read_mounted, write_mounted};
use crate::{Inside, real};
use control::{AnswerAll, Control, PAUSE, SETTLE, wait};
use held::{feed_held, hold_output};
use libc::c_int;
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The environment variable that hands bridges to the next program.
const VARIABLE: &str = "IOPATH_STDIO";

/// Lowest descriptor number a bridge's own end of its pipe takes (out of
/// the way of the numbers programs expect to be theirs).
const END_FLOOR: c_int = 400;

/// Bytes a pipe holds (asked for; the kernel may give less): fewer wake-ups
/// of the bridge for a program that writes much.
const PIPE_BYTES: c_int = 1 << 20;

/// One bridge, as handed from one program to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    /// The program's descriptors on the pipe (0, 1 or 2, and their duplicates).
    fds: Vec<c_int>,
    /// The program writes the file (else it reads it).
    writes_file: bool,
    /// The bridge's end of the pipe.
    end: c_int,
    /// The open file, where it stands.
    file: Reopen,
    /// The program opened the file itself and writes it (it landed on 0, 1 or
    /// 2: rsync's receiver closes its standard output): its seeks move where
    /// the bridge writes, also once the bridge holds its bytes in memory
    /// ([`seek::reposition_writer`]). Not handed across an exec (the next
    /// program did not open it).
    own: bool,
}

impl Spec {
    /// `fds|w|end|` and the file's [`Reopen::encode`].
    fn encode(&self) -> String {
        let dir = if self.writes_file { 'w' } else { 'r' };
        format!("{}|{dir}|{}|{}", encode_fds(&self.fds), self.end, self.file.encode())
    }

    fn decode(text: &str) -> Option<Spec> {
        let parts: Vec<&str> = text.split('|').collect();
        let [fds, dir, end, ref file @ ..] = parts[..] else { return None };
        Some(Spec {
            fds: decode_fds(fds)?,
            writes_file: match dir {
                "w" => true,
                "r" => false,
                _ => return None,
            },
            end: end.parse().ok()?,
            file: Reopen::decode(file)?,
            own: false,
        })
    }

    fn shown(&self) -> String {
        describe(&self.fds, self.writes_file, self.file.mount_dir(), &self.file.path)
    }
}

/// Descriptor numbers as a hand-over carries them: "1,2".
pub(crate) fn encode_fds(fds: &[c_int]) -> String {
    fds.iter().map(c_int::to_string).collect::<Vec<_>>().join(",")
}

/// [`encode_fds`] read back: at least one number, none negative.
pub(crate) fn decode_fds(text: &str) -> Option<Vec<c_int>> {
    let fds = text.split(',').map(|f| f.parse().ok().filter(|f: &c_int| *f >= 0)).collect::<Option<Vec<_>>>()?;
    (!fds.is_empty()).then_some(fds)
}

/// "descriptor 1,2 into /mnt/i/log": a bridge, for messages.
fn describe(fds: &[c_int], writes_file: bool, mount: &[u8], path: &[u8]) -> String {
    format!(
        "descriptor {} {} {}{}",
        encode_fds(fds),
        if writes_file { "into" } else { "from" },
        String::from_utf8_lossy(mount),
        String::from_utf8_lossy(path)
    )
}

/// Where a bridge's open file comes from.
enum Source {
    /// Handed over by the program that executed this one: opened again.
    Handed(Spec),
    /// This program's own open file, shared (one position); for a bridge
    /// feeding a child, read from a cursor of its own ([`Cursor`]).
    Here(Arc<Description>, Option<Cursor>),
    /// Let go before a fork, so that the child can mount (see [`let_go`]):
    /// for a writing program, bytes that arrived and are not in the file yet
    /// (they go at `spec`'s position); for a reading one, the rest of the
    /// file from `spec`'s position, read into memory, of which the first
    /// `sent` bytes are in the pipe already (kept: a seek back finds them);
    /// `more` if the file goes on past them (up to [`held::HELD_BYTES`] are
    /// read at a time, the mount taken for each: see [`held::feed_held`]).
    Held { spec: Spec, bytes: Vec<u8>, sent: usize, more: bool },
}

/// Where a bridge feeding a forked or spawned child reads its parent's
/// open file: a position of its own, from the shared one when it started.
/// The shared position moves by what the child consumed when the child is
/// reaped ([`end_bridge`]). Read from the shared position, a sibling that
/// inherited the same file and never read it (`exec 3< f; cat <&3 |
/// md5sum`: md5sum keeps 3 across its exec, and gets a pipe too) had its
/// pipe fed ahead, and what went there was gone for the reader: cat's
/// output was short in 1 run of 10.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The shared position when the bridge started.
    start: u64,
    /// Where it reads next.
    at: u64,
}

/// A bridge whose thread runs.
struct Running {
    /// The program's descriptors on the pipe.
    fds: Vec<c_int>,
    /// What tells the thread to stop or to write what its pipe holds.
    control: Arc<Control>,
    /// The program's open file it shares, if it does (else it has its own, or none).
    description: Option<Arc<Description>>,
    /// Where it was handed over or let go, if it was (else `description` says).
    spec: Option<Spec>,
    /// For a writing program's bridge: the file it writes (mount index, inode).
    writes_into: Option<(usize, u64)>,
    /// It feeds the program from its file (else the program writes the file).
    feeds: bool,
    /// For a bridge feeding a forked or spawned child: the child, and this
    /// process's copy of the pipe's reading end (see [`after_child_ended`]).
    reader: Option<Reader>,
    /// Its pipe (device and inode numbers), by which a seek on any of the
    /// pipe's reading ends finds it (`seek.rs`); `None` if fstat failed.
    pipe: Option<(u64, u64)>,
    /// It feeds the program from bytes held in memory ([`Source::Held`]).
    in_memory: bool,
    /// For a bridge reading from a cursor of its own: where the shared position stood.
    cursor_start: Option<u64>,
    thread: std::thread::JoinHandle<Option<Paused>>,
}

/// A forked or spawned child a bridge feeds, and this process's copy of
/// the reading end of the child's pipe: once the child is gone, what the
/// pipe still holds is what it did not read.
#[derive(Debug)]
pub struct Reader {
    /// The child (the process that asked; a subshell passing on its own
    /// child's request); minus its spawn's number until the spawn returns
    /// ([`spawned`]).
    pub child: libc::pid_t,
    /// This process's copy of the reading end (close-on-exec, moved up).
    pub fd: c_int,
}

impl Reader {
    fn close(self) {
        forget_own(self.fd);
        // SAFETY: ours; no thread uses it.
        unsafe { real::close(self.fd) };
    }
}

/// A bridge stopped: where it stands, and what it holds in memory (as in
/// [`Source::Held`]; empty for a bridge that had its file open).
struct Paused {
    spec: Spec,
    held: Vec<u8>,
    /// For a reading bridge feeding from memory: bytes of `held` in the
    /// pipe already (`spec`'s position is `held`'s first byte's); else 0.
    sent: usize,
    /// For a reading bridge feeding from memory: the file goes on past `held`.
    more: bool,
}

impl Paused {
    /// Where the file's bytes in the pipe end: the next one to feed.
    fn fed_to(&self) -> u64 {
        self.spec.file.position + self.sent as u64
    }
}

/// The running bridges ([`running`]).
static RUNNING: FreshInChild<Vec<Running>> = FreshInChild::new(Mutex::new(Vec::new()));
/// How many bridges run: a call on any descriptor costs one load while none does.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The running bridges, locked. The shell's `SIGCHLD` handler may call
/// `waitpid` (and so [`after_child_ended`]) on a thread that holds this
/// lock (bash's `close` interrupted in [`unread`]: it waited for itself
/// for ever, a hang seen once in about 200 runs of the mount suite's seek
/// script): while a thread holds it, a child it reaps is noted
/// ([`DEFERRED`]) and seen to as the lock is let go. A handler behind the
/// library's wrapper waits for the lock's release ([`crate::Section`]);
/// this is for those that are not (installed before the library loaded).
fn running() -> RunningGuard {
    // Before the lock, and ended after it is let go: a signal between the two waits too.
    let section = crate::Section::enter();
    // Said before the lock is taken, and unsaid after it is let go: a signal between the
    // two only defers what it reaps.
    HOLDS_RUNNING.with(|h| h.set(true));
    let guard = RUNNING.get().lock().unwrap_or_else(|e| e.into_inner());
    RunningGuard(std::mem::ManuallyDrop::new(guard), section)
}

/// [`running`], once none of descriptors `first..=last` is on a bridge let
/// go before a fork or to a waiting process ([`held::let_go_holds`]): it
/// waits for their resume, when they are in the table again.
fn running_for(first: c_int, last: c_int) -> RunningGuard {
    loop {
        let table = running();
        if !held::let_go_holds(first, last) {
            return table;
        }
        drop(table);
        held::wait_for_resume();
    }
}

thread_local! {
    /// This thread holds [`RUNNING`] ([`running`]).
    static HOLDS_RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Children reaped by a signal handler while its thread held [`RUNNING`]
/// (0: a free slot; a handler reaps a child at a time, so a few are enough).
static DEFERRED: [std::sync::atomic::AtomicI32; 16] = [const { std::sync::atomic::AtomicI32::new(0) }; 16];

/// [`RUNNING`] locked by this thread: seeing to the children reaped
/// meanwhile once it is let go, and then (the section's end, a field's drop
/// after the lock's) to the handlers that waited.
struct RunningGuard(std::mem::ManuallyDrop<std::sync::MutexGuard<'static, Vec<Running>>>, crate::Section);

impl std::ops::Deref for RunningGuard {
    type Target = Vec<Running>;
    fn deref(&self) -> &Vec<Running> {
        &self.0
    }
}

impl std::ops::DerefMut for RunningGuard {
    fn deref_mut(&mut self) -> &mut Vec<Running> {
        &mut self.0
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) };
        HOLDS_RUNNING.with(|h| h.set(false));
        // (Loads first: this runs at every release of the lock, and there is rarely any.)
        for slot in DEFERRED.iter().filter(|slot| slot.load(Ordering::Acquire) != 0) {
            let child = slot.swap(0, Ordering::AcqRel);
            if child > 0 {
                after_child_ended(child);
            }
        }
    }
}

/// Whether a bridge of this process feeds a pipe (a child may ask it to
/// seek: its adopter must listen).
pub(crate) fn feeds_any() -> bool {
    COUNT.load(Ordering::Acquire) > 0 && running().iter().any(|b| b.feeds)
}

/// Every running bridge's descriptors (its pipe end and its eventfd): a
/// forked child closes them (the thread is not there, and a child holding a
/// feeding end would keep its reader from ever seeing the end of the file).
/// Atomics, not a locked list: the fork handler may not wait for a lock a
/// thread of the parent held. Room for 512 (a bridge has two, three if it
/// feeds a child; 16 slots were 8 bridges: a parent with more children on
/// its files than that at once left the ends of the others open in its
/// next forked child).
static OWN_FDS: [AtomicI32; 512] = [const { AtomicI32::new(-1) }; 512];

fn note_own(fd: c_int) {
    if !OWN_FDS.iter().any(|s| s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok()) {
        crate::log(&format!(
            "more than {} bridge descriptors at once: a child forked now keeps descriptor {fd} open",
            OWN_FDS.len()
        ));
    }
}

fn forget_own(fd: c_int) {
    for slot in &OWN_FDS {
        let _ = slot.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// What the bridges hold across a fork ([`crate::fork_holds`]): the list
/// of descriptors on bridges let go (the table of running ones is left to
/// the parent by [`in_child_after_fork`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    held::hold_for_fork()
}

/// In a child just forked: closes the bridges' own descriptors (their
/// threads stay with the parent; the child's writes reach them through the pipe).
pub fn in_child_after_fork() {
    for slot in &OWN_FDS {
        let fd = slot.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: a descriptor this library opened; the child has no thread using it.
            unsafe { real::close(fd) };
        }
    }
    // The parent's threads are not here: nothing to stop or join (and a table one
    // of them held at the fork is left to the parent: a child that starts a bridge
    // of its own waited for it for ever).
    if RUNNING.renew_in_child() {
        crate::log("a thread of the parent held the bridges' table at the fork: the child starts a new one");
    } else if let Ok(mut running) = RUNNING.get().try_lock() {
        std::mem::forget(std::mem::take(&mut *running));
    }
    COUNT.store(0, Ordering::Release);
    held::in_child_after_fork();
    adopt::in_child_after_fork();
}

/// Takes the bridges a parent handed over (`IOPATH_STDIO`) and starts them;
/// the variable is removed, so this program's children do not take them too.
pub fn adopt() {
    let Some(value) = std::env::var_os(VARIABLE) else { return };
    // SAFETY: at load, before the program's main: no other thread reads the environment.
    unsafe { libc::unsetenv(c"IOPATH_STDIO".as_ptr()) };
    for text in value.to_string_lossy().split(';').filter(|t| !t.is_empty()) {
        match Spec::decode(text) {
            Some(spec) => {
                crate::log(&format!("bridging {} (handed over at exec)", spec.shown()));
                relaunch(Source::Handed(spec));
            }
            None => crate::say(&format!("{VARIABLE}: cannot read \"{text}\"; standard streams on mounted files lost")),
        }
    }
}

/// Whether mounted descriptor `d` put on descriptor `to` becomes a bridge:
/// a file, on 0, 1 or 2.
pub fn wanted(d: &Description, to: c_int) -> bool {
    (0..=2).contains(&to) && matches!(d.node, Node::File(_))
}

/// Whether a bridge for mounted `d` on descriptor `to` writes into the
/// file (else it feeds the file to the program): a file open for writing,
/// unless it is put on standard input and can be read.
fn writes_into(d: &Description, to: c_int) -> bool {
    d.writable() && !(to == 0 && d.readable())
}

/// `dup2(fd, to)` of mounted `d` onto a standard stream: `to` becomes a
/// pipe that a bridge keeps, sharing `d` (its position). `to` or -1 with errno.
pub fn onto(d: &Arc<Description>, to: c_int, cloexec: bool) -> c_int {
    let writes_file = writes_into(d, to);
    let (theirs, end) = match pipe(writes_file) {
        Ok(pair) => pair,
        Err(errno) => return crate::posix::fail(errno),
    };
    // SAFETY: dup3 of our pipe end onto the program's `to` (replaced on purpose), then ours closed.
    let placed = unsafe {
        let placed = real::dup3(theirs, to, if cloexec { libc::O_CLOEXEC } else { 0 });
        let errno = crate::posix::last_errno();
        real::close(theirs);
        if placed < 0 {
            real::close(end);
            return crate::posix::fail(errno);
        }
        placed
    };
    crate::log(&format!(
        "bridging {} (a pipe: the C library's stdio calls the kernel)",
        describe(&[to], writes_file, &d.mount.dir, &d.path)
    ));
    launch(vec![to], end, writes_file, Source::Here(Arc::clone(d), None), None);
    placed
}

/// A bridge for a child that `posix_spawn` starts with mounted `d` as its
/// descriptor `to` (a file action's `dup2` of a mounted descriptor, or its
/// `open` of a mounted path): this program keeps the file and a bridge,
/// the child gets a pipe. Returns the pipe's end for the child
/// (close-on-exec; the caller hands it to the spawn and closes it after),
/// or errno. The bridge holds none of this program's descriptors: it ends
/// when every writer of the pipe has closed it (or its reader has), or at
/// this program's exit or exec, whichever comes first. A bridge feeding
/// the child keeps a copy of the pipe's reading end, for spawn number
/// `spawn` ([`next_spawn`]) until [`spawned`] names the child: reaped, it
/// gives back what it left unread, as a forked child does.
pub fn for_child(d: &Arc<Description>, to: c_int, spawn: libc::pid_t) -> Result<c_int, c_int> {
    let writes_file = writes_into(d, to);
    let (theirs, end) = pipe(writes_file)?;
    let copy = if writes_file { None } else { copied_up(theirs).ok() };
    let reader = copy.map(|fd| Reader { child: -spawn, fd });
    start_for_child(d, to, end, reader);
    Ok(theirs)
}

/// A number for a spawn whose children's bridges wait to learn its pid
/// ([`for_child`], [`spawned`]).
pub fn next_spawn() -> libc::pid_t {
    static SPAWNS: AtomicI32 = AtomicI32::new(0);
    SPAWNS.fetch_add(1, Ordering::Relaxed) % (libc::pid_t::MAX - 1) + 1
}

/// Spawn `spawn` made child `pid` (`None`: it failed, or the caller did not
/// ask for the pid): the bridges feeding it count what it leaves unread
/// when it is reaped, as a forked child's do; without a pid they cannot,
/// and let their copies go (a bridge ends when its child closes the pipe).
pub fn spawned(spawn: libc::pid_t, pid: Option<libc::pid_t>) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    for bridge in running().iter_mut() {
        let Some(reader) = bridge.reader.as_mut().filter(|r| r.child == -spawn) else { continue };
        match pid {
            Some(pid) => reader.child = pid,
            None => bridge.reader.take().into_iter().for_each(Reader::close),
        }
    }
}

/// Starts a bridge on `d` for a child's descriptor `to`, over `end` (this
/// process's end of the child's pipe): see [`for_child`]. With `reader`,
/// a feeding bridge gives back what the child leaves unread when it is
/// reaped ([`after_child_ended`]).
fn start_for_child(d: &Arc<Description>, to: c_int, end: c_int, reader: Option<Reader>) {
    reap_ended();
    let writes_file = writes_into(d, to);
    if writes_file && let Ok(file) = d.file() {
        // What the child wrote through an earlier pipe into this file (a subshell's
        // `echo one >&4; echo two >&4`: a pipe each) lies before what it writes next.
        let ino = file.metadata().ino;
        drop(file);
        written_before(d.mount, ino);
    }
    crate::log(&format!(
        "bridging a child's {} (a pipe: the child cannot reach the mount)",
        describe(&[to], writes_file, &d.mount.dir, &d.path)
    ));
    if let Some(reader) = &reader {
        note_own(reader.fd);
    }
    let cursor = (!writes_file).then(|| {
        let at = *d.position.lock().unwrap_or_else(|e| e.into_inner());
        Cursor { start: at, at }
    });
    launch(Vec::new(), end, writes_file, Source::Here(Arc::clone(d), cursor), reader);
}

/// A child of this program ended (`wait` and its kind reaped `child`): the
/// bridges of spawned children write what their pipes hold, so that the
/// parent finds the child's output in the file, as with the kernel's; a
/// bridge that fed `child` its parent's open file stops, and the file's
/// position goes back by what the child left unread in the pipe (`exec 3<
/// f; head -c 6 <&3; cat <&3` in a shell: cat found the rest of the file
/// gone, fed into head's pipe).
pub fn after_child_ended(child: libc::pid_t) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    if HOLDS_RUNNING.with(|h| h.get()) {
        // A signal handler on a thread that holds the bridges' lock: later (see `running`).
        let _ =
            DEFERRED.iter().any(|slot| slot.compare_exchange(0, child, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        return;
    }
    // SAFETY: kill with signal 0 only asks whether the process is there (a stopped
    // child, or one left waitable, is: its pipe may still be read).
    if child > 0 && unsafe { libc::kill(child, 0) } != 0 {
        let fed: Vec<Running> = {
            let mut running = running();
            let (fed, going): (Vec<Running>, Vec<Running>) = std::mem::take(&mut *running)
                .into_iter()
                .partition(|b| b.reader.as_ref().is_some_and(|r| r.child == child));
            *running = going;
            COUNT.store(running.len(), Ordering::Release);
            fed
        };
        for mut bridge in fed {
            let reader = bridge.reader.take();
            end_bridge(bridge, || reader.as_ref().map_or(0, |r| pipe_holds(r.fd)));
            if let Some(reader) = reader {
                reader.close();
            }
        }
    }
    let writing: Vec<Arc<Control>> = running()
        .iter()
        .filter(|b| b.fds.is_empty() && b.writes_into.is_some())
        .map(|b| Arc::clone(&b.control))
        .collect();
    for control in writing {
        control.flush();
    }
    reap_ended();
}

/// Joins the bridges of spawned children that have ended for good.
fn reap_ended() {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let ended: Vec<Running> = {
        let mut running = running();
        let (ended, going): (Vec<Running>, Vec<Running>) = std::mem::take(&mut *running)
            .into_iter()
            .partition(|b| b.fds.is_empty() && b.reader.is_none() && b.control.ended.load(Ordering::Acquire));
        *running = going;
        COUNT.store(running.len(), Ordering::Release);
        ended
    };
    for bridge in ended {
        // (One that fed a child from its own cursor moves the shared position by all it fed.)
        end_bridge(bridge, || 0);
    }
}

/// Starts a stopped bridge again (its descriptors, end and direction are its spec's).
fn relaunch(source: Source) {
    let spec = match &source {
        Source::Handed(spec) | Source::Held { spec, .. } => spec,
        Source::Here(..) => unreachable!("a bridge on this program's own file is started by `onto`"),
    };
    let (fds, end, writes_file) = (spec.fds.clone(), spec.end, spec.writes_file);
    launch(fds, end, writes_file, source, None);
}

/// A new pipe: the program's end and this library's, both at [`END_FLOOR`]
/// or above and close-on-exec; or errno. The program's end is put where
/// the program wants it by the caller; until then it sits high too (left
/// on the lowest free number, a program's `pipe` on another thread got
/// the number above: `tests/c/lowest_numbers.c`).
fn pipe(writes_file: bool) -> Result<(c_int, c_int), c_int> {
    iopath::sys::own_numbers(|| {
        let mut pipe = [-1; 2];
        // SAFETY: pipe2 fills two descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(crate::posix::last_errno());
        }
        let (theirs, ours) = if writes_file { (pipe[1], pipe[0]) } else { (pipe[0], pipe[1]) };
        // SAFETY: fcntl on our own end of the pipe.
        unsafe { real::fcntl(ours, libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_ulong) };
        let theirs = moved_up(theirs);
        match (theirs, moved_up(ours)) {
            (Ok(theirs), Ok(end)) => Ok((theirs, end)),
            (theirs, end) => {
                for fd in [theirs, end].into_iter().flatten() {
                    // SAFETY: this library's, not handed out yet.
                    unsafe { real::close(fd) };
                }
                Err(theirs.err().or(end.err()).unwrap_or(libc::EMFILE))
            }
        }
    })
}

/// A descriptor of this library's that `make` opens (or -1 with errno),
/// moved up at once ([`moved_up`]), both inside
/// [`iopath::sys::own_numbers`]: a bridge's thread or the adopter makes
/// them while the program redirects.
fn made_up(make: impl FnOnce() -> c_int) -> Result<c_int, c_int> {
    iopath::sys::own_numbers(|| {
        let fd = make();
        if fd < 0 { Err(crate::posix::last_errno()) } else { moved_up(fd) }
    })
}

/// `fd` (this library's) moved to the lowest free number from
/// [`END_FLOOR`], close-on-exec; the old number is closed either way.
fn moved_up(fd: c_int) -> Result<c_int, c_int> {
    let up = copied_up(fd);
    // SAFETY: closing a descriptor of this library's, copied (or not) above.
    unsafe { real::close(fd) };
    up
}

/// A close-on-exec copy of `fd` on the lowest free number from
/// [`END_FLOOR`] (never a low one, even for a moment), or errno.
fn copied_up(fd: c_int) -> Result<c_int, c_int> {
    // SAFETY: F_DUPFD_CLOEXEC only makes a new descriptor.
    let up = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, END_FLOOR as libc::c_ulong) };
    if up < 0 { Err(crate::posix::last_errno()) } else { Ok(up) }
}

/// Starts a bridge's thread on `end` (made close-on-exec).
fn launch(fds: Vec<c_int>, end: c_int, writes_file: bool, source: Source, reader: Option<Reader>) {
    // SAFETY: F_SETFD on a descriptor of this library's.
    unsafe { real::fcntl(end, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    let control = match Control::new() {
        Ok(control) => control,
        Err(errno) => {
            crate::say(&format!("cannot keep a standard stream on a mounted file: eventfd: {}", os_error(errno)));
            // SAFETY: our end; closing it tells the program (EPIPE, or the end of its input).
            unsafe { real::close(end) };
            if let Some(reader) = reader {
                reader.close();
            }
            return;
        }
    };
    // (An exit that interrupts a call then has a thread to end the bridge: one
    // that has not mounted yet may hold the program's bytes.)
    crate::interrupted_exit::prepare();
    let named = std::thread::Builder::new().name("iopath-stdio".into());
    let bridge_fds = fds.clone();
    let (description, spec, file) = match &source {
        Source::Here(d, _) => {
            let index = mount::mounts().iter().position(|m| std::ptr::eq(m, d.mount));
            let ino = d.file().map(|f| f.metadata().ino).ok();
            (Some(Arc::clone(d)), None, index.zip(ino))
        }
        Source::Handed(spec) | Source::Held { spec, .. } => {
            (None, Some(spec.clone()), Some((spec.file.mount, spec.file.ino)))
        }
    };
    let writes_into = file.filter(|_| writes_file);
    let pipe = pipe_id(if end >= 0 { end } else { fds.first().copied().unwrap_or(-1) });
    let in_memory = matches!(source, Source::Held { .. });
    let cursor_start = match &source {
        Source::Here(_, cursor) => cursor.map(|c| c.start),
        _ => None,
    };
    let theirs = Arc::clone(&control);
    let body = move || {
        let _answer = AnswerAll(Arc::clone(&theirs));
        run(source, bridge_fds, end, writes_file, &theirs)
    };
    // Returns once the thread runs: the fork handler starts bridges just before the
    // fork, and a child must not inherit a thread start half done.
    match iopath::sys::spawn_without_signals(named, body) {
        Ok(thread) => {
            if end >= 0 {
                note_own(end);
            }
            let mut running = running();
            running.push(Running {
                fds,
                control,
                description,
                spec,
                writes_into,
                feeds: !writes_file,
                reader,
                pipe,
                in_memory,
                cursor_start,
                thread,
            });
            COUNT.store(running.len(), Ordering::Release);
        }
        Err(e) => {
            crate::say(&format!("cannot start a thread for a standard stream on a mounted file: {e}"));
            // SAFETY: our end, used by nothing else (the control closes its eventfd as it goes).
            unsafe { real::close(end) };
            if let Some(reader) = reader {
                reader.close();
            }
        }
    }
}

/// The program is about to open file `ino` of mount `m`: every bridge
/// writing into it first writes what the program has put in its pipe, so
/// that what it wrote before lies before what it writes or reads next, as
/// with the kernel's file (`{ echo one; echo two >> f; } > f` gave "two
/// one" now and then: the bridge's thread wrote "one" after the builtin
/// had written "two" directly).
pub fn written_before(m: &mount::Mount, ino: u64) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(index) = mount::mounts().iter().position(|n| std::ptr::eq(n, m)) else { return };
    let controls: Vec<Arc<Control>> =
        running().iter().filter(|b| b.writes_into == Some((index, ino))).map(|b| Arc::clone(&b.control)).collect();
    let _errno = crate::KeepErrno::new();
    for control in controls {
        control.flush();
    }
}

/// The file behind descriptor `fd` if it is a bridge's (`None` if it is
/// not one): the program's open file it shares, or the file opened again
/// (mounting if need be), with what the program wrote into the pipe
/// written into it first; `Err(errno)` if it cannot be had.
pub fn file_of(fd: c_int) -> Option<Result<Arc<Description>, c_int>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let (control, description, spec, writes) = {
        // A bridge let go to a waiting process is out of the table until it resumes:
        // waited for, or the call went to the pipe (ftruncate: EINVAL).
        let running = running_for(fd, fd);
        let b = running.iter().find(|b| b.fds.contains(&fd))?;
        (Arc::clone(&b.control), b.description.clone(), b.spec.clone(), b.writes_into.is_some())
    };
    // Opened first: a held bridge writes what it holds once the mount is here.
    let file = match (description, spec) {
        (Some(d), _) => Ok(d),
        (None, Some(spec)) => spec.file.open().map(Arc::new).map_err(|why| {
            crate::log(&format!("{}: {why}", spec.shown()));
            libc::EIO
        }),
        (None, None) => Err(libc::EBADF),
    };
    if writes {
        control.flush();
    }
    Some(file)
}

/// The program's own open file that a writing bridge of this process
/// writes into from the pipe descriptor `fd` is on (the program opened the
/// file and put it on 0, 1 or 2 itself: `dd of=f` does), once the bridge
/// has written what the pipe holds; a seek there moves where the bridge
/// writes what comes next. `None` if `fd` is on no such bridge: a reading
/// one, one let go before a fork, or one whose file the program before
/// handed over (`prog > f`: the program may probe whether its output
/// seeks, then seek through stdio, which the pipe refuses; see `seek.rs`).
pub(super) fn written_file(fd: c_int) -> Option<Arc<Description>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let (control, description) = {
        // (One let go to a waiting process is waited for, as in `file_of`: a seek went
        // to the pipe, ESPIPE.)
        let running = running_for(fd, fd);
        let b = running.iter().find(|b| b.fds.contains(&fd) && !b.feeds && !b.in_memory)?;
        (Arc::clone(&b.control), Arc::clone(b.description.as_ref()?))
    };
    let _errno = crate::KeepErrno::new();
    control.flush();
    Some(description)
}

/// Whether the bridge on pipe descriptor `fd` still writes into the
/// program's open file `d` ([`written_file`]): not if a let-go (to a
/// waiting process, or before a fork) has stopped it since, keeping
/// where `d`'s position stood then. Waits for a let-go under way to end.
pub(super) fn still_writes_into(fd: c_int, d: &Arc<Description>) -> bool {
    let running = running_for(fd, fd);
    running
        .iter()
        .any(|b| b.fds.contains(&fd) && !b.in_memory && b.description.as_ref().is_some_and(|own| Arc::ptr_eq(own, d)))
}

/// Stops a bridge and waits for it: it writes what its pipe holds into its
/// file (or into memory, if it is held, unless `settle`) and gives back
/// where it stands (`None` if it had ended: its file fed to the end, every
/// writer gone, or failed and said why). Its end of the pipe stays open
/// (an exec hands it on).
fn pause(bridge: Running, settle: bool) -> Option<Paused> {
    if let Some(reader) = bridge.reader {
        reader.close();
    }
    bridge.control.tell(if settle { SETTLE } else { PAUSE });
    let paused = bridge.thread.join().ok().flatten();
    paused.map(|p| Paused { spec: Spec { fds: bridge.fds, ..p.spec }, ..p })
}

/// [`pause`]; for a reading bridge that had ended, where it stood then
/// (its end of the pipe closed: -1 in the spec). With whether its end is open.
fn pause_or_last(bridge: Running, settle: bool) -> Option<(Paused, bool)> {
    let (control, fds) = (Arc::clone(&bridge.control), bridge.fds.clone());
    if let Some(paused) = pause(bridge, settle) {
        return Some((paused, true));
    }
    let last = control.last().take()?;
    Some((Paused { spec: Spec { fds, ..last.spec }, ..last }, false))
}

/// [`pause`], and what a writing program's bridge held in memory written
/// into its file (waiting for the mount if another process has it): where
/// the bridge stands, with nothing left behind. A reading bridge that had
/// fed its file to the end says where it stood, its end -1 (handed on at
/// an exec so, a seek in the next program can start it again).
fn stop(bridge: Running) -> Option<Spec> {
    let (paused, _) = pause_or_last(bridge, true)?;
    debug_assert!(!paused.spec.writes_file || paused.held.is_empty(), "a settled bridge holds nothing");
    let position = paused.fed_to();
    Some(Spec { file: Reopen { position, ..paused.spec.file }, ..paused.spec })
}

fn close_end(spec: &Spec) {
    if spec.end >= 0 {
        forget_own(spec.end);
        // SAFETY: the bridge's end; its thread is gone.
        unsafe { real::close(spec.end) };
    }
}

/// Stops every bridge (see [`stop`]).
fn stop_all() -> Vec<Spec> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let all = std::mem::take(&mut *running());
    COUNT.store(0, Ordering::Release);
    all.into_iter().filter_map(stop).collect()
}

/// Before the program closes or replaces descriptor `fd`: if it is the
/// last of a bridge feeding the program its own open file, the bytes its
/// pipe holds that the program has not read (`FIONREAD` on the program's
/// end). [`closed`] puts the file's position back by them (and by what the
/// bridge read from the file and had not sent), so the program's next read
/// of that file starts after what it consumed, as with the kernel's file:
/// dash's `read a <&8; read b <&8` gave `b` nothing (the first bridge had
/// fed the whole file into its pipe). 0 for any other descriptor.
pub fn unread(fd: c_int) -> u64 {
    if COUNT.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let last_feeding = running().iter().any(|b| b.feeds && b.description.is_some() && b.fds == [fd]);
    if last_feeding { pipe_holds(fd) } else { 0 }
}

/// The pipe `fd` is an end of: its device and inode numbers.
fn pipe_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local.
    let fifo = unsafe { real::fstat(fd, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO;
    fifo.then_some((st.st_dev, st.st_ino))
}

/// Bytes pipe end `fd` holds that no reader took (`FIONREAD`; 0 if it cannot say).
fn pipe_holds(fd: c_int) -> u64 {
    let mut n: c_int = 0;
    // SAFETY: FIONREAD into a local.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return 0;
    }
    u64::try_from(n).unwrap_or(0)
}

/// The program closed descriptor `fd` (or the kernel replaced it): if it
/// was the last of a bridge's, the bridge writes what is left and ends now
/// (a feeding bridge puts its file's position back by what was not
/// consumed: `unread` bytes in the pipe, see [`unread`]).
pub fn closed(fd: c_int, unread: u64) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let ended = {
        let mut running = running_for(fd, fd);
        let Some(at) = running.iter().position(|b| b.fds.contains(&fd)) else { return };
        running[at].fds.retain(|&f| f != fd);
        if !running[at].fds.is_empty() {
            return;
        }
        let ended = running.swap_remove(at);
        COUNT.store(running.len(), Ordering::Release);
        ended
    };
    let _errno = crate::KeepErrno::new(); // (the caller's call already returned)
    end_bridge(ended, || unread);
}

/// Stops a bridge for good ([`stop`]) and closes its end; one feeding the
/// program its own open file puts the file's position back by what the
/// bridge read from the file and had not sent, and by `unread` (asked once
/// the bridge has stopped): bytes in the pipe no reader took.
fn end_bridge(ended: Running, unread: impl FnOnce() -> u64) {
    let rewind = ended.description.clone().filter(|_| ended.feeds);
    let cursor_start = ended.cursor_start;
    let stood = pause_or_last(ended, true);
    if let Some(d) = rewind {
        let unread = unread();
        let mut position = d.position.lock().unwrap_or_else(|e| e.into_inner());
        match (cursor_start, &stood) {
            // Its own cursor: the shared position moves by what the child consumed
            // (not past the end, where two children that each read it all would put it).
            (Some(start), Some((paused, _))) => {
                let consumed_to = paused.fed_to().saturating_sub(unread);
                let moved = (*position + consumed_to).saturating_sub(start);
                let size = d.file().map_or(u64::MAX, |f| f.len());
                *position = if moved > size && *position <= size { size } else { moved };
            }
            (Some(_), None) => {}
            // Paused, the spec's position is the file's less what the bridge had not sent;
            // ended, the file's position is where it stopped (or where the program put it since).
            (None, _) => {
                let fed_to = stood.as_ref().filter(|(_, open)| *open).map_or(*position, |(p, _)| p.fed_to());
                *position = fed_to.saturating_sub(unread);
            }
        }
    }
    if let Some((paused, _)) = stood {
        close_end(&paused.spec);
    }
}

/// The program closed descriptors `first..=last`: as [`closed`] for each.
pub fn closed_range(first: c_int, last: c_int) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut on_bridges: Vec<c_int> = running_for(first, last).iter().flat_map(|b| b.fds.clone()).collect();
    on_bridges.retain(|fd| (first..=last).contains(fd));
    for fd in on_bridges {
        closed(fd, 0);
    }
}

/// The kernel made `to` a duplicate of `from`: if `from` is a bridge's, so is `to`.
pub fn duplicated(from: c_int, to: c_int) {
    if COUNT.load(Ordering::Acquire) == 0 || to < 0 || from == to {
        return;
    }
    let mut running = running_for(from, from);
    if let Some(bridge) = running.iter_mut().find(|b| b.fds.contains(&from))
        && !bridge.fds.contains(&to)
    {
        bridge.fds.push(to);
    }
}

/// At exit: what the program wrote is written into the files (its stdio
/// buffers flushed first, when `flush_stdio`: `exit` flushes them only
/// after this library's exit handler has run), and the bridges end.
pub fn finish(flush_stdio: bool) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    if flush_stdio {
        // SAFETY: fflush(NULL) flushes every output stream; the program is exiting.
        unsafe { libc::fflush(std::ptr::null_mut()) };
    }
    for spec in stop_all() {
        close_end(&spec);
    }
    // What is written to those pipes from here on (this library's exit log
    // through its copy of stderr, a later destructor's output) has no reader:
    // it fails with EPIPE rather than kill the exiting program with SIGPIPE
    // (`ls > f 2>&1` with IOPATH_LOG exited 141).
    // SAFETY: setting a signal's disposition to ignore; the process is exiting.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// What an exec hands on: this program's bridges, stopped (to put in the
/// new program's environment, or to start again if the exec fails).
#[derive(Default)]
pub struct HandOver(Vec<Spec>);

impl HandOver {
    /// The `IOPATH_STDIO=...` entry, if there is anything to hand on.
    pub fn entry(&self) -> Option<CString> {
        let specs: Vec<String> = self.0.iter().map(Spec::encode).collect();
        if specs.is_empty() {
            return None;
        }
        CString::new(format!("{VARIABLE}={}", specs.join(";"))).ok()
    }

    /// The exec failed and this program goes on: its bridges run again
    /// (their files opened again by path).
    pub fn undo(self) {
        for spec in self.0 {
            relaunch(Source::Handed(spec));
        }
    }
}

/// Before an exec: stops this program's bridges (their files get what the
/// pipes held) and leaves their ends open across the exec, for the next
/// program to keep. (A forked child of a holder has none: its parent's
/// bridges are its parent's, and it writes into their pipes.)
pub fn hand_over() -> HandOver {
    let mut handed = Vec::new();
    for mut spec in stop_all() {
        // Only the descriptors the exec keeps are the next program's.
        // SAFETY: F_GETFD on the program's descriptors.
        spec.fds.retain(|&fd| unsafe { real::fcntl(fd, libc::F_GETFD, 0) } == 0);
        if spec.fds.is_empty() {
            close_end(&spec);
        } else {
            if spec.end >= 0 {
                // SAFETY: F_SETFD on a bridge's end: the next program takes it.
                unsafe { real::fcntl(spec.end, libc::F_SETFD, 0) };
            }
            handed.push(spec);
        }
    }
    HandOver(handed)
}

/// The spec of a bridge on `d` (`None` if its file has no name any more:
/// the next program could not open it).
fn spec_of(d: &Description, fds: Vec<c_int>, end: c_int, writes_file: bool, unsent: u64) -> Option<Spec> {
    Some(Spec { fds, writes_file, end, file: Reopen::of(d, unsent)?, own: false })
}

/// How a bridge's loop ended.
enum Ended {
    /// Told to stop; this many bytes it had read from the file were not
    /// yet in the pipe (a feeding bridge's position goes back by them).
    Stopped { unsent: u64 },
    /// For good: the file fed to its end, every writer gone, or an error (said).
    Done,
}

/// A bridge's thread: moves bytes until it ends or is stopped; if stopped,
/// gives back where it stands (to be handed on at an exec).
fn run(source: Source, fds: Vec<c_int>, end: c_int, writes_file: bool, control: &Control) -> Option<Paused> {
    let _inside = Inside::enter();
    let source = match source {
        // Handed on having fed its file to the end: nothing to feed until a seek
        // (and no mount needed for that).
        Source::Handed(spec) if !writes_file && end < 0 => {
            control.keep_last(Some(Paused { spec, held: Vec::new(), sent: 0, more: false }));
            end_for_good(end, control);
            return None;
        }
        Source::Held { spec, bytes, .. } if writes_file => return hold_output(spec, bytes, end, control),
        Source::Held { spec, bytes, sent, more } => return feed_held(spec, bytes, sent, more, end, control),
        source => source,
    };
    let shown = || match &source {
        Source::Handed(spec) | Source::Held { spec, .. } => spec.shown(),
        Source::Here(d, _) => describe(&fds, writes_file, &d.mount.dir, &d.path),
    };
    let (d, mut cursor) = match &source {
        Source::Handed(spec) | Source::Held { spec, .. } => (spec.file.open().map(Arc::new), None),
        Source::Here(d, cursor) => (Ok(Arc::clone(d)), cursor.map(|c| c.at)),
    };
    // The program's own open file that it writes (no cursor of a child's), or one that was.
    let own = writes_file
        && match &source {
            Source::Here(_, cursor) => cursor.is_none(),
            Source::Handed(spec) | Source::Held { spec, .. } => spec.own,
        };
    // Where it stood, `unsent` bytes back: its own cursor's, else the shared position's.
    let stood = |d: &Description, end: c_int, unsent: u64, cursor: Option<u64>| {
        let mut spec = spec_of(d, fds.clone(), end, writes_file, unsent)?;
        spec.own = own;
        if let Some(at) = cursor {
            spec.file.position = at.saturating_sub(unsent);
        }
        Some(Paused { spec, held: Vec::new(), sent: 0, more: false })
    };
    let ended = match &d {
        Ok(d) if writes_file => drain_into(d, end, control, &shown),
        Ok(d) => feed_from(d, end, control, &shown, &mut cursor),
        Err(why) => {
            crate::say(&format!("cannot keep {}: {why}", shown()));
            Ended::Done
        }
    };
    match (ended, d) {
        (Ended::Stopped { unsent }, Ok(d)) => {
            let paused = stood(&d, end, unsent, cursor);
            if paused.is_none() {
                crate::say(&format!("{}: the file was unlinked; the next program cannot be given it", shown()));
                forget_own(end);
                // SAFETY: the bridge's end, which nothing will take on.
                unsafe { real::close(end) };
            }
            paused
        }
        (Ended::Done, Ok(d)) if !writes_file => {
            // Where it stood, for a seek back (`seek.rs`): its end is closed below.
            control.keep_last(stood(&d, -1, 0, cursor));
            end_for_good(end, control);
            None
        }
        _ => {
            end_for_good(end, control);
            None
        }
    }
}

/// Closes a bridge's end from its own thread (the program sees EPIPE, or
/// the end of its input), then waits to be stopped and joined rather than
/// end now: a thread that ends while another thread of the program forks
/// can leave the child waiting for ever (see `launch`). Flushes asked for
/// meanwhile are answered at once (there is nothing to write).
fn end_for_good(end: c_int, control: &Control) {
    control.ended.store(true, Ordering::Release);
    // A flush asked for while the loop ended (its eventfd count read with the pipe's
    // end) has nothing left to wait for: answered now, or its caller waited for ever.
    control.answer(control.asked.load(Ordering::Acquire));
    if end >= 0 {
        forget_own(end);
        // SAFETY: the bridge's end; nothing else uses it.
        unsafe { real::close(end) };
    }
    while !control.stopped.load(Ordering::Acquire) {
        // (A negative descriptor is left out by poll: only the control is waited on.)
        let told = wait(-1, 0, control);
        control.answer(told.asked);
    }
}

/// Sets O_NONBLOCK on descriptor `fd` of this library's, or clears it.
fn set_nonblocking(fd: c_int, on: bool) {
    // SAFETY: fcntl on a descriptor of ours (a pipe end only this bridge holds, a connection).
    unsafe {
        let flags = real::fcntl(fd, libc::F_GETFL, 0);
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        real::fcntl(fd, libc::F_SETFL, flags as libc::c_ulong);
    }
}

/// How a read of everything a pipe holds ended.
enum Pipe {
    /// Empty for now.
    Empty,
    /// Every writer has closed it.
    Closed,
    /// A read failed.
    Failed(c_int),
}

/// Reads what the (non-blocking) pipe holds, piece by piece, into `take`,
/// until it is empty or closed.
fn read_pipe(end: c_int, buf: &mut [u8], mut take: impl FnMut(&[u8])) -> Pipe {
    loop {
        // SAFETY: reads into a buffer we own.
        let n = unsafe { real::read(end, buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => return Pipe::Closed,
            n if n > 0 => take(&buf[..n as usize]),
            _ => match crate::posix::last_errno() {
                libc::EAGAIN => return Pipe::Empty,
                libc::EINTR => {}
                errno => return Pipe::Failed(errno),
            },
        }
    }
}

/// A writing program's bridge: what arrives is written into the file. If
/// a write fails (ENOSPC, EIO), what arrives from then on is read and
/// dropped, and said on stderr, then and when the bridge ends: closing the
/// pipe instead would kill most writers with SIGPIPE, and a killed process
/// loses everything it had not synced on the mount, not just this stream.
fn drain_into(d: &Description, end: c_int, control: &Control, shown: &dyn Fn() -> String) -> Ended {
    set_nonblocking(end, true);
    let mut buf = vec![0u8; 256 << 10];
    let mut lost: Option<(c_int, u64)> = None;
    let ended = loop {
        let told = wait(end, libc::POLLIN, control);
        let pipe = read_pipe(end, &mut buf, |bytes| {
            if let Some((_, n)) = &mut lost {
                *n += bytes.len() as u64;
            } else if write_mounted(d, bytes, None) < 0 {
                let errno = crate::posix::last_errno();
                crate::say(&format!(
                    "{}: {}; what the program writes there from now on is lost",
                    shown(),
                    os_error(errno)
                ));
                lost = Some((errno, bytes.len() as u64));
            }
        });
        match pipe {
            Pipe::Empty => {}
            Pipe::Closed => break Ended::Done,
            Pipe::Failed(errno) => {
                crate::say(&format!("{}: reading the pipe: {}", shown(), os_error(errno)));
                break Ended::Done;
            }
        }
        if told.stop != 0 {
            break Ended::Stopped { unsent: 0 };
        }
        control.answer(told.asked);
    };
    if let Some((errno, bytes)) = lost {
        crate::say(&format!("{}: {bytes} bytes the program wrote were lost ({})", shown(), os_error(errno)));
    }
    ended
}

/// A reading program's bridge: the file's bytes are fed into the pipe,
/// from the shared position, or from `cursor` (moved on) if it has one.
fn feed_from(
    d: &Description,
    end: c_int,
    control: &Control,
    shown: &dyn Fn() -> String,
    cursor: &mut Option<u64>,
) -> Ended {
    set_nonblocking(end, true);
    let mut buf = vec![0u8; 64 << 10];
    let (mut at, mut len) = (0usize, 0usize);
    loop {
        if at == len {
            let n = read_mounted(d, &mut buf, cursor.map(|c| c as libc::off_t));
            if let (Some(c), true) = (cursor.as_mut(), n > 0) {
                *c += n as u64;
            }
            if n < 0 {
                crate::say(&format!("{}: {}", shown(), os_error(crate::posix::last_errno())));
                return Ended::Done;
            }
            if n == 0 {
                return Ended::Done; // the end of the file: the reader sees it
            }
            (at, len) = (0, n as usize);
        }
        if wait(end, libc::POLLOUT, control).stop != 0 {
            return Ended::Stopped { unsent: (len - at) as u64 };
        }
        // SAFETY: writes from a buffer we own.
        let n = unsafe { real::write(end, buf[at..len].as_ptr().cast(), len - at) };
        if n > 0 {
            at += n as usize;
        } else if n < 0 && !matches!(crate::posix::last_errno(), libc::EAGAIN | libc::EINTR) {
            return Ended::Done; // the reader is gone (EPIPE)
        }
    }
}

fn os_error(errno: c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_its_encoding_whatever_bytes_its_path_holds() {
        let spec = Spec {
            fds: vec![1, 2, 10],
            writes_file: true,
            end: 401,
            file: Reopen {
                mount: 1,
                ino: 77,
                generation: 5,
                flags: libc::O_WRONLY | libc::O_APPEND,
                position: 1 << 40,
                path: b"/d;ir|x/\xff name=1".to_vec(),
            },
            own: false,
        };
        assert_eq!(Spec::decode(&spec.encode()), Some(spec.clone()));
        let reader = Spec { fds: vec![0], writes_file: false, ..spec };
        assert_eq!(Spec::decode(&reader.encode()), Some(reader));
    }

    #[test]
    fn a_malformed_spec_is_refused() {
        for bad in ["", "1|w|4", "-1|w|400|0|1|1|0|2f", "1|x|400|0|1|1|0|2f", "1|w|400|0|1|1|0|2", "1|w|400|0|1|1|0|zz"]
        {
            assert_eq!(Spec::decode(bad), None, "{bad}");
        }
    }
}
