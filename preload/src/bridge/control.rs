//! How a bridge's thread is told to stop or to write what its pipe holds
//! (an eventfd), and how it answers a flush (a count and a condition
//! variable): the program's `open` of a file waits for the answer.

use super::{Paused, forget_own, made_up, note_own};
use crate::real;
use libc::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// What a bridge's eventfd tells its thread (the value written): stop.
pub(super) const PAUSE: u64 = 1;
/// Stop, and first write any bytes held in memory into the file (waiting
/// for the mount): done by the bridge's thread, as the caller may be a
/// thread at exit whose thread-local storage is gone.
pub(super) const SETTLE: u64 = 2;
/// Write what the pipe holds now, and answer (added once per request; the
/// stop values stay below it).
pub(super) const FLUSH: u64 = 1 << 20;

/// How a bridge's thread is told to stop or to flush, and how it answers a flush.
pub(super) struct Control {
    /// An eventfd: [`PAUSE`], [`SETTLE`] or [`FLUSH`] written to it wakes the thread.
    pub(super) event: c_int,
    /// Flushes asked for so far.
    pub(super) asked: AtomicU64,
    /// Flushes done (`u64::MAX` once the thread has ended: nothing to wait for).
    answered: Mutex<u64>,
    done: Condvar,
    /// Told to stop ([`PAUSE`] or [`SETTLE`]): set before the eventfd is
    /// written, so a thread that read the value on its way to ending for
    /// good still knows ([`super::end_for_good`]).
    pub(super) stopped: std::sync::atomic::AtomicBool,
    /// The thread has ended for good and only waits to be joined
    /// ([`super::end_for_good`]): a child's bridge that nothing stops is
    /// joined then ([`super::reap_ended`]).
    pub(super) ended: std::sync::atomic::AtomicBool,
    /// Where a reading bridge that ended stood (its end of the pipe
    /// closed): a seek on the pipe starts it again from there (`seek.rs`).
    last: Mutex<Option<Paused>>,
}

impl Control {
    /// A control with its eventfd (close-on-exec, above [`super::END_FLOOR`]), or errno.
    pub(super) fn new() -> Result<Arc<Control>, c_int> {
        // SAFETY: eventfd has no preconditions.
        let event = made_up(|| unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })?;
        note_own(event);
        Ok(Arc::new(Control {
            event,
            asked: AtomicU64::new(0),
            answered: Mutex::new(0),
            done: Condvar::new(),
            stopped: std::sync::atomic::AtomicBool::new(false),
            ended: std::sync::atomic::AtomicBool::new(false),
            last: Mutex::new(None),
        }))
    }

    pub(super) fn tell(&self, value: u64) {
        if !value.is_multiple_of(FLUSH) {
            self.stopped.store(true, Ordering::Release);
        }
        // SAFETY: an eventfd of ours; writes 8 bytes from a local.
        unsafe { real::write(self.event, (&raw const value).cast(), 8) };
    }

    /// Asks the thread to write what its pipe holds now into the file, and
    /// waits until it has: what the program wrote before lands first.
    pub(super) fn flush(&self) {
        let mine = self.asked.fetch_add(1, Ordering::AcqRel) + 1;
        self.tell(FLUSH);
        let mut answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        while *answered < mine {
            answered = self.done.wait(answered).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The thread, ending, leaves where it stood (see `last`).
    pub(super) fn keep_last(&self, last: Option<Paused>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = last;
    }

    /// What the thread left ending ([`Control::keep_last`]), if it has ended.
    pub(super) fn last(&self) -> std::sync::MutexGuard<'_, Option<Paused>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The thread has done the flushes asked for up to `asked`.
    pub(super) fn answer(&self, asked: u64) {
        let mut answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        *answered = (*answered).max(asked);
        self.done.notify_all();
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        forget_own(self.event);
        // SAFETY: the eventfd is ours; its thread is gone (this was the last reference).
        unsafe { real::close(self.event) };
    }
}

/// Answers every flush when a bridge's thread ends, however it ends.
pub(super) struct AnswerAll(pub(super) Arc<Control>);

impl Drop for AnswerAll {
    fn drop(&mut self) {
        self.0.answer(u64::MAX);
    }
}

/// What a bridge's thread was told while it waited.
#[derive(Clone, Copy)]
pub(super) struct Told {
    /// 0, [`PAUSE`] or [`SETTLE`].
    pub(super) stop: u64,
    /// Flushes asked for by the time it looked: answered once the pipe is drained.
    pub(super) asked: u64,
}

/// Waits until `end` has `events` or the control says something; what it said.
pub(super) fn wait(end: c_int, events: i16, control: &Control) -> Told {
    let mut fds = [
        libc::pollfd { fd: end, events, revents: 0 },
        libc::pollfd { fd: control.event, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: two pollfds of ours; EINTR just comes back here.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    let mut value = 0u64;
    if fds[1].revents & libc::POLLIN != 0 {
        // SAFETY: reads the eventfd's 8-byte count into a local (it is readable: no wait).
        unsafe { real::read(control.event, (&raw mut value).cast(), 8) };
    }
    Told { stop: value % FLUSH, asked: control.asked.load(Ordering::Acquire) }
}
