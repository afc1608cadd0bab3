//! Mounted descriptors above 2 across `exec`: `sh -c 'cat <&5' 5<
//! /mnt/i/f`, `flock 9 cmd 9> /mnt/i/lock`, `exec 4> /mnt/i/log; sh -c
//! 'echo x >&4'`.
//!
//! A mounted descriptor is a number the kernel holds for the interposer (an
//! `O_PATH` descriptor of the mount's directory) and a description in this
//! library's table; an exec keeps the number and loses the table, so the
//! next program found a descriptor it could not use (EBADF). Standard
//! streams are bridged (`bridge/`); the others are handed on here, in one
//! of two ways:
//!
//! - **The executing process holds the mount** (a shell's child that made
//!   the redirection and executes the command; a program that opened the
//!   file and executes another): the exec commits, hands each descriptor
//!   the exec keeps (not close-on-exec) on in `IOPATH_FDS` (its numbers and
//!   the open file where it stands, [`Reopen`]), and the next program's
//!   interposer opens the file again as it loads and puts it at the same
//!   numbers, duplicates sharing one description: a mounted descriptor as
//!   before, with its position, flags, `fstat` and locks.
//! - **A forked child of the holder executes** (the shell keeps `exec 4>
//!   f` open and runs a command): the child cannot mount (its parent holds
//!   the mount), so each such descriptor becomes a pipe its parent bridges
//!   (`bridge/adopt.rs`), as a standard stream does: what the program
//!   writes lands in the file at the shared position (a file open for
//!   reading is fed into the pipe), but the program sees a pipe (`fstat`
//!   says FIFO; `flock` on it locks the pipe, while the mount's lock still
//!   keeps every other process off the device).
//!
//! A descriptor whose file has no name any more (unlinked while open)
//! cannot be opened again by the next program: it gets EBADF there, and
//! the interposer says so (`IOPATH_LOG=1`).

use crate::bridge::{decode_fds, encode_fds};
use crate::mount::{self, Description, Node, Reopen};
use crate::real;
use libc::c_int;
use std::ffi::CString;
use std::sync::Arc;

/// The environment variable that hands descriptors to the next program.
const VARIABLE: &str = "IOPATH_FDS";

/// The mounted descriptors above 2 an exec hands on: each open file with
/// the numbers that stand for it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandOver(Vec<(Vec<c_int>, Reopen)>);

impl HandOver {
    /// The `IOPATH_FDS=...` entry, if there is anything to hand on.
    pub fn entry(&self) -> Option<CString> {
        (!self.0.is_empty()).then(|| CString::new(format!("{VARIABLE}={}", self.encode())).ok())?
    }

    /// `fds|reopen;fds|reopen` (see [`Reopen::encode`]).
    fn encode(&self) -> String {
        let each: Vec<String> =
            self.0.iter().map(|(fds, file)| format!("{}|{}", encode_fds(fds), file.encode())).collect();
        each.join(";")
    }

    fn decode(text: &str) -> Option<HandOver> {
        let mut out = Vec::new();
        for one in text.split(';').filter(|t| !t.is_empty()) {
            let parts: Vec<&str> = one.split('|').collect();
            let [fds, ref file @ ..] = parts[..] else { return None };
            out.push((decode_fds(fds)?, Reopen::decode(file)?));
        }
        Some(HandOver(out))
    }
}

/// Whether the exec keeps descriptor `fd` (it is not close-on-exec).
fn kept_by_exec(fd: c_int) -> bool {
    // SAFETY: F_GETFD on a descriptor number; -1 if it is not open.
    unsafe { real::fcntl(fd, libc::F_GETFD, 0) == 0 }
}

/// The mounted files above 2 the exec keeps, each with its numbers.
fn kept() -> Vec<(Vec<c_int>, Arc<Description>)> {
    let mut kept: Vec<(Vec<c_int>, Arc<Description>)> = Vec::new();
    let mut fds: Vec<(c_int, Arc<Description>)> = mount::descriptors()
        .into_iter()
        .filter(|(fd, d)| *fd > 2 && matches!(d.node, Node::File(_)) && kept_by_exec(*fd))
        .collect();
    fds.sort_unstable_by_key(|(fd, _)| *fd);
    for (fd, d) in fds {
        match kept.iter_mut().find(|(_, other)| Arc::ptr_eq(other, &d)) {
            Some((numbers, _)) => numbers.push(fd),
            None => kept.push((vec![fd], d)),
        }
    }
    kept
}

/// Before an exec: what the next program gets of the mounted descriptors
/// above 2 that the exec keeps (see the module's documentation). In a
/// forked child of the holder, those it inherited become pipes its parent
/// bridges now (they are the parent's); those it opened itself are handed on.
pub fn hand_over() -> HandOver {
    let (parents, kept): (Vec<_>, Vec<_>) = kept().into_iter().partition(|(_, d)| mount::inherited(d));
    if kept.is_empty() && parents.is_empty() {
        return HandOver::default();
    }
    let _inside = crate::Inside::enter();
    for (fds, d) in parents {
        for fd in fds {
            if !crate::bridge::bridged_in_place(&d, fd, false) {
                let why = std::io::Error::last_os_error();
                crate::log(&format!("descriptor {fd} on {}: not bridged by the parent ({why})", shown(&d)));
            }
        }
    }
    let mut handed = Vec::new();
    for (fds, d) in kept {
        match Reopen::of(&d, 0) {
            Some(file) => handed.push((fds, file)),
            None => crate::log(&format!(
                "descriptor {} on {}: the file was unlinked; the next program cannot be given it",
                encode_fds(&fds),
                shown(&d)
            )),
        }
    }
    HandOver(handed)
}

fn shown(d: &Description) -> String {
    format!("{}{}", String::from_utf8_lossy(&d.mount.dir), String::from_utf8_lossy(&d.path))
}

/// As the library loads: opens again the files the program that executed
/// this one handed on (`IOPATH_FDS`), and puts each at its numbers. The
/// variable is removed, so this program's children do not take them too.
pub fn adopt() {
    let Some(value) = std::env::var_os(VARIABLE) else { return };
    // SAFETY: at load, before the program's main: no other thread reads the environment.
    unsafe { libc::unsetenv(c"IOPATH_FDS".as_ptr()) };
    let text = value.to_string_lossy();
    let Some(handed) = HandOver::decode(&text) else {
        crate::say(&format!("{VARIABLE}: cannot read \"{text}\"; mounted descriptors above 2 lost"));
        return;
    };
    for (fds, file) in handed.0 {
        let fds: Vec<c_int> = fds.into_iter().filter(|&fd| fd > 2 && kept_by_exec(fd)).collect();
        let shown = || {
            let (dir, path) = (String::from_utf8_lossy(file.mount_dir()), String::from_utf8_lossy(&file.path));
            format!("descriptor {} on {dir}{path}", encode_fds(&fds))
        };
        if fds.is_empty() {
            continue;
        }
        match file.open() {
            Ok(d) => {
                crate::log(&format!("{} (handed over at exec)", shown()));
                let d = Arc::new(d);
                for fd in fds {
                    mount::install(fd, Arc::clone(&d));
                }
            }
            Err(why) => crate::say(&format!("cannot keep {}: {why}", shown())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_survives_its_encoding() {
        let file = |mount, path: &[u8]| Reopen {
            mount,
            ino: 12,
            generation: 1_795_000_000_123_456_789,
            flags: libc::O_RDWR | libc::O_APPEND,
            position: 1 << 33,
            path: path.to_vec(),
        };
        let handed = HandOver(vec![(vec![3, 9], file(0, b"/a;b|c=d")), (vec![12], file(2, b"/\xff"))]);
        assert_eq!(HandOver::decode(&handed.encode()), Some(handed));
        assert_eq!(HandOver::decode(""), Some(HandOver::default()));
        for bad in ["3", "x|0|1|7|2|3|2f", "3|0|1|7|2|3|2", "-3|0|1|7|2|3|2f", "3|0|1|7|2|3|2f|9", "3|0|1|2|3|2f"] {
            assert_eq!(HandOver::decode(bad), None, "{bad}");
        }
        assert_eq!(HandOver::default().entry(), None);
    }
}
