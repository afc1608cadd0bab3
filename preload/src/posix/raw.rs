//! `syscall`: the C library's door to any system call by number.
//!
//! Some programs call the kernel that way for file operations the C
//! library also names: libuv asks `syscall(SYS_statx, ...)` for every
//! `stat`, so Node.js's `fs.statSync` on a mounted file said ENOENT
//! although `fs.writeFileSync` had just made it. The numbers of such calls
//! are served as the named functions are ([`statx`](super::metadata::statx));
//! every other number goes to the C library's `syscall` untouched.
//!
//! `syscall` is variadic, which stable Rust cannot define; it is declared
//! here with six argument words after the number. On x86-64 and aarch64
//! Linux a variadic call passes integer arguments where a fixed one does
//! (registers, then the stack), so the words a caller gave are the ones
//! received, and those it did not give are read but never used.

use crate::real;
use libc::{c_char, c_int, c_long, c_uint};

/// `syscall(number, ...)`: `statx` on a mount as the [`statx`](super::metadata::statx)
/// hook serves it, any other call the C library's.
///
/// # Safety
/// As the C function: the arguments are those the system call `number` takes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall(
    number: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if number == libc::SYS_statx && super::mounting() {
        // SAFETY: statx's arguments, as the caller gave them.
        return c_long::from(unsafe {
            super::metadata::statx(a1 as c_int, a2 as *const c_char, a3 as c_int, a4 as c_uint, a5 as *mut libc::statx)
        });
    }
    // SAFETY: passed on as the caller gave it.
    unsafe { real::syscall(number, a1, a2, a3, a4, a5, a6) }
}
