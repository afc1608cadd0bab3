//! One iopath engine per routed file, shared by every descriptor of it.
//!
//! A file is known by (device, inode, writable): descriptors of the same
//! file share one engine, so all of a program's threads go through one
//! merging path. The engine is opened at the file's first routed I/O (a
//! file created empty has nothing to route until it has been written), on
//! `/proc/self/fd/N`, so a relative or since-renamed path does not matter.
//! Its size is the file's size then; requests past it go to the C library,
//! and one that finds the file grown reopens the engine at the new size.

use iopath::engine::Engine;
use iopath::path::PathSpec;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

/// An open engine and what a request must respect to go through it.
pub struct Slot {
    /// The engine (its blocking calls serve any thread).
    pub engine: Engine,
    /// Bytes the engine covers, from offset 0.
    pub size: u64,
    /// Alignment of buffers, offsets and lengths.
    pub align: u64,
    /// Largest single request.
    pub max_io: u64,
}

enum State {
    NotYet,
    Ready(Arc<Slot>),
    /// Opening an engine failed; the file's calls go to the C library.
    Failed,
}

/// A routed file.
pub struct FileEntry {
    /// Its absolute path (for messages).
    pub path: String,
    writable: bool,
    state: RwLock<State>,
    /// Held by calls at the file position (`read`, `write`), which read the
    /// position, do the I/O and move the position as one step.
    pub position: Mutex<()>,
}

type Key = (u64, u64, bool);
static FILES: Mutex<BTreeMap<Key, Weak<FileEntry>>> = Mutex::new(BTreeMap::new());

/// In a child just forked: whether the parent had an engine open for a
/// routed file (the child cannot use it: its threads are not here). Asked
/// without waiting: a lock held at the fork by a thread that did not come
/// along counts as an engine. A child of a parent that opened none (fio
/// forks its jobs before they do any I/O) routes its own calls.
pub fn any_engine_across_fork() -> bool {
    let files = match FILES.try_lock() {
        Ok(files) => files,
        Err(std::sync::TryLockError::Poisoned(files)) => files.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return true,
    };
    files.values().filter_map(Weak::upgrade).any(|entry| match entry.state.try_read() {
        Ok(state) => matches!(*state, State::Ready(_)),
        Err(std::sync::TryLockError::Poisoned(state)) => matches!(*state.into_inner(), State::Ready(_)),
        Err(std::sync::TryLockError::WouldBlock) => true,
    })
}

/// The routed files' entries, held across a fork ([`crate::fork_holds`]).
pub(crate) fn hold_for_fork() -> Option<crate::fork_holds::Held> {
    crate::fork_holds::mutex(&FILES)
}

/// The entry for a file, shared with its other descriptors.
pub fn entry_for(dev: u64, ino: u64, writable: bool, path: &str) -> Arc<FileEntry> {
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    files.retain(|_, w| w.strong_count() > 0);
    if let Some(entry) = files.get(&(dev, ino, writable)).and_then(Weak::upgrade) {
        return entry;
    }
    let entry = Arc::new(FileEntry {
        path: path.to_string(),
        writable,
        state: RwLock::new(State::NotYet),
        position: Mutex::new(()),
    });
    files.insert((dev, ino, writable), Arc::downgrade(&entry));
    entry
}

impl FileEntry {
    /// Whether writes may go through the engine (the descriptor was opened for writing).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The engine, opened on first use through descriptor `fd`; None if it cannot be.
    pub fn slot(&self, fd: i32, path_spec: &str) -> Option<Arc<Slot>> {
        if let State::Ready(slot) = &*self.state.read().unwrap_or_else(|e| e.into_inner()) {
            return Some(Arc::clone(slot));
        }
        self.open(fd, path_spec, 0)
    }

    /// The engine, reopened if the file has grown to cover `end` since it was opened.
    pub fn grown(&self, fd: i32, path_spec: &str, end: u64) -> Option<Arc<Slot>> {
        self.open(fd, path_spec, end)
    }

    /// Forgets the engine (the file was truncated): the next I/O opens a new one.
    pub fn invalidate(&self) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if matches!(*state, State::Ready(_)) {
            *state = State::NotYet;
        }
    }

    fn open(&self, fd: i32, path_spec: &str, end: u64) -> Option<Arc<Slot>> {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match &*state {
            State::Failed => return None,
            State::Ready(slot) if slot.size >= end => return Some(Arc::clone(slot)),
            _ => {}
        }
        if let State::Ready(slot) = &*state {
            // Only reopen for real growth: a file appended to by small writes would
            // otherwise reopen its engine for every one.
            let size = file_size(fd)?;
            if size < end || size < slot.size + (slot.size / 4).max(1 << 20) {
                return None;
            }
        }
        let _inside = crate::Inside::enter();
        let spec = format!("uring:/proc/self/fd/{fd}{}", if self.writable { "" } else { ",readonly=1" });
        let opened = PathSpec::parse(path_spec).and_then(|p| Engine::open(&spec, p.config()?));
        match opened {
            Ok(engine) => {
                let caps = engine.device().capabilities();
                let slot = Arc::new(Slot {
                    size: engine.device().size(),
                    align: u64::from(caps.alignment.max(1)),
                    max_io: u64::from(caps.max_segment_bytes),
                    engine,
                });
                crate::log(&format!(
                    "{}: engine open, {} bytes, path {path_spec}: {}",
                    self.path,
                    slot.size,
                    slot.engine.device().describe()
                ));
                *state = State::Ready(Arc::clone(&slot));
                Some(slot)
            }
            Err(e) => {
                // An empty file has nothing to route yet: try again once it has data.
                if file_size(fd).unwrap_or(0) > 0 {
                    crate::log(&format!("{}: cannot open an engine ({e}); its calls go to the C library", self.path));
                    *state = State::Failed;
                }
                None
            }
        }
    }
}

/// The size of the file (or block device) behind `fd`.
pub fn file_size(fd: i32) -> Option<u64> {
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
        let mut size = 0u64;
        // SAFETY: BLKGETSIZE64 writes a u64.
        return (unsafe { libc::ioctl(fd, 0x8008_1272, &mut size) } == 0).then_some(size);
    }
    Some(st.st_size as u64)
}
