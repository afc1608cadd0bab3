//! [`IoBuf`]: an owned byte buffer aligned for O_DIRECT.
//!
//! O_DIRECT needs buffer addresses aligned to the device's logical block size
//! (512 B or 4 KiB); a `Vec<u8>` gives no such promise. An `IoBuf` is always
//! aligned to 4096 bytes, which satisfies every device.
//!
//! Buffers of whole blocks up to [`RECYCLED_MAX`] go back to a process-wide
//! pool when dropped (up to [`RECYCLED_BYTES`] in all) and are handed out
//! again: the file layer copies every writeback and journal transaction into
//! one, and fresh memory for each cost a page fault and zeroing per 4 KiB
//! (a fifth of `tar x`'s time on a mount, in `perf`), where the allocator
//! had given the last ones back to the kernel.
//!
//! Single blocks (a page cache's frames) are cut from 2 MiB chunks mapped
//! with transparent huge pages where the kernel gives them: one fault and
//! one zeroing of 2 MiB instead of 512 faults, allocator splits and memory
//! cgroup charges (a mount's cache fills 16,384 frames in each new process:
//! 13% of `tar c`'s time on a mount went to getting them). A block buffer
//! therefore always goes back to the pool when dropped, whatever the pool
//! holds: the process keeps its peak of them. Under the interposer the
//! chunks come from a file in /dev/shm that the next process takes over
//! ([`crate::frames`]): memory already faulted in and zeroed once. Buffers larger than the
//! pool's are mapped straight from the kernel (zero pages filled on first
//! touch, no zeroing pass of ours: mounting read a 32 MiB inode table into
//! a buffer it first spent 19 ms zeroing) and unmapped when dropped.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Alignment of every [`IoBuf`].
pub const IO_ALIGN: usize = 4096;

/// Largest buffer the pool keeps (256 blocks of 4 KiB: the largest writeback run).
pub const RECYCLED_MAX: usize = 256 * IO_ALIGN;

/// Bytes the pool keeps at most of buffers larger than a block (blocks it keeps all).
pub const RECYCLED_BYTES: usize = 32 << 20;

/// Single blocks are cut from chunks this large (a huge page; a frame file's piece).
const CHUNK: usize = crate::frames::PIECE;

/// Dropped buffers by size in blocks (index = blocks - 1), and their bytes in all.
static POOL: Mutex<(Vec<Vec<IoBuf>>, usize)> = Mutex::new((Vec::new(), 0));

fn pool_class(len: usize) -> Option<usize> {
    (len > 0 && len <= RECYCLED_MAX && len.is_multiple_of(IO_ALIGN)).then(|| len / IO_ALIGN - 1)
}

/// The pool's lock, held across a fork ([`crate::sys::hold_globals_for_fork`]).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(POOL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A pooled buffer of `len` bytes, if one is there (holding old bytes).
fn from_pool(len: usize) -> Option<IoBuf> {
    let class = pool_class(len)?;
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let buf = pool.0.get_mut(class)?.pop()?;
    if class > 0 && !crate::frames::within(buf.ptr.as_ptr()) {
        // (Saturating: in a forked child the parent's frames no longer count as
        // frames, so a buffer pooled as one was never in this count. An overflow
        // here panicked with the pool locked, and the unwinding drop of `buf`
        // waited for the lock for ever.)
        pool.1 = pool.1.saturating_sub(len);
    }
    Some(buf)
}

/// `len` bytes of fresh anonymous memory (zeros), page-aligned.
fn map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; no file, no fixed address.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        std::alloc::handle_alloc_error(Layout::from_size_align(len, IO_ALIGN).expect("a valid layout"));
    }
    raw.cast()
}

/// A fresh, zeroed block cut from a new chunk (the rest of the chunk goes to
/// the pool): a piece of this process's frame file ([`crate::frames`]) when
/// it has one, else anonymous memory.
fn new_block() -> IoBuf {
    let start = match crate::frames::piece(second_piece_of(0)) {
        Some(piece) => {
            // Bytes another process left: the block handed out now must be zeros
            // (the rest join the pool, whose blocks hold old bytes anyway).
            // SAFETY: the piece is mapped, ours, and holds nothing of ours yet.
            unsafe { std::ptr::write_bytes(piece.as_ptr(), 0, IO_ALIGN) };
            piece.as_ptr() as usize
        }
        None => anonymous_chunk(),
    };
    let block = |i: usize| IoBuf {
        ptr: NonNull::new((start + i * IO_ALIGN) as *mut u8).expect("a mapping is not at 0"),
        len: IO_ALIGN,
    };
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.0.is_empty() {
        pool.0.push(Vec::new());
    }
    pool.0[0].extend((1..CHUNK / IO_ALIGN).map(block));
    block(0)
}

/// A buffer of `len` bytes (more than a block, at most [`RECYCLED_MAX`]) cut
/// from a new piece of the frame file, the rest of the piece cut likewise
/// into the pool (and what is left over into blocks); `None` without frames.
/// Its bytes are whatever the file held. Fresh memory for a process's first
/// buffers of a size was a page fault and zeroing per 4 KiB: the exit of
/// `tar cf` within a mount took a third of its page faults copying its
/// writeback into them (`perf record -e page-faults`).
fn from_piece(len: usize) -> Option<IoBuf> {
    let class = pool_class(len).filter(|&c| c > 0)?;
    let piece = crate::frames::piece(second_piece_of(class))?.as_ptr() as usize;
    let n = CHUNK / len;
    let cut = |at: usize, len: usize| IoBuf { ptr: NonNull::new(at as *mut u8).expect("a mapping is not at 0"), len };
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.0.len() <= class {
        pool.0.resize_with(class + 1, Vec::new);
    }
    // Frame-file memory is never given back: not counted against the pool's bound.
    pool.0[class].extend((1..n).map(|i| cut(piece + i * len, len)));
    pool.0[0].extend((n * len..CHUNK).step_by(IO_ALIGN).map(|at| cut(piece + at, IO_ALIGN)));
    Some(cut(piece, len))
}

/// Size classes (blocks - 1) that took a piece of the frame file before.
static PIECED: [std::sync::atomic::AtomicU64; RECYCLED_MAX / IO_ALIGN / 64] =
    [const { std::sync::atomic::AtomicU64::new(0) }; RECYCLED_MAX / IO_ALIGN / 64];

/// Whether size class `class` took a piece before (and notes that it has
/// now): a class's first piece is faulted in as it is used, the next ones
/// at once. A short program uses a buffer or two of a class (a `stat` on a
/// mount populated seven pieces: 3.5 ms of its 12); one that needs a second
/// piece of a class will use it all (`cp -r` faulted 3,400 more pages when
/// no piece was populated).
fn second_piece_of(class: usize) -> bool {
    let bit = 1u64 << (class % 64);
    PIECED[class / 64].fetch_or(bit, std::sync::atomic::Ordering::Relaxed) & bit != 0
}

/// A new chunk of anonymous memory, huge-page aligned (zeros until touched).
fn anonymous_chunk() -> usize {
    // Twice the chunk, so a huge-page-aligned chunk lies inside; the rest is unmapped.
    let span = 2 * CHUNK;
    let raw = map(span);
    let (raw, start) = (raw as usize, (raw as usize).next_multiple_of(CHUNK));
    // SAFETY: both ranges lie inside the mapping, outside the chunk, and hold nothing.
    unsafe {
        if start > raw {
            libc::munmap(raw as *mut libc::c_void, start - raw);
        }
        if raw + span > start + CHUNK {
            libc::munmap((start + CHUNK) as *mut libc::c_void, raw + span - start - CHUNK);
        }
    }
    // SAFETY: [start, start + CHUNK) is mapped. Huge pages are a hint.
    unsafe { libc::madvise(start as *mut libc::c_void, CHUNK, libc::MADV_HUGEPAGE) };
    start
}

/// A zero-filled, 4096-byte-aligned heap buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: IoBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access is read-only through `Deref`, like Vec<u8>.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zero-filled buffer of `len` bytes.
    pub fn new(len: usize) -> IoBuf {
        match from_pool(len) {
            Some(mut buf) => {
                buf.fill(0);
                buf
            }
            None => Self::allocate(len),
        }
    }

    /// A buffer of `len` bytes whose contents are whatever a recycled one held
    /// (zeros if it is new): for a caller that overwrites all of it.
    pub fn for_overwrite(len: usize) -> IoBuf {
        from_pool(len).or_else(|| from_piece(len)).unwrap_or_else(|| Self::allocate(len))
    }

    fn allocate(len: usize) -> IoBuf {
        if let Some(mut buf) = (len > IO_ALIGN).then(|| from_piece(len)).flatten() {
            buf.fill(0);
            return buf;
        }
        if len == IO_ALIGN {
            return new_block();
        }
        if len == 0 {
            // An aligned, never dereferenced address: empty slices need only a non-null pointer.
            let ptr = NonNull::new(std::ptr::without_provenance_mut(IO_ALIGN)).expect("non-null");
            return IoBuf { ptr, len: 0 };
        }
        if len > RECYCLED_MAX {
            return IoBuf { ptr: NonNull::new(map(len)).expect("a mapping is not at 0"), len };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf { ptr, len }
    }

    /// A block buffer (4096 bytes) over memory the caller hands over for
    /// good: a block of a mapping that is never unmapped, which no one else
    /// uses (the carried cache lends the blocks of a private mapping of its
    /// file this way: read without a copy, copied on the first write by the
    /// kernel). Dropped, it joins the pool of blocks as any other does.
    ///
    /// # Safety
    /// `ptr` is aligned to 4096, valid for reads and writes of 4096 bytes for
    /// the rest of the process, and used by nothing but the buffer returned.
    pub unsafe fn from_mapped_block(ptr: NonNull<u8>) -> IoBuf {
        debug_assert_eq!(ptr.as_ptr() as usize % IO_ALIGN, 0);
        IoBuf { ptr, len: IO_ALIGN }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        // Every byte is written below: no zeroing first.
        let mut buf = IoBuf::for_overwrite(data.len());
        buf.copy_from_slice(data);
        buf
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_ALIGN).expect("buffer size overflows a Layout")
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(class) = pool_class(self.len) {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            // A block is part of a chunk, and frame-file memory is never given back:
            // neither is freed alone.
            let framed = class > 0 && crate::frames::within(self.ptr.as_ptr());
            if class == 0 || framed || pool.1 + self.len <= RECYCLED_BYTES {
                if pool.0.len() <= class {
                    pool.0.resize_with(class + 1, Vec::new);
                }
                let keep = IoBuf { ptr: self.ptr, len: self.len };
                if class > 0 && !framed {
                    pool.1 += self.len;
                }
                pool.0[class].push(keep);
                self.len = 0; // this one no longer owns the memory
                return;
            }
        }
        if self.len > RECYCLED_MAX {
            // SAFETY: mapped in `allocate` with this length; nothing else refers to it.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        } else if self.len > 0 {
            // SAFETY: allocated in `allocate` with this very layout.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
        }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_writable() {
        for len in [0, 1, 512, 4096, 10_000] {
            let mut b = IoBuf::new(len);
            assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(7);
            assert_eq!(b.len(), len);
        }
        assert_eq!(&*IoBuf::from_slice(b"abc"), b"abc");
    }

    #[test]
    fn a_recycled_buffer_is_zeroed_again_unless_it_is_for_overwriting() {
        // Sizes no other test uses, so a parallel test cannot take them meanwhile.
        let len = 37 * IO_ALIGN;
        let mut b = IoBuf::new(len);
        b.fill(9);
        let at = b.as_ptr() as usize;
        drop(b);
        let again = IoBuf::new(len);
        assert!(again.iter().all(|&x| x == 0));
        assert_eq!(again.as_ptr() as usize, at, "the same memory, recycled");
        let mut c = IoBuf::new(41 * IO_ALIGN);
        c.fill(5);
        drop(c);
        let kept = IoBuf::for_overwrite(41 * IO_ALIGN);
        assert!(kept.iter().all(|&x| x == 5), "old bytes, as promised: no zeroing");
        assert_eq!(kept.as_ptr() as usize % IO_ALIGN, 0);
    }
}
