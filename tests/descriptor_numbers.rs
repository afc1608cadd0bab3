//! A program's descriptor numbers beside iopath's threads: a thread of
//! iopath's that makes a descriptor holds the lowest free number for a
//! moment ([`iopath::sys::own_numbers`]) before it moves it high; a
//! program's `open` at that moment must still end on the number it would
//! have had ([`iopath::sys::taking_lowest`]). Its own test binary: no other
//! test's thread opens files meanwhile, so the lowest free number is known.

use iopath::sys::{own_numbers, taking_lowest};
use std::sync::mpsc;
use std::time::Duration;

fn open_null() -> libc::c_int {
    // SAFETY: a NUL-terminated path.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) }
}

fn close(fd: libc::c_int) {
    // SAFETY: closing a descriptor this test opened.
    unsafe { libc::close(fd) };
}

fn cloexec(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFD only asks.
    unsafe { libc::fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
}

/// An iopath thread that, once told, makes a descriptor on the lowest free
/// number inside a section, says which, holds it `hold`, then moves it high.
fn iopath_thread(hold: Duration) -> (mpsc::Sender<()>, mpsc::Receiver<libc::c_int>, std::thread::JoinHandle<()>) {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        let high = own_numbers(|| {
            let low = open_null();
            held_tx.send(low).unwrap();
            std::thread::sleep(hold);
            // SAFETY: copies this thread's own descriptor high, then closes the low one.
            let high = unsafe { libc::fcntl(low, libc::F_DUPFD_CLOEXEC, 1000) };
            close(low);
            high
        });
        close(high);
    });
    (go_tx, held_rx, thread)
}

#[test]
fn a_programs_open_ends_on_the_number_an_iopath_thread_held_for_a_moment() {
    // The fixture shows the race: a plain open meanwhile gets a higher number.
    let (go, held, thread) = iopath_thread(Duration::from_millis(100));
    go.send(()).unwrap();
    let low = held.recv().unwrap();
    let plain = open_null();
    thread.join().unwrap();
    assert!(plain > low, "a plain open got {plain} while iopath held {low}");
    close(plain);

    // A section already running as the call starts: the call waits for it.
    let (go, held, thread) = iopath_thread(Duration::from_millis(100));
    go.send(()).unwrap();
    let low = held.recv().unwrap();
    let fd = taking_lowest(open_null, false);
    thread.join().unwrap();
    assert_eq!(fd, low, "the program's open while a section ran");
    assert!(!cloexec(fd), "no close-on-exec asked for");
    close(fd);

    // A section that starts while the call runs: the descriptor moves down
    // after it, keeping the close-on-exec flag the call asked for.
    for asked in [false, true] {
        let (go, held, thread) = iopath_thread(Duration::from_millis(50));
        let mut low = -1;
        let fd = taking_lowest(
            || {
                go.send(()).unwrap();
                low = held.recv().unwrap();
                // SAFETY: a NUL-terminated path.
                unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | if asked { libc::O_CLOEXEC } else { 0 }) }
            },
            asked,
        );
        thread.join().unwrap();
        assert_eq!(fd, low, "the program's open beside a section (cloexec {asked})");
        assert_eq!(cloexec(fd), asked);
        close(fd);
    }
    // Nothing was left open on the way: the lowest free number is the first one's again.
    let again = open_null();
    assert_eq!(again, low);
    close(again);
}
