//! [`IoBuf`]: an owned byte buffer aligned for O_DIRECT.
//!
//! O_DIRECT needs buffer addresses aligned to the device's logical block size
//! (512 B or 4 KiB); a `Vec<u8>` gives no such promise. An `IoBuf` is always
//! aligned to 4096 bytes, which satisfies every device.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`].
pub const IO_ALIGN: usize = 4096;

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
        if len == 0 {
            // An aligned, never dereferenced address: empty slices need only a non-null pointer.
            let ptr = NonNull::new(std::ptr::without_provenance_mut(IO_ALIGN)).expect("non-null");
            return IoBuf { ptr, len: 0 };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf { ptr, len }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::new(data.len());
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
        if self.len > 0 {
            // SAFETY: allocated in `new` with this very layout.
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
}
