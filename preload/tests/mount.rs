//! Programs on iopath files: `tests/c/mount_test.c` runs in a directory of
//! the kernel's file system, then with `LD_PRELOAD` and `IOPATH_MOUNT`
//! serving that directory from an iopath image; every check must pass
//! both ways, the host directory must stay empty, and the image must be
//! clean (fsck) with the program's files in it.

mod common;

use common::{compile, engine, formatted_image, preload_library};
use iopath::fs::{FileSystem, check};
use std::path::Path;
use std::process::Command;

fn run(program: &Path, dir: &Path, mode: &str, env: &[(&str, String)]) -> (String, String) {
    let out = Command::new(program).arg(dir).arg(mode).envs(env.iter().map(|(k, v)| (k, v))).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && stdout.contains(" passed, 0 failed"), "{mode}:\n{stdout}{stderr}");
    (stdout, stderr)
}

#[test]
fn a_program_sees_posix_semantics_on_an_iopath_mount_as_on_the_kernels_file_system() {
    let program = compile("mount_test", &[]);
    let scratch = tempfile::tempdir().unwrap();
    let kernel_dir = scratch.path().join("kernel");
    std::fs::create_dir(&kernel_dir).unwrap();
    run(&program, &kernel_dir, "kernel", &[]);

    let (image, mount_dir) = formatted_image(scratch.path());
    let (_, stderr) = run(
        &program,
        &mount_dir,
        "iopath",
        &[
            ("LD_PRELOAD", preload_library().display().to_string()),
            ("IOPATH_MOUNT", format!("{}={}", mount_dir.display(), image.display())),
            ("IOPATH_LOG", "1".into()),
        ],
    );
    assert!(stderr.contains("mounted "), "{stderr}");
    assert!(stderr.contains("a forked child cannot use its parent's iopath mount"), "{stderr}");
    assert!(stderr.contains("shared writable map of "), "{stderr}");
    assert_eq!(std::fs::read_dir(&mount_dir).unwrap().count(), 0, "nothing reached the host directory");

    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean() && report.replayed == 0, "{report:?}");
    let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
    let names: Vec<String> =
        fs.read_dir("/").unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    assert_eq!(names, ["c", "d", "forked", "lock", "other"]);
    let mut a = [0u8; 1];
    assert_eq!(fs.open("d").unwrap().read_at(&mut a, 0).unwrap(), 1);
    assert_eq!(&a, b"A");
    let _ = std::fs::remove_file(program);
}

/// A forked child of a process that holds a mount is told once that it
/// cannot use the mount, when it tries to; a child that only makes and
/// lists files of the kernel's (a subshell's redirection) is told nothing.
#[test]
fn a_forked_child_using_only_kernel_files_is_not_warned() {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let outside = scratch.path().join("outside");
    let script = format!(
        "exec 3> {m}/held; ( : > {o}; ls {s} > /dev/null ); exec 3>&-; test -e {o}",
        m = mount_dir.display(),
        o = outside.display(),
        s = scratch.path().display()
    );
    let mut command = Command::new("sh");
    command.arg("-c").arg(&script);
    common::mounted(&mut command, &mount_dir, &image);
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("forked child"), "{stderr}");
}

/// With `IOPATH_LOG`, a process says at exit what its mount did, even when it
/// closed its stderr on the way (GNU programs do, in their atexit handler).
#[test]
fn the_exit_summary_reaches_stderr_even_after_the_program_closed_it() {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let script = format!("echo hello > {}/greeting && exec 2>&- && echo done", mount_dir.display());
    let mut command = Command::new("sh");
    command.arg("-c").arg(&script).env("IOPATH_LOG", "1");
    common::mounted(&mut command, &mount_dir, &image);
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout == "done\n", "{stdout}{stderr}");
    let summary = stderr.lines().find(|l| l.contains(" commits (") && l.contains("device ")).unwrap_or_default();
    assert!(summary.contains("1 pages written back"), "{stderr}");
    let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
    let mut back = [0u8; 6];
    assert_eq!(fs.open("greeting").unwrap().read_at(&mut back, 0).unwrap(), 6);
    assert_eq!(&back, b"hello\n");
}

/// A process leaves its clean pages in the mount's carried cache at exit, and
/// the next process that mounts the device reads them from there instead of
/// the device (`iopath::fs::carry`); with `IOPATH_CARRY=0` it reads the device.
#[test]
fn the_next_process_reads_what_the_last_one_left_in_the_carried_cache() {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let numbers = mount_dir.join("numbers");
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    let run = |program: &str, args: &[&str], carry: &str| {
        let mut command = Command::new(program);
        command.args(args).env("IOPATH_LOG", "1").env("IOPATH_CARRY", carry);
        common::mounted(&mut command, &mount_dir, &image);
        let out = command.output().unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(out.status.success(), "{stdout}{stderr}");
        (stdout, stderr)
    };
    let carried_reads = |stderr: &str| -> u64 {
        let (before, _) = stderr
            .lines()
            .find_map(|l| l.split_once(" blocks read from the carried cache"))
            .unwrap_or_else(|| panic!("{stderr}"));
        let count = before.rsplit(' ').next().unwrap_or_default();
        count.parse().unwrap_or_else(|_| panic!("{stderr}"))
    };
    let source = scratch.path().join("numbers");
    std::fs::write(&source, &expected).unwrap();
    run("cp", &[source.to_str().unwrap(), numbers.to_str().unwrap()], "64m");
    let (stdout, stderr) = run("cat", &[numbers.to_str().unwrap()], "64m");
    assert_eq!(stdout, expected);
    assert!(stderr.contains("blocks in its carried cache"), "{stderr}");
    assert!(carried_reads(&stderr) >= 26, "all 27 blocks of the file but the last, at least: {stderr}");
    let (stdout, stderr) = run("cat", &[numbers.to_str().unwrap()], "0");
    assert_eq!(stdout, expected);
    assert_eq!(carried_reads(&stderr), 0, "{stderr}");
    let report = iopath::fs::check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A scratch directory holding an empty kernel directory, a mount
/// directory and its formatted image: (scratch, kernel dir, mount dir, image).
fn kernel_dir_and_mount() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let scratch = tempfile::tempdir().unwrap();
    let kernel_dir = scratch.path().join("kernel");
    std::fs::create_dir(&kernel_dir).unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    (scratch, kernel_dir, mount_dir, image)
}

/// `bash -c script` with `D` set to `dir`, served from `image` when given
/// (`dir` is then its mount); killed and failed after 120 s.
fn bash_in(script: &str, dir: &Path, image: Option<&Path>) -> std::process::Output {
    let mut command = Command::new("bash");
    command.arg("-c").arg(script).env("D", dir);
    if let Some(image) = image {
        common::mounted(&mut command, dir, image);
    }
    common::output_within(&mut command, std::time::Duration::from_secs(120))
}

/// Runs `script` in a kernel directory and on a mount, each to success with
/// nothing on stderr: the standard output of each (kernel's first), and the
/// scratch directory, the kernel directory and the image.
fn on_both(script: &str) -> ([String; 2], tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let stdout = [(&kernel_dir, false), (&mount_dir, true)].map(|(dir, mount)| {
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.is_empty(), "{}: {stderr}", dir.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    (stdout, scratch, kernel_dir, image)
}

/// The standard output of `script` run on a mount only (for what the
/// kernel's file system has no counterpart of), which must succeed with
/// nothing on stderr.
fn on_mount(script: &str) -> String {
    let (_scratch, _kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let out = bash_in(script, &mount_dir, Some(&image));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `image` passes fsck, and each of `names` in it holds what the file of
/// that name in `kernel_dir` holds, byte for byte.
fn same_files_in_image(image: &Path, kernel_dir: &Path, names: &[&str]) {
    let report = check::check(engine(image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let (fs, _) = FileSystem::mount(engine(image)).unwrap();
    for name in names {
        let expected = std::fs::read(kernel_dir.join(name)).unwrap();
        let file = fs.open(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut got = vec![0u8; file.len() as usize];
        assert_eq!(file.read_at(&mut got, 0).unwrap(), got.len());
        let differs = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(got.len().min(expected.len()));
        assert!(
            got == expected,
            "{name}: {} bytes against {}, first difference at {differs}: {:?}",
            got.len(),
            expected.len(),
            String::from_utf8_lossy(&got[differs.min(got.len())..got.len().min(differs + 80)])
        );
    }
}

/// A program's low descriptor numbers are its own: a shell's `exec 3> f`
/// replaces whatever is on 3, and the mount's io_uring descriptor, which
/// the kernel had put on the lowest free number, was there (every later
/// call on the mount then waited for ever).
#[test]
fn a_programs_low_descriptor_numbers_never_reach_iopaths_own() {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let script = "exec 3> \"$D/a\"; echo one >&3; exec 4> \"$D/b\" 5>&3; echo two >&4; echo three >&5; \
                  exec 3>&- 4>&- 5>&-; cat \"$D/a\" \"$D/b\"";
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).env("D", &mount_dir);
    common::mounted(&mut command, &mount_dir, &image);
    let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout == "one\nthree\ntwo\n", "{stdout}{stderr}");
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A shell's redirections to and from mounted files (`bridge/`): programs
/// that write their standard output through stdio, read their standard
/// input, share one file on 1 and 2, append, hand the streams on through
/// further execs, and a failed exec that leaves the shell writing; the same
/// script on a kernel directory and on a mount leaves the same files, byte
/// for byte. `exec 3>` also checks that the program's low descriptor
/// numbers do not reach iopath's own (its io_uring descriptor was on 3).
#[test]
fn a_shells_redirections_to_and_from_mounted_files_work_as_on_the_kernels() {
    let script = r#"set -e
        seq 1 50000 > "$D/numbers"
        wc -l < "$D/numbers" > "$D/count"
        echo appended >> "$D/numbers"
        ( echo sub; ls -d / ) > "$D/both" 2>&1
        sort -r -o "$D/sorted" "$D/numbers"
        while read -r l; do echo "[$l]"; done < "$D/both" > "$D/bracketed"
        exec 3> "$D/three"; echo three >&3; exec 3>&-
        nice env sh -c 'cat; echo tail' < "$D/numbers" > "$D/copy"
        gzip -nc < "$D/numbers" > "$D/numbers.gz"; gunzip -c < "$D/numbers.gz" > "$D/unzipped"
        head -c 10 < "$D/numbers" > "$D/head"
        ( exec 4>&1; nice sh -c 'echo one; echo four >&4' ) > "$D/duplicated"
        ls "$D" > "$D/names"
        set +e; shopt -s execfail; exec > "$D/failed"; echo before; exec /nonexistent/program; echo after"#;
    let names = [
        "both",
        "bracketed",
        "copy",
        "count",
        "duplicated",
        "failed",
        "head",
        "names",
        "numbers",
        "numbers.gz",
        "sorted",
        "three",
        "unzipped",
    ];
    let (_scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let run = |dir: &Path, mount: bool| {
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{}: {stderr}", dir.display());
        stderr
    };
    let kernel_stderr = run(&kernel_dir, false);
    let mount_stderr = run(&mount_dir, true);
    assert_eq!(mount_stderr, kernel_stderr);
    assert_eq!(std::fs::read_dir(&mount_dir).unwrap().count(), 0, "nothing reached the host directory");

    same_files_in_image(&image, &kernel_dir, &names);
    assert_eq!(std::fs::read_to_string(kernel_dir.join("failed")).unwrap(), "before\nafter\n");
    assert_eq!(std::fs::read_to_string(kernel_dir.join("copy")).unwrap().lines().last(), Some("tail"));
}

/// A shell that redirects while a thread of the interposer mounts keeps
/// its descriptors. dash's `echo four >&4` is `close(1)` then `dup2(4,
/// 1)`; the thread of the new program's interposer that mounted meanwhile
/// (its standard output is a handed-over bridge) opened its files at the
/// lowest free number, 1, for a moment, and moved them up by closing 1:
/// dash's new standard output then. `echo: I/O error` or `4: Device or
/// resource busy` in 1 run of 10 (the interposer before failed 2 to 10 of
/// these 40).
#[test]
fn a_shell_redirecting_while_the_interposer_mounts_keeps_its_descriptors() {
    let script = r#"for i in $(seq 1 40); do
            ( exec 4>&1; nice sh -c 'echo one; echo four >&4' ) > "$D/dup"; cat "$D/dup"
        done"#;
    assert_eq!(on_mount(script), "one\nfour\n".repeat(40));
}

/// A pipeline whose last command writes a mounted file and whose first
/// reads one works whichever starts first: the last one's standard output
/// is a bridge that has its file open, and when the first waits for the
/// mount, its lender lets the bridge go as before a fork (what arrives is
/// held in memory) and gives the mount back. Before, `{ sleep; cat in; } |
/// sort | head > out` waited `IOPATH_MOUNT_WAIT` and cat failed (EBUSY);
/// without the sleep, one run in two to five.
#[test]
fn a_pipeline_reading_and_writing_the_mount_at_both_ends_runs() {
    let script = r#"set -e
        cd "$D"; seq 1 10000 > in
        { sleep 0.2; cat in; } | sort -rn | head -3 > top
        cat top
        { sleep 0.2; cat in; } | tail -2 >> top
        cat top"#;
    let (stdout, _scratch, _kernel_dir, _image) = on_both(script);
    assert_eq!(stdout[0], "10000\n9999\n9998\n10000\n9999\n9998\n9999\n10000\n");
    assert_eq!(stdout[1], stdout[0]);
}

/// A named pipe in a mount is one: `mkfifo` makes a FIFO that `stat`, `ls`
/// and `test -p` see; a reader and a writer in two processes meet there
/// (the reader waiting for the writer, as on the kernel's), also while the
/// writer has a mounted file open; an open for writing without a reader
/// that must not wait fails with ENXIO; the FIFO moves, takes a hard link
/// and goes as a file does; `mknod NAME p` makes one too, and `touch -d`
/// sets its time (no reader: its open fails, its utimensat not). The same output
/// as on the kernel's file system, and the FIFO left is one in the image.
#[test]
fn a_fifo_made_in_a_mount_carries_bytes_between_processes() {
    let script = r#"set -e
        cd "$D"; umask 022
        mkfifo p; [ -p p ] && echo is-a-fifo
        stat -c '%F %s %a %h' p; ls -l p | cut -c1-10
        { sleep 0.3; echo through the fifo; } > p & cat p; wait
        seq 1 20000 > in
        cat p | sort -rn | head -2 & sleep 0.3; cat in > p; wait
        dd if=/dev/null of=p oflag=nonblock conv=notrunc 2>&1 | head -1
        mv p q; ln q q2; stat -c '%F %h' q2; rm q2
        mknod r p; mknod f c 1 3 2>/dev/null || true; rm -f f
        touch -d @1700000000 r; stat -c '%F %s %Y' r; ls"#;
    let (stdout, _scratch, _kernel_dir, image) = on_both(script);
    assert_eq!(
        stdout[0],
        "is-a-fifo\nfifo 0 644 1\nprw-r--r--\nthrough the fifo\n20000\n19999\n\
         dd: failed to open 'p': No such device or address\nfifo 2\nfifo 0 1700000000\nin\nq\nr\n"
    );
    assert_eq!(stdout[1], stdout[0]);
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
    assert_eq!(fs.symlink_metadata("q").unwrap().kind, iopath::fs::Kind::Fifo);
    assert_eq!(fs.symlink_metadata("r").unwrap().mtime_ns, 1_700_000_000 * 1_000_000_000);
    assert_eq!(fs.open("q").unwrap_err().errno(), Some(libc::ENXIO));
}

/// A library stored on a mount is loaded by `dlopen` as from the kernel's
/// file system (`posix/libraries.rs`): by an absolute path, relative to a
/// working directory inside the mount, through `..`; twice the same
/// handle, also after it was rebuilt in place (the loader's answer for the
/// same file); closed and rebuilt, the new one; a missing one fails with
/// the kernel's message; and a bare name is still searched in the calling program's
/// `DT_RUNPATH` (the interposer's entry point keeps the caller's return
/// address). rustc's proc macros in a target directory on a mount failed
/// to load ("can't find crate"), as Python's extension modules there would.
#[test]
fn a_library_stored_on_a_mount_is_loaded_by_dlopen_as_from_the_kernels() {
    let script = r#"set -e
        cd "$D"; K=$(mktemp -d); trap 'rm -rf "$K"' EXIT
        echo 'int answer(void) { return 42; }' > lib.c; gcc -shared -fPIC -o lib.so lib.c
        echo 'int answer(void) { return 7; }' > "$K/k.c"; gcc -shared -fPIC -o "$K/libk.so" "$K/k.c"
        cat > main.c <<'END'
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    void *opened[64];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '!') { fflush(stdout); if (system(argv[i] + 1) != 0) return 1; continue; }
        if (argv[i][0] == '-') { while (n > 0) dlclose(opened[--n]); continue; }
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h) { printf("%d: %s\n", i, dlerror()); continue; }
        int (*answer)(void) = (int (*)(void))dlsym(h, "answer");
        printf("%d: %d%s\n", i, answer(), n > 0 && h == opened[0] ? " (same handle)" : "");
        opened[n++] = h;
    }
    return 0;
}
END
        gcc -o main main.c -Wl,-rpath,"$K"
        mkdir sub
        ./main "$D/lib.so" ./lib.so sub/../lib.so ./nope.so libk.so \
            '!echo "int answer(void) { return 43; }" > lib.c && gcc -shared -fPIC -o lib.so lib.c' ./lib.so \
            - '!echo "int answer(void) { return 44; }" > lib.c && gcc -shared -fPIC -o lib.so lib.c' ./lib.so
        cd sub; ../main ../lib.so"#;
    let (stdout, _scratch, _kernel_dir, image) = on_both(script);
    assert_eq!(
        stdout[0],
        "1: 42\n2: 42 (same handle)\n3: 42 (same handle)\n\
         4: ./nope.so: cannot open shared object file: No such file or directory\n5: 7\n7: 42 (same handle)\n\
         10: 44\n1: 44\n"
    );
    assert_eq!(stdout[1], stdout[0]);
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// Two processes that work on the mount file by file, each with a file
/// open there in turn, as `rsync -a` between two directories of a mount
/// does: the receiver (which closed its standard output) creates each temp
/// file on descriptor 1, so each is a bridge, waits on a pipe for the
/// sender's bytes, writes them, closes and renames; the sender opens each
/// source file, reads it and sends it. Every file arrives whole. Before,
/// the receiver's lender let its bridges go once per stretch of the
/// sender's nudges, so from the second file on the sender waited out
/// `IOPATH_MOUNT_WAIT` (rsync failed every time); letting them go at every
/// nudge then lost a file's bytes when the receiver's close came while its
/// bridge was let go (the close found no bridge, returned, and the rename
/// went first).
#[test]
fn a_sender_and_a_receiver_taking_turns_file_by_file_lose_nothing() {
    let script = sender_and_receiver(
        100,
        false,
        r#"
        while data:
            data = data[os.write(fd, data):]"#,
    );
    let (stdout, _scratch, _kernel_dir, _image) = on_both(&script);
    assert_eq!(stdout[0], "same\n100\n");
    assert_eq!(stdout[1], stdout[0]);
}

/// A Python sender and receiver taking turns file by file, as rsync's do:
/// the parent sends `files` files of `src` down a pipe (stat-ing `dst`
/// before each, as rsync's generator does, when `stat_first`); the child,
/// its standard output closed, opens each temp file (which lands on
/// descriptor 1), writes `data` into `fd` with `write_file` (Python lines
/// indented by 8), closes and renames it. The script prints "same" if
/// `dst` matches `src`, then how many files it holds.
fn sender_and_receiver(files: usize, stat_first: bool, write_file: &str) -> String {
    let stat = if stat_first { "os.stat(\"dst\")" } else { "pass" };
    format!(
        r#"set -e
        cd "$D"; mkdir src dst
        for i in $(seq 1 {files}); do seq $i 7 $((i * 900)) > src/f$i; done
        python3 -c 'import os, sys
r, w = os.pipe()
if os.fork() == 0:
    os.close(w)
    os.close(1)
    pipe = os.fdopen(r, "rb")
    for i in range(1, {files} + 1):
        n = int.from_bytes(pipe.read(8), "little")
        data = pipe.read(n)
        fd = os.open("dst/.f%d.tmp" % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        assert fd == 1, fd{write_file}
        os.close(fd)
        os.rename("dst/.f%d.tmp" % i, "dst/f%d" % i)
    os._exit(0)
os.close(r)
for i in range(1, {files} + 1):
    with open("src/f%d" % i, "rb") as f:
        data = f.read()
    {stat}
    os.write(w, len(data).to_bytes(8, "little"))
    while data:
        data = data[os.write(w, data):]
os.close(w)
_, status = os.wait()
sys.exit(os.waitstatus_to_exitcode(status))'
        diff -r src dst && echo same
        ls dst | wc -l"#
    )
}

/// rsync's receiver with `--sparse`: its temp files land on descriptor 1
/// (it closed its standard output), it seeks over runs of zeros, truncates
/// the file to its size and may seek back, while its generator (here the
/// parent, stat-ing the directory before each file) borrows the mount
/// between its calls. Each borrow lets the receiver's bridge go, and it
/// comes back holding the bytes in memory: its seeks failed with ESPIPE
/// and its ftruncate, which found no bridge while it was let go, reached
/// the pipe and failed with EINVAL (`rsync -a --sparse /usr/share/doc`
/// into a mount failed at a random file, and its receiver then hung in
/// its exit). Now they wait for the bridge, which writes what it holds
/// and starts again where the seek says (`bridge/seek.rs`). A let-go
/// between a seek's finding the running bridge and moving its file's
/// position lost the seek: the next query said the file's end (1 run of
/// 8 of this suite; 16 of 16 with the window widened by 20 ms by hand).
#[test]
fn a_receiver_seeking_and_truncating_its_files_on_descriptor_1_loses_nothing() {
    let script = sender_and_receiver(
        60,
        true,
        r#"
        half = len(data) // 2
        os.write(fd, data[:half])
        os.lseek(fd, len(data) - half - 1, os.SEEK_CUR)
        os.write(fd, data[-1:])
        os.ftruncate(fd, len(data))
        assert os.lseek(fd, half, os.SEEK_SET) == half
        at = os.lseek(fd, 0, os.SEEK_CUR)
        assert at == half, (at, half)
        os.write(fd, data[half:])"#,
    );
    let (stdout, _scratch, _kernel_dir, _image) = on_both(&script);
    assert_eq!(stdout[0], "same\n60\n");
    assert_eq!(stdout[1], stdout[0]);
}

/// A program that unlinks the mounted file on its standard input (put
/// there by itself, or by the shell) and then starts another program
/// reads all of the file. Before, the bridge that fed it was let go before
/// the fork, could not find the file again ("the file was unlinked; the
/// next program cannot be given it") and the program read only what the
/// pipe held; now such a bridge keeps the mount, as an unlinked file open
/// on a descriptor does.
#[test]
fn a_program_that_unlinks_its_input_then_forks_still_reads_all_of_it() {
    let script = r#"set -e
        cd "$D"; seq 1 100000 > in
        python3 -c 'import os, subprocess, sys
fd = os.open("in", os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
os.unlink("in")
subprocess.run(["true"], check=True)
print(len(sys.stdin.buffer.read()))'
        seq 1 100000 > in
        python3 -c 'import os, subprocess, sys
os.unlink("in")
subprocess.run(["true"], check=True)
print(len(sys.stdin.buffer.read()))' < in"#;
    let (stdout, _scratch, _kernel_dir, _image) = on_both(script);
    assert_eq!(stdout[0], "588895\n588895\n");
    assert_eq!(stdout[1], stdout[0]);
}

/// A program that rebuilds a library on a mount and loads it again and
/// again does not keep a copy of every version in memory: a copy that a
/// newer one replaced is closed once the loader does not have it and its
/// grace period (5 s) has passed, so the newest and the one it replaced
/// last are left. (The "library" here is none: the loader refuses every
/// version, so none stays loaded.) Before, 11 versions kept 11 copies.
#[test]
fn a_library_rebuilt_and_loaded_again_and_again_keeps_two_copies_at_most() {
    let script = r#"set -e
        cd "$D"
        python3 -c 'import ctypes, os, time
def load(version):
    with open("plugin.so", "wb") as f:
        f.write(b"not a library" * (100 + version))
    try:
        ctypes.CDLL(os.path.abspath("plugin.so"))
    except OSError:
        pass
def copies():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink("/proc/self/fd/" + fd).startswith("/memfd:iopath-library")
        except OSError:
            pass
    return n
for version in range(10):
    load(version)
print(copies())
time.sleep(6)
load(10)
print(copies())'"#;
    assert_eq!(on_mount(script), "10\n2\n", "copies open after 10 versions, then after the grace period and one more");
}

/// A program that forks children, each of which needs the mount, while
/// another of its threads writes there every half millisecond
/// (`tests/c/fork_while_mounting.c`): every child gets the mount. Before,
/// the program's lender gave the mount to the waiting child and its thread
/// took it back before the child's next try, every time: children waited
/// `IOPATH_MOUNT_WAIT` and failed with EBUSY from the first fork on. (The
/// fork handler also takes every mount's state lock now: a fork while
/// another thread mounted left the child's mount stuck, EPERM, which cargo
/// running build scripts met in 2 of 3 builds; too rare to catch here.)
#[test]
fn a_program_forking_while_its_thread_uses_the_mount_lets_every_child_have_it() {
    let program = compile("fork_while_mounting", &["-lpthread"]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let mut command = Command::new(&program);
    command.arg(&mount_dir).arg("100").env("IOPATH_MOUNT_WAIT", "5000");
    common::mounted(&mut command, &mount_dir, &image);
    let out = common::output_within(&mut command, std::time::Duration::from_secs(300));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("200 passed, 0 failed"), "{stdout}{stderr}");
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let _ = std::fs::remove_file(program);
}

/// A program whose two threads call on a mount without pause (open, dup,
/// close, directory and stdio streams, stat, dlopen, and fsync of a pipe,
/// which looks in the table of bridges: its standard input is a mounted
/// file) while its main thread forks (`tests/c/fork_beside_calls.c`): every
/// child makes the same calls, reads a mounted file of its own on its
/// standard input, and none waits for a lock a worker held at the fork.
/// A child whose fork came while a worker held the bridges' table waited
/// for it for ever as it started its own bridge (5 runs in 10 hung a child
/// before the child took a new table, 0 in 60 after). It found a child's
/// lender waiting for ever on its parent's file system, whose file it
/// tried to put to sleep (in 1 of 3 runs of 300 forks); a child waiting for
/// the list of library copies (its dlopen) shows only where the workers
/// copy all the time, which costs too many descriptors for a test: by hand,
/// 3 runs of 3 hung before the fork held the interposer's locks, 0 after.
/// And a child's open after closing 0 ended on 11 (an iopath thread held
/// 0 for a moment) in 1 of 24 runs with three at once, before such an
/// open moved down to the number it would have had (0 of 30 after).
#[test]
fn a_child_forked_beside_threads_calling_on_the_mount_never_waits_for_their_locks() {
    let program = compile("fork_beside_calls", &["-lpthread", "-ldl"]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let mut command = Command::new(&program);
    command.arg(&mount_dir).arg("300");
    common::mounted(&mut command, &mount_dir, &image);
    let out = common::output_within(&mut command, std::time::Duration::from_secs(600));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("601 passed, 0 failed"), "{stdout}{stderr}");
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let _ = std::fs::remove_file(program);
}

/// Threads that fork at once while the process holds a mounted file open
/// (`tests/c/forks_at_once.c`, as cargo's job threads start rustc) make one
/// socket for their children's standard streams between them. Before, two
/// made one each and the second's bind failed ("cannot listen for
/// children's standard streams: Address already in use" in 13 of 20 runs);
/// a child forked meanwhile kept the first one's socket unrecorded.
#[test]
fn threads_forking_at_once_make_one_socket_for_their_children() {
    let program = compile("forks_at_once", &["-lpthread"]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    for _ in 0..5 {
        let mut command = Command::new(&program);
        command.arg(&mount_dir).env("IOPATH_LOG", "1");
        common::mounted(&mut command, &mount_dir, &image);
        let out = common::output_within(&mut command, std::time::Duration::from_secs(120));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout == "done\n", "{stdout}{stderr}");
        assert!(!stderr.contains("cannot listen"), "{stderr}");
    }
    let _ = std::fs::remove_file(program);
}

/// A program whose signal handler calls `_exit` while its main loop is in
/// the middle of a file call on a mount (rsync on Ctrl-C: every run of
/// `rsync -a /usr/share` into a mount interrupted so hung): the exit
/// commits the mounts on a thread of its own, which needed a lock the
/// interrupted call held, and the exit waited for it for ever. Now it
/// waits 2 s, says so, and the process ends with the handler's status;
/// the image is clean (what a kill leaves).
#[test]
fn an_exit_from_a_signal_handler_in_the_middle_of_a_file_call_ends_the_program() {
    let program = compile("exit_in_handler", &[]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let mut command = Command::new(&program);
    command.arg(&mount_dir);
    ends_with_the_handlers_status(&mut command, &mount_dir, &image);
    let _ = std::fs::remove_file(program);
}

/// Runs `command` (`tests/c/exit_in_handler.c`) on the mount: it ends, with
/// its handler's status, and leaves the image clean.
fn ends_with_the_handlers_status(command: &mut Command, mount_dir: &Path, image: &Path) {
    common::mounted(command, mount_dir, image);
    let out = common::output_within(command, std::time::Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let report = check::check(engine(image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// The same exit with the program's stdout on a mounted file (a bridge,
/// which has bytes to write as it ends), 5 times. The exiting thread now
/// allocates nothing and leaves the work to a helper thread started when
/// the process mounted: before, an exit whose handler had interrupted a
/// `malloc` inside a file call waited for ever on the allocator's lock in
/// the exit handler (by hand, 2 runs in 40 hung; 0 in 20 after).
#[test]
fn an_exit_from_a_signal_handler_with_stdout_on_the_mount_ends_the_program() {
    let program = compile("exit_in_handler", &[]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    for _ in 0..5 {
        let mut command = Command::new("sh");
        command.arg("-c").arg(r#"exec "$0" "$1" print > "$1/out""#).arg(&program).arg(&mount_dir);
        ends_with_the_handlers_status(&mut command, &mount_dir, &image);
    }
    let _ = std::fs::remove_file(program);
}

/// A signal handler that duplicates and closes the program's stdout (a
/// bridge to a mounted file) while the program does the same in a loop,
/// a timer firing every 100 us (`tests/c/handler_beside_bridges.c`): the
/// handler waits for the end of the interposer's section it interrupted
/// (the bridges' table, the lock on descriptor numbers), and runs 3000
/// times; and with `exit`, the `_exit` from it ends the program. Before,
/// the handler waited for ever on the lock its own thread held, in both
/// modes (3 runs of 3 hung in each); the exit was the test above's hang,
/// 1 run in about 450.
#[test]
fn a_handler_duplicating_a_bridged_stdout_beside_the_program_runs_and_exits() {
    let program = compile("handler_beside_bridges", &[]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    for (mode, status) in [("", 0), ("exit", 3)] {
        let mut command = Command::new("sh");
        command.arg("-c").arg(r#"exec "$0" $2 > "$1/out""#).arg(&program).arg(&mount_dir).arg(mode);
        common::mounted(&mut command, &mount_dir, &image);
        let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(status), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        let report = check::check(engine(&image)).unwrap();
        assert!(report.is_clean(), "{report:?}");
        if mode.is_empty() {
            let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
            let file = fs.open("out").unwrap();
            let mut bytes = vec![0u8; file.len() as usize];
            assert_eq!(file.read_at(&mut bytes, 0).unwrap(), bytes.len());
            let printed = String::from_utf8_lossy(&bytes);
            assert!(printed.starts_with("ok ") && printed.trim_end() != "ok 0", "printed {printed:?}");
        }
    }
    let _ = std::fs::remove_file(program);
}

/// A program that a signal kills (one it leaves at its default action:
/// Ctrl-C, `kill`, `timeout`) keeps what it wrote to the mount, as on a
/// kernel file system, whose page cache outlives the process: the library's
/// stand-in handler commits the mounts, then the signal ends the process
/// with its own status. A shell writing through a descriptor and through
/// its standard output (a bridge), and writer threads that the signal
/// finds in the middle of a write most often (each finishes it first),
/// also where the program's own handler, set with `signal()`, sets the
/// default back and raises the signal again. Before, every file was empty.
/// And where the program's handler ends the process with `_exit` (rsync's
/// does): it runs at the end of the write it interrupted, as the kernel runs
/// handlers at a system call's end, and the exit's commit finds no lock
/// held; before, it ran inside the write, the commit waited 2 s for the
/// write's lock and the files were empty.
#[test]
fn a_program_killed_by_a_signal_keeps_what_it_wrote_to_the_mount() {
    use std::os::unix::process::ExitStatusExt;
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let script = r#"exec 3> "$D/out"; printf hello >&3; exec > "$D/log"; echo line; kill -TERM $$; sleep 5"#;
    let out = bash_in(script, &mount_dir, Some(&image));
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{}", String::from_utf8_lossy(&out.stderr));
    let program = compile("killed_writers", &[]);
    let runs = [(libc::SIGTERM, ""), (libc::SIGINT, ""), (libc::SIGHUP, ""), (libc::SIGTERM, "reraise")];
    for (signal, mode) in runs.into_iter().chain([(libc::SIGALRM, "exit"); 3]) {
        let mut command = Command::new(&program);
        command.arg(&mount_dir).arg(signal.to_string());
        if !mode.is_empty() {
            command.arg(mode);
        }
        common::mounted(&mut command, &mount_dir, &image);
        // The program checks that it sees SIG_DFL (not the library's stand-in).
        common::with_default_actions(&mut command, &[libc::SIGINT, libc::SIGQUIT]);
        let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        // In "exit" mode: the records each thread had written when the handler ran.
        let mut at_least = [20; 4];
        if mode == "exit" {
            assert_eq!(out.status.code(), Some(3), "{stderr}");
            let counts: Vec<usize> =
                stderr.lines().next().unwrap_or("").split(' ').filter_map(|c| c.parse().ok()).collect();
            assert_eq!(counts.len(), 4, "{stderr}");
            for (least, count) in at_least.iter_mut().zip(counts) {
                *least = (*least).max(count);
            }
        } else {
            assert_eq!(out.status.signal(), Some(signal), "{stderr}");
        }
        let report = check::check(engine(&image)).unwrap();
        assert!(report.is_clean(), "{report:?}");
        let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
        let read = |name: &str| {
            let file = fs.open(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut bytes = vec![0u8; file.len() as usize];
            assert_eq!(file.read_at(&mut bytes, 0).unwrap(), bytes.len());
            bytes
        };
        assert_eq!(read("out"), b"hello");
        assert_eq!(read("note"), b"hello", "{signal} {mode}: the note is not there");
        assert_eq!(read("log"), b"line\n");
        for (n, least) in at_least.into_iter().enumerate() {
            let bytes = read(&format!("w{n}"));
            assert!(
                bytes.len() % 4096 == 0 && bytes.len() >= least * 4096,
                "w{n}: {} bytes, {least} records written",
                bytes.len()
            );
            for (i, record) in bytes.chunks(4096).enumerate() {
                let number = u64::from_ne_bytes(record[..8].try_into().unwrap());
                let fill = b'a' + (i % 26) as u8;
                assert!(number == i as u64 && record[8..].iter().all(|&b| b == fill), "w{n}: record {i} is wrong");
            }
        }
    }
    let _ = std::fs::remove_file(program);
}

/// A program's handlers of signals other than the ending ones (SIGCHLD,
/// SIGWINCH, a real-time signal sent with a value by `sigqueue`) that write
/// to the mount while its threads write there: each runs at the end of the
/// write it interrupted, with the `siginfo_t` the signal came with, and its
/// own write lands. Before, it ran inside the interrupted write, and 299 of
/// its 300 writes failed (the program's check: "DIR/handled holds 1
/// bytes"). The files are whole, fsck clean. `tests/c/handlers_on_mount.c`.
#[test]
fn a_programs_signal_handlers_write_to_the_mount_between_its_calls() {
    passes_on_mount("handlers_on_mount", &["-lpthread"], "9 passed, 0 failed", 2);
}

/// A program's pipes, sockets, socket pairs, accepted connections and
/// event, epoll, memfd, signalfd, timerfd and inotify descriptors take
/// the lowest free numbers while another of its threads keeps putting its
/// stdout on a mounted file and back (each time, a bridge's pipe is made
/// by the interposer, which holds a low number for a moment):
/// `tests/c/lowest_numbers.c`, 2 s of rounds. Before, every kind came a
/// number too high in 3 to 600 rounds of about 20,000; the first fix
/// (the calls wait for the interposer's own descriptors to move) left
/// pipes and socket pairs off in about 50 (the bridge's pipe left the
/// program's end low until it was placed).
#[test]
fn a_programs_pipes_and_sockets_take_the_lowest_numbers_beside_bridges_being_made() {
    passes_on_mount("lowest_numbers", &["-lpthread"], "10 passed, 0 failed", 1);
}

/// Compiles C test `tests/c/NAME.c` (with `flags`) and runs it `runs`
/// times with a fresh mount's directory as its argument, under the
/// interposer mounting its image there: each run must print `summary`
/// (its "N passed, M failed"), exit 0 within a minute, and leave the file
/// system clean.
fn passes_on_mount(name: &str, flags: &[&str], summary: &str, runs: usize) {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let program = compile(name, flags);
    for _ in 0..runs {
        let mut command = Command::new(&program);
        command.arg(&mount_dir);
        common::mounted(&mut command, &mount_dir, &image);
        let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.trim(), summary);
        let report = check::check(engine(&image)).unwrap();
        assert!(report.is_clean(), "{report:?}");
    }
    let _ = std::fs::remove_file(program);
}

/// `signal` in a program compiled as strict POSIX is the C library's
/// `__sysv_signal`, and `sysv_signal`, `bsd_signal` and `sigset` (with its
/// `SIG_HOLD`) are its other forms:
/// each installs the program's handler behind the interposer's wrapper (the
/// kernel's handler is another address), reads back as itself, keeps the
/// System V (reset as it runs) or BSD semantics, and its write to the mount
/// lands. Before, all four installed the handler bare: the kernel held the
/// program's own address (`tests/c/sysv_signal.c`).
#[test]
fn the_c_librarys_other_signal_calls_install_handlers_behind_the_wrapper() {
    passes_on_mount("sysv_signal", &["-std=c11"], "36 passed, 0 failed", 1);
}

/// A flock on a mounted file is the kernel's, taken on a file that stands
/// for the inode (`posix/locks.rs`): a process holding one lends the mount
/// to a process that waits for it, and the lock still keeps other
/// processes out as on ext4. `flock f cmd` runs `cmd` while it holds the
/// lock, and `cmd` uses the mount; another flock of the same file fails
/// with `-n` and waits without it; shared locks go together. Before, the
/// lock was kept in the holder's memory, so a description holding one
/// kept its mount: `cmd` waited `IOPATH_MOUNT_WAIT` and could not mount.
#[test]
fn a_flock_held_lends_the_mount_and_still_keeps_other_processes_out() {
    let script = r#"set -e
        cd "$D"; touch lockf
        flock lockf -c 'ls lockf; echo in > inside; cat inside'
        flock lockf -c 'flock -n lockf -c true || echo busy'
        flock -s lockf -c 'flock -s -n lockf -c "echo shared"'
        (flock lockf -c 'touch held; sleep 0.3; echo first') &
        while [ ! -e held ]; do sleep 0.01; done
        flock lockf -c 'echo second'
        wait"#;
    let (stdout, _scratch, _kernel_dir, image) = on_both(script);
    assert_eq!(stdout[0], "lockf\nin\nbusy\nshared\nfirst\nsecond\n");
    assert_eq!(stdout[1], stdout[0]);
    // The kernel files the flocks were taken on outlive every process (a test's image does not).
    let dir = iopath::fs::lock::flock_path(&image, 0).unwrap();
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

/// A program that opens its output file itself and puts it on its
/// standard output moves there as on the kernel's file: `dd of=f seek=N`
/// (with and without `conv=notrunc`) opens `f`, puts it on descriptor 1
/// and seeks before it writes; the bridge behind descriptor 1 writes what
/// the pipe holds first, then the seek moves the open file it writes into
/// (`bridge/seek.rs`). Before, dd failed: "cannot seek: Illegal seek".
/// A query of where standard output stands is answered too, for such a
/// file (not for one handed over: `prog > f`, which fails as on a pipe).
#[test]
fn dd_seeks_in_an_output_file_it_opened_itself() {
    let script = r#"set -e
        printf 'abcdefgh' > "$D/keep"; printf 'XY' | dd of="$D/keep" bs=1 seek=3 conv=notrunc status=none
        printf 'abcdefgh' > "$D/cut"; printf 'XY' | dd of="$D/cut" bs=1 seek=3 status=none
        seq 1 3000 | dd of="$D/far" bs=1000 seek=5 status=none
        printf '0123456789' > "$D/src"; dd if="$D/src" of="$D/part" bs=2 skip=2 seek=1 count=2 status=none"#;
    let names = ["keep", "cut", "far", "part"];
    let (_, _scratch, kernel_dir, image) = on_both(script);
    same_files_in_image(&image, &kernel_dir, &names);
    assert_eq!(std::fs::read(kernel_dir.join("keep")).unwrap(), b"abcXYfgh");
    assert_eq!(std::fs::read(kernel_dir.join("cut")).unwrap(), b"abcXY");
}

/// A program writing into a pipe while the process on the other end
/// borrows the mount from it (the writer reads a mounted file, the reader
/// opens another) writes all it wrote: each lend tears down io_uring rings
/// the writer's thread used, which interrupts its blocked pipe write (task
/// work with `TWA_SIGNAL`, no signal), and the kernel gives back the part
/// written; the interposer carries the write on (`posix/data.rs`, `whole`).
/// Before, Python's `os.write` of 8 KiB came back with 4 at each lend and
/// the rest was lost (as `unzip -p a.zip f | cmp - f` lost the end of `f`).
#[test]
fn a_pipe_write_interrupted_by_a_lend_of_the_mount_writes_everything() {
    let script = r#"set -e
        seq 1 100000 > "$D/a"; cp "$D/a" "$D/b"
        for i in 1 2 3 4; do
            python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); size = os.fstat(fd).st_size; pos = 0
while pos < size:
    os.lseek(fd, pos, 0); b = os.read(fd, 8192); os.write(1, b); pos += len(b)
os.writev(1, [b"tail", b"-end"])' "$D/a" | python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
def full(f, n):
    out = b""
    while len(out) < n:
        more = os.read(f, n - len(out))
        if not more:
            break
        out += more
    return out
n = 0
while True:
    x, y = full(0, 4096), full(fd, 4096)
    if x != y and x != y + b"tail-end":
        sys.exit(f"the pipe and the file differ after byte {n}")
    if not y:
        break
    n += len(y)
print("same", n)' "$D/b"
        done"#;
    assert_eq!(on_mount(script), "same 588895\n".repeat(4));
}

/// A shared map a program cannot write (Python's `ACCESS_READ`, Rust's
/// `memmap2::Mmap`, LMDB's readers) follows the file as a kernel mapping
/// does: writes through another descriptor and a truncation show in it at
/// once, and a writable map of it is refused (EACCES, as on the kernel's
/// file opened read only). While it lasts the mount stays in the process
/// (a child that needs it waits, then fails with EBUSY, as beside a record
/// lock); its unmapping gives the mount to the next process. Before, every
/// shared map was refused with ENODEV.
#[test]
fn a_shared_read_only_map_follows_the_file_and_keeps_the_mount_while_it_lasts() {
    let script = r#"set -e
        export IOPATH_MOUNT_WAIT=0.3
        python3 -c 'import mmap, os, subprocess, sys
p = sys.argv[1]
with open(p, "wb") as f:
    f.write(b"a" * 10000)
fd = os.open(p, os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
w = os.open(p, os.O_WRONLY)
os.pwrite(w, b"XYZ", 4095)
os.truncate(p, 5000)
print(len(m), m[4094:4099], m[4998:5002])
try:
    mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)
except OSError as e:
    print("writable:", e.errno)
busy = subprocess.run(["cat", p], capture_output=True)
m.close()
done = subprocess.run(["cat", p], capture_output=True)
print(busy.returncode != 0, done.returncode, len(done.stdout), done.stdout[4094:4099])' "$D/f""#;
    let (outputs, ..) = on_both(script);
    let [kernel, mounted] = outputs;
    assert_eq!(kernel, "10000 b'aXYZa' b'aa\\x00\\x00'\nwritable: 13\nFalse 0 5000 b'aXYZa'\n");
    // The kernel lets the child read the mapped file; on a mount it waits its turn and gives up.
    assert_eq!(mounted, kernel.replace("False 0", "True 0"));
}

/// A writable shared map (SQLite's WAL index, Python's default `mmap`) is
/// the file's truth for its range while it lasts: a read of the file sees
/// what was stored, and `flush` (msync) or closing the map writes it into
/// the file, which the next process reads. SQLite in WAL mode without
/// exclusive locking, two processes one after the other, then its
/// integrity check. Python's `mmap.resize` (ftruncate, then mremap), which
/// grows the map past what its mirror held: a new mirror of the new length.
/// Before, the map was refused with ENODEV and SQLite said "disk I/O
/// error"; then the grown part of a resized map raised SIGBUS.
#[test]
fn a_writable_shared_map_reaches_the_file_and_sqlite_runs_in_wal_mode() {
    let script = r#"set -e
        python3 -c 'import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
os.write(fd, b"a" * 8192)
m = mmap.mmap(fd, 8192)
m[0:6] = b"stored"
print(os.pread(fd, 6, 0))
m[4096:4101] = b"flush"
m.flush()
m[8190:8192] = b"zz"
m.close()
os.close(fd)' "$D/w"
        head -c 6 "$D/w"; echo; tail -c 2 "$D/w"; echo; cut -c 4097-4101 "$D/w" | head -c 5; echo
        sqlite3 "$D/s.db" "pragma journal_mode=wal; create table t(x); insert into t values(1),(2),(3);"
        sqlite3 "$D/s.db" "insert into t values(4); select sum(x) from t; pragma integrity_check;"
        python3 -c 'import ctypes, mmap, os, sys
at = lambda m: ctypes.addressof(ctypes.c_char.from_buffer(m))
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
os.write(fd, b"a" * 4096)
m = mmap.mmap(fd, 4096)
m[0:5] = b"first"
m.resize(3 * 4096)
m[8000:8005] = b"grown"
print(os.fstat(fd).st_size, m[0:5], m[4096:4098], os.pread(fd, 5, 8000))
before = at(m)
m.resize(2000)
print(len(m), m[0:5], at(m) == before)
m.close()
print(os.pread(fd, 5, 0), os.fstat(fd).st_size)' "$D/r""#;
    let (outputs, ..) = on_both(script);
    let [kernel, mounted] = outputs;
    assert_eq!(
        kernel,
        "b'stored'\nstored\nzz\nflush\nwal\n10\nok\n\
         12288 b'first' b'\\x00\\x00' b'grown'\n2000 b'first' True\nb'first' 2000\n"
    );
    assert_eq!(mounted, kernel);
}

/// A map with `MAP_SYNC` (stores durable once out of the CPU caches: DAX
/// persistent memory only) is refused with EOPNOTSUPP, as the kernel
/// refuses it on ext4; without it the same `MAP_SHARED_VALIDATE` map works.
/// Any other flag the kernel does not accept with `MAP_SHARED_VALIDATE` is
/// refused too, and a map type that is none of the three is EINVAL.
/// MariaDB 10.11 tries exactly this for its redo log and, given the map,
/// took the mount for persistent memory and stopped syncing the log: a
/// killed server lost every commit it had acknowledged since the last
/// write-back of the map.
#[test]
fn a_map_sync_map_is_refused_as_on_a_file_that_is_not_persistent_memory() {
    let script = r#"set -e
        python3 -c 'import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
os.write(fd, b"a" * 8192)
rw, shared_validate, map_sync = 3, 3, 0x80000
p = libc.mmap(None, 8192, rw, shared_validate | map_sync, fd, 0)
print(p == ctypes.c_void_p(-1).value, ctypes.get_errno())
for flags in (shared_validate | 0x100000, shared_validate | 0x200000, 0x08 | shared_validate, 0x0b):
    ctypes.set_errno(0)
    print(libc.mmap(None, 8192, rw, flags, fd, 0) == ctypes.c_void_p(-1).value, ctypes.get_errno())
p = libc.mmap(None, 8192, rw, shared_validate | 0x4000, fd, 0)
ctypes.memmove(p, b"stored", 6)
print(p != ctypes.c_void_p(-1).value, os.pread(fd, 6, 0))' "$D/log""#;
    let (outputs, ..) = on_both(script);
    let [kernel, mounted] = outputs;
    // MAP_SYNC, MAP_FIXED_NOREPLACE and an unknown flag are refused with MAP_SHARED_VALIDATE,
    // an unknown map type is not a map; MAP_NORESERVE is a known flag.
    assert_eq!(kernel, "True 95\nTrue 95\nTrue 95\nTrue 22\nTrue 22\nTrue b'stored'\n");
    assert_eq!(mounted, kernel);
}

/// Every store into a writable shared map reaches the file, however the
/// store and the write-back meet: flushes after stores into different
/// pages (a write-back looks only at the pages stored into since the last,
/// as the kernel's page tables tell), a page dropped from the page tables
/// after a store (`MADV_DONTNEED`), a store by a forked child into the map
/// it shares (in the child's page tables: the parent looks at every page
/// from then on; its fsync is checked after a SIGKILL, before any unmap
/// could look again), and a page unmapped alone before the rest. Before the
/// watch, every write-back compared every page (LMDB with `writemap`: 0.42
/// s against ext4's 0.05 s).
#[test]
fn every_store_into_a_writable_shared_map_reaches_the_file() {
    let script = r#"set -e
        python3 -c 'import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
P = mmap.PAGESIZE
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
os.write(fd, b"." * (16 * P))
m = mmap.mmap(fd, 16 * P)
m[9 * P:9 * P + 5] = b"after"
m.flush()
m[12 * P:12 * P + 5] = b"alone"
m[15 * P:15 * P + 4] = b"last"
buf = ctypes.c_char.from_buffer(m)
print(libc.munmap(ctypes.addressof(buf) + 12 * P, P))
del buf
m.close()
os.close(fd)' "$D/w"
        python3 -c 'import mmap, os, signal, sys
P = mmap.PAGESIZE
def run(path, fork):
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"." * (16 * P))
    m = mmap.mmap(fd, 16 * P)
    if fork:
        m[0:6] = b"parent"
        m.flush()
        pid = os.fork()
        if pid == 0:
            m[7 * P:7 * P + 5] = b"child"
            os._exit(0)
        os.waitpid(pid, 0)
    else:
        for r in range(4):
            m[r * P:r * P + 5] = b"round"
            m[r * P + 100:r * P + 101] = b"x"
            m.flush()
        m[5 * P:5 * P + 4] = b"gone"
        m.madvise(mmap.MADV_DONTNEED, 5 * P, P)
    m.flush()
    os.fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)
for path, fork in [(sys.argv[1], False), (sys.argv[2], True)]:
    pid = os.fork()
    if pid == 0:
        run(path, fork)
    print("killed" if os.WIFSIGNALED(os.waitpid(pid, 0)[1]) else "not killed")' "$D/f" "$D/g"
        for f in w f g; do python3 -c 'import mmap, sys
data = open(sys.argv[1], "rb").read()
print(len(data), [(i, data[i * mmap.PAGESIZE:i * mmap.PAGESIZE + 5]) for i in range(16) if data[i * mmap.PAGESIZE] != 46])' "$D/$f"; done"#;
    let (outputs, ..) = on_both(script);
    let [kernel, mounted] = outputs;
    assert_eq!(
        kernel,
        "0\nkilled\nkilled\n65536 [(9, b'after'), (12, b'alone'), (15, b'last.')]\n\
         65536 [(0, b'round'), (1, b'round'), (2, b'round'), (3, b'round'), (5, b'gone.')]\n\
         65536 [(0, b'paren'), (7, b'child')]\n"
    );
    assert_eq!(mounted, kernel);
}

/// A program's thread is never sent task work by iopath's rings when it
/// is not waiting on them (`TWA_SIGNAL` interrupts a blocking read or
/// write that has made progress: a read of /dev/urandom gives part of what
/// was asked). Three causes, each seen cutting reads short here: the
/// IOPOLL probe ring made and closed at every mount (`dd if=/dev/urandom
/// bs=1M` onto a mount: "partial read", 63+1 records, in every run), the
/// engine closed with its threads' rings when the mount is lent to a child
/// (a Python program running `cat` on a file it writes), and the watchdog
/// timeout of a sleeping wait firing up to 100 ms after it.
#[test]
fn a_program_using_the_mount_gets_whole_reads_from_dev_urandom() {
    let script = r#"set -e
        dd if=/dev/urandom of="$D/r" bs=1M count=16 status=none
        stat -c %s "$D/r"
        python3 -c 'import os, subprocess, sys
f = open(sys.argv[1], "wb")
short = 0
for r in range(8):
    f.write(b"x" * 4096); f.flush()
    subprocess.run(["cat", sys.argv[1]], stdout=subprocess.DEVNULL, check=True)
    fd = os.open("/dev/urandom", os.O_RDONLY)
    short += sum(len(os.read(fd, 1 << 20)) < 1 << 20 for i in range(16))
    os.close(fd)
print("short reads:", short)' "$D/h""#;
    assert_eq!(on_mount(script), "16777216\nshort reads: 0\n");
}

/// A reader that read ahead of what it used gives the rest back with a
/// seek, and the next reader of its standard input starts there, as on the
/// kernel's file (`bridge/seek.rs`): GNU head in a group (the shell's
/// bridge feeds it, let go at the fork, and a file larger than what a
/// bridge holds in memory, whose mount the shell keeps), in a subshell,
/// a program seeking its own handed-over standard input forward, back
/// and from the end, a child reading a descriptor the shell keeps open,
/// larger than a pipe holds (`exec 3< f; head -n 1 <&3; cat <&3`: the
/// child's 0 and its 3 kept across exec share one pipe, as they share one
/// position; two pipes raced for the file's bytes), and in a pipeline
/// whose other command inherits the descriptor and never reads it (`cat
/// <&3 | cksum`: the sibling's pipe is fed from a cursor of its own),
/// Python's children with its open file as standard input (a grandchild's
/// seek goes up past the shell between, which listens to no one), and
/// bash's `read` builtin, which reads as from a pipe. Before, `{ head -n
/// 1; cat; } < f` gave cat nothing: head's seek failed with ESPIPE.
#[test]
fn a_reader_that_seeks_back_leaves_the_rest_to_the_next_as_on_the_kernels_file() {
    let script = r#"set -e
        seq 1 20000 > "$D/in"
        seq 1 1000000 > "$D/big"
        { head -n 1 > "$D/first"; cat > "$D/rest"; } < "$D/in"
        (head -n 3 > "$D/three"; sort -rn > "$D/sorted") < "$D/in"
        { head -n 2 > /dev/null; head -c 5; head -n 1; cat; } < "$D/in" > "$D/mixed"
        { head -n 1 > /dev/null; cat; } < "$D/big" > "$D/bigrest"
        { read -r a; read -r b; head -n 2; echo "$a $b"; } < "$D/in" > "$D/read"
        seq 1 300000 > "$D/two"
        exec 3< "$D/two"; cat <&3 | cksum; exec 3<&-
        exec 3< "$D/two"; head -n 1 <&3; head -n 2 <&3; cat <&3; exec 3<&-
        python3 -c 'import os; os.read(0, 10); print(os.lseek(0, -4, 1), os.read(0, 3)); \
            print(os.lseek(0, 100, 0), os.read(0, 3)); print(os.lseek(0, -6, 2), os.read(0, 6)); \
            print(os.lseek(0, 2, 0), os.read(0, 2))' < "$D/in" > "$D/python"
        python3 -c 'import os, subprocess, sys; f = open(sys.argv[1], "rb", buffering=0); f.read(3); \
            a = subprocess.run(["head", "-c", "4"], stdin=f, capture_output=True).stdout; \
            b = subprocess.run(["sh", "-c", "head -n 1; head -c 3"], stdin=f, capture_output=True).stdout; \
            print(a, b, os.lseek(f.fileno(), 0, 1), f.read(5))' "$D/in" > "$D/spawned""#;
    let names = ["first", "rest", "three", "sorted", "mixed", "bigrest", "read", "python", "spawned"];
    let (_scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let stdout = [(&kernel_dir, false), (&mount_dir, true)].map(|(dir, mount)| {
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.is_empty(), "{}: {stderr}", dir.display());
        out.stdout
    });
    // (The shell keeps `two` open, so it holds the mount: its children write to the test's pipe.)
    let all: Vec<u8> = (1..=300_000).flat_map(|n| format!("{n}\n").into_bytes()).collect();
    let cksum = |out: &[u8]| String::from_utf8_lossy(&out[..out.len().saturating_sub(all.len())]).into_owned();
    assert!(stdout.iter().all(|out| out.ends_with(&all)), "{} and {} bytes", stdout[0].len(), stdout[1].len());
    assert_eq!(cksum(&stdout[1]), cksum(&stdout[0]), "cat's copy, its sibling cksum inheriting 3 too");
    same_files_in_image(&image, &kernel_dir, &names);
    let python = std::fs::read_to_string(kernel_dir.join("python")).unwrap();
    assert_eq!(python, "6 b'4\\n5'\n100 b'7\\n3'\n108888 b'20000\\n'\n2 b'2\\n'\n");
    let spawned = std::fs::read_to_string(kernel_dir.join("spawned")).unwrap();
    assert_eq!(spawned, "b'\\n3\\n4' b'\\n5\\n6' 11 b'\\n7\\n8\\n'\n");
}

/// A shell that keeps mounted files open (`exec 3<`, `exec 4>>`) and does
/// nothing with them while its commands run gives them the mount: its
/// lender closes those files when a command waits for the mount, and the
/// shell's next use of each opens it again where it stood. A subshell
/// forked meanwhile (a background job) keeps no hold on it. Before, `ls`
/// waited 10 s and failed with EBUSY: the shell held the mount for its
/// open descriptors, and a forked child's copy of the lock's descriptor
/// (and of its mapping) kept the lock even after the shell let go.
/// Subshells forked while the shell holds the mount use it too: they
/// mount in their turn for their own paths (`[ -f ]`, `$(< f)`, a
/// redirection before an exec), and the shell's descriptors they use
/// (`echo >&4`, `read <&3`) become pipes the shell bridges, sharing its
/// positions (before: EPERM and EBADF).
#[test]
fn a_shell_keeping_files_open_gives_the_mount_to_its_commands() {
    let script = r#"set -e
        seq 1 5 > "$D/list"
        exec 3< "$D/list"
        read -r a <&3
        (sleep 2; true) &
        listing=$(ls "$D")
        n=$(cat "$D/list" | wc -l)
        read -r b <&3
        exec 4>> "$D/log"
        echo "$a $b $n" >&4
        echo "$listing" >&4
        c=$(cat "$D/log")
        echo "$c" > "$D/copy"
        read -r rest <&3
        echo "rest $rest" >&4
        exec 3< "$D/list"
        ( [ -f "$D/list" ] && echo "subshell sees list" >&4 )
        ( echo "subshell writes" >&4; read -r x <&3; echo "subshell read $x" >&4 )
        read -r y <&3; echo "then the shell reads $y" >&4
        v=$(< "$D/copy"); echo "${#v} bytes" >&4
        while read -r n <&3; do grep -c . "$D/list" > "$D/out.$n"; done
        cat "$D"/out.* >&4
        exec 3<&- 4>&-
        wait"#;
    let (_scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    for (dir, mount) in [(&kernel_dir, false), (&mount_dir, true)] {
        let started = std::time::Instant::now();
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.is_empty(), "{}: {stderr}", dir.display());
        // (Each command would have waited IOPATH_MOUNT_WAIT, 10 s, for the mount.)
        assert!(started.elapsed() < std::time::Duration::from_secs(9), "{:?}", started.elapsed());
    }
    same_files_in_image(&image, &kernel_dir, &["log", "copy", "out.3", "out.5"]);
    let log = std::fs::read_to_string(kernel_dir.join("log")).unwrap();
    assert_eq!(
        log,
        "1 2 5\nlist\nrest 3\nsubshell sees list\nsubshell writes\nsubshell read 1\nthen the shell reads 2\n\
         10 bytes\n5\n5\n5\n"
    );
}

/// A shell's files kept open while its commands rename them follow their
/// files, as descriptors do: the shell lends the mount to `mv`, which
/// renames the files under it, and the shell's next writes and reads land
/// in the renamed files, where they stood. Before, the shell opened each
/// again by its old path, found nothing, and `two` was lost ("cannot open
/// '/log': no such file").
#[test]
fn files_a_shell_keeps_open_follow_their_renames_by_its_commands() {
    let script = r#"set -e
        seq 1 4 > "$D/list"
        exec 4>> "$D/log" 3< "$D/list"
        echo one >&4
        read -r a <&3
        mv "$D/log" "$D/log.1"
        mkdir "$D/old"
        mv "$D/list" "$D/old/list"
        echo two >&4
        read -r b <&3
        echo "read $a $b" >&4
        exec 3<&- 4>&-
        cat "$D/log.1""#;
    let ([kernel, mounted], _scratch, kernel_dir, image) = on_both(script);
    assert_eq!(kernel, "one\ntwo\nread 1 2\n");
    assert_eq!(mounted, kernel);
    same_files_in_image(&image, &kernel_dir, &["log.1", "old/list"]);
}

/// A script whose standard streams are mounted files runs commands that use
/// the mount: the shell's bridges are its only hold on the mount, and they
/// let go of it at each fork (holding what arrives in memory), so the
/// children can mount it; their output, the shell's own and what an exec
/// hands on all land in order, byte for byte as on the kernel's files, also
/// where the shell writes the same file directly between them. A shell
/// reading a file longer than a bridge holds in memory (4 MiB) lets go
/// too, and reads it on a window at a time (before, its bridge kept the
/// mount, and `ls` waited 10 s and failed). (Before, every such command
/// waited for the mount and failed: EBUSY.)
#[test]
fn a_script_writing_into_a_mount_runs_commands_that_use_the_mount() {
    let script = r#"set -e
        seq 1 200 > "$D/in"
        { echo start; ls "$D"; wc -l < "$D/in"; echo end; } > "$D/block"
        while read -r l; do ls "$D" > /dev/null; echo "line $l"; done < "$D/in" > "$D/loop"
        bash -c 'ls "$D" > /dev/null; head -c 6000000 /dev/zero | tr "\0" x; echo' > "$D/big"
        bash -c 'ls "$D" > /dev/null; echo held; exec echo handed' > "$D/exec"
        bash -c 'ls "$D" > /dev/null; read -r first; echo "first $first"; exec tail -n 2' < "$D/in" > "$D/rest"
        { date -d @0 -u; ls "$D" > /dev/null; } 2>&1 >> "$D/block"
        for i in 1 2 3; do { echo "one $i"; echo two >> "$D/order"; echo three; cat "$D/order" > "$D/seen"; } >> "$D/order"; done
        seq 1 1000000 > "$D/long"
        { head -c 100 > /dev/null; ls "$D" > "$D/listed"; cat; } < "$D/long" > "$D/tail""#;
    let names = ["block", "loop", "big", "exec", "rest", "order", "seen", "long", "listed", "tail"];
    let (_, _scratch, kernel_dir, image) = on_both(script);
    same_files_in_image(&image, &kernel_dir, &names);
    assert_eq!(std::fs::read_to_string(kernel_dir.join("exec")).unwrap(), "held\nhanded\n");
    assert_eq!(std::fs::read_to_string(kernel_dir.join("rest")).unwrap(), "first 1\n199\n200\n");
}

/// A process that holds the mount and waits for its children gives it to
/// them: its lender sees them wait (`iopath::fs::lock::Wanted`) and gives
/// the mount back while nothing there is open. A parent that looked at the
/// mount after starting a child and then waited for it held the child off
/// until it failed with EBUSY; `make -j2` failed so on this machine.
#[test]
fn a_parent_waiting_for_its_children_lets_them_use_the_mount() {
    let script = r#"set -e
        python3 -c '
import os, subprocess, sys
d = os.environ["D"]
child = subprocess.Popen(["sh", "-c", "sleep 0.3; echo from-child > \"$D/child\""])
os.stat(d)  # the parent has the mount again, after the spawn gave it back
sys.exit(child.wait())'
        cat "$D/child"
        mkdir "$D/proj" && cd "$D/proj"
        for n in 1 2 3 4; do printf "int f$n(void){return $n;}\n" > f$n.c; done
        printf "int f1(void);int f2(void);int f3(void);int f4(void);\nint main(void){return f1()+f2()+f3()+f4();}\n" > m.c
        printf "prog: m.o f1.o f2.o f3.o f4.o\n\tcc -o \$@ \$^\n%%.o: %%.c\n\tcc -c \$<\n" > Makefile
        make -s -j2
        ./prog || echo "prog says $?""#;
    let (_scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let mut outputs = Vec::new();
    for (dir, mount) in [(&kernel_dir, false), (&mount_dir, true)] {
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stderr.is_empty(), "{}: {stdout}{stderr}", dir.display());
        outputs.push(stdout.into_owned());
    }
    assert_eq!(outputs[0], "from-child\nprog says 10\n");
    assert_eq!(outputs[1], outputs[0]);
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A program whose stderr is a bridge into a mounted file exits with its
/// own status: with `IOPATH_LOG`, the interposer's exit log goes to a copy
/// of stderr, the bridge's pipe, which has no reader by then (it exited
/// 141, killed by SIGPIPE).
#[test]
fn a_program_whose_log_goes_into_a_mounted_file_exits_with_its_own_status() {
    let (_scratch, _, mount_dir, image) = kernel_dir_and_mount();
    let mut command = Command::new("bash");
    command.arg("-c").arg(r#"ls / > "$D/out" 2>&1; echo "rc=$?""#).env("D", &mount_dir).env("IOPATH_LOG", "1");
    common::mounted(&mut command, &mount_dir, &image);
    let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout == "rc=0\n", "{stdout}{stderr}");
}

/// A forked child that closes every descriptor above 2 with a raw
/// `close_range` (no hook sees it: Python's subprocess does this before its
/// exec) and then mounts keeps its own new descriptors: the per-thread
/// engine handles it inherited are forgotten, never dropped (dropping them
/// closed the numbers they had, which the child's mount had just been
/// given: "device error on flush: Invalid argument" at its exit).
#[test]
fn a_child_that_closed_every_descriptor_by_a_raw_system_call_mounts_cleanly() {
    let scratch = tempfile::tempdir().unwrap();
    let (image, mount_dir) = formatted_image(scratch.path());
    let script = r#"
import ctypes, os, sys
d = sys.argv[1]
with open(d + "/parent", "w") as f:
    f.write("parent")
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None, use_errno=True).syscall(436, 3, 0xFFFFFFFF, 0)  # close_range
    fd = os.open(d + "/child", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"child")
    os.fsync(fd)
    os.close(fd)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(status, open(d + "/child").read())
"#;
    let mut command = Command::new("python3");
    command.arg("-c").arg(script).arg(&mount_dir);
    common::mounted(&mut command, &mount_dir, &image);
    let out = common::output_within(&mut command, std::time::Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout == "0 child\n", "{stdout}{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// Programs stored on a mount run from there (the kernel cannot load what
/// it cannot see): a program compiled into the mount (from a memfd), a
/// script through its `#!` interpreter with its own path as `$0`, a
/// script whose interpreter is a script on the mount, a file without `#!`
/// (the shell runs it), a file without an execute bit (EACCES), the same
/// through `env` (execvp), `os.posix_spawn` and Python's subprocess; the
/// same script in a kernel directory prints the same.
#[test]
fn programs_stored_on_a_mount_run_as_from_the_kernels_file_system() {
    let script = r#"cd "$D"
        printf '#include <stdio.h>\nint main(int c, char **v) { printf("%%s %%d\\n", v[0], c); return 3; }\n' > h.c
        cc -o h h.c
        ./h a; echo "rc=$?"
        "$D/h" | sed "s|$D|D|"
        printf '#!/bin/sh\necho "script $0 $1"\n' > s; chmod +x s; ./s x
        printf '#!%s/s\n' "$D" > nested; chmod +x nested; ./nested y | sed "s|$D|D|"
        printf 'echo plain $0\n' > plain; chmod +x plain; ./plain
        echo data > nx; ./nx 2> /dev/null; echo "nx=$?"
        env ./s via-env
        python3 -c 'import os; pid = os.posix_spawn("./h", ["./h", "spawned"], os.environ); print(os.waitpid(pid, 0)[1] >> 8)'
        python3 -c 'import subprocess; print(subprocess.run(["./s", "sub"]).returncode)'"#;
    let (_scratch, kernel_dir, mount_dir, image) = kernel_dir_and_mount();
    let run = |dir: &Path, mount: bool| {
        let out = bash_in(script, dir, mount.then_some(image.as_path()));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stderr.is_empty(), "{}: {stdout}{stderr}", dir.display());
        stdout.into_owned()
    };
    let expected = run(&kernel_dir, false);
    assert!(expected.starts_with("./h 2\nrc=3\nD/h 1\nscript ./s x\n"), "{expected}");
    assert_eq!(run(&mount_dir, true), expected);
    assert_eq!(std::fs::read_dir(&mount_dir).unwrap().count(), 0, "nothing reached the host directory");
}
