//! The `iopath` binary as a user meets it: flags, output formats, errors.

mod common;

use common::{fails, iopath, stderr};
use serde_json::Value;
use std::process::Command;

fn bench_json(args: &[&str]) -> Value {
    let mut all = vec!["bench", "--output-format", "json", "--no-progress"];
    all.extend_from_slice(args);
    let o = iopath(&all);
    assert!(o.status.success(), "{all:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

#[test]
fn json_uses_fio_field_names_and_iopath_figures() {
    let v = bench_json(&["--device", "emu:dram-ssd,size=64m", "--rw", "randread", "--runtime", "300ms"]);
    let job = &v["jobs"][0];
    assert!(job["read"]["iops"].as_f64().unwrap() > 0.0);
    assert!(job["read"]["bw_bytes"].as_u64().unwrap() > 0);
    assert!(job["read"]["lat_ns"]["mean"].as_f64().unwrap() >= 7000.0);
    assert!(job["read"]["lat_ns"]["percentile"]["99.000000"].as_u64().unwrap() >= 7000);
    assert!(job["read"]["clat_ns"]["percentile"]["50.000000"].is_u64());
    assert_eq!(job["write"]["total_ios"], 0);
    for key in ["usr_cpu", "sys_cpu", "ctx"] {
        assert!(job[key].is_number(), "{key}");
    }
    let io = &job["iopath"];
    assert_eq!(io["device_ns_mean"].as_f64().unwrap(), 7000.0, "the model's 7 us per 4 KiB read");
    for key in
        ["share_of_peak", "device_utilization", "software_ns_mean", "ctx_per_io", "cpu_ns_per_io", "polls_per_io"]
    {
        assert!(io[key].is_number(), "{key}");
    }
    assert_eq!(io["merge"]["mean_segments"].as_f64().unwrap(), 1.0);
    let share = io["share_of_peak"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 0.79, "one 4 KiB command at a time cannot pass 78% of peak: {share}");
}

#[test]
fn completion_flag_overrides_the_preset() {
    // A slow device (0.5 ms per read), so that a waiter almost never finds its
    // request already complete when it goes to sleep, however loaded the machine.
    let device = "emu:dram-ssd,size=16m,xfer=500us";
    let v = bench_json(&["--device", device, "--completion", "interrupt", "--ios", "50"]);
    let io = &v["jobs"][0]["iopath"];
    assert_eq!(io["completion"]["policy"], "interrupt");
    assert!(io["completion"]["source"].as_str().unwrap().contains("timer"), "{io}");
    // The default preset's dispatch stays.
    assert_eq!(io["dispatch"], "auto");
    let sleeps = io["sleeps_per_io"].as_f64().unwrap();
    assert!(sleeps > 0.5 && sleeps < 1.5, "one sleep per request: {io}");
    assert_eq!(v["jobs"][0]["read"]["total_ios"], 50);
    let v = bench_json(&["--device", device, "--path", "sync-path", "--ios", "50"]);
    assert_eq!(v["jobs"][0]["iopath"]["sleeps_per_io"].as_f64().unwrap(), 0.0, "poll never sleeps");
    let v = bench_json(&["--device", device, "--ios", "50"]);
    assert_eq!(v["jobs"][0]["iopath"]["completion"]["policy"], "auto", "the default path is auto");
}

/// Blocks read back and checked after 300 randrw I/Os of `threads` threads
/// on an 8 MiB `spec`, with `flag value` (a path or a completion policy).
fn verified_randrw(spec: &str, threads: &str, flag: &str, value: &str) -> u64 {
    let v = bench_json(&[
        "--device",
        spec,
        "--size",
        "8m",
        "--rw",
        "randrw",
        "--threads",
        threads,
        "--verify",
        "--ios",
        "300",
        flag,
        value,
    ]);
    v["jobs"][0]["iopath"]["verified_blocks"].as_u64().unwrap()
}

/// The queue the merging paths share between threads, on Linux AIO: 16
/// threads' reads and writes merged into batches that whichever thread looks
/// completes, every byte checked, and a device error in the middle of a
/// merged batch reaching its own requests only (the run reports them, none
/// hangs).
#[test]
fn merging_paths_share_an_aio_queue_among_16_threads_and_lose_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("aio:{}", dir.path().join("a.img").display());
    for path in ["stm", "atm", "htm", "2q", "combine+yield"] {
        assert!(verified_randrw(&spec, "16", "--path", path) > 0, "{path}");
    }
    let faulty = format!("{spec},fail_range=1m-2m");
    let o = iopath(&[
        "bench",
        "--device",
        &faulty,
        "--size",
        "8m",
        "--rw",
        "randread",
        "--threads",
        "16",
        "--ios",
        "300",
        "--path",
        "stm",
        "--no-progress",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a failed read must fail the run: {err}");
    assert!(err.contains("device error on read") && err.contains("Input/output error"), "{err}");
}

#[test]
fn verify_passes_under_8_threads_of_randrw_on_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let mut specs = vec!["emu:dram-ssd".to_string(), "emu:nand".to_string()];
    specs.push(format!("uring:{}", dir.path().join("u.img").display()));
    specs.push(format!("psync:{}", dir.path().join("p.img").display()));
    specs.push(format!("aio:{}", dir.path().join("a.img").display()));
    for spec in &specs {
        for completion in ["poll", "interrupt"] {
            assert!(verified_randrw(spec, "8", "--completion", completion) > 0, "{spec}");
        }
    }
    let v = bench_json(&[
        "--device",
        "emu:dram-ssd",
        "--size",
        "8m",
        "--rw",
        "randrw",
        "--threads",
        "4",
        "--iodepth",
        "8",
        "--verify",
        "--ios",
        "500",
    ]);
    assert!(v["jobs"][0]["iopath"]["verified_blocks"].as_u64().unwrap() > 0);
}

#[test]
fn verify_passes_on_every_path_under_16_threads_of_randrw() {
    for path in ["scsi-intr", "sync-path", "sync-intr", "stm", "atm", "htm", "2q"] {
        for completion in ["poll", "interrupt"] {
            for depth in ["1", "4"] {
                let v = bench_json(&[
                    "--device",
                    "emu:dram-ssd",
                    "--size",
                    "16m",
                    "--rw",
                    "randrw",
                    "--threads",
                    "16",
                    "--verify",
                    "--ios",
                    "100",
                    "--path",
                    path,
                    "--completion",
                    completion,
                    "--iodepth",
                    depth,
                ]);
                let job = &v["jobs"][0];
                assert!(job["iopath"]["verified_blocks"].as_u64().unwrap() > 0, "{path} {completion} {depth}");
                let total = job["read"]["total_ios"].as_u64().unwrap() + job["write"]["total_ios"].as_u64().unwrap();
                assert_eq!(total, 1600, "{path} {completion} qd{depth}: every request completed");
            }
        }
    }
}

#[test]
fn verify_passes_on_a_loop_device() {
    common::with_loop_device("verify_passes_on_a_loop_device", |dev| {
        let spec = format!("uring:{}", dev.path.display());
        for depth in ["1", "16"] {
            let v = bench_json(&[
                "--device",
                &spec,
                "--rw",
                "randrw",
                "--threads",
                "8",
                "--verify",
                "--ios",
                "300",
                "--iodepth",
                depth,
                "--allow-overwrite",
            ]);
            assert!(v["jobs"][0]["iopath"]["verified_blocks"].as_u64().unwrap() > 0);
        }
        // The output says what a waiter waited on: a loop device has no poll
        // queues, so polling spins on the completion ring in user space.
        for (completion, says) in [("poll", "user space"), ("adaptive", "user space"), ("interrupt", "interrupts")] {
            let v = bench_json(&["--device", &spec, "--completion", completion, "--ios", "200"]);
            let source = v["jobs"][0]["iopath"]["completion"]["source"].as_str().unwrap().to_string();
            assert!(source.contains(says), "{completion}: {source}");
            if completion != "interrupt" {
                assert!(source.contains("IOPOLL"), "says why there is no kernel polling: {source}");
            }
        }
    });
}

#[test]
fn table_output_is_readable() {
    let o = iopath(&["bench", "--device", "emu:optane,size=16m", "--rw", "randwrite", "--ios", "500", "--no-progress"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in ["IOPS", "p99.9", "write", "of peak bandwidth", "context switches per I/O", "auto"] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
}

#[test]
fn a_missing_file_is_created_at_size() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("new.img");
    let spec = format!("uring:{}", file.display());
    bench_json(&["--device", &spec, "--size", "2m", "--rw", "write", "--bs", "64k"]);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 2 << 20);
}

#[test]
fn a_bare_path_names_a_device_in_bench_as_in_mkfs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    let path = file.to_str().unwrap();
    bench_json(&["--device", &format!("uring:{path}"), "--size", "2m", "--rw", "write", "--ios", "8"]);
    let v = bench_json(&["--device", path, "--rw", "randread", "--ios", "64"]);
    assert_eq!(v["jobs"][0]["read"]["total_ios"], 64, "{v}");
    let e = fails(&["bench", "--device", &format!("{path}.typo")]);
    assert!(e.contains("no such file") && e.contains("uring:PATH"), "{e}");
    let o = iopath(&["mkfs", path, "--allow-overwrite", "--allow-fs-overwrite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = iopath(&["df", path]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn bad_input_gets_a_clear_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let missing_dir = "psync:/nonexistent-iopath-dir/x.img";
    let f = dir.path().join("f.img");
    let uring_file = format!("uring:{}", f.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["bench", "--device", "emu:floppy"], "unknown preset 'floppy'"),
        (vec!["bench", "--device", "tape:/dev/st0"], "expected emu:PRESET"),
        (vec!["bench", "--device", "emu:dram-ssd,warp=9"], "unknown option 'warp'"),
        (vec!["bench", "--bs", "4q"], "unknown suffix"),
        (vec!["bench", "--bs", "0"], "zero-length"),
        (vec!["bench", "--runtime", "soon"], "expected a number with a unit"),
        (vec!["bench", "--rw", "sideways"], "expected read, write"),
        (vec!["bench", "--path", "teleport"], "known presets: scsi-intr, sync-path"),
        (vec!["bench", "--path", "warp+poll"], "expected one of: auto, direct, combine"),
        (vec!["bench", "--pipeline", "0"], "at least one command"),
        (vec!["bench", "--completion", "telepathy"], "expected one of: interrupt, poll"),
        (vec!["bench", "--threads", "0"], "at least one thread"),
        (vec!["bench", "--threads", "100000"], "at most 4096"),
        (vec!["bench", "--iodepth", "0"], "at least 1"),
        (vec!["bench", "--rwmixread", "101"], "percentage"),
        (vec!["bench", "--device", "emu:dram-ssd,size=1m", "--size", "2m"], "past the end of the device"),
        (vec!["bench", "--device", missing_dir, "--size", "1m"], "directory must exist"),
        (vec!["bench", "--device", "psync:/nonexistent-iopath.img"], "give --size"),
        (vec!["bench", "--device", "uring:/dev/null"], "not a regular file or a block device"),
        (vec!["bench", "--device", &uring_file, "--size", "1m", "--bs", "3000"], "invalid --bs '3000'"),
        (vec!["bench", "--device", &uring_file, "--size", "1m", "--bs", "3000"], "direct=0"),
        (vec!["bench", "--device", "uring:/proc/version"], "procfs"),
        (vec!["bench", "--device", "psync:/proc/version,direct=0", "--size", "4k"], "procfs"),
        (vec!["bench", "--runtime", "0s"], "invalid --runtime '0'"),
        (vec!["bench", "--ios", "0"], "invalid --ios '0'"),
        (vec!["bench", "--allow-fs-overwrite"], "--allow-overwrite"),
        (vec!["compare", "--plot", "/nonexistent-iopath-dir/c.svg"], "cannot create the chart file"),
        (vec!["bench", "--device", "emu:dram-ssd,hang_nth=2", "--timeout", "50ms", "--ios", "5"], "--timeout"),
        (vec!["bench", "--device", "emu:dram-ssd,fail_rate=1.5"], "probability"),
        (vec!["bench", "--device", "null", "--verify"], "moves no data"),
        (vec!["bench", "--device", "emu:dram-ssd,size=8k", "--threads", "4"], "raise --size"),
        (vec!["bench", "--frobnicate"], "unexpected argument"),
        (vec!["teleport"], "unrecognized subcommand"),
    ];
    for (args, needle) in cases {
        let err = fails(&args);
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
    }
}

#[test]
fn permission_denied_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locked.img");
    std::fs::write(&file, vec![0u8; 65536]).unwrap();
    let spec = format!("psync:{}", file.display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
    cmd.args(["bench", "--device", &spec, "--ios", "1"]);
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root bypasses file modes: run as nobody instead, on a file only root may read.
        use std::os::unix::process::CommandExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        cmd.uid(65534).gid(65534);
    } else {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let o = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // The checkout itself is not reachable for the unprivileged user.
            eprintln!("SKIPPED permission_denied_is_explained: cannot run the binary as nobody ({e})");
            return;
        }
        Err(e) => panic!("cannot run iopath: {e}"),
    };
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("ermission denied"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn help_teaches() {
    let o = iopath(&["bench", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in ["emu:PRESET", "dram-ssd", "sync-path", "EXAMPLES", "--iodepth", "--verify", "fail_range"] {
        assert!(out.contains(needle), "missing {needle}");
    }
}

#[test]
fn a_device_error_fails_the_run_with_its_location() {
    let err = fails(&["bench", "--device", "emu:dram-ssd,size=1m,fail_nth=5", "--ios", "20", "--no-progress"]);
    assert!(err.contains("device error on read"), "{err}");
    // In the warm-up too, with other threads stopped by it: the error, not an interruption.
    let err = fails(&[
        "bench",
        "--device",
        "emu:dram-ssd,size=16m,fail_nth=500",
        "--threads",
        "4",
        "--ramp-time",
        "1s",
        "--runtime",
        "1s",
        "--no-progress",
    ]);
    assert!(err.contains("device error on read") && !err.contains("interrupted"), "{err}");
}

#[test]
fn compare_prints_matrices_json_and_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("share.svg");
    let o = iopath(&[
        "compare",
        "--paths",
        "scsi-intr,sync-path,stm",
        "--workloads",
        "randread,write",
        "--threads",
        "4",
        "--runtime",
        "150ms",
        "--no-progress",
        "--plot",
        chart.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "relative to scsi-intr",
        "Share of the device's peak bandwidth",
        "randread",
        "stm",
        "req/cmd",
        "sleep/IO",
        "preempt/IO",
        "Which path to use",
        "seed 000, Yu's 2012 thesis",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    assert!(!out.contains("hog ops/s"), "no hog column without hogs: {out}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("scsi-intr"));

    let o = iopath(&[
        "compare",
        "--paths",
        "scsi-intr,stm+interrupt",
        "--workloads",
        "randwrite",
        "--threads",
        "2",
        "--runtime",
        "100ms",
        "--output-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let cells = v["compare"]["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[0]["normalized"].as_f64().unwrap(), 1.0, "the baseline is 1.0 by definition");
    // The advice names the path the cells say is fastest.
    let fastest = cells.iter().max_by(|a, b| a["iops"].as_f64().unwrap().total_cmp(&b["iops"].as_f64().unwrap()));
    let advice = &v["compare"]["advice"][0];
    assert_eq!(advice["workload"], "randwrite");
    assert_eq!(advice["fastest"], fastest.unwrap()["path"]);
    assert!(advice["lowest_p99"].is_string() && advice["lowest_p99_9"].is_string(), "{advice}");
    // Each job is exactly what `bench` prints for that run.
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs[1]["iopath"]["dispatch"], "combine");
    assert_eq!(jobs[1]["iopath"]["completion"]["policy"], "interrupt");
    let bench = bench_json(&["--device", "emu:dram-ssd", "--threads", "2", "--ios", "10", "--rw", "randwrite"]);
    let keys = |j: &Value| j.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&jobs[0]), keys(&bench["jobs"][0]));
    assert_eq!(keys(&jobs[0]["iopath"]), keys(&bench["jobs"][0]["iopath"]));
    let iops = cells[1]["iops"].as_f64().unwrap();
    let job_iops = jobs[1]["write"]["iops"].as_f64().unwrap();
    assert!((iops - job_iops).abs() < 1e-6 * iops.max(1.0), "matrix and job agree");

    let err = fails(&["compare", "--workloads", "sideways"]);
    assert!(err.contains("expected read, write"), "{err}");
}

#[test]
fn compare_completion_policies_under_cpu_hogs() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("contention.svg");
    let o = iopath(&[
        "compare",
        "--device",
        "emu:nand,size=16m",
        "--completions",
        "interrupt,poll,hybrid,adaptive",
        "--cpu-hogs",
        "0,1",
        "--runtime",
        "150ms",
        "--no-progress",
        "--output-format",
        "json",
        "--plot",
        chart.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let levels = v["contention"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, hogs) in levels.iter().zip([0, 1]) {
        assert_eq!(level["cpu_hogs"], hogs);
        let jobs = level["result"]["jobs"].as_array().unwrap();
        let completions: Vec<&str> =
            jobs.iter().map(|j| j["iopath"]["completion"]["policy"].as_str().unwrap()).collect();
        assert_eq!(completions, ["interrupt", "poll", "hybrid", "adaptive"]);
        // Every decision of the adaptive policy is visible: it spent all its time in
        // modes it reports, and the counters are there even when zero.
        let adaptive = &jobs[3]["iopath"]["completion"];
        let in_modes: u64 =
            ["poll", "hybrid", "interrupt"].iter().map(|m| adaptive["time_in_mode_ns"][m].as_u64().unwrap()).sum();
        assert!(in_modes > 0, "{adaptive}");
        assert!(adaptive["switches"].is_u64() && adaptive["probes"].is_u64(), "{adaptive}");
        for job in jobs {
            assert_eq!(job["iopath"]["threads"], 1);
            assert_eq!(job["iopath"]["hogs"].is_null(), hogs == 0, "hog progress reported when hogs ran");
        }
    }
    assert!(std::fs::read_to_string(&chart).unwrap().contains("1 hog(s)"));

    // The rows are named for the policies asked for, on the path they were asked of.
    let o = iopath(&["compare", "--completions", "interrupt,hybrid", "--runtime", "100ms", "--no-progress"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sync-path+interrupt") && out.contains("sync-path+hybrid"), "{out}");
    assert!(!out.contains("direct+hybrid") && !out.contains("hog ops/s"), "{out}");
}

#[test]
fn combine_polling_and_per_path_knobs_are_chosen_shown_and_checked() {
    for polling in ["shared", "winner"] {
        let v = bench_json(&["--path", "stm", "--threads", "4", "--ios", "200", "--combine-polling", polling]);
        let job = &v["jobs"][0];
        assert_eq!(job["iopath"]["knobs"]["combine_polling"], polling);
        assert_eq!(job["write"]["total_ios"].as_u64().unwrap() + job["read"]["total_ios"].as_u64().unwrap(), 800);
        // The merged commands are counted with the path even though no thread owns them.
        assert!(job["iopath"]["merge"]["segments"].as_u64().unwrap() >= 800, "{}", job["iopath"]["merge"]);
    }
    let o = iopath(&["bench", "--path", "htm", "--ios", "10", "--no-progress", "--combine-polling", "winner"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("(hybrid+poll, winner polling)"));
    let err = fails(&["bench", "--path", "stm", "--combine-polling", "sideways"]);
    assert!(err.contains("expected shared or winner"), "{err}");

    // Two settings of one design side by side in one matrix.
    let o = iopath(&[
        "compare",
        "--paths",
        "stm,stm@combine-polling=winner@pipeline=1",
        "--workloads",
        "randwrite",
        "--threads",
        "4",
        "--runtime",
        "100ms",
        "--baseline",
        "stm",
        "--output-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs[1]["iopath"]["path"], "stm@combine-polling=winner@pipeline=1");
    assert_eq!(jobs[0]["iopath"]["knobs"]["combine_polling"], "shared");
    assert_eq!(jobs[1]["iopath"]["knobs"]["combine_polling"], "winner");
    assert_eq!(jobs[1]["iopath"]["knobs"]["pipeline"], 1);
    let v = bench_json(&["--device", "null", "--path", "auto@crowd=off", "--ios", "10"]);
    assert_eq!(v["jobs"][0]["iopath"]["knobs"]["crowd"], "off");
    let err = fails(&["bench", "--path", "stm@colour=blue", "--ios", "1"]);
    assert!(err.contains("knobs a path name can set") && err.contains("combine-polling"), "{err}");
    let err = fails(&["bench", "--path", "stm@pipeline=many", "--ios", "1"]);
    assert!(err.contains("expected a number of commands"), "{err}");
}

#[test]
fn doctor_reports_the_machine_and_recommends_a_path() {
    let out = common::succeeds(&["doctor", "--no-trials"]);
    for needle in
        ["kernel", "io_uring", "DEFER_TASKRUN", "memlock", "cpus", "wake-up of a sleeping thread", "timer sleep"]
    {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let o = iopath(&[
        "doctor",
        "emu:nand,size=16m",
        "--threads",
        "1,4",
        "--trial-time",
        "200ms",
        "--output-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["costs_ns"]["syscall"].as_f64().unwrap() > 0.0);
    assert_eq!(v["recommendations"].as_array().unwrap().len(), 2, "{v}");
    for r in v["recommendations"].as_array().unwrap() {
        // The pick tried again while idle CPUs poll, where that pays and may be asked for; else null.
        match &r["with_idle_polling"] {
            Value::Null => {}
            t => {
                assert!(t["iops"].as_f64().unwrap() > 0.0 && r["why"].as_str().unwrap().contains("--idle-poll"), "{r}")
            }
        }
    }
    // One path for both counts, if one came within 10% of the best at each: one that was tried.
    let tried: Vec<&str> = v["trials"].as_array().unwrap().iter().map(|t| t["path"].as_str().unwrap()).collect();
    match &v["one_path"] {
        Value::Null => {}
        one => assert!(tried.contains(&one["path"].as_str().unwrap()), "{one}"),
    }
    assert!(v.as_object().unwrap().contains_key("one_path"), "{v}");
    assert!(v["trials"].as_array().unwrap().len() >= 6);
    // A file: its O_DIRECT alignment, and never a write.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.img");
    std::fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    let out = common::succeeds(&["doctor", &file.display().to_string(), "--threads", "1", "--trial-time", "200ms"]);
    assert!(out.contains("O_DIRECT alignment") && out.contains("recommended   1 thread(s):"), "{out}");
    assert!(std::fs::read(&file).unwrap().iter().all(|&b| b == 7), "doctor wrote to the file");
    let err = fails(&["doctor", "/nonexistent-iopath.img"]);
    assert!(err.contains("never creates or writes"), "{err}");
    common::with_loop_device("doctor_on_a_loop_device", |dev| {
        let out = common::succeeds(&["doctor", &dev.path.display().to_string(), "--no-trials"]);
        assert!(out.contains("loop backing file") && out.contains("no poll queues"), "{out}");
    });
}

/// Whether this process may ask that idle CPUs poll (root with PM QoS).
fn may_ask_for_idle_polling() -> bool {
    std::fs::OpenOptions::new().write(true).open("/dev/cpu_dma_latency").is_ok()
}

#[test]
fn idle_polling_is_asked_for_reported_and_its_refusal_explained() {
    let bench = ["bench", "--device", "emu:dram-ssd,size=16m", "--runtime", "200ms"];
    let doctor = ["doctor", "--no-trials", "--output-format", "json"];
    let o = iopath(&doctor);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["cpu_idle"].is_object() && v["costs_ns"].as_object().unwrap().contains_key("cross_cpu_wake_idle_polling")
    );
    if !may_ask_for_idle_polling() {
        let err = fails(&[&bench[..], &["--idle-poll"]].concat());
        assert!(err.contains("/dev/cpu_dma_latency") && err.contains("--idle-poll"), "{err}");
        return;
    }
    // As root (CI), the refusal is met by running as an unprivileged user, where setpriv exists.
    if let Ok(o) = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_iopath")])
        .args(bench)
        .args(["--idle-poll", "--no-progress"])
        .output()
        // (Not where the binary is out of the unprivileged user's reach: setpriv says so itself.)
        && !String::from_utf8_lossy(&o.stderr).starts_with("setpriv:")
    {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("only root may ask") && err.contains("--idle-poll"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let v = bench_json(&[&bench[1..], &["--idle-poll"]].concat());
    assert_eq!(v["jobs"][0]["iopath"]["idle_polling"], Value::Bool(true), "{v}");
    let out = common::succeeds(&[&bench[..], &["--idle-poll", "--no-progress"]].concat());
    assert!(out.contains("idle CPUs polled instead of halting"), "{out}");
    // (That the request ends with the run is checked in src/idle.rs: here other tests'
    // doctor runs, which hold requests of their own, may overlap this one.)
    let o = iopath(&[&doctor[..], &["--idle-poll"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cpu_idle"]["driver"].is_string() || v["cpu_idle"]["driver"].is_null(), "{v}");
    let out = common::succeeds(&[
        "fsbench",
        "--device",
        "emu:optane",
        "--workloads",
        "randread",
        "--paths",
        "aios",
        "--runtime",
        "100ms",
        "--file-size",
        "8m",
        "--idle-poll",
    ]);
    assert!(out.contains("idle CPUs polled instead of halting"), "{out}");
    let out = common::succeeds(&[
        "compare",
        "--device",
        "emu:dram-ssd,size=16m",
        "--paths",
        "sync-path",
        "--workloads",
        "randread",
        "--runtime",
        "100ms",
        "--no-progress",
        "--idle-poll",
    ]);
    assert!(out.contains("idle CPUs polled instead of halting during every run"), "{out}");
    // A reproduce report says on its first line that idle CPUs polled.
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().display().to_string();
    common::succeeds(&["reproduce", "merge", "--quick", "--idle-poll", "--no-progress", "--out", &out_dir]);
    let report = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
    assert!(report.lines().nth(2).is_some_and(|l| l.contains("idle CPUs polled instead of halting")), "{report}");
}

#[test]
fn mkfs_makes_a_file_system_ls_lists_it_and_neither_destroys_what_it_should_not() {
    use common::succeeds;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let img = img.to_str().unwrap();
    let out = succeeds(&["mkfs", img, "--size", "32m", "--inodes", "100"]);
    assert!(out.contains("104 files at most"), "{out}");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(img).unwrap();
    assert!(meta.len() == 32 << 20 && meta.blocks() * 512 < 8 << 20, "a sparse image: {} blocks", meta.blocks());
    let out = succeeds(&["ls", "-l", img]);
    assert!(out.contains("0 file(s)"), "{out}");
    // Made once, it is a file system: making it again (or a write benchmark) needs both flags.
    let e = fails(&["mkfs", img]);
    assert!(e.contains("iopath file system") && e.contains("--allow-fs-overwrite"), "{e}");
    let spec = format!("uring:{img}");
    let e = fails(&["bench", "--device", &spec, "--rw", "randwrite", "--runtime", "100ms", "--no-progress"]);
    assert!(e.contains("iopath file system"), "{e}");
    succeeds(&["mkfs", img, "--allow-overwrite", "--allow-fs-overwrite"]);
    // A file someone else made is refused; one without a file system cannot be listed.
    let other = dir.path().join("theirs.img");
    std::fs::write(&other, vec![1u8; 1 << 20]).unwrap();
    let e = fails(&["mkfs", other.to_str().unwrap()]);
    assert!(e.contains("iopath did not create"), "{e}");
    let e = fails(&["ls", other.to_str().unwrap()]);
    assert!(e.contains("iopath mkfs"), "{e}");
    let e = fails(&["mkfs", "emu:optane"]);
    assert!(e.contains("file="), "{e}");
    let e = fails(&["ls", dir.path().join("missing.img").to_str().unwrap()]);
    assert!(e.contains("no such file") && !e.contains("--size"), "{e}");
}

#[test]
fn the_file_tools_copy_in_and_out_list_remove_and_check() {
    use common::succeeds;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let img = img.to_str().unwrap();
    succeeds(&["mkfs", img, "--size", "64m"]);
    // A tree with a nested directory, an odd name and a file of several chunks.
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("a.txt"), "hello\n").unwrap();
    std::fs::write(src.join("sub/with space"), "x").unwrap();
    std::os::unix::fs::symlink("../a.txt", src.join("sub/to-a")).unwrap();
    let pipe = std::ffi::CString::new(src.join("sub/pipe").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(pipe.as_ptr(), 0o640) }, 0, "a named pipe to copy");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(src.join("sub/deeper/big"), &big).unwrap();
    let src_s = src.to_str().unwrap();
    let e = fails(&["cp", img, src_s, "::/"]);
    assert!(e.contains("-r"), "{e}");
    succeeds(&["cp", img, "-r", src_s, "::/"]);
    let out = succeeds(&["ls", "-lR", img]);
    assert!(out.contains("/src/sub/deeper:") && out.contains("3000000") && out.contains("with space"), "{out}");
    assert!(out.contains("5 file(s), 3 directory(ies)") && out.contains("to-a -> ../a.txt"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("prw-r-----") && l.ends_with(" pipe")), "a FIFO made anew: {out}");
    assert_eq!(succeeds(&["ls", img, "/src"]), "a.txt\nsub\n");
    assert_eq!(succeeds(&["cat", img, "/src/a.txt", "src/sub/with space"]), "hello\nx");
    // Out again, byte for byte.
    let back = dir.path().join("back");
    succeeds(&["cp", img, "-r", "::/src", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(back.join("sub/deeper/big")).unwrap(), big);
    assert_eq!(std::fs::read(back.join("a.txt")).unwrap(), b"hello\n");
    assert_eq!(
        std::fs::read_link(back.join("sub/to-a")).unwrap(),
        std::path::Path::new("../a.txt"),
        "a link stays one"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(back.join("sub/pipe")).unwrap().file_type().is_fifo(), "a FIFO stays one");
    // Within the file system, into a directory made with -p.
    succeeds(&["mkdir", "-p", img, "/x/y/z"]);
    succeeds(&["cp", img, "::/src/a.txt", "::/src/sub/with space", "::/x/y/z"]);
    assert_eq!(succeeds(&["ls", img, "x/y/z"]), "a.txt\nwith space\n");
    // Wrong requests: clear errors, nothing changed.
    let e = fails(&["cp", img, "a", "b"]);
    assert!(e.contains("::"), "{e}");
    let e = fails(&["cat", img, "/nope"]);
    assert!(e.contains("/nope") && e.to_lowercase().contains("no such file"), "{e}");
    let e = fails(&["rm", img, "/x"]);
    assert!(e.contains("-r"), "{e}");
    let e = fails(&["mkdir", img, "/x"]);
    assert!(e.contains("exists"), "{e}");
    succeeds(&["rm", "-f", img, "/nope"]);
    succeeds(&["rm", "-r", img, "/x", "/src/sub"]);
    assert_eq!(succeeds(&["ls", img, "/src"]), "a.txt\n");
    let out = succeeds(&["df", img]);
    assert!(out.contains("inodes") && out.contains("use%"), "{out}");
    // A symbolic link (made through the library: the tools make none): listed as one, counted apart.
    {
        let engine = iopath::Engine::open(img, iopath::path::PathConfig::preset("sync-path").unwrap()).unwrap();
        let (fs, _) = iopath::fs::FileSystem::mount(std::sync::Arc::new(engine)).unwrap();
        fs.symlink("a.txt", "/src/link").unwrap();
        fs.unmount().unwrap();
    }
    let out = succeeds(&["ls", "-l", img, "/src"]);
    assert!(out.contains("lrwxrwxrwx") && out.contains("link -> a.txt"), "{out}");
    assert_eq!(succeeds(&["cat", img, "/src/link"]), "hello\n");
    let out = succeeds(&["fsck", img]);
    assert!(
        out.trim_end().ends_with("clean") && out.contains("1 file(s), 1 directory(ies), 1 symbolic link(s)"),
        "{out}"
    );
    succeeds(&["rm", img, "/src/link"]);
    assert_eq!(succeeds(&["cat", img, "/src/a.txt"]), "hello\n", "rm removed the link, not its target");
    let out = succeeds(&["fsck", img]);
    assert!(out.trim_end().ends_with("clean") && out.contains("1 file(s), 1 directory(ies)"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&succeeds(&["fsck", img, "--json"])).unwrap();
    assert_eq!(
        (v["clean"].as_bool(), v["files"].as_u64(), v["leaked_blocks"].as_u64()),
        (Some(true), Some(1), Some(0))
    );

    // Damage: the block of the one file left marked free in the bitmap. fsck names it and
    // fails; mount refuses.
    let mut bytes = std::fs::read(img).unwrap();
    let sb = iopath::fs::format::Superblock::decode(&bytes[..4096], bytes.len() as u64 / 4096).unwrap();
    let owned = (sb.data_start..sb.blocks)
        .find(|b| {
            let bit = (sb.bitmap_start * 4096 * 8 + b) as usize;
            bytes[bit / 8] & (1 << (bit % 8)) != 0
        })
        .unwrap();
    let bit = (sb.bitmap_start * 4096 * 8 + owned) as usize;
    bytes[bit / 8] &= !(1 << (bit % 8));
    std::fs::write(img, &bytes).unwrap();
    let o = common::iopath(&["fsck", img]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success() && out.contains("PROBLEM") && out.contains("marks free"), "{out}");
    let e = fails(&["ls", img]);
    assert!(e.contains("iopath fsck"), "{e}");
}

/// A 32 MiB image in `dir` with an iopath file system, and where to mount
/// it: (the image, the mount directory, `--mount`'s DIR=DEVICE).
fn formatted_image_to_mount(dir: &std::path::Path) -> (String, String, String) {
    let img = dir.join("fs.img").to_str().unwrap().to_string();
    let mnt = dir.join("mnt").to_str().unwrap().to_string();
    common::succeeds(&["mkfs", &img, "--size", "32m"]);
    let mount = format!("{mnt}={img}");
    (img, mnt, mount)
}

#[test]
fn run_mounts_an_image_for_a_program_and_one_process_holds_it_at_a_time() {
    use common::succeeds;
    let dir = tempfile::tempdir().unwrap();
    let (img, mnt_s, mount) = formatted_image_to_mount(dir.path());
    let (img, mnt_s, mnt) = (img.as_str(), mnt_s.as_str(), dir.path().join("mnt"));
    // A shell's builtins run in the process that mounts: a directory, a file, a rename.
    // (A failed mkdir or write fails the run and shows why: one CI run found no /d
    // afterwards with nothing said; mv may fail, which the listing below allows.)
    let script = format!(
        "mkdir {mnt_s}/d && echo hello > {mnt_s}/d/x || exit 1; mv {mnt_s}/d/x {mnt_s}/d/y 2>/dev/null; exit 0"
    );
    let o = common::iopath(&["run", "--wait", "5", "--mount", &mount, "--", "sh", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0, "the host directory stays empty");
    // mv is a program of its own: it mounted in turn (or, without it, d/x stays).
    let listing = succeeds(&["ls", img, "/d"]);
    assert!(listing == "y\n" || listing == "x\n", "{listing}");
    let name = listing.trim();
    assert_eq!(succeeds(&["cat", img, &format!("/d/{name}")]), "hello\n");
    // A shell that touched the mount (a glob, a cd) gives it back before it forks its next
    // command, when it holds nothing open there: the command mounts in turn.
    // Its working directory inside the mount goes with the commands it starts.
    let script = format!("cd {mnt_s}/d && for f in {mnt_s}/d/*; do cat \"$f\"; done && cat {name} && /bin/pwd");
    let o = common::iopath(&["run", "--wait", "1", "--mount", &mount, "--", "sh", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("hello\nhello\n{mnt_s}/d\n"));
    // A subshell is a fork of a shell that holds nothing there (it gave the mount back, or
    // never touched it): it mounts in turn, as a new process does.
    let script = format!("(cd {mnt_s}/d && cat {name}); test -d {mnt_s}/d && (cd {mnt_s}/d && /bin/pwd)");
    let o = common::iopath(&["run", "--wait", "1", "--mount", &mount, "--", "sh", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("hello\n{mnt_s}/d\n"));
    // A program that has the device mounted and nothing open there gives it to a file
    // tool that asks (its lender), and goes on (it mounts again at its next call).
    let script = format!(
        "import os, sys, time\nos.listdir('{mnt_s}/d')\nprint('mounted', flush=True)\nsys.stdin.readline()\n\
         print(sorted(os.listdir('{mnt_s}')))"
    );
    let mut idle = std::process::Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["run", "--wait", "5", "--mount", &mount, "--", "python3", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(idle.stdout.as_mut().unwrap()), &mut said).unwrap();
    assert_eq!(said, "mounted\n");
    succeeds(&["mkdir", img, "/by-a-tool"]);
    std::io::Write::write_all(idle.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let idle = idle.wait_with_output().unwrap();
    assert!(idle.status.success(), "{}", stderr(&idle));
    assert_eq!(
        String::from_utf8_lossy(&idle.stdout),
        "['by-a-tool', 'd']\n",
        "it mounted again and sees the tool's change"
    );
    assert!(succeeds(&["ls", img]).contains("by-a-tool"));
    // While a program holds a file with a record lock open there, others are refused by name
    // (the file tools after a second of asking). (A file open without a lock and not in use,
    // or with a flock, which is the kernel's, does not keep the mount: the lender closes it,
    // to be opened again at its next use.)
    let script =
        format!("import fcntl, time\nf = open('{mnt_s}/d/{name}')\nfcntl.lockf(f, fcntl.LOCK_SH)\ntime.sleep(6)");
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["run", "--mount", &mount, "--", "python3", "-c", &script])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let e = fails(&["ls", img]);
    assert!(e.contains("mounted by process") && e.contains("python3"), "{e}");
    let o = common::iopath(&["run", "--wait", "0", "--mount", &mount, "--", "sh", "-c", &format!("ls {mnt_s}/d")]);
    assert!(!o.status.success() && stderr(&o).contains("mounted by process"), "{}", stderr(&o));
    assert!(holder.wait().unwrap().success());
    succeeds(&["fsck", img]);
    // A writable shared mmap of a mounted file (SQLite's WAL index) reaches the file.
    let script = format!(
        "import mmap, os\nfd = os.open('{mnt_s}/db-shm', os.O_RDWR | os.O_CREAT)\nos.write(fd, b'x' * 4096)\n\
         m = mmap.mmap(fd, 4096)\nm[0:2] = b'ok'\nm.close()\nprint(os.pread(fd, 2, 0).decode())"
    );
    let o = common::iopath(&["run", "--wait", "5", "--mount", &mount, "--", "python3", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
    // Wrong requests.
    let e = fails(&["run", "--mount", &format!("{mnt_s}={}", dir.path().join("none.img").display()), "--", "true"]);
    assert!(e.contains("iopath mkfs"), "{e}");
    let e = fails(&["run", "--", "true"]);
    assert!(e.contains("--mount"), "{e}");
    let e = fails(&["run", "--wait=-1", "--mount", &mount, "--", "true"]);
    assert!(e.contains("not a number of seconds"), "{e}");
    // The caller's IOPATH_MOUNT_WAIT holds unless --wait is given.
    let waits = |flag: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_iopath"))
            .arg("run")
            .args(flag)
            .args(["--mount", &mount, "--", "sh", "-c", "echo $IOPATH_MOUNT_WAIT"])
            .env("IOPATH_MOUNT_WAIT", "3")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(waits(&[]), "3");
    assert_eq!(waits(&["--wait", "0.5"]), "0.5");
}

#[test]
fn run_log_file_keeps_the_interposers_lines_out_of_the_programs_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let (img, mnt_s, mount) = formatted_image_to_mount(dir.path());
    std::fs::create_dir(&mnt_s).unwrap(); // (else `run` says it made it, on stderr)
    // Relative: taken against the working directory (every process appends to one file).
    let script = format!("echo hi > {mnt_s}/f && cat {mnt_s}/f");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_iopath"))
        .current_dir(dir.path())
        .args(["run", "--log-file", "run.log", "--mount", &mount, "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    assert!(!stderr(&o).contains("iopath:"), "{}", stderr(&o));
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(log.contains(&format!("iopath: {img} serves {mnt_s}")) && log.contains("mounted"), "{log}");
    // The interposer opens it with the kernel: one inside a mount would be hidden under it.
    let e = fails(&["run", "--log-file", &format!("{mnt_s}/run.log"), "--mount", &mount, "--", "true"]);
    assert!(e.contains("inside the mount") && e.contains("outside every mount"), "{e}");
}

#[test]
fn fsbench_runs_both_paths_on_every_workload_and_reports_steps() {
    let o = iopath(&[
        "fsbench",
        "--device",
        "emu:optane,wcache=1",
        "--file-size",
        "16m",
        "--region",
        "4m",
        "--cache",
        "2m",
        "--runtime",
        "150ms",
        "--output-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let runs = v["runs"].as_array().unwrap();
    // randread, hitsweep (4 cache sizes), seqread, region, fsync; two paths each.
    assert_eq!(runs.len(), 2 * (1 + 4 + 1 + 1 + 1), "{v}");
    for r in runs {
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(r["lat_ns"]["p99"].as_u64().unwrap() > 0, "{r}");
    }
    let randread = runs.iter().find(|r| r["workload"] == "randread").unwrap();
    assert!(randread["steps_ns_per_op"]["device"].as_f64().unwrap() > 0.0, "{randread}");
    let fsync = runs.iter().find(|r| r["workload"] == "fsync" && r["fsync_path"] == "conventional").unwrap();
    assert!(fsync["steps_ns_per_op"]["fsync_journal"].as_f64().unwrap() > 0.0, "{fsync}");
    let region = runs.iter().find(|r| r["workload"] == "region").unwrap();
    assert_eq!(region["cache"]["readahead_pages"], 0, "{region}");
    let e = fails(&["fsbench", "--workloads", "backup"]);
    assert!(e.contains("randread"), "{e}");
    let e = fails(&["fsbench", "--paths", "fast"]);
    assert!(e.contains("conventional or aios"), "{e}");
    let e = fails(&["fsbench", "--device", "emu:optane,size=64m", "--file-size", "256m"]);
    assert!(e.contains("--file-size") && e.contains("holds 64MiB") && e.contains("no file fits"), "{e}");
    // Where a smaller file fits, the message says how large.
    let e = fails(&["fsbench", "--device", "emu:optane,size=128m", "--file-size", "256m"]);
    assert!(e.contains("--file-size 56MiB or less fits"), "{e}");
    // Settings that cannot make a run are refused before anything is formatted.
    for (args, names) in [
        (&["--bs", "1g"][..], "--file-size '256MiB': at least --bs (1GiB)"),
        (&["--cache", "0"], "--cache '0B': at least 64KiB"),
        (&["--region", "0", "--workloads", "region"], "--region '0B': from --bs"),
        (&["--region", "1t", "--workloads", "region"], "to --file-size (256MiB)"),
        (&["--runtime", "0s"], "--runtime '0'"),
        (&["--repeat", "0"], "--repeat '0'"),
        (&["--fsync-every", "0", "--workloads", "fsync"], "--fsync-every '0'"),
        (&["--threads", "5000"], "--threads '5000': at most 4096"),
    ] {
        let e = fails(&[&["fsbench"][..], args].concat());
        assert!(e.contains(names) && !e.contains("formatting"), "{args:?}: {e}");
    }
}

/// The logsync workload: threads overwriting records of one shared log,
/// an fdatasync after each, on both fsync paths; and the ring's bound.
#[test]
fn fsbench_logsync_runs_many_threads_on_one_log() {
    let o = iopath(&[
        "fsbench",
        "--device",
        "emu:optane,wcache=1",
        "--file-size",
        "4m",
        "--workloads",
        "logsync",
        "--bs",
        "512",
        "--threads",
        "8",
        "--paths",
        "conventional,aios/journaled",
        "--runtime",
        "150ms",
        "--output-format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for r in runs {
        assert_eq!(r["workload"], "logsync", "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0 && r["lat_ns"]["p99"].as_u64().unwrap() > 0, "{r}");
    }
    let e = fails(&["fsbench", "--workloads", "logsync", "--bs", "64k", "--threads", "32"]);
    assert!(e.contains("--bs '64KiB'") && e.contains("1MiB ring") && !e.contains("formatting"), "{e}");
}

#[test]
fn reproduce_writes_a_report_whose_tables_match_its_data_and_redraws_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let args = ["reproduce", "latency", "merge", "--quick", "--no-progress", "--out", out.to_str().unwrap()];
    let printed = common::succeeds(&args);
    assert!(printed.contains("findings hold"), "{printed}");
    let results: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let sections = results["sections"].as_array().unwrap();
    assert_eq!(sections.iter().map(|s| s["key"].as_str().unwrap()).collect::<Vec<_>>(), ["latency", "merge"]);
    let md = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for s in sections {
        let key = s["key"].as_str().unwrap();
        assert!(md.contains(&format!("![{}]({key}.svg)", s["chart"]["title"].as_str().unwrap())), "{md}");
        let svg = std::fs::read_to_string(out.join(format!("{key}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && html.contains(&format!("id=\"{key}\"")));
        // Every finding and every measured cell in the JSON is in both documents.
        for f in s["findings"].as_array().unwrap() {
            let verdict = if f["holds"].as_bool().unwrap() { "yes" } else { "**no**" };
            let iopath = f["iopath"].as_str().unwrap();
            assert!(md.contains(&format!("| {iopath} | {verdict} |")), "{iopath} / {verdict} not in REPORT.md");
            assert!(f["rule"].as_str().is_some_and(|r| !r.is_empty()));
        }
        for table in s["tables"].as_array().unwrap() {
            for row in table["rows"].as_array().unwrap() {
                let cells: Vec<&str> = row.as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
                assert!(md.contains(&format!("| {} |", cells.join(" | "))), "row {cells:?} not in REPORT.md");
                assert!(html.contains(&format!("<td>{}</td>", cells[0])), "row {cells:?} not in report.html");
            }
        }
    }
    // `iopath report` redraws the same documents from results.json alone.
    std::fs::remove_file(out.join("REPORT.md")).unwrap();
    std::fs::remove_file(out.join("report.html")).unwrap();
    common::succeeds(&["report", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(out.join("REPORT.md")).unwrap(), md);
    assert_eq!(std::fs::read_to_string(out.join("report.html")).unwrap(), html);

    let err = fails(&["reproduce", "nonsense", "--out", out.to_str().unwrap()]);
    assert!(err.contains("known experiments: latency"), "{err}");
    let err = fails(&["report", dir.path().join("missing").to_str().unwrap()]);
    assert!(err.contains("results.json"), "{err}");
}

/// Every experiment runs to the end and renders (what each finds is not
/// asserted: these are short runs of a debug build on a shared machine).
#[test]
fn reproduce_quick_runs_every_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all");
    common::succeeds(&["reproduce", "--quick", "--no-progress", "--out", out.to_str().unwrap()]);
    let results: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let keys: Vec<&str> = results["sections"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        ["latency", "peak", "threads", "sensitivity", "cpu", "contention", "merge", "aios", "real", "apps"]
    );
    for s in results["sections"].as_array().unwrap() {
        let skipped = s["explanation"].as_str().unwrap().starts_with("Skipped:");
        assert!(skipped || !s["findings"].as_array().unwrap().is_empty(), "{s}");
        assert!(
            std::fs::read_to_string(out.join(format!("{}.svg", s["key"].as_str().unwrap())))
                .unwrap()
                .starts_with("<svg")
        );
    }
}

#[test]
fn fio_job_files_run_their_jobs_and_refuse_what_iopath_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("data.img");
    let job = dir.path().join("two.fio");
    std::fs::write(
        &job,
        format!(
            "; as fio's examples write them\n[global]\nioengine=io_uring\nfilename={}\nsize=16m\ndirect=1\nbs=4k\n\
             number_ios=200\nthread\ngroup_reporting\n\n[rand-read]\nrw=randread\niodepth=4\n\n[mixed]\nstonewall\n\
             rw=randrw\nrwmixwrite=30\nnumjobs=2\niopath_path=stm\n",
            img.display()
        ),
    )
    .unwrap();
    let out = common::succeeds(&[
        "bench",
        job.to_str().unwrap(),
        "--allow-overwrite",
        "--no-progress",
        "--output-format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.iter().map(|j| j["jobname"].as_str().unwrap()).collect::<Vec<_>>(), ["rand-read", "mixed"]);
    assert_eq!(jobs[0]["job options"]["iodepth"], "4");
    assert_eq!(jobs[1]["job options"]["rwmixwrite"], "30", "the job's options as the file gives them");
    assert_eq!(jobs[1]["read"]["total_ios"].as_u64().unwrap() + jobs[1]["write"]["total_ios"].as_u64().unwrap(), 400);
    assert_eq!(jobs[1]["iopath"]["dispatch"], "combine");
    assert_eq!(jobs[0]["read"]["total_ios"], 200, "number_ios per thread");
    assert!(jobs[1]["write"]["total_ios"].as_u64().unwrap() > 0);

    std::fs::write(&job, "[a]\nrw=randread\noffset_increment=1g\n").unwrap();
    let err = fails(&["bench", job.to_str().unwrap()]);
    assert!(err.contains("offset_increment=1g in [a] (line 1)") && err.contains("does not support"), "{err}");
    let err = fails(&["bench", dir.path().join("missing.fio").to_str().unwrap()]);
    assert!(err.contains("job file"), "{err}");
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let o = iopath(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = String::from_utf8_lossy(&o.stdout);
        assert!(script.contains("fsbench") && script.contains("idle-poll"), "{shell}:\n{script}");
    }
    let e = fails(&["completions", "tcsh"]);
    assert!(e.contains("bash") && e.contains("fish"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let o = iopath(&["man", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in ["iopath.1", "iopath-bench.1", "iopath-run.1", "iopath-mkfs.1"] {
        let text = std::fs::read_to_string(out.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is not roff:\n{text}");
    }
    let bench = std::fs::read_to_string(out.join("iopath-bench.1")).unwrap();
    assert!(bench.contains("device") && bench.contains("uring:PATH"), "{bench}");
    assert!(!out.join("iopath-help.1").exists(), "no page for clap's help subcommand");
}
