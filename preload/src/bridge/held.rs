//! Bridges let go before a fork (see the parent module): a writing
//! program's bytes held in memory until the mount can be had, a reading
//! program's file read into memory, so that the child can mount.

use super::control::{Control, SETTLE, wait};
use super::{
    COUNT, Paused, Pipe, Running, Source, Spec, end_for_good, os_error, pause_or_last, pipe_holds, read_pipe, relaunch,
    running, set_nonblocking,
};
use crate::fork_holds::FreshInChild;
use crate::mount::{self, Reopen};
use crate::posix::data::{read_mounted, write_mounted};
use crate::real;
use libc::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most bytes a bridge holds in memory: a writing program's output beyond
/// it goes into the file as soon as the mount can be had without waiting;
/// a file to be read that is larger is read on this much at a time, the
/// mount taken for each ([`feed_held`]).
pub(crate) const HELD_BYTES: usize = 4 << 20;

/// Writes bytes a writing program's bridge held into its file, at `spec`'s
/// position (moved past them), if the mount can be had (`may_wait`: waiting for
/// another process to let go, as any call into the mount does). A mount
/// taken for this alone is given back after. Whether the bytes are gone
/// from `held` (written, or lost and said so).
fn write_held(spec: &mut Spec, held: &mut Vec<u8>, may_wait: bool) -> bool {
    if held.is_empty() {
        return true;
    }
    crate::background(|| write_held_now(spec, held, may_wait))
}

/// [`write_held`], the fork gate held: one bridge at a time mounts, writes
/// and gives the mount back before another looks whether it is mounted.
fn write_held_now(spec: &mut Spec, held: &mut Vec<u8>, may_wait: bool) -> bool {
    let Some(m) = mount::mounts().get(spec.file.mount) else { return false };
    let was_mounted = m.mounted().is_some();
    let fs = if was_mounted || may_wait { m.fs().ok() } else { m.try_fs() };
    let Some(fs) = fs else {
        if may_wait {
            crate::say(&format!("{}: {} bytes the program wrote were lost (no mount)", spec.shown(), held.len()));
            held.clear();
        }
        return may_wait;
    };
    match spec.file.open_in(&fs, m) {
        Ok(d) => {
            if write_mounted(&d, held, None) < 0 {
                let errno = crate::posix::last_errno();
                let lost = held.len();
                crate::say(&format!(
                    "{}: {lost} bytes the program wrote were lost ({})",
                    spec.shown(),
                    os_error(errno)
                ));
            }
            spec.file.position = *d.position.lock().unwrap_or_else(|e| e.into_inner());
        }
        Err(why) => crate::say(&format!("{}: {} bytes the program wrote were lost ({why})", spec.shown(), held.len())),
    }
    held.clear();
    drop(fs);
    if !was_mounted {
        m.release_if_idle("after writing a standard stream's bytes");
    }
    true
}

/// Bridges stopped before a fork so that their mounts can be given back
/// ([`let_go`]); [`LetGo::resume`] starts them again after. Until then,
/// the program's calls on their descriptors wait ([`let_go_holds`]).
pub struct LetGo(Vec<Paused>, Option<MutexGuard<'static, ()>>);

/// Held from a [`let_go`] until its [`LetGo::resume`], while its bridges
/// are out of the table of running ones.
static LETTING_GO: FreshInChild<()> = FreshInChild::new(Mutex::new(()));
/// The program's descriptors on the bridges let go (empty: none are). Set
/// and cleared with the table of running bridges locked, so that a
/// descriptor is always in one or the other.
static LET_GO_FDS: Mutex<Vec<c_int>> = Mutex::new(Vec::new());

/// The descriptors on bridges let go, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&LET_GO_FDS)
}

/// In a child just forked: the parent's bridges are not here, let go or
/// not (nothing to wait for), and a let-go under way in a thread of the
/// parent at the fork leaves the child's gate free.
pub(super) fn in_child_after_fork() {
    LETTING_GO.renew_in_child();
    LET_GO_FDS.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// Whether one of descriptors `first..=last` is on a bridge let go, and
/// the calling thread may wait for its [`LetGo::resume`] ([`wait_for_resume`]).
/// Asked with the table of running bridges locked, by a call that did not
/// find its descriptor there. A close of a bridged descriptor must find
/// its bridge, to make it write what it holds before the call returns; one
/// that came while a mount's lender had the bridges out found none,
/// returned at once, and the program went on: rsync's receiver renamed its
/// temp file (on its descriptor 1) before the held bytes reached it, and
/// they were lost. This library's own calls never wait: a thread the
/// let-go stops closes its ring as it ends, after its body returned, and
/// that close is iopath's too ([`iopath::sys::own_thread`]); it waited for
/// the resume while the let-go waited for it to end, and the mount was
/// never given back (a few runs in a hundred of a sender and a receiver
/// taking turns under load).
pub(super) fn let_go_holds(first: c_int, last: c_int) -> bool {
    !crate::inside()
        && LET_GO_FDS.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|fd| (first..=last).contains(fd))
}

/// Waits until the bridges let go run again ([`LetGo::resume`]).
pub(super) fn wait_for_resume() {
    drop(LETTING_GO.get().lock().unwrap_or_else(|e| e.into_inner()));
}

/// Before a fork (`fork`, `vfork`, `posix_spawn`): stops the bridges that
/// alone keep their file open (no descriptor of the program stands for its
/// open file), so that a mount they were the only hold on can be given
/// back and the child can mount it: `{ ls /mnt/i; echo done; } >
/// /mnt/i/log` in a shell. Bytes held from an earlier fork go into their
/// files first, if the mount can be had without waiting (what the program
/// wrote before the fork lies before what the child writes). A reading
/// program's file is read into memory, up to [`HELD_BYTES`] of it (the rest
/// later, a window at a time: [`feed_held`]), unless the file has no name
/// any more: that bridge runs on ([`feeds_unnamed`]).
pub fn let_go() -> LetGo {
    if COUNT.load(Ordering::Acquire) == 0 {
        return LetGo(Vec::new(), None);
    }
    let gate = LETTING_GO.get().lock().unwrap_or_else(|e| e.into_inner());
    let (alone, writing): (Vec<Running>, Vec<Arc<Control>>) = {
        let mut running = running();
        let (alone, shared): (Vec<Running>, Vec<Running>) = std::mem::take(&mut *running).into_iter().partition(|b| {
            // (One that fed its bytes from memory and ended holds nothing: it stays.)
            let ended_in_memory = b.in_memory && b.control.ended.load(Ordering::Acquire);
            b.description.as_ref().is_none_or(|d| !mount::in_table(d)) && !ended_in_memory
        });
        *running = shared;
        // COUNT still counts the bridges let go, until the resume: the calls that
        // skip the table when it says none would not wait for them.
        *LET_GO_FDS.lock().unwrap_or_else(|e| e.into_inner()) = alone.iter().flat_map(|b| b.fds.clone()).collect();
        let writing = running.iter().filter(|b| b.writes_into.is_some()).map(|b| Arc::clone(&b.control)).collect();
        (alone, writing)
    };
    // Those that feed a file with no name stay too, put back once it is known (with
    // the table let go: finding a file may take a mount's state, whose holders may
    // take the table).
    let (unnamed, alone): (Vec<Running>, Vec<Running>) = alone.into_iter().partition(feeds_unnamed);
    if !unnamed.is_empty() {
        let mut running = running();
        let mut let_go_fds = LET_GO_FDS.lock().unwrap_or_else(|e| e.into_inner());
        let_go_fds.retain(|fd| !unnamed.iter().any(|b| b.fds.contains(fd)));
        running.extend(unnamed);
    }
    // The bridges that stay: what the program wrote lands before the child looks.
    for control in writing {
        control.flush();
    }
    let mut paused = Vec::new();
    // (A feeding bridge's open file is read from where it has one, not the file
    // found again by its inode: another thread may have unlinked it since.)
    let stopped = alone.into_iter().filter_map(|b| {
        let open = b.description.clone();
        pause_or_last(b, false).map(|(p, _)| (p, open))
    });
    for (Paused { mut spec, mut held, sent, more }, open) in stopped {
        if spec.writes_file {
            write_held(&mut spec, &mut held, false);
            paused.push(Paused { spec, held, sent, more });
        } else if !held.is_empty() {
            paused.push(Paused { spec, held, sent, more }); // its file is in memory already
        } else {
            // Read from what the reader has not taken yet: the bytes in the pipe
            // are kept too, so that a seek back into them finds them. (A bridge
            // that ended has closed its end: the program's reading end counts them.)
            let counted_on = if spec.end >= 0 { spec.end } else { spec.fds.first().copied().unwrap_or(-1) };
            let in_pipe = pipe_holds(counted_on).min(spec.file.position);
            spec.file.position -= in_pipe;
            // (The mount is this process's here, before the fork.)
            let (rest, more) = read_window(&spec, open.as_deref()).unwrap_or_default(); // (unread: the reader sees the end)
            let sent = rest.len().min(in_pipe as usize);
            paused.push(Paused { spec, held: rest, sent, more });
        }
    }
    LetGo(paused, Some(gate))
}

/// Whether `b` feeds the program a file that has no name any more (the
/// program unlinked its input: `exec < f; rm f`). Such a bridge is not let
/// go: a file with no name cannot be found again once the mount is given
/// back, and its reader saw the end early ("the file was unlinked; the next
/// program cannot be given it"). It keeps the mount, as an unlinked file
/// open on a descriptor does.
fn feeds_unnamed(b: &Running) -> bool {
    if !b.feeds || b.in_memory {
        return false;
    }
    match (&b.description, &b.spec) {
        (Some(d), _) => d.file().is_ok_and(|f| f.path().is_none()),
        // (Handed over at an exec, its file is open in its thread: one that cannot be
        // found by its inode has none.)
        (None, Some(spec)) => mount::mounts()
            .get(spec.file.mount)
            .is_some_and(|m| m.mounted().is_some_and(|fs| spec.file.open_in(&fs, m).is_err())),
        (None, None) => false,
    }
}

/// Up to [`HELD_BYTES`] of a reading program's file from `spec`'s
/// position, and whether the file goes on past them; read from `open`, the
/// file still open, if given, else with its mount, mounted for this if
/// this process does not have it (waiting as any call does) and given back
/// after. `None` if it cannot be read (said).
fn read_window(spec: &Spec, open: Option<&mount::Description>) -> Option<(Vec<u8>, bool)> {
    let m = mount::mounts().get(spec.file.mount)?;
    let was_mounted = m.mounted().is_some();
    let read = || {
        let found;
        let d = match open {
            Some(d) => d,
            None => {
                let fs = m.fs().map_err(|errno| os_error(errno).to_string())?;
                found = spec.file.open_in(&fs, m)?;
                &found
            }
        };
        let mut window = vec![0u8; HELD_BYTES + 1];
        let mut len = 0;
        while len < window.len() {
            let at = (spec.file.position + len as u64) as libc::off_t;
            match read_mounted(d, &mut window[len..], Some(at)) {
                0 => break,
                n if n > 0 => len += n as usize,
                _ => return Err(os_error(crate::posix::last_errno()).to_string()),
            }
        }
        window.truncate(len.min(HELD_BYTES));
        Ok::<_, String>((window, len > HELD_BYTES))
    };
    let got = read();
    if !was_mounted {
        m.release_if_idle("after reading a standard stream's next bytes");
    }
    got.map_err(|why| crate::say(&format!("cannot read on {}: {why}; its reader sees the end here", spec.shown()))).ok()
}

impl LetGo {
    /// After the fork (and after the mounts nothing held were given back):
    /// the bridges run again, holding their bytes in memory (a reading one
    /// whose file is all in the pipe ends at once, and a seek can start it again).
    pub fn resume(self) {
        let LetGo(paused, gate) = self;
        for Paused { spec, held, sent, more } in paused {
            relaunch(Source::Held { spec, bytes: held, sent, more });
        }
        if gate.is_some() {
            let running = running();
            COUNT.store(running.len(), Ordering::Release);
            LET_GO_FDS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// A writing program's bridge let go before a fork: what arrives is held
/// in memory, and written into the file when the mount is here anyway (the
/// program uses it again), when more than [`HELD_BYTES`] is held and the
/// mount can be had without waiting, and when the bridge stops or every
/// writer has gone (then waiting for the mount as any call does). It never
/// stops reading the pipe: a child writing much while holding the mount
/// must not wait on a full pipe while its parent waits for the mount.
pub(super) fn hold_output(mut spec: Spec, mut held: Vec<u8>, end: c_int, control: &Control) -> Option<Paused> {
    set_nonblocking(end, true);
    let index = spec.file.mount;
    let mounted = || mount::mounts().get(index).is_some_and(|m| m.mounted().is_some());
    let mut next_try = HELD_BYTES;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let told = wait(end, libc::POLLIN, control);
        let pipe = read_pipe(end, &mut buf, |bytes| held.extend_from_slice(bytes));
        if let Pipe::Closed | Pipe::Failed(_) = pipe {
            if let Pipe::Failed(errno) = pipe {
                crate::say(&format!("{}: reading the pipe: {}", spec.shown(), os_error(errno)));
            }
            write_held(&mut spec, &mut held, true);
            end_for_good(end, control);
            return None;
        }
        if told.stop != 0 {
            if told.stop >= SETTLE {
                write_held(&mut spec, &mut held, true);
            }
            return Some(Paused { spec, held, sent: 0, more: false });
        }
        // Into the file when the mount is here anyway (asked to flush: the program
        // is opening the file, so it has the mount), or when much is held.
        if !held.is_empty() && (held.len() >= next_try || mounted()) && !write_held(&mut spec, &mut held, false) {
            next_try = held.len() + HELD_BYTES; // another process has the mount: later
        }
        if held.is_empty() {
            next_try = HELD_BYTES;
        }
        control.answer(told.asked);
    }
}

/// A reading program's bridge let go before a fork: the rest of its file,
/// read into memory then, is fed into the pipe from byte `sent` on; a file
/// longer than [`HELD_BYTES`] is read on a window at a time, the mount
/// taken for each (as any call takes it) and given back after, so that a
/// shell reading a long list keeps no mount from the commands it starts.
/// When all is fed, where it stood is kept for a seek ([`Control::keep_last`]).
pub(super) fn feed_held(
    mut spec: Spec,
    mut rest: Vec<u8>,
    sent: usize,
    mut more: bool,
    end: c_int,
    control: &Control,
) -> Option<Paused> {
    set_nonblocking(end, true);
    let mut at = sent;
    loop {
        if at == rest.len() && more {
            // The window is fed: the next, once the pipe has room (a reader that
            // stopped reading does not make this process take the mount).
            if wait(end, libc::POLLOUT, control).stop != 0 {
                return Some(Paused { spec, held: rest, sent: at, more });
            }
            let next = Spec {
                file: Reopen { position: spec.file.position + rest.len() as u64, ..spec.file.clone() },
                ..spec.clone()
            };
            match crate::background(|| read_window(&next, None)) {
                Some((window, further)) => (spec, rest, at, more) = (next, window, 0, further),
                None => more = false,
            }
            continue;
        }
        if at >= rest.len() {
            break;
        }
        if wait(end, libc::POLLOUT, control).stop != 0 {
            return Some(Paused { spec, held: rest, sent: at, more });
        }
        // SAFETY: writes from a buffer we own.
        let n = unsafe { real::write(end, rest[at..].as_ptr().cast(), rest.len() - at) };
        if n > 0 {
            at += n as usize;
        } else if n < 0 && !matches!(crate::posix::last_errno(), libc::EAGAIN | libc::EINTR) {
            break; // the reader is gone (EPIPE)
        }
    }
    control.keep_last(Some(Paused { spec: Spec { end: -1, ..spec }, held: rest, sent: at, more: false }));
    end_for_good(end, control);
    None
}
