//! Users' data is safe: `bench` writes only to targets iopath created or the
//! user explicitly allows, refuses file systems and mounted devices, and a
//! read-only workload opens its target read-only and never writes.

mod common;

use common::{fails, iopath, stderr, succeeds};
use std::path::Path;
use std::process::Command;

/// A file with content somebody cares about.
fn precious(path: &Path) -> Vec<u8> {
    let text: Vec<u8> = (0..256 * 1024).map(|i| b"notes worth keeping\n"[i % 20]).collect();
    std::fs::write(path, &text).unwrap();
    text
}

#[test]
fn an_existing_file_is_never_overwritten_without_permission() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    let before = precious(&notes);
    let p = notes.display().to_string();
    for (device, rw) in [
        (format!("psync:{p},direct=0"), "write"),
        (format!("psync:{p}"), "randrw"),
        (format!("uring:{p}"), "randwrite"),
        (format!("emu:dram-ssd,size=256k,file={p}"), "write"),
    ] {
        let err = fails(&["bench", "--device", &device, "--rw", rw, "--ios", "10", "--no-progress"]);
        assert!(err.contains("refusing to write") && err.contains("--allow-overwrite"), "{device}: {err}");
        assert!(err.contains("did not create"), "{device}: {err}");
        // --verify on a write workload lays the region out first: refused the same way.
        let err = fails(&["bench", "--device", &device, "--rw", rw, "--verify", "--ios", "10"]);
        assert!(err.contains("--allow-overwrite"), "{device}: {err}");
        assert!(std::fs::read(&notes).unwrap() == before, "{device}: the file changed");
    }
    // A larger --size would extend it: refused too, and unchanged.
    let err = fails(&["bench", "--device", &format!("psync:{p}"), "--size", "1m", "--rw", "write", "--ios", "1"]);
    assert!(err.contains("--allow-overwrite"), "{err}");
    assert!(std::fs::read(&notes).unwrap() == before, "the file changed");
}

#[test]
fn read_workloads_open_read_only_and_never_write() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    let before = precious(&notes);
    let p = notes.display().to_string();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o444)).unwrap();
    for device in [format!("psync:{p},direct=0"), format!("uring:{p}"), format!("emu:nand,size=256k,file={p}")] {
        let out = succeeds(&["bench", "--device", &device, "--rw", "randread", "--ios", "50", "--no-progress"]);
        assert!(out.contains("IOPS"), "{out}");
        // --verify on a read workload checks a pattern iopath laid out; these notes hold none.
        let err = fails(&["bench", "--device", &device, "--rw", "read", "--verify", "--ios", "5"]);
        assert!(err.contains("no iopath pattern") && err.contains("--rw write --verify"), "{device}: {err}");
        assert!(std::fs::read(&notes).unwrap() == before, "{device}: a read workload changed the file");
    }
    // A read-only run asked for more than the file holds says so instead of extending it.
    let err = fails(&["bench", "--device", &format!("psync:{p}"), "--size", "1m", "--ios", "1"]);
    assert!(err.contains("fewer than") && err.contains("--size"), "{err}");
    assert!(std::fs::read(&notes).unwrap() == before, "the file changed");
}

#[test]
fn a_read_only_file_can_be_benchmarked_by_a_user_who_may_only_read_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to run the tool as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data.img");
    precious(&data);
    // Root's file, readable by everybody, writable by nobody but root.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).unwrap();
    use std::os::unix::process::CommandExt;
    let spec = format!("psync:{},direct=0", data.display());
    let o = match Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["bench", "--device", &spec, "--rw", "randread", "--ios", "20", "--no-progress"])
        .uid(65534)
        .gid(65534)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run the binary as nobody ({e})");
            return;
        }
    };
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn files_iopath_created_are_its_own_and_carry_a_pattern_to_verify() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("new.img");
    let spec = format!("psync:{}", img.display());
    // Created by a read-only run: laid out with the pattern, which --verify then checks.
    succeeds(&["bench", "--device", &spec, "--size", "1m", "--rw", "randread", "--verify", "--ios", "100"]);
    // Iopath's own file: writable without --allow-overwrite, run after run.
    succeeds(&["bench", "--device", &spec, "--rw", "randwrite", "--verify", "--bs", "16k", "--ios", "50"]);
    succeeds(&["bench", "--device", &spec, "--rw", "randwrite", "--threads", "2", "--ios", "50"]);
    // Rewritten with --verify: every sector still describes itself, whatever the block size.
    succeeds(&["bench", "--device", &spec, "--rw", "randwrite", "--verify", "--bs", "16k", "--ios", "50"]);
    succeeds(&["bench", "--device", &spec, "--rw", "randread", "--verify", "--bs", "4k", "--ios", "200"]);
    let err = fails(&["bench", "--device", &spec, "--rw", "randread", "--verify", "--bs", "1000", "--ios", "1"]);
    assert!(err.contains("--bs") && err.contains("512"), "{err}");
}

#[test]
fn allow_overwrite_lets_a_user_overwrite_a_plain_file() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.img");
    precious(&old);
    let spec = format!("uring:{}", old.display());
    succeeds(&["bench", "--device", &spec, "--rw", "randwrite", "--verify", "--ios", "50", "--allow-overwrite"]);
}

/// A file that looks like an ext4 file system to anyone probing it.
fn fake_ext4(path: &Path) {
    let mut bytes = vec![0u8; 256 * 1024];
    bytes[1080] = 0x53;
    bytes[1081] = 0xef;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_file_system_is_refused_even_with_allow_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    fake_ext4(&disk);
    let before = std::fs::read(&disk).unwrap();
    let spec = format!("psync:{}", disk.display());
    let err = fails(&["bench", "--device", &spec, "--rw", "write", "--ios", "5", "--allow-overwrite"]);
    assert!(err.contains("ext2/ext3/ext4") && err.contains("--allow-fs-overwrite"), "{err}");
    assert!(std::fs::read(&disk).unwrap() == before, "the file system image changed");
    // The second flag alone is not enough either.
    let err = fails(&["bench", "--device", &spec, "--rw", "write", "--ios", "5", "--allow-fs-overwrite"]);
    assert!(err.contains("--allow-overwrite"), "{err}");
    succeeds(&["bench", "--device", &spec, "--rw", "write", "--ios", "5", "--allow-overwrite", "--allow-fs-overwrite"]);
}

#[test]
fn block_devices_need_permission_and_mounted_ones_are_refused() {
    common::with_loop_device("block_devices_need_permission_and_mounted_ones_are_refused", |dev| {
        let spec = format!("uring:{}", dev.path.display());
        let err = fails(&["bench", "--device", &spec, "--rw", "randwrite", "--ios", "10"]);
        assert!(err.contains("block device") && err.contains("--allow-overwrite"), "{err}");
        succeeds(&["bench", "--device", &spec, "--rw", "randread", "--ios", "10"]);
        succeeds(&["bench", "--device", &spec, "--rw", "randwrite", "--ios", "10", "--allow-overwrite"]);
        // With a file system on it: refused even with --allow-overwrite.
        let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev.path).output();
        if !mkfs.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("SKIPPED the file-system part: mkfs.ext4 is not available here");
            return;
        }
        let err = fails(&["bench", "--device", &spec, "--rw", "randwrite", "--ios", "10", "--allow-overwrite"]);
        assert!(err.contains("ext2/ext3/ext4"), "{err}");
        // Mounted: the kernel itself refuses an exclusive open, even with both flags.
        let mnt = tempfile::tempdir().unwrap();
        let mount = Command::new("mount").args(["-o", "ro"]).arg(&dev.path).arg(mnt.path()).output();
        if !mount.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("SKIPPED the mounted part: cannot mount here");
            return;
        }
        let before = std::fs::read(&dev.path).unwrap();
        let err = fails(&[
            "bench",
            "--device",
            &spec,
            "--rw",
            "randwrite",
            "--ios",
            "10",
            "--allow-overwrite",
            "--allow-fs-overwrite",
        ]);
        // Reading a mounted device is harmless and allowed.
        let read = iopath(&["bench", "--device", &spec, "--rw", "randread", "--ios", "10"]);
        // (Read before unmounting: ext4 writes its superblock when it is unmounted.)
        let unchanged = std::fs::read(&dev.path).unwrap() == before;
        let _ = Command::new("umount").arg(mnt.path()).status();
        assert!(err.contains("in use") && err.contains("unmount"), "{err}");
        assert!(read.status.success(), "{}", stderr(&read));
        assert!(unchanged, "the mounted device changed");
    });
}
