//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `iopath` binary.
pub fn iopath(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iopath")).args(args).output().expect("run iopath")
}

/// What a run printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Runs a command that must fail cleanly (no panic) and returns its message.
pub fn fails(args: &[&str]) -> String {
    let o = iopath(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    err
}

/// Runs a command that must succeed and returns what it printed on stdout.
pub fn succeeds(args: &[&str]) -> String {
    let o = iopath(args);
    assert!(o.status.success(), "iopath {args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A loop device with direct I/O over a file in /dev/shm, detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
    backing: PathBuf,
}

impl LoopDevice {
    /// Sets one up, or says why not (not root, no losetup, no loop support).
    pub fn new(size_mib: u64) -> Result<LoopDevice, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let backing = PathBuf::from(format!("/dev/shm/iopath-test-{}-{}.img", std::process::id(), fastrand::u64(..)));
        let file = std::fs::File::create(&backing).map_err(|e| e.to_string())?;
        file.set_len(size_mib << 20).map_err(|e| e.to_string())?;
        let out = Command::new("losetup")
            .args(["--direct-io=on", "-f", "--show"])
            .arg(&backing)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&backing);
            return Err(format!("losetup failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        Ok(LoopDevice { path, backing })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        iopath::fs::carry::remove_for(&self.path);
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// Runs `f` with a loop device, or prints loudly why the test is skipped.
pub fn with_loop_device(name: &str, f: impl FnOnce(&LoopDevice)) {
    match LoopDevice::new(64) {
        Ok(dev) => f(&dev),
        Err(why) => eprintln!("SKIPPED {name}: no loop device ({why}); run as root with losetup to cover it"),
    }
}

/// Runs `f` on another thread and fails (instead of hanging the test run) if
/// it has not finished after a generous two minutes.
pub fn within_two_minutes(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(()) => worker.join().unwrap(),
        // The worker panicked: re-raise its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(worker.join().unwrap_err()),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still not finished after 2 minutes: hung"),
    }
}
