//! Page frames kept in /dev/shm from one process to the next
//! (`iopath::frames`): which process takes which file, and that a forked
//! child never writes its parent's frames.
//!
//! The frame source is process-wide, so each case runs in a process of its
//! own: this test binary started again with `FRAMES_CASE` naming the case.

use iopath::IoBuf;
use std::path::{Path, PathBuf};
use std::process::Command;

const BOUND: usize = 16 << 20;

/// Blocks enough to use up the pool and take new memory (more than a piece).
fn take_blocks(n: usize) -> Vec<IoBuf> {
    (0..n).map(|_| IoBuf::new(4096)).collect()
}

/// The address ranges of this process's mappings of `file`.
fn mapped_ranges(file: &Path) -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.ends_with(file.to_str().unwrap()))
        .map(|l| {
            let range = l.split(' ').next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap())
        })
        .collect()
}

fn inside(ranges: &[(usize, usize)], buf: &IoBuf) -> bool {
    let p = buf.as_ptr() as usize;
    ranges.iter().any(|&(a, b)| p >= a && p < b)
}

/// Runs `case` in a new process of this test binary, frames in `dir`; returns its stdout.
fn run_case(case: &str, dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "case_runner", "--nocapture", "--test-threads=1"])
        .env("FRAMES_CASE", case)
        .env("FRAMES_DIR", dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "case {case} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The value after `key` on the line that has it (the test harness may have
/// printed on that line before it).
fn said<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.split_once(key).map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
        .trim()
}

/// Not a test of its own: the body of a case when started by `run_case`.
#[test]
fn case_runner() {
    let (Ok(case), Ok(dir)) = (std::env::var("FRAMES_CASE"), std::env::var("FRAMES_DIR")) else { return };
    let dir = PathBuf::from(dir);
    iopath::frames::enable(&dir, BOUND);
    match case.as_str() {
        // Takes frames, fills them, says which file they came from.
        "take" => {
            let mut blocks = take_blocks(2048);
            let file = iopath::frames::claimed().expect("a frame file claimed");
            let ranges = mapped_ranges(&file);
            let from_file = blocks.iter().filter(|b| inside(&ranges, b)).count();
            assert!(from_file >= 512, "{from_file} of 2048 blocks from {}", file.display());
            for b in &mut blocks {
                b.fill(0x5a);
            }
            println!("file: {}", file.display());
            println!("held: {}", iopath::frames::held());
        }
        // Buffers larger than a block: cut from the frame file (a process after
        // "take" finds 0x5a there), zeros when asked for new ones, and given back
        // to the pool, never freed, when dropped.
        "large" => {
            let file = {
                let _b = IoBuf::new(4096);
                iopath::frames::claimed().expect("a frame file claimed")
            };
            let held = iopath::frames::held();
            let bufs: Vec<IoBuf> = (0..8).map(|_| IoBuf::new(64 << 10)).collect();
            let ranges = mapped_ranges(&file);
            assert!(bufs.iter().all(|b| inside(&ranges, b)), "from the frame file");
            assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 0)), "zeros");
            assert_eq!(iopath::frames::held(), held + (2 << 20), "one piece cut into 32");
            let addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
            drop(bufs);
            let again: Vec<IoBuf> = (0..8).map(|_| IoBuf::for_overwrite(64 << 10)).collect();
            assert!(again.iter().all(|b| addrs.contains(&(b.as_ptr() as usize))), "the same buffers, pooled");
            assert_eq!(iopath::frames::held(), held + (2 << 20));
            println!("file: {}", file.display());
        }
        // Holds its frame file until told to go (its stdin closes); "aside": after
        // moving it out of the way of a close of its number (as the interposer's
        // close does) and that close; "give-up": after giving it up and closing it.
        "hold" | "aside" | "give-up" => {
            let _blocks = take_blocks(1024);
            let file = iopath::frames::claimed().expect("a frame file claimed");
            let fd = iopath::frames::own_fd().expect("its descriptor");
            match case.as_str() {
                "aside" => assert!(iopath::frames::step_aside(fd, fd as libc::c_uint)),
                "give-up" => iopath::frames::give_up(),
                _ => {}
            }
            if case != "hold" {
                assert_ne!(iopath::frames::own_fd(), Some(fd), "{case}");
                // SAFETY: the number the program closes; the file is elsewhere now (or given up).
                unsafe { libc::close(fd) };
            }
            println!("file: {}", file.display());
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        // A block of the file, written by a forked child: the parent's stays as it was.
        "fork" => {
            let mut blocks = take_blocks(1024);
            let file = iopath::frames::claimed().expect("a frame file claimed");
            let ranges = mapped_ranges(&file);
            let shared = blocks.iter_mut().find(|b| inside(&ranges, b)).expect("a block from the frame file");
            shared.fill(1);
            // SAFETY: the child only writes memory and leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                shared.fill(2);
                // New blocks in the child: not from the parent's file, which it does
                // not hold (it takes a file of its own).
                let fresh = take_blocks(1024);
                let parents = fresh.iter().filter(|b| inside(&ranges, b)).count();
                let code = if !shared.iter().all(|&x| x == 2) {
                    99
                } else if iopath::frames::claimed().is_some_and(|f| f == file) {
                    98
                } else {
                    parents as i32 % 256
                };
                // SAFETY: leaves the child at once, running nothing of the parent's.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status));
            println!("child: {}", libc::WEXITSTATUS(status));
            assert!(shared.iter().all(|&x| x == 1), "the child's write reached the parent's frame");
            println!("parent: intact");
        }
        // Forks a child that outlives this process (it waits for its stdin to
        // close), then leaves: the frame file must be free for the next process.
        "fork-and-leave" => {
            let _blocks = take_blocks(1024);
            let file = iopath::frames::claimed().expect("a frame file claimed");
            // SAFETY: the child only reads its stdin and leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // Said once fork has returned here, so after the library's handler for a
                // forked child has let go of the parent's file: the test waits for it.
                let line = b"released\n";
                // SAFETY: writes a buffer of ours to standard output.
                unsafe { libc::write(1, line.as_ptr().cast(), line.len()) };
                let mut byte = 0u8;
                // SAFETY: reads into a byte of ours until the test closes the pipe.
                while unsafe { libc::read(0, (&raw mut byte).cast(), 1) } > 0 {}
                // SAFETY: leaves the child at once, running nothing of the parent's.
                unsafe { libc::_exit(0) };
            }
            println!("file: {}", file.display());
            println!("child: {pid}");
        }
        other => panic!("unknown case {other}"),
    }
}

#[test]
fn the_next_process_takes_the_frame_file_the_last_one_left() {
    let dir = tempfile::tempdir().unwrap();
    let first = run_case("take", dir.path());
    let file = PathBuf::from(said(&first, "file:"));
    assert!(file.starts_with(dir.path()) && file.file_name().unwrap().to_str().unwrap().ends_with("-0"), "{first}");
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size >= 2 << 20 && size <= BOUND as u64, "{size}");
    // The same file again, no larger: its pages are taken again, not new ones.
    let second = run_case("take", dir.path());
    assert_eq!(said(&second, "file:"), file.to_str().unwrap());
    assert_eq!(std::fs::metadata(&file).unwrap().len(), size);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn buffers_larger_than_a_block_come_from_the_frame_file_and_stay_in_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    run_case("take", dir.path());
    run_case("large", dir.path());
}

/// Starts `case` (a holder) in a process of its own; returns it and the file it holds.
fn start_holder(case: &str, dir: &Path) -> (std::process::Child, String) {
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "case_runner", "--nocapture", "--test-threads=1"])
        .env("FRAMES_CASE", case)
        .env("FRAMES_DIR", dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let held = holder.stdout.take().and_then(|stdout| {
        let mut out = std::io::BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if std::io::BufRead::read_line(&mut out, &mut line).ok()? == 0 {
                return None;
            }
            if line.contains("file:") {
                // The rest of its output read to the end, so its last lines find a reader.
                std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
                return Some(said(&line, "file:").to_string());
            }
        }
    });
    match held {
        Some(held) => (holder, held),
        None => {
            let _ = holder.kill();
            let status = holder.wait();
            panic!("the holder ended early: {status:?}");
        }
    }
}

fn stop_holder(mut holder: std::process::Child) {
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// Starts holder `case`, then another process that takes frames: it must
/// take another file than the one the holder holds. Stops the holder.
fn another_process_takes_another_file(case: &str, dir: &Path) -> String {
    let (holder, held) = start_holder(case, dir);
    let other = run_case("take", dir);
    assert_ne!(said(&other, "file:"), held, "{case}: a file another process holds is not taken");
    stop_holder(holder);
    held
}

/// A burst of processes running at once left a frame file each, kept for
/// good (seven of up to 33 MiB after a day of tests); a claim now removes
/// the unheld ones two past its own, so a burst leaves two spares behind.
#[test]
fn a_claim_removes_the_unheld_frame_files_a_burst_left_beyond_two_spares() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for n in 0..8 {
        let f = std::fs::File::create(dir.path().join(format!("iopath-frames-{uid}-{n}"))).unwrap();
        f.set_len(2 << 20).unwrap();
    }
    let (holder, held) = start_holder("hold", dir.path());
    assert!(held.ends_with("-0"), "{held}");
    let mut left: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, (0..3).map(|n| format!("iopath-frames-{uid}-{n}")).collect::<Vec<_>>());
    // The claim beside a holder takes the next file and keeps two past it.
    let other = run_case("take", dir.path());
    assert!(said(&other, "file:").ends_with("-1"), "{other}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    stop_holder(holder);
}

#[test]
fn processes_running_at_once_take_different_files() {
    let dir = tempfile::tempdir().unwrap();
    let held = another_process_takes_another_file("hold", dir.path());
    // Let go: the next one takes the first file again.
    assert_eq!(said(&run_case("take", dir.path()), "file:"), held);
}

/// A program that closes the frame file's number (a loop over every
/// descriptor, `dup2` onto it) must not let go of its lock: another process
/// would map the same pages. Moved aside first, the file stays held; where
/// it cannot be moved, its name goes, and the next claim makes a new file.
#[test]
fn a_closed_frame_file_number_never_lets_another_process_share_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    another_process_takes_another_file("aside", dir.path());

    let dir = tempfile::tempdir().unwrap();
    let (holder, held) = start_holder("give-up", dir.path());
    assert!(!Path::new(&held).exists(), "its name is gone");
    let other = run_case("take", dir.path());
    assert_eq!(said(&other, "file:"), held, "the name is free again: a new file under it");
    assert!(std::fs::metadata(&held).unwrap().len() <= BOUND as u64);
    stop_holder(holder);
}

#[test]
fn a_forked_child_never_writes_its_parents_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_case("fork", dir.path());
    assert_eq!(said(&out, "child:"), "0", "the child wrote its copy and took no block of the parent's file:\n{out}");
    assert_eq!(said(&out, "parent:"), "intact");
}

/// A forked child that outlives its parent (a shell's background job, a
/// daemon) must not keep the parent's frame file locked: its private view
/// of the frames is mapped from an open file of its own, not from the
/// parent's locked one, whose lock a mapping of it would keep.
#[test]
fn a_child_outliving_its_parent_leaves_the_frame_file_to_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut parent = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "case_runner", "--nocapture", "--test-threads=1"])
        .env("FRAMES_CASE", "fork-and-leave")
        .env("FRAMES_DIR", dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child_stdin = parent.stdin.take();
    // Up to the parent's line naming the child and the child's own, said after the
    // library's fork handler ran in it (not to the end: the child holds the pipe
    // too). Waiting for the parent's line alone let the next process come first under
    // load, while the child still held its inherited copy of the locked file (CI on
    // 15d7716: the next process took iopath-frames-0-1).
    let mut stdout = std::io::BufReader::new(parent.stdout.take().unwrap());
    let mut out = String::new();
    while !(out.contains("child:") && out.contains("released")) {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() == 0 {
            break;
        }
        out.push_str(&line);
    }
    assert!(parent.wait().unwrap().success(), "{out}");
    let held = said(&out, "file:").to_string();
    let child: i32 = said(&out, "child:").parse().unwrap();
    // SAFETY: asks whether the child is alive (signal 0 sends nothing).
    assert_eq!(unsafe { libc::kill(child, 0) }, 0, "the child outlives its parent");
    let next = run_case("take", dir.path());
    drop(child_stdin);
    assert_eq!(said(&next, "file:"), held, "the next process takes the file the parent left");
}

/// A tool that ran programs under the interposer gives back the frame files
/// no process holds; one a process holds stays.
#[test]
fn remove_unheld_leaves_a_held_frame_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, held) = start_holder("hold", dir.path());
    let left = PathBuf::from(said(&run_case("take", dir.path()), "file:"));
    assert_ne!(left.to_str().unwrap(), held);
    assert!(iopath::frames::remove_unheld(dir.path()) >= 2 << 20);
    assert!(!left.exists(), "the file no process holds is gone");
    assert!(Path::new(&held).exists(), "the held one stays");
    stop_holder(holder);
}
