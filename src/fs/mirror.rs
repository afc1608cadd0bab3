//! Mirrors: a range of a file copied into memory and kept equal to the file
//! for as long as the mirror lives. Every write and truncate of the file,
//! through any handle, updates the mirrors that overlap it, under the
//! file's lock, before the call returns; a mirror holds its file (and so
//! the mount) open.
//!
//! For a program's shared mapping of a mounted file (the interposer's
//! `mmap`): the mirror's memory is a memfd that the program maps where it
//! asked, while the file layer writes through a mapping of its own. What
//! the program sees changes when the file does, as a kernel mapping's pages
//! do; a page wholly past the end reads as zeros where the kernel would
//! raise SIGBUS.
//!
//! - A read-only mirror's memfd is sealed against writes (no other mapping
//!   of it can be made writable: `mprotect(PROT_WRITE)` fails as on a file
//!   opened read only).
//! - A writable mirror is the file's truth for its range while it lives:
//!   reads of the file through the file layer see what the program stored
//!   in it ([`File::read_at`] lays its bytes over what it read), and its
//!   bytes go to the file ([`Mirror::sync`]: the interposer's `msync`, the
//!   file's `fsync`, the mirror's drop, the process's exit), page by page,
//!   those that differ from the file's. A store that races a read or a
//!   write-back is seen or not, as with a kernel mapping.

use super::File;
use super::written::WriteWatch;
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// The memory of a mirror, as the file's lock holders see it.
pub(super) struct MirrorMemory {
    /// Where in the file the copy starts.
    offset: u64,
    /// Bytes mirrored (the mapping may be longer: whole pages).
    len: usize,
    /// The file layer's own writable mapping of `fd`.
    ptr: *mut u8,
    map_len: usize,
    fd: OwnedFd,
    /// The program may store into it (see the module's doc).
    pub(super) writable: bool,
    /// The pages the program stores into, once it has mapped a writable
    /// mirror ([`Mirror::watch_writes`]).
    watch: std::sync::OnceLock<WriteWatch>,
}

// SAFETY: the memory is written only under the file's lock (`NodeState` is
// behind its `RwLock`), and a mapping is not tied to a thread.
unsafe impl Send for MirrorMemory {}
// SAFETY: as above.
unsafe impl Sync for MirrorMemory {}

impl Drop for MirrorMemory {
    fn drop(&mut self) {
        // SAFETY: our own mapping, made in `MirrorMemory::new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.map_len) };
    }
}

impl MirrorMemory {
    /// Zeroed memory for `len` bytes of the file from `offset`.
    fn new(offset: u64, len: usize, writable: bool) -> Result<MirrorMemory> {
        let os = |context: &str| Error::Os { context: context.to_string(), source: std::io::Error::last_os_error() };
        let map_len = len.div_ceil(crate::sys::page_size()) * crate::sys::page_size();
        let fd = crate::sys::own_high(|| {
            // SAFETY: a NUL-terminated name and valid flags.
            unsafe { libc::memfd_create(c"iopath-mirror".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) }
        })
        .map_err(|source| Error::Os { context: "cannot make memory for a mapping (memfd_create)".into(), source })?;
        // SAFETY: our descriptor; a size in range.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) } != 0 {
            return Err(os("cannot size the memory for a mapping"));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new shared mapping of our descriptor, at an address the kernel picks.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), map_len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(os("cannot map the memory for a mapping"));
        }
        let memory = MirrorMemory { offset, len, ptr: ptr.cast(), map_len, fd, writable, watch: Default::default() };
        // A read-only mirror: only the mapping above may write (the program's maps it
        // read only, and cannot make its own writable: mprotect fails, as for a file
        // opened read only). Neither kind changes size.
        let write_seal = if writable { 0 } else { libc::F_SEAL_FUTURE_WRITE };
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | write_seal | libc::F_SEAL_SEAL;
        // SAFETY: our descriptor, made with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(memory.fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os("cannot seal the memory for a mapping"));
        }
        Ok(memory)
    }

    /// The mirrored bytes, to be written (the caller holds the file's lock).
    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: `len <= map_len` bytes of our mapping; only lock holders write.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The part of `[from, to)` (file bytes) this mirror holds, as a range of
    /// its memory and the same range's offset in the file.
    fn overlap(&self, from: u64, to: u64) -> Option<(std::ops::Range<usize>, u64)> {
        let start = from.max(self.offset);
        let end = to.min(self.offset + self.len as u64);
        (start < end).then(|| ((start - self.offset) as usize..(end - self.offset) as usize, start))
    }

    /// `data`, just written at `offset` of the file, copied in where it overlaps.
    pub(super) fn written(&self, data: &[u8], offset: u64) {
        if let Some((range, start)) = self.overlap(offset, offset + data.len() as u64) {
            let skip = (start - offset) as usize;
            let n = range.len();
            self.bytes()[range].copy_from_slice(&data[skip..skip + n]);
        }
    }

    /// File bytes `[from, to)` were deallocated (a hole punched): they read as zeros.
    pub(super) fn zeroed(&self, from: u64, to: u64) {
        if let Some((range, _)) = self.overlap(from, to) {
            self.bytes()[range].fill(0);
        }
    }

    /// The file now ends at `len`: what lies past it reads as zeros.
    pub(super) fn truncated(&self, len: u64) {
        if let Some((range, _)) = self.overlap(len, u64::MAX) {
            self.bytes()[range].fill(0);
        }
    }

    /// Where in the file the copy starts.
    pub(super) fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes mirrored.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The file ranges within `[from, to)` whose pages the program stored
    /// into since the last look (protected again as they are told), or
    /// `None` where nothing watches them or the watch cannot tell: then
    /// every page must be looked at.
    pub(super) fn written_since_last_look(&self, from: u64, to: u64) -> Option<Vec<std::ops::Range<u64>>> {
        let watch = self.watch.get()?;
        let Some((range, _)) = self.overlap(from, to) else { return Some(Vec::new()) };
        let written = watch.take_written(range)?;
        let at = |x: usize| self.offset + x as u64;
        Some(written.into_iter().map(|r| at(r.start)..at(r.end)).collect())
    }

    /// A write-back failed after a look: the pages it was told of are no
    /// longer marked, so every page is looked at from now on.
    pub(super) fn distrust_watch(&self) {
        if let Some(watch) = self.watch.get() {
            watch.distrust();
        }
    }

    /// Lays what the mirror holds of `[offset, offset + buf.len())` over `buf`.
    pub(super) fn lay_over(&self, buf: &mut [u8], offset: u64) {
        if let Some((range, start)) = self.overlap(offset, offset + buf.len() as u64) {
            let at = (start - offset) as usize;
            // SAFETY: `range` lies within the mapping. The program may be storing into
            // these bytes this moment: what is copied is what a kernel mapping's reader
            // would see, one byte's value or the other's.
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.add(range.start), buf[at..].as_mut_ptr(), range.len());
            }
        }
    }

    /// `[from, to)` of the file, for `fill` to copy in (the file's bytes there).
    pub(super) fn refill(&self, from: u64, to: u64, fill: impl FnOnce(&mut [u8], u64) -> Result<()>) -> Result<()> {
        match self.overlap(from, to) {
            Some((range, start)) => fill(&mut self.bytes()[range], start),
            None => Ok(()),
        }
    }
}

/// A copy of part of a file kept equal to it while this lives ([`File::mirror`]).
pub struct Mirror {
    pub(super) memory: Arc<MirrorMemory>,
    /// Keeps the file open (and its mount): the mirror is updated by the file's changes.
    pub(super) file: File,
}

impl Mirror {
    /// The memory's descriptor, to be mapped shared and read only (at offset 0,
    /// for the mirror's length); a number of iopath's own, close-on-exec.
    pub fn fd(&self) -> RawFd {
        self.memory.fd.as_raw_fd()
    }

    /// Bytes mirrored.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// Whether it mirrors nothing (never: a mirror is made for at least a byte).
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// Where in the file it starts.
    pub fn offset(&self) -> u64 {
        self.memory.offset
    }

    /// Whether the program may store into it ([`File::mirror_writable`]).
    pub fn writable(&self) -> bool {
        self.memory.writable
    }

    /// Writes what a writable mirror holds into the file (the pages that
    /// differ from the file's), up to the file's end; nothing for a
    /// read-only one. Not durable: the file's `fsync` makes it so.
    pub fn sync(&self) -> Result<()> {
        self.sync_range(0, self.memory.len)
    }

    /// [`Mirror::sync`] of `len` bytes from byte `start` of the mirror only
    /// (an `msync` of part of a map).
    pub fn sync_range(&self, start: usize, len: usize) -> Result<()> {
        if !self.memory.writable {
            return Ok(());
        }
        let from = self.memory.offset + start as u64;
        self.file.write_back_mirror(&self.memory, from, from.saturating_add(len as u64))
    }

    /// The program has mapped this (writable) mirror at `at`: from now on a
    /// write-back looks only at the pages stored into there, where the kernel
    /// can tell ([`super::written`]). Once per mirror; later calls and
    /// read-only mirrors change nothing. Returns whether the stores are
    /// watched.
    pub fn watch_writes(&self, at: *mut u8) -> bool {
        if !self.memory.writable {
            return false;
        }
        if self.memory.watch.get().is_none()
            && let Some(watch) = WriteWatch::new(at as usize, self.memory.len)
        {
            let _ = self.memory.watch.set(watch);
        }
        self.memory.watch.get().is_some()
    }

    /// The program's map of this mirror is gone, or part of it: write-backs
    /// look at every page from now on (the pages stored into are in the
    /// memory, but no longer marked where a watch could see them).
    pub fn unwatch(&self) {
        self.memory.distrust_watch();
    }

    /// A new mirror of the same file from the same offset, `len` bytes long
    /// and as writable as this one (for a map the program resizes). Write
    /// this one back first if it is writable: the new one starts from the file.
    pub fn resized(&self, len: usize) -> Result<Mirror> {
        if self.memory.writable {
            self.file.mirror_writable(self.memory.offset, len)
        } else {
            self.file.mirror(self.memory.offset, len)
        }
    }

    pub(super) fn new_memory(offset: u64, len: usize, writable: bool) -> Result<Arc<MirrorMemory>> {
        MirrorMemory::new(offset, len, writable).map(Arc::new)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        // What the program stored reaches the file (an error has no one to go to:
        // the interposer's munmap has succeeded by now, as the kernel's would).
        let _ = self.sync();
        self.file.forget_mirror(&self.memory);
    }
}
