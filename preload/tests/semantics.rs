//! The interposer keeps the kernel's semantics: `tests/c/preload_test.c`
//! runs as it is (the kernel's answers) and under `LD_PRELOAD` with its
//! scratch files routed, for several iopath paths; every check must pass in
//! every run, and the routed runs must really have routed.

mod common;

use common::{compile, preload_library};
use std::path::Path;
use std::process::Command;

/// Runs the program; returns (stdout, stderr) after checking it passed.
fn run(program: &Path, env: &[(&str, String)]) -> (String, String) {
    let dir = tempfile::tempdir_in(std::env::var("IOPATH_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into()))
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let out = Command::new(program).arg(dir.path()).envs(env.iter().map(|(k, v)| (k, v))).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{env:?}:\n{stdout}{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    (stdout, stderr)
}

#[test]
fn programs_see_the_kernels_semantics_with_and_without_the_interposer() {
    let program = compile("preload_test", &["-lpthread"]);
    run(&program, &[]);
    let library = preload_library().display().to_string();
    for path in ["auto", "sync-yield", "stm", "sync-path", "2q", "sync-intr", "stm+adaptive"] {
        let (_, stderr) = run(
            &program,
            &[
                ("LD_PRELOAD", library.clone()),
                ("IOPATH_FILES", "/**/data.img:/**/buffered.img".into()),
                ("IOPATH_PATH", path.into()),
                ("IOPATH_LOG", "1".into()),
            ],
        );
        assert!(stderr.contains(&format!("routed through {path}")), "{path}: {stderr}");
        assert!(stderr.contains("buffered.img: not routed: opened without O_DIRECT"), "{stderr}");
        let routed: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("iopath: ")?.split_once(" calls routed")?.0.parse().ok())
            .unwrap_or_else(|| panic!("{path}: no summary line: {stderr}"));
        assert!(routed > 10_000, "{path}: only {routed} calls routed: {stderr}");
    }
    let _ = std::fs::remove_file(program);
}

#[test]
fn without_patterns_nothing_is_routed_and_nothing_is_printed() {
    let program = compile("preload_test", &["-lpthread"]);
    let library = preload_library().display().to_string();
    let (_, stderr) = run(&program, &[("LD_PRELOAD", library), ("IOPATH_LOG", "1".into())]);
    assert!(!stderr.contains("iopath:"), "{stderr}");
    let _ = std::fs::remove_file(program);
}

#[test]
fn idle_polling_is_asked_for_when_the_environment_says_so() {
    let program = compile("preload_test", &["-lpthread"]);
    let library = preload_library().display().to_string();
    let (_, stderr) = run(
        &program,
        &[
            ("LD_PRELOAD", library),
            ("IOPATH_FILES", "/**/data.img".into()),
            ("IOPATH_IDLE_POLL", "1".into()),
            ("IOPATH_LOG", "1".into()),
        ],
    );
    // Granted where the test runs as root (CI), refused with the reason elsewhere:
    // never silent, and the program's semantics hold either way.
    let root = std::fs::OpenOptions::new().write(true).open("/dev/cpu_dma_latency").is_ok();
    let line = if root { "idle CPUs poll while this program runs" } else { "IOPATH_IDLE_POLL: cannot ask" };
    assert!(stderr.contains(line), "{stderr}");
    let _ = std::fs::remove_file(program);
}
