//! Write-behind and drop-behind: the pages of a file written in one long
//! stream go to the device in the background while the writer goes on,
//! and once the stream is long they leave the cache as soon as they are
//! written.
//!
//! Why: `tar cf` of /usr/include into a mount (a 120 MB archive written
//! once, 10 KiB at a time, never read) kept every page of it dirty until
//! the process exited, whose exit then spent 57-64 ms copying them out and
//! writing them back after tar was done, while 126 MiB of page frames were
//! mapped in to hold them (`MADV_POPULATE_WRITE`: 5.6% of the run's
//! samples) and copied again into the carried cache. The kernel writes
//! such pages back in the background; `RWF_DONTCACHE` drops them too.
//!
//! - **When**: a buffered write that starts where the file's stream ended
//!   adds its bytes to it; one that ends past it starts a new stream; one
//!   behind its end (a header written again) leaves it as it is. Once the stream is [`START_BYTES`] long and [`JOB_PAGES`] pages
//!   of the file are dirty, its dirty whole blocks behind the writer (up to
//!   [`MAX_JOB_PAGES`]) are copied out as any writeback copies them
//!   (marked clean, and pinned: not evictable until their blocks are marked
//!   written) and handed to the flusher thread as a [`Job`], which writes
//!   them and says so. The writer does not wait.
//! - **Settled** under the file's exclusive lock: the next write settles the
//!   jobs that are done (without waiting), and everyone else who takes the
//!   lock exclusively (fsync, a writeback, truncate, unlink, rename, close)
//!   waits for every job in flight first, then settles: the blocks are
//!   marked written (the next commit records them), the pages unpinned, and
//!   on a stream past [`DROP_AFTER_BYTES`] taken out of the cache, their
//!   frames used again for the pages the writer makes next. So no block of
//!   the file is ever in flight twice, no block a job writes is freed or
//!   moved meanwhile, and a reader finds either the page or a written block.
//!   A job that failed puts its pages back dirty and stops write-behind for
//!   the file: the next fsync writes them again and reports the error.
//! - **Bounds**: at most [`JOBS_PER_FILE`] jobs of a file in flight, and
//!   [`JOBS_QUEUED`] of all files not yet written; a writer that outruns
//!   the device leaves its pages dirty for the next job or for the dirty
//!   budget ([`super::writeback`]).
//! - **What it gives up**: a long stream's pages are not kept for a reader
//!   (nor carried to the next process): it reads them from the device.

use super::format::BLOCK_U64;
use super::writeback::Writeback;
use super::{Inner, Node, NodeState};
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLockWriteGuard, Weak, mpsc};

/// Stream length from which a file's pages are written behind.
pub(super) const START_BYTES: u64 = 4 << 20;

/// Dirty pages of a file that start a job (4 MiB).
pub(super) const JOB_PAGES: usize = 1024;

/// Pages one job takes at most (a writer that outran the flusher).
pub(super) const MAX_JOB_PAGES: usize = 4096;

/// Jobs of one file in flight at most.
pub(super) const JOBS_PER_FILE: usize = 2;

/// Jobs of all files handed to the flusher and not yet written, at most
/// (their copies: 64 MiB at most; the one thread writes them one after the
/// other, so more queued would not go faster).
pub(super) const JOBS_QUEUED: usize = 4;

/// Times [`Node::lock_settled`] waits for a job without the file's lock
/// before it waits holding it (writers may keep posting new ones).
const WAITS_UNLOCKED: usize = 4;

/// Stream length from which written pages leave the cache.
pub(super) const DROP_AFTER_BYTES: u64 = 16 << 20;

/// Part of a file's pages on their way to the device: written behind by the
/// flusher thread, or written durable by an fdatasync's own thread
/// ([`NodeState::take_for_sync`]).
pub(super) struct Job {
    wb: Writeback,
    /// Its pages leave the cache once settled (the stream was long).
    drop_behind: bool,
    /// Written behind: a failure stops write-behind for the file. (An
    /// fdatasync's failure is reported to its caller; the stream goes on.)
    behind: bool,
    /// Whether the write succeeded, once it is done. (A write-behind job's
    /// error is not kept: the next fsync writes the pages again and reports
    /// its own.)
    done: Mutex<Option<bool>>,
    finished: Condvar,
    /// An fdatasync's job: the file's count of writes ([`Node::writes`]) when
    /// it was taken, every one of which it makes durable.
    covers: u64,
}

impl Job {
    fn new(wb: Writeback, drop_behind: bool, behind: bool, covers: u64) -> Arc<Job> {
        Arc::new(Job { wb, drop_behind, behind, done: Mutex::new(None), finished: Condvar::new(), covers })
    }

    fn complete(&self, written: bool) {
        *self.done.lock().expect("job lock poisoned") = Some(written);
        self.finished.notify_all();
    }

    fn is_done(&self) -> bool {
        self.done.lock().expect("job lock poisoned").is_some()
    }

    /// Waits until the job is written (or failed): whether it succeeded.
    fn wait(&self) -> bool {
        let mut done = self.done.lock().expect("job lock poisoned");
        loop {
            if let Some(written) = *done {
                return written;
            }
            done = self.finished.wait(done).expect("job lock poisoned");
        }
    }

    /// An fdatasync's job: writes its pages with forced unit access, from the
    /// calling thread, which holds no lock of the file meanwhile. Durable when
    /// this returns `Ok`.
    pub(super) fn write_durable(&self, disk: &super::disk::Disk) -> Result<()> {
        debug_assert!(!self.behind, "a write-behind job is the flusher's");
        let result = self.wb.write_durable(disk);
        self.complete(result.is_ok());
        result
    }
}

/// The stream a file is being written in, and its jobs.
#[derive(Default)]
pub(super) struct Stream {
    /// Where the last buffered write ended.
    end: u64,
    /// Bytes written one after another up to `end`.
    len: u64,
    /// Jobs in flight, or done and not yet settled, oldest first.
    jobs: VecDeque<Arc<Job>>,
    /// A job of the file failed (or none could be posted): no more of them.
    off: bool,
}

impl Stream {
    /// Whether a job of the file is in flight or not yet settled.
    pub(super) fn busy(&self) -> bool {
        !self.jobs.is_empty()
    }
}

/// The flusher thread and its queue: started with the first job (most
/// programs never stream 4 MiB into a file), stopped at unmount.
#[derive(Default)]
pub(super) struct Flusher {
    /// Where jobs go; `None` before the first or once stopped.
    jobs: Option<mpsc::Sender<Arc<Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Stopped, or the thread could not start: no more jobs.
    closed: bool,
    /// Jobs handed to the thread and not yet written.
    queued: Arc<AtomicUsize>,
}

impl Flusher {
    /// Hands `job` to the thread (started now if need be); false if it
    /// cannot take it.
    fn post(&mut self, fs: &Weak<Inner>, job: Arc<Job>) -> bool {
        if self.closed {
            return false;
        }
        if self.jobs.is_none() {
            let (tx, rx) = mpsc::channel();
            let (fs, queued) = (fs.clone(), Arc::clone(&self.queued));
            let named = std::thread::Builder::new().name("iopath-flush".into());
            match crate::sys::spawn_without_signals(named, move || flusher_thread(fs, rx, queued)) {
                Ok(thread) => (self.jobs, self.thread) = (Some(tx), Some(thread)),
                Err(_) => {
                    self.closed = true;
                    return false;
                }
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        let sent = self.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Whether the thread has as many jobs as it takes ([`JOBS_QUEUED`]).
    fn full(&self) -> bool {
        self.queued.load(Ordering::Acquire) >= JOBS_QUEUED
    }

    /// Takes no more jobs; the thread finishes those it has and is gone
    /// when this returns.
    pub(super) fn stop(&mut self) {
        self.closed = true;
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            debug_assert_ne!(thread.thread().id(), std::thread::current().id(), "the flusher unmounting");
            let _ = thread.join();
        }
    }
}

fn flusher_thread(fs: Weak<Inner>, jobs: mpsc::Receiver<Arc<Job>>, queued: Arc<AtomicUsize>) {
    while let Ok(job) = jobs.recv() {
        let result = match fs.upgrade() {
            Some(fs) => job.wb.write(&fs.disk),
            None => Err(super::file_error("write", "", libc::EIO, "the file system was unmounted")),
        };
        queued.fetch_sub(1, Ordering::AcqRel);
        job.complete(result.is_ok());
    }
}

impl NodeState {
    /// Whether the file has data not yet on the device as the file's: dirty
    /// pages, or a write-behind job in flight or not yet settled.
    pub(super) fn pending(&self) -> bool {
        !self.dirty.is_empty() || self.stream.busy()
    }

    /// After a buffered write of bytes `[offset, end)` of the file (the
    /// caller holds its lock): counts the stream, settles the jobs that are
    /// done, and hands the next part of a long stream to the flusher.
    pub(super) fn write_behind(&mut self, fs: &Inner, offset: u64, end: u64) {
        let stream = &mut self.stream;
        if offset == stream.end {
            stream.len += end - offset;
            stream.end = end;
        } else if end > stream.end {
            // Elsewhere ahead: a new stream. (A write behind the stream's end, a header
            // rewritten, leaves it going.)
            (stream.len, stream.end) = (end - offset, end);
        }
        if stream.busy() {
            self.settle(fs, false);
        }
        let stream = &self.stream;
        if stream.off
            || !fs.options.write_behind
            || stream.len < START_BYTES
            || stream.jobs.len() >= JOBS_PER_FILE
            || self.dirty.len() < JOB_PAGES
        {
            return;
        }
        if fs.flusher.lock().expect("flusher lock poisoned").full() {
            return; // (the next write looks again)
        }
        // Whole blocks behind the writer: the one it is in may be written again at once.
        let wb = Writeback::take_behind(fs, self, end / BLOCK_U64, MAX_JOB_PAGES);
        if wb.is_empty() {
            return;
        }
        let pages = wb.pages() as u64;
        let job = Job::new(wb, self.stream.len >= DROP_AFTER_BYTES, true, 0);
        let posted = fs.flusher.lock().expect("flusher lock poisoned").post(&fs.me, Arc::clone(&job));
        if posted {
            fs.written_behind.fetch_add(pages, Ordering::Relaxed);
            self.stream.jobs.push_back(job);
        } else {
            // Dirty again before unpinned: never clean and evictable in between.
            job.wb.restore(fs, self);
            job.wb.pin(false);
            self.stream.off = true;
        }
    }

    /// Takes every dirty page of the file for an fdatasync that writes them
    /// durable from its own thread ([`Job::write_durable`]) after letting the
    /// file's lock go: pinned, copied out and marked clean as for a
    /// write-behind job, and a job of the file until settled, so that whoever
    /// takes the lock to write the file back (another fsync, a direct access,
    /// a truncate) waits for it first, while writers and readers of the file
    /// go on. The caller holds the lock from [`Node::lock_settled`]: no job
    /// is in flight.
    /// `writes` is the file's count of writes now ([`Node::writes`]): the
    /// job covers them all (they are in its pages, or were written back
    /// before, which its flush covers).
    pub(super) fn take_for_sync(&mut self, fs: &Inner, writes: u64) -> Arc<Job> {
        debug_assert!(!self.stream.busy(), "a sync's pages taken while a job of the file is in flight");
        let wb = Writeback::take_behind(fs, self, u64::MAX, usize::MAX);
        let job = Job::new(wb, false, false, writes);
        self.stream.jobs.push_back(Arc::clone(&job));
        job
    }

    /// Settles the file's jobs that are done (see the module's doc); with
    /// `wait`, waits for every one in flight first. The caller holds the
    /// file's lock exclusively.
    pub(super) fn settle(&mut self, fs: &Inner, wait: bool) {
        while let Some(job) = self.stream.jobs.front() {
            if !wait && !job.is_done() {
                return;
            }
            let job = self.stream.jobs.pop_front().expect("looked at");
            let written = job.wait();
            if written && !job.behind {
                self.synced = self.synced.max(job.covers);
            }
            match written {
                true if self.live => {
                    job.wb.finish_part(fs, self, true, self.stream.busy());
                    job.wb.pin(false);
                    if job.drop_behind {
                        for (block, page) in job.wb.taken() {
                            let written_again = self.dirty.get(block).is_some_and(|p| Arc::ptr_eq(p, page));
                            if !written_again {
                                fs.cache.drop_behind(Arc::clone(page));
                            }
                        }
                    }
                }
                true => job.wb.pin(false),
                false => {
                    job.wb.restore(fs, self);
                    job.wb.pin(false);
                    self.stream.off |= job.behind;
                }
            }
        }
    }
}

impl Node {
    /// The file's lock, exclusively, once every job of the file is written
    /// and settled. It waits for jobs in flight without the lock (a few times
    /// over, then holding it): a writer of the file is not held up behind
    /// another thread's wait (a database's log written while its last part
    /// is synced).
    pub(super) fn lock_settled(&self, fs: &Inner) -> RwLockWriteGuard<'_, NodeState> {
        self.lock_settled_unless(fs, |_| false).expect("nothing is covered")
    }

    /// [`Node::lock_settled`] for an fdatasync that another thread's sync
    /// job may cover: after each wait the jobs that are done are settled and
    /// `covered` asked, and `None` comes back once it says so, the lock let
    /// go. Sixteen threads each appending a record to one log block and
    /// syncing it took the lock after every job, and after four waits held
    /// it through the next one, the writers of the file waiting behind.
    pub(super) fn lock_settled_unless(
        &self,
        fs: &Inner,
        covered: impl Fn(&NodeState) -> bool,
    ) -> Option<RwLockWriteGuard<'_, NodeState>> {
        for _ in 0..WAITS_UNLOCKED {
            let mut state = self.state.write().expect("file lock poisoned");
            state.settle(fs, false);
            if covered(&state) {
                return None;
            }
            let Some(job) = state.stream.jobs.iter().find(|job| !job.is_done()).cloned() else {
                // Nothing in flight (the common case): settled without a wait, and the
                // lock taken once.
                state.settle(fs, true);
                return Some(state);
            };
            drop(state);
            job.wait();
        }
        let mut state = self.state.write().expect("file lock poisoned");
        state.settle(fs, true);
        (!covered(&state)).then_some(state)
    }
}
