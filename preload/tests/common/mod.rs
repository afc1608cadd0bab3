//! Helpers shared by the interposer's integration tests.
#![allow(dead_code)]

use iopath::fs::{FileSystem, FormatOptions};
use iopath::{Engine, PathConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// This build's `libiopath_preload.so`.
pub fn preload_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps, deps.parent().unwrap_or(deps)]
        .into_iter()
        .map(|d| d.join("libiopath_preload.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libiopath_preload.so near {}", deps.display()))
}

/// Compiles `tests/c/NAME.c` (with `extra` arguments) into a temporary executable.
pub fn compile(name: &str, extra: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let out = std::env::temp_dir().join(format!("iopath-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root.join("tests/c").join(format!("{name}.c")))
        .arg("-o")
        .arg(&out)
        .args(extra)
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}): install a C compiler (apt-get install gcc)"));
    assert!(status.success(), "cc failed on tests/c/{name}.c");
    out
}

/// An engine on the image file `image` (io_uring, the plain synchronous path).
pub fn engine(image: &Path) -> Arc<Engine> {
    let spec = format!("uring:{}", image.display());
    Arc::new(Engine::open(&spec, PathConfig::preset("sync-path").unwrap()).unwrap())
}

/// A 64 MiB image file in `dir` with an empty iopath file system, and an
/// empty directory to mount it on.
pub fn formatted_image(dir: &Path) -> (PathBuf, PathBuf) {
    formatted_image_of(dir, 64 << 20)
}

/// [`formatted_image`] of `bytes` bytes.
pub fn formatted_image_of(dir: &Path, bytes: u64) -> (PathBuf, PathBuf) {
    let image = dir.join("fs.img");
    std::fs::File::create(&image).unwrap().set_len(bytes).unwrap();
    FileSystem::format(engine(&image), FormatOptions::default()).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (image, mnt)
}

/// Sets the interposer up on `command` to serve `mnt` from `image`.
pub fn mounted(command: &mut Command, mnt: &Path, image: &Path) {
    command
        .env("LD_PRELOAD", preload_library())
        .env("IOPATH_MOUNT", format!("{}={}", mnt.display(), image.display()))
        .env("IOPATH_MOUNT_WAIT", "5");
}

/// Starts `command` with `signals` at their default action, as a program
/// started from a terminal has them. A command run in the background of a
/// shell script (`cmd &`, no job control) inherits SIGINT and SIGQUIT
/// ignored, and a test that looks at a program's dispositions must not
/// depend on how the test run itself was started.
pub fn with_default_actions(command: &mut Command, signals: &'static [libc::c_int]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only `signal` (one system call) runs.
    unsafe {
        command.pre_exec(move || {
            for &signal in signals {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

/// Runs `command` to its end, as `output()` does, but kills it and fails
/// after `limit` (a hang is a failure here, not a stuck test run).
pub fn output_within(command: &mut Command, limit: std::time::Duration) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    // In a process group of its own: a hang's children are killed too (they hold the pipes).
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().unwrap();
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = done.send(());
        out
    });
    if waited.recv_timeout(limit).is_err() {
        // SAFETY: kill has no memory preconditions; the group is our child's, not yet reaped.
        unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        let out = waiter.join().unwrap().unwrap();
        panic!(
            "still running after {limit:?}, killed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    waiter.join().unwrap().unwrap()
}
