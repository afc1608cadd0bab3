//! Where the emulated device keeps its data: anonymous memory or a mapped file.
//!
//! Memory is reserved lazily (`MAP_NORESERVE`), so a large emulated device
//! costs only the pages that are written. A file-backed store is mapped
//! shared and made durable by a flush (`msync`).

use super::target::{Guard, check_guard, mark_owned};
use crate::error::{Error, Result};
use memmap2::{MmapMut, MmapOptions};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

/// The bytes of an emulated device.
pub struct Store {
    map: MmapMut,
    base: *mut u8,
    file: Option<PathBuf>,
}

// SAFETY: the store is a fixed mapping that lives as long as the device; concurrent
// commands touch it through raw copies only, like DMA into device memory. Two
// overlapping commands in flight at once get no ordering, exactly as on hardware.
unsafe impl Send for Store {}
// SAFETY: see above.
unsafe impl Sync for Store {}

impl Store {
    /// Zero-filled anonymous memory of `size` bytes. With `populate`, every
    /// page is allocated up front (in huge pages where the kernel allows), so
    /// no request pays a page fault: a first touch of a page costs 1-20 µs
    /// here (the hypervisor backs guest memory on first use), which would
    /// otherwise be counted as the path's software time. Populating 1 GiB
    /// takes ~3.5 s the first time on a fresh VM and ~0.1 s after that.
    pub fn memory(size: u64, populate: bool) -> Result<Store> {
        let mut map = MmapOptions::new().len(size as usize).map_anon().map_err(|source| Error::Os {
            context: format!("cannot reserve {size} bytes for the emulated device"),
            source,
        })?;
        if populate {
            // Both are hints: an older kernel without them just faults pages in later.
            let _ = map.advise(memmap2::Advice::HugePage);
            let _ = map.advise(memmap2::Advice::PopulateWrite);
        }
        let base = map.as_mut_ptr();
        Ok(Store { map, base, file: None })
    }

    /// A file of `size` bytes (created or grown as needed) mapped shared; with
    /// `read_only`, mapped copy-on-write so nothing written reaches the file.
    /// An existing file is written to only as `guard` allows.
    pub fn file(path: &Path, size: u64, read_only: bool, guard: Guard) -> Result<Store> {
        let target = |action, source| Error::Target { action, path: path.to_path_buf(), source };
        let created = !path.exists();
        if !created && !read_only {
            check_guard(path, false, guard)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .create(!read_only)
            .truncate(false)
            .open(path)
            .map_err(|e| target("open", e))?;
        if created {
            mark_owned(&file);
        }
        let len = file.metadata().map_err(|e| target("stat", e))?.len();
        if len < size {
            if read_only {
                return Err(Error::Refused {
                    path: path.to_path_buf(),
                    why: format!("it holds {len} bytes, fewer than the device size {size}"),
                    fix: "give the emulated device a size= no larger than the file; a read-only device does \
                          not extend it"
                        .into(),
                });
            }
            file.set_len(size).map_err(|e| target("size", e))?;
        }
        let mut options = MmapOptions::new();
        options.len(size as usize);
        // SAFETY: the mapping is private to this store; other processes changing the
        // file underneath would only change the bytes we read, which is the file's contract.
        let map = unsafe { if read_only { options.map_copy(&file) } else { options.map_mut(&file) } };
        let mut map = map.map_err(|e| target("map", e))?;
        let base = map.as_mut_ptr();
        Ok(Store { map, base, file: (!read_only).then(|| path.to_path_buf()) })
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the store has no bytes.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The backing file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Copies `len` bytes at `offset` into `dst`.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for `len` writable bytes and `offset + len <= self.len()`.
    pub unsafe fn read(&self, offset: u64, dst: *mut u8, len: usize) {
        debug_assert!(offset + len as u64 <= self.len());
        // SAFETY: the caller guarantees both ranges; the store range is inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset as usize), dst, len) };
    }

    /// Copies `len` bytes from `src` to `offset`.
    ///
    /// # Safety
    ///
    /// `src` must be valid for `len` readable bytes and `offset + len <= self.len()`.
    pub unsafe fn write(&self, offset: u64, src: *const u8, len: usize) {
        debug_assert!(offset + len as u64 <= self.len());
        // SAFETY: the caller guarantees both ranges; the store range is inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src, self.base.add(offset as usize), len) };
    }

    /// Zeroes `len` bytes at `offset` (a trim).
    ///
    /// # Safety
    ///
    /// `offset + len <= self.len()`, and no one else touches the range meanwhile.
    pub unsafe fn zero(&self, offset: u64, len: usize) {
        debug_assert!(offset + len as u64 <= self.len());
        // SAFETY: the caller guarantees the range lies inside the mapping.
        unsafe { std::ptr::write_bytes(self.base.add(offset as usize), 0, len) };
    }

    /// Makes written data durable (file-backed stores); a no-op for memory.
    pub fn flush(&self) -> Result<()> {
        if self.file.is_some() {
            self.map
                .flush()
                .map_err(|source| Error::Os { context: "msync of the emulated device's file".into(), source })?;
        }
        Ok(())
    }
}
