//! Seeking a standard stream that a bridge feeds or drains: `{ head -n 1;
//! cat; } < f`, `(head -n 1; sort) < f`, `dd of=f seek=N conv=notrunc`.
//!
//! A reader of a kernel file that read more than it used gives the rest
//! back with `lseek(0, -n, SEEK_CUR)` (GNU head does), and the next reader
//! of the shared open file starts there. A bridged descriptor is a pipe,
//! which cannot seek, and its bridge has fed the file ahead of the reader.
//! So a seek that the kernel refuses with ESPIPE on a pipe is asked of the
//! bridge that feeds it: in this process (the pipe's reading end is one
//! of a bridge's descriptors), or in a parent (a shell that redirected a
//! group's standard input and forked the group's commands), through the
//! parent's adopter socket (`adopt.rs`), which passes it on up when the
//! bridge is not its own; where the parent does not listen (a shell that
//! holds no mounted file, between a program and the `head` it runs), the
//! nearest ancestor that does. The bridge is stopped; what the reader consumed
//! is where the file's bytes in the pipe end less what the pipe still
//! holds; the pipe is emptied and the bridge starts again at the new
//! position (a bridge that had fed its file to the end, and closed its
//! end, gets a new writing end of the same pipe, opened through
//! `/proc/self/fd`).
//!
//! A query (`lseek(fd, 0, SEEK_CUR)`) is answered as a pipe answers it,
//! with ESPIPE: programs ask it to learn whether their input can seek,
//! and one that learns it can reads ahead and seeks back at every turn.
//! bash's `read` does so for every line: a `while read` loop over 10,000
//! lines took 3.1 s so (every seek stops the bridge, empties the pipe and
//! feeds it again), against 0.06 s reading a byte at a time as from a
//! pipe (as before) and 0.04 s on the kernel's file. So Python's
//! `sys.stdin.seek` still fails (its `seekable()` asks the query).
//!
//! A writer seeks too where it opened the file itself and put it on its
//! standard output (`dd of=f seek=N conv=notrunc` opens `f`, puts it on
//! descriptor 1 and moves there): the bridge shares the program's open
//! file, so once it has written what the pipe holds, the seek moves where
//! it writes next. Not where the file was handed over (`prog > f`): a
//! program told that its output seeks may go on to seek it through stdio,
//! which calls the kernel and fails on the pipe. `zip - a b > out.zip`
//! probes with `lseek(1, -1, SEEK_CUR)`, and answered so, it wrote a
//! broken archive; refused with ESPIPE, it writes one that streams. A
//! query fails with ESPIPE for every writer, for the same reason.
//!
//! A bridge let go before a fork feeds from memory: a seek within what it
//! holds there is served from there; outside it, it needs the mount, and
//! fails with ESPIPE (as a pipe does) if another process has it.

use super::{
    COUNT, Cursor, Paused, Reader, Running, Source, Spec, launch, made_up, pause_or_last, pipe_holds, pipe_id,
    relaunch, running,
};
use crate::mount::{self, Description, Reopen};
use crate::real;
use libc::c_int;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// `lseek(fd, offset, whence)` that the kernel refused with ESPIPE: if a
/// bridge feeds the pipe `fd` reads from, here or in a parent, the new
/// position (or -1 with errno); `None` if none does (the caller keeps ESPIPE).
pub fn seek(fd: c_int, offset: libc::off_t, whence: c_int) -> Option<libc::off_t> {
    if let Some(description) = super::written_file(fd) {
        let at = {
            let _inside = crate::Inside::enter();
            crate::posix::data::seek(&description, offset, whence)
        };
        // A lender that let the bridge go between finding it and the seek kept the
        // position from before the seek: the bridge, holding in memory now, goes
        // where the seek went. (rsync's receiver: `lseek(1, half, SEEK_SET)` said
        // `half`, and the next `lseek(1, 0, SEEK_CUR)` said the file's end, in 1 run
        // of 8 of the mount suite with its bridges' threads started a little later.)
        if at < 0 || super::still_writes_into(fd, &description) {
            return Some(at);
        }
        return Some(reposition_writer(fd, at, libc::SEEK_SET).map_or(at, answer));
    }
    if let Some(result) = reposition_writer(fd, offset, whence) {
        return Some(answer(result));
    }
    if whence == libc::SEEK_CUR && offset == 0 {
        return None; // a query: answered as a pipe (see above)
    }
    let _inside = crate::Inside::enter();
    let result = match reposition(fd, offset, whence) {
        Some(result) => result,
        None => super::adopt::ask_seek(fd, offset, whence)?,
    };
    Some(answer(result))
}

/// What `lseek` returns for a seek's result: the position, or -1 with errno.
fn answer(result: Result<u64, c_int>) -> libc::off_t {
    match result {
        Ok(position) => position as libc::off_t,
        Err(errno) => crate::posix::fail(errno) as libc::off_t,
    }
}

/// Moves the bridge of this process that feeds the pipe `read_end` reads
/// from (see the module's comment); `None` if no bridge here feeds it.
pub(super) fn reposition(read_end: c_int, offset: i64, whence: c_int) -> Option<Result<u64, c_int>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let pipe = pipe_id(read_end)?;
    let bridge = {
        let mut running = running();
        let at = running.iter().position(|b| b.feeds && b.pipe == Some(pipe))?;
        let bridge = running.swap_remove(at);
        COUNT.store(running.len(), Ordering::Release);
        bridge
    };
    Some(move_bridge(bridge, read_end, offset, whence))
}

/// A seek on `fd` where it is on a bridge that holds in memory what the
/// program writes into a file it opened itself (let go to a waiting
/// process, or before a fork): the bridge writes what it holds (waiting
/// for the mount, as any call does) and starts again at the new position.
/// rsync's receiver, whose temp files land on its descriptor 1, seeks over
/// the zeros of a sparse file and lends the mount to its generator between
/// writes: its seeks failed with ESPIPE. `None` if `fd` is on no such bridge.
pub(super) fn reposition_writer(fd: c_int, offset: i64, whence: c_int) -> Option<Result<u64, c_int>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let bridge = {
        let mut running = super::running_for(fd, fd);
        let own_held = |b: &Running| b.in_memory && !b.feeds && b.spec.as_ref().is_some_and(|s| s.own);
        let at = running.iter().position(|b| b.fds.contains(&fd) && own_held(b))?;
        let bridge = running.swap_remove(at);
        COUNT.store(running.len(), Ordering::Release);
        bridge
    };
    let _inside = crate::Inside::enter();
    // Settled: what it held and what the pipe held are in the file.
    let Some((mut stood, _)) = pause_or_last(bridge, true) else { return Some(Err(libc::ESPIPE)) };
    let size = if whence == libc::SEEK_END {
        stood.spec.file.open().map_or(0, |d| d.file().map_or(0, |f| f.len()))
    } else {
        0
    };
    let answer = target(stood.spec.file.position, size, offset, whence);
    if let Ok(to) = answer {
        stood.spec.file.position = to;
    }
    relaunch(Source::Held { spec: stood.spec, bytes: Vec::new(), sent: 0, more: false });
    Some(answer)
}

/// Where a seek goes from `consumed`, in a file of `size` bytes; or errno.
fn target(consumed: u64, size: u64, offset: i64, whence: c_int) -> Result<u64, c_int> {
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => consumed,
        libc::SEEK_END => size,
        _ => return Err(libc::EINVAL),
    };
    (base as i64).checked_add(offset).filter(|to| *to >= 0).map(|to| to as u64).ok_or(libc::EINVAL)
}

/// Stops `bridge`, empties the pipe if the position moves, and starts it
/// again where the seek says (where it stood if the seek fails).
fn move_bridge(mut bridge: Running, read_end: c_int, offset: i64, whence: c_int) -> Result<u64, c_int> {
    let reader = bridge.reader.take();
    let description = bridge.description.clone();
    let in_memory = bridge.in_memory;
    let cursor_start = bridge.cursor_start;
    let Some((stood, open)) = pause_or_last(bridge, false) else {
        reader.into_iter().for_each(Reader::close);
        return Err(libc::ESPIPE); // it failed and said why: nothing to move
    };
    let in_pipe = pipe_holds(read_end);
    let fed_to = stood.fed_to();
    let consumed = fed_to.saturating_sub(in_pipe);
    let size = if whence == libc::SEEK_END { file_size(&stood, description.as_deref(), in_memory) } else { 0 };
    let (answer, from) = match target(consumed, size, offset, whence) {
        Ok(to) if to == consumed => (Ok(to), fed_to),
        Ok(to) if reachable(&stood, in_memory, to) => {
            drain(read_end, in_pipe);
            (Ok(to), to)
        }
        Ok(to) => {
            crate::log(&format!(
                "{}: cannot seek to {to}, outside what is held in memory since the last fork, \
                 while another process has the mount",
                stood.spec.shown()
            ));
            (Err(libc::ESPIPE), fed_to)
        }
        Err(errno) => (Err(errno), fed_to),
    };
    let end = if open {
        stood.spec.end
    } else {
        match new_writing_end(read_end) {
            Ok(end) => end,
            Err(errno) => {
                // Nothing can feed the pipe again: it stays at its end.
                reader.into_iter().for_each(Reader::close);
                return Err(errno);
            }
        }
    };
    restart(stood, description, in_memory, cursor_start, from, end, reader);
    answer
}

/// The size of the file a stopped bridge feeds from (its size when it
/// was read into memory, for one that feeds from there).
fn file_size(stood: &Paused, description: Option<&Description>, in_memory: bool) -> u64 {
    match description.map(|d| d.file()) {
        Some(Ok(f)) => f.len(),
        Some(Err(_)) => 0,
        None if in_memory => stood.spec.file.position + stood.held.len() as u64,
        None => stood.spec.file.open().ok().and_then(|d| d.file().ok().map(|f| f.len())).unwrap_or(0),
    }
}

/// Whether a bridge that stood so can feed from `to`: one feeding from
/// memory needs `to` there, or its mount without waiting.
fn reachable(stood: &Paused, in_memory: bool, to: u64) -> bool {
    let base = stood.spec.file.position;
    !in_memory
        || (base..=base + stood.held.len() as u64).contains(&to)
        || mount::mounts().get(stood.spec.file.mount).is_some_and(|m| m.mounted().or_else(|| m.try_fs()).is_some())
}

/// Starts a bridge that stood so again on pipe end `end`, feeding from
/// `from`: on the program's open file (from its own cursor, for a child,
/// if it had one: where the shared position stood when it started), from
/// the bytes in memory if `from` is among them, else on its file opened
/// again by path.
fn restart(
    stood: Paused,
    description: Option<Arc<Description>>,
    in_memory: bool,
    cursor_start: Option<u64>,
    from: u64,
    end: c_int,
    reader: Option<Reader>,
) {
    let Paused { spec, held, more, .. } = stood;
    let base = spec.file.position;
    match description {
        Some(d) => {
            let cursor = cursor_start.map(|start| Cursor { start, at: from });
            if cursor.is_none() {
                *d.position.lock().unwrap_or_else(|e| e.into_inner()) = from;
            }
            launch(spec.fds, end, false, Source::Here(d, cursor), reader);
        }
        None => {
            reader.into_iter().for_each(Reader::close);
            let spec = Spec { end, ..spec };
            if in_memory && (base..=base + held.len() as u64).contains(&from) {
                relaunch(Source::Held { spec, bytes: held, sent: (from - base) as usize, more });
            } else {
                relaunch(Source::Handed(Spec { file: Reopen { position: from, ..spec.file }, ..spec }));
            }
        }
    }
}

/// Reads and drops the `n` bytes pipe end `read_end` holds (its bridge is
/// stopped: nothing comes meanwhile), never waiting: another reader of
/// the pipe may take some first.
fn drain(read_end: c_int, mut n: u64) {
    let mut buf = vec![0u8; (n as usize).min(256 << 10)];
    while n > 0 {
        let mut ready = libc::pollfd { fd: read_end, events: libc::POLLIN, revents: 0 };
        // SAFETY: polls one pollfd of ours, without waiting.
        if unsafe { libc::poll(&mut ready, 1, 0) } != 1 || ready.revents & libc::POLLIN == 0 {
            return;
        }
        let want = (n as usize).min(buf.len());
        // SAFETY: reads into a buffer we own; the pipe holds bytes (polled).
        match unsafe { real::read(read_end, buf.as_mut_ptr().cast(), want) } {
            got if got > 0 => n -= got as u64,
            _ if crate::posix::last_errno() == libc::EINTR => {}
            _ => return,
        }
    }
}

/// A new writing end of the pipe `read_end` reads from (a bridge that fed
/// its file to the end closed its own), opened through `/proc/self/fd`,
/// non-blocking and close-on-exec, above the program's numbers; or errno.
fn new_writing_end(read_end: c_int) -> Result<c_int, c_int> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{read_end}")).map_err(|_| libc::EINVAL)?;
    let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: opens a path we own; the descriptor is moved up at once.
    made_up(|| unsafe { real::open(path.as_ptr(), flags, 0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seek_goes_where_lseek_would_and_never_before_the_start() {
        assert_eq!(target(10, 100, 5, libc::SEEK_SET), Ok(5));
        assert_eq!(target(10, 100, -4, libc::SEEK_CUR), Ok(6));
        assert_eq!(target(10, 100, -1, libc::SEEK_END), Ok(99));
        assert_eq!(target(10, 100, 50, libc::SEEK_END), Ok(150));
        assert_eq!(target(10, 100, -11, libc::SEEK_CUR), Err(libc::EINVAL));
        assert_eq!(target(10, 100, 0, 99), Err(libc::EINVAL));
        assert_eq!(target(u64::MAX / 2, 0, i64::MAX, libc::SEEK_CUR), Err(libc::EINVAL));
    }
}
