//! The C interface: builds `examples/c/example.c` and `tests/c/capi_test.c`
//! against `include/iopath.h` and the `libiopath.so` cargo built for this
//! test run, and runs them. Needs a C compiler (`cc`; `.ci/run` installs gcc).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put this build's `libiopath.so`: beside the test executable
/// (`target/<profile>/deps`, during `cargo test`) or one folder up.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [deps, deps.parent().unwrap_or(deps)]
        .into_iter()
        .find(|d| d.join("libiopath.so").exists())
        .unwrap_or_else(|| {
            panic!("no libiopath.so near {}: the library's crate-type must include cdylib", deps.display())
        })
        .to_path_buf()
}

/// Compiles `source` into an executable linked with libiopath; returns its path.
fn compile(source: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let out = std::env::temp_dir().join(format!("iopath-{name}-{}", std::process::id()));
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join(source))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .args(["-liopath", "-lpthread"])
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}): install a C compiler (apt-get install gcc)"));
    assert!(status.success(), "cc failed on {source}");
    out
}

/// A command running `exe` with the library it was linked against: cargo's
/// own `LD_LIBRARY_PATH` (which outranks the rpath) may name a stale copy in
/// `target/<profile>` first.
fn run(exe: &Path) -> Command {
    let mut command = Command::new(exe);
    command.env("LD_LIBRARY_PATH", library_dir());
    command
}

#[test]
fn the_c_example_writes_and_reads_back() {
    let exe = compile("examples/c/example.c", "example");
    for args in [vec![], vec!["emu:dram-ssd,size=64m", "stm"]] {
        let out = run(&exe).args(&args).output().expect("run the example");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "example {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("ok: 64 blocks"), "{stdout}");
        let stats: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).expect("stats are JSON");
        assert_eq!(stats["reads"], 64);
        assert_eq!(stats["writes"], 64);
    }
    let out = run(&exe).arg("bogus:").output().expect("run the example");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid device spec"));
    let _ = std::fs::remove_file(exe);
}

#[test]
fn the_c_interface_keeps_its_contract() {
    let exe = compile("tests/c/capi_test.c", "capi-test");
    let dir = tempfile::tempdir().unwrap();
    let out = run(&exe).arg(dir.path().join("scratch.img")).output().expect("run capi_test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    let _ = std::fs::remove_file(exe);
}
